"""One serving process: start the engine for an App, wait for a stop request, stop gracefully.

cyserve.start calls serve_process() when one process serves, and cyserve.supervisor calls it in
each worker process it forks. The lifecycle, in order:

1. The routes (App.build) are built before touching the network, so a mistake is reported as one
   line and nothing is left half-started (the options were validated by Config already).
2. Install the SIGINT, SIGTERM and SIGHUP handlers *before* starting the workers: a signal that
   arrives while the server starts is then recorded rather than lost or raised as
   KeyboardInterrupt in the middle of start(). SIGHUP (a process manager's "reload") stops like
   SIGTERM: reloading the application needs a process supervisor, and its default action would
   cut requests in flight. A TLS server is the exception: SIGHUP reloads its certificates
   (Server.reload_tls: new handshakes get them, connections keep theirs) and it goes on.
3. Start the server (bind, listen, start the workers) and print one line saying where it serves.
4. The main thread waits in poll() for what can end the wait (Waiter.wait_for_request): the
   interpreter's signal wake-up descriptor, the engine's when it stops, one a stop_event's
   watcher writes. Python runs signal handlers only in the main thread, between bytecodes; the
   wake-up descriptor is what makes a blocked poll() return for them. Polling releases the GIL,
   so the workers are not held back, and nothing wakes the thread while nothing happens.
   (A process already at its descriptor limit when the wait begins gets no descriptor for it:
   the wait then wakes every POLL_SECONDS instead, as it always did before.)
5. On the first signal: print "cyserve: shutting down" (a supervisor's worker leaves that line to
   the supervisor, which says it once for all) and call srv.stop(grace=graceful_timeout):
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
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .app import App
from .config import Config
from .errors import CyserveError, ListenError
from .listeners import Listeners
from .signals import POLL_SECONDS, Waiter, configure_logging, format_address, listen_error, say

if TYPE_CHECKING:
    from ._core import Server

__all__ = ["serve_process"]

# After a forced stop, how long the workers get to leave their handlers before the process is
# ended under them (a third signal ends it at once). A forced stop cancels every request parked
# in the engine at once, so only a handler that is still computing can take longer than this.
_FORCE_WAIT_SECONDS = 2.0


def serve_process(app: App, config: Config, *, stop_event: threading.Event | None = None,
                  ready: Callable[[Server], None] | None = None,
                  listeners: Listeners | None = None,
                  tick: Callable[[Server], None] | None = None,
                  metrics: tuple[Any, int] | None = None, parent: int = 0,
                  supervised: bool = False) -> None:
    """Serve ``app`` in this process until a stop request (see the module docstring).

    Outside the main thread no signal handler can be installed: the server then runs until
    ``stop_event`` is set (setting it once acts like one Ctrl-C). ``ready`` is called with the
    started Server (its ``port`` is the bound port when config.port is 0). ``listeners``: the
    sockets already made by a process supervisor (else they are made, and closed, here).
    ``tick`` is called with the Server every POLL_SECONDS while it serves (the supervisor's
    workers check --max-requests with it). ``metrics``: (a cyserve._core.Metrics, this
    process's slot) made by a process supervisor; without it, config.metrics_bind makes one here
    that this process serves. ``parent``: the pid of a process supervisor whose death stops
    this process, from a thread of the engine that needs no GIL (csrc/server.c, "the
    supervisor's watcher"); 0: none. ``supervised``: a process supervisor's worker, whose stop
    is announced by the supervisor, once for all its workers ("shutting down", the drain, the
    forcing): the worker says only what is its own (a handler it had to abandon)."""
    configure_logging(config.log_level, config.log_config)
    routes = app.build()
    if config.health_path is not None:
        # Served from C like any static route; a route of the application's own on the same
        # path is reported as a conflict by the engine.
        routes = routes + [("path", config.health_path, ("GET",), "health",
                            (200, [("Content-Type", "text/plain")], b"ok\n"))]
    server_cls = _server_class()
    own = listeners is None
    if listeners is None:
        listeners = Listeners.for_config(config)
        listeners.open()
    scrape: MetricsEndpoint | None = None
    try:
        if metrics is None and config.metrics_bind is not None:
            scrape = MetricsEndpoint(config, 1)
            metrics = (scrape.metrics, scrape.metrics.claim(os.getpid()))
        _serve_on(app, config, routes, server_cls, listeners, stop_event, ready, tick, metrics,
                  parent, supervised)
    finally:
        if scrape is not None:
            scrape.close()
        if own:
            listeners.close()


class MetricsEndpoint:
    """The metrics' shared region for ``nprocs`` serving processes and the listener at
    config.metrics_bind that answers GET /metrics from it in C (csrc/metrics.c). Made by the
    process that answers scrapes before it forks any worker; ListenError when the address
    cannot be bound."""

    def __init__(self, config: Config, nprocs: int) -> None:
        from ._core import Metrics
        from .listeners import parse_bind

        assert config.metrics_bind is not None
        a = parse_bind(config.metrics_bind, "metrics_bind")
        assert a.host is not None
        try:
            infos = socket.getaddrinfo(a.host, a.port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise ListenError(f"cannot resolve the metrics host {a.host}: {exc.strerror}") \
                from exc
        family, kind, proto, _, addr = infos[0]
        self.sock = socket.socket(family, kind, proto)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(addr)
            self.sock.listen(64)
        except OSError as exc:
            self.sock.close()
            raise ListenError(f"metrics: {listen_error(a.host, a.port, exc)}") from exc
        self.port = self.sock.getsockname()[1]
        self.metrics = Metrics(nprocs, config.metrics_shards)
        self.metrics.serve(self.sock.fileno())
        say(f"cyserve: metrics on http://{format_address(a.host, self.port)}/metrics")

    def close(self) -> None:
        self.metrics.close()
        self.sock.close()


def _serve_on(app: App, config: Config, routes: list[Any], server_cls: type[Server],
              listeners: Listeners, stop_event: threading.Event | None,
              ready: Callable[[Server], None] | None,
              tick: Callable[[Server], None] | None = None,
              metrics: tuple[Any, int] | None = None, parent: int = 0,
              supervised: bool = False) -> None:
    kwargs = config.server_kwargs()
    if parent:
        kwargs["parent_pid"], kwargs["parent_grace"] = parent, float(config.graceful_timeout)
    if metrics is not None and metrics[1] >= 0:
        kwargs["metrics"], kwargs["metrics_slot"] = metrics
    tcp = listeners.tcp
    if not listeners.default:
        kwargs["listen"] = listeners.engine_listen()
    trusted = config.trusted_proxies()
    if trusted is not None:
        kwargs["forwarded_allow_ips"] = trusted
        kwargs["forwarded_header"] = config.forwarded_header
        kwargs["forwarded_host"] = config.forwarded_host
    pp = config.proxy_protocol_peers()
    if pp is not None:
        kwargs["proxy_protocol_from"] = pp
    # WSGI's SERVER_NAME and SERVER_PORT (for a request without Host): the first TCP address.
    wsgi_host, wsgi_port = (tcp[0].host, tcp[0].port) if tcp else ("localhost", 80)
    # "-" is gunicorn's standard output: the access log's own default, no file to open.
    logfile = (AccessLogFile.open(config.access_logfile)
               if config.access_logfile and config.access_logfile != "-" else None)
    if logfile is not None:
        kwargs["access_log_fd"] = logfile.fd
    try:
        srv = server_cls(routes, **kwargs)
    except BaseException:
        if logfile is not None:
            logfile.close()
        raise
    _bind_wsgi(routes, config, wsgi_port, wsgi_host)
    runtime = _start_asgi(routes, config)

    def bound(port: int) -> None:
        # The port an ephemeral bind got, told to the apps before any worker runs: rebinding
        # after the start replaced a dict the workers were reading (on a free-threaded
        # interpreter, nothing orders that store before their reads).
        if tcp and wsgi_port == 0:
            _bind_wsgi(routes, config, port, wsgi_host)

    waiter = Waiter(stop_event, on_usr1=logfile.reopen if logfile is not None else None,
                    on_hup=(lambda: _reload_tls(srv)) if config.ssl_certfile else None)
    waiter.install()
    if waiter.owns_process():
        # A worker process forked by the supervisor starts with them blocked (supervisor.py):
        # from here on they reach the handlers just installed.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM,
                                                    signal.SIGHUP, signal.SIGUSR1})
    try:
        try:
            srv.start(on_bound=bound)
        except OSError as exc:
            if listeners.default:
                raise listen_error(config.host, config.port, exc) from exc
            # The engine's sentence names the address that failed.
            err = ListenError(exc.strerror or str(exc))
            err.errno = exc.errno
            raise err from exc
        try:
            workers = config.workers
            if listeners.default:
                where = f"{config.scheme}://{format_address(config.host, srv.port)}"
            else:
                ports = srv.ports
                where = ", ".join(a.url((ports[i] or None) if a.kind == "tcp" else None)
                                  for i, a in enumerate(listeners.addresses))
            say(f"cyserve: serving on {where} with "
                f"{workers} thread{'s' if workers != 1 else ''} (pid {os.getpid()})")
            if ready is not None:
                ready(srv)
            waiter.wait_for_request(srv, tick)
            if srv.running:
                if not supervised:
                    say(waiter.shutdown_line())
                _drain_delay(srv, config, waiter, announce=not supervised)
                _stop(srv, config.graceful_timeout, waiter, announce=not supervised)
        finally:
            # Whatever went wrong above, never leave workers running behind the caller's back.
            if srv.running:
                srv.stop(grace=0.0)
    finally:
        waiter.uninstall()
        if runtime is not None:
            # The requests in flight are done (or given up): the lifespan shutdown runs now.
            runtime.stop()
        if logfile is not None:
            logfile.close()  # the workers are gone: nothing writes to it any more


def drain_line(config: Config) -> str:
    """What a stop with config.drain_delay > 0 says first (by the single process, or by the
    process supervisor for all its workers)."""
    what = f"{config.health_path} answers 503" if config.health_path else "serving"
    return f"cyserve: {what} for {config.drain_delay:g}s (--drain-delay) before the listeners close"


def _drain_delay(srv: Server, config: Config, waiter: Waiter, *, announce: bool) -> None:
    """config.drain_delay seconds of serving as usual with the health path failing, before the
    graceful stop closes the listeners: a load balancer checking it stops sending new requests
    first. A second stop request (Ctrl-C again) ends the wait."""
    if config.drain_delay <= 0:
        return
    srv.fail_health()
    if announce:
        say(drain_line(config))
    first = waiter.pending()
    deadline = time.monotonic() + config.drain_delay
    while srv.running and waiter.pending() == first and time.monotonic() < deadline:
        time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))


def _reload_tls(srv: Server) -> None:
    """SIGHUP to a TLS server: read its certificate files again, or say why not and keep the
    ones it has."""
    try:
        srv.reload_tls()
    except ValueError as exc:
        say(f"cyserve: SIGHUP: cannot reload the certificates: {exc}; still serving with the "
            "ones loaded before", sys.stderr)
        return
    say("cyserve: SIGHUP: certificates reloaded: new connections get them, open ones keep "
        "theirs (the application is not imported again: that needs a process supervisor)")


class AccessLogFile:
    """The file of --access-logfile. Opened once here; its descriptor goes to the engine, whose
    workers write each line to it. reopen() (on SIGUSR1) opens the path again and dup2()s the
    new file onto the same descriptor, so logrotate's rename-then-signal works without the
    engine knowing: a line being written goes wholly to the old file or wholly to the new one.
    With --processes each worker process opens the file for itself (O_APPEND keeps their lines
    whole) and the supervisor passes SIGUSR1 on to them."""

    FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC

    def __init__(self, path: str, fd: int) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def open(cls, path: str) -> AccessLogFile:
        try:
            return cls(path, os.open(path, cls.FLAGS, 0o644))
        except OSError as exc:
            raise CyserveError(f"cannot open the access log file {path} (--access-logfile): "
                               f"{exc.strerror or exc}") from None

    def reopen(self) -> None:
        try:
            fd = os.open(self.path, self.FLAGS, 0o644)
        except OSError as exc:
            say(f"cyserve: SIGUSR1: cannot reopen the access log {self.path}: "
                f"{exc.strerror or exc}; still writing to the file it had", sys.stderr)
            return
        os.dup2(fd, self.fd, inheritable=False)
        os.close(fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _start_asgi(routes: list[Any], config: Config) -> Any:
    """Start the event loop of the ASGI apps among the routes, and run their lifespan startup,
    before anything is accepted; None when there are none. CyserveError when a startup fails."""
    from ._core import ASGIHandler

    handlers = [route[4] for route in routes if isinstance(route[4], ASGIHandler)]
    if not handlers:
        return None
    from .asgi import ASGIRuntime, LifespanError, per_thread_loops

    for handler in handlers:
        handler.bind(config.host, config.port)
    # Decided here, after the application was imported: an extension it imported that is not
    # free-threading safe has turned the GIL back on by now.
    runtime = ASGIRuntime(handlers, config.loop, per_thread=per_thread_loops(config.asgi_loops),
                          workers=config.workers, lifespan=config.lifespan)
    try:
        runtime.start()
    except LifespanError as exc:
        raise CyserveError(str(exc)) from exc
    return runtime


def _bind_wsgi(routes: list[Any], config: Config, port: int, host: str | None = None) -> None:
    """Tell the WSGI apps among the routes where they run (their environ's SERVER_NAME and
    SERVER_PORT when a request has no Host, wsgi.multithread, wsgi.multiprocess)."""
    from ._core import ASGIHandler, WSGIHandler

    for route in routes:
        if isinstance(route[4], (WSGIHandler, ASGIHandler)):
            route[4].set_root_path(config.root_path)  # --root-path
        if isinstance(route[4], WSGIHandler):
            route[4].bind(config.host if host is None else host, port, config.workers,
                          config.shared_port)
        elif isinstance(route[4], ASGIHandler):
            route[4].bind(config.host if host is None else host, port)  # the scope's "server"


def _stop(srv: Server, grace: float, waiter: Waiter, *, announce: bool) -> None:
    """srv.stop(grace) on a helper thread; a second stop request forces stop(0) (said when
    ``announce``), and a forced stop that cannot finish ends the process (see
    _FORCE_WAIT_SECONDS)."""
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
            if announce:
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
