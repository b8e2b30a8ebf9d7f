"""HTTP/2 (csrc/http2.c) end to end, with the `h2` library as the client (and curl when it is
installed): h2c by prior knowledge and h2 by ALPN over TLS; static, GIL-free, Python, file, WSGI
and ASGI routes; many streams on one connection; flow control over large bodies; the limits
(header list size, body size, concurrent streams), the floods (rapid reset, PING), a stalled
stream, and GOAWAY on a graceful stop."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest
from _rawhttp import Conn, serving
from _certs import self_signed

import cyserve
from cyserve.config import Config
from cyserve.start import serve

pytestmark = pytest.mark.native

BIG = bytes(range(256)) * 1200  # 307,200 bytes: far past the initial 64 KiB windows
FILE = bytes(range(251)) * 800


class H2:
    """One HTTP/2 connection, plain (prior knowledge) or TLS (ALPN h2)."""

    def __init__(self, port: int, tls: ssl.SSLContext | None = None, timeout: float = 10.0,
                 preface: bool = True) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if tls is not None:
            raw = tls.wrap_socket(raw, server_hostname="localhost")
            assert raw.selected_alpn_protocol() == "h2"
        self.sock = raw
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.events: list[Any] = []
        self.closed = False
        if preface:
            self.conn.initiate_connection()
            self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self) -> list[Any]:
        data = self.sock.recv(65536)
        if not data:
            self.closed = True
            raise EOFError("connection closed")
        events = self.conn.receive_data(data)
        for e in events:
            if isinstance(e, h2.events.DataReceived):
                self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
        self.events += events
        try:
            self.flush()
        except OSError:  # the server has closed: what it sent is read on
            pass
        return events

    def send(self, path: str, method: str = "GET", headers: list | None = None,
             body: bytes | None = None, end: bool = True) -> int:
        sid = self.conn.get_next_available_stream_id()
        hs = [(":method", method), (":path", path), (":scheme", "http"),
              (":authority", "localhost")] + (headers or [])
        self.conn.send_headers(sid, hs, end_stream=end and body is None)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=end)
        self.flush()
        return sid

    def response(self, sid: int) -> tuple[int, dict[str, str], bytes]:
        """The status, headers and body of stream sid (AssertionError if it is reset)."""
        status, headers, body = 0, {}, b""
        seen = 0
        while True:
            for e in self.events[seen:]:
                if getattr(e, "stream_id", None) != sid:
                    continue
                if isinstance(e, h2.events.ResponseReceived):
                    headers = {k.decode(): v.decode() for k, v in e.headers}
                    status = int(headers.pop(":status"))
                elif isinstance(e, h2.events.DataReceived):
                    body += e.data
                elif isinstance(e, h2.events.StreamEnded):
                    return status, headers, body
                elif isinstance(e, h2.events.StreamReset):
                    raise AssertionError(f"stream {sid} reset: {e.error_code!r}")
            seen = len(self.events)
            self.pump()

    def get(self, path: str, **kw: Any) -> tuple[int, dict[str, str], bytes]:
        return self.response(self.send(path, **kw))

    def until(self, kind: type, limit: float = 10.0) -> Any:
        """Read until an event of kind arrives; return it."""
        end = time.monotonic() + limit
        seen = 0
        while time.monotonic() < end:
            for e in self.events[seen:]:
                if isinstance(e, kind):
                    return e
            seen = len(self.events)
            self.pump()
        raise AssertionError(f"no {kind.__name__}")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> H2:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wsgi_app(environ: dict[str, Any], start_response: Any) -> Any:
    if environ["PATH_INFO"] == "/gen":
        start_response("200 OK", [("Content-Type", "text/plain"), ("Connection", "close")])
        return (b"g" * 30000 for _ in range(5))
    body = environ["wsgi.input"].read()
    text = (f"{environ['SERVER_PROTOCOL']}|{environ.get('HTTP_HOST')}|"
            f"{environ.get('HTTP_COOKIE')}|{environ['wsgi.url_scheme']}|{len(body)}")
    start_response("200 OK", [("Content-Type", "text/plain"), ("X-Mixed-Case", "yes")])
    return [text.encode()]


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    if scope["path"] == "/stream":
        for _ in range(4):
            await send({"type": "http.response.body", "body": b"s" * 20000, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    text = f"{scope['http_version']} {scope['method']} {len(body)}"
    await send({"type": "http.response.body", "body": text.encode()})


def build_app(root: Any) -> Any:
    from examples import hello_nogil

    app = cyserve.App()
    app.static("/plaintext", b"Hello, World!", content_type="text/plain")
    app.static("/big", BIG, content_type="application/octet-stream")
    app.nogil("/nogil", hello_nogil.ROOT)
    app.files("/files", root)

    @app.route("/py", methods=["GET", "POST"])
    def py(req: Any) -> str:
        return f"{req.http_version} {req.scheme} {req.method} {len(req.body)}"

    @app.route("/slow")
    def slow(req: Any) -> str:
        time.sleep(0.5)
        return "slow done"

    app.wsgi("/wsgi", wsgi_app)
    return app


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("h2-root")
    (d / "f.bin").write_bytes(FILE)
    return d


@pytest.fixture(scope="module")
def port(root: Any) -> Iterator[int]:
    with serving(build_app(root).build(), max_body_bytes=100_000) as srv:
        yield srv.port


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return self_signed(tmp_path_factory.mktemp("h2-tls"))


def h2_context(certs: dict[str, str], alpn: tuple[str, ...] = ("h2", "http/1.1")) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=certs["cert"])
    ctx.set_alpn_protocols(list(alpn))
    return ctx


@pytest.fixture(scope="module")
def tls_port(root: Any, certs: dict[str, str]) -> Iterator[int]:
    with serving(build_app(root).build(), ssl_certfile=certs["cert"],
                 ssl_keyfile=certs["key"]) as srv:
        yield srv.port


def check_every_route(c: H2, scheme: str) -> None:
    status, headers, body = c.get("/plaintext")
    assert (status, body) == (200, b"Hello, World!")
    assert headers["server"] == "cyserve" and headers["content-length"] == "13"
    assert headers["content-type"] == "text/plain" and "date" in headers
    status, _, body = c.get("/nogil")
    assert status == 200 and body.startswith(b"Hello")
    assert c.get("/py")[2] == f"2 {scheme} GET 0".encode()
    assert c.get("/py", method="POST", body=b"x" * 5000)[2] == f"2 {scheme} POST 5000".encode()
    status, headers, body = c.get("/wsgi", method="POST", body=b"abc",
                                  headers=[("cookie", "a=1"), ("cookie", "b=2")])
    assert body == f"HTTP/2|localhost|a=1; b=2|{scheme}|3".encode()
    assert headers["x-mixed-case"] == "yes"  # names lower-cased for HTTP/2
    status, headers, body = c.get("/wsgi/gen")
    assert status == 200 and body == b"g" * 150000
    assert "connection" not in headers  # connection-specific fields are dropped
    status, headers, body = c.get("/big")
    assert status == 200 and body == BIG and headers["content-length"] == str(len(BIG))
    status, headers, body = c.get("/files/f.bin")
    assert status == 200 and body == FILE
    status, headers, body = c.get("/files/f.bin", headers=[("range", "bytes=10-19")])
    assert status == 206 and body == FILE[10:20]
    status, headers, body = c.get("/big", method="HEAD")
    assert status == 200 and body == b"" and headers["content-length"] == str(len(BIG))
    status, _, body = c.get("/nope")
    assert status == 404 and body == b"404 Not Found\n"
    status, headers, _ = c.get("/plaintext", method="POST", body=b"x")
    assert status == 405 and headers["allow"] == "GET, HEAD"


def test_h2c_prior_knowledge_every_route(port: int) -> None:
    with H2(port) as c:
        check_every_route(c, "http")


def test_h2_over_tls_by_alpn_every_route(tls_port: int, certs: dict[str, str]) -> None:
    with H2(tls_port, tls=h2_context(certs)) as c:
        check_every_route(c, "https")


def test_http1_still_served_beside_it(port: int, tls_port: int, certs: dict[str, str]) -> None:
    with Conn(port) as c:
        c.send(b"GET /py HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.reply().body == b"1.1 http GET 0"
    raw = socket.create_connection(("127.0.0.1", tls_port), timeout=10)
    with h2_context(certs, ("http/1.1",)).wrap_socket(raw, server_hostname="localhost") as s:
        assert s.selected_alpn_protocol() == "http/1.1"
        s.sendall(b"GET /py HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        assert data.endswith(b"1.1 https GET 0")


def test_many_streams_at_once(port: int) -> None:
    """Forty streams sent before any answer is read: every one answered, on one connection."""
    with H2(port) as c:
        sids = [c.send(p) for p in ["/plaintext", "/py", "/big", "/wsgi", "/nogil"] * 8]
        bodies = [c.response(s) for s in sids]
        assert all(status == 200 for status, _, _ in bodies)
        assert bodies[2][2] == BIG and bodies[0][2] == b"Hello, World!"


def test_slow_stream_does_not_hold_back_the_others() -> None:
    """One worker thread. A stream whose Python handler sleeps is sent first; streams sent
    after it on the same connection (static, GIL-free, Python, WSGI) are answered while it
    sleeps, and a second sleeping stream sleeps at the same time as the first, not after it:
    the calls go through the worker's offload and relief threads, as HTTP/1.1 calls do.

    The sleep is 4 s (it was 1.5 s): relief needs the monitor, and this test needs two of its
    decisions (the worker stuck, then the relief thread stuck in the second sleep) before the
    first sleep ends. On a machine whose CPUs other processes keep busy the monitor waits its
    turn for a CPU: at most 0.2 s in its batch scheduling class, up to 1.8 s when it was in the
    idle class, which failed this test about one run in eight at load average 11-19 on 2 cores
    (docs/architecture.md, "Known limits")."""
    from examples import hello_nogil

    app = cyserve.App()
    app.static("/plaintext", b"Hello, World!", content_type="text/plain")
    app.nogil("/nogil", hello_nogil.ROOT)
    nap = 4.0
    began: list[float] = []  # when each sleeping call began and returned (list.append: atomic)
    returned: list[float] = []

    @app.route("/sleep")
    def sleep(req: Any) -> str:
        began.append(time.monotonic())
        time.sleep(nap)
        returned.append(time.monotonic())
        return "slept"

    @app.route("/py")
    def py(req: Any) -> str:
        return "fast"

    app.wsgi("/wsgi", wsgi_app)
    with serving(app.build(), threads=1) as srv, H2(srv.port) as c:
        t0 = time.monotonic()
        slow = c.send("/sleep")
        deadline = t0 + 10
        while not began and time.monotonic() < deadline:
            time.sleep(0.005)
        assert began, "the first sleeping call never began"
        slow2 = c.send("/sleep")
        time.sleep(0.1)
        fast = [c.send(p) for p in ["/plaintext", "/nogil", "/py", "/wsgi"]]
        ended: dict[int, float] = {}
        while len(ended) < 6:
            for e in c.pump():
                if isinstance(e, h2.events.StreamEnded):
                    ended[e.stream_id] = time.monotonic() - t0
                assert not isinstance(e, h2.events.StreamReset), e
        assert all(ended[s] < ended[slow] for s in fast), ended
        assert max(ended[s] for s in fast) < nap - 0.1, ended
        assert ended[slow] >= nap and ended[slow2] >= nap
        assert all(ended[s] < ended[slow2] for s in fast), ended
        # The two sleeps overlapped: the second began before the first returned.
        assert len(began) == len(returned) == 2 and began[1] < returned[0], (began, returned)
        bodies = {s: c.response(s) for s in [slow, slow2, *fast]}
        assert bodies[slow][2] == bodies[slow2][2] == b"slept"
        assert [bodies[s][2][:5] for s in fast] == [b"Hello", b"Hello", b"fast", b"HTTP/"]
        assert c.get("/plaintext")[0] == 200  # the connection goes on


def thread_io_calls() -> tuple[int, int]:
    """The read and write system calls (syscr, syscw: read(2), write(2) and their kin, which is
    what the TLS transport makes; not recv/send) of every thread of this process but the
    calling one: the server's workers, monitor and relief threads."""
    me = threading.get_native_id()
    reads = writes = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/io") as f:
                io = dict(line.split(": ") for line in f.read().splitlines())
        except OSError:  # the thread ended meanwhile
            continue
        reads += int(io["syscr"])
        writes += int(io["syscw"])
    return reads, writes


