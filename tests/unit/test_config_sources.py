"""Options from the environment (CYSERVE_<OPTION>) and from a TOML file (--config): every
option is taken from both, the command line wins over the environment, which wins over the
file, and a bad key or value is one line that names it (cli.parse_command)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from cyserve import cli


def _sample(action: argparse.Action) -> tuple[object, object]:
    """A value for the option that differs from its default: (as given, as parsed)."""
    if action.nargs == 0:
        value = not action.default
        return value, value
    if action.nargs == "?" and not action.option_strings:  # MODULE:APP
        return "m:app", "m:app"
    if isinstance(action, argparse._AppendAction):
        return ["unix:/tmp/a.sock", "127.0.0.1:9"], ["unix:/tmp/a.sock", "127.0.0.1:9"]
    if action.choices:
        value = next(c for c in action.choices if c != action.default)
        return value, value
    return "7", "7"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return f'"{value}"'


def test_every_option_is_taken_from_the_environment_and_from_toml(tmp_path: Path) -> None:
    parser = cli.build_parser()
    names = cli.option_names(parser)
    assert {"port", "processes", "workers", "max-requests", "app", "config", "http2"} <= \
        set(names)
    checked = 0
    for option, action in names.items():
        if option == "config":
            continue  # where the file is: below
        given, parsed = _sample(action)
        # A list in the environment: words, but a header per line (its value has blanks).
        sep = "\n" if option == "header" else " "
        env_value = sep.join(given) if isinstance(given, list) else \
            ("true" if given is True else "false" if given is False else str(given))
        env = {cli.env_name(option): env_value}
        if option != "app":
            env["CYSERVE_APP"] = "m:app"
        args, given_dests, labels = cli.parse_sources([], env)
        assert getattr(args, action.dest) == parsed, (option, env)
        assert labels[action.dest].startswith(cli.env_name(option) + "=")
        toml = tmp_path / f"{option}.toml"
        lines = [f"{option} = {_toml(given)}"]
        if option != "app":
            lines.append('app = "m:app"')
        toml.write_text("\n".join(lines) + "\n")
        args, _, labels = cli.parse_sources(["--config", str(toml)], {})
        assert getattr(args, action.dest) == parsed, (option, toml.read_text())
        # The snake_case spelling of a key is the same key.
        toml.write_text("\n".join([f"{option.replace('-', '_')} = {_toml(given)}"] + lines[1:])
                        + "\n")
        args, _, _ = cli.parse_sources([], {"CYSERVE_CONFIG": str(toml)})
        assert getattr(args, action.dest) == parsed, option
        checked += 1
    assert checked == len(names) - 1


def test_headers_from_the_environment_are_one_per_line() -> None:
    args, _, _ = cli.parse_sources([], {"CYSERVE_APP": "m:app",
                                        "CYSERVE_HEADER": "X-A: b c\nX-B:d\n"})
    assert args.header == ["X-A: b c", "X-B:d"]
    assert cli.config_from_args(args).headers == (("X-A", "b c"), ("X-B", "d"))


def test_the_command_line_wins_over_the_environment_which_wins_over_the_file(
        tmp_path: Path) -> None:
    toml = tmp_path / "cyserve.toml"
    toml.write_text('app = "m:app"\nport = 9001\nthreads = 3\nmax-requests = 50\n'
                    'bind = ["127.0.0.1:9100"]\naccess-log = true\n')
    args, config = cli.parse_command(["--config", str(toml)], {})
    assert (config.port, config.threads, config.max_requests, config.bind, config.access_log) \
        == (9001, 3, 50, ("127.0.0.1:9100",), True)
    env = {"CYSERVE_PORT": "9002", "CYSERVE_THREADS": "2", "CYSERVE_BIND": "127.0.0.1:9200",
           "CYSERVE_TEST_HOOKS": "1"}  # not an option: left alone
    args, config = cli.parse_command(["--config", str(toml), "--threads", "1",
                                      "--bind", "127.0.0.1:9300"], env)
    assert (config.port, config.threads, config.max_requests, config.bind) == \
        (9002, 1, 50, ("127.0.0.1:9300",))
    assert args.app == "m:app"
    # A [cyserve] table of its own is the same table.
    toml.write_text('[cyserve]\napp = "m:app"\nworkers = 2\n')
    assert cli.parse_command(["--config", str(toml)], {})[1].processes == 2


@pytest.mark.parametrize("content, env, message", [
    ('app = "m:app"\nprot = 80\n', {}, "--config {path}: unknown option 'prot'"),
    ('app = "m:app"\nport = "eighty"\n', {},
     "--config {path}: port: must be an integer"),
    ('app = "m:app"\nport = true\n', {},
     "--config {path}: port: must be a string or a number, got True"),
    ('app = "m:app"\nlog-level = "loud"\n', {},
     "--config {path}: log-level: argument --log-level: invalid choice: 'loud'"),
    ('app = "m:app"\naccess-log = "maybe"\n', {},
     "--config {path}: access-log: must be true or false, got 'maybe'"),
    ('app = "m:app"\nconfig = "other.toml"\n', {}, "--config {path}: unknown option 'config'"),
    ('app = "m:app"\nport = 8000\n[extra]\n', {}, "--config {path}: unknown option 'extra'"),
    ('app = "m:app"\nport = 80\nport = 81\n', {}, "--config {path}: not valid TOML"),
    ('app = "m:app"\n', {"CYSERVE_MAX_REQUESTS": "lots"},
     "CYSERVE_MAX_REQUESTS='lots': must be an integer"),
    ('app = "m:app"\n', {"CYSERVE_PROCESSES": "0"},
     "CYSERVE_PROCESSES='0': must be between 1 and 256"),
    ('app = "m:app"\n', {"CYSERVE_HTTP2": "perhaps"},
     "CYSERVE_HTTP2='perhaps': must be true or false, got 'perhaps'"),
])
def test_a_bad_key_or_value_names_it(tmp_path: Path, content: str, env: dict[str, str],
                                     message: str) -> None:
    toml = tmp_path / "cyserve.toml"
    toml.write_text(content)
    with pytest.raises(cli._UsageError) as err:
        cli.parse_command(["--config", str(toml)], env)
    text = str(err.value)
    assert text.startswith(message.format(path=toml)), text
    assert "\n" not in text


def test_a_gunicorn_python_config_is_read(tmp_path: Path) -> None:
    # Its globals named as options are options (the hooks: tests/e2e/test_hooks.py), below the
    # environment and the command line as a TOML file's are; its own names are left alone.
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("import multiprocessing\n\nBASE = 4\nworkers = BASE // 2\n"
                    "max_requests = 100\nbind = ('127.0.0.1:9100', 'unix:/tmp/c.sock')\n"
                    "access_log = True\npid = None\n\n\ndef helper():\n    return 1\n")
    args, config = cli.parse_command(["m:app", "-c", str(conf), "--max-requests", "7"],
                                     {"CYSERVE_ACCESS_LOG": "0"})
    assert (config.processes, config.max_requests, config.bind, config.access_log,
            config.pid) == (2, 7, ("127.0.0.1:9100", "unix:/tmp/c.sock"), False, None)


def test_a_gunicorn_file_s_own_names_are_its_options(tmp_path: Path) -> None:
    # A gunicorn.conf.py names nine settings otherwise than their command-line options
    # (accesslog for --access-logfile, keepalive for --keep-alive, ...): a file copied from a
    # gunicorn deployment starts with them, where they were "unknown option" before.
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(f"accesslog = {str(tmp_path / 'access.log')!r}\nerrorlog = '-'\n"
                    "loglevel = 'warning'\nkeepalive = 3\npreload_app = False\n"
                    "raw_env = ['A=1', 'B=2']\n"
                    f"pidfile = {str(tmp_path / 'srv.pid')!r}\nproc_name = 'shop'\n")
    args, config = cli.parse_command(["m:app", "-c", str(conf)], {})
    assert (config.access_logfile, config.log_level, config.keepalive_timeout, config.preload,
            config.pid, config.proc_name) == (str(tmp_path / "access.log"), "warning", 3.0,
                                              False, str(tmp_path / "srv.pid"), "shop")
    assert args.env == ["A=1", "B=2"]


def test_a_gunicorn_files_proxy_allow_ips_is_proxy_allow_from(tmp_path: Path) -> None:
    # gunicorn.conf.py's name of --proxy-allow-from: the PROXY protocol's peers, no headers.
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("proxy_protocol = True\nproxy_allow_ips = '10.0.0.0/8'\n")
    _, config = cli.parse_command(["m:app", "-c", str(conf)], {})
    assert (config.proxy_protocol_peers(), config.trusted_proxies()) == ("10.0.0.0/8", None)


def test_a_value_given_on_the_command_line_is_reported_as_the_option(tmp_path: Path) -> None:
    from cyserve.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        cli.parse_command(["m:app", "--port", "x"], {"CYSERVE_PORT": "y"})
    assert err.value.for_cli() == "invalid --port x: must be an integer"


def test_the_options_table_in_the_docs_is_the_generated_one() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "options.md").read_text()
    begin, end = "<!-- options table: begin -->\n", "<!-- options table: end -->\n"
    assert begin in doc and end in doc
    table = doc[doc.index(begin) + len(begin):doc.index(end)]
    assert table == cli.options_markdown(), (
        "docs/options.md is out of date: rewrite it with `.venv/bin/python -m cyserve.cli "
        "--write-options-doc`")


def test_the_options_said_not_taken_are_refused() -> None:
    # docs/options.md's hand-written table of uvicorn's and gunicorn's options that cyserve does
    # not take: each option named in its first column must still be unknown to the parser (one
    # that was taken since belongs in the generated table, and its row goes).
    doc = (Path(__file__).resolve().parents[2] / "docs" / "options.md").read_text()
    heading = "## Options of uvicorn and gunicorn that cyserve does not take\n"
    assert heading in doc
    rows = [ln for ln in doc[doc.index(heading):].splitlines()
            if ln.startswith("| ") and not ln.startswith(("| option ", "| ---"))]
    named = {opt for row in rows for opt in re.findall(r"(?<![\w-])-{1,2}[A-Za-z][\w-]*",
                                                         row.split(" | ")[0])}
    assert len(named) >= 10, named  # the table was found and read
    known = set(cli.build_parser()._option_string_actions)
    assert sorted(named & known) == [], "taken now: move them out of the table of options not taken"


def test_every_option_has_a_help_section() -> None:
    parser = cli.build_parser()
    left = [a.option_strings for a in parser._optionals._group_actions
            if a.dest not in ("help", "version")]
    assert left == [], "options without a section in --help (cli._SECTIONS)"


@pytest.mark.parametrize("argv, env, toml, expected", [
    (["--lifespan", "on"], {}, "", "on"),
    (["--lifespan", "OFF"], {}, "", "off"),
    ([], {"CYSERVE_LIFESPAN": "off"}, "", "off"),
    ([], {}, 'lifespan = "on"\n', "on"),
    ([], {}, "", "auto"),
])
def test_lifespan_from_each_source_reaches_the_config(tmp_path: Path, argv: list[str],
                                                      env: dict[str, str], toml: str,
                                                      expected: str) -> None:
    if toml:
        (tmp_path / "c.toml").write_text(toml)
        argv = [*argv, "--config", str(tmp_path / "c.toml")]
    args, config = cli.parse_command(["m:app", *argv], env)
    assert config.lifespan == expected


def test_a_bad_lifespan_is_refused() -> None:
    with pytest.raises(cli._UsageError, match="--lifespan: invalid choice: 'maybe'"):
        cli.parse_command(["m:app", "--lifespan", "maybe"], {})
    with pytest.raises(cli._UsageError, match="CYSERVE_LIFESPAN='maybe'"):
        cli.parse_command(["m:app"], {"CYSERVE_LIFESPAN": "maybe"})


@pytest.mark.parametrize("argv, env, mode", [
    ([], {}, "auto"),
    (["--http", "1"], {}, "1"),
    (["--http", "2"], {}, "2"),
    (["--http", "AUTO"], {}, "auto"),
    (["--no-http2"], {}, "1"),
    (["--http2", "--http", "2"], {}, "2"),
    ([], {"CYSERVE_HTTP": "2"}, "2"),
    (["--http", "auto"], {"CYSERVE_HTTP": "2"}, "auto"),  # the command line wins
])
def test_http_versions_from_the_command_line(argv: list[str], env: dict[str, str],
                                             mode: str) -> None:
    assert cli.parse_command(["m:app", *argv], env)[1].http_mode == mode


@pytest.mark.parametrize("argv, env, line", [
    (["--http", "2", "--no-http2"], {}, "invalid --http 2: contradicts http2=False "
     "(--no-http2): give one of them (--http 1 is --no-http2)"),
    (["--http", "1", "--http2"], {}, "invalid --http 1: contradicts http2=True (--http2)"),
    (["--no-http2"], {"CYSERVE_HTTP": "2"}, "CYSERVE_HTTP='2': contradicts http2=False"),
    (["--http", "h11"], {}, "argument --http: 'h11' is uvicorn's choice of HTTP/1.1 parser "
     "(cyserve's is its own): --http takes 1, 2 or auto"),
    (["--http", "3"], {}, "argument --http: invalid choice: '3'"),
])
def test_contradicting_http_options_are_one_line(argv: list[str], env: dict[str, str],
                                                 line: str, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main(["m:app", *argv]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("cyserve: " + line), err
    # A value argparse refuses on the command line points to --help on a second line.
    hint = line.startswith("argument ")
    assert err.splitlines()[1:] == (["Try 'cyserve --help' for help."] if hint else []), err


def test_print_config_reads_back_to_the_same_config(tmp_path: Path) -> None:
    argv = ["m:app", "--threads", "3", "--no-http2", "-b", "unix:/tmp/x.sock", "-b",
            "127.0.0.1:9", "--access-log-format", '%(h)s "%(r)s" %(s)s', "--reload-exclude",
            "*_test.py", "--name", "web", "--reload-delay", "0.25"]
    env = {"CYSERVE_MAX_REQUESTS": "100", "CYSERVE_ACCESS_LOG": "yes"}
    args, config = cli.parse_command(argv, env)
    printed = tmp_path / "printed.toml"
    printed.write_text(cli.config_toml(args))
    args2, config2 = cli.parse_command(["--config", str(printed)], {})
    assert config2 == config
    assert args2.app == "m:app"
    assert (config.threads, config.http2, config.max_requests, config.access_log,
            config.proc_name, config.reload_excludes, config.reload_delay) == (
        3, False, 100, True, "web", ("*_test.py",), 0.25)
    # Only what differs from the defaults is printed.
    assert "port" not in printed.read_text()


def _a_value_for_every_option() -> tuple[list[str], dict[str, type]]:
    """A command line that gives every option --print-config prints a value other than its
    default, and the TOML type each should be printed as."""
    argv, kinds = ["m:app"], {}
    for action in cli.build_parser()._actions:
        if not action.option_strings or action.dest in cli._NOT_PRINTED:
            continue
        long = next(o for o in action.option_strings if o.startswith("--"))
        if action.nargs == 0:
            on = action.default is not True
            argv.append(long if on else f"--no-{long[2:]}")
            kinds[long[2:]] = bool
        elif isinstance(action, argparse._AppendAction):
            argv += [long, "a b", long, "c"]
            kinds[long[2:]] = list
        elif action.choices:
            argv += [long, next(c for c in action.choices if c != action.default)]
            kinds[long[2:]] = str
        elif action.dest in cli._NUMBER_OPTIONS:
            fraction = "." in str(action.default)
            argv += [long, "2.5" if fraction else "7"]
            kinds[long[2:]] = float if fraction else int
        else:
            argv += [long, 'a "quoted" value']
            kinds[long[2:]] = str
    return argv, kinds


def test_print_config_writes_every_option_with_its_toml_type_and_reads_it_back(
        tmp_path: Path) -> None:
    argv, kinds = _a_value_for_every_option()
    args = cli.parse_sources(argv, {})[0]
    printed = cli.config_toml(args)
    path = tmp_path / "printed.toml"
    path.write_text(printed)
    doc = cli._read_toml(str(path))
    assert {k: type(v) for k, v in doc.items() if k != "app"} == kinds, printed
    again = cli.parse_sources(["--config", str(path)], {})[0]
    assert {k: v for k, v in vars(again).items() if k not in ("config", "hooks")} == \
        {k: v for k, v in vars(args).items() if k not in ("config", "hooks")}


@pytest.mark.parametrize("text, toml", [
    ("5", "5"), ("-3", "-3"), ("0.25", "0.25"), ("1e3", '"1e3"'), ("010", '"010"'),
    ("-0", '"-0"'), ("nan", '"nan"'), ("auto", '"auto"'),
])
def test_print_config_writes_a_number_only_where_it_reads_back_as_written(
        text: str, toml: str) -> None:
    args = cli.parse_sources(["m:app", "--max-requests", text], {})[0]
    assert f"max-requests = {toml}" in cli.config_toml(args).splitlines()


@pytest.mark.parametrize("argv, line", [
    (["--reload-delay", "0"], "invalid --reload-delay 0.0: must be positive"),
    (["--reload-delay", "soon"], "invalid --reload-delay soon: must be a number of seconds"),
    (["--name", " "], "invalid --name ' ': must be a non-empty name"),
])
def test_bad_reload_and_name_options_are_named(argv: list[str], line: str) -> None:
    with pytest.raises(cli.ConfigError) as err:
        cli.parse_command(["m:app", *argv], {})
    assert err.value.for_cli() == line


def test_a_bad_value_from_the_environment_names_the_variable_for_renamed_fields() -> None:
    with pytest.raises(cli._UsageError) as err:
        cli.parse_command(["m:app"], {"CYSERVE_NAME": " "})
    assert str(err.value) == "CYSERVE_NAME=' ': must be a non-empty name"
