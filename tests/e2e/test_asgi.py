"""ASGI 3 applications (cyserve/asgi.py, native/asgi.pyx) served end to end over raw sockets: the
http scope exactly, receive() and send() (streaming, backpressure on a slow reader, HEAD), the
lifespan (startup state, shutdown after the requests, a failed startup), an app's failures (500
and a logged traceback, a streamed answer cut, no answer at all, an answer that never comes at
a stop), all of asyncio inside a request, and apps mounted beside native routes."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _procfd import fd_targets
from _rawhttp import Conn, get, request
from test_http2 import H2

import cyserve
import cyserve.asgi
from cyserve.config import Config
from cyserve.errors import CyserveError
from cyserve.start import serve

pytestmark = pytest.mark.native

Scope = dict[str, Any]


@contextlib.contextmanager
def serving_app(app: Any, **options: Any) -> Iterator[int]:
    """serve() in a thread for app (an ASGI app or a cyserve.App), on a free port; stopped (and
    waited for) at the end. The loop is asyncio's unless the test names one: the suite's ground,
    what a plain install and the free-threaded build run; the tests that take the loop_kind
    fixture (conftest.py) run on uvloop's as well, and the commands started as subprocesses on
    auto's choice (uvloop where it is installed)."""
    options.setdefault("threads", 2)
    options.setdefault("loop", "asyncio")
    options.setdefault("graceful_timeout", 2.0)
    config = Config(host="127.0.0.1", port=0, **options)
    stop = threading.Event()
    ready: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            serve(app, config, stop_event=stop, ready=ready.append)
        except BaseException as exc:  # handed to the test
            failure.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not ready and not failure and time.monotonic() < deadline:
        time.sleep(0.01)
    if failure:
        raise failure[0]
    assert ready, "the server did not start"
    try:
        yield ready[0].port
    finally:
        stop.set()
        th.join(30)
        assert not th.is_alive(), "the server did not stop"
        if failure:
            raise failure[0]


async def echo_scope(scope: Scope, receive: Any, send: Any) -> None:
    """Answers with its scope (headers, state and the body messages it received) as a repr."""
    if scope["type"] == "lifespan":
        raise RuntimeError("no lifespan here")
    messages = []
    while True:
        msg = await receive()
        messages.append((msg["type"], len(msg.get("body", b"")), msg.get("more_body")))
        if not msg.get("more_body"):
            break
    seen = dict(scope)
    seen["messages"] = messages
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": repr(seen).encode()})


def scope_of(port: int, data: bytes) -> Scope:
    r = request(port, data)
    assert r.status == 200, r
    import ast
    return ast.literal_eval(r.body.decode())  # type: ignore[no-any-return]


# ---- the scope ----------------------------------------------------------------------------

def test_scope_is_complete_and_exact() -> None:
    with serving_app(echo_scope) as port:
        s = scope_of(port, get("/caf%C3%A9/a%2Fb?x=1&y=%20", host="example.org:81",
                               extra="X-Custom: Value  One\r\nx-custom: two\r\n"))
        client = s.pop("client")
        assert client[0] == "127.0.0.1" and isinstance(client[1], int)
        assert s == {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/café/a/b",
            "raw_path": b"/caf%C3%A9/a%2Fb",
            "query_string": b"x=1&y=%20",
            "root_path": "",
            "headers": [(b"host", b"example.org:81"), (b"x-custom", b"Value  One"),
                        (b"x-custom", b"two")],
            "server": ("127.0.0.1", port),
            "state": {},
            "extensions": {"http.response.pathsend": {}, "http.response.trailers": {}},
            "messages": [("http.request", 0, False)],
        }
        s = scope_of(port, b"POST /p HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello")
        assert (s["http_version"], s["method"], s["query_string"]) == ("1.0", "POST", b"")
        assert s["messages"] == [("http.request", 5, False)]


