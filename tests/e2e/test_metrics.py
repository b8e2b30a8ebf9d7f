"""--metrics-bind (csrc/metrics.c): the Prometheus text exposition on a listener of its own,
read with prometheus_client's own parser; summed over the worker processes and kept across a
worker's replacement; and --worker-timeout (supervisor.py, point 6): a worker stuck in a call is
killed, its stacks printed, and replaced, while the others serve."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _scrape import scrape
from _served import TIMEOUT, Served, free_port, request

pytestmark = pytest.mark.native

APP = """
import os
import re
import time

import cyserve

app = cyserve.App()


@app.get("/who")
def who(request):
    return f"{os.getpid()} {request.client}"


@app.post("/echo")
def echo(request):
    return request.body


@app.get("/sleep")
def sleep(request):
    time.sleep(3600)  # blocks its worker thread (with relief off: the whole worker)
    return "late"


@app.get("/spin")
def spin(request):
    # Catastrophic backtracking: the regular expression engine runs in C for ages, holding
    # the GIL all along.
    re.match(r"(a+)+$", "a" * 64 + "b")
    return "never"


app.static("/plain", b"plain")
"""


# Standard error into standard output: the supervisor's lines about workers, and faulthandler's
# dump, come in order with the status lines.
MERGED = ["sh", "-c", 'exec "$@" 2>&1', "sh"]


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.close()


def wait_for(cond, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + TIMEOUT
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize("processes", [1, 2])
def test_metrics_count_every_process_and_parse(tmp_path: Path, served: list[Served],
                                               processes: int) -> None:
    port, mport = free_port(), free_port()
    args = ["--port", str(port), "--threads", "2", "--metrics-bind", f"127.0.0.1:{mport}"]
    if processes > 1:
        args += ["--processes", str(processes)]
    srv = Served(tmp_path, *args, wait_serving=processes, app=APP)
    served.append(srv)
    addr = ("127.0.0.1", port)
    before = scrape(mport)
    assert before['cyserve_requests_total{route=static,status=2xx}'] == 0
    assert before["cyserve_worker_processes"] == processes
    pids = set()
    for _ in range(40):
        assert request(socket.AF_INET, addr, "/plain")[1] == "plain"
        pids.add(request(socket.AF_INET, addr, "/who")[1].split()[0])
    assert request(socket.AF_INET, addr, "/missing")[0] == b"HTTP/1.1 404 Not Found"
    # A malformed request: refused by the engine (400).
    with socket.create_connection(addr, timeout=TIMEOUT) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    # The app's port does not serve the metrics, and the metrics port nothing else.
    assert request(socket.AF_INET, addr, "/metrics")[0] == b"HTTP/1.1 404 Not Found"
    assert request(socket.AF_INET, ("127.0.0.1", mport), "/plain")[0] == \
        b"HTTP/1.1 404 Not Found"

    def counted() -> bool:
        m = scrape(mport)
        # (the scheduler's counters are copied every 100 ms)
        return (m["cyserve_requests_total{route=python,status=2xx}"] == 40
                and m["cyserve_scheduler_offloads_total"] >= 40)
    wait_for(counted, "the python requests are not all counted")
    m = scrape(mport)
    print(f"\n{processes} process(es): {len(pids)} answered; " + ", ".join(
        f"{k}={v:g}" for k, v in m.items() if v and not k.endswith("_created")))
    if processes > 1:
        assert len(pids) == processes  # both counted into the same sums
    assert m["cyserve_requests_total{route=static,status=2xx}"] == 40
    assert m["cyserve_requests_total{route=none,status=4xx}"] == 3  # two 404s and the 400
    assert m["cyserve_rejections_total{reason=malformed,status=400}"] == 1
    assert m["cyserve_request_duration_seconds_count"] == 82  # the 400 has no duration
    assert m["cyserve_request_duration_seconds_bucket{le=+Inf}"] == 82
    assert m["cyserve_request_duration_seconds_bucket{le=10}"] <= 82
    assert 0 < m["cyserve_request_duration_seconds_sum"] < 82 * 1.0
    assert m["cyserve_connections_total"] >= 83
    assert m["cyserve_received_bytes_total"] > 83 * 30
    assert m["cyserve_sent_bytes_total"] > 83 * 60
    assert m["cyserve_scheduler_offloads_total"] >= 40
    assert m["cyserve_coroutines_spawned_total"] > 0
    assert m["cyserve_scheduler_run_queue"] >= 0
    # 40 Python calls ran in batches that each waited for the GIL a little (under 1 s here).
    assert 0 < m["cyserve_python_wait_seconds_total"] < 40
    # Coroutines alive now: a few at most (never the wrap-around of finished read past spawned).
    assert 0 <= m["cyserve_coroutines"] < 1000
    assert "cyserve_scheduler_steals_total" in m and "cyserve_relief_adoptions_total" in m
    # Workers that waited for work between the requests went to sleep, and said so.
    assert m["cyserve_scheduler_parks_total"] > 0
    # Every request so far asked for Connection: close (or was malformed), which the inline
    # path leaves to a coroutine: none was answered there.
    assert m["cyserve_inline_answers_total"] == 0
    # An idle keep-alive connection is open, and seen within the publisher's period.
    with socket.create_connection(addr, timeout=TIMEOUT) as s:
        s.sendall(b"GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(200).endswith(b"plain")
        wait_for(lambda: scrape(mport)["cyserve_open_connections"] >= 1,
                 "the open connection is not counted")
        # The next request on that idle connection, lone and complete, to a static route: the
        # inline path answers it (csrc/http1_inline.c), and its counter says so. (The first
        # request of the connection may have been answered inline too, or by the coroutine
        # that took the connection: tests/e2e/test_inline_path.py counts from the second.)
        s.sendall(b"GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(200).endswith(b"plain")
        wait_for(lambda: scrape(mport)["cyserve_inline_answers_total"] >= 1,
                 "the inline answer is not counted")
        assert scrape(mport)["cyserve_inline_answers_total"] <= 2
    assert srv.stop() == 0, srv.stderr


def test_metrics_keep_a_replaced_workers_counts(tmp_path: Path, served: list[Served]) -> None:
    port, mport = free_port(), free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--processes", "2",
                 "--metrics-bind", f"127.0.0.1:{mport}", wait_serving=2, app=APP,
                 launcher=MERGED)
    served.append(srv)
    addr = ("127.0.0.1", port)
    for _ in range(30):
        request(socket.AF_INET, addr, "/who")
    wait_for(lambda: scrape(mport)["cyserve_requests_total{route=python,status=2xx}"] == 30,
             "not counted")
    victim = int(request(socket.AF_INET, addr, "/who")[1].split()[0])
    # A scrape connected before the replacement's fork and sent after it: the supervisor stops
    # its scrape thread around each fork, which once closed such a scrape unanswered.
    early = socket.create_connection(("127.0.0.1", mport), timeout=TIMEOUT)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + TIMEOUT
    while "starting a new one" not in srv.lines.get(timeout=TIMEOUT):
        assert time.monotonic() < deadline
    with early:
        early.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := early.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:200]
    assert b'cyserve_requests_total{route="python",status="2xx"} 31' in answer
    # The killed worker's counts stay in the sums (no counter goes down).
    m = scrape(mport)
    assert m["cyserve_requests_total{route=python,status=2xx}"] == 31
    assert m["cyserve_worker_processes"] == 1 or m["cyserve_worker_processes"] == 2
    assert srv.stop() == 0, srv.stderr


@pytest.mark.parametrize("path", ["/sleep", "/spin", "SIGSTOP"])
def test_worker_timeout_kills_a_stuck_worker(tmp_path: Path, served: list[Served],
                                             path: str) -> None:
    port = free_port()
    # One worker thread and relief off: a stuck call stops the whole worker process.
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--blocking-threads", "0",
                 "--processes", "2", "--worker-timeout", "2", wait_serving=2, app=APP,
                 launcher=MERGED)
    served.append(srv)
    addr = ("127.0.0.1", port)
    pids = set()
    while len(pids) < 2:
        pids.add(int(request(socket.AF_INET, addr, "/who")[1].split()[0]))
    stuck = socket.create_connection(addr, timeout=TIMEOUT)
    started = time.monotonic()  # before the call can start: took is never short of the limit
    if path == "SIGSTOP":  # a process that stopped: its heartbeat goes silent
        stuck.sendall(b"GET /who HTTP/1.1\r\nHost: x\r\n\r\n")
        victim = int(stuck.recv(1000).partition(b"\r\n\r\n")[2].split()[0])
        os.kill(victim, signal.SIGSTOP)
    else:
        stuck.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    deadline = started + TIMEOUT
    lines = []
    while not any("its replacement serves" in ln for ln in lines):
        assert time.monotonic() < deadline, lines
        lines.append(srv.lines.get(timeout=TIMEOUT))
    took = time.monotonic() - started
    said = [ln for ln in lines if "--worker-timeout" in ln]
    print(f"\n{path}: replaced after {took:.1f} s: " + " | ".join(said))
    why = "has not been heard from" if path == "SIGSTOP" else "a call has run for"
    assert any("made no progress for over 2 s" in ln and why in ln for ln in said), lines
    if path != "SIGSTOP":  # the log line names the route that was running
        assert any(f"(route {path})" in ln for ln in said), said
    assert 2 <= took < 15
    assert stuck.recv(100) == b""  # its connection went with it
    stuck.close()
    # The other worker and the replacement serve.
    for _ in range(20):
        assert request(socket.AF_INET, addr, "/plain")[1] == "plain"
    assert srv.stop() == 0
    while not srv.lines.empty():
        lines.append(srv.lines.get_nowait())
    if path == "SIGSTOP":
        return  # killed by SIGKILL: nothing printed
    # faulthandler's dump names the handler that was stuck.
    dump = "\n".join(lines)
    assert ("in sleep" if path == "/sleep" else "in spin") in dump, dump[-3000:]
