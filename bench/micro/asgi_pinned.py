"""Where an ASGI request's wake-ups go in the pinned configuration, counted rather than timed.

    bench/micro/asgi_pinned.py TREE [--conns 1,64] [--duration 5] [--path /plaintext] [--strace]

TREE is a cyserve checkout built in place for the interpreter that runs this script (or
--python); the app is this checkout's bench.peers.python.asgi_app:app, so two trees serve the
same app. The server runs as the suite's pinned mode runs cyserve-asgi: one process, one worker
thread (--threads 1), every thread on CPU 0 (taskset); wrk runs on CPU 1. For each connection
count, while wrk runs for --duration seconds, it reads:

- from /proc/PID/task/*/status and stat, per thread: voluntary switches (a thread that went to
  sleep and was woken: for the event loop's thread, its wake-ups), involuntary switches (a thread
  preempted while it could run: on one CPU, what a wake-up of the other thread does to it), and
  CPU time;
- `perf stat -e context-switches,task-clock` over the process (the kernel's software counters;
  hardware counters are not needed);
- with --strace, in a second run under `strace -f -y -e trace=write,sendto`: the eventfd writes
  and the 1-byte socket sends (asyncio's self-pipe, call_soon_threadsafe's wake-up) per request.
  strace slows every system call, so batches differ from the first run's: read these as counts
  of what wakes whom, not as the batch size.

Everything is printed per request (wrk's count), which the machine's load moves little: these are
counts of events per request, not rates.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
APP = "bench.peers.python.asgi_app:app"


def threads(pid):
    """{tid: (comm, voluntary, involuntary, cpu_ticks)} of process pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                st = f.read()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        vol = int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", st, re.M).group(1))
        inv = int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", st, re.M).group(1))
        out[int(tid)] = (comm, vol, inv, int(fields[11]) + int(fields[12]))
    return out


def role(pid, ths, tid):
    """The threads are unnamed Python threads; they are made in this order: the main thread, the
    event loop's (before the server starts), then the engine's worker (--threads 1)."""
    python = [t for t in sorted(ths) if t != pid and ths[t][0] == ths[pid][0]]
    if tid == pid:
        return "main thread"
    if python and tid == python[0]:
        return "event loop thread"
    if len(python) > 1 and tid == python[1]:
        return "worker thread"
    return ths[tid][0]


def wrk(port, conns, duration, path):
    r = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{int(duration)}s",
                        f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True, check=True)
    m = re.search(r"(\d+) requests in", r.stdout)
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", r.stdout)
    if not m or errs:
        sys.exit(f"wrk: {r.stdout}")
    return int(m.group(1))


def start(tree, py, port):
    env = dict(os.environ, PYTHONHASHSEED="0",
               PYTHONPATH=os.pathsep.join([os.path.join(tree, "src"), ROOT]))
    p = subprocess.Popen(["taskset", "-c", "0", py, "-m", "cyserve", APP, "--host", "127.0.0.1",
                          "--port", str(port), "--threads", "1"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        if p.poll() is not None:
            break
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p
        except OSError:
            time.sleep(0.1)
    p.kill()
    sys.exit(f"the server did not start (exit status {p.poll()})")


def measure(tree, py, conns, duration, path, use_strace):
    with socket.socket() as probe:  # a free port (the server binds it again at once)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    p = start(tree, py, port)
    try:
        wrk(port, conns, 1, path)  # warm-up
        before = threads(p.pid)
        perf_out = tempfile.mktemp(suffix=".perf")
        perf = subprocess.Popen(["perf", "stat", "-x,", "-o", perf_out, "-e",
                                 "context-switches,task-clock", "-p", str(p.pid)])
        time.sleep(0.2)
        n = wrk(port, conns, duration, path)
        perf.send_signal(signal.SIGINT)
        perf.wait()
        after = threads(p.pid)
        res = {"requests": n}
        with open(perf_out) as f:
            for line in f:
                parts = line.split(",")
                if len(parts) > 2 and parts[2] in ("context-switches", "task-clock"):
                    res[parts[2]] = float(parts[0])
        os.unlink(perf_out)
        res["threads"] = []
        for tid, (comm, vol, inv, cpu) in sorted(after.items()):
            b = before.get(tid, (comm, 0, 0, 0))
            dv, di, dc = vol - b[1], inv - b[2], cpu - b[3]
            res["threads"].append((role(p.pid, after, tid), dv, di, dc))
        if use_strace:
            log = tempfile.mktemp(suffix=".strace")
            st = subprocess.Popen(["strace", "-f", "-y", "-qq", "-e", "trace=write,sendto",
                                   "-e", "signal=none", "-o", log, "-p", str(p.pid)])
            time.sleep(1.0)
            ns = wrk(port, conns, duration, path)
            st.send_signal(signal.SIGINT)
            st.wait()
            efd = {}  # writer's tid: eventfd writes
            selfpipe = other = 0
            with open(log) as f:
                for line in f:
                    tid = int(line.split(None, 1)[0])
                    if "eventfd" in line and "write(" in line:
                        efd[tid] = efd.get(tid, 0) + 1
                    elif "sendto(" in line and re.search(r", 1, 0, NULL, 0\) = 1", line):
                        selfpipe += 1
                    elif "write(" in line or "sendto(" in line:
                        other += 1
            os.unlink(log)
            ths = threads(p.pid)
            efd = {(role(p.pid, ths, t) if t in ths else str(t)): k for t, k in efd.items()}
            res["strace"] = {"requests": ns, "eventfd_writes": efd, "selfpipe_sends": selfpipe,
                             "other_writes": other}
        return res
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree")
    ap.add_argument("--conns", default="1,64")
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--path", default="/plaintext")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--strace", action="store_true")
    args = ap.parse_args()
    for tool in ("wrk", "taskset", "perf") + (("strace",) if args.strace else ()):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed")
    tree = os.path.abspath(args.tree)
    for c in (int(x) for x in args.conns.split(",")):
        r = measure(tree, args.python, c, args.duration, args.path, args.strace)
        n = r["requests"]
        print(f"{tree} {args.path} conns={c}: {n} requests; per request: "
              f"context switches {r.get('context-switches', 0) / n:.3f}, "
              f"task-clock {r.get('task-clock', 0) * 1000 / n:.1f} us")
        for who, dv, di, dc in r["threads"]:
            print(f"    {who:18} voluntary {dv / n:.3f}/req ({n / dv if dv else float('inf'):.1f} "
                  f"req per sleep), involuntary {di / n:.3f}/req, cpu {dc} ticks")
        if "strace" in r:
            s = r["strace"]
            ns = s["requests"]
            by = ", ".join(f"{t}: {k / ns:.3f}" for t, k in sorted(s["eventfd_writes"].items()))
            print(f"    under strace ({ns} requests): eventfd writes per request by writer ({by}), "
                  f"self-pipe sends {s['selfpipe_sends'] / ns:.3f}/req, "
                  f"other writes {s['other_writes'] / ns:.3f}/req")


if __name__ == "__main__":
    main()