def test_python_answers_of_one_round_are_written_together(certs: dict[str, str]) -> None:
    """One worker thread, over TLS. Ten streams to a Python handler sent at once, twenty times:
    their calls run in one batch, and the connection writes their answers in one round, not one
    write each (the first finished task woke the connection ahead of the others: 0.81 writes
    and 2.1 reads a request before, docs/benchmarks.md), nor reads a drained socket again
    between a task's wake-ups."""
    app = cyserve.App()

    @app.route("/py")
    def py(req: Any) -> str:
        return "fast"

    rounds, streams = 20, 10
    with serving(app.build(), threads=1, ssl_certfile=certs["cert"],
                 ssl_keyfile=certs["key"]) as srv, H2(srv.port, tls=h2_context(certs)) as c:
        assert c.get("/py")[0] == 200  # the session and the handler's first call are made
        reads0, writes0 = thread_io_calls()
        for _ in range(rounds):
            sids = []
            for _ in range(streams):
                sid = c.conn.get_next_available_stream_id()
                c.conn.send_headers(sid, [(":method", "GET"), (":path", "/py"),
                                          (":scheme", "https"), (":authority", "localhost")],
                                    end_stream=True)
                sids.append(sid)
            c.flush()  # the round's ten requests in one write
            assert [c.response(s)[2] for s in sids] == [b"fast"] * streams
        reads, writes = thread_io_calls()
    per_round = ((reads - reads0) / rounds, (writes - writes0) / rounds)
    # Measured on a loaded 2-core machine: 1.05 writes and 2.05 reads a round; 10 and 12
    # before the fix (main at d17b6cc).
    assert per_round[1] <= 4 and per_round[0] <= 8, per_round


