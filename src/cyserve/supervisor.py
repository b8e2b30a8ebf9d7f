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
   kernel for SIGTERM if the supervisor dies (PR_SET_PDEATHSIG), so none is orphaned; and since
   that SIGTERM's handler needs the GIL, which a C call may hold for good, the engine watches
   the supervisor too (Server(parent_pid=...), csrc/server.c) and ends the process itself.
3. A worker that exits while the server is running is replaced. One that exits within
   _QUICK_EXIT_SECONDS of its start counts as a failure to start; after _MAX_QUICK_EXITS in a
   row the supervisor stops everything and exits with status 1 rather than fork forever.
4. The first SIGINT or SIGTERM is passed on as SIGTERM: every worker stops gracefully
   (its own graceful_timeout). A second is passed on again, which a worker takes as "force" (see
   serving.py). A third, or workers still alive graceful_timeout + _FORCE_EXTRA_SECONDS after the
   first, get SIGKILL.
5. Handovers, where a worker is replaced with nothing refused: the new worker is started first,
   and the old one is told to stop (SIGTERM: it finishes what is in flight, as any graceful
   stop) only once the new one serves, which it says on a pipe of its own ("R"). While both
   run they share the addresses: TCP listeners join one SO_REUSEPORT group, and a Unix socket or
   an inherited descriptor is one socket made here, which every worker accepts from, so what
   waits in its queue is served by whoever accepts next. This is why --max-requests runs under
   a supervisor even with one process.
   - --max-requests N (+ a random 0..--max-requests-jitter per worker): a worker past its count
     says so on its pipe ("M") and keeps serving until its replacement does. --max-lifetime S
     (+ a random 0..--max-lifetime-jitter seconds) is the same for a worker serving for S
     seconds ("L"): a leak that grows with time rather than with requests is bounded too.
   - SIGHUP: a reload, as gunicorn's. The application is imported again here first (when the
     command line gave it as module:attribute: the modules under its folder are forgotten and
     imported anew), so an application that no longer imports or builds is reported and the old
     workers keep serving; then as many new workers start, and once they all serve, the old
     ones stop. A new worker that exits before it serves aborts the reload the same way.
   - --reload (development): a .py file under the watched folders that changes is a SIGHUP
     (reloader.py says which changed; the main loop asks it, no thread of its own), whose
     lines name the file instead of a signal that was never sent.
   - SIGTTIN and SIGTTOU, as gunicorn's: one worker more, or one fewer (never fewer than one).
     The supervisor keeps the count it was told (replacements, reloads and recycling keep it);
     the worker that goes is the newest, stopped gracefully like any retired one.
