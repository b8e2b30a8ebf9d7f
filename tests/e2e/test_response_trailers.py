"""Trailers from the native App API and from GIL-free handlers: `Response(..., trailers=...)`
(native/python_handler.pyx) and `cyserve_resp_trailer` (native/http_api.pxi) over the engine's
resp_add_trailer. On HTTP/1.1 a whole body with trailers goes out as one chunk whatever the
client's TE (as an ASGI body that announced them), the trailer section only to a client that sent
`TE: trailers` (over plain TCP and TLS alike); an HTTP/1.0 client gets the body with its length
and no trailers. Over h2c, h2 by ALPN and the stream 1 of an `Upgrade: h2c` they are the
HEADERS frame that ends the stream. The bodies take each of the engine's ways out: copied behind
the head, sent from memory, from a memfd by sendfile, and the inline path of a GIL-free handler.
Fields that cannot be trailers are refused where they are set, with an error naming them."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
from _certs import self_signed
from _cython_ext import build_user_module
from _rawhttp import Conn, get, serving
from test_asgi_trailers import trailers_of
from test_http2 import H2, upgrade_request

import cyserve
from cyserve import Response

pytestmark = pytest.mark.native

TESTS = Path(__file__).parent.parent
TE = "TE: trailers\r\n"
# Past BODY_COPY_MAX (16 KiB): sent from the object itself, or from a memfd once the same object
# comes back (python_handler.pyx, PIN_MIN).
BIG = bytes(range(256)) * 100
TRAILERS = [("X-Checksum", "abc"), ("Grpc-Status", "0")]
SECTION = b"0\r\nX-Checksum: abc\r\nGrpc-Status: 0\r\n\r\n"


@pytest.fixture(scope="module")
def hello(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_user_module(TESTS / "cython_ext" / "hello.pyx",
                             tmp_path_factory.mktemp("cython_ext"))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return self_signed(tmp_path_factory.mktemp("trailers2-tls"))


def build_app(hello: Any) -> cyserve.App:
    app = cyserve.App()

    @app.get("/t")
    def whole(req: Any) -> Response:
        return Response("hello world", headers={"Trailer": "X-Checksum, Grpc-Status"},
                        trailers=TRAILERS)

    @app.get("/empty")
    def empty(req: Any) -> Response:
        # A gRPC-style error: no message, the status in the trailers (a mapping this time).
        return Response(b"", content_type="application/grpc",
                        trailers={"grpc-status": "12", b"grpc-message": b"unimplemented"})

    @app.get("/big-fresh")
    def big_fresh(req: Any) -> Response:
        return Response(bytes(BIG), trailers=TRAILERS)  # a new object: sent from memory

    @app.get("/big-same")
    def big_same(req: Any) -> Response:
        return Response(BIG, trailers=TRAILERS)  # the same object: from its memfd

    @app.get("/no-content")
    def no_content(req: Any) -> Response:
        return Response(status=204, trailers=TRAILERS)

    @app.get("/plain")
    def plain(req: Any) -> str:
        return "no trailers"

    app.nogil("/nogil", hello.TRAILERS)
    return app


@pytest.fixture(scope="module")
def port(hello: Any) -> Any:
    with serving(build_app(hello).build(), threads=2) as srv:
        yield srv


def chunked_head(c: Conn) -> bytes:
    head = c.read_until(b"\r\n\r\n").lower()
    assert head.startswith(b"http/1.1 200 "), head
    assert b"\r\ntransfer-encoding: chunked\r\n" in head and b"content-length" not in head
    return head


def test_python_response_http11_exact_bytes(port: Any) -> None:
    with Conn(port.port) as c:
        c.send(get("/t", extra=TE))
        head = chunked_head(c)
        assert b"\r\ntrailer: x-checksum, grpc-status\r\n" in head
        assert b"\r\ncontent-type: text/plain; charset=utf-8\r\n" in head
        want = b"b\r\nhello world\r\n" + SECTION
        assert c.read_exact(len(want)) == want
        # No TE: trailers: the same chunked body, an empty trailer section.
        c.send(get("/t"))
        chunked_head(c)
        want = b"b\r\nhello world\r\n0\r\n\r\n"
        assert c.read_exact(len(want)) == want
        # An empty body: the last chunk at once, then the fields (str and bytes names alike).
        c.send(get("/empty", extra="TE: gzip, trailers\r\n"))
        chunked_head(c)
        want = b"0\r\ngrpc-status: 12\r\ngrpc-message: unimplemented\r\n\r\n"
        assert c.read_exact(len(want)) == want
        # HEAD: GET's head (chunked), no body, no trailer section; the next answer reads cleanly.
        c.send(b"HEAD /t HTTP/1.1\r\nHost: t\r\nTE: trailers\r\n\r\n")
        chunked_head(c)
        # An answer without trailers is framed as it always was.
        c.send(get("/plain", extra=TE))
        r = c.reply()
        assert (r.status, r.header("content-length"), r.body) == (200, "11", b"no trailers")
        assert r.header("transfer-encoding") is None


@pytest.mark.parametrize("path", ["/big-fresh", "/big-same"])
def test_large_bodies_sent_from_memory_and_from_a_memfd(port: Any, path: str) -> None:
    want = b"%x\r\n" % len(BIG) + BIG + b"\r\n" + SECTION
    with Conn(port.port) as c:
        for _ in range(3):  # /big-same goes out of its memfd from the second time on
            c.send(get(path, extra=TE))
            chunked_head(c)
            assert c.read_exact(len(want)) == want


def test_http10_gets_the_body_with_its_length_and_no_trailers(port: Any) -> None:
    with socket.create_connection(("127.0.0.1", port.port), timeout=10) as s:
        s.sendall(b"GET /t HTTP/1.0\r\nHost: t\r\nTE: trailers\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head.lower()
    assert b"\r\ncontent-length: 11" in head.lower()
    assert body == b"hello world"


def test_refused_where_they_are_set() -> None:
    cases = {
        "Content-Length": "b'Content-Length' cannot be a trailer",
        "transfer-encoding": "b'transfer-encoding' cannot be a trailer",
        "TE": "b'TE' cannot be a trailer",
        "Host": "b'Host' cannot be a trailer",
        "Content-Type": "b'Content-Type' cannot be a trailer",
        "bad name": "invalid trailer b'bad name'",
        ":status": "invalid trailer b':status'",
    }
    for name, text in cases.items():
        with pytest.raises(ValueError, match="^" + text.replace("(", r"\(")):
            Response("x", trailers=[(name, "1")])
    for value in ("1\r\nX-Evil: 2", "a\x00b", "a\nb"):
        with pytest.raises(ValueError, match=r"^invalid trailer b'X-Split': a name must be a "
                                             "token"):
            Response("x", trailers=[("X-Split", value)])
    with pytest.raises(ValueError, match="is not Latin-1"):
        Response("x", trailers=[("X-Name", "\u20ac")])
    with pytest.raises(TypeError, match="trailers must be"):
        Response("x", trailers=["X-Name: 1"])
    r = Response("x")
    assert r.trailers is None
    with pytest.raises(ValueError, match="b'Trailer' cannot be a trailer"):
        r.trailers = {"Trailer": "x"}
    assert r.trailers is None  # a refused value leaves the last good one
    r.trailers = {"X-A": b"1"}
    assert r.trailers == ((b"X-A", b"1"),)


def test_no_content_with_trailers_is_an_error(port: Any, caplog: pytest.LogCaptureFixture) -> None:
    with Conn(port.port) as c:
        c.send(get("/no-content", extra=TE))
        r = c.reply()
        assert r.status == 500
    assert "a 204 response cannot have trailers (2 given)" in caplog.text


def nogil_check(c: Conn, req: bytes) -> None:
    c.send(req)
    head = chunked_head(c)
    # What the API refused: -EINVAL for a bad name, CR LF, NUL; -EPERM for Content-Length, TE.
    assert b"\r\nx-refused: -22,-22,-22,-1,-1\r\n" in head
    want = b"b\r\nhello world\r\n" + SECTION
    assert c.read_exact(len(want)) == want


LEARN = 64  # INLINE_LEARN in csrc/http1_inline.h: the calls before a route may run inline


def test_nogil_handler_inline_and_in_a_coroutine(hello: Any) -> None:
    req = get("/nogil", extra=TE)
    with serving([("path", "/nogil", None, "nogil", hello.TRAILERS)], threads=1) as srv, \
            Conn(srv.port) as c:
        for _ in range(LEARN + 8):  # the route's learning calls, in the coroutine
            nogil_check(c, req)
        before = srv.stats()["inline"]
        nogil_check(c, req)  # a lone keep-alive request: the inline path
        assert srv.stats()["inline"] == before + 1, "not answered inline"
        c.send(req + req)  # pipelined: the coroutine answers both
        for _ in range(2):
            head = chunked_head(c)
            assert b"x-refused: -22,-22,-22,-1,-1" in head
            want = b"b\r\nhello world\r\n" + SECTION
            assert c.read_exact(len(want)) == want
        assert srv.stats()["inline"] == before + 1, "a pipelined request was answered inline"
        # Inline again: without TE: trailers the same chunk and no fields; an empty body; HEAD;
        # HTTP/1.0 (the length, no trailers).
        c.send(get("/nogil"))
        chunked_head(c)
        want = b"b\r\nhello world\r\n0\r\n\r\n"
        assert c.read_exact(len(want)) == want
        c.send(get("/nogil?empty", extra=TE))
        chunked_head(c)
        assert c.read_exact(len(SECTION)) == SECTION
        c.send(b"HEAD /nogil HTTP/1.1\r\nHost: t\r\nTE: trailers\r\n\r\n")
        chunked_head(c)
        c.send(b"GET /nogil HTTP/1.0\r\nConnection: keep-alive\r\nTE: trailers\r\n\r\n")
        r = c.reply()
        assert (r.header("content-length"), r.body) == ("11", b"hello world")
        assert r.header("transfer-encoding") is None
        assert srv.stats()["inline"] == before + 5, "not answered inline"
        c.send(get("/nogil", extra=TE))  # the connection serves on, in step
        chunked_head(c)
        assert c.read_exact(len(b"b\r\nhello world\r\n" + SECTION)) == (
            b"b\r\nhello world\r\n" + SECTION)


def check_h2(c: H2) -> None:
    te = [("te", "trailers")]
    want = [(b"x-checksum", b"abc"), (b"grpc-status", b"0")]
    for path, body in [("/t", b"hello world"), ("/nogil", b"hello world"),
                       ("/big-fresh", BIG), ("/big-same", BIG), ("/big-same", BIG)]:
        sid = c.send(path, headers=te)
        status, headers, got = c.response(sid)
        assert (status, got) == (200, body), path
        assert trailers_of(c, sid) == want, path
    sid = c.send("/t")  # no TE: trailers: the DATA frame ends the stream
    assert c.response(sid)[2] == b"hello world" and trailers_of(c, sid) is None
    sid = c.send("/empty", headers=te)  # no body: a DATA frame of none, then the trailers
    status, headers, body = c.response(sid)
    assert (status, headers["content-type"], body) == (200, "application/grpc", b"")
    assert trailers_of(c, sid) == [(b"grpc-status", b"12"), (b"grpc-message", b"unimplemented")]
    sid = c.send("/empty")  # the same without TE: the HEADERS frame ends the stream
    assert c.response(sid)[2] == b"" and trailers_of(c, sid) is None
    sid = c.send("/nogil?empty", headers=te)
    assert c.response(sid)[2] == b"" and trailers_of(c, sid) == want
    sid = c.send("/t", method="HEAD", headers=te)
    assert c.response(sid)[2] == b"" and trailers_of(c, sid) is None


def test_h2c_and_h2_over_tls(hello: Any, certs: dict[str, str]) -> None:
    routes = build_app(hello).build()
    with serving(routes) as srv, H2(srv.port) as c:
        check_h2(c)
    with serving(routes, ssl_certfile=certs["cert"], ssl_keyfile=certs["key"]) as srv:
        ctx = ssl.create_default_context(cafile=certs["cert"])
        ctx.set_alpn_protocols(["h2"])
        with H2(srv.port, tls=ctx) as c:
            check_h2(c)
        # HTTP/1.1 over TLS: the same chunk framing, the memfd's body read and encrypted in
        # pieces between the chunk's size line and its CRLF.
        ctx1 = ssl.create_default_context(cafile=certs["cert"])
        big = b"%x\r\n" % len(BIG) + BIG + b"\r\n" + SECTION
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as raw, \
                ctx1.wrap_socket(raw, server_hostname="localhost") as s:
            for path, want in [("/t", b"b\r\nhello world\r\n" + SECTION), ("/big-same", big),
                               ("/big-same", big), ("/nogil", b"b\r\nhello world\r\n" + SECTION)]:
                s.sendall(get(path, extra=TE))
                data = b""
                while not data.endswith(b"\r\n\r\n" + want):
                    chunk = s.recv(65536)
                    assert chunk, (path, data[-200:])
                    data += chunk
                    assert len(data) < 2 * len(want) + 4096, (path, data[:300])
                head = data[:len(data) - len(want)].lower()
                assert b"transfer-encoding: chunked" in head and b"content-length" not in head


def upgraded(port: int, path: str, extra: bytes) -> tuple[H2, int]:
    """An HTTP/1.1 request upgraded to h2c; its answer is stream 1 of the returned client."""
    req, conn = upgrade_request(path, extra)
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(req)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    c = H2.__new__(H2)
    c.sock, c.conn, c.events, c.closed = sock, conn, [], False
    c.flush()
    if rest:
        c.events += conn.receive_data(rest)
    return c, 1


@pytest.mark.parametrize("te", [b"TE: trailers\r\n", b"TE: deflate, Trailers\r\n"])
def test_upgrade_h2c_stream_1_keeps_te_trailers(port: Any, te: bytes) -> None:
    # RFC 9113 3.1: the upgraded request is stream 1 with its headers; its TE (connection-
    # specific in HTTP/1.1) is kept as "te: trailers", the one value HTTP/2 allows, so that its
    # answer ends with the trailers.
    for path in ("/t", "/nogil"):
        c, sid = upgraded(port.port, path, te)
        with c:
            status, _, body = c.response(sid)
            assert (status, body) == (200, b"hello world")
            assert trailers_of(c, sid) == [(b"x-checksum", b"abc"), (b"grpc-status", b"0")]
            # The streams after it are served as usual.
            sid = c.send("/t", headers=[("te", "trailers")])
            assert c.response(sid)[2] == b"hello world" and trailers_of(c, sid) is not None


def test_upgrade_h2c_without_te_gets_no_trailers(port: Any) -> None:
    c, sid = upgraded(port.port, "/t", b"TE: gzip\r\n")
    with c:
        status, _, body = c.response(sid)
        assert (status, body) == (200, b"hello world") and trailers_of(c, sid) is None
