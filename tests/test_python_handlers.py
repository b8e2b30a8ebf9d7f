"""Python handlers on one worker: slow handlers must not hold back each other's responses.

The worker runs offloaded Python calls in batches (one GIL acquisition per batch) and resumes a
coroutine, which then writes its response, only when its batch has ended. A batch is bounded by
time, so a burst of slow handlers is answered one by one, not all after the last handler."""

from __future__ import annotations

import selectors
import socket
import threading
import time

from _rawhttp import serving

N_CONN = 8
SLEEP_S = 0.05


def test_slow_handlers_answer_one_by_one():
    starts: list[float] = []
    lock = threading.Lock()

    def slow(req):
        with lock:
            starts.append(time.monotonic())
        time.sleep(SLEEP_S)  # releases the GIL, as blocking I/O in a real handler would
        return "slow"

    routes = [("path", "/slow", None, "python", slow)]
    with serving(routes, threads=1) as srv:
        socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                 for _ in range(N_CONN)]
        sel = selectors.DefaultSelector()
        arrivals: list[float] = []
        try:
            for s in socks:
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ, {"buf": b""})
            # Every request is sent before the server answers the first (it sleeps 50 ms), so
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
