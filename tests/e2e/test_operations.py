"""What an operator sets around the server, each with a real server in a subprocess: --pid,
options from the environment and a TOML file, --log-config and the pid in every worker's log
lines, --no-preload. (Recycling, reloads and scaling, under load: test_lifecycle.py.)"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import socket
import subprocess
import time
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from _certs import self_signed
from _served import TIMEOUT, Served, free_port, request

pytestmark = pytest.mark.native

APP = """
import os

import cyserve

os.write(1, f"imported in {os.getpid()}\\n".encode())  # one write: workers share the pipe
app = cyserve.App()


@app.get("/who")
def who(request):
    return f"{os.getpid()}"


@app.get("/boom")
def boom(request):
    raise RuntimeError("boom on purpose")
"""


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.close()


def _cyserve(tmp: Path, *args: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cyserve", *args], cwd=tmp, text=True,
                          capture_output=True, timeout=TIMEOUT,
                          env=dict(os.environ, **(env or {})))


@pytest.mark.parametrize("processes", [1, 2])
def test_pid_file_is_written_refused_while_live_and_removed(tmp_path: Path,
                                                            served: list[Served],
                                                            processes: int) -> None:
    pidfile = tmp_path / "run" / "cyserve.pid"
    pidfile.parent.mkdir()
    pidfile.write_text("999999999\n")  # stale: no such process
    port = free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--processes",
                 str(processes), "--pid", str(pidfile), wait_serving=processes, app=APP)
    served.append(srv)
    assert pidfile.read_text() == f"{srv.proc.pid}\n"  # the supervisor's, or the one process's
    # A second server given the same file is refused before it binds anything.
    r = _cyserve(tmp_path, "listen_app:app", "--port", str(free_port()), "--pid", str(pidfile))
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        f"cyserve: --pid {pidfile}: process {srv.proc.pid} written in it is still running "
        "(another server?); stop it, or remove the file")
    assert request(socket.AF_INET, ("127.0.0.1", port))[0] == b"HTTP/1.1 200 OK"
    assert pidfile.read_text() == f"{srv.proc.pid}\n"
    assert srv.stop() == 0, srv.stderr
    assert not pidfile.exists()


def test_options_from_the_environment_and_a_toml_file(tmp_path: Path,
                                                      served: list[Served]) -> None:
    port = free_port()
    toml = tmp_path / "cyserve.toml"
    toml.write_text('port = 1\nthreads = 1\nhealth-path = "/healthz"\nworkers = 2\n'
                    'log-level = "warning"\n')
    # The environment wins over the file (the port), the command line over both (--workers).
    srv = Served(tmp_path, "--workers", "1", wait_serving=1, app=APP,
                 env={"CYSERVE_CONFIG": str(toml), "CYSERVE_PORT": str(port)})
    served.append(srv)
    assert srv.serving == [f"http://127.0.0.1:{port}"]
    assert request(socket.AF_INET, ("127.0.0.1", port), "/healthz") == (b"HTTP/1.1 200 OK",
                                                                        "ok\n")
    assert srv.stop() == 0, srv.stderr
    assert "supervising" not in srv.stderr
    # A bad value says where it came from, in one line.
    r = _cyserve(tmp_path, "listen_app:app", env={"CYSERVE_CONFIG": str(toml),
                                                  "CYSERVE_THREADS": "many"})
    assert (r.returncode, r.stderr) == (2, "cyserve: CYSERVE_THREADS='many': must be an "
                                           "integer\n")
    toml.write_text('app = "listen_app:app"\nmax-request = 10\n')
    r = _cyserve(tmp_path, "-c", str(toml))
    assert (r.returncode, r.stderr) == (2, f"cyserve: --config {toml}: unknown option "
                                           "'max-request'\n")


def test_every_workers_log_lines_carry_its_pid(tmp_path: Path, served: list[Served]) -> None:
    port = free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--processes", "2",
                 wait_serving=2, app=APP)
    served.append(srv)
    pids = set(_pids_of_children(srv.proc.pid))
    for _ in range(6):
        assert request(socket.AF_INET, ("127.0.0.1", port), "/boom")[0].endswith(b"500 "
                                                                              b"Internal Server "
                                                                              b"Error")
    assert srv.stop() == 0
    lines = [ln for ln in srv.stderr.splitlines() if ln.startswith("cyserve: ERROR: ")]
    assert len(lines) == 6, srv.stderr
    for ln in lines:
        m = re.match(r"cyserve: ERROR: \[(\d+)\] handler .* failed", ln)
        assert m and m.group(1) in pids, (ln, pids)


def _pids_of_children(pid: int) -> list[str]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return f.read().split()


@pytest.mark.parametrize("kind", ["json", "yaml", "ini"])
def test_log_config_configures_logging_in_every_worker(tmp_path: Path, served: list[Served],
                                                       kind: str) -> None:
    log = tmp_path / "app.log"
    fmt = "%(process)d %(name)s %(levelname)s %(message)s"
    dict_config = {
        "version": 1,
        "formatters": {"plain": {"format": fmt}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log),
                              "formatter": "plain"}},
        "loggers": {"cyserve": {"handlers": ["file"], "level": "INFO"}},
    }
    if kind == "json":
        conf = tmp_path / "logging.json"
        conf.write_text(json.dumps(dict_config))
    elif kind == "yaml":
        import yaml  # PyYAML: requirements-dev.txt pins it

        conf = tmp_path / "logging.yaml"
        conf.write_text(yaml.safe_dump(dict_config))
    else:
        conf = tmp_path / "logging.ini"
        conf.write_text(f"""
