"""Where a server listens (cyserve/listeners.py, csrc/listen.c's shared listeners): a Unix
socket with its mode, a socket inherited from a parent that sets LISTEN_FDS as systemd does,
several addresses at once, under --threads and under --processes, and the errors that name a
bad address. Each test runs the real command in a subprocess."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from _served import TIMEOUT, Served, free_port, ipv6_loopback, request

pytestmark = pytest.mark.native

APP = """
import os

import cyserve

app = cyserve.App()


@app.get("/who")
def who(request):
    return f"{os.getpid()} {request.client}"


app.static("/plain", b"plain")
"""

@pytest.fixture
def served(tmp_path: Path) -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.close()


def test_unix_socket_with_its_mode_serves_and_is_removed_at_exit(tmp_path: Path,
                                                                  served: list[Served]) -> None:
    path = tmp_path / "app.sock"
    srv = Served(tmp_path, "--uds", str(path), "--uds-perms", "660", "--threads", "2")
    served.append(srv)
    assert srv.serving == [f"unix:{path}"]
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
    for _ in range(20):
        status, body = request(socket.AF_UNIX, str(path))
        assert status == b"HTTP/1.1 200 OK"
        assert body.endswith(" None")  # a Unix socket's client has no address
    assert request(socket.AF_UNIX, str(path), "/plain") == (b"HTTP/1.1 200 OK", "plain")
    assert srv.stop() == 0
    assert not path.exists()


def test_a_stale_socket_file_is_replaced_and_a_live_one_or_a_file_is_not(
        tmp_path: Path, served: list[Served]) -> None:
    path = tmp_path / "app.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a server killed before it could remove its file leaves this
    stale.close()
    srv = Served(tmp_path, "--bind", f"unix:{path}", "--threads", "1")
    served.append(srv)
    assert request(socket.AF_UNIX, str(path))[0] == b"HTTP/1.1 200 OK"
    second = subprocess.run([sys.executable, "-m", "cyserve", "listen_app:app", "--uds",
                             str(path)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert second.returncode == 1
    assert second.stderr.strip().endswith(
        f"cannot listen on unix:{path}: another server is listening on it"), second.stderr
    assert request(socket.AF_UNIX, str(path))[0] == b"HTTP/1.1 200 OK"  # left alone
    assert srv.stop() == 0

    other = tmp_path / "data.txt"
    other.write_text("keep me")
    third = subprocess.run([sys.executable, "-m", "cyserve", "listen_app:app", "--uds",
                            str(other)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=TIMEOUT)
    assert third.returncode == 1
    assert "the path exists and is not a socket" in third.stderr
    assert other.read_text() == "keep me"


# Emulates systemd's socket activation: the listening socket becomes descriptor 3 and
# LISTEN_PID/LISTEN_FDS name the process that execs cyserve (exec keeps the pid).
LAUNCHER = ("import os, sys; os.dup2(int(sys.argv[1]), 3); "
            "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1', "
            "LISTEN_FDNAMES='web'); os.execv(sys.argv[2], sys.argv[2:])")


@pytest.mark.parametrize("processes", [1, 2])
def test_a_socket_passed_with_listen_fds_is_served(tmp_path: Path, served: list[Served],
                                                   processes: int) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    srv = Served(tmp_path, "--threads", "2", "--processes", str(processes),
                 launcher=[sys.executable, "-c", LAUNCHER, str(sock.fileno())],
                 pass_fds=(sock.fileno(),), wait_serving=processes)
    served.append(srv)
    sock.close()  # the server's copy is the only one now
    assert srv.serving == ["fd://3"] * processes
    pids = set()
    for _ in range(40):
        status, body = request(socket.AF_INET, ("127.0.0.1", port))
        assert status == b"HTTP/1.1 200 OK"
        pid, _, client = body.partition(" ")
        assert client.startswith("('127.0.0.1', ")
        pids.add(int(pid))
    assert len(pids) <= processes
    assert srv.stop() == 0


def test_fd_option_names_an_inherited_socket(tmp_path: Path, served: list[Served]) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    fd = sock.fileno()
    srv = Served(tmp_path, "--fd", str(fd), "--threads", "2", pass_fds=(fd,))
    served.append(srv)
    sock.close()
    assert srv.serving == [f"fd://{fd}"]
    assert request(socket.AF_INET, ("127.0.0.1", port))[0] == b"HTTP/1.1 200 OK"
    assert srv.stop() == 0


@pytest.mark.parametrize("processes", [1, 2])
def test_several_addresses_at_once(tmp_path: Path, served: list[Served], processes: int) -> None:
    p4 = free_port()
    binds = ["--bind", f"127.0.0.1:{p4}", "--bind", f"unix:{tmp_path / 'app.sock'}"]
    want = [f"http://127.0.0.1:{p4}", f"unix:{tmp_path / 'app.sock'}"]
    if ipv6_loopback():
        p6 = free_port(socket.AF_INET6, "::1")
        binds += ["-b", f"[::1]:{p6}"]
        want.append(f"http://[::1]:{p6}")
    srv = Served(tmp_path, *binds, "--threads", "2", "--processes", str(processes),
                 wait_serving=processes)
    served.append(srv)
    assert srv.serving == [", ".join(want)] * processes
    for _ in range(10):
        status, body = request(socket.AF_INET, ("127.0.0.1", p4))
        assert status == b"HTTP/1.1 200 OK" and "'127.0.0.1'" in body
        assert request(socket.AF_UNIX, str(tmp_path / "app.sock"))[0] == b"HTTP/1.1 200 OK"
        if len(want) == 3:
            status, body = request(socket.AF_INET6, ("::1", p6))
            assert status == b"HTTP/1.1 200 OK" and "'::1'" in body
    assert srv.stop() == 0
    assert not (tmp_path / "app.sock").exists()


def _dual_stack() -> bool:
    try:
        with open("/proc/sys/net/ipv6/bindv6only") as f:
            return ipv6_loopback() and f.read().strip() == "0"
    except OSError:
        return False


@pytest.mark.skipif(not _dual_stack(), reason="needs IPv6 with net.ipv6.bindv6only=0")
def test_the_ipv6_wildcard_is_dual_stack(tmp_path: Path, served: list[Served]) -> None:
    # --bind [::]:PORT (the README's dual-stack address): one listener that IPv4 clients reach
    # too, as IPv4-mapped addresses, and that a trusted proxy's list still matches in its IPv4
    # form (csrc/proxy.c).
    port = free_port(socket.AF_INET6, "::")
    srv = Served(tmp_path, "-b", f"[::]:{port}", "--threads", "2", "--proxy-headers",
                 "--forwarded-allow-ips", "127.0.0.1")
    served.append(srv)
    assert srv.serving == [f"http://[::]:{port}"]
    status, body = request(socket.AF_INET6, ("::1", port))
    assert status == b"HTTP/1.1 200 OK" and "'::1'" in body, body
    status, body = request(socket.AF_INET, ("127.0.0.1", port))
    assert status == b"HTTP/1.1 200 OK" and "'::ffff:127.0.0.1'" in body, body

    def forwarded(family: int, host: str) -> str:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(TIMEOUT)
            s.connect((host, port))
            s.sendall(b"GET /who HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.5\r\n"
                      b"Connection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        return data.partition(b"\r\n\r\n")[2].decode()

    assert "('203.0.113.5', 0)" in forwarded(socket.AF_INET, "127.0.0.1")  # listed
    assert "'::1'" in forwarded(socket.AF_INET6, "::1")  # not listed: not believed
    assert srv.stop() == 0


@pytest.mark.parametrize("args, message", [
    (["--bind", "localhost:http"], "invalid --bind localhost:http: port 'http' must be a number"),
    (["--bind", "::1:8000"], "invalid --bind ::1:8000: an IPv6 address goes in brackets"),
    (["--bind", "fd://three"], "invalid --bind fd://three: a descriptor must be"),
    (["--uds-perms", "660"], "invalid --uds-perms 0o660: applies to a Unix socket"),
    (["--uds", "/tmp/x", "--uds-perms", "rw"], "invalid --uds-perms rw: must be an octal mode"),
    (["--fd", "-1"], "invalid --fd -1: must be between 0 and"),
    (["--processes", "2", "--bind", "127.0.0.1:0"], "invalid --processes 2: needs fixed ports"),
])
def test_bad_addresses_are_one_line_naming_the_option(tmp_path: Path, args: list[str],
                                                      message: str) -> None:
    (tmp_path / "listen_app.py").write_text(textwrap.dedent(APP))
    r = subprocess.run([sys.executable, "-m", "cyserve", "listen_app:app", *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("cyserve: " + message), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_descriptor_that_is_not_a_listening_socket_is_refused(tmp_path: Path) -> None:
    (tmp_path / "listen_app.py").write_text(textwrap.dedent(APP))
    sock = socket.socket()  # not listening
    try:
        r = subprocess.run([sys.executable, "-m", "cyserve", "listen_app:app", "--fd",
                            str(sock.fileno())], cwd=tmp_path, capture_output=True, text=True,
                           timeout=TIMEOUT, pass_fds=(sock.fileno(),))
    finally:
        sock.close()
    assert r.returncode == 1
    assert "it is not a listening stream socket" in r.stderr


def test_a_unix_socket_file_is_removed_only_while_it_is_still_ours(tmp_path: Path) -> None:
    """At exit the socket file goes, unless it is no longer the one this process made (a
    restarted server already replaced it: removing it would cut the new server off). A file
    whose server refuses only briefly (binding, setting the mode) is not taken for stale."""
    from cyserve.config import Config
    from cyserve.listeners import Listeners

    path = str(tmp_path / "s.sock")
    first = Listeners.for_config(Config(uds=path))
    first.open()
    os.unlink(path)  # the next server, started meanwhile, put its own socket there
    other = socket.socket(socket.AF_UNIX)
    other.bind(path)
    other.listen()
    try:
        first.close()
        assert stat.S_ISSOCK(os.lstat(path).st_mode), "the other server's socket was removed"
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(path)
    finally:
        other.close()
        os.unlink(path)
    again = Listeners.for_config(Config(uds=path))
    again.open()
    again.close()
    assert not os.path.exists(path)  # ours: removed


def test_an_inherited_socket_is_not_passed_on_to_programs_the_app_runs(
        tmp_path: Path, served: list[Served]) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    fd = sock.fileno()
    app = textwrap.dedent(f"""
        import os

        import cyserve

        app = cyserve.App()


        @app.get("/who")
        def who(request):
            return "inheritable" if os.get_inheritable({fd}) else "close-on-exec"
    """)
    srv = Served(tmp_path, "--fd", str(fd), "--threads", "2", pass_fds=(fd,), app=app)
    served.append(srv)
    sock.close()
    status, body = request(socket.AF_INET, ("127.0.0.1", port))
    assert (status, body) == (b"HTTP/1.1 200 OK", "close-on-exec")
    assert srv.stop() == 0
