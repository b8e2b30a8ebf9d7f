"""A server run as a user runs it: a subprocess on a free port, asked until it answers, stopped
with SIGTERM (SIGKILL if it does not stop), its output kept for the failure message."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from _rawhttp import Conn, Reply, get

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A port that was free a moment ago (the kernel's choice for a bind to port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, out: Path,
                 tls: ssl.SSLContext | None = None) -> None:
        self.proc, self.port, self._out, self.tls = proc, port, out, tls

    def output(self) -> str:
        return self._out.read_text(errors="replace")

    def get(self, path: str, extra: str = "") -> Reply:
        with Conn(self.port) as c:
            if self.tls is not None:  # an HTTPS server: the same request over TLS
                c.sock = self.tls.wrap_socket(c.sock, server_hostname="localhost")
            c.send(get(path, host=f"127.0.0.1:{self.port}", extra=extra))
            return c.reply()


def env_with_src(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a user in the repository with the .venv active: the package built in
    place is importable whatever the current folder (the sanitizer stage sets PYTHONPATH to
    its own copy, which is kept)."""
    env = dict(os.environ)
    paths = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    env["PYTHONPATH"] = os.pathsep.join(paths + [str(ROOT / "src"), str(ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@contextlib.contextmanager
def running(argv: Sequence[str], port: int, cwd: Path | str = ROOT,
            env: dict[str, str] | None = None, probe: str = "/",
            timeout: float = 60.0, tls: ssl.SSLContext | None = None) -> Iterator[Running]:
    """Starts argv and waits until a GET of `probe` on `port` gets any answer. Stops it on exit
    with SIGTERM and expects it to end within 20 s. With tls, requests are made over TLS."""
    with tempfile.NamedTemporaryFile(prefix="cyserve-sub-", suffix=".log", delete=False) as f:
        out = Path(f.name)
    log = out.open("wb")
    proc = subprocess.Popen(list(argv), cwd=str(cwd),
                            env=env if env is not None else env_with_src(),
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    srv = Running(proc, port, out, tls)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"{' '.join(argv)} exited with {proc.returncode} before "
                                     f"answering:\n{srv.output()}")
            try:
                srv.get(probe)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{' '.join(argv)} did not answer on port {port} "
                                         f"within {timeout} s:\n{srv.output()}") from None
                time.sleep(0.1)
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise AssertionError(f"{' '.join(argv)} did not stop on SIGTERM:\n"
                                     f"{srv.output()}") from None
        log.close()
        text = srv.output()
        out.unlink()
        srv.output = lambda: text  # type: ignore[method-assign]


PYTHON = sys.executable
