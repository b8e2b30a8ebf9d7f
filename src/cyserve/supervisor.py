"""The process supervisor: ``cyserve app --processes N`` (``cyserve.run(app, processes=N)``).

One process has one GIL, so Python handlers use one core whatever the thread count (the full
benchmark run measured /fib at 21 req/s with one worker thread or two). N processes, each a
complete cyserve server with its own worker threads and its own SO_REUSEPORT listeners on the
same address, let the kernel spread connections over N interpreters.

The supervisor (the process the user started) never serves. In order:

1. Everything that can be checked once is checked before forking: the options, the routes
   (App.build), and that the address is free (an exclusive probe bind, as the engine's own), so
   a mistake is one line from one process, not N. The workers then join one SO_REUSEPORT group
   (Config.shared_port skips the engine's exclusive probe, which would refuse the second).
2. It forks the workers after importing the app and before any engine thread exists (fork copies
   only the calling thread). Each worker runs its own process group, so a Ctrl-C in the terminal
   reaches the supervisor alone, which then decides what each worker gets; and each asks the
   kernel for SIGTERM if the supervisor dies (PR_SET_PDEATHSIG), so none is orphaned.
3. A worker that exits while the server is running is replaced. One that exits within
   _QUICK_EXIT_SECONDS of its start counts as a failure to start; after _MAX_QUICK_EXITS in a
   row the supervisor stops everything and exits with status 1 rather than fork forever.
4. The first SIGINT, SIGTERM or SIGHUP is passed on as SIGTERM: every worker stops gracefully
   (its own graceful_timeout). A second is passed on again, which a worker takes as "force" (see
   serving.py). A third, or workers still alive graceful_timeout + _FORCE_EXTRA_SECONDS after the
   first, get SIGKILL.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from .app import App
from .config import Config
from .errors import CyserveError, ListenError
from .serving import serve_process
from .signals import Waiter, configure_logging, format_address, listen_error, say

__all__ = ["serve_processes"]

_POLL_SECONDS = 0.05
_QUICK_EXIT_SECONDS = 1.0
_MAX_QUICK_EXITS = 5
_FORCE_EXTRA_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1


def serve_processes(app: App, config: Config) -> int:
    """Supervise config.processes worker processes serving ``app``; return the exit status
    (0 after a requested stop). Raises ListenError/RouteError/CyserveError before forking."""
    if threading.current_thread() is not threading.main_thread():
        raise CyserveError("processes > 1 needs the main thread (it supervises by signals)")
    configure_logging(config.log_level)
    app.build()  # a bad route is reported here, once
    if config.ssl_certfile:
        from ._core import check_tls

        check_tls(**config.tls_kwargs())  # and a certificate or key OpenSSL cannot use
    try:
        _probe_bind(config.host, config.port)
    except OSError as exc:
        raise listen_error(config.host, config.port, exc) from exc

    sup = _Supervisor(app, config)
    sup.install()
    try:
        say(f"cyserve: supervising {config.processes} processes on "
            f"{config.scheme}://{format_address(config.host, config.port)} (pid {os.getpid()})")
        return sup.run()
    finally:
        sup.uninstall()


def _probe_bind(host: str, port: int) -> None:
    """Bind host:port as the engine's own probe does (SO_REUSEADDR, no SO_REUSEPORT: a
    reuseport bind would join another server's group instead of failing), then let go. The
    workers then join each other's group (Config.shared_port)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:  # worded as the engine words it (server_start)
        raise OSError(errno.EINVAL, f"cannot resolve host {host}: {exc.strerror}") from exc
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
        s.listen(1)


