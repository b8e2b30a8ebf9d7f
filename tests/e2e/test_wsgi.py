"""WSGI applications (cyserve/wsgi.py) served end to end over raw sockets: the environ a request
becomes, the answers start_response and the body make, the app's mistakes (each a 500 that
names it, the server serving on), wsgiref's PEP 3333 validator, and a Flask app unmodified."""

from __future__ import annotations

import ast
import contextvars
import io
import logging
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from wsgiref.validate import validator

import flask
import pytest
from _rawhttp import Conn, Reply, get, request, serving
from _subserve import env_with_src
from test_http2 import H2

import cyserve
from cyserve._core import Server
from cyserve.app import as_app
from cyserve.config import Config
from cyserve.errors import HandlerTypeError, RouteError
from cyserve.start import serve

pytestmark = pytest.mark.native

Environ = dict[str, Any]


def echo_environ(environ: Environ, start_response: Any) -> list[bytes]:
    """Answers with the environ's CGI keys and a few wsgi.* ones, as a Python literal."""
    keys = {k: v for k, v in environ.items() if k.isupper()}
    keys["body"] = environ["wsgi.input"].read()
    for k in ("wsgi.version", "wsgi.url_scheme", "wsgi.multithread", "wsgi.multiprocess",
              "wsgi.run_once", "wsgi.input_terminated"):
        keys[k] = environ[k]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [repr(keys).encode()]


def environ_of(port: int, data: bytes) -> Environ:
    r = request(port, data)
    assert r.status == 200, r
    env: Environ = ast.literal_eval(r.body.decode())
    return env


@pytest.fixture()
def echo_port() -> Iterator[int]:
    app = cyserve.App()
    app.wsgi("/", echo_environ)
    with serving(app.build()) as srv:
        yield srv.port


# ---- the environ --------------------------------------------------------------------------

def test_environ_of_a_get(echo_port: int) -> None:
    env = environ_of(echo_port, b"GET /a/b?x=1&y=%20 HTTP/1.1\r\nHost: example.com:8080\r\n"
                                b"Accept: a\r\nAccept: b\r\nCookie: c=1\r\nCookie: d=2\r\n"
                                b"X-Same: s\r\nX-Same: s\r\nX-Empty:\r\nX-Empty:\r\n\r\n")
    assert env["REQUEST_METHOD"] == "GET"
    assert (env["SCRIPT_NAME"], env["PATH_INFO"]) == ("", "/a/b")
    assert env["QUERY_STRING"] == "x=1&y=%20"  # raw, as PEP 3333 wants it
    assert env["SERVER_PROTOCOL"] == "HTTP/1.1"
    assert (env["SERVER_NAME"], env["SERVER_PORT"]) == ("example.com", "8080")
    assert env["HTTP_HOST"] == "example.com:8080"
    assert env["HTTP_ACCEPT"] == "a, b"
    # Repeated with the same value (one-character and empty strs are shared objects).
    assert (env["HTTP_X_SAME"], env["HTTP_X_EMPTY"]) == ("s, s", ", ")
    assert env["HTTP_COOKIE"] == "c=1; d=2"
    assert "CONTENT_LENGTH" not in env and "CONTENT_TYPE" not in env
    assert env["body"] == b""
    assert env["wsgi.version"] == (1, 0)
    assert env["wsgi.url_scheme"] == "http"
    assert env["wsgi.run_once"] is False and env["wsgi.input_terminated"] is True
    assert env["REMOTE_ADDR"] == "127.0.0.1" and env["REMOTE_PORT"].isdigit()


def test_remote_port_is_the_clients(echo_port: int) -> None:
    with Conn(echo_port) as c:
        c.send(get("/"))
        env = ast.literal_eval(c.reply().body.decode())
        assert int(env["REMOTE_PORT"]) == c.sock.getsockname()[1]


def test_what_comes_from_the_connection_is_each_connections_own(echo_port: int) -> None:
    # The keys that depend on the connection and its Host are made once per connection and kept
    # by the worker: each connection, and each Host, must still get its own values, the same
    # connection the same ones on every request, and a new Host its own split at once.
    with Conn(echo_port) as a, Conn(echo_port) as b:
        seen = []
        for c, host in ((a, "one.test:81"), (b, "one.test:81"), (a, "two.test"),
                        (a, "one.test:81"), (b, "[::1]:82"), (b, "one.test:81")):
            c.send(get("/", host=host))
            env = ast.literal_eval(c.reply().body.decode())
            seen.append((int(env["REMOTE_PORT"]), env["SERVER_NAME"], env["SERVER_PORT"],
                         env["HTTP_HOST"], env["SERVER_PROTOCOL"]))
        pa, pb = a.sock.getsockname()[1], b.sock.getsockname()[1]
        assert seen == [(pa, "one.test", "81", "one.test:81", "HTTP/1.1"),
                        (pb, "one.test", "81", "one.test:81", "HTTP/1.1"),
                        (pa, "two.test", "80", "two.test", "HTTP/1.1"),
                        (pa, "one.test", "81", "one.test:81", "HTTP/1.1"),
                        (pb, "::1", "82", "[::1]:82", "HTTP/1.1"),
                        (pb, "one.test", "81", "one.test:81", "HTTP/1.1")]
        # An HTTP/1.0 request on the same connection says so (the part depends on it too).
        a.send(b"GET / HTTP/1.0\r\nHost: one.test:81\r\nConnection: keep-alive\r\n\r\n")
        env = ast.literal_eval(a.reply().body.decode())
        assert (env["SERVER_PROTOCOL"], int(env["REMOTE_PORT"])) == ("HTTP/1.0", pa)


@pytest.fixture()
def echo_port_one_worker() -> Iterator[int]:
    """echo_environ on one worker thread: every connection's part in the same table."""
    app = cyserve.App()
    app.wsgi("/", echo_environ)
    with serving(app.build(), threads=1) as srv:
        yield srv.port


def test_many_connections_in_turn_each_get_their_own_peer(echo_port_one_worker: int) -> None:
    # 200 connections served in turn, three rounds: more than the worker's table of connection
    # parts holds in some of its sets (128 sets of four), so that parts are evicted and made
    # again between a connection's requests; each request must still see its own connection.
    conns = [Conn(echo_port_one_worker) for _ in range(200)]
    try:
        for _ in range(3):
            for c in conns:
                c.send(get("/"))
            for c in conns:
                env = ast.literal_eval(c.reply().body.decode())
                assert (env["REMOTE_ADDR"], int(env["REMOTE_PORT"])) == c.sock.getsockname()
    finally:
        for c in conns:
            c.close()


def test_one_connection_with_more_hosts_than_a_set_holds(echo_port_one_worker: int) -> None:
    # The set is chosen by the connection's peer (the engine's pointer to it), the flags and the
    # Host's length, so one connection's Hosts of one length share a set of four: six of them in
    # turn evict each other, and each request must get its own Host's split.
    with Conn(echo_port_one_worker) as c:
        for _ in range(2):
            for i in range(6):
                c.send(get("/", host=f"h{i}.test:8{i}"))
                env = ast.literal_eval(c.reply().body.decode())
                assert (env["SERVER_NAME"], env["SERVER_PORT"], env["HTTP_HOST"]) == (
                    f"h{i}.test", f"8{i}", f"h{i}.test:8{i}")


def test_a_new_connection_in_an_old_ones_place_gets_its_own_peer(echo_port_one_worker: int) -> None:
    # A connection closed and a new one opened: the engine's memory for the new one's peer is
    # likely the old one's (the same pointer, so the same set and the "last part" shortcut), and
    # the peer's text differs from the old one's only in the address's last digit, with the
    # same port (a new address each time: the old connection's four-tuple is in TIME_WAIT). The
    # part must be compared in full: the new connection gets its own REMOTE_ADDR.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    for i in range(6):
        addr = f"127.0.0.{1 + i}"
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.settimeout(10)
        s.bind((addr, port))
        s.connect(("127.0.0.1", echo_port_one_worker))
        c = Conn.__new__(Conn)
        c.sock, c.buf = s, b""
        with c:
            for _ in range(2):
                c.send(get("/"))
                env = ast.literal_eval(c.reply().body.decode())
                assert (env["REMOTE_ADDR"], env["REMOTE_PORT"]) == (addr, str(port))


def test_each_request_gets_a_fresh_environ_and_input(echo_port: int) -> None:
    # The per-connection part is copied, never handed out: what an app adds to its environ, or
    # reads from its wsgi.input, is not there on the next request.
    def app(environ: Environ, start_response: Any) -> list[bytes]:
        seen = (environ.get("x.mark"), environ["SERVER_NAME"], environ["wsgi.input"].tell(),
                type(environ["wsgi.input"]).__name__)
        environ["x.mark"] = True
        environ["SERVER_NAME"] = "changed"
        environ["wsgi.input"].write(b"scribble")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [repr(seen).encode()]

    a = cyserve.App()
    a.wsgi("/", app)
    with serving(a.build()) as srv, Conn(srv.port) as c:
        for host in ("t", "t", "h.test", "t"):
            c.send(get("/", host=host))
            assert ast.literal_eval(c.reply().body.decode()) == (None, host, 0, "BytesIO")


FRESH_INPUT = (True, False, 0, b"", False, False)


@pytest.mark.parametrize("touch", ["read", "seek", "write", "write-rewind", "close", "attribute",
                                   "weakref", "keep", "keep-environ"])
