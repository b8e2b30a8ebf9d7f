"""How much memory does a large upload, or a large download, cost the server?

    .venv/bin/python bench/http/upload_rss.py [--mib 1024] [--chunked] [--app wsgi|native|asgi]
    .venv/bin/python bench/http/upload_rss.py --download [--mib 1024] [--app wsgi|asgi]

Starts `cyserve` with one worker thread and `--max-body-bytes` above the upload, whose app hashes
the body as it reads it (a WSGI app reading wsgi.input in 64 KiB reads, an App handler
iterating request.stream(), or an ASGI app awaiting receive()), sends one upload of --mib MiB
(pseudo-random, Content-Length or chunked) from this process, checks the answer (the byte count
and SHA-256), and prints the server's RSS before, its peak (VmHWM) after, the time and the rate.
With the body read whole before the call (as before bodies streamed), the peak grows with the
upload; streamed, it stays at the window's size.

--download turns it round: the app answers with --mib MiB made of one pseudo-random MiB repeated
(a WSGI app returning a generator of 1 MiB pieces, or an ASGI app sending them with more_body),
this process reads and hashes it, and the same figures are printed. A server that queued the
pieces faster than the client reads them would grow with the download; one that applies
backpressure stays flat. The figures are for docs/architecture.md; nothing here is a test.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

APP = '''
import hashlib
import cyserve

def wsgi(environ, start_response):
    h = hashlib.sha256()
    n = 0
    inp = environ["wsgi.input"]
    while True:
        piece = inp.read(65536)
        if not piece:
            break
        h.update(piece)
        n += len(piece)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{n} {h.hexdigest()}".encode()]

app = cyserve.App()
app.wsgi("/w", wsgi)

@app.post("/n")
def native(request):
    h = hashlib.sha256()
    n = 0
    for piece in request.stream():
        h.update(piece)
        n += len(piece)
    return f"{n} {h.hexdigest()}"


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    h = hashlib.sha256()
    n = 0
    more = True
    while more:
        event = await receive()
        piece = event.get("body", b"")
        h.update(piece)
        n += len(piece)
        more = event.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": f"{n} {h.hexdigest()}".encode()})

app.asgi("/a", asgi)

import os
import random
BLOCK = random.Random(1).randbytes(1 << 20)
MIB = int(os.environ["DOWNLOAD_MIB"])


def wsgi_down(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/octet-stream"),
                              ("Content-Length", str(MIB << 20))])
    # A new bytes object per piece, as an app that reads or renders it would make: pieces queued
    # without backpressure would each hold their MiB.
    return (bytes(bytearray(BLOCK)) for _ in range(MIB))

app.wsgi("/wd", wsgi_down)


async def asgi_down(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/octet-stream"),
                            (b"content-length", str(MIB << 20).encode())]})
    for i in range(MIB):
        await send({"type": "http.response.body", "body": bytes(bytearray(BLOCK)),
                    "more_body": i < MIB - 1})

app.asgi("/ad", asgi_down)
'''


def kib(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else -1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--chunked", action="store_true")
    p.add_argument("--app", choices=("wsgi", "native", "asgi"), default="wsgi")
    p.add_argument("--download", action="store_true")
    args = p.parse_args()
    if args.download and args.app == "native":
        p.error("--download is measured for --app wsgi and --app asgi")
    size = args.mib << 20
    block = os.urandom(1 << 20)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "upload_app.py").write_text(APP)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=f"{tmp}{os.pathsep}{ROOT / 'src'}",
                   DOWNLOAD_MIB=str(args.mib))
        srv = subprocess.Popen(
            [sys.executable, "-m", "cyserve", "upload_app:app", "--port", str(port),
             "--threads", "1", "--max-body-bytes", str(size + (1 << 20))],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert srv.stdout is not None
            for line in srv.stdout:
                if "serving on" in line:
                    break
            rss0 = kib(srv.pid, "VmRSS")
            if args.download:
                download(srv.pid, port, args.app, args.mib, rss0)
                return
            path = {"wsgi": "/w", "native": "/n", "asgi": "/a"}[args.app]
            head = f"POST {path} HTTP/1.1\r\nHost: t\r\n"
            head += ("Transfer-Encoding: chunked\r\n\r\n" if args.chunked
                     else f"Content-Length: {size}\r\n\r\n")
            h = hashlib.sha256()
            t0 = time.monotonic()
            with socket.create_connection(("127.0.0.1", port)) as c:
                c.sendall(head.encode())
                for _ in range(args.mib):
                    h.update(block)
                    if args.chunked:
                        c.sendall(b"100000\r\n" + block + b"\r\n")
                    else:
                        c.sendall(block)
                if args.chunked:
                    c.sendall(b"0\r\n\r\n")
                reply = b""
                while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(
                        h.hexdigest().encode()):
                    got = c.recv(65536)
                    if not got:
                        break
                    reply += got
            took = time.monotonic() - t0
            peak = kib(srv.pid, "VmHWM")
            ok = reply.split(b"\r\n\r\n", 1)[-1].decode() == f"{size} {h.hexdigest()}"
            print(f"{args.mib} MiB {'chunked' if args.chunked else 'Content-Length'} to the "
                  f"{args.app} app: answer {'right' if ok else 'WRONG ' + repr(reply[:200])}; "
                  f"server RSS {rss0 / 1024:.1f} MiB before, peak {peak / 1024:.1f} MiB; "
                  f"{took:.1f} s ({args.mib / took:.0f} MiB/s)")
        finally:
            srv.terminate()
            srv.wait(30)


def download(pid: int, port: int, app: str, mib: int, rss0: int) -> None:
    """Reads the app's download in 64 KiB receives, hashing it, then prints the figures."""
    import random
    want = hashlib.sha256()
    block = random.Random(1).randbytes(1 << 20)
    for _ in range(mib):
        want.update(block)
    path = "/wd" if app == "wsgi" else "/ad"
    h = hashlib.sha256()
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            got = c.recv(65536)
            if not got:
                break
            buf += got
        head, _, rest = buf.partition(b"\r\n\r\n")
        h.update(rest)
        n = len(rest)
        while n < mib << 20:
            got = c.recv(65536)
            if not got:
                break
            h.update(got)
            n += len(got)
    took = time.monotonic() - t0
    peak = kib(pid, "VmHWM")
    ok = n == mib << 20 and h.digest() == want.digest() and head.startswith(b"HTTP/1.1 200")
    print(f"{mib} MiB download from the {app} app: {n} bytes, "
          f"{'right' if ok else 'WRONG ' + repr(head[:200])}; server RSS {rss0 / 1024:.1f} MiB "
          f"before, peak {peak / 1024:.1f} MiB; {took:.1f} s ({mib / took:.0f} MiB/s)")


if __name__ == "__main__":
    main()
