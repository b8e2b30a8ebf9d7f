"""HTTPS: the TLS transport (csrc/tls.c) end to end with Python's ssl module as the client.

A self-signed certificate is made per module with `openssl req`. Over TLS 1.2 and 1.3: keep-alive
and pipelined requests, a static route, a large static body (sent through the transport's
sendfile fallback), a file route, a Python handler with a body, a WSGI app; ALPN; a plain HTTP
request to the TLS port (a 400 in plain text), garbage, a client that stalls mid-handshake; and
the start-up errors for certificate and key files that cannot be used."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _rawhttp import Conn, get, serving

import cyserve
from cyserve import cli
from cyserve._core import Server, check_tls
from cyserve.app import as_app
from cyserve.config import Config
from cyserve.errors import ConfigError

pytestmark = pytest.mark.native

BIG = bytes(range(256)) * 1200  # 307,200 bytes: many records, a memfd static body
FILE = bytes(range(251)) * 800  # 200,800 bytes: the read+encrypt loop, several chunks
PASSWORD = "s3cret-pw"
VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """cert.pem with key.pem (plain) and key-enc.pem (the same key, encrypted with PASSWORD)."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make the test certificate")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem"), "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(d / "key.pem"), "-aes256", "-passout",
                    f"pass:{PASSWORD}", "-out", str(d / "key-enc.pem")],
                   check=True, capture_output=True)
    (d / "garbage.pem").write_text("not a certificate\n")
    # Two client certificates, each its own CA: the server trusts "client" only.
    for name in ("client", "stranger"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                        str(d / f"{name}-key.pem"), "-out", str(d / f"{name}.pem"), "-days", "2",
                        "-subj", f"/CN={name}"], check=True, capture_output=True)
    names = ("cert", "key", "key-enc", "garbage", "client", "client-key", "stranger",
             "stranger-key")
    return {name: str(d / f"{name}.pem") for name in names}


def client_context(certs: dict[str, str], version: str | None = None,
                   alpn: list[str] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=certs["cert"])
    if version:
        ctx.minimum_version = ctx.maximum_version = VERSIONS[version]
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


class TLSConn(Conn):
    """_rawhttp.Conn over TLS."""

    def __init__(self, port: int, ctx: ssl.SSLContext, timeout: float = 10.0) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        self.buf = b""


class RecordConn(Conn):
    """_rawhttp.Conn over TLS made with memory BIOs, so that the test chooses how the records
    meet the socket: several records in one write, or one record cut over two writes."""

    def __init__(self, port: int, ctx: ssl.SSLContext, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.inc, self.out, server_hostname="localhost")
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.sock.sendall(self.out.read())
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("closed during the handshake") from None
                self.inc.write(data)
        self.sock.sendall(self.out.read())

    def records(self, *pieces: bytes) -> bytes:
        """The ciphertext of each piece as a record of its own, all together."""
        for p in pieces:
            self.tls.write(p)
        return self.out.read()

    def send(self, data: bytes) -> None:
        self.sock.sendall(self.records(data))

    def _fill(self) -> bool:
        while True:
            try:
                data = self.tls.read(65536)
                if not data:
                    return False  # the server's close_notify
                self.buf += data
                return True
            except ssl.SSLZeroReturnError:
                return False
            except ssl.SSLWantReadError:
                data = self.sock.recv(65536)
                if not data:
                    return False
                self.inc.write(data)


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    body = f"{environ['wsgi.url_scheme']} {environ['SERVER_PORT']}".encode()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body]