def test_stream_reset_while_its_handler_runs(port: int) -> None:
    """The client resets a stream whose handler is at work: the answer is dropped when it comes,
    the connection serves on."""
    with H2(port) as c:
        sid = c.send("/slow")
        time.sleep(0.1)
        c.conn.reset_stream(sid)
        c.flush()
        assert c.get("/py")[2] == b"2 http GET 0"
        time.sleep(0.6)  # the slow handler has returned meanwhile
        assert c.get("/plaintext")[0] == 200


def test_connection_closed_while_handlers_run(port: int) -> None:
    """The client goes away while streams' handlers run: the server waits for them, then frees
    the connection (under the sanitizers, nothing is used after it is freed)."""
    c = H2(port)
    for _ in range(3):
        c.send("/slow")
    c.send("/wsgi/gen")
    time.sleep(0.1)
    c.close()
    time.sleep(0.7)
    with H2(port) as c2:
        assert c2.get("/plaintext")[0] == 200


def test_expect_100_continue(port: int) -> None:
    """A body that waits for 100 Continue gets it from a route that reads bodies; a route that
    does not (404 here) answers at once, and the body is never asked for."""
    with H2(port) as c:
        sid = c.send("/py", method="POST", headers=[("expect", "100-continue")], end=False)
        info = c.until(h2.events.InformationalResponseReceived)
        assert info.stream_id == sid and dict(info.headers)[b":status"] == b"100"
        c.conn.send_data(sid, b"x" * 10, end_stream=True)
        c.flush()
        assert c.response(sid)[2] == b"2 http POST 10"
        sid = c.send("/nope", method="POST", headers=[("expect", "100-continue")], end=False)
        assert c.response(sid)[0] == 404
        assert not any(isinstance(e, h2.events.InformationalResponseReceived) and
                       e.stream_id == sid for e in c.events)
        assert c.get("/plaintext")[0] == 200


def send_body(c: H2, sid: int, body: bytes) -> None:
    """body on stream sid, then END_STREAM, as the flow-control windows let it go."""
    off = 0
    while off < len(body):
        n = min(c.conn.local_flow_control_window(sid), c.conn.max_outbound_frame_size,
                len(body) - off)
        if n <= 0:
            c.pump()  # a WINDOW_UPDATE
            continue
        c.conn.send_data(sid, body[off:off + n])
        c.flush()
        off += n
    c.conn.end_stream(sid)
    c.flush()


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "no-length"])
def test_expect_100_continue_before_a_streamed_body(port: int, length: bool) -> None:
    """A WSGI app's body large enough to stream to it as it arrives (or of no announced
    length): the client that waits for 100 Continue (RFC 9110 10.1.1, RFC 9113 8.5: an
    informational HEADERS frame) gets it before anything of the body is read, and the app then
    reads the whole body; a client that waits does not hang."""
    body = b"b" * 90_000  # over BODY_STREAM_MIN (64 KiB), under the fixture's max_body_bytes
    with H2(port) as c:
        headers = [("expect", "100-continue")] + (
            [("content-length", str(len(body)))] if length else [])
        sid = c.send("/wsgi", method="POST", headers=headers, end=False)
        info = c.until(h2.events.InformationalResponseReceived)
        assert info.stream_id == sid and dict(info.headers)[b":status"] == b"100"
        assert not any(isinstance(e, h2.events.ResponseReceived) for e in c.events)
        send_body(c, sid, body)
        status, _, text = c.response(sid)
        assert (status, text.split(b"|")[-1]) == (200, b"90000")
        assert c.get("/plaintext")[0] == 200


def test_connection_reused_after_idle(port: int) -> None:
    with H2(port) as c:
        assert c.get("/plaintext")[0] == 200
        time.sleep(0.3)  # the connection goes idle (no coroutine) in between
        assert c.get("/py")[2] == b"2 http GET 0"


def test_session_set_aside_while_idle_serves_on(port: int) -> None:
    """Idle past 100 ms, the session is set aside (its memory given back) and written back when
    the client speaks again: the HPACK tables of both sides must be as they were, so each round
    sends fields the client's encoder indexed in the previous one (decoded from the server's
    table) and reads answers whose fields the server indexed (decoded from the client's)."""
    with H2(port) as c:
        for i in range(3):
            status, headers, body = c.get("/wsgi", headers=[("cookie", "k=v"),
                                                            ("x-round", "same")])
            assert (status, body) == (200, b"HTTP/2|localhost|k=v|http|0"), i
            assert headers["content-type"] == "text/plain" and headers["x-mixed-case"] == "yes"
            time.sleep(0.3)


def pause() -> None:
    """Idle past 100 ms: the server sets the connection's session aside (its pack given back)
    and writes it back at the next readiness, the frame sent after this."""
    time.sleep(0.25)


@pytest.mark.parametrize("over_tls", [False, True])
def test_every_frame_after_the_session_was_set_aside(port: int, tls_port: int,
                                                     certs: dict[str, str], over_tls: bool) -> None:
    """Whatever frame wakes a session set aside is taken as by one never set aside: PING,
    SETTINGS (a smaller HPACK table, a larger window), a header block cut into CONTINUATION
    frames, WINDOW_UPDATE, RST_STREAM on a closed stream, PRIORITY for an idle stream (which
    the library keeps while the connection is idle), and GOAWAY, after which the server
    closes."""
    scheme = "https" if over_tls else "http"
    with H2(tls_port if over_tls else port, tls=h2_context(certs) if over_tls else None) as c:
        assert c.get("/plaintext")[0] == 200
        pause()
        c.conn.ping(b"12345678")
        c.flush()
        assert c.until(h2.events.PingAckReceived).ping_data == b"12345678"
        pause()
        c.conn.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: 1024,
                                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 200_000})
        c.flush()
        c.until(h2.events.SettingsAcknowledged)
        pause()
        c.conn.max_outbound_frame_size = 1000  # the block goes as HEADERS and CONTINUATIONs
        cookie = "k=" + "v" * 4000
        status, _, body = c.get("/wsgi", headers=[("cookie", cookie), ("x-round", "same")])
        assert (status, body) == (200, f"HTTP/2|localhost|{cookie}|{scheme}|0".encode())
        c.conn.max_outbound_frame_size = 16384
        pause()
        c.conn.increment_flow_control_window(1_000_000)
        c.flush()
        pause()
        status, _, body = c.get("/big")
        assert status == 200 and body == BIG
        pause()
        last = c.conn.highest_outbound_stream_id
        c.sock.sendall(b"\x00\x00\x04\x03\x00" + last.to_bytes(4, "big") + b"\x00\x00\x00\x08")
        pause()
        idle = last + 20  # PRIORITY for a stream not opened yet: weight 16, on stream 0
        c.sock.sendall(b"\x00\x00\x05\x02\x00" + idle.to_bytes(4, "big") + b"\x00" * 4 + b"\x0f")
        pause()
        status, _, body = c.get("/wsgi", headers=[("cookie", "k=v"), ("x-round", "same")])
        assert (status, body) == (200, f"HTTP/2|localhost|k=v|{scheme}|0".encode())
        assert not any(isinstance(e, (h2.events.ConnectionTerminated, h2.events.StreamReset))
                       for e in c.events)
        pause()
        c.conn.close_connection()
        c.flush()
        c.sock.settimeout(5)
        with pytest.raises(EOFError):
            for _ in range(100):
                c.pump()