def test_scheme_and_client_follow_a_trusted_proxy() -> None:
    # The scope's scheme and client come from the engine's one answer (server_req_scheme,
    # server_req_peer): https over TLS, or what a trusted proxy's headers say.
    with serving_app(echo_scope, proxy_headers=True) as port:  # trusts 127.0.0.1
        plain = scope_of(port, get("/"))
        assert plain["scheme"] == "http"
        proxied = scope_of(port, get("/", extra="X-Forwarded-For: 203.0.113.7\r\n"
                                             "X-Forwarded-Proto: https\r\n"))
        assert (proxied["scheme"], proxied["client"]) == ("https", ("203.0.113.7", 0))


def test_a_large_body_arrives_in_pieces() -> None:
    body = b"x" * 200_000
    with serving_app(echo_scope) as port:
        s = scope_of(port, b"PUT /up HTTP/1.1\r\nHost: t\r\nContent-Length: 200000\r\n\r\n" + body)
        assert s["messages"] == [("http.request", 65536, True), ("http.request", 65536, True),
                                 ("http.request", 65536, True), ("http.request", 3392, False)]


def test_mounted_beside_native_routes_with_root_path() -> None:
    app = cyserve.App()
    app.asgi("/sub", echo_scope)

    @app.get("/native")
    def native(request: Any) -> str:
        return "native"

    app.static("/plain", "static")
    with serving_app(app) as port:
        s = scope_of(port, get("/sub/x/y?q"))
        assert (s["path"], s["raw_path"], s["root_path"], s["query_string"]) == (
            "/sub/x/y", b"/sub/x/y", "/sub", b"q")
        assert request(port, get("/native")).body == b"native"
        assert request(port, get("/plain")).body == b"static"
        assert request(port, get("/other")).status == 404


# ---- send(): whole, streamed, HEAD ----------------------------------------------------------

async def answers(scope: Scope, receive: Any, send: Any) -> None:
    path = scope["path"]
    if path == "/stream":
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"text/event-stream"), (b"x-a", b"1")]})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i,
                        "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    elif path == "/sized":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"10")]})
        await send({"type": "http.response.body", "body": b"01234", "more_body": True})
        await send({"type": "http.response.body", "body": b"56789"})
    else:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"server", b"app")]})
        await send({"type": "http.response.body", "body": b"whole"})


def test_answers_whole_streamed_and_sized() -> None:
    with serving_app(answers) as port, Conn(port) as c:
        c.send(get("/"))
        r = c.reply()
        assert (r.status, r.body, r.header("content-length"), r.header("server")) == (
            200, b"whole", "5", "app")
        c.send(get("/stream"))
        r = c.reply()
        assert (r.status, r.header("transfer-encoding"), r.header("x-a")) == (201, "chunked", "1")
        assert r.body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        c.send(get("/sized"))
        r = c.reply()
        assert (r.header("content-length"), r.body) == ("10", b"0123456789")
        c.send(get("/"))  # the connection stayed open through all of them
        assert c.reply().body == b"whole"


def test_a_streamed_body_past_its_content_length_raises_in_send() -> None:
    """Bytes past the Content-Length the app announced raise in its send(), naming both lengths
    (uvicorn raises there too); the client still gets exactly the announced bytes, and the
    connection goes on. A piece that reaches the length exactly may be followed by an empty
    last message, which is no error."""
    raised: dict[str, str] = {}

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        pieces = {"/across": [b"he", b"llo"], "/after": [b"hel", b"lo"],
                  "/exact": [b"he", b"l", b""]}[scope["path"]]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"3")]})
        try:
            for piece in pieces:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except RuntimeError as exc:
            raised[scope["path"]] = str(exc)

    with serving_app(app) as port, Conn(port) as c:
        for path in ("/across", "/after", "/exact"):
            c.send(get(path))
            r = c.reply()
            assert (r.status, r.header("content-length"), r.body) == (200, "3", b"hel"), path
        c.send(get("/exact"))  # the connection stayed open through all of them
        assert c.reply().body == b"hel"
    assert raised == {
        "/across": "ASGI: Content-Length 3, but the body goes on past it: 5 bytes or more",
        "/after": "ASGI: Content-Length 3, but the body goes on past it: 5 bytes or more"}


