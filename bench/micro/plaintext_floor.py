"""The kernel's floor on /plaintext: bench/micro/uring_vs_epoll.c's two variants beside cyserve
(and Lwan, with LWAN_BIN), in interleaved rounds. Pinned like the suite: the server on CPU 0, one
worker, wrk -t1 -c64 on CPU 1, keep-alive, no pipelining, 1 s warm-up; requests per second of
server CPU time (utime + stime of the server's process tree, /proc), medians over rounds.

usage: python3 bench/micro/plaintext_floor.py ROUNDS SECONDS NAME...
names: floor-epoll floor-uring (gcc ... -o /tmp/uring_vs_epoll first), cyserve-static,
cyserve-nogil, go-fasthttp (make build, then a bench run for bench/.build), lwan (LWAN_BIN).
A cyserve name may name another checkout to compare builds in the same rounds:
cyserve-static@/path/to/worktree (built there with make build)."""
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

MAIN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO = os.environ.get("FLOOR_BIN", "/tmp/uring_vs_epoll")
TMP = tempfile.mkdtemp(prefix="floor-")
TCK = os.sysconf("SC_CLK_TCK")


def servers(port, tree=MAIN):
    env = dict(os.environ, PYTHONPATH=f"{tree}/src:{tree}:{MAIN}/bench/.build")
    return {
        "floor-epoll": ([PROTO, "epoll", str(port)], None, None),
        "floor-uring": ([PROTO, "uring", str(port)], None, None),
        "go-fasthttp": ([f"{MAIN}/bench/.build/go-fasthttp", "-addr", f"127.0.0.1:{port}", "-threads", "1",
                         "-data", f"{MAIN}/bench/data"], None, None),
        "lwan": ([os.environ.get("LWAN_BIN", "lwan"), "-c", f"{TMP}/lwan{port}.conf"], None, TMP),
        "cyserve-static": ([f"{tree}/.venv/bin/python", "-m", "cyserve", "bench.apps.cyserve_static_app:app",
                            "--host", "127.0.0.1", "--port", str(port), "--threads", "1"], env, tree),
        "cyserve-nogil": ([f"{tree}/.venv/bin/python", "-m", "cyserve", "bench.apps.cyserve_nogil_app:app",
                           "--host", "127.0.0.1", "--port", str(port), "--threads", "1"], env, tree),
    }


def tree_ticks(pid):
    total = 0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(p) == pid or int(st[1]) == pid:
            total += int(st[11]) + int(st[12])
    return total


def wait_port(port):
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("no listener")


def wrk(port, secs):
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", "-c64", f"-d{secs}s",
                          f"http://127.0.0.1:{port}/plaintext"], capture_output=True, text=True).stdout
    return int([ln for ln in out.splitlines() if "requests in" in ln][0].split()[0])


def main():
    rounds, secs, names = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    res = {n: [] for n in names}
    port = 9700
    for r in range(rounds):
        for n in names:
            port += 1
            if n == "lwan":  # a folder with the one file, and a config naming it
                os.makedirs(f"{TMP}/root", mode=0o755, exist_ok=True)
                with open(f"{TMP}/root/plaintext", "w") as f:
                    f.write("Hello, World!")
                with open(f"{TMP}/lwan{port}.conf", "w") as f:
                    f.write(f"threads = 1\nlistener 127.0.0.1:{port}\nsite {{\n serve_files / {{\n"
                            f"  path = {TMP}/root\n }}\n}}\n")
            base, _, tree = n.partition("@")
            argv, env, cwd = servers(port, tree or MAIN)[base]
            p = subprocess.Popen(["taskset", "-c", "0"] + argv, env=env, cwd=cwd,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_port(port)
                wrk(port, 1)
                t0 = tree_ticks(p.pid)
                req = wrk(port, secs)
                t1 = tree_ticks(p.pid)
            finally:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            v = req / ((t1 - t0) / TCK)
            res[n].append(v)
            print(f"r{r} {n:<15} {req / secs:>9.0f} req/s {v:>9.0f} req/cpu-s", flush=True)
    print("medians:")
    for n in names:
        print(f"  {n:<15} {statistics.median(res[n]):>9.0f}  (min {min(res[n]):.0f}, max {max(res[n]):.0f})")


if __name__ == "__main__":
    main()