def test_stop_while_sessions_are_set_aside(root: Any, certs: dict[str, str]) -> None:
    """A stop closes idle connections whose sessions are set aside, over h2c and TLS, without
    waiting for its grace period, and the sessions are written back and freed (the sanitizer
    stage checks the memory)."""
    srv_cm = serving(build_app(root).build(), ssl_certfile=certs["cert"],
                     ssl_keyfile=certs["key"])
    tls_srv = srv_cm.__enter__()
    try:
        with serving(build_app(root).build()) as srv:
            conns = [H2(srv.port) for _ in range(8)]
            conns += [H2(tls_srv.port, tls=h2_context(certs)) for _ in range(8)]
            for c in conns:
                c.conn.ping(b"warm-up!")
                c.flush()
                c.until(h2.events.PingAckReceived)
                assert c.get("/wsgi", headers=[("x-round", "same")])[0] == 200
            pause()
            t0 = time.monotonic()
            srv.stop(grace=5.0)
            tls_srv.stop(grace=5.0)
            assert time.monotonic() - t0 < 4
            for c in conns:
                c.sock.settimeout(5)
                with pytest.raises((EOFError, ConnectionResetError)):
                    for _ in range(100):
                        c.pump()
                c.sock.close()
    finally:
        srv_cm.__exit__(None, None, None)


