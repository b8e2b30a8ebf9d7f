"""gunicorn's spellings of options cyserve has under other names, and the process settings a
gunicorn user sets (--chdir, --umask, --user/--group, --env-file), each through a served
process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from _served import TIMEOUT, Served, free_port
from _rawhttp import request as raw_request
from cyserve import cli

pytestmark = pytest.mark.native


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


def test_gunicorn_limit_spellings_set_the_limits() -> None:
    parser = cli.build_parser()
    c = cli.config_from_args(parser.parse_args(
        ["m:app", "--limit-request-line", "100", "--limit-request-fields", "7",
         "--limit-request-field_size", "300"]))
    assert (c.max_target_bytes, c.max_headers, c.max_header_bytes) == (100, 7, 300)
    c = cli.config_from_args(parser.parse_args(
        ["m:app", "--limit-request-line", "0", "--limit-request-fields", "0",
         "--limit-request-field-size", "0"]))
    assert (c.max_target_bytes, c.max_headers, c.max_header_bytes) == (1 << 20, 10000, 1 << 20)
    # Not given: the cyserve options' own values stand.
    c = cli.config_from_args(parser.parse_args(["m:app", "--max-headers", "5"]))
    assert (c.max_target_bytes, c.max_headers, c.max_header_bytes) == (8192, 5, 8192)


@pytest.mark.parametrize(("args", "line"), [
    (["--limit-request-line", "-1"],
     "cyserve: invalid --limit-request-line -1: must be 0 (the most, 1048576) or between 1 and "
     "1048576"),
    (["--limit-request-fields", "many"],
     "cyserve: invalid --limit-request-fields many: must be an integer"),
    (["--limit-request-field_size", "10"],
     "cyserve: invalid --limit-request-field-size 10: must be 0 (the most, 1048576) or between "
     "64 and 1048576"),
])
def test_bad_gunicorn_limits_are_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    out = _cyserve(tmp_path, "m:app", *args)
    assert out.returncode == 2
    assert out.stderr == line + "\n"


def test_gunicorn_tls_spellings_are_aliases() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["m:app", "--certfile", "c.pem", "--keyfile", "k.pem",
                              "--ca-certs", "ca.pem", "--ciphers", "HIGH", "--cert-reqs", "2"])
    assert (args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs, args.ssl_ciphers,
            args.ssl_cert_reqs) == ("c.pem", "k.pem", "ca.pem", "HIGH", "2")


def test_more_gunicorn_spellings_are_aliases() -> None:
    parser = cli.build_parser()
    c = cli.config_from_args(parser.parse_args(
        ["m:app", "-t", "30", "--access-logformat", "%(h)s %(s)s"]))
    assert (c.worker_timeout, c.access_log_format) == (30.0, "%(h)s %(s)s")


@pytest.mark.parametrize(("worker", "interface"), [
    ("uvicorn.workers.UvicornWorker", "asgi"), ("uvicorn.workers.UvicornH11Worker", "asgi"),
    ("uvicorn_worker.UvicornWorker", "asgi"), ("sync", "wsgi"), ("gthread", "wsgi"),
    ("gunicorn.workers.gthread.ThreadWorker", "wsgi"),
])
def test_worker_class_is_taken_as_the_interface_it_implies(worker: str, interface: str) -> None:
    parser = cli.build_parser()
    for argv in (["-k", worker], ["--worker-class", worker],
                 ["--worker-class", worker, "--interface", interface]):
        assert cli.config_from_args(parser.parse_args(["m:app", *argv])).interface == interface


def test_worker_class_from_a_gunicorn_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text('worker_class = "uvicorn.workers.UvicornWorker"\nworkers = 2\n')
    _, config = cli.parse_command(["m:app", "-c", str(conf)], {})
    assert (config.interface, config.processes) == ("asgi", 2)


@pytest.mark.parametrize(("args", "line"), [
    (["-k", "gevent"], "cyserve: argument -k/--worker-class: 'gevent' is refused: cyserve does "
                       "not run applications in greenlets"),
    (["-k", "eventlet"], "cyserve: argument -k/--worker-class: 'eventlet' is refused: cyserve "
                         "does not run applications in greenlets"),
    (["--worker-class", "tornado"], "cyserve: argument -k/--worker-class: 'tornado' is refused: "
                                    "cyserve serves WSGI and ASGI applications"),
    (["-k", "uvicorn.workers.UvicornWorker", "--interface", "wsgi"],
     "cyserve: invalid --worker-class uvicorn.workers.UvicornWorker: serves ASGI applications, "
     "not --interface wsgi's"),
    (["--error-logfile", "err.log"], "cyserve: argument --error-logfile/--log-file: 'err.log' "
                                     "is refused: cyserve writes its error log to standard "
                                     "error"),
    (["--log-file", "err.log"], "cyserve: argument --error-logfile/--log-file: 'err.log' is "
                                "refused"),
])
def test_gunicorn_options_cyserve_cannot_honour_are_one_line(tmp_path: Path, args: list[str],
                                                             line: str) -> None:
    out = _cyserve(tmp_path, "m:app", *args)
    assert out.returncode == 2
    assert out.stderr.startswith(line), out.stderr
    # A word argparse refuses points to --help on a second line; a value cyserve refuses is one.
    hint = line.startswith("cyserve: argument ")
    assert out.stderr.splitlines()[1:] == (["Try 'cyserve --help' for help."] if hint else [])


def test_a_worker_class_that_does_not_fit_the_app_is_named_in_the_error(tmp_path: Path) -> None:
    # gunicorn's `-k uvicorn.workers.UvicornWorker` on a WSGI app: the line says where the
    # interface it names came from, since --interface was never typed.
    (tmp_path / "wsgiapp.py").write_text(
        "def app(environ, start_response):\n"
        "    start_response('200 OK', [])\n    return [b'']\n")
    out = _cyserve(tmp_path, "wsgiapp:app", "-k", "uvicorn.workers.UvicornWorker",
                   "--check-config")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.rstrip().endswith("(--worker-class uvicorn.workers.UvicornWorker means "
                                        "--interface asgi)"), out.stderr


def test_error_logfile_dash_is_standard_error_where_cyserve_writes_it() -> None:
    parser = cli.build_parser()
    for argv in (["--error-logfile", "-"], ["--log-file", "-"]):
        assert cli.config_from_args(parser.parse_args(["m:app", *argv])) == \
            cli.config_from_args(parser.parse_args(["m:app"]))


def test_gunicorn_limits_are_enforced_by_the_served_process(tmp_path: Path,
                                                            served: list[Served]) -> None:
    port = free_port()
    served.append(Served(tmp_path, "--port", str(port), "--threads", "1",
                         "--limit-request-line", "40", "--limit-request-fields", "3",
                         "--limit-request-field-size", "200"))

    def status(target: str, headers: str = "") -> int:
        return raw_request(port, f"GET {target} HTTP/1.1\r\nHost: t\r\n{headers}"
                           "Connection: close\r\n\r\n".encode()).status

    assert status("/plain") == 200
    assert status("/plain?" + "q" * 40) == 414
    assert status("/plain", "A: 1\r\n") == 200  # Host, A, Connection: three fields
    assert status("/plain", "A: 1\r\nB: 2\r\n") == 431
    assert status("/plain", "C: " + "v" * 200 + "\r\n") == 431


ENV_APP = """
import os

