"""Smoke test of the HTTP benchmark suite (bench/http/ on bench/common/): keeps `make bench`
working without running it.

Stdlib only and nothing installed: the peers used are bench/peers/python/minimal.py's threading
design and http.server's ThreadingHTTPServer, run with this interpreter; the load comes from the
harness's Python client, so no wrk or hey is needed. No figure is asserted, only that figures
exist, that validation catches a wrong body, and the shape of the JSON the runner writes.
"""

import json
import os
import platform
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench.common import processes  # noqa: E402
from bench.http import harness, report  # noqa: E402
from bench.http import workloads as W  # noqa: E402


@pytest.fixture
def bench_python(monkeypatch):
    """Make the suite start its Python peers with this interpreter instead of bench/.venv's."""
    monkeypatch.setenv("CYSERVE_BENCH_PYTHON", sys.executable)
    import importlib

    from bench.http import servers
    importlib.reload(servers)
    yield servers
    monkeypatch.delenv("CYSERVE_BENCH_PYTHON")
    importlib.reload(servers)


@pytest.fixture
def threading_server(tmp_path, bench_python):
    server = bench_python.BY_NAME["min-threading"]
    port = processes.free_port()
    argv, env, _ = server.command(port, 1, str(tmp_path))
    run = processes.start_server(argv, port, str(tmp_path / "server.log"), env=env, cwd=ROOT)
    yield run
    run.stop()
    assert run.proc.poll() is not None, "the server outlived stop()"


def test_expected_bodies_match_the_seeds():
    bodies = W.expected_bodies()
    assert bodies["plaintext"] == b"Hello, World!"
    assert bodies["welcome"] == b"Welcome!\n"
    assert bodies["fib"] == b"Fibonacci(10^6) = %d (with overflow)\n" % W.fib_u32(10**6)
    assert W.fib_u32(10) == 55 and W.fib_u32(48) == 4807526976 % 2**32  # the 32-bit wrap
    assert len(bodies["transfer"]) == 133622
    assert bodies["json"] == b"133622\n"
    assert json.loads(bodies["transfer"])[999]["id"] == 999


def test_validation_accepts_exact_bodies_and_rejects_others(threading_server):
    expected = W.expected_bodies()
    stdlib_routes = ["plaintext", "fib", "welcome", "transfer", "loop"]
    assert (harness.validate(threading_server.port, expected, stdlib_routes)
            == {w: "ok" for w in stdlib_routes})
    wrong = dict(expected, welcome=b"Welcome?\n")
    assert harness.validate(threading_server.port, wrong,
                            ["welcome"])["welcome"].startswith("invalid: body")


def test_measure_reads_cpu_and_memory_of_the_server_tree(threading_server):
    res = harness.measure(threading_server, "/plaintext", 1, 4, client="python")
    assert res["client"] == "python"
    assert res["requests"] > 0 and res["errors"] == 0 and res["non2xx"] == 0
    assert res["server_cpu_s"] > 0, "the server served requests, so it used CPU time"
    assert res["rss_peak_kib"] > 1000
    assert res["p50_ms"] is not None and res["p50_ms"] <= res["p99_ms"]


def test_parsers_read_wrk_and_hey_output():
    wrk = """Running 1s test @ http://127.0.0.1:1/plaintext
  1 threads and 64 connections
  Latency Distribution
     50%  310.00us
     75%  400.00us
     90%    1.20ms
     99%    5.00ms
  12345 requests in 1.00s, 1.50MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 7
Requests/sec:  12345.67
"""
    r = harness.parse_wrk(wrk)
    assert (r["rps"], r["requests"], r["p50_ms"], r["p99_ms"], r["errors"], r["non2xx"]) == \
        (12345.67, 12345, 0.31, 5.0, 3, 7)
    hey = """Summary:
  Requests/sec:\t4000.5
Latency distribution:
  10%% in 0.0010 secs
  50%% in 0.0020 secs
  99%% in 0.0150 secs
Status code distribution:
  [200]\t1990 responses
  [500]\t10 responses
"""
    r = harness.parse_hey(hey)
    assert (r["rps"], r["requests"], r["non2xx"]) == (4000.5, 2000, 10)
    assert r["p50_ms"] == pytest.approx(2.0) and r["p99_ms"] == pytest.approx(15.0)


def test_runner_writes_results_report_and_marks_cells(tmp_path, bench_python, capsys):
    from bench.http import run
    rc = run.main(["--quick", "--no-setup", "--client", "python", "--servers", "min-threading,lwan",
                   "--workloads", "plaintext,msgpack,welcome", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "skip lwan" in out or os.environ.get("LWAN_BIN")
    with open(tmp_path / "latest.json") as f:
        result = json.load(f)
    for key in ("started", "command", "machine", "config", "servers", "runs", "summary"):
        assert key in result
    assert result["config"]["pipelining"] is False
    info = result["servers"]["min-threading"]
    assert info["available"] and info["validation"]["plaintext"] == "ok"
    # Every Python server records the interpreter it ran on (here CYSERVE_BENCH_PYTHON's, this one).
    this = f"{platform.python_implementation()} {platform.python_version()}"
    assert info["python"].startswith(this) and result["bench_python"] == info["python"]
    assert result["servers"]["lwan"]["python"] is None
    try:
        import msgpack  # noqa: F401
    except ImportError:
        # Without msgpack the app answers 500: the cell is marked invalid, never measured.
        assert info["validation"]["msgpack"].startswith("invalid: status 500")
        assert not [r for r in result["runs"] if r["workload"] == "msgpack"]
    cells = [r for r in result["runs"] if r["server"] == "min-threading" and r["mode"] == "pinned"]
    assert {r["workload"] for r in cells} >= {"plaintext", "welcome"}
    for r in cells:
        assert r["requests"] > 0 and r["status"] == "ok"
        for k in ("rps", "p50_ms", "p99_ms", "server_cpu_s", "requests_per_cpu_s", "rss_peak_kib",
                  "round"):
            assert k in r
    fig = result["summary"]["pinned"]["plaintext"]["min-threading"]
    assert fig["rps"]["median"] > 0 and fig["pct_nginx"] is None  # no nginx in this run
    md = (tmp_path / "latest.md").read_text()
    assert "minimal: threading" in md and "/plaintext" in md
    assert f"- Python servers: {info['python']} (all)" in md
    assert f"| {info['python']} | ok" in md
    assert report.markdown(result) == md


def test_report_embeds_the_coroutine_table_whatever_its_shape():
    result = {"mode": "quick", "started": "2026-01-01T00:00:00+00:00", "command": "x", "git": "0",
              "elapsed_s": 1.0, "workloads": ["plaintext"], "runs": [], "servers": {},
              "machine": {"cpu": "c", "cores": 2, "memory": "1 GiB", "kernel": "k", "python": "3",
                          "tools": {}},
              "config": {"client": "wrk", "connections": 64, "rounds": 1, "duration_s": 1,
                         "warmup_s": 0, "hey": "hey -n 2000 -c 50", "scaling_workloads": []},
              "coro": {"unexpected": [1, 2]}}
    result["summary"] = report.summarize(result)
    md = report.markdown(result)
    assert "## Coroutines (bench/coro)" in md and '"unexpected"' in md