@pytest.fixture(scope="module")
def site(certs: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    root = tmp_path_factory.mktemp("tls-root")
    (root / "big.bin").write_bytes(FILE)
    app = cyserve.App()
    app.static("/plaintext", b"Hello, World!", content_type="text/plain")
    app.static("/big", BIG, content_type="application/octet-stream")
    app.files("/files", root)

    @app.route("/py", methods=["GET", "POST"])
    def py(req: Any) -> str:
        return f"{req.scheme} {req.method} {len(req.body)}"

    app.wsgi("/wsgi", wsgi_app)
    # Short timeouts, which the tests of a stalled handshake and an idle close wait out, but not
    # so short that a client thread of a loaded machine (the sanitizer stage's), descheduled
    # between two steps of a test, overruns one.
    with serving(app.build(), ssl_certfile=certs["cert"], ssl_keyfile=certs["key"],
                 header_timeout=2.0, keepalive_timeout=2.0) as srv:
        assert srv.scheme == "https"
        yield srv.port


@pytest.mark.parametrize("version", list(VERSIONS))
def test_keep_alive_and_pipelined(site: int, certs: dict[str, str], version: str) -> None:
    with TLSConn(site, client_context(certs, version)) as c:
        assert c.sock.version() == version
        for _ in range(3):
            c.send(get("/plaintext"))
            r = c.reply()
            assert (r.status, r.body) == (200, b"Hello, World!")
        # Pipelined: several requests in one write, answered in order on the same connection.
        c.send(get("/plaintext") + get("/py") + get("/plaintext") + get("/files/big.bin"))
        assert c.reply().body == b"Hello, World!"
        assert c.reply().body == b"https GET 0"
        assert c.reply().body == b"Hello, World!"
        assert c.reply().body == FILE


@pytest.mark.parametrize("version", list(VERSIONS))
def test_records_and_writes_apart(site: int, certs: dict[str, str], version: str) -> None:
    """The server reads a request to its end however its records meet the socket. A read whose
    recv found the socket empty ends the server's reading only when OpenSSL holds nothing more
    (csrc/tls.c, "Reads"): with two records in one write, the second is still in OpenSSL's
    buffer when the first is returned, and no readiness would come for it (the site's
    header_timeout, 2 s, would answer 408 first)."""
    req = get("/plaintext")
    with RecordConn(site, client_context(certs, version)) as c:
        assert c.tls.version() == version
        # One request head in two records, one write.
        c.sock.sendall(c.records(req[:7], req[7:]))
        assert c.reply().body == b"Hello, World!"
        # Two requests, a record each, one write (pipelined).
        c.sock.sendall(c.records(req, get("/py")))
        assert c.reply().body == b"Hello, World!"
        assert c.reply().body == b"https GET 0"
        # One head in two records, two writes 50 ms apart: the first read leaves the socket
        # drained with half a head, and the second record's arrival wakes the connection.
        c.sock.sendall(c.records(req[:7]))
        time.sleep(0.05)
        c.sock.sendall(c.records(req[7:]))
        assert c.reply().body == b"Hello, World!"
        # One record cut in two writes 50 ms apart: OpenSSL holds half a record in between.
        wire = c.records(req)
        c.sock.sendall(wire[:9])
        time.sleep(0.05)
        c.sock.sendall(wire[9:])
        assert c.reply().body == b"Hello, World!"


@pytest.mark.parametrize("version", list(VERSIONS))
@pytest.mark.parametrize("why", ["connection close", "http/1.0", "idle timeout"])
def test_every_close_says_close_notify(site: int, certs: dict[str, str], version: str,
                                       why: str) -> None:
    """A close after the handshake sends close_notify, whatever closes: a client that treats a
    missing one as truncation (suppress_ragged_eofs=False, as strict OpenSSL 3 clients do)
    reads a clean end of stream, never SSLEOFError."""
    raw = socket.create_connection(("127.0.0.1", site), timeout=10)
    with client_context(certs, version).wrap_socket(raw, server_hostname="localhost",
                                                    suppress_ragged_eofs=False) as s:
        if why == "connection close":
            s.sendall(b"GET /plaintext HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        elif why == "http/1.0":
            s.sendall(b"GET /plaintext HTTP/1.0\r\n\r\n")
        else:  # the site closes a keep-alive connection idle for 2 s
            s.sendall(b"GET /plaintext HTTP/1.1\r\nHost: t\r\n\r\n")
        got = b""
        while chunk := s.recv(65536):  # raises ssl.SSLEOFError on a close without it
            got += chunk
        assert got.endswith(b"Hello, World!")


@pytest.mark.parametrize("version", list(VERSIONS))
def test_large_bodies(site: int, certs: dict[str, str], version: str) -> None:
    with TLSConn(site, client_context(certs, version)) as c:
        for path, body in (("/big", BIG), ("/files/big.bin", FILE), ("/big", BIG)):
            c.send(get(path))
            r = c.reply()
            assert r.status == 200 and r.body == body, path
        # A range of the file, and HEAD: the file route's other answers.
        c.send(get("/files/big.bin", extra="Range: bytes=70000-70009\r\n"))
        r = c.reply()
        assert (r.status, r.body) == (206, FILE[70000:70010])


def test_python_handler_with_body_and_wsgi(site: int, certs: dict[str, str]) -> None:
    body = b"x" * 50000
    with TLSConn(site, client_context(certs)) as c:
        c.send(b"POST /py HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert c.reply().body == b"https POST 50000"
        c.send(get("/wsgi", host="example.org"))
        assert c.reply().body == b"https 443"  # wsgi.url_scheme, and HTTPS's default port


def test_alpn(site: int, certs: dict[str, str]) -> None:
    # HTTP/2 is on by default: h2 is picked when offered (tests/e2e/test_http2.py speaks it).
    with TLSConn(site, client_context(certs, alpn=["h2", "http/1.1"])) as c:
        assert c.sock.selected_alpn_protocol() == "h2"
    with TLSConn(site, client_context(certs, alpn=["http/1.1"])) as c:
        assert c.sock.selected_alpn_protocol() == "http/1.1"
        c.send(get("/plaintext"))
        assert c.reply().status == 200


def test_alpn_without_http2(certs: dict[str, str]) -> None:
    app = cyserve.App()
    app.static("/plaintext", b"Hello, World!", content_type="text/plain")
    with serving(app.build(), ssl_certfile=certs["cert"], ssl_keyfile=certs["key"],
                 http2=False) as srv:
        with TLSConn(srv.port, client_context(certs, alpn=["h2", "http/1.1"])) as c:
            assert c.sock.selected_alpn_protocol() == "http/1.1"
            c.send(get("/plaintext"))
            assert c.reply().status == 200
        # A client offering nothing cyserve speaks goes on without ALPN rather than fail.
        with TLSConn(srv.port, client_context(certs, alpn=["h2"])) as c:
            assert c.sock.selected_alpn_protocol() is None
            c.send(get("/plaintext"))
            assert c.reply().status == 200


def test_session_resumption(site: int, certs: dict[str, str]) -> None:
    ctx = client_context(certs, "TLSv1.2")
    with TLSConn(site, ctx) as c:
        c.send(get("/plaintext"))
        c.reply()
        session = c.sock.session
    raw = socket.create_connection(("127.0.0.1", site), timeout=10)
    with ctx.wrap_socket(raw, server_hostname="localhost", session=session) as s:
        assert s.session_reused


def test_error_left_in_openssls_queue_by_a_handler(certs: dict[str, str]) -> None:
    """A handler that leaves an entry in OpenSSL's per-thread error queue (any libcrypto user on
    a server thread can) must not make a TLS read that ends in WANT_READ look failed: the
    transport empties the queue before each SSL call when it holds something. A streamed
    request body is read by the handler's own thread (tls_recv_nowait) right after the entry
    is left, over and over while the client sends slowly; then the connection's next requests
    and a new handshake."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("crypto")
    if name is None:
        pytest.fail("libcrypto is not found (the server links it)")
    crypto = ctypes.CDLL(name)
    crypto.ERR_peek_error.restype = ctypes.c_ulong

    def leave_error() -> bool:
        crypto.ERR_new()
        crypto.ERR_set_error(ctypes.c_int(20), ctypes.c_int(100), None)  # ERR_LIB_SSL
        return bool(crypto.ERR_peek_error())

    app = cyserve.App()

    @app.post("/upload")
    def upload(request: Any) -> str:
        queued = leave_error()
        n = 0
        for piece in request.stream():
            queued = leave_error() and queued
            n += len(piece)
        return f"{n} queued {queued}"

    @app.route("/leave-error")
    def leave(req: Any) -> str:
        return f"queued {leave_error()}"

    app.static("/plaintext", b"Hello, World!", content_type="text/plain")
    piece, pieces = b"u" * 65536, 12  # 768 KiB: under max_body_bytes, streamed
    with serving(app.build(), threads=1, ssl_certfile=certs["cert"], ssl_keyfile=certs["key"]) \
            as srv:
        for version in VERSIONS:
            with TLSConn(srv.port, client_context(certs, version)) as c:
                c.send(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
                       % (len(piece) * pieces))
                for _ in range(pieces):  # slowly: the handler's reads find the socket empty
                    c.send(piece)
                    time.sleep(0.01)
                assert c.reply().body == b"%d queued True" % (len(piece) * pieces)
                for _ in range(3):
                    c.send(get("/leave-error"))
                    assert c.reply().body == b"queued True"
                    c.send(get("/plaintext"))
                    assert c.reply().body == b"Hello, World!"
            with TLSConn(srv.port, client_context(certs, version)) as c:
                c.send(get("/plaintext"))
                assert c.reply().body == b"Hello, World!"


def test_plain_http_to_the_tls_port_gets_400(site: int) -> None:
    with Conn(site) as c:
        c.send(get("/plaintext"))
        r = c.reply()
        assert r.status == 400 and r.header("connection") == "close"
        assert b"TLS port" in r.body
        assert c.is_closed()


def test_garbage_is_closed(site: int) -> None:
    with Conn(site) as c:
        c.send(b"\x00\x01\x02\x03garbage")
        assert c.is_closed()
        assert c.buf == b""


def test_stalled_handshake_is_closed(site: int, certs: dict[str, str]) -> None:
    # The start of a TLS record (a ClientHello that never ends): the server must close it once
    # header_timeout (2 s here) has passed, not wait for ever.
    t0 = time.monotonic()  # before the connection, whose accept starts the server's clock
    with Conn(site, timeout=5.0) as c:
        c.send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        assert c.is_closed()
        assert 1.5 < time.monotonic() - t0 < 4.5
    # The server is still fine.
    with TLSConn(site, client_context(certs)) as c:
        c.send(get("/plaintext"))
        assert c.reply().status == 200


def test_encrypted_key_with_its_password(certs: dict[str, str]) -> None:
    app = cyserve.App()
    app.static("/", b"ok")
    with serving(app.build(), ssl_certfile=certs["cert"], ssl_keyfile=certs["key-enc"],
                 ssl_keyfile_password=PASSWORD, ssl_ciphers="ECDHE+AESGCM") as srv:
        with TLSConn(srv.port, client_context(certs, "TLSv1.2")) as c:
            assert "GCM" in c.sock.cipher()[0]
            c.send(get("/"))
            assert c.reply().body == b"ok"


def test_tls13_suite_is_the_servers_first(certs: dict[str, str], site: int) -> None:
    # OpenSSL's clients (Python's ssl here, wrk, h2load) offer TLS_AES_256_GCM_SHA384 first; the
    # server's order wins and puts TLS_AES_128_GCM_SHA256 first (csrc/tls.c, tls_ctx_make), the
    # suite browsers and Go ask for, and a cheaper key schedule per new handshake.
    with TLSConn(site, client_context(certs, "TLSv1.3")) as c:
        assert c.sock.cipher()[0] == "TLS_AES_128_GCM_SHA256"
        c.send(get("/plaintext"))
        assert c.reply().status == 200


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"ssl_certfile": "garbage", "ssl_keyfile": "key"},
     ["certificate", "garbage.pem", "not a PEM file"]),
    ({"ssl_certfile": "cert", "ssl_keyfile": "garbage"}, ["private key", "garbage.pem"]),
    ({"ssl_certfile": "cert", "ssl_keyfile": "key-enc"},
     ["private key", "key-enc.pem", "password is needed"]),
    ({"ssl_certfile": "cert", "ssl_keyfile": "key-enc", "ssl_keyfile_password": "wrong"},
     ["private key", "key-enc.pem", "wrong password?"]),
    ({"ssl_certfile": "cert", "ssl_keyfile": "key", "ssl_ciphers": "NOPE"}, ["cipher", "NOPE"]),
    # OpenSSL 3 says only "unsupported" of a key file with no key (the default, the certificate
    # file, when the key is kept apart) and "key values mismatch" of another certificate's key.
    ({"ssl_certfile": "cert"}, ["private key", "cert.pem", "no private key in it"]),
    ({"ssl_certfile": "cert", "ssl_keyfile": "client-key"},
     ["private key", "client-key.pem", "not the certificate's key"]),
])
def test_unusable_files_are_clear_errors(certs: dict[str, str], kwargs: dict[str, str],
                                         words: list[str]) -> None:
    given = {k: (certs[v] if k in ("ssl_certfile", "ssl_keyfile") else v)
             for k, v in kwargs.items()}
    with pytest.raises(ValueError) as info:
        Server([], host="127.0.0.1", port=0, threads=1, **given)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message
    with pytest.raises(ValueError):
        check_tls(**given)


def client_cert_outcome(port: int, certs: dict[str, str], who: str | None,
                        version: str) -> str:
    """"ok" when a request with the client certificate `who` (None: none) is answered, else
    "refused" (the handshake, or with TLS 1.3 the first read after it, fails)."""
    ctx = client_context(certs, version)
    if who:
        ctx.load_cert_chain(certs[who], certs[f"{who}-key"])
    try:
        with TLSConn(port, ctx) as c:
            c.send(get("/"))
            return "ok" if c.reply().body == b"ok" else "refused"
    except (ssl.SSLError, ConnectionError):
        return "refused"


@pytest.mark.parametrize("version", list(VERSIONS))
@pytest.mark.parametrize(("reqs", "expect"), [
    (2, {None: "refused", "client": "ok", "stranger": "refused"}),
    (1, {None: "ok", "client": "ok", "stranger": "refused"}),
    (0, {None: "ok", "client": "ok", "stranger": "ok"}),
])
def test_client_certificates(certs: dict[str, str], reqs: int, expect: dict[str | None, str],
                             version: str) -> None:
    app = cyserve.App()
    app.static("/", b"ok")
    with serving(app.build(), ssl_certfile=certs["cert"], ssl_keyfile=certs["key"],
                 ssl_ca_certs=certs["client"], ssl_cert_reqs=reqs) as srv:
        got = {who: client_cert_outcome(srv.port, certs, who, version) for who in expect}
        assert got == expect


def test_client_certificate_options_are_checked(certs: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="ssl_cert_reqs 2: client certificates need"):
        Config(ssl_certfile=certs["cert"], ssl_cert_reqs=2)
    with pytest.raises(ConfigError, match="ssl_cert_reqs 3"):
        Config(ssl_certfile=certs["cert"], ssl_ca_certs=certs["client"], ssl_cert_reqs=3)
    with pytest.raises(ValueError, match="CA certificates from '.*garbage.pem'"):
        check_tls(certs["cert"], certs["key"], ssl_ca_certs=certs["garbage"], ssl_cert_reqs=2)
    args = cli.build_parser().parse_args(["m:app", "--ssl-certfile", certs["cert"],
                                          "--ssl-ca-certs", certs["client"],
                                          "--ssl-cert-reqs", "2"])
    c = cli.config_from_args(args)
    assert (c.ssl_ca_certs, c.ssl_cert_reqs) == (certs["client"], 2)
    assert c.server_kwargs()["ssl_cert_reqs"] == 2


def test_config_checks_the_files(certs: dict[str, str], tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigError, match="ssl_certfile .*nope.pem: cannot read the file"):
        Config(ssl_certfile=missing)
    with pytest.raises(ConfigError, match="ssl_keyfile .*nope.pem: cannot read the file"):
        Config(ssl_certfile=certs["cert"], ssl_keyfile=missing)
    with pytest.raises(ConfigError, match="needs ssl_certfile"):
        Config(ssl_keyfile=certs["key"])
    c = Config(ssl_certfile=certs["cert"], ssl_keyfile=certs["key"])
    assert c.scheme == "https" and c.server_kwargs()["ssl_certfile"] == certs["cert"]
    assert "ssl_certfile" not in Config().server_kwargs() and Config().scheme == "http"
    assert PASSWORD not in repr(Config(ssl_certfile=certs["cert"], ssl_keyfile_password=PASSWORD))


def test_cli_options_and_wrong_password(certs: dict[str, str], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    args = cli.build_parser().parse_args([
        "m:app", "--ssl-certfile", certs["cert"], "--ssl-keyfile", certs["key-enc"],
        "--ssl-keyfile-password", PASSWORD, "--ssl-ciphers", "ECDHE+AESGCM"])
    c = cli.config_from_args(args)
    assert (c.ssl_certfile, c.ssl_keyfile, c.ssl_keyfile_password, c.ssl_ciphers) == (
        certs["cert"], certs["key-enc"], PASSWORD, "ECDHE+AESGCM")
    monkeypatch.setattr(sys, "path", list(sys.path))
    name = f"tls_cli_mod_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import cyserve
        app = cyserve.App()
        app.static("/", b"ok")
    """))
    status = cli.main([f"{name}:app", "--app-dir", str(tmp_path), "--port", "0",
                       "--ssl-certfile", certs["cert"], "--ssl-keyfile", certs["key-enc"],
                       "--ssl-keyfile-password", "wrong"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("cyserve: ")
    assert "key-enc.pem" in err and "wrong password?" in err
    status = cli.main([f"{name}:app", "--app-dir", str(tmp_path), "--port", "0",
                       "--ssl-certfile", str(tmp_path / "missing.pem")])
    err = capsys.readouterr().err
    assert status == 2 and "--ssl-certfile" in err and "missing.pem" in err


def test_run_serves_https(certs: dict[str, str]) -> None:
    """cyserve.run's options reach the engine (through serve(), which run() calls)."""
    import threading

    from cyserve.start import serve

    stop = threading.Event()
    ready: list[Server] = []
    app = as_app(wsgi_app)
    config = Config.from_options(port=0, threads=1, ssl_certfile=certs["cert"],
                                 ssl_keyfile=certs["key"])
    t = threading.Thread(target=serve, args=(app, config),
                         kwargs={"stop_event": stop, "ready": ready.append}, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not ready and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready, "the server did not start"
        with TLSConn(ready[0].port, client_context(certs)) as c:
            c.send(get("/"))
            assert c.reply().body == b"https 443"  # no port in Host: HTTPS's default
    finally:
        stop.set()
        t.join(10)
