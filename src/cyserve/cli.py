"""The ``cyserve`` command (and ``python -m cyserve``).

    cyserve module:app [--host H] [--port P] [--threads N] [--processes N] ...

Every failure is one line on stderr, ``cyserve: <what is wrong>``, and a non-zero exit status:
2 for a usage or configuration mistake (a bad option, an app path that does not import or has no
such attribute), 1 for a failure at run time (the port is in use, the engine is missing). A
command line that cannot be parsed (an unknown option, a missing value, a choice not offered, no
MODULE:APP) adds a second line, ``Try 'cyserve --help' for help.``, as uvicorn's does, and never
the whole usage. The one exception is an error raised by the application's own code while it is
imported: its traceback is printed first, because the one line alone would not say where the bug
is.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import math
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from . import __version__
from .app import App, as_app
from .config import (ACCESS_LOG_FORMATS, ASGI_LOOPS, FORWARDED_HEADERS, HTTP_VERSIONS,
                     INTERFACES, LIFESPANS, LOG_LEVELS, LOOPS, Config)
from .errors import (AppLoadError, ConfigError, CyserveError, HandlerTypeError, ListenError,
                     RouteError)

__all__ = ["main", "load_app", "build_parser", "EXIT_RUNTIME", "EXIT_USAGE"]

EXIT_RUNTIME = 1
EXIT_USAGE = 2

# Numeric options arrive as text and are converted here rather than by argparse, so that a bad
# value gets the same "invalid --NAME VALUE: REASON" line as a value Config rejects.
_INT_OPTIONS = ("port", "threads", "processes", "blocking_threads", "backlog", "max_body_bytes",
                "body_budget", "min_body_rate", "http2_max_concurrent_streams")
# The limits gunicorn and uvicorn also name (_GUNICORN_LIMITS): None when not given.
_LIMIT_OPTIONS = ("max_header_bytes", "max_target_bytes", "max_headers")
_FLOAT_OPTIONS = ("keepalive_timeout", "header_timeout", "body_timeout", "graceful_timeout",
                  "worker_timeout", "max_lifetime", "max_lifetime_jitter", "drain_delay")


class _UsageError(Exception):
    pass


class _BadCommandLine(_UsageError):
    """The command line's words themselves are wrong: --help lists the right ones."""


# The second line of a _BadCommandLine, in uvicorn's (click's) words.
HELP_HINT = "Try 'cyserve --help' for help."


class _Flag(argparse.BooleanOptionalAction):
    """--x / --no-x, with its help as written: Python 3.10's BooleanOptionalAction appends
    "(default: True)" to it, where the help already says "(default: on)" (and --help and
    docs/options.md would differ from one Python to the next)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = kwargs.get("help")


# Options of uvicorn and gunicorn whose meaning cyserve cannot honour: refused as unknown, with
# what cyserve does instead, rather than ignored (docs/options.md lists them with the others).
_REFUSED = {
    "--ws-max-queue": "cyserve bounds an ASGI WebSocket's unreceived messages in bytes, not in "
                      "messages: it stops reading the socket while they fill its window "
                      "(--ws-max-size bounds one message)",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line and exit status 2 instead of usage text, and a
    misspelt option names the one meant, as uvicorn's (click's) errors do."""

    def error(self, message: str) -> NoReturn:
        words = message.split(": ", 1)[1].split() if message.startswith(
            "unrecognized arguments: ") else []
        unknown = next((w.split("=", 1)[0] for w in words if w.startswith("--")), None)
        if unknown in _REFUSED:
            raise _BadCommandLine(f"{unknown} is refused: {_REFUSED[unknown]}")
        if unknown is not None:
            # 0.82: --prot finds --port, --acess-log --access-log; --worker-count does not
            # find --worker-timeout (0.8), which would mislead.
            close = difflib.get_close_matches(
                unknown, [s for s in self._option_string_actions if s.startswith("--")],
                n=1, cutoff=0.82)
            if close:
                message += f" (did you mean {close[0]}?)"
        raise _BadCommandLine(message)