def test_asgi_over_http2() -> None:
    """serve() in a thread, as tests/e2e/test_asgi.py runs ASGI apps."""
    stop = threading.Event()
    ready: list[Any] = []
    config = Config(host="127.0.0.1", port=0, threads=2, graceful_timeout=2.0)
    th = threading.Thread(target=serve, args=(asgi_app, config),
                          kwargs={"stop_event": stop, "ready": ready.append}, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not ready and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ready, "the server did not start"
    try:
        with H2(ready[0].port) as c:
            assert c.get("/x", method="POST", body=b"hello")[2] == b"2 POST 5"
            # A client that waits for 100 Continue gets it (an informational HEADERS frame)
            # before receive() is given any of the body: it does not hang.
            sid = c.send("/x", method="POST", headers=[("expect", "100-continue")], end=False)
            info = c.until(h2.events.InformationalResponseReceived)
            assert info.stream_id == sid and dict(info.headers)[b":status"] == b"100"
            send_body(c, sid, b"y" * 100_000)
            assert c.response(sid)[2] == b"2 POST 100000"
            status, _, body = c.get("/stream")
            assert status == 200 and body == b"s" * 80000
    finally:
        stop.set()
        th.join(30)
        assert not th.is_alive(), "the server did not stop"


def test_asgi_body_past_the_limit_is_never_taken_for_a_whole_one() -> None:
    """The body's last DATA passes max_body_bytes and ends the stream in the same frame: what
    was held is dropped, and the app must not read the end that follows as the body's end."""
    stop = threading.Event()
    ready: list[Any] = []
    seen: list[tuple[int, bool]] = []
    receiving = threading.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        receiving.set()
        n = 0
        while True:
            m = await receive()
            if m["type"] == "http.disconnect":
                seen.append((n, False))
                return
            n += len(m.get("body", b""))
            if not m.get("more_body"):
                break
        seen.append((n, True))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(n).encode()})

    config = Config(host="127.0.0.1", port=0, threads=2, graceful_timeout=2.0,
                    max_body_bytes=1000)
    th = threading.Thread(target=serve, args=(app, config),
                          kwargs={"stop_event": stop, "ready": ready.append}, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not ready and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ready, "the server did not start"
    try:
        with H2(ready[0].port) as c:
            sid = c.send("/x", method="POST", end=False)
            assert receiving.wait(20), "the request did not reach the app"  # it waits in receive()
            c.conn.send_data(sid, b"x" * 2000, end_stream=True)
            c.flush()
            with pytest.raises(AssertionError, match="reset"):
                c.response(sid)
            assert c.get("/x", method="POST", body=b"12345")[2] == b"5"  # the connection goes on
        assert seen[0] == (0, False)
    finally:
        stop.set()
        th.join(30)
        assert not th.is_alive(), "the server did not stop"


@pytest.mark.parametrize("trailers", [
    [("x-t", "v" * 9000)],                      # past max_header_bytes
    [(f"x-t{i}", "v") for i in range(120)],     # past max_headers
])
def test_request_trailers_past_the_limits_get_431(port: int, trailers: list) -> None:
    with H2(port) as c:
        sid = c.send("/py", method="POST", body=b"abc", end=False)
        c.conn.send_headers(sid, trailers, end_stream=True)
        c.flush()
        assert c.response(sid)[0] == 431
        assert c.get("/plaintext")[0] == 200  # a stream error: the connection goes on
    with H2(port) as c:  # trailers within the limits are taken and dropped
        sid = c.send("/py", method="POST", body=b"abc", end=False)
        c.conn.send_headers(sid, [("x-checksum", "1234")], end_stream=True)
        c.flush()
        assert c.response(sid)[2] == b"2 http POST 3"


def test_a_trailer_block_without_end_ends_the_connection(port: int) -> None:
    """A trailer block four times past the bound is a flood (CONTINUATION frames without end):
    the connection ends, as for a header block. (nghttp2 1.52 as Debian ships it ends this one
    by itself too; the server's own bound is for a library without that bound.)"""
    with H2(port) as c:
        sid = c.send("/py", method="POST", body=b"abc", end=False)
        # ~101 KB in 7 frames: past 4 x 8 KiB + 64 KiB.
        c.conn.send_headers(sid, [(f"x-t{i}", "v" * 4000) for i in range(25)], end_stream=True)
        c.flush()
        ended = False
        try:
            ev = c.until(h2.events.ConnectionTerminated)
            ended = ev.error_code != h2.errors.ErrorCodes.NO_ERROR
        except (EOFError, ConnectionResetError):  # closed before the GOAWAY was read
            ended = True
        assert ended


def test_header_list_too_large_gets_431(port: int) -> None:
    with H2(port) as c:
        status, _, _ = c.get("/py", headers=[("x-big", "v" * 9000)])
        assert status == 431
        assert c.get("/plaintext")[0] == 200  # a stream error: the connection goes on


def test_too_many_header_fields_gets_431(port: int) -> None:
    with H2(port) as c:
        assert c.get("/py", headers=[(f"x-{i}", "v") for i in range(120)])[0] == 431


def test_body_too_large_gets_413(port: int) -> None:
    with H2(port) as c:
        # Announced: refused before the body is read.
        sid = c.send("/py", method="POST", headers=[("content-length", "200000")], end=False)
        assert c.response(sid)[0] == 413
        assert c.get("/plaintext")[0] == 200  # a stream error: the connection goes on
    # Not announced: refused when it passes the limit (100,000 bytes here).
    with H2(port) as c:
        sid = c.send("/py", method="POST", end=False)
        sent = 0
        answered = (h2.events.ResponseReceived, h2.events.StreamReset)
        while sent < 120_000 and not any(isinstance(e, answered) for e in c.events):
            n = min(16000, c.conn.local_flow_control_window(sid), 120_000 - sent)
            if n <= 0:
                c.pump()
                continue
            c.conn.send_data(sid, b"x" * n)
            c.flush()
            sent += n
        headers = c.until(h2.events.ResponseReceived).headers
        status = int(dict(headers)[b":status"])
        assert status == 413


def test_concurrent_stream_limit() -> None:
    app = cyserve.App()
    app.static("/plaintext", b"ok", content_type="text/plain")
    with serving(app.build(), http2_max_concurrent_streams=5) as srv, H2(srv.port) as c:
        # Sent at once, before the server's SETTINGS are read: the library takes them.
        sids = [c.send("/plaintext", end=False) for _ in range(8)]
        reset = c.until(h2.events.StreamReset)
        assert reset.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
        assert c.conn.remote_settings.max_concurrent_streams == 5
        for sid in sids[:5]:
            c.conn.end_stream(sid)
        c.flush()
        assert [c.response(s)[0] for s in sids[:5]] == [200] * 5


def test_rapid_reset_ends_the_connection(port: int) -> None:
    """CVE-2023-44487: streams opened and reset at once, past the bound of resets per second."""
    with H2(port) as c:
        for _ in range(150):
            sid = c.conn.get_next_available_stream_id()
            c.conn.send_headers(sid, [(":method", "GET"), (":path", "/plaintext"),
                                      (":scheme", "http"), (":authority", "localhost")])
            c.conn.reset_stream(sid)
        try:
            c.flush()
        except OSError:  # the server may close before the last frames are sent
            pass
        ended = c.until(h2.events.ConnectionTerminated)
        assert ended.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        with pytest.raises((EOFError, ConnectionError)):
            for _ in range(100):
                c.pump()


def test_ping_flood_ends_the_connection(port: int) -> None:
    with H2(port) as c:
        for i in range(150):
            c.conn.ping(i.to_bytes(8, "big"))
        try:
            c.flush()
        except OSError:  # the server may close before the last frames are sent
            pass
        ended = c.until(h2.events.ConnectionTerminated)
        assert ended.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


def test_stalled_stream_is_closed_after_body_timeout() -> None:
    app = cyserve.App()

    @app.route("/py", methods=["POST"])
    def py(req: Any) -> str:
        return "never"

    with serving(app.build(), body_timeout=0.5) as srv, H2(srv.port) as c:
        # A small body announced (read whole before the call) that never comes. (A large or
        # unannounced one streams to the handler, which answers without reading it here.) The
        # clock starts before the request is sent, so that the lower bound holds however late
        # this thread runs after the send.
        t0 = time.monotonic()
        c.send("/py", method="POST", headers=[("content-length", "1000")], end=False)
        ended = c.until(h2.events.ConnectionTerminated)
        assert ended.error_code == h2.errors.ErrorCodes.NO_ERROR
        assert 0.4 < time.monotonic() - t0 < 5


def test_idle_connection_closed_after_keepalive_timeout() -> None:
    app = cyserve.App()
    app.static("/plaintext", b"ok", content_type="text/plain")
    with serving(app.build(), keepalive_timeout=0.5) as srv, H2(srv.port) as c:
        t0 = time.monotonic()  # before the request: the server's idle time starts after it
        assert c.get("/plaintext")[0] == 200
        with pytest.raises(EOFError):
            while time.monotonic() - t0 < 5:
                c.pump()
        assert 0.3 < time.monotonic() - t0 < 3


def test_graceful_stop_sends_goaway_and_finishes_the_stream(root: Any) -> None:
    app = build_app(root)
    entered = threading.Event()

    @app.route("/held")
    def held(req: Any) -> str:
        entered.set()
        time.sleep(0.5)
        return "slow done"

    srv_cm = serving(app.build())
    srv = srv_cm.__enter__()
    stopped = False
    try:
        with H2(srv.port) as c:
            assert c.get("/plaintext")[0] == 200
            sid = c.send("/held")
            # The handler runs: the stop comes after the stream was taken, not after a pause a
            # loaded machine may overrun (the GOAWAY would then refuse the stream).
            assert entered.wait(20), "the handler did not start"
            stopper = threading.Thread(target=srv.stop, kwargs={"grace": 5.0})
            stopper.start()
            status, _, body = c.response(sid)
            assert (status, body) == (200, b"slow done")
            ended = c.until(h2.events.ConnectionTerminated)
            assert ended.error_code == h2.errors.ErrorCodes.NO_ERROR
            assert ended.last_stream_id == sid
            stopper.join()
            stopped = True
    finally:
        if not stopped:
            srv_cm.__exit__(None, None, None)


def upgrade_request(path: str, extra: bytes = b"") -> tuple[bytes, h2.connection.H2Connection]:
    """An HTTP/1.1 request asking for `Upgrade: h2c`, and the h2 client connection whose
    settings its HTTP2-Settings field carries."""
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None))
    settings = conn.initiate_upgrade_connection()
    req = (f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade, HTTP2-Settings\r\n"
           f"Upgrade: h2c\r\nHTTP2-Settings: {settings.decode()}\r\n").encode() + extra + b"\r\n"
    return req, conn


def test_upgrade_h2c(port: int) -> None:
    """RFC 7540 3.2: 101, then the request is answered as stream 1 over HTTP/2, and the
    connection goes on with HTTP/2 streams."""
    for path, body in [("/py", b"2 http GET 0"), ("/plaintext", b"Hello, World!")]:
        req, conn = upgrade_request(path, b"X-Extra: 1\r\n")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(req)
            data = b""
            while b"\r\n\r\n" not in data:
                data += sock.recv(65536)
            head, _, rest = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 101 ")
            assert b"upgrade: h2c" in head.lower()
            c = H2.__new__(H2)
            c.sock, c.conn, c.events, c.closed = sock, conn, [], False
            c.flush()  # the client's preface and SETTINGS
            if rest:
                c.events += conn.receive_data(rest)
            status, _, got = c.response(1)
            assert (status, got) == (200, body)
            assert c.get("/nogil")[2].startswith(b"Hello")  # a stream of its own, id 3