def test_an_input_the_app_touched_or_kept_is_never_the_next_requests(touch: str) -> None:
    # A request without a body gets its connection part's empty BytesIO when no earlier app
    # kept it or left a trace on it (native/wsgi.pyx, _input_fresh): whatever an app does to
    # its wsgi.input, the next request's must look new, and one the app keeps (or whose
    # environ it keeps) stays its own, open and readable, never handed to a later request.
    kept: list[Any] = []

    def app(environ: Environ, start_response: Any) -> list[bytes]:
        inp = environ["wsgi.input"]
        seen = (type(inp) is io.BytesIO, inp.closed, inp.tell(), inp.getvalue(),
                hasattr(inp, "mark"), any(k is inp for k in kept))
        if environ["QUERY_STRING"] == "touch":
            if touch == "read":
                inp.read()
            elif touch == "seek":
                inp.seek(5)
            elif touch == "write":
                inp.write(b"abc")
                inp.truncate(0)  # empty again, but the position moved
            elif touch == "write-rewind":
                inp.write(b"abc")
                inp.seek(0)
                inp.truncate(0)  # as new: may be given again
            elif touch == "close":
                inp.close()
            elif touch == "attribute":
                inp.mark = True
            elif touch == "weakref":
                kept.append(weakref.ref(inp))
            elif touch == "keep":
                kept.append(inp)
            elif touch == "keep-environ":
                kept.append(environ)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [repr(seen).encode()]

    a = cyserve.App()
    a.wsgi("/", app)
    with serving(a.build(), threads=1) as srv, Conn(srv.port) as c:
        for q in ("", "touch", "", "touch", "", ""):
            c.send(get("/?" + q))
            assert ast.literal_eval(c.reply().body.decode()) == FRESH_INPUT, q
    held = [k() if touch == "weakref" else k["wsgi.input"] if touch == "keep-environ" else k
            for k in kept]
    if touch in ("keep", "keep-environ"):
        assert len(held) == 2 and held[0] is not held[1]
        assert all(not h.closed and h.read() == b"" for h in held)


def test_a_context_variable_set_by_a_wsgi_app_is_not_in_the_next_call() -> None:
    # Each call runs in a context of its own; a thread reuses the last one only when the call
    # left no variable set in it (_context_for).
    var: contextvars.ContextVar[str] = contextvars.ContextVar("wsgi_var", default="unset")

    def app(environ: Environ, start_response: Any) -> list[bytes]:
        before = var.get()
        if environ["QUERY_STRING"] == "set":
            var.set("set by an earlier request")
        elif environ["QUERY_STRING"] == "reset":
            var.reset(var.set("set, then reset"))  # as new again: may be reused
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [before.encode()]

    a = cyserve.App()
    a.wsgi("/", app)
    with serving(a.build(), threads=1) as srv, Conn(srv.port) as c:
        for q in ("", "set", "", "reset", "", "set", "set", ""):
            c.send(get("/?" + q))
            assert c.reply().body == b"unset", q


@pytest.mark.parametrize("name", ["Host", "HOST", "hOsT", "host"])
def test_the_host_header_is_found_in_any_case(echo_port: int, name: str) -> None:
    env = environ_of(echo_port, f"GET / HTTP/1.1\r\n{name}: a.test:81\r\nHosu: b\r\n"
                                f"Xost: c\r\n\r\n".encode())
    assert (env["HTTP_HOST"], env["SERVER_NAME"], env["SERVER_PORT"]) == ("a.test:81", "a.test",
                                                                            "81")
    assert (env["HTTP_HOSU"], env["HTTP_XOST"]) == ("b", "c")


