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
from collections.abc import Sequence
from typing import Any, NoReturn

from . import __version__
from .app import App, as_app
from .config import INTERFACES, LOG_LEVELS, Config
from .errors import (AppLoadError, ConfigError, CyserveError, HandlerTypeError, ListenError,
                     RouteError)

__all__ = ["main", "load_app", "build_parser", "EXIT_RUNTIME", "EXIT_USAGE"]

EXIT_RUNTIME = 1
EXIT_USAGE = 2

# Numeric options arrive as text and are converted here rather than by argparse, so that a bad
# value gets the same "invalid --NAME VALUE: REASON" line as a value Config rejects.
_INT_OPTIONS = ("port", "threads", "processes", "blocking_threads", "backlog", "max_header_bytes",
                "max_target_bytes", "max_headers", "max_body_bytes")
_FLOAT_OPTIONS = ("keepalive_timeout", "header_timeout", "body_timeout", "graceful_timeout")


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
                   help="the cyserve.App or WSGI application to serve, e.g. "
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
    p.add_argument("--graceful-timeout", metavar="SECONDS", default=str(defaults.graceful_timeout),
                   help="seconds in-flight requests get to finish on shutdown")
    p.add_argument("--log-level", default=defaults.log_level, choices=LOG_LEVELS, type=str.lower,
                   help="level of the cyserve logger (default info)")
    p.add_argument("--access-log", action="store_true",
                   help="print one line per response on standard output (Common Log Format "
                        "and the seconds the request took)")
    p.add_argument("--interface", default=defaults.interface, choices=INTERFACES,
                   type=str.lower,
                   help="what MODULE:APP is: a cyserve.App, a WSGI application, or auto "
                        "(default: whichever it is)")
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
    p.add_argument("--version", action="version", version=f"cyserve {__version__}")
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    """A validated Config from parsed arguments; ConfigError names the flag's option."""
    options: dict[str, Any] = {"host": args.host, "log_level": args.log_level,
                               "access_log": args.access_log, "interface": args.interface}
    for name in ("ssl_certfile", "ssl_keyfile", "ssl_keyfile_password", "ssl_ciphers",
                 "ssl_ca_certs"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
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
        serve(app, config.replace(interface="cyserve"))
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
