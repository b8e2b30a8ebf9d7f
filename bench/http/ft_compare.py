"""Free-threaded against GIL build: one cyserve process with 1 and N worker threads, Python
handlers (bench/http/apps/cyserve_py.py) and the WSGI peers' app, on each interpreter given.

    python -m bench.http.ft_compare --python gil=.venv/bin/python \\
        --python ft=.venv-3.14t/bin/python --threads 1,2 --workloads plaintext,loop

Each interpreter needs cyserve built for it in src/cyserve (make build, make test-ft) and msgpack
for /json and /msgpack. Rounds interleave every cell; a cell is one server started, a 1 s warm-up
and a wrk run; it reports requests/s and requests per server CPU-second (the server process's
user + system time over the run), medians over the rounds. On a machine where wrk shares the
CPUs with the server (the 2-core development machine), requests/s depends on how the two share
them: read requests per CPU-second there, and scaling on a machine with cores to spare
(bench/http/scaling.py with CYSERVE_BENCH_PYTHON_FT).
"""

import argparse
import os
import statistics
import sys
import tempfile

from bench.common import processes
from bench.http import harness
from bench.http import servers as S

APPS = {"py": "bench.http.apps.cyserve_py:app", "wsgi": "bench.peers.python.wsgi_app:app",
        "asgi": "bench.peers.python.asgi_app:app"}
# A CPU-bound route takes tens of ms a request: a few connections keep every worker busy.
CONNECTIONS = {"plaintext": 32, "json": 8, "msgpack": 8, "loop": 4}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", action="append", required=True, metavar="LABEL=PATH")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--apps", default="py,wsgi")
    ap.add_argument("--workloads", default="plaintext,loop")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=3)
    ap.add_argument("--wrk-threads", type=int, default=1)
    args = ap.parse_args(argv)
    pythons = dict(p.split("=", 1) for p in args.python)
    threads = [int(t) for t in args.threads.split(",")]
    cells = {}
    with tempfile.TemporaryDirectory(prefix="cyserve-ft-") as tmp:
        for rnd in range(args.rounds):
            for label, py in pythons.items():
                for app in args.apps.split(","):
                    for n in threads:
                        port = processes.free_port()
                        argv_ = [py, "-m", "cyserve", APPS[app], "--host", "127.0.0.1",
                                 "--port", str(port), "--threads", str(n)]
                        if app == "asgi":  # a loop per worker thread: one would be the limit
                            argv_ += ["--asgi-loops", "thread"]
                        run = processes.start_server(argv_, port, os.path.join(tmp, "log"),
                                                     env=S.py_env(), cwd=S.ROOT)
                        try:
                            for w in args.workloads.split(","):
                                c = CONNECTIONS.get(w, 8)
                                harness.run_wrk(port, "/" + w, 1, c, args.wrk_threads)
                                res = harness.measure(run, "/" + w, args.duration, c,
                                                      client_threads=args.wrk_threads)
                                key = (w, app, label, n)
                                cells.setdefault(key, []).append(res)
                                print(f"r{rnd + 1} {label:<5} {app:<5} threads={n} /{w:<9} "
                                      f"{res['rps']:>9.0f} req/s  "
                                      f"{res['requests_per_cpu_s'] or 0:>9.0f} req/CPU-s  "
                                      f"cpu {res['server_cpu_s']:.2f} s", flush=True)
                        finally:
                            run.stop()
    print()
    print("| route | app | interpreter | " + " | ".join(f"threads={n}: req/s, req/CPU-s"
                                                    for n in threads) + " |")
    print("|---|---|---|" + "---|" * len(threads))
    for w in args.workloads.split(","):
        for app in args.apps.split(","):
            for label in pythons:
                row = []
                for n in threads:
                    rs = cells.get((w, app, label, n), [])
                    rps = statistics.median(r["rps"] for r in rs) if rs else 0
                    per = [r["requests_per_cpu_s"] for r in rs if r["requests_per_cpu_s"]]
                    row.append(f"{rps:,.0f}, {statistics.median(per):,.0f}" if per
                               else f"{rps:,.0f}, –")
                print(f"| /{w} | {app} | {label} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
