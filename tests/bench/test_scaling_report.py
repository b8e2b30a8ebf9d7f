"""bench/http/scaling.py's table: medians over rounds, the speed-up over the first point, the
busy cores, requests per server CPU-second, and a dash for a point that was never measured.
The driver itself needs a machine of at least twice the largest point's cores (and wrk); its
table is what docs/benchmarks.md quotes, so that is what is checked here."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench.http.scaling import report  # noqa: E402


def run(rnd, server, n, rps, busy, per):
    return {"round": rnd, "server": server, "workload": "plaintext", "n": n, "rps": rps,
            "busy_cores": busy, "requests_per_cpu_s": per}


def test_report_medians_speedups_and_missing_points():
    meta = {"cores": 16, "points": [1, 2], "client_cpus": "8-15", "connections": 128,
            "rounds": 3, "duration": 2}
    runs = [run(1, "a", 1, 100_000, 1.0, 90_000), run(2, "a", 1, 120_000, 1.1, 100_000),
            run(3, "a", 1, 500_000, 0.9, 80_000),  # an outlier round: the median ignores it
            run(1, "a", 2, 230_000, 2.0, 95_000), run(2, "a", 2, 250_000, 2.1, 99_000),
            run(3, "a", 2, 240_000, 1.9, 97_000),
            run(1, "b", 1, 5_000, 1.0, 4_900)]
    md = report(meta, runs)
    assert "median of 3 rounds of 2 s" in md
    assert "| a | 120k (×1.00) [1.0] | 240k (×2.00) [2.0] |" in md
    assert "| b | 5.00k (×1.00) [1.0] | – |" in md
    assert "| a | 90.0 | 97.0 |" in md
    assert "| b | 4.9 | – |" in md


def test_report_names_the_interpreter_when_recorded():
    meta = {"cores": 4, "points": [1], "client_cpus": "2-3", "connections": 128, "rounds": 1,
            "duration": 1}
    runs = [run(1, "a", 1, 100_000, 1.0, 90_000)]
    assert "Python servers on" not in report(meta, runs)  # a file from before it was recorded
    assert "; Python servers on CPython 3.12.1" in report(dict(meta, python="CPython 3.12.1"), runs)


def test_report_shows_peak_and_final_memory_with_threads_when_recorded():
    meta = {"cores": 16, "points": [1, 8], "client_cpus": "8-15", "connections": 64,
            "rounds": 3, "duration": 2}
    runs = []
    for rnd, (peak, final, threads) in enumerate([(264, 250, 26), (64, 60, 10), (160, 150, 18)]):
        r = run(rnd + 1, "a", 8, 3000, 8.0, 400)
        r.update(rss_peak_kib=peak * 1024, rss_final_kib=final * 1024, threads_final=threads)
        runs.append(r)
    runs.append(run(1, "a", 1, 500, 1.0, 500))  # a cell from before memory was recorded
    md = report(meta, runs)
    assert "peak during the cell / once it ended [threads then]" in md
    assert "| a | – | 160 / 150 [18] |" in md
    assert "memory of" not in report(meta, runs[-1:])  # nothing recorded: no table
