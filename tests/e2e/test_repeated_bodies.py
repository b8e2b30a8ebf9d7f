"""A large bytes body that is the same object response after response (a module constant, a
cached page) is copied once into a sealed memfd and sent from it with sendfile; one made afresh
per response is lent as before. These tests check the bytes on the wire in both cases, that a
body never goes out under another one's identity (two objects of the same length, a fresh
object at a freed one's address), that the memfd exists while the body is being sent and is
let go with the body's reference about a second after its last use, and at a stop."""

from __future__ import annotations

import gc
import os
import random
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from _rawhttp import Conn, get, request, serving

import cyserve
from cyserve._core import _bodies_kept_idle_ms
from cyserve.app import as_app

pytestmark = pytest.mark.native

SAME = random.Random(21).randbytes(133622)
OTHER = random.Random(22).randbytes(133622)  # the same length, other bytes
SMALLEST = random.Random(23).randbytes(16385)  # the smallest body kept in a memfd
AT = random.Random(24).randbytes(16384)  # copied behind the head: never kept
BIGGEST = random.Random(25).randbytes(2 << 20)  # the largest kept
TOO_BIG = random.Random(26).randbytes((2 << 20) + 1)
BODIES = {"/same": SAME, "/other": OTHER, "/smallest": SMALLEST, "/at": AT,
          "/biggest": BIGGEST, "/too-big": TOO_BIG}


def memfds() -> int:
    """The memfds of large bodies this process holds open: distinct files, since a response
    sends from a descriptor of its own (a dup, closed a moment after the client has it all)."""
    files = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "memfd:cyserve-static" in os.readlink(f"/proc/self/fd/{fd}"):
                files.add(os.stat(f"/proc/self/fd/{fd}").st_ino)
        except OSError:
            pass
    return len(files)


