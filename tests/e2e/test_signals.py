"""The serving thread's wait for a stop (cyserve.signals.Waiter.wait_for_request) with a real
engine: it blocks in poll() and wakes only for what can end or change the wait (a signal, the
server stopping, a stop_event), never on a clock; what it replaces (the interpreter's signal
wake-up descriptor) is put back. The end-to-end stops (SIGTERM, a second Ctrl-C, SIGHUP, a
stop_event) of a whole process are test_shutdown.py's and test_lifecycle.py's.

pytest runs tests on the main thread, where signal handlers can be installed.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from _procfd import fd_targets

from cyserve._core import Server
from cyserve.signals import Waiter, _Wakeups

TIMEOUT = 30.0  # generous: each wake below takes milliseconds


@pytest.fixture
def srv() -> Iterator[Server]:
    server = Server([("path", "/plaintext", None, "static",
                      (200, [("Content-Type", "text/plain")], b"Hello, World!"))],
                    host="127.0.0.1", port=0, threads=1)
    server.start()
    yield server
    server.stop(0.0)


def voluntary_switches() -> int:
    """The main thread's voluntary context switches: how many times it went to sleep."""
    with open(f"/proc/self/task/{threading.main_thread().native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc")


def later(seconds: float, fn: Callable[..., object], *args: object) -> threading.Timer:
    timer = threading.Timer(seconds, fn, args)
    timer.start()
    return timer


def test_a_quiet_wait_does_not_wake_and_a_signal_ends_it(srv: Server) -> None:
    waiter = Waiter(None)
    waiter.install()
    try:
        t0 = time.monotonic()  # before the timer: a pause of this thread cannot shorten took
        timer = later(1.0, os.kill, os.getpid(), signal.SIGTERM)
        before = voluntary_switches()
        waiter.wait_for_request(srv)
        took, switches = time.monotonic() - t0, voluntary_switches() - before
        timer.join()
    finally:
        waiter.uninstall()
    assert waiter.pending() == 1 and waiter.first_signal == signal.SIGTERM
    assert 0.9 < took < TIMEOUT
    # Polling every 50 ms, the wait slept 20 times in that second. Now: the poll, the wake-up,
    # and perhaps a wait for the GIL the timer's thread held.
    assert switches <= 5, switches


def test_a_server_stopped_by_another_thread_ends_the_wait(srv: Server) -> None:
    waiter = Waiter(None)  # not installed: no signals, as on a thread other than the main one
    timer = later(0.3, srv.stop, 0.0)
    t0 = time.monotonic()
    waiter.wait_for_request(srv)
    took = time.monotonic() - t0
    timer.join()
    assert not srv.running and waiter.pending() == 0
    assert took < TIMEOUT


def threads_besides(before: list[threading.Thread]) -> list[threading.Thread]:
    """The threads alive now that were not before."""
    return [t for t in threading.enumerate() if t not in before]


def test_a_stop_event_set_through_a_method_taken_before_the_wait_ends_it(srv: Server) -> None:
    stop = threading.Event()
    before = threading.enumerate()
    t0 = time.monotonic()  # before the timer: a pause of this thread cannot shorten took
    timer = later(0.3, stop.set)  # bound before the wait began: nothing of it can be wrapped
    waiter = Waiter(stop)
    waiter.wait_for_request(srv)
    took = time.monotonic() - t0
    timer.join()
    assert waiter.pending() == 1 and srv.running
    assert 0.25 < took < TIMEOUT
    # Nothing of the wait is left: no thread, and nothing in the event's list of waiters (the
    # wait's hook, _EventHook), which would pile up in an event that outlives many servers.
    assert threads_besides(before) == []
    assert not stop._cond._waiters  # type: ignore[attr-defined]


def test_nothing_watches_the_stop_event_once_the_server_stopped_without_it(
        srv: Server) -> None:
    # The wait ends because the server stopped, the event never set: no thread watches the
    # event from the moment the wait returned. A thread waiting on it (a second at a time, to
    # notice the wait had ended) outlived the wait by up to a second.
    stop = threading.Event()
    before = threading.enumerate()
    waiter = Waiter(stop)
    timer = later(0.2, srv.stop, 0.0)
    waiter.wait_for_request(srv)
    timer.join()
    assert not srv.running and not stop.is_set()
    assert threads_besides(before) == []
    assert not stop._cond._waiters  # type: ignore[attr-defined]
    stop.set()  # what a program does later with its event is its own business


