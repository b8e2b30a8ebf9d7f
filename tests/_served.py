"""A cyserve command serving a small app in a subprocess, for the end-to-end tests of where it
listens and what it believes (tests/e2e/test_listen.py, test_proxy_headers.py, test_lifecycle.py):
its status lines read as they come, raw requests over any socket family."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

TIMEOUT = 60.0

APP = """
import os

import cyserve

app = cyserve.App()


@app.get("/who")
def who(request):
    return f"{os.getpid()} {request.client}"


app.static("/plain", b"plain")
"""

SERVING = re.compile(r"cyserve: serving on (.+) with \d+ threads? \(pid (\d+)\)")


def free_port(family: int = socket.AF_INET, host: str = "127.0.0.1") -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def _kill_session(sid: int) -> None:
    """SIGKILL every process left in session sid (Served starts each server in its own)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        # After the name: state, ppid, pgrp, session.
        if len(fields) > 3 and int(fields[3]) == sid:
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass


class Served:
    """`cyserve listen_app:app ARGS...` in a session of its own, its output read line by line."""

    def __init__(self, tmp: Path, *args: str, pass_fds: tuple[int, ...] = (),
                 launcher: list[str] | None = None, wait_serving: int = 1,
                 app: str = APP, env: dict[str, str] | None = None) -> None:
        (tmp / "listen_app.py").write_text(textwrap.dedent(app))
        cmd = [sys.executable, "-m", "cyserve", "listen_app:app", *args]
        self.proc = subprocess.Popen((launcher or []) + cmd, cwd=tmp, pass_fds=pass_fds,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.all_lines: list[str] = []  # every line read, including those taken from lines
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.serving: list[str] = []
        while len(self.serving) < wait_serving:
            line = self.lines.get(timeout=TIMEOUT)
            m = SERVING.fullmatch(line)
            if m:
                self.serving.append(m.group(1))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.all_lines.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(TIMEOUT)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # Worker processes have process groups of their own (supervisor.py), so the kill above
        # misses them; they end when their supervisor does (SIGTERM from the kernel), unless one
        # is stuck in C holding the GIL, as the --worker-timeout tests make them. Such a worker
        # would keep this reader's pipe open, and the test run would hang on it: kill what is
        # left of the session.
        _kill_session(self.proc.pid)
        self._reader.join(TIMEOUT)
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            self.stderr = self.proc.stderr.read()  # the process has exited: this ends
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def request(family: int, address: object, path: str = "/who") -> tuple[bytes, str]:
    """One GET over a fresh connection: (status line, body)."""
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect(address)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body.decode()


