"""A server at its descriptor limit (accept4 fails with EMFILE) says so on standard error, at most
once a second, pauses accepting instead of spinning, and serves again once descriptors are
freed. It used to retry silently: clients hung in the accept queue with nothing telling the
operator why."""

from __future__ import annotations

import os
import queue
import re
import resource
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from _rawhttp import Conn, get
from _subserve import env_with_src

LIMIT = 64  # RLIMIT_NOFILE of the server process
TIMEOUT = 60.0
LINE = "cyserve: cannot accept connections: too many open files (EMFILE)"
SERVING = re.compile(r"cyserve: serving on http://127\.0\.0\.1:(\d+) with 1 thread "
                     r"\(pid (\d+)\)")
APP = """
import cyserve

app = cyserve.App()
app.static("/plaintext", "Hello, World!")
"""


def _low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime (fields 14 and 15 of the line; here counted after the name), every thread
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_emfile_at_accept_is_logged_paced_and_survived(tmp_path: Path) -> None:
    (tmp_path / "limit_app.py").write_text(textwrap.dedent(APP))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cyserve", "limit_app:app", "--port", "0", "--threads", "1",
         "--keepalive-timeout", "60"],
        cwd=tmp_path, env=env_with_src(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=_low_limit)
    errors: queue.Queue[str] = queue.Queue()
    stderr: list[str] = []

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            stderr.append(line.rstrip("\n"))
            errors.put(line.rstrip("\n"))

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    conns: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        m = SERVING.fullmatch(proc.stdout.readline().rstrip("\n"))
        assert m, stderr
        port = int(m.group(1))
        used = _fds(proc.pid)
        # Enough connections to take every free descriptor, and ten more that stay queued.
        for _ in range(LIMIT - used + 10):
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT))
        deadline = time.monotonic() + TIMEOUT
        while _fds(proc.pid) < LIMIT:
            assert time.monotonic() < deadline, (used, _fds(proc.pid))
            time.sleep(0.01)
        at_limit = time.monotonic()

        # Said on standard error, with what to do.
        line = ""
        while not line.startswith("cyserve: cannot accept"):
            try:
                line = errors.get(timeout=5.0)
            except queue.Empty:
                raise AssertionError(f"nothing said at the limit: {stderr}") from None
        assert line.startswith(LINE), line
        assert f"limit of {LIMIT} descriptors" in line and "ulimit -n" in line, line

        # Paused, not spinning: the process's CPU time over a second at the limit.
        cpu0 = _cpu_seconds(proc.pid)
        time.sleep(1.0)
        cpu = _cpu_seconds(proc.pid) - cpu0
        held = time.monotonic() - at_limit
        print(f"\nat the descriptor limit: {cpu:.3f} s of CPU in 1 s")
        assert cpu < 0.5

        # At most one line a second.
        lines = [s for s in stderr if s.startswith("cyserve: cannot accept")]
        assert 1 <= len(lines) <= 1 + int(held) + 1, lines

        # Freed descriptors: the queued connections are taken and new ones served.
        for s in conns:
            s.close()
        conns.clear()
        deadline = time.monotonic() + 10.0
        while True:
            try:
                with Conn(port, timeout=2.0) as c:
                    c.send(get("/plaintext"))
                    r = c.reply()
                    assert (r.status, r.body) == (200, b"Hello, World!")
                    break
            except OSError:
                assert time.monotonic() < deadline, "not serving after descriptors were freed"
        proc.terminate()
        assert proc.wait(TIMEOUT) == 0, stderr
    finally:
        for s in conns:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(TIMEOUT)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
