"""What a serving process and the process supervisor share: counting stop requests (SIGINT,
SIGTERM, SIGHUP, a stop_event) and the lines they print.

Both stop on the same signals and word their status lines and errors the same way; neither
imports the other for it (cyserve.serving runs one server, cyserve.supervisor forks several).
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from .errors import CyserveError, ListenError

if TYPE_CHECKING:
    from ._core import Server

__all__ = ["Waiter", "say", "format_address", "listen_error", "configure_logging", "log",
           "POLL_SECONDS", "PidFile"]

log = logging.getLogger("cyserve")

# How often the loops that do poll (a supervisor's, a stop under way, a worker's --max-requests
# tick) wake up. A signal interrupts their sleep at once and its handler runs; PEP 475 then
# resumes the sleep for what is left of it, so this bounds how long a recorded signal waits to
# be acted on there. Waiter.wait_for_request does not poll: see _Wakeups.
POLL_SECONDS = 0.05

# How long _EventWatch, the thread that watches a stop_event not built as threading.Event is,
# waits on it at a time: only how long it outlives the wait it serves when the event is never
# set. (A threading.Event is hooked instead: _EventHook.)
_EVENT_WATCH_SECONDS = 1.0

# What opening the wait's descriptors fails with at the process's (or the system's) limit.
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


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


class Waiter:
    """Counts stop requests: signals (in the main thread) and a stop_event (anywhere)."""

    def __init__(self, stop_event: threading.Event | None,
                 on_usr1: Callable[[], None] | None = None,
                 on_hup: Callable[[], None] | None = None) -> None:
        self.requests = 0
        self.first_signal: int | None = None
        self.stop_event = stop_event
        self.on_usr1 = on_usr1
        # With on_hup (a TLS server: reload its certificates), SIGHUP is counted here and
        # on_hup runs from the waiting loop (run_hups), not from the signal handler.
        self.on_hup = on_hup
        self.hups = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        # SIGHUP too: process managers send it to reload (gunicorn's meaning). cyserve cannot
        # reload, and SIGHUP's default action would end the process at once, cutting requests in
        # flight; a graceful stop loses nothing (shutdown_line says why it stopped).
        # A TLS server reloads its certificates on SIGHUP instead (on_hup).
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            handler = self._on_hup if signum == signal.SIGHUP and self.on_hup else self._on_signal
            self._previous[signum] = signal.signal(signum, handler)
        # SIGUSR1 reopens the access log file (logrotate), and is ignored when there is none:
        # its default action would end the process.
        self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_usr1)

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

    def _on_hup(self, signum: int, frame: FrameType | None) -> None:
        self.hups += 1

    def run_hups(self) -> None:
        """Act on the SIGHUPs counted since the last call (one on_hup for any number)."""
        if self.hups and self.on_hup is not None:
            self.hups = 0
            self.on_hup()

    def _on_usr1(self, signum: int, frame: FrameType | None) -> None:
        if self.on_usr1 is not None:
            self.on_usr1()

    def shutdown_line(self) -> str:
        """What to print when the stop begins."""
        if self.first_signal == signal.SIGHUP:
            return ("cyserve: SIGHUP: reloading needs a process supervisor (--processes 2 or "
                    "more, or --max-requests); shutting down gracefully (start the server again "
                    "to load new code)")
        return "cyserve: shutting down"

    def pending(self) -> int:
        if self.stop_event is not None and self.stop_event.is_set():
            return max(self.requests, 1)
        return self.requests

    def wait_for_request(self, srv: Server,
                         tick: Callable[[Server], None] | None = None) -> None:
        """Return when a stop was requested or the server stopped on its own, acting on
        SIGHUPs meanwhile. Blocks in poll() (the GIL released) until one of those happens
        (_Wakeups); with ``tick``, also every POLL_SECONDS, to call it with the server."""
        wakeups = _Wakeups(self, srv)
        try:
            wakeups.open()  # closes what it opened when it fails
        except OSError as exc:
            if exc.errno not in _OUT_OF_DESCRIPTORS:
                raise
            # The wait's descriptors are opened once the server runs, and a server flooded
            # with connections from its first moment can be at the process's limit by then.
            # Failing here would stop it; waking on a clock instead, as the wait did before
            # it had descriptors, only costs a wake-up every POLL_SECONDS.
            while srv.running and self.pending() == 0:
                self.run_hups()
                if tick is not None:
                    tick(srv)
                time.sleep(POLL_SECONDS)
            return
        try:
            while srv.running and self.pending() == 0:
                self.run_hups()  # counted before the wait began, or during the last one
                if tick is not None:
                    tick(srv)
                wakeups.wait(POLL_SECONDS if tick is not None else None)
        finally:
            wakeups.close()


class _Wakeups:
    """What wakes a thread waiting for a stop request, as descriptors for one poll(): the
    server's stopped_fd (written by the engine once its workers have stopped, whoever stopped
    them), the interpreter's signal wake-up descriptor, and an eventfd for a stop_event.

    A signal handler runs only on the main thread, between bytecodes, so a main thread blocked
    in a C call sees a signal only if the call returns: the C-level handler writes the signal's
    number to the wake-up descriptor (signal.set_wakeup_fd), poll() returns, and the handler
    runs (Waiter._on_signal, _on_hup) before the loop looks at what it counted. That holds
    whichever thread the kernel delivered the signal to. The descriptor is the interpreter's only
    one: a previous one (an application's asyncio loop made on the main thread sets it) is put
    back when the wait ends, and the bytes read meanwhile are written on to it, so that the loop
    still learns of the signals it handles. Set only where the Waiter owns the process's signals
    (install() ran on the main thread): the process supervisor polls, and a worker it forks
    inherits nothing of this.

    A threading.Event has no descriptor, and its set() tells only the threads waiting on it, so
    the eventfd is written by a waiter of our own in the event's list (_EventHook), which set()
    wakes as it wakes them: no thread waits for it, and nothing outlives the wait. While no
    signal comes, no stop_event is set and the server runs, the waiting thread does not wake:
    an idle or busy server costs its main thread nothing (docs/benchmarks.md, "Session 20: the
    server's clocked threads")."""

    def __init__(self, waiter: Waiter, srv: Server) -> None:
        self._waiter = waiter
        self._srv = srv
        self._poll = select.poll()
        self._signal_r = self._signal_w = self._event_fd = -1
        self._previous_wakeup = -1
        self._hook: _EventHook | _EventWatch | None = None  # what watches the stop_event

    def open(self) -> None:
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        self._poll.register(self._srv.stopped_fd, select.POLLIN)
        if self._waiter.owns_process():
            self._signal_r, self._signal_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._poll.register(self._signal_r, select.POLLIN)
            # warn_on_full_buffer: a burst of signals that fills the pipe loses only bytes,
            # not signals (their handlers run all the same), and is not worth a warning.
            self._previous_wakeup = signal.set_wakeup_fd(self._signal_w,
                                                         warn_on_full_buffer=False)
        event = self._waiter.stop_event
        if event is not None:
            self._event_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._poll.register(self._event_fd, select.POLLIN)
            self._watch_event(event)

    def _watch_event(self, event: threading.Event) -> None:
        if isinstance(self._hook, _EventWatch):
            self._hook.join()  # it wrote the eventfd: it ends at once
        if _EventHook.fits(event):
            self._hook = _EventHook(self._event_fd, event)
        else:
            self._hook = _EventWatch(self._event_fd, event)

    def wait(self, timeout: float | None) -> None:
        """Until something happened (or ``timeout`` seconds, None: no limit); what it was is
        for the caller to look at."""
        ready = self._poll.poll(None if timeout is None else timeout * 1000.0)
        for fd, _ in ready:
            if fd == self._signal_r:
                self._pass_on(fd)
            elif fd == self._event_fd and self._waiter.stop_event is not None:
                # The event's set() wrote it once, and its hook is spent. Unreadable again, and
                # watched again: an event set and cleared before the caller looked is no stop
                # (pending()), and the next set() must wake this wait too. (One set for good
                # ends the wait, and the new hook with it.)
                os.eventfd_read(fd)
                self._watch_event(self._waiter.stop_event)

    def _pass_on(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 512)
            except BlockingIOError:
                return
            if not data:
                return
            if self._previous_wakeup >= 0:
                try:
                    os.write(self._previous_wakeup, data)
                except OSError:  # full or gone: what the interpreter itself does is drop it
                    pass

    def close(self) -> None:
        # The hook leaves the event's waiters before the eventfd closes: from then on no set()
        # writes it. One that set() called already wrote it, and that write is read back
        # before the close: it is then ordered before the close for ThreadSanitizer (make
        # test-ft-tsan) too, through the eventfd (a read acquires what a write released),
        # where the event's lock's order is invisible to it (the interpreter is not
        # instrumented).
        if isinstance(self._hook, _EventHook):
            if self._hook.withdraw():
                try:
                    os.eventfd_read(self._event_fd)
                except BlockingIOError:  # read already, by the wait
                    pass
        elif self._hook is not None:
            self._hook.stop()
            event = self._waiter.stop_event
            if event is not None and event.is_set():
                self._hook.join()
        self._hook = None
        if self._event_fd >= 0:
            os.close(self._event_fd)
            self._event_fd = -1
        if self._signal_w >= 0:
            # Put the previous descriptor back, unless someone replaced ours meanwhile.
            current = signal.set_wakeup_fd(self._previous_wakeup)
            if current != self._signal_w:
                signal.set_wakeup_fd(current)
            # Bytes of signals that came after the last poll returned (as the server stopped,
            # say): theirs too, or the previous descriptor's reader (an asyncio loop's handler
            # for SIGCHLD) would never learn of them.
            self._pass_on(self._signal_r)
            os.close(self._signal_r)
            os.close(self._signal_w)
            self._signal_r = self._signal_w = -1


class _EventHook:
    """Writes _Wakeups's eventfd when a stop_event is set, with no thread: it waits in the
    event's own list of waiters (its Condition's), as a thread in event.wait() does, and the
    event's set(), which wakes each waiter there by calling its release() under the event's
    lock, calls this one's, which writes the eventfd once. withdraw() takes it out of the list
    under the same lock, so that once it returns no set() can write any more; a thread of our
    own waiting on the event could not be woken but by a set(), and outlived the wait when
    none came (it waited a second at a time for that).

    This stands in the list where only threading's own lock objects stand: it relies on
    threading.Event keeping a Condition in _cond and its flag in _flag, and on Condition
    keeping its waiters in a deque, _waiters, whose notify() calls release() on each (a
    RuntimeError from it meaning "released already"), as CPython's threading.py does (tried on
    3.10 to 3.13, and 3.14t without the GIL). fits() checks the event's parts, and once per
    process that a set() does call release() (_set_calls_release); an event or an interpreter
    built otherwise is watched by a thread (_EventWatch). Holds the descriptor's number and
    nothing of the wait or its server."""

    def __init__(self, fd: int, event: threading.Event) -> None:
        self._fd = fd
        self._cond: Any = event._cond  # type: ignore[attr-defined]
        self._fired = False
        with self._cond:
            if event._flag:  # type: ignore[attr-defined]
                self.release()  # set already: as its set() would have done
            else:
                self._cond._waiters.append(self)

    @staticmethod
    def fits(event: threading.Event) -> bool:
        """Whether event is built as _EventHook relies on (threading.Event's own set())."""
        return _has_hookable_parts(event) and _set_calls_release()

    def release(self) -> None:
        """Called by the event's set(), on the thread that set it, the event's lock held."""
        if self._fired:
            raise RuntimeError("release unlocked lock")  # as a lock released twice says
        self._fired = True
        # The descriptor is open: withdraw(), which _Wakeups calls before it closes it, takes
        # the same lock. A full counter (2**64 - 2 writes) cannot happen: one write at most.
        os.eventfd_write(self._fd, 1)

    def withdraw(self) -> bool:
        """Out of the event's waiters: no set() calls release() from here on. Returns whether
        one did (the eventfd was written)."""
        with self._cond:
            try:
                self._cond._waiters.remove(self)
            except ValueError:  # set() took it out when it called release()
                pass
            return self._fired


def _has_hookable_parts(event: threading.Event) -> bool:
    cond = getattr(event, "_cond", None)
    return (isinstance(event, threading.Event) and type(event).set is threading.Event.set
            and isinstance(cond, threading.Condition)
            and isinstance(getattr(cond, "_waiters", None), collections.deque)
            and isinstance(getattr(event, "_flag", None), bool))


@functools.cache
def _set_calls_release() -> bool:
    """Whether threading.Event.set() wakes what stands in its Condition's list of waiters by
    calling its release() (what _EventHook relies on), tried once on an event of our own."""
    class Probe:
        called = False

        def release(self) -> None:
            Probe.called = True

    event = threading.Event()
    if not _has_hookable_parts(event):
        return False
    cond: Any = event._cond  # type: ignore[attr-defined]
    with cond:
        cond._waiters.append(Probe())
    event.set()
    return Probe.called


class _EventWatch:
    """A thread that waits on a stop_event for _Wakeups and writes its eventfd once the event is
    set, then ends: for an event that _EventHook cannot hook (not built as threading.Event is).
    It holds the descriptor's number and nothing of the wait, so that when it outlives the wait
    (up to _EVENT_WATCH_SECONDS, an event never set) it keeps no server alive, nor the server's
    descriptors: a program that starts many servers one after another does not pile them up.
    The eventfd is _Wakeups's to close, after stop()."""

    def __init__(self, fd: int, event: threading.Event) -> None:
        self._fd = fd
        self._lock = threading.Lock()  # orders the thread's write against stop()
        self._thread = threading.Thread(target=self._run, args=(event,),
                                        name="cyserve-stop-event", daemon=True)
        self._thread.start()

    def _run(self, event: threading.Event) -> None:
        while True:
            # Event.wait says True when woken by a set(), even if a clear() came since: the
            # wait's loop looks at the event itself (Waiter.pending) and watches again.
            is_set = event.wait(_EVENT_WATCH_SECONDS)
            with self._lock:
                if self._fd < 0:
                    return
                if is_set:
                    os.eventfd_write(self._fd, 1)
                    return

    def stop(self) -> None:
        """From here on the thread writes nothing (the descriptor may then be closed)."""
        with self._lock:
            self._fd = -1

    def join(self) -> None:
        self._thread.join()


# For these the C library's text is the whole story ("address already in use"); for anything
# else (an unknown host name, say) the engine's own sentence says more than strerror would.
_PLAIN_ERRNOS = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL, errno.EPERM})


