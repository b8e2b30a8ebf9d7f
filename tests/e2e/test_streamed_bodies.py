"""Request bodies streamed to WSGI apps and App handlers: a body over 64 KiB that did not arrive
with its head is read as the handler asks (wsgi.input, Request.read/stream), not whole before
the call. Chunked and fixed-length bodies, partial reads followed by keep-alive requests on the
same connection, the size limit hit midway, a client too slow, a client that leaves midway, and
bodies small enough to be read whole as before."""

from __future__ import annotations

import hashlib
import random
import socket
import threading
import time

import pytest

from _rawhttp import TIMEOUT, Conn, get, serving
from cyserve import App

pytestmark = pytest.mark.native

BIG = random.Random(13).randbytes(3 * 1024 * 1024 + 17)
# What the apps saw, for the tests to look at: (name, value) pairs.
SEEN: list[tuple[str, object]] = []


def wsgi_app(environ, start_response):
    path = environ["PATH_INFO"]
    inp = environ["wsgi.input"]
    if path == "/hash":
        h = hashlib.sha256()
        n = 0
        while True:
            piece = inp.read(65536)
            if not piece:
                break
            h.update(piece)
            n += len(piece)
        body = f"{n} {h.hexdigest()}".encode()
    elif path == "/readall":
        data = inp.read()
        body = f"{len(data)} {hashlib.sha256(data).hexdigest()}".encode()
    elif path == "/partial":
        data = inp.read(1000)
        body = f"{len(data)}".encode()
    elif path == "/lines":
        lines = list(inp)
        body = f"{len(lines)} {sum(map(len, lines))} {lines[0]!r}".encode()
    elif path == "/env":
        SEEN.append(("env", (environ.get("CONTENT_LENGTH"), environ["wsgi.input_terminated"],
                             type(inp).__name__)))
        body = str(len(inp.read())).encode()
    elif path == "/catch":
        try:
            inp.read()
            body = b"read it all"
        except OSError as exc:
            SEEN.append(("caught", exc))
            start_response("400 Bad Request", [("Content-Type", "text/plain")])
            return [f"caught {type(exc).__name__}".encode()]
    elif path == "/echo":
        def gen():
            while True:
                piece = inp.read(65536)
                if not piece:
                    return
                yield piece
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return gen()
    else:
        try:
            inp.read()
        except BaseException as exc:
            SEEN.append(("raised", exc))
            raise
        body = b"?"
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body]


def native_app() -> App:
    app = App()

    @app.post("/n/body")
    def whole(request):
        return f"{len(request.body)} {hashlib.sha256(request.body).hexdigest()}"

    @app.post("/n/stream")
    def stream(request):
        h = hashlib.sha256()
        sizes = 0
        pieces = 0
        for piece in request.stream(32768):
            assert len(piece) <= 32768
            h.update(piece)
            sizes += len(piece)
            pieces += 1
        return f"{sizes} {h.hexdigest()} {pieces > 1}"

    @app.post("/n/read")
    def read(request):
        first = request.read(10)
        rest = request.read()
        return f"{len(first)} {len(rest)} {hashlib.sha256(first + rest).hexdigest()}"

    @app.post("/n/mixed")
    def mixed(request):
        request.read(10)
        try:
            request.body
        except RuntimeError as exc:
            return f"refused: {exc}"
        return "allowed"

    @app.post("/n/bodythenread")
    def body_then_read(request):
        whole = request.body
        again = request.read(5)
        return f"{len(whole)} {again!r}"

    app.wsgi("/w", wsgi_app)
    return app


@pytest.fixture(scope="module")
def port():
    with serving(native_app().build(), threads=2, max_body_bytes=8 << 20, body_timeout=2.0,
                 min_body_rate=0) as srv:
        yield srv.port


def post(path: str, body: bytes, chunked: bool = False, extra: str = "") -> bytes:
    if chunked:
        head = (f"POST {path} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n{extra}"
                "\r\n").encode()
        return head + chunk_body(body)
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}"
            "\r\n").encode() + body


def chunk_body(body: bytes, size: int = 50000) -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
                   for i in range(0, len(body), size))
    return out + b"0\r\n\r\n"


