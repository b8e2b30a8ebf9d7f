"""What the differential tests of real applications share (test_frameworks_uvicorn_diff.py against
uvicorn, test_wsgi_gunicorn_diff.py against gunicorn): the applications' folder and the file they
serve, the two servers of an application started once per module, the raw requests, a client
that keeps each status line, and an answer reduced to what must be equal. Each test module keeps
its own comparison, whose rules its docstring gives."""

from __future__ import annotations

import contextlib
import gzip
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _subserve import env_with_src, free_port, running
from test_asgi_uvicorn_diff import Answer, Client

APPS = Path(__file__).resolve().parent / "diffapps"
# Each server's own headers, and the framing, which the rules compare apart.
OWN = {"date", "server"}
FRAMING = {"content-length", "transfer-encoding"}


def file_bytes() -> bytes:
    """The 64 KiB file the Starlette and Django apps serve: known bytes, the same on both."""
    return bytes(random.Random(7).getrandbits(8) for _ in range(65536))


@contextlib.contextmanager
def server_pairs(tmp_path_factory: pytest.TempPathFactory, names: tuple[str, str],
                 argvs: Callable[[str, int, int], tuple[list[str], list[str]]]
                 ) -> Iterator[Callable[[str], dict[str, int]]]:
    """For a module's `served` fixture: start(app) starts an application's two servers the
    first time a test asks for them, and gives their ports by name (names: cyserve's first,
    then the reference server's, which runs from APPS); argvs(app, port, reference_port) gives
    their two command lines. Both find the served file in $DIFFAPP_FILE."""
    data = tmp_path_factory.mktemp("diffdata") / "file.bin"
    data.write_bytes(file_bytes())
    env = env_with_src({"DIFFAPP_FILE": str(data)})
    ports: dict[str, dict[str, int]] = {}
    with contextlib.ExitStack() as stack:
        def start(app: str) -> dict[str, int]:
            if app not in ports:
                cy, ref = free_port(), free_port()
                cy_argv, ref_argv = argvs(app, cy, ref)
                stack.enter_context(running(cy_argv, cy, env=env))
                stack.enter_context(running(ref_argv, ref, env=env, cwd=APPS))
                ports[app] = dict(zip(names, (cy, ref)))
            return ports[app]

        yield start


@dataclass
class Reply(Answer):
    """An answer with its status line's version and reason phrase."""

    version: str = ""
    reason: str = ""


class LineClient(Client):
    """The raw client of test_asgi_uvicorn_diff.py, keeping each status line's version (an
    HTTP/1.0 one taken too: gunicorn's answer to an HTTP/1.0 request) and reason phrase."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.lines: list[tuple[str, str]] = []

    def head(self) -> tuple[int, list[tuple[str, str]]]:
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError(f"closed before a status line: {self.buf!r}")
        line = self.buf.split(b"\r\n", 1)[0].decode("latin-1")
        version, _, rest = line.partition(" ")
        assert version in ("HTTP/1.0", "HTTP/1.1"), line
        self.lines.append((version, rest.partition(" ")[2]))
        self.buf = b"HTTP/1.1" + self.buf[len(version):]
        return super().head()


def exchange(port: int, data: bytes, body_after_continue: bytes | None = None) -> Reply:
    """One request on a connection of its own; with body_after_continue, the head is sent first
    and the body only once a 100 Continue came."""
    c = LineClient(port)
    try:
        c.sock.sendall(data)
        interim: list[int] = []
        if body_after_continue is not None:
            status, _ = c.head()
            interim.append(status)
            c.sock.sendall(body_after_continue)
        a = c.answer(data.split(b" ", 1)[0].decode(), interim=interim)
        version, reason = c.lines[-1]
        # Whether the server kept the connection: a second request gets an answer on it (any:
        # a 404), or the end of the connection. Quicker than waiting to see nothing come.
        try:
            c.sock.sendall(b"GET /probe-after HTTP/1.1\r\nHost: t\r\n\r\n")
            c.head()
            closed = False
        except (ConnectionError, TimeoutError):
            closed = True
        return Reply(a.status, a.headers, a.body, a.interim, closed, version, reason)
    finally:
        c.close()


def decoded(a: Answer) -> bytes:
    if a.get("content-encoding") == ["gzip"]:
        return gzip.decompress(a.body)
    return a.body


def normalised(a: Answer, unkept: set[str]) -> tuple[list[tuple[str, str]], bytes]:
    """The headers that must be equal and the decoded body (the module docstring's rules)."""
    body = decoded(a)
    headers = []
    for k, v in a.headers:
        if k in OWN | FRAMING | unkept or k == "connection":
            continue
        if k == "content-type" and v.startswith("multipart/byteranges; boundary="):
            boundary = v.split("=", 1)[1]
            body = body.replace(boundary.encode(), b"BOUNDARY")
            v = v.replace(boundary, "BOUNDARY")
        if k == "allow":
            v = ", ".join(sorted(m.strip() for m in v.split(",")))
        headers.append((k, v))
    return headers, body


def asks_keep_alive(data: bytes) -> bool:
    head = data.split(b"\r\n\r\n", 1)[0]
    return b"HTTP/1.1" in head.split(b"\r\n", 1)[0] and b"Connection: close" not in head


def get(target: str, extra: str = "") -> bytes:
    # Latin-1: a header value outside ASCII is one byte a character (obs-text, RFC 9110 5.5).
    return f"GET {target} HTTP/1.1\r\nHost: t\r\n{extra}\r\n".encode("latin-1")


def post(target: str, body: bytes, ctype: str, extra: str = "") -> bytes:
    return (f"POST {target} HTTP/1.1\r\nHost: t\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def multipart(field: str, filename: str, data: bytes, extra: dict[str, str]) -> tuple[bytes, str]:
    boundary = "diffboundary7d3a"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in extra.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; '
                 f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
                 .encode() + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def sequence(port: int, requests: list[bytes]) -> list[tuple[int, Any]]:
    """The requests one after the other on one connection (a new one after a request that ends
    it): the status and the compared headers and body of each answer."""
    got: list[tuple[int, Any]] = []
    c = LineClient(port)
    try:
        for data in requests:
            c.sock.sendall(data)
            a = c.answer(data.split(b" ", 1)[0].decode())
            got.append((a.status, normalised(a, {"vary"})))
            if not asks_keep_alive(data):
                c.close()
                c = LineClient(port)
    finally:
        c.close()
    return got