def listen_error(host: str, port: int, exc: OSError) -> ListenError:
    """The ListenError for a bind or listen on host:port that failed with ``exc``."""
    if exc.errno in _PLAIN_ERRNOS or (exc.errno and not exc.strerror):
        reason = os.strerror(exc.errno)
        reason = reason[:1].lower() + reason[1:]
    else:
        reason = exc.strerror or str(exc)
    err = ListenError(f"cannot listen on {format_address(host, port)}: {reason}")
    err.errno = exc.errno
    return err


# The --log-config file this process has applied (a forked worker inherits it applied).
_applied_log_config: str | None = None


def configure_logging(level: str, log_config: str | None = None) -> None:
    """Set up the "cyserve" logger (tracebacks of failing handlers, the engine's warnings).

    With ``log_config`` (--log-config), the file configures logging, uvicorn's way: a
    dictConfig in JSON or YAML, else an INI file for fileConfig, loggers it does not name left
    as they are; its levels win over ``level``. A file logging cannot use is a ConfigError.
    Without one, the logger gets a handler only if the application configured none, so that
    users' logging setups win; its lines carry the process's pid, since several worker
    processes write to one standard error."""
    global _applied_log_config
    if log_config is not None:
        if _applied_log_config != log_config:
            _load_log_config(log_config)
            _applied_log_config = log_config
        return
    log.setLevel(level.upper())
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(
            "cyserve: %(levelname)s: [%(process)d] %(message)s"))
        log.addHandler(handler)


