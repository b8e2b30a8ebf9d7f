"""Resident memory of idle WebSockets (docs/benchmarks.md, "Idle WebSockets").

Starts a server on a WebSocket echo, reads the server's RSS and PSS, opens N WebSockets that each
send one 32-byte text message and read its echo (so every connection has been served and is idle
on the server again), waits, reads RSS and PSS again, and reports the growth per connection.
The server's RLIMIT_NOFILE and this process's are raised to fit N. The echo (--app):

- nogil (default): cyserve on the GIL-free echo of examples/ws_echo_nogil.pyx (as `make build`
  builds it in place);
- asgi: a raw ASGI echo (bench/peers/python/ws_asgi_app.py), served by cyserve, or with
  --server uvicorn / granian by that server (run with --peer-python, default bench/.venv's);
- app: cyserve's native @app.websocket echo (bench/http/apps/cyserve_ws_app.py): a thread each
  while its handler runs, and at most 1000 at once (the route's max_connections; more are
  answered 503), so --conns stays under that.

With --breakdown (cyserve only) the server runs under tracemalloc and reports, beside the totals,
where the growth went: the Python objects (tracemalloc's bytes, and the source lines that
allocated most), the C heap (glibc's mallinfo2 in-use bytes, less the Python objects it holds),
and the coroutine stacks' resident pages (the 68 KiB read-write mappings of /proc/PID/smaps: a
64 KiB stack and the page of its header).
tracemalloc adds its own bookkeeping to the RSS, so the totals of a --breakdown run are not the
figures to quote.

With --deflate each WebSocket negotiates permessage-deflate and its one message is a compressed
128-byte text, which the server inflates and echoes compressed: both of zlib's streams have then
been used for that connection.

    .venv/bin/python bench/http/ws_idle_memory.py --conns 10000 --threads 1 [--deflate]
    .venv/bin/python bench/http/ws_idle_memory.py --conns 5000 --app asgi --server uvicorn
"""

import argparse
import base64
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from bench.common.procfs import tree_pss_kib, tree_rss_kib  # noqa: E402

