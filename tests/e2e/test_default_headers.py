"""The fields the server writes on every answer (--header, --server-header, --date-header, as
uvicorn's options): each response writer honours them -- static answers (C, head built once),
GIL-free handlers (the inline path and the coroutine), Python handlers, WSGI, ASGI (streamed
too), files, the engine's own refusals (400, 404, 408, 413, 431, 503) and HTTP/2 for all of
them -- and a handler's own Server replaces the server's (uvicorn 0.54 sends both; cyserve
keeps one, RFC 9110 10.2.4)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from _rawhttp import Conn, Reply, get
from _subserve import env_with_src, free_port, running

import cyserve
from cyserve.config import Config
from cyserve.errors import ConfigError
from cyserve.start import serve

pytestmark = pytest.mark.native



def wsgi_app(environ: dict[str, Any], start_response: Any) -> Any:
    own = environ["PATH_INFO"] == "/own"
    start_response("200 OK", [("Content-Type", "text/plain")] + ([("Server", "app/2")] if own
                                                                  else []))
    return [b"wsgi"]


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    own = scope["path"].endswith("/own")
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]
                + ([(b"server", b"app/3")] if own else [])})
    if scope["path"].endswith("/stream"):
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})
        return
    await send({"type": "http.response.body", "body": b"asgi"})


# Set by /slow's handler when it starts: the request that must be past limit_concurrency waits
# for it, not for a fixed time a loaded machine may not keep.
SLOW_ENTERED = threading.Event()


def build_app(root: Path) -> cyserve.App:
    from examples import hello_nogil

    app = cyserve.App()
    app.static("/static", b"static")
    app.static("/static-own", b"static", headers=[("Server", "app/0")])
    app.nogil("/nogil", hello_nogil.ROOT)
    app.files("/files", root)

    @app.route("/py", methods=["GET", "POST"])
    def py(req: Any) -> str:
        return "py"

    @app.get("/py-own")
    def py_own(req: Any) -> Any:
        return cyserve.Response("own", headers=[("Server", "app/1")])

    @app.get("/slow")
    def slow(req: Any) -> str:
        SLOW_ENTERED.set()
        time.sleep(1.5)
        return "slow"

    app.wsgi("/wsgi", wsgi_app)
    app.asgi("/asgi", asgi_app)
    return app


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("head-root")
    (d / "f.txt").write_bytes(b"file")
    return d


def start(root: Path, **options: Any) -> tuple[threading.Event, threading.Thread, int]:
    stop = threading.Event()
    ready: list[Any] = []
    config = Config(host="127.0.0.1", port=0, threads=2, graceful_timeout=2.0,
                    max_body_bytes=1000, max_header_bytes=2048, header_timeout=1.0,
                    limit_concurrency=1, **options)
    th = threading.Thread(target=serve, args=(build_app(root), config),
                          kwargs={"stop_event": stop, "ready": ready.append}, daemon=True)
    th.start()
    deadline = time.monotonic() + 30
    while not ready and time.monotonic() < deadline and th.is_alive():
        time.sleep(0.01)
    assert ready, "the server did not start"
    return stop, th, ready[0].port


@pytest.fixture(scope="module")
def custom(root: Path) -> Iterator[int]:
    """--header X-Frame-Options: DENY --header 'X-Two: a b' (Server and Date as by default)."""
    stop, th, port = start(root, headers=(("X-Frame-Options", "DENY"), "X-Two:  a b "))
    yield port
    stop.set()
    th.join(30)


@pytest.fixture(scope="module")
def bare(root: Path) -> Iterator[int]:
    """--no-server-header --no-date-header --header X-Only: 1."""
    stop, th, port = start(root, headers=(("X-Only", "1"),), server_header=False,
                           date_header=False)
    yield port
    stop.set()
    th.join(30)


@pytest.fixture(scope="module")
def edge(root: Path) -> Iterator[int]:
    """--header Server: edge/1 replaces the engine's Server."""
    stop, th, port = start(root, headers=(("Server", "edge/1"),))
    yield port
    stop.set()
    th.join(30)


def h1(port: int, path: str, extra: str = "") -> Reply:
    with Conn(port) as c:
        c.send(get(path, extra=extra))
        return c.reply()


def fields(raw_head: bytes) -> list[tuple[str, str]]:
    lines = raw_head.decode("latin-1").split("\r\n")[1:]
    return [(n.strip().lower(), v.strip()) for n, _, v in (ln.partition(":") for ln in lines
                                                          if ln)]


