"""What a server keeps of a burst once it goes quiet: RSS and coroutine stacks, before a burst,
right after it and some seconds later.

    python bench/micro/idle_stacks.py TREE [TREE ...] [--client h2c|h1] [--rounds R] [--idle S]

TREE: a built cyserve checkout (its src/ goes first on PYTHONPATH; the server runs with the
interpreter running this script unless SERVER_PY says otherwise), the trees taken in turn,
round after round, so that a baseline and a branch share the machine's moods. The server runs
bench.http.apps.cyserve_py:app (Python handlers) with --threads T (2). It gets 200 warm-up
requests, then the burst on /plaintext:
  h2c: h2load -c 20 -m 100 -t 1 -n N (N 40,000): up to 2,000 streams at once, each a task
       coroutine waiting on its Python call (SETTINGS_MAX_CONCURRENT_STREAMS is 100);
  h1:  wrk -t1 -c1000 -d3s: 1,000 connections, each a coroutine waiting on its call.
Printed per run: VmRSS (KiB) and the coroutine stacks mapped with their resident KiB (the
68 KiB read-write mappings of /proc/PID/smaps, bench/micro/load_counts.py's stack_maps) at
three moments: after the warm-up, 0.2 s after the burst, and S seconds (5) after it.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load_counts import rss_kib, run_client, stack_maps, wait_port  # noqa: E402


def one_run(tree, client, threads, n, idle):
    port = 20000 + (os.getpid() * 7 + int(time.time())) % 20000
    env = dict(os.environ, PYTHONHASHSEED="0",
               PYTHONPATH=os.pathsep.join([os.path.join(tree, "src"), tree]))
    py = os.environ.get("SERVER_PY", sys.executable)
    server = subprocess.Popen([py, "-m", "cyserve", "bench.http.apps.cyserve_py:app", "--host",
                               "127.0.0.1", "--port", str(port), "--threads", str(threads)],
                              cwd=tree, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        run_client("h2c", port, 200, 2, 1)
        time.sleep(1.5)
        marks = [("warm", rss_kib(server.pid), stack_maps(server.pid))]
        if client == "h2c":
            argv = ["h2load", "-c", "20", "-m", "100", "-t", "1", "-n", str(n),
                    f"http://127.0.0.1:{port}/plaintext"]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=600).stdout
            if f"{n} succeeded" not in out.replace(",", ""):
                sys.exit("h2load failed:\n" + out[-1500:])
        else:
            run_client("h1", port, 0, 1000, 3)
        time.sleep(0.2)
        marks.append(("after", rss_kib(server.pid), stack_maps(server.pid)))
        time.sleep(idle - 0.2)
        marks.append((f"+{idle:g}s", rss_kib(server.pid), stack_maps(server.pid)))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    return marks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--client", choices=("h2c", "h1"), default="h2c")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=40000, help="h2load's requests")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--idle", type=float, default=5.0)
    args = ap.parse_args()
    for r in range(args.rounds):
        for tree in args.trees:
            marks = one_run(os.path.abspath(tree), args.client, args.threads, args.n, args.idle)
            cells = "  ".join(f"{name}: RSS {rss} KiB, stacks {st[0]} ({st[1]} KiB)"
                              for name, rss, st in marks)
            print(f"round {r + 1} {tree} {args.client}: {cells}", flush=True)


if __name__ == "__main__":
    main()
