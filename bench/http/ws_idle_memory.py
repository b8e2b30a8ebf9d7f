"""Resident memory of idle GIL-free WebSockets (docs/benchmarks.md, "Idle WebSockets").

Starts `cyserve` on bench/http/apps/cyserve_ws_nogil_app.py's echo (examples/ws_echo_nogil.pyx, as
`make build` builds it in place), reads the server's RSS and PSS, opens N WebSockets that each
send one 32-byte text message and read its echo (so every connection has been served and is idle
on the server again, holding no coroutine), waits, reads RSS and PSS again, and reports the
growth per connection. The server's RLIMIT_NOFILE and this process's are raised to fit N.
With --deflate each WebSocket negotiates permessage-deflate and its one message is a compressed
128-byte text, which the server inflates and echoes compressed: both of zlib's streams have then
been used for that connection.

    .venv/bin/python bench/http/ws_idle_memory.py --conns 10000 --threads 1 [--deflate]
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

APP = """
import cyserve
from examples import ws_echo_nogil

app = cyserve.App()
app.nogil_websocket("/ws", ws_echo_nogil.ECHO)
app.static("/ready", b"ok")
"""


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
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(req + msg)
        socks.append(s)
    for s in socks:
        data = b""
        while not (b"\r\n\r\n" in data and len(data.split(b"\r\n\r\n", 1)[1]) >= len(want)):
            chunk = s.recv(4096)
            if not chunk:
                raise RuntimeError("server closed a WebSocket")
            data += chunk
        if not data.startswith(b"HTTP/1.1 101 "):
            raise RuntimeError(f"handshake answered {data[:40]!r}")
        head, body = data.split(b"\r\n\r\n", 1)
        if deflate and b"permessage-deflate" not in head:
            raise RuntimeError("permessage-deflate was not negotiated")
        if body != want:
            raise RuntimeError(f"the echo was {body[:40]!r}, not {want[:40]!r}")
    return socks


def wait_ready(port, proc, limit=60.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError("the server exited")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server did not start")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conns", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument("--deflate", action="store_true",
                    help="negotiate permessage-deflate and echo one compressed message")
    args = ap.parse_args(argv)
    need = args.conns + 512
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        sys.exit(f"RLIMIT_NOFILE's hard limit {hard} is under {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))  # inherited by the server
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "ws_idle_app.py"), "w") as f:
            f.write(APP)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, ROOT, os.path.join(ROOT, "src")]))
        proc = subprocess.Popen([sys.executable, "-m", "cyserve", "ws_idle_app:app", "--host",
                                 "127.0.0.1", "--port", str(port), "--threads",
                                 str(args.threads), "--ws-ping-interval", "0",
                                 "--backlog", "4096"], env=env, cwd=tmp)
        try:
            wait_ready(port, proc)
            open_idle(port, 8, args.deflate)  # the first WebSockets' one-time costs (caches, code pages)
            time.sleep(args.settle)
            rss0, pss0 = tree_rss_kib(proc.pid), tree_pss_kib(proc.pid)
            socks = open_idle(port, args.conns, args.deflate)
            time.sleep(args.settle)
            rss1, pss1 = tree_rss_kib(proc.pid), tree_pss_kib(proc.pid)
            for s in socks:
                s.close()
        finally:
            proc.terminate()
            proc.wait(30)
    print(json.dumps({
        "conns": args.conns, "threads": args.threads, "deflate": args.deflate,
        "rss_before_kib": rss0, "rss_after_kib": rss1,
        "rss_per_conn_bytes": round((rss1 - rss0) * 1024 / args.conns),
        "pss_before_kib": pss0, "pss_after_kib": pss1,
        "pss_per_conn_bytes": round((pss1 - pss0) * 1024 / args.conns),
    }))


if __name__ == "__main__":
    main()
