"""A server's memory over time under load: RSS, PSS and where the anonymous memory lives.

What grows in one process of N threads while it serves, and whether it comes back: the server is
started (cyserve by default, `--threads N`), loaded with wrk on each path for `--duration`
seconds, then left idle for `--idle` seconds, while a sampler reads every `--interval` seconds
VmRSS (/proc/PID/status), Pss and Anonymous (smaps_rollup) and the anonymous memory split by
allocator (bench/common/procfs.anon_breakdown: mimalloc's arenas, glibc's main arena and its
per-thread arenas, thread and coroutine stacks, the rest). Variants (`--variant NAME:K=V,K=V`,
repeatable) run the same server with other environment variables (PYTHON_GIL, MALLOC_ARENA_MAX,
mimalloc's MIMALLOC_* options, CYSERVE_<OPTION>) in interleaved rounds, so that a knob is measured against the
same load.

    python -m bench.http.rss_timeline --python .venv-3.14t/bin/python --threads 8 \\
        --paths /json,/plaintext --duration 20 --variant base: --variant arena2:MALLOC_ARENA_MAX=2

Memory, unlike throughput, does not depend much on how busy the machine is: on a 2-core machine
eight threads are oversubscribed, but they allocate in the same pattern. Stdlib only.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

from bench.common import processes
from bench.common.procfs import ANON_KINDS, anon_breakdown_kib, rss_pss_kib
from bench.http import harness
from bench.http import servers as S


def sample(pid):
    """One sample of pid's memory in KiB, or None if it is gone."""
    base = rss_pss_kib(pid)
    split = anon_breakdown_kib(pid)
    if base is None or split is None:
        return None
    return {"rss": base[0], "pss": base[1], "anon": base[2], **split}


class Sampler:
    """Samples pid every interval seconds in a thread, each sample tagged with a phase."""

    def __init__(self, pid, interval):
        self.pid, self.interval, self.phase, self.samples = pid, interval, "start", []
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            s = sample(self.pid)
            if s is not None:
                s.update(t=round(time.monotonic() - self._t0, 2), phase=self.phase)
                self.samples.append(s)
            if self._stop.wait(self.interval):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def summarise(samples, phase):
    """{field: (first, peak, last)} over the samples of one phase."""
    rows = [s for s in samples if s["phase"] == phase]
    if not rows:
        return {}
    return {k: (rows[0][k], max(r[k] for r in rows), rows[-1][k])
            for k in ("rss", "pss", "anon") + ANON_KINDS}


def run_once(args, variant, env_extra, tmp):
    port = processes.free_port()
    env = S.py_env()
    env["PYTHONPATH"] += os.pathsep + S.BUILD
    if args.pythonpath:
        env["PYTHONPATH"] += os.pathsep + args.pythonpath
    env.update(env_extra)
    argv = [args.python, "-m", "cyserve", args.app, "--host", "127.0.0.1", "--port", str(port),
            "--threads", str(args.threads)] + args.extra.split()
    log = os.path.join(args.log_dir or tmp, f"{variant}-{port}.log")
    run = processes.start_server(argv, port, log, env=env, cwd=S.ROOT, cpus=args.cpus or None)
    out = {"variant": variant, "env": env_extra, "paths": {}}
    try:
        with Sampler(run.pid, args.interval) as smp:
            time.sleep(args.interval * 2)
            for path in args.paths.split(","):
                smp.phase = path
                res = harness.run_wrk(port, path, args.duration, args.connections, args.client_threads,
                                      args.client_cpus or None)
                res.pop("raw", None)
                smp.phase = path + " idle"
                time.sleep(args.idle)
                out["paths"][path] = {"rps": res.get("rps"), "requests": res.get("requests"),
                                      "errors": res.get("errors"),
                                      "load": summarise(smp.samples, path),
                                      "idle": summarise(smp.samples, path + " idle")}
        out["samples"] = smp.samples
    finally:
        run.stop()
    return out


def mib(kib):
    return f"{kib / 1024:.0f}"


def report(results, paths):
    lines = ["Peak during the load / last sample after the idle spell, MiB (medians over rounds):", ""]
    cols = ("rss", "pss") + ANON_KINDS
    lines.append("| variant | path | requests | " + " | ".join(cols) + " |")
    lines.append("|---|---|---:|" + "---:|" * len(cols))
    for variant in dict.fromkeys(r["variant"] for r in results):
        for path in paths:
            rs = [r["paths"][path] for r in results if r["variant"] == variant and path in r["paths"]]
            rs = [r for r in rs if r["load"] and r["idle"]]
            if not rs:
                continue
            cells = [f"{mib(statistics.median(r['load'][c][1] for r in rs))} / "
                     f"{mib(statistics.median(r['idle'][c][2] for r in rs))}" for c in cols]
            reqs = statistics.median(r["requests"] or 0 for r in rs)
            lines.append(f"| {variant} | {path} | {reqs:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_variant(text):
    name, _, rest = text.partition(":")
    env = {}
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        env[k] = v
    return name or "base", env


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=S.FT_PY, help="the server's interpreter")
    ap.add_argument("--pythonpath", default="", help="more PYTHONPATH for the server (msgpack's)")
    ap.add_argument("--app", default="bench.http.apps.cyserve_py:app")
    ap.add_argument("--extra", default="", help="more server options, space-separated")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--paths", default="/json,/plaintext")
    ap.add_argument("--duration", type=int, default=20, help="seconds of wrk per path")
    ap.add_argument("--idle", type=float, default=3.0, help="seconds sampled idle after each path")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--client-threads", type=int, default=2)
    ap.add_argument("--cpus", default="", help="pin the server to these CPUs (taskset -c)")
    ap.add_argument("--client-cpus", default="", help="pin wrk to these CPUs")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variant", action="append", default=[], help="NAME:K=V,K=V (repeatable)")
    ap.add_argument("--out", default="", help="write every sample here as JSON")
    ap.add_argument("--log-dir", default="", help="keep the servers' output here")
    args = ap.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant] or [("base", {})]
    results = []
    with tempfile.TemporaryDirectory(prefix="cyserve-rss-") as tmp:
        for rnd in range(1, args.rounds + 1):
            for name, env in variants:
                r = run_once(args, name, env, tmp)
                r["round"] = rnd
                results.append(r)
                for path, p in r["paths"].items():
                    load, idle = p["load"], p["idle"]
                    print(f"r{rnd} {name:<12} {path:<11} {p['requests'] or 0:>8} req  rss peak "
                          f"{mib(load['rss'][1])} MiB, after idle {mib(idle['rss'][2])}; mimalloc "
                          f"{mib(load['mimalloc'][1])}/{mib(idle['mimalloc'][2])}, glibc arenas "
                          f"{mib(load['glibc_arenas'][1])}/{mib(idle['glibc_arenas'][2])}",
                          flush=True)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump({"args": vars(args), "results": results}, f)
    print(report(results, args.paths.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
