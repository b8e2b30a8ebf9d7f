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

`--floor` measures beside each cell what the interpreters hold with no server at all: the same
app imported (cyserve with it), and the same Python work done by the same number of threads or
processes (each calls the routes' functions as many times as one worker serves them here); on
the free-threaded interpreter one process with N threads, on the GIL build a parent that forks
N children, as the supervisor forks its workers. The server's own memory is the cell less its
floor. `--detail` prints, for each process of a cell, its threads by name and its anonymous
memory by allocator (bench/common/procfs.anon_breakdown).

Each interpreter needs cyserve built for it in src/cyserve, and msgpack (for /json).
"""

import argparse
import collections
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import processes  # noqa: E402
from bench.common.procfs import (anon_breakdown_kib, process_tree, tree_pss_kib,  # noqa: E402
                                  tree_rss_kib)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APPS = {"wsgi": "bench.peers.python.wsgi_app:app", "py": "bench.http.apps.cyserve_py:app"}
# Each of the 4*N connections asks for every path PASSES times: each worker serves about
# 4 * PASSES of each path, which the floor's threads or children repeat.
PASSES = 5


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


# The floor: the app imported with cyserve and its extension (`import cyserve` alone does not
# load it), and the routes' work done by n threads that stay (one process), or by n forked
# children of the importing parent; "ready" on stdout once done, then every process waits for
# the end of its standard input.
FLOOR_SRC = """
import os, sys, threading, time, importlib
import cyserve._core
importlib.import_module(sys.argv[1].partition(":")[0])
from bench.peers.python.routes import handle
n, ft, reps, paths = int(sys.argv[2]), sys.argv[3] == "ft", int(sys.argv[4]), sys.argv[5].split(",")
def work():
    for _ in range(reps):
        for path in paths:
            if handle(path)[0] != 200:
                print(path + ": not a 200", file=sys.stderr, flush=True)
                os._exit(1)  # from a thread too: the whole floor fails
if ft:
    done = threading.Barrier(n + 1)
    def thread():
        work()
        done.wait()
        time.sleep(3600)
    for _ in range(n):
        threading.Thread(target=thread, daemon=True).start()
    done.wait()
elif n == 1:
    work()
else:
    for _ in range(n):
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(r)
            work()
            os.write(w, b"x")
            os.read(0, 1)
            os._exit(0)
        os.close(w)
        if os.read(r, 1) != b"x":
            sys.exit(1)  # the child failed
print("ready", flush=True)
os.read(0, 1)  # until the driver closes the pipe, or dies: nothing outlives it
"""


@contextlib.contextmanager
def floor_process(python, app, n, ft, paths, reps):
    """FLOOR_SRC's process tree, yielded (its root's Popen) once its work is done. Each thread or
    child calls each path's function reps times, as each worker serves it reps times, and stays
    alive, as workers do. The process model is the server's: one process of N threads on the
    free-threaded interpreter; on the GIL build one process for N=1 (`--processes 1` forks
    nothing) and else a parent that imported everything and N forked children. On leaving, the
    tree ends (each process at the end of its standard input; killed after 5 s)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + ROOT)
    proc = subprocess.Popen([python, "-c", FLOOR_SRC, APPS[app], str(n), "ft" if ft else "gil",
                             str(reps), ",".join(paths)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, cwd=ROOT, start_new_session=True)
    try:
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the floor's program failed ({python}, {app}, N={n})")
        yield proc
    finally:
        proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()


def floor(python, app, n, ft, paths, settle, reps):
    """(RSS, PSS) in KiB of the floor's process tree (floor_process) once its work is done."""
    with floor_process(python, app, n, ft, paths, reps) as proc:
        time.sleep(settle)
        return tree_rss_kib(proc.pid), tree_pss_kib(proc.pid)


def detail(root):
    """One line per process of root's tree: RSS, anonymous and file-backed, its threads by name,
    and its anonymous memory by allocator (KiB)."""
    lines = []
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                st = dict(line.split(":", 1) for line in f if ":" in line)
            names = collections.Counter()
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    names[f.read().strip()] += 1
        except OSError:
            continue
        split = {k: v for k, v in (anon_breakdown_kib(pid) or {}).items() if v}
        rss, anon, file = (st[k].split()[0] for k in ("VmRSS", "RssAnon", "RssFile"))
        lines.append(f"    pid {pid}: RSS {rss} (anon {anon}, file {file}); "
                     f"threads {dict(names)}; anon {split}")
    return "\n".join(lines)


def measure(python, app, n, ft, paths, settle, show_detail=False):
    port = processes.free_port()
    argv = [python, "-m", "cyserve", APPS[app], "--port", str(port)]
    argv += ["--threads", str(n)] if ft else ["--processes", str(n), "--threads", "1"]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + ROOT)
    with tempfile.TemporaryDirectory(prefix="cyserve-ftmem-") as tmp:
        run = processes.start_server(argv, port, os.path.join(tmp, "log"), env=env, cwd=ROOT)
        try:
            time.sleep(0.5 if ft else 1.0)  # the supervisor's workers all listening
            exercise(port, 4 * n, paths, PASSES)
            time.sleep(settle)
            if show_detail:
                print(detail(run.pid), flush=True)
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
    ap.add_argument("--floor", action="store_true",
                    help="also measure each cell's floor: no server, the same imports and work")
    ap.add_argument("--detail", action="store_true",
                    help="print each process's threads and anonymous memory by allocator")
    args = ap.parse_args(argv)
    ns = [int(x) for x in args.n.split(",")]
    paths = args.paths.split(",")
    kinds = ("server", "floor") if args.floor else ("server",)
    cells = [(app, n, ft, kind) for app in args.apps.split(",") for n in ns
             for ft in (True, False) for kind in kinds]
    results = {c: [] for c in cells}
    for r in range(args.rounds):
        for cell in cells[r % len(cells):] + cells[:r % len(cells)]:
            app, n, ft, kind = cell
            python = args.ft if ft else args.gil
            print(f"round {r} {app} N={n} {'ft 1 process' if ft else 'GIL processes'}"
                  f"{' (floor: no server)' if kind == 'floor' else ''}:", end=" ", flush=True)
            if kind == "floor":
                rss, pss = floor(python, app, n, ft, paths, args.settle, 4 * PASSES)
            else:
                if args.detail:
                    print(flush=True)
                rss, pss = measure(python, app, n, ft, paths, args.settle, args.detail)
            results[cell].append((rss, pss))
            print(f"RSS {rss} KiB, PSS {pss} KiB", flush=True)

    def med(app, n, ft, kind):
        rows = results[(app, n, ft, kind)]
        return (statistics.median(x for x, _ in rows) / 1024,
                statistics.median(y for _, y in rows) / 1024)

    print("\n| app | N | 3.14t, 1 process × N threads: RSS, PSS (MiB) | GIL build, N processes: "
          "RSS, PSS (MiB) | RSS ratio | PSS ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    summary = []
    for app in args.apps.split(","):
        for n in ns:
            f, g = med(app, n, True, "server"), med(app, n, False, "server")
            row = {"app": app, "n": n, "ft_rss_mib": round(f[0], 1), "ft_pss_mib": round(f[1], 1),
                   "gil_rss_mib": round(g[0], 1), "gil_pss_mib": round(g[1], 1)}
            print(f"| {app} | {n} | {f[0]:.1f}, {f[1]:.1f} | {g[0]:.1f}, {g[1]:.1f} | "
                  f"{f[0] / g[0]:.2f} | {f[1] / g[1]:.2f} |")
            if args.floor:
                ff, gf = med(app, n, True, "floor"), med(app, n, False, "floor")
                row.update(ft_floor_rss_mib=round(ff[0], 1), gil_floor_rss_mib=round(gf[0], 1))
            summary.append(row)
    if args.floor:
        print("\nThe floor (no server; the same imports and work), and the server's own part (the "
              "cell less its floor), RSS in MiB:\n")
        print("| app | N | 3.14t floor | GIL floor | floor ratio | 3.14t server − floor | "
              "GIL server − floor |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for row in summary:
            print(f"| {row['app']} | {row['n']} | {row['ft_floor_rss_mib']:.1f} | "
                  f"{row['gil_floor_rss_mib']:.1f} | "
                  f"{row['ft_floor_rss_mib'] / row['gil_floor_rss_mib']:.2f} | "
                  f"{row['ft_rss_mib'] - row['ft_floor_rss_mib']:.1f} | "
                  f"{row['gil_rss_mib'] - row['gil_floor_rss_mib']:.1f} |")
    print(json.dumps({"rounds": args.rounds, "paths": paths, "cells": summary}))

if __name__ == "__main__":
    main()