[loggers]
keys = root,cyserve

[handlers]
keys = file

[formatters]
keys = plain

[logger_root]
handlers =

[logger_cyserve]
handlers = file
qualname = cyserve
level = INFO

[handler_file]
class = FileHandler
args = ({str(log)!r},)
formatter = plain

[formatter_plain]
format = {fmt}
""")
    port = free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--processes", "2",
                 "--log-config", str(conf), wait_serving=2, app=APP)
    served.append(srv)
    pids = set(_pids_of_children(srv.proc.pid))
    for _ in range(6):
        request(socket.AF_INET, ("127.0.0.1", port), "/boom")
    assert srv.stop() == 0, srv.stderr
    assert "boom on purpose" not in srv.stderr  # to the file, not standard error
    logged = [ln for ln in log.read_text().splitlines() if re.match(r"\d+ cyserve", ln)]
    assert len(logged) == 6, log.read_text()
    assert {ln.split()[0] for ln in logged} <= pids


def test_log_config_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "listen_app.py").write_text(APP)
    yaml = tmp_path / "logging.yaml"
    try:
        import yaml as _  # noqa: F401
    except ImportError:
        yaml.write_text("version: 1\n")
        r = _cyserve(tmp_path, "listen_app:app", "--log-config", str(yaml))
        assert (r.returncode, r.stderr) == (2, f"cyserve: invalid --log-config {yaml}: a YAML "
                                               "file needs PyYAML (pip install pyyaml); or give "
                                               "the same dictionary as JSON\n")
    else:
        # PyYAML is there (requirements-dev.txt has it): the file is read, and what logging
        # refuses is one line, as for JSON. (A valid file would start a server that runs on.)
        yaml.write_text("version: 1\nhandlers:\n  h:\n    class: no.such.Handler\n")
        r = _cyserve(tmp_path, "listen_app:app", "--port", str(free_port()), "--log-config",
                     str(yaml))
        assert r.returncode == 2
        assert r.stderr.startswith(f"cyserve: invalid --log-config {yaml}: logging cannot use "
                                   "it: "), r.stderr
    bad = tmp_path / "logging.json"
    bad.write_text('{"version": 1, "handlers": {"h": {"class": "no.such.Handler"}}}')
    r = _cyserve(tmp_path, "listen_app:app", "--port", str(free_port()), "--log-config",
                 str(bad))
    assert r.returncode == 2
    assert r.stderr.startswith(f"cyserve: invalid --log-config {bad}: logging cannot use it: ")
    assert r.stderr.count("\n") == 1, r.stderr
    r = _cyserve(tmp_path, "listen_app:app", "--log-config", str(tmp_path / "none.json"))
    assert (r.returncode, r.stderr) == (2, f"cyserve: invalid --log-config "
                                           f"{tmp_path / 'none.json'}: cannot read the file: "
                                           "No such file or directory\n")


@pytest.mark.parametrize("preload", [True, False])
def test_preload_imports_once_and_no_preload_in_each_worker(tmp_path: Path,
                                                            served: list[Served],
                                                            preload: bool) -> None:
    port = free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--processes", "2",
                 *([] if preload else ["--no-preload"]), wait_serving=2, app=APP)
    served.append(srv)
    workers = set(_pids_of_children(srv.proc.pid))
    answered = {request(socket.AF_INET, ("127.0.0.1", port))[1] for _ in range(20)}
    assert answered <= workers
    assert srv.stop() == 0, srv.stderr
    imports = [ln for ln in srv.all_lines if ln.startswith("imported in ")]
    expected = {str(srv.proc.pid)} | (set() if preload else workers)
    assert {ln.split()[-1] for ln in imports} == expected, imports


def test_toml_on_python_310_without_tomli_says_what_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3.10 environment that lacks tomli all the same (installed without its dependencies)
    gets one line that says what is missing, on any interpreter: the version is made 3.10's and
    tomli's import fails."""
    from cyserve import cli
    toml = tmp_path / "cyserve.toml"
    toml.write_text("port = 9000\n")
    monkeypatch.setattr(sys, "version_info", (3, 10, 13, "final", 0))
    monkeypatch.setitem(sys.modules, "tomli", None)  # `import tomli` raises ModuleNotFoundError
    with pytest.raises(cli._UsageError) as exc:
        cli._read_toml(str(toml))
    assert str(exc.value) == (f"--config {toml}: reading TOML on Python 3.10 needs the tomli "
                              "package (pip install tomli)")


