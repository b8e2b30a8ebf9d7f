"""--health-path: a path answered 200 "ok" from C (a static route added by serving.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _served import APP, TIMEOUT, Served, free_port, request

pytestmark = pytest.mark.native


def test_health_path_answers_ok(tmp_path: Path) -> None:
    port = free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--health-path", "/healthz")
    try:
        assert request(socket.AF_INET, ("127.0.0.1", port), "/healthz") == \
            (b"HTTP/1.1 200 OK", "ok\n")
        assert request(socket.AF_INET, ("127.0.0.1", port), "/plain") == \
            (b"HTTP/1.1 200 OK", "plain")
        assert srv.stop() == 0
    finally:
        srv.close()


@pytest.mark.parametrize("path, message", [
    ("/plain", "route '/plain': another route already has this pattern"),
    ("healthz", "invalid --health-path 'healthz': must be a path such as /healthz"),
])
def test_a_bad_health_path_is_one_line(tmp_path: Path, path: str, message: str) -> None:
    (tmp_path / "listen_app.py").write_text(textwrap.dedent(APP))
    r = subprocess.run([sys.executable, "-m", "cyserve", "listen_app:app", "--port",
                        str(free_port()), "--health-path", path], cwd=tmp_path,
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("cyserve: " + message), r.stderr


def test_drain_delay_fails_the_health_path_first_then_stops(tmp_path: Path) -> None:
    # SIGTERM with --drain-delay: for that long the health path answers 503 while everything
    # else (new connections included) is served as usual; then the graceful stop closes the
    # listeners. A load balancer checking the path stops sending before connections are refused.
    import signal
    import time

    port = free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--health-path", "/healthz",
                 "--drain-delay", "1.5")
    try:
        addr = ("127.0.0.1", port)
        assert request(socket.AF_INET, addr, "/healthz") == (b"HTTP/1.1 200 OK", "ok\n")
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        # The order is the test, not the clock: 200 until the signal is handled, then 503, and
        # after that 503 a new connection is still served, so the 503 came within the drain
        # delay (the listeners close when it ends). This loop once had 1 s: a loaded machine
        # may take that long to deliver the signal and answer, with the server still right.
        deadline = t0 + TIMEOUT
        seen: list[bytes] = []
        while time.monotonic() < deadline:
            status, _ = request(socket.AF_INET, addr, "/healthz")
            seen.append(status)
            if not status.startswith(b"HTTP/1.1 200"):
                break
            time.sleep(0.02)
        assert seen[-1].startswith(b"HTTP/1.1 503"), seen
        # Still serving the rest during the delay, on a new connection.
        assert request(socket.AF_INET, addr, "/plain") == (b"HTTP/1.1 200 OK", "plain")
        assert srv.proc.wait(TIMEOUT) == 0
        took = time.monotonic() - t0
        assert took >= 1.4, took
    finally:
        srv.close()


def test_a_negative_drain_delay_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "listen_app.py").write_text(textwrap.dedent(APP))
    r = subprocess.run([sys.executable, "-m", "cyserve", "listen_app:app", "--port",
                        str(free_port()), "--drain-delay", "-1"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("cyserve: invalid --drain-delay -1.0: must be at least 0"), r.stderr
