"""ASGI 3 applications (the ``http``, ``websocket`` and ``lifespan`` scopes) on cyserve.

``cyserve module:app`` serves an ASGI application (FastAPI, Starlette ...) when it finds one (an
async callable, as uvicorn tells them; ``--interface asgi`` insists), ``cyserve.run(asgi_app)``
too, and ``app.asgi(prefix, asgi_app)`` mounts one beside native, GIL-free and WSGI routes, with
``root_path`` set to the prefix and ``path`` the whole path (as Starlette's Mount reads it).

Where it runs: one asyncio event loop per process, on a thread of its own ("cyserve-asgi"),
started before the server accepts anything (``--loop auto|asyncio|uvloop``; auto takes uvloop
when it is installed). With ``asgi_loops="thread"`` (``--asgi-loops thread``, meant for a
free-threaded interpreter whose GIL is off: ``loops_per_thread``), each worker thread has a
loop of its own ("cyserve-asgi-N" for "cyserve-worker-N", made on its first ASGI request), and a
request runs on the loop of the worker that parsed it; the process's loop then runs only the
lifespans. The application may use all of asyncio there: tasks, sleeps,
timeouts, its own sockets, run_in_executor. The engine's workers never wait for it: a request's
coroutine parks until the application has sent its answer (docs/architecture.md, "ASGI").

The http scope: ``http_version``, ``method``, ``scheme`` ("http"), ``path`` (percent-decoded,
UTF-8), ``raw_path``, ``query_string`` (raw), ``root_path``, ``headers`` (lower-cased names, raw
byte values, in order), ``client`` and ``server`` ((host, port)), ``state`` (a copy of the
lifespan's). ``receive()`` gives the body as ``http.request`` messages of 64 KiB (the last one
shorter): a Content-Length body is read from the socket a piece per ``receive()`` (100 Continue
before the first read, when asked for; an answer that leaves the body unread closes the
connection), a chunked one is read whole before the call; both within ``max_body_bytes``. Then
``http.disconnect`` once
the response is complete or the client went away (also while the app still works: the engine
watches the socket while it waits for the answer). ``send()``:
``http.response.start`` is kept until the first body message, which goes out with it; a body with
``more_body`` is streamed (chunked, or as announced by the app's Content-Length) and each such
``send()`` returns once the engine has written the piece: a slow reader slows the app down. An
answer to HEAD is its head (the body the app sends goes nowhere). An exception before the answer
started is a 500 (and a logged traceback); after it, the connection closes without the last chunk.
An app that returns without completing its answer is treated the same way. At a stop, answers
still pending when the grace period ends are given up (their connections closed) and their tasks
cancelled. ``send()`` (in both scopes) is no coroutine function, as granian's is not: it does its
work when called and returns what the app awaits, a future already done or the future of the
piece's write; a bad message raises from the call. On Python 3.12 and later a request's task
starts eagerly (``Task(eager_start=True)``): the app runs until its first real suspension from
the callback that hands the loop its batch of requests.

The websocket scope (``native/asgi_ws.pyx``): a request with ``Upgrade: websocket`` to an ASGI
route. A bad handshake is answered by the server (400; 426 with ``Sec-WebSocket-Version: 13``)
without the app. The scope has ``scheme`` "ws" or "wss", ``subprotocols`` (the client's offers)
and the http scope's other keys but ``method``; ``extensions`` offers
``websocket.http.response``. ``receive()``: ``websocket.connect``, then ``websocket.receive``
(``text`` or ``bytes``, each message whole), then ``websocket.disconnect`` with the client's
``code`` (1005 when it gave none, 1006 when it went without a close frame) and ``reason``.
``send()``: ``websocket.accept`` (``subprotocol``, ``headers``), ``websocket.send``,
``websocket.close`` (``code``, ``reason``; before accepting: a 403),
``websocket.http.response.start``/``.body`` before accepting (the denial response). A send waits
while 256 KiB are queued for a slow client; after the connection closed it raises
``ClientDisconnected``. An app that returns closes with 1000, one that raises with 1011 (a 500
before accepting). At a stop, open WebSockets are closed with 1001 after the grace period.

lifespan: ``startup`` runs before the server starts accepting; ``lifespan.startup.failed`` ends
the start with the app's message (the command exits non-zero; Starlette and FastAPI send it when
their startup raises); an app that raises instead of completing its startup does not support
lifespan (as uvicorn reads it) and is served without. ``shutdown`` runs at a stop, after the
requests in flight finished. The state the app puts in ``scope["state"]`` is copied into every
request's scope.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from .app import is_asgi_app
from .config import LOOPS

__all__ = ["is_asgi_app", "ASGIRuntime", "LifespanError", "loop_factory", "loops_per_thread"]

_log = logging.getLogger("cyserve.asgi")
_STOP_TASKS_SECONDS = 5.0


class LifespanError(RuntimeError):
    """The application's lifespan startup (or shutdown) failed."""


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop constructor for ``--loop`` kind: uvloop's when asked for (an error if it
    is not installed) or, with "auto", when installed; asyncio's otherwise."""
    if kind not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}, got {kind!r}")
    if kind in ("auto", "uvloop"):
        try:
            import uvloop  # type: ignore[import-not-found]
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            return uvloop.new_event_loop  # type: ignore[no-any-return]
    return asyncio.new_event_loop