APPS = {
    "nogil": """
import cyserve
from examples import ws_echo_nogil

app = cyserve.App()
app.nogil_websocket("/ws", ws_echo_nogil.ECHO)
app.static("/ready", b"ok")
""",
    # Both answer /plaintext beside /ws, which tells that they are up.
    "asgi": "from bench.peers.python.ws_asgi_app import app\n",
    "app": "from bench.http.apps.cyserve_ws_app import app\n",
}
READY = {"nogil": "/ready", "asgi": "/plaintext", "app": "/plaintext"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ws_frame(payload, b0=0x81):
    mask = os.urandom(4)
    return bytes([b0, 0x80 | len(payload)]) + mask + bytes(
        b ^ mask[i % 4] for i, b in enumerate(payload))


def deflated(payload):
    c = zlib.compressobj(wbits=-15)
    return (c.compress(payload) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]


def open_idle(port, n, deflate=False):
    """n WebSockets, each with one echo done; the sockets, open."""
    socks = []
    key = base64.b64encode(b"0123456789abcdef").decode()
    ext = "Sec-WebSocket-Extensions: permessage-deflate\r\n" if deflate else ""
    req = (f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{ext}\r\n").encode()
    if deflate:
        payload = b"0123456789abcdef" * 8
        msg = ws_frame(deflated(payload), 0xC1)  # FIN, RSV1 (compressed), text
        want = bytes([0xC1, len(deflated(payload))]) + deflated(payload)
    else:
        payload = b"0123456789abcdef0123456789abcdef"
        msg = ws_frame(payload)
        want = bytes([0x81, len(payload)]) + payload
    # The handshakes first, then each one message once its 101 came: uvicorn drops frames that
    # arrive with the handshake.
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(req)
        socks.append(s)
    for s in socks:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(1)
            if not chunk:
                raise RuntimeError("server closed a WebSocket")
            head += chunk
        if not head.startswith(b"HTTP/1.1 101 "):
            raise RuntimeError(f"handshake answered {head[:40]!r}")
        if deflate and b"permessage-deflate" not in head:
            raise RuntimeError("permessage-deflate was not negotiated")
        s.sendall(msg)
    for s in socks:
        body = b""
        while len(body) < len(want):
            chunk = s.recv(len(want) - len(body))
            if not chunk:
                raise RuntimeError("server closed a WebSocket")
            body += chunk
        if body != want:
            raise RuntimeError(f"the echo was {body[:40]!r}, not {want[:40]!r}")
    return socks


def wait_ready(port, proc, path="/ready", limit=60.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError("the server exited")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server did not start")


def server_argv(args, port):
    """The server's command line for --app and --server."""
    if args.server == "cyserve":
        return [sys.executable, "-m", "cyserve", "ws_idle_app:app", "--host", "127.0.0.1",
                "--port", str(port), "--threads", str(args.threads), "--ws-ping-interval", "0",
                "--backlog", "4096"]
    if args.server == "uvicorn":  # its WebSocket implementation is the websockets library's
        return [args.peer_python, "-m", "uvicorn", "ws_idle_app:app", "--host", "127.0.0.1",
                "--port", str(port), "--ws-ping-interval", "0", "--backlog", "4096",
                "--log-level", "warning"]
    return [args.peer_python, "-m", "granian", "--interface", "asgi", "ws_idle_app:app",
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--backlog", "4096",
            "--log-level", "warning"]


# The server under tracemalloc (--breakdown): a thread takes a snapshot whenever a file
# "<dir>/snapN.req" appears and answers with "<dir>/snapN.json".
BREAKDOWN = r"""
import ctypes, json, os, runpy, sys, threading, time, tracemalloc

tracemalloc.start(1)
_dir = sys.argv.pop(1)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                              "usmblks", "fsmblks", "uordblks", "fordblks",
                                              "keepcost")]


_libc = ctypes.CDLL(None)
_libc.mallinfo2.restype = _MallInfo2


def _stacks_rss_kib():
    total, size, rw = 0, 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and ":" not in first:
                lo, hi = (int(x, 16) for x in first.split("-"))
                size, rw = hi - lo, line.split()[1].startswith("rw")
                anon = len(line.split()) < 6
                rw = rw and anon
            elif first == "Rss:" and rw and size == 68 * 1024:  # 64 KiB and its header page
                total += int(line.split()[1])
    return total


def _watch():
    n = 0
    while True:
        req = os.path.join(_dir, f"snap{n}.req")
        if not os.path.exists(req):
            time.sleep(0.1)
            continue
        snap = tracemalloc.take_snapshot()
        stats = snap.statistics("lineno")
        large = sum(t.size for t in snap.traces if t.size > 512)
        out = {"python": sum(s.size for s in stats), "python_large": large,
               "malloc_in_use": _libc.mallinfo2().uordblks, "stacks_kib": _stacks_rss_kib(),
               "lines": {f"{s.traceback[0].filename}:{s.traceback[0].lineno}": s.size
                         for s in stats[:400]}}
        with open(os.path.join(_dir, f"snap{n}.json.tmp"), "w") as f:
            json.dump(out, f)
        os.rename(os.path.join(_dir, f"snap{n}.json.tmp"), os.path.join(_dir, f"snap{n}.json"))
        n += 1


threading.Thread(target=_watch, daemon=True).start()
sys.argv[0] = "cyserve"
runpy.run_module("cyserve", run_name="__main__", alter_sys=True)
"""


def snapshot(tmp, n, proc, limit=120.0):
    """Ask the server under --breakdown for snapshot n; its JSON."""
    open(os.path.join(tmp, f"snap{n}.req"), "w").close()
    path = os.path.join(tmp, f"snap{n}.json")
    end = time.monotonic() + limit
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError("the server gave no tracemalloc snapshot")
        time.sleep(0.1)
    with open(path) as f:
        return json.load(f)


def breakdown(before, after, conns):
    """Bytes per connection by part, and the Python lines that grew most."""
    py = after["python"] - before["python"]
    heap = after["malloc_in_use"] - before["malloc_in_use"]
    py_large = after["python_large"] - before["python_large"]
    lines = {k: v - before["lines"].get(k, 0) for k, v in after["lines"].items()}
    top = sorted(lines.items(), key=lambda kv: -kv[1])[:12]
    return {
        "python_bytes_per_conn": round(py / conns),
        "c_heap_bytes_per_conn": round((heap - py_large) / conns),
        "stacks_bytes_per_conn": round((after["stacks_kib"] - before["stacks_kib"]) * 1024
                                       / conns),
        "python_top_lines": {k: round(v / conns) for k, v in top if v > 0},
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conns", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument("--deflate", action="store_true",
                    help="negotiate permessage-deflate and echo one compressed message")
    ap.add_argument("--app", choices=sorted(APPS), default="nogil",
                    help="which echo: the GIL-free one, a raw ASGI app, or @app.websocket")
    ap.add_argument("--server", choices=["cyserve", "uvicorn", "granian"], default="cyserve",
                    help="who serves --app asgi (the others are cyserve's alone)")
    ap.add_argument("--peer-python", default=os.path.join(ROOT, "bench", ".venv", "bin",
                                                          "python"),
                    help="the Python that has uvicorn and granian (default bench/.venv's)")
    ap.add_argument("--breakdown", action="store_true",
                    help="run the server under tracemalloc and say where the growth went")
    args = ap.parse_args(argv)
    if args.server != "cyserve" and args.app != "asgi":
        ap.error("--server uvicorn and granian serve --app asgi only")
    if args.breakdown and args.server != "cyserve":
        ap.error("--breakdown is for cyserve")
    need = args.conns + 512
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        sys.exit(f"RLIMIT_NOFILE's hard limit {hard} is under {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))  # inherited by the server
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "ws_idle_app.py"), "w") as f:
            f.write(APPS[args.app])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, ROOT, os.path.join(ROOT, "src")]))
        argv = server_argv(args, port)
        if args.breakdown:
            argv[1:3] = ["-c", BREAKDOWN, tmp]  # instead of -m cyserve
        proc = subprocess.Popen(argv, env=env, cwd=tmp)
        parts = None
        try:
            wait_ready(port, proc, READY[args.app])
            open_idle(port, 8, args.deflate)  # the first WebSockets' one-time costs (caches, code pages)
            time.sleep(args.settle)
            snap0 = snapshot(tmp, 0, proc) if args.breakdown else None
            rss0, pss0 = tree_rss_kib(proc.pid), tree_pss_kib(proc.pid)
            socks = open_idle(port, args.conns, args.deflate)
            time.sleep(args.settle)
            rss1, pss1 = tree_rss_kib(proc.pid), tree_pss_kib(proc.pid)
            if args.breakdown:
                parts = breakdown(snap0, snapshot(tmp, 1, proc), args.conns)
            for s in socks:
                s.close()
        finally:
            proc.terminate()
            proc.wait(30)
    print(json.dumps({
        "app": args.app, "server": args.server,
        "conns": args.conns, "threads": args.threads, "deflate": args.deflate,
        "rss_before_kib": rss0, "rss_after_kib": rss1,
        "rss_per_conn_bytes": round((rss1 - rss0) * 1024 / args.conns),
        "pss_before_kib": pss0, "pss_after_kib": pss1,
        "pss_per_conn_bytes": round((pss1 - pss0) * 1024 / args.conns),
        **({"breakdown": parts} if parts else {}),
    }))


if __name__ == "__main__":
    main()
