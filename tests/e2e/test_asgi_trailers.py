"""The ASGI HTTP Trailers extension (native/asgi.pyx, _Exchange._body_trailed and _trailers;
the engine's resp_add_trailer, http_write_chunked_end and h2_submit_trailers): advertised in the
http scope; `trailers: True` in the start makes the body go out chunked on HTTP/1.1 (no
Content-Length, even one the app gave), and the response ends with the last
`http.response.trailers` message. The trailers reach a client that sent `TE: trailers` (in the
trailer section of the chunked body, or in the HEADERS frame that ends an HTTP/2 stream) and are
dropped for others and after an HTTP/1.0 request. A gRPC-style answer (grpc-status in the
trailers, and a trailers-only error) over h2c and h2 by ALPN. Trailers the app must not send are
refused by send() with an error that names the problem, and nothing malformed goes out."""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import time
from typing import Any

import h2.events
import pytest
from _certs import self_signed
from _rawhttp import Conn, get
from test_asgi import serving_app
from test_http2 import H2

pytestmark = pytest.mark.native

Scope = dict[str, Any]

# The framing a gRPC message has in a body: a compression flag, a 4-byte length, the message.
GRPC_REPLY = b"\x00" + struct.pack(">I", 5) + b"hello"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return self_signed(tmp_path_factory.mktemp("trailers-tls"))


def make_app() -> Any:
    """/two: a body in two pieces then trailers in two messages; /grpc and /grpc-error: gRPC's
    shapes; /head: for HEAD; /refused/<case>: a send() that must be refused, answered with the
    error's text in the trailers; /let-go/<case>: the same error left to the app's caller;
    /no-trailers: trailers announced, never sent."""
    seen: list[Any] = []
    errors: list[str] = []

    async def start(send: Any, headers: list | None = None) -> None:
        await send({"type": "http.response.start", "status": 200, "trailers": True,
                    "headers": headers or [(b"content-type", b"text/plain"),
                                           (b"trailer", b"x-checksum, grpc-status")]})

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen.append(scope["extensions"])
        path = scope["path"]
        if path == "/two":
            # The app's Content-Length is not announced: a chunked body cannot have one.
            await start(send, [(b"content-length", b"11"), (b"trailer", b"x-checksum")])
            await send({"type": "http.response.body", "body": b"hello ", "more_body": True})
            await send({"type": "http.response.body", "body": b"world"})
            await send({"type": "http.response.trailers",
                        "headers": [(b"x-checksum", b"abc")], "more_trailers": True})
            await send({"type": "http.response.trailers", "headers": [(b"grpc-status", b"0")]})
            return
        if path in ("/grpc", "/grpc-error"):
            await start(send, [(b"content-type", b"application/grpc")])
            ok = path == "/grpc"
            await send({"type": "http.response.body", "body": GRPC_REPLY if ok else b""})
            await send({"type": "http.response.trailers", "headers": [
                (b"grpc-status", b"0" if ok else b"12"),
                (b"grpc-message", b"" if ok else b"unimplemented method")]})
            return
        if path == "/head":
            await start(send)
            await send({"type": "http.response.body", "body": b"not sent to HEAD"})
            await send({"type": "http.response.trailers", "headers": [(b"x-checksum", b"1")]})
            return
        if path == "/no-trailers":
            await start(send)
            await send({"type": "http.response.body", "body": b"partial"})
            return
        case = path.rsplit("/", 1)[-1]
        trailer = {"name": [(b"bad name", b"1")], "pseudo": [(b":status", b"200")],
                   "length": [(b"content-length", b"3")], "te": [(b"TE", b"trailers")],
                   "crlf": [(b"x-split", b"1\r\nx-evil: 2")], "nul": [(b"x-nul", b"a\x00b")]}
        try:
            if case == "unannounced":
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b"body"})
                await send({"type": "http.response.trailers", "headers": []})
                return
            await start(send)
            if case == "early":
                await send({"type": "http.response.body", "body": b"begun", "more_body": True})
                await send({"type": "http.response.trailers", "headers": []})
            else:
                await send({"type": "http.response.body", "body": b"body"})
                if case == "body-after":
                    await send({"type": "http.response.body", "body": b"more"})
                else:
                    await send({"type": "http.response.trailers", "headers": trailer[case]})
        except (RuntimeError, ValueError) as exc:
            errors.append(f"{case}: {exc}")
            if path.startswith("/let-go/"):
                raise
            if case == "unannounced":
                return  # the answer was complete before the refusal
            if case == "early":
                await send({"type": "http.response.body", "body": b""})
            await send({"type": "http.response.trailers", "headers": [(b"x-refused", b"yes")]})
            return
        errors.append(f"{case}: not refused")

    app.seen = seen  # type: ignore[attr-defined]
    app.errors = errors  # type: ignore[attr-defined]
    return app


