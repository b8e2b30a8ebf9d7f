"""--proxy-protocol (csrc/proxyproto.c, conn_proxy_preface in csrc/conn.c): a connection from a
peer of --forwarded-allow-ips begins with a PROXY protocol header, version 1 or 2, and the client
it names is the one the native Request, WSGI's REMOTE_ADDR, ASGI's scope and the access log see;
over TCP and over a Unix socket. A peer that is not listed is served as it comes; a listed peer
that sends no valid header is closed without an answer."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from _served import TIMEOUT, Served, free_port

pytestmark = pytest.mark.native

APP = """
import cyserve

app = cyserve.App()


@app.get("/who")
def who(request):
    client = "%s:%s" % request.client if request.client else "-"
    return f"{client} {request.scheme}"


def wsgi(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{environ['REMOTE_ADDR']} {environ['wsgi.url_scheme']}".encode()]


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    host, port = scope["client"]
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": f"{host}:{port}".encode()})


app.wsgi("/wsgi", wsgi)
app.asgi("/asgi", asgi)
"""

SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def v2(src: str, sport: int, dst: str = "198.51.100.1", dport: int = 443,
       local: bool = False) -> bytes:
    if ":" in src:
        fam, addrs = 0x21, socket.inet_pton(socket.AF_INET6, src) + \
            socket.inet_pton(socket.AF_INET6, dst if ":" in dst else "::1")
    else:
        fam, addrs = 0x11, socket.inet_aton(src) + socket.inet_aton(dst)
    body = addrs + struct.pack("!HH", sport, dport)
    return SIG + bytes([0x20 if local else 0x21, fam]) + struct.pack("!H", len(body)) + body


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.close()


def exchange(family: int, address: object, data: bytes) -> bytes:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect(address)
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def closed_unanswered(family: int, address: object, data: bytes) -> bool:
    """The server closed without a byte of answer (a reset, since what was sent is unread)."""
    try:
        return exchange(family, address, data) == b""
    except ConnectionResetError:
        return True


def body(answer: bytes) -> str:
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer
    return rest.decode()


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()


@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_the_header_names_the_client_everywhere(tmp_path: Path, served: list[Served],
                                                family: str) -> None:
    if family == "tcp":
        port = free_port()
        where = ["--port", str(port)]
        fam, address = socket.AF_INET, ("127.0.0.1", port)
    else:
        path = str(tmp_path / "pp.sock")
        where = ["--uds", path]
        fam, address = socket.AF_UNIX, path
    srv = Served(tmp_path, *where, "--threads", "2", "--proxy-protocol", "--access-log",
                 "--access-log-format", "json", app=APP)
    served.append(srv)
    v1 = b"PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\r\n"
    assert body(exchange(fam, address, v1 + get("/who"))) == "192.0.2.1:56324 http"
    assert body(exchange(fam, address, v1 + get("/wsgi"))) == "192.0.2.1 http"
    assert body(exchange(fam, address, v1 + get("/asgi"))) == "192.0.2.1:56324"
    six = b"PROXY TCP6 2001:db8::7 2001:db8::1 4000 443\r\n"
    # (host, port): no brackets
    assert body(exchange(fam, address, six + get("/who"))) == "2001:db8::7:4000 http"
    assert body(exchange(fam, address, v2("203.0.113.9", 1234) + get("/who"))) == \
        "203.0.113.9:1234 http"
    assert body(exchange(fam, address, v2("203.0.113.9", 1234) + get("/asgi"))) == \
        "203.0.113.9:1234"
    # A header sent in pieces, the request behind it on the same connection, kept alive.
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect(address)
        for piece in (v1[:7], v1[7:30], v1[30:]):
            s.sendall(piece)
        s.sendall(b"GET /who HTTP/1.1\r\nHost: x\r\n\r\n")
        first = s.recv(65536)
        assert body(first) == "192.0.2.1:56324 http"
        s.sendall(get("/wsgi"))
        assert body(s.recv(65536)) == "192.0.2.1 http"
    # LOCAL (a health check of the balancer's own): the socket's peer stands.
    own = "127.0.0.1:" if family == "tcp" else "- "
    assert body(exchange(fam, address, v2("192.0.2.1", 1, local=True) + get("/who"))) \
        .startswith(own)
    # No valid header from a listed peer: closed, no answer.
    assert closed_unanswered(fam, address, get("/who"))
    assert closed_unanswered(fam, address,
                             b"PROXY TCP4 192.0.2.01 198.51.100.1 1 2\r\n" + get("/who"))
    assert srv.stop() == 0, srv.stderr
    log = []
    while not srv.lines.empty():
        log.append(srv.lines.get_nowait())
    records = [json.loads(ln) for ln in log if ln.startswith("{")]
    assert any((r["client"], r["port"], r["target"], r["status"]) == ("192.0.2.1", 56324, "/who",
                                                                        200)
               for r in records), log


def test_unlisted_peers_are_served_as_they_come(tmp_path: Path, served: list[Served]) -> None:
    port = free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--proxy-protocol",
                 "--forwarded-allow-ips", "10.0.0.0/8", app=APP)
    served.append(srv)
    addr = ("127.0.0.1", port)
    assert body(exchange(socket.AF_INET, addr, get("/who"))).startswith("127.0.0.1:")
    # A header from a peer that is not a listed balancer is not believed: it is no HTTP.
    answer = exchange(socket.AF_INET, addr,
                      b"PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\r\n" + get("/who"))
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert srv.stop() == 0, srv.stderr


def test_forwarded_headers_are_read_from_the_client_the_header_names(
        tmp_path: Path, served: list[Served]) -> None:
    """With both, the balancer's PROXY header names the client, and that client's own
    X-Forwarded-* headers are believed only if it is itself listed."""
    port = free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--proxy-protocol",
                 "--forwarded-allow-ips", "127.0.0.1,10.1.0.0/16", app=APP)
    served.append(srv)
    addr = ("127.0.0.1", port)
    xff = b"GET /who HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 192.0.2.77\r\n" \
          b"X-Forwarded-Proto: https\r\nConnection: close\r\n\r\n"
    # The client named is an outside address: its headers are not believed.
    spoof = b"PROXY TCP4 203.0.113.5 10.0.0.1 5555 80\r\n" + xff
    assert body(exchange(socket.AF_INET, addr, spoof)) == "203.0.113.5:5555 http"
    # The client named is a listed proxy (another hop): its headers are.
    hop = b"PROXY TCP4 10.1.2.3 10.0.0.1 5555 80\r\n" + xff
    assert body(exchange(socket.AF_INET, addr, hop)) == "192.0.2.77:0 https"
    assert srv.stop() == 0, srv.stderr


def test_the_header_comes_before_tls(tmp_path: Path, served: list[Served]) -> None:
    """The header is read, and only it, before the TLS handshake: the balancer forwards the
    client's encrypted bytes behind it."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make the test certificate")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                    str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem"), "-days", "2",
                    "-subj", "/CN=localhost"], check=True, capture_output=True)
    port = free_port()
    srv = Served(tmp_path, "--port", str(port), "--threads", "1", "--proxy-protocol",
                 "--ssl-certfile", str(tmp_path / "cert.pem"), "--ssl-keyfile",
                 str(tmp_path / "key.pem"), app=APP)
    served.append(srv)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    for header in (b"PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\r\n", v2("192.0.2.1", 56324)):
        raw = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        raw.sendall(header)
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(get("/who"))
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        assert body(data) == "192.0.2.1:56324 https"
    assert srv.stop() == 0, srv.stderr