def test_a_stop_event_built_otherwise_is_watched_by_a_thread(srv: Server) -> None:
    # An Event whose set() is its own (a subclass that logs, say) may not wake what waits in
    # its list: a thread waits on it instead (_EventWatch), which ends with the wait once the
    # event is set.
    class Logged(threading.Event):
        def set(self) -> None:
            super().set()

    stop = Logged()
    before = threading.enumerate()
    timer = later(0.3, stop.set)
    waiter = Waiter(stop)
    waiter.wait_for_request(srv)
    timer.join()
    assert waiter.pending() == 1 and srv.running
    assert threads_besides(before) == []


def test_sighup_runs_on_hup_and_the_wait_goes_on(srv: Server) -> None:
    hups: list[float] = []
    waiter = Waiter(None, on_hup=lambda: hups.append(time.monotonic()))
    waiter.install()
    try:
        t0 = time.monotonic()
        first = later(0.2, os.kill, os.getpid(), signal.SIGHUP)
        # Well after it: a loaded machine may wake this thread late for the first.
        second = later(1.5, os.kill, os.getpid(), signal.SIGTERM)
        waiter.wait_for_request(srv)
        first.join()
        second.join()
    finally:
        waiter.uninstall()
    assert len(hups) == 1 and hups[0] - t0 < 1.5  # acted on when it came, not at the end
    assert waiter.pending() == 1 and waiter.first_signal == signal.SIGTERM


def test_the_previous_wakeup_descriptor_is_put_back_and_told_of_the_signals(
        srv: Server) -> None:
    # An application's own wake-up descriptor (asyncio's, for one): the wait borrows the
    # interpreter's only slot, passes the signals' bytes on, and gives the slot back.
    theirs, other_end = socket.socketpair()
    theirs.setblocking(False)
    other_end.setblocking(False)
    previous = signal.set_wakeup_fd(theirs.fileno())
    waiter = Waiter(None)
    waiter.install()
    try:
        timer = later(0.2, os.kill, os.getpid(), signal.SIGINT)
        waiter.wait_for_request(srv)
        timer.join()
    finally:
        waiter.uninstall()
        current = signal.set_wakeup_fd(previous)
    try:
        assert current == theirs.fileno()
        assert other_end.recv(16) == bytes([signal.SIGINT])
    finally:
        theirs.close()
        other_end.close()
    assert waiter.pending() == 1


def test_a_tick_is_called_while_waiting(srv: Server) -> None:
    # Every POLL_SECONDS (0.05). The server stops once three ticks came, not after a fixed half
    # second, which a loaded machine could spend with this thread descheduled.
    ticks: list[Server] = []
    three = threading.Event()

    def tick(server: Server) -> None:
        ticks.append(server)
        if len(ticks) >= 3:
            three.set()

    def stop_after_three() -> None:
        three.wait(TIMEOUT)  # guards a hang only: no ticks fail the assertion below
        srv.stop(0.0)

    stopper = threading.Thread(target=stop_after_three)
    stopper.start()
    waiter = Waiter(None)
    waiter.wait_for_request(srv, tick)
    stopper.join()
    assert len(ticks) >= 3 and all(t is srv for t in ticks)


