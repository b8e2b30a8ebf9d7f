"""The cyserve command: argument handling in-process, then the real `python -m cyserve` in a
subprocess, where each failure must be one line on stderr and the documented exit status."""

from __future__ import annotations

import errno
import itertools
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cyserve
from cyserve import cli, signals
from cyserve.errors import AppLoadError

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


@pytest.fixture
def isolated_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_app puts --app-dir on sys.path; undo it after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def write_module(folder: Path, source: str) -> str:
    """A module with a name no other test uses (sys.modules caches imports)."""
    name = f"cli_mod_{os.getpid()}_{next(_names)}"
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return name


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = cli.main(list(argv))
    err = capsys.readouterr().err
    return status, err


# ---- in-process: parsing, options and loading the app -------------------------------------

def test_parser_defaults() -> None:
    args = cli.build_parser().parse_args(["m:app"])
    config = cli.config_from_args(args)
    assert config == cyserve.config.Config()
    assert args.app_dir == "."


def test_every_option_reaches_the_config() -> None:
    args = cli.build_parser().parse_args([
        "m:app", "--host", "0.0.0.0", "--port", "8080", "--threads", "3", "--backlog", "7",
        "--max-header-bytes", "100", "--max-target-bytes", "101", "--max-headers", "9",
        "--max-body-bytes", "102", "--keepalive-timeout", "1.5", "--header-timeout", "2",
        "--body-timeout", "3", "--graceful-timeout", "0", "--log-level", "debug",
        "--processes", "4", "--access-log", "--interface", "WSGI"])
    c = cli.config_from_args(args)
    assert (c.host, c.port, c.threads, c.backlog) == ("0.0.0.0", 8080, 3, 7)
    assert (c.max_header_bytes, c.max_target_bytes, c.max_headers, c.max_body_bytes) == (
        100, 101, 9, 102)
    assert (c.keepalive_timeout, c.header_timeout, c.body_timeout, c.graceful_timeout) == (
        1.5, 2.0, 3.0, 0.0)
    assert c.log_level == "debug"
    assert (c.processes, c.access_log, c.interface) == (4, True, "wsgi")


@pytest.mark.parametrize("level", ["trace", "TRACE"])
def test_uvicorns_trace_log_level_is_taken_as_debug(level: str) -> None:
    # uvicorn's command lines say --log-level trace: they start, at cyserve's finest level.
    args = cli.build_parser().parse_args(["m:app", "--log-level", level])
    assert cli.config_from_args(args).log_level == "debug"
    assert re.search(r"\btrace\b", cli.build_parser().format_help())


@pytest.mark.parametrize(("argv", "line"), [
    (["--threads", "-1", "m:app"], "cyserve: invalid --threads -1: must be between 0 and 1024"),
    (["--port", "70000", "m:app"], "cyserve: invalid --port 70000: must be between 0 and 65535"),
    (["--port", "http", "m:app"], "cyserve: invalid --port http: must be an integer"),
    (["--graceful-timeout", "soon", "m:app"],
     "cyserve: invalid --graceful-timeout soon: must be a number of seconds"),
    (["--keepalive-timeout", "0", "m:app"],
     "cyserve: invalid --keepalive-timeout 0.0: must be positive"),
    (["--max-body-bytes", "0", "m:app"],
     "cyserve: invalid --max-body-bytes 0: must be between 1 and 1099511627776"),
    (["--backlog", "99999999999", "m:app"],
     "cyserve: invalid --backlog 99999999999: must be between 1 and 65535"),
])
def test_option_errors_are_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    status, err = run_main(capsys, *argv)
    assert status == cli.EXIT_USAGE == 2
    assert err.count("\n") == 1
    assert err.startswith(line)


