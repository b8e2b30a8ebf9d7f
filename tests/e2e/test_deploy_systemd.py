"""deploy/cyserve.service and deploy/cyserve.socket, the systemd units of deploy/README.md: the
service's command line is cyserve's (no address: the socket comes from systemd), its stop
timeout covers the graceful stop, and the command itself runs under socket activation as
systemd would start it (systemd-socket-activate, systemd's own tool for that: LISTEN_FDS and
LISTEN_PID, the program started by the first connection, which waits in the socket's queue),
answers, reloads on ExecReload's SIGHUP and stops on KillSignal."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import time
from pathlib import Path

import pytest

from cyserve import cli

from _subserve import PYTHON, ROOT, free_port, running

pytestmark = pytest.mark.native

SERVICE = ROOT / "deploy" / "cyserve.service"
SOCKET = ROOT / "deploy" / "cyserve.socket"

APP = """
import os

import cyserve

app = cyserve.App()


@app.get("/who")
def who(request):
    return str(os.getpid())
"""


def _unit(path: Path) -> dict[str, list[str]]:
    """A unit file's settings, KEY: [values in order], its continued lines joined."""
    settings: dict[str, list[str]] = {}
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, eq, value = line.partition("=")
        assert eq, f"{path.name}: not KEY=VALUE: {line!r}"
        settings.setdefault(key.strip(), []).append(" ".join(value.split()))
    return settings


def _exec_start() -> list[str]:
    (command,) = _unit(SERVICE)["ExecStart"]
    return shlex.split(command)


def test_the_units_agree_with_cyserves_options() -> None:
    service, sock = _unit(SERVICE), _unit(SOCKET)
    argv = _exec_start()
    assert argv[0].endswith("/bin/cyserve")  # the wheel's console script
    args, config = cli.parse_command(argv[1:], {})
    # No address of its own: the socket is systemd's (LISTEN_FDS), found without being named.
    assert (config.bind, config.uds, config.fd) == ((), None, None)
    assert "--host" not in argv and "--port" not in argv
    assert config.supervised  # a reload (SIGHUP) needs a supervisor
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert service["KillSignal"] == ["SIGTERM"]
    assert float(service["TimeoutStopSec"][0]) > config.graceful_timeout + 1
    assert service["Requires"] == ["cyserve.socket"]
    assert sock["ListenStream"] == ["8000"]


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                    reason="needs systemd-socket-activate (Debian's systemd package)")
def test_the_service_command_serves_under_socket_activation_reloads_and_stops(
        tmp_path: Path) -> None:
    (tmp_path / "unit_app.py").write_text(APP)
    argv = _exec_start()
    # The unit's options as written, but for the application, and 2 processes instead of 4 on
    # a small test machine.
    args = ["unit_app:app"] + argv[2:]
    at = args.index("--processes")
    args[at + 1] = "2"
    port = free_port()
    # The package built in place, after the sanitizer stage's copy when that is on the path.
    env = {"PYTHONPATH": os.pathsep.join([*filter(None, [os.environ.get("PYTHONPATH")]),
                                          str(ROOT / "src")]),
           "PYTHONUNBUFFERED": "1", "PATH": os.environ["PATH"]}
    for name in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "CYSERVE_EXPECT_SANITIZED"):
        if name in os.environ:  # the sanitizer stage's
            env[name] = os.environ[name]
    # systemd-socket-activate passes on only the variables it is given (and LISTEN_*).
    command = ["systemd-socket-activate", "-l", f"127.0.0.1:{port}",
               *[f"-E{k}={v}" for k, v in env.items()], PYTHON, "-m", "cyserve", *args]
    # The tool itself runs without the sanitizer's preload, which is for the interpreter.
    with running(command, port, cwd=tmp_path, env={"PATH": os.environ["PATH"]},
                 probe="/who") as srv:
        first = srv.get("/who")
        assert first.status == 200
        # The first answer can come from one worker while the other is still starting.
        deadline = time.monotonic() + 60
        while len(before := _children(srv.proc.pid)) < 2:
            assert time.monotonic() < deadline, (before, srv.output())
            time.sleep(0.05)
        assert len(before) == 2 and first.body.decode() in before
        srv.proc.send_signal(signal.SIGHUP)  # ExecReload
        deadline = time.monotonic() + 60
        while True:
            now = _children(srv.proc.pid)
            if len(now) == 2 and not now & before:
                break
            assert srv.get("/who").status == 200  # served all along
            assert time.monotonic() < deadline, (before, now, srv.output())
            time.sleep(0.05)
        assert srv.get("/who").body.decode() in now
    assert srv.proc.returncode == 0, srv.output()
    out = srv.output()
    assert "reload: 2 new worker processes serve" in out, out


def _children(pid: int) -> set[str]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return set(f.read().split())
