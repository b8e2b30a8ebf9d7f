"""Where an ASGI request runs: with `asgi_loops="thread"` (the default on a free-threaded
interpreter without the GIL), on the event loop of the worker thread that parsed it (one loop per
worker, each running the app's lifespan for itself, with a state of its own); with "process"
(the default with the GIL), on the process's one loop, which runs the lifespan once.

Each test runs in both modes, on whatever interpreter runs the tests (a GIL build checks the same
machinery: several loops, a request's futures on its own loop, a lifespan per loop, the stop of
every loop)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import socketserver
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from _rawhttp import Conn, get, request
from test_asgi import serving_app

import cyserve.asgi
from cyserve.config import Config
from cyserve.errors import CyserveError

pytestmark = pytest.mark.native

WORKERS = 4
CLIENTS = 8
REQUESTS = 100  # per client, over one keep-alive connection


@pytest.fixture(params=["process", "thread"])
def per_thread(request: Any) -> Iterator[bool]:
    yield request.param == "thread"


def loops(per_thread: bool) -> str:
    """The asgi_loops option of a mode."""
    return "thread" if per_thread else "process"


def _asgi_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("cyserve-asgi")]


class LifespanApp:
    """Counts its lifespan events; requests answer with what they saw (and whether their state
    is their own loop's), and record where they ran."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()
        self.loops: dict[int, str] = {}  # id(loop) -> the name of the thread that runs it

    async def lifespan(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                with self.lock:
                    self.events.append("startup")
                scope["state"]["token"] = "made-at-startup"
                scope["state"]["shared"] = []
                scope["state"]["loop"] = id(asyncio.get_running_loop())
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                with self.lock:
                    self.events.append("shutdown")
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        name = threading.current_thread().name
        with self.lock:
            if not self.events or self.events[0] != "startup":
                self.events.append("request before startup")
            self.loops[id(loop)] = name
        state = scope["state"]
        # A shallow copy per request: a key set here is not seen by the next request, the
        # objects the lifespan made are the same.
        leaked = "mine" in state
        state["mine"] = True
        tag = dict(scope["headers"]).get(b"x-tag", b"").decode()
        body = (f"{scope['path']}|{tag}|{state['token']}|{leaked}|{id(state['shared'])}|"
                f"{state['loop'] == id(loop)}|{id(loop)}")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body.encode()})


