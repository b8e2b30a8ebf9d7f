"""End-to-end checks of small protocol and command-line rules, over raw sockets and subprocesses.

Each test states the rule it holds; the parser's side of each rule also has conformance cases in
tests/http/*.md (fed split at every byte by tests/http/test_parser.py)."""

from __future__ import annotations

import subprocess

import pytest

import cyserve

from _rawhttp import Conn, get, request, serving
from _subserve import PYTHON, env_with_src, free_port, running


def _app() -> cyserve.App:
    app = cyserve.App()
    app.static("/a", b"plain a", content_type="text/plain")
    return app


def test_fragment_in_target_is_400_not_404():
    """RFC 9112 3.2: no request-target has a fragment. '#' is a malformed request (400), never a
    path to look up (which used to give 404), and the connection is not kept."""
    with serving(_app().build()) as srv:
        for target in ("/a#x", "/a#", "/a?q=1#x", "/#"):
            with Conn(srv.port) as c:
                c.send(get(target))
                r = c.reply()
                assert r.status == 400, (target, r.status, r.body)
                assert c.is_closed()
        # "%23" is an ordinary (encoded) byte of the path: looked up, not refused.
        assert request(srv.port, get("/a%23")).status == 404
        assert request(srv.port, get("/a")).status == 200


def test_content_length_spelled_two_ways_is_400():
    """"Content-Length: 3" with "Content-Length: 03" are two framings to anyone comparing the
    text: refused (400, connection closed) rather than read as one value. The same digits
    repeated are still one value (RFC 9110 8.6)."""
    with serving(_app().build()) as srv:
        for lines in ("Content-Length: 3\r\nContent-Length: 03\r\n",
                      "Content-Length: 03\r\nContent-Length: 3\r\n",
                      "Content-Length: 3, 03\r\n"):
            with Conn(srv.port) as c:
                c.send(f"POST /a HTTP/1.1\r\nHost: t\r\n{lines}\r\nabc".encode())
                r = c.reply()
                assert r.status == 400, (lines, r.status, r.body)
                assert c.is_closed()
        with Conn(srv.port) as c:
            c.send(b"GET /a HTTP/1.1\r\nHost: t\r\nContent-Length: 03\r\n"
                   b"Content-Length: 03, 03\r\n\r\nabc" + get("/a"))
            assert c.reply().status == 200
            assert c.reply().body == b"plain a"  # the body was framed as 3 bytes


def _echo_app() -> cyserve.App:
    app = _app()

    @app.post("/echo")
    def echo(request):
        return request.body

    return app


