"""Process workers (`cyserve app --processes N`, cyserve/supervisor.py): N interpreters serve one
port, a worker that dies is replaced, a stop reaches every worker and lets requests in flight
finish, and mistakes are one line before anything is forked.

Each test runs the real command in a subprocess, in a session of its own (so a SIGINT to its
process group is what a terminal's Ctrl-C would send). Only generous timeouts are asserted.
"""

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
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cyserve.config import available_cpus

TIMEOUT = 60.0


def free_port() -> int:
    # A port nothing listens on now (the kernel's pick); tests here need a fixed port, because
    # --processes refuses port 0.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

APP = """
import os
import time

import cyserve

app = cyserve.App()


@app.get("/pid")
def pid(request):
    return str(os.getpid())


@app.get("/slow")
def slow(request):
    with open(os.environ["CYSERVE_TEST_MARKER"], "a") as f:
        f.write("started\\n")
    time.sleep(float(os.environ.get("CYSERVE_TEST_SLEEP", "1.0")))
    return "slow done"


def wsgi(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{os.getpid()} {environ['wsgi.multiprocess']}".encode()]


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                scope["state"]["started_in"] = os.getpid()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = f"{os.getpid()} {scope['state']['started_in']}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})
"""

SUPERVISING = re.compile(r"cyserve: supervising (\d+) processes on http://127\.0\.0\.1:(\d+) "
                         r"\(pid (\d+)\)")
SERVING = re.compile(r"cyserve: serving on http://127\.0\.0\.1:(\d+) with (\d+) threads? "
                     r"\(pid (\d+)\)")


