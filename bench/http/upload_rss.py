"""How much memory does a large upload cost the server?

    .venv/bin/python bench/http/upload_rss.py [--mib 1024] [--chunked] [--app wsgi|native]

Starts `cyserve` with one worker thread and `--max-body-bytes` above the upload, whose app hashes
the body as it reads it (a WSGI app reading wsgi.input in 64 KiB reads, or an App handler
iterating request.stream()), sends one upload of --mib MiB (pseudo-random, Content-Length or
chunked) from this process, checks the answer (the byte count and SHA-256), and prints the
server's RSS before, its peak (VmHWM) after, the time and the rate. With the body read whole
before the call (as before bodies streamed), the peak grows with the upload; streamed, it stays
at the window's size. The figures are for docs/architecture.md; nothing here is a test.
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
'''


def kib(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else -1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--chunked", action="store_true")
    p.add_argument("--app", choices=("wsgi", "native"), default="wsgi")
    args = p.parse_args()
    size = args.mib << 20
    block = os.urandom(1 << 20)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "upload_app.py").write_text(APP)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=f"{tmp}{os.pathsep}{ROOT / 'src'}")
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
            path = "/w" if args.app == "wsgi" else "/n"
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


if __name__ == "__main__":
    main()
