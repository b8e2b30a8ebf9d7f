"""Processes every driver starts and measures: a free port, a server started in its own session
(pinned with taskset when asked) and waited for until it listens, and stopped by its process
group, so that workers it forked go with it.

Stdlib only, like the rest of bench/common/."""

import os
import shutil
import signal
import socket
import subprocess
import time

from bench.common.pinning import pinned


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout):
    """True once 127.0.0.1:port accepts a connection; False if proc exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class Running:
    """A started server: its Popen (whose pid is the root of the measured tree) and its log."""

    def __init__(self, proc, port, log_path, cleanup=None):
        self.proc, self.port, self.log_path, self.cleanup = proc, port, log_path, cleanup

    @property
    def pid(self):
        return self.proc.pid

    def log_tail(self, n=600):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def stop(self, grace=1.0):
        """Stop by the pid we started: SIGTERM to its process group (it was made a session
        leader, so workers it forked go too), SIGKILL after `grace` seconds."""
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # Workers that outlived their master (same group) are killed too, still by our pgid.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.cleanup:
            self.cleanup()


def start_server(argv, port, log_path, env=None, cwd=None, cpus=None, timeout=20.0, cleanup=None):
    """Start argv (pinned to `cpus`, e.g. "0", with taskset when given) in its own session.

    Returns a Running once the port accepts connections; raises RuntimeError with the log's tail
    when it exits or never listens."""
    argv = pinned(argv, cpus)
    log = open(log_path, "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, cwd=cwd, start_new_session=True)
    log.close()
    run = Running(proc, port, log_path, cleanup)
    if not wait_port(port, proc, timeout):
        run.stop()
        why = "exited" if proc.poll() is not None else f"not listening after {timeout:.0f} s"
        raise RuntimeError(f"{why}: {run.log_tail()}")
    return run


def have(tool):
    """True when `tool` is on PATH."""
    return shutil.which(tool) is not None
