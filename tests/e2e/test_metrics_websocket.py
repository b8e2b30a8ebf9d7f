"""--metrics-bind and WebSocket, scraped from a real server with prometheus_client's parser: the
connections' states stay true while GIL-free WebSockets (csrc/ws_nogil.c) go busy and idle at
every message and timer, and cyserve_websocket_closes_total counts each WebSocket's end by its
close code's class and by who began the closing handshake, on the three paths (GIL-free, ASGI
and the App's @app.websocket, both through csrc/ws_conn.c)."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_asgi import serving_app
from test_websocket import close_code_of, frame, handshake, read_frame

import cyserve
from _cython_ext import build_user_module
from _scrape import scrape, states
from _served import TIMEOUT, free_port

websockets = pytest.importorskip("websockets")
from websockets.sync.client import connect  # noqa: E402

pytestmark = pytest.mark.native

ROOT = Path(__file__).parent.parent.parent
MAX_SIZE = 4096  # ws_max_size: a frame announcing more closes 1009 from its head


@pytest.fixture(scope="module")
def user(tmp_path_factory: Any) -> Any:
    """tests/cython_ext/ws_user.pyx: a GIL-free echo that also closes with a code on "close N"
    and fails its callback (1011) on "fail"."""
    return build_user_module(ROOT / "tests" / "cython_ext" / "ws_user.pyx",
                             tmp_path_factory.mktemp("ws_user"))


def wait_states(mport: int, want: tuple[int, int, int], timeout: float = 10.0) -> None:
    # The gauges are published every 100 ms: wait for them to settle on want, and say what they
    # were last when they do not.
    deadline = time.monotonic() + timeout
    got = states(mport)
    while got != want:
        assert time.monotonic() < deadline, f"(idle, active, python) {got}, not {want}"
        time.sleep(0.05)
        got = states(mport)


def nogil_app(user: Any) -> cyserve.App:
    app = cyserve.App()
    app.nogil_websocket("/ws", user.HANDLER_CAPSULE)
    return app


# ---- the busy count of GIL-free WebSockets (csrc/ws_nogil.c) ----

def test_nogil_websocket_messages_leave_no_connection_counted_busy(user: Any) -> None:
    # Each message takes the idle connection (a readable event: busy, paid when its coroutine
    # starts) and gives it back idle once the socket is drained; the count of busy connections
    # must come back with it, or every open GIL-free WebSocket reads "active" for ever.
    mport = free_port()
    with serving_app(nogil_app(user), metrics_bind=f"127.0.0.1:{mport}") as port:
        wait_states(mport, (0, 0, 0))
        clients = [connect(f"ws://127.0.0.1:{port}/ws") for _ in range(4)]
        try:
            for round_ in range(25):
                for i, ws in enumerate(clients):
                    ws.send(f"m{round_}-{i}")
                for i, ws in enumerate(clients):
                    assert ws.recv(timeout=TIMEOUT) == f"m{round_}-{i}"
            wait_states(mport, (4, 0, 0))
        finally:
            for ws in clients:
                ws.close()
        wait_states(mport, (0, 0, 0))


def test_nogil_websocket_timers_leave_no_connection_counted_busy(user: Any) -> None:
    # The idle connection's timer takes it too (a ping due, a pong overdue): the keep-alive
    # pings of clients that answer them, then a client that does not, closed 1011 by its pong's
    # deadline from the timer's coroutine. Neither may change the count of busy connections.
    mport = free_port()
    # The pong timeout is long enough for a loaded machine's client threads to read each ping
    # and answer it (the library does, in a thread of its own); the silent client waits it out.
    with serving_app(nogil_app(user), metrics_bind=f"127.0.0.1:{mport}",
                     ws_ping_interval=0.1, ws_ping_timeout=2.0) as port:
        clients = [connect(f"ws://127.0.0.1:{port}/ws") for _ in range(2)]
        try:
            silent, head = handshake(port, path="/ws")
            with silent:
                assert head.startswith(b"HTTP/1.1 101 ")
                assert read_frame(silent)[0] == 9  # a ping, left unanswered
                assert close_code_of(silent) == 1011
                assert silent.recv(10) == b""
            time.sleep(0.5)  # several pings to the others, each from the timer
            for ws in clients:
                ws.send("still here")
                assert ws.recv(timeout=TIMEOUT) == "still here"
            wait_states(mport, (2, 0, 0))
            m = scrape(mport)
            assert m["cyserve_websocket_closes_total{by=server,reason=internal_error}"] == 1
        finally:
            for ws in clients:
                ws.close()
        wait_states(mport, (0, 0, 0))


# ---- closes by reason, on the three paths ----

async def asgi_echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Echoes text and bytes; "close N" closes with code N."""
    assert scope["type"] == "websocket"
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            return
        text = msg.get("text")
        if text is not None and text.startswith("close "):
            await send({"type": "websocket.close", "code": int(text[6:])})
            return
        if text is not None:
            await send({"type": "websocket.send", "text": text})
        else:
            await send({"type": "websocket.send", "bytes": msg["bytes"]})


