"""A worker process whose supervisor is killed with SIGKILL ends, even when its Python thread
never gets the GIL again: the engine's own watcher thread (csrc/server.c, "the supervisor's
watcher") notices the supervisor is gone, stops the engine and, past the grace period, ends the
process, where PR_SET_PDEATHSIG's SIGTERM alone waits for a Python handler that never runs."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _served import TIMEOUT, Served, free_port

pytestmark = pytest.mark.native

APP = """
import os
import re

import cyserve

app = cyserve.App()


@app.get("/who")
def who(request):
    return str(os.getpid())


@app.get("/spin")
def spin(request):
    # Catastrophic backtracking: the regular expression engine runs in C for ages, holding the
    # GIL all along.
    re.match(r"(a+)+$", "a" * 64 + "b")
    return "never"
"""


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.close()


def cpu_seconds(pid: int) -> float:
    """The CPU time pid has used (user and system), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie has ended: its parent, the init process here, reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("path", ["/spin", None])
def test_worker_ends_when_its_supervisor_is_killed(tmp_path: Path, served: list[Served],
                                                   path: str | None) -> None:
    port = free_port()
    # --max-requests puts one worker process under a supervisor; a 1 s grace period.
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--processes", "1",
                 "--max-requests", "1000000", "--graceful-timeout", "1", app=APP)
    served.append(srv)
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(b"GET /who HTTP/1.1\r\nHost: x\r\n\r\n")
        worker = int(s.recv(1000).partition(b"\r\n\r\n")[2])
    assert worker != srv.proc.pid
    stuck = None
    if path is not None:
        idle = cpu_seconds(worker)
        stuck = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        stuck.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        # The worker's Python thread waits for a GIL that the call never gives back: its own
        # SIGTERM handler could not run. Let the call start: the worker spins, which an idle
        # one does not (a fixed pause could end before a loaded machine started it).
        deadline = time.monotonic() + TIMEOUT
        while cpu_seconds(worker) - idle < 0.2:
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.02)
    os.kill(srv.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    while alive(worker):
        # Noticed within 0.1 s; the stop's grace period (1 s); one more second before _exit.
        assert time.monotonic() - killed < 5.0, f"worker {worker} still runs"
        time.sleep(0.02)
    took = time.monotonic() - killed
    print(f"\n{path}: the worker ended {took:.2f} s after its supervisor's SIGKILL")
    if stuck is not None:
        assert 1.0 <= took, took  # the call in flight had its grace period
        stuck.settimeout(TIMEOUT)
        assert stuck.recv(100) == b""  # and its connection went with the process
        stuck.close()
    srv.proc.wait(TIMEOUT)
    srv.close()
    if stuck is not None:
        # (Without a stuck call, the worker's own SIGTERM handler may finish first.)
        said = srv.stderr + "\n".join(srv.all_lines)
        assert "the supervisor is gone: stopping this worker" in said, said
        assert "did not stop within its grace period: exiting" in said, said
