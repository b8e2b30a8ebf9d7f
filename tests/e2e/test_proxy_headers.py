"""Behind a proxy (--proxy-headers, --forwarded-allow-ips; csrc/proxy.c): from a trusted peer,
X-Forwarded-For/-Proto and Forwarded name the client and scheme that Request.client,
Request.scheme, WSGI's REMOTE_ADDR and the access log tell, and with --forwarded-host
X-Forwarded-Host (or Forwarded's host=) the Host that Request.headers, WSGI's HTTP_HOST and
SERVER_NAME and ASGI's headers show; from any other peer they are ignored. Each server runs as
the real command in a subprocess (tests/c/test_proxy.c holds the header-reading cases)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _served import TIMEOUT, Served, free_port

pytestmark = pytest.mark.native

APP = """
import cyserve

app = cyserve.App()


@app.get("/who")
def who(request):
    return f"{request.client} {request.scheme}"


def legacy(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{environ.get('REMOTE_ADDR')} {environ.get('REMOTE_PORT')} "
            f"{environ['wsgi.url_scheme']}".encode()]


app.wsgi("/wsgi", legacy)
"""

FORWARDED = ("X-Forwarded-For: 198.51.100.1, 203.0.113.7\r\n"
             "X-Forwarded-Proto: https\r\n")


def get(address: object, path: str, extra: str = "", family: int = socket.AF_INET) -> str:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect(address)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n"
                  .encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    return body.decode()


def start(tmp: Path, *args: str) -> tuple[Served, int]:
    port = free_port()
    srv = Served(tmp, "--port", str(port), "--threads", "2", "--access-log", *args, app=APP)
    return srv, port


def access_lines(srv: Served, count: int) -> list[str]:
    lines = []
    while len(lines) < count:
        line = srv.lines.get(timeout=TIMEOUT)
        if '"GET ' in line:
            lines.append(line)
    return lines


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "listen_app.py").write_text(textwrap.dedent(APP))
    return tmp_path


def test_a_trusted_peer_names_the_client_and_scheme(app_dir: Path) -> None:
    srv, port = start(app_dir, "--proxy-headers")  # trusts 127.0.0.1 by default
    try:
        assert get(("127.0.0.1", port), "/who", FORWARDED) == "('203.0.113.7', 0) https"
        assert get(("127.0.0.1", port), "/wsgi", FORWARDED) == "203.0.113.7 0 https"
        # A Forwarded field, when the proxy writes X-Forwarded-* (the default): the client's
        # own, passed through, so not believed.
        forwarded = 'Forwarded: for="[2001:db8::17]:4711";proto=https\r\n'
        assert re.fullmatch(r"\('127\.0\.0\.1', \d+\) http",
                            get(("127.0.0.1", port), "/who", forwarded))
        # Without the headers, the peer as it is.
        assert re.fullmatch(r"\('127\.0\.0\.1', \d+\) http", get(("127.0.0.1", port), "/who"))
        lines = access_lines(srv, 4)
        # The Common Log Format's host: the address alone, no port.
        assert lines[0].startswith("203.0.113.7 - - [")
        assert lines[1].startswith("203.0.113.7 - - [")
        assert lines[2].startswith("127.0.0.1 - - [")
        assert lines[3].startswith("127.0.0.1 - - [")
        assert srv.stop() == 0
    finally:
        srv.close()


def test_forwarded_is_read_when_the_proxy_writes_it(app_dir: Path) -> None:
    srv, port = start(app_dir, "--proxy-headers", "--forwarded-header", "forwarded")
    try:
        forwarded = 'Forwarded: for="[2001:db8::17]:4711";proto=https\r\n'
        assert get(("127.0.0.1", port), "/who", forwarded) == "('2001:db8::17', 0) https"
        # Now X-Forwarded-* is the client's own: not believed.
        assert re.fullmatch(r"\('127\.0\.0\.1', \d+\) http",
                            get(("127.0.0.1", port), "/who", FORWARDED))
        lines = access_lines(srv, 2)
        assert lines[0].startswith("2001:db8::17 - - [")
        assert lines[1].startswith("127.0.0.1 - - [")
        assert srv.stop() == 0
    finally:
        srv.close()


def test_an_untrusted_peer_is_not_believed(app_dir: Path) -> None:
    srv, port = start(app_dir, "--forwarded-allow-ips", "10.0.0.0/8, 192.168.0.1")
    try:
        assert re.fullmatch(r"\('127\.0\.0\.1', \d+\) http",
                            get(("127.0.0.1", port), "/who", FORWARDED))
        assert re.fullmatch(r"127\.0\.0\.1 \d+ http",
                            get(("127.0.0.1", port), "/wsgi", FORWARDED))
        line = access_lines(srv, 1)[0]
        assert line.startswith("127.0.0.1 - - ["), line
        assert srv.stop() == 0
    finally:
        srv.close()


def test_without_proxy_headers_nothing_is_believed(app_dir: Path) -> None:
    srv, port = start(app_dir)
    try:
        assert re.fullmatch(r"\('127\.0\.0\.1', \d+\) http",
                            get(("127.0.0.1", port), "/who", FORWARDED))
        assert srv.stop() == 0
    finally:
        srv.close()


def test_a_cidr_and_star_and_a_unix_socket_peer(app_dir: Path) -> None:
    sock = app_dir / "p.sock"
    srv = Served(app_dir, "--bind", "127.0.0.1:0", "--uds", str(sock), "--threads", "1",
                 "--forwarded-allow-ips", "127.0.0.0/8", app=APP)
    try:
        port = int(srv.serving[0].split(",")[0].rsplit(":", 1)[1])
        assert get(("127.0.0.1", port), "/who", FORWARDED) == "('203.0.113.7', 0) https"
        # A Unix socket's peer is trusted: who may connect is the socket file's mode.
        assert get(str(sock), "/who", FORWARDED, socket.AF_UNIX) == "('203.0.113.7', 0) https"
        assert srv.stop() == 0
    finally:
        srv.close()
    srv = Served(app_dir, "--port", str(free_port()), "--threads", "1",
                 "--forwarded-allow-ips", "*", app=APP)
    try:
        port = int(srv.serving[0].rsplit(":", 1)[1])
        # With *, the leftmost hop: nobody is told apart from a proxy.
        assert get(("127.0.0.1", port), "/who", FORWARDED) == "('198.51.100.1', 0) https"
        assert srv.stop() == 0
    finally:
        srv.close()


def test_a_bad_list_is_one_line(app_dir: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "cyserve", "listen_app:app",
                        "--forwarded-allow-ips", "10.0.0.0/8, proxy.local"], cwd=app_dir,
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 2
    assert r.stderr == ("cyserve: invalid --forwarded-allow-ips 10.0.0.0/8, proxy.local: "
                        "'proxy.local' is not an IP address or network (10.0.0.0/8, ::1, or * "
                        "for every peer)\n")


HOST_APP = """
import cyserve