6. Metrics and heartbeats (--metrics-bind, --worker-timeout). The supervisor makes the shared
   region the workers' engines count into (csrc/metrics.c) before it forks them, gives each
   worker a slot, and answers the scrapes from a C thread of its own, summing every slot; when
   it reaps a worker, the worker's counters join the totals (metrics_retire), so that no counter
   goes down when a worker is replaced. Each worker's engine also publishes its scheduler's
   heartbeat in its slot (a thread of the engine, every 100 ms: how long the longest call has
   run). With --worker-timeout S, a worker whose heartbeat says a call has run over S seconds,
   or whose heartbeat stopped for S seconds, is sent SIGABRT (faulthandler prints every
   thread's Python stack: the handler that was running) and SIGKILL shortly after, and a new
   worker is started at once, as gunicorn's --timeout does.
"""

from __future__ import annotations

import ctypes
import errno
import faulthandler
import math
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from .app import App
from .config import MAX_PROCESSES, Config
import random
import traceback
from collections.abc import Callable

from .errors import ConfigError, CyserveError
from .listeners import Listeners
from .hooks import HookError, HookServer, HookWorker, call_hook
from .owner import drop_privileges
from .reloader import Watcher
from .serving import MetricsEndpoint, drain_line, serve_process
from .signals import Waiter, configure_logging, format_address, listen_error, say

__all__ = ["serve_processes"]

_POLL_SECONDS = 0.05
_QUICK_EXIT_SECONDS = 1.0
_MAX_QUICK_EXITS = 5
_FORCE_EXTRA_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
# Blocked across fork until the new worker's handlers are in place (_spawn): the stop signals,
# and SIGUSR1, which the supervisor passes on to its workers (they reopen the access log file).
_FORK_BLOCKED = _STOP_SIGNALS | {signal.SIGUSR1}
# One worker more, one fewer (gunicorn's signals). The supervisor's own handlers; a worker
# puts the default actions back.
_SCALE_SIGNALS = (signal.SIGTTIN, signal.SIGTTOU)
# After SIGABRT (--worker-timeout), how long a worker gets to print its stacks before SIGKILL.
_ABORT_GRACE_SECONDS = 2.0


# Without the GIL, the signal a worker sends each of its threads at a --worker-timeout SIGABRT
# so that faulthandler prints that thread's own stack (a realtime signal: applications leave
# them alone).
_STACK_SIGNAL = signal.SIGRTMIN + 3
_STACK_WAIT_SECONDS = 0.02  # for one thread's dump to be written before the next one's header


def _dump_stacks_and_abort(signum: int, frame: Any) -> None:
    """A worker's SIGABRT (--worker-timeout) on an interpreter running without the GIL, where
    faulthandler cannot show every thread from one signal handler ("Cannot show all threads
    while the GIL is disabled"), only the thread it runs on. So each thread is sent
    _STACK_SIGNAL, whose faulthandler handler prints that thread's own stack from its signal
    handler, even one stuck in C code; then the abort. This runs on the main thread, between
    two of its bytecodes: with no GIL, a stuck handler on a worker thread does not hold it back
    (a stuck main thread is what the SIGKILL after _ABORT_GRACE_SECONDS is for)."""
    err = sys.stderr
    try:
        err.write("Fatal Python error: Aborted (--worker-timeout)\n\n")
        me = threading.get_ident()
        for thread in threading.enumerate():
            if thread.ident is None or thread.ident == me:
                continue
            err.write(f"Thread {thread.ident:#x} ({thread.name}):\n")
            err.flush()
            try:
                signal.pthread_kill(thread.ident, _STACK_SIGNAL)
            except OSError:  # it ended meanwhile
                continue
            time.sleep(_STACK_WAIT_SECONDS)
        err.flush()
    finally:
        signal.signal(signal.SIGABRT, signal.SIG_DFL)
        os.abort()


def serve_processes(app: App, config: Config, loader: Callable[[], App] | None = None, *,
                    server: HookServer | None = None) -> int:
    """Supervise config.processes worker processes serving ``app``; return the exit status
    (0 after a requested stop). Raises ListenError/RouteError/CyserveError before forking.
    ``loader`` imports the application again, for a reload (SIGHUP); without it a reload
    starts new workers with the same application. ``server``: what the hooks are given as
    theirs (cyserve.hooks)."""
    if threading.current_thread() is not threading.main_thread():
        raise CyserveError("processes > 1 needs the main thread (it supervises by signals)")
    configure_logging(config.log_level, config.log_config)
    for name, value in (("reload", config.reload), ("preload", not config.preload)):
        if value and loader is None:
            raise ConfigError(name, config.reload if name == "reload" else config.preload,
                              "needs the application given as MODULE:APP (the command "
                              "line), which can be imported again")
    app.build()  # a bad route is reported here, once
    if config.drops_privileges:
        # The engine is loaded here, as root: the user the workers become may not be able to
        # read it, or the standard library it imports (an interpreter installed under /root).
        import encodings.idna  # noqa: F401  (the engine encodes host names with it)

        from . import _core  # noqa: F401
    if config.ssl_certfile:
        from ._core import check_tls

        check_tls(**config.tls_kwargs())  # and a certificate or key OpenSSL cannot use
    listeners = Listeners.for_config(config)
    for a in listeners.tcp:
        try:
            _probe_bind(a.host, a.port)
        except OSError as exc:
            raise listen_error(a.host, a.port, exc) from exc
    # Unix sockets and inherited descriptors: one socket for every worker process, made (or
    # checked) here once, so that a worker that is replaced leaves what waits in its queue to
    # the others and to its successor.
    listeners.open()
    scrape: MetricsEndpoint | None = None
    region: Any = None
    try:
        # Room for every worker, those of a handover beside those they replace, and a few
        # reaped late.
        nprocs = 2 * config.processes + 2
        if config.metrics_bind is not None:
            scrape = MetricsEndpoint(config, nprocs)
            region = scrape.metrics
        elif config.worker_timeout:
            from ._core import Metrics

            region = Metrics(nprocs, config.metrics_shards)  # for the heartbeats alone
        sup = _Supervisor(app, config, listeners, loader, region, scrape,
                          server if server is not None else HookServer(config))
        sup.install()
        try:
            if listeners.default:
                where = f"{config.scheme}://{format_address(config.host, config.port)}"
            else:
                where = ", ".join(a.url() for a in listeners.addresses)
            say(f"cyserve: supervising {config.processes} "
                f"process{'es' if config.processes != 1 else ''} on {where} "
                f"(pid {os.getpid()})")
            return sup.run()
        finally:
            sup.uninstall()
    finally:
        if scrape is not None:
            scrape.close()
        listeners.close()


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
    def __init__(self, app: App, config: Config, listeners: Listeners,
                 loader: Callable[[], App] | None = None, region: Any = None,
                 scrape: MetricsEndpoint | None = None,
                 server: HookServer | None = None) -> None:
        self.app = app
        # The hooks' server (cyserve.hooks); when_ready is called once the first workers serve.
        self.server = server if server is not None else HookServer(config)
        self.when_ready_due = config.when_ready is not None
        self.spawned = 0  # workers started so far: the next one's age is one more
        # Metrics and heartbeats (point 6 above): the shared region, each worker's slot in it.
        self.region = region
        self.scrape = scrape
        self.slots: dict[int, int] = {}
        self.no_slot_said = False
        self.timed_out: dict[int, float] = {}  # pid -> when SIGABRT was sent
        self.config = config
        self.listeners = listeners
        self.loader = loader
        self.children: dict[int, float] = {}  # pid -> start time
        self.waiter = Waiter(None)  # counts SIGINT/SIGTERM, like a single server's loop
        self.giving_up = False
        self.quick_exits = 0
        # Handovers (point 5 above).
        self.pipes: dict[int, int] = {}  # pid -> the read end of the worker's pipe
        self.ready: set[int] = set()  # workers that serve
        self.retiring: set[int] = set()  # told to stop by a handover: their exit is expected
        self.spent: set[int] = set()  # past --max-requests, waiting for a replacement
        self.replacing: dict[int, int] = {}  # new pid -> the spent pid it replaces
        self.reload_new: set[int] = set()  # a reload's new workers, until they all serve
        self.reload_old: set[int] = set()  # the workers they replace
        self.hups = 0
        # What asked for a reload, named by its lines: "SIGHUP", or "--reload: FILE changed" (no
        # signal was sent then). The last asked (hup_cause) is the next reload's; reload_cause
        # is the one under way's, that a SIGHUP meanwhile must not rename.
        self.hup_cause = self.reload_cause = "SIGHUP"
        self.spent_why: dict[int, str] = {}  # what made a spent worker spent, for its line
        # How many workers to keep: --processes, then SIGTTIN and SIGTTOU (scaled by the main
        # loop; the handlers only count).
        self.target = config.processes
        self.scale = 0
        self.scale_previous: dict[int, Any] = {}
        self.watcher: Watcher | None = None
        if config.reload:
            self.watcher = Watcher(config.reload_dirs or ["."], config.reload_includes,
                                   config.reload_excludes, config.reload_delay)
            files = ", ".join(("*.py",) + config.reload_includes)
            less = f" less {', '.join(config.reload_excludes)}" if config.reload_excludes \
                else ""
            say(f"cyserve: --reload: watching the files {files}{less} under "
                f"{', '.join(self.watcher.dirs)} ({self.watcher.uses})")

    def install(self) -> None:
        self.waiter.install()
        if self.waiter.owns_process():
            # SIGHUP reloads here, instead of stopping as it does a single server.
            signal.signal(signal.SIGHUP, self._on_hup)
            # SIGUSR1 (logrotate) is for the workers, which write the access log.
            signal.signal(signal.SIGUSR1, lambda signum, frame: self._signal_all(signum))
            for signum in _SCALE_SIGNALS:
                self.scale_previous[signum] = signal.signal(signum, self._on_scale)

    def uninstall(self) -> None:
        self.waiter.uninstall()  # puts SIGHUP's own previous handler back too
        for signum, previous in self.scale_previous.items():
            signal.signal(signum, previous)
        self.scale_previous.clear()

    def _on_scale(self, signum: int, frame: Any) -> None:
        self.scale += 1 if signum == signal.SIGTTIN else -1

    def _on_hup(self, signum: int, frame: Any) -> None:
        self.hups += 1  # acted on by the main loop, as a stop request is
        self.hup_cause = "SIGHUP"

    def run(self) -> int:
        for _ in range(self.target):
            self._spawn()
        status = 0
        while not self.giving_up and self.waiter.pending() == 0:
            time.sleep(_POLL_SECONDS)
            self._read_pipes()
            if self.when_ready_due and len(self.ready) >= self.target:
                self.when_ready_due = False
                self.server.worker_pids = sorted(self.children)
                call_hook(self.config, "when_ready", self.server)
            if self.watcher is not None:
                changed = self.watcher.changed()
                if changed:
                    more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
                    # Said by _begin_reload, with what became of it.
                    self.hup_cause = f"--reload: {changed[0]}{more} changed"
                    self.hups += 1
            if self.hups and not self.reload_new:
                # One reload at a time: a SIGHUP during a reload (the code changed again) is
                # acted on once it is over, and several collapse into one.
                self.hups = 0
                self.reload_cause = self.hup_cause
                self._begin_reload()
            self._hand_over()
            self._rescale()
            self._watch()
            for pid, code in self._reap():
                started = self.children.pop(pid)
                was_old = pid in self.reload_old
                self._forget(pid)
                if self.timed_out.pop(pid, None) is not None:
                    say(f"cyserve: worker process {pid} {_describe(code)} (--worker-timeout); "
                        "its replacement serves", sys.stderr)
                    continue
                if pid in self.retiring:
                    self.retiring.discard(pid)
                    if not (os.WIFEXITED(code) and os.WEXITSTATUS(code) == 0):
                        say(f"cyserve: worker process {pid} {_describe(code)} while stopping",
                            sys.stderr)
                    continue
                if self.giving_up or self.waiter.pending():
                    continue  # stopping anyway: _stop() accounts for the others
                if pid in self.reload_new:
                    self._abort_reload(f"new worker process {pid} {_describe(code)} before "
                                       "it served")
                    continue
                quick = time.monotonic() - started < _QUICK_EXIT_SECONDS
                self.quick_exits = self.quick_exits + 1 if quick else 0
                if self.quick_exits >= _MAX_QUICK_EXITS:
                    say(f"cyserve: {self.quick_exits} worker processes in a row exited at "
                        "start; stopping", sys.stderr)
                    status = 1
                    self.giving_up = True
                    continue
                if pid in self.replacing:  # a replacement that failed: _hand_over tries again
                    del self.replacing[pid]
                    say(f"cyserve: new worker process {pid} {_describe(code)} before it "
                        "served", sys.stderr)
                    continue
                taking_over = [new for new, old in self.replacing.items() if old == pid]
                for new in taking_over:
                    del self.replacing[new]  # it takes the place of the one that died
                if taking_over or was_old:
                    say(f"cyserve: worker process {pid} {_describe(code)}; the new one "
                        "takes its place", sys.stderr)
                    continue
                say(f"cyserve: worker process {pid} {_describe(code)}; starting a new one",
                    sys.stderr)
                self._spawn()
        if status == 0:
            # Said here once for all the workers, which stop without a word of their own.
            say(self.waiter.shutdown_line())
            if self.config.drain_delay > 0:
                say(drain_line(self.config))
        return self._stop(status)

    def _read_pipes(self) -> None:
        for pid, fd in list(self.pipes.items()):
            try:
                data = os.read(fd, 64)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:  # the worker closed it (it exits): its exit is reaped as any
                os.close(fd)
                del self.pipes[pid]
                continue
            if b"R" in data:
                self.ready.add(pid)
            if pid in self.retiring:
                continue
            if b"M" in data:
                self.spent.add(pid)
                self.spent_why[pid] = "answered its --max-requests"
            elif b"L" in data:
                self.spent.add(pid)
                self.spent_why[pid] = "reached its --max-lifetime"

    def _hand_over(self) -> None:
        """Move every handover on: start a replacement for each spent worker, stop the old
        worker once its replacement serves; finish a reload once all its new workers serve."""
        if self.reload_new:
            if self.reload_new <= self.ready:
                n = len(self.reload_new)
                say(f"cyserve: reload: {n} new worker process{'es' if n != 1 else ''} "
                    f"serve{'' if n != 1 else 's'}; "
                    "stopping the old ones gracefully")
                for pid in self.reload_old:
                    self._retire(pid)
                self.reload_new = set()
                self.reload_old = set()
            return  # spent workers wait for the reload to end
        for new, old in list(self.replacing.items()):
            if new in self.ready:
                del self.replacing[new]
                self._retire(old)
        waiting = set(self.replacing.values())
        for pid in sorted(self.spent - waiting):
            if pid in self.children and pid not in self.retiring:
                why = self.spent_why.get(pid, "answered its --max-requests")
                say(f"cyserve: worker process {pid} {why}; starting its replacement")
                self.replacing[self._spawn()] = pid

    def _rescale(self) -> None:
        """SIGTTIN/SIGTTOU: start a worker more, or retire the newest, never below one."""
        if not self.scale or self.reload_new or self.giving_up or self.waiter.pending():
            return  # a reload under way scales once it is over
        scale, self.scale = self.scale, 0
        target = max(1, min(self.target + scale, MAX_PROCESSES))
        if target == self.target:
            say(f"cyserve: {'SIGTTIN' if scale > 0 else 'SIGTTOU'}: keeping {self.target} "
                f"worker process{'es' if self.target != 1 else ''}")
            return
        if target > self.target:
            for _ in range(target - self.target):
                self._spawn()
        else:
            # The newest workers go; not one that a handover is replacing or starting.
            handing = set(self.replacing) | set(self.replacing.values())
            serving = sorted((p for p in self.children
                              if p not in self.retiring and p not in handing),
                             key=lambda p: self.children[p])
            for pid in serving[max(0, len(serving) - (self.target - target)):]:
                self._retire(pid)
        say(f"cyserve: {'SIGTTIN' if scale > 0 else 'SIGTTOU'}: {target} worker "
            f"process{'es' if target != 1 else ''} (was {self.target})")
        self.target = target

    def _retire(self, pid: int) -> None:
        self.spent.discard(pid)
        if pid in self.children and pid not in self.retiring:
            self.retiring.add(pid)
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _begin_reload(self) -> None:
        if self.config.ssl_certfile:
            # The new workers read the certificate files again: a file that cannot be used now
            # keeps the old workers, with the certificates they have, rather than fail them.
            from ._core import check_tls

            try:
                check_tls(**self.config.tls_kwargs())
            except ValueError as exc:
                say(f"cyserve: {self.reload_cause}: reload failed: {exc}; the old worker "
                    "processes keep serving with the certificates they have", sys.stderr)
                return
        if self.loader is not None:
            try:
                app = self.loader()
                app.build()
            except BaseException as exc:  # noqa: B036 - any failure keeps the old workers
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                traceback.print_exc()
                say(f"cyserve: {self.reload_cause}: reload failed: {type(exc).__name__}: {exc}; "
                    "the old worker processes keep serving", sys.stderr)
                return
            self.app = app
            say(f"cyserve: {self.reload_cause}: reloading: application imported again; starting "
                f"{self.target} new worker process{'es' if self.target != 1 else ''}")
        else:
            say(f"cyserve: {self.reload_cause}: reloading: starting new worker processes (the "
                "application was given as an object: it is not imported again)")
        self.reload_old = {pid for pid in self.children if pid not in self.retiring}
        self.reload_new = {self._spawn() for _ in range(self.target)}
        # Spent workers are replaced by the reload itself.
        for new in list(self.replacing):
            self.replacing.pop(new)
            self.reload_old.add(new)

    def _abort_reload(self, why: str) -> None:
        say(f"cyserve: {self.reload_cause}: reload failed: {why}; the old worker processes keep "
            "serving", sys.stderr)
        for pid in self.reload_new:
            self._retire(pid)
        self.reload_new = set()
        self.reload_old = set()

    def _watch(self) -> None:
        """--worker-timeout: kill and replace a worker whose scheduler made no progress (point 6
        above); SIGKILL one that outlived its SIGABRT."""
        now = time.monotonic()
        for pid, at in self.timed_out.items():
            if now - at > _ABORT_GRACE_SECONDS and pid in self.children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        limit = self.config.worker_timeout
        if not limit or self.region is None:
            return
        now_ns = time.monotonic_ns()  # CLOCK_MONOTONIC, the engine's clock
        for pid, slot in list(self.slots.items()):
            if pid in self.retiring or pid in self.timed_out or pid not in self.ready:
                continue
            beat, stuck = self.region.health(slot)
            if not beat:
                continue  # not serving yet
            silent = (now_ns - beat) / 1e9
            if stuck / 1e9 <= limit and silent <= limit:
                continue
            if stuck / 1e9 > limit:
                route = self.region.route(slot)
                why = f"a call has run for {stuck / 1e9:.1f} s" + (
                    f" (route {route})" if route else "")
            else:
                why = f"its scheduler has not been heard from for {silent:.1f} s"
            say(f"cyserve: worker process {pid} made no progress for over {limit:g} s "
                f"(--worker-timeout): {why}; killing it (SIGABRT: its threads' Python stacks "
                "follow) and starting a new one", sys.stderr)
            self.timed_out[pid] = time.monotonic()
            self.spent.discard(pid)
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
            # The stuck worker still holds its share of the listeners' connections: its
            # replacement starts now, not when it is reaped.
            for new, old in list(self.replacing.items()):
                if old == pid:
                    del self.replacing[new]  # that replacement takes its place
                    break
            else:
                if pid in self.reload_old:
                    self.reload_old.discard(pid)
                elif not (self.giving_up or self.waiter.pending()):
                    self._spawn()

    def _forget(self, pid: int) -> None:
        slot = self.slots.pop(pid, None)
        if slot is not None and self.region is not None:
            self.region.retire(slot)  # its counters join the totals
        fd = self.pipes.pop(pid, None)
        if fd is not None:
            os.close(fd)
        self.ready.discard(pid)
        self.spent.discard(pid)
        self.spent_why.pop(pid, None)
        self.reload_old.discard(pid)

    def _spawn(self) -> int:
        supervisor = os.getpid()
        slot = -1
        if self.region is not None:
            slot = self.region.claim(supervisor)
            if slot < 0 and not self.no_slot_said:
                self.no_slot_said = True
                say("cyserve: more worker processes than metrics slots: the next ones are not "
                    "counted or watched", sys.stderr)
        rfd, wfd = os.pipe2(os.O_CLOEXEC)
        # The stop signals stay blocked in the new worker until its own handlers are in place
        # (serving.py unblocks them): a SIGTERM sent meanwhile (a stop while a replacement
        # starts) would otherwise reach the supervisor's handlers, inherited and deaf in the
        # worker, or the default action, and be lost or end it without a graceful stop.
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _FORK_BLOCKED)
        # No thread of ours may run while forking (one inside malloc would leave the child's
        # allocator locked): the scrape listener's thread stops for the moment of the fork,
        # and scrapes wait in its socket's queue meanwhile.
        if self.scrape is not None:
            self.scrape.metrics.close()
        self.spawned += 1
        pid = os.fork()
        if pid != 0:
            if self.scrape is not None:
                self.scrape.metrics.serve(self.scrape.sock.fileno())
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        if pid == 0:  # the worker: never returns into the supervisor's code
            code = 1
            worker: HookWorker | None = None
            try:
                os.close(rfd)
                for fd in self.pipes.values():  # its siblings' pipes are not its business
                    os.close(fd)
                if self.scrape is not None:  # nor the scrapes
                    self.scrape.sock.close()
                owner = self.config.process_owner()
                if owner is not None:  # --user/--group: before the app is imported or served
                    drop_privileges(owner)
                worker = HookWorker(self.config, self.spawned, supervisor)
                self.server.worker_pids = sorted(self.children)
                call_hook(self.config, "post_fork", self.server, worker, must=True)
                app = self.app
                if not self.config.preload and self.loader is not None:
                    app = self.loader()  # --no-preload: this worker imports it for itself
                code = _worker_main(app, self.config, self.waiter.previous_handlers(),
                                    supervisor, self.listeners, wfd,
                                    (self.region, slot) if slot >= 0 else None)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except HookError as exc:  # post_fork's traceback is printed already
                say(f"cyserve: {exc}", sys.stderr)
            except BaseException:  # noqa: B036 - whatever happens, leave by os._exit
                import traceback
                traceback.print_exc()
            finally:
                if worker is not None:
                    call_hook(self.config, "worker_exit", self.server, worker)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(wfd)
        os.set_blocking(rfd, False)
        if slot >= 0:
            self.slots[pid] = slot
        self.pipes[pid] = rfd
        self.children[pid] = time.monotonic()
        return pid

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
        """Stop every worker (SIGTERM); one more stop request forces them (SIGINT, which a
        worker takes as its second stop signal), another or the deadline kills them."""
        # Not to a worker a handover already told to stop: it is stopping, and past its own
        # handlers (put back before it exits) a second SIGTERM would kill it outright, "killed
        # by SIGTERM", a failed worker where nothing failed.
        for pid in list(self.children):
            if pid not in self.retiring:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        # The stop request being served now is the first; any beyond it (a quick double Ctrl-C
        # may already have counted two) forces. A supervisor giving up on its own had none.
        base = 0 if self.giving_up else 1
        forced = killed = False
        deadline = (time.monotonic() + self.config.drain_delay + self.config.graceful_timeout
                    + _FORCE_EXTRA_SECONDS)
        while self.children:
            for pid, code in self._reap():
                self.children.pop(pid, None)
                slot = self.slots.pop(pid, None)
                if slot is not None and self.region is not None:
                    self.region.retire(slot)
                if self.giving_up and pid not in self.ready:
                    continue  # one more that could not start: the line above says so
                if not (os.WIFEXITED(code) and os.WEXITSTATUS(code) == 0) and not killed:
                    say(f"cyserve: worker process {pid} {_describe(code)}", sys.stderr)
                    status = status or 1
            if not self.children:
                break
            extra = self.waiter.pending() - base
            if extra >= 1 and not forced:
                forced = True
                say("cyserve: forcing shutdown")
                # SIGINT, not a second SIGTERM: a quick double Ctrl-C has both go out at once
                # (above, then here on the loop's first pass), and two SIGTERMs that reach a
                # worker before its handler runs are one to Python, which runs a signal's handler
                # once however often it came: the worker then waited out its grace period. Two
                # different signals each run their handler, and the worker counts both.
                self._signal_all(signal.SIGINT)
            elif not killed and (extra >= 2 or time.monotonic() > deadline):
                say("cyserve: worker processes still running; killing them", sys.stderr)
                killed = True
                status = 1
                self._signal_all(signal.SIGKILL)
            time.sleep(_POLL_SECONDS)
        return status


def _worker_main(app: App, config: Config, previous: dict[int, Any], supervisor: int,
                 listeners: Listeners, pipe: int, metrics: tuple[Any, int] | None = None) -> int:
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
    for signum in _SCALE_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    if config.worker_timeout:
        # SIGABRT from the supervisor (--worker-timeout) prints every thread's Python stack from
        # the signal handler, without the GIL a stuck handler may hold.
        faulthandler.enable(file=sys.stderr, all_threads=True)
        if not getattr(sys, "_is_gil_enabled", lambda: True)():
            # Without the GIL, faulthandler shows only the thread the signal lands on ("Cannot
            # show all threads while the GIL is disabled"), not the stuck handler's: each
            # thread is asked to show its own (_dump_stacks_and_abort).
            faulthandler.register(_STACK_SIGNAL, file=sys.stderr, all_threads=False,
                                  chain=False)
            signal.signal(signal.SIGABRT, _dump_stacks_and_abort)
    try:
        # threads resolved here, where processes still says how many share the CPUs.
        serve_process(app, config.replace(processes=1, threads=config.workers,
                                          shared_port=True, max_requests=0,
                                          max_lifetime=0.0, worker_timeout=0.0,
                                          metrics_bind=None),
                      listeners=listeners, ready=lambda srv: _tell(pipe, b"R"),
                      tick=_recycle_tick(config, pipe), metrics=metrics, parent=supervisor,
                      supervised=True)
    except CyserveError as exc:
        # A listener that cannot be made, an ASGI lifespan startup that failed (its message
        # carries the application's traceback): one sentence, as the single process says it,
        # not this frame's traceback around it.
        say(f"cyserve: {exc}", sys.stderr)
        return 1
    return 0


def _tell(pipe: int, what: bytes) -> None:
    try:
        os.write(pipe, what)
    except OSError:  # the supervisor is gone: PR_SET_PDEATHSIG stops this worker
        pass


def _recycle_tick(config: Config, pipe: int) -> Callable[[Any], None] | None:
    """What a worker checks while it waits for a stop request: whether it has answered its
    --max-requests, or served for its --max-lifetime (each plus its own jitter), then says which
    once on its pipe."""
    if not config.max_requests and not config.max_lifetime:
        return None
    limit = config.max_requests + random.randint(0, config.max_requests_jitter) \
        if config.max_requests else 0
    lifetime = config.max_lifetime + random.uniform(0.0, config.max_lifetime_jitter) \
        if config.max_lifetime else math.inf
    end: float | None = None
    told = False

    def tick(srv: Any) -> None:
        nonlocal told, end
        if told:
            return
        if end is None:  # the first tick comes once the server serves: the lifetime starts
            end = time.monotonic() + lifetime
        if limit and srv.requests >= limit:
            told = True
            _tell(pipe, b"M")
        elif time.monotonic() >= end:
            told = True
            _tell(pipe, b"L")

    return tick


def _describe(wstatus: int) -> str:
    if os.WIFSIGNALED(wstatus):
        sig = os.WTERMSIG(wstatus)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"was killed by {name}"
    return f"exited with status {os.WEXITSTATUS(wstatus)}"