def app_echo() -> cyserve.App:
    app = cyserve.App()

    @app.websocket("/ws")
    def echo(ws: Any) -> None:
        for message in ws:
            if isinstance(message, str) and message.startswith("close "):
                ws.close(int(message[6:]))
                return
            ws.send(message)

    return app


PATHS: dict[str, Callable[[Any], Any]] = {
    "nogil": nogil_app,
    "asgi": lambda user: asgi_echo,
    "app": lambda user: app_echo(),
}


def broken(port: int, data: bytes, code: int) -> None:
    """A raw client sends data (a rule broken) after one good message; the server closes with
    code and then the TCP connection."""
    s, head = handshake(port, path="/ws")
    with s:
        assert head.startswith(b"HTTP/1.1 101 "), head
        s.sendall(frame(1, b"fine"))
        assert read_frame(s) == (1, b"fine")
        s.sendall(data)
        assert close_code_of(s) == code
        assert s.recv(10) == b""


def closed_by_client(port: int, code: int | None) -> None:
    """A raw client begins the closing handshake (code None: a close frame without a code); the
    server echoes it."""
    s, head = handshake(port, path="/ws")
    with s:
        assert head.startswith(b"HTTP/1.1 101 "), head
        s.sendall(frame(8, b"" if code is None else struct.pack("!H", code)))
        assert close_code_of(s) == code
        assert s.recv(10) == b""


def closed_by_server(port: int, code: int) -> None:
    """The application closes with code when asked; the client answers its close frame."""
    s, head = handshake(port, path="/ws")
    with s:
        assert head.startswith(b"HTTP/1.1 101 "), head
        s.sendall(frame(1, f"close {code}".encode()))
        assert close_code_of(s) == code
        s.sendall(frame(8, struct.pack("!H", code)))
        assert s.recv(10) == b""


@pytest.mark.parametrize("path", list(PATHS))
def test_websocket_closes_counted_by_reason(user: Any, path: str) -> None:
    mport = free_port()
    app = PATHS[path](user)
    with serving_app(app, metrics_bind=f"127.0.0.1:{mport}", ws_max_size=MAX_SIZE,
                     ws_per_message_deflate=False) as port:
        key = "cyserve_websocket_closes_total{by=%s,reason=%s}"
        before = scrape(mport)
        closes = {k: v for k, v in before.items() if k.startswith("cyserve_websocket_closes")}
        assert closes and not any(closes.values()), closes
        # The rules a client can break, each closed by the server with the RFC's code.
        broken(port, frame(1, b"hi", mask=False), 1002)                 # unmasked
        broken(port, frame(1, b"ok\xc0\xaf"), 1007)                     # invalid UTF-8
        broken(port, bytes([0x82, 0xFF]) + struct.pack("!Q", MAX_SIZE + 1) + b"mask", 1009)
        # Normal closes begun by the client: 1000, 1001 and a close frame without a code.
        closed_by_client(port, 1000)
        closed_by_client(port, 1001)
        closed_by_client(port, None)
        # Closes the application began: normal, policy, and an application's own code.
        closed_by_server(port, 1000)
        closed_by_server(port, 1008)
        closed_by_server(port, 4001)
        # A client that leaves without a close frame.
        s, head = handshake(port, path="/ws")
        assert head.startswith(b"HTTP/1.1 101 ")
        s.sendall(frame(1, b"bye"))
        assert read_frame(s) == (1, b"bye")
        s.close()
        want = {
            key % ("server", "protocol_error"): 1,
            key % ("server", "invalid_payload"): 1,
            key % ("server", "too_big"): 1,
            key % ("client", "normal"): 3,
            key % ("server", "normal"): 1,
            key % ("server", "policy"): 1,
            key % ("server", "other"): 1,
            key % ("client", "abnormal"): 1,
        }
        # Each is counted when the server is done with its connection, which may come just
        # after the client saw the end: wait for the counts, and every connection gone.
        deadline = time.monotonic() + 10
        while True:
            m = scrape(mport)
            got = {k: v for k, v in m.items() if k.startswith("cyserve_websocket_closes")}
            if got == {**{k: 0.0 for k in got}, **want} and m["cyserve_open_connections"] == 0:
                break
            assert time.monotonic() < deadline, (got, m["cyserve_open_connections"])
            time.sleep(0.05)
        assert states(mport) == (0, 0, 0)