def refs() -> dict[str, int]:
    gc.collect()
    return {k: sys.getrefcount(v) for k, v in BODIES.items()}


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    path = environ["PATH_INFO"]
    if path.startswith("/fresh/"):
        # A new object per response, each time with other bytes, of one length: freed after
        # its answer, so the next one may well be made at its address.
        n = int(path.rsplit("/", 1)[1])
        body = bytes([n % 251]) * 70000
    elif path == "/small":
        body = b"small"
    else:
        body = BODIES[path]
    start_response("200 OK", [("Content-Type", "application/octet-stream"),
                              ("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture(autouse=True)
def kept_long() -> Iterator[None]:
    """However slow the machine, nothing is let go for being unused between two requests of a
    test (settle puts the default second back)."""
    was = _bodies_kept_idle_ms(600000)
    yield
    _bodies_kept_idle_ms(was)


def settle(port: int, before: dict[str, int], fds: int) -> None:
    """Unused for a second (the default), the kept bodies are let go at the next Python call:
    make calls until they are (a body kept for good fails the test)."""
    long = _bodies_kept_idle_ms(1000)
    try:
        deadline = time.monotonic() + 10
        while (refs() != before or memfds() != fds) and time.monotonic() < deadline:
            request(port, get("/small"))
            time.sleep(0.05)
        assert refs() == before
        assert memfds() == fds
    finally:
        _bodies_kept_idle_ms(long)


@pytest.mark.parametrize("path", ["/same", "/smallest", "/biggest"])
def test_a_body_sent_again_goes_out_from_a_memfd(path: str) -> None:
    with serving(as_app(wsgi_app).build()) as srv:
        before, fds = refs(), memfds()
        with Conn(srv.port) as c:
            for i in range(4):
                c.send(get(path))
                r = c.reply()
                assert (r.status, r.header("content-length")) == (200, str(len(BODIES[path])))
                assert r.header("content-type") == "application/octet-stream"
                assert r.body == BODIES[path]
                if i >= 1:  # back while a candidate slot held it: kept from its second answer
                    assert memfds() == fds + 1
                    assert refs()[path] == before[path] + 1
            # Pipelined, with a HEAD between: in order, and the HEAD without body bytes.
            c.send(get(path) + b"HEAD " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n\r\n"
                   + get("/small"))
            assert c.reply().body == BODIES[path]
            assert c.reply(head_only=True).header("content-length") == str(len(BODIES[path]))
            assert c.reply().body == b"small"
            assert c.buf == b""
        settle(srv.port, before, fds)
        # Let go, it is kept again when it comes back.
        for _ in range(2):
            assert request(srv.port, get(path)).body == BODIES[path]
        assert memfds() == fds + 1
        settle(srv.port, before, fds)


@pytest.mark.parametrize("path", ["/at", "/too-big"])
def test_bodies_outside_the_sizes_are_not_kept(path: str) -> None:
    with serving(as_app(wsgi_app).build()) as srv:
        fds = memfds()
        with Conn(srv.port) as c:
            for _ in range(3):
                c.send(get(path))
                assert c.reply().body == BODIES[path]
        assert memfds() == fds


def test_two_objects_of_one_length_each_get_their_own_bytes() -> None:
    with serving(as_app(wsgi_app).build()) as srv:
        before, fds = refs(), memfds()
        with Conn(srv.port) as c:
            for path in ("/same", "/other") * 4:
                c.send(get(path))
                assert c.reply().body == BODIES[path]
        assert memfds() == fds + 2
        settle(srv.port, before, fds)


def test_a_body_made_per_response_is_never_kept() -> None:
    with serving(as_app(wsgi_app).build()) as srv:
        fds = memfds()
        with Conn(srv.port) as c:
            for i in range(40):
                c.send(get(f"/fresh/{i}"))
                r = c.reply()
                assert r.body == bytes([i % 251]) * 70000
        assert memfds() == fds


def test_app_handler_bytes_and_response_bodies() -> None:
    app = cyserve.App()

    @app.get("/bytes")
    def as_bytes(req: Any) -> bytes:
        return SAME

    @app.get("/response")
    def as_response(req: Any) -> cyserve.Response:
        return cyserve.Response(OTHER, status=201, content_type="application/x-test")

    @app.get("/small")
    def small(req: Any) -> str:
        return "small"

    with serving(app.build()) as srv:
        before, fds = refs(), memfds()
        with Conn(srv.port) as c:
            for _ in range(3):
                c.send(get("/bytes") + get("/response"))
                r = c.reply()
                assert (r.status, r.body) == (200, SAME)
                assert r.header("content-type") == "application/octet-stream"
                r = c.reply()
                assert (r.status, r.body) == (201, OTHER)
                assert r.header("content-type") == "application/x-test"
        assert memfds() == fds + 2
        settle(srv.port, before, fds)


def test_the_stop_lets_go_of_every_kept_body() -> None:
    with serving(as_app(wsgi_app).build()) as srv:
        before, fds = refs(), memfds()
        for _ in range(3):
            assert request(srv.port, get("/same")).body == SAME
        assert memfds() == fds + 1
    assert refs() == before
    assert memfds() == fds


def test_the_bounds_in_another_process() -> None:
    # 64 bodies at most are kept, 32 MiB in all: past that they are lent, and bytes stay right.
    # In a process of its own, so that what it keeps (and its idle time) does not meet the
    # other tests'.
    script = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, sys.argv[1])
        from _rawhttp import get, request, serving
        from cyserve._core import _bodies_kept_idle_ms
        from cyserve.app import as_app

        # However slow the machine, nothing is let go for being unused during the test.
        _bodies_kept_idle_ms(600000)

        def memfds():
            files = set()
            for fd in os.listdir("/proc/self/fd"):
                try:
                    if "memfd:cyserve-static" in os.readlink(f"/proc/self/fd/{fd}"):
                        files.add(os.stat(f"/proc/self/fd/{fd}").st_ino)
                except OSError:
                    pass
            return len(files)

        bodies = [bytes([i]) * 20000 for i in range(70)]
        big = [bytes([i]) * (2 << 20) for i in range(20)]

        def app(environ, start_response):
            kind, i = environ["PATH_INFO"].split("/")[1:]
            body = (bodies if kind == "b" else big)[int(i)]
            start_response("200 OK", [("Content-Length", str(len(body)))])
            return [body]

        with serving(as_app(app).build()) as srv:
            fds = memfds()
            for i in range(70):
                for _ in range(2):
                    assert request(srv.port, get(f"/b/{i}")).body == bodies[i]
            assert memfds() == fds + 64, memfds() - fds
        with serving(as_app(app).build()) as srv:
            fds = memfds()
            for i in range(20):
                for _ in range(2):
                    assert request(srv.port, get(f"/g/{i}")).body == big[i]
            assert memfds() == fds + 16, memfds() - fds  # 16 x 2 MiB = 32 MiB
        print("ok")
        """)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", script, here], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def h2c_get(port: int, path: str) -> tuple[int, bytes]:
    """One GET over h2c by prior knowledge: the status and the body."""
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                                (":authority", "localhost")], end_stream=True)
        s.sendall(conn.data_to_send())
        status, body = 0, b""
        while True:
            data = s.recv(65536)
            assert data, "connection closed"
            for e in conn.receive_data(data):
                if isinstance(e, h2.events.ResponseReceived):
                    status = int(dict(e.headers)[b":status"])
                elif isinstance(e, h2.events.DataReceived):
                    body += e.data
                    conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                elif isinstance(e, h2.events.StreamEnded):
                    return status, body
            s.sendall(conn.data_to_send())


def test_a_kept_body_over_http2() -> None:
    with serving(as_app(wsgi_app).build(), http2=True) as srv:
        fds = memfds()
        for _ in range(3):
            assert h2c_get(srv.port, "/same") == (200, SAME)
        assert memfds() == fds + 1