def build_parser(*, _help: bool = True) -> argparse.ArgumentParser:
    defaults = Config()
    # One usage line, as uvicorn's and gunicorn's: argparse's own lists every option (46 lines
    # above the help that lists them again).
    p = _Parser(prog="cyserve", usage="%(prog)s [OPTIONS] MODULE:APP",
                description="Serve a cyserve.App, a WSGI or an ASGI application over HTTP/1.1 "
                            "and HTTP/2 (TLS, WebSocket).",
                epilog="Ctrl-C or SIGTERM stops the server gracefully; a second Ctrl-C forces it.",
                add_help=_help)
    p.add_argument("app", metavar="MODULE:APP", nargs="?", default=None,
                   help="the cyserve.App, WSGI or ASGI application to serve, e.g. "
                        "examples.demo.app:app (or $CYSERVE_APP, or app in the --config file)")
    p.add_argument("--host", default=defaults.host,
                   help=f"address to bind (default {defaults.host})")
    p.add_argument("--port", metavar="PORT", default=str(defaults.port),
                   help=f"port to bind, 0 for any free port (default {defaults.port})")
    p.add_argument("--threads", metavar="N", default=str(defaults.threads),
                   help="worker threads of each process; 0: the CPUs available divided among "
                        "the --processes, at least one: a thread per CPU for one process, one "
                        "thread each (gunicorn's sync workers) for as many processes as CPUs "
                        "or more (default 0)")
    p.add_argument("--processes", "-w", "--workers", metavar="N", default=str(defaults.processes),
                   help="worker processes, each with --threads threads (default 1); Python "
                        "handlers need more than one to use more than one core, and gain "
                        "nothing from more threads in each (one GIL each), GIL-free routes "
                        "gain from either. The application is imported once, by the "
                        "supervisor, and the workers are forked from it (gunicorn's "
                        "--preload); --no-preload imports it in each worker")
    p.add_argument("--blocking-threads", metavar="N", default=str(defaults.blocking_threads),
                   help="Python calls that may block at once (sleep, a slow database) while "
                        "every worker keeps serving its other connections: threads kept to "
                        "take over a worker stuck in a long call (default "
                        f"{defaults.blocking_threads}; 0 = none)")
    p.add_argument("--backlog", metavar="N", default=str(defaults.backlog),
                   help="listen() backlog: connections the kernel holds before they are "
                        f"accepted (default {defaults.backlog}; gunicorn's and uvicorn's 2048)")
    # default None: not said, so that a gunicorn or uvicorn name of the same limit given a
    # different value is refused rather than preferred (_gunicorn_limits).
    p.add_argument("--max-header-bytes", metavar="BYTES", default=None,
                   help="largest header block, the request line and every field (431 beyond) "
                        f"(default {defaults.max_header_bytes})")
    p.add_argument("--max-target-bytes", metavar="BYTES", default=None,
                   help="longest request target (414 beyond) "
                        f"(default {defaults.max_target_bytes})")
    p.add_argument("--max-headers", metavar="N", default=None,
                   help=f"most header fields (431 beyond) (default {defaults.max_headers})")
    _add_gunicorn_limits(p)
    p.add_argument("--max-body-bytes", metavar="BYTES", default=str(defaults.max_body_bytes),
                   help="largest request body (413 beyond)")
    p.add_argument("--keepalive-timeout", "--timeout-keep-alive", "--keep-alive",
                   metavar="SECONDS",
                   default=str(defaults.keepalive_timeout),
                   help="seconds an idle keep-alive connection is kept (default "
                        f"{defaults.keepalive_timeout}, as uvicorn's; gunicorn's --keep-alive "
                        "is 2)")
    p.add_argument("--header-timeout", metavar="SECONDS", default=str(defaults.header_timeout),
                   help="seconds for the whole header block (408 beyond)")
    p.add_argument("--body-timeout", metavar="SECONDS", default=str(defaults.body_timeout),
                   help="seconds a body may make no progress (408 beyond)")
    p.add_argument("--body-budget", metavar="BYTES", default=str(defaults.body_budget),
                   help="request body bytes all connections may hold at once while bodies "
                        "are read whole (a body streamed to its app holds only a 64 KiB window); "
                        "past it bodies wait unread, 503 after --body-timeout (default "
                        f"{defaults.body_budget}; 0 = no bound)")
    p.add_argument("--min-body-rate", metavar="BYTES_PER_S", default=str(defaults.min_body_rate),
                   help="bytes/s a body must average once --body-timeout has passed since it "
                        f"began; slower gets 408 (default {defaults.min_body_rate}; 0 = none)")
    p.add_argument("--graceful-timeout", "--timeout-graceful-shutdown", metavar="SECONDS",
                   default=str(defaults.graceful_timeout),
                   help="seconds in-flight requests get to finish on shutdown (default "
                        f"{defaults.graceful_timeout}; gunicorn's is 30, and uvicorn waits "
                        "without end)")
    p.add_argument("--drain-delay", metavar="SECONDS", default=str(defaults.drain_delay),
                   help="on a stop, first serve as usual for this long with --health-path "
                        "answering 503, so that a load balancer takes this server out before "
                        "its listeners close (Kubernetes: instead of a preStop sleep); a second "
                        "Ctrl-C ends the wait (default 0: none)")
    # trace is uvicorn's: taken so that its command lines start.
    p.add_argument("--log-level", default=defaults.log_level, choices=LOG_LEVELS + ("trace",),
                   type=str.lower,
                   help="level of the cyserve logger (default info); trace, uvicorn's level "
                        "below debug, is debug here: cyserve logs nothing finer")
    # --no-access-log is uvicorn's (whose log is on by default): taken so that its command
    # lines start, and meaning what it means there.
    p.add_argument("--access-log", action=_Flag, default=defaults.access_log,
                   help="print one line per response on standard output (Common Log Format "
                        "unless --access-log-format says otherwise) (default: off, where "
                        "uvicorn's is on; --access-logfile turns it on)")
    p.add_argument("--access-log-format", "--access-logformat",
                   default=defaults.access_log_format,
                   metavar="FORMAT", type=_access_log_format,
                   help="common (CLF), combined (CLF with the referer and the user agent), "
                        "json (one object per line, with the port, scheme and seconds taken), "
                        "or gunicorn's atoms, e.g. '%%(h)s %%(t)s \"%%(r)s\" %%(s)s %%(D)s' "
                        f"(default {defaults.access_log_format})")
    p.add_argument("--use-colors", action=_Flag, default=None,
                   help="uvicorn's log colouring, taken so that its command lines start: it has "
                        "no effect, since cyserve's log lines have no colours (a --log-config "
                        "formatter may add them) (default: no colours)")
    p.add_argument("--error-logfile", "--log-file", metavar="-", default=None, choices=("-",),
                   type=_error_logfile,
                   help="gunicorn's error log: - (standard error) is taken, as that is where "
                        "cyserve writes it; a file is refused, since cyserve has no setting for "
                        "one: redirect standard error, or give --log-config a FileHandler "
                        "(default: standard error)")
    p.add_argument("--access-logfile", metavar="PATH", default=None,
                   help="write the access log to this file instead of standard output (turns "
                        "it on); SIGUSR1 reopens it, for logrotate; - is standard output, as "
                        "gunicorn's")
    p.add_argument("-k", "--worker-class", metavar="CLASS", default=None,
                   choices=tuple(_WORKER_CLASSES), type=_worker_class,
                   help="gunicorn's worker class, taken as the --interface it implies: "
                        "uvicorn's workers (uvicorn.workers.UvicornWorker, "
                        "uvicorn_worker.UvicornWorker, their H11 ones) an ASGI application, "
                        "sync and gthread a WSGI one; gevent, eventlet and tornado are refused "
                        "(default: none, --interface's)")
    p.add_argument("--interface", default=defaults.interface, choices=INTERFACES,
                   type=_interface_choice,
                   help="what MODULE:APP is: a cyserve.App, a WSGI or an ASGI application "
                        "(asgi3, uvicorn's name, is asgi; asgi2 is refused), or auto (default: "
                        "whichever it is)")
    p.add_argument("--loop", default=defaults.loop, choices=LOOPS, type=str.lower,
                   help="the event loop of an ASGI application (default auto: uvloop when "
                        "installed, else asyncio)")
    p.add_argument("--asgi-loops", default=defaults.asgi_loops, choices=ASGI_LOOPS,
                   type=str.lower,
                   help="process: one event loop runs every ASGI request; thread: one loop per "
                        "worker thread, each running the app's lifespan (startup and shutdown "
                        "once per loop, a state of its own); auto (default): thread when the "
                        "interpreter runs without the GIL, else process")
    p.add_argument("--lifespan", default=defaults.lifespan, choices=LIFESPANS, type=str.lower,
                   help="the ASGI lifespan scope: auto (default; an app that raises on it "
                        "before completing its startup is served without it), on (that is a "
                        "startup failure), off (never sent)")
    p.add_argument("--factory", action="store_true",
                   help="MODULE:APP is a function that returns the application: call it (with "
                        "no arguments) first")
    p.add_argument("--app-dir", metavar="DIR", default=".",
                   help="folder put first on sys.path before importing (default: the current one)")
    p.add_argument("--ssl-certfile", "--certfile", metavar="FILE", default=None,
                   help="serve HTTPS with this certificate (PEM, then its chain)")
    p.add_argument("--ssl-keyfile", "--keyfile", metavar="FILE", default=None,
                   help="the certificate's private key (PEM; default: in --ssl-certfile)")
    p.add_argument("--ssl-keyfile-password", metavar="PASSWORD", default=None,
                   help="the password of an encrypted --ssl-keyfile")
    p.add_argument("--ssl-ciphers", "--ciphers", metavar="CIPHERS", default=None,
                   help="OpenSSL cipher list for TLS 1.2 (default: OpenSSL's)")
    p.add_argument("--ssl-ca-certs", "--ca-certs", metavar="FILE", default=None,
                   help="the CAs client certificates are verified against (PEM)")
    p.add_argument("--ssl-cert-reqs", "--cert-reqs", metavar="N", default=None,
                   help="client certificates: 0 not asked for (default), 1 optional, 2 required")
    p.add_argument("--ssl-sni", metavar="NAME=CERTFILE[,KEYFILE]", action="append",
                   default=None,
                   help="serve NAME (or *.domain) with its own certificate, chosen by the name "
                        "the client asks for (SNI); repeatable. Other names, and clients that "
                        "name none, get --ssl-certfile's")
    p.add_argument("--ssl-ocsp-file", metavar="FILE", default=None,
                   help="an OCSP response (DER) stapled for --ssl-certfile's certificate when "
                        "a client asks; read again with the certificates on SIGHUP")
    p.add_argument("--ssl-ticket-rotation", metavar="SECONDS", default=None,
                   help="session ticket keys change every SECONDS (default 3600); a ticket "
                        "resumes for two periods")
    p.add_argument("--http", metavar="{1,2,auto}", default=defaults.http, type=_http_version,
                   choices=HTTP_VERSIONS,
                   help="the HTTP versions spoken: auto (default) HTTP/2 beside HTTP/1.1 (h2 by "
                        "ALPN over TLS, h2c by prior knowledge or Upgrade in cleartext), 1 "
                        "HTTP/1.1 only, 2 HTTP/2 only (ALPN offers h2 alone; an HTTP/1.1 "
                        "request gets 505)")
    p.add_argument("--http2", action=_Flag, default=None,
                   help="the older spelling of --http: --no-http2 is --http 1, --http2 asks "
                        "for HTTP/2 (default: on)")
    p.add_argument("--http2-max-concurrent-streams", metavar="N",
                   default=str(defaults.http2_max_concurrent_streams),
                   help="streams one HTTP/2 connection may have open at once "
                        f"(default {defaults.http2_max_concurrent_streams})")
    _add_listen_options(p)
    _add_proxy_options(p)
    _add_lifecycle_options(p)
    _add_metrics_options(p)
    _add_ws_options(p)
    _add_head_options(p)
    _add_operations_options(p)
    p.formatter_class = _HelpWithDefaults
    if _help:
        p.add_argument("--version", action="version", version=f"cyserve {__version__}")
    _group_options(p)
    return p


# gunicorn's names of the request limits, and uvicorn's one: (its option, the cyserve option it
# sets).
_GUNICORN_LIMITS = (("limit_request_line", "max_target_bytes"),
                    ("limit_request_fields", "max_headers"),
                    ("limit_request_field_size", "max_header_bytes"),
                    ("h11_max_incomplete_event_size", "max_header_bytes"))


def _add_gunicorn_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit-request-line", metavar="BYTES", default=None,
                   help="gunicorn's name for --max-target-bytes, which it sets: cyserve counts "
                        "the request target, not the method and version around it (so a line "
                        "a dozen bytes longer passes); 0: the largest, 1048576 (default: "
                        "--max-target-bytes's)")
    p.add_argument("--h11-max-incomplete-event-size", metavar="BYTES", default=None,
                   help="uvicorn's bound on the bytes of a request head not yet whole (h11's), "
                        "taken as --max-header-bytes, which it sets: both bound the request "
                        "line and header fields together; past it cyserve answers 431 where "
                        "h11 answers 400 (default: --max-header-bytes's)")
    p.add_argument("--limit-request-fields", metavar="N", default=None,
                   help="gunicorn's name for --max-headers, which it sets; 0: the most, 10000 "
                        "(default: --max-headers's)")
    p.add_argument("--limit-request-field-size", "--limit-request-field_size", metavar="BYTES",
                   default=None,
                   help="gunicorn's limit on one header field, taken as --max-header-bytes, "
                        "which it sets: cyserve bounds the whole header block (request line "
                        "and every field), and so each field; 0: the largest, 1048576 "
                        "(default: --max-header-bytes's)")