def _hammer(port: int, check: Any) -> list[str]:
    failures: list[str] = []

    def client(k: int) -> None:
        try:
            with Conn(port, timeout=60) as c:
                for i in range(REQUESTS):
                    c.send(get(f"/a{k}/{i}", extra=f"X-Tag: c{k}-r{i}\r\n"))
                    check(k, i, c.reply())
        except BaseException as exc:  # reported by the test's thread
            failures.append(f"client {k}: {exc!r}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a client got stuck"
    return failures


def test_requests_run_on_their_workers_loops_with_a_lifespan_per_loop(per_thread: bool) -> None:
    app = LifespanApp()
    shared: dict[str, set[str]] = {}  # loop -> the ids of the lifespan's objects seen there

    def check(k: int, i: int, reply: Any) -> None:
        assert reply.status == 200, reply
        path, tag, token, leaked, shared_id, own_loop, loop_id = reply.body.decode().split("|")
        assert (path, tag, token, leaked, own_loop) == (
            f"/a{k}/{i}", f"c{k}-r{i}", "made-at-startup", "False", "True"), reply.body
        shared.setdefault(loop_id, set()).add(shared_id)

    # Relief off: a relief thread that runs a stuck worker's calls (a crowded machine preempts
    # batches for long enough) makes a loop of its own, and this test counts the workers' loops.
    with serving_app(app, threads=WORKERS, blocking_threads=0,
                     asgi_loops=loops(per_thread)) as port:
        # Every startup ran before the server took a request; no shutdown yet.
        assert app.events == ["startup"] * (WORKERS if per_thread else 1)
        failures = _hammer(port, check)
        assert not failures, failures[:5]
        running = _asgi_threads()
    # One lifespan per loop: as many startups, then as many shutdowns, and no request before.
    n = WORKERS if per_thread else 1
    assert app.events == ["startup"] * n + ["shutdown"] * n
    # Within a loop the lifespan's objects are the same for every request; each loop has its own.
    assert all(len(ids) == 1 for ids in shared.values()), shared
    assert len(set().union(*shared.values())) == len(shared), shared
    names = set(app.loops.values())
    if per_thread:
        # Each loop on a thread of its own, one per worker, all started with the server.
        assert len(app.loops) > 1, f"every request ran on one loop: {names}"
        assert len(names) == len(app.loops), app.loops
        assert all(re.fullmatch(r"cyserve-asgi-\d+", n) for n in names), names
        assert len(app.loops) <= WORKERS
        assert sorted(running) == sorted(f"cyserve-asgi-{i}" for i in range(WORKERS)), running
    else:
        assert names == {"cyserve-asgi"}
        assert len(app.loops) == 1
        assert running == ["cyserve-asgi"], running
    assert set(running) >= names
    # The stop ended every loop thread.
    deadline = time.monotonic() + 5
    while _asgi_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _asgi_threads() == []


def test_asyncio_inside_a_request_uses_the_requests_loop(per_thread: bool) -> None:
    executor = concurrent.futures.ThreadPoolExecutor(2)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        loop = asyncio.get_running_loop()
        k = int(scope["path"].rsplit("/", 1)[1])

        async def child(n: int) -> tuple[int, bool]:
            await asyncio.sleep(0.001)
            return n * n, asyncio.get_running_loop() is loop

        squares = await asyncio.gather(*(asyncio.ensure_future(child(n)) for n in range(3)))
        in_default = await loop.run_in_executor(None, lambda: k + 1)
        in_own = await loop.run_in_executor(executor, lambda: k + 2)
        try:
            await asyncio.wait_for(asyncio.sleep(10), 0.005)
            timed_out = False
        except asyncio.TimeoutError:
            timed_out = True
        body = {"squares": [s for s, _ in squares], "same_loop": all(same for _, same in squares),
                "default": in_default, "own": in_own, "timed_out": timed_out,
                "loop_thread": threading.current_thread().name}
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": repr(body).encode()})

    threads: set[str] = set()
    failures: list[str] = []

    def client(c0: int) -> None:
        try:
            with Conn(port, timeout=60) as c:
                for k in range(c0, c0 + 20):
                    c.send(get(f"/x/{k}"))
                    reply = c.reply()
                    assert reply.status == 200, reply
                    body = eval(reply.body.decode())  # noqa: S307 (our own repr of a dict)
                    assert body["squares"] == [0, 1, 4] and body["same_loop"], body
                    assert (body["default"], body["own"], body["timed_out"]) == \
                        (k + 1, k + 2, True), body
                    threads.add(body["loop_thread"])
        except BaseException as exc:
            failures.append(repr(exc))

    try:
        with serving_app(app, threads=WORKERS, asgi_loops=loops(per_thread)) as port:
            clients = [threading.Thread(target=client, args=(100 * n,)) for n in range(6)]
            for t in clients:
                t.start()
            for t in clients:
                t.join(120)
            assert not any(t.is_alive() for t in clients)
    finally:
        executor.shutdown()
    assert not failures, failures[:5]
    if per_thread:
        assert threads and all(re.fullmatch(r"cyserve-asgi-\d+", n) for n in threads), threads
    else:
        assert threads == {"cyserve-asgi"}


def test_stop_cancels_pending_requests_on_every_loop_then_runs_its_shutdown(
        per_thread: bool) -> None:
    events: list[str] = []
    shutdowns: list[tuple[str, int]] = []  # (its loop's thread, how many events came before)
    lock = threading.Lock()
    started = threading.Semaphore(0)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                t = msg["type"].rsplit(".", 1)[1]
                with lock:
                    if t == "shutdown":
                        shutdowns.append((threading.current_thread().name, len(events)))
                    events.append(t)
                await send({"type": f"lifespan.{t}.complete"})
                if t == "shutdown":
                    return
        try:
            started.release()
            await asyncio.sleep(60)  # never answers: the stop gives it up
        except asyncio.CancelledError:
            with lock:
                events.append(f"cancelled on {threading.current_thread().name}")
            raise

    conns = []
    with serving_app(app, threads=WORKERS, graceful_timeout=0.2,
                     asgi_loops=loops(per_thread)) as port:
        for n in range(8):
            c = Conn(port, timeout=30)
            c.__enter__()
            c.send(get(f"/wait/{n}"))
            conns.append(c)
        for _ in range(8):
            assert started.acquire(timeout=20), "a request did not reach the app"
    for c in conns:
        c.__exit__(None, None, None)
    cancelled = [e for e in events if e.startswith("cancelled on ")]
    n = WORKERS if per_thread else 1
    assert events[:n] == ["startup"] * n and events[-1] == "shutdown", events
    assert events.count("startup") == n and events.count("shutdown") == n, events
    assert len(cancelled) == 8, events
    where = {e[len("cancelled on "):] for e in cancelled}
    # Each loop's shutdown ran after that loop's requests were cancelled.
    for thread, before in shutdowns:
        assert f"cancelled on {thread}" not in events[before:], (thread, events)
    assert len({thread for thread, _ in shutdowns}) == n, shutdowns
    if per_thread:
        assert all(re.fullmatch(r"cyserve-asgi-\d+", n) for n in where), where
    else:
        assert where == {"cyserve-asgi"}
    assert _asgi_threads() == []


# ---- a lifespan per loop --------------------------------------------------------------------

class _EchoServer(socketserver.ThreadingTCPServer):
    """A line echo server on a free port, counting the connections it got and the open ones."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.accepted = 0
        self.open = 0
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                with outer.lock:
                    outer.accepted += 1
                    outer.open += 1
                try:
                    for line in self.rfile:
                        self.wfile.write(line)
                finally:
                    with outer.lock:
                        outer.open -= 1

        super().__init__(("127.0.0.1", 0), Handler)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()


class LoopBoundApp:
    """An app whose lifespan makes what asyncio binds to the loop that uses it: an asyncio.Lock
    and an asyncio.Queue (bound by a first contended use, at startup), and a client connection
    (asyncio.open_connection) to an echo server. Every request uses all three, contended by the
    other requests of its loop; from another loop, each would raise ("bound to a different
    event loop", "attached to a different loop")."""

    def __init__(self, echo_port: int) -> None:
        self.echo_port = echo_port
        self.lock = threading.Lock()
        self.startups = 0
        self.shutdowns = 0

    async def lifespan(self, state: dict[str, Any], receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "lifespan.startup"
        lock, queue = asyncio.Lock(), asyncio.Queue()  # type: ignore[var-annotated]
        await lock.acquire()
        waiter = asyncio.ensure_future(lock.acquire())
        await asyncio.sleep(0)  # the waiter's future binds the lock to this loop
        lock.release()
        await waiter
        lock.release()
        getter = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)  # so does the getter's the queue
        queue.put_nowait("bound")
        assert await getter == "bound"
        reader, writer = await asyncio.open_connection("127.0.0.1", self.echo_port)
        state.update(lock=lock, queue=queue, reader=reader, writer=writer)
        with self.lock:
            self.startups += 1
        await send({"type": "lifespan.startup.complete"})
        assert (await receive())["type"] == "lifespan.shutdown"
        writer.close()
        await writer.wait_closed()
        with self.lock:
            self.shutdowns += 1
        await send({"type": "lifespan.shutdown.complete"})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(scope["state"], receive, send)
            return
        state = scope["state"]
        tag = scope["path"].strip("/")
        try:
            async with state["lock"]:
                state["writer"].write(f"{tag}\n".encode())
                await state["writer"].drain()
                echoed = (await state["reader"].readline()).decode().strip()
            getter = asyncio.ensure_future(state["queue"].get())
            await asyncio.sleep(0)
            state["queue"].put_nowait(tag)
            got = await getter  # this request's tag or another's of the same loop
            body = f"{echoed}|{got.startswith('c')}"
            status = 200
        except Exception as exc:  # noqa: BLE001 (the client reports it)
            body, status = repr(exc), 500
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body.encode()})