class _Lifespan:
    """The lifespan scope of one application, driven from the loop thread."""

    def __init__(self, app: Any, state: dict[str, Any]) -> None:
        self.app = app
        self.state = state
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.startup: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.shutdown: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.supported = True
        self.failed = False  # the app sent lifespan.startup.failed or lifespan.shutdown.failed
        self.task = asyncio.get_running_loop().create_task(self._main())

    async def _main(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.4"},
                 "state": self.state}
        try:
            await self.app(scope, self._receive, self._send)
        except BaseException as exc:  # noqa: BLE001 (reported to whoever waits)
            if not self.startup.done():
                # As uvicorn reads it: an app that raises instead of completing (or failing)
                # its startup does not speak lifespan (a bare app that only knows http).
                self.supported = False
                _log.info("ASGI 'lifespan' appears unsupported by the application (%s: %s); "
                          "serving without it", type(exc).__name__, exc)
            elif not self.failed:  # after a startup.failed, the raise is the app's way out
                _log.error("ASGI lifespan failed", exc_info=exc)
        finally:
            for fut in (self.startup, self.shutdown):
                if not fut.done():
                    fut.set_result(None)

    async def _receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def _send(self, message: dict[str, Any]) -> None:
        t = message["type"]
        done = {"lifespan.startup.complete": (self.startup, None),
                "lifespan.shutdown.complete": (self.shutdown, None),
                "lifespan.startup.failed": (self.startup, "startup"),
                "lifespan.shutdown.failed": (self.shutdown, "shutdown")}
        if t not in done:
            raise RuntimeError(f"ASGI lifespan: unexpected message {t!r}")
        fut, failed = done[t]
        if fut.done():
            return
        if failed:
            self.failed = True
            fut.set_exception(LifespanError(f"the ASGI application's lifespan {failed} failed: "
                                            f"{message.get('message', '')}".rstrip()))
        else:
            fut.set_result(None)


def loops_per_thread() -> bool:
    """Whether a loop per worker thread (``asgi_loops="thread"``) can run requests at once here:
    on a free-threaded interpreter whose GIL is off at runtime (an extension that does not
    declare itself free-threading safe turns it back on), where one loop thread would be the
    limit of every worker's ASGI requests. With the GIL, one loop per process serves as well
    (the workers' Python calls are serialised anyway, and each loop is one more thread to
    wake). Per-thread loops are asked for, never chosen from this: an object the lifespan made
    for its loop (a connection pool, a client session) cannot be used from another loop."""
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    return is_gil_enabled is not None and not is_gil_enabled()


