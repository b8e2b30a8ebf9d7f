"""--metrics-bind and WebSocket, scraped from a real server with prometheus_client's parser: the
connections' states stay true while GIL-free WebSockets (csrc/ws_nogil.c) go busy and idle at
every message and timer."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_asgi import serving_app
from test_websocket import close_code_of, handshake, read_frame

import cyserve
from _cython_ext import build_user_module
from _served import TIMEOUT, free_port

websockets = pytest.importorskip("websockets")
from websockets.sync.client import connect  # noqa: E402

pytestmark = pytest.mark.native

ROOT = Path(__file__).parent.parent.parent
STATES = ("idle", "active", "python")
MAX_SIZE = 4096  # ws_max_size: a frame announcing more closes 1009 from its head


@pytest.fixture(scope="module")
def user(tmp_path_factory: Any) -> Any:
    """tests/cython_ext/ws_user.pyx: a GIL-free echo that also closes with a code on "close N"
    and fails its callback (1011) on "fail"."""
    return build_user_module(ROOT / "tests" / "cython_ext" / "ws_user.pyx",
                             tmp_path_factory.mktemp("ws_user"))


def scrape(port: int) -> dict[str, float]:
    """Every sample of the endpoint, by name and labels, parsed by prometheus_client."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def states(mport: int) -> tuple[int, ...]:
    m = scrape(mport)
    got = tuple(int(m[f"cyserve_connections{{state={s}}}"]) for s in STATES)
    assert sum(got) == m["cyserve_open_connections"], m
    return got


def wait_states(mport: int, want: tuple[int, int, int], timeout: float = 10.0) -> None:
    # The gauges are published every 100 ms: wait for them to settle on want, and say what they
    # were last when they do not.
    deadline = time.monotonic() + timeout
    got = states(mport)
    while got != want:
        assert time.monotonic() < deadline, f"(idle, active, python) {got}, not {want}"
        time.sleep(0.05)
        got = states(mport)


def nogil_app(user: Any) -> cyserve.App:
    app = cyserve.App()
    app.nogil_websocket("/ws", user.HANDLER_CAPSULE)
    return app


# ---- the busy count of GIL-free WebSockets (csrc/ws_nogil.c) ----

def test_nogil_websocket_messages_leave_no_connection_counted_busy(user: Any) -> None:
    # Each message takes the idle connection (a readable event: busy, paid when its coroutine
    # starts) and gives it back idle once the socket is drained; the count of busy connections
    # must come back with it, or every open GIL-free WebSocket reads "active" for ever.
    mport = free_port()
    with serving_app(nogil_app(user), metrics_bind=f"127.0.0.1:{mport}") as port:
        wait_states(mport, (0, 0, 0))
        clients = [connect(f"ws://127.0.0.1:{port}/ws") for _ in range(4)]
        try:
            for round_ in range(25):
                for i, ws in enumerate(clients):
                    ws.send(f"m{round_}-{i}")
                for i, ws in enumerate(clients):
                    assert ws.recv(timeout=TIMEOUT) == f"m{round_}-{i}"
            wait_states(mport, (4, 0, 0))
        finally:
            for ws in clients:
                ws.close()
        wait_states(mport, (0, 0, 0))


def test_nogil_websocket_timers_leave_no_connection_counted_busy(user: Any) -> None:
    # The idle connection's timer takes it too (a ping due, a pong overdue): the keep-alive
    # pings of clients that answer them, then a client that does not, closed 1011 by its pong's
    # deadline from the timer's coroutine. Neither may change the count of busy connections.
    mport = free_port()
    with serving_app(nogil_app(user), metrics_bind=f"127.0.0.1:{mport}",
                     ws_ping_interval=0.1, ws_ping_timeout=0.3) as port:
        clients = [connect(f"ws://127.0.0.1:{port}/ws") for _ in range(2)]
        try:
            silent, head = handshake(port, path="/ws")
            with silent:
                assert head.startswith(b"HTTP/1.1 101 ")
                assert read_frame(silent)[0] == 9  # a ping, left unanswered
                assert close_code_of(silent) == 1011
                assert silent.recv(10) == b""
            time.sleep(0.5)  # several pings to the others, each from the timer
            for ws in clients:
                ws.send("still here")
                assert ws.recv(timeout=TIMEOUT) == "still here"
            wait_states(mport, (2, 0, 0))
        finally:
            for ws in clients:
                ws.close()
        wait_states(mport, (0, 0, 0))