def send_in_thread(c: Conn, data: bytes, pause: float = 0.0,
                   step: int = 1 << 20) -> threading.Thread:
    """Send data from a thread (a body larger than the socket buffers would block a send before
    the reply is read), in steps with pauses between."""
    def run():
        try:
            for i in range(0, len(data), step):
                c.sock.sendall(data[i:i + step])
                if pause:
                    time.sleep(pause)
        except OSError:
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def closed(c: Conn) -> bool:
    """The server closed the connection: nothing more than end of stream (or a reset)."""
    try:
        return c.buf == b"" and c.sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def digest(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("path", ["/w/hash", "/w/readall"])
def test_streamed_wsgi_body_then_keep_alive(port, path, chunked):
    with Conn(port) as c:
        for _ in range(2):
            t = send_in_thread(c, post(path, BIG, chunked))
            r = c.reply()
            t.join(TIMEOUT)
            assert (r.status, r.body.decode()) == (200, f"{len(BIG)} {digest(BIG)}")
            assert r.header("connection") is None
            c.send(get("/w/partial"))  # a small follow-up on the same connection
            r = c.reply()
            assert (r.status, r.body) == (200, b"0")


@pytest.mark.parametrize("chunked", [False, True])
def test_environ_of_a_streamed_body(port, chunked):
    SEEN.clear()
    with Conn(port) as c:
        t = send_in_thread(c, post("/w/env", BIG, chunked))
        r = c.reply()
        t.join(TIMEOUT)
        assert (r.status, r.body) == (200, str(len(BIG)).encode())
    length = None if chunked else str(len(BIG))
    assert SEEN == [("env", (length, True, "RequestBody"))]


def test_small_body_stays_whole(port):
    SEEN.clear()
    with Conn(port) as c:
        c.send(post("/w/env", b"x" * 1000))
        assert c.reply().body == b"1000"
    assert SEEN == [("env", ("1000", True, "BytesIO"))]


def test_lines_of_a_streamed_body(port):
    text = b"".join(b"line %d %s\n" % (i, b"y" * (i % 50)) for i in range(20000))
    with Conn(port) as c:
        t = send_in_thread(c, post("/w/lines", text, chunked=True))
        r = c.reply()
        t.join(TIMEOUT)
    n, total, first = r.body.decode().split(" ", 2)
    assert (int(n), int(total), first) == (20000, len(text), repr(b"line 0 \n"))


@pytest.mark.parametrize("chunked", [False, True])
def test_partial_read_then_keep_alive(port, chunked):
    """The app reads 1000 bytes of a 3 MiB body: the rest is not read as a request. A rest over
    the drain bound closes the connection after the answer; a rest within it is dropped and the
    connection serves the next request."""
    small = BIG[:300000]
    with Conn(port) as c:
        t = send_in_thread(c, post("/w/partial", small, chunked) + get("/w/partial"))
        r = c.reply()
        assert (r.status, r.body) == (200, b"1000")
        r = c.reply()
        t.join(TIMEOUT)
        assert (r.status, r.body) == (200, b"0")
        c.send(post("/w/partial", b"z" * 10))
        assert c.reply().body == b"10"
    with Conn(port) as c:
        t = send_in_thread(c, post("/w/partial", BIG, chunked))
        r = c.reply()
        assert (r.status, r.body, r.header("connection")) == (200, b"1000", "close")
        t.join(TIMEOUT)
        assert closed(c)


def test_pipelined_after_a_streamed_chunked_body(port):
    body = BIG[:200000]
    with Conn(port) as c:
        c.send(post("/w/readall", body, chunked=True) + get("/w/partial") +
               post("/w/readall", b"abc"))
        assert c.reply().body.decode() == f"{len(body)} {digest(body)}"
        assert c.reply().body == b"0"
        assert c.reply().body.decode() == f"3 {digest(b'abc')}"


def test_echo_reads_while_answering(port):
    body = BIG[:1 << 20]
    with Conn(port) as c:
        t = send_in_thread(c, post("/w/echo", body, chunked=True), step=65536)
        r = c.reply()
        t.join(TIMEOUT)
        assert (r.status, r.body) == (200, body)
        c.send(get("/w/partial"))
        assert c.reply().body == b"0"


def test_limit_midway_chunked(port):
    """A chunked body over max_body_bytes: the app's read raises an error naming the limit, the
    client gets 413 and the connection closes."""
    SEEN.clear()
    huge = BIG * 3  # 9 MiB > 8 MiB
    with Conn(port) as c:
        t = send_in_thread(c, post("/w/raise", huge, chunked=True))
        r = c.reply()
        assert r.status == 413
        assert b"too large" in r.body
        assert r.header("connection") == "close"
        t.join(TIMEOUT)
    (kind, exc), = SEEN
    assert kind == "raised"
    assert "max_body_bytes" in str(exc) and getattr(exc, "status", None) == 413


def test_limit_caught_by_the_app(port):
    SEEN.clear()
    with Conn(port) as c:
        t = send_in_thread(c, post("/w/catch", BIG * 3, chunked=True))
        r = c.reply()
        assert (r.status, r.body) == (400, b"caught RequestBodyTooLarge")
        assert r.header("connection") == "close"
        t.join(TIMEOUT)


def test_content_length_over_limit_refused_before_the_call(port):
    with Conn(port) as c:
        c.send(b"POST /w/hash HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999\r\n\r\n")
        r = c.reply()
        assert r.status == 413


def test_client_stops_sending(port):
    """A client that sends part of a body and then nothing: body_timeout (2 s) ends the read
    with RequestBodyTimeout, the client gets 408."""
    SEEN.clear()
    with Conn(port) as c:
        c.send(post("/w/raise", BIG)[:200000])
        r = c.reply()
        assert r.status == 408
    (kind, exc), = SEEN
    assert kind == "raised" and isinstance(exc, TimeoutError)


def test_client_leaves_midway(port):
    """A client that closes after part of the body: the app's read raises a
    ConnectionResetError naming it, and nothing hangs."""
    SEEN.clear()
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    s.sendall(post("/w/raise", BIG)[:300000])
    time.sleep(0.2)
    s.close()
    deadline = time.monotonic() + 5
    while not SEEN and time.monotonic() < deadline:
        time.sleep(0.05)
    (kind, exc), = SEEN
    assert kind == "raised" and isinstance(exc, ConnectionResetError)
    assert "client" in str(exc)
    with Conn(port) as c:  # the server goes on
        c.send(get("/w/partial"))
        assert c.reply().body == b"0"


@pytest.mark.parametrize("chunked", [False, True])
def test_native_request_stream_read_body(port, chunked):
    with Conn(port) as c:
        for path in ("/n/body", "/n/stream", "/n/read"):
            t = send_in_thread(c, post(path, BIG, chunked))
            r = c.reply()
            t.join(TIMEOUT)
            assert r.status == 200, r.body
            got = r.body.decode()
            if path == "/n/body":
                assert got == f"{len(BIG)} {digest(BIG)}"
            elif path == "/n/stream":
                assert got == f"{len(BIG)} {digest(BIG)} True"
            else:
                assert got == f"10 {len(BIG) - 10} {digest(BIG)}"


def test_native_body_after_partial_read_refused(port):
    with Conn(port) as c:
        t = send_in_thread(c, post("/n/mixed", BIG))
        r = c.reply()
        t.join(TIMEOUT)
        assert r.body.startswith(b"refused: the request body was already read in part")


def test_native_small_body_read_and_stream(port):
    with Conn(port) as c:
        for path, want in (("/n/read", f"10 5 {digest(b'0123456789abcde')}"),
                           ("/n/stream", f"15 {digest(b'0123456789abcde')} False"),
                           ("/n/bodythenread", "15 b'01234'")):
            c.send(post(path, b"0123456789abcde"))
            assert c.reply().body.decode() == want


def test_min_rate_while_streaming():
    """With a minimum rate, a client trickling a large body is cut once body_timeout of waiting
    has passed, though each byte comes within body_timeout."""
    SEEN.clear()
    with serving(native_app().build(), threads=1, body_timeout=0.5, min_body_rate=200000) as srv:
        with Conn(srv.port) as c:
            data = post("/w/raise", BIG[:1000000])
            c.send(data[:100000])
            t0 = time.monotonic()
            try:
                for i in range(100000, len(data), 2000):
                    c.sock.sendall(data[i:i + 2000])
                    time.sleep(0.1)
                    if time.monotonic() - t0 > 10:
                        break
            except OSError:
                pass
            r = c.reply()
            assert r.status == 408
            assert b"too slow" in r.body
            assert time.monotonic() - t0 < 8


def flask_app():
    import flask

    app = flask.Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = None

    @app.post("/upload")
    def upload():
        f = flask.request.files["file"]
        h = hashlib.sha256()
        n = 0
        while True:
            piece = f.stream.read(65536)
            if not piece:
                break
            h.update(piece)
            n += len(piece)
        return f"{flask.request.form['name']} {n} {h.hexdigest()}"

    @app.post("/raw")
    def raw():
        h = hashlib.sha256()
        n = 0
        for piece in iter(lambda: flask.request.stream.read(65536), b""):
            h.update(piece)
            n += len(piece)
        return f"{n} {h.hexdigest()}"

    return app


def test_flask_uploads():
    """A Flask app: a multipart file upload parsed by Werkzeug from wsgi.input, and a raw body
    read from request.stream, both large, both chunked and with a length."""
    app = App()
    app.wsgi("/", flask_app())
    boundary = "cyserveboundary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nbig.bin\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            "filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
    form += BIG + f"\r\n--{boundary}--\r\n".encode()
    ctype = f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
    with serving(app.build(), threads=2, max_body_bytes=8 << 20) as srv:
        with Conn(srv.port) as c:
            for chunked in (False, True):
                t = send_in_thread(c, post("/upload", form, chunked, extra=ctype))
                r = c.reply()
                t.join(TIMEOUT)
                assert (r.status, r.body.decode()) == (200, f"big.bin {len(BIG)} {digest(BIG)}")
                t = send_in_thread(c, post("/raw", BIG, chunked))
                r = c.reply()
                t.join(TIMEOUT)
                assert (r.status, r.body.decode()) == (200, f"{len(BIG)} {digest(BIG)}")


def test_body_unreadable_after_the_call(port):
    kept = []
    app = App()

    @app.post("/keep")
    def keep(request):
        kept.append(request)
        kept.append(request.stream())
        return "ok"

    with serving(app.build(), threads=1) as srv:
        with Conn(srv.port) as c:
            t = send_in_thread(c, post("/keep", BIG[:500000]))
            assert c.reply().body == b"ok"
            t.join(TIMEOUT)
    with pytest.raises(RuntimeError):
        kept[0].read()
    with pytest.raises((RuntimeError, ValueError)):
        next(kept[1])


def test_silent_client_costs_no_call(port):
    """The first 64 KiB of a large body are read before the call: a client that sends only its
    head is answered 408 by the engine, and the app never runs."""
    SEEN.clear()
    with Conn(port) as c:
        c.send(post("/w/raise", BIG)[:1000])
        r = c.reply()
        assert r.status == 408
    assert SEEN == []


def test_bodies_beyond_the_stream_slots_are_read_whole():
    """blocking_threads 2: one body streams at a time (half of them); while one does, another
    large body is read whole before its call, as bodies were."""
    SEEN.clear()
    with serving(native_app().build(), threads=1, blocking_threads=2, max_body_bytes=8 << 20,
                 min_body_rate=0) as srv:
        with Conn(srv.port) as a, Conn(srv.port) as b:
            first = post("/w/env", BIG)
            a.send(first[:500000])  # streams, then waits for the rest
            deadline = time.monotonic() + 5
            time.sleep(0.3)
            t = send_in_thread(b, post("/w/env", BIG))
            r = b.reply()
            t.join(TIMEOUT)
            assert (r.status, r.body) == (200, str(len(BIG)).encode())
            a.send(first[500000:])
            r = a.reply()
            assert (r.status, r.body) == (200, str(len(BIG)).encode())
            assert time.monotonic() < deadline + TIMEOUT
    assert sorted(v[2] for _, v in SEEN) == ["BytesIO", "RequestBody"]
