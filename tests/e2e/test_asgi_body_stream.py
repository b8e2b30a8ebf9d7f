"""An ASGI app's request body streams: receive() gets it in pieces of 64 KiB (the last one
shorter) as the client sends it, each piece read from the socket only when the app asks (so an
upload goes through with one piece in memory, and an app that reads slowly slows the client
down), within the body limits (413 past max_body_bytes, 100 Continue on the first receive());
an answer that leaves the body unread closes the connection. A chunked body streams the same
way, decoded as it comes: its limit is checked as it goes (413, or 400 for bad framing, even
while the app is waiting in receive()), and what follows its end is the next request."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
from test_asgi import serving_app

pytestmark = pytest.mark.native

Scope = dict[str, Any]


def read_response(s: socket.socket, f: Any = None) -> bytes:
    """One response (head and Content-Length body) from s (through its buffered reader f when
    several are read), leaving what follows it."""
    f = f or s.makefile("rb")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = f.readline()
        if not line:
            return head
        head += line
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return head + f.read(length)


def counting_app(seen: dict[str, Any]) -> Any:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        total, pieces, biggest = 0, 0, 0
        while True:
            msg = await receive()
            assert msg["type"] == "http.request"
            total += len(msg["body"])
            pieces += 1
            biggest = max(biggest, len(msg["body"]))
            if pieces == 1:
                seen["first"].set()
            if not msg["more_body"]:
                break
        seen.update(total=total, pieces=pieces, biggest=biggest)
        body = str(total).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return app


def test_upload_streams_in_pieces_while_it_is_sent() -> None:
    seen: dict[str, Any] = {"first": threading.Event()}
    size = 8 << 20
    with serving_app(counting_app(seen), max_body_bytes=16 << 20) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % size)
            s.sendall(b"x" * 100_000)
            # The app has its first piece while most of the body is not even sent.
            assert seen["first"].wait(5)
            sent = 100_000
            block = b"y" * 65536
            while sent < size:
                n = min(len(block), size - sent)
                s.sendall(block[:n])
                sent += n
            resp = read_response(s)
    assert resp.startswith(b"HTTP/1.1 200 ") and resp.endswith(str(size).encode())
    assert seen["total"] == size
    assert seen["pieces"] == size // 65536 and seen["biggest"] == 65536


def test_body_limits_and_100_continue() -> None:
    seen: dict[str, Any] = {"first": threading.Event()}
    with serving_app(counting_app(seen), max_body_bytes=1000) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\n\r\n")
            assert read_response(s).startswith(b"HTTP/1.1 413 ")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n"
                      b"Expect: 100-continue\r\n\r\n")
            assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
            s.sendall(b"0123456789")
            resp = read_response(s)
            assert resp.startswith(b"HTTP/1.1 200 ") and resp.endswith(b"10")


def test_an_app_that_never_receives_gets_no_100_continue() -> None:
    """The 100 goes out on the first receive(): an app that answers without reading the body
    sends the final status only, and the client never sends the body it was not asked for."""
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"no"})

    with serving_app(app) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n"
                      b"Expect: 100-continue\r\n\r\n")
            resp = read_response(s)
            assert resp.startswith(b"HTTP/1.1 403 ") and resp.endswith(b"\r\n\r\nno"), resp
            # Nothing else came: no 100 before the answer, nor after it.
            s.settimeout(0.3)
            try:
                rest = s.recv(100)
            except TimeoutError:
                rest = b""
            assert b"100 Continue" not in rest


def test_body_left_unread_closes_the_connection_and_pipelining_still_works() -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/read":
            body = b""
            more = True
            while more:
                msg = await receive()
                body += msg["body"]
                more = msg["more_body"]
        else:
            body = b"ignored"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    with serving_app(app) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            # Two requests with their bodies in one write: both answered, in order.
            s.sendall(b"POST /read HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
                      b"POST /read HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nde")
            f = s.makefile("rb")
            assert read_response(s, f).endswith(b"abc")
            assert read_response(s, f).endswith(b"de")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /skip HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
            s.sendall(b"z" * 1000)
            resp = read_response(s)
            assert resp.startswith(b"HTTP/1.1 200 ")
            assert b"\r\nConnection: close\r\n" in resp
            t0 = time.monotonic()
            while s.recv(65536):
                assert time.monotonic() - t0 < 5


def chunked(data: bytes, size: int = 1000) -> bytes:
    """data as chunks of size bytes, with the last chunk (no trailers)."""
    out = b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size])
                   for i in range(0, len(data), size))
    return out + b"0\r\n\r\n"


def echo_app(seen: dict[str, Any]) -> Any:
    """Answers with the body it received; notes each receive() message's size, and sets
    seen["first"] on the first, seen["gone"] when told http.disconnect."""
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        sizes = seen.setdefault("sizes", [])
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                seen["gone"].set()
                return
            body += msg["body"]
            sizes.append(len(msg["body"]))
            seen["first"].set()
            if not msg["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return app


def test_chunked_upload_streams_with_bounded_pieces() -> None:
    seen: dict[str, Any] = {"first": threading.Event(), "gone": threading.Event()}
    size = 4 << 20
    data = bytes(range(256)) * (size // 256)
    with serving_app(echo_app(seen), max_body_bytes=8 << 20) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
            s.sendall(chunked(data[:100_000], 4096)[:-5])  # without the last chunk
            # The app has its first piece while most of the body is not even sent: it streams.
            assert seen["first"].wait(5)
            reader = threading.Thread(target=lambda: seen.update(resp=read_response(s)))
            reader.start()
            s.sendall(chunked(data[100_000:], 30_000))
            reader.join(20)
    resp = seen["resp"]
    assert resp.startswith(b"HTTP/1.1 200 ")
    assert resp.split(b"\r\n\r\n", 1)[1] == data
    assert max(seen["sizes"]) <= 65536 and len(seen["sizes"]) >= size // 65536


def test_chunked_keep_alive_and_pipelined_request_after_the_body() -> None:
    seen: dict[str, Any] = {"first": threading.Event(), "gone": threading.Event()}
    with serving_app(echo_app(seen)) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            f = s.makefile("rb")
            # A chunked body, then a pipelined request, in one write: both answered, in order.
            s.sendall(b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                      + chunked(b"hello world", 4)
                      + b"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nxyz")
            assert read_response(s, f).endswith(b"\r\n\r\nhello world")
            assert read_response(s, f).endswith(b"\r\n\r\nxyz")
            # The body's end and the next request come in a later read than the head.
            s.sendall(b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
            time.sleep(0.2)
            s.sendall(chunked(b"abc" * 5000, 7000)
                      + b"GET /d HTTP/1.1\r\nHost: a\r\n\r\n")
            assert read_response(s, f).endswith(b"\r\n\r\n" + b"abc" * 5000)
            resp = read_response(s, f)
            assert resp.startswith(b"HTTP/1.1 200 ") and resp.endswith(b"\r\n\r\n")
            assert b"Connection: close" not in resp


def test_chunked_body_over_the_limit_or_badly_framed_is_refused_while_the_app_waits() -> None:
    for bad, status in ((chunked(b"x" * 3000, 1000), b"413"),   # 3,000 bytes > 2,000
                        (b"10000\r\n", b"413"),                 # one chunk announced too big
                        (b"5\r\nabcde\r\nzz\r\n", b"400")):     # not a chunk size
        seen: dict[str, Any] = {"first": threading.Event(), "gone": threading.Event()}
        with serving_app(echo_app(seen), max_body_bytes=2000) as port:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
                time.sleep(0.1)
                s.sendall(bad)
                resp = read_response(s)
                assert resp.startswith(b"HTTP/1.1 " + status + b" "), (bad, resp)
                assert b"\r\nConnection: close\r\n" in resp
                assert s.recv(100) == b""
            # The app waiting in receive() is told the client is gone.
            assert seen["gone"].wait(5), bad