def test_a_connections_requests_each_get_their_own_method_path_query_and_host() -> None:
    # The connection's part of the environ carries the method, the path and (with the Host
    # first) HTTP_HOST of the connection's last request, and each request copies it: every
    # request must still see its own values, in the order the keys always had (the request's
    # keys, then the headers as sent), whatever the app did to the previous one's environ.
    def app(environ: Environ, start_response: Any) -> list[bytes]:
        order = [k for k in environ if k.isupper() or k == "wsgi.input"]
        seen = (environ["REQUEST_METHOD"], environ["PATH_INFO"], environ["QUERY_STRING"],
                environ.get("HTTP_HOST"), order[order.index("REQUEST_METHOD"):])
        environ["REQUEST_METHOD"] = "SCRIBBLED"
        environ["PATH_INFO"] = "/scribbled"
        environ["HTTP_HOST"] = "scribbled"
        del environ["QUERY_STRING"]
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [repr(seen).encode()]

    long = "/" + "l" * 120  # longer than the paths the worker keeps decoded
    # method, path, query, header lines; what the app sees: method, PATH_INFO, QUERY_STRING,
    # HTTP_HOST and the keys after wsgi.input.
    steps: list[tuple[str, str, str, str, tuple[str, str, str, str, list[str]]]] = [
        ("GET", "/a", "", "Host: t\r\nX-One: 1\r\n",
         ("GET", "/a", "", "t", ["HTTP_HOST", "HTTP_X_ONE"])),
        ("POST", "/b%20c", "q=1", "Host: t\r\nContent-Length: 2\r\n",
         ("POST", "/b c", "q=1", "t", ["HTTP_HOST", "CONTENT_LENGTH"])),
        ("GET", "/a", "", "Host: t\r\n", ("GET", "/a", "", "t", ["HTTP_HOST"])),
        ("GET", "/a", "", "X-First: 1\r\nHost: t\r\n",
         ("GET", "/a", "", "t", ["HTTP_X_FIRST", "HTTP_HOST"])),
        ("PUT", "/a", "x", "host: u.test:81\r\n", ("PUT", "/a", "x", "u.test:81", ["HTTP_HOST"])),
        ("GET", long, "", "Host: t\r\n", ("GET", long, "", "t", ["HTTP_HOST"])),
        ("GET", long, "", "Host: t\r\n", ("GET", long, "", "t", ["HTTP_HOST"])),
        ("GET", "/a", "", "Host: t\r\n", ("GET", "/a", "", "t", ["HTTP_HOST"])),
    ]
    a = cyserve.App()
    a.wsgi("/", app)
    with serving(a.build()) as srv, Conn(srv.port) as c:
        for method, path, query, headers, want in steps:
            target = path + ("?" + query if query else "")
            body = "ab" if "Content-Length" in headers else ""
            c.send(f"{method} {target} HTTP/1.1\r\n{headers}\r\n{body}".encode())
            seen = ast.literal_eval(c.reply().body.decode())
            base = ["REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "wsgi.input"]
            assert seen == (*want[:4], base + want[4]), (method, target, headers)


def test_path_info_is_percent_decoded_bytes_as_latin1(echo_port: int) -> None:
    env = environ_of(echo_port, get("/caf%C3%A9/a%2Fb%20c"))
    # PEP 3333: the decoded bytes, each as one latin-1 character; "%2F" is a "/" here (CGI).
    assert env["PATH_INFO"] == "/caf\u00c3\u00a9/a/b c"
    assert env["PATH_INFO"].encode("latin-1").decode("utf-8") == "/café/a/b c"


def test_headers_with_an_underscore_are_left_out(echo_port: int) -> None:
    env = environ_of(echo_port, get("/", extra="X-User: alice\r\nX_User: mallory\r\n"
                                               "Content_Length: 9\r\n"))
    assert env["HTTP_X_USER"] == "alice"
    assert "CONTENT_LENGTH" not in env and "HTTP_CONTENT_LENGTH" not in env


def test_ipv6_host_and_a_host_without_port(echo_port: int) -> None:
    env = environ_of(echo_port, get("/", host="[::1]:9000"))
    assert (env["SERVER_NAME"], env["SERVER_PORT"]) == ("::1", "9000")
    env = environ_of(echo_port, get("/", host="example.com"))
    assert (env["SERVER_NAME"], env["SERVER_PORT"]) == ("example.com", "80")


def test_post_body_content_length_and_type(echo_port: int) -> None:
    env = environ_of(echo_port, b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Type: text/x\r\n"
                                b"Content-Length: 5\r\n\r\nhello")
    assert (env["CONTENT_TYPE"], env["CONTENT_LENGTH"], env["body"]) == ("text/x", "5", b"hello")
    assert "HTTP_CONTENT_TYPE" not in env and "HTTP_CONTENT_LENGTH" not in env


def test_chunked_body_arrives_whole_with_its_length(echo_port: int) -> None:
    env = environ_of(echo_port, b"PUT /p HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                                b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nTrailer: x\r\n\r\n")
    assert (env["REQUEST_METHOD"], env["CONTENT_LENGTH"], env["body"]) == ("PUT", "7", b"abcdefg")


def test_an_empty_body_with_content_length_zero(echo_port: int) -> None:
    env = environ_of(echo_port, b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
    assert env["CONTENT_LENGTH"] == "0"


def test_mounted_under_a_prefix_beside_other_routes() -> None:
    app = cyserve.App()
    app.static("/plaintext", b"Hello, World!", content_type="text/plain")
    app.wsgi("/api", echo_environ)
    with serving(app.build()) as srv:
        env = environ_of(srv.port, get("/api/users/7"))
        assert (env["SCRIPT_NAME"], env["PATH_INFO"]) == ("/api", "/users/7")
        env = environ_of(srv.port, get("/api"))
        assert (env["SCRIPT_NAME"], env["PATH_INFO"]) == ("/api", "")
        assert request(srv.port, get("/plaintext")).body == b"Hello, World!"
        assert request(srv.port, get("/apix")).status == 404  # prefixes match whole segments


def test_an_encoded_prefix_is_decoded_like_path_info() -> None:
    app = cyserve.App()
    app.wsgi("/caf%C3%A9", echo_environ)
    with serving(app.build()) as srv:
        env = environ_of(srv.port, get("/caf%C3%A9/x%20y"))
        assert (env["SCRIPT_NAME"], env["PATH_INFO"]) == ("/caf\u00c3\u00a9", "/x y")


def test_a_host_without_a_name_leaves_the_servers(echo_port: int) -> None:
    env = environ_of(echo_port, get("/", host=":8080"))
    assert (env["SERVER_NAME"], env["SERVER_PORT"]) == ("localhost", "8080")


def test_a_bytes_subclass_is_bytes() -> None:
    class B(bytes):
        pass

    def app(environ: Environ, start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [B(b"hello")]

    with serve_wsgi(app) as srv:
        assert request(srv.port, get("/")).body == b"hello"


def test_an_unregistered_status_has_no_made_up_reason() -> None:
    # The app's own reason phrase is sent as given; without one, an unregistered code gets none.
    def app(environ: Environ, start_response: Any) -> list[bytes]:
        start_response("299" + environ["QUERY_STRING"].replace("_", " "), [])
        return [b""]

    with serve_wsgi(app) as srv:
        r = request(srv.port, get("/"))
        assert (r.status, r.raw_head.split(b"\r\n")[0]) == (299, b"HTTP/1.1 299 ")
        r = request(srv.port, get("/?_Whatever"))
        assert (r.status, r.raw_head.split(b"\r\n")[0]) == (299, b"HTTP/1.1 299 Whatever")


def test_serve_tells_the_app_where_it_runs() -> None:
    # HTTP/1.0 may come without Host: SERVER_NAME and SERVER_PORT are then the server's own.
    ready = threading.Event()
    stop = threading.Event()
    box: dict[str, Any] = {}

    def on_ready(srv: Any) -> None:
        box["port"] = srv.port
        ready.set()

    t = threading.Thread(target=serve, args=(echo_environ, Config(port=0, threads=2)),
                         kwargs={"stop_event": stop, "ready": on_ready}, daemon=True)
    t.start()
    try:
        assert ready.wait(10)
        env = environ_of(box["port"], b"GET / HTTP/1.0\r\n\r\n")
        assert (env["SERVER_NAME"], env["SERVER_PORT"]) == ("127.0.0.1", str(box["port"]))
        assert env["SERVER_PROTOCOL"] == "HTTP/1.0"
        assert env["wsgi.multithread"] is True and env["wsgi.multiprocess"] is False
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive()


# ---- answers ------------------------------------------------------------------------------

def serve_wsgi(app: Any) -> Any:
    return serving(as_app(app).build())


def test_status_headers_and_a_body_in_pieces() -> None:
    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("404 Not Found", [("Content-Type", "text/html"), ("Set-Cookie", "a=1"),
                                         ("Set-Cookie", "b=2"), ("X-Thing", "v")])
        yield b"<p>"
        yield b""
        yield bytearray(b"gone")
        yield memoryview(b"</p>")

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        c.send(get("/x"))
        r = c.reply()
        assert (r.status, r.body) == (404, b"<p>gone</p>")
        assert r.header("content-type") == "text/html" and r.header("x-thing") == "v"
        assert r.raw_head.count(b"Set-Cookie:") == 2
        # A generator with no Content-Length is streamed: chunked, each piece as it came.
        assert r.header("content-length") is None and r.header("transfer-encoding") == "chunked"
        c.send(get("/again"))  # keep-alive goes on
        assert c.reply().status == 404


def test_write_callable_and_iterable_together() -> None:
    def app(environ: Environ, start_response: Any) -> list[bytes]:
        write = start_response("200 OK", [])
        write(b"from write, ")
        return [b"then the iterable"]

    with serve_wsgi(app) as srv:
        assert request(srv.port, get("/")).body == b"from write, then the iterable"


@pytest.mark.parametrize("before", [0, 70])
def test_headers_past_the_first_64_are_read_as_the_first(before: int) -> None:
    # start_response marks the headers it does not send in a 64-bit mask; those past it are
    # filtered another way, with the same outcome: Content-Length checked and written by the
    # engine, Date dropped, Connection: close obeyed, the rest sent in order.
    extra = [(f"X-H{i}", str(i)) for i in range(before)]

    def app(environ: Environ, start_response: Any) -> list[bytes]:
        start_response("200 OK", extra + [("Content-Length", "2"), ("X-Mid", "m"),
                                          ("Date", "yesterday"), ("Connection", "close"),
                                          ("X-Last", "z")])
        return [b"ok"]

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        c.send(get("/"))
        r = c.reply()
        assert (r.status, r.body) == (200, b"ok")
        assert r.header("content-length") == "2" and r.raw_head.count(b"Content-Length") == 1
        assert r.header("date") != "yesterday" and r.header("connection") == "close"
        names = [line.split(b":")[0] for line in r.raw_head.split(b"\r\n")[1:]]
        sent = [n.decode() for n in names if n.startswith(b"X-")]
        assert sent == [n for n, _ in extra] + ["X-Mid", "X-Last"]


def test_a_start_response_or_write_the_app_keeps_stays_its_own_requests() -> None:
    # start_response is the request's own (its answer), and write a method bound to it that a
    # thread reuses for its next request only once nothing else refers to it: a write that the
    # app keeps, or holds a weak reference to, stays bound to its own request, and later
    # requests get others. Both may be referenced weakly, as bound methods may.
    kept: list[tuple[Any, Any]] = []
    weak: list[tuple[Any, Any]] = []
    problems: list[str] = []

    def app(environ: Environ, start_response: Any) -> list[bytes]:
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        path = environ["PATH_INFO"]
        if write.__self__ is not start_response:
            problems.append(f"{path}: write is bound to another request")
        for sr, w in kept:
            if sr is start_response or w is write:
                problems.append(f"{path}: a kept start_response or write was given again")
            if w.__self__ is not sr:
                problems.append(f"{path}: a kept write was rebound")
        for sr_ref, w_ref in weak:
            sr, w = sr_ref(), w_ref()
            if sr is start_response or w is write or (w is not None
                                                      and w.__self__ is start_response):
                problems.append(f"{path}: a weakly referenced one was given again")
        if path == "/keep":
            kept.append((start_response, write))
        elif path == "/weak":
            weak.append((weakref.ref(start_response), weakref.ref(write)))
        return [path.encode()]

    with serving(as_app(app).build(), threads=1) as srv, Conn(srv.port) as c:
        for path in ["/a", "/keep", "/b", "/weak", "/c", "/keep", "/d", "/e"]:
            c.send(get(path))
            r = c.reply()
            assert (r.status, r.body) == (200, path.encode())
    assert problems == []
    assert len(kept) == 2 and kept[0][0] is not kept[1][0]


@pytest.mark.parametrize("name", ["Content-Type", "content-type", "CONTENT-TYPE"])
def test_the_content_type_is_sent_as_spelt_and_checked_whatever_its_spelling(name: str) -> None:
    # "Content-Type" spelt so is written without the checks of its name (_H_CTYPE), any other
    # spelling as any header: the same line as the app spelt it, the same refusals of a value
    # that would split the response and of a second Content-Type, with the same messages.
    errors: list[str] = []

    def app(environ: Environ, start_response: Any) -> list[bytes]:
        for n in (name, "Content-type"):  # the second always the general way
            for headers in ([(n, "text/plain\r\nInjected: yes")],
                            [(n, "text/a"), ("X-A", "1"), (n, "text/b")]):
                try:
                    start_response("200 OK", headers)
                except ValueError as exc:
                    errors.append(str(exc).replace(repr(n), "NAME"))
        start_response("200 OK", [("X-B", "2"), (name, "text/x; charset=latin-1")],
                       (None, None, None))
        return [b"ok"]

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        for _ in range(2):
            c.send(get("/"))
            r = c.reply()
            assert (r.status, r.body) == (200, b"ok")
            assert r.header("content-type") == "text/x; charset=latin-1"
            assert f"\r\n{name}: text/x; charset=latin-1\r\n".encode() in r.raw_head
            assert r.header("injected") is None and r.header("x-a") is None
    assert errors == ["invalid header NAME", "header NAME given twice"] * 4, errors


@pytest.mark.parametrize("then", ["an error page", "nothing else"])
def test_a_header_the_engine_refuses_is_refused_by_start_response_itself(then: str) -> None:
    # start_response writes the headers it keeps into the engine's response as the app calls
    # it, so a header the engine refuses (here a value that would split the response) is an
    # error raised by start_response in the app's call, as PEP 3333 allows: the app may answer
    # with an error page instead (exc_info), and none of the refused answer's headers is sent.
    # An app that swallows the error and answers nothing else gets a 500.
    import sys
    errors: list[str] = []

    def app(environ: Environ, start_response: Any) -> list[bytes]:
        try:
            start_response("200 OK", [("X-First", "1"), ("A", "b\r\nInjected: yes")])
        except ValueError as exc:
            errors.append(str(exc))
            if then == "an error page":
                start_response("400 Bad Request", [("X-Why", "a header")], sys.exc_info())
                return [b"refused"]
        return [b"body"]

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        c.send(get("/"))
        r = c.reply()
        if then == "an error page":
            assert (r.status, r.body, r.header("x-why")) == (400, b"refused", "a header")
        else:
            assert (r.status, r.body) == (500, b"500 Internal Server Error\n")
        assert r.header("x-first") is None and r.header("injected") is None
        c.send(get("/"))  # and the connection goes on
        assert c.reply().status in (400, 500)
    assert len(errors) == 2 and "invalid header 'A'" in errors[0], errors


def test_each_request_gets_a_fresh_answer_whatever_the_last_one_held(tmp_path: Any) -> None:
    # A thread reuses its last answer (the start_response it gave) once nothing else holds it:
    # nothing of one request's answer may show in the next one's (status, headers, what write()
    # sent, Connection: close, an answer to HEAD whose length was unknown, a file's body, an
    # answer that failed).
    data = tmp_path / "f.txt"
    data.write_bytes(b"from the file")

    def app(environ: Environ, start_response: Any) -> Any:
        path = environ["PATH_INFO"]
        if path == "/write":
            write = start_response("201 Created", [("X-A", "1"), ("Content-Length", "6")])
            write(b"abc")
            return [b"def"]
        if path == "/gen":
            start_response("200 OK", [])
            return iter([b"g1", b"g2"])  # no length: unknown to HEAD, streamed to GET
        if path == "/file":
            start_response("200 OK", [("X-F", "f")])
            return environ["wsgi.file_wrapper"](open(data, "rb"))
        if path == "/fail":
            write = start_response("200 OK", [("X-B", "2")])
            write(b"zz")
            raise RuntimeError("after start_response and write")
        if path == "/close":
            start_response("200 OK", [("Connection", "close")])
            return [b"bye"]
        start_response("200 OK", [])
        return [b"x"]

    def plain(r: Reply) -> None:
        assert (r.status, r.body, r.header("content-length")) == (200, b"x", "1"), r
        assert not any(r.header(h) for h in ("x-a", "x-b", "x-f", "connection"))

    with serving(as_app(app).build(), threads=1) as srv:
        with Conn(srv.port) as c:
            c.send(get("/write"))
            r = c.reply()
            assert (r.status, r.body, r.header("x-a")) == (201, b"abcdef", "1")
            for path, length in [("/plain", "1"), ("/gen", None)]:
                c.send(b"HEAD " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n\r\n")
                assert c.reply(head_only=True).header("content-length") == length
            c.send(get("/gen"))
            assert c.reply().body == b"g1g2"
            c.send(get("/file"))
            r = c.reply()
            assert (r.body, r.header("x-f")) == (b"from the file", "f")
            c.send(get("/plain"))
            plain(c.reply())
            c.send(get("/fail"))
            assert c.reply().status == 500
            c.send(get("/plain"))
            plain(c.reply())
            c.send(get("/close"))
            assert c.reply().header("connection") == "close" and c.is_closed()
        with Conn(srv.port) as c:
            for _ in range(2):  # kept alive: the close was the last answer's alone
                c.send(get("/plain"))
                plain(c.reply())


# A body piece that is a bytes subclass whose bytes() is another subclass (__bytes__ may return
# one), whose deallocation calls the write() its request kept, three times, and then lets write()
# go: were such pieces kept in the answer's list, emptying it at the end of the request would run
# that code, and the list would grow under the loop that empties it (native/wsgi.pyx,
# _chunks_empty; it crashed the next request that reused the answer). Run in a child: what this
# guards against is a crash.
_PIECES_GROW_AS_THEY_GO = """
import sys
import cyserve
from _rawhttp import Conn, get, serving

kept = []

class Piece(bytes):
    def __del__(self):
        if kept:
            write = kept.pop()
            for _ in range(3):
                write(b"zz")

class Sub(bytes):
    def __bytes__(self):
        return Piece(self[:])

def app(environ, start_response):
    write = start_response("200 OK", [("Content-Type", "text/plain")])
    if environ["QUERY_STRING"] == "keep":
        kept.append(write)
    return [Sub(b"a"), Sub(b"b"), Sub(b"c"), Sub(b"d")]

a = cyserve.App()
a.wsgi("/", app)
with serving(a.build(), threads=1) as srv, Conn(srv.port) as c:
    for q in ("", "keep", "", ""):
        c.send(get("/?" + q))
        r = c.reply()
        print(q or "-", r.status, r.body.decode(), flush=True)
"""


def test_a_piece_whose_deallocation_writes_more_leaves_the_next_answer_whole() -> None:
    out = subprocess.run([sys.executable, "-c", _PIECES_GROW_AS_THEY_GO], env=env_with_src(),
                         cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                         text=True, timeout=60)
    lines = out.stdout.split("\n")
    assert out.returncode == 0, (lines, out.stderr)
    # The writes come before the pieces after them, or after the answer went out: the app's
    # doing either way. The answers after it are whole.
    assert lines[0] == "- 200 abcd" and lines[1].startswith("keep 200 "), lines
    assert lines[2:] == ["- 200 abcd", "- 200 abcd", ""], lines


def test_an_answer_of_many_pieces_leaves_no_large_list_behind() -> None:
    # The thread's reused answer empties its list of pieces in place, keeping the list's array
    # for the next request (_chunks_empty): an answer of many pieces (a write() per line of a
    # report) must not leave an array of that size to the thread for good. 500,000 pieces are
    # a 4 MB array; what the answers leave allocated afterwards is counted by tracemalloc (the
    # empty pieces are the one shared empty bytes: nothing else of them stays).
    import tracemalloc

    pieces = 500_000

    def app(environ: Environ, start_response: Any) -> list[bytes]:
        write = start_response("200 OK", [("Content-Length", "0")])
        if environ["QUERY_STRING"] == "many":
            for _ in range(pieces):
                write(b"")
        return []

    with serving(as_app(app).build(), threads=1) as srv, Conn(srv.port, 30.0) as c:
        c.send(get("/"))
        assert c.reply().status == 200
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            c.send(get("/?many"))
            assert c.reply().status == 200
            c.send(get("/"))  # the thread's answer reused, its list emptied again
            assert c.reply().status == 200
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert kept < pieces * 8 // 4, kept


def test_start_response_takes_its_arguments_by_name_and_refuses_a_wrong_call() -> None:
    # PEP 3333 names them status, response_headers and exc_info; a call with keywords, or with
    # a wrong number of arguments, is parsed as a Python function's would be.
    errors: list[str] = []

    def app(environ: Environ, start_response: Any) -> list[bytes]:
        for bad in [(), ("200 OK",), ("200 OK", [], None, None)]:
            try:
                start_response(*bad)
            except TypeError as e:
                errors.append(str(e))
        try:
            start_response("200 OK", [], nothing=1)
        except TypeError as e:
            errors.append(str(e))
        if environ["PATH_INFO"] == "/named":
            start_response(status="201 Created", response_headers=[("X-A", "1")])
        else:
            start_response("500 Oops", [("X-A", "0")])
            start_response("202 Accepted", [("X-A", "2")], exc_info=(None, None, None))
        return [b"x"]

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        c.send(get("/named"))
        r = c.reply()
        assert (r.status, r.header("x-a")) == (201, "1")
        c.send(get("/exc"))
        r = c.reply()
        assert (r.status, r.header("x-a")) == (202, "2")
    assert len(errors) == 8 and all("argument" in e for e in errors), errors


def test_the_apps_own_server_is_kept_and_its_date_gives_way_to_the_engines() -> None:
    # As gunicorn and uvicorn do: the app's Server is sent, and the engine adds none.
    def app(environ: Environ, start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Date", "yesterday"), ("Server", "app/1"),
                                  ("Connection", "keep-alive"), ("Keep-Alive", "timeout=5")])
        return [b"x"]

    with serve_wsgi(app) as srv:
        r = request(srv.port, get("/"))
        assert (r.status, r.reason) == (200, "OK")
        assert r.raw_head.count(b"Server:") == 1 and r.header("server") == "app/1"
        assert r.header("date") != "yesterday"
        assert r.header("keep-alive") is None


@pytest.mark.parametrize("status, reason", [
    ("200 OK", "OK"), ("200", "OK"), ("404 Not Found", "Not Found"),
    ("200 Everything Fine", "Everything Fine"), ("404 Nowhere\tto be\xe9n", "Nowhere\tto be\xe9n"),
    ("200 ", ""), ("299 Custom", "Custom"),
])
def test_the_apps_reason_phrase_is_sent_as_given(status: str, reason: str) -> None:
    def app(environ: Environ, start_response: Any) -> list[bytes]:
        start_response(status, [])
        return [b"x"]

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        for _ in range(2):  # the second from the status lines already seen
            c.send(get("/"))
            r = c.reply()
            assert r.raw_head.startswith(f"HTTP/1.1 {status[:3]} {reason}\r\n".encode("latin-1"))
            # Without a Server of the app's, the engine's.
            assert r.raw_head.count(b"Server:") == 1 and r.header("server") == "cyserve"
            assert r.body == b"x"


def test_a_streamed_answer_keeps_the_apps_server_and_reason() -> None:
    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("202 Taken Care Of", [("Server", "app/2")])
        yield b"a"
        yield b"b"

    with serve_wsgi(app) as srv:
        r = request(srv.port, get("/"))
        assert (r.status, r.reason, r.body) == (202, "Taken Care Of", b"ab")
        assert r.raw_head.count(b"Server:") == 1 and r.header("server") == "app/2"
        assert r.header("transfer-encoding") == "chunked"


@pytest.mark.parametrize("kind, why", [
    ("bad reason", "the reason phrase holds a control character"),
    ("DEL in reason", "the reason phrase holds a control character"),
    ("CR in reason", "invalid WSGI status"),
    ("two Server", "header 'server' given twice"),
])
def test_a_bad_reason_or_server_is_a_500_that_names_it(
        kind: str, why: str, caplog: pytest.LogCaptureFixture) -> None:
    closed: list[bool] = []
    with serve_wsgi(failing_app(kind, closed)) as srv, caplog.at_level(logging.ERROR):
        r = request(srv.port, get("/"))
    assert (r.status, r.reason, r.body) == (500, "Internal Server Error",
                                            b"500 Internal Server Error\n")
    assert r.raw_head.count(b"Server:") == 1 and r.header("server") == "cyserve"
    text = "\n".join(rec.getMessage() + "\n" + (rec.exc_text or "") for rec in caplog.records)
    assert why in text


def test_content_length_from_the_app_is_checked_and_announced_for_head() -> None:
    def app(environ: Environ, start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Length", "5")])
        # Like Werkzeug: an answer to HEAD has no body, but says what GET would send.
        return [] if environ["REQUEST_METHOD"] == "HEAD" else [b"hello"]

    with serve_wsgi(app) as srv:
        r = request(srv.port, get("/"))
        assert (r.status, r.body, r.header("content-length")) == (200, b"hello", "5")
        r = request(srv.port, b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (r.status, r.header("content-length")) == (200, "5")


def test_connection_close_from_the_app_closes_after_the_answer() -> None:
    def app(environ: Environ, start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Connection", "Close")])
        return [b"bye"]

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        c.send(get("/"))
        r = c.reply()
        assert (r.body, r.header("connection")) == (b"bye", "close")
        assert c.is_closed()


def test_an_error_page_replaces_the_first_answer_with_exc_info() -> None:
    def app(environ: Environ, start_response: Any) -> list[bytes]:
        write = start_response("200 OK", [("X-First", "1")])
        write(b"partial")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            import sys
            start_response("503 Service Unavailable", [("Retry-After", "1")], sys.exc_info())
        return [b"try later"]

    with serve_wsgi(app) as srv:
        r = request(srv.port, get("/"))
        assert (r.status, r.body, r.header("x-first")) == (503, b"try later", None)
        assert r.header("retry-after") == "1"


class Closing:
    """A response iterable that records its close()."""

    def __init__(self, items: list[Any], closed: list[bool]) -> None:
        self.items = items
        self.closed = closed

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            if isinstance(item, Exception):
                raise item
            yield item

    def close(self) -> None:
        self.closed.append(True)


def failing_app(kind: str, closed: list[bool]) -> Any:
    def app(environ: Environ, start_response: Any) -> Any:
        if kind == "raises":
            raise ValueError("the app failed")
        if kind == "no start_response":
            return Closing([b"x"], closed)
        if kind == "twice":
            start_response("200 OK", [])
            start_response("200 OK", [])
        if kind == "bad status":
            start_response("200", [])  # no reason phrase is fine: the next line is not
            start_response("2000 OK", [], (None, None, None))
        if kind == "1xx status":
            start_response("103 Early Hints", [])
        if kind == "status not str":
            start_response(200, [])
        if kind == "headers not list":
            start_response("200 OK", {"A": "b"})
        if kind == "header not str":
            start_response("200 OK", [("A", 1)])
        if kind == "hop-by-hop":
            start_response("200 OK", [("Transfer-Encoding", "chunked")])
        if kind == "upgrade":
            start_response("200 OK", [("Upgrade", "websocket")])
        if kind == "bad header value":
            start_response("200 OK", [("A", "b\r\nInjected: yes")])
        if kind == "wrong content-length":
            start_response("200 OK", [("Content-Length", "3")])
        if kind == "bad content-length":
            start_response("200 OK", [("Content-Length", "+5")])
            return Closing([b"hello"], closed)
        if kind == "str chunk":
            start_response("200 OK", [])
            return Closing([b"", "text"], closed)
        if kind == "iteration raises":
            start_response("200 OK", [])
            return Closing([b"", KeyError("before the body")], closed)
        if kind == "too long":  # with a length, the first piece does not start the answer
            start_response("200 OK", [("Content-Length", "3")])
            return Closing([b"ok", b"ok"], closed)
        if kind == "bad reason":
            start_response("200 Fine\x01", [])
        if kind == "DEL in reason":
            start_response("200 Fine\x7f", [])
        if kind == "CR in reason":
            start_response("200 Fine\r\nInjected: yes", [])
        if kind == "two Server":
            start_response("200 OK", [("Server", "a"), ("server", "b")])
        if kind == "body on 204":
            start_response("204 No Content", [])
        return Closing([b"body"], closed)

    return app


@pytest.mark.parametrize("kind", ["raises", "no start_response", "twice", "bad status",
                                  "1xx status", "status not str", "headers not list",
                                  "header not str", "hop-by-hop", "upgrade", "bad header value",
                                  "wrong content-length", "bad content-length", "str chunk",
                                  "iteration raises", "too long", "body on 204"])
def test_what_the_app_gets_wrong_is_a_500_and_a_logged_error(
        kind: str, caplog: pytest.LogCaptureFixture) -> None:
    closed: list[bool] = []
    with serve_wsgi(failing_app(kind, closed)) as srv, caplog.at_level(logging.ERROR):
        with Conn(srv.port) as c:
            c.send(get("/"))
            r = c.reply()
            assert (r.status, r.body) == (500, b"500 Internal Server Error\n")
            c.send(get("/"))  # the connection and the server go on
            assert c.reply().status == 500
    assert any("failed for GET /" in rec.getMessage() for rec in caplog.records)
    if kind not in ("raises", "twice", "bad status", "1xx status", "status not str",
                    "headers not list", "header not str", "hop-by-hop", "upgrade",
                    "bad header value"):
        assert closed == [True, True]  # close() is called whatever went wrong


def test_the_error_names_the_mistake(caplog: pytest.LogCaptureFixture) -> None:
    closed: list[bool] = []
    with serve_wsgi(failing_app("str chunk", closed)) as srv, caplog.at_level(logging.ERROR):
        request(srv.port, get("/"))
    text = "\n".join(rec.getMessage() + "\n" + (rec.exc_text or "") for rec in caplog.records)
    assert "the WSGI application yielded a str, not bytes" in text


# The app's Content-Length is read as a C integer on the answer's own path (native/wsgi.pyx,
# length_int): only 1*DIGIT (RFC 9110 8.6), with the spaces around it that _content_length
# strips, and at most 18 digits, whatever else int() would take; held or streamed alike.
@pytest.mark.parametrize("value, ok", [
    ("5", True), (" 5", True), ("5\t", True), ("000000000000000005", True),
    ("+5", False), ("-5", False), ("-1", False), ("", False), ("0x5", False), ("5_0", False),
    ("\u0665", False), ("\uff15", False), ("0000000000000000005", False),
    ("9223372036854775813", False), ("18446744073709551621", False), ("5\r\n", False)])
@pytest.mark.parametrize("body", ["list", "generator"])
def test_a_content_length_is_digits_whatever_int_takes(value: str, ok: bool, body: str) -> None:
    def app(environ: Environ, start_response: Any) -> Any:
        start_response("200 OK", [("Content-Length", value)])
        if body == "list":
            return [b"hel", b"lo"]
        return (piece for piece in (b"hel", b"lo"))

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        # (HEAD with a generator is another matter: what of it is run.)
        for method in ("GET", "HEAD") if body == "list" else ("GET",):
            c.send(f"{method} / HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            r = c.reply(head_only=method == "HEAD")
            if ok:
                assert (r.status, r.header("content-length")) == (200, "5"), (method, r)
                assert r.body == (b"hello" if method == "GET" else b""), (method, r)
            else:
                assert r.status == 500, (method, r)


# ---- streamed answers ---------------------------------------------------------------------

def test_a_piece_goes_out_before_the_next_is_produced() -> None:
    # Server-sent events: the generator waits for the client to have seen piece 1 before it
    # yields piece 2, so this only passes if each piece is sent as it comes.
    seen = threading.Event()

    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/event-stream")])
        yield b"data: 1\n\n"
        assert seen.wait(10), "the client never got the first event"
        yield b"data: 2\n\n"

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        c.send(get("/events"))
        head = c.read_until(b"\r\n\r\n")
        assert b"Transfer-Encoding: chunked\r\n" in head and b"Content-Length" not in head
        assert c.read_until(b"data: 1\n\n\r\n") == b"9\r\ndata: 1\n\n\r\n"
        seen.set()
        assert c.read_until(b"0\r\n\r\n") == b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"
        c.send(get("/again"))  # the connection goes on after a chunked answer
        seen.set()
        assert c.reply().body == b"data: 1\n\ndata: 2\n\n"


def pieces(n: int, size: int, produced: list[int] | None = None) -> Iterator[bytes]:
    for i in range(n):
        if produced is not None:
            produced.append(i)
        yield bytes([65 + i % 26]) * size


def test_http10_gets_the_stream_until_the_connection_closes() -> None:
    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [])
        return pieces(3, 5)

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        c.send(b"GET / HTTP/1.0\r\n\r\n")
        r = c.reply()
        assert r.header("transfer-encoding") is None and r.header("content-length") is None
        assert r.header("connection") == "close"
        assert r.body == b"AAAAABBBBBCCCCC"


def test_a_long_body_with_its_length_is_streamed_as_it_is() -> None:
    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Length", str(40 * 65536))])
        return pieces(40, 65536)

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        for _ in range(2):  # keep-alive: the length framed it
            c.send(get("/big"))
            r = c.reply()
            assert r.header("transfer-encoding") is None
            assert r.body == b"".join(pieces(40, 65536))


def test_a_slow_reader_slows_the_producer_down() -> None:
    # 640 MB on offer; a client that reads nothing lets the server produce only what the
    # socket buffers hold, not the whole body into memory.
    produced: list[int] = []

    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [])
        return pieces(10_000, 65536, produced)

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        c.send(get("/huge"))
        c.read_until(b"\r\n\r\n")
        time.sleep(0.5)
        assert 1 <= len(produced) < 500, len(produced)


def test_a_failure_midway_cuts_the_answer_short(caplog: pytest.LogCaptureFixture) -> None:
    closed: list[bool] = []

    def app(environ: Environ, start_response: Any) -> Any:
        start_response("200 OK", [])
        return Closing([b"first", RuntimeError("failed midway")], closed)

    with serve_wsgi(app) as srv, caplog.at_level(logging.ERROR), Conn(srv.port) as c:
        c.send(get("/"))
        head = c.read_until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"chunked" in head
        while c._fill():
            pass
        # The piece that was sent, then the close: no last chunk, so the client knows.
        assert c.buf == b"5\r\nfirst\r\n"
    assert closed == [True]
    assert any("failed while streaming" in rec.getMessage() for rec in caplog.records)


def test_a_streamed_body_past_its_content_length_is_cut_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """A body long enough to be streamed (past WSGI_STREAM_AFTER) that goes on past the
    Content-Length its app announced: the client gets exactly the announced bytes and the
    connection goes on (gunicorn cuts it the same way), and the error log says which request it
    was, once (the app is in no call that could raise)."""
    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Length", "70000")])
        yield b"a" * 65536
        yield b"b" * 10000
        yield b"c" * 10

    with serve_wsgi(app) as srv, caplog.at_level(logging.ERROR), Conn(srv.port) as c:
        c.send(get("/long"))
        r = c.reply()
        assert (r.status, r.header("content-length")) == (200, "70000")
        assert r.body == b"a" * 65536 + b"b" * 4464
        c.send(get("/next"))  # the connection stayed open
        assert c.reply().body == r.body
    lines = [rec.getMessage() for rec in caplog.records if "past its Content-Length" in
             rec.getMessage()]
    assert len(lines) == 2, lines
    assert "GET /long" in lines[0] and "Content-Length 70000" in lines[0], lines
    assert "GET /next" in lines[1], lines


def test_a_body_that_fills_its_content_length_then_goes_on_is_cut_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """Pieces that fill the announced Content-Length exactly, then one more: the answer is the
    announced bytes (as gunicorn's), the connection goes on, and the error log says which
    request went on past its length, as for a streamed body (the next test). The rest of the
    iterable is looked at, as PEP 3333's server iterates to the end; it used to be dropped
    without a word. A body that ends where announced says nothing."""
    closed: list[bool] = []

    def app(environ: Environ, start_response: Any) -> Any:
        start_response("200 OK", [("Content-Length", "4")])
        extra = [b"more"] if environ["PATH_INFO"] == "/long" else []
        return Closing([b"ok", b"ok", b""] + extra, closed)

    with serve_wsgi(app) as srv, caplog.at_level(logging.ERROR), Conn(srv.port) as c:
        for path in ("/exact", "/long", "/exact"):
            c.send(get(path))
            r = c.reply()
            assert (r.status, r.header("content-length"), r.body) == (200, "4", b"okok")
    lines = [rec.getMessage() for rec in caplog.records if "past its Content-Length" in
             rec.getMessage()]
    assert len(lines) == 1 and "GET /long" in lines[0] and "Content-Length 4" in lines[0], lines
    assert closed == [True, True, True]


def test_a_streamed_body_that_fills_its_content_length_then_goes_on_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """The pieces of a streamed body fill the announced Content-Length exactly and the app has
    more: the engine asks for no piece past the length, so the server looks for one when it lets
    the stream go, and logs it as it logs a piece that crosses the length (the client gets
    exactly the announced bytes, the connection goes on). It went unsaid before."""
    closed: list[bool] = []

    def app(environ: Environ, start_response: Any) -> Any:
        start_response("200 OK", [("Content-Length", "70000")])
        extra = [b"c" * 10] if environ["PATH_INFO"].endswith("long") else []
        return Closing([b"a" * 65536, b"b" * 4464, b""] + extra, closed)

    with serve_wsgi(app) as srv, caplog.at_level(logging.ERROR):
        with Conn(srv.port) as c:
            for path in ("/exact", "/long"):
                c.send(get(path))
                r = c.reply()
                assert (r.status, r.header("content-length")) == (200, "70000")
                assert r.body == b"a" * 65536 + b"b" * 4464
        # HTTP/2 lets the stream go on its own path (the stream's end, not send_stream's).
        with H2(srv.port) as h:
            for path in ("/exact", "/h2-long"):
                status, headers, body = h.get(path)
                assert (status, headers["content-length"]) == (200, "70000")
                assert body == b"a" * 65536 + b"b" * 4464
        deadline = time.monotonic() + 5
        while len(closed) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)  # the stream is let go after the answer is sent
    lines = [rec.getMessage() for rec in caplog.records if "past its Content-Length" in
             rec.getMessage()]
    assert len(lines) == 2, lines
    assert "GET /long" in lines[0] and "GET /h2-long" in lines[1], lines
    assert closed == [True] * 4


@pytest.mark.parametrize("protocol", ["http/1.1", "h2"])
@pytest.mark.parametrize("after", ["waits", "empty pieces"])
@pytest.mark.parametrize("body", ["yielded", "empty", "written"])
def test_a_body_that_fills_its_content_length_goes_out_before_the_app_goes_on(
        body: str, after: str, protocol: str, caplog: pytest.LogCaptureFixture) -> None:
    """A generator that fills its announced Content-Length and then does not end: it waits
    (work after its last piece, a server-sent-events loop) or yields empty pieces for ever. The
    length is filled by a piece (yielded), by write() before the generator's first, empty,
    piece (written), or is 0, where the first piece is empty too (PEP 3333's one answer whose
    head may go before any byte of its body). The client gets the whole answer at once, as
    gunicorn sends each piece as it comes; looking for a piece past the length before sending
    left it waiting for the generator, for ever here (with an empty piece, whatever the length
    was, it waited for a piece with bytes). The generator is closed once, nothing is logged (no
    byte went past the length), and the connection serves the next request."""
    gate = threading.Event()
    closed: list[bool] = []
    want = {"yielded": b"hello", "empty": b"", "written": b"hey"}[body]

    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        if environ["PATH_INFO"] == "/next":
            start_response("200 OK", [("Content-Length", "5")])
            yield b"next!"
            return
        write = start_response("200 OK", [("Content-Length", str(len(want)))])
        try:
            if body == "written":
                write(want)
            yield want if body == "yielded" else b""
            while not gate.is_set():
                if after == "waits":
                    gate.wait(60.0)
                else:
                    yield b""
        finally:
            closed.append(True)

    # The generator goes on for 60 s or more: a reply within 10 s came before its end.
    with serve_wsgi(app) as srv, caplog.at_level(logging.ERROR):
        if protocol == "h2":
            with H2(srv.port, timeout=10.0) as h:
                try:
                    status, headers, got = h.get("/")
                    assert (status, headers["content-length"], got) == (200, str(len(want)), want)
                finally:
                    gate.set()
                assert h.get("/next")[2] == b"next!"
        else:
            with Conn(srv.port, 10.0) as c:
                try:
                    c.send(get("/"))
                    r = c.reply()
                    assert (r.status, r.header("content-length"), r.body) == (
                        200, str(len(want)), want)
                finally:
                    gate.set()
                c.send(get("/next"))
                assert c.reply().body == b"next!"
        deadline = time.monotonic() + 10
        while not closed and time.monotonic() < deadline:
            time.sleep(0.01)  # the stream is let go after the answer is sent
    assert closed == [True]
    assert not [rec for rec in caplog.records if "past its Content-Length" in rec.getMessage()]


@pytest.mark.parametrize("protocol", ["http/1.1", "h2"])
def test_empty_pieces_for_ever_past_the_content_length_are_closed(
        protocol: str, caplog: pytest.LogCaptureFixture) -> None:
    """A generator that fills its Content-Length and then yields empty pieces for ever, with
    nothing to stop it: the server reads a bounded number of them (WSGI_EMPTY_PAST_LENGTH, 64)
    and closes it, with a line that says so. Reading on held the GIL and the connection for
    good: every Python call of the process stalled behind it, and the next request on the
    connection never came. The connection serves the next request."""
    closed: list[int] = []

    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Length", "5")])
        if environ["PATH_INFO"] == "/next":
            yield b"next!"
            return
        n = 0
        try:
            yield b"hello"
            while True:
                n += 1
                yield b""
        finally:
            closed.append(n)

    with serve_wsgi(app) as srv, caplog.at_level(logging.ERROR):
        if protocol == "h2":
            with H2(srv.port, timeout=10.0) as h:
                assert h.get("/")[2] == b"hello"
                assert h.get("/next")[2] == b"next!"
        else:
            with Conn(srv.port, 10.0) as c:
                c.send(get("/"))
                assert c.reply().body == b"hello"
                c.send(get("/next"))
                assert c.reply().body == b"next!"
        deadline = time.monotonic() + 10
        while not closed and time.monotonic() < deadline:
            time.sleep(0.01)  # the stream is let go after the answer is sent
    assert closed == [64]
    lines = [rec.getMessage() for rec in caplog.records if "empty pieces" in rec.getMessage()]
    assert len(lines) == 1 and "GET /" in lines[0] and "Content-Length 5" in lines[0], lines


@pytest.mark.parametrize("protocol", ["http/1.1", "h2"])
@pytest.mark.parametrize("rest", ["waits", "empty pieces"])
@pytest.mark.parametrize("length", [None, "5", "0"])
def test_head_answered_by_a_generator_goes_out_without_its_rest(
        length: str | None, rest: str, protocol: str) -> None:
    """HEAD answered by a generator whose rest never ends: it waits (a slow generator,
    server-sent events) or yields empty pieces for ever. No body is sent to HEAD, so the head
    goes as soon as it says what GET would send: at the first piece with bytes (here "hello"),
    or at once with "Content-Length: 0" (whose first piece is empty). The rest is not read: the
    generator is closed (once) at that first piece, and the connection serves the next request
    at once. With a length announced, the rest used to be read to its end before the head went:
    for ever here, a worker spinning on the empty pieces. gunicorn sends the head at once but
    reads the rest to its end (test_wsgi_gunicorn_diff.py,
    test_head_with_a_slow_generator_is_not_held_by_its_rest)."""
    gate = threading.Event()
    closed: list[bool] = []
    rest_read: list[bool] = []
    first = b"" if length == "0" else b"hello"

    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        if environ["PATH_INFO"] == "/next":
            start_response("200 OK", [("Content-Length", "5")])
            yield b"next!"
            return
        start_response("200 OK", [] if length is None else [("Content-Length", length)])
        try:
            yield first
            rest_read.append(True)
            while not gate.is_set():
                if rest == "waits":
                    gate.wait(60.0)
                else:
                    yield first
        finally:
            closed.append(True)

    # The generator goes on for 60 s or more: a reply within 10 s came before its end.
    with serve_wsgi(app) as srv:
        try:
            if protocol == "h2":
                with H2(srv.port, timeout=10.0) as h:
                    status, headers, got = h.response(h.send("/", method="HEAD"))
                    assert (status, headers.get("content-length"), got) == (200, length, b"")
                    assert h.get("/next")[2] == b"next!"
            else:
                with Conn(srv.port, 10.0) as c:
                    c.send(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n")
                    r = c.reply(head_only=True)
                    assert (r.status, r.header("content-length")) == (200, length)
                    assert r.header("transfer-encoding") is None
                    c.send(get("/next"))
                    assert c.reply().body == b"next!"
        finally:
            gate.set()
    assert closed == [True] and rest_read == []


@pytest.mark.parametrize("protocol", ["http/1.1", "h2"])
@pytest.mark.parametrize("case", ["a 204 with bytes", "past its length"])
def test_head_is_refused_where_get_is_though_its_rest_is_not_read(
        case: str, protocol: str, caplog: pytest.LogCaptureFixture) -> None:
    """An answer to HEAD is cut at its first piece with bytes (the test above), but that piece
    is checked as GET's is: a 204 that has a body, or a first piece longer than the announced
    Content-Length, is the app's mistake, a 500 to GET and to HEAD alike. (An answer to HEAD of
    unknown length used to drop its first piece unchecked: a 204 with a body was a 204.) The
    generator is closed once for each."""
    closed: list[bool] = []

    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        if case == "a 204 with bytes":
            start_response("204 No Content", [])
        else:
            start_response("200 OK", [("Content-Length", "3")])
        try:
            yield b"hello"
            yield b"more"
        finally:
            closed.append(True)

    with serve_wsgi(app) as srv, caplog.at_level(logging.ERROR):
        if protocol == "h2":
            with H2(srv.port) as h:
                assert h.get("/")[0] == 500
                assert h.response(h.send("/", method="HEAD"))[0] == 500
        else:
            with Conn(srv.port) as c:
                c.send(get("/"))
                assert c.reply().status == 500
                c.send(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n")
                assert c.reply(head_only=True).status == 500
    failed = [rec for rec in caplog.records if "failed for" in rec.getMessage()]
    assert [rec.getMessage().rsplit(" ", 2)[1] for rec in failed] == ["GET", "HEAD"]
    assert all("does not match" in (rec.exc_text or "") or "cannot have a body"
               in (rec.exc_text or "") for rec in failed), failed
    assert closed == [True, True]


@pytest.mark.parametrize("how", ["at once", "pipelined", "after a pause"])
@pytest.mark.parametrize("nxt", ["/w/next", "/static", "/missing"])
def test_a_generators_rest_is_read_before_the_next_request_is_answered(how: str,
                                                                        nxt: str) -> None:
    """A generator that fills its Content-Length (every Flask answer) is answered first and its
    rest read afterwards, in a call of its own. The code after its last piece has run, and the
    generator is closed, before the next request on the connection is answered: by the app
    itself, by a static route, or by the engine's 404, as under gunicorn, which reads the rest
    before it reads the next request."""
    events: list[str] = []

    def body() -> Iterator[bytes]:
        try:
            yield b"hello"
            events.append("rest")  # work after the last piece
        finally:
            events.append("closed")

    def gen(environ: Environ, start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Length", "5")])
        if environ["PATH_INFO"] == "/next":
            events.append("next")
            return [b"next!"]
        return body()

    app = cyserve.App()
    app.wsgi("/w", gen)
    app.static("/static", "static!")
    with serving(app.build()) as srv, Conn(srv.port, 10.0) as c:
        for _ in range(3):
            del events[:]
            if how == "pipelined":
                c.send(get("/w/gen") + get(nxt))
                assert c.reply().body == b"hello"
            else:
                c.send(get("/w/gen"))
                assert c.reply().body == b"hello"
                if how == "after a pause":
                    # No request follows: the rest is read all the same, soon.
                    deadline = time.monotonic() + 10
                    while len(events) < 2 and time.monotonic() < deadline:
                        time.sleep(0.001)
                    assert events == ["rest", "closed"]
                c.send(get(nxt))
            r = c.reply()
            # No wait here: the rest was read before this answer went out.
            if nxt == "/w/next":
                assert (r.status, r.body) == (200, b"next!")
                assert events == ["rest", "closed", "next"]
            else:
                assert r.status == (200 if nxt == "/static" else 404)
                assert events == ["rest", "closed"]


def test_write_while_a_stream_is_made_goes_out_in_order() -> None:
    """write() called by a generator between its pieces, once the answer streams: the bytes go
    out before the next piece, in the order the app gave them (gunicorn sends them at once).
    They used to be kept for an answer already sent, and lost."""
    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        write = start_response("200 OK", [("Content-Type", "text/plain")])

        def pieces() -> Iterator[bytes]:
            yield b"one "
            write(b"two ")
            yield b"three "
            write(b"four")
        return pieces()

    with serve_wsgi(app) as srv:
        r = request(srv.port, get("/"))
        assert (r.status, r.header("transfer-encoding"), r.body) == (200, "chunked",
                                                                     b"one two three four")


def test_exc_info_once_the_head_is_out_raises_and_cuts_the_answer(
        caplog: pytest.LogCaptureFixture) -> None:
    """start_response called with exc_info after the first piece of a streamed answer went out:
    the head cannot be replaced, so start_response raises the app's error again (PEP 3333) and
    the answer is cut short, with no last chunk. It used to be taken as a new answer that was
    never sent, and the app's next piece went out as if nothing had failed."""
    raised: list[BaseException] = []

    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        yield b"first"
        try:
            raise RuntimeError("failed midway")
        except RuntimeError:
            import sys
            try:
                start_response("500 Internal Server Error", [], sys.exc_info())
            except RuntimeError as e:
                raised.append(e)
                raise
        yield b"never sent"

    with serve_wsgi(app) as srv, caplog.at_level(logging.ERROR), Conn(srv.port) as c:
        c.send(get("/"))
        head = c.read_until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"chunked" in head
        while c._fill():
            pass
        assert c.buf == b"5\r\nfirst\r\n"
    assert [str(e) for e in raised] == ["failed midway"]
    assert any("failed while streaming" in rec.getMessage() for rec in caplog.records)


def test_an_error_page_after_a_streamed_answer_on_the_same_thread() -> None:
    """A thread reuses its answer object for its next request (_answer_for): a streamed answer
    marks it sent, and a reuse that kept the mark made the next request's start_response with
    exc_info before any body raise the app's error (a 500) instead of replacing its answer.
    One worker thread, so each request after the stream gets the reused answer."""
    def app(environ: Environ, start_response: Any) -> Any:
        if environ["PATH_INFO"] == "/stream":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return (b"x" * 40000 for _ in range(3))  # past 64 KiB: streamed
        start_response("200 OK", [("X-First", "1")])
        try:
            raise RuntimeError("changed its mind")
        except RuntimeError:
            import sys
            start_response("503 Service Unavailable", [("Retry-After", "1")], sys.exc_info())
        return [b"later"]

    with serving(as_app(app).build(), threads=1) as srv, Conn(srv.port) as c:
        for _ in range(3):
            c.send(get("/stream"))
            assert c.reply().body == b"x" * 120000
            c.send(get("/error-page"))
            r = c.reply()
            assert (r.status, r.body, r.header("x-first")) == (503, b"later", None)


def test_a_client_that_leaves_midway_gets_the_stream_closed() -> None:
    closed = threading.Event()

    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [])
        try:
            while True:
                yield b"x" * 65536
        finally:
            closed.set()

    with serve_wsgi(app) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(get("/endless"))
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert closed.wait(10), "the generator was never closed"


def test_a_stream_the_stop_cuts_short_is_still_closed() -> None:
    # Past the grace period the stop cancels everything, offloaded calls included, so the
    # engine cannot ask the handler to close the stream itself: Server.stop() does it after.
    closed = threading.Event()

    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [])
        try:
            while True:
                yield b"event\n"
                time.sleep(0.02)
        finally:
            closed.set()

    srv = Server(as_app(app).build(), host="127.0.0.1", port=0, threads=2)
    srv.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(get("/events"))
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
            srv.stop(grace=0.2)
            assert closed.is_set(), "the generator was not closed by the stop"
    finally:
        srv.stop(grace=0)


def test_more_than_announced_is_cut_and_less_closes_the_connection() -> None:
    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        n = 100_000
        start_response("200 OK", [("Content-Length", str(n))])
        if environ["PATH_INFO"] == "/more":
            return pieces(3, 65536)  # 196,608 bytes for 100,000 announced
        return pieces(1, 70_000)  # fewer: past 64 KiB it was already streaming

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        c.send(get("/more"))
        r = c.reply()
        assert len(r.body) == 100_000
        c.send(get("/less"))
        head = c.read_until(b"\r\n\r\n")
        assert b"Content-Length: 100000\r\n" in head
        while c._fill():
            pass
        assert len(c.buf) == 70_000  # and then the close: the client sees the short body


def test_head_of_a_stream_says_no_length() -> None:
    def app(environ: Environ, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return pieces(3, 5)

    with serve_wsgi(app) as srv, Conn(srv.port) as c:
        c.send(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply(head_only=True)
        assert r.status == 200 and r.header("content-length") is None
        c.send(get("/"))
        assert c.reply().body == b"AAAAABBBBBCCCCC"


# ---- the PEP 3333 validator and a real framework -------------------------------------------

def validated_app(environ: Environ, start_response: Any) -> Iterator[bytes]:
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body) + 3))])
    return iter([b"ok:", body])


@pytest.mark.parametrize("data", [
    get("/v?q=1"),
    b"POST /v HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nbody",
    b"PUT /v HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
    b"GET /v HTTP/1.0\r\n\r\n",
])
def test_wsgiref_validator_finds_nothing_wrong(data: bytes) -> None:
    # wsgiref.validate checks the server's side of PEP 3333 (the environ's keys and types,
    # wsgi.input, start_response, close()): any finding is an AssertionError or a warning, both
    # of which make the request a 500 (the suite turns warnings into errors).
    with serving(as_app(validator(validated_app)).build()) as srv:
        r = request(srv.port, data)
        assert r.status == 200, r
        assert r.body.startswith(b"ok:")


def make_flask_app() -> Any:
    app = flask.Flask("cyserve_test")

    @app.get("/hello/<name>")
    def hello(name: str) -> str:
        return f"Hello, {name}! q={flask.request.args.get('q')}"

    @app.post("/json")
    def json_echo() -> Any:
        return flask.jsonify(got=flask.request.get_json(), ip=flask.request.remote_addr)

    @app.post("/form")
    def form() -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(flask.request.form.items()))

    @app.get("/cookie")
    def cookie() -> Any:
        resp = flask.make_response(f"seen={flask.request.cookies.get('seen')}")
        resp.set_cookie("seen", "yes")
        return resp

    @app.get("/go")
    def go() -> Any:
        return flask.redirect(flask.url_for("hello", name="there"))

    @app.get("/fail")
    def fail() -> str:
        raise RuntimeError("flask handler failed")

    @app.get("/stream")
    def stream() -> Any:
        return flask.Response((f"{i}," for i in range(3)), mimetype="text/csv")

    return app


def test_a_flask_app_runs_unmodified() -> None:
    fapp = make_flask_app()
    with serve_wsgi(fapp) as srv, Conn(srv.port) as c:
        def ask(data: bytes, head: bool = False) -> Reply:
            c.send(data)
            return c.reply(head_only=head)

        r = ask(get("/hello/caf%C3%A9?q=1"))
        assert (r.status, r.body) == (200, "Hello, café! q=1".encode())
        assert r.header("content-type") == "text/html; charset=utf-8"
        r = ask(b"HEAD /hello/x HTTP/1.1\r\nHost: t\r\n\r\n", head=True)
        assert (r.status, r.header("content-length")) == (200, str(len(b"Hello, x! q=None")))
        body = b'{"a": [1, 2]}'
        r = ask(b"POST /json HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert r.status == 200
        assert flask.json.loads(r.body) == {"got": {"a": [1, 2]}, "ip": "127.0.0.1"}
        form = b"b=2&a=%C3%A9"
        r = ask(b"POST /form HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-www-form-urlencoded"
                b"\r\nContent-Length: %d\r\n\r\n%s" % (len(form), form))
        assert (r.status, r.body) == (200, "a=é,b=2".encode())
        r = ask(get("/cookie", extra="Cookie: seen=no\r\n"))
        assert r.body == b"seen=no" and r.header("set-cookie").startswith("seen=yes")
        r = ask(get("/go", host="example.com"))
        assert (r.status, r.header("location")) == (302, "/hello/there")
        r = ask(get("/missing"))
        assert r.status == 404 and b"Not Found" in r.body
        r = ask(b"DELETE /json HTTP/1.1\r\nHost: t\r\n\r\n")
        assert r.status == 405 and r.header("allow") is not None
        r = ask(get("/fail"))  # Flask answers its own 500 and logs the traceback
        assert r.status == 500
        r = ask(get("/stream"))
        assert (r.status, r.body, r.header("transfer-encoding")) == (200, b"0,1,2,", "chunked")
        r = ask(b"HEAD /stream HTTP/1.1\r\nHost: t\r\n\r\n", head=True)
        assert (r.status, r.header("content-length")) == (200, None)


# ---- registering and loading --------------------------------------------------------------

def test_as_app_tells_an_app_from_a_wsgi_callable() -> None:
    app = cyserve.App()
    assert as_app(app) is app and as_app(app, "cyserve") is app
    wrapped = as_app(echo_environ)
    assert [r[:4] for r in wrapped.build()] == [("prefix", "/", None, "python")]
    assert as_app(echo_environ, "wsgi").build()[0][4].app is echo_environ


async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    pass


class AsgiClass:
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        pass


@pytest.mark.parametrize("obj, interface, message", [
    (42, "auto", "expected a cyserve.App, a WSGI or an ASGI application, got int 42"),
    (echo_environ, "cyserve", "expected a cyserve.App, got function"),
    (cyserve.App(), "wsgi", "interface 'wsgi' was asked for, but this is a cyserve.App"),
    (asgi_app, "wsgi", "is an async (ASGI) application, but interface 'wsgi' was asked for"),
    (AsgiClass(), "wsgi", "is an async (ASGI) application"),
    (echo_environ, "asgi", "interface 'asgi' was asked for, but function"),
    (cyserve.App(), "asgi", "interface 'asgi' was asked for, but this is a cyserve.App"),
])
def test_as_app_refuses_what_it_cannot_serve(obj: Any, interface: str, message: str) -> None:
    with pytest.raises(HandlerTypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        as_app(obj, interface)


def test_app_wsgi_checks_its_arguments() -> None:
    app = cyserve.App()
    with pytest.raises(HandlerTypeError, match="must be callable"):
        app.wsgi("/", 42)  # type: ignore[arg-type]
    with pytest.raises(RouteError, match="ASGI"):
        app.wsgi("/", asgi_app)
    with pytest.raises(RouteError, match="not a WSGI application"):
        app.wsgi("/", cyserve.App())  # type: ignore[arg-type]
    with pytest.raises(RouteError, match="must start with '/'"):
        app.wsgi("no-slash", echo_environ)
    with pytest.raises(HandlerTypeError, match=r"with \(environ, start_response\): its signature "
                                               r"is \(environ\)$"):
        app.wsgi("/", lambda environ: [])
    app.wsgi("/a", echo_environ)
    with pytest.raises(RouteError, match="duplicate route"):
        app.wsgi("/a/", echo_environ)
    assert len(app) == 1


def test_interface_option_is_validated() -> None:
    with pytest.raises(cyserve.ConfigError, match="invalid interface 'rsgi'"):
        Config(interface="rsgi")


def test_request_client_is_the_peer_address() -> None:
    # What REMOTE_ADDR and REMOTE_PORT come from, for any Python handler.
    seen: list[Any] = []

    def handler(req: Any) -> str:
        seen.append(req.client)
        return "ok"

    with serving([("path", "/", None, "python", handler)]) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(get("/"))
            assert s.recv(1024).startswith(b"HTTP/1.1 200")
            assert seen == [("127.0.0.1", s.getsockname()[1])]


def test_on_bound_runs_with_the_port_before_any_request_and_can_cancel_the_start() -> None:
    # serve() tells the apps an ephemeral port through Server.start(on_bound=...): once bound,
    # before any worker runs, instead of changing what running workers read.
    seen: list[tuple[int, bool]] = []
    srv = Server([("path", "/", None, "python", lambda req: "ok")], host="127.0.0.1", port=0,
                 threads=1)
    srv.start(on_bound=lambda port: seen.append((port, srv.running)))
    try:
        assert seen == [(srv.port, False)] and srv.port > 0
        assert request(srv.port, get("/")).body == b"ok"
    finally:
        srv.stop(grace=1.0)

    class Refused(Exception):
        pass

    def refuse(port: int) -> None:
        raise Refused(f"not on {port}")

    srv = Server([("path", "/", None, "python", lambda req: "ok")], host="127.0.0.1", port=0,
                 threads=1)
    with pytest.raises(Refused):
        srv.start(on_bound=refuse)
    assert not srv.running
    srv.start()  # nothing was left half started
    try:
        assert request(srv.port, get("/")).body == b"ok"
    finally:
        srv.stop(grace=1.0)