SLOW_APP = """
import asyncio
import os

import cyserve


async def asgi(scope, receive, send):
    # /a/slow stays in flight until the test makes the file (at most 30 s), awaiting on the
    # event loop: no worker thread is held, whatever the machine's load.
    slow = scope["path"].endswith("/slow")
    if slow:
        open("started", "w").close()
    for _ in range(3000 if slow else 0):
        if os.path.exists("release"):
            break
        await asyncio.sleep(0.01)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"slow" if slow else b"fast"})


app = cyserve.App()
app.asgi("/a", asgi)
app.static("/plain", b"plain")
"""


def _raw(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith((b"slow", b"fast", b"plain",
                                                              b"at once\n")):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_limit_concurrency_answers_503_past_n_requests_in_handlers(
        tmp_path: Path, served: list[Served]) -> None:
    import threading

    port = free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--limit-concurrency", "1",
                 app=SLOW_APP)
    served.append(srv)
    answers: list[bytes] = []
    slow = threading.Thread(target=lambda: answers.append(_raw(port, "/a/slow")))
    slow.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (tmp_path / "started").exists():  # the slow request is in flight
            assert time.monotonic() < deadline and not answers, answers
            time.sleep(0.01)
        refused = _raw(port, "/a/fast")
        assert refused.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), refused
        head = refused.split(b"\r\n\r\n")[0].split(b"\r\n")
        assert b"Retry-After: 1" in head and b"Connection: close" in head, head
        # Answers that need no handler are not counted.
        assert _raw(port, "/plain").startswith(b"HTTP/1.1 200")
    finally:
        (tmp_path / "release").write_text("")
        slow.join(TIMEOUT)
    assert [a.split(b"\r\n")[0] for a in answers] == [b"HTTP/1.1 200 OK"]
    assert _raw(port, "/a/fast").startswith(b"HTTP/1.1 200")  # the count went back down
    assert srv.stop() == 0, srv.stderr


def _comm(pid: int | str) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().rstrip("\n")


def test_name_is_the_task_name_of_the_supervisor_and_every_worker(tmp_path: Path,
                                                                  served: list[Served]) -> None:
    port = free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--processes", "2",
                 "--name", "shop-frontend-eu-1", wait_serving=2, app=APP)
    served.append(srv)
    workers = _pids_of_children(srv.proc.pid)
    assert len(workers) == 2
    # The kernel keeps 15 bytes of it; pgrep and ps show that.
    assert [_comm(p) for p in [srv.proc.pid, *workers]] == ["shop-frontend-e"] * 3
    assert request(socket.AF_INET, ("127.0.0.1", port))[0] == b"HTTP/1.1 200 OK"
    # Without the sanitizer stage's preload, which is for the interpreter (pgrep hangs with it).
    found = subprocess.run(["pgrep", "-x", "shop-frontend-e"], capture_output=True, text=True,
                           env={"PATH": os.environ["PATH"]}, timeout=TIMEOUT)
    assert sorted(found.stdout.split()) == sorted([str(srv.proc.pid), *workers])
    assert srv.stop() == 0, srv.stderr
    # Without it, the interpreter's own name (what the option changes).
    srv = Served(tmp_path, "--port", str(free_port()), "--threads", "1", app=APP)
    served.append(srv)
    assert _comm(srv.proc.pid).startswith("python")
    assert srv.stop() == 0, srv.stderr


