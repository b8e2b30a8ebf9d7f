"""Where an ASGI request runs: with `asgi_loops="thread"` (meant for a free-threaded interpreter
without the GIL), on an event loop of the worker thread that parsed it (one loop per worker, made
on its first ASGI request); by default, on the process's one loop. The lifespan runs once either
way, its state shared.

Each test runs in both modes, on whatever interpreter runs the tests (a GIL build checks the same
machinery: several loops, a request's futures on its own loop, the stop of every loop)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from _rawhttp import Conn, get
from test_asgi import serving_app

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
    """Counts its lifespan events; requests answer with what they saw, and record where they
    ran."""

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
        body = f"{scope['path']}|{tag}|{state['token']}|{leaked}|{id(state['shared'])}"
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


def test_requests_run_on_their_workers_loops_with_one_lifespan(per_thread: bool) -> None:
    app = LifespanApp()
    shared: set[str] = set()

    def check(k: int, i: int, reply: Any) -> None:
        assert reply.status == 200, reply
        path, tag, token, leaked, shared_id = reply.body.decode().split("|")
        assert (path, tag, token, leaked) == (f"/a{k}/{i}", f"c{k}-r{i}", "made-at-startup",
                                              "False"), reply.body
        shared.add(shared_id)

    # Relief off: a relief thread that runs a stuck worker's calls (a crowded machine preempts
    # batches for long enough) makes a loop of its own, and this test counts the workers' loops.
    with serving_app(app, threads=WORKERS, blocking_threads=0,
                     asgi_loops=loops(per_thread)) as port:
        failures = _hammer(port, check)
        assert not failures, failures[:5]
        running = _asgi_threads()
    assert app.events == ["startup", "shutdown"]
    assert len(shared) == 1, "the lifespan's objects differ between requests"
    names = set(app.loops.values())
    if per_thread:
        # Each loop on a thread of its own, named after its worker, and not the lifespan's.
        assert len(app.loops) > 1, f"every request ran on one loop: {names}"
        assert len(names) == len(app.loops), app.loops
        assert all(re.fullmatch(r"cyserve-asgi-\d+", n) for n in names), names
        assert len(app.loops) <= WORKERS
    else:
        assert names == {"cyserve-asgi"}
        assert len(app.loops) == 1
    assert set(running) >= names | {"cyserve-asgi"}
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


def test_stop_cancels_pending_requests_on_every_loop_then_runs_shutdown_once(
        per_thread: bool) -> None:
    events: list[str] = []
    lock = threading.Lock()
    started = threading.Semaphore(0)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                t = msg["type"].rsplit(".", 1)[1]
                with lock:
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
    assert events[0] == "startup" and events[-1] == "shutdown", events
    assert events.count("startup") == 1 and events.count("shutdown") == 1, events
    assert len(cancelled) == 8, events
    where = {e[len("cancelled on "):] for e in cancelled}
    if per_thread:
        assert all(re.fullmatch(r"cyserve-asgi-\d+", n) for n in where), where
    else:
        assert where == {"cyserve-asgi"}
    assert _asgi_threads() == []
