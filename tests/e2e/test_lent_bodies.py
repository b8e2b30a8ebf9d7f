"""Large Python bodies sent from the object's own buffer: a bytes body of 8 KiB or more (a
WSGI app's list item or streamed piece, an App handler's bytes or Response) is lent to the engine,
which writes it without copying it and hands its reference back once written; the next Python
call (or the stop) drops it. These tests check the bytes on the wire on both sides of the size
where lending starts (8 KiB), and that every reference is dropped on every path: written, HEAD,
the client gone midway, the server stopped midway. wsgi.file_wrapper over a real file goes out
with sendfile; over anything else it is iterated as before."""

from __future__ import annotations

import gc
import io
import os
import random
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _procfd import fd_targets
from _rawhttp import Conn, get, request, serving

import cyserve
from cyserve._core import Server
from cyserve.app import as_app

pytestmark = pytest.mark.native

BIG = random.Random(7).randbytes(133622)
UNDER = random.Random(11).randbytes(8191)  # copied: lending starts at 8 KiB
AT = random.Random(8).randbytes(16384)  # lent, and copied behind the head by the engine
OVER = random.Random(9).randbytes(16385)
HUGE = random.Random(10).randbytes(8 << 20)  # more than any socket buffer holds
BODIES = {"/big": BIG, "/under": UNDER, "/at": AT, "/over": OVER, "/small": b"small", "/huge": HUGE}


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    body = BODIES[environ["PATH_INFO"]]
    start_response("200 OK", [("Content-Type", "application/octet-stream"),
                              ("Content-Length", str(len(body)))])
    return [body]


def py_app() -> cyserve.App:
    app = cyserve.App()

    @app.get("/bytes/{name}")
    def as_bytes(req: Any) -> bytes:
        return BODIES["/" + req.params["name"]]

    @app.get("/response/{name}")
    def as_response(req: Any) -> cyserve.Response:
        return cyserve.Response(BODIES["/" + req.params["name"]], status=201,
                                content_type="application/x-test")

    @app.get("/ping")
    def ping(req: Any) -> str:
        return "pong"

    return app


def refs() -> dict[str, int]:
    gc.collect()
    return {k: sys.getrefcount(v) for k, v in BODIES.items()}


def settle(port: int, before: dict[str, int], path: str = "/small") -> None:
    """The references the engine held are dropped by the next Python call: make calls until
    they are (a reference kept for good fails the test)."""
    deadline = time.monotonic() + 10
    while refs() != before and time.monotonic() < deadline:
        request(port, get(path))
        time.sleep(0.01)
    assert refs() == before


@pytest.mark.parametrize("path", ["/big", "/under", "/at", "/over", "/small"])
def test_wsgi_bytes_on_the_wire_and_every_reference_dropped(path: str) -> None:
    with serving(as_app(wsgi_app).build()) as srv:
        before = refs()
        with Conn(srv.port) as c:
            for _ in range(3):
                c.send(get(path))
                r = c.reply()
                assert (r.status, r.header("content-length")) == (200, str(len(BODIES[path])))
                assert r.body == BODIES[path]
            # Pipelined, with a HEAD between: in order, and the HEAD without body bytes.
            c.send(get(path) + b"HEAD " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n\r\n"
                   + get("/small"))
            assert c.reply().body == BODIES[path]
            assert c.reply(head_only=True).header("content-length") == str(len(BODIES[path]))
            assert c.reply().body == b"small"
            assert c.buf == b""
        settle(srv.port, before)


@pytest.mark.parametrize("kind", ["bytes", "response"])
def test_app_handler_bodies_are_lent_too(kind: str) -> None:
    with serving(py_app().build()) as srv:
        before = refs()
        with Conn(srv.port) as c:
            for name in ("big", "over", "at", "under", "small", "big"):
                c.send(get(f"/{kind}/{name}"))
                r = c.reply()
                assert r.body == BODIES["/" + name]
                assert r.status == (201 if kind == "response" else 200)
        settle(srv.port, before, "/ping")


def test_a_streamed_answer_lends_each_piece() -> None:
    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [])
        yield BIG
        yield OVER
        yield b"tail"

    with serving(as_app(app).build()) as srv:
        before = refs()
        with Conn(srv.port) as c:
            c.send(get("/"))
            r = c.reply()
            assert r.header("transfer-encoding") == "chunked"
            assert r.body == BIG + OVER + b"tail"
        settle(srv.port, before)