def test_upgrade_h2c_declined(port: int) -> None:
    """A request with a body, or without a valid HTTP2-Settings, is answered over HTTP/1.1 as if
    it had not asked (RFC 7540 3.2.1: no upgrade without exactly one HTTP2-Settings)."""
    with Conn(port) as c:
        c.send(b"POST /py HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\n"
               b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"
               b"Content-Length: 3\r\n\r\nabc")
        r = c.reply()
        assert (r.status, r.body) == (200, b"1.1 http POST 3")
        for bad in [b"HTTP2-Settings: not*base64\r\n", b"HTTP2-Settings: AAMAAAB\r\n", b"",
                    b"HTTP2-Settings: AAMAAABk\r\nHTTP2-Settings: AAMAAABk\r\n"]:
            c.send(b"GET /py HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                   b"Upgrade: h2c\r\n" + bad + b"\r\n")
            r = c.reply()
            assert (r.status, r.body) == (200, b"1.1 http GET 0"), bad


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_upgrade_h2c_with_curl(port: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run(["curl", "-s", "--http2", "-w", " %{http_version}",
                          f"http://127.0.0.1:{port}/py"], capture_output=True, timeout=30, env=env)
    assert out.stdout == b"2 http GET 0 2"


def test_http2_off() -> None:
    app = cyserve.App()
    app.static("/plaintext", b"ok", content_type="text/plain")
    with serving(app.build(), http2=False) as srv, Conn(srv.port) as c:
        c.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert c.reply().status in (400, 505)


def test_preface_split_across_reads(port: int) -> None:
    c = H2(port, preface=False)
    with c:
        c.conn.initiate_connection()
        data = c.conn.data_to_send()
        c.sock.sendall(data[:5])
        time.sleep(0.05)
        c.sock.sendall(data[5:])
        assert c.get("/plaintext")[0] == 200


def raw_data_frame(sid: int, payload: bytes = b"x") -> bytes:
    """A DATA frame made by hand (the h2 library sends none on a stream it knows closed)."""
    return len(payload).to_bytes(3, "big") + b"\x00\x00" + sid.to_bytes(4, "big") + payload


@pytest.mark.parametrize("split", [False, True])
def test_data_on_a_closed_stream_is_stream_closed(port: int, split: bool) -> None:
    """The server forgets a stream once it is closed (an idle connection keeps none), yet DATA
    on a stream that both sides ended is still the connection error STREAM_CLOSED (RFC 9113
    5.1), also when the frame's head arrives in two reads."""
    with H2(port) as c:
        sid = c.send("/plaintext")
        assert c.response(sid)[0] == 200
        frame = raw_data_frame(sid)
        if split:
            c.sock.sendall(frame[:4])
            time.sleep(0.1)
            c.sock.sendall(frame[4:])
        else:
            c.sock.sendall(frame)
        ended = c.until(h2.events.ConnectionTerminated)
        assert ended.error_code == h2.errors.ErrorCodes.STREAM_CLOSED


def test_headers_on_a_closed_stream_is_stream_closed(port: int) -> None:
    with H2(port) as c:
        sid = c.send("/plaintext")
        assert c.response(sid)[0] == 200
        c.send("/plaintext")  # stream sid + 2, so that sid is below the latest id
        # A HEADERS frame on sid: the HPACK block of "GET /plaintext", indexed fields only.
        block = bytes([0x82, 0x86, 0x84])  # :method GET, :scheme http, :path /
        c.sock.sendall(len(block).to_bytes(3, "big") + b"\x01\x05" + sid.to_bytes(4, "big") + block)
        ended = c.until(h2.events.ConnectionTerminated)
        assert ended.error_code == h2.errors.ErrorCodes.STREAM_CLOSED


def test_data_after_the_server_reset_a_stream_is_ignored(port: int) -> None:
    """A stream the server answered before its body came is reset by it (NO_ERROR): the DATA
    the client had in flight is dropped, and the connection goes on."""
    with H2(port) as c:
        sid = c.send("/nope", method="POST", headers=[("expect", "100-continue")], end=False)
        assert c.response(sid)[0] == 404
        c.until(h2.events.StreamReset)
        c.sock.sendall(raw_data_frame(sid, b"late"))
        assert c.get("/plaintext")[0] == 200
        assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in c.events)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl(port: int, tls_port: int, certs: dict[str, str]) -> None:
    # curl runs without the sanitizers' runtime that `make test-asan` preloads into this process.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-w", " %{http_version}",
                          f"http://127.0.0.1:{port}/py"], capture_output=True, timeout=30, env=env)
    assert out.stdout == b"2 http GET 0 2"
    out = subprocess.run(["curl", "-s", "--http2", "--cacert", certs["cert"], "-w",
                          " %{http_version}", f"https://localhost:{tls_port}/py", "--resolve",
                          f"localhost:{tls_port}:127.0.0.1"], capture_output=True, timeout=30,
                         env=env)
    assert out.stdout == b"2 https GET 0 2"


