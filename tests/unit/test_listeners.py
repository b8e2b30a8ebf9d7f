"""Addresses as the options spell them (cyserve/listeners.py) and their checks in Config."""

from __future__ import annotations

import pytest

from cyserve.config import Config
from cyserve.errors import ConfigError
from cyserve.listeners import Address, Listeners, parse_bind, systemd_fds


@pytest.mark.parametrize("spec, want", [
    ("127.0.0.1:8080", Address("tcp", host="127.0.0.1", port=8080)),
    ("0.0.0.0", Address("tcp", host="0.0.0.0", port=8000)),
    ("localhost:0", Address("tcp", host="localhost", port=0)),
    ("[::]:80", Address("tcp", host="::", port=80)),
    ("[::1]", Address("tcp", host="::1", port=8000)),
    ("unix:/run/app.sock", Address("unix", path="/run/app.sock")),
    ("unix:rel.sock", Address("unix", path="rel.sock")),
    ("fd://3", Address("fd", fd=3)),
])
def test_parse_bind(spec: str, want: Address) -> None:
    assert parse_bind(spec) == want


@pytest.mark.parametrize("spec", ["", " 1.2.3.4:80", ":80", "h:", "h:x", "h:70000", "::1:80",
                                  "[::1", "[]:80", "[::1]x", "[::1]:", "unix:", "fd://",
                                  "fd://-1", "unix:/" + "x" * 120])
def test_parse_bind_refuses(spec: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_bind(spec)
    assert e.value.option == "bind"


def test_urls() -> None:
    assert parse_bind("[::1]:80").url() == "http://[::1]:80"
    assert parse_bind("h:0").url(4242) == "http://h:4242"
    assert parse_bind("unix:/a").url() == "unix:/a"
    assert parse_bind("fd://4").url() == "fd://4"


def test_systemd_fds_only_for_this_process() -> None:
    assert systemd_fds({"LISTEN_PID": "42", "LISTEN_FDS": "2"}, pid=42) == [3, 4]
    assert systemd_fds({"LISTEN_PID": "41", "LISTEN_FDS": "2"}, pid=42) == []
    assert systemd_fds({"LISTEN_FDS": "2"}, pid=42) == []
    assert systemd_fds({"LISTEN_PID": "42", "LISTEN_FDS": "0"}, pid=42) == []
    assert systemd_fds({"LISTEN_PID": "42", "LISTEN_FDS": "x"}, pid=42) == []


def test_config_addresses_replace_host_and_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LISTEN_PID", raising=False)
    assert Listeners.for_config(Config()).default
    lst = Listeners.for_config(Config(bind=("127.0.0.1:1", "unix:/tmp/s"), uds="/tmp/u", fd=7))
    assert not lst.default
    assert [a.url() for a in lst.addresses] == ["http://127.0.0.1:1", "unix:/tmp/s",
                                                 "unix:/tmp/u", "fd://7"]
    assert Config(bind="127.0.0.1:9").bind == ("127.0.0.1:9",)  # one address, not characters


def test_config_uses_systemd_sockets_only_without_explicit_addresses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    monkeypatch.setenv("LISTEN_FDS", "2")
    lst = Listeners.for_config(Config())
    assert [a.url() for a in lst.addresses] == ["fd://3", "fd://4"] and lst.systemd
    assert [a.url() for a in Listeners.for_config(Config(uds="/tmp/x")).addresses] == \
        ["unix:/tmp/x"]


@pytest.mark.parametrize("options, option", [
    ({"bind": ("nope:x",)}, "bind"),
    ({"bind": 5}, "bind"),
    ({"uds": ""}, "uds"),
    ({"uds": "/tmp/a", "uds_perms": 0o1777}, "uds_perms"),
    ({"uds_perms": 0o600}, "uds_perms"),
    ({"fd": -1}, "fd"),
    ({"fd": True}, "fd"),
    ({"bind": ("unix:/a",), "uds": "/a"}, "bind"),
    ({"bind": ("127.0.0.1:0",), "processes": 2}, "processes"),
])
def test_config_refuses(options: dict[str, object], option: str) -> None:
    with pytest.raises(ConfigError) as e:
        Config.from_options(**options)
    assert e.value.option == option


def test_processes_with_only_a_unix_socket_need_no_port() -> None:
    assert Config(port=0, processes=2, uds="/tmp/x").processes == 2


def test_proxy_headers_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    assert Config().trusted_proxies() is None
    assert Config(proxy_headers=True).trusted_proxies() == "127.0.0.1"
    assert Config(forwarded_allow_ips="10.0.0.0/8,::1").trusted_proxies() == "10.0.0.0/8,::1"
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "192.168.0.0/16")
    assert Config(proxy_headers=True).trusted_proxies() == "192.168.0.0/16"
    assert Config().trusted_proxies() is None  # the variable alone turns nothing on


@pytest.mark.parametrize("value", ["", "proxy.local", "10.0.0.0/33", "1.2.3.4,,", 7])
def test_forwarded_allow_ips_refused(value: object) -> None:
    with pytest.raises(ConfigError) as e:
        Config.from_options(forwarded_allow_ips=value)
    assert e.value.option == "forwarded_allow_ips"
