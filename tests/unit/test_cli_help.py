"""`cyserve --help` says every option's default (cli._HelpWithDefaults)."""

from __future__ import annotations

import argparse

from cyserve import cli


def test_help_names_a_default_for_every_option() -> None:
    parser = cli.build_parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.default is argparse.SUPPRESS:
            continue  # the app argument, --help, --version
        shown = formatter._expand_help(action)
        assert "default" in shown, (action.option_strings, shown)
    text = " ".join(parser.format_help().split())
    assert "--max-body-bytes BYTES largest request body (413 beyond) (default 1048576)" in text
    assert "on shutdown (default 5.0;" in text
    assert "unless --access-log-format says otherwise) (default: off, where uvicorn's is on;" \
        in text
    # The first line a user reads says what is served, and over what (it said HTTP/1.1 alone).
    assert "Serve a cyserve.App, a WSGI or an ASGI application over HTTP/1.1 and HTTP/2" in text


def test_operations_flags_reach_the_config() -> None:
    parser = cli.build_parser()
    c = cli.config_from_args(parser.parse_args(
        ["m:app", "--host", "0.0.0.0", "--metrics-port", "9100", "--worker-timeout", "30",
         "--proxy-protocol", "--forwarded-allow-ips", "10.0.0.0/8"]))
    assert c.metrics_bind == "0.0.0.0:9100"  # --metrics-port: on --host
    assert c.worker_timeout == 30.0 and c.proxy_protocol
    c = cli.config_from_args(parser.parse_args(["m:app", "--metrics-bind", "[::1]:9100"]))
    assert c.metrics_bind == "[::1]:9100" and not c.proxy_protocol and not c.worker_timeout
    text = " ".join(parser.format_help().split())
    assert "metrics: Prometheus text format at GET /metrics" in text


def test_uvicorn_and_gunicorn_spellings_are_aliases() -> None:
    parser = cli.build_parser()
    c = cli.config_from_args(parser.parse_args(
        ["m:app", "--workers", "3", "--timeout-keep-alive", "7", "--limit-max-requests", "100",
         "--timeout", "30", "--timeout-graceful-shutdown", "2", "-b", "127.0.0.1:9000",
         "-p", "/tmp/x.pid", "--max-lifetime", "60", "--limit-concurrency", "50"]))
    assert (c.processes, c.keepalive_timeout, c.max_requests, c.worker_timeout,
            c.graceful_timeout, c.bind, c.pid, c.max_lifetime, c.limit_concurrency) == \
        (3, 7.0, 100, 30.0, 2.0, ("127.0.0.1:9000",), "/tmp/x.pid", 60.0, 50)
    assert cli.config_from_args(parser.parse_args(["m:app", "-w", "2", "--keep-alive", "3"])
                                ).processes == 2
    text = " ".join(parser.format_help().split())
    for section in ("application:", "where to listen:", "development:", "worker processes:",
                    "logging:", "HTTP:", "HTTPS:", "resource limits:", "timeouts:",
                    "behind a proxy:", "metrics:"):
        assert section in text
    assert "The application is imported once, by the supervisor, and the workers are forked " \
        "from it" in text


def test_uvicorns_no_access_log_is_taken() -> None:
    # uvicorn logs by default and production command lines turn it off with --no-access-log;
    # cyserve's log is off by default, and the same words must start it (not "unrecognized").
    parser = cli.build_parser()
    assert not cli.config_from_args(parser.parse_args(["m:app", "--no-access-log"])).access_log
    assert cli.config_from_args(parser.parse_args(["m:app", "--access-log"])).access_log
    assert not cli.config_from_args(parser.parse_args(["m:app"])).access_log


def test_defaults_that_differ_from_gunicorns_or_uvicorns_say_theirs() -> None:
    # A user switching reads the option's own help, not a table elsewhere: where cyserve's
    # default is not what the command they come from does, the help says both.
    text = " ".join(cli.build_parser().format_help().split())
    for said in ("(default 1024; gunicorn's and uvicorn's 2048)",
                 "(default 5.0, as uvicorn's; gunicorn's --keep-alive is 2)",
                 "(default 5.0; gunicorn's is 30, and uvicorn waits without end)",
                 "(default: off, where uvicorn's is on; --access-logfile turns it on)",
                 "(default: on, where gunicorn's is off)",
                 "(default 0: never, where gunicorn's --timeout is 30)",
                 "one thread each (gunicorn's sync workers) for as many processes as CPUs"):
        assert said in text, said


def test_uvicorns_interface_names() -> None:
    parser = cli.build_parser()
    for name in ("asgi3", "ASGI3", "asgi"):
        assert cli.config_from_args(parser.parse_args(["m:app", "--interface", name])
                                    ).interface == "asgi"
    text = " ".join(parser.format_help().split())
    assert "(asgi3, uvicorn's name, is asgi; asgi2 is refused)" in text
