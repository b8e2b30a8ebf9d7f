"""cyserve.config.Config: defaults, and a ConfigError naming the option and value for each
kind of bad value."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

from cyserve.config import MAX_THREADS, Config, available_cpus
from cyserve.errors import ConfigError


def test_defaults_are_those_of_the_issue() -> None:
    c = Config()
    assert (c.host, c.port, c.threads, c.backlog) == ("127.0.0.1", 8000, 0, 1024)
    assert (c.max_header_bytes, c.max_target_bytes, c.max_headers, c.max_body_bytes) == (
        8192, 8192, 100, 1048576)
    assert (c.keepalive_timeout, c.header_timeout, c.body_timeout) == (5.0, 10.0, 10.0)
    assert c.graceful_timeout == 5.0
    assert c.log_level == "info"
    assert c.blocking_threads == 16
    assert (c.http, c.http2, c.http_mode, c.http2_max_concurrent_streams) == (
        "auto", None, "auto", 100)
    assert (c.asgi_loops, c.lifespan) == ("auto", "auto")


def test_server_kwargs_match_the_engine_contract() -> None:
    c = Config(port=0, threads=3, keepalive_timeout=2)
    assert c.server_kwargs() == {
        "host": "127.0.0.1", "port": 0, "threads": 3, "blocking_threads": 16, "backlog": 1024,
        "max_header_bytes": 8192, "max_target_bytes": 8192, "max_headers": 100,
        "max_body_bytes": 1048576, "keepalive_timeout": 2.0, "header_timeout": 10.0,
        "body_timeout": 10.0, "shared_port": False, "access_log": False,
        "access_log_format": "common",
        "body_budget": 64 << 20, "min_body_rate": 500,
        "http2": True, "http": "auto", "http2_max_concurrent_streams": 100,
        "ws_max_size": 16 << 20, "ws_ping_interval": 20.0, "ws_ping_timeout": 20.0,
        "ws_per_message_deflate": True, "headers": (), "server_header": True,
        "date_header": True,
    }
    assert isinstance(c.server_kwargs()["keepalive_timeout"], float)
    # Set only by the process supervisor for its workers (cyserve/supervisor.py).
    assert c.replace(processes=2, port=8000, shared_port=True).server_kwargs()["shared_port"]


def test_zero_threads_means_the_cpus_this_process_may_use() -> None:
    assert Config(threads=0).workers == len(os.sched_getaffinity(0)) == available_cpus()
    assert Config(threads=5).workers == 5
    assert Config(threads=0).server_kwargs()["threads"] == available_cpus()


@pytest.mark.parametrize(("cpus", "processes", "threads", "workers"), [
    (2, 1, 0, 2),  # one process: a thread per CPU, as before
    (2, 2, 0, 1),  # as many processes as CPUs: gunicorn's single-threaded sync workers
    (2, 5, 0, 1),  # more processes than CPUs: still one thread each, never none
    (16, 4, 0, 4),  # fewer: the CPUs shared out, so that GIL-free routes use every core
    (16, 3, 0, 5),
    (2, 2, 2, 2),  # --threads says otherwise: it wins
    (16, 4, 1, 1),
])
def test_zero_threads_shares_the_cpus_among_the_processes(
        monkeypatch: pytest.MonkeyPatch, cpus: int, processes: int, threads: int,
        workers: int) -> None:
    monkeypatch.setattr("cyserve.config.available_cpus", lambda: cpus)
    c = Config(threads=threads, processes=processes)
    assert c.workers == workers
    assert c.server_kwargs()["threads"] == workers


@pytest.mark.parametrize(("option", "value", "message"), [
    ("port", -1, "invalid port -1: must be between 0 and 65535"),
    ("ws_max_size", 0, "invalid ws_max_size 0: must be between 1 and 1099511627776"),
    ("ws_ping_interval", -1, "invalid ws_ping_interval -1: must be at least 0"),
    ("ws_ping_timeout", "5", "invalid ws_ping_timeout '5': must be a number of seconds"),
    ("ws_per_message_deflate", 1,
     "invalid ws_per_message_deflate 1: must be True or False"),
    ("port", 65536, "invalid port 65536: must be between 0 and 65535"),
    ("port", "80", "invalid port '80': must be an integer"),
    ("port", 80.0, "invalid port 80.0: must be an integer"),
    ("threads", -1, "invalid threads -1: must be between 0 and 1024"),
    ("access_log", "yes", "invalid access_log 'yes': must be True or False"),
    ("access_log_format", "apache",
     "invalid access_log_format 'apache': must be one of common, combined, json"),
    ("access_logfile", "", "invalid access_logfile '': must be a file path"),
    ("forwarded_header", "both", "invalid forwarded_header 'both': must be one of x-forwarded, "
     "forwarded"),
    ("processes", 0, "invalid processes 0: must be between 1 and 256"),
    ("threads", MAX_THREADS + 1, "invalid threads 1025: must be between 0 and 1024"),
    ("threads", True, "invalid threads True: must be an integer"),
    ("backlog", 0, "invalid backlog 0: must be between 1 and 65535"),
    ("max_header_bytes", 63, "invalid max_header_bytes 63: must be between 64 and 1048576"),
    ("max_target_bytes", -5, "invalid max_target_bytes -5: must be between 1 and 1048576"),
    ("max_headers", 0, "invalid max_headers 0: must be between 1 and 10000"),
    ("max_body_bytes", 0, "invalid max_body_bytes 0: must be between 1 and 1099511627776"),
    # Values the engine's C types cannot hold used to end in a traceback (OverflowError) or, for
    # timeouts, wrap to 0 nanoseconds: "close at once" for a user who meant "never".
    ("backlog", 99999999999, "invalid backlog 99999999999: must be between 1 and 65535"),
    ("max_header_bytes", 3000000000,
     "invalid max_header_bytes 3000000000: must be between 64 and 1048576"),
    ("max_body_bytes", 10**23,
     "invalid max_body_bytes 100000000000000000000000: must be between 1 and 1099511627776"),
    ("keepalive_timeout", 1e12,
     "invalid keepalive_timeout 1000000000000.0: must be at most 2592000 seconds (30 days)"),
    ("graceful_timeout", 1e300,
     "invalid graceful_timeout 1e+300: must be at most 2592000 seconds (30 days)"),
    ("keepalive_timeout", 0, "invalid keepalive_timeout 0: must be positive"),
    ("header_timeout", -1.5, "invalid header_timeout -1.5: must be positive"),
    ("body_timeout", math.inf, "invalid body_timeout inf: must be a finite number of seconds"),
    ("body_timeout", math.nan, "invalid body_timeout nan: must be a finite number of seconds"),
    ("body_timeout", "10", "invalid body_timeout '10': must be a number of seconds"),
    ("graceful_timeout", -0.1, "invalid graceful_timeout -0.1: must be at least 0"),
    ("log_level", "loud", "invalid log_level loud: must be one of critical, error, warning, "
                          "info, debug"),
    ("host", "", "invalid host '': must be a host name or an IP address"),
    ("host", " 127.0.0.1", "invalid host ' 127.0.0.1': must be a host name or an IP address"),
    ("host", None, "invalid host None: must be a host name or an IP address"),
    ("lifespan", "yes", "invalid lifespan 'yes': must be one of auto, on, off"),
    ("asgi_loops", "worker", "invalid asgi_loops 'worker': must be one of auto, process, thread"),
])
def test_bad_values_name_the_option_and_the_value(option: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config(**{option: value})
    assert str(info.value) == message
    assert info.value.option == option
    assert isinstance(info.value, ValueError)


def test_the_cli_spelling_of_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        Config(max_body_bytes=0)
    assert info.value.for_cli() == ("invalid --max-body-bytes 0: must be between 1 and "
                                    "1099511627776")


@pytest.mark.parametrize(("option", "value"), [
    ("port", 0), ("port", 65535), ("threads", 1024), ("graceful_timeout", 0),
    ("keepalive_timeout", 0.001), ("body_timeout", 2592000), ("max_body_bytes", 1 << 40),
    ("max_headers", 10000), ("backlog", 65535), ("host", "::1"), ("host", "localhost"),
    ("log_level", "DEBUG"),
])
def test_edge_values_that_are_fine(option: str, value: Any) -> None:
    assert getattr(Config(**{option: value}), option) == value


def test_from_options_rejects_unknown_names() -> None:
    with pytest.raises(ConfigError, match=r"invalid keepalive 3: unknown option \(known: "):
        Config.from_options(keepalive=3)
    assert Config.from_options(port=1, threads=2).port == 1


def test_replace_validates_again() -> None:
    c = Config()
    assert c.replace(port=9000).port == 9000
    with pytest.raises(ConfigError, match="invalid port 70000"):
        c.replace(port=70000)


def test_config_is_immutable() -> None:
    c = Config()
    with pytest.raises(AttributeError):
        c.port = 1  # type: ignore[misc]


@pytest.mark.parametrize("options, needle", [
    ({"metrics_bind": "unix:/tmp/m.sock"}, "metrics_bind"),
    ({"metrics_bind": "nohostport:"}, "metrics_bind"),
    ({"metrics_bind": 9100}, "metrics_bind"),
    ({"worker_timeout": 0.5, "port": 8000}, "worker_timeout"),
    ({"worker_timeout": -1}, "worker_timeout"),
    ({"worker_timeout": 30, "port": 0}, "worker_timeout"),
    ({"proxy_protocol": "yes"}, "proxy_protocol"),
])
def test_operations_options_are_checked(options: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        Config(**options)


def test_operations_options() -> None:
    c = Config(metrics_bind="127.0.0.1:9100", worker_timeout=30, threads=3, blocking_threads=5)
    assert c.supervised  # the supervisor watches the heartbeats
    assert c.metrics_shards == 8  # a shard per scheduler thread: workers, then relief threads
    assert Config().proxy_protocol_peers() is None
    assert Config(proxy_protocol=True, forwarded_allow_ips="10.0.0.0/8") \
        .proxy_protocol_peers() == "10.0.0.0/8"
    assert Config(proxy_protocol=True).trusted_proxies() is None  # headers stay off


def test_proxy_allow_from_names_the_proxy_protocols_peers_alone() -> None:
    # gunicorn's --proxy-allow-from: the PROXY protocol's list, before forwarded_allow_ips ...
    c = Config(proxy_protocol=True, proxy_allow_from="10.0.0.0/8",
               forwarded_allow_ips="192.168.0.1")
    assert (c.proxy_protocol_peers(), c.trusted_proxies()) == ("10.0.0.0/8", "192.168.0.1")
    # ... and, unlike it, it does not turn proxy headers on.
    c = Config(proxy_protocol=True, proxy_allow_from="*")
    assert (c.proxy_protocol_peers(), c.trusted_proxies()) == ("*", None)
    assert Config(proxy_allow_from="*").proxy_protocol_peers() is None  # no protocol, no peers
    with pytest.raises(ConfigError, match="proxy_allow_from"):
        Config(proxy_protocol=True, proxy_allow_from="not an address")


@pytest.mark.parametrize("options, mode", [
    ({}, "auto"), ({"http": "1"}, "1"), ({"http": 2}, "2"), ({"http": "auto"}, "auto"),
    ({"http2": False}, "1"), ({"http2": True}, "auto"), ({"http2": True, "http": "2"}, "2"),
    ({"http2": False, "http": "1"}, "1"), ({"http2": False, "http": "auto"}, "1"),
])
def test_http_versions_and_the_older_http2_spelling(options: dict[str, Any], mode: str) -> None:
    """--http 1|2|auto (granian's spelling) and --http2/--no-http2 (kept): the engine gets one
    mode, HTTP/2 off only for "1"."""
    c = Config(**options)
    assert c.http_mode == mode
    assert (c.server_kwargs()["http"], c.server_kwargs()["http2"]) == (mode, mode != "1")


@pytest.mark.parametrize("options, message", [
    ({"http2": False, "http": "2"}, "invalid http 2: contradicts http2=False (--no-http2)"),
    ({"http2": True, "http": 1}, "invalid http 1: contradicts http2=True (--http2)"),
    ({"http": "3"}, "invalid http '3': must be one of auto, 1, 2"),
    ({"http": "h2"}, "invalid http 'h2': must be one of auto, 1, 2"),
    ({"http2": "yes"}, "invalid http2 'yes': must be True or False"),
])
def test_contradicting_http_options_are_an_error(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        Config(**options)
    assert str(e.value).startswith(message)
