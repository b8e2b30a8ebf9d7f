"""--metrics-bind's connections by state (idle, active, python) and --limit-concurrency's
refusals under a reason of their own, each scraped from a real server, with prometheus_client's
parser, while connections are held in every state."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _scrape import scrape, states
from _served import TIMEOUT, Served, free_port

pytestmark = pytest.mark.native

APP = """
import os
import time

import cyserve

app = cyserve.App()
GO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "go")


@app.get("/block")
def block(request):
    # Holds its Python call (and its --limit-concurrency place) until the test makes the file.
    while not os.path.exists(GO):
        time.sleep(0.01)
    return "done"


app.static("/plain", b"plain")
"""


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.close()


def wait_states(mport: int, want: tuple[int, int, int]) -> None:
    deadline = time.monotonic() + TIMEOUT
    got = states(mport)
    while got != want:
        assert time.monotonic() < deadline, f"(idle, active, python) {got}, not {want}"
        time.sleep(0.05)
        got = states(mport)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)


@pytest.mark.parametrize("processes", [1, 2])
def test_connections_by_state_and_limit_refusals(tmp_path: Path, served: list[Served],
                                                 processes: int) -> None:
    port, mport = free_port(), free_port()
    args = ["--port", str(port), "--threads", "2", "--metrics-bind", f"127.0.0.1:{mport}",
            "--limit-concurrency", "1"]
    if processes > 1:
        args += ["--processes", str(processes)]
    srv = Served(tmp_path, *args, wait_serving=processes, app=APP)
    served.append(srv)
    wait_states(mport, (0, 0, 0))
    held: list[socket.socket] = []
    # Idle: three keep-alive connections that had their answer.
    for _ in range(3):
        s = connect(port)
        s.sendall(b"GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(200).endswith(b"plain")
        held.append(s)
    wait_states(mport, (3, 0, 0))
    # Active: two connections in the middle of a request head.
    for _ in range(2):
        s = connect(port)
        s.sendall(b"GET /plain HTTP/1.1\r\nHost: x\r\n")
        held.append(s)
    wait_states(mport, (3, 2, 0))
    # Python: one request in its handler.
    blocked = connect(port)
    blocked.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_states(mport, (3, 2, 1))
    key = "cyserve_rejections_total{reason=%s,status=503}"
    assert scrape(mport)[key % "limit_concurrency"] == 0
    # A second handler call is past --limit-concurrency 1. With two processes, only in the
    # process of the first: a try that lands in the other one starts a handler there, which
    # waits as the first does, and the next try is refused wherever it lands.
    started = 0
    while True:
        status, body = _try_block(port, mport, 1 + started)
        if status.startswith(b"HTTP/1.1 503"):
            assert "too many requests at once" in body
            break
        assert processes > 1 and started == 0 and status == b"", (status, body)
        started += 1
    (tmp_path / "go").touch()  # every handler returns
    assert blocked.recv(200).endswith(b"done")
    blocked.close()

    def counted() -> dict[str, float]:
        m = scrape(mport)
        return m if m["cyserve_requests_total{route=python,status=2xx}"] == 1 + started \
            else {}
    deadline = time.monotonic() + TIMEOUT
    while not (m := counted()):
        assert time.monotonic() < deadline, scrape(mport)
        time.sleep(0.05)
    assert m[key % "limit_concurrency"] == 1
    assert m[key % "body_capacity"] == 0  # the other 503 the engine gives, told apart
    # The refusal is the engine's own answer: counted under no route, once.
    assert m["cyserve_requests_total{route=none,status=5xx}"] == 1
    assert m["cyserve_requests_total{route=python,status=5xx}"] == 0
    # The keep-alive connection that had the blocked answer is idle again; then all close.
    wait_states(mport, (3, 2, 0))
    for s in held:
        s.close()
    wait_states(mport, (0, 0, 0))
    assert srv.stop() == 0, srv.stderr


def _try_block(port: int, mport: int, blocked: int) -> tuple[bytes, str]:
    """GET /block: its status line and body, or (b"", "") once its handler is seen to run (the
    connections in a Python call go past the `blocked` ones before it): it landed in a process
    with room, and waits for the file. Not a fixed wait for the answer, which a loaded machine
    may overrun with the refusal still to come."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        deadline = time.monotonic() + TIMEOUT
        while not select.select([s], [], [], 0.05)[0]:
            if states(mport)[2] > blocked:
                return b"", ""
            assert time.monotonic() < deadline, "neither an answer nor a handler that runs"
        data = s.recv(1000)
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body.decode()


def test_timeouts_are_counted_by_their_reason(tmp_path: Path, served: list[Served]) -> None:
    # Issue 17 asks for timeouts by kind beside the limits' refusals: a head that does not
    # arrive within --header-timeout and a body that stops are each answered 408 and counted
    # under reason "timeout", apart from the other refusals.
    port, mport = free_port(), free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--metrics-bind",
                 f"127.0.0.1:{mport}", "--header-timeout", "0.5", "--body-timeout", "0.5",
                 app=APP)
    served.append(srv)
    key = "cyserve_rejections_total{reason=%s,status=%s}"
    assert scrape(mport)[key % ("timeout", "408")] == 0
    for partial in (b"GET /plain HTTP/1.1\r\nHost: x\r\n",  # the head never ends
                    b"POST /plain HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"):
        with connect(port) as s:
            s.sendall(partial)
            assert s.recv(200).startswith(b"HTTP/1.1 408 "), partial
    deadline = time.monotonic() + TIMEOUT
    while (m := scrape(mport))[key % ("timeout", "408")] != 2:
        assert time.monotonic() < deadline, m
        time.sleep(0.05)
    assert m[key % ("malformed", "400")] == 0
    assert m["cyserve_requests_total{route=none,status=4xx}"] == 2  # the engine's own answers
    assert srv.stop() == 0, srv.stderr
