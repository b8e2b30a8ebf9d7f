"""Empty lines between requests (RFC 9112 2.2): one stray CRLF after a request is let go, as
clients send one after a POST body now and then; more count toward the next head, its size limit
(max_header_bytes: 431) and its deadline (header_timeout: 408). Every empty line used to be
dropped and to leave the connection idle again, restarting its keep-alive timer: a CRLF every
4 s held a connection for ever, and 227 KB of them in 25 s never met max_header_bytes."""

from __future__ import annotations

import socket
import time

import pytest

from _rawhttp import Conn, get, serving

pytestmark = pytest.mark.native

PLAIN = b"Hello, World!"
ROUTES = [
    ("path", "/plaintext", ("GET",), "static", (200, [("Content-Type", "text/plain")], PLAIN)),
    ("path", "/py", None, "python", lambda req: "py"),
]


def _until_closed(c: Conn, send_every: float, limit: float) -> tuple[bytes, float]:
    """Send a CRLF every send_every seconds until the server closes the connection or limit
    seconds pass; returns what the server sent and when it closed (inf if it did not)."""
    t0 = time.monotonic()
    got = b""
    c.sock.settimeout(send_every)
    while time.monotonic() - t0 < limit:
        try:
            c.sock.sendall(b"\r\n")
        except OSError:
            return got, time.monotonic() - t0
        try:
            data = c.sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return got, time.monotonic() - t0
        if not data:
            return got, time.monotonic() - t0
        got += data
    return got, float("inf")


@pytest.mark.parametrize("first", [b"", get("/plaintext"), get("/py")],
                         ids=["fresh", "after-inline", "after-coroutine"])
def test_a_slow_stream_of_crlf_meets_the_head_deadline(first: bytes) -> None:
    # A CRLF more often than the keep-alive timeout: the second one starts a head, which must be
    # complete within header_timeout. The keep-alive timeout is far above the CRLFs' period (it
    # was 0.4 s against 0.25 s: a client late by 0.15 s found the connection closed as idle,
    # with no 408).
    with serving(ROUTES, threads=1, keepalive_timeout=2.0, header_timeout=0.6) as srv:
        with Conn(srv.port) as c:
            if first:
                c.send(first)
                assert c.reply().status == 200
            got, closed_after = _until_closed(c, send_every=0.25, limit=10.0)
            print(f"\nclosed after {closed_after:.2f}s: {got[:60]!r}")
            assert got.startswith(b"HTTP/1.1 408 "), got
            # at most: one stray CRLF's keep-alive period, then the head deadline, with slack
            assert closed_after < 5.0


def test_a_flood_of_crlf_meets_max_header_bytes() -> None:
    with serving(ROUTES, threads=1) as srv:
        with Conn(srv.port) as c:
            try:
                c.sock.sendall(b"\r\n" * 16384)  # 32 KiB, four times max_header_bytes
            except OSError:
                pass  # the server may have answered and closed already
            r = c.reply()
            assert r.status == 431, (r.status, r.body)
            assert c.is_closed()


def test_one_crlf_after_each_request_is_let_go() -> None:
    # The allowance is per request: each request may be followed by one, on the inline path
    # (static), in a coroutine (Python), and pipelined with the request or sent on its own.
    with serving(ROUTES, threads=1, keepalive_timeout=5.0, header_timeout=0.5) as srv:
        with Conn(srv.port) as c:
            for path in ("/plaintext", "/py", "/plaintext", "/py"):
                c.send(get(path))
                assert c.reply().status == 200
                time.sleep(0.05)
                c.send(b"\r\n")
                time.sleep(0.05)
            c.send(get("/py") + b"\r\n")  # in the same segment
            assert c.reply().body == b"py"
            time.sleep(0.8)  # longer than header_timeout: no head was started
            c.send(get("/plaintext"))
            r = c.reply()
            assert (r.status, r.body) == (200, PLAIN)
            assert r.header("connection") != "close"


def test_empty_lines_before_a_request_are_still_skipped() -> None:
    # More than one empty line start a head; a request that follows them is served.
    with serving(ROUTES, threads=1) as srv:
        with Conn(srv.port) as c:
            c.send(b"\r\n\r\n\r\n" + get("/plaintext"))
            assert c.reply().body == PLAIN
            c.send(b"\r\n\r\n")
            time.sleep(0.05)
            c.send(get("/py"))
            assert c.reply().body == b"py"
