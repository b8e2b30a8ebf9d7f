"""Threads per worker process under --processes (docs/benchmarks.md, "Threads per worker process").

`cyserve APP --processes P --threads T` for each T given, for a WSGI app, a Python handler and a
static route, each on /plaintext: the server unpinned (its processes spread over the machine),
wrk pinned to CPU 1 as bench/http/run.py pins it (-t1 -c64, keep-alive, no pipelining), a
one-second warm-up, then one cell of --duration seconds. Cells are interleaved: each round visits
every (app, T) once, in an order rotated per round, and the summary takes medians with min-max.
Requests per server CPU-second count the supervisor and its workers (/proc); each worker's thread
count and RSS are read once its load has ended. The machine's load average is printed, since
the figures mean little on a machine that other work keeps busy.

    .venv/bin/python bench/http/threads_per_process.py --processes 2 --threads 1,2 --rounds 5
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from bench.common.processes import free_port, wait_port  # noqa: E402
from bench.common.procfs import process_tree  # noqa: E402
from bench.http import harness  # noqa: E402

APPS = {"wsgi": "bench.peers.python.wsgi_app:app",
        "python-handler": "bench.http.apps.cyserve_py:app",
        "static": "bench.http.apps.cyserve_static_app:app"}
CONNECTIONS = 64
CLIENT_CPU = "1"


def _status(pid):
    """(threads, RSS in KiB) of one process."""
    found = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Threads", "VmRSS"):
                found[key] = int(value.split()[0])
    return found["Threads"], found["VmRSS"]


class _Run:
    def __init__(self, pid, port):
        self.pid, self.port = pid, port


def cell(app, processes, threads, duration):
    port = free_port()
    argv = [sys.executable, "-m", "cyserve", APPS[app], "--port", str(port), "--processes",
            str(processes), "--threads", str(threads), "--no-access-log", "--log-level",
            "warning"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), ROOT]))
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        if not wait_port(port, proc, 60):
            raise SystemExit(f"{app}: the server did not start")
        time.sleep(1.0)  # every worker listening, not only the first
        harness.run_wrk(port, "/plaintext", 1, CONNECTIONS, 1, CLIENT_CPU)  # warm-up
        res = harness.measure(_Run(proc.pid, port), "/plaintext", duration, CONNECTIONS,
                              client_cpus=CLIENT_CPU)
        res["workers"] = [_status(pid) for pid in process_tree(proc.pid) if pid != proc.pid]
        return res
    finally:
        proc.terminate()
        proc.wait(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--threads", default="1,2", help="thread counts to compare, by commas")
    ap.add_argument("--apps", default=",".join(APPS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=int, default=5)
    args = ap.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    cells = [(a, t) for a in args.apps.split(",") for t in counts]
    results = {c: [] for c in cells}
    load = []
    for rnd in range(args.rounds):
        for app, threads in cells[rnd % len(cells):] + cells[:rnd % len(cells)]:
            load.append(os.getloadavg()[0])
            res = cell(app, args.processes, threads, args.duration)
            results[(app, threads)].append(res)
            print(f"round {rnd} {app} threads={threads}: {res['rps']:.0f} req/s, "
                  f"{res['requests_per_cpu_s'] or 0:.0f} per CPU-s, errors {res['errors']}, "
                  f"non-2xx {res['non2xx']}, (threads, RSS KiB) per worker {res['workers']}",
                  flush=True)
    print(f"load average (1 min) at each cell's start: min {min(load):.2f}, median "
          f"{statistics.median(load):.2f}, max {max(load):.2f}")
    for app in args.apps.split(","):
        for threads in counts:
            rs = results[(app, threads)]
            rps = [r["rps"] for r in rs]
            per = [r["requests_per_cpu_s"] or 0 for r in rs]
            workers = [w for r in rs for w in r["workers"]]
            print(f"{app} --processes {args.processes} --threads {threads}: req/s "
                  f"{statistics.median(rps):.0f} ({min(rps):.0f}-{max(rps):.0f}), per CPU-s "
                  f"{statistics.median(per):.0f} ({min(per):.0f}-{max(per):.0f}), threads per "
                  f"worker {statistics.median(w[0] for w in workers):.0f}, RSS per worker "
                  f"{statistics.median(w[1] for w in workers) / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
