"""One serving process: start the engine for an App, wait for a stop request, stop gracefully.

cyserve.start calls serve_process() when one process serves, and cyserve.supervisor calls it in
each worker process it forks. The lifecycle, in order:

1. The routes (App.build) are built before touching the network, so a mistake is reported as one
   line and nothing is left half-started (the options were validated by Config already).
2. Install the SIGINT, SIGTERM and SIGHUP handlers *before* starting the workers: a signal that
   arrives while the server starts is then recorded rather than lost or raised as
   KeyboardInterrupt in the middle of start(). SIGHUP (a process manager's "reload") stops like
   SIGTERM: reloading is not supported, and its default action would cut requests in flight.
3. Start the server (bind, listen, start the workers) and print one line saying where it serves.
4. The main thread waits in short time.sleep() calls. Python runs signal handlers only in the main
   thread, between bytecodes; a main thread blocked in a long C call would never see Ctrl-C.
   Sleeping releases the GIL, so the workers are not held back.
5. On the first signal: print "cyserve: shutting down" and call srv.stop(grace=graceful_timeout):
   stop accepting, let requests in flight finish within the grace period, then close the rest.
   stop() runs on a helper thread while the main thread keeps waiting in short sleeps, so that a
   second Ctrl-C during the grace period is seen and forces srv.stop(grace=0).
6. A forced stop still has to join the workers, and a worker stuck in a handler that does not
   return cannot be joined. If the forced stop has not finished after _FORCE_WAIT_SECONDS (or on a
   third signal), or a single signal's stop has not finished _FORCE_WAIT_SECONDS after its grace
   period, the process exits with status 1 (os._exit): the only way out that does not finalise
   the interpreter under threads still running Python code. A stop_event (an embedding program)
   never ends the process: serve_process() waits for its handlers.
7. Restore the previous signal handlers and return.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .app import App
from .config import Config
from .errors import CyserveError
from .signals import POLL_SECONDS, Waiter, configure_logging, format_address, listen_error, say

if TYPE_CHECKING:
    from ._core import Server

__all__ = ["serve_process"]

# After a forced stop, how long the workers get to leave their handlers before the process is
# ended under them (a third signal ends it at once). A forced stop cancels every request parked
# in the engine at once, so only a handler that is still computing can take longer than this.
_FORCE_WAIT_SECONDS = 2.0


def serve_process(app: App, config: Config, *, stop_event: threading.Event | None = None,
                  ready: Callable[[Server], None] | None = None) -> None:
    """Serve ``app`` in this process until a stop request (see the module docstring).

    Outside the main thread no signal handler can be installed: the server then runs until
    ``stop_event`` is set (setting it once acts like one Ctrl-C). ``ready`` is called with the
    started Server (its ``port`` is the bound port when config.port is 0)."""
    configure_logging(config.log_level)
    routes = app.build()
    server_cls = _server_class()
    srv = server_cls(routes, **config.server_kwargs())
    _bind_wsgi(routes, config, config.port)
    waiter = Waiter(stop_event)
    waiter.install()
    try:
        try:
            srv.start()
        except OSError as exc:
            raise listen_error(config.host, config.port, exc) from exc
        if config.port == 0:
            _bind_wsgi(routes, config, srv.port)  # now that the port is known
        try:
            workers = config.workers
            address = format_address(config.host, srv.port)
            say(f"cyserve: serving on {config.scheme}://{address} with "
                f"{workers} thread{'s' if workers != 1 else ''} (pid {os.getpid()})")
            if ready is not None:
                ready(srv)
            waiter.wait_for_request(srv)
            if srv.running:
                say(waiter.shutdown_line())
                _stop(srv, config.graceful_timeout, waiter)
        finally:
            # Whatever went wrong above, never leave workers running behind the caller's back.
            if srv.running:
                srv.stop(grace=0.0)
    finally:
        waiter.uninstall()


def _bind_wsgi(routes: list[Any], config: Config, port: int) -> None:
    """Tell the WSGI apps among the routes where they run (their environ's SERVER_NAME and
    SERVER_PORT when a request has no Host, wsgi.multithread, wsgi.multiprocess)."""
    from ._core import WSGIHandler

    for route in routes:
        if isinstance(route[4], WSGIHandler):
            route[4].bind(config.host, port, config.workers, config.shared_port)


def _stop(srv: Server, grace: float, waiter: Waiter) -> None:
    """srv.stop(grace) on a helper thread; a second stop request forces stop(0), and a forced
    stop that cannot finish ends the process (see _FORCE_WAIT_SECONDS)."""
    failure: list[BaseException] = []

    def stop(grace: float) -> None:
        try:
            srv.stop(grace=grace)
        except BaseException as exc:  # handed to the main thread, which re-raises it
            failure.append(exc)

    # The engine allows a second stop() from another thread while the first waits: the shorter
    # grace wins (Server.stop's contract). Both run off the main thread, which stays free to see
    # signals.
    stopper = threading.Thread(target=stop, args=(grace,), name="cyserve-stop", daemon=True)
    stopper.start()
    # A single stop request must end too: once the grace period is over stop(grace) has closed
    # everything parked, and a handler still computing gets _FORCE_WAIT_SECONDS more, as after a
    # forced stop (the process supervisor gives a worker the same before SIGKILL). Only when
    # signals drive the stop, that is when cyserve owns the process: a program that embeds the
    # server and sets its stop_event once is not ended under its own feet (serve_process()
    # returns when the handler does).
    deadline = (time.monotonic() + grace + _FORCE_WAIT_SECONDS if waiter.owns_process()
                else math.inf)
    forced_at: float | None = None
    while stopper.is_alive():
        time.sleep(POLL_SECONDS)
        if forced_at is None and time.monotonic() > deadline:
            _abandon_handlers("the grace period")
        if forced_at is None and waiter.pending() > 1:
            say("cyserve: forcing shutdown")
            forced_at = time.monotonic()
            threading.Thread(target=stop, args=(0.0,), name="cyserve-force-stop",
                             daemon=True).start()
        elif forced_at is not None and (waiter.pending() > 2 or
                                        time.monotonic() - forced_at > _FORCE_WAIT_SECONDS):
            _abandon_handlers("the forced stop")
    stopper.join()
    if failure:
        raise failure[0]


def _abandon_handlers(after: str) -> None:
    # A worker inside a handler that does not return (a Python handler in time.sleep or a loop,
    # a nogil handler computing) cannot be cancelled, so stop(0) cannot join it. Returning would
    # be worse than leaving: the interpreter would finalise under threads that still run Python
    # code. The user asked to stop and the time given is spent, so end the process; the kernel
    # closes every socket.
    say(f"cyserve: handlers still running after {after}; exiting without them")
    try:
        sys.stderr.flush()
    except (OSError, ValueError):  # nobody reads it any more: leave all the same
        pass
    os._exit(1)


def _server_class() -> type[Server]:
    try:
        from ._core import Server
    except ImportError as exc:
        raise CyserveError("the native engine (cyserve._core.Server) is not available; "
                           f"run `make build` ({exc})") from exc
    return Server