def test_a_client_gone_midway_drops_the_reference() -> None:
    with serving(as_app(wsgi_app).build()) as srv:
        before = refs()
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(get("/huge"))
            assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
            # Closing with unread bytes resets the connection: the server's write fails.
            s.close()
        settle(srv.port, before)


def test_the_stop_midway_drops_the_reference() -> None:
    # A reader that reads nothing holds the answer in its write past the grace period: the stop
    # cancels it, and the reference comes back with the cancelled coroutine.
    for app, path in ((as_app(wsgi_app).build(), "/huge"), (py_app().build(), "/bytes/huge")):
        srv = Server(app, host="127.0.0.1", port=0, threads=2)
        srv.start()
        before = refs()
        try:
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.sendall(get(path))
                assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
                # Lent, not copied: the engine holds the body itself while it waits.
                assert refs()["/huge"] == before["/huge"] + 1
                srv.stop(grace=0.2)
                assert refs() == before
        finally:
            srv.stop(grace=0)


# ---- wsgi.file_wrapper ----------------------------------------------------------------------

@pytest.fixture()
def data_file() -> Iterator[str]:
    fd, path = tempfile.mkstemp()
    with os.fdopen(fd, "wb") as f:
        f.write(BIG)
    yield path
    os.unlink(path)


def file_app(path: str, opened: list[Any]) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        q = environ["QUERY_STRING"]
        headers = [("Content-Type", "application/json")]
        if q == "bytesio":
            f: Any = io.BytesIO(BIG)
        else:
            f = open(path, "rb")  # noqa: SIM115 - the server closes it through the wrapper
            if q == "seek":
                f.seek(1000)
            if q == "length":
                headers.append(("Content-Length", str(len(BIG))))
            if q == "short":
                headers.append(("Content-Length", "10"))
        opened.append(f)
        start_response("200 OK", headers)
        return environ["wsgi.file_wrapper"](f, 8192)
    return app


@pytest.mark.parametrize(("q", "body", "length"), [
    ("", BIG, str(len(BIG))),            # sendfile: the file's length is announced
    ("seek", BIG[1000:], str(len(BIG) - 1000)),  # from where the file stands
    ("length", BIG, str(len(BIG))),
    ("bytesio", BIG, None),              # no file: iterated, streamed as before
])
def test_file_wrapper_bodies(data_file: str, q: str, body: bytes, length: str | None) -> None:
    opened: list[Any] = []
    with serving(as_app(file_app(data_file, opened)).build()) as srv, Conn(srv.port) as c:
        for _ in range(2):
            c.send(get("/f?" + q))
            r = c.reply()
            assert (r.status, r.header("content-length"), r.body) == (200, length, body)
            assert r.header("content-type") == "application/json"
        if length is not None:
            c.send(b"HEAD /f?" + q.encode() + b" HTTP/1.1\r\nHost: t\r\n\r\n" + get("/f?" + q))
            assert c.reply(head_only=True).header("content-length") == length
            assert c.reply().body == body
        assert c.buf == b""
    assert opened and all(f.closed for f in opened)


def test_file_wrapper_with_a_wrong_length_is_still_the_apps_error(data_file: str) -> None:
    opened: list[Any] = []
    with serving(as_app(file_app(data_file, opened)).build()) as srv:
        assert request(srv.port, get("/f?short")).status == 500
        assert request(srv.port, get("/f?")).body == BIG
    assert all(f.closed for f in opened)


def test_a_file_answer_that_fails_closes_the_descriptor_it_took(data_file: str) -> None:
    # The answer takes its own descriptor of the file (a dup) as soon as the app returns the
    # wrapper; the app's close of its body then fails the answer, and that descriptor must be
    # closed with it, not leaked once per request. Only the file's own descriptors are
    # counted: the process opens others (the engine's, the test runner's) at its own times.
    class FailingClose(io.FileIO):
        def close(self) -> None:
            super().close()
            raise OSError("the close failed")

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return environ["wsgi.file_wrapper"](FailingClose(data_file, "rb"), 8192)

    with serving(as_app(app).build()) as srv, Conn(srv.port) as c:
        for _ in range(5):
            c.send(get("/"))
            assert c.reply().status == 500
        gc.collect()
        assert os.path.realpath(data_file) not in fd_targets().values()
