"""--metrics-bind's coroutine stacks (cyserve_coroutine_stacks, from csrc/coro.c's
coro_stack_counts) and idle trims (cyserve_coroutine_stack_trims_total): a burst of connections
held at once maps a stack for each, and once the server has been idle a little over a second
its threads give the free ones back (csrc/sched.c, "Giving back an idle thread's stacks"): each
worker keeps one magazine, the depot they share is unmapped. The end-to-end check of the idle
trim, which RSS is too noisy to give."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from _scrape import scrape
from _served import TIMEOUT, Served, free_port

pytestmark = pytest.mark.native

# An ASGI app whose /hold requests all wait for one /go: while they wait, each connection's
# coroutine (and its stack) waits for the app's answer. An asyncio.Event serves the one loop it
# is first awaited on, and without the GIL each worker thread runs a loop of its own (asgi_loops
# "auto"), so each loop gets its own gate and /go opens every one on its own loop's thread.
APP = """
import asyncio
import threading

lock = threading.Lock()
gates = {}  # event loop -> its gate
opened = False


def gate_of(loop):
    with lock:
        gate = gates.get(loop)
        if gate is None:
            gate = gates[loop] = asyncio.Event()
            if opened:
                gate.set()
        return gate


def open_all():
    global opened
    with lock:
        opened = True
        for loop, gate in gates.items():
            loop.call_soon_threadsafe(gate.set)


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            await send({"type": msg["type"] + ".complete"})
            if msg["type"] == "lifespan.shutdown":
                return
    gate = gate_of(asyncio.get_running_loop())
    await receive()
    if scope["path"] == "/go":
        open_all()
    else:
        await gate.wait()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
"""

BURST = 300
THREADS = 2
MAGAZINE = 32  # CORO_STACK_MAG (csrc/coro.h): what an idle worker keeps


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.close()


def wait_for(mport: int, cond: Callable[[dict[str, float]], bool], what: str) -> dict[str, float]:
    """Scrapes until cond holds of one (within the suite's timeout): that scrape."""
    deadline = time.monotonic() + TIMEOUT
    m = scrape(mport)
    while not cond(m):
        assert time.monotonic() < deadline, f"{what}: {m}"
        time.sleep(0.1)
        m = scrape(mport)
    return m


def test_idle_server_gives_back_a_bursts_stacks(tmp_path: Path, served: list[Served]) -> None:
    port, mport = free_port(), free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", str(THREADS), "--interface",
                 "asgi", "--metrics-bind", f"127.0.0.1:{mport}", "--backlog", "2048", app=APP)
    served.append(srv)
    first = scrape(mport)
    assert first["cyserve_coroutine_stacks"] >= 0
    held: list[socket.socket] = []
    try:
        for _ in range(BURST):
            s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
            s.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(s)
        # Every request waits for the app's answer, each in a coroutine with a stack of its own
        # (the publisher copies the counts every 100 ms).
        peak = wait_for(mport, lambda m: m["cyserve_coroutines"] >= BURST
                        and m["cyserve_coroutine_stacks"] >= BURST,
                        "the held requests' coroutines and stacks are not all counted")
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as go:
            go.sendall(b"GET /go HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert go.recv(200).startswith(b"HTTP/1.1 200")
        for s in held:
            assert s.recv(200).endswith(b"ok")
    finally:
        for s in held:
            s.close()
    # The connections are gone; their coroutines end and leave their stacks free in the pools.
    after = wait_for(mport, lambda m: m["cyserve_open_connections"] == 0
                     and m["cyserve_coroutines"] == 0, "the burst's connections did not end")
    t0 = time.monotonic()
    # Idle, each thread that ran coroutines sleeps CORO_IDLE_TRIM_MS (1.01 s), then trims; a
    # depot still moving then waits for a later trim. Nothing alive holds a stack now, so what
    # stays is at most one magazine per worker. The bound on the wait is the suite's timeout,
    # not the trim's period: a loaded machine may delay the threads' wake-ups.
    idle = wait_for(mport, lambda m: m["cyserve_coroutine_stacks"] <= THREADS * MAGAZINE,
                    "the idle threads did not give back the burst's stacks")
    waited = time.monotonic() - t0
    print(f"\nstacks: {first['cyserve_coroutine_stacks']:g} before, "
          f"{peak['cyserve_coroutine_stacks']:g} with {BURST} held, "
          f"{after['cyserve_coroutine_stacks']:g} once they ended, "
          f"{idle['cyserve_coroutine_stacks']:g} {waited:.1f} s later; "
          f"trims {peak['cyserve_coroutine_stack_trims_total']:g} -> "
          f"{idle['cyserve_coroutine_stack_trims_total']:g}")
    # The drop is the trims' doing (the free stacks of the coroutines that ended after the peak's
    # scrape were unmapped by a trim after it), and they are counted.
    assert idle["cyserve_coroutine_stack_trims_total"] > peak["cyserve_coroutine_stack_trims_total"]
    assert srv.stop() == 0, srv.stderr
