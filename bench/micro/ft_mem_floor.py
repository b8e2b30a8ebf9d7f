"""An interpreter's own memory, without a server: what one process holds at each stage of what a
cyserve process does before and while it serves, and what one thread keeps after running the
app's work (docs/benchmarks.md, "Session 20: one 3.14t process against N GIL processes").

    PYTHONPATH=src:. PYTHON bench/micro/ft_mem_floor.py stages
    PYTHONPATH=src:. PYTHON bench/micro/ft_mem_floor.py thread WORK K

stages: VmRSS (KiB) of this process bare, then with cyserve and its extension imported (the
        standard library modules they import included), then with the WSGI peers' app imported,
        then after each of two threads has called the app's routes as one worker serves them in
        bench.http.ft_memory (20 `/plaintext` and 20 `/json`), each thread kept alive.
thread: how much VmRSS three threads add, one after the other, each running WORK K times and
        then kept alive: `idle` (nothing), `plaintext` (the route's function), `dumps`
        (json.dumps of the 1,000 cached records, the 133 KB string `/json` builds and drops).

Stdlib and the peers' routes only (msgpack for the cached records). Linux: reads /proc/self.
"""

import json
import sys
import threading
import time


def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def in_thread(fn):
    """Run fn on a new thread that then stays (as a worker does); wait until fn has returned."""
    done = threading.Event()

    def run():
        fn()
        done.set()
        time.sleep(3600)

    threading.Thread(target=run, daemon=True).start()
    done.wait()
    time.sleep(0.3)


def stages():
    out = [rss_kib()]
    import cyserve._core  # noqa: F401  (`import cyserve` alone does not load the extension)
    out.append(rss_kib())
    import bench.peers.python.wsgi_app  # noqa: F401
    from bench.peers.python.routes import handle
    out.append(rss_kib())

    def work():
        for _ in range(20):
            handle("/plaintext")
            handle("/json")
    for _ in range(2):
        in_thread(work)
        out.append(rss_kib())
    names = ("bare", "cyserve._core", "+ app", "+ thread 1", "+ thread 2")
    print(sys.version.split()[0], " ".join(f"{n}={v}" for n, v in zip(names, out)))


def thread(what, k):
    from bench.peers.python import routes
    jobs = {"idle": lambda: None, "plaintext": routes.plaintext,
            "dumps": lambda: json.dumps(routes.CACHE, separators=(",", ":"))}
    job = jobs[what]

    def work():
        for _ in range(k):
            job()
    before = rss_kib()
    added = []
    for _ in range(3):
        in_thread(work)
        now = rss_kib()
        added.append(now - before)
        before = now
    print(sys.version.split()[0], what, k, "KiB added by each thread:", added)


if __name__ == "__main__":
    if sys.argv[1] == "stages":
        stages()
    else:
        thread(sys.argv[2], int(sys.argv[3]))