def _gunicorn_limits(args: argparse.Namespace, options: dict[str, Any],
                     sources: Mapping[str, str]) -> None:
    """gunicorn's limit options, given, replace the cyserve options they name; 0 (gunicorn's
    "no limit") is the largest value cyserve takes."""
    from .config import _LIMIT_MAXIMUM

    # target: the first name that set it, its value as given, and the limit it makes
    given: dict[str, tuple[str, str, int]] = {}
    for name, target in _GUNICORN_LIMITS:
        raw = getattr(args, name)
        if raw is None:
            continue
        try:
            value = int(raw, 10)
        except ValueError:
            raise ConfigError(name, raw, "must be an integer") from None
        most = _LIMIT_MAXIMUM[target]
        low = 64 if target == "max_header_bytes" else 1
        if name == "h11_max_incomplete_event_size" and not low <= value <= most:
            # 0 is no "no limit" to h11: every request would be too large.
            raise ConfigError(name, raw, f"must be between {low} and {most}")
        if value != 0 and not low <= value <= most:
            raise ConfigError(name, raw, f"must be 0 (the most, {most}) or between {low} and "
                              f"{most}")
        if target in given and given[target][2] != (value or most):
            # gunicorn's and uvicorn's names of the one limit, given different limits: which
            # was meant cannot be told, and neither may win without a word. The limits are
            # compared, not their spellings: "0100" is 100, and gunicorn's 0 is the most.
            first, first_raw, _ = given[target]
            said = sources.get(first, f"--{first.replace('_', '-')} {first_raw}")
            raise ConfigError(name, raw, f"sets --{target.replace('_', '-')}, as {said} does: "
                              "give one of them")
        given[target] = (name, raw, value or most)
        own = getattr(args, target)
        if own is not None and options.get(target) != (value or most):
            # The cyserve name and gunicorn's (or uvicorn's) of the one limit, set differently:
            # which was meant cannot be told, and neither may win without a word.
            # Said where it came from when the command line did not give it.
            where = f" ({sources[target]})" if target in sources else ""
            raise ConfigError(name, raw, f"sets --{target.replace('_', '-')}, which is given "
                              f"as {own}{where}: give one of them")
        options[target] = value or most


def _add_operations_options(p: argparse.ArgumentParser) -> None:
    defaults = Config()
    p.add_argument("-c", "--config", metavar="FILE", default=None,
                   help="read options from this TOML file: one table whose keys are the long "
                        "options' names (port = 8000, max-requests = 1000), or from a Python "
                        "file (FILE.py, as gunicorn's): its globals named as options "
                        "(max_requests = 1000) and its hooks (on_starting, when_ready, "
                        "post_fork, worker_exit, on_exit); the command line and "
                        "CYSERVE_<OPTION> environment variables win over it (default: "
                        "$CYSERVE_CONFIG, else none)")
    p.add_argument("--preload", action=_Flag, default=defaults.preload,
                   help="with worker processes, import the application once in the supervisor "
                        "and fork the workers from it (memory shared until written, a broken "
                        "app reported once); --no-preload imports it in each worker after the "
                        "fork, for an app that opens connections or threads at import "
                        "(default: on, where gunicorn's is off)")
    p.add_argument("--limit-concurrency", metavar="N", default=str(defaults.limit_concurrency),
                   help="answer 503 (Retry-After, the connection closed) to a request that "
                        "finds N requests of its process in flight (default 0: no limit)")
    p.add_argument("--log-config", metavar="FILE", default=None,
                   help="configure Python's logging from FILE: a dictConfig in JSON (.json) or "
                        "YAML (.yaml, .yml: needs PyYAML), else an INI file for fileConfig; "
                        "its levels win over --log-level (default: none)")
    p.add_argument("--reload", action="store_true",
                   help="development: restart the workers when a .py file (or one "
                        "--reload-include names) under --reload-dir changes (new workers serve "
                        "before the old ones stop); uses watchfiles "
                        "when installed, else polls every --reload-delay (default: off)")
    p.add_argument("--reload-dir", metavar="DIR", action="append", default=[],
                   help="a folder --reload watches, repeatable (default: --app-dir)")
    p.add_argument("--reload-include", metavar="GLOB", action="append", default=[],
                   help="files --reload watches besides the .py files, by a glob pattern on "
                        "their name or their path below --reload-dir, e.g. '*.html' or "
                        "'templates/*'; repeatable (default: none)")
    p.add_argument("--reload-exclude", metavar="GLOB", action="append", default=[],
                   help="files --reload ignores although included, by the same patterns, e.g. "
                        "'*_test.py'; repeatable (default: none)")
    p.add_argument("--reload-delay", metavar="SECONDS", default=str(defaults.reload_delay),
                   help="seconds between two looks at the files when polling, or over which "
                        "watchfiles gathers changes into one reload "
                        f"(default {defaults.reload_delay})")
    p.add_argument("--pythonpath", metavar="DIRS", default=None,
                   help="folders, separated by commas, put first on sys.path before the "
                        "application is imported (gunicorn's) (default: none)")
    p.add_argument("-n", "--name", metavar="NAME", default=None,
                   help="the name the server's processes show in ps, top and pgrep (the "
                        "kernel's task name: its first 15 bytes) (default: the interpreter's)")
    p.add_argument("--check-config", action="store_true",
                   help="check the options and import the application (its routes built), "
                        "then exit: 0 and one line when all is well, 2 and one line saying what "
                        "is wrong otherwise; nothing is bound (default: off)")
    p.add_argument("--print-config", action="store_true",
                   help="print the options in effect (the command line, the environment and "
                        "--config merged) as a TOML file that --config reads, then exit "
                        "(default: off)")
    _add_process_options(p)


def _add_process_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chdir", metavar="DIR", default=None,
                   help="change to DIR first, before the application is imported and every "
                        "other relative path is read (but --config's) (default: stay)")
    p.add_argument("--env-file", metavar="PATH", default=None,
                   help="set the environment variables of a file of NAME=VALUE lines before "
                        "the application is imported (comments, export, quotes, ${VAR}); a "
                        "variable already set keeps its value; CYSERVE_<OPTION> ones in it are "
                        "options (default: none)")
    p.add_argument("-e", "--env", metavar="NAME=VALUE", action="append", default=[],
                   help="set an environment variable before the application is imported, "
                        "over any value it had (gunicorn's); repeatable (default: none)")
    p.add_argument("-m", "--umask", metavar="MASK", default=None,
                   help="the process's umask, as gunicorn reads it: 022 or 0o22 octal, 18 "
                        "decimal, 0x12 hex (default: the inherited one)")
    p.add_argument("-u", "--user", metavar="USER", default=None,
                   help="worker processes run as USER (a name or an id): the supervisor, "
                        "started as root, binds every listener, then each worker switches before "
                        "it serves or imports the application; its group is USER's own unless "
                        "--group says (default: stay)")
    p.add_argument("-g", "--group", metavar="GROUP", default=None,
                   help="worker processes run with GROUP (a name or an id) (default: --user's "
                        "group, else stay)")


def parse_umask(raw: str) -> int:
    """gunicorn's reading of --umask: a number as Python writes it (0o22, 0x12, 18), and a
    leading 0 followed by digits is octal (022). ConfigError otherwise."""
    text = raw.strip()
    if re.fullmatch(r"0\d+", text):
        text = "0o" + text[1:]
    try:
        return int(text, 0)
    except ValueError:
        raise ConfigError("umask", raw, "must be a mode such as 022 (octal), 0o22 or 18") \
            from None


# --help's sections, in order, as uvicorn's documentation groups its settings. Options are
# added where their code is and placed here, so that a new option lands in "options" until it
# is given a section (tests/unit/test_cli_help.py checks that none is left there).
_SECTIONS: list[tuple[str, str | None, tuple[str, ...]]] = [
    ("application", None, ("app_dir", "factory", "interface", "loop", "asgi_loops", "lifespan",
                           "config", "chdir", "env", "env_file", "pythonpath", "check_config",
                           "print_config")),
    ("where to listen", None, ("host", "port", "backlog")),
    ("development", None, ("reload", "reload_dir", "reload_include", "reload_exclude",
                           "reload_delay")),
    ("worker processes", None, ("processes", "threads", "blocking_threads", "worker_class",
                                "preload", "pid",
                                "name", "user", "group", "umask")),
    ("logging", None, ("log_level", "log_config", "access_log", "access_log_format",
                       "access_logfile", "error_logfile", "use_colors")),
    ("HTTP", None, ("http", "http2", "http2_max_concurrent_streams", "health_path", "header",
                    "server_header", "date_header")),
    ("HTTPS", None, ("ssl_certfile", "ssl_keyfile", "ssl_keyfile_password", "ssl_ciphers",
                     "ssl_ca_certs", "ssl_cert_reqs", "ssl_sni", "ssl_ocsp_file",
                     "ssl_ticket_rotation")),
    ("resource limits", None, ("limit_concurrency", "max_header_bytes", "max_target_bytes",
                               "max_headers", "max_body_bytes", "body_budget",
                               "min_body_rate", "limit_request_line", "limit_request_fields",
                               "limit_request_field_size", "h11_max_incomplete_event_size")),
    ("timeouts", None, ("keepalive_timeout", "header_timeout", "body_timeout",
                        "graceful_timeout", "drain_delay")),
    ("behind a proxy", None, ()),
    ("metrics", None, ()),
]


