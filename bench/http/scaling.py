"""Multi-core scaling: requests/s against the number of cores a server is given, 1, 2, 4, 8...

This needs a machine with at least twice as many cores as the largest point (the 2-core
development machine shows only the 1-core point; the figures in docs/benchmarks.md come from a
16-core machine). Method:
- The server is pinned (taskset) to CPUs 0..N-1 and told to use N: cyserve N worker threads for
  the static and GIL-free routes, N processes of one thread for Python handlers, WSGI and ASGI
  (one GIL each, as in the suite's all-core mode); Go GOMAXPROCS=N; nginx N worker processes.
- wrk runs on the other half of the machine, with one thread per CPU there and a fixed number of
  connections (keep-alive, no pipelining), so the client's capacity is the same at every point.
- Rounds interleave the servers; each cell reports the median of the rounds. Besides requests/s
  it reports requests per server CPU-second and how many of its N cores the server kept busy:
  where that is well under N, the client (or the server's design) is the limit, and the table
  says so rather than hiding it.

    python -m bench.http.scaling --threads 1,2,4,8 --rounds 3 --duration 3 --out DIR

Stdlib only; uses the suite's servers (bench/http/servers.py) and harness. It builds nothing: run
`make bench` (or bench/http/run.py) once first so the peers and the GIL-free handlers exist.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from bench.common import interpreter, processes
from bench.http import harness
from bench.http import servers as S
from bench.http import workloads as W

DEFAULT_SERVERS = ("cyserve-static", "cyserve-nogil", "cyserve-py", "cyserve-wsgi", "cyserve-asgi",
                   "go-fasthttp", "go-nethttp", "nginx")
# /fib is CPU-bound (a million iterations per request), so it scales with cores even where
# /plaintext is limited by the client; Python handlers take ~80 ms a request there, too slow
# for a cell of a few seconds to say much, so /fib is measured on the compiled servers only.
FIB_SERVERS = ("cyserve-nogil", "go-fasthttp", "go-nethttp")


def say(msg):
    print(msg, flush=True)


def cpu_list(first, count):
    return f"{first}-{first + count - 1}" if count > 1 else str(first)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2,4,8", help="comma-separated core counts")
    ap.add_argument("--servers", default=",".join(DEFAULT_SERVERS))
    ap.add_argument("--workloads", default="plaintext,fib")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=3, help="seconds per wrk cell")
    ap.add_argument("--connections", type=int, default=128)
    ap.add_argument("--out", default=os.path.join(S.BENCH, "results"))
    args = ap.parse_args(argv)

    cores = os.cpu_count() or 1
    points = [int(t) for t in args.threads.split(",")]
    client_cpus = max(1, cores // 2)
    points = [n for n in points if n <= cores - client_cpus]
    if not points:
        say(f"scaling: {cores} CPUs leave no room for the server beside a client on {client_cpus}")
        return 1
    client = cpu_list(cores - client_cpus, client_cpus)
    chosen = [S.BY_NAME[n] for n in args.servers.split(",")]
    wanted = args.workloads.split(",")
    expected = W.expected_bodies()
    os.makedirs(args.out, exist_ok=True)
    out_json = os.path.join(args.out, "scaling.json")
    say(f"scaling: {cores} CPUs; server on CPUs 0..N-1 for N in {points}; wrk -t{client_cpus} "
        f"-c{args.connections} on CPUs {client}; {args.rounds} rounds of {args.duration} s")
    runs = []
    meta = {"cores": cores, "points": points, "client_cpus": client, "connections": args.connections,
            "rounds": args.rounds, "duration": args.duration, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            # The interpreter of every Python server here (bench/.venv's, as run.py made it).
            "python": interpreter.label(interpreter.describe(S.VENV_PY))}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cyserve-scaling-") as tmp:
        for rnd in range(1, args.rounds + 1):
            for server in chosen:
                work = [w for w in wanted if w in server.workloads
                        and (w != "fib" or server.name in FIB_SERVERS)]
                for n in points:
                    port = processes.free_port()
                    argv, env, cleanup = server.command(port, n, tmp)
                    if server.group == "go":
                        env = dict(os.environ, GOMAXPROCS=str(n))
                    log = os.path.join(tmp, f"{server.name}-{n}.log")
                    try:
                        run = processes.start_server(argv, port, log, env=env, cwd=S.ROOT,
                                                     cpus=cpu_list(0, n), cleanup=cleanup)
                    except RuntimeError as e:
                        say(f"  {server.name} N={n}: failed to start: {e}")
                        continue
                    try:
                        valid = harness.validate(port, expected, work)
                        for w in work:
                            if valid[w] != "ok":
                                say(f"  {server.name} /{w}: {valid[w]}")
                                continue
                            if w != "fib":  # a short warm-up: connections, caches, lazy imports
                                harness.run_wrk(port, "/" + w, 1, args.connections, client_cpus, client)
                            res = harness.measure(run, "/" + w, args.duration, args.connections,
                                                  client_threads=client_cpus, client_cpus=client)
                            if res.get("requests"):
                                res.pop("raw", None)  # wrk's text is kept only where a cell failed
                            busy = res["server_cpu_s"] / args.duration
                            rec = {"round": rnd, "server": server.name, "workload": w, "n": n,
                                   "busy_cores": round(busy, 2), **res}
                            runs.append(rec)
                            say(f"[{time.monotonic() - t0:6.1f}s] r{rnd} {server.name:<15} N={n:<2} "
                                f"/{w:<9} {res['rps']:>10.0f} req/s  busy {busy:4.1f} cores  "
                                f"p99 {res['p99_ms'] or 0:.1f} ms")
                            # Written after every cell: a run cut short keeps what it measured.
                            with open(out_json, "w") as f:
                                json.dump({"meta": meta, "runs": runs}, f, indent=1)
                    finally:
                        run.stop()
    md = report(meta, runs)
    with open(os.path.join(args.out, "scaling.md"), "w") as f:
        f.write(md)
    say(md)
    return 0


def report(meta, runs):
    """Markdown: per workload, one row per server, one column per N: median req/s (speed-up over
    N=1) and the median busy cores."""
    lines = [f"Scaling on {meta['cores']} CPUs: server on CPUs 0..N-1, wrk -c{meta['connections']} on "
             f"CPUs {meta['client_cpus']}; median of {meta['rounds']} rounds of {meta['duration']} s; "
             "cell: req/s (× N=1) [busy cores]" + (f"; Python servers on {meta['python']}" if meta.get("python") else ""),
             ""]
    for w in sorted({r["workload"] for r in runs}, key=W.WORKLOADS.index):
        pts = meta["points"]
        lines += [f"### /{w}", "", "| server | " + " | ".join(f"N={n}" for n in pts) + " |",
                  "|---|" + "---|" * len(pts)]
        for server in dict.fromkeys(r["server"] for r in runs if r["workload"] == w):
            cells, base = [], None
            for n in pts:
                rs = [r for r in runs if r["server"] == server and r["workload"] == w and r["n"] == n]
                if not rs:
                    cells.append("–")
                    continue
                rps = statistics.median(r["rps"] for r in rs)
                busy = statistics.median(r["busy_cores"] for r in rs)
                base = base or (rps if n == pts[0] else None)
                up = f" (×{rps / base:.2f})" if base else ""
                cells.append(f"{rps / 1000:.{0 if rps >= 10000 else 2}f}k{up} [{busy:.1f}]")
            lines.append(f"| {server} | " + " | ".join(cells) + " |")
        lines += ["", f"/{w}, thousands of requests per server CPU-second (median):", "",
                  "| server | " + " | ".join(f"N={n}" for n in pts) + " |", "|---|" + "---|" * len(pts)]
        for server in dict.fromkeys(r["server"] for r in runs if r["workload"] == w):
            cells = []
            for n in pts:
                per = [r["requests_per_cpu_s"] for r in runs if r["server"] == server
                       and r["workload"] == w and r["n"] == n and r.get("requests_per_cpu_s")]
                cells.append(f"{statistics.median(per) / 1000:.1f}" if per else "–")
            lines.append(f"| {server} | " + " | ".join(cells) + " |")
        lines.append("")
        mem = [r for r in runs if r["workload"] == w and r.get("rss_final_kib")]
        if mem:
            lines += [f"/{w}, memory of the server's process tree, MiB: peak during the cell / "
                      "once it ended [threads then] (median):", "",
                      "| server | " + " | ".join(f"N={n}" for n in pts) + " |",
                      "|---|" + "---|" * len(pts)]
            for server in dict.fromkeys(r["server"] for r in mem):
                cells = []
                for n in pts:
                    rs = [r for r in mem if r["server"] == server and r["n"] == n]
                    if not rs:
                        cells.append("–")
                        continue
                    peak = statistics.median(r["rss_peak_kib"] for r in rs) / 1024
                    final = statistics.median(r["rss_final_kib"] for r in rs) / 1024
                    threads = statistics.median(r.get("threads_final") or 0 for r in rs)
                    cells.append(f"{peak:.0f} / {final:.0f} [{threads:.0f}]")
                lines.append(f"| {server} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
