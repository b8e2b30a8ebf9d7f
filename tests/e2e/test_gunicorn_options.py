"""gunicorn's spellings of options cyserve has under other names, and the process settings a
gunicorn user sets (--chdir, --umask, --user/--group, --env-file), each through a served
process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from _served import TIMEOUT, Served, free_port
from _rawhttp import request as raw_request
from cyserve import cli

pytestmark = pytest.mark.native


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.close()


def _cyserve(tmp: Path, *args: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cyserve", *args], cwd=tmp, text=True,
                          capture_output=True, timeout=TIMEOUT,
                          env=dict(os.environ, **(env or {})))


def test_gunicorn_limit_spellings_set_the_limits() -> None:
    parser = cli.build_parser()
    c = cli.config_from_args(parser.parse_args(
        ["m:app", "--limit-request-line", "100", "--limit-request-fields", "7",
         "--limit-request-field_size", "300"]))
    assert (c.max_target_bytes, c.max_headers, c.max_header_bytes) == (100, 7, 300)
    c = cli.config_from_args(parser.parse_args(
        ["m:app", "--limit-request-line", "0", "--limit-request-fields", "0",
         "--limit-request-field-size", "0"]))
    assert (c.max_target_bytes, c.max_headers, c.max_header_bytes) == (1 << 20, 10000, 1 << 20)
    # Not given: the cyserve options' own values stand.
    c = cli.config_from_args(parser.parse_args(["m:app", "--max-headers", "5"]))
    assert (c.max_target_bytes, c.max_headers, c.max_header_bytes) == (8192, 5, 8192)


@pytest.mark.parametrize(("args", "line"), [
    (["--limit-request-line", "-1"],
     "cyserve: invalid --limit-request-line -1: must be 0 (the most, 1048576) or between 1 and "
     "1048576"),
    (["--limit-request-fields", "many"],
     "cyserve: invalid --limit-request-fields many: must be an integer"),
    (["--limit-request-field_size", "10"],
     "cyserve: invalid --limit-request-field-size 10: must be 0 (the most, 1048576) or between "
     "64 and 1048576"),
])
def test_bad_gunicorn_limits_are_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    out = _cyserve(tmp_path, "m:app", *args)
    assert out.returncode == 2
    assert out.stderr == line + "\n"


def test_gunicorn_tls_spellings_are_aliases() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["m:app", "--certfile", "c.pem", "--keyfile", "k.pem",
                              "--ca-certs", "ca.pem", "--ciphers", "HIGH", "--cert-reqs", "2"])
    assert (args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs, args.ssl_ciphers,
            args.ssl_cert_reqs) == ("c.pem", "k.pem", "ca.pem", "HIGH", "2")


def test_gunicorn_limits_are_enforced_by_the_served_process(tmp_path: Path,
                                                            served: list[Served]) -> None:
    port = free_port()
    served.append(Served(tmp_path, "--port", str(port), "--threads", "1",
                         "--limit-request-line", "40", "--limit-request-fields", "3",
                         "--limit-request-field-size", "200"))

    def status(target: str, headers: str = "") -> int:
        return raw_request(port, f"GET {target} HTTP/1.1\r\nHost: t\r\n{headers}"
                           "Connection: close\r\n\r\n".encode()).status

    assert status("/plain") == 200
    assert status("/plain?" + "q" * 40) == 414
    assert status("/plain", "A: 1\r\n") == 200  # Host, A, Connection: three fields
    assert status("/plain", "A: 1\r\nB: 2\r\n") == 431
    assert status("/plain", "C: " + "v" * 200 + "\r\n") == 431