def _group_options(p: argparse.ArgumentParser) -> None:
    groups = {g.title: g for g in p._action_groups}
    ordered = [groups["positional arguments"], groups[p._optionals.title]]
    for title, description, dests in _SECTIONS:
        group = groups.get(title) or p.add_argument_group(title, description)
        at = 0  # the section's own options first, in the order given
        for dest in dests:
            for action in p._actions:
                if action.dest == dest:
                    for g in p._action_groups:
                        if action in g._group_actions:
                            g._group_actions.remove(action)
                    group._group_actions.insert(at, action)
                    at += 1
        ordered.append(group)
    p._action_groups[:] = ordered + [g for g in p._action_groups if g not in ordered]


class _HelpWithDefaults(argparse.HelpFormatter):
    """--help says every option's default, so that nobody has to read config.py for it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if ("default" in text or not action.option_strings
                or action.default is argparse.SUPPRESS):
            return text
        if action.nargs == 0:  # a flag
            return f"{text} (default: off)"
        if action.default in (None, "", []):
            return f"{text} (default: none)"
        return f"{text} (default %(default)s)"


# gunicorn's worker classes that cyserve takes, by every name gunicorn and uvicorn give them,
# with the --interface each implies (cyserve's own engine serves either kind).
_WORKER_CLASSES = {
    **{name: "asgi" for name in (
        "uvicorn.workers.UvicornWorker", "uvicorn.workers.UvicornH11Worker",
        "uvicorn_worker.UvicornWorker", "uvicorn_worker.UvicornH11Worker")},
    **{name: "wsgi" for name in (
        "sync", "gthread", "gunicorn.workers.sync.SyncWorker",
        "gunicorn.workers.gthread.ThreadWorker", "egg:gunicorn#sync", "egg:gunicorn#gthread")},
}

# The worker classes refused, by the words gunicorn's names for them contain, and why.
_GREEN = ("cyserve does not run applications in greenlets: its workers are threads (--threads), "
          "and a Python call that blocks is handed to --blocking-threads")
_REFUSED_WORKERS = {
    "gevent": _GREEN,
    "eventlet": _GREEN,
    "tornado": "cyserve serves WSGI and ASGI applications, and a Tornado one is neither",
}


def _worker_class(value: str) -> str:
    for word, why in _REFUSED_WORKERS.items():
        if word in value.lower():
            raise argparse.ArgumentTypeError(f"{value!r} is refused: {why}")
    return value


def _error_logfile(value: str) -> str:
    if value != "-":
        raise argparse.ArgumentTypeError(
            f"{value!r} is refused: cyserve writes its error log to standard error and has no "
            "setting for a file: redirect standard error (2>>FILE, journald), or give "
            "--log-config a FileHandler")
    return value


def _interface_choice(value: str) -> str:
    # uvicorn's --interface names the ASGI version: 3 is the one cyserve speaks.
    if value.lower() == "asgi3":
        return "asgi"
    if value.lower() == "asgi2":
        raise argparse.ArgumentTypeError(
            "'asgi2' is refused: cyserve serves ASGI 3 applications (one async callable of "
            "scope, receive and send); asgiref's guarantee_single_callable() makes an ASGI 2 "
            "application one")
    return value.lower()


def _http_version(value: str) -> str:
    if value.lower() in ("h11", "httptools"):
        # uvicorn's --http names an HTTP/1.1 parser: cyserve has one, its own, in C.
        raise argparse.ArgumentTypeError(f"{value!r} is uvicorn's choice of HTTP/1.1 parser "
                                         "(cyserve's is its own): --http takes 1, 2 or auto")
    return value.lower()


def _access_log_format(value: str) -> str:
    # A named format in any case, as before; a format of atoms as written (%(U)s is not %(u)s).
    return value.lower() if value.lower() in ACCESS_LOG_FORMATS else value


def _add_listen_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "where to listen",
        "Any of --bind, --uds and --fd replaces --host/--port; with none of them, sockets passed "
        "by systemd's socket activation (LISTEN_FDS) are served if there are any.")
    g.add_argument("-b", "--bind", metavar="ADDRESS", action="append", default=[],
                   help="an address to serve, repeatable: HOST:PORT, [V6]:PORT, unix:PATH or "
                        "fd://N (default: none, --host and --port)")
    g.add_argument("--uds", metavar="PATH", default=None,
                   help="serve on a Unix socket made at PATH (a stale socket file nobody "
                        "listens on is replaced; removed at exit) (default: none)")
    g.add_argument("--uds-perms", metavar="OCTAL", default=None,
                   help="mode of the Unix socket, e.g. 660 (default: what the umask leaves)")
    g.add_argument("--fd", metavar="N", default=None,
                   help="serve on listening socket N inherited from the parent process "
                        "(default: none)")


def _add_proxy_options(p: argparse.ArgumentParser) -> None:
    defaults = Config()
    g = p.add_argument_group(
        "behind a proxy",
        "From a trusted peer, X-Forwarded-For and X-Forwarded-Proto (or Forwarded, RFC 7239, "
        "with --forwarded-header forwarded) say who the client is and which scheme it used: "
        "the access log, WSGI's REMOTE_ADDR and Request.client and Request.scheme tell that "
        "instead of the proxy's own address; with --forwarded-host, X-Forwarded-Host (or "
        "Forwarded's host=) is the request's Host.")
    # default None: not said, so that --no-proxy-headers (uvicorn's) can be told apart from it
    # and refused beside an option that would turn the headers back on.
    g.add_argument("--proxy-headers", action=_Flag, default=None,
                   help="believe proxy headers from --forwarded-allow-ips; --no-proxy-headers, "
                        "uvicorn's spelling, leaves them unread (default: off, where uvicorn's "
                        "is on: with no proxy in front, a client on 127.0.0.1 or on a Unix "
                        "socket could name any address; --forwarded-allow-ips and "
                        "--forwarded-host turn them on)")
    g.add_argument("--proxy-protocol", action="store_true",
                   help="connections from --proxy-allow-from (else --forwarded-allow-ips) "
                        "begin with a PROXY protocol header (HAProxy's, v1 or v2: HAProxy, AWS "
                        "NLB, nginx's stream module) naming the client (default: off)")
    g.add_argument("--proxy-allow-from", metavar="LIST", default=None,
                   help="the peers whose connections --proxy-protocol reads, as gunicorn's: "
                        "addresses and networks (CIDR) separated by commas, or * for all; "
                        "unlike --forwarded-allow-ips, it does not turn proxy headers on "
                        "(default: --forwarded-allow-ips's list)")
    g.add_argument("--forwarded-allow-ips", metavar="LIST", default=None,
                   help="the trusted peers: addresses and networks (CIDR) separated by commas, "
                        "or * for all; implies --proxy-headers (default: $FORWARDED_ALLOW_IPS, "
                        "else 127.0.0.1; a Unix socket's peer is always trusted)")
    # default None: not said, so that it can be refused beside --no-proxy-headers (which
    # leaves every proxy header unread); Config's default applies otherwise.
    g.add_argument("--forwarded-header", default=None,
                   choices=FORWARDED_HEADERS, type=str.lower,
                   help="the headers the proxy writes: x-forwarded (X-Forwarded-For/-Proto) or "
                        "forwarded (RFC 7239); the other kind is the client's and is ignored "
                        f"(default {defaults.forwarded_header})")
    g.add_argument("--forwarded-host", action="store_true",
                   help="with proxy headers, the host the proxy names (X-Forwarded-Host, or "
                        "Forwarded's host= with --forwarded-header forwarded) replaces the "
                        "request's Host: WSGI's HTTP_HOST and SERVER_NAME, ASGI's host header, "
                        "Request.headers; only for a proxy that sets the header, since one that "
                        "does not passes the client's own through; implies --proxy-headers "
                        "(default: off)")
    g.add_argument("--root-path", metavar="PATH", default=defaults.root_path,
                   help="the path the proxy serves the application under, e.g. /api, which it "
                        "removes before forwarding: ASGI's root_path (and the start of its path "
                        "and raw_path, as uvicorn), WSGI's SCRIPT_NAME (a request path that "
                        "still begins with it has it moved out of PATH_INFO, as gunicorn); "
                        "routes still match the path as received (default: none)")


def _add_lifecycle_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "worker processes",
        "A supervisor runs the workers with --processes 2 or more, or with --max-requests (then "
        "even one worker: its replacement starts before it stops). SIGHUP to the supervisor "
        "reloads: new workers with the application imported again, then the old ones stop "
        "gracefully. SIGTTIN adds a worker process, SIGTTOU removes one.")
    g.add_argument("--max-requests", "--limit-max-requests", metavar="N", default="0",
                   help="replace a worker process after it has answered N requests; it finishes "
                        "what is in flight once its replacement serves (default 0: never)")
    g.add_argument("-p", "--pid", metavar="FILE", default=None,
                   help="write the server's pid (the supervisor's with --processes) to FILE, "
                        "removed at exit; refused while FILE holds a live process's pid "
                        "(default: none)")
    p.add_argument("--health-path", metavar="PATH", default=None,
                   help="answer GET PATH with 200 \"ok\" from C, for a load balancer's health "
                        "checks, e.g. /healthz (default: none)")
    g.add_argument("--max-requests-jitter", metavar="J", default="0",
                   help="add a random 0..J to each worker's --max-requests, so that workers are "
                        "not all replaced at once (default 0)")
    g.add_argument("--max-lifetime", metavar="SECONDS", default="0",
                   help="replace a worker process once it has served for SECONDS, as "
                        "--max-requests does (default 0: never)")
    g.add_argument("--max-lifetime-jitter", metavar="SECONDS", default="0",
                   help="add a random 0..SECONDS to each worker's --max-lifetime (default 0)")
    g.add_argument("--worker-timeout", "--timeout", "-t", metavar="SECONDS", default="0",
                   help="kill and replace a worker process whose scheduler makes no progress "
                        "for SECONDS (a call that runs that long, a stopped process); its "
                        "threads' Python stacks are printed first (default 0: never, where "
                        "gunicorn's --timeout is 30)")


def _add_metrics_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "metrics",
        "Prometheus text format at GET /metrics on a listener of its own, answered in C by the "
        "supervisor (or the one serving process), summed over every worker process.")
    g.add_argument("--metrics-bind", metavar="HOST:PORT", default=None,
                   help="serve the metrics at HOST:PORT (default: none, nothing counted)")
    g.add_argument("--metrics-port", metavar="PORT", default=None,
                   help="serve the metrics on PORT of --host (default: none)")


def _add_ws_options(p: argparse.ArgumentParser) -> None:
    defaults = Config()
    g = p.add_argument_group("WebSocket", "uvicorn's names and defaults.")
    g.add_argument("--ws-max-size", metavar="BYTES", default=str(defaults.ws_max_size),
                   help="a message longer than this closes the connection with 1009 "
                        f"(default {defaults.ws_max_size})")
    g.add_argument("--ws-ping-interval", metavar="SECONDS", default=str(defaults.ws_ping_interval),
                   help="send a ping this often; 0: never "
                        f"(default {defaults.ws_ping_interval})")
    g.add_argument("--ws-ping-timeout", metavar="SECONDS", default=str(defaults.ws_ping_timeout),
                   help="close with 1011 when a ping's pong does not come within this; 0: never "
                        f"(default {defaults.ws_ping_timeout})")
    g.add_argument("--ws-per-message-deflate", action=_Flag,
                   default=defaults.ws_per_message_deflate,
                   help="take permessage-deflate (RFC 7692) when a client offers it "
                        "(default: on)")
    g.add_argument("--ws", default="auto", choices=("auto", "websockets", "wsproto"),
                   type=_ws_choice,
                   help="uvicorn's choice of WebSocket library, taken so that its command lines "
                        "start: auto, websockets and wsproto all mean cyserve's own WebSocket, "
                        "in C; none is refused, since cyserve has no setting that turns "
                        "WebSocket off (default auto)")


def _ws_choice(value: str) -> str:
    if value.lower() == "none":
        # uvicorn's none passes an upgrade request to the application as a plain HTTP request;
        # cyserve's engine always upgrades it, so none could not mean what it means there.
        raise argparse.ArgumentTypeError(
            "'none' is refused: cyserve has no setting that turns WebSocket off (an upgrade "
            "request reaches an ASGI app as a websocket scope, not as uvicorn's plain HTTP "
            "request)")
    return value.lower()


def _add_head_options(p: argparse.ArgumentParser) -> None:
    defaults = Config()
    p.add_argument("--header", metavar="NAME:VALUE", action="append", default=[],
                   help="a header added to every response, e.g. 'X-Frame-Options: DENY'; "
                        "repeatable; a Server header given here replaces the server's, and an "
                        "application's own Server replaces either (default: none)")
    p.add_argument("--server-header", action=_Flag, default=defaults.server_header,
                   help="send 'Server: cyserve' when the application sets no Server header "
                        "(default: on)")
    p.add_argument("--date-header", action=_Flag, default=defaults.date_header,
                   help="send a Date header with every response (default: on)")


def _ws_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"ws_per_message_deflate": args.ws_per_message_deflate}
    try:
        options["ws_max_size"] = int(args.ws_max_size, 10)
    except ValueError:
        raise ConfigError("ws_max_size", args.ws_max_size, "must be an integer") from None
    for name in ("ws_ping_interval", "ws_ping_timeout"):
        raw = getattr(args, name)
        try:
            options[name] = float(raw)
        except ValueError:
            raise ConfigError(name, raw, "must be a number of seconds") from None
    return options


def _app_reloader(args: argparse.Namespace, config: Config) -> Callable[[], App]:
    """What imports the application again for a reload (SIGHUP to a process supervisor): the
    modules imported since now whose files are under --app-dir (the application's own code, not
    the libraries it uses, nor cyserve) are forgotten, then MODULE:APP is loaded as at start."""
    before = set(sys.modules)
    folder = os.path.abspath(args.app_dir) + os.sep

    def reload_app() -> App:
        for name, module in list(sys.modules.items()):
            path = getattr(module, "__file__", None)
            if (name in before or name == "cyserve" or name.startswith("cyserve.") or not path
                    or not os.path.abspath(path).startswith(folder)
                    or f"{os.sep}site-packages{os.sep}" in path):
                continue
            del sys.modules[name]
            # CPython trusts a cached .pyc whose source kept its size and modification second:
            # an edit made within the second of the last import would not be seen.
            if path.endswith(".py"):
                try:
                    os.unlink(importlib.util.cache_from_source(path))
                except (OSError, NotImplementedError, ValueError):
                    pass
        importlib.invalidate_caches()
        return load_app(args.app, args.app_dir, config.interface, args.factory)

    return reload_app


def _listen_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"bind": tuple(args.bind), "uds": args.uds}
    if args.uds_perms is not None:
        try:
            options["uds_perms"] = int(args.uds_perms, 8)
        except ValueError:
            raise ConfigError("uds_perms", args.uds_perms,
                              "must be an octal mode such as 660") from None
    if args.fd is not None:
        try:
            options["fd"] = int(args.fd, 10)
        except ValueError:
            raise ConfigError("fd", args.fd, "must be a descriptor number") from None
    return options


def config_from_args(args: argparse.Namespace,
                     sources: Mapping[str, str] | None = None) -> Config:
    """A validated Config from parsed arguments; ConfigError names the flag's option.
    sources: where the values the command line did not give came from (parse_sources's
    labels), for an error that names a second option."""
    options: dict[str, Any] = {"host": args.host,
                               "log_level": "debug" if args.log_level == "trace" else
                               args.log_level,
                               "access_log": args.access_log,
                               "access_log_format": args.access_log_format,
                               "access_logfile": args.access_logfile,
                               "interface": _interface(args),
                               "loop": args.loop, "asgi_loops": args.asgi_loops,
                               "lifespan": args.lifespan,
                               "http": args.http, "http2": args.http2}
    for name in ("ssl_certfile", "ssl_keyfile", "ssl_keyfile_password", "ssl_ciphers",
                 "ssl_ca_certs"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.ssl_sni:
        options["ssl_sni"] = tuple(args.ssl_sni)
    if args.ssl_ocsp_file is not None:
        options["ssl_ocsp_file"] = args.ssl_ocsp_file
    if args.ssl_ticket_rotation is not None:
        try:
            options["ssl_ticket_rotation"] = int(args.ssl_ticket_rotation, 10)
        except ValueError:
            raise ConfigError("ssl_ticket_rotation", args.ssl_ticket_rotation,
                              "must be a whole number of seconds") from None
    if args.ssl_cert_reqs is not None:
        try:
            options["ssl_cert_reqs"] = int(args.ssl_cert_reqs, 10)
        except ValueError:
            raise ConfigError("ssl_cert_reqs", args.ssl_cert_reqs, "must be 0, 1 or 2") from None
    for name in _INT_OPTIONS:
        raw = getattr(args, name)
        try:
            options[name] = int(raw, 10)
        except ValueError:
            raise ConfigError(name, raw, "must be an integer") from None
    for name in _LIMIT_OPTIONS:
        raw = getattr(args, name)
        if raw is None:
            continue
        try:
            options[name] = int(raw, 10)
        except ValueError:
            raise ConfigError(name, raw, "must be an integer") from None
    for name in _FLOAT_OPTIONS:
        raw = getattr(args, name)
        try:
            options[name] = float(raw)
        except ValueError:
            raise ConfigError(name, raw, "must be a number of seconds") from None
    options.update(_listen_options(args))
    _gunicorn_limits(args, options, sources or {})
    if args.umask is not None:
        options["umask"] = parse_umask(args.umask)
    options.update(user=args.user, group=args.group, **getattr(args, "hooks", {}))
    for name in ("max_requests", "max_requests_jitter"):
        raw = getattr(args, name)
        try:
            options[name] = int(raw, 10)
        except ValueError:
            raise ConfigError(name, raw, "must be an integer") from None
    options["health_path"] = args.health_path
    options["pid"] = args.pid
    try:
        options["limit_concurrency"] = int(args.limit_concurrency, 10)
    except ValueError:
        raise ConfigError("limit_concurrency", args.limit_concurrency,
                          "must be an integer") from None
    options.update(log_config=args.log_config, reload=args.reload, preload=args.preload,
                   reload_dirs=tuple(args.reload_dir or
                                     ([args.app_dir] if args.reload else [])),
                   reload_includes=tuple(args.reload_include),
                   reload_excludes=tuple(args.reload_exclude), proc_name=args.name)
    try:
        options["reload_delay"] = float(args.reload_delay)
    except ValueError:
        raise ConfigError("reload_delay", args.reload_delay,
                          "must be a number of seconds") from None
    if args.metrics_bind is not None:
        options["metrics_bind"] = args.metrics_bind
    elif args.metrics_port is not None:
        host = args.host if ":" not in args.host else f"[{args.host}]"
        options["metrics_bind"] = f"{host}:{args.metrics_port}"
    options.update(_proxy_lists(args, sources or {}))
    if args.forwarded_header is not None:
        options["forwarded_header"] = args.forwarded_header
    options.update(proxy_headers=bool(args.proxy_headers),
                   forwarded_host=args.forwarded_host,
                   proxy_protocol=args.proxy_protocol, root_path=args.root_path)
    options.update(_ws_options(args))
    options.update(headers=tuple(args.header), server_header=args.server_header,
                   date_header=args.date_header)
    return Config(**options)


def _proxy_lists(args: argparse.Namespace, sources: Mapping[str, str]) -> dict[str, Any]:
    """forwarded_allow_ips and proxy_allow_from as the options mean them together.
    --forwarded-allow-ips names the peers believed for both proxy headers and, unless
    --proxy-allow-from names them, the PROXY protocol; with --no-proxy-headers and
    --proxy-protocol it names the PROXY protocol's alone. What cannot be so read is refused in
    one line rather than settled by a choice the user did not make."""
    ips, pp_from = args.forwarded_allow_ips, args.proxy_allow_from
    if args.proxy_headers is not False:
        return {"forwarded_allow_ips": ips, "proxy_allow_from": pp_from}
    # uvicorn's --no-proxy-headers beside an option that turns them on says two things. An
    # option the command line did not give is said with where it came from (an environment
    # variable, a --config key), as a limit given twice is (_gunicorn_limits).
    def said(dest: str, shown: str) -> str:
        return f"{shown} ({sources[dest]})" if dest in sources else shown

    if args.forwarded_host:
        raise ConfigError("proxy_headers", "off", "--no-proxy-headers contradicts "
                          f"{said('forwarded_host', '--forwarded-host')}, which turns proxy "
                          "headers on")
    if args.forwarded_header is not None:
        header = said("forwarded_header", f"--forwarded-header {args.forwarded_header}")
        raise ConfigError("proxy_headers", "off", f"--no-proxy-headers contradicts {header}, "
                          "which names the proxy headers to believe: none are read")
    if ips is not None and not args.proxy_protocol:
        raise ConfigError("proxy_headers", "off", "--no-proxy-headers contradicts "
                          f"{said('forwarded_allow_ips', '--forwarded-allow-ips')}, which turns "
                          "proxy headers on (for the PROXY protocol's peers, add "
                          "--proxy-protocol)")
    if ips is not None and pp_from is not None:
        raise ConfigError("proxy_headers", "off", "--no-proxy-headers contradicts "
                          f"{said('forwarded_allow_ips', '--forwarded-allow-ips')}, which can "
                          "only turn proxy headers on when "
                          f"{said('proxy_allow_from', '--proxy-allow-from')} names the PROXY "
                          "protocol's peers")
    # The PROXY protocol from these peers, and no proxy header believed from anyone.
    return {"forwarded_allow_ips": None, "proxy_allow_from": ips if ips is not None else pp_from}


def _interface(args: argparse.Namespace) -> str:
    """--interface, or the one gunicorn's --worker-class implies; both, differing, is a
    contradiction."""
    if args.worker_class is None:
        return str(args.interface)
    implied = _WORKER_CLASSES[args.worker_class]
    if args.interface not in ("auto", implied):
        raise ConfigError("worker_class", args.worker_class,
                          f"serves {implied.upper()} applications, not --interface "
                          f"{args.interface}'s")
    return implied


class _NotThatInterface(AppLoadError):
    """The object found is not an application of the interface asked for (or of any)."""


def load_app(spec: str, app_dir: str | None = ".", interface: str = "auto",
             factory: bool = False) -> App:
    """Import ``module:attribute`` (the attribute may be dotted) and return the App there, or
    an App serving the WSGI application there (``interface``: see app.as_app).

    AppLoadError when the spec is malformed, the module does not exist or the attribute is
    missing or is not what ``interface`` asks for. With ``factory``, the attribute is called
    with no arguments and what it returns is the application. An exception raised by the
    module's own code (or the factory's) propagates as it is.
    """
    if app_dir is not None:
        folder = os.path.abspath(app_dir)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # like uvicorn: `cyserve mymod:app` finds ./mymod.py
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"app must be given as 'module:attribute', got {spec!r}")
    if module_name.startswith("."):
        raise AppLoadError(f"app module must be an absolute module name, got {module_name!r} "
                           f"(a relative import needs a package to be relative to)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing module on the path to the one named is the user's typo; a module that
        # the application itself fails to import is a bug in the application.
        if exc.name is not None and _is_parent_or_self(exc.name, module_name):
            raise AppLoadError(f"cannot import {module_name!r}: {exc}") from None
        raise
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppLoadError(f"{module_name!r} has no attribute {attr!r}") from None
    if factory:
        if not callable(obj):
            raise AppLoadError(f"{spec!r} is not callable, so it cannot be a factory (it is a "
                               f"{type(obj).__name__})")
        obj = obj()
    try:
        return as_app(obj, interface)
    except HandlerTypeError as exc:
        what = f"{spec!r} (its factory's result)" if factory else repr(spec)
        raise _NotThatInterface(f"{what}: {exc}") from None


def _is_parent_or_self(missing: str, wanted: str) -> bool:
    return wanted == missing or wanted.startswith(missing + ".")


ENV_PREFIX = "CYSERVE_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def option_names(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option that the environment and a --config file may set, by its long name
    (``max-requests``; an alias such as ``workers`` too), with the action that takes it. Not
    --help, --version, nor the --no- spellings of a flag (``http2 = false`` says that)."""
    names: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.dest in ("help", "version"):
            continue
        if not action.option_strings:
            names["app"] = action
        for s in action.option_strings:
            if s.startswith("--") and not (s.startswith("--no-") and
                                           isinstance(action, argparse.BooleanOptionalAction)):
                names[s[2:]] = action
    return names