TE = "TE: trailers\r\n"


def test_http11_chunked_end_with_trailers() -> None:
    app = make_app()
    with serving_app(app) as port, Conn(port) as c:
        c.send(get("/two", extra=TE))
        head = c.read_until(b"\r\n\r\n").lower()
        assert head.startswith(b"http/1.1 200 ")
        assert b"\r\ntransfer-encoding: chunked\r\n" in head
        assert b"content-length" not in head and b"\r\ntrailer: x-checksum\r\n" in head
        # The exact bytes: the two pieces, the last chunk, the fields, the empty line.
        want = (b"6\r\nhello \r\n5\r\nworld\r\n"
                b"0\r\nx-checksum: abc\r\ngrpc-status: 0\r\n\r\n")
        assert c.read_exact(len(want)) == want
        # The answer ended cleanly: the connection serves on, and a client that did not ask
        # for trailers gets the same body without them.
        c.send(get("/two"))
        head = c.read_until(b"\r\n\r\n").lower()
        assert b"transfer-encoding: chunked" in head
        want = b"6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n"
        assert c.read_exact(len(want)) == want
        # A list of t-codings, in any case, finds "trailers" too.
        c.send(get("/grpc-error", extra="TE: deflate;q=0.5 ,  Trailers\r\n"))
        c.read_until(b"\r\n\r\n")
        want = b"0\r\ngrpc-status: 12\r\ngrpc-message: unimplemented method\r\n\r\n"
        assert c.read_exact(len(want)) == want
        # HEAD: the head alone, with no length (GET's body would be chunked); the trailers go
        # nowhere and the next answer is read cleanly.
        c.send(b"HEAD /head HTTP/1.1\r\nHost: t\r\nTE: trailers\r\n\r\n")
        r = c.reply(head_only=True)
        assert r.status == 200 and r.header("content-length") is None
        c.send(get("/grpc", extra=TE))
        c.read_until(b"\r\n\r\n")
        want = (b"a\r\n" + GRPC_REPLY + b"\r\n0\r\ngrpc-status: 0\r\ngrpc-message: \r\n\r\n")
        assert c.read_exact(len(want)) == want
    assert app.seen and all(e == {"http.response.pathsend": {}, "http.response.trailers": {}}
                            for e in app.seen)
    assert app.errors == []


def test_http10_drops_them() -> None:
    with serving_app(make_app()) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /two HTTP/1.0\r\nHost: t\r\nTE: trailers\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"transfer-encoding" not in head.lower() and b"content-length" not in head.lower()
        assert b"connection: close" in head.lower()
        assert body == b"hello world"  # the close ends it; no trailer section


def trailers_of(c: H2, sid: int) -> list[tuple[bytes, bytes]] | None:
    """The trailers stream sid ended with (its events are read already), or None."""
    for e in c.events:
        if isinstance(e, h2.events.TrailersReceived) and e.stream_id == sid:
            assert e.stream_ended is not None, "the trailers end the stream"
            return list(e.headers)
    return None


def check_h2(c: H2) -> None:
    te = [("te", "trailers")]
    sid = c.send("/two", headers=te)
    status, headers, body = c.response(sid)
    assert (status, body) == (200, b"hello world") and "content-length" not in headers
    assert trailers_of(c, sid) == [(b"x-checksum", b"abc"), (b"grpc-status", b"0")]
    sid = c.send("/two")  # no TE: trailers: the DATA frame ends the stream
    assert c.response(sid)[2] == b"hello world" and trailers_of(c, sid) is None
    sid = c.send("/grpc", method="POST", headers=te + [("content-type", "application/grpc")],
                 body=b"\x00\x00\x00\x00\x00")
    status, headers, body = c.response(sid)
    assert (status, headers["content-type"], body) == (200, "application/grpc", GRPC_REPLY)
    assert trailers_of(c, sid) == [(b"grpc-status", b"0"), (b"grpc-message", b"")]
    sid = c.send("/grpc-error", method="POST", headers=te, body=b"\x00\x00\x00\x00\x00")
    status, headers, body = c.response(sid)
    assert (status, body) == (200, b"")
    assert trailers_of(c, sid) == [(b"grpc-status", b"12"),
                                   (b"grpc-message", b"unimplemented method")]
    sid = c.send("/head", method="HEAD", headers=te)
    assert c.response(sid)[2] == b"" and trailers_of(c, sid) is None


