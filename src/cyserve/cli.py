"""The ``cyserve`` command (and ``python -m cyserve``).

    cyserve module:app [--host H] [--port P] [--threads N] [--processes N] ...

Every failure is one line on stderr, ``cyserve: <what is wrong>``, and a non-zero exit status:
2 for a usage or configuration mistake (a bad option, an app path that does not import or has no
such attribute), 1 for a failure at run time (the port is in use, the engine is missing). The one
exception is an error raised by the application's own code while it is imported: its traceback is
printed first, because the one line alone would not say where the bug is.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from . import __version__
from .app import App, as_app
from .config import ACCESS_LOG_FORMATS, FORWARDED_HEADERS, INTERFACES, LOG_LEVELS, LOOPS, Config
from .errors import (AppLoadError, ConfigError, CyserveError, HandlerTypeError, ListenError,
                     RouteError)

__all__ = ["main", "load_app", "build_parser", "EXIT_RUNTIME", "EXIT_USAGE"]

EXIT_RUNTIME = 1
EXIT_USAGE = 2

# Numeric options arrive as text and are converted here rather than by argparse, so that a bad
# value gets the same "invalid --NAME VALUE: REASON" line as a value Config rejects.
_INT_OPTIONS = ("port", "threads", "processes", "blocking_threads", "backlog", "max_header_bytes",
                "max_target_bytes", "max_headers", "max_body_bytes", "body_budget",
                "min_body_rate", "http2_max_concurrent_streams")
_FLOAT_OPTIONS = ("keepalive_timeout", "header_timeout", "body_timeout", "graceful_timeout",
                  "worker_timeout")


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line and exit status 2 instead of usage text."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    defaults = Config()
    p = _Parser(prog="cyserve", description="Serve a cyserve.App over HTTP/1.1.",
                epilog="Ctrl-C or SIGTERM stops the server gracefully; a second Ctrl-C forces it.")
    p.add_argument("app", metavar="MODULE:APP",
                   help="the cyserve.App, WSGI or ASGI application to serve, e.g. "
                        "examples.demo.app:app")
    p.add_argument("--host", default=defaults.host,
                   help=f"address to bind (default {defaults.host})")
    p.add_argument("--port", metavar="PORT", default=str(defaults.port),
                   help=f"port to bind, 0 for any free port (default {defaults.port})")
    p.add_argument("--threads", metavar="N", default=str(defaults.threads),
                   help="worker threads; 0 = one per CPU available (default 0)")
    p.add_argument("--processes", metavar="N", default=str(defaults.processes),
                   help="worker processes, each with --threads threads (default 1); Python "
                        "handlers need more than one to use more than one core")
    p.add_argument("--blocking-threads", metavar="N", default=str(defaults.blocking_threads),
                   help="Python calls that may block at once (sleep, a slow database) while "
                        "every worker keeps serving its other connections: threads kept to "
                        "take over a worker stuck in a long call (default "
                        f"{defaults.blocking_threads}; 0 = none)")
    p.add_argument("--backlog", metavar="N", default=str(defaults.backlog), help="listen() backlog")
    p.add_argument("--max-header-bytes", metavar="BYTES", default=str(defaults.max_header_bytes),
                   help="largest header block (431 beyond)")
    p.add_argument("--max-target-bytes", metavar="BYTES", default=str(defaults.max_target_bytes),
                   help="longest request target (414 beyond)")
    p.add_argument("--max-headers", metavar="N", default=str(defaults.max_headers),
                   help="most header fields (431 beyond)")
    p.add_argument("--max-body-bytes", metavar="BYTES", default=str(defaults.max_body_bytes),
                   help="largest request body (413 beyond)")
    p.add_argument("--keepalive-timeout", metavar="SECONDS",
                   default=str(defaults.keepalive_timeout),
                   help="seconds an idle keep-alive connection is kept")
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
                   help="seconds in-flight requests get to finish on shutdown")
    p.add_argument("--log-level", default=defaults.log_level, choices=LOG_LEVELS, type=str.lower,
                   help="level of the cyserve logger (default info)")
    p.add_argument("--access-log", action="store_true",
                   help="print one line per response on standard output (Common Log Format "
                        "unless --access-log-format says otherwise)")
    p.add_argument("--access-log-format", default=defaults.access_log_format,
                   choices=ACCESS_LOG_FORMATS, type=str.lower,
                   help="common (CLF), combined (CLF with the referer and the user agent) or "
                        "json (one object per line, with the port, scheme and seconds taken) "
                        f"(default {defaults.access_log_format})")
    p.add_argument("--access-logfile", metavar="PATH", default=None,
                   help="write the access log to this file instead of standard output (turns "
                        "it on); SIGUSR1 reopens it, for logrotate")
    p.add_argument("--interface", default=defaults.interface, choices=INTERFACES,
                   type=str.lower,
                   help="what MODULE:APP is: a cyserve.App, a WSGI or an ASGI application, "
                        "or auto (default: whichever it is)")
    p.add_argument("--loop", default=defaults.loop, choices=LOOPS, type=str.lower,
                   help="the event loop of an ASGI application (default auto: uvloop when "
                        "installed, else asyncio)")
    p.add_argument("--factory", action="store_true",
                   help="MODULE:APP is a function that returns the application: call it (with "
                        "no arguments) first")
    p.add_argument("--app-dir", metavar="DIR", default=".",
                   help="folder put first on sys.path before importing (default: the current one)")
    p.add_argument("--ssl-certfile", metavar="FILE", default=None,
                   help="serve HTTPS with this certificate (PEM, then its chain)")
    p.add_argument("--ssl-keyfile", metavar="FILE", default=None,
                   help="the certificate's private key (PEM; default: in --ssl-certfile)")
    p.add_argument("--ssl-keyfile-password", metavar="PASSWORD", default=None,
                   help="the password of an encrypted --ssl-keyfile")
    p.add_argument("--ssl-ciphers", metavar="CIPHERS", default=None,
                   help="OpenSSL cipher list for TLS 1.2 (default: OpenSSL's)")
    p.add_argument("--ssl-ca-certs", metavar="FILE", default=None,
                   help="the CAs client certificates are verified against (PEM)")
    p.add_argument("--ssl-cert-reqs", metavar="N", default=None,
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
    p.add_argument("--http2", action=argparse.BooleanOptionalAction, default=defaults.http2,
                   help="speak HTTP/2 beside HTTP/1.1: offered by ALPN over TLS, and h2c by "
                        "prior knowledge on plain connections (default: on)")
    p.add_argument("--http2-max-concurrent-streams", metavar="N",
                   default=str(defaults.http2_max_concurrent_streams),
                   help="streams one HTTP/2 connection may have open at once "
                        f"(default {defaults.http2_max_concurrent_streams})")
    _add_listen_options(p)
    _add_proxy_options(p)
    _add_lifecycle_options(p)
    _add_metrics_options(p)
    p.formatter_class = _HelpWithDefaults
    p.add_argument("--version", action="version", version=f"cyserve {__version__}")
    return p


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
        "instead of the proxy's own address.")
    g.add_argument("--proxy-headers", action="store_true",
                   help="believe proxy headers from --forwarded-allow-ips (default: off)")
    g.add_argument("--proxy-protocol", action="store_true",
                   help="connections from --forwarded-allow-ips begin with a PROXY protocol "
                        "header (HAProxy's, v1 or v2: HAProxy, AWS NLB, nginx's stream module) "
                        "naming the client (default: off)")
    g.add_argument("--forwarded-allow-ips", metavar="LIST", default=None,
                   help="the trusted peers: addresses and networks (CIDR) separated by commas, "
                        "or * for all; implies --proxy-headers (default: $FORWARDED_ALLOW_IPS, "
                        "else 127.0.0.1; a Unix socket's peer is always trusted)")
    g.add_argument("--forwarded-header", default=defaults.forwarded_header,
                   choices=FORWARDED_HEADERS, type=str.lower,
                   help="the headers the proxy writes: x-forwarded (X-Forwarded-For/-Proto) or "
                        "forwarded (RFC 7239); the other kind is the client's and is ignored "
                        f"(default {defaults.forwarded_header})")


def _add_lifecycle_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "worker processes",
        "A supervisor runs the workers with --processes 2 or more, or with --max-requests (then "
        "even one worker: its replacement starts before it stops). SIGHUP to the supervisor "
        "reloads: new workers with the application imported again, then the old ones stop "
        "gracefully.")
    g.add_argument("--max-requests", metavar="N", default="0",
                   help="replace a worker process after it has answered N requests; it finishes "
                        "what is in flight once its replacement serves (default 0: never)")
    p.add_argument("--health-path", metavar="PATH", default=None,
                   help="answer GET PATH with 200 \"ok\" from C, for a load balancer's health "
                        "checks, e.g. /healthz (default: none)")
    g.add_argument("--max-requests-jitter", metavar="J", default="0",
                   help="add a random 0..J to each worker's --max-requests, so that workers are "
                        "not all replaced at once (default 0)")
    g.add_argument("--worker-timeout", metavar="SECONDS", default="0",
                   help="kill and replace a worker process whose scheduler makes no progress "
                        "for SECONDS (a call that runs that long, a stopped process); its "
                        "threads' Python stacks are printed first (default 0: never)")


def _add_metrics_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "metrics",
        "Prometheus text format at GET /metrics on a listener of its own, answered in C by the "
        "supervisor (or the one serving process), summed over every worker process.")
    g.add_argument("--metrics-bind", metavar="HOST:PORT", default=None,
                   help="serve the metrics at HOST:PORT (default: none, nothing counted)")
    g.add_argument("--metrics-port", metavar="PORT", default=None,
                   help="serve the metrics on PORT of --host (default: none)")


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


def config_from_args(args: argparse.Namespace) -> Config:
    """A validated Config from parsed arguments; ConfigError names the flag's option."""
    options: dict[str, Any] = {"host": args.host, "log_level": args.log_level,
                               "access_log": args.access_log,
                               "access_log_format": args.access_log_format,
                               "access_logfile": args.access_logfile,
                               "interface": args.interface,
                               "loop": args.loop, "http2": args.http2}
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
    for name in _FLOAT_OPTIONS:
        raw = getattr(args, name)
        try:
            options[name] = float(raw)
        except ValueError:
            raise ConfigError(name, raw, "must be a number of seconds") from None
    options.update(_listen_options(args))
    for name in ("max_requests", "max_requests_jitter"):
        raw = getattr(args, name)
        try:
            options[name] = int(raw, 10)
        except ValueError:
            raise ConfigError(name, raw, "must be an integer") from None
    options["health_path"] = args.health_path
    if args.metrics_bind is not None:
        options["metrics_bind"] = args.metrics_bind
    elif args.metrics_port is not None:
        host = args.host if ":" not in args.host else f"[{args.host}]"
        options["metrics_bind"] = f"{host}:{args.metrics_port}"
    options.update(proxy_headers=args.proxy_headers,
                   forwarded_allow_ips=args.forwarded_allow_ips,
                   forwarded_header=args.forwarded_header,
                   proxy_protocol=args.proxy_protocol)
    return Config(**options)


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
        raise AppLoadError(f"{what}: {exc}") from None


def _is_parent_or_self(missing: str, wanted: str) -> bool:
    return wanted == missing or wanted.startswith(missing + ".")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return its exit status."""
    try:
        args = build_parser().parse_args(argv)
        config = config_from_args(args)
    except _UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except ConfigError as exc:
        return _fail(exc.for_cli(), EXIT_USAGE)

    reload_app = _app_reloader(args, config)
    try:
        app = load_app(args.app, args.app_dir, config.interface, args.factory)
    except AppLoadError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except Exception as exc:
        traceback.print_exc()
        return _fail(f"error while importing {args.app!r}: {type(exc).__name__}: {exc}",
                     EXIT_RUNTIME)

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


def _fail(message: str, status: int) -> int:
    print(f"cyserve: {message}", file=sys.stderr, flush=True)
    return status
