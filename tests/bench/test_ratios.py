"""bench/http/ratios.py: per-round ratios of one server's figures over another's, as the
metrics-cost A/B (docs/benchmarks.md, "Session 16") reads them: only rounds that measured both,
only cells that completed, in round order, with the median."""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench.http.ratios import main, pair_ratios  # noqa: E402


def run(rnd, server, rps, per, status="ok", mode="pinned"):
    return {"round": rnd, "mode": mode, "server": server, "workload": "plaintext",
            "status": status, "rps": rps, "requests_per_cpu_s": per}


RESULT = {"machine": {"loadavg_start": [1.0, 1.0, 1.0], "loadavg_end": [2.0, 2.0, 2.0]},
          "runs": [run(0, "a", 90.0, 80.0), run(0, "b", 100.0, 100.0),
                   run(1, "a", 110.0, 99.0), run(1, "b", 100.0, 90.0),
                   run(2, "a", 50.0, 50.0),  # b was not measured in round 2
                   run(3, "a", 100.0, 100.0), run(3, "b", 100.0, 100.0, status="invalid"),
                   run(4, "a", 1.0, 1.0, mode="allcore"), run(4, "b", 2.0, 2.0, mode="allcore")]}


def test_pair_ratios_take_rounds_that_measured_both():
    got = pair_ratios(RESULT, "a", "b")
    assert list(got) == ["plaintext"]
    row = got["plaintext"]
    assert row["rounds"] == [0, 1]
    assert row["rps"] == [0.9, 1.1]
    assert row["cpu"] == [0.8, 1.1]
    assert pair_ratios(RESULT, "a", "b", mode="allcore")["plaintext"]["rps"] == [0.5]
    assert pair_ratios(RESULT, "a", "c") == {}


def test_main_prints_every_round_and_the_median(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(RESULT))
    assert main([str(path), "a", "b"]) == 0
    out = capsys.readouterr().out
    assert "load average at start [1.0, 1.0, 1.0]" in out
    assert "/plaintext requests/s: median 1.000 (0.900 1.100)" in out
    assert "/plaintext per server CPU-second: median 0.950 (0.800 1.100)" in out
    assert main([str(path), "a", "c"]) == 1
