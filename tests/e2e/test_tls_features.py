"""HTTPS beyond the transport (tests/e2e/test_tls.py): what handlers see of the TLS session
(the client's certificate in the native Request, the WSGI environ and the ASGI scope's
extensions["tls"]), several certificates chosen by SNI, session tickets whose keys rotate,
OCSP stapling from a file, certificates reloaded (Server.reload_tls, SIGHUP with one process and
with a supervisor) and the kernel TLS probe. Clients: Python's ssl module, `openssl s_client`
and curl. A small PKI is made per module with the openssl command."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import contextlib
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _rawhttp import Conn, get, serving
from _subserve import PYTHON, free_port, running

import cyserve
from cyserve import cli
from cyserve._core import Server, check_tls, kernel_tls
from cyserve.config import Config
from cyserve.errors import ConfigError

pytestmark = pytest.mark.native

# curl and openssl run without the sanitizers' runtime that `make test-asan` preloads here.
TOOL_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, env=TOOL_ENV)


def _issue(d: Path, name: str, subject: str, ca: str, ext: str) -> None:
    """name.pem and name.key: a certificate for subject signed by ca (ca.pem, ca.key)."""
    _openssl("req", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
    (d / f"{name}.ext").write_text(ext + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
             cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A server CA and its certificates (localhost, other.test, *.wild.test, a second
    localhost one for reloads), a client CA with an intermediate and a client certificate
    under it, a stranger's self-signed certificate, and an OCSP response for localhost's."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make the test certificates")
    d = tmp_path_factory.mktemp("pki")
    ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext",
              "keyUsage=critical,keyCertSign,cRLSign"]
    for ca in ("ca", "client-ca"):
        _openssl("req", "-x509", *EC, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                 "-subj", f"/CN={ca}", *ca_ext, cwd=d)
    _issue(d, "localhost", "/CN=localhost", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1")
    _issue(d, "localhost2", "/CN=localhost/O=second", "ca",
           "subjectAltName=DNS:localhost,IP:127.0.0.1")
    _issue(d, "other", "/CN=other.test", "ca", "subjectAltName=DNS:other.test")
    _issue(d, "wild", "/CN=*.wild.test", "ca", "subjectAltName=DNS:*.wild.test")
    _issue(d, "client-int", "/CN=client-int", "client-ca",
           "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign")
    _issue(d, "client", "/O=Example/CN=client one", "client-int", "extendedKeyUsage=clientAuth")
    (d / "client-chain.pem").write_text((d / "client.pem").read_text() +
                                        (d / "client-int.pem").read_text())
    _openssl("req", "-x509", *EC, "-keyout", "stranger.key", "-out", "stranger.pem", "-days", "2",
             "-subj", "/CN=stranger", cwd=d)
    (d / "index.txt").write_text("")
    _openssl("ocsp", "-issuer", "ca.pem", "-cert", "localhost.pem", "-reqout", "ocsp-req.der",
             "-no_nonce", cwd=d)
    _openssl("ocsp", "-index", "index.txt", "-rsigner", "ca.pem", "-rkey", "ca.key", "-CA",
             "ca.pem", "-reqin", "ocsp-req.der", "-respout", "ocsp.der", "-ndays", "1", cwd=d)
    (d / "garbage.pem").write_text("not a certificate\n")
    out = {p.stem if p.suffix == ".pem" else p.name: str(p) for p in d.iterdir()}
    out["dir"] = str(d)
    return out


def client_ctx(pki: dict[str, str], cert: str | None = None, version: str = "TLSv1.3",
               check_hostname: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki["ca"])
    ctx.check_hostname = check_hostname
    v = getattr(ssl.TLSVersion, version.replace("TLSv1.", "TLSv1_"))
    ctx.minimum_version = ctx.maximum_version = v
    if cert == "client":
        ctx.load_cert_chain(pki["client-chain"], pki["client.key"])
    elif cert == "stranger":
        ctx.load_cert_chain(pki["stranger"], pki["stranger.key"])
    return ctx


def tls_get(port: int, ctx: ssl.SSLContext, path: str, name: str | None = "localhost",
            session: ssl.SSLSession | None = None) -> tuple[bytes, SimpleNamespace]:
    """GET path over a new connection: the body, and the connection's session and whether it
    was resumed."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s = ctx.wrap_socket(raw, server_hostname=name, session=session)
    except BaseException:
        raw.close()
        raise
    with s:
        c = Conn.__new__(Conn)
        c.sock, c.buf = s, b""
        c.send(get(path))
        r = c.reply()
        done = SimpleNamespace(session=s.session, session_reused=s.session_reused)
    assert r.status == 200, r
    return r.body, done