def count(fs: list[tuple[str, str]], name: str) -> int:
    return sum(1 for n, _ in fs if n == name)


def value(fs: list[tuple[str, str]], name: str) -> str | None:
    got = [v for n, v in fs if n == name]
    assert len(got) <= 1, f"{name} sent {len(got)} times: {fs}"
    return got[0] if got else None


# Every kind of answer the engine writes (path, expected status, expected body).
PLAIN = [("/static", 200, b"static"), ("/nogil", 200, b"Hello, World!"), ("/py", 200, b"py"),
         ("/wsgi/x", 200, b"wsgi"), ("/asgi/x", 200, b"asgi"), ("/asgi/stream", 200, b"ab"),
         ("/files/f.txt", 200, b"file"), ("/nothing-here", 404, None)]
OWN = [("/static-own", "app/0"), ("/py-own", "app/1"), ("/wsgi/own", "app/2"),
       ("/asgi/own", "app/3")]


def refusals(port: int) -> Iterator[tuple[str, Reply]]:
    """The engine's own error answers: 400, 413, 431, 408 and 503 (limit_concurrency=1)."""
    with Conn(port) as c:
        c.send(b"GARBAGE\r\n\r\n")
        yield "400", c.reply()
    with Conn(port) as c:
        c.send(b"POST /py HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n")
        yield "413", c.reply()
    with Conn(port) as c:
        c.send(get("/py", extra="X-Big: " + "b" * 3000 + "\r\n"))
        yield "431", c.reply()
    with Conn(port) as c:
        c.send(b"GET /py HTTP/1.1\r\nHost: t\r\n")  # the head never ends: 408 after 1 s
        yield "408", c.reply()
    slow = Conn(port)
    try:
        SLOW_ENTERED.clear()
        slow.send(get("/slow"))
        assert SLOW_ENTERED.wait(10)  # the slow request is in its handler: the next one is
        # past the limit
        with Conn(port) as c:
            c.send(get("/py"))
            yield "503", c.reply()
        assert slow.reply().body == b"slow"
    finally:
        slow.close()


def test_header_added_to_every_http1_answer(custom: int) -> None:
    for path, status, body in PLAIN:
        for _ in range(2):  # the GIL-free route answers inline after its first call
            r = h1(custom, path)
            fs = fields(r.raw_head)
            assert r.status == status and (body is None or r.body == body), path
            assert value(fs, "x-frame-options") == "DENY", (path, fs)
            assert value(fs, "x-two") == "a b", (path, fs)
            assert value(fs, "server") == "cyserve", (path, fs)
            assert count(fs, "date") == 1, (path, fs)
    for what, r in refusals(custom):
        fs = fields(r.raw_head)
        assert str(r.status) == what, (what, r.status)
        assert value(fs, "x-frame-options") == "DENY" and value(fs, "server") == "cyserve", what
        assert count(fs, "date") == 1, what


def test_no_server_no_date(bare: int) -> None:
    for path, status, _ in PLAIN:
        for _ in range(2):
            r = h1(bare, path)
            fs = fields(r.raw_head)
            assert r.status == status, path
            assert value(fs, "x-only") == "1", (path, fs)
            assert count(fs, "server") == 0 and count(fs, "date") == 0, (path, fs)
    for what, r in refusals(bare):
        fs = fields(r.raw_head)
        assert str(r.status) == what
        assert value(fs, "x-only") == "1", what
        assert count(fs, "server") == 0 and count(fs, "date") == 0, (what, fs)
    for path, server in OWN:
        fs = fields(h1(bare, path).raw_head)
        assert value(fs, "server") == server and value(fs, "x-only") == "1", (path, fs)


def test_the_applications_server_wins(custom: int, edge: int) -> None:
    for port in (custom, edge):
        for path, server in OWN:
            fs = fields(h1(port, path).raw_head)
            assert value(fs, "server") == server, (path, fs)
    for path, _, _ in PLAIN:
        fs = fields(h1(edge, path).raw_head)
        assert value(fs, "server") == "edge/1", (path, fs)