import cyserve

IMPORTED = dict(uid=os.getuid(), gid=os.getgid(), greeting=os.environ.get("GREETING", "-"),
                cwd=os.getcwd())
app = cyserve.App()


@app.get("/env")
def env(request):
    return f"{IMPORTED['greeting']} {os.environ.get('KEPT')} {IMPORTED['cwd']}"


@app.get("/owner")
def owner(request):
    return f"{os.getuid()} {os.getgid()} {IMPORTED['uid']} {IMPORTED['gid']}"
"""


def _body(port: int, path: str) -> str:
    reply = raw_request(port, f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
                        .encode())
    assert reply.status == 200, reply
    return reply.body.decode()


def test_env_file_is_loaded_before_the_import_and_may_set_options(
        tmp_path: Path, served: list[Served]) -> None:
    port = free_port()
    (tmp_path / "app.env").write_text(
        "# what the application reads\n"
        "export GREETING='hello there'\n"
        "KEPT=from the file\n"
        "CYSERVE_HEALTH_PATH=/hz\n")
    served.append(Served(tmp_path, "--port", str(port), "--threads", "1", "--env-file",
                         "app.env", app=ENV_APP, env={"KEPT": "from the environment"}))
    assert _body(port, "/env") == f"hello there from the environment {tmp_path}"
    assert _body(port, "/hz") == "ok\n"  # an option set by the file


def test_env_options_set_variables_over_the_environment_and_the_env_file(
        tmp_path: Path, served: list[Served]) -> None:
    port = free_port()
    (tmp_path / "app.env").write_text("GREETING=from-the-file\n")
    served.append(Served(tmp_path, "--port", str(port), "--threads", "1", "-e",
                         "GREETING=from-e", "--env", "KEPT=from --env", "--env-file", "app.env",
                         app=ENV_APP, env={"KEPT": "from the environment"}))
    assert _body(port, "/env") == f"from-e from --env {tmp_path}"


def test_a_bad_env_option_is_one_line(tmp_path: Path) -> None:
    out = _cyserve(tmp_path, "m:app", "--env", "NOEQUALS")
    assert out.returncode == 2
    assert out.stderr == ("cyserve: --env NOEQUALS: must be NAME=VALUE (a variable name, "
                          "then '=')\n")


@pytest.mark.parametrize(("content", "line"), [
    (None, "cyserve: --env-file app.env: cannot read it: No such file or directory"),
    ("A=1\nnot an assignment\n",
     "cyserve: --env-file app.env, line 2: expected NAME=VALUE, got 'not an assignment'"),
])
def test_env_file_errors_are_one_line(tmp_path: Path, content: str | None, line: str) -> None:
    if content is not None:
        (tmp_path / "app.env").write_text(content)
    out = _cyserve(tmp_path, "m:app", "--env-file", "app.env")
    assert out.returncode == 2
    assert out.stderr == line + "\n"


def test_chdir_comes_before_the_import_and_the_env_file(tmp_path: Path,
                                                        served: list[Served]) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "listen_app.py").write_text(ENV_APP)  # the one in tmp_path has no app
    (site / "app.env").write_text("GREETING=from-site\n")
    conf = tmp_path / "cyserve.toml"  # read from where the command starts
    conf.write_text('env-file = "app.env"\n')
    port = free_port()
    served.append(Served(tmp_path, "--port", str(port), "--threads", "1", "--chdir", "site",
                         "--config", "cyserve.toml", app=""))
    assert _body(port, "/env") == f"from-site None {site}"


def test_chdir_to_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    out = _cyserve(tmp_path, "m:app", "--chdir", "nowhere")
    assert out.returncode == 2
    assert out.stderr == "cyserve: --chdir nowhere: cannot enter it: No such file or directory\n"


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


@pytest.mark.parametrize(("given", "mask"), [("027", "0027"), ("0o77", "0077"), ("18", "0022")])
def test_umask_is_the_serving_processs(tmp_path: Path, served: list[Served], given: str,
                                       mask: str) -> None:
    sock = tmp_path / "s.sock"
    s = Served(tmp_path, "--uds", str(sock), "--threads", "1", "--umask", given)
    served.append(s)
    assert _status(s.proc.pid)["Umask"] == mask
    assert (sock.stat().st_mode & 0o777) == 0o777 & ~int(mask, 8)


def test_a_bad_umask_is_one_line(tmp_path: Path) -> None:
    out = _cyserve(tmp_path, "m:app", "--umask", "rw")
    assert out.returncode == 2
    assert out.stderr == ("cyserve: invalid --umask rw: must be a mode such as 022 (octal), "
                          "0o22 or 18\n")


def _privileged_port() -> int:
    """A free port below 1024, which only root may bind."""
    import socket

    for port in range(1023, 900, -1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.fail("no free port below 1024")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
@pytest.mark.parametrize("preload", [True, False])
def test_workers_run_as_user_and_group_after_binding(served: list[Served],
                                                     preload: bool) -> None:
    import pwd
    import socket
    import tempfile

    from _served import request as family_request

    nobody = pwd.getpwnam("nobody")
    # A folder the workers' user may read: with --no-preload each worker imports the app there
    # after it has switched.
    folder = Path(tempfile.mkdtemp(prefix="cyserve-user-"))
    try:
        folder.chmod(0o755)
        port = _privileged_port()
        sock = folder / "s.sock"
        s = Served(folder, "--bind", f"127.0.0.1:{port}", "--bind", f"unix:{sock}",
                   "--threads", "1", "--processes", "2", "--user", "nobody", "--group",
                   str(nobody.pw_gid), "--preload" if preload else "--no-preload",
                   app=ENV_APP, wait_serving=2)
        served.append(s)
        imported = "0 0" if preload else f"{nobody.pw_uid} {nobody.pw_gid}"
        assert _body(port, "/owner") == f"{nobody.pw_uid} {nobody.pw_gid} {imported}"
        status, body = family_request(socket.AF_UNIX, str(sock), "/owner")
        assert status.endswith(b" 200 OK") and body == f"{nobody.pw_uid} {nobody.pw_gid} " \
            f"{imported}"
        st = sock.stat()
        assert (st.st_uid, st.st_gid) == (nobody.pw_uid, nobody.pw_gid)
        workers = [int(line.rsplit("(pid ", 1)[1].rstrip(")")) for line in s.all_lines
                   if line.startswith("cyserve: serving on ")]
        assert len(workers) == 2
        for pid in workers:
            st_ = _status(pid)
            assert st_["Uid"].split() == [str(nobody.pw_uid)] * 4
            assert st_["Gid"].split() == [str(nobody.pw_gid)] * 4
            assert st_["Groups"].split() in ([], [str(nobody.pw_gid)])  # root's are gone
        assert _status(s.proc.pid)["Uid"].split()[0] == "0"  # the supervisor stays root
        assert s.stop() == 0
        assert not sock.exists()  # removed by the supervisor at exit
    finally:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


@pytest.mark.parametrize(("args", "line"), [
    (["--user", "no-such-user-here"], "cyserve: invalid --user no-such-user-here: no such user"),
    (["--group", "no-such-group-here"],
     "cyserve: invalid --group no-such-group-here: no such group"),
])
def test_an_unknown_user_or_group_is_one_line(tmp_path: Path, args: list[str],
                                              line: str) -> None:
    out = _cyserve(tmp_path, "m:app", *args)
    assert out.returncode == 2
    assert out.stderr == line + "\n"


def test_switching_user_without_root_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from cyserve.config import Config
    from cyserve.errors import ConfigError

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 1000)
    with pytest.raises(ConfigError, match=r"invalid user nobody: switching to another user "
                                          r"needs root \(this process runs as uid 1000, gid "
                                          r"1000\)"):
        Config(user="nobody")
    # Its own user and group need nothing.
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "getgid", lambda: 1000)
    owner = Config(user=1000, group=1000).process_owner()
    assert owner is not None and owner[:2] == (1000, 1000)
