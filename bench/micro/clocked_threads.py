"""What cyserve's clocked threads do, idle and under load: the serving process's main thread
(its wait for a stop) and the relief monitor (cyserve-monitor), counted from /proc.

One WSGI server (the peers' app, bench.peers.python.wsgi_app:app, one worker thread, this
tree's src/ first on the path) is started; then
  - idle for --idle seconds: the main thread's voluntary context switches (how often it went to
    sleep, so how often it woke) per second;
  - under `wrk -t1 -cC -dD` on PATH (no pipelining), after a 1 s warm-up that starts the
    monitor: the main thread's and the monitor's voluntary switches and CPU time (schedstat's
    run time, which counts the kernel's part of every wake-up) per request; with --strace, the
    monitor's system calls by `strace -c -p TID` during the load (strace slows the monitor
    down: read the counts, not its timings).
It prints one JSON line (and strace's table). CPU times on a machine shared with other work
move from run to run; interleave the trees compared.

usage: python bench/micro/clocked_threads.py [--path /json] [--conns 4] [--duration 10]
                                              [--idle 10] [--strace]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/json")
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--idle", type=float, default=10.0)
    ap.add_argument("--strace", action="store_true")
    a = ap.parse_args()

    env = dict(os.environ, PYTHONHASHSEED="0",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), ROOT]))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "cyserve", "bench.peers.python.wsgi_app:app",
                             "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # "cyserve: serving on ..."
    task = f"/proc/{proc.pid}/task"

    def switches(tid: int) -> int:
        with open(f"{task}/{tid}/status") as f:
            return int(re.search(r"^voluntary_ctxt_switches:\s*(\d+)", f.read(), re.M).group(1))

    def cpu_ns(tid: int) -> int:
        with open(f"{task}/{tid}/schedstat") as f:
            return int(f.read().split()[0])

    def named(name: str) -> list[int]:
        found = []
        for tid in os.listdir(task):
            with open(f"{task}/{tid}/comm") as f:
                if f.read().strip() == name:
                    found.append(int(tid))
        return found

    url = f"http://127.0.0.1:{port}{a.path}"
    res: dict[str, object] = {"path": a.path, "conns": a.conns}
    tracer, table = None, None
    try:
        time.sleep(1.0)
        before = switches(proc.pid)
        time.sleep(a.idle)
        res["idle_main_wakes_per_s"] = round((switches(proc.pid) - before) / a.idle, 2)
        subprocess.run(["wrk", "-t1", f"-c{a.conns}", "-d1s", url], capture_output=True)
        mon = (named("cyserve-monitor") or [None])[0]
        if a.strace and mon is not None:
            table = tempfile.NamedTemporaryFile(suffix=".strace", delete=False).name
            tracer = subprocess.Popen(["strace", "-c", "-p", str(mon), "-o", table],
                                      stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        m0, c0 = switches(proc.pid), cpu_ns(proc.pid)
        w0, k0 = (switches(mon), cpu_ns(mon)) if mon else (0, 0)
        out = subprocess.run(["wrk", "-t1", f"-c{a.conns}", f"-d{a.duration}s", url],
                             capture_output=True, text=True).stdout
        m1, c1 = switches(proc.pid), cpu_ns(proc.pid)
        w1, k1 = (switches(mon), cpu_ns(mon)) if mon else (0, 0)
        if tracer is not None:
            tracer.terminate()
            tracer.wait()
        n = int(re.search(r"(\d+) requests in", out).group(1))
        res.update(requests=n, main_wakes=m1 - m0, main_cpu_ns_per_request=round((c1 - c0) / n),
                   monitor_wakes_per_request=round((w1 - w0) / n, 3) if mon else None,
                   monitor_cpu_ns_per_request=round((k1 - k0) / n) if mon else None,
                   relief_threads=len(named("cyserve-relief")))
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    print(json.dumps(res))
    if table is not None:
        with open(table) as f:
            print(f.read())
        os.unlink(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
