"""The access log (`--access-log`, Config.access_log; csrc/access_log.c): one line per
response on standard output in the Common Log Format plus the seconds the request took, for every
kind of route and for rejected requests, never torn by concurrent workers, and nothing at all
when it is off.

Each test runs the real command in a subprocess on port 0 and reads its standard output.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.native

TIMEOUT = 60.0

APP = """
import time

import cyserve

app = cyserve.App()
app.static("/plaintext", "Hello, World!")


@app.get("/py")
def py(request):
    return "from python"


@app.get("/slow")
def slow(request):
    time.sleep(0.2)
    return "slow"
"""

SERVING = re.compile(r"cyserve: serving on http://127\.0\.0\.1:(\d+) with \d+ threads? "
                     r"\(pid \d+\)")
LINE = re.compile(r'127\.0\.0\.1:(\d+) - - \[(\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d \+0000)\] '
                  r'"([^"]*)" (\d{3}) (\d+|-) (\d+\.\d{6})')


def serve(tmp: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    (tmp / "log_app.py").write_text(textwrap.dedent(APP))
    proc = subprocess.Popen([sys.executable, "-m", "cyserve", "log_app:app", "--port", "0",
                             "--threads", "2", *args], cwd=tmp, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.stdout is not None
    first = proc.stdout.readline().rstrip("\n")
    m = SERVING.fullmatch(first)
    assert m, first
    return proc, int(m.group(1))


def stop(proc: subprocess.Popen[str]) -> list[str]:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert (proc.returncode, err) == (0, "")
    lines = out.splitlines()
    assert lines[-1] == "cyserve: shutting down"
    return lines[:-1]


def exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return got


def get(port: int, target: str, method: str = "GET") -> bytes:
    return exchange(port, f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                    .encode())


def test_one_line_per_response_for_every_kind_of_route(tmp_path: Path) -> None:
    proc, port = serve(tmp_path, "--access-log")
    try:
        before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        assert get(port, "/plaintext").endswith(b"Hello, World!")
        get(port, "/plaintext", "HEAD")
        get(port, "/py?x=1&y=%20")
        get(port, "/missing")
        get(port, "/slow")
        # HTTP/1.1 without Host: rejected by the parser, so no request line to log.
        assert exchange(port, b"GET / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        after = datetime.datetime.now(datetime.timezone.utc)
    finally:
        lines = stop(proc)
    parsed = []
    for line in lines:
        m = LINE.fullmatch(line)
        assert m, line
        parsed.append(m.groups())
    assert [(req, status, size) for _, _, req, status, size, _ in parsed] == [
        ("GET /plaintext HTTP/1.1", "200", "13"),
        ("HEAD /plaintext HTTP/1.1", "200", "0"),
        ("GET /py?x=1&y=%20 HTTP/1.1", "200", "11"),
        ("GET /missing HTTP/1.1", "404", "14"),
        ("GET /slow HTTP/1.1", "200", "4"),
        ("-", "400", str(len(b"400 Bad Request: missing host\n"))),  # the body sent
    ]
    for _, stamp, *_ in parsed:
        when = datetime.datetime.strptime(stamp, "%d/%b/%Y:%H:%M:%S %z")
        assert before <= when <= after
    seconds = {req: float(secs) for _, _, req, _, _, secs in parsed}
    assert seconds["GET /slow HTTP/1.1"] >= 0.2
    assert seconds["GET /plaintext HTTP/1.1"] < 0.2


def test_concurrent_lines_are_never_torn(tmp_path: Path) -> None:
    proc, port = serve(tmp_path, "--access-log")
    per_thread, threads = 25, 16

    def client(i: int) -> None:
        for j in range(per_thread):
            get(port, f"/py?client={i}&n={j}")

    try:
        workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(TIMEOUT)
    finally:
        lines = stop(proc)
    assert len(lines) == per_thread * threads
    seen = set()
    for line in lines:
        m = LINE.fullmatch(line)
        assert m and m.group(4) == "200", line
        seen.add(m.group(3))
    assert seen == {f"GET /py?client={i}&n={j} HTTP/1.1"
                    for i in range(threads) for j in range(per_thread)}


def test_off_by_default(tmp_path: Path) -> None:
    proc, port = serve(tmp_path)
    try:
        get(port, "/plaintext")
        get(port, "/py")
        exchange(port, b"GET / HTTP/1.1\r\n\r\n")
    finally:
        lines = stop(proc)
    assert lines == []
