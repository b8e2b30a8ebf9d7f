"""Large static bodies: above 16 KiB the engine keeps them in a sealed memfd and sends them with
sendfile() after the head (corked with MSG_MORE); at or below it they are copied behind the head.
These tests check the bytes on the wire on both sides of that line, keep-alive and HEAD after a
large body, pipelining order, and a reader so slow that the server's socket buffer fills and
sendfile() has to wait for EPOLLOUT."""

from __future__ import annotations

import random
import socket
import time

import pytest

from _rawhttp import TIMEOUT, Conn, get, serving

pytestmark = pytest.mark.native

# Non-periodic content, so a chunk sent twice, skipped or out of place cannot go unnoticed.
BIG = random.Random(4).randbytes(133622)
AT_LIMIT = random.Random(5).randbytes(16384)
OVER_LIMIT = random.Random(6).randbytes(16385)


@pytest.fixture(scope="module")
def port():
    routes = [
        ("path", "/big", None, "static", (200, [("Content-Type", "application/json")], BIG)),
        ("path", "/at", ("GET",), "static", (200, [], AT_LIMIT)),
        ("path", "/over", ("GET",), "static", (200, [], OVER_LIMIT)),
        ("path", "/small", ("GET",), "static", (200, [], b"small")),
        ("path", "/missing", None, "static", (404, [("X-Why", "big 404")], BIG)),
    ]
    with serving(routes, threads=2) as srv:
        yield srv.port


@pytest.mark.parametrize(("path", "body"), [("/big", BIG), ("/at", AT_LIMIT),
                                            ("/over", OVER_LIMIT), ("/small", b"small")])
def test_exact_bytes_and_keep_alive(port, path, body):
    with Conn(port) as c:
        for _ in range(3):
            c.send(get(path))
            r = c.reply()
            assert (r.status, r.header("content-length")) == (200, str(len(body)))
            assert r.header("connection") is None
            assert r.body == body
        assert c.buf == b""


def test_large_body_with_other_status_and_headers(port):
    with Conn(port) as c:
        c.send(get("/missing"))
        r = c.reply()
        assert (r.status, r.header("x-why"), r.body) == (404, "big 404", BIG)


def test_head_has_no_body(port):
    with Conn(port) as c:
        c.send(b"HEAD /big HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply(head_only=True)
        assert (r.status, r.header("content-length")) == (200, str(len(BIG)))
        assert r.header("content-type") == "application/json"
        # The next reply starts right after the HEAD answer's empty line: no body bytes between.
        c.send(get("/small"))
        r = c.reply()
        assert (r.status, r.body) == (200, b"small")
        assert c.buf == b""


def test_pipelined_large_and_small_in_order(port):
    order = ["/big", "/small", "/over", "/big", "/at", "/small", "/big"]
    bodies = {"/big": BIG, "/small": b"small", "/over": OVER_LIMIT, "/at": AT_LIMIT}
    with Conn(port) as c:
        c.send(b"".join(get(p) for p in order) +
               b"HEAD /big HTTP/1.1\r\nHost: t\r\n\r\n" + get("/small"))
        for p in order:
            assert c.reply().body == bodies[p], p
        r = c.reply(head_only=True)
        assert r.header("content-length") == str(len(BIG))
        assert c.reply().body == b"small"


def test_connection_close_after_large_body(port):
    with Conn(port) as c:
        c.send(b"GET /big HTTP/1.0\r\nHost: t\r\n\r\n")
        r = c.reply()
        assert (r.status, r.header("connection"), r.body) == (200, "close", BIG)
        assert c.is_closed()


def _slow_conn(port: int) -> Conn:
    """A Conn whose socket has a tiny receive buffer (set before connecting, so the advertised
    window is small from the start)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(TIMEOUT)
    sock.connect(("127.0.0.1", port))
    c = Conn.__new__(Conn)
    c.sock, c.buf = sock, b""
    return c


def test_slow_reader_gets_every_byte(port):
    # 40 pipelined responses of 133,622 bytes (5.3 MB) against a 4 KiB receive window: more
    # than any socket send buffer holds, so the server's sendfile() hits EAGAIN and waits for
    # EPOLLOUT many times. The client then reads in small pieces with pauses.
    n = 40
    with _slow_conn(port) as c:
        c.send(get("/big") * (n - 1) + get("/small"))
        time.sleep(0.3)
        raw = bytearray()
        while True:
            chunk = c.sock.recv(8192)
            assert chunk, "server closed the connection early"
            raw += chunk
            if raw.endswith(b"\r\n\r\nsmall"):
                break
            if len(raw) % (256 * 1024) < 8192:
                time.sleep(0.005)
        c.buf = bytes(raw)
        for i in range(n - 1):
            r = c.reply()
            assert (r.status, len(r.body)) == (200, len(BIG)), i
            assert r.body == BIG, i
        assert c.reply().body == b"small"
        assert c.buf == b""
        # The connection is still usable after all that waiting.
        c.send(get("/over"))
        assert c.reply().body == OVER_LIMIT


def test_slow_but_steady_reader_is_not_cut():
    """A response write's deadline is about progress: a client reading a large response slowly
    but steadily must get all of it. Linux reports a full socket writable only once about a third
    of its send buffer has drained, which at ~1 MB/s takes longer than a 0.5 s body_timeout, so
    waiting for EPOLLOUT alone cut such a reader off after a few MB (sendfile and send paths)."""
    big = random.Random(7).randbytes(5 << 20)
    routes = [
        ("path", "/static", None, "static", (200, [], big)),
        ("path", "/py", None, "python", lambda req: big),
    ]
    with serving(routes, threads=1, body_timeout=0.5) as srv:
        for path in ("/static", "/py"):
            with Conn(srv.port) as c:
                c.send(get(path))
                raw = bytearray()
                t0 = time.monotonic()
                need = None  # the total once the head is in
                while need is None or len(raw) < need:
                    chunk = c.sock.recv(16384)
                    assert chunk, f"{path}: cut after {len(raw)} bytes"
                    raw += chunk
                    if need is None and b"\r\n\r\n" in raw:
                        need = raw.index(b"\r\n\r\n") + 4 + len(big)
                    # Pace to about 1.2 MB/s.
                    lag = len(raw) / 1.2e6 - (time.monotonic() - t0)
                    if lag > 0:
                        time.sleep(lag)
                head, _, body = bytes(raw).partition(b"\r\n\r\n")
                assert body == big, path