def test_h2c_and_h2_over_tls(certs: dict[str, str]) -> None:
    app = make_app()
    with serving_app(app) as port, H2(port) as c:
        check_h2(c)
    with serving_app(app, ssl_certfile=certs["cert"], ssl_keyfile=certs["key"]) as port:
        ctx = ssl.create_default_context(cafile=certs["cert"])
        ctx.set_alpn_protocols(["h2"])
        with H2(port, tls=ctx) as c:
            check_h2(c)
        # HTTP/1.1 over TLS: the same trailer section.
        ctx1 = ssl.create_default_context(cafile=certs["cert"])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                ctx1.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(get("/two", extra=TE + "Connection: close\r\n"))
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        assert data.endswith(b"\r\n\r\n6\r\nhello \r\n5\r\nworld\r\n"
                             b"0\r\nx-checksum: abc\r\ngrpc-status: 0\r\n\r\n")
    assert {"tls", "http.response.pathsend", "http.response.trailers"} == set(app.seen[-1])
    assert app.errors == []


REFUSED = {
    "name": "invalid trailer b'bad name'",
    "pseudo": "invalid trailer b':status'",
    "length": "b'content-length' cannot be a trailer",
    "te": "b'TE' cannot be a trailer",
    "crlf": "invalid trailer b'x-split'",
    "nul": "invalid trailer b'x-nul'",
    "unannounced": "did not announce them (trailers: True)",
    "early": "http.response.trailers before the body's last message",
    "body-after": "http.response.body after the body's last message",
}


def test_refused_trailers() -> None:
    app = make_app()
    with serving_app(app) as port, Conn(port) as c:
        for case in REFUSED:
            c.send(get(f"/refused/{case}", extra=TE))
            head = c.read_until(b"\r\n\r\n").lower()
            if case == "unannounced":  # a whole answer went out before the refusal
                assert b"content-length: 4\r\n" in head
                assert c.read_exact(4) == b"body"
                continue
            # The refused fields never reach the wire; the app's next message ends the answer.
            tail = c.read_until(b"0\r\nx-refused: yes\r\n\r\n")
            assert b"x-evil" not in tail and b":status" not in tail and b"x-nul" not in tail
            assert tail.endswith(b"\r\n0\r\nx-refused: yes\r\n\r\n"), (case, tail)
    got = dict(e.split(": ", 1) for e in app.errors)
    assert set(got) == set(REFUSED)
    for case, text in REFUSED.items():
        assert text in got[case], (case, got[case])


@pytest.mark.parametrize("case", ["name", "crlf", "length"])
def test_an_error_let_go_cuts_the_body(case: str, caplog: pytest.LogCaptureFixture) -> None:
    # The app lets send()'s error go after its body began: the connection closes without the
    # last chunk, which tells the client the body is incomplete, and no trailer went out.
    caplog.set_level(logging.ERROR, logger="cyserve.asgi")
    with serving_app(make_app()) as port, Conn(port) as c:
        c.send(get(f"/let-go/{case}", extra=TE))
        c.read_until(b"\r\n\r\n")
        assert c.read_exact(9) == b"4\r\nbody\r\n"
        assert c.is_closed()
    assert "Exception in ASGI application" in caplog.text and "ValueError" in caplog.text


def test_trailers_never_sent(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="cyserve.asgi")
    with serving_app(make_app()) as port, Conn(port) as c:
        c.send(get("/no-trailers", extra=TE))
        c.read_until(b"\r\n\r\n")
        assert c.read_exact(12) == b"7\r\npartial\r\n"
        assert c.is_closed()  # no last chunk: the body is incomplete
    assert "announced trailers but returned without sending http.response.trailers" in caplog.text


