"""The server's options, their defaults and their validation.

One Config object is built from whatever the user gave (keyword arguments to cyserve.run or
command-line flags) and is validated at once, so that a bad value is reported before anything is
bound or started, with a message that names the option and the value (see errors.ConfigError).

The defaults are those a user behind a load balancer would expect: an idle
keep-alive connection is closed after 5 s, the whole header block must arrive within 10 s, and a
body that makes no progress for 10 s is dropped.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from .access_log import compile_format as compile_access_log_format
from .errors import ConfigError
from .hooks import HOOKS, check_hook
from .listeners import check_uds_path, parse_bind

__all__ = ["Config", "HTTP_VERSIONS", "INTERFACES", "LOG_LEVELS", "MAX_PROCESSES", "MAX_THREADS",
           "available_cpus"]

# More workers than this is a typing mistake rather than a machine: every worker owns a thread,
# an epoll instance and a listening socket.
MAX_THREADS = 1024

# Worker processes: each is a whole interpreter and server; more than this is a mistake.
MAX_PROCESSES = 256
# The scheduler's limit on relief threads (SCHED_MAX_RELIEF in csrc/sched.h).
MAX_BLOCKING_THREADS = 1024

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")

# What the object served is (app.as_app): "auto" tells a cyserve.App from a WSGI or an ASGI
# callable.
INTERFACES = ("auto", "cyserve", "wsgi", "asgi")
# The proxy header families (csrc/proxy.h): the one the proxy writes is read, the other ignored.
FORWARDED_HEADERS = ("x-forwarded", "forwarded")
# The access log's line formats (csrc/access_log.c).
ACCESS_LOG_FORMATS = ("common", "combined", "json")

# The event loop of ASGI applications (cyserve.asgi): auto takes uvloop when it is installed.
LOOPS = ("auto", "asyncio", "uvloop")
# Where ASGI requests run: one event loop thread per process, or one per worker thread (for a
# free-threaded interpreter, where one loop thread would be the limit of every worker's requests),
# each running the app's lifespan for itself; auto: per thread when the GIL is off at runtime.
ASGI_LOOPS = ("auto", "process", "thread")
# Which HTTP versions are spoken (granian's --http): auto both (h2 by ALPN over TLS, h2c by prior
# knowledge or Upgrade), 1 HTTP/1.1 only, 2 HTTP/2 only (ALPN offers h2 alone; an HTTP/1.1
# request gets 505).
HTTP_VERSIONS = ("auto", "1", "2")
# The ASGI lifespan scope, as uvicorn's --lifespan: auto (an app that raises on it before its
# startup completed is served without it), on (that is a startup failure), off (never sent).
LIFESPANS = ("auto", "on", "off")

# Options whose value is a count or a size: integers of at least 1.
_LIMITS = ("backlog", "max_header_bytes", "max_target_bytes", "max_headers", "max_body_bytes")
# The header block holds at least a request line and a Host field; the engine refuses less.
_LIMIT_MINIMUM = {"max_header_bytes": 64}
# Upper bounds: the engine stores these in C ints and sizes (a larger value used to overflow
# into a traceback, or into a limit other than the one asked for), and past them a value is a
# typing mistake, not a setting: the kernel caps the backlog at net.core.somaxconn, a head is
# held in one buffer, each header slot is memory per request, a body is held in memory.
_LIMIT_MAXIMUM = {"backlog": 65535, "max_header_bytes": 1 << 20, "max_target_bytes": 1 << 20,
                  "max_headers": 10000, "max_body_bytes": 1 << 40}
# Timeouts become nanoseconds in a uint64 (past ~584 years they wrapped to 0: "close at once");
# 30 days is longer than any deadline a server needs.
MAX_SECONDS = 30 * 24 * 3600
# Timeouts in seconds: finite and strictly positive.
_TIMEOUTS = ("keepalive_timeout", "header_timeout", "body_timeout")


def available_cpus() -> int:
    """The number of CPUs this process may run on (its affinity mask, not the machine's count),
    so that `taskset -c 0 cyserve ...` starts one worker."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: fall back to the machine's count
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Config:
    """Every option of a cyserve server. Construction validates: ConfigError on a bad value."""

    host: str = "127.0.0.1"
    port: int = 8000
    # 0: the CPUs available to the process shared among the processes (workers, below): one
    # per CPU for one process, one each (gunicorn's sync workers) for as many processes as CPUs
    threads: int = 0
    processes: int = 1  # worker processes, each with `threads` threads (supervisor.py)
    # Python calls that may block at once (time.sleep, a slow database) while every worker
    # still serves its connections: threads kept to take over a stuck worker's loop
    # (csrc/sched_relief.c.h)
    blocking_threads: int = 16
    backlog: int = 1024
    max_header_bytes: int = 8192  # the whole header block; more gets 431
    max_target_bytes: int = 8192  # the request target; longer gets 414
    max_headers: int = 100  # header fields; more gets 431
    max_body_bytes: int = 1048576  # a larger body gets 413
    keepalive_timeout: float = 5.0  # an idle keep-alive connection is closed after this
    header_timeout: float = 10.0  # the whole header block must arrive within this (else 408)
    body_timeout: float = 10.0  # a body that makes no progress for this long gets 408
    # Request body bytes all connections may hold at once while bodies are read whole (0: no
    # bound; a body streamed to its app holds only its window); past it bodies are not read
    # until it frees, and get 503 after body_timeout.
    body_budget: int = 64 << 20
    # Bytes/s a body must average once body_timeout has passed since it began (0: no minimum);
    # slower gets 408, as Apache's mod_reqtimeout MinRate (500 is its default too).
    min_body_rate: int = 500
    graceful_timeout: float = 5.0  # on shutdown, in-flight requests get this long to finish
    # On a stop, serve this long first with the health path answering 503 (serving.py).
    drain_delay: float = 0.0
    log_level: str = "info"
    access_log: bool = False  # one line per response on standard output (csrc/access_log.c)
    access_log_format: str = "common"  # common (CLF), combined (+ referer, user agent), json, or
    # gunicorn's atoms: "%(h)s %(l)s %(u)s %(t)s \"%(r)s\" %(s)s %(b)s" (cyserve/access_log.py)
    # A file for the access log instead of standard output (implies access_log); reopened on
    # SIGUSR1, for logrotate. "-" is standard output (gunicorn's spelling).
    access_logfile: str | None = None
    interface: str = "auto"  # a cyserve.App, a WSGI or ASGI application, or "auto"
    loop: str = "auto"  # the event loop of ASGI applications (cyserve.asgi)
    # One event loop per process, or one per worker thread (requests run on the loop of the
    # worker that parsed them, and each loop runs the app's lifespan: N startups, N states);
    # "auto" is per thread when the GIL is off at runtime (cyserve.asgi.loops_per_thread).
    asgi_loops: str = "auto"
    lifespan: str = "auto"  # the ASGI lifespan scope: auto, on or off (LIFESPANS)
    # Where to listen beyond host and port (cyserve.listeners): any of these replaces host:port.
    bind: tuple[str, ...] = ()  # HOST:PORT, [V6]:PORT, unix:PATH, fd://N (gunicorn's spelling)
    uds: str | None = None  # a Unix socket's path (made at start, removed at exit)
    uds_perms: int | None = None  # its mode, e.g. 0o660 (default: the umask's)
    fd: int | None = None  # a listening socket inherited from the parent process
    # Behind a proxy (csrc/proxy.c): believe X-Forwarded-For/-Proto and Forwarded from these peers.
    proxy_headers: bool = False  # also on when forwarded_allow_ips is given
    # The PROXY protocol (csrc/proxyproto.c, v1 and v2): connections from the peers of
    # proxy_allow_from, else of forwarded_allow_ips (its default when None), begin with a header
    # that names the client.
    proxy_protocol: bool = False
    forwarded_allow_ips: str | None = None  # None: $FORWARDED_ALLOW_IPS, else "127.0.0.1"
    # The PROXY protocol's peers alone (gunicorn's --proxy-allow-from), so that a TCP balancer
    # may be trusted for it without its proxy headers being believed. None: as above.
    proxy_allow_from: str | None = None
    # Which headers the proxy writes: "x-forwarded" (X-Forwarded-For/-Proto, as nginx's usual
    # configuration and uvicorn) or "forwarded" (RFC 7239). The other family is ignored: the
    # proxy passes it through from the client.
    forwarded_header: str = "x-forwarded"
    # With proxy headers: also take the host the proxy names (X-Forwarded-Host, or Forwarded's
    # host=) as the request's Host, which WSGI's HTTP_HOST and SERVER_NAME, ASGI's host header
    # and Request.headers then show (csrc/proxy.c). Off by default, as werkzeug's ProxyFix
    # x_host: a proxy that does not set the field passes the client's own through.
    forwarded_host: bool = False  # implies proxy_headers
    # The path a proxy serves this application under ("/api"), removed by the proxy before it
    # forwards: ASGI's root_path and the front of its path, WSGI's SCRIPT_NAME (serving.py,
    # native/asgi.pyx, native/wsgi.pyx). "": none.
    root_path: str = ""
    # Worker recycling (supervisor.py): a worker process that has answered max_requests (plus a
    # random 0..max_requests_jitter of its own) is replaced, the new one serving first. 0: never.
    max_requests: int = 0
    max_requests_jitter: int = 0
    # A worker process older than max_lifetime seconds (plus a random 0..max_lifetime_jitter of
    # its own) is replaced the same way. 0: never.
    max_lifetime: float = 0.0
    max_lifetime_jitter: float = 0.0
    # A file the pid of the server (the supervisor, or the one serving process) is written to,
    # and removed from at exit; refused while it holds the pid of a live process.
    pid: str | None = None
    # Requests one process may have in flight at once; past it 503 with Retry-After and the
    # connection closed (csrc/request.c). 0: no limit.
    limit_concurrency: int = 0
    # A logging configuration file (signals.configure_logging): dictConfig JSON or YAML, or a
    # fileConfig INI file. Its levels win over log_level.
    log_config: str | None = None
    # Development: restart the workers when a .py file under reload_dirs changes (a SIGHUP
    # reload: the new workers serve before the old ones stop; supervisor.py).
    reload: bool = False
    reload_dirs: tuple[str, ...] = ()
    # Which files under reload_dirs count, as uvicorn's --reload-include/--reload-exclude: glob
    # patterns matched against a file's name and its path below the folder; "*.py" is always
    # included (reloader.py).
    reload_includes: tuple[str, ...] = ()
    reload_excludes: tuple[str, ...] = ()
    # Seconds between two looks at the files (polling), or over which changes are gathered into
    # one reload (watchfiles).
    reload_delay: float = 0.5
    # The name the processes carry in ps, top and pgrep (gunicorn's proc_name): the kernel's
    # 15-byte task name of the serving processes (start.py). None: python's own.
    proc_name: str | None = None
    # With worker processes: import the application once in the supervisor and fork the workers
    # from it (True), or import it again in each worker after the fork (False).
    preload: bool = True
    # A path answered 200 "ok" from C (a static route), for load balancers' health checks.
    health_path: str | None = None
    # Prometheus metrics (csrc/metrics.c): HOST:PORT of a listener of their own answering
    # GET /metrics, summed over every worker process. None: not counted at all.
    metrics_bind: str | None = None
    # A worker process whose scheduler makes no progress for this many seconds (a call that runs
    # that long, or a process that stopped) is killed and replaced (supervisor.py). 0: never.
    worker_timeout: float = 0.0
    # TLS (csrc/tls.c), with uvicorn's and gunicorn's names: a certificate file turns it on.
    ssl_certfile: str | None = None  # PEM: the certificate, then its chain
    ssl_keyfile: str | None = None  # PEM private key; None: it is in ssl_certfile
    ssl_keyfile_password: str | None = dataclasses.field(default=None, repr=False)
    ssl_ciphers: str | None = None  # OpenSSL cipher list for TLS 1.2; None: OpenSSL's defaults
    ssl_ca_certs: str | None = None  # PEM: the CAs that client certificates are verified against
    ssl_cert_reqs: int = 0  # client certificates: 0 none, 1 optional, 2 required (ssl.CERT_*)
    # More names, each served with its own certificate (SNI): "NAME=CERTFILE[,KEYFILE]" entries
    # (NAME may be *.domain); a client naming none of them gets ssl_certfile's.
    ssl_sni: tuple[str, ...] = ()
    ssl_ocsp_file: str | None = None  # DER OCSP response stapled for ssl_certfile's certificate
    ssl_ticket_rotation: int = 3600  # seconds each session ticket key is used for
    # HTTP versions (HTTP_VERSIONS; 1 and 2 may be given as ints): "auto" speaks HTTP/2
    # (csrc/http2.c) beside HTTP/1.1, "1" HTTP/1.1 only, "2" HTTP/2 only.
    http: str = "auto"
    # The older spelling, kept: False is http="1", True HTTP/2 on; None (default) says nothing.
    # One that contradicts http (False with "2", True with "1") is an error, not a guess.
    http2: bool | None = None
    http2_max_concurrent_streams: int = 100  # SETTINGS_MAX_CONCURRENT_STREAMS per connection
    # WebSocket (csrc/ws_conn.c), uvicorn's names and defaults: a message over ws_max_size bytes
    # closes 1009; a ping every ws_ping_interval seconds, closed with 1011 when its pong does not
    # come within ws_ping_timeout (None or 0: off); permessage-deflate taken when offered.
    ws_max_size: int = 16 * 1024 * 1024
    ws_ping_interval: float | None = 20.0
    ws_ping_timeout: float | None = 20.0
    ws_per_message_deflate: bool = True
    # Fields written on every answer, uvicorn's --header/--server-header/--date-header: headers
    # are (name, value) pairs (or "Name: value" strings) added to every response, as they are
    # (a handler's field of the same name is sent too), except Server: one given here replaces
    # "Server: cyserve", and a handler's own Server replaces either. server_header False: no
    # Server field of the engine's; date_header False: no Date field.
    headers: tuple[tuple[str, str], ...] = ()
    server_header: bool = True
    date_header: bool = True
    # The user and group (names or ids) the worker processes run as: the supervisor, run as
    # root, binds the listeners, then each worker drops to them before it serves or imports the
    # application (supervisor.py, owner.py). None: stay as started.
    user: str | int | None = None
    group: str | int | None = None
    # The process's umask (os.umask) from the start, e.g. 0o027; None: the inherited one.
    umask: int | None = None
    # Hooks as gunicorn calls them (cyserve.hooks): on_starting(server), when_ready(server),
    # post_fork(server, worker), worker_exit(server, worker), on_exit(server).
    on_starting: Callable[..., Any] | None = dataclasses.field(default=None, repr=False)
    when_ready: Callable[..., Any] | None = dataclasses.field(default=None, repr=False)
    post_fork: Callable[..., Any] | None = dataclasses.field(default=None, repr=False)
    worker_exit: Callable[..., Any] | None = dataclasses.field(default=None, repr=False)
    on_exit: Callable[..., Any] | None = dataclasses.field(default=None, repr=False)
    # Set by the process supervisor for its workers only (not a user option: the CLI has no flag).
    shared_port: bool = dataclasses.field(default=False, repr=False)

    def __post_init__(self) -> None:
        self._validate()

    @classmethod
    def from_options(cls, **options: Any) -> Config:
        """A Config from keyword options; an unknown name is a ConfigError too, so that a typo
        such as ``keepalive=3`` is not silently ignored."""
        known = {f.name for f in fields(cls)} - {"shared_port"}  # internal, see below
        for name in options:
            if name not in known:
                raise ConfigError(name, options[name], "unknown option (known: "
                                  + ", ".join(sorted(known)) + ")")
        return cls(**options)

    def replace(self, **changes: Any) -> Config:
        """A copy with some options changed, validated again."""
        return dataclasses.replace(self, **changes)

    @property
    def workers(self) -> int:
        """The number of worker threads each process starts: threads, or when 0 the CPUs
        available divided among the processes (at least one). N processes of CPUs threads each
        would oversubscribe the machine N times over: a process's Python calls take turns
        under its GIL, so the extra threads bring wake-ups and memory, not throughput
        (docs/benchmarks.md, "Threads per worker process")."""
        if self.threads > 0:
            return self.threads
        return max(1, available_cpus() // self.processes)

    def server_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of cyserve._core.Server, minus the routes."""
        return {
            "host": self.host,
            "port": self.port,
            "threads": self.workers,
            "blocking_threads": self.blocking_threads,
            "backlog": self.backlog,
            # A worker process joins its siblings' SO_REUSEPORT group (supervisor.py).
            "shared_port": self.shared_port,
            "access_log": self.access_log or self.access_logfile is not None,
            "access_log_format": self.access_log_format,
            "max_header_bytes": self.max_header_bytes,
            "max_target_bytes": self.max_target_bytes,
            "max_headers": self.max_headers,
            "max_body_bytes": self.max_body_bytes,
            "keepalive_timeout": float(self.keepalive_timeout),
            "header_timeout": float(self.header_timeout),
            "body_timeout": float(self.body_timeout),
            "body_budget": self.body_budget,
            "min_body_rate": self.min_body_rate,
            "http2": self.http_mode != "1",
            "http": self.http_mode,
            "http2_max_concurrent_streams": self.http2_max_concurrent_streams,
            "ws_max_size": self.ws_max_size,
            "ws_ping_interval": self.ws_ping_interval,
            "ws_ping_timeout": self.ws_ping_timeout,
            "ws_per_message_deflate": self.ws_per_message_deflate,
            "headers": self.headers,
            "server_header": self.server_header,
            "date_header": self.date_header,
            # Only when set: the engine's default is no limit.
            **({"limit_concurrency": self.limit_concurrency} if self.limit_concurrency else {}),
            **self.tls_kwargs(),
        }

    @property
    def http_mode(self) -> str:
        """The HTTP versions spoken, "auto", "1" or "2": http, with http2=False meaning "1"."""
        return "1" if self.http2 is False else self.http

    @property
    def scheme(self) -> str:
        """"https" when the server speaks TLS, else "http"."""
        return "https" if self.ssl_certfile else "http"

    def tls_kwargs(self) -> dict[str, Any]:
        """The TLS keyword arguments of cyserve._core.Server (none without a certificate)."""
        if not self.ssl_certfile:
            return {}
        return {"ssl_certfile": self.ssl_certfile, "ssl_keyfile": self.ssl_keyfile,
                "ssl_keyfile_password": self.ssl_keyfile_password,
                "ssl_ciphers": self.ssl_ciphers, "ssl_ca_certs": self.ssl_ca_certs,
                "ssl_cert_reqs": int(self.ssl_cert_reqs),
                "ssl_sni": [parse_sni(entry) for entry in self.ssl_sni],
                "ssl_ocsp_file": self.ssl_ocsp_file,
                "ssl_ticket_rotation": int(self.ssl_ticket_rotation)}

    def _validate(self) -> None:
        if not isinstance(self.host, str) or not self.host or self.host != self.host.strip():
            raise ConfigError("host", repr(self.host), "must be a host name or an IP address")
        _check_int("port", self.port, 0, 65535)
        _check_int("threads", self.threads, 0, MAX_THREADS)
        _check_int("processes", self.processes, 1, MAX_PROCESSES)
        _check_int("blocking_threads", self.blocking_threads, 0, MAX_BLOCKING_THREADS)
        _check_int("body_budget", self.body_budget, 0, 1 << 40)
        _check_int("min_body_rate", self.min_body_rate, 0, 1 << 40)
        self._validate_http()
        _check_int("http2_max_concurrent_streams", self.http2_max_concurrent_streams, 1, 1 << 20)
        _check_int("ws_max_size", self.ws_max_size, 1, 1 << 40)
        for name in ("ws_ping_interval", "ws_ping_timeout"):
            if getattr(self, name) is not None:
                _check_seconds(name, getattr(self, name), allow_zero=True)
        if not isinstance(self.ws_per_message_deflate, bool):
            raise ConfigError("ws_per_message_deflate", repr(self.ws_per_message_deflate),
                              "must be True or False")
        self._validate_headers()
        self._validate_listen()
        self._validate_proxy()
        self._validate_recycling()
        _check_int("limit_concurrency", self.limit_concurrency, 0, 1 << 30)
        for name in ("reload", "preload"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, repr(getattr(self, name)), "must be True or False")
        if isinstance(self.reload_dirs, str):
            object.__setattr__(self, "reload_dirs", (self.reload_dirs,))
        object.__setattr__(self, "reload_dirs", tuple(self.reload_dirs))
        for d in self.reload_dirs:
            if not isinstance(d, str) or not os.path.isdir(d):
                raise ConfigError("reload_dirs", repr(d), "must be a folder")
        for name in ("reload_includes", "reload_excludes"):
            value = getattr(self, name)
            value = (value,) if isinstance(value, str) else tuple(value)
            object.__setattr__(self, name, value)
            for pattern in value:
                if not isinstance(pattern, str) or not pattern or "\0" in pattern:
                    raise ConfigError(name, repr(pattern), "must be a glob pattern such as "
                                      "'*.html' or 'templates/*'")
        _check_seconds("reload_delay", self.reload_delay, allow_zero=False)
        if self.proc_name is not None and (
                not isinstance(self.proc_name, str) or not self.proc_name.strip()
                or "\0" in self.proc_name):
            raise ConfigError("proc_name", repr(self.proc_name), "must be a non-empty name")
        if self.reload and self.port == 0 and not self._listens_elsewhere():
            raise ConfigError("reload", True, "needs a fixed port: a new worker must listen "
                              "where the one it replaces did")
        if self.log_config is not None:
            check_log_config(self.log_config)
        if self.pid is not None and (not isinstance(self.pid, str) or not self.pid
                                     or "\0" in self.pid):
            raise ConfigError("pid", repr(self.pid), "must be a file path")
        if self.health_path is not None and (
                not isinstance(self.health_path, str) or not self.health_path.startswith("/")
                or any(c.isspace() or c in "?#" for c in self.health_path)):
            raise ConfigError("health_path", repr(self.health_path),
                              "must be a path such as /healthz")
        if self.processes > 1 and self.port == 0 and not self._listens_elsewhere():
            raise ConfigError("processes", self.processes, "needs a fixed port: with port 0 "
                              "each process would listen on a port of its own")
        for name in _LIMITS:
            _check_int(name, getattr(self, name), _LIMIT_MINIMUM.get(name, 1),
                       _LIMIT_MAXIMUM[name])
        for name in _TIMEOUTS:
            _check_seconds(name, getattr(self, name), allow_zero=False)
        # 0 is meaningful here: do not wait for in-flight requests at all.
        _check_seconds("graceful_timeout", self.graceful_timeout, allow_zero=True)
        _check_seconds("drain_delay", self.drain_delay, allow_zero=True)
        if not isinstance(self.access_log, bool):
            raise ConfigError("access_log", repr(self.access_log), "must be True or False")
        if self.access_log_format not in ACCESS_LOG_FORMATS:
            # Else gunicorn's %(h)s atoms, compiled here so that a typo is a start-up error.
            if not isinstance(self.access_log_format, str) or "%" not in self.access_log_format:
                raise ConfigError("access_log_format", repr(self.access_log_format),
                                  "must be one of " + ", ".join(ACCESS_LOG_FORMATS))
            try:
                compile_access_log_format(self.access_log_format)
            except ValueError as e:
                raise ConfigError("access_log_format", repr(self.access_log_format),
                                  str(e)) from None
        if self.access_logfile is not None and (not isinstance(self.access_logfile, str)
                                                or not self.access_logfile):
            raise ConfigError("access_logfile", repr(self.access_logfile), "must be a file path")
        if self.interface not in INTERFACES:
            raise ConfigError("interface", repr(self.interface),
                              "must be one of " + ", ".join(INTERFACES))
        if self.asgi_loops not in ASGI_LOOPS:
            raise ConfigError("asgi_loops", repr(self.asgi_loops),
                              "must be one of " + ", ".join(ASGI_LOOPS))
        if self.lifespan not in LIFESPANS:
            raise ConfigError("lifespan", repr(self.lifespan),
                              "must be one of " + ", ".join(LIFESPANS))
        if self.loop not in LOOPS:
            raise ConfigError("loop", repr(self.loop), "must be one of " + ", ".join(LOOPS))
        if self.loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ConfigError("loop", "'uvloop'", "uvloop is not installed")
        if not isinstance(self.log_level, str) or self.log_level.lower() not in LOG_LEVELS:
            raise ConfigError("log_level", self.log_level,
                              "must be one of " + ", ".join(LOG_LEVELS))
        self._validate_tls()

    def _validate_http(self) -> None:
        if isinstance(self.http, int) and not isinstance(self.http, bool):
            object.__setattr__(self, "http", str(self.http))  # cyserve.run(http=2)
        if self.http not in HTTP_VERSIONS:
            raise ConfigError("http", repr(self.http), "must be one of " + ", ".join(HTTP_VERSIONS))
        if self.http2 is not None and not isinstance(self.http2, bool):
            raise ConfigError("http2", repr(self.http2), "must be True or False")
        if (self.http2, self.http) in ((False, "2"), (True, "1")):
            flag = "--http2" if self.http2 else "--no-http2"
            raise ConfigError("http", self.http, f"contradicts http2={self.http2} ({flag}): "
                              "give one of them (--http 1 is --no-http2)")

    def _validate_tls(self) -> None:
        # The files are only checked for being readable here: whether they hold a certificate
        # and its key (and the password opens the key) is OpenSSL's to say, when the server is
        # made (a ValueError naming the file).
        _check_int("ssl_cert_reqs", self.ssl_cert_reqs, 0, 2)
        if self.ssl_cert_reqs and not self.ssl_ca_certs:
            raise ConfigError("ssl_cert_reqs", self.ssl_cert_reqs,
                              "client certificates need ssl_ca_certs to verify them")
        _check_int("ssl_ticket_rotation", self.ssl_ticket_rotation, 1, 1 << 30)
        if isinstance(self.ssl_sni, str):
            object.__setattr__(self, "ssl_sni", (self.ssl_sni,))
        if not isinstance(self.ssl_sni, (tuple, list)):
            raise ConfigError("ssl_sni", repr(self.ssl_sni), "must be a list of NAME=CERTFILE"
                              "[,KEYFILE] entries")
        object.__setattr__(self, "ssl_sni", tuple(self.ssl_sni))
        sni_files = []
        for entry in self.ssl_sni:
            _name, cert, key = parse_sni(entry)  # ConfigError when malformed
            sni_files += [("ssl_sni", cert), ("ssl_sni", key)]
        for name in ("ssl_certfile", "ssl_keyfile", "ssl_keyfile_password", "ssl_ciphers",
                     "ssl_ca_certs", "ssl_ocsp_file"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or "\0" in value):
                raise ConfigError(name, repr(value) if name != "ssl_keyfile_password" else "***",
                                  "must be a string")
        if not self.ssl_certfile:
            for name in ("ssl_keyfile", "ssl_keyfile_password", "ssl_ciphers", "ssl_ca_certs",
                         "ssl_cert_reqs", "ssl_sni", "ssl_ocsp_file"):
                if getattr(self, name):
                    raise ConfigError(name, "(given)" if name == "ssl_keyfile_password"
                                      else getattr(self, name), "needs ssl_certfile")
            return
        files = [(name, getattr(self, name)) for name in ("ssl_certfile", "ssl_keyfile",
                                                          "ssl_ca_certs", "ssl_ocsp_file")]
        for name, path in files + sni_files:
            if path:
                try:
                    with open(path, "rb"):
                        pass
                except OSError as exc:
                    raise ConfigError(name, path, f"cannot read the file: {exc.strerror}") from None


    def trusted_proxies(self) -> str | None:
        """The peers whose proxy headers are believed, as the engine takes them, or None when
        proxy headers are off."""
        if not self.proxy_headers and self.forwarded_allow_ips is None and \
                not self.forwarded_host:
            return None
        if self.forwarded_allow_ips is not None:
            return self.forwarded_allow_ips
        return os.environ.get("FORWARDED_ALLOW_IPS", DEFAULT_FORWARDED_ALLOW_IPS)

    def proxy_protocol_peers(self) -> str | None:
        """The peers whose connections begin with a PROXY protocol header, as the engine takes
        them, or None when the PROXY protocol is off: proxy_allow_from, else
        forwarded_allow_ips, as for headers."""
        if not self.proxy_protocol:
            return None
        if self.proxy_allow_from is not None:
            return self.proxy_allow_from
        if self.forwarded_allow_ips is not None:
            return self.forwarded_allow_ips
        return os.environ.get("FORWARDED_ALLOW_IPS", DEFAULT_FORWARDED_ALLOW_IPS)

    @property
    def supervised(self) -> bool:
        """Whether a process supervisor runs the workers: for several processes, and for
        recycling (--max-requests), which needs a process to start the next worker."""
        return (self.processes > 1 or self.max_requests > 0 or self.max_lifetime > 0
                or self.worker_timeout > 0 or self.reload or self.drops_privileges
                or self.post_fork is not None or self.worker_exit is not None)

    @property
    def drops_privileges(self) -> bool:
        """Whether the workers switch to another user or group (user, group): then a supervisor
        runs them, having made every listening socket before (privileged ports included)."""
        return self.user is not None or self.group is not None

    def process_owner(self) -> tuple[int, int, str | None] | None:
        """(uid, gid, user name or None) that the workers switch to, or None: stay. Without a
        group, the user's own (its primary group); without a user, the current uid."""
        return resolve_owner(self.user, self.group) if self.drops_privileges else None

    @property
    def metrics_shards(self) -> int:
        """The metrics shards one serving process needs: one per scheduler thread (the
        workers, then the relief threads)."""
        return self.workers + self.blocking_threads

    def _validate_recycling(self) -> None:
        _check_seconds("worker_timeout", self.worker_timeout, allow_zero=True)
        if self.worker_timeout and self.worker_timeout < 1:
            raise ConfigError("worker_timeout", self.worker_timeout,
                              "must be 0 (never) or at least 1 second")
        if self.worker_timeout and self.port == 0 and not self._listens_elsewhere():
            raise ConfigError("worker_timeout", self.worker_timeout, "needs a fixed port: a "
                              "new worker must listen where the one it replaces did")
        if self.metrics_bind is not None:
            a = parse_bind(self.metrics_bind, "metrics_bind") \
                if isinstance(self.metrics_bind, str) else None
            if a is None or a.kind != "tcp":
                raise ConfigError("metrics_bind", repr(self.metrics_bind),
                                  "must be HOST:PORT or [V6]:PORT")
        _check_int("max_requests", self.max_requests, 0, 1 << 62)
        _check_int("max_requests_jitter", self.max_requests_jitter, 0, 1 << 62)
        _check_seconds("max_lifetime", self.max_lifetime, allow_zero=True)
        _check_seconds("max_lifetime_jitter", self.max_lifetime_jitter, allow_zero=True)
        if self.max_lifetime and self.max_lifetime < 1:
            raise ConfigError("max_lifetime", self.max_lifetime,
                              "must be 0 (never) or at least 1 second")
        for name in ("max_requests", "max_lifetime"):
            value = getattr(self, name)
            if not value:
                continue
            if self.port == 0 and not self._listens_elsewhere():
                raise ConfigError(name, value, "needs a fixed port: a new worker must listen "
                                  "where the one it replaces did")
            for b in self.bind:
                a = parse_bind(b)
                if a.kind == "tcp" and a.port == 0:
                    raise ConfigError(name, value, f"needs fixed ports: {a.url()} would change "
                                      "with each new worker")

    def _validate_proxy(self) -> None:
        if not isinstance(self.proxy_headers, bool):
            raise ConfigError("proxy_headers", repr(self.proxy_headers), "must be True or False")
        if not isinstance(self.forwarded_host, bool):
            raise ConfigError("forwarded_host", repr(self.forwarded_host), "must be True or False")
        if self.forwarded_header not in FORWARDED_HEADERS:
            raise ConfigError("forwarded_header", repr(self.forwarded_header),
                              "must be one of " + ", ".join(FORWARDED_HEADERS))
        if not isinstance(self.proxy_protocol, bool):
            raise ConfigError("proxy_protocol", repr(self.proxy_protocol),
                              "must be True or False")
        if self.proxy_allow_from is not None:
            check_forwarded_allow_ips("proxy_allow_from", self.proxy_allow_from)
        elif self.proxy_protocol and self.forwarded_allow_ips is None and \
                "FORWARDED_ALLOW_IPS" in os.environ:
            check_forwarded_allow_ips("forwarded_allow_ips", os.environ["FORWARDED_ALLOW_IPS"])
        if self.forwarded_allow_ips is not None:
            check_forwarded_allow_ips("forwarded_allow_ips", self.forwarded_allow_ips)
        elif (self.proxy_headers or self.forwarded_host) and "FORWARDED_ALLOW_IPS" in os.environ:
            check_forwarded_allow_ips("forwarded_allow_ips", os.environ["FORWARDED_ALLOW_IPS"])
        check_root_path(self.root_path)
        if self.umask is not None:
            _check_int("umask", self.umask, 0, 0o777)
        if self.drops_privileges:
            resolve_owner(self.user, self.group)  # ConfigError when it cannot be done
        for name in HOOKS:
            if getattr(self, name) is not None:
                check_hook(name, getattr(self, name))

    def _listens_elsewhere(self) -> bool:
        """Whether bind, uds or fd replace host and port."""
        return bool(self.bind) or self.uds is not None or self.fd is not None

    def _validate_headers(self) -> None:
        for name in ("server_header", "date_header"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, repr(getattr(self, name)), "must be True or False")
        raw = self.headers
        if isinstance(raw, (str, bytes)) or not isinstance(raw, (list, tuple)):
            raise ConfigError("headers", repr(raw), "must be a list of (name, value) pairs or "
                              "'Name: value' strings")
        object.__setattr__(self, "headers", tuple(parse_header(h) for h in raw))
        servers = [n for n, _ in self.headers if n.lower() == "server"]
        if len(servers) > 1:
            raise ConfigError("headers", "Server", "given twice: Server is one field "
                              "(RFC 9110 10.2.4)")

    def _validate_listen(self) -> None:
        if isinstance(self.bind, str):  # bind="0.0.0.0:80": one address, not its characters
            object.__setattr__(self, "bind", (self.bind,))
        if not isinstance(self.bind, (tuple, list)):
            raise ConfigError("bind", repr(self.bind), "must be a list of addresses")
        object.__setattr__(self, "bind", tuple(self.bind))
        addresses = [parse_bind(b) for b in self.bind]
        if self.uds is not None:
            if not isinstance(self.uds, str) or not self.uds:
                raise ConfigError("uds", repr(self.uds), "must be a socket path")
            check_uds_path("uds", self.uds, self.uds)
            addresses.append(parse_bind("unix:" + self.uds, "uds"))
        if self.uds_perms is not None:
            _check_int("uds_perms", self.uds_perms, 0, 0o777)
            if not any(a.kind == "unix" for a in addresses):
                raise ConfigError("uds_perms", oct(self.uds_perms),
                                  "applies to a Unix socket: give --uds or --bind unix:PATH")
        if self.fd is not None:
            _check_int("fd", self.fd, 0, 1 << 30)
        paths = [a.path for a in addresses if a.kind == "unix"]
        if len(paths) != len(set(paths)):
            raise ConfigError("bind", ", ".join(self.bind), "names a Unix socket twice")
        if self.processes > 1:
            for a in addresses:
                if a.kind == "tcp" and a.port == 0:
                    raise ConfigError("processes", self.processes,
                                      f"needs fixed ports: {a.url()} would be a port of its "
                                      "own in each process")


# A root path's characters: RFC 3986's pchar without '%' (so that the path and the raw path
# spell it alike), in segments each after a '/'.
_ROOT_PATH = re.compile(r"(/[A-Za-z0-9\-._~!$&'()*+,;=:@]+)+")


# A field name (RFC 9110 5.6.2's token).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Fields the engine writes itself, from the answer's framing or its own clock.
_ENGINE_FIELDS = ("content-length", "transfer-encoding", "connection", "date")


def parse_header(item: object) -> tuple[str, str]:
    """One --header: a (name, value) pair or a "Name: value" string (the value's surrounding
    blanks dropped), checked: ConfigError for a name that is not a token, a CR, LF or NUL in
    the value (it would split the response), or a field the engine writes itself."""
    if isinstance(item, str):
        name, sep, value = item.partition(":")
        if not sep:
            raise ConfigError("headers", repr(item), "must be NAME:VALUE, e.g. "
                              "'X-Frame-Options: DENY'")
        value = value.strip(" \t")
    elif isinstance(item, (list, tuple)) and len(item) == 2 and all(
            isinstance(v, str) for v in item):
        name, value = item
    else:
        raise ConfigError("headers", repr(item), "must be a (name, value) pair of strings or a "
                          "'Name: value' string")
    if not _TOKEN.fullmatch(name):
        raise ConfigError("headers", repr(name), "is not a valid header name (letters, digits "
                          "and !#$%&'*+-.^_`|~, no spaces)")
    if any(c in value for c in "\r\n\0"):
        raise ConfigError("headers", repr(value), f"header {name!r}: a CR, LF or NUL in its "
                          "value would split the response")
    if name.lower() in _ENGINE_FIELDS:
        raise ConfigError("headers", repr(name), "is written by the server itself"
                          + (" (--no-date-header turns Date off)" if name.lower() == "date"
                             else ""))
    return name, value


def check_root_path(value: object) -> None:
    """ConfigError unless value is "" or a path such as /api: it begins with '/', does not end
    with one, and holds no character a path would have to percent-encode."""
    if not isinstance(value, str):
        raise ConfigError("root_path", repr(value), "must be a path such as /api")
    if value == "":
        return
    if not value.startswith("/"):
        raise ConfigError("root_path", repr(value), "must begin with '/', e.g. /api")
    if value.endswith("/"):
        raise ConfigError("root_path", repr(value), "must not end with '/' (/api, not /api/; "
                          "an empty value for none)")
    if not _ROOT_PATH.fullmatch(value):
        raise ConfigError("root_path", repr(value), "must be path segments of letters, digits "
                          "and -._~!$&'()*+,;=:@ (no empty segment, no '%', '?' or '#')")


def resolve_owner(user: object, group: object) -> tuple[int, int, str | None]:
    """(uid, gid, user name or None) for a user and a group given as names or ids (an id may
    be a string of digits); None keeps the current one, but a user alone brings its primary
    group. ConfigError for an unknown name, or when switching needs root and this process is
    not root."""
    import grp
    import pwd

    name: str | None = None
    uid, gid = os.getuid(), os.getgid()
    if user is not None:
        if isinstance(user, bool) or not isinstance(user, (str, int)) or user == "":
            raise ConfigError("user", repr(user), "must be a user name or id")
        try:
            entry = pwd.getpwuid(int(user)) if isinstance(user, int) or user.isdigit() \
                else pwd.getpwnam(user)
        except KeyError:
            if isinstance(user, int) or user.isdigit():
                entry = None  # an id without a name is allowed, as with chown
                uid = int(user)
            else:
                raise ConfigError("user", user, "no such user") from None
        if entry is not None:
            uid, gid, name = entry.pw_uid, entry.pw_gid, entry.pw_name
    if group is not None:
        if isinstance(group, bool) or not isinstance(group, (str, int)) or group == "":
            raise ConfigError("group", repr(group), "must be a group name or id")
        if isinstance(group, int) or group.isdigit():
            gid = int(group)
        else:
            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise ConfigError("group", group, "no such group") from None
    for value, what in ((uid, "user"), (gid, "group")):
        if not 0 <= value < 2**32 - 1:
            raise ConfigError(what, value, "must be an id between 0 and 4294967294")
    if os.geteuid() != 0 and (uid != os.geteuid() or gid != os.getegid()):
        which = "user" if user is not None and uid != os.geteuid() else "group"
        raise ConfigError(which, user if which == "user" else group,
                          f"switching to another {which} needs root (this process runs as uid "
                          f"{os.geteuid()}, gid {os.getegid()})")
    return uid, gid, name


def check_log_config(path: object) -> None:
    """ConfigError unless ``path`` is a readable logging configuration cyserve can load: YAML
    needs PyYAML (not a dependency of cyserve)."""
    if not isinstance(path, str) or not path:
        raise ConfigError("log_config", repr(path), "must be a file path")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError("log_config", path, f"cannot read the file: {exc.strerror}") from None
    if path.endswith((".yaml", ".yml")) and importlib.util.find_spec("yaml") is None:
        raise ConfigError("log_config", path, "a YAML file needs PyYAML (pip install pyyaml); "
                          "or give the same dictionary as JSON")


# Whose proxy headers are believed when --proxy-headers gives no list: uvicorn's default.
DEFAULT_FORWARDED_ALLOW_IPS = "127.0.0.1"


def check_forwarded_allow_ips(name: str, value: object) -> None:
    """ConfigError unless value is a comma-separated list of IP addresses, CIDR networks or *."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(name, repr(value), "must list addresses or networks (CIDR), or *")
    for item in value.split(","):
        item = item.strip()
        if item == "*":
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise ConfigError(name, value, f"{item!r} is not an IP address or network "
                                           "(10.0.0.0/8, ::1, or * for every peer)") from None


def parse_sni(entry: object) -> tuple[str, str, str | None]:
    """One ssl_sni entry, "NAME=CERTFILE[,KEYFILE]" (--ssl-sni), as (name, certfile, keyfile
    or None); ConfigError when it is not one."""
    if not isinstance(entry, str) or "\0" in entry:
        raise ConfigError("ssl_sni", repr(entry), "must be a NAME=CERTFILE[,KEYFILE] string")
    name, eq, files = entry.partition("=")
    cert, _, key = files.partition(",")
    name = name.strip()
    if not eq or not name or not cert:
        raise ConfigError("ssl_sni", entry, "must be NAME=CERTFILE[,KEYFILE] (a host name or "
                          "*.domain, then its certificate and, unless in it, its key)")
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-.")
    bare = name[2:] if name.startswith("*.") else name
    if not bare or not set(bare.lower()) <= allowed:
        raise ConfigError("ssl_sni", entry, f"{name!r} is not a host name (or *.domain)")
    return name.lower(), cert, key or None


def _check_int(name: str, value: object, low: int, high: int | None) -> None:
    # bool is an int subclass, but `threads=True` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, repr(value), "must be an integer")
    if high is None and value < low:
        raise ConfigError(name, value, f"must be at least {low}")
    if high is not None and not low <= value <= high:
        raise ConfigError(name, value, f"must be between {low} and {high}")


def _check_seconds(name: str, value: object, *, allow_zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, repr(value), "must be a number of seconds")
    if not math.isfinite(value):
        raise ConfigError(name, value, "must be a finite number of seconds")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(name, value, "must be at least 0" if allow_zero else "must be positive")
    if value > MAX_SECONDS:
        raise ConfigError(name, value, f"must be at most {MAX_SECONDS} seconds (30 days)")