class Supervised:
    def __init__(self, tmp: Path, processes: int, sleep: float = 1.0,
                 spec: str = "proc_app:app", threads: int | None = 1) -> None:
        (tmp / "proc_app.py").write_text(textwrap.dedent(APP))
        self.marker = tmp / "marker"
        self.port = free_port()
        env = dict(os.environ, CYSERVE_TEST_MARKER=str(self.marker), PYTHONUNBUFFERED="1",
                   CYSERVE_TEST_SLEEP=str(sleep))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cyserve", spec, "--port", str(self.port),
             *(["--threads", str(threads)] if threads is not None else []),
             "--processes", str(processes), "--graceful-timeout", "5"],
            cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr = ""
        self.workers: set[int] = set()
        self.threads: list[int] = []  # each worker's thread count, as its line says
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        first = self.next_line()
        assert SUPERVISING.fullmatch(first), first
        for _ in range(processes):
            m = SERVING.fullmatch(self.next_line())
            assert m and int(m.group(1)) == self.port
            self.threads.append(int(m.group(2)))
            self.workers.add(int(m.group(3)))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))

    def next_line(self) -> str:
        return self.lines.get(timeout=TIMEOUT)

    def get(self, path: str) -> str:
        with socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        return body.decode()

    def pids_seen(self, want: set[int], tries: int = 400) -> set[int]:
        seen: set[int] = set()
        for _ in range(tries):
            seen.add(int(self.get("/pid")))
            if want <= seen:
                break
        return seen

    def finish(self) -> tuple[int, str]:
        try:
            self.proc.wait(TIMEOUT)
        finally:
            self.close()
        return self.proc.returncode, self.stderr

    def close(self) -> None:
        """Kill what is left (the supervisor, then any worker), reap, close the pipes."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in self.workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._reader.join(TIMEOUT)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        if not self.proc.stderr.closed:
            self.stderr = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    sup = Supervised(tmp_path, 2)
    yield sup
    sup.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is gone too: the supervisor has not reaped it yet, or has exited.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize("processes", [2, 3])
def test_worker_processes_share_the_cpus_by_default(tmp_path: Path, processes: int) -> None:
    # No --threads: the CPUs divided among the processes (gunicorn's N single-threaded sync
    # workers when there are as many processes as CPUs), not CPUs threads in each of them.
    sup = Supervised(tmp_path, processes, threads=None)
    try:
        assert sup.threads == [max(1, available_cpus() // processes)] * processes
    finally:
        sup.close()


def test_two_processes_share_the_port_and_both_answer(supervised: Supervised) -> None:
    assert len(supervised.workers) == 2 and supervised.proc.pid not in supervised.workers
    # SO_REUSEPORT spreads new connections by a hash of their address: both answer soon.
    assert supervised.pids_seen(supervised.workers) == supervised.workers
    os.killpg(supervised.proc.pid, signal.SIGTERM)
    code, err = supervised.finish()
    assert (code, err) == (0, "")
    assert all(_gone(pid) for pid in supervised.workers)


def test_sighup_replaces_the_workers_then_sigterm_stops_them_gracefully(
        supervised: Supervised) -> None:
    # SIGHUP reloads (tests/e2e/test_lifecycle.py tests it under load): new workers, then the
    # old ones stop; the supervisor goes on until SIGTERM.
    os.killpg(supervised.proc.pid, signal.SIGHUP)
    assert supervised.next_line().startswith("cyserve: SIGHUP: reloading: application imported "
                                             "again; starting 2 new worker processes")
    new: set[int] = set()
    while len(new) < 2:
        m = SERVING.fullmatch(supervised.next_line())
        if m:
            new.add(int(m.group(3)))
    assert new.isdisjoint(supervised.workers)
    deadline = time.monotonic() + TIMEOUT
    while not all(_gone(pid) for pid in supervised.workers):
        assert time.monotonic() < deadline, "the old workers did not stop"
        time.sleep(0.05)
    assert supervised.pids_seen(new) == new
    old, supervised.workers = supervised.workers, new
    os.killpg(supervised.proc.pid, signal.SIGTERM)
    code, err = supervised.finish()
    assert (code, err) == (0, "")
    assert all(_gone(pid) for pid in new | old)


def test_a_wsgi_app_runs_in_every_process(tmp_path: Path) -> None:
    sup = Supervised(tmp_path, 2, spec="proc_app:wsgi")
    try:
        seen: set[int] = set()
        for _ in range(400):
            pid, multiprocess = sup.get("/any/path").split()
            assert multiprocess == "True"  # wsgi.multiprocess: the app runs in several
            seen.add(int(pid))
            if seen == sup.workers:
                break
        assert seen == sup.workers
        os.killpg(sup.proc.pid, signal.SIGTERM)
        assert sup.finish() == (0, "")
    finally:
        sup.close()


def test_an_asgi_app_runs_in_every_process(tmp_path: Path) -> None:
    sup = Supervised(tmp_path, 2, spec="proc_app:asgi")
    try:
        seen: set[int] = set()
        for _ in range(400):
            pid, started_in = sup.get("/any/path").split()
            assert started_in == pid  # each process ran the app's lifespan on its own loop
            seen.add(int(pid))
            if seen == sup.workers:
                break
        assert seen == sup.workers
        os.killpg(sup.proc.pid, signal.SIGTERM)
        assert sup.finish() == (0, "")
    finally:
        sup.close()


def test_a_worker_that_dies_is_replaced(supervised: Supervised) -> None:
    victim = min(supervised.workers)
    os.kill(victim, signal.SIGKILL)
    m = SERVING.fullmatch(supervised.next_line())
    assert m, supervised.stdout
    new = int(m.group(3))
    assert new not in supervised.workers
    survivors = (supervised.workers - {victim}) | {new}
    assert supervised.pids_seen(survivors) == survivors
    os.killpg(supervised.proc.pid, signal.SIGTERM)
    code, err = supervised.finish()
    assert code == 0
    assert err == f"cyserve: worker process {victim} was killed by SIGKILL; starting a new one\n"


def test_ctrl_c_stops_every_worker_and_lets_requests_in_flight_finish(
        supervised: Supervised) -> None:
    # One slow request in each worker's hands, if the hash spreads them (at least one anyway).
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(supervised.get("/slow")))
               for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + TIMEOUT
    while not (supervised.marker.exists() and supervised.marker.read_text().count("started") == 4):
        assert time.monotonic() < deadline, "the slow requests never started"
        time.sleep(0.01)
    # What a terminal sends on Ctrl-C: SIGINT to the foreground process group. The workers are
    # in groups of their own, so each gets exactly one stop, from the supervisor.
    os.killpg(supervised.proc.pid, signal.SIGINT)
    for t in threads:
        t.join(TIMEOUT)
    assert results == ["slow done"] * 4
    code, err = supervised.finish()
    assert (code, err) == (0, "")
    assert "cyserve: forcing shutdown" not in supervised.stdout
    assert all(_gone(pid) for pid in supervised.workers)


def test_workers_do_not_outlive_a_killed_supervisor(supervised: Supervised) -> None:
    # SIGKILL leaves the supervisor no chance to pass anything on: the kernel's parent-death
    # signal (PR_SET_PDEATHSIG, SIGTERM) stops each worker gracefully instead of orphaning it.
    os.kill(supervised.proc.pid, signal.SIGKILL)
    supervised.proc.wait(TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while not all(_gone(pid) for pid in supervised.workers):
        assert time.monotonic() < deadline, "workers outlived their supervisor"
        time.sleep(0.05)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", supervised.port), timeout=5).close()


def _listening(pid: int) -> bool:
    """Whether pid holds a listening TCP socket: a worker shuts its listeners once its stop has
    begun (its handler of the stop signal has run)."""
    held = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # it has ended
        return False
    for fd in fds:
        try:
            held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and f"socket:[{fields[9]}]" in held:  # 0A: LISTEN
                    return True
    return False


@pytest.mark.parametrize("quick", [False, True], ids=["after-the-first-was-taken", "20ms-apart"])
def test_a_second_ctrl_c_forces_the_workers(tmp_path: Path, quick: bool) -> None:
    # A handler that sleeps 60 s cannot finish within the 5 s grace: the first Ctrl-C alone would
    # end in the supervisor's SIGKILL after graceful_timeout + 5 s. The second Ctrl-C forces
    # each worker, which abandons its handler after 2 s (serving._FORCE_WAIT_SECONDS) and exits 1.
    sup = Supervised(tmp_path, 2, sleep=60.0)
    try:
        _slow_request_started(sup)
        t0 = time.monotonic()
        os.killpg(sup.proc.pid, signal.SIGINT)
        if quick:
            # 20 ms apart: the supervisor has counted both before it passes the stop on, and
            # sends each worker its stop and the forcing one back to back. Two SIGTERMs would
            # reach the worker before its handler runs and count as one there (it then waited
            # out its 5 s grace and 2 s more, "after the grace period", in about half the runs);
            # a SIGTERM and a SIGINT count as two.
            time.sleep(0.02)
        else:
            # Once the first was taken by the supervisor and, passed on, by every worker:
            # Python runs a handler once for signals that come before it runs, so a second one
            # sent sooner (a fixed 0.2 s on a loaded machine) could count as none at all here.
            deadline = time.monotonic() + TIMEOUT
            while sup.next_line() != "cyserve: shutting down":
                assert time.monotonic() < deadline
            while any(_listening(pid) for pid in sup.workers):
                assert time.monotonic() < deadline, "a worker did not begin its stop"
                time.sleep(0.01)
        os.killpg(sup.proc.pid, signal.SIGINT)
        code, err = sup.finish()
        elapsed = time.monotonic() - t0
    finally:
        sup.close()
    said = "\n".join(sup.stdout) + err
    assert "cyserve: forcing shutdown" in sup.stdout
    assert "after the forced stop" in said and "after the grace period" not in said, said
    assert code == 1 and "killing them" not in err, err
    assert re.search(r"cyserve: worker process \d+ exited with status 1", err), err
    # The forced stop's 2 s, not the 5 s grace and 2 s more (nor the supervisor's SIGKILL).
    assert elapsed < (5.0 if quick else 5.0 + 5.0), elapsed
    assert all(_gone(pid) for pid in sup.workers)


def _slow_request_started(sup: Supervised) -> None:
    """A request to /slow from a thread of its own, returned once its handler has begun (the
    handler's marker file). What a forced stop then does to the request is not checked."""
    def slow() -> None:
        try:
            sup.get("/slow")
        except BaseException:  # noqa: BLE001 - the connection is closed under it: expected
            pass

    threading.Thread(target=slow, daemon=True).start()
    deadline = time.monotonic() + TIMEOUT
    while not sup.marker.exists():
        assert time.monotonic() < deadline, "the slow request never started"
        time.sleep(0.01)


def run_cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp / "proc_app.py").write_text(textwrap.dedent(APP))
    return subprocess.run([sys.executable, "-m", "cyserve", "proc_app:app", *args], cwd=tmp,
                          text=True, capture_output=True, timeout=TIMEOUT)


