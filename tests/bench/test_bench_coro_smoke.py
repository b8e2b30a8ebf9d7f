"""A tiny CI run of the coroutine benchmark (bench/coro/run.py, `make bench-coro`).

It runs the harness for real, with 2,000 coroutines and one round, on the systems that need
nothing installed (cyserve and asyncio; no Go, no bench/coro/.venv), and checks the JSON it
writes: the shape that docs and other tools read, and the values being real measurements. It
asserts no timing: the machine may be loaded, and speed is what `make bench-coro` reports.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "bench" / "coro" / "run.py"
FIGURES = ("spawn_s", "run_s", "total_s")
FIB_N = 1000
FIB_COROS = 200


def fib32(k):
    a, b = 0, 1
    for _ in range(k):
        a, b = b, (a + b) & 0xFFFFFFFF
    return a


def run_harness(tmp_path, env=None):
    out = tmp_path / "coro.json"
    proc = subprocess.run(
        [sys.executable, str(RUN), "--n", "2000", "--runs", "1",
         "--systems", "cyserve-1,cyserve-all,asyncio", "--scaling-systems", "cyserve",
         "--fib-n", str(FIB_N), "--fib-coros", str(FIB_COROS), "--parked-seconds", "0.2",
         "--retries", "0", "--no-install", "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    return proc, out


def assert_measured(entry):
    for key in FIGURES:
        value = entry[key]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    assert entry["available"] is True
    assert len(entry["runs"]) == 1
    assert entry["runs"][0]["attempts"] == 1
    assert 0 <= entry["others_cpu_share"] <= 1
    for key in FIGURES:
        assert entry["min"][key] == entry["max"][key] == entry[key]


def test_harness_writes_the_documented_json(tmp_path):
    proc, out = run_harness(tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())

    assert set(report) >= {"systems", "scaling", "parked", "ratios", "machine", "date",
                           "method"}
    assert list(report["systems"]) == ["cyserve-1", "cyserve-all", "asyncio"]
    assert report["machine"]["cpus_available"] >= 1
    assert report["method"]["runs"] == 1
    assert report["systems"]["asyncio"]["n"] == 2000
    assert_measured(report["systems"]["asyncio"])
    # The Markdown table is printed, one row per system asked for.
    for name in ("cyserve-1", "cyserve-all", "asyncio"):
        assert f"| {name} |" in proc.stdout

    scaling = report["scaling"]
    assert scaling["fib_n"] == FIB_N and scaling["coroutines"] == FIB_COROS
    assert scaling["expected_checksum"] == FIB_COROS * fib32(FIB_N)
    cyserve = scaling["systems"]["cyserve"]

    for name in ("cyserve-1", "cyserve-all"):
        assert_measured(report["systems"][name])
    assert report["systems"]["cyserve-1"]["workers"] == 1
    assert report["systems"]["cyserve-all"]["workers"] == report["machine"]["cpus_available"]
    assert isinstance(report["ratios"]["cyserve-all/asyncio"], float)
    assert scaling["checksum_ok"] is True
    assert cyserve["available"] is True
    assert [int(k) for k in cyserve["by_workers"]] == scaling["workers"]
    for k, entry in cyserve["by_workers"].items():
        assert entry["checksum"] == scaling["expected_checksum"], k
        assert entry["throughput"] > 0 and entry["speedup"] > 0
    assert cyserve["by_workers"]["1"]["speedup"] == 1.0
    parked = report["parked"]
    assert parked["available"] is True
    assert parked["cpu_s"] >= 0 and parked["wall_s"] > 0


def test_harness_reports_a_cyserve_without_benchmarks(tmp_path):
    # A cyserve package without the benchmark functions (an old build) shadows the real one:
    # the harness must say so in a clear line, write null figures and still measure the rest.
    fake = tmp_path / "fake" / "cyserve"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "_core.py").write_text("")
    env = dict(os.environ, PYTHONPATH=str(fake.parent))
    proc, out = run_harness(tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    for name in ("cyserve-1", "cyserve-all"):
        entry = report["systems"][name]
        assert entry["available"] is False
        assert entry["total_s"] is None
        assert "has no bench_empty() yet" in entry["reason"]
    assert report["scaling"]["systems"]["cyserve"]["available"] is False
    assert report["parked"]["available"] is False
    assert_measured(report["systems"]["asyncio"])
    assert "cyserve-1: not available" in proc.stderr


def test_harness_rejects_an_unknown_system(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(RUN), "--systems", "asyncio,nodejs", "--no-install",
         "--out", str(tmp_path / "x.json")],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2
    assert "unknown system 'nodejs'" in proc.stderr
    assert not (tmp_path / "x.json").exists()