def peer_subject(port: int, ctx: ssl.SSLContext, name: str | None) -> dict[str, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=name) as s:
        cert = s.getpeercert()
    return {k: v for rdn in cert["subject"] for k, v in rdn}


# ---- the session, as handlers see it ----

def _wsgi_tls(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    keys = {k: v for k, v in environ.items() if k.startswith("SSL_") or k == "HTTPS"}
    keys["scheme"] = environ["wsgi.url_scheme"]
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(keys).encode()]


async def _asgi_tls(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            await send({"type": msg["type"] + ".complete"})
            if msg["type"] == "lifespan.shutdown":
                return
    body = json.dumps({"scheme": scope["scheme"],
                       "tls": scope["extensions"].get("tls")}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _app() -> cyserve.App:
    app = cyserve.App()

    @app.route("/native")
    def native(req: Any) -> dict[str, Any]:
        return {"scheme": req.scheme, "tls": req.tls, "client_cert": req.client_cert}

    app.wsgi("/wsgi", _wsgi_tls)
    app.asgi("/asgi", _asgi_tls)
    return app


@contextlib.contextmanager
def serve_app(app: cyserve.App, **options: Any) -> Iterator[Server]:
    """serve() on a thread (the ASGI runtime with it), stopped at the end."""
    from cyserve.start import serve

    stop = threading.Event()
    ready: list[Server] = []
    config = Config.from_options(port=0, threads=2, **options)
    t = threading.Thread(target=serve, args=(app, config),
                         kwargs={"stop_event": stop, "ready": ready.append}, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while not ready and time.monotonic() < deadline and t.is_alive():
            time.sleep(0.01)
        assert ready, "the server did not start"
        yield ready[0]
    finally:
        stop.set()
        t.join(20)


def _pem(path: str) -> str:
    return Path(path).read_text()


@pytest.mark.parametrize("reqs", [1, 2])
def test_client_certificate_reaches_handlers(pki: dict[str, str], reqs: int) -> None:
    with serve_app(_app(), ssl_certfile=pki["localhost"], ssl_keyfile=pki["localhost.key"],
                   ssl_ca_certs=pki["client-ca"], ssl_cert_reqs=reqs) as srv:
        ctx = client_ctx(pki, "client")
        native = json.loads(tls_get(srv.port, ctx, "/native")[0])
        wsgi = json.loads(tls_get(srv.port, ctx, "/wsgi")[0])
        asgi = json.loads(tls_get(srv.port, ctx, "/asgi")[0])
        for seen in (native, asgi):
            tls = seen["tls"]
            assert seen["scheme"] == "https"
            assert tls["server_cert"] == _pem(pki["localhost"])
            assert tls["client_cert_chain"] == [_pem(pki["client"]), _pem(pki["client-int"])]
            assert tls["client_cert_name"] == "CN=client one,O=Example"
            assert tls["client_cert_error"] is None
            assert tls["tls_version"] == 0x0304
            assert tls["cipher_suite"] in (0x1301, 0x1302, 0x1303)
        assert native["client_cert"] == _pem(pki["client"])
        assert wsgi["scheme"] == "https" and wsgi["HTTPS"] == "on"
        assert wsgi["SSL_PROTOCOL"] == "TLSv1.3" and wsgi["SSL_CIPHER"].startswith("TLS_")
        assert wsgi["SSL_TLS_SNI"] == "localhost"
        assert wsgi["SSL_CLIENT_VERIFY"] == "SUCCESS"
        assert wsgi["SSL_CLIENT_CERT"] == _pem(pki["client"])
        assert wsgi["SSL_CLIENT_CERT_CHAIN_0"] == _pem(pki["client-int"])
        assert wsgi["SSL_CLIENT_S_DN"] == "CN=client one,O=Example"
        # TLS 1.2: the version and a suite of its own.
        asgi12 = json.loads(tls_get(srv.port, client_ctx(pki, "client", "TLSv1.2"), "/asgi")[0])
        assert asgi12["tls"]["tls_version"] == 0x0303
        assert asgi12["tls"]["client_cert_chain"][0] == _pem(pki["client"])
        # No certificate: optional mode serves without one, required mode refuses.
        bare = client_ctx(pki)
        if reqs == 1:
            native = json.loads(tls_get(srv.port, bare, "/native")[0])
            assert native["tls"]["client_cert_chain"] == [] and native["client_cert"] is None
            assert native["tls"]["client_cert_name"] is None
            wsgi = json.loads(tls_get(srv.port, bare, "/wsgi")[0])
            assert wsgi["SSL_CLIENT_VERIFY"] == "NONE" and "SSL_CLIENT_CERT" not in wsgi
        else:
            with pytest.raises((ssl.SSLError, ConnectionError)):
                tls_get(srv.port, bare, "/native")
        # A certificate from a CA the server does not trust is refused in both modes.
        with pytest.raises((ssl.SSLError, ConnectionError)):
            tls_get(srv.port, client_ctx(pki, "stranger"), "/native")


def test_client_certificate_with_curl(pki: dict[str, str]) -> None:
    if shutil.which("curl") is None:
        pytest.fail("curl is needed for this test")
    with serve_app(_app(), ssl_certfile=pki["localhost"], ssl_keyfile=pki["localhost.key"],
                   ssl_ca_certs=pki["client-ca"], ssl_cert_reqs=2) as srv:
        for path in ("/wsgi", "/native"):
            out = subprocess.run(
                ["curl", "-sS", "--cacert", pki["ca"], "--cert", pki["client-chain"], "--key",
                 pki["client.key"], f"https://localhost:{srv.port}{path}"],
                capture_output=True, text=True, timeout=30, env=TOOL_ENV)
            assert out.returncode == 0, out.stderr
            seen = json.loads(out.stdout)
            if path == "/wsgi":
                assert seen["SSL_CLIENT_S_DN"] == "CN=client one,O=Example"
            else:
                assert seen["client_cert"] == _pem(pki["client"])


def test_cleartext_has_no_tls() -> None:
    with serve_app(_app()) as srv:
        with Conn(srv.port) as c:
            c.send(get("/native") + get("/wsgi") + get("/asgi"))
            native, wsgi, asgi = (json.loads(c.reply().body) for _ in range(3))
    assert native == {"scheme": "http", "tls": None, "client_cert": None}
    assert wsgi == {"scheme": "http"}
    assert asgi == {"scheme": "http", "tls": None}


# ---- SNI ----

def test_sni_picks_the_certificate(pki: dict[str, str]) -> None:
    app = cyserve.App()

    @app.route("/")
    def index(req: Any) -> str:
        return req.tls["client_cert_name"] or "-"

    sni = [("other.test", pki["other"], pki["other.key"]),
           ("*.wild.test", pki["wild"], pki["wild.key"])]
    with serving(app.build(), ssl_certfile=pki["localhost"], ssl_keyfile=pki["localhost.key"],
                 ssl_sni=sni, ssl_ca_certs=pki["client-ca"], ssl_cert_reqs=1) as srv:
        ctx = client_ctx(pki)
        loose = client_ctx(pki, check_hostname=False)
        assert peer_subject(srv.port, ctx, "localhost")["commonName"] == "localhost"
        assert peer_subject(srv.port, ctx, "other.test")["commonName"] == "other.test"
        assert peer_subject(srv.port, ctx, "OTHER.test")["commonName"] == "other.test"
        assert peer_subject(srv.port, ctx, "a.wild.test")["commonName"] == "*.wild.test"
        # Not matched: the default certificate (a wildcard covers one label only).
        for name in ("a.b.wild.test", "wild.test", "unknown.test", None):
            assert peer_subject(srv.port, loose, name)["commonName"] == "localhost", name
        # ALPN, tickets and client certificates work on an SNI name's context too.
        alpn = client_ctx(pki)
        alpn.set_alpn_protocols(["h2", "http/1.1"])
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        with alpn.wrap_socket(raw, server_hostname="other.test") as s:
            assert s.selected_alpn_protocol() == "h2"
        body, s = tls_get(srv.port, client_ctx(pki, "client"), "/", "other.test")
        assert body == b"CN=client one,O=Example"
        ctx12 = client_ctx(pki, version="TLSv1.2")
        _, first = tls_get(srv.port, ctx12, "/", "other.test")
        _, again = tls_get(srv.port, ctx12, "/", "other.test", session=first.session)
        assert again.session_reused
    if shutil.which("curl"):
        with serving(app.build(), ssl_certfile=pki["localhost"], ssl_keyfile=pki["localhost.key"],
                     ssl_sni=sni) as srv:
            out = subprocess.run(
                ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", pki["ca"],
                 "--resolve", f"x.wild.test:{srv.port}:127.0.0.1",
                 f"https://x.wild.test:{srv.port}/"], capture_output=True, text=True, timeout=30,
                env=TOOL_ENV)
            assert (out.returncode, out.stdout) == (0, "200"), out.stderr


def test_sni_options_are_checked(pki: dict[str, str]) -> None:
    base = {"ssl_certfile": pki["localhost"], "ssl_keyfile": pki["localhost.key"]}
    with pytest.raises(ValueError, match="garbage.pem"):
        check_tls(**base, ssl_sni=[("other.test", pki["garbage"], None)])
    with pytest.raises(ValueError, match="wild.key.*mismatch"):
        check_tls(**base, ssl_sni=[("other.test", pki["other"], pki["wild.key"])])
    with pytest.raises(ValueError, match="two certificates"):
        check_tls(**base, ssl_sni=[("a.test", pki["other"], pki["other.key"]),
                                   ("A.test", pki["other"], pki["other.key"])])
    with pytest.raises(ValueError, match="not a host name"):
        check_tls(**base, ssl_sni=[("bad name", pki["other"], pki["other.key"])])
    c = Config(**base, ssl_sni=[f"other.test={pki['other']},{pki['other.key']}",
                                f"*.wild.test={pki['wild']}"])
    assert c.tls_kwargs()["ssl_sni"] == [("other.test", pki["other"], pki["other.key"]),
                                         ("*.wild.test", pki["wild"], None)]
    for bad in ("other.test", "=x.pem", "bad/name=x.pem", f"a.test={pki['dir']}/missing.pem"):
        with pytest.raises(ConfigError, match="ssl_sni"):
            Config(**base, ssl_sni=[bad])
    with pytest.raises(ConfigError, match="needs ssl_certfile"):
        Config(ssl_sni=[f"other.test={pki['other']}"])
    args = cli.build_parser().parse_args([
        "m:app", "--ssl-certfile", pki["localhost"], "--ssl-keyfile", pki["localhost.key"],
        "--ssl-sni", f"other.test={pki['other']},{pki['other.key']}",
        "--ssl-sni", f"*.wild.test={pki['wild']},{pki['wild.key']}",
        "--ssl-ocsp-file", pki["ocsp.der"], "--ssl-ticket-rotation", "600"])
    c = cli.config_from_args(args)
    assert len(c.ssl_sni) == 2 and c.ssl_ocsp_file == pki["ocsp.der"]
    assert c.ssl_ticket_rotation == 600


# ---- session tickets ----

@pytest.mark.parametrize("version", ["TLSv1.2", "TLSv1.3"])
def test_tickets_resume_across_one_rotation(pki: dict[str, str], version: str) -> None:
    app = cyserve.App()
    app.static("/", b"ok")
    with serving(app.build(), ssl_certfile=pki["localhost"], ssl_keyfile=pki["localhost.key"],
                 ssl_ticket_rotation=3600) as srv:
        ctx = client_ctx(pki, version=version)
        _, first = tls_get(srv.port, ctx, "/")
        assert first.session is not None and first.session.has_ticket
        _, again = tls_get(srv.port, ctx, "/", session=first.session)
        assert again.session_reused
        srv.rotate_ticket_keys()
        _, after_one = tls_get(srv.port, ctx, "/", session=first.session)
        assert after_one.session_reused  # the previous period's key still opens it
        srv.rotate_ticket_keys()
        _, after_two = tls_get(srv.port, ctx, "/", session=first.session)
        assert not after_two.session_reused  # too old: a full handshake, and a new ticket
        _, fresh = tls_get(srv.port, ctx, "/", session=after_two.session)
        assert fresh.session_reused


def test_tickets_rotate_with_the_clock(pki: dict[str, str]) -> None:
    """A period of 1 s: a ticket resumes in the next second's period, not two periods later."""
    app = cyserve.App()
    app.static("/", b"ok")
    with serving(app.build(), ssl_certfile=pki["localhost"], ssl_keyfile=pki["localhost.key"],
                 ssl_ticket_rotation=1) as srv:
        ctx = client_ctx(pki, version="TLSv1.2")
        for _ in range(5):
            before = int(time.time())
            _, first = tls_get(srv.port, ctx, "/")
            if int(time.time()) == before:
                break  # made wholly within one period
        # (Never a negative sleep, a ValueError: a paused thread may come back past the mark.)
        time.sleep(max(0.0, before + 1.05 - time.time()))
        _, next_period = tls_get(srv.port, ctx, "/", session=first.session)
        if int(time.time()) == before + 1:
            assert next_period.session_reused
        time.sleep(max(0.0, before + 2.05 - time.time()))
        _, later = tls_get(srv.port, ctx, "/", session=first.session)
        assert not later.session_reused


def test_ticket_keys_survive_a_reload(pki: dict[str, str]) -> None:
    app = cyserve.App()
    app.static("/", b"ok")
    with serving(app.build(), ssl_certfile=pki["localhost"],
                 ssl_keyfile=pki["localhost.key"]) as srv:
        ctx = client_ctx(pki)
        _, first = tls_get(srv.port, ctx, "/")
        srv.reload_tls()
        _, again = tls_get(srv.port, ctx, "/", session=first.session)
        assert again.session_reused


# ---- OCSP stapling ----

def _s_client(port: int, *extra: str) -> str:
    out = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}",
                          "-servername", "localhost", *extra],
                         input="", capture_output=True, text=True, timeout=30, env=TOOL_ENV)
    return out.stdout + out.stderr


