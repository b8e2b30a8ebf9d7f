"""The access log (`--access-log`, Config.access_log; csrc/access_log.c): one line per
response on standard output in the Common Log Format (or combined, or JSON lines with the seconds
the request took), for every kind of route and for rejected requests, never torn by concurrent
workers, to a file reopened on SIGUSR1 when asked, and nothing at all when it is off.

Each test runs the real command in a subprocess on port 0 and reads its standard output.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from _certs import self_signed
from _procfd import fd_targets

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

SERVING = re.compile(r"cyserve: serving on https?://127\.0\.0\.1:(\d+) with \d+ threads? "
                     r"\(pid \d+\)")
# The Common Log Format exactly: host (no port), identity, user, [time], "request", status, bytes.
LINE = re.compile(r'(127\.0\.0\.1) - - \[(\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d \+0000)\] '
                  r'"([^"]*)" (\d{3}) (\d+|-)')


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
    assert [(req, status, size) for _, _, req, status, size in parsed] == [
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


def test_json_lines_carry_the_port_the_scheme_and_the_seconds(tmp_path: Path) -> None:
    proc, port = serve(tmp_path, "--access-log", "--access-log-format", "json")
    try:
        before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
            client_port = s.getsockname()[1]
            s.sendall(b"GET /slow?a=%22 HTTP/1.1\r\nHost: x\r\nReferer: http://r/\"q\"\r\n"
                      b"User-Agent: agent\xe9\\1\r\nConnection: close\r\n\r\n")
            while s.recv(65536):
                pass
        get(port, "/plaintext")
        assert exchange(port, b"GET / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        after = datetime.datetime.now(datetime.timezone.utc)
    finally:
        lines = stop(proc)
    records = [json.loads(line) for line in lines]  # each line is one valid JSON document
    slow, plain, bad = records
    assert slow == {"time": slow["time"], "client": "127.0.0.1", "port": client_port,
                    "scheme": "http", "method": "GET", "target": "/slow?a=%22",
                    "protocol": "HTTP/1.1", "status": 200, "bytes": 4,
                    "duration": slow["duration"], "referer": 'http://r/"q"',
                    "user_agent": "agent\u00e9\\1"}  # a byte above 0x7f: its Latin-1 character
    assert slow["duration"] >= 0.2 > plain["duration"]
    when = datetime.datetime.strptime(slow["time"], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)
    assert before <= when <= after
    assert (plain["target"], plain["referer"], plain["user_agent"]) == ("/plaintext", None, None)
    assert (bad["method"], bad["target"], bad["status"]) == (None, None, 400)


def test_json_lines_say_https_for_a_tls_connection(tmp_path: Path) -> None:
    # The scheme is the connection's own when no proxy header names one: a request over TLS,
    # HTTP/1.1 or HTTP/2, is "https" (it was "http" whenever proxy headers were off).
    certs = self_signed(tmp_path)
    proc, port = serve(tmp_path, "--access-log", "--access-log-format", "json",
                       "--ssl-certfile", certs["cert"], "--ssl-keyfile", certs["key"])
    ctx = ssl.create_default_context(cafile=certs["cert"])
    try:
        for http2 in (False, True):
            with httpx.Client(http1=not http2, http2=http2, verify=ctx,
                              timeout=TIMEOUT) as client:
                r = client.get(f"https://localhost:{port}/plaintext")
                assert (r.http_version, r.text) == ("HTTP/2" if http2 else "HTTP/1.1",
                                                    "Hello, World!")
    finally:
        lines = stop(proc)
    records = [json.loads(line) for line in lines]
    assert [(r["protocol"], r["status"], r["scheme"]) for r in records] == [
        ("HTTP/1.1", 200, "https"), ("HTTP/2.0", 200, "https")]


def test_combined_adds_the_referer_and_the_user_agent_escaped(tmp_path: Path) -> None:
    proc, port = serve(tmp_path, "--access-log", "--access-log-format", "combined")
    try:
        exchange(port, b"GET /py HTTP/1.1\r\nHost: x\r\nReferer: http://r/\"q\"\r\n"
                       b"User-Agent: agent\xe9\\1\r\nConnection: close\r\n\r\n")
        get(port, "/plaintext")
    finally:
        lines = stop(proc)
    tail = [line.split(" 200 ", 1)[1] for line in lines]
    assert tail == ['11 "http://r/\\"q\\"" "agent\\xe9\\\\1"', '13 "-" "-"']
    for line in lines:
        assert LINE.match(line), line  # still a CLF line up to the bytes: CLF parsers read it


def test_a_log_file_is_reopened_on_sigusr1(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    proc, port = serve(tmp_path, "--access-logfile", str(log))
    try:
        get(port, "/plaintext")
        wait_for(lambda: log.read_text().count("\n") == 1)
        log.rename(tmp_path / "access.log.1")  # what logrotate does, then it signals
        proc.send_signal(signal.SIGUSR1)
        # Reopened once no descriptor of the server is on the old file: the new file exists a
        # moment before the server's log descriptor is moved onto it.
        wait_for(lambda: log.exists() and not _holds(proc.pid, tmp_path / "access.log.1"))
        get(port, "/py")
        wait_for(lambda: log.read_text().count("\n") == 1)
    finally:
        lines = stop(proc)
    assert lines == []  # nothing on standard output
    assert '"GET /plaintext HTTP/1.1" 200 13' in (tmp_path / "access.log.1").read_text()
    assert '"GET /py HTTP/1.1" 200 11' in log.read_text()
    assert oct(log.stat().st_mode & 0o777) == oct(0o644 & ~current_umask())


def test_a_dash_for_the_log_file_is_standard_output(tmp_path: Path) -> None:
    # gunicorn's spelling (`--access-logfile -`), common in the command lines users bring: the
    # lines go to standard output, and no file named "-" is made in the current folder.
    proc, port = serve(tmp_path, "--access-logfile", "-")
    try:
        get(port, "/plaintext")
    finally:
        lines = stop(proc)
    assert len(lines) == 1 and '"GET /plaintext HTTP/1.1" 200 13' in lines[0], lines
    assert not (tmp_path / "-").exists()


def test_worker_processes_reopen_on_sigusr1_too(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        fixed = s.getsockname()[1]
    (tmp_path / "log_app.py").write_text(textwrap.dedent(APP))
    proc = subprocess.Popen([sys.executable, "-m", "cyserve", "log_app:app", "--port", str(fixed),
                             "--processes", "2", "--access-logfile", str(log)], cwd=tmp_path,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        wait_for(lambda: _answers(fixed))
        for _ in range(20):  # over fresh connections: both workers answer some
            get(fixed, "/plaintext")
        wait_for(lambda: log.read_text().count("\n") >= 20)
        log.rename(tmp_path / "access.log.1")
        proc.send_signal(signal.SIGUSR1)
        # The supervisor passes it on and each worker reopens: by then no worker has a
        # descriptor on the old file (a fixed pause could end before a busy machine got there).
        wait_for(lambda: not any(_holds(pid, tmp_path / "access.log.1")
                                 for pid in _children(proc.pid)))
        for _ in range(20):
            get(fixed, "/py")
        wait_for(lambda: log.exists() and log.read_text().count("\n") == 20)
        assert proc.poll() is None  # SIGUSR1 ended no process
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    old = (tmp_path / "access.log.1").read_text().splitlines()
    new = log.read_text().splitlines()
    assert len(old) == 21 and all("/plaintext" in line for line in old)  # and the probe's
    assert len(new) == 20 and all('"GET /py HTTP/1.1" 200 11' in line for line in new)


def test_a_log_file_that_cannot_be_opened_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "log_app.py").write_text(textwrap.dedent(APP))
    proc = subprocess.run([sys.executable, "-m", "cyserve", "log_app:app", "--port", "0",
                           "--access-logfile", str(tmp_path / "missing" / "access.log")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode != 0
    assert "access-logfile" in proc.stderr and "No such file or directory" in proc.stderr, \
        proc.stderr


def _answers(port: int) -> bool:
    try:
        return get(port, "/plaintext").endswith(b"Hello, World!")
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def _holds(pid: int, path: Path) -> bool:
    """Whether process pid has a descriptor open on path (False once it is gone)."""
    return str(path) in fd_targets(pid).values()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def wait_for(cond: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


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


def test_a_gunicorn_format_is_compiled_once_and_written_per_line(tmp_path: Path) -> None:
    fmt = ('%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s" m=%(m)s U=%(U)s '
           'q=%(q)s H=%(H)s B=%(B)s D=%(D)s T=%(T)s M=%(M)s L=%(L)s p=%(p)s '
           'x=%({X-Request-Id}i)s 100%%')
    proc, port = serve(tmp_path, "--access-log", "--access-log-format", fmt)
    try:
        exchange(port, b"GET /slow?a=1&b=%22 HTTP/1.1\r\nHost: x\r\nReferer: http://r/\"q\"\r\n"
                       b"User-Agent: agent\xe9\r\nX-Request-Id: abc-123\r\n"
                       b"Connection: close\r\n\r\n")
        get(port, "/plaintext", "HEAD")
        assert exchange(port, b"GET / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    finally:
        pid = proc.pid
        lines = stop(proc)
    slow, head, bad = lines
    m = re.fullmatch(r'127\.0\.0\.1 - - \[(\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d \+0000)\] '
                     r'"GET /slow\?a=1&b=%22 HTTP/1\.1" 200 4 "http://r/\\"q\\"" "agent\\xe9" '
                     r'm=GET U=/slow q=a=1&b=%22 H=HTTP/1\.1 B=4 D=(\d+) T=(\d+) M=(\d+) '
                     r'L=(\d+\.\d{6}) p=<(\d+)> x=abc-123 100%', slow)
    assert m, slow
    micros, secs, millis, decimal, logged_pid = (int(m.group(2)), int(m.group(3)),
                                                  int(m.group(4)), float(m.group(5)),
                                                  int(m.group(6)))
    assert micros >= 200_000 and millis == micros // 1000 and secs == micros // 1_000_000
    assert abs(decimal - micros / 1e6) < 1e-5
    assert logged_pid == pid
    assert ' "HEAD /plaintext HTTP/1.1" 200 0 "-" "-" m=HEAD U=/plaintext q= ' in head
    assert ' x=- 100%' in head
    # Rejected before it was parsed: no request line, no method, nothing timed.
    assert re.search(r'"-" 400 \d+ "-" "-" m=- U=- q= H=- B=\d+ D=0 T=0 M=0 L=0\.000000 ', bad), bad


def test_an_unknown_atom_is_a_one_line_error_at_start(tmp_path: Path) -> None:
    (tmp_path / "log_app.py").write_text(textwrap.dedent(APP))
    for fmt, says in [("%(h)s %(zz)s", "unknown atom %(zz)s"),
                      ("%(h)s %({Content-Type}o)s", "not supported"),
                      ("%(h)s 100%", "starts no %(name)s atom")]:
        proc = subprocess.run([sys.executable, "-m", "cyserve", "log_app:app", "--port", "0",
                               "--access-log", "--access-log-format", fmt], cwd=tmp_path,
                              text=True, capture_output=True, timeout=TIMEOUT)
        assert proc.returncode != 0 and proc.stdout == ""
        err = proc.stderr.strip()
        assert "\n" not in err and err.startswith("cyserve: invalid --access-log-format"), err
        assert says in err, err
