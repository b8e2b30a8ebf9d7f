"""What the relief monitor's scheduling class costs a busy pinned server whose Python calls do
not block: one `cyserve-py` server (Python handlers, --threads 1, relief on) pinned to CPU 0,
wrk -t1 -c64 on CPU 1 on /plaintext (keep-alive, no pipelining), and between rounds the
monitor thread moved with chrt to each class in turn (needs CAP_SYS_NICE to leave the idle
class). Same process for every class, rounds interleaved: per round and class, requests per
server CPU-second (/proc), and the deltas over the run of the worker's involuntary context
switches (the monitor preempting it shows there) and of the monitor's own switches (its
wake-ups).

usage: python bench/micro/monitor_class_cost.py ROUNDS SECONDS [CLASS...]   (classes: other
batch idle; default all three)
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from bench.common.pinning import pinned  # noqa: E402
from bench.common.procfs import tree_cpu_seconds  # noqa: E402

FLAGS = {"other": "-o", "batch": "-b", "idle": "-i"}


def threads(pid: int) -> dict[str, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                out.setdefault(f.read().strip(), int(tid))
        except OSError:
            pass
    return out


def busiest(pid: int) -> int:
    def cpu(tid: str) -> int:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    return int(max(os.listdir(f"/proc/{pid}/task"), key=cpu))


def switches(pid: int, tid: int) -> tuple[int, int]:
    vol = invol = 0
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                invol = int(line.split()[1])
    return vol, invol


def wrk(port: int, secs: int) -> int:
    out = subprocess.run(pinned(["wrk", "-t1", "-c64", f"-d{secs}s",
                                 f"http://127.0.0.1:{port}/plaintext"], "1"),
                         capture_output=True, text=True).stdout
    return int([ln for ln in out.splitlines() if "requests in" in ln][0].split()[0])


def main() -> int:
    rounds, secs = int(sys.argv[1]), int(sys.argv[2])
    classes = sys.argv[3:] or ["other", "batch", "idle"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}/src:{ROOT}")
    srv = subprocess.Popen(pinned([sys.executable, "-m", "cyserve", "bench.http.apps.cyserve_py:app",
                                   "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
                                  "0"), env=env, cwd=ROOT)
    rows = []
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        wrk(port, 1)  # warm-up; the first batch starts the monitor
        t = threads(srv.pid)
        mon = t["cyserve-monitor"]
        worker = busiest(srv.pid)  # the worker threads are not named: the one that served
        for r in range(rounds):
            for cls in classes:
                subprocess.run(["chrt", FLAGS[cls], "-p", "0", str(mon)], check=True)
                c0, w0, m0 = tree_cpu_seconds(srv.pid), switches(srv.pid, worker), switches(srv.pid, mon)
                n = wrk(port, secs)
                c1, w1, m1 = tree_cpu_seconds(srv.pid), switches(srv.pid, worker), switches(srv.pid, mon)
                row = {"round": r, "class": cls, "requests": n, "per_cpu_s": n / max(c1 - c0, 1e-9),
                       "worker_invol": w1[1] - w0[1], "monitor_switches": sum(m1) - sum(m0)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        srv.terminate()
        srv.wait(10)
    for cls in classes:
        mine = sorted(r["per_cpu_s"] for r in rows if r["class"] == cls)
        inv = sorted(r["worker_invol"] for r in rows if r["class"] == cls)
        mon_sw = sorted(r["monitor_switches"] for r in rows if r["class"] == cls)
        print(f"{cls}: median {mine[len(mine) // 2]:,.0f} req/CPU-s (range {mine[0]:,.0f}-{mine[-1]:,.0f}), "
              f"worker involuntary switches median {inv[len(inv) // 2]}, monitor switches "
              f"median {mon_sw[len(mon_sw) // 2]} per {secs} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