def test_not_http_on_the_cleartext_port_is_closed(port: int) -> None:
    """Bytes that are neither the client preface nor an HTTP/1 request line (a third word that
    is not an HTTP version) are a preface gone wrong on a port that serves h2c: the connection is
    closed without an HTTP/1.1 answer (RFC 9113 3.4; h2spec 3.5/2). An HTTP/1 request that is
    only malformed still gets its 400, and so do other lines that are not HTTP."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"INVALID CONNECTION PREFACE\r\n\r\n")
        assert s.recv(100) == b""
    for bad in (b"GET / HTTP/1.1x\r\nHost: t\r\n\r\n", b"GET / XTTP/1.1\r\nHost: t\r\n\r\n",
                b"PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\r\n\r\n"):
        with Conn(port) as c:
            c.send(bad)
            assert c.reply().status == 400, bad
    with Conn(port) as c:
        c.send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a TLS hello: not a method
        assert c.reply().status == 400
    app = cyserve.App()
    app.static("/plaintext", b"ok", content_type="text/plain")
    with serving(app.build(), http2=False) as srv, Conn(srv.port) as c:
        c.send(b"INVALID CONNECTION PREFACE\r\n\r\n")  # HTTP/1 only: answered as HTTP/1
        assert c.reply().status == 400


# --http 1|2|auto (granian's spelling; auto is every test above). Each mode on both transports.

def mode_app() -> Any:
    app = cyserve.App()
    app.static("/plaintext", b"ok", content_type="text/plain")

    @app.route("/py")
    def py(req: Any) -> str:
        return f"{req.http_version} {req.scheme} {req.method}"

    return app


def http1_over_tls(port: int, certs: dict[str, str], alpn: tuple[str, ...] | None,
                   request: bytes) -> tuple[str | None, bytes]:
    """The protocol ALPN chose and everything the server sent back to one HTTP/1.1 request."""
    ctx = ssl.create_default_context(cafile=certs["cert"])
    if alpn is not None:
        ctx.set_alpn_protocols(list(alpn))
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with ctx.wrap_socket(raw, server_hostname="localhost") as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return s.selected_alpn_protocol(), data


def test_http_1_speaks_http1_only(certs: dict[str, str]) -> None:
    """--http 1 (as --no-http2): the preface is an HTTP/1.1 error, Upgrade: h2c is declined
    (answered over HTTP/1.1), and ALPN never picks h2."""
    with serving(mode_app().build(), http="1", ssl_certfile=certs["cert"],
                 ssl_keyfile=certs["key"]) as tls, \
            serving(mode_app().build(), http="1") as plain:
        with Conn(plain.port) as c:
            c.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            assert c.reply().status in (400, 505)
        req, _ = upgrade_request("/py")
        with Conn(plain.port) as c:
            c.send(req)
            r = c.reply()
            assert (r.status, r.body) == (200, b"1.1 http GET")
        close = b"GET /py HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        for alpn in [("h2", "http/1.1"), ("h2",)]:
            chosen, data = http1_over_tls(tls.port, certs, alpn, close)
            assert chosen == ("http/1.1" if "http/1.1" in alpn else None)
            assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"1.1 https GET")


def test_http_2_speaks_http2_only_in_cleartext() -> None:
    """--http 2 in cleartext: prior knowledge only. An HTTP/1.1 request, an Upgrade: h2c one
    too, gets a 505 that says why, then the connection closes; static and Python routes answer
    over h2c (the inline path, HTTP/1's, is not taken)."""
    with serving(mode_app().build(), http="2") as srv:
        with H2(srv.port) as c:
            assert c.get("/plaintext")[::2] == (200, b"ok")
            assert c.get("/py")[::2] == (200, b"2 http GET")
        for req in [b"GET /plaintext HTTP/1.1\r\nHost: t\r\n\r\n",
                    b"GET /py HTTP/1.0\r\n\r\n", upgrade_request("/py")[0]]:
            with Conn(srv.port) as c:
                c.send(req)
                r = c.reply()
                assert r.status == 505 and b"HTTP/2 only" in r.body, req
                assert r.header("connection") == "close"
                assert c.sock.recv(100) == b""  # closed after the answer
        with H2(srv.port) as c:  # and the port still serves HTTP/2
            assert c.get("/plaintext")[0] == 200


def test_http_2_speaks_http2_only_over_tls(certs: dict[str, str]) -> None:
    """--http 2 over TLS: ALPN offers h2 alone. A client offering only http/1.1 gets the
    no_application_protocol alert (RFC 7301 3.2); one that offers nothing is answered 505."""
    with serving(mode_app().build(), http="2", ssl_certfile=certs["cert"],
                 ssl_keyfile=certs["key"]) as srv:
        with H2(srv.port, tls=h2_context(certs)) as c:  # h2 chosen from h2 and http/1.1
            assert c.get("/py")[::2] == (200, b"2 https GET")
        with pytest.raises(ssl.SSLError, match="(?i)no.application.protocol"):
            http1_over_tls(srv.port, certs, ("http/1.1",), b"GET / HTTP/1.1\r\n\r\n")
        chosen, data = http1_over_tls(srv.port, certs, None,
                                      b"GET /py HTTP/1.1\r\nHost: t\r\n\r\n")
        assert chosen is None
        assert data.startswith(b"HTTP/1.1 505 HTTP Version Not Supported\r\n")
        assert b"HTTP/2 only" in data
        with H2(srv.port, tls=h2_context(certs, ("h2",))) as c:
            assert c.get("/plaintext")[0] == 200


@pytest.mark.parametrize("options, h1, h2c", [
    ({"http": 2}, 505, True),
    ({"http": "1"}, 200, False),
    ({"http2": False}, 200, False),
    ({"http2": True}, 200, True),
])
def test_http_mode_through_config(options: dict[str, Any], h1: int, h2c: bool) -> None:
    """The mode given to Config (as cyserve.run and the command give it) reaches the engine."""
    stop = threading.Event()
    ready: list[Any] = []
    config = Config(host="127.0.0.1", port=0, threads=1, graceful_timeout=1.0, **options)
    th = threading.Thread(target=serve, args=(mode_app(), config),
                          kwargs={"stop_event": stop, "ready": ready.append}, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not ready and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ready, "the server did not start"
    try:
        port = ready[0].port
        with Conn(port) as c:
            c.send(b"GET /plaintext HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.reply().status == h1
        if h2c:
            with H2(port) as c:
                assert c.get("/plaintext")[0] == 200
        else:
            with Conn(port) as c:
                c.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                assert c.reply().status in (400, 505)
    finally:
        stop.set()
        th.join(30)
        assert not th.is_alive(), "the server did not stop"


# The attacks of issue 16 not covered above: a zero-window stall, a SETTINGS flood, a
# CONTINUATION flood on a request's header block, an indexed HPACK bomb. Each asserts the
# server's answer, then that a second, normal connection is served at once.

def attack_app() -> Any:
    app = cyserve.App()
    app.static("/plaintext", b"ok", content_type="text/plain")
    app.static("/big", BIG, content_type="application/octet-stream")

    @app.route("/py")
    def py(req: Any) -> str:
        return "py"

    return app


def served_promptly(port: int) -> None:
    t0 = time.monotonic()
    with H2(port, timeout=5) as c:
        assert c.get("/plaintext")[::2] == (200, b"ok")
    assert time.monotonic() - t0 < 2


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big") + payload


def hpack_int(value: int, prefix: int, first: int = 0) -> bytes:
    """RFC 7541 5.1: value with an N-bit prefix, the first byte's other bits from first."""
    top = (1 << prefix) - 1
    if value < top:
        return bytes([first | value])
    out = [first | top]
    value -= top
    while value >= 128:
        out.append(value % 128 | 128)
        value //= 128
    return bytes(out + [value])


def hpack_literal(name: bytes, value: bytes, indexed: bool = False) -> bytes:
    """A literal field with a new name: with incremental indexing (it enters the client's
    dynamic table) or without."""
    return (b"\x40" if indexed else b"\x00") + hpack_int(len(name), 7) + name + \
        hpack_int(len(value), 7) + value


def request_block(path: bytes = b"/py") -> bytes:
    # :method GET, :scheme http (static 2, 6); :path and :authority literal, names indexed.
    return b"\x82\x86" + b"\x04" + hpack_int(len(path), 7) + path + b"\x01\x09localhost"


class RawH2:
    """A client that writes frames by hand (the h2 library would refuse to send these) and reads
    the server's: the answer's :status, RST_STREAM and GOAWAY codes, or the end."""

    def __init__(self, port: int) -> None:
        import hpack

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
        self.dec = hpack.Decoder()
        self.buf = b""
        # The server's SETTINGS, acknowledged now: an ACK written later could fall between a
        # HEADERS frame and its CONTINUATION, which the peer must take for a protocol error.
        first = self.next_frame()
        assert first is not None and first[0] == 4, first

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_frame(self) -> tuple[int, int, int, bytes] | None:
        """The next frame, or None when the server closed (or reset) the connection."""
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.buf += data
        n = int.from_bytes(self.buf[:3], "big")
        kind, flags = self.buf[3], self.buf[4]
        sid = int.from_bytes(self.buf[5:9], "big") & ~(1 << 31)
        payload, self.buf = self.buf[9:9 + n], self.buf[9 + n:]
        if kind == 4 and not flags & 1:
            self.send(frame(4, 1, 0))  # the server's SETTINGS acknowledged
        return kind, flags, sid, payload

    def outcome(self, sid: int) -> tuple[str, int | None]:
        """What ended stream sid or the connection first: ("status", code), ("reset", error),
        ("goaway", error) or ("closed", None)."""
        while (f := self.next_frame()) is not None:
            kind, flags, fsid, payload = f
            if kind == 1 and fsid == sid:
                fields = dict(self.dec.decode(payload))
                return "status", int(fields[":status"])
            if kind == 3 and fsid == sid:
                return "reset", int.from_bytes(payload[:4], "big")
            if kind == 7:
                return "goaway", int.from_bytes(payload[4:8], "big")
        return "closed", None

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("pings", [False, True])
def test_zero_window_stall_is_bounded(pings: bool) -> None:
    """A client that opens no window (SETTINGS_INITIAL_WINDOW_SIZE 0) with answers to send:
    the server holds their streams at most body_timeout without progress, then GOAWAY and
    close, also when the client keeps the connection busy with PINGs (below the flood bound)
    meanwhile: only a byte of an answer or of a request body is progress, not any frame."""
    with serving(attack_app().build(), body_timeout=0.5) as srv:
        with H2(srv.port, preface=False) as c:
            c.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
            c.conn.initiate_connection()
            c.flush()
            t0 = time.monotonic()  # before the requests: the lower bound holds however late
            c.send("/big")
            c.send("/py")
            ended = None
            pinged = 0.0
            while time.monotonic() - t0 < 6 and ended is None:
                if pings and time.monotonic() - pinged > 0.1:  # 10 a second: no flood
                    pinged = time.monotonic()
                    c.conn.ping(b"stalled!")
                    c.flush()
                c.sock.settimeout(0.15)
                try:
                    c.pump()
                except (socket.timeout, TimeoutError):
                    continue
                except (EOFError, ConnectionResetError):
                    ended = "closed"
                for e in c.events:
                    if isinstance(e, h2.events.ConnectionTerminated):
                        ended = e.error_code
                    assert not isinstance(e, h2.events.DataReceived)  # the window is shut
            took = time.monotonic() - t0
            assert ended == h2.errors.ErrorCodes.NO_ERROR, ended
            assert 0.4 < took < 3, took
        served_promptly(srv.port)


def test_settings_flood_ends_the_connection() -> None:
    """SETTINGS frames sent without reading their ACKs, past HTTP2_CONTROL_PER_S in a second:
    GOAWAY ENHANCE_YOUR_CALM (the count PING floods share)."""
    with serving(attack_app().build()) as srv:
        with H2(srv.port) as c:
            for i in range(150):
                c.conn.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: 4096 + i})
            try:
                c.flush()
            except OSError:  # the server may close before the last frames are sent
                pass
            ended = c.until(h2.events.ConnectionTerminated)
            assert ended.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        with H2(srv.port) as c:  # SETTINGS below the bound are answered as usual
            for i in range(20):
                c.conn.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: 4096 + i})
            c.flush()
            assert c.get("/plaintext")[0] == 200
        served_promptly(srv.port)


