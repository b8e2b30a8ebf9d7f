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
import math
import os
from dataclasses import dataclass, fields
from typing import Any

from .errors import ConfigError

__all__ = ["Config", "INTERFACES", "LOG_LEVELS", "MAX_PROCESSES", "MAX_THREADS",
           "available_cpus"]

# More workers than this is a typing mistake rather than a machine: every worker owns a thread,
# an epoll instance and a listening socket.
MAX_THREADS = 1024

# Worker processes: each is a whole interpreter and server; more than this is a mistake.
MAX_PROCESSES = 256
# The scheduler's limit on relief threads (SCHED_MAX_RELIEF in csrc/sched.h).
MAX_BLOCKING_THREADS = 1024

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")

# What the object served is (app.as_app): "auto" tells a cyserve.App from a WSGI callable.
INTERFACES = ("auto", "cyserve", "wsgi")

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
    threads: int = 0  # 0: one worker per CPU available to the process
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
    graceful_timeout: float = 5.0  # on shutdown, in-flight requests get this long to finish
    log_level: str = "info"
    access_log: bool = False  # one line per response on standard output (csrc/access_log.c)
    interface: str = "auto"  # a cyserve.App, a WSGI application, or "auto": whichever it is
    # TLS (csrc/tls.c), with uvicorn's and gunicorn's names: a certificate file turns it on.
    ssl_certfile: str | None = None  # PEM: the certificate, then its chain
    ssl_keyfile: str | None = None  # PEM private key; None: it is in ssl_certfile
    ssl_keyfile_password: str | None = dataclasses.field(default=None, repr=False)
    ssl_ciphers: str | None = None  # OpenSSL cipher list for TLS 1.2; None: OpenSSL's defaults
    ssl_ca_certs: str | None = None  # PEM: the CAs that client certificates are verified against
    ssl_cert_reqs: int = 0  # client certificates: 0 none, 1 optional, 2 required (ssl.CERT_*)
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
        """The number of worker threads to start: threads, or the CPUs available when 0."""
        return self.threads if self.threads > 0 else available_cpus()

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
            "access_log": self.access_log,
            "max_header_bytes": self.max_header_bytes,
            "max_target_bytes": self.max_target_bytes,
            "max_headers": self.max_headers,
            "max_body_bytes": self.max_body_bytes,
            "keepalive_timeout": float(self.keepalive_timeout),
            "header_timeout": float(self.header_timeout),
            "body_timeout": float(self.body_timeout),
            **self.tls_kwargs(),
        }

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
                "ssl_cert_reqs": int(self.ssl_cert_reqs)}

    def _validate(self) -> None:
        if not isinstance(self.host, str) or not self.host or self.host != self.host.strip():
            raise ConfigError("host", repr(self.host), "must be a host name or an IP address")
        _check_int("port", self.port, 0, 65535)
        _check_int("threads", self.threads, 0, MAX_THREADS)
        _check_int("processes", self.processes, 1, MAX_PROCESSES)
        _check_int("blocking_threads", self.blocking_threads, 0, MAX_BLOCKING_THREADS)
        if self.processes > 1 and self.port == 0:
            raise ConfigError("processes", self.processes, "needs a fixed port: with port 0 "
                              "each process would listen on a port of its own")
        for name in _LIMITS:
            _check_int(name, getattr(self, name), _LIMIT_MINIMUM.get(name, 1),
                       _LIMIT_MAXIMUM[name])
        for name in _TIMEOUTS:
            _check_seconds(name, getattr(self, name), allow_zero=False)
        # 0 is meaningful here: do not wait for in-flight requests at all.
        _check_seconds("graceful_timeout", self.graceful_timeout, allow_zero=True)
        if not isinstance(self.access_log, bool):
            raise ConfigError("access_log", repr(self.access_log), "must be True or False")
        if self.interface not in INTERFACES:
            raise ConfigError("interface", repr(self.interface),
                              "must be one of " + ", ".join(INTERFACES))
        if not isinstance(self.log_level, str) or self.log_level.lower() not in LOG_LEVELS:
            raise ConfigError("log_level", self.log_level,
                              "must be one of " + ", ".join(LOG_LEVELS))
        self._validate_tls()

    def _validate_tls(self) -> None:
        # The files are only checked for being readable here: whether they hold a certificate
        # and its key (and the password opens the key) is OpenSSL's to say, when the server is
        # made (a ValueError naming the file).
        _check_int("ssl_cert_reqs", self.ssl_cert_reqs, 0, 2)
        if self.ssl_cert_reqs and not self.ssl_ca_certs:
            raise ConfigError("ssl_cert_reqs", self.ssl_cert_reqs,
                              "client certificates need ssl_ca_certs to verify them")
        for name in ("ssl_certfile", "ssl_keyfile", "ssl_keyfile_password", "ssl_ciphers",
                     "ssl_ca_certs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or "\0" in value):
                raise ConfigError(name, repr(value) if name != "ssl_keyfile_password" else "***",
                                  "must be a string")
        if not self.ssl_certfile:
            for name in ("ssl_keyfile", "ssl_keyfile_password", "ssl_ciphers", "ssl_ca_certs",
                         "ssl_cert_reqs"):
                if getattr(self, name):
                    raise ConfigError(name, "(given)" if name == "ssl_keyfile_password"
                                      else getattr(self, name), "needs ssl_certfile")
            return
        for name in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
            path = getattr(self, name)
            if path:
                try:
                    with open(path, "rb"):
                        pass
                except OSError as exc:
                    raise ConfigError(name, path, f"cannot read the file: {exc.strerror}") from None


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
