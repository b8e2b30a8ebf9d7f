"""How long a worker blocked in a Python call stalls its other connections: the relief delay,
on a crowded machine.

One worker (--threads 1, relief on with 4 relief threads) serves a static /plaintext and a
/block handler that records when it starts and then sleeps on an Event (asleep in the kernel,
as a blocking call is). Each sample: a keep-alive connection homed on the worker asks for
/plaintext once (warm), /block is sent on a second connection, and as soon as the handler is
inside its call /plaintext is sent again on the first: the sample is the time from the call's
start to that answer (the relief detection, the relief thread's wake-up, the answer, and this
client's own scheduling). Samples are spaced by a random 0-150 ms, so that some find the relief
monitor watching and some asleep without a timeout (it sleeps after 100 ms without batches).

--load K starts K busy-loop processes at nice 0 for the run (the machine's CPUs all busy, as
a parallel compile or several test processes make them). --policy moves the monitor thread
(found by its name, cyserve-monitor) to another scheduling class with chrt before the samples
(needs CAP_SYS_NICE to leave the idle class): as-built leaves it where the engine put it.

usage: python bench/micro/relief_delay.py [--samples N] [--load K] [--policy P] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from _rawhttp import Conn, get, serving  # noqa: E402

POLICIES = {"other": "-o", "batch": "-b", "idle": "-i"}


def monitor_tid() -> int | None:
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "cyserve-monitor":
                    return int(tid)
        except OSError:
            pass
    return None


def policy_of(tid: int) -> str:
    out = subprocess.run(["chrt", "-p", str(tid)], capture_output=True, text=True).stdout
    return out.splitlines()[0].split(":")[-1].strip() if out else "?"


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--load", type=int, default=0)
    ap.add_argument("--policy", default="as-built", choices=["as-built", *POLICIES])
    ap.add_argument("--json")
    a = ap.parse_args()

    entered = threading.Event()
    gate = threading.Event()
    started = [0.0]

    def block(req: object) -> str:
        started[0] = time.monotonic()
        entered.set()
        gate.wait(30)
        return "unblocked"

    routes = [("path", "/plaintext", None, "static",
               (200, [("Content-Type", "text/plain")], b"Hello, World!")),
              ("path", "/block", None, "python", block)]
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(a.load)]
    delays: list[float] = []
    try:
        with serving(routes, threads=1, blocking_threads=4) as srv:
            with Conn(srv.port) as warm:  # a first batch starts the monitor's watch
                warm.send(get("/block"))
                entered.wait(10)
                gate.set()
                warm.reply()
            tid = None
            for _ in range(100):  # the thread names itself once it runs
                tid = monitor_tid()
                if tid is not None:
                    break
                time.sleep(0.02)
            if tid is None:
                print("no cyserve-monitor thread", file=sys.stderr)
                return 1
            if a.policy != "as-built":
                subprocess.run(["chrt", POLICIES[a.policy], "-p", "0", str(tid)], check=True)
            pol = policy_of(tid)
            time.sleep(1.0)  # let the burners take the CPUs
            for _ in range(a.samples):
                time.sleep(random.uniform(0, 0.15))
                entered.clear()
                gate.clear()
                with Conn(srv.port) as b, Conn(srv.port) as blk:
                    b.send(get("/plaintext"))
                    b.reply()
                    blk.send(get("/block"))
                    if not entered.wait(30):
                        print("the /block call did not start", file=sys.stderr)
                        return 1
                    b.send(get("/plaintext"))
                    b.reply()
                    delays.append(time.monotonic() - started[0])
                    gate.set()
                    blk.reply()
    finally:
        for p in burners:
            p.kill()
            p.wait()
    ms = [d * 1000 for d in delays]
    res = {"policy": pol, "load": a.load, "samples": len(ms), "median_ms": pct(ms, 0.5),
           "p90_ms": pct(ms, 0.9), "p99_ms": pct(ms, 0.99), "max_ms": max(ms),
           "over_100ms": sum(d > 100 for d in ms), "loadavg": os.getloadavg()[0]}
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(res, delays_ms=ms), f)
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(60)
    sys.exit(main())