def test_pythonpath_folders_come_first_before_the_import(tmp_path: Path) -> None:
    for folder, answer in (("lib_a", "a"), ("lib_b", "b")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "pp_app.py").write_text(
            f"import cyserve\napp = cyserve.App()\napp.static('/', b'{answer}')\n"
            f"print('imported from {folder}')\n")
    r = _cyserve(tmp_path, "pp_app:app", "--check-config")
    assert (r.returncode, r.stderr) == (2, "cyserve: cannot import 'pp_app': No module named "
                                           "'pp_app'\n")
    r = _cyserve(tmp_path, "pp_app:app", "--pythonpath", "lib_b,lib_a", "--check-config")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "imported from lib_b"  # the first named wins
    r = _cyserve(tmp_path, "pp_app:app", "--pythonpath", "lib_a, nowhere", "--check-config")
    assert (r.returncode, r.stderr) == (2, "cyserve: --pythonpath lib_a, nowhere: 'nowhere' is "
                                           "not a folder\n")


def test_check_config_imports_the_app_binds_nothing_and_says_what_is_wrong(
        tmp_path: Path) -> None:
    (tmp_path / "listen_app.py").write_text(APP)
    with socket.socket() as taken:  # a port in use: --check-config does not bind it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        r = _cyserve(tmp_path, "listen_app:app", "--port", port, "--check-config")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines() == [
        f"imported in {r.stdout.split()[2]}",
        "cyserve: the configuration is valid: listen_app:app imports, with 2 routes"]
    bad = [
        (["listen_app:nothing"], "cyserve: 'listen_app' has no attribute 'nothing'"),
        (["listen_app:app", "--threads", "x"], "cyserve: invalid --threads x: must be an integer"),
        # A file that exists but is not a certificate: only loading it tells (the sentence a
        # start prints).
        (["listen_app:app", "--ssl-certfile", "listen_app.py"],
         "cyserve: cannot load the certificate from 'listen_app.py': no start line "
         "(not a PEM file)"),
    ]
    for args, line in bad:
        r = _cyserve(tmp_path, *args, "--check-config")
        assert r.returncode == 2 and r.stderr.startswith(line), (args, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr


def test_check_config_never_asks_for_a_key_password_on_the_terminal(tmp_path: Path) -> None:
    # Run from a terminal with an encrypted key and no --ssl-keyfile-password, --check-config
    # loaded the key with Python's ssl, whose OpenSSL asked "Enter PEM pass phrase:" on the
    # terminal and waited; a start never prompts (README, "HTTPS"), and neither does the check.
    (tmp_path / "listen_app.py").write_text(APP)
    certs = self_signed(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    subprocess.run(["openssl", "pkey", "-in", certs["key"], "-aes256", "-passout", "pass:pw",
                    "-out", str(tmp_path / "key-enc.pem")], check=True, capture_output=True,
                   env=env)
    argv = [sys.executable, "-m", "cyserve", "listen_app:app", "--check-config",
            "--ssl-certfile", certs["cert"], "--ssl-keyfile", str(tmp_path / "key-enc.pem")]
    # The child makes the pty its controlling terminal (a new session's leader opening a
    # terminal takes it), so that OpenSSL could prompt on it; no fork of this process, which
    # may run threads.
    fd, slave = pty.openpty()
    child = ("import os, sys; os.setsid(); t = os.open(os.ttyname(0), os.O_RDWR); "
             "[os.dup2(t, n) for n in (0, 1, 2)]; os.execv(sys.executable, sys.argv[1:])")
    proc = subprocess.Popen([sys.executable, "-c", child, *argv], cwd=tmp_path, stdin=slave,
                            stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 30.0  # the check takes a few seconds; a prompt waits forever
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child has exited and closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        if proc.poll() is None:
            proc.kill()  # still waiting for a password: the failure below
        status = proc.wait(timeout=TIMEOUT)
        os.close(fd)
    text = out.decode(errors="replace")
    assert "pass phrase" not in text, text
    assert status == 2, text
    assert "key-enc.pem" in text and "password is needed" in text, text


def test_print_config_prints_a_file_that_config_reads_back(tmp_path: Path) -> None:
    toml = tmp_path / "base.toml"
    toml.write_text('threads = 1\nbind = ["127.0.0.1:9001"]\nhttp2 = false\n')
    r = _cyserve(tmp_path, "listen_app:app", "--config", str(toml), "--max-requests", "50",
                 "--reload-include", "*.html", "--print-config",
                 env={"CYSERVE_WORKERS": "3", "CYSERVE_ACCESS_LOG": "true"})
    assert (r.returncode, r.stderr) == (0, "")
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# ")
    assert set(lines[1:]) == {'app = "listen_app:app"', 'threads = 1',
                              'processes = 3', "access-log = true", "http2 = false",
                              'max-requests = 50', 'bind = ["127.0.0.1:9001"]',
                              'reload-include = ["*.html"]'}