def test_what_a_lifespan_binds_to_its_loop_works_in_requests_on_every_worker(
        per_thread: bool) -> None:
    echo = _EchoServer()
    app = LoopBoundApp(echo.port)

    def check(k: int, i: int, reply: Any) -> None:
        assert (reply.status, reply.body) == (200, f"c{k}-r{i}|True".encode()), reply

    try:
        with serving_app(app, threads=WORKERS, blocking_threads=0,
                         asgi_loops=loops(per_thread)) as port:
            n = WORKERS if per_thread else 1
            assert (app.startups, app.shutdowns) == (n, 0)
            # The echo server's thread counts a connection once it got to it (the client's
            # connect completes before that).
            _wait_until(lambda: echo.accepted >= n)
            assert echo.accepted == n
            failures = _hammer_paths(port, check)
            assert not failures, failures[:5]
        assert (app.startups, app.shutdowns) == (n, n)
        _wait_until(lambda: echo.open == 0)
        assert (echo.accepted, echo.open) == (n, 0)  # each shutdown closed its loop's client
    finally:
        echo.shutdown()
        echo.server_close()


def _wait_until(ready: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.01)


def _hammer_paths(port: int, check: Any) -> list[str]:
    failures: list[str] = []

    def client(k: int) -> None:
        try:
            with Conn(port, timeout=60) as c:
                for i in range(REQUESTS // 4):
                    c.send(get(f"/c{k}-r{i}"))
                    check(k, i, c.reply())
        except BaseException as exc:  # reported by the test's thread
            failures.append(f"client {k}: {exc!r}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a client got stuck"
    return failures


def test_a_startup_failing_on_one_loop_fails_the_start_once(per_thread: bool) -> None:
    """The third startup fails (the first with one loop): the start fails with its message,
    and the loops whose startup completed run their shutdown."""
    lock = threading.Lock()
    events: list[str] = []
    fail_at = 3 if per_thread else 1

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan", "no request may reach the app"
        assert (await receive())["type"] == "lifespan.startup"
        with lock:
            events.append("startup")
            nth = events.count("startup")
        if nth == fail_at:
            await send({"type": "lifespan.startup.failed", "message": f"startup {nth} failed"})
            return
        await send({"type": "lifespan.startup.complete"})
        assert (await receive())["type"] == "lifespan.shutdown"
        with lock:
            events.append("shutdown")
        await send({"type": "lifespan.shutdown.complete"})

    with pytest.raises(CyserveError, match=f"lifespan startup failed: startup {fail_at} failed$"):
        with serving_app(app, threads=WORKERS, asgi_loops=loops(per_thread)):
            pass
    n = WORKERS if per_thread else 1
    assert events.count("startup") == n, events
    assert events.count("shutdown") == n - 1, events
    assert _asgi_threads() == []


# ---- --lifespan auto|on|off -----------------------------------------------------------------

async def _no_lifespan(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that only knows http: it raises on the lifespan scope."""
    if scope["type"] != "http":
        raise RuntimeError("no lifespan here")
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": repr(scope["state"]).encode()})


def test_lifespan_auto_serves_an_app_that_raises_on_it_with_one_note(
        per_thread: bool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cyserve.asgi")
    with serving_app(_no_lifespan, threads=WORKERS, asgi_loops=loops(per_thread),
                     lifespan="auto") as port:
        reply = request(port, get("/"))
    assert (reply.status, reply.body) == (200, b"{}")
    notes = [r.getMessage() for r in caplog.records if "appears unsupported" in r.getMessage()]
    assert notes == ["ASGI 'lifespan' appears unsupported by the application (RuntimeError: "
                     "no lifespan here); serving without it"], notes


def test_lifespan_on_fails_the_start_of_an_app_that_raises_on_it(
        per_thread: bool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cyserve.asgi")
    with pytest.raises(CyserveError,
                       match="lifespan startup failed: RuntimeError: no lifespan here$"):
        with serving_app(_no_lifespan, threads=WORKERS, asgi_loops=loops(per_thread),
                         lifespan="on"):
            pass
    # The app's traceback once, however many loops ran its lifespan.
    failed = [r for r in caplog.records if "startup failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None, failed
    assert not any("appears unsupported" in r.getMessage() for r in caplog.records)
    assert _asgi_threads() == []


@pytest.mark.parametrize("lifespan", ["on", "off"])
def test_lifespan_on_runs_it_and_off_never_sends_it(per_thread: bool, lifespan: str) -> None:
    app = LifespanApp()
    with serving_app(app, threads=WORKERS, asgi_loops=loops(per_thread),
                     lifespan=lifespan) as port:
        reply = request(port, get("/x"))
        if lifespan == "off":
            # No state from a startup that never ran: the request finds no token.
            assert reply.status == 500, reply
        else:
            assert reply.status == 200 and b"|made-at-startup|" in reply.body, reply
    n = (WORKERS if per_thread else 1) if lifespan == "on" else 0
    assert app.events[:n] == ["startup"] * n and app.events.count("startup") == n, app.events
    assert app.events.count("shutdown") == n, app.events


def test_a_loop_per_thread_is_the_default_only_without_the_gil() -> None:
    assert Config().asgi_loops == "auto" and Config().lifespan == "auto"
    gil_off = cyserve.asgi.loops_per_thread()
    assert gil_off == (not getattr(sys, "_is_gil_enabled", lambda: True)())
    assert cyserve.asgi.per_thread_loops("auto") is gil_off
    assert cyserve.asgi.per_thread_loops("thread") is True
    assert cyserve.asgi.per_thread_loops("process") is False

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body",
                    "body": threading.current_thread().name.encode()})

    with serving_app(app, threads=2) as port:
        name = request(port, get("/")).body.decode()
        running = sorted(_asgi_threads())
    if gil_off:
        assert re.fullmatch(r"cyserve-asgi-[01]", name), name
        assert running == ["cyserve-asgi-0", "cyserve-asgi-1"], running
    else:
        assert (name, running) == ("cyserve-asgi", ["cyserve-asgi"])


# ---- the event loop: --loop asyncio | uvloop --------------------------------------------------

class LoopApp:
    """A lifespan that keeps a state, requests that answer with their scope and loop's type, a
    streamed answer of an uploaded body, and a WebSocket echo."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        loop = asyncio.get_running_loop()
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                self.events.append(f"{msg['type']} {type(loop).__module__}.{type(loop).__name__}")
                if msg["type"] == "lifespan.startup":
                    scope["state"]["token"] = "from-startup"
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.accept"})
            while (msg := await receive())["type"] == "websocket.receive":
                await send({"type": "websocket.send", "text": msg.get("text"),
                            "bytes": msg.get("bytes")})
            return
        body = []
        while True:
            msg = await receive()
            body.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for piece in body:
                await asyncio.sleep(0)
                await send({"type": "http.response.body", "body": piece[::-1],
                            "more_body": True})
            await send({"type": "http.response.body", "body": b"end"})
            return
        seen = {"loop": f"{type(loop).__module__}.{type(loop).__name__}",
                "path": scope["path"], "query_string": scope["query_string"],
                "headers": scope["headers"], "state": dict(scope["state"])}
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": repr(seen).encode()})


def test_scope_streaming_websocket_and_lifespan_on_each_loop(loop_kind: str) -> None:
    from websockets.sync.client import connect

    app = LoopApp()
    threads = 2
    with serving_app(app, loop=loop_kind, threads=threads) as port:
        import ast
        seen = ast.literal_eval(request(port, get("/a%20b?x=%41", extra="X-A: 1\r\nx-a: 2\r\n"))
                                .body.decode())
        assert seen["path"] == "/a b" and seen["query_string"] == b"x=%41"
        assert seen["headers"] == [(b"host", b"t"), (b"x-a", b"1"), (b"x-a", b"2")]
        assert seen["state"] == {"token": "from-startup"}
        expected = "uvloop.Loop" if loop_kind == "uvloop" else "asyncio.unix_events."
        assert seen["loop"].startswith(expected), seen["loop"]
        with Conn(port) as c:
            c.send(b"POST /stream HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n")
            r = c.reply()
            assert r.header("transfer-encoding") == "chunked"
            # However the body's pieces arrived, the answer is each piece reversed, then "end".
            assert r.body.endswith(b"end") and len(r.body) == 9, r.body
        with connect(f"ws://127.0.0.1:{port}/ws") as ws:
            ws.send("text")
            assert ws.recv(timeout=5) == "text"
            ws.send(b"\x00bytes")
            assert ws.recv(timeout=5) == b"\x00bytes"
    # Every loop of the default asgi_loops ("auto": one per worker thread without the GIL, one
    # with it) runs the lifespan on the loop named, all starting before any stops.
    loop_name = seen["loop"]
    n_loops = threads if cyserve.asgi.loops_per_thread() else 1
    assert app.events == ([f"lifespan.startup {loop_name}"] * n_loops
                          + [f"lifespan.shutdown {loop_name}"] * n_loops)


def test_the_command_runs_the_app_on_the_loop_it_names(loop_kind: str, tmp_path: Any) -> None:
    """`cyserve --loop uvloop` (or asyncio): the app, started as a user starts it, runs on it."""
    from _subserve import free_port, running

    (tmp_path / "loop_main.py").write_text(
        "import asyncio\n"
        "async def app(scope, receive, send):\n"
        "    if scope['type'] != 'http':\n"
        "        return\n"
        "    loop = asyncio.get_running_loop()\n"
        "    await send({'type': 'http.response.start', 'status': 200, 'headers': []})\n"
        "    await send({'type': 'http.response.body',\n"
        "                'body': f'{type(loop).__module__}.{type(loop).__name__}'.encode()})\n")
    port = free_port()
    argv = [sys.executable, "-m", "cyserve", "loop_main:app", "--port", str(port), "--threads",
            "1", "--app-dir", str(tmp_path), "--loop", loop_kind]
    with running(argv, port) as srv:
        body = srv.get("/").body.decode()
    if loop_kind == "uvloop":
        assert body == "uvloop.Loop"
    else:
        assert body.startswith("asyncio."), body
