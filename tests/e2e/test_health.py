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
