"""cyserve.run: start a server for an App, wait for a signal, stop it gracefully.

The lifecycle, in order:

1. Validate the options (Config) and the routes (App.build) before touching the network, so a
   mistake is reported as one line and nothing is left half-started.
2. Install the SIGINT, SIGTERM and SIGHUP handlers *before* starting the workers: a signal that
   arrives while the server starts is then recorded rather than lost or raised as
   KeyboardInterrupt in the middle of start(). SIGHUP (a process manager's "reload") stops like
   SIGTERM: reloading is not supported, and its default action would cut requests in flight.
3. Start the server (bind, listen, start the workers) and print one line saying where it serves.
4. The main thread waits in short time.sleep() calls. Python runs signal handlers only in the main
   thread, between bytecodes; a main thread blocked in a long C call (as onion's ctypes bindings do)
   would never see Ctrl-C. Sleeping releases the GIL, so the workers are not held back.
5. On the first signal: print "cyserve: shutting down" and call srv.stop(grace=graceful_timeout):
   stop accepting, let requests in flight finish within the grace period, then close the rest.
   stop() runs on a helper thread while the main thread keeps waiting in short sleeps, so that a
   second Ctrl-C during the grace period is seen and forces srv.stop(grace=0).
6. A forced stop still has to join the workers, and a worker stuck in a handler that does not
   return cannot be joined. If the forced stop has not finished after _FORCE_WAIT_SECONDS (or on a
   third signal), or a single signal's stop has not finished _FORCE_WAIT_SECONDS after its grace
   period, the process exits with status 1 (os._exit): the only way out that does not finalise
   the interpreter under threads still running Python code. A stop_event (an embedding program)
   never ends the process: serve() waits for its handlers.
7. Restore the previous signal handlers and return.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from .app import App, as_app
from .config import Config
from .errors import CyserveError, ListenError

if TYPE_CHECKING:
    from ._core import Server

__all__ = ["run", "serve", "format_address"]

log = logging.getLogger("cyserve")

# How often the waiting main thread wakes up. A signal interrupts the sleep at once and its
# handler runs; PEP 475 then resumes the sleep for what is left of it, so this bounds how long a
# recorded signal waits to be acted on.
_POLL_SECONDS = 0.05
# After a forced stop, how long the workers get to leave their handlers before the process is
# ended under them (a third signal ends it at once). A forced stop cancels every request parked
# in the engine at once, so only a handler that is still computing can take longer than this.
_FORCE_WAIT_SECONDS = 2.0


def run(app: App | Callable[..., Any], host: str = "127.0.0.1", port: int = 8000,
        threads: int = 0, **options: Any) -> None:
    """Serve ``app`` until SIGINT or SIGTERM, then stop gracefully and return.

    ``app`` is a cyserve.App or a WSGI application (PEP 3333; ``interface="wsgi"`` insists on
    one, cyserve.wsgi says how it is run).

    ``threads=0`` starts one worker per CPU available to the process; ``processes=N`` runs N
    such processes under a supervisor (cyserve.processes). Other options are those of
    cyserve.config.Config (backlog, limits, timeouts, graceful_timeout, log_level). Raises
    ConfigError for a bad option, RouteError for a bad route, ListenError when the address
    cannot be bound.
    """
    config = Config.from_options(host=host, port=port, threads=threads, **options)
    serve(app, config)


def serve(app: App | Callable[..., Any], config: Config, *,
          stop_event: threading.Event | None = None,
          ready: Callable[[Server], None] | None = None) -> None:
    """Run ``app`` with ``config``: what run() does, for callers holding a Config.

    Outside the main thread no signal handler can be installed: the server then runs until
    ``stop_event`` is set (setting it once acts like one Ctrl-C). ``ready`` is called with the
    started Server (its ``port`` is the bound port when config.port is 0).
    """
    app = as_app(app, config.interface)
    if config.processes > 1:
        if stop_event is not None or ready is not None:
            raise CyserveError("processes > 1 is run from the main thread by signals; "
                               "stop_event and ready apply to one process only")
        from .processes import serve_processes
        if serve_processes(app, config.replace(interface="cyserve")) != 0:
            raise CyserveError("stopped: worker processes failed (see above)")
        return
    _configure_logging(config.log_level)
    routes = app.build()
    server_cls = _server_class()
    srv = server_cls(routes, **config.server_kwargs())
    _bind_wsgi(routes, config, config.port)
    waiter = _Waiter(stop_event)
    waiter.install()
    try:
        try:
            srv.start()
        except OSError as exc:
            raise _listen_error(config.host, config.port, exc) from exc
        if config.port == 0:
            _bind_wsgi(routes, config, srv.port)  # now that the port is known
        try:
            workers = config.workers
            say(f"cyserve: serving on http://{format_address(config.host, srv.port)} with "
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


def say(line: str, stream: TextIO | None = None) -> None:
    """One status line in one write: with several worker processes on one pipe (and
    PYTHONUNBUFFERED, where print() writes the text and the newline separately) lines from
    different processes must not interleave."""
    stream = sys.stdout if stream is None else stream
    try:
        stream.write(line + "\n")
        stream.flush()
    except (BrokenPipeError, ValueError):
        # Nobody reads the output any more (`cyserve ... | head -1`, a log reader that died, a
        # closed stream): a status line is not worth losing the graceful stop over. Point the
        # descriptor at /dev/null so that the interpreter's last flush does not fail either.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


def format_address(host: str, port: int) -> str:
    """HOST:PORT as it appears in a URL: an IPv6 address goes in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Waiter:
    """Counts stop requests: signals (in the main thread) and a stop_event (anywhere)."""

    def __init__(self, stop_event: threading.Event | None) -> None:
        self.requests = 0
        self.first_signal: int | None = None
        self.stop_event = stop_event
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        # SIGHUP too: process managers send it to reload (gunicorn's meaning). cyserve cannot
        # reload, and SIGHUP's default action would end the process at once, cutting requests in
        # flight; a graceful stop loses nothing (shutdown_line says why it stopped).
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def owns_process(self) -> bool:
        """Whether the stop is driven by signals (install() ran on the main thread)."""
        return bool(self._previous)

    def previous_handlers(self) -> dict[int, Any]:
        """The handlers install() replaced (a forked worker process puts them back)."""
        return dict(self._previous)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only count here: printing from a signal handler can re-enter a print the main thread
        # was in the middle of (RuntimeError: reentrant call), so the main loop does the talking.
        if self.first_signal is None:
            self.first_signal = signum
        self.requests += 1

    def shutdown_line(self) -> str:
        """What to print when the stop begins."""
        if self.first_signal == signal.SIGHUP:
            return ("cyserve: SIGHUP: reloading is not supported; shutting down gracefully "
                    "(start the server again to load new code)")
        return "cyserve: shutting down"

    def pending(self) -> int:
        if self.stop_event is not None and self.stop_event.is_set():
            return max(self.requests, 1)
        return self.requests

    def wait_for_request(self, srv: Server) -> None:
        """Return when a stop was requested or the server stopped on its own."""
        while srv.running and self.pending() == 0:
            time.sleep(_POLL_SECONDS)


