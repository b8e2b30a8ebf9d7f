"""An interpreter's own memory, without a server: what one process holds at each stage of what a
cyserve process does before and while it serves, and what one thread keeps after running the
app's work (docs/benchmarks.md, "Session 20: one 3.14t process against N GIL processes").

    PYTHONPATH=src:. PYTHON bench/micro/ft_mem_floor.py stages
    PYTHONPATH=src:. PYTHON bench/micro/ft_mem_floor.py thread WORK K
    PYTHONPATH=src:. python bench/micro/ft_mem_floor.py idle PYTHON

stages: VmRSS (KiB) of this process bare, then with cyserve and its extension imported (the
        standard library modules they import included), then with the WSGI peers' app imported,
        then after each of two threads has called the app's routes as one worker serves them in
        bench.http.ft_memory (20 `/plaintext` and 20 `/json`), each thread kept alive.
thread: how much VmRSS three threads add, one after the other, each running WORK K times and
        then kept alive: `idle` (nothing), `plaintext` (the route's function), `dumps`
        (json.dumps of the 1,000 cached records, the 133 KB string `/json` builds and drops).
idle:   PYTHON with cyserve's extension and the app imported and nothing else, against
        `PYTHON -m cyserve APP --threads 1` 1 s after it listens, before any request: VmRSS,
        anonymous and file-backed (KiB), the anonymous memory by allocator, and the files whose
        resident pages differ by more than 40 KiB. What starting a server adds to its imports.

Stdlib and the peers' routes only (msgpack for the cached records). Linux: reads /proc/self.
"""

import collections
import json
import os
import subprocess
import sys
import tempfile
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


def snapshot(pid):
    """(VmRSS, RssAnon, RssFile, anonymous KiB by allocator, resident KiB by file) of pid."""
    from bench.common.procfs import anon_breakdown
    with open(f"/proc/{pid}/status") as f:
        st = dict(line.split(":", 1) for line in f if ":" in line)
    with open(f"/proc/{pid}/smaps") as f:
        text = f.read()
    files, name = collections.Counter(), ""
    for line in text.splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else ""
        elif line.startswith("Rss:") and name.startswith("/"):
            files[os.path.basename(name)] += int(head[1])
    split = {k: v for k, v in anon_breakdown(text).items() if v}
    return (*(int(st[k].split()[0]) for k in ("VmRSS", "RssAnon", "RssFile")), split, files)


def idle(python):
    from bench.common import processes
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "src") + os.pathsep + root)
    app = "bench.peers.python.wsgi_app"
    proc = subprocess.Popen([python, "-c", f"import sys, cyserve._core, {app}\n"
                             "print('ready', flush=True)\nsys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=root)
    try:
        proc.stdout.readline()
        time.sleep(0.5)
        imported = snapshot(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait()
        proc.stdout.close()
    port = processes.free_port()
    with tempfile.TemporaryDirectory() as tmp:
        run = processes.start_server([python, "-m", "cyserve", app + ":app", "--port", str(port),
                                      "--threads", "1"], port, os.path.join(tmp, "log"),
                                     env=env, cwd=root)
        try:
            time.sleep(1.0)
            served = snapshot(run.pid)
        finally:
            run.stop()
    for label, snap in (("imported", imported), ("idle server", served)):
        print(f"{label}: RSS {snap[0]} anon {snap[1]} file {snap[2]} {snap[3]}")
    diff = {k: v - imported[4].get(k, 0) for k, v in served[4].items()}
    print("files:", sorted(((v, k) for k, v in diff.items() if abs(v) > 40), reverse=True))


if __name__ == "__main__":
    if sys.argv[1] == "stages":
        stages()
    elif sys.argv[1] == "idle":
        idle(sys.argv[2])
    else:
        thread(sys.argv[2], int(sys.argv[3]))