def env_name(option: str) -> str:
    """The environment variable of a long option: --max-requests is CYSERVE_MAX_REQUESTS."""
    return ENV_PREFIX + option.upper().replace("-", "_")


class _Source:
    """Option values from one place (the environment, a TOML file), as command-line words."""

    def __init__(self) -> None:
        self.words: dict[str, list[str]] = {}  # dest -> the words that say it
        self.label: dict[str, str] = {}  # dest -> where it came from, for errors
        self.hooks: dict[str, Any] = {}  # a Python configuration file's (cyserve.hooks)

    def add(self, parser: argparse.ArgumentParser, action: argparse.Action, option: str,
            label: str, value: object) -> None:
        """Record ``value`` for ``action``; a value of the wrong kind is a usage error that
        names ``label``."""
        positional = not action.option_strings  # MODULE:APP
        long = f"--{option}"
        words: list[str]
        if action.nargs == 0:  # a flag: true or false
            if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
                value = value.strip().lower() in _TRUE
            if not isinstance(value, bool):
                raise _UsageError(f"{label}: must be true or false, got {value!r}")
            if isinstance(action, argparse.BooleanOptionalAction):
                words = [long if value else f"--no-{option}"]
            else:
                words = [long] if value else []
        elif isinstance(action, argparse._AppendAction):
            # A header's value has blanks: one per line there, not one per word.
            split = str.splitlines if action.dest == "header" else str.split
            items = split(value) if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
                raise _UsageError(f"{label}: must be a list of strings, got {value!r}")
            words = [w for v in items for w in (long, v)]
        else:
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise _UsageError(f"{label}: must be a string or a number, got {value!r}")
            words = [str(value)] if positional else [long, str(value)]
        try:  # a choice checked alone, so that a bad one is reported with where it came from
            parser.parse_args(([] if positional else ["m:app"]) + words)
        except _UsageError as exc:
            raise _UsageError(f"{label}: {exc}") from None
        self.words[action.dest] = words
        self.label[action.dest] = label