class H2:
    """One h2c connection by prior knowledge, with the `h2` library as the client."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def get(self, path: str) -> tuple[list[tuple[str, str]], bytes]:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                                     (":authority", "t")], end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        fs: list[tuple[str, str]] = []
        body = b""
        while True:
            data = self.sock.recv(65536)
            assert data, "connection closed"
            for e in self.conn.receive_data(data):
                if getattr(e, "stream_id", None) != sid:
                    continue
                if isinstance(e, h2.events.ResponseReceived):
                    fs = [(k.decode(), v.decode()) for k, v in e.headers]
                elif isinstance(e, h2.events.DataReceived):
                    body += e.data
                    self.conn.acknowledge_received_data(e.flow_controlled_length, sid)
                elif isinstance(e, h2.events.StreamEnded):
                    return fs, body
            self.sock.sendall(self.conn.data_to_send())

    def close(self) -> None:
        self.sock.close()


def test_http2_answers(custom: int, bare: int, edge: int) -> None:
    c, b, e = H2(custom), H2(bare), H2(edge)
    try:
        for path, status, body in PLAIN:
            for _ in range(2):
                fs, got = c.get(path)
                assert value(fs, ":status") == str(status) and (body is None or got == body)
                assert value(fs, "x-frame-options") == "DENY" and value(fs, "x-two") == "a b", \
                    (path, fs)
                assert value(fs, "server") == "cyserve" and count(fs, "date") == 1, (path, fs)
                fs, _ = b.get(path)
                assert value(fs, "x-only") == "1", (path, fs)
                assert count(fs, "server") == 0 and count(fs, "date") == 0, (path, fs)
                fs, _ = e.get(path)
                assert value(fs, "server") == "edge/1", (path, fs)
        for path, server in OWN:
            for conn in (c, b, e):
                fs, _ = conn.get(path)
                assert value(fs, "server") == server, (path, fs)
            assert value(c.get(path)[0], "x-frame-options") == "DENY"
    finally:
        c.close()
        b.close()
        e.close()


@pytest.mark.parametrize("headers,why", [
    ((("X Y", "z"),), "not a valid header name"),
    (("X-A: b\r\nInjected: 1",), "CR, LF or NUL"),
    ((("X-A", "b\nc"),), "CR, LF or NUL"),
    (("no colon",), "must be NAME:VALUE"),
    ((("Content-Length", "1"),), "written by the server"),
    ((("Date", "x"),), "--no-date-header"),
    ((("Server", "a"), ("server", "b")), "given twice"),
    ("X-A: b", "must be a list"),
])
def test_bad_headers_are_refused_at_startup(headers: Any, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        Config(headers=headers)


def test_cli_and_config_file(tmp_path: Path) -> None:
    """The options from the command line, the environment and a --config TOML file, in a
    served process; a bad --header is one line and exit status 2."""
    (tmp_path / "hd_app.py").write_text(
        "import cyserve\napp = cyserve.App()\napp.static('/s', b's')\n"
        "@app.get('/p')\ndef p(req):\n    return 'p'\n")
    port = free_port()
    argv = [sys.executable, "-m", "cyserve", "hd_app:app", "--port", str(port), "--threads",
            "1", "--header", "X-Cli: one two", "--no-date-header"]
    with running(argv, port, cwd=tmp_path, probe="/s",
                 env=env_with_src({"CYSERVE_SERVER_HEADER": "false"})) as srv:
        for path in ("/s", "/p"):
            fs = fields(srv.get(path).raw_head)
            assert value(fs, "x-cli") == "one two", fs
            assert count(fs, "date") == 0 and count(fs, "server") == 0, fs
    (tmp_path / "c.toml").write_text('header = ["X-Toml: 1", "Server: toml/1"]\n'
                                     "date-header = true\n")
    port = free_port()
    argv = [sys.executable, "-m", "cyserve", "hd_app:app", "--port", str(port), "--threads",
            "1", "--config", "c.toml"]
    with running(argv, port, cwd=tmp_path, probe="/s") as srv:
        for path in ("/s", "/p"):
            fs = fields(srv.get(path).raw_head)
            assert value(fs, "x-toml") == "1" and value(fs, "server") == "toml/1", fs
            assert count(fs, "date") == 1, fs
    bad = subprocess.run([sys.executable, "-m", "cyserve", "hd_app:app", "--header",
                          "X-A: b\rc"], cwd=tmp_path, env=env_with_src(), capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2, bad
    assert bad.stderr.strip().splitlines() == [
        "cyserve: invalid --header 'b\\rc': header 'X-A': a CR, LF or NUL in its value would "
        "split the response"], bad.stderr