class ASGIRuntime:
    """The process's event loop thread and the lifespans of the ASGI handlers it serves; with
    per_thread (``asgi_loops="thread"``) also one loop thread per worker thread, made on the
    worker's first ASGI request."""

    def __init__(self, handlers: list[Any], loop: str = "auto", per_thread: bool = False) -> None:
        from ._core import _ASGILoop

        self.handlers = handlers
        self._factory = loop_factory(loop)
        self.loop = self._factory()
        self.main = _ASGILoop(self.loop)
        self.thread = threading.Thread(target=self._run, args=(self.loop,), name="cyserve-asgi",
                                       daemon=True)
        self._lifespans: list[_Lifespan] = []
        self.per_thread = per_thread
        # The worker threads' loops and their threads: appended by the workers (each its own,
        # once), read by stop() after the server stopped.
        self._lock = threading.Lock()
        self._thread_loops: list[tuple[Any, threading.Thread]] = []
        self._stopping = False

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    def _new_thread_loop(self) -> Any:
        """The calling worker thread's own loop, running on a thread of its own (named after
        the worker: cyserve-asgi-N for cyserve-worker-N). Called by the engine, Python state
        attached, on the worker's first ASGI request."""
        from ._core import _ASGILoop

        name = threading.current_thread().name
        suffix = name.rpartition("-")[2] if name.startswith("cyserve-worker-") else name
        lp = _ASGILoop(self._factory())
        thread = threading.Thread(target=self._run, args=(lp.loop,), name=f"cyserve-asgi-{suffix}",
                                  daemon=True)
        with self._lock:
            if self._stopping:
                lp.loop.close()
                raise RuntimeError("the ASGI event loops are stopping")
            thread.start()
            self._thread_loops.append((lp, thread))
        return lp

    def _call(self, coro: Any, timeout: float | None = None,
              loop: asyncio.AbstractEventLoop | None = None) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, loop or self.loop)
        return fut.result(timeout)

    def start(self) -> None:
        """Start the loop and run every application's lifespan startup; LifespanError when one
        fails (the loop is stopped again)."""
        from ._core import _asgi_set_loop

        self.thread.start()
        try:
            # The lifespans run on the process's loop before any request: their state is then
            # every request's, whichever loop runs it.
            self._call(self._startup())
        except BaseException:
            self.stop(0.0, lifespan=False)
            raise
        _asgi_set_loop(self.main, self._new_thread_loop if self.per_thread else None)

    async def _startup(self) -> None:
        seen: dict[int, _Lifespan] = {}
        for handler in self.handlers:
            life = seen.get(id(handler.app))
            if life is None:
                state: dict[str, Any] = {}
                life = _Lifespan(handler.app, state)
                seen[id(handler.app)] = life
                self._lifespans.append(life)
                life.inbox.put_nowait({"type": "lifespan.startup"})
                await life.startup
            handler.state = life.state

    async def _shutdown(self) -> None:
        for life in self._lifespans:
            if life.supported and not life.task.done():
                life.inbox.put_nowait({"type": "lifespan.shutdown"})
                try:
                    await life.shutdown
                except LifespanError as exc:
                    _log.error("%s", exc)

    async def _cancel_requests(self, lp: Any, timeout: float) -> None:
        # Every task but this one and the lifespans': the requests' and what they spawned.
        keep = {asyncio.current_task(), *(life.task for life in self._lifespans)}
        tasks = [t for t in asyncio.all_tasks() if t not in keep]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        from ._core import _asgi_drop_done_tasks

        _asgi_drop_done_tasks(lp)

    def _stop_loop(self, lp: Any, thread: threading.Thread, timeout: float) -> None:
        lp.closed = True
        try:
            if timeout >= 0:
                self._call(self._cancel_requests(lp, timeout), timeout + 1.0, lp.loop)
        finally:
            lp.loop.call_soon_threadsafe(lp.loop.stop)
            thread.join()
            lp.loop.close()

    def stop(self, timeout: float = _STOP_TASKS_SECONDS, lifespan: bool = True) -> None:
        """After the server stopped: cancel the requests' tasks still running (their answers
        were given up by the stop), on every loop; run the lifespan shutdowns, once, on the
        process's loop; stop and close the loops."""
        from ._core import _asgi_set_loop

        if not self.thread.is_alive():
            return
        _asgi_set_loop(None)
        with self._lock:
            self._stopping = True
            thread_loops, self._thread_loops = self._thread_loops, []
        try:
            # The workers' loops first: a request's task there may still use what the
            # lifespan made, which its shutdown then closes.
            for lp, thread in thread_loops:
                self._stop_loop(lp, thread, timeout)
            self.main.closed = True
            self._call(self._cancel_requests(self.main, timeout), timeout + 1.0)
            if lifespan:
                self._call(self._shutdown(), None)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()