def _from_environment(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> _Source:
    """CYSERVE_<OPTION> for every long option. Other variables with the prefix are not
    options (the build's CYSERVE_TEST_HOOKS, an application's own) and are left alone."""
    src = _Source()
    for option, action in option_names(parser).items():
        name = env_name(option)
        if name in environ:
            src.add(parser, action, option, f"{name}={environ[name]!r}", environ[name])
    return src


# A Python configuration file's settings and hooks, by its real path: the command line is
# parsed twice (_prepare_process), and the file's code must run once.
_PYTHON_CONFIGS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}


def _read_python_config(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A gunicorn-style configuration file, run once: (its settings, its hooks). Its module
    globals named as options (max_requests, workers, bind) are settings; functions named as
    hooks (cyserve.hooks) are hooks. Names beginning with '_' or a capital, modules, classes and
    other functions are the file's own business; any other value is an unknown option."""
    from .hooks import HOOKS, hook_refusal

    key = os.path.realpath(path)
    if key in _PYTHON_CONFIGS:
        return _PYTHON_CONFIGS[key]
    import runpy
    import types

    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise _UsageError(f"--config {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        namespace = runpy.run_path(path, run_name="__cyserve_config__")
    except SyntaxError as exc:
        raise _UsageError(f"--config {path}, line {exc.lineno}: SyntaxError: {exc.msg}") \
            from None
    except Exception as exc:
        lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__)
                 if os.path.realpath(f.filename) == key]
        where = f", line {lines[-1]}" if lines else ""
        raise _UsageError(f"--config {path}{where}: {type(exc).__name__}: {exc}") from None
    settings: dict[str, Any] = {}
    hooks: dict[str, Any] = {}
    for name, value in namespace.items():
        if name.startswith("_") or name[:1].isupper():
            continue
        refusal = hook_refusal(name)
        if refusal is not None:
            raise _UsageError(f"--config {path}: {refusal}")
        if name in HOOKS:
            hooks[name] = value
        elif value is not None and not isinstance(value, (types.ModuleType, type)) \
                and not callable(value):
            settings[name] = list(value) if isinstance(value, tuple) else value
    _PYTHON_CONFIGS[key] = (settings, hooks)
    return settings, hooks