@pytest.mark.parametrize("protocol", ["http/1.1", "h2"])
@pytest.mark.parametrize("status", [204, 205, 304])
def test_a_body_on_a_status_without_content_raises_in_send(
        status: int, protocol: str, tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Body bytes for a status that has no content (RFC 9110 6.4.1, 15.3.6): the app's mistake,
    raised in its send() as uvicorn raises it (test_asgi_uvicorn_diff.py), not dropped without
    a word as before. In the body's first message (/first; /file, a file's bytes by
    http.response.pathsend) nothing was sent yet, since the head waits for it: the app's error
    makes the answer a 500, as cyserve's WSGI answers such a body, and it is logged with the
    app's traceback. In a later message (/later) the head is out, the answer complete with the
    empty first message: the client keeps that answer and its connection, and the error is
    logged. Empty messages (/empty) are no error. HEAD gets what GET gets."""
    caplog.set_level(logging.ERROR, logger="cyserve.asgi")
    data = tmp_path / "five.txt"
    data.write_bytes(b"hello")
    raised: list[str] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        shape = scope["path"]
        await send({"type": "http.response.start", "status": status, "headers": []})
        try:
            if shape == "/file":
                await send({"type": "http.response.pathsend", "path": str(data)})
                return
            first = b"hello" if shape == "/first" else b""
            await send({"type": "http.response.body", "body": first, "more_body": True})
            last = b"late" if shape == "/later" else b""
            await send({"type": "http.response.body", "body": last})
        except RuntimeError as exc:
            raised.append(f"{scope['method']} {shape}: {exc}")
            raise

    # (method, path) -> the status the client gets.
    want = {(m, p): 500 if p in ("/first", "/file") else status
            for m in ("GET", "HEAD") for p in ("/first", "/file", "/later", "/empty")}
    got: dict[tuple[str, str], int] = {}
    with serving_app(app) as port:
        if protocol == "h2":
            with H2(port) as h:
                for method, path in want:
                    code, _, body = h.response(h.send(path, method=method))
                    got[method, path] = code
                    assert body == (b"" if code == status else body), (method, path, body)
        else:
            with Conn(port) as c:  # one connection: every answer leaves it open
                for method, path in want:
                    c.send(f"{method} {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                    r = c.reply(head_only=method == "HEAD")
                    got[method, path] = r.status
                    if r.status == status:
                        assert r.header("transfer-encoding") is None
                        assert r.header("content-length") == ("0" if status == 205 else None)
                c.send(get("/empty"))
                assert c.reply().status == status
    assert got == want
    n = {"/first": 5, "/file": 5, "/later": 4}
    assert sorted(raised) == sorted(
        f"{m} {p}: ASGI: a {status} response cannot have a body ({n[p]} bytes given)"
        for m, p in want if p in n)
    assert caplog.text.count("Exception in ASGI application") == 6


def test_send_from_the_task_or_another_thread() -> None:
    # send() returns an awaitable (not necessarily a coroutine); one awaited at once, one made
    # on another thread for asyncio.run_coroutine_threadsafe (which wants a coroutine and runs
    # it on the loop), a streamed piece and the last one all arrive in order. The request's task
    # stays asyncio.current_task() across a suspension, which anyio's cancel scopes rely on
    # (3.12+ starts the task eagerly: its first step runs in the batch's callback).
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            raise RuntimeError("unsupported")
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        started = send({"type": "http.response.start", "status": 200, "headers": []})
        assert inspect.isawaitable(started)
        await started
        await asyncio.sleep(0)
        assert asyncio.current_task() is task

        def from_thread() -> None:
            piece = {"type": "http.response.body", "body": b"thread,", "more_body": True}
            asyncio.run_coroutine_threadsafe(send(piece), loop).result(5)

        await loop.run_in_executor(None, from_thread)
        await send({"type": "http.response.body", "body": b"loop", "more_body": False})

    with serving_app(app) as port, Conn(port) as c:
        for _ in range(2):
            c.send(get("/"))
            r = c.reply()
            assert (r.status, r.header("transfer-encoding"), r.body) == (
                200, "chunked", b"thread,loop")


def test_what_send_returns_is_an_awaitable_for_asyncio_too() -> None:
    # A message taken at once gives an awaitable that is no future: awaiting it gives None, as
    # often as it is awaited, and asyncio's helpers that take any awaitable (ensure_future,
    # gather, wait_for) wrap it in a task that ends at once.
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            raise RuntimeError("unsupported")
        started = send({"type": "http.response.start", "status": 200, "headers": []})
        assert not asyncio.isfuture(started) and inspect.isawaitable(started)
        seen = [await started, await started, await asyncio.ensure_future(started)]
        seen.extend(await asyncio.gather(started))
        await send({"type": "http.response.body", "body": b"streamed,", "more_body": True})
        seen.append(await asyncio.wait_for(
            send({"type": "http.response.body", "body": repr(seen).encode()}), 5))
        assert seen == [None] * 5, seen

    with serving_app(app) as port, Conn(port) as c:
        c.send(get("/"))
        r = c.reply()
        assert (r.status, r.body) == (200, b"streamed,[None, None, None, None]")
        c.send(get("/"))  # the exchange ended cleanly: the connection serves the next one
        assert c.reply().body == b"streamed,[None, None, None, None]"


def test_send_takes_its_message_by_keyword_and_refuses_other_calls() -> None:
    # send is called with one positional message on the fast path; a call by keyword, or with
    # another count of arguments, takes the method's own parse: the keyword works, and the
    # wrong counts raise TypeError as a Python method would, without touching the answer.
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            raise RuntimeError("unsupported")
        refused = []
        for args in ((), ({"type": "http.response.start"}, None)):
            try:
                send(*args)
            except TypeError:
                refused.append(len(args))
        await send(message={"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": repr(refused).encode()})

    with serving_app(app) as port, Conn(port) as c:
        for _ in range(2):
            c.send(get("/"))
            r = c.reply()
            assert (r.status, r.body) == (200, b"[0, 2]")


def test_head_gets_the_head_only() -> None:
    with serving_app(answers) as port, Conn(port) as c:
        c.send(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply(head_only=True)
        assert (r.status, r.header("content-length")) == (200, "5")
        c.send(b"HEAD /sized HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply(head_only=True)
        assert r.header("content-length") == "10"
        c.send(get("/"))
        assert c.reply().body == b"whole"  # nothing of the HEAD bodies was sent before it


PIECE = 64 * 1024
PIECES = 400  # 25 MiB: far more than the socket buffers hold


def test_send_waits_for_a_slow_reader() -> None:
    sent: list[int] = []
    finished = threading.Event()

    async def big(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        chunk = b"z" * PIECE
        for i in range(PIECES):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            sent.append(i)
        await send({"type": "http.response.body", "body": b""})
        finished.set()

    with serving_app(big) as port:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.connect(("127.0.0.1", port))
        sock.sendall(get("/big"))
        time.sleep(1.0)
        paused_at = len(sent)
        assert paused_at < PIECES // 4, f"the app ran {paused_at} pieces ahead of the reader"
        got = 0
        sock.settimeout(10)
        while not finished.is_set() or got < PIECES * PIECE:
            data = sock.recv(1 << 20)
            if not data:
                break
            got += len(data)
            if data.endswith(b"0\r\n\r\n"):
                break
        sock.close()
        assert finished.wait(5)
        assert got > PIECES * PIECE


# ---- receive(): http.disconnect ----------------------------------------------------------

def test_disconnect_after_the_response_and_when_the_client_goes() -> None:
    events: list[str] = []
    gone = threading.Event()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await receive()
        if scope["path"] == "/after":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            events.append((await receive())["type"])
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        waiter = asyncio.ensure_future(receive())
        try:
            while True:
                await send({"type": "http.response.body", "body": b"x" * PIECE,
                            "more_body": True})
        except OSError as exc:
            events.append(type(exc).__name__)
        events.append((await asyncio.wait_for(waiter, 5))["type"])
        gone.set()

    with serving_app(app) as port:
        assert request(port, get("/after")).body == b"ok"
        # That client is gone: its app is told before the next request begins (the two
        # connections may be on different workers, whose news reach the loop in either order).
        deadline = time.monotonic() + 20
        while not events and time.monotonic() < deadline:
            time.sleep(0.01)
        assert events == ["http.disconnect"], events
        with Conn(port) as c:
            c.send(get("/stream"))
            c.read_until(b"\r\n\r\n")
            c.read_exact(PIECE)
        assert gone.wait(10)
    assert events == ["http.disconnect", "ClientDisconnected", "http.disconnect"]


# ---- the app's failures ------------------------------------------------------------------

async def failing(scope: Scope, receive: Any, send: Any) -> None:
    if scope["path"] == "/raise":
        raise ValueError("boom in the app")
    if scope["path"] == "/midway":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise ValueError("boom midway")
    if scope["path"] == "/nothing":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"fine"})


def test_failures_are_500_or_a_cut_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="cyserve.asgi")
    with serving_app(failing) as port:
        r = request(port, get("/raise"))
        assert (r.status, r.body) == (500, b"500 Internal Server Error\n")
        with Conn(port) as c:
            c.send(get("/midway"))
            c.read_until(b"\r\n\r\n")
            assert c.read_until(b"part\r\n") == b"4\r\npart\r\n"
            with pytest.raises(ConnectionError):
                c.read_until(b"0\r\n\r\n")  # closed without the last chunk
        r = request(port, get("/nothing"))
        assert r.status == 500
        assert request(port, get("/")).body == b"fine"  # the server serves on
    text = caplog.text
    assert "Exception in ASGI application" in text and "ValueError: boom in the app" in text
    assert "Traceback" in text and "boom midway" in text
    assert "returned without completing its response" in text


def test_an_answer_that_never_comes_does_not_hang_the_stop() -> None:
    started = threading.Event()
    cancelled = threading.Event()

    async def never(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return  # no lifespan: an app may also just return
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    t0 = time.monotonic()
    with serving_app(never, graceful_timeout=0.5) as port:
        c = Conn(port)
        c.send(get("/"))
        assert started.wait(5)
    took = time.monotonic() - t0
    assert c.is_closed(), "the connection of the answer given up is closed"
    c.close()
    assert cancelled.is_set(), "the app's task was cancelled at the stop"
    assert took < 10


# ---- lifespan ----------------------------------------------------------------------------

@pytest.mark.parametrize("asgi_loops", ["process", "thread"])
def test_lifespan_startup_state_and_shutdown_after_requests(asgi_loops: str) -> None:
    # With a loop per worker thread (two here), each loop runs the lifespan.
    n = 2 if asgi_loops == "thread" else 1
    log: list[str] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    scope["state"]["db"] = "connected"
                    log.append("startup")
                    await send({"type": "lifespan.startup.complete"})
                else:
                    log.append("shutdown")
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        log.append("request")
        await asyncio.sleep(0.3)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["state"]["db"].encode()})
        log.append("answered")

    replies: list[Any] = []
    with serving_app(app, threads=2, asgi_loops=asgi_loops) as port:
        assert log == ["startup"] * n
        th = threading.Thread(target=lambda: replies.append(request(port, get("/"))))
        th.start()
        # The stop begins once the request is in the app, not after a pause a loaded machine
        # may overrun (the request would then come after the stop, or not at all).
        deadline = time.monotonic() + 20
        while "request" not in log and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "request" in log, "the request did not reach the app"
    th.join()
    assert replies[0].body == b"connected"
    assert log == ["startup"] * n + ["request", "answered"] + ["shutdown"] * n


@pytest.mark.parametrize("asgi_loops", ["process", "thread"])
def test_lifespan_startup_failure_stops_the_start(asgi_loops: str) -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no database"})

    with pytest.raises(CyserveError, match="startup failed.*no database"):
        with serving_app(app, asgi_loops=asgi_loops):
            pass


@pytest.mark.parametrize("asgi_loops", ["process", "thread"])
def test_an_app_without_lifespan_is_served(asgi_loops: str) -> None:
    with serving_app(echo_scope, asgi_loops=asgi_loops) as port:  # it raises on lifespan
        assert request(port, get("/")).status == 200


# ---- all of asyncio -----------------------------------------------------------------------

def test_the_app_has_all_of_asyncio(loop_kind: str) -> None:
    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"upstream:" + await reader.readline())
        await writer.drain()
        writer.close()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            raise RuntimeError("unsupported")
        loop = asyncio.get_running_loop()
        assert asyncio.current_task() is not None
        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping\n")
        line = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        server.close()
        spawned = asyncio.create_task(asyncio.sleep(0.01, result=b"task"))
        in_thread = await loop.run_in_executor(None, lambda: threading.current_thread().name)
        body = b"|".join([line.strip(), await spawned, in_thread.encode()[:6],
                          threading.current_thread().name.encode()])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    # The loop's thread: the process's by default with the GIL, a worker's own loop without it
    # (test_asgi_loops.py has both modes).
    per_thread = cyserve.asgi.per_thread_loops("auto")
    loop_thread = rb"cyserve-asgi-\d+" if per_thread else rb"cyserve-asgi"
    # The default executor's threads are named after the loop's maker.
    executor = b"asynci" if loop_kind == "asyncio" else b"uvloop"
    with serving_app(app, loop=loop_kind) as port:
        body = request(port, get("/")).body
    assert re.fullmatch(rb"upstream:ping\|task\|" + executor + rb"\|" + loop_thread, body), body


def test_many_concurrent_requests_are_all_answered() -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.001)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["path"].encode()})

    with serving_app(app) as port:
        assert _each_path_echoed(port, 16, 20) == []


def _each_path_echoed(port: int, connections: int, requests: int) -> list[str]:
    """connections clients at once, each asking on one connection for requests paths in turn
    (/i/k) from an app that answers with the path: the answers that were not the path asked."""
    errors: list[str] = []

    def client(i: int) -> None:
        with Conn(port) as c:
            for k in range(requests):
                c.send(get(f"/{i}/{k}"))
                body = c.reply().body
                if body != f"/{i}/{k}".encode():
                    errors.append(body.decode())

    threads = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_batches_from_every_worker_wake_the_loop_and_its_wake_up_closes() -> None:
    # Apps that answer without suspending, from 16 connections over 2 workers: every batch's
    # hand-off must wake the loop (a lost wake-up leaves a request unanswered, and the client's
    # read times out), and the loop's wake-up descriptor is closed with the loop at the stop.
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["path"].encode()})

    # Eventfds only, by number: a count of all the process's descriptors also moved with
    # unrelated ones (a socket of an earlier test closed by the collector meanwhile).
    before = _eventfds()
    with serving_app(app, threads=2) as port:
        assert _each_path_echoed(port, 16, 50) == []
    assert _eventfds() <= before, "an eventfd opened by the server is still open"


def _eventfds() -> set[int]:
    """The descriptors of this process that are eventfds (the loop's wake-up is one)."""
    return {fd for fd, target in fd_targets().items() if target == "anon_inode:[eventfd]"}


def test_pipelined_requests_are_answered_in_order() -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = (await receive())["body"]
        await asyncio.sleep(0.01 if scope["path"] == "/slow" else 0)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["path"].encode() + body})

    with serving_app(app) as port, Conn(port) as c:
        c.send(get("/slow") + b"POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi"
               + get("/c"))
        assert [c.reply().body for _ in range(3)] == [b"/slow", b"/bhi", b"/c"]
