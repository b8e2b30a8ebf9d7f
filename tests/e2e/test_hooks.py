"""Server hooks from a Python configuration file (--config FILE.py, as gunicorn's), through a
served process: each hook is called where and when cyserve.hooks says, with --processes 2 and
with one process; the file's globals are options; what it may not define is one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from _served import TIMEOUT, Served, free_port

pytestmark = pytest.mark.native

HOOKS = """
import os
import socket

_LOG = {log!r}
_PORT = {port}
workers = {workers}
threads = 1
port = _PORT


def _log(*words):
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (" ".join(str(w) for w in words) + "\\n").encode())  # one write per line
    os.close(fd)


def _get():
    # The status line of GET /plain, or "refused".
    try:
        with socket.create_connection(("127.0.0.1", _PORT), timeout=10) as s:
            s.sendall(b"GET /plain HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        return data.split(b"\\r\\n")[0].decode().replace(" ", "_")
    except ConnectionRefusedError:
        return "refused"


def on_starting(server):
    _log("on_starting", server.pid, os.getpid(), _get(), server.config.processes)


def when_ready(server):
    _log("when_ready", server.pid, os.getpid(), _get(), *server.worker_pids)


def post_fork(server, worker):
    _log("post_fork", server.pid, worker.pid, os.getpid(), worker.ppid, os.getppid(),
         worker.age, worker.config.processes)


def worker_exit(server, worker):
    _log("worker_exit", server.pid, worker.pid, os.getpid(), worker.age)


def on_exit(server):
    with open(_LOG) as f:
        forked = [line.split()[2] for line in f if line.startswith("post_fork")]
    alive = [pid for pid in forked if os.path.exists(f"/proc/{{pid}}")]
    _log("on_exit", server.pid, os.getpid(), "alive:", *alive)
"""


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.close()


def _events(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()]


def test_hooks_with_two_worker_processes(tmp_path: Path, served: list[Served]) -> None:
    port = free_port()
    log = tmp_path / "hooks.log"
    conf = tmp_path / "conf.py"
    conf.write_text(HOOKS.format(log=str(log), port=port, workers=2))
    s = Served(tmp_path, "--config", str(conf), wait_serving=2)
    served.append(s)
    supervisor = str(s.proc.pid)
    assert s.stop() == 0
    events = _events(log)
    names = [e[0] for e in events]
    assert names == ["on_starting", "post_fork", "post_fork", "when_ready", "worker_exit",
                     "worker_exit", "on_exit"], events
    # on_starting: in the supervisor, before anything listens; the file's workers = 2 read.
    assert events[0][1:] == [supervisor, supervisor, "refused", "2"]
    # post_fork: in each new worker, its own pid, its parent the supervisor, ages 1 and 2.
    forks = [e for e in events if e[0] == "post_fork"]
    workers = sorted(e[2] for e in forks)
    for e in forks:
        assert e[1] == supervisor and e[2] == e[3] and e[4] == e[5] == supervisor
        assert e[7] == "2"
    assert sorted(e[6] for e in forks) == ["1", "2"]
    assert workers != [supervisor, supervisor] and len(set(workers)) == 2
    # when_ready: in the supervisor, once both workers answer.
    ready = events[3]
    assert ready[1:4] == [supervisor, supervisor, "HTTP/1.1_200_OK"]
    assert sorted(ready[4:]) == workers
    # worker_exit: in each worker, once it stopped serving.
    exits = [e for e in events if e[0] == "worker_exit"]
    assert sorted(e[2] for e in exits) == workers
    assert all(e[2] == e[3] and e[1] == supervisor for e in exits)
    # on_exit: last, in the supervisor, every worker gone.
    assert events[-1] == ["on_exit", supervisor, supervisor, "alive:"]


def test_hooks_with_one_process(tmp_path: Path, served: list[Served]) -> None:
    port = free_port()
    log = tmp_path / "hooks.log"
    conf = tmp_path / "conf.py"
    # Without post_fork and worker_exit nothing needs a worker process: one process serves.
    text = HOOKS.format(log=str(log), port=port, workers=1)
    text = text.replace("def post_fork(", "def _post_fork(").replace("def worker_exit(",
                                                                      "def _worker_exit(")
    conf.write_text(text)
    s = Served(tmp_path, "--config", str(conf))
    served.append(s)
    pid = str(s.proc.pid)
    assert not any("supervising" in line for line in s.all_lines)
    assert s.stop() == 0
    assert _events(log) == [["on_starting", pid, pid, "refused", "1"],
                            ["when_ready", pid, pid, "HTTP/1.1_200_OK"],
                            ["on_exit", pid, pid, "alive:"]]


def test_post_fork_brings_a_supervisor_to_one_process(tmp_path: Path,
                                                      served: list[Served]) -> None:
    port = free_port()
    log = tmp_path / "hooks.log"
    conf = tmp_path / "conf.py"
    conf.write_text(HOOKS.format(log=str(log), port=port, workers=1))
    s = Served(tmp_path, "--config", str(conf))
    served.append(s)
    # One process, said in the singular (it was "1 processes").
    assert any(line.startswith("cyserve: supervising 1 process on ") for line in s.all_lines)
    assert s.stop() == 0
    assert [e[0] for e in _events(log)] == ["on_starting", "post_fork", "when_ready",
                                            "worker_exit", "on_exit"]


def _cyserve(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cyserve", *args], cwd=tmp, text=True,
                          capture_output=True, timeout=TIMEOUT)


@pytest.mark.parametrize(("text", "line"), [
    ("wrokers = 2\n", "cyserve: --config {path}: unknown option 'wrokers'"),
    ("def pre_request(worker, req):\n    pass\n",
     "cyserve: --config {path}: pre_request: cyserve calls no per-request hook: most requests "
     "are answered in C without entering Python (a WSGI or ASGI middleware can do it)"),
    ("def pre_fork(server, worker):\n    pass\n",
     "cyserve: --config {path}: pre_fork: a gunicorn hook that cyserve does not call (it calls "
     "on_starting, when_ready, post_fork, worker_exit, on_exit)"),
    ("def post_fork(server):\n    pass\n",
     "cyserve: --config {path}: post_fork: must take (server, worker)"),
    ("x = 1\ny = (\n", "cyserve: --config {path}, line 2: SyntaxError: "),
    ("import os\nworkers = int(os.environ['NO_SUCH_VARIABLE_HERE'])\n",
     "cyserve: --config {path}, line 2: KeyError: 'NO_SUCH_VARIABLE_HERE'"),
    ("port = 'eighty'\n", "cyserve: --config {path}: port: must be an integer"),
])
def test_what_a_python_config_may_not_hold_is_one_line(tmp_path: Path, text: str,
                                                       line: str) -> None:
    (tmp_path / "m.py").write_text("import cyserve\napp = cyserve.App()\n")
    conf = tmp_path / "conf.py"
    conf.write_text(text)
    out = _cyserve(tmp_path, "m:app", "--config", str(conf))
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(line.format(path=conf)), out.stderr
    assert out.stderr.count("\n") == 1


def test_a_failing_on_starting_stops_before_anything_is_bound(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import cyserve\napp = cyserve.App()\n")
    conf = tmp_path / "conf.py"
    conf.write_text(textwrap.dedent("""
        def on_starting(server):
            raise RuntimeError("not today")
    """))
    out = _cyserve(tmp_path, "m:app", "--config", str(conf), "--port", str(free_port()))
    assert out.returncode == 1
    assert "Traceback" in out.stderr and 'raise RuntimeError("not today")' in out.stderr
    assert out.stderr.endswith("cyserve: the on_starting hook failed: RuntimeError: not today\n")
    assert "serving on" not in out.stdout


def test_hooks_are_config_and_run_keywords() -> None:
    from cyserve.config import Config
    from cyserve.errors import ConfigError

    def hook(server: object) -> None:
        pass

    c = Config(port=9, on_starting=hook, when_ready=hook, on_exit=hook)
    assert c.on_starting is hook and not c.supervised
    assert Config(port=9, worker_exit=lambda s, w: None).supervised
    with pytest.raises(ConfigError, match="must take \\(server, worker\\)"):
        Config(post_fork=hook)
    with pytest.raises(ConfigError, match="must be a function"):
        Config(on_exit="print")  # type: ignore[arg-type]
    assert os.environ.get("CYSERVE_ON_EXIT") is None  # hooks are not command-line options