def _chunked_post(trailer: bytes) -> bytes:
    return (b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n" + trailer + b"\r\n")


def test_trailers_within_the_limit_are_accepted():
    with serving(_echo_app().build()) as srv:
        r = request(srv.port, _chunked_post(b"X-Sum: 1\r\n"))
        assert (r.status, r.body) == (200, b"abc")


def test_trailers_over_the_limit_are_431():
    """A trailer section over max_header_bytes is a field section too large, like a head: 431
    says what to change, where "400 invalid chunked body" did not."""
    big = b"X-Big: " + b"v" * 9000 + b"\r\n"
    with serving(_echo_app().build()) as srv:
        with Conn(srv.port) as c:
            c.send(_chunked_post(big))
            r = c.reply()
            assert r.status == 431, (r.status, r.body)
            assert b"trailer" in r.body
            assert c.is_closed()


WSGI_MODULE = """
def application(environ, start_response):
    body = ("wsgi " + environ["PATH_INFO"]).encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]


def create_app():
    return application
"""


@pytest.mark.parametrize("extra", [
    ["--interface", "wsgi"],
    ["--interface", "WSGI", "--threads", "1"],
    ["--interface", "wsgi", "--processes", "2", "--threads", "1"],
    ["--interface", "auto"],
], ids=lambda a: " ".join(a))
def test_cli_interface_wsgi_serves_a_wsgi_app(tmp_path, extra):
    """`--interface wsgi` must serve a WSGI application: the command converted the app, then
    checked the converted App against "wsgi" again and refused every WSGI app."""
    (tmp_path / "wsgimod.py").write_text(WSGI_MODULE)
    port = free_port()
    argv = [PYTHON, "-m", "cyserve", "wsgimod:application", "--port", str(port), *extra]
    with running(argv, port, cwd=tmp_path) as srv:
        r = srv.get("/x")
        assert (r.status, r.body) == (200, b"wsgi /x"), srv.output()
    assert srv.proc.returncode == 0, srv.output()


def test_cli_interface_wsgi_with_a_factory(tmp_path):
    (tmp_path / "wsgifactory.py").write_text(WSGI_MODULE)
    port = free_port()
    argv = [PYTHON, "-m", "cyserve", "wsgifactory:create_app", "--factory", "--interface", "wsgi",
            "--port", str(port), "--threads", "1"]
    with running(argv, port, cwd=tmp_path) as srv:
        assert srv.get("/f").body == b"wsgi /f"


def test_cli_interface_wsgi_still_refuses_an_app(tmp_path):
    """The check itself stays: a cyserve.App under --interface wsgi is a usage error."""
    (tmp_path / "appmod.py").write_text("import cyserve\napp = cyserve.App()\n")
    proc = subprocess.run([PYTHON, "-m", "cyserve", "appmod:app", "--interface", "wsgi",
                           "--port", str(free_port())], cwd=tmp_path, env=env_with_src(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "cyserve: 'appmod:app': interface 'wsgi' was asked for, but this is a cyserve.App"]


@pytest.fixture(scope="module")
def files_port(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    (root / "f.bin").write_bytes(bytes(range(256)) * 4)
    with serving([("prefix", "/files", ("GET", "HEAD"), "files", str(root))]) as srv:
        yield srv.port


FILE = bytes(range(256)) * 4


def test_one_range_is_honoured(files_port):
    r = request(files_port, get("/files/f.bin", extra="Range: bytes=0-1\r\n"))
    assert (r.status, r.body) == (206, FILE[:2])


@pytest.mark.parametrize("lines", [
    "Range: bytes=0-1\r\nRange: bytes=5-9\r\n",
    "Range: bytes=0-1\r\nrange: bytes=0-1\r\n",
    "Range: bytes=0-1\r\nIf-Range: {etag}\r\nIf-Range: \"other\"\r\n",
], ids=["differing", "identical", "two If-Range"])
def test_repeated_range_is_ignored(files_port, lines):
    """Range (and If-Range) may appear once (RFC 9110 5.3): repeated, neither copy is used and
    the whole file is served (200), as RFC 9110 14.2 lets a server ignore Range. (Two If-Range
    lines, the first matching: the Range is not honoured on the strength of one of them.)"""
    etag = request(files_port, get("/files/f.bin")).header("etag")
    r = request(files_port, get("/files/f.bin", extra=lines.format(etag=etag)))
    assert (r.status, r.body) == (200, FILE)


def test_a_client_that_half_closes_and_stops_reading_costs_no_cpu_and_is_dropped():
    """A client that sends its request, shuts its sending side (FIN) and never reads: the
    worker's write waits for the socket to drain, asleep, and drops the client after
    body_timeout without progress. (The half-close used to end every wait for writability at
    once, so the worker spun on EAGAIN at full CPU and never reached its timeout.)"""
    import socket
    import time

    routes = [("path", "/big", None, "static", (200, [], b"x" * (32 << 20)))]
    with serving(routes, threads=1, body_timeout=1.0) as srv:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", srv.port))
        try:
            s.sendall(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
            s.shutdown(socket.SHUT_WR)
            time.sleep(0.3)  # the response fills both socket buffers
            cpu0 = time.process_time()
            time.sleep(1.5)
            spent = time.process_time() - cpu0
            assert spent < 0.5, f"{spent:.2f} s of CPU in 1.5 s while the client reads nothing"
            # The first timeout may find the client's buffer took a few more bytes (progress:
            # the wait goes on); by the second there is none. Waited for, not slept: a fixed
            # pause left 1 s for the second timeout to come round on a loaded machine.
            deadline = time.monotonic() + 20
            while srv.live_connections and time.monotonic() < deadline:
                time.sleep(0.05)
            assert srv.live_connections == 0, "the client was not dropped"
            # Past body_timeout the server gave up on the client: reading now finds the end of
            # what it had sent, then EOF or a reset, well short of the 32 MiB.
            s.settimeout(10)
            got = 0
            try:
                while chunk := s.recv(1 << 20):
                    got += len(chunk)
            except ConnectionResetError:
                pass
            assert got < 32 << 20
        finally:
            s.close()