def test_port_in_use_is_one_line_before_any_fork(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = run_cli(tmp_path, "--port", str(port), "--processes", "3")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"cyserve: cannot listen on 127.0.0.1:{port}: address already in use\n"


def test_unknown_host_is_worded_as_for_one_process(tmp_path: Path) -> None:
    one = run_cli(tmp_path, "--host", "nope.invalid", "--port", "9")
    many = run_cli(tmp_path, "--host", "nope.invalid", "--port", "9", "--processes", "2")
    assert (many.returncode, many.stdout) == (1, "")
    assert many.stderr == one.stderr
    assert one.stderr.startswith("cyserve: cannot listen on nope.invalid:9: cannot resolve host ")


@pytest.mark.parametrize(("args", "line"), [
    (["--port", "0", "--processes", "2"],
     "cyserve: invalid --processes 2: needs a fixed port: with port 0 each process would "
     "listen on a port of its own"),
    (["--processes", "0"], "cyserve: invalid --processes 0: must be between 1 and 256"),
    (["--processes", "two"], "cyserve: invalid --processes two: must be an integer"),
])
def test_bad_processes_option(tmp_path: Path, args: list[str], line: str) -> None:
    proc = run_cli(tmp_path, *args)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", line + "\n")


def test_workers_that_cannot_start_stop_the_supervisor(tmp_path: Path) -> None:
    # The app imports in the supervisor, then fails in every worker (at its start, which is
    # where a worker's own failures happen): the supervisor gives up instead of forking forever.
    (tmp_path / "bad_app.py").write_text(textwrap.dedent("""
        import os
        import cyserve

        SUPERVISOR = os.getpid()
        app = cyserve.App()

        @app.get("/")
        def index(request):
            return "hi"

        _build = app.build

        def build():
            if os.getpid() != SUPERVISOR:
                raise SystemExit(3)
            return _build()

        app.build = build
    """))
    proc = subprocess.run([sys.executable, "-m", "cyserve", "bad_app:app", "--port",
                           str(free_port()), "--processes", "2"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=TIMEOUT)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[-2] == "cyserve: 5 worker processes in a row exited at start; stopping"
    assert lines[-1] == "cyserve: stopped: worker processes failed (see above)"


def test_config_rejects_shared_port_as_a_user_option() -> None:
    import cyserve
    from cyserve.errors import ConfigError
    with pytest.raises(ConfigError, match="shared_port"):
        cyserve.config.Config.from_options(shared_port=True)