app = cyserve.App()


@app.get("/host")
def host(request):
    return request.headers.get("host", "-")


def legacy(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{environ.get('HTTP_HOST')} {environ['SERVER_NAME']} {environ['SERVER_PORT']} "
            f"{environ['wsgi.url_scheme']}".encode()]


async def modern(scope, receive, send):
    if scope["type"] != "http":
        return
    hosts = [v.decode() for k, v in scope["headers"] if k == b"host"]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body",
                "body": f"{hosts} {scope['scheme']}".encode()})


app.wsgi("/wsgi", legacy)
app.asgi("/asgi", modern)
"""

XFH = ("X-Forwarded-For: 203.0.113.7\r\n"
       "X-Forwarded-Proto: https\r\n"
       "X-Forwarded-Host: example.com:8443\r\n")


def hosts_seen(port: int, extra: str) -> tuple[str, str, str]:
    """What the native Request, the WSGI app and the ASGI app see of the Host ("x", sent by
    get()) behind the forwarding headers extra."""
    return (get(("127.0.0.1", port), "/host", extra),
            get(("127.0.0.1", port), "/wsgi/", extra),
            get(("127.0.0.1", port), "/asgi/", extra))


def start_host(tmp: Path, *args: str) -> tuple[Served, int]:
    port = free_port()
    srv = Served(tmp, "--port", str(port), "--threads", "2", *args, app=HOST_APP)
    return srv, port


def test_forwarded_host_replaces_the_host_for_every_interface(tmp_path: Path) -> None:
    srv, port = start_host(tmp_path, "--forwarded-host")  # implies --proxy-headers
    try:
        assert hosts_seen(port, XFH) == (
            "example.com:8443",
            "example.com:8443 example.com 8443 https",
            "['example.com:8443'] https")
        # A list: the nearest proxy's element (the first is the client's to write).
        xfh = "X-Forwarded-Host: evil.example, example.com\r\n"
        assert hosts_seen(port, xfh) == ("example.com", "example.com example.com 80 http",
                                         "['example.com'] http")
        # Not what a Host may be: the request's own Host stays.
        assert hosts_seen(port, "X-Forwarded-Host: a/b@c\r\n") == (
            "x", "x x 80 http", "['x'] http")
        # No X-Forwarded-Host: the Host as sent.
        assert hosts_seen(port, "") == ("x", "x x 80 http", "['x'] http")
        assert srv.stop() == 0
    finally:
        srv.close()


def test_forwarded_host_is_off_by_default(tmp_path: Path) -> None:
    # --proxy-headers alone: the client and scheme, never the host (a proxy that does not set
    # X-Forwarded-Host passes the client's own through).
    srv, port = start_host(tmp_path, "--proxy-headers")
    try:
        assert hosts_seen(port, XFH) == ("x", "x x 80 https", "['x'] https")
        assert srv.stop() == 0
    finally:
        srv.close()


def test_forwarded_host_from_an_untrusted_peer_is_not_believed(tmp_path: Path) -> None:
    srv, port = start_host(tmp_path, "--forwarded-host", "--forwarded-allow-ips", "10.0.0.0/8")
    try:
        assert hosts_seen(port, XFH) == ("x", "x x 80 http", "['x'] http")
        assert srv.stop() == 0
    finally:
        srv.close()


def test_forwarded_host_from_rfc_7239(tmp_path: Path) -> None:
    srv, port = start_host(tmp_path, "--forwarded-host", "--forwarded-header", "forwarded")
    try:
        fw = 'Forwarded: for=203.0.113.7;proto=https;host="example.com"\r\n'
        assert hosts_seen(port, fw) == ("example.com", "example.com example.com 80 https",
                                        "['example.com'] https")
        # X-Forwarded-Host is the client's own when the proxy writes Forwarded.
        assert hosts_seen(port, XFH) == ("x", "x x 80 http", "['x'] http")
        assert srv.stop() == 0
    finally:
        srv.close()