def _dict_config(cfg: Any) -> None:
    import logging.config

    if isinstance(cfg, dict):
        # As uvicorn's own configuration says: loggers made before (cyserve's, the app's) keep
        # working unless the file asks otherwise.
        cfg.setdefault("disable_existing_loggers", False)
    logging.config.dictConfig(cfg)


def _load_log_config(path: str) -> None:
    import logging.config

    try:
        if path.endswith(".json"):
            import json

            with open(path) as f:
                _dict_config(json.load(f))
        elif path.endswith((".yaml", ".yml")):
            import yaml  # type: ignore[import-untyped,unused-ignore]

            with open(path) as f:
                _dict_config(yaml.safe_load(f))
        else:
            logging.config.fileConfig(path, disable_existing_loggers=False)
    except Exception as exc:  # json, yaml, configparser and logging's own errors alike
        from .errors import ConfigError

        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError("log_config", path, f"logging cannot use it: {reason}") from None


class PidFile:
    """--pid FILE: the pid of the process the user started (the supervisor, or the one serving
    process), for init scripts and `kill -HUP $(cat FILE)`.

    Written whole or not at all (a temporary file renamed over it), refused while the pid
    already in it is a live process (a second server started by mistake would otherwise take
    over the file of the first), and removed at exit only while it still holds this process's
    pid: a later server may have taken it over."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pid = os.getpid()

    def write(self) -> None:
        other = self._live_pid()
        if other is not None:
            raise CyserveError(f"--pid {self.path}: process {other} written in it is still "
                               "running (another server?); stop it, or remove the file")
        tmp = f"{self.path}.{self.pid}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(f"{self.pid}\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise CyserveError(f"--pid {self.path}: cannot write the pid file: "
                               f"{exc.strerror or exc}") from None

    def remove(self) -> None:
        try:
            with open(self.path) as f:
                mine = f.read().strip() == str(self.pid)
            if mine:
                os.unlink(self.path)
        except OSError:
            pass

    def _live_pid(self) -> int | None:
        try:
            with open(self.path) as f:
                pid = int(f.read().strip() or "0")
        except (OSError, ValueError):
            return None  # no file, or not a pid: nothing to protect
        if pid <= 0 or pid == self.pid:
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None  # stale: its server ended without removing it (SIGKILL, a crash)
        except PermissionError:
            return pid  # alive, another user's
        return pid