@pytest.mark.parametrize("empty", [False, True])
def test_continuation_flood_ends_the_connection(empty: bool) -> None:
    """A request's header block that never ends: HEADERS without END_HEADERS, then
    CONTINUATION frames without end. Frames of 16 KB of fields: past four times
    max_header_bytes (4 KiB here: 80 KiB, the sixth frame) the server ends the connection with
    GOAWAY ENHANCE_YOUR_CALM (before the library's own bound of CONTINUATION frames, where it
    has one). Empty frames decode to nothing to count: the library's bound ends them (Debian's
    nghttp2 1.52.0-1+deb12u3 closes at once), else body_timeout does, since a header block that
    does not end is no progress. Either way the connection is not held."""
    with serving(attack_app().build(), body_timeout=0.5, max_header_bytes=4096) as srv:
        c = RawH2(srv.port)

        def flood() -> None:
            fields = b"" if empty else b"".join(hpack_literal(b"x-flood%d" % i, b"v" * 4000)
                                                for i in range(4))
            try:
                c.send(frame(1, 0, 1, request_block()))  # HEADERS without END_HEADERS
                t0 = time.monotonic()
                while time.monotonic() - t0 < 6:
                    c.send(frame(9, 0, 1, fields))  # CONTINUATION, END_HEADERS never set
                    time.sleep(0.001)
            except OSError:
                pass  # the server closed: what it sent is read below

        th = threading.Thread(target=flood, daemon=True)
        t0 = time.monotonic()
        th.start()
        try:
            kind, code = c.outcome(1)
            took = time.monotonic() - t0
        finally:
            c.close()
            th.join(10)
        if empty:
            assert kind in ("goaway", "closed") and code != 0, (kind, code)
        else:
            assert (kind, code) == ("goaway", h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        assert took < 3, took
        served_promptly(srv.port)


@pytest.mark.parametrize("refs, expected", [(12, ("status", 431)), (2000, ("goaway", None))])
def test_indexed_hpack_bomb_is_bounded(refs: int, expected: tuple[str, int | None]) -> None:
    """A 4000-byte field put once into the client's dynamic table (HPACK incremental indexing,
    by a request within the limits), then referenced by a one-byte index many times: the
    decoded header list is counted as it is decoded (max_header_bytes, 8 KiB), not as it was
    sent. A dozen references (48 KB decoded from 12 bytes) is that stream's 431; two thousand
    (8 MB) pass four times the bound and end the connection before they are decoded."""
    with serving(attack_app().build()) as srv:
        c = RawH2(srv.port)
        try:
            insert = request_block() + hpack_literal(b"x-bomb", b"b" * 4000, indexed=True)
            c.send(frame(1, 5, 1, insert))  # END_STREAM | END_HEADERS
            assert c.outcome(1) == ("status", 200)
            bomb = request_block() + b"\xbe" * refs  # index 62: the newest dynamic entry
            c.send(frame(1, 5, 3, bomb))
            kind, code = c.outcome(3)
            assert kind == expected[0], (kind, code)
            if kind == "status":
                assert code == expected[1]
                c.send(frame(1, 5, 5, request_block(b"/plaintext")))  # the connection goes on
                assert c.outcome(5) == ("status", 200)
            else:
                assert code != 0  # an error GOAWAY
        finally:
            c.close()
        served_promptly(srv.port)