def test_a_signal_between_the_check_and_the_poll_is_not_lost(
        srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # SIGTERM after the loop found nothing pending and before poll() blocks: its handler runs
    # then, and poll() must still return for it (the wake-up descriptor holds its byte).
    real_wait = _Wakeups.wait
    sent: list[int] = []

    def wait(self: _Wakeups, timeout: float | None) -> None:
        if not sent:
            sent.append(signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        real_wait(self, timeout)

    monkeypatch.setattr(_Wakeups, "wait", wait)
    waiter = Waiter(None)
    waiter.install()
    try:
        stopper = later(TIMEOUT, srv.stop, 0.0)  # only if the wake-up was lost
        waiter.wait_for_request(srv)
        stopper.cancel()
    finally:
        waiter.uninstall()
    assert srv.running and waiter.pending() == 1 and waiter.first_signal == signal.SIGTERM


def test_a_signal_that_comes_as_the_wait_ends_reaches_the_previous_descriptor(
        srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # A signal whose byte lands in the wait's pipe after its last poll() returned (here: as
    # the server stops) is passed on to the application's descriptor all the same.
    real_wait = _Wakeups.wait

    def wait(self: _Wakeups, timeout: float | None) -> None:
        srv.stop(0.0)
        real_wait(self, timeout)  # returns at once: the server has stopped
        os.kill(os.getpid(), signal.SIGUSR2)  # its handler has run when kill() returns

    monkeypatch.setattr(_Wakeups, "wait", wait)
    theirs, other_end = socket.socketpair()
    theirs.setblocking(False)
    other_end.setblocking(False)
    usr2 = signal.signal(signal.SIGUSR2, lambda signum, frame: None)  # the app's own handler
    previous = signal.set_wakeup_fd(theirs.fileno())
    waiter = Waiter(None)
    waiter.install()
    try:
        waiter.wait_for_request(srv)
    finally:
        waiter.uninstall()
        signal.set_wakeup_fd(previous)
        signal.signal(signal.SIGUSR2, usr2)
    try:
        assert other_end.recv(16) == bytes([signal.SIGUSR2])
    except BlockingIOError:
        pytest.fail("the SIGUSR2 that came as the wait ended never reached the app's descriptor")
    finally:
        theirs.close()
        other_end.close()
    assert not srv.running and waiter.pending() == 0


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


# What a server and a wait open: sockets, pipes and anonymous inodes (eventfd, epoll, timerfd).
_ENGINE_KINDS = ("socket:", "pipe:", "anon_inode:")


def engine_descriptors() -> Counter[str]:
    """The descriptors of the kinds a server and a wait open, by kind. Files (pytest's capture,
    a module an import reads) are not counted: another thread of the test process may open one
    at any moment."""
    kinds: Counter[str] = Counter()
    for target in fd_targets().values():
        kinds.update(k for k in _ENGINE_KINDS if target.startswith(k))
    return kinds


def test_servers_waited_for_one_after_another_leave_no_descriptor() -> None:
    # A stop_event never set, each server stopped by another thread: what watched the event
    # must keep nothing of its server (its stopped_fd, its listeners) nor of the wait.
    def one() -> None:
        server = Server([("path", "/", None, "static", (200, [], b"ok"))],
                        host="127.0.0.1", port=0, threads=1)
        server.start()
        stopper = threading.Thread(target=server.stop, args=(0.0,))
        stopper.start()
        Waiter(threading.Event()).wait_for_request(server)
        stopper.join()

    one()  # whatever the first server makes once (the engine's shared state)
    before = engine_descriptors()
    for _ in range(20):
        one()
    # A leak is one descriptor or more of a kind per server, 20 here; a descriptor that another
    # thread of the test process holds a moment (a connection it closes) is let go soon.
    deadline = time.monotonic() + 10
    while (after := engine_descriptors()) - before:
        assert time.monotonic() < deadline, (before, after)
        time.sleep(0.05)


def test_a_wait_begun_at_the_descriptor_limit_still_ends_on_a_signal(srv: Server) -> None:
    # The wait opens descriptors of its own (a pipe, an eventfd), after the server started: a
    # server flooded with connections from its first moment can be at its limit by then. The
    # wait must still work (it polls on a clock instead), not fail and take the server down.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler: list[int] = []
    waiter = Waiter(threading.Event())
    waiter.install()
    timer = later(0.3, os.kill, os.getpid(), signal.SIGTERM)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_descriptors() + 64, hard))
        with pytest.raises(OSError):
            while True:
                filler.append(os.dup(0))
        waiter.wait_for_request(srv)
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        timer.join()
        waiter.uninstall()
    assert srv.running and waiter.pending() == 1 and waiter.first_signal == signal.SIGTERM


def test_a_stop_event_set_again_after_a_set_and_clear_ends_the_wait(srv: Server) -> None:
    # set() then clear() before the wait looked is no stop (as pending() says); the set() that
    # comes later is, however the first one woke the event's watcher.
    stop = threading.Event()

    def pulse_then_set() -> None:
        stop.set()
        stop.clear()
        time.sleep(0.3)
        stop.set()

    waiter = Waiter(stop)
    timer = later(0.2, pulse_then_set)
    stopper = later(10.0, srv.stop, 0.0)  # only if the second set() went unseen
    try:
        waiter.wait_for_request(srv)
    finally:
        stopper.cancel()
        timer.join()
    assert srv.running and waiter.pending() == 1