def _read_toml(path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the tomli backport, a dependency of cyserve there
        try:
            import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
        except ModuleNotFoundError:
            raise _UsageError(f"--config {path}: reading TOML on Python 3.10 needs the tomli "
                              "package (pip install tomli)") from None
    try:
        with open(path, "rb") as f:
            doc: dict[str, Any] = tomllib.load(f)
    except OSError as exc:
        raise _UsageError(f"--config {path}: cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise _UsageError(f"--config {path}: not valid TOML: {exc}") from None
    if set(doc) == {"cyserve"} and isinstance(doc["cyserve"], dict):
        doc = doc["cyserve"]  # the options in a [cyserve] table of their own
    return doc


# gunicorn's settings whose name in a gunicorn.conf.py is not its command-line option's
# (accesslog is --access-logfile there too): a gunicorn file names them so, and cyserve has the
# same option under the command line's name.
_GUNICORN_FILE_NAMES = {"accesslog": "access-logfile", "errorlog": "error-logfile",
                        "loglevel": "log-level", "keepalive": "keep-alive",
                        "preload_app": "preload", "raw_env": "env", "pidfile": "pid",
                        "logconfig": "log-config", "proc_name": "name",
                        "proxy_allow_ips": "proxy-allow-from"}


def _from_file(parser: argparse.ArgumentParser, path: str) -> _Source:
    names = option_names(parser)
    src = _Source()
    python = path.endswith(".py")
    if python:
        doc, src.hooks = _read_python_config(path)
    else:
        doc = _read_toml(path)
    for key, value in doc.items():
        option = key.replace("_", "-")
        if python and key in _GUNICORN_FILE_NAMES:
            option = _GUNICORN_FILE_NAMES[key]
        action = names.get(option) if option != "config" else None
        if action is None:
            raise _UsageError(f"--config {path}: unknown option {key!r}")
        src.add(parser, action, option, f"--config {path}: {key}", value)
    return src


def _given(argv: Sequence[str]) -> set[str]:
    """The dests the command line itself gives (read by a parser without --help and --version,
    which would act on them)."""
    quiet = build_parser(_help=False)
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    try:
        return set(vars(quiet.parse_known_args(list(argv))[0]))
    except _UsageError:
        return set()  # the real parse says what is wrong


def parse_command(argv: Sequence[str] | None = None,
                  environ: Mapping[str, str] | None = None
                  ) -> tuple[argparse.Namespace, Config]:
    """The arguments and the Config of a command line, with what the environment
    (CYSERVE_<OPTION>) and a --config TOML file add: the command line wins over the
    environment, which wins over the file, which wins over the defaults. _UsageError or
    ConfigError (naming where a bad value came from) otherwise."""
    args, given, labels = parse_sources(argv, environ)
    try:
        # Where each value the command line did not give came from: an error that names a
        # second option says it (a value the user did not type is not reported as typed).
        return args, config_from_args(args, {dest: label for dest, label in labels.items()
                                             if dest not in given})
    except ConfigError as exc:
        dest = exc.cli_option.replace("-", "_")
        label = labels.get(dest)
        if label is not None and dest not in given:
            raise _UsageError(f"{label}: {exc.reason}") from None
        raise


def parse_sources(argv: Sequence[str] | None = None,
                  environ: Mapping[str, str] | None = None
                  ) -> tuple[argparse.Namespace, set[str], dict[str, str]]:
    """parse_command's first half: the merged arguments, the dests the command line gave, and
    where each of the others came from (an environment variable, a key of the file)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    env = _from_environment(parser, os.environ if environ is None else environ)
    given = _given(argv)
    path = None
    if "config" in given:
        path = parser.parse_known_args(argv)[0].config
    elif "config" in env.words:
        path = env.words["config"][-1]
    file = _from_file(parser, path) if path is not None else _Source()
    words: list[str] = []
    labels: dict[str, str] = {}
    for src in (file, env):
        for dest in src.words:
            labels[dest] = src.label[dest]
    app: list[str] = []
    for dest in labels:
        if dest in given or dest == "config":
            continue
        src = env if dest in env.words else file
        if dest == "app":
            app = src.words[dest]
        else:
            words += src.words[dest]
    args = parser.parse_args(words + argv)
    args.config = path  # the file read, wherever it was named
    args.hooks = file.hooks
    for name in file.hooks:
        labels[name] = f"--config {path}: {name}"
    if args.app is None and app:
        args.app = app[0]
    if args.app is None:
        raise _BadCommandLine("the following arguments are required: MODULE:APP")
    return args, given, labels


def _prepare_process(argv: list[str]) -> list[str]:
    """--chdir, --umask, --env and --env-file, done before anything else is read or imported;
    the arguments to parse again then (the --config file's path made absolute: it is read from
    where the command was started). _UsageError or ConfigError when one cannot be done."""
    args, _, _ = parse_sources(argv)
    if args.chdir is None and args.env_file is None and args.umask is None and not args.env:
        return argv
    if args.config is not None:
        argv = argv + ["--config", os.path.abspath(args.config)]
    if args.chdir is not None:
        try:
            os.chdir(args.chdir)
        except OSError as exc:
            raise _UsageError(f"--chdir {args.chdir}: cannot enter it: "
                              f"{exc.strerror or exc}") from None
    if args.umask is not None:
        mask = parse_umask(args.umask)
        if not 0 <= mask <= 0o777:
            raise ConfigError("umask", args.umask, "must be between 0 and 0o777")
        os.umask(mask)
    for item in args.env:
        name, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name) or "\0" in value:
            raise _UsageError(f"--env {item}: must be NAME=VALUE (a variable name, then '=')")
        os.environ[name] = value
    if args.env_file is not None:  # after --env, whose values it does not replace
        from .envfile import EnvFileError, load_env_file

        try:
            load_env_file(args.env_file)
        except EnvFileError as exc:
            raise _UsageError(str(exc)) from None
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return its exit status."""
    try:
        args, config = parse_command(_prepare_process(list(sys.argv[1:] if argv is None
                                                            else argv)))
        if config.log_config is not None:
            # Before the application is imported, as uvicorn does: its import may log too.
            from .signals import configure_logging

            configure_logging(config.log_level, config.log_config)
        if args.print_config:
            sys.stdout.write(config_toml(args))
            return 0
        _add_python_path(args.pythonpath)
    except _BadCommandLine as exc:
        return _fail(f"{exc}\n{HELP_HINT}", EXIT_USAGE)
    except _UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except ConfigError as exc:
        return _fail(exc.for_cli(), EXIT_USAGE)

    reload_app = _app_reloader(args, config)
    loaded: App | None = None
    failure, status = "", EXIT_RUNTIME
    try:
        loaded = load_app(args.app, args.app_dir, config.interface, args.factory)
        if args.check_config:
            routes = len(loaded.build())
    except (AppLoadError, RouteError) as exc:
        failure, status = str(exc), EXIT_USAGE
        if isinstance(exc, _NotThatInterface) and args.worker_class is not None:
            # The interface came from gunicorn's worker class, not from --interface: say so.
            failure += f" (--worker-class {args.worker_class} means --interface {config.interface})"
    except Exception as exc:
        traceback.print_exc()
        failure = f"error while importing {args.app!r}: {type(exc).__name__}: {exc}"
        status = EXIT_RUNTIME
    if loaded is None:
        if not config.reload or args.check_config:
            return _fail(failure, status)
        _fail(failure, status)
        loaded, status = _wait_for_a_fix(config, reload_app, args.app)
        if loaded is None:
            return status
    app = loaded
    if args.check_config:
        problem = _check_certificates(config)
        if problem is not None:
            return _fail(problem, EXIT_USAGE)
        print(f"cyserve: the configuration is valid: {args.app} imports, with {routes} "
              f"route{'s' if routes != 1 else ''}", flush=True)
        return 0

    from .start import serve

    try:
        # load_app has already resolved --interface and made the application an App: serve() must
        # take that App as it is, not check it against "wsgi" a second time.
        serve(app, config.replace(interface="cyserve"), loader=reload_app)
    except (RouteError, ConfigError) as exc:
        return _fail(str(exc), EXIT_USAGE)
    except ListenError as exc:
        return _fail(str(exc), EXIT_RUNTIME)
    except CyserveError as exc:
        return _fail(str(exc), EXIT_RUNTIME)
    except ValueError as exc:  # the engine's own check of a route or an option
        return _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:  # only possible before the signal handlers are in place
        return 130
    return 0


def _wait_for_a_fix(config: Config, reload_app: Callable[[], App],
                    target: str) -> tuple[App | None, int]:
    """--reload, when the application does not import at start (a typo being fixed): wait for a
    change to the watched files and import it again, until it imports, as uvicorn's reloader
    does, rather than end the development server. The application and 0; or None and the exit
    status when the wait is ended: 130 on Ctrl-C, 0 on SIGTERM (as a server that stops on it)."""
    import signal

    from .reloader import Watcher
    from .signals import say

    # The signal is noted, not raised: watchfiles' generator turns an exception raised by a
    # Python signal handler while it checks signals into the end of its watch, so a raised
    # KeyboardInterrupt or SIGTERM would be lost there and the wait would go on.
    stop: list[int] = []

    def note(signum: int, frame: object) -> None:
        stop.append(signum)

    watcher = Watcher(config.reload_dirs or ["."], config.reload_includes,
                      config.reload_excludes, config.reload_delay)
    app: App | None = None
    previous = {signum: signal.signal(signum, note) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        while app is None and not stop:
            # A status line, where --reload's other lines go (the error went to standard error).
            say(f"cyserve: --reload: waiting for a change under {', '.join(watcher.dirs)} to "
                "import the application again")
            while not stop and not watcher.changed():
                time.sleep(0.1)
            if stop:
                break
            try:
                app = reload_app()
            except (AppLoadError, RouteError) as exc:
                _fail(str(exc), EXIT_USAGE)
            except Exception as exc:
                traceback.print_exc()
                _fail(f"error while importing {target!r}: {type(exc).__name__}: {exc}",
                      EXIT_RUNTIME)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    # Looked at once the handlers are back: a stop noted at any time, while the fixed
    # application imported too (an import can take seconds), ends the wait rather than being
    # dropped with a server started after it.
    if stop:
        return None, 130 if stop[0] == signal.SIGINT else 0
    return app, 0


def _check_certificates(config: Config) -> str | None:
    """--check-config: whether the certificates, keys, CAs and OCSP file load as the engine
    loads them (its own loader: the same sentence as a start would print, and a key's password
    never asked for on the terminal, which Python's ssl lets OpenSSL do); what is wrong, or
    None."""
    if not config.ssl_certfile:
        return None
    from ._core import check_tls

    try:
        check_tls(**config.tls_kwargs())
    except ValueError as exc:
        return str(exc)
    return None


def _add_python_path(dirs: str | None) -> None:
    """--pythonpath: each folder first on sys.path, in the order given (before --app-dir's,
    which load_app puts first only when it is not there already). _UsageError for a folder
    that is not one."""
    if dirs is None:
        return
    folders = [d.strip() for d in dirs.split(",") if d.strip()]
    if not folders:
        raise _UsageError(f"--pythonpath {dirs!r}: must name folders, separated by commas")
    for d in folders:
        if not os.path.isdir(d):
            raise _UsageError(f"--pythonpath {dirs}: {d!r} is not a folder")
    for d in reversed(folders):
        path = os.path.abspath(d)
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)


# Options --print-config leaves out: what makes it act instead of configure, and where the file
# was (the printed text is the file).
_NOT_PRINTED = ("help", "version", "config", "check_config", "print_config")

# The options whose value is a number, printed by --print-config as a TOML number (the others,
# --umask and --uds-perms among them, are text: 022 is octal there, which TOML has no way to say).
_NUMBER_OPTIONS = frozenset(_INT_OPTIONS + _FLOAT_OPTIONS + _LIMIT_OPTIONS + (
    "max_requests", "max_requests_jitter", "limit_concurrency", "limit_request_line",
    "limit_request_fields", "limit_request_field_size", "h11_max_incomplete_event_size",
    "ssl_cert_reqs", "ssl_ticket_rotation",
    "fd", "metrics_port", "ws_max_size", "ws_ping_interval", "ws_ping_timeout", "reload_delay"))


def _toml_number(text: str) -> str | None:
    """``text`` as a TOML number that --config reads back to the same words (it turns a number
    into text with str()), or None when it is not one: 1e3 or 010 stay quoted, as written."""
    if re.fullmatch(r"0|-?[1-9][0-9]*", text):
        return text
    try:
        number = float(text)
    except ValueError:
        return None
    return text if math.isfinite(number) and repr(number) == text else None


def config_toml(args: argparse.Namespace) -> str:
    """The options of ``args`` that differ from their defaults, as a TOML file that --config
    reads back to the same options (tests/unit/test_config_sources.py reads it back)."""
    import json

    parser = build_parser()
    lines = ["# cyserve options in effect: `cyserve --config FILE` reads this file back"]
    if args.app is not None:
        lines.append(f"app = {json.dumps(args.app)}")
    for action in parser._actions:
        if not action.option_strings or action.dest in _NOT_PRINTED:
            continue
        value = getattr(args, action.dest)
        if value == action.default or value is None:
            continue
        name = next(o for o in action.option_strings if o.startswith("--"))[2:]
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list):
            text = "[" + ", ".join(json.dumps(str(v)) for v in value) + "]"
        else:
            number = _toml_number(value) if action.dest in _NUMBER_OPTIONS else None
            text = number if number is not None else json.dumps(str(value))
        lines.append(f"{name} = {text}")
    for hook in sorted(getattr(args, "hooks", {}) or {}):
        lines.append(f"# {hook}: a hook of the Python --config file, not written here")
    return "\n".join(lines) + "\n"


def _fail(message: str, status: int) -> int:
    print(f"cyserve: {message}", file=sys.stderr, flush=True)
    return status


def options_markdown() -> str:
    """The tables of every option, a section of --help each, for docs/options.md: made from
    the parser itself, so that they cannot drift from it (tests/unit/test_config_sources.py
    compares the two)."""
    parser = build_parser()
    formatter = parser._get_formatter()
    out: list[str] = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.dest not in ("help", "version")]
        if not actions:
            continue
        out += [f"### {group.title}", "", "| option | environment | what it does |",
                "| --- | --- | --- |"]
        for action in actions:
            if not action.option_strings:
                spellings = f"`{action.metavar}`"
                env = f"`{ENV_PREFIX}APP`, `app`"
            else:
                first = next(s for s in action.option_strings if s.startswith("--"))
                value = "" if action.nargs == 0 else \
                    " " + formatter._format_args(action, action.dest.upper())
                spellings = ", ".join([f"`{first}{value}`"] + [
                    f"`{s}`" for s in action.option_strings if s != first])
                env = f"`{env_name(first[2:])}`"
            what = " ".join(formatter._expand_help(action).split()).replace("|", "\\|")
            out.append(f"| {spellings} | {env} | {what} |")
        out.append("")
    return "\n".join(out)


def _write_options_doc(path: str) -> None:
    begin, end = "<!-- options table: begin -->\n", "<!-- options table: end -->\n"
    with open(path) as f:
        text = f.read()
    text = text[:text.index(begin) + len(begin)] + options_markdown() + text[text.index(end):]
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__" and sys.argv[1:2] == ["--write-options-doc"]:
    # Rewrites the table of docs/options.md from the parser (run from the repository's root).
    _write_options_doc(sys.argv[2] if len(sys.argv) > 2 else "docs/options.md")