def test_ocsp_stapling(pki: dict[str, str]) -> None:
    app = cyserve.App()
    app.static("/", b"ok")
    with serving(app.build(), ssl_certfile=pki["localhost"], ssl_keyfile=pki["localhost.key"],
                 ssl_ocsp_file=pki["ocsp.der"],
                 ssl_sni=[("other.test", pki["other"], pki["other.key"])]) as srv:
        for version in ("-tls1_2", "-tls1_3"):
            text = _s_client(srv.port, "-status", version)
            assert "OCSP Response Status: successful" in text, text
            assert "Responder Id: CN = ca" in text
        # Only for a client that asks, and only for the certificate the file is about.
        assert "OCSP response" not in _s_client(srv.port)
        text = _s_client(srv.port, "-status", "-servername", "other.test")
        assert "OCSP response: no response sent" in text
    with serving(app.build(), ssl_certfile=pki["localhost"],
                 ssl_keyfile=pki["localhost.key"]) as srv:
        assert "OCSP response: no response sent" in _s_client(srv.port, "-status")
    base = {"ssl_certfile": pki["localhost"], "ssl_keyfile": pki["localhost.key"]}
    with pytest.raises(ValueError, match="garbage.pem' is not an OCSP response"):
        check_tls(**base, ssl_ocsp_file=pki["garbage"])
    with pytest.raises(ValueError, match="cannot read the OCSP response"):
        check_tls(**base, ssl_ocsp_file=pki["dir"] + "/missing.der")
    with pytest.raises(ConfigError, match="ssl_ocsp_file"):
        Config(**base, ssl_ocsp_file=pki["dir"] + "/missing.der")