class _Supervisor:
    def __init__(self, app: App, config: Config) -> None:
        self.app = app
        self.config = config
        self.children: dict[int, float] = {}  # pid -> start time
        self.waiter = Waiter(None)  # counts SIGINT/SIGTERM/SIGHUP, like a single server's loop
        self.giving_up = False
        self.quick_exits = 0

    def install(self) -> None:
        self.waiter.install()

    def uninstall(self) -> None:
        self.waiter.uninstall()

    def run(self) -> int:
        for _ in range(self.config.processes):
            self._spawn()
        status = 0
        while not self.giving_up and self.waiter.pending() == 0:
            time.sleep(_POLL_SECONDS)
            for pid, code in self._reap():
                started = self.children.pop(pid)
                if self.giving_up or self.waiter.pending():
                    continue  # stopping anyway: _stop() accounts for the others
                quick = time.monotonic() - started < _QUICK_EXIT_SECONDS
                self.quick_exits = self.quick_exits + 1 if quick else 0
                if self.quick_exits >= _MAX_QUICK_EXITS:
                    say(f"cyserve: {self.quick_exits} worker processes in a row exited at "
                        "start; stopping", sys.stderr)
                    status = 1
                    self.giving_up = True
                    continue
                say(f"cyserve: worker process {pid} {_describe(code)}; starting a new one",
                    sys.stderr)
                self._spawn()
        if status == 0:
            say(self.waiter.shutdown_line())
        return self._stop(status)

    def _spawn(self) -> None:
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the supervisor's code
            code = 1
            try:
                code = _worker_main(self.app, self.config, self.waiter.previous_handlers(),
                                    supervisor)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: B036 - whatever happens, leave by os._exit
                import traceback
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.children[pid] = time.monotonic()

    def _reap(self) -> list[tuple[int, int]]:
        done: list[tuple[int, int]] = []
        while self.children:
            try:
                pid, wstatus = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                # No child left at all (someone else reaped ours): forget them rather than wait
                # forever for pids that cannot be waited for.
                reaped = {pid for pid, _ in done}
                done.extend((pid, 0) for pid in self.children if pid not in reaped)
                break
            if pid == 0:
                break
            if pid in self.children:
                done.append((pid, wstatus))
        return done

    def _signal_all(self, signum: int) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _stop(self, status: int) -> int:
        """Stop every worker (SIGTERM); one more stop request forces them (a second SIGTERM,
        which a worker takes as its second signal), another or the deadline kills them."""
        self._signal_all(signal.SIGTERM)
        # The stop request being served now is the first; any beyond it (a quick double Ctrl-C
        # may already have counted two) forces. A supervisor giving up on its own had none.
        base = 0 if self.giving_up else 1
        forced = killed = False
        deadline = time.monotonic() + self.config.graceful_timeout + _FORCE_EXTRA_SECONDS
        while self.children:
            for pid, code in self._reap():
                self.children.pop(pid, None)
                if not (os.WIFEXITED(code) and os.WEXITSTATUS(code) == 0) and not killed:
                    say(f"cyserve: worker process {pid} {_describe(code)}", sys.stderr)
                    status = status or 1
            if not self.children:
                break
            extra = self.waiter.pending() - base
            if extra >= 1 and not forced:
                forced = True
                say("cyserve: forcing shutdown")
                self._signal_all(signal.SIGTERM)
            elif not killed and (extra >= 2 or time.monotonic() > deadline):
                say("cyserve: worker processes still running; killing them", sys.stderr)
                killed = True
                status = 1
                self._signal_all(signal.SIGKILL)
            time.sleep(_POLL_SECONDS)
        return status


def _worker_main(app: App, config: Config, previous: dict[int, Any], supervisor: int) -> int:
    # Own process group: a terminal's Ctrl-C goes to the supervisor's group only.
    os.setpgid(0, 0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: a dead supervisor leaves workers running
        pass
    # The supervisor died before prctl took effect. (Compared with its pid, not with 1: in a
    # container the supervisor often is pid 1.)
    if os.getppid() != supervisor:
        return 1
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    try:
        serve_process(app, config.replace(processes=1, shared_port=True))
    except ListenError as exc:
        say(f"cyserve: {exc}", sys.stderr)
        return 1
    return 0


def _describe(wstatus: int) -> str:
    if os.WIFSIGNALED(wstatus):
        sig = os.WTERMSIG(wstatus)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"was killed by {name}"
    return f"exited with status {os.WEXITSTATUS(wstatus)}"

