"""Resident memory of a server holding many idle keep-alive connections (docs/benchmarks.md).

For each server: start it (pinned like the suite's primary mode when --cpus is given), read the
RSS of its whole process tree, open N connections that each send one keep-alive GET and read the
answer, so every connection has been served and is now idle, wait, read the RSS again, close.
The figure is the growth per idle connection. Servers run one after the other, in rounds, and
the median over rounds is reported.

    .venv/bin/python bench/http/idle_memory.py --servers cyserve-static,go-nethttp --conns 1000
"""

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import processes  # noqa: E402
from bench.common.procfs import tree_rss_kib  # noqa: E402
from bench.http import harness  # noqa: E402
from bench.http import servers as S  # noqa: E402


def open_idle(port, n, path="/plaintext"):
    conns = []
    req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(req)
        conns.append(s)
    for s in conns:  # every connection answered, so each one is idle on the server now
        s.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                raise RuntimeError("server closed a connection")
            data += chunk
    return conns


def measure(server, conns, threads, cpus, settle):
    port = processes.free_port()
    with tempfile.TemporaryDirectory(prefix="cyserve-idle-") as tmp:
        argv, env, cleanup = server.command(port, threads, tmp)
        run = processes.start_server(argv, port, os.path.join(tmp, "log"), env=env, cpus=cpus,
                                     cleanup=cleanup)
        try:
            harness.http_get(port, "/plaintext")  # warm: first request served, caches made
            time.sleep(settle)
            before = tree_rss_kib(run.pid)
            socks = open_idle(port, conns)
            time.sleep(settle)
            after = tree_rss_kib(run.pid)
            for s in socks:
                s.close()
        finally:
            run.stop()
    return before, after


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="cyserve-static,cyserve-nogil,go-nethttp,go-fasthttp,nginx")
    ap.add_argument("--conns", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpus", default="0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=1.0)
    args = ap.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.conns + 256)), hard))
    by_name = {s.name: s for s in S.SERVERS}
    names = args.servers.split(",")
    results = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order
            before, after = measure(by_name[name], args.conns, args.threads, args.cpus,
                                    args.settle)
            results[name].append((before, after))
            print(f"round {r} {name:16s} rss {before} KiB -> {after} KiB "
                  f"({(after - before) * 1024 / args.conns:.0f} B per idle connection)",
                  flush=True)
    summary = {}
    print(f"\n| server | RSS before (KiB) | RSS with {args.conns} idle (KiB) | per idle conn (B) |")
    print("|---|---:|---:|---:|")
    for name, rows in results.items():
        b = statistics.median(x for x, _ in rows)
        a = statistics.median(y for _, y in rows)
        per = statistics.median((y - x) * 1024 / args.conns for x, y in rows)
        summary[name] = {"rss_before_kib": b, "rss_idle_kib": a, "bytes_per_conn": per}
        print(f"| {name} | {b:.0f} | {a:.0f} | {per:.0f} |")
    print(json.dumps({"conns": args.conns, "threads": args.threads, "rounds": args.rounds,
                      "servers": summary}))


if __name__ == "__main__":
    main()
