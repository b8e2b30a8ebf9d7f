"""Python handlers on one worker: slow handlers must not hold back each other's responses.

The worker runs offloaded Python calls in batches (one GIL acquisition per batch) and resumes a
coroutine, which then writes its response, only when its batch has ended. A batch is bounded by
time, so a burst of slow handlers is answered one by one, not all after the last handler."""

from __future__ import annotations

import selectors
import socket
import subprocess
import sys
import threading
import time

import pytest

from _rawhttp import serving

pytestmark = pytest.mark.native

N_CONN = 8
# Each call's length: the responses' arrivals are seen by this process's main thread, and a
# thread of a loaded machine may be descheduled for a few of them at 50 ms (half of them early
# is the bound, six the usual count).
SLEEP_S = 0.15


def test_slow_handlers_answer_one_by_one():
    starts: list[float] = []
    lock = threading.Lock()

    def slow(req):
        with lock:
            starts.append(time.monotonic())
        time.sleep(SLEEP_S)  # releases the GIL, as blocking I/O in a real handler would
        return "slow"

    routes = [("path", "/slow", None, "python", slow)]
    # Without relief threads, so that the one worker runs every call itself: this is about how
    # its batches are bounded (with relief, the calls run at once: test_blocking_handlers.py).
    with serving(routes, threads=1, blocking_threads=0) as srv:
        socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                 for _ in range(N_CONN)]
        sel = selectors.DefaultSelector()
        arrivals: list[float] = []
        try:
            for s in socks:
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ, {"buf": b""})
            # Every request is sent before the server answers the first (it sleeps 150 ms), so
            # they are all queued on the one worker at about the same time.
            for s in socks:
                s.sendall(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
            while len(arrivals) < N_CONN:
                events = sel.select(timeout=10)
                assert events, "no response for 10 s"
                for key, _ in events:
                    data = key.fileobj.recv(65536)
                    assert data, "server closed a keep-alive connection"
                    key.data["buf"] += data
                    if key.data["buf"].endswith(b"\r\n\r\nslow"):
                        arrivals.append(time.monotonic())
                        sel.unregister(key.fileobj)
        finally:
            sel.close()
            for s in socks:
                s.close()

    assert len(starts) == N_CONN
    last_start = max(starts)
    early = sum(1 for t in arrivals if t < last_start)
    # Bounded batches: each slow call is a batch of its own, and its response is written before
    # the next call starts, so nearly every response arrives before the last handler starts.
    # Unbounded, the second batch took all calls queued behind the first one, and at most the
    # first batch's response arrived before the last handler started.
    assert min(arrivals) < last_start
    assert early >= N_CONN // 2, (early, sorted(arrivals), sorted(starts))


# The client of the fairness test, in a process of its own: in this one it would need the GIL that
# the busy handlers hold, and could not send a connection's next request as soon as its answer
# arrives, which is what let answered connections overtake the others.
_FAIR_CLIENT = """
import selectors, socket, sys, time
port, n_conn, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
# Past the seconds, go on (up to 10 s) until the connections have 24 answers each on average:
# on a crowded machine a few answers each would make min/max a matter of rounding.
enough, longest = 24 * n_conn, 10.0
req = b"GET /busy HTTP/1.1\\r\\nHost: t\\r\\n\\r\\n"
sel = selectors.DefaultSelector()
counts = {}
for i in range(n_conn):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ, [i, b""])
    counts[i] = 0
    s.sendall(req)
began = time.monotonic()
while (time.monotonic() - began < seconds or
       (sum(counts.values()) < enough and time.monotonic() - began < longest)):
    for key, _ in sel.select(timeout=10):
        data = key.fileobj.recv(65536)
        assert data, "server closed a keep-alive connection"
        key.data[1] += data
        while b"done" in key.data[1]:
            key.data[1] = key.data[1].split(b"done", 1)[1]
            counts[key.data[0]] += 1
            key.fileobj.sendall(req)
print(" ".join(str(counts[i]) for i in range(n_conn)))
"""


def test_slow_handlers_serve_every_connection_in_turn():
    # Every connection keeps one request outstanding and each call runs past the batch's time
    # slice, so each batch answers a call or two and sends the rest back to be queued again. The
    # calls must be taken in the order they were first queued: once, the connections just
    # answered (whose next request arrives at once) overtook the others on every batch, and a
    # few got most of the answers (wrk, 64 connections: one got 780, most 30; p99 1.1 s).
    def busy(req):
        end = time.perf_counter() + 0.0006  # holds the GIL, as computing handlers do
        while time.perf_counter() < end:
            pass
        return "done"

    routes = [("path", "/busy", None, "python", busy)]
    # Relief off: this is the order of one worker's batches. With relief on, a crowded machine
    # (a load of 5-15, or ASan's slower batches) preempts a busy batch past relief's threshold,
    # and relief threads then serve some of the connections. One queue of calls per process
    # took the worst of that away (min/max 0.00-0.04 became mostly 0.5-0.95), but at a load of
    # 16 relief on still gave 0.29-0.82 against 0.91-0.96 off, and this assertion failed 2 runs
    # in 7: docs/architecture.md ("Known limits").
    with serving(routes, threads=1, blocking_threads=0) as srv:
        # 64 connections: as many as a batch's call limit (SCHED_OFFLOAD_BATCH), where the
        # overtaking showed (with 32 the old order was only uneven, 78 to 138).
        out = subprocess.run([sys.executable, "-c", _FAIR_CLIENT, str(srv.port), "64", "2"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    served = sorted(int(n) for n in out.stdout.split())
    # About 3,000 calls shared by 64 connections (on a quiet machine; at least ~1,500 on a
    # crowded one): in turn, each gets the same count within one or two; the bug gave a few
    # connections ~200 and many ~20, and the relief threads' uneven share of the GIL 2 to 165.
    assert len(served) == 64 and served[0] >= 0.5 * served[-1], served
