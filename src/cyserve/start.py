"""cyserve.run: start a server for an App, in this process or under a process supervisor.

This is what `cyserve.run` and the command line call. It validates the options (Config), turns a
WSGI application into an App, and hands over to one of two modules, which never import each
other's internals:

- cyserve.serving: one process serves (start the engine, wait for a signal, stop gracefully);
- cyserve.supervisor: ``processes=N`` forks N serving processes and supervises them.

What both need of signals and status lines is in cyserve.signals.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .app import App, as_app
from .config import Config
from .errors import CyserveError
from .hooks import HookServer, call_hook
from .serving import serve_process
from .signals import PidFile, format_address
from .supervisor import serve_processes

if TYPE_CHECKING:
    from ._core import Server

__all__ = ["run", "serve", "format_address"]


def run(app: App | Callable[..., Any], host: str = "127.0.0.1", port: int = 8000,
        threads: int = 0, **options: Any) -> None:
    """Serve ``app`` until SIGINT or SIGTERM, then stop gracefully and return.

    ``app`` is a cyserve.App or a WSGI application (PEP 3333; ``interface="wsgi"`` insists on
    one, cyserve.wsgi says how it is run).

    ``threads=0`` starts one worker per CPU available to the process; ``processes=N`` runs N
    such processes under a supervisor (cyserve.supervisor). Other options are those of
    cyserve.config.Config (backlog, limits, timeouts, graceful_timeout, log_level; HTTPS with
    ssl_certfile, ssl_keyfile, ssl_keyfile_password, ssl_ciphers). Raises
    ConfigError for a bad option, RouteError for a bad route, ListenError when the address
    cannot be bound.
    """
    config = Config.from_options(host=host, port=port, threads=threads, **options)
    serve(app, config)


def serve(app: App | Callable[..., Any], config: Config, *,
          stop_event: threading.Event | None = None,
          ready: Callable[[Server], None] | None = None,
          loader: Callable[[], App] | None = None) -> None:
    """Run ``app`` with ``config``: what run() does, for callers holding a Config.

    Outside the main thread no signal handler can be installed: the server then runs until
    ``stop_event`` is set (setting it once acts like one Ctrl-C). ``ready`` is called with the
    started Server (its ``port`` is the bound port when config.port is 0). ``loader`` imports the
    application again, for a process supervisor's reload (SIGHUP).
    """
    app = as_app(app, config.interface)
    if config.proc_name is not None:
        name_process(config.proc_name)
    if config.umask is not None:
        os.umask(config.umask)  # before any file is made: the pid file, a Unix socket
    pidfile = PidFile(config.pid) if config.pid is not None else None
    if config.supervised and (stop_event is not None or ready is not None):
        raise CyserveError("processes > 1 is run from the main thread by signals; "
                           "stop_event and ready apply to one process only")
    server = HookServer(config)
    call_hook(config, "on_starting", server, must=True)  # before anything is bound
    if pidfile is not None:
        pidfile.write()
    try:
        if config.supervised:  # processes > 1, or worker recycling (max_requests)
            if serve_processes(app, config.replace(interface="cyserve"), loader,
                               server=server) != 0:
                raise CyserveError("stopped: worker processes failed (see above)")
            return
        serve_process(app, config, stop_event=stop_event,
                      ready=_when_ready(config, server, ready))
    finally:
        if pidfile is not None:
            pidfile.remove()
        call_hook(config, "on_exit", server)


def name_process(name: str) -> None:
    """Give this process the task name ``name`` (its first 15 bytes, the kernel's limit), which
    ps, top, pgrep and /proc/PID/comm show; the worker processes forked later inherit it.
    prctl(PR_SET_NAME) names the calling thread, which here is the main one, the process's
    own; the engine's threads name themselves. Nothing happens where there is no prctl."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return
    pr_set_name = 15
    raw = name.encode("utf-8")[:15]
    if prctl(pr_set_name, ctypes.c_char_p(raw), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise CyserveError(f"--name {name}: the kernel refused it: {os.strerror(errno)}")


def _when_ready(config: Config, server: HookServer, ready: Callable[[Server], None] | None
                ) -> Callable[[Server], None] | None:
    """``ready``, with the when_ready hook called first (one serving process)."""
    if config.when_ready is None:
        return ready

    def both(srv: Server) -> None:
        call_hook(config, "when_ready", server)
        if ready is not None:
            ready(srv)

    return both