# ---- reloading the certificates ----

def _files(d: Path, which: str, pki: dict[str, str]) -> None:
    """d/cert.pem and d/key.pem become `which`'s (or garbage)."""
    if which == "garbage":
        (d / "cert.pem").write_text("not a certificate\n")
        return
    shutil.copy(pki[which], d / "cert.pem.new")
    shutil.copy(pki[which + ".key"], d / "key.pem.new")
    os.replace(d / "key.pem.new", d / "key.pem")
    os.replace(d / "cert.pem.new", d / "cert.pem")


def _org(port: int, ctx: ssl.SSLContext) -> str:
    return peer_subject(port, ctx, "localhost").get("organizationName", "-")


def test_reload_tls_keeps_connections(pki: dict[str, str], tmp_path: Path) -> None:
    _files(tmp_path, "localhost", pki)
    app = cyserve.App()
    app.static("/", b"ok")
    ctx = client_ctx(pki)
    with serving(app.build(), ssl_certfile=str(tmp_path / "cert.pem"),
                 ssl_keyfile=str(tmp_path / "key.pem"), keepalive_timeout=30.0) as srv, \
            socket.create_connection(("127.0.0.1", srv.port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as kept:
        c = Conn.__new__(Conn)
        c.sock, c.buf = kept, b""
        c.send(get("/"))
        assert c.reply().body == b"ok"
        assert _org(srv.port, ctx) == "-"
        _files(tmp_path, "localhost2", pki)
        srv.reload_tls()
        assert _org(srv.port, ctx) == "second"  # new handshakes: the new certificate
        c.send(get("/"))  # the open connection goes on with its session
        assert c.reply().body == b"ok"
        _files(tmp_path, "garbage", pki)
        with pytest.raises(ValueError, match="cert.pem"):
            srv.reload_tls()
        assert _org(srv.port, ctx) == "second"  # the last good one stays
        c.send(get("/"))
        assert c.reply().body == b"ok"


def _write_app(d: Path) -> str:
    (d / "tls_reload_app.py").write_text(textwrap.dedent("""
        import cyserve
        app = cyserve.App()
        app.static("/", b"ok")
    """))
    return "tls_reload_app:app"


def _wait_for(srv: Any, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in srv.output():
        assert time.monotonic() < deadline, f"no {text!r} in:\n{srv.output()}"
        time.sleep(0.05)


@pytest.mark.parametrize("processes", [1, 2])
def test_sighup_reloads_certificates(pki: dict[str, str], tmp_path: Path,
                                     processes: int) -> None:
    _files(tmp_path, "localhost", pki)
    port = free_port()
    ctx = client_ctx(pki)
    argv = [PYTHON, "-m", "cyserve", _write_app(tmp_path), "--app-dir", str(tmp_path),
            "--port", str(port), "--threads", "1", "--processes", str(processes),
            "--ssl-certfile", str(tmp_path / "cert.pem"), "--ssl-keyfile",
            str(tmp_path / "key.pem"), "--keepalive-timeout", "60"]
    with running(argv, port, tls=ctx) as srv, \
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as kept:
        c = Conn.__new__(Conn)
        c.sock, c.buf = kept, b""
        c.send(get("/"))
        assert c.reply().body == b"ok"
        if processes == 2:
            # The workers share the ticket keys (made before the supervisor forked): a ticket
            # from one resumes on the other, so every resumption takes.
            ctx12 = client_ctx(pki, version="TLSv1.2")
            _, first = tls_get(port, ctx12, "/")
            for _ in range(8):
                assert tls_get(port, ctx12, "/", session=first.session)[1].session_reused
        # A certificate that cannot be used: said, and the old one goes on.
        _files(tmp_path, "garbage", pki)
        os.kill(srv.proc.pid, signal.SIGHUP)
        _wait_for(srv, "cannot reload the certificates" if processes == 1 else "reload failed")
        assert "cert.pem" in srv.output()
        assert _org(port, ctx) == "-"
        _files(tmp_path, "localhost2", pki)
        os.kill(srv.proc.pid, signal.SIGHUP)
        if processes == 1:
            _wait_for(srv, "certificates reloaded")
            assert _org(port, ctx) == "second"
            c.send(get("/"))  # the connection made before the reload is still served
            assert c.reply().body == b"ok"
        else:
            _wait_for(srv, "new worker processes serve")
            # The old workers stop now: until they have, one of them may still accept.
            deadline = time.monotonic() + 30
            seen = []
            while seen[-3:] != ["second"] * 3:
                assert time.monotonic() < deadline, f"{seen}:\n{srv.output()}"
                seen.append(_org(port, ctx))
                time.sleep(0.05 if seen[-1] == "second" else 0.3)
        assert srv.proc.poll() is None


# ---- kernel TLS ----

def test_kernel_tls_probe(pki: dict[str, str]) -> None:
    check_tls(ssl_certfile=pki["localhost"], ssl_keyfile=pki["localhost.key"])
    try:
        ulps = Path("/proc/sys/net/ipv4/tcp_available_ulp").read_text().split()
    except OSError:
        ulps = []
    # After the probe: a module it loaded shows in the list.
    if "tls" not in ulps:
        assert kernel_tls() is False
    else:
        assert isinstance(kernel_tls(), bool)
