"""The kernel's floor on /plaintext: bench/micro/uring_vs_epoll.c's two variants beside cyserve
(and Lwan, with LWAN_BIN), in interleaved rounds. Pinned like the suite: the server on CPU 0, one
worker, wrk -t1 -c64 on CPU 1, keep-alive, no pipelining, 1 s warm-up; requests per second of
server CPU time (utime + stime of the server's process tree, /proc), medians over rounds.

usage: python3 bench/micro/plaintext_floor.py ROUNDS SECONDS NAME...
names: floor-epoll floor-uring (gcc ... -o /tmp/uring_vs_epoll first), cyserve-static,
cyserve-nogil, go-fasthttp (make build, then a bench run for bench/.build), lwan (LWAN_BIN).
A cyserve name may name another checkout to compare builds in the same rounds:
cyserve-static@/path/to/worktree (built there with make build): that tree's interpreter and src/,
this checkout's apps (bench/http/apps/), so that a tree from before bench/'s layout compares too."""
import os
import socket
import subprocess
import sys
import tempfile
import time

MAIN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, MAIN)
from bench.common.pinning import pinned  # noqa: E402
from bench.common.procfs import tree_cpu_seconds  # noqa: E402
from bench.common.stats import spread  # noqa: E402

PROTO = os.environ.get("FLOOR_BIN", "/tmp/uring_vs_epoll")
TMP = tempfile.mkdtemp(prefix="floor-")


def servers(port, tree=MAIN):
    env = dict(os.environ, PYTHONPATH=f"{tree}/src:{MAIN}:{MAIN}/bench/.build")
    return {
        "floor-epoll": ([PROTO, "epoll", str(port)], None, None),
        "floor-uring": ([PROTO, "uring", str(port)], None, None),
        "go-fasthttp": ([f"{MAIN}/bench/.build/go-fasthttp", "-addr", f"127.0.0.1:{port}", "-threads", "1",
                         "-data", f"{MAIN}/bench/data"], None, None),
        "lwan": ([os.environ.get("LWAN_BIN", "lwan"), "-c", f"{TMP}/lwan{port}.conf"], None, TMP),
        "cyserve-static": ([f"{tree}/.venv/bin/python", "-m", "cyserve", "bench.http.apps.cyserve_static_app:app",
                            "--host", "127.0.0.1", "--port", str(port), "--threads", "1"], env, MAIN),
        "cyserve-nogil": ([f"{tree}/.venv/bin/python", "-m", "cyserve", "bench.http.apps.cyserve_nogil_app:app",
                           "--host", "127.0.0.1", "--port", str(port), "--threads", "1"], env, MAIN),
    }


def wait_port(port):
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("no listener")


def wrk(port, secs):
    out = subprocess.run(pinned(["wrk", "-t1", "-c64", f"-d{secs}s",
                                 f"http://127.0.0.1:{port}/plaintext"], "1"),
                         capture_output=True, text=True).stdout
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
            p = subprocess.Popen(pinned(argv, "0"), env=env, cwd=cwd,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_port(port)
                wrk(port, 1)
                t0 = tree_cpu_seconds(p.pid)
                req = wrk(port, secs)
                t1 = tree_cpu_seconds(p.pid)
            finally:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            v = req / (t1 - t0)
            res[n].append(v)
            print(f"r{r} {n:<15} {req / secs:>9.0f} req/s {v:>9.0f} req/cpu-s", flush=True)
    print("medians:")
    for n in names:
        st = spread(res[n])
        print(f"  {n:<15} {st['median']:>9.0f}  (min {st['min']:.0f}, max {st['max']:.0f})")


if __name__ == "__main__":
    main()
