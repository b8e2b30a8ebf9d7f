"""A load client in a process of its own, for tests/e2e/test_lifecycle.py: GET /who without
pause, on keep-alive connections and on a new connection per request at once (a thread each),
until the file named STOP exists; then one JSON line on standard output says what happened.

    python tests/_loadclient.py ADDRESS STOP      ADDRESS: unix:PATH or HOST:PORT

A failure is anything a client could not have retried: an answer other than 200, a
connection refused or reset before it was used, a request that got a partial answer. What a
careful client retries is counted apart (RFC 9112 9.3.1): a keep-alive connection the server
closed while idle, found closed when the next request is sent on it (nothing of an answer came
back), and, over TCP only, a new connection reset by a closing SO_REUSEPORT listener before it
was answered ("resets", docs/architecture.md, "Known limits")."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

REQUEST = b"GET /who HTTP/1.1\r\nHost: x\r\n\r\n"


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = 0
        self.keepalive_retries = 0  # an idle keep-alive connection closed under the request
        self.resets = 0  # TCP only: a new connection reset by a closing listener
        self.closes = 0  # answers that said Connection: close (a draining worker's)
        self.failures: list[str] = []
        self.bodies: set[str] = set()
        self.last = ""


def connect(address: str) -> socket.socket:
    if address.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(address[5:])
    else:
        host, _, port = address.rpartition(":")
        s = socket.create_connection((host, int(port)), timeout=30)
    return s


def read_answer(s: socket.socket, buf: bytearray) -> tuple[bytes, bytes, bool] | None:
    """(status line, body, closes) of the next answer; None when the connection ended before
    any byte of it."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            if buf:
                raise ConnectionError(f"connection closed in an answer's head: {bytes(buf)!r}")
            return None
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:])}
    length = int(fields.get(b"content-length", b"0"))
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed in an answer's body")
        rest += chunk
    buf[:] = rest[length:]
    return lines[0], rest[:length], fields.get(b"connection", b"").lower() == b"close"


def one(stats: Stats, status: bytes, body: bytes) -> None:
    with stats.lock:
        if status != b"HTTP/1.1 200 OK":
            stats.failures.append(status.decode(errors="replace"))
            return
        stats.ok += 1
        stats.last = body.decode()
        stats.bodies.add(stats.last)


def keepalive(address: str, stop: str, stats: Stats) -> None:
    s: socket.socket | None = None
    buf = bytearray()
    used = False
    while not os.path.exists(stop):
        try:
            if s is None:
                s, buf, used = connect(address), bytearray(), False
            try:
                s.sendall(REQUEST)
                answer = read_answer(s, buf)
            except (ConnectionResetError, BrokenPipeError):
                answer = None
                if not used:
                    raise
            if answer is None:
                if not used:
                    raise ConnectionError("a new connection closed before any answer")
                with stats.lock:
                    stats.keepalive_retries += 1  # the server closed it while idle: retry
                s.close()
                s = None
                continue
            used = True
            one(stats, answer[0], answer[1])
            if answer[2]:
                with stats.lock:
                    stats.closes += 1
                s.close()
                s = None
        except OSError as exc:
            if isinstance(exc, ConnectionResetError) and not address.startswith("unix:"):
                with stats.lock:
                    stats.resets += 1
            else:
                with stats.lock:
                    stats.failures.append(f"keep-alive: {exc!r}")
            if s is not None:
                s.close()
            s = None
    if s is not None:
        s.close()


def fresh(address: str, stop: str, stats: Stats) -> None:
    while not os.path.exists(stop):
        try:
            with connect(address) as s:
                s.sendall(b"GET /who HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answer = read_answer(s, bytearray())
            if answer is None:
                raise ConnectionError("a new connection closed before any answer")
            one(stats, answer[0], answer[1])
        except OSError as exc:
            with stats.lock:
                if isinstance(exc, ConnectionResetError) and not address.startswith("unix:"):
                    stats.resets += 1
                else:
                    stats.failures.append(f"new connection: {exc!r}")


def main() -> None:
    address, stop = sys.argv[1], sys.argv[2]
    stats = Stats()
    threads = [threading.Thread(target=f, args=(address, stop, stats))
               for f in (keepalive, keepalive, fresh)]
    for t in threads:
        t.start()
    last_said = 0.0
    while any(t.is_alive() for t in threads):
        time.sleep(0.05)
        if time.monotonic() - last_said > 0.2:  # progress, for the test to wait on
            last_said = time.monotonic()
            with stats.lock:
                print(json.dumps({"ok": stats.ok, "last": stats.last,
                                  "failures": len(stats.failures)}), flush=True)
    print(json.dumps({"done": True, "ok": stats.ok, "failures": stats.failures[:20],
                      "nfailures": len(stats.failures),
                      "keepalive_retries": stats.keepalive_retries, "resets": stats.resets,
                      "closes": stats.closes, "pids": len({b.split()[-1] for b in stats.bodies})
                      }), flush=True)


if __name__ == "__main__":
    main()
