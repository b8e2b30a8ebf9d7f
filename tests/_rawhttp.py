"""Raw-socket HTTP/1.1 helpers for the end-to-end tests: no HTTP library in between, so the tests
see exactly the bytes the server writes (pipelining, Connection: close, early closes)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

from cyserve._core import Server

TIMEOUT = 10.0


@dataclass
class Reply:
    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    raw_head: bytes = b""

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


class Conn:
    """One client connection with a read buffer, so that pipelined replies can be read one by
    one."""

    def __init__(self, port: int, timeout: float = TIMEOUT) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        self.buf += data
        return True

    def read_until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            if not self._fill():
                raise ConnectionError(f"closed before {marker!r}; got {self.buf!r}")
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionError(f"closed after {len(self.buf)} of {n} body bytes")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def reply(self, head_only: bool = False) -> Reply:
        head = self.read_until(b"\r\n\r\n")
        lines = head[:-4].decode("latin-1").split("\r\n")
        version, status, reason = (lines[0].split(" ", 2) + [""])[:3]
        assert version == "HTTP/1.1", lines[0]
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        r = Reply(int(status), reason, headers, b"", head)
        code = r.status
        if head_only or code < 200 or code in (204, 304):
            return r
        if "content-length" in headers:
            r.body = self.read_exact(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            r.body = self.read_chunked()
        else:
            while self._fill():
                pass
            r.body, self.buf = self.buf, b""
        return r

    def read_chunked(self) -> bytes:
        """A chunked body (RFC 9112 7.1), checked strictly: the sizes the server writes."""
        body = b""
        while True:
            line = self.read_until(b"\r\n")[:-2]
            assert line and all(c in b"0123456789abcdef" for c in line), line
            size = int(line, 16)
            if size == 0:
                assert self.read_until(b"\r\n") == b"\r\n"  # no trailers
                return body
            body += self.read_exact(size)
            assert self.read_exact(2) == b"\r\n"

    def is_closed(self) -> bool:
        """True when the server closed the connection (EOF or reset) with nothing left unread."""
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return True
        self.buf += data
        return data == b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def get(path: str, host: str = "t", extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode("latin-1")


def request(port: int, data: bytes) -> Reply:
    with Conn(port) as c:
        c.send(data)
        return c.reply(head_only=data.startswith(b"HEAD "))


@contextlib.contextmanager
def serving(routes: list, threads: int = 2, **options: object) -> Iterator[Server]:
    """A started Server on 127.0.0.1 and an ephemeral port, stopped at the end."""
    srv = Server(routes, host="127.0.0.1", port=0, threads=threads, **options)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop(grace=2.0)
