"""A stress run of every Python path at once, for ThreadSanitizer on a free-threaded interpreter.

`make test-ft-tsan` builds the extension with -fsanitize=thread against CPython 3.14t and runs
this program with the TSan runtime preloaded: four workers call Python handlers, a WSGI app
and an ASGI app at the same time (no GIL orders them), beside static and body-echo routes,
with the access log on, while client processes keep every route busy. TSan sees only what
is instrumented, cyserve's C and Cython code (the interpreter is not): a report whose frames
are all in CPython is its own business and suppressed (tests/ft/tsan.supp); one with a frame
of cyserve's fails the run. At the end the shared counter must equal the answers counted by
the clients: a lost update would show there even where TSan cannot see.

Usage: python tests/ft/tsan_stress.py SECONDS
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import cyserve
from cyserve import Request
from cyserve.config import Config
from cyserve.start import serve

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
THREADS = 4
CLIENTS = 3
CONNS = 8

lock = threading.Lock()
counter = {"n": 0}
local = threading.local()


def count(request: Request) -> str:
    with lock:
        counter["n"] += 1
    return "counted"


def per_thread(request: Request) -> dict[str, int]:
    local.n = getattr(local, "n", 0) + 1
    return {"n": local.n, "tid": threading.get_ident()}


def wsgi_app(environ, start_response):  # type: ignore[no-untyped-def]
    body = environ["wsgi.input"].read()
    out = b"wsgi:" + environ["PATH_INFO"].encode() + b":" + str(len(body)).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(out)))])
    return [out]


async def asgi_app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    out = b"asgi:" + str(len(body)).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": out})


app = cyserve.App()
app.static("/plaintext", "Hello, World!", content_type="text/plain")
app.get("/count")(count)
app.get("/local")(per_thread)
app.route("/echo")(lambda request: request.body)
app.wsgi("/wsgi", wsgi_app)
app.asgi("/asgi", asgi_app)

CLIENT = r"""
import socket, sys, time
port, conns, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
reqs = [
    (b"GET /count HTTP/1.1\r\nHost: t\r\n\r\n", b"counted"),
    (b"GET /plaintext HTTP/1.1\r\nHost: t\r\n\r\n", b"Hello, World!"),
    (b"GET /local HTTP/1.1\r\nHost: t\r\n\r\n", b'"n"'),
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello", b"hello"),
    (b"POST /wsgi/x HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc", b"wsgi:/x:3"),
    (b"POST /asgi/y HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nabcd", b"asgi:4"),
]
socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(conns)]
counted = 0
i = 0
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    for s in socks:
        req, want = reqs[i % len(reqs)]
        i += 1
        s.sendall(req)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, "closed"
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(rest) < n:
            rest += s.recv(65536)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert want in rest, (want, rest)
        if want == b"counted":
            counted += 1
print(counted)
"""


def main() -> int:
    ready: list[object] = []
    stop = threading.Event()
    log = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"cyserve-tsan-{os.getpid()}.log")
    config = Config(host="127.0.0.1", port=0, threads=THREADS, access_logfile=log)
    th = threading.Thread(target=serve, args=(app, config),
                          kwargs={"stop_event": stop, "ready": ready.append}, daemon=True)
    th.start()
    deadline = time.monotonic() + 60
    while not ready and time.monotonic() < deadline:
        time.sleep(0.05)
    if not ready:
        print("tsan_stress: the server did not start", file=sys.stderr)
        return 1
    port = ready[0].port  # type: ignore[attr-defined]
    clients = [subprocess.Popen([sys.executable, "-c", CLIENT, str(port), str(CONNS),
                                 str(SECONDS)], stdout=subprocess.PIPE, text=True,
                                env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
               for _ in range(CLIENTS)]
    counted = 0
    failed = 0
    for c in clients:
        out, _ = c.communicate(timeout=SECONDS + 120)
        if c.returncode != 0:
            failed += 1
        else:
            counted += int(out.strip())
    stop.set()
    th.join(60)
    with open(log, "rb") as f:
        lines = sum(1 for _ in f)
    os.unlink(log)
    print(json.dumps({"counted_by_clients": counted, "counter": counter["n"],
                      "clients_failed": failed, "access_log_lines": lines,
                      "gil_enabled": sys._is_gil_enabled()}))  # type: ignore[attr-defined]
    if failed or counted != counter["n"] or th.is_alive():
        print("tsan_stress: FAILED", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
