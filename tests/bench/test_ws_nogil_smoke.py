"""Smoke test of the GIL-free WebSocket echo's benchmark pieces, without running a benchmark:
the app bench/http/protocols.py serves as "cyserve-nogil-ws" (bench/http/apps/
cyserve_ws_nogil_app.py over examples/ws_echo_nogil.pyx) answers the driver's own probe, and
bench/http/ws_idle_memory.py reports a per-connection figure for a few hundred idle WebSockets."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench.common import processes  # noqa: E402
from bench.http import protocols as P  # noqa: E402

def test_nogil_ws_server_is_in_the_driver_with_its_target():
    server = P.BY_NAME["cyserve-nogil-ws"]
    assert server.app == "bench.http.apps.cyserve_ws_nogil_app"
    assert server.missing is None  # the app exists now: an import error is a real failure
    assert ("ws-echo", "cyserve-nogil-ws", "go-ws", 1.0) in P.TARGETS


def test_nogil_ws_app_answers_the_drivers_probe(tmp_path):
    # examples/ws_echo_nogil is built in place by `make build` (examples/build.py); the runner
    # builds its own copy into bench/.build/ (bench/http/build_nogil.py).
    port = processes.free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT, os.path.join(ROOT, "examples"), os.path.join(ROOT, "src")]))
    argv = [sys.executable, "-m", "cyserve", "bench.http.apps.cyserve_ws_nogil_app:app",
            "--host", "127.0.0.1", "--port", str(port), "--threads", "1"]
    run = processes.start_server(argv, port, str(tmp_path / "server.log"), env=env, cwd=ROOT)
    try:
        assert P.ws_probe(port) is None
    finally:
        run.stop()


def test_idle_memory_script_reports_per_connection_figures():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "http", "ws_idle_memory.py"),
                          "--conns", "300", "--settle", "0.5"], capture_output=True, text=True,
                         timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["conns"] == 300
    for key in ("rss_before_kib", "rss_after_kib", "rss_per_conn_bytes", "pss_per_conn_bytes"):
        assert isinstance(res[key], int)
    assert res["rss_after_kib"] > 0 and res["rss_before_kib"] > 0
