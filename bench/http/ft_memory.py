"""Resident memory of one free-threaded process with N worker threads against N processes of a
GIL build, serving the same application (docs/benchmarks.md, "Free-threaded CPython").

For each N and each interpreter: start `cyserve APP --threads N` on the free-threaded one and
`cyserve APP --processes N --threads 1` on the GIL build, send every route of a list through
4×N keep-alive connections (so that every worker thread or process has run the app), wait,
and read the memory of the whole process tree (the supervisor included): the sum of RSS, which
counts pages forked processes share once per process, and the sum of PSS, which counts them
once in all (the fairer figure for N processes). Rounds rotate the order;
medians are reported. RSS does not depend on how busy the machine is, so a shared 2-core
machine gives the same figures as a quiet one.

    python -m bench.http.ft_memory --ft .venv-3.14t/bin/python --gil .venv/bin/python \\
        --n 2,4,8 --rounds 3

Each interpreter needs cyserve built for it in src/cyserve, and msgpack (for /json).
"""

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import processes  # noqa: E402
from bench.common.procfs import tree_pss_kib, tree_rss_kib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APPS = {"wsgi": "bench.peers.python.wsgi_app:app", "py": "bench.http.apps.cyserve_py:app"}


def exercise(port, conns, paths, per_conn):
    """Send each path per_conn times on each of conns keep-alive connections; every answer is
    read whole (Content-Length) and must be a 200."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(conns)]
    try:
        for _ in range(per_conn):
            for path in paths:
                req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
                for s in socks:
                    s.sendall(req)
                for s in socks:
                    buf = b""
                    while b"\r\n\r\n" not in buf:
                        chunk = s.recv(65536)
                        if not chunk:
                            raise RuntimeError(f"{path}: connection closed")
                        buf += chunk
                    head, _, rest = buf.partition(b"\r\n\r\n")
                    if not head.startswith(b"HTTP/1.1 200"):
                        raise RuntimeError(f"{path}: {head[:40]!r}")
                    n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    while len(rest) < n:
                        rest += s.recv(65536)
    finally:
        for s in socks:
            s.close()


def measure(python, app, n, ft, paths, settle):
    port = processes.free_port()
    argv = [python, "-m", "cyserve", APPS[app], "--port", str(port)]
    argv += ["--threads", str(n)] if ft else ["--processes", str(n), "--threads", "1"]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + ROOT)
    with tempfile.TemporaryDirectory(prefix="cyserve-ftmem-") as tmp:
        run = processes.start_server(argv, port, os.path.join(tmp, "log"), env=env, cwd=ROOT)
        try:
            time.sleep(0.5 if ft else 1.0)  # the supervisor's workers all listening
            exercise(port, 4 * n, paths, 5)
            time.sleep(settle)
            return tree_rss_kib(run.pid), tree_pss_kib(run.pid)
        finally:
            run.stop()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ft", required=True, help="the free-threaded interpreter")
    ap.add_argument("--gil", required=True, help="an interpreter of a GIL build")
    ap.add_argument("--n", default="2,4,8")
    ap.add_argument("--apps", default="wsgi,py")
    ap.add_argument("--paths", default="/plaintext,/json")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=1.0)
    args = ap.parse_args(argv)
    ns = [int(x) for x in args.n.split(",")]
    paths = args.paths.split(",")
    cells = [(app, n, ft) for app in args.apps.split(",") for n in ns for ft in (True, False)]
    results = {c: [] for c in cells}
    for r in range(args.rounds):
        for cell in cells[r % len(cells):] + cells[:r % len(cells)]:
            app, n, ft = cell
            rss, pss = measure(args.ft if ft else args.gil, app, n, ft, paths, args.settle)
            results[cell].append((rss, pss))
            print(f"round {r} {app} N={n} {'ft 1 process' if ft else 'GIL processes'}: "
                  f"RSS {rss} KiB, PSS {pss} KiB", flush=True)
    print("\n| app | N | 3.14t, 1 process × N threads: RSS, PSS (MiB) | GIL build, N processes: "
          "RSS, PSS (MiB) | ratio of PSS |")
    print("|---|---:|---:|---:|---:|")
    summary = []
    for app in args.apps.split(","):
        for n in ns:
            med = {}
            for ft in (True, False):
                rows = results[(app, n, ft)]
                med[ft] = (statistics.median(x for x, _ in rows) / 1024,
                           statistics.median(y for _, y in rows) / 1024)
            summary.append({"app": app, "n": n, "ft_rss_mib": round(med[True][0], 1),
                            "ft_pss_mib": round(med[True][1], 1),
                            "gil_rss_mib": round(med[False][0], 1),
                            "gil_pss_mib": round(med[False][1], 1)})
            print(f"| {app} | {n} | {med[True][0]:.1f}, {med[True][1]:.1f} | "
                  f"{med[False][0]:.1f}, {med[False][1]:.1f} | {med[True][1] / med[False][1]:.2f} |")
    print(json.dumps({"rounds": args.rounds, "paths": paths, "cells": summary}))


if __name__ == "__main__":
    main()