def _stop(srv: Server, grace: float, waiter: _Waiter) -> None:
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
    # server and sets its stop_event once is not ended under its own feet (serve() returns
    # when the handler does).
    deadline = (time.monotonic() + grace + _FORCE_WAIT_SECONDS if waiter.owns_process()
                else math.inf)
    forced_at: float | None = None
    while stopper.is_alive():
        time.sleep(_POLL_SECONDS)
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


# For these the C library's text is the whole story ("address already in use"); for anything
# else (an unknown host name, say) the engine's own sentence says more than strerror would.
_PLAIN_ERRNOS = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL, errno.EPERM})


def _listen_error(host: str, port: int, exc: OSError) -> ListenError:
    if exc.errno in _PLAIN_ERRNOS or (exc.errno and not exc.strerror):
        reason = os.strerror(exc.errno)
        reason = reason[:1].lower() + reason[1:]
    else:
        reason = exc.strerror or str(exc)
    err = ListenError(f"cannot listen on {format_address(host, port)}: {reason}")
    err.errno = exc.errno
    return err


def _configure_logging(level: str) -> None:
    # Tracebacks of failing handlers and the engine's warnings go through this logger. Give it a
    # handler only if the application configured none, so that users' logging setups win.
    log.setLevel(level.upper())
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("cyserve: %(levelname)s: %(message)s"))
        log.addHandler(handler)
