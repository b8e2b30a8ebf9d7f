"""System calls, minor page faults and RSS of a server under h2load or wrk load, per request.

    python bench/micro/load_counts.py TREE APP CLIENT [--n N] [--conns C] [--tracer strace|perf]

TREE: a built cyserve checkout (its src/ goes first on PYTHONPATH; the server runs with the
interpreter running this script unless SERVER_PY says otherwise); APP: module:app, e.g.
bench.http.apps.cyserve_py:app or bench.http.apps.cyserve_static_app:app; CLIENT: h2c (h2load
-c C -m 10 -t 1 -n N on /plaintext, as bench/http/protocols.py runs it but with a count) or
h1 (wrk -t1 -cC -d on /plaintext, one request per connection at a time, never pipelined; the
requests are wrk's own count).

The server runs with one worker thread (--threads 1). A warm-up of the same load runs first
(so that relief threads and caches exist), then the tracer attaches to every thread of the
server and the measured load runs:
  strace: `strace -c -f -p` (threads started later too); its whole table is written to OUT.
  perf:   `perf stat` of the mmap, munmap and mprotect system calls, every system call, and
          minor faults (-p of the process, inherited by threads started later); perf slows the
          server far less than strace, so its counts are nearer those of an untraced server.
Printed: requests, each counted call per request, the minor faults per request (from the
kernel's /proc/PID/stat, both tracers), VmRSS after the load and after 2 s idle, and the
coroutine stacks mapped after the load with their resident KiB. Counts,
not rates: a loaded machine moves them only through how requests batch.
"""

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time


def wait_port(port):
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit("the server did not start")


def minflt(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[7])  # minflt, the 10th field, counted over the whole thread group


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def stack_maps(pid):
    """(count, resident KiB) of the coroutine stacks: the 68 KiB read-write mappings of smaps (a
    64 KiB stack and the page of its header; the guard page is a mapping of its own)."""
    count = rss = 0
    size = 0
    rw = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                lo, hi = (int(x, 16) for x in first.split("-"))
                size, rw = hi - lo, line.split()[1].startswith("rw")
            elif first == "Rss:" and rw and size == 68 * 1024:
                count += 1
                rss += int(line.split()[1])
    return count, rss


def run_client(client, port, n, conns, duration):
    url = f"http://127.0.0.1:{port}/plaintext"
    if client == "h2c":
        argv = ["h2load", "-c", str(conns), "-m", "10", "-t", "1", "-n", str(n), url]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=600).stdout
        m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out)
        if not m or m.group(1) != m.group(2) or "h2c" not in out:
            sys.exit("h2load failed:\n" + out[-1500:])
        return int(m.group(2))
    argv = ["wrk", "-t", "1", "-c", str(conns), "-d", f"{duration}s", url]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600).stdout
    m = re.search(r"(\d+) requests in", out)
    if not m or "Socket errors" in out or "Non-2xx" in out:
        sys.exit("wrk failed:\n" + out[-1500:])
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("app")
    ap.add_argument("client", choices=("h2c", "h1"))
    ap.add_argument("--n", type=int, default=20000, help="h2load's requests")
    ap.add_argument("--duration", type=int, default=4, help="wrk's seconds")
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--tracer", choices=("strace", "perf"), default="strace")
    ap.add_argument("--out", default="/tmp/load-counts.txt")
    args = ap.parse_args()
    tree = os.path.abspath(args.tree)
    port = 20000 + (os.getpid() * 7) % 20000
    env = dict(os.environ, PYTHONHASHSEED="0",
               PYTHONPATH=os.pathsep.join([os.path.join(tree, "src"), tree]))
    py = os.environ.get("SERVER_PY", sys.executable)
    with open(args.out + ".log", "w") as log:
        server = subprocess.Popen([py, "-m", "cyserve", args.app, "--host", "127.0.0.1",
                                   "--port", str(port), "--threads", "1"],
                                  cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port)
        run_client(args.client, port, args.n // 4, args.conns, 1)  # warm-up
        pid = str(server.pid)
        if args.tracer == "strace":
            tracer = subprocess.Popen(["strace", "-c", "-f", "-o", args.out, "-p", pid],
                                      stderr=subprocess.PIPE)
            while b"attached" not in tracer.stderr.readline():
                if tracer.poll() is not None:
                    sys.exit("strace ended before attaching")
        else:
            events = ("syscalls:sys_enter_mmap,syscalls:sys_enter_munmap,"
                      "syscalls:sys_enter_mprotect,raw_syscalls:sys_enter")
            tracer = subprocess.Popen(["perf", "stat", "-x", ",", "-e", events, "-o", args.out,
                                       "-p", pid])
        time.sleep(0.5)
        f0 = minflt(server.pid)
        done = run_client(args.client, port, args.n, args.conns, args.duration)
        f1 = minflt(server.pid)
        time.sleep(0.2)
        tracer.send_signal(signal.SIGINT)
        tracer.wait()
        rss_after = rss_kib(server.pid)
        stacks_after = stack_maps(server.pid)
        time.sleep(2)
        rss_idle = rss_kib(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    counts = {}
    with open(args.out) as f:
        for line in f:
            if args.tracer == "strace":
                parts = line.split()
                if len(parts) >= 5 and re.fullmatch(r"[0-9.]+", parts[0]):
                    counts[parts[-1]] = int(parts[3])
            else:
                parts = line.strip().split(",")
                if len(parts) > 2 and parts[0].isdigit():
                    name = parts[2].split(":")[-1].replace("sys_enter_", "")
                    counts["all" if name == "sys_enter" else name] = int(parts[0])
    keys = sorted(counts, key=lambda k: -counts[k])
    print(f"{args.client} {args.app} tracer={args.tracer} requests={done}")
    print("  ".join(f"{k} {counts[k] / done:.4f}" for k in keys))
    print(f"minflt/request {(f1 - f0) / done:.4f}  RSS after {rss_after} KiB, "
          f"after 2 s idle {rss_idle} KiB; stacks mapped after the load {stacks_after[0]}, "
          f"resident {stacks_after[1]} KiB")
    for k in ("mmap", "munmap", "mprotect"):
        print(f"{k} total {counts.get(k, 0)}")


if __name__ == "__main__":
    main()
