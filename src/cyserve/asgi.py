"""ASGI 3 applications (the ``http``, ``websocket`` and ``lifespan`` scopes) on cyserve.

``cyserve module:app`` serves an ASGI application (FastAPI, Starlette ...) when it finds one (an
async callable, as uvicorn tells them; ``--interface asgi`` insists), ``cyserve.run(asgi_app)``
too, and ``app.asgi(prefix, asgi_app)`` mounts one beside native, GIL-free and WSGI routes, with
``root_path`` set to the prefix and ``path`` the whole path (as Starlette's Mount reads it).
With ``--root-path /svc`` (``root_path="/svc"``), ``root_path`` is "/svc" followed by the prefix and
``path`` and ``raw_path`` begin with "/svc", as uvicorn builds them: the proxy removed it.

Where it runs: one asyncio event loop per process, on a thread of its own ("cyserve-asgi"),
started before the server accepts anything (``--loop auto|asyncio|uvloop``; auto takes uvloop
when it is installed). With ``asgi_loops="thread"`` (``--asgi-loops thread``; the default
"auto" chooses it on a free-threaded interpreter whose GIL is off: ``loops_per_thread``), one
loop per worker thread ("cyserve-asgi-0" ... for N workers, all started before the server), each
worker taking one on its first ASGI request, and a request runs on the loop of the worker that
parsed it. The application may use all of asyncio there: tasks, sleeps,
timeouts, its own sockets, run_in_executor. The engine's workers never wait for it: a request's
coroutine parks until the application has sent its answer (docs/architecture.md, "ASGI").

The http scope: ``http_version``, ``method``, ``scheme`` ("http"), ``path`` (percent-decoded,
UTF-8), ``raw_path``, ``query_string`` (raw), ``root_path``, ``headers`` (lower-cased names, raw
byte values, in order), ``client`` and ``server`` ((host, port)), ``state`` (a copy of the
lifespan's). ``receive()`` gives the body as ``http.request`` messages of 64 KiB (the last one
shorter): a body, with a Content-Length or chunked, is read from the socket a piece per
``receive()`` (100 Continue before the first read, when asked for, so an app that never reads
sends none; an answer that leaves the body unread closes the connection), within
``max_body_bytes``. Then
``http.disconnect`` once
the response is complete or the client went away (also while the app still works: the engine
watches the socket while it waits for the answer). ``send()``:
``http.response.start`` is kept until the first body message, which goes out with it; a body with
``more_body`` is streamed (chunked, or as announced by the app's Content-Length) and each such
``send()`` returns once the engine has written the piece: a slow reader slows the app down. An
answer to HEAD is its head, with the app's Content-Length (else the length of the body the app
sends, which goes nowhere). An exception before the answer
started is a 500 (and a logged traceback); after it, the connection closes without the last chunk.
An app that returns without completing its answer is treated the same way. ``extensions`` offers
``http.response.pathsend`` (and ``tls`` over TLS): after the start, ``{"type":
"http.response.pathsend", "path": ...}`` makes the file at that path (absolute, as the spec
asks; a relative one is the app's working directory's) the whole body, sent by the engine as a
file body (sendfile); a file that cannot be opened or is not a regular file, or a pathsend
before the start or after the body began raise from ``send()``.
At a stop, answers
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
``websocket.http.response``, and ``tls`` over TLS. ``receive()``: ``websocket.connect``, then
``websocket.receive`` (``text`` or ``bytes``, each message whole), then ``websocket.disconnect``
with the client's ``code`` (1005 when it gave none, 1006 when it went without a close frame)
and ``reason``.
``send()``: ``websocket.accept`` (``subprotocol``, ``headers``), ``websocket.send``,
``websocket.close`` (``code``, ``reason``; before accepting: a 403),
``websocket.http.response.start``/``.body`` before accepting (the denial response). A send waits
while 256 KiB are queued for a slow client; after the connection closed it raises
``ClientDisconnected``. An app that returns closes with 1000, one that raises with 1011 (a 500
before accepting). At a stop, open WebSockets are closed with 1001 after the grace period.

lifespan (``--lifespan auto|on|off``, uvicorn's semantics): ``startup`` runs before the server
starts accepting; ``lifespan.startup.failed`` ends the start with the app's message (the command
exits non-zero; Starlette and FastAPI send it when their startup raises); an app that raises
instead of completing its startup does not support lifespan (as uvicorn reads it) and is served
without, with a logged note ("auto"), or fails the start ("on"); "off" never sends the scope.
``shutdown`` runs at a stop, after the requests in flight finished. The state the app puts in
``scope["state"]`` is copied shallowly into every request's scope. With a loop per worker
thread, each loop runs the lifespan for itself before any request: N workers, N startups, each
with its own state, so that what a startup binds to its loop (a connection pool, a client
session, an asyncio.Lock) is used by requests on that loop only; a startup that fails on any
loop fails the start (its message once), and each loop's shutdown runs after that loop's
requests ended.
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
from .config import LIFESPANS, LOOPS

__all__ = ["is_asgi_app", "ASGIRuntime", "LifespanError", "loop_factory", "loops_per_thread",
           "per_thread_loops"]

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
        # uvloop is typed where it is installed (the test venvs) and missing where it is not
        # (3.14t): each ignore holds for one of the two, hence unused-ignore.
        try:
            import uvloop  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            return uvloop.new_event_loop  # type: ignore[no-any-return, unused-ignore]
    return asyncio.new_event_loop


class _Lifespan:
    """The lifespan scope of one application on one event loop, driven from that loop's thread.
    It logs nothing itself: with a loop per worker thread the same app runs one lifespan per
    loop, and ASGIRuntime reports what they have in common once."""

    def __init__(self, app: Any, state: dict[str, Any], required: bool = False) -> None:
        self.app = app
        self.state = state
        self.required = required  # lifespan "on": an app that raises at startup has failed
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.startup: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.shutdown: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.supported = True
        self.failed = False  # the app sent lifespan.startup.failed or lifespan.shutdown.failed
        self.error: BaseException | None = None  # what the app raised, if it did
        self.task = asyncio.get_running_loop().create_task(self._main())

    async def _main(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.4"},
                 "state": self.state}
        try:
            await self.app(scope, self._receive, self._send)
        except BaseException as exc:  # noqa: BLE001 (reported to whoever waits)
            if self.startup.done():
                if not self.failed:  # after a *.failed message, the raise is the app's way out
                    _log.error("ASGI lifespan failed", exc_info=exc)
            else:
                self.error = exc
                if self.required:
                    self.failed = True
                    self.startup.set_exception(LifespanError(
                        f"the ASGI application's lifespan startup failed: "
                        f"{type(exc).__name__}: {exc}".rstrip(": ")))
                else:
                    # As uvicorn reads it (--lifespan auto): an app that raises instead of
                    # completing (or failing) its startup does not speak lifespan (a bare app
                    # that only knows http).
                    self.supported = False
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
    """Whether a loop per worker thread can run requests at once here: on a free-threaded
    interpreter whose GIL is off at runtime (an extension that does not declare itself
    free-threading safe turns it back on), where one loop thread would be the limit of every
    worker's ASGI requests. It is what ``asgi_loops="auto"`` (the default) chooses from. With
    the GIL, one loop per process serves as well and costs less (the workers' Python calls are
    serialised anyway, and each loop is one more thread to wake)."""
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    return is_gil_enabled is not None and not is_gil_enabled()


def per_thread_loops(asgi_loops: str) -> bool:
    """Whether the ``asgi_loops`` option means one loop per worker thread: "thread", or "auto"
    on an interpreter whose GIL is off (loops_per_thread)."""
    return asgi_loops == "thread" or (asgi_loops == "auto" and loops_per_thread())


class _Loop:
    """One event loop of the runtime, its thread, and the lifespans that run on it."""

    def __init__(self, lp: Any, name: str) -> None:
        self.lp = lp  # the engine's _ASGILoop: the asyncio loop and its requests' tasks
        self.thread = threading.Thread(target=self._run, args=(lp.loop,), name=name, daemon=True)
        self.lifespans: list[_Lifespan] = []

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    def call(self, coro: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.lp.loop)

    def end(self) -> None:
        """Stop the loop, join its thread, close it."""
        self.lp.closed = True
        self.lp.loop.call_soon_threadsafe(self.lp.loop.stop)
        self.thread.join()
        self.lp.close_wake()
        self.lp.loop.close()


class ASGIRuntime:
    """The event loops of the ASGI handlers a server serves, and their lifespans: one loop per
    process ("cyserve-asgi"), or with per_thread one per worker thread ("cyserve-asgi-0" ...,
    ``workers`` of them), each running every application's lifespan for itself. All are made,
    and their lifespans started, before the server starts; a worker thread takes its loop on
    its first ASGI request.

    lifespan: "auto" (an app that raises on the lifespan scope before completing its startup
    does not support lifespan: served without it, with a logged note), "on" (that is a startup
    failure) or "off" (the scope is never sent), as uvicorn's --lifespan."""

    def __init__(self, handlers: list[Any], loop: str = "auto", per_thread: bool = False,
                 workers: int = 1, lifespan: str = "auto") -> None:
        from ._core import _ASGILoop

        if lifespan not in LIFESPANS:
            raise ValueError(f"lifespan must be one of {', '.join(LIFESPANS)}, got {lifespan!r}")
        self.handlers = handlers
        self.per_thread = per_thread
        self.lifespan = lifespan
        factory = loop_factory(loop)
        if per_thread:
            names = [f"cyserve-asgi-{i}" for i in range(max(1, workers))]
        else:
            names = ["cyserve-asgi"]
        self.loops = [_Loop(_ASGILoop(factory()), name) for name in names]
        self.loop = self.loops[0].lp.loop  # the process's loop (the first, with per_thread)
        # Which loop the next worker thread takes: the loops in turn, so that each of the
        # first `workers` threads has one of its own (a relief thread, or a worker of a later
        # turn, then shares one). Taken under the lock by the workers, once each.
        self._lock = threading.Lock()
        self._next = 0
        self._started = False

    def _take_loop(self) -> Any:
        """The calling worker thread's loop, per_thread only. Called by the engine, Python
        state attached, on the thread's first ASGI request."""
        with self._lock:
            lp = self.loops[self._next % len(self.loops)].lp
            self._next += 1
        if lp.closed:
            raise RuntimeError("the ASGI event loops are stopping")
        return lp

    def start(self) -> None:
        """Start the loops and run every application's lifespan startup on each, all loops at
        once; LifespanError when one fails (the message of the first, once: the same app fails
        the same way on every loop). The loops whose startup completed then run their shutdown,
        and all are stopped again."""
        from ._core import _asgi_set_loop

        for one in self.loops:
            one.thread.start()
        self._started = True
        futures = [one.call(self._startup(one)) for one in self.loops]
        failure: BaseException | None = None
        for fut in futures:
            try:
                fut.result()
            except BaseException as exc:  # noqa: BLE001 (the first is raised below)
                if failure is None:
                    failure = exc
        self._report_startup()
        if failure is not None:
            self.stop(0.0)
            raise failure
        _asgi_set_loop(self.loops[0].lp, self._take_loop if self.per_thread else None)

    def _report_startup(self) -> None:
        """Log, once per application, what its lifespans on every loop had to say."""
        seen: set[int] = set()
        for one in self.loops:
            for life in one.lifespans:
                if id(life.app) in seen or life.error is None:
                    continue
                seen.add(id(life.app))
                exc = life.error
                if life.required:
                    _log.error("ASGI lifespan startup failed (--lifespan on)", exc_info=exc)
                else:
                    _log.info("ASGI 'lifespan' appears unsupported by the application (%s: %s); "
                              "serving without it", type(exc).__name__, exc)

    async def _startup(self, one: _Loop) -> None:
        """Every app's lifespan startup on this loop (its thread), each with a state of its
        own; the state every request on this loop then gets a shallow copy of."""
        by_app: dict[int, _Lifespan | None] = {}
        for handler in self.handlers:
            key = id(handler.app)
            if key not in by_app:
                life = None
                if self.lifespan != "off":
                    life = _Lifespan(handler.app, {}, required=self.lifespan == "on")
                    one.lifespans.append(life)
                    life.inbox.put_nowait({"type": "lifespan.startup"})
                    # A failure ends this loop's startup here: the apps before it on this loop
                    # completed theirs, and stop() shuts those down.
                    await life.startup
                by_app[key] = life
            life = by_app[key]
            one.lp.states[handler] = {} if life is None else life.state

    async def _finish(self, one: _Loop, timeout: float, lifespan: bool) -> list[str]:
        """At a stop, on the loop's thread: cancel the requests' tasks still there (their
        answers were given up by the stop), then run its lifespans' shutdown. The shutdown
        failures' messages, for stop() to log once."""
        from ._core import _asgi_drop_done_tasks

        keep = {asyncio.current_task(), *(life.task for life in one.lifespans)}
        tasks = [t for t in asyncio.all_tasks() if t not in keep]
        for task in tasks:
            task.cancel()
        if tasks and timeout >= 0:
            await asyncio.wait(tasks, timeout=timeout)
        _asgi_drop_done_tasks(one.lp)
        errors: list[str] = []
        if not lifespan:
            return errors
        for life in one.lifespans:
            # Only an app whose startup completed (a failed or unsupported one has nothing to
            # shut down, and one that never answered is still waiting for its startup).
            if not (life.supported and not life.failed and life.startup.done()
                    and not life.task.done()):
                continue
            life.inbox.put_nowait({"type": "lifespan.shutdown"})
            try:
                await life.shutdown
            except LifespanError as exc:
                errors.append(str(exc))
        return errors

    def stop(self, timeout: float = _STOP_TASKS_SECONDS, lifespan: bool = True) -> None:
        """After the server stopped: on every loop at once, cancel the requests' tasks still
        running and run that loop's lifespan shutdowns; then stop and close the loops. A
        shutdown failure is logged once however many loops reported it."""
        from ._core import _asgi_set_loop

        if not self._started:
            return
        self._started = False
        _asgi_set_loop(None)
        with self._lock:
            for one in self.loops:
                one.lp.closed = True  # handed out no more
        try:
            futures = [one.call(self._finish(one, timeout, lifespan)) for one in self.loops]
            errors: list[str] = []
            for fut in futures:
                try:
                    errors += fut.result()
                except BaseException:  # noqa: BLE001 (the loops must still be stopped)
                    _log.exception("stopping an ASGI event loop failed")
            for message in dict.fromkeys(errors):
                _log.error("%s", message)
        finally:
            for one in self.loops:
                one.end()