def bodyless_app() -> Any:
    """/<status>/trailers: a start announcing trailers, an empty body, one trailer field;
    /<status>/stream: a body streamed in two empty messages. Both need the engine's streamed
    path; the status (204, 304) has no content. Each app call is recorded when it ends."""
    ended: list[str] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        _, status, shape = scope["path"].split("/")
        trailers = shape == "trailers"
        await send({"type": "http.response.start", "status": int(status), "trailers": trailers,
                    "headers": [(b"etag", b'"v1"')]})
        await send({"type": "http.response.body", "body": b"", "more_body": not trailers})
        if trailers:
            await send({"type": "http.response.trailers", "headers": [(b"x-checksum", b"1")]})
        else:
            await send({"type": "http.response.body", "body": b""})
        ended.append(scope["path"])

    app.ended = ended  # type: ignore[attr-defined]
    return app


@pytest.mark.parametrize("status", [204, 304])
@pytest.mark.parametrize("shape", ["stream"])
def test_bodyless_status_sends_no_framing(status: int, shape: str) -> None:
    # A 204 or 304 ends with its head (RFC 9110 6.4.1): no last chunk, no trailer section may
    # follow it, or the client reads them as the start of the next response on the connection.
    app = bodyless_app()
    with serving_app(app) as port, Conn(port) as c:
        c.send(get(f"/{status}/{shape}", extra=TE) + get("/200/stream"))
        r = c.reply()
        assert r.status == status and r.header("etag") == '"v1"'
        assert r.header("transfer-encoding") is None and r.header("content-length") is None
        assert c.buf == b"" or c.buf.startswith(b"HTTP/1.1 200 "), c.buf
        second = c.reply()
        assert second.status == 200 and second.body == b""
        assert r.header("content-type") is None  # no content, no type (as for a whole body)
        # The app ran to its end: its body messages were taken, not refused as a client gone.
        deadline = time.monotonic() + 5
        while len(app.ended) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert app.ended == [f"/{status}/{shape}", "/200/stream"]


@pytest.mark.parametrize("status", [204, 304])
def test_bodyless_status_over_h2_is_no_client_gone(status: int) -> None:
    # Over HTTP/2 the HEADERS frame of a 204 or 304 ends the stream: the app's body and
    # trailers messages that follow are taken and dropped, not refused with ClientDisconnected
    # (the client is there, and has its answer).
    app = bodyless_app()
    with serving_app(app) as port, H2(port) as c:
        sid = c.send(f"/{status}/stream", headers=[("te", "trailers")])
        got, headers, body = c.response(sid)
        assert (got, body) == (status, b"") and headers["etag"] == '"v1"'
        assert trailers_of(c, sid) is None
        deadline = time.monotonic() + 5
        while not app.ended and time.monotonic() < deadline:
            time.sleep(0.01)
    assert app.ended == [f"/{status}/stream"]


@pytest.mark.parametrize("protocol", ["http/1.1", "h2"])
@pytest.mark.parametrize("status", [204, 304])
def test_trailers_announced_on_a_bodyless_status_are_refused(
        status: int, protocol: str, caplog: pytest.LogCaptureFixture) -> None:
    # Trailers follow a body, which a 204 or 304 cannot have: announced at http.response.start,
    # they are refused there (a RuntimeError in send(), so an app that lets it go gets a 500,
    # as a body on such a status is) rather than dropped without a word. They used to be
    # dropped. The connection serves the next request.
    app = bodyless_app()
    with caplog.at_level(logging.ERROR), serving_app(app) as port:
        if protocol == "h2":
            with H2(port) as c:
                sid = c.send(f"/{status}/trailers", headers=[("te", "trailers")])
                got, _, body = c.response(sid)
                assert (got, body) == (500, b"500 Internal Server Error\n")
                sid = c.send("/200/stream")
                assert c.response(sid)[0] == 200
        else:
            with Conn(port) as c:
                c.send(get(f"/{status}/trailers", extra=TE) + get("/200/stream"))
                r = c.reply()
                assert (r.status, r.body) == (500, b"500 Internal Server Error\n")
                assert c.reply().status == 200
        deadline = time.monotonic() + 5
        while not app.ended and time.monotonic() < deadline:
            time.sleep(0.01)
    assert app.ended == ["/200/stream"]  # the refused app raised at its start
    assert f"announces trailers for a {status} response" in caplog.text, caplog.text