@pytest.mark.parametrize(("argv", "line"), [
    (["m:app", "--bogus"], "cyserve: unrecognized arguments: --bogus"),
    # A misspelt option names the one meant (uvicorn's errors do).
    (["m:app", "--prot", "9000"],
     "cyserve: unrecognized arguments: --prot 9000 (did you mean --port?)"),
    (["m:app", "--acess-log=1"],
     "cyserve: unrecognized arguments: --acess-log=1 (did you mean --access-log?)"),
    ([], "cyserve: the following arguments are required: MODULE:APP"),
    (["m:app", "--threads"], "cyserve: argument --threads: expected one argument"),
    (["--log-level", "loud", "m:app"], "cyserve: argument --log-level: invalid choice: 'loud' "),
])
def test_a_bad_command_line_is_its_error_and_a_pointer_to_help(
        capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    # Two lines, as uvicorn's: never argparse's usage, which lists every option.
    status, err = run_main(capsys, *argv)
    assert status == cli.EXIT_USAGE == 2
    first, second = err.splitlines()
    assert first.startswith(line)
    assert second == "Try 'cyserve --help' for help."
    assert err.endswith("\n")


def test_help_has_one_usage_line_and_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: cyserve [OPTIONS] MODULE:APP\n\n")
    for action in cli.build_parser()._actions:
        for spelling in action.option_strings:
            assert spelling in out


def test_loop_uvloop_without_uvloop_is_one_line(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # A None in sys.modules is how Python says a module cannot be imported: uvloop is missing
    # for this test whether or not it is installed.
    monkeypatch.setitem(sys.modules, "uvloop", None)
    status, err = run_main(capsys, "m:app", "--loop", "uvloop")
    assert (status, err) == (2, "cyserve: invalid --loop 'uvloop': uvloop is not installed\n")


def test_bad_app_spec(capsys: pytest.CaptureFixture[str], isolated_path: None) -> None:
    status, err = run_main(capsys, "justamodule")
    assert (status, err) == (2, "cyserve: app must be given as 'module:attribute', "
                                "got 'justamodule'\n")


def test_module_that_does_not_exist(capsys: pytest.CaptureFixture[str],
                                    isolated_path: None) -> None:
    status, err = run_main(capsys, "no_such_pkg_xyz.y:app")
    assert (status, err) == (2, "cyserve: cannot import 'no_such_pkg_xyz.y': "
                                "No module named 'no_such_pkg_xyz'\n")


def test_missing_attribute(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                           isolated_path: None) -> None:
    name = write_module(tmp_path, "x = 1\n")
    status, err = run_main(capsys, f"{name}:app", "--app-dir", str(tmp_path))
    assert (status, err) == (2, f"cyserve: '{name}' has no attribute 'app'\n")


def test_attribute_that_is_not_an_app(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      isolated_path: None) -> None:
    name = write_module(tmp_path, "app = 42\n")
    status, err = run_main(capsys, f"{name}:app", "--app-dir", str(tmp_path))
    assert (status, err) == (2, f"cyserve: '{name}:app': expected a cyserve.App, a WSGI "
                                "or an ASGI application, got int 42\n")


def test_a_wsgi_callable_is_served_as_one(tmp_path: Path, isolated_path: None) -> None:
    name = write_module(tmp_path, """
        def app(environ, start_response):
            start_response("200 OK", [])
            return [b"hi"]
    """)
    app = cli.load_app(f"{name}:app", str(tmp_path))
    assert isinstance(app, cyserve.App)
    [(match, pattern, methods, kind, handler)] = app.build()
    assert (match, pattern, methods, kind) == ("prefix", "/", None, "python")
    assert handler.app.__module__ == name
    assert cli.load_app(f"{name}:app", str(tmp_path), "wsgi").build()[0][4].app is handler.app


@pytest.mark.parametrize(("source", "options", "message"), [
    ("import cyserve\napp = cyserve.App()\n", ("--interface", "wsgi"),
     "interface 'wsgi' was asked for, but this is a cyserve.App"),
    ("def app(environ, start_response):\n    return []\n", ("--interface", "cyserve"),
     "expected a cyserve.App, got function"),
    ("async def app(scope, receive, send):\n    pass\n", ("--interface", "wsgi"),
     "is an async (ASGI) application, but interface 'wsgi' was asked for"),
    ("def app(environ, start_response):\n    return []\n", ("--interface", "asgi"),
     "interface 'asgi' was asked for, but function"),
])
def test_interface_mismatch_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        isolated_path: None, source: str,
                                        options: tuple[str, ...], message: str) -> None:
    name = write_module(tmp_path, source)
    status, err = run_main(capsys, f"{name}:app", "--app-dir", str(tmp_path), *options)
    assert status == 2
    assert err.startswith(f"cyserve: '{name}:app': ") and err.endswith("\n")
    assert message in err and err.count("\n") == 1


def test_factory_is_called_for_the_app(tmp_path: Path, isolated_path: None) -> None:
    name = write_module(tmp_path, """
        import cyserve

        def create_app():
            app = cyserve.App()
            app.static("/", "made")
            return app

        def create_wsgi():
            def wsgi(environ, start_response):
                start_response("200 OK", [])
                return [b"hi"]
            return wsgi

        def create_asgi():
            async def asgi(scope, receive, send):
                pass
            return asgi
    """)
    app = cli.load_app(f"{name}:create_app", str(tmp_path), factory=True)
    assert isinstance(app, cyserve.App) and app.build()[0][3] == "static"
    app = cli.load_app(f"{name}:create_wsgi", str(tmp_path), factory=True)
    assert app.build()[0][4].app.__name__ == "wsgi"
    # An ASGI app from a factory is told from a WSGI one as an attribute would be, and
    # --interface asgi takes it.
    for interface in ("auto", "asgi"):
        app = cli.load_app(f"{name}:create_asgi", str(tmp_path), interface=interface,
                           factory=True)
        target = app.build()[0][4]
        assert (type(target).__name__, target.app.__name__) == ("ASGIHandler", "asgi")
    with pytest.raises(cli.AppLoadError,
                       match=r"is an async \(ASGI\) application, but interface 'wsgi' was"):
        cli.load_app(f"{name}:create_asgi", str(tmp_path), interface="wsgi", factory=True)


def test_a_factory_without_factory_is_one_line(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path, isolated_path: None) -> None:
    name = write_module(tmp_path, """
        def create_app():
            pass

        not_callable = 5
    """)
    status, err = run_main(capsys, f"{name}:create_app", "--app-dir", str(tmp_path))
    assert status == 2 and err.count("\n") == 1
    assert "'create_app' cannot be called as a WSGI application with (environ, " in err
    assert "(an application factory? the command takes --factory to call it first)" in err
    status, err = run_main(capsys, f"{name}:not_callable", "--app-dir", str(tmp_path),
                           "--factory")
    assert (status, err) == (2, f"cyserve: '{name}:not_callable' is not callable, so it cannot "
                                f"be a factory (it is a int)\n")
    status, err = run_main(capsys, f"{name}:create_app", "--app-dir", str(tmp_path),
                           "--factory")
    assert (status, err) == (2, f"cyserve: '{name}:create_app' (its factory's result): expected "
                                f"a cyserve.App, a WSGI or an ASGI application, got NoneType "
                                f"None\n")


def test_uvicorns_asgi2_interface_is_refused_in_words(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    status, err = run_main(capsys, "m:app", "--interface", "asgi2")
    assert (status, err) == (2, "cyserve: argument --interface: 'asgi2' is refused: cyserve "
                                "serves ASGI 3 applications (one async callable of scope, "
                                "receive and send); asgiref's guarantee_single_callable() "
                                "makes an ASGI 2 application one\n"
                                "Try 'cyserve --help' for help.\n")


def test_unknown_interface_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, err = run_main(capsys, "m:app", "--interface", "rsgi")
    assert status == 2 and err.startswith("cyserve: argument --interface: invalid choice: 'rsgi'")
    assert err.endswith("\nTry 'cyserve --help' for help.\n")


def test_dotted_attribute(tmp_path: Path, isolated_path: None) -> None:
    name = write_module(tmp_path, """
        import cyserve
        class Holder:
            app = cyserve.App()
    """)
    app = cli.load_app(f"{name}:Holder.app", str(tmp_path))
    assert isinstance(app, cyserve.App)


def test_app_dir_defaults_to_the_current_folder(tmp_path: Path, isolated_path: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    name = write_module(tmp_path, "import cyserve\napp = cyserve.App()\n")
    monkeypatch.chdir(tmp_path)
    assert isinstance(cli.load_app(f"{name}:app"), cyserve.App)


def test_an_error_inside_the_application_shows_its_traceback(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, isolated_path: None) -> None:
    name = write_module(tmp_path, "import cyserve\nraise RuntimeError('boom in app')\n")
    status, err = run_main(capsys, f"{name}:app", "--app-dir", str(tmp_path))
    assert status == 1
    assert "Traceback" in err and f"{name}.py" in err
    assert err.splitlines()[-1] == (f"cyserve: error while importing '{name}:app': "
                                    "RuntimeError: boom in app")


def test_a_missing_dependency_of_the_app_is_not_reported_as_a_bad_app_path(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, isolated_path: None) -> None:
    name = write_module(tmp_path, "import no_such_dependency_xyz\n")
    status, err = run_main(capsys, f"{name}:app", "--app-dir", str(tmp_path))
    assert status == 1
    assert err.splitlines()[-1] == (f"cyserve: error while importing '{name}:app': "
                                    "ModuleNotFoundError: No module named "
                                    "'no_such_dependency_xyz'")


def test_load_app_errors_are_app_load_errors(isolated_path: None) -> None:
    with pytest.raises(AppLoadError, match="module:attribute"):
        cli.load_app(":app")
    with pytest.raises(AppLoadError, match="module:attribute"):
        cli.load_app("mod:")
    # importlib would raise a TypeError about a 'package' argument the user never gave.
    with pytest.raises(AppLoadError, match="absolute module name, got '.demo'"):
        cli.load_app(".demo:app")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"cyserve {cyserve.__version__}\n"


# ---- subprocess: `python -m cyserve` as a user runs it --------------------------------------

def run_cyserve(*args: str, cwd: Path = ROOT,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cyserve", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout)


def test_subprocess_bad_app_path() -> None:
    proc = run_cyserve("x.y:app")
    assert proc.returncode == 2
    assert proc.stderr == "cyserve: cannot import 'x.y': No module named 'x'\n"
    assert proc.stdout == ""


def test_subprocess_missing_attribute(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("x = 1\n")
    proc = run_cyserve("mod:app", cwd=tmp_path)  # the current folder is on the path
    assert (proc.returncode, proc.stderr) == (2, "cyserve: 'mod' has no attribute 'app'\n")


def test_subprocess_bad_option() -> None:
    proc = run_cyserve("examples.demo.app:app", "--threads", "-1")
    assert proc.returncode == 2
    assert proc.stderr == "cyserve: invalid --threads -1: must be between 0 and 1024\n"


def test_subprocess_unknown_flag() -> None:
    # (--workers was the example here until it became --processes' alias, as uvicorn spells it.)
    proc = run_cyserve("examples.demo.app:app", "--worker-count", "2")
    assert proc.returncode == 2
    assert proc.stderr == ("cyserve: unrecognized arguments: --worker-count 2\n"
                           "Try 'cyserve --help' for help.\n")
def test_subprocess_port_in_use(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(textwrap.dedent("""
        import cyserve
        app = cyserve.App()
        app.static("/", "hi")
    """))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = run_cyserve("tiny:app", "--port", str(port), "--threads", "1", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr == f"cyserve: cannot listen on 127.0.0.1:{port}: address already in use\n"


@pytest.mark.parametrize(("exc", "message"), [
    (OSError(errno.EADDRINUSE, "bind: whatever the engine said"), "address already in use"),
    (OSError(errno.EACCES, "bind: denied"), "permission denied"),
    (OSError(errno.EADDRNOTAVAIL, ""), "cannot assign requested address"),
    (OSError(errno.EINVAL, "cannot resolve host nope: Name or service not known"),
     "cannot resolve host nope: Name or service not known"),
])
def test_listen_error_messages(exc: OSError, message: str) -> None:
    err = signals.listen_error("::1", 8000, exc)
    assert str(err) == f"cannot listen on [::1]:8000: {message}"
    assert err.errno == exc.errno


def test_format_address() -> None:
    assert signals.format_address("127.0.0.1", 80) == "127.0.0.1:80"
    assert signals.format_address("::", 0) == "[::]:0"
    assert signals.format_address("localhost", 1) == "localhost:1"


def test_help_lists_the_limits_and_timeouts() -> None:
    proc = subprocess.run([sys.executable, "-m", "cyserve", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for option in ("--max-body-bytes", "--keepalive-timeout", "--header-timeout",
                   "--body-timeout", "--graceful-timeout", "--threads", "--processes"):
        assert option in proc.stdout, option


# ---- uvicorn's command lines (issue 17): taken where cyserve can honour them ----------------

def _config(*argv: str) -> cyserve.config.Config:
    return cli.config_from_args(cli.build_parser().parse_args(["m:app", *argv]))


def test_uvicorns_no_proxy_headers_is_the_off_switch(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    assert _config("--no-proxy-headers").trusted_proxies() is None
    assert _config("--proxy-headers").trusted_proxies() is not None
    # cyserve's default stays off (uvicorn's is on), and --help says so.
    assert _config().proxy_headers is False
    assert "default: off, where uvicorn's is on" in " ".join(
        cli.build_parser().format_help().split())
    # Off beside an option that turns the headers on is a contradiction, said in one line.
    status, err = run_main(capsys, "m:app", "--no-proxy-headers", "--forwarded-allow-ips", "*")
    assert status == 2
    assert err == ("cyserve: invalid --proxy-headers off: --no-proxy-headers contradicts "
                   "--forwarded-allow-ips, which turns proxy headers on (for the PROXY "
                   "protocol's peers, add --proxy-protocol)\n")


# Each combination of the proxy options a uvicorn or gunicorn user may write: (whose proxy
# headers are believed, whose connections begin with a PROXY protocol header).
@pytest.mark.parametrize(("argv", "headers_from", "pp_from"), [
    ([], None, None),
    (["--no-proxy-headers"], None, None),
    (["--proxy-headers"], "127.0.0.1", None),
    (["--forwarded-allow-ips", "10.0.0.0/8"], "10.0.0.0/8", None),
    (["--proxy-headers", "--forwarded-allow-ips", "*"], "*", None),
    (["--proxy-protocol"], None, "127.0.0.1"),
    (["--no-proxy-headers", "--proxy-protocol"], None, "127.0.0.1"),
    (["--proxy-protocol", "--forwarded-allow-ips", "10.0.0.0/8"], "10.0.0.0/8", "10.0.0.0/8"),
    # A TCP balancer (AWS NLB) passes the client's own headers through: the PROXY protocol
    # from it, and no header believed, said in uvicorn's words ...
    (["--no-proxy-headers", "--proxy-protocol", "--forwarded-allow-ips", "10.0.0.0/8"],
     None, "10.0.0.0/8"),
    # ... or in gunicorn's.
    (["--proxy-protocol", "--proxy-allow-from", "10.0.0.0/8"], None, "10.0.0.0/8"),
    (["--no-proxy-headers", "--proxy-protocol", "--proxy-allow-from", "10.0.0.0/8"],
     None, "10.0.0.0/8"),
    # gunicorn's two lists: the balancer's for the PROXY protocol, the proxies' for headers.
    (["--proxy-protocol", "--proxy-allow-from", "10.0.0.0/8", "--forwarded-allow-ips",
      "192.168.0.0/16"], "192.168.0.0/16", "10.0.0.0/8"),
    (["--proxy-headers", "--proxy-protocol", "--proxy-allow-from", "*"], "127.0.0.1", "*"),
    # gunicorn takes its PROXY protocol list without the protocol: it names no peer then.
    (["--proxy-allow-from", "10.0.0.0/8"], None, None),
])
def test_proxy_option_combinations(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                   headers_from: str | None, pp_from: str | None) -> None:
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    c = _config(*argv)
    assert (c.trusted_proxies(), c.proxy_protocol_peers()) == (headers_from, pp_from)


@pytest.mark.parametrize(("argv", "reason"), [
    (["--no-proxy-headers", "--forwarded-host"],
     "--no-proxy-headers contradicts --forwarded-host, which turns proxy headers on"),
    (["--no-proxy-headers", "--proxy-protocol", "--forwarded-host"],
     "--no-proxy-headers contradicts --forwarded-host, which turns proxy headers on"),
    # Which proxy headers to believe, when none are read: given, even as the default's value,
    # it says proxy headers are wanted.
    (["--no-proxy-headers", "--forwarded-header", "forwarded"],
     "--no-proxy-headers contradicts --forwarded-header forwarded, which names the proxy "
     "headers to believe: none are read"),
    (["--no-proxy-headers", "--proxy-protocol", "--forwarded-header", "x-forwarded"],
     "--no-proxy-headers contradicts --forwarded-header x-forwarded, which names the proxy "
     "headers to believe: none are read"),
    # The list could only be for the headers, which are off.
    (["--no-proxy-headers", "--proxy-protocol", "--proxy-allow-from", "10.0.0.1",
      "--forwarded-allow-ips", "10.0.0.2"],
     "--no-proxy-headers contradicts --forwarded-allow-ips, which can only turn proxy headers "
     "on when --proxy-allow-from names the PROXY protocol's peers"),
])
def test_proxy_option_contradictions_are_one_line(capsys: pytest.CaptureFixture[str],
                                                  argv: list[str], reason: str) -> None:
    assert run_main(capsys, "m:app", *argv) == (
        2, f"cyserve: invalid --proxy-headers off: {reason}\n")


def test_a_bad_proxy_allow_from_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(capsys, "m:app", "--proxy-protocol", "--proxy-allow-from", "10.0.0.300") == (
        2, "cyserve: invalid --proxy-allow-from 10.0.0.300: '10.0.0.300' is not an IP address "
           "or network (10.0.0.0/8, ::1, or * for every peer)\n")


def test_forwarded_header_from_the_environment_beside_no_proxy_headers_says_so(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CYSERVE_FORWARDED_HEADER", "forwarded")
    assert run_main(capsys, "m:app", "--no-proxy-headers") == (
        2, "cyserve: invalid --proxy-headers off: --no-proxy-headers contradicts "
           "--forwarded-header forwarded (CYSERVE_FORWARDED_HEADER='forwarded'), which names the "
           "proxy headers to believe: none are read\n")


@pytest.mark.parametrize(("argv", "env", "reason"), [
    (["--no-proxy-headers"], {"CYSERVE_FORWARDED_HOST": "1"},
     "--forwarded-host (CYSERVE_FORWARDED_HOST='1'), which turns proxy headers on"),
    (["--no-proxy-headers"], {"CYSERVE_FORWARDED_ALLOW_IPS": "10.0.0.2"},
     "--forwarded-allow-ips (CYSERVE_FORWARDED_ALLOW_IPS='10.0.0.2'), which turns proxy headers "
     "on (for the PROXY protocol's peers, add --proxy-protocol)"),
    (["--no-proxy-headers", "--proxy-protocol", "--forwarded-allow-ips", "10.0.0.2"],
     {"CYSERVE_PROXY_ALLOW_FROM": "10.0.0.1"},
     "--forwarded-allow-ips, which can only turn proxy headers on when --proxy-allow-from "
     "(CYSERVE_PROXY_ALLOW_FROM='10.0.0.1') names the PROXY protocol's peers"),
])
def test_proxy_contradictions_name_the_environment_variable_a_value_came_from(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str],
        env: dict[str, str], reason: str) -> None:
    """An option beside --no-proxy-headers that the command line did not give is said with the
    variable that gave it, as --forwarded-header's and the limits' are: the user looking at the
    command line would not find it there."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert run_main(capsys, "m:app", *argv) == (
        2, f"cyserve: invalid --proxy-headers off: --no-proxy-headers contradicts {reason}\n")


def test_forwarded_header_unsaid_is_configs_default() -> None:
    assert _config().forwarded_header == cyserve.config.Config().forwarded_header
    assert _config("--forwarded-header", "Forwarded").forwarded_header == "forwarded"
    assert _config("--no-proxy-headers").forwarded_header == "x-forwarded"


def test_no_proxy_headers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    args, config = cli.parse_command(["m:app"], {"CYSERVE_PROXY_HEADERS": "false"})
    assert args.proxy_headers is False and config.trusted_proxies() is None
    _, config = cli.parse_command(["m:app"], {"CYSERVE_PROXY_HEADERS": "true"})
    assert config.trusted_proxies() is not None


@pytest.mark.parametrize("library", ["auto", "websockets", "wsproto", "WSPROTO"])
def test_uvicorns_ws_libraries_mean_cyserves_own_websocket(library: str) -> None:
    # Not "ambiguous option" against the --ws-* options; the WebSocket settings are unchanged.
    args = cli.build_parser().parse_args(["m:app", "--ws", library])
    assert args.ws == library.lower()
    assert cli.config_from_args(args) == cyserve.config.Config()


@pytest.mark.parametrize(("argv", "line"), [
    # uvicorn's --ws none hands an upgrade to the app as plain HTTP; cyserve cannot.
    (["--ws", "none"], "cyserve: argument --ws: 'none' is refused: cyserve has no setting that "
                       "turns WebSocket off"),
    (["--ws-max-queue", "32"], "cyserve: --ws-max-queue is refused: cyserve bounds an ASGI "
                               "WebSocket's unreceived messages in bytes, not in messages"),
    (["--h11-max-incomplete-event-size", "0"],
     "cyserve: invalid --h11-max-incomplete-event-size 0: must be between 64 and 1048576"),
    # Two names of the one limit, set differently: the last no longer wins without a word.
    (["--limit-request-field-size", "8190", "--h11-max-incomplete-event-size", "4096"],
     "cyserve: invalid --h11-max-incomplete-event-size 4096: sets --max-header-bytes, as "
     "--limit-request-field-size 8190 does: give one of them"),
])
def test_uvicorn_options_cyserve_cannot_honour_are_one_line(
        capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    status, err = run_main(capsys, "m:app", *argv)
    assert status == 2
    assert err.startswith(line)
    # A word argparse refuses points to --help too; a value cyserve refuses is one line.
    hint = argv[0] in ("--ws", "--ws-max-queue")
    assert err.splitlines()[1:] == (["Try 'cyserve --help' for help."] if hint else [])


def test_uvicorns_h11_max_incomplete_event_size_sets_max_header_bytes() -> None:
    assert _config("--h11-max-incomplete-event-size", "4096").max_header_bytes == 4096
    assert _config("--h11-max-incomplete-event-size", "4096", "--limit-request-field-size",
                   "4096").max_header_bytes == 4096  # the same value twice is no contradiction


@pytest.mark.parametrize(("argv", "limit"), [
    (["--limit-request-field-size", "0100", "--h11-max-incomplete-event-size", "100"], 100),
    # gunicorn's 0 is the most cyserve takes, which uvicorn's option names as a number.
    (["--limit-request-field-size", "0", "--h11-max-incomplete-event-size", "1048576"], 1048576),
])
def test_two_names_of_one_limit_agree_by_the_limit_not_its_spelling(argv: list[str],
                                                                     limit: int) -> None:
    """gunicorn's and uvicorn's names of --max-header-bytes given the same limit in two
    spellings: no contradiction (they were refused as if they differed)."""
    assert _config(*argv).max_header_bytes == limit


@pytest.mark.parametrize(("argv", "line"), [
    (["--max-header-bytes", "4096", "--limit-request-field-size", "8190"],
     "cyserve: invalid --limit-request-field-size 8190: sets --max-header-bytes, which is given "
     "as 4096: give one of them\n"),
    # The order on the command line does not matter: neither wins.
    (["--limit-request-field-size", "8190", "--max-header-bytes", "4096"],
     "cyserve: invalid --limit-request-field-size 8190: sets --max-header-bytes, which is given "
     "as 4096: give one of them\n"),
    (["--max-header-bytes", "4096", "--h11-max-incomplete-event-size", "8192"],
     "cyserve: invalid --h11-max-incomplete-event-size 8192: sets --max-header-bytes, which is "
     "given as 4096: give one of them\n"),
    (["--max-target-bytes", "2048", "--limit-request-line", "4094"],
     "cyserve: invalid --limit-request-line 4094: sets --max-target-bytes, which is given as "
     "2048: give one of them\n"),
    (["--max-headers", "50", "--limit-request-fields", "100"],
     "cyserve: invalid --limit-request-fields 100: sets --max-headers, which is given as 50: "
     "give one of them\n"),
    # Even the default's value, said, is a value the user meant.
    (["--max-header-bytes", str(cyserve.config.Config().max_header_bytes),
      "--limit-request-field-size", "8190"],
     "cyserve: invalid --limit-request-field-size 8190: sets --max-header-bytes, which is given "
     f"as {cyserve.config.Config().max_header_bytes}: give one of them\n"),
])
def test_a_cyserve_limit_and_gunicorns_name_of_it_set_differently_are_refused(
        capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    assert run_main(capsys, "m:app", *argv) == (2, line)


@pytest.mark.parametrize(("env", "argv", "line"), [
    # A value the user did not type is not reported as if typed: the line says which variable
    # (or --config key) gave it.
    ({"CYSERVE_MAX_HEADER_BYTES": "4096"}, ["--limit-request-field-size", "8190"],
     "cyserve: invalid --limit-request-field-size 8190: sets --max-header-bytes, which is given "
     "as 4096 (CYSERVE_MAX_HEADER_BYTES='4096'): give one of them\n"),
    ({"CYSERVE_LIMIT_REQUEST_FIELD_SIZE": "8190"}, ["--max-header-bytes", "4096"],
     "cyserve: CYSERVE_LIMIT_REQUEST_FIELD_SIZE='8190': sets --max-header-bytes, which is given "
     "as 4096: give one of them\n"),
    ({"CYSERVE_LIMIT_REQUEST_FIELD_SIZE": "8190", "CYSERVE_MAX_HEADER_BYTES": "4096"}, [],
     "cyserve: CYSERVE_LIMIT_REQUEST_FIELD_SIZE='8190': sets --max-header-bytes, which is given "
     "as 4096 (CYSERVE_MAX_HEADER_BYTES='4096'): give one of them\n"),
    ({"CYSERVE_LIMIT_REQUEST_FIELD_SIZE": "8190"}, ["--h11-max-incomplete-event-size", "4096"],
     "cyserve: invalid --h11-max-incomplete-event-size 4096: sets --max-header-bytes, as "
     "CYSERVE_LIMIT_REQUEST_FIELD_SIZE='8190' does: give one of them\n"),
])
def test_a_limit_set_twice_says_where_each_value_came_from(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        env: dict[str, str], argv: list[str], line: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert run_main(capsys, "m:app", *argv) == (2, line)


def test_a_limit_set_twice_names_the_config_file_key(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("max-header-bytes = 4096\n")
    assert run_main(capsys, "m:app", "--config", str(conf), "--limit-request-field-size",
                    "8190") == (
        2, "cyserve: invalid --limit-request-field-size 8190: sets --max-header-bytes, which is "
           f"given as 4096 (--config {conf}: max-header-bytes): give one of them\n")


def test_a_cyserve_limit_and_gunicorns_name_of_it_agreeing_are_taken() -> None:
    assert _config("--max-header-bytes", "8190", "--limit-request-field-size",
                   "8190").max_header_bytes == 8190
    # gunicorn's 0 is the most, the same limit as cyserve's largest value.
    assert _config("--max-target-bytes", str(1 << 20), "--limit-request-line",
                   "0").max_target_bytes == 1 << 20
    # Not given, the defaults stand, as before.
    assert (_config().max_header_bytes, _config().max_target_bytes, _config().max_headers) == (
        cyserve.config.Config().max_header_bytes, cyserve.config.Config().max_target_bytes,
        cyserve.config.Config().max_headers)


@pytest.mark.parametrize("flag", ["--use-colors", "--no-use-colors"])
def test_uvicorns_use_colors_is_taken_and_changes_nothing(flag: str) -> None:
    assert _config(flag) == cyserve.config.Config()
    help_text = " ".join(cli.build_parser().format_help().split())
    assert "--use-colors" in help_text and "no effect" in help_text
