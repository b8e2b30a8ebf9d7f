"""GIL-free WebSocket routes (csrc/ws_nogil.c, app.nogil_websocket): the echo of
examples/ws_echo_nogil.pyx and the handler of tests/cython_ext/ws_user.pyx, each built against the
installed package as a user would, served through Server, with the `websockets` library as a real
client and raw sockets for what a library would never send."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_websocket import close_code_of, frame, handshake, read_frame

import cyserve
from _cython_ext import build_user_module
from _rawhttp import serving

websockets = pytest.importorskip("websockets")
from websockets.sync.client import connect  # noqa: E402

pytestmark = pytest.mark.native

ROOT = Path(__file__).parent.parent.parent


@pytest.fixture(scope="module")
def built(tmp_path_factory: Any) -> tuple[Any, Any]:
    echo = build_user_module(ROOT / "examples" / "ws_echo_nogil.pyx",
                             tmp_path_factory.mktemp("ws_echo"))
    user = build_user_module(ROOT / "tests" / "cython_ext" / "ws_user.pyx",
                             tmp_path_factory.mktemp("ws_user"))
    return echo, user


def routes(built: tuple[Any, Any]) -> list[Any]:
    echo, user = built
    return [("path", "/echo", ("GET",), "nogil_ws", (echo.ECHO, None)),
            ("path", "/user", ("GET",), "nogil_ws", (user.HANDLER_CAPSULE, None)),
            ("path", "/plain", ("GET",), "static", (200, [], b"plain"))]


@pytest.fixture(scope="module")
def port(built: tuple[Any, Any]) -> Any:
    with serving(routes(built), threads=2) as srv:
        yield srv.port


def wait_for(pred: Any, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_echo_text_and_bytes(port: int) -> None:
    with connect(f"ws://127.0.0.1:{port}/echo") as ws:
        for i in range(50):
            ws.send(f"message {i} é")
            assert ws.recv(timeout=5) == f"message {i} é"
        ws.send(b"\x00\x01\xff" * 1000)
        assert ws.recv(timeout=5) == b"\x00\x01\xff" * 1000
        ws.send("")
        assert ws.recv(timeout=5) == ""


def test_many_messages_in_one_batch_answered_in_order(port: int) -> None:
    s, head = handshake(port, path="/echo")
    with s:
        assert head.startswith(b"HTTP/1.1 101 ")
        s.sendall(b"".join(frame(1, f"m{i}".encode()) for i in range(200)))
        for i in range(200):
            assert read_frame(s) == (1, f"m{i}".encode())


def test_fragmented_message_with_interleaved_ping(port: int) -> None:
    s, head = handshake(port, path="/echo")
    with s:
        assert head.startswith(b"HTTP/1.1 101 ")
        s.sendall(frame(9, b"ping-data"))
        assert read_frame(s) == (10, b"ping-data")
        data = frame(1, "ab".encode(), fin=False) + frame(9, b"p") + frame(0, "cdé".encode())
        for i in range(len(data)):  # a byte at a time: every frame arrives in pieces
            s.sendall(data[i:i + 1])
            time.sleep(0.001)
        assert read_frame(s) == (10, b"p")
        assert read_frame(s) == (1, "abcdé".encode())
        s.sendall(frame(8, struct.pack("!H", 1000) + b"done"))
        assert read_frame(s) == (8, struct.pack("!H", 1000))
        assert s.recv(10) == b""  # the server closes the TCP connection after the close


def test_websockets_client_fragments_and_ping(port: int) -> None:
    with connect(f"ws://127.0.0.1:{port}/echo") as ws:
        ws.send(iter(["frag", "mented", " text"]))
        assert ws.recv(timeout=5) == "fragmented text"
        ws.send(iter([b"a" * 70000, b"b" * 70000]))
        assert ws.recv(timeout=5) == b"a" * 70000 + b"b" * 70000
        pong = ws.ping(b"are you there")
        assert pong.wait(5)


def test_client_frames_right_behind_the_handshake(port: int) -> None:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    with s:
        req = (f"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {'MDEyMzQ1Njc4OWFiY2RlZg=='}\r\n"
               f"Sec-WebSocket-Version: 13\r\n\r\n").encode()
        s.sendall(req + frame(1, b"early"))
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        assert head.startswith(b"HTTP/1.1 101 ")
        assert b"\r\nSec-WebSocket-Accept: " in head
        assert read_frame(s) == (1, b"early")


@pytest.mark.parametrize("kw,status", [
    ({"version": "8"}, 426),
    ({"method": "POST"}, 405),  # the route is GET's only
    ({"key": "short"}, 400),
])
def test_bad_handshakes(port: int, kw: dict[str, str], status: int) -> None:
    s, head = handshake(port, path="/echo", **kw)
    with s:
        assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
        if status == 426:
            assert b"\r\nSec-WebSocket-Version: 13\r\n" in head


def test_plain_get_to_the_route_is_refused(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        assert data.startswith(b"HTTP/1.1 400 ")


@pytest.mark.parametrize("data,code", [
    (frame(1, b"hi", mask=False), 1002),                      # unmasked
    (frame(1, b"hi", rsv=0x40), 1002),                        # RSV1: no extension here
    (frame(3, b""), 1002),                                    # reserved opcode
    (frame(9, b"x" * 126), 1002),                             # control frame too long
    (frame(0, b"x"), 1002),                                   # continuation without a message
    (frame(1, b"\xc0\xaf"), 1007),                            # overlong UTF-8
    (frame(1, b"ok\xed\xa0\x80", fin=False), 1007),           # surrogate, in a first fragment
    (frame(8, struct.pack("!H", 1005)), 1002),                # a reserved close code
    (bytes([0x82, 0xFF]) + struct.pack("!Q", 64 << 20) + b"mask", 1009),  # too big, from its head
])
def test_protocol_errors_close_with_their_code(port: int, built: Any, data: bytes,
                                               code: int) -> None:
    user = built[1]
    closes = user.counts()[1]
    s, head = handshake(port, path="/user")
    with s:
        assert head.startswith(b"HTTP/1.1 101 ")
        s.sendall(data)
        assert close_code_of(s) == code
        assert s.recv(10) == b""
    assert wait_for(lambda: user.counts()[1] == closes + 1)
    assert user.counts()[2] == code


def test_handler_close_with_code_and_reason(port: int, built: Any) -> None:
    user = built[1]
    with connect(f"ws://127.0.0.1:{port}/user") as ws:
        ws.send("close 4001")
        with pytest.raises(websockets.exceptions.ConnectionClosed) as exc:
            ws.recv(timeout=5)
        assert exc.value.rcvd is not None
        assert (exc.value.rcvd.code, exc.value.rcvd.reason) == (4001, "bye")
    assert wait_for(lambda: user.counts()[2] == 4001)


def test_invalid_close_code_is_refused_to_the_handler(port: int) -> None:
    with connect(f"ws://127.0.0.1:{port}/user") as ws:
        ws.send("close 1005")  # reserved: may not be sent
        assert ws.recv(timeout=5) == "close rc=-22"
        ws.send("close 999")
        assert ws.recv(timeout=5) == "close rc=-22"


def test_client_close_code_reaches_on_close(port: int, built: Any) -> None:
    user = built[1]
    with connect(f"ws://127.0.0.1:{port}/user") as ws:
        ws.send("x")
        assert ws.recv(timeout=5) == "x"
        ws.close(code=4321, reason="client says bye")
    assert wait_for(lambda: user.counts()[2] == 4321)


def test_client_gone_without_close_is_1006(port: int, built: Any) -> None:
    user = built[1]
    closes = user.counts()[1]
    s, head = handshake(port, path="/user")
    assert head.startswith(b"HTTP/1.1 101 ")
    s.close()
    assert wait_for(lambda: user.counts()[1] == closes + 1)
    assert user.counts()[2] == 1006


def test_failing_on_message_closes_1011(port: int) -> None:
    with connect(f"ws://127.0.0.1:{port}/user") as ws:
        ws.send("fail")
        with pytest.raises(websockets.exceptions.ConnectionClosedError) as exc:
            ws.recv(timeout=5)
        assert exc.value.rcvd is not None and exc.value.rcvd.code == 1011


def test_send_refuses_invalid_utf8_and_large_messages_go_out_whole(port: int) -> None:
    with connect(f"ws://127.0.0.1:{port}/user", max_size=None) as ws:
        ws.send("bad-utf8")
        assert ws.recv(timeout=5) == "rc=-22"
        ws.send("big 200000")
        assert ws.recv(timeout=5) == "big:"
        assert ws.recv(timeout=5) == bytes(i % 251 for i in range(200000))


def test_per_connection_data_and_greeting_from_on_open(port: int) -> None:
    with connect(f"ws://127.0.0.1:{port}/user?hello") as ws:
        assert ws.recv(timeout=5) == "hello"
        ws.send("a")
        assert ws.recv(timeout=5) == "a"
        ws.send("count")
        assert ws.recv(timeout=5) == "2"
    with connect(f"ws://127.0.0.1:{port}/user") as ws:
        ws.send("count")
        assert ws.recv(timeout=5) == "1"


def test_on_open_refuses_with_its_answer_and_sets_subprotocol(port: int) -> None:
    s, head = handshake(port, path="/user?deny")
    with s:
        assert head.startswith(b"HTTP/1.1 401 "), head
        assert b"\r\nX-Why: no\r\n" in head
    with connect(f"ws://127.0.0.1:{port}/user", subprotocols=["chat"]) as ws:
        assert ws.subprotocol == "chat"


def test_registration_checks(built: Any) -> None:
    echo, user = built
    app = cyserve.App()
    app.nogil_websocket("/ws", echo.ECHO)
    with pytest.raises(TypeError, match="cyserve.nogil_ws_handler"):
        app.nogil_websocket("/other", object())
    with pytest.raises(ValueError, match="on_open"):
        user.capsule_of_null()


def test_idle_websockets_survive_and_many_connections_echo(port: int) -> None:
    """Connections idle between messages (no coroutine) wake on their next frame."""
    socks = []
    for _ in range(100):
        s, head = handshake(port, path="/echo")
        assert head.startswith(b"HTTP/1.1 101 ")
        socks.append(s)
    time.sleep(0.3)
    for i, s in enumerate(socks):
        s.sendall(frame(1, str(i).encode()))
    for i, s in enumerate(socks):
        assert read_frame(s) == (1, str(i).encode())
        s.close()


def test_server_ping_and_pong_timeout(built: Any) -> None:
    """--ws-ping-interval pings an idle GIL-free WebSocket; one that never answers is closed
    with 1011 after --ws-ping-timeout."""
    user = built[1]
    # The pong timeout is long enough for a loaded machine's client thread to read each ping and
    # answer it (the library does, in a thread of its own); the raw client waits it out.
    with serving(routes(built), threads=1, ws_ping_interval=0.2, ws_ping_timeout=2.0) as srv:
        # The library answers pings: the connection stays open across several intervals.
        with connect(f"ws://127.0.0.1:{srv.port}/echo") as ws:
            time.sleep(1.0)
            ws.send("still here")
            assert ws.recv(timeout=5) == "still here"
        closes = user.counts()[1]
        s, head = handshake(srv.port, path="/user")
        with s:
            assert head.startswith(b"HTTP/1.1 101 ")
            op, payload = read_frame(s)  # a ping; never answered
            assert op == 9 and len(payload) == 8
            assert close_code_of(s) == 1011
        assert wait_for(lambda: user.counts()[1] == closes + 1)
        assert user.counts()[2] == 1011


def test_stop_closes_idle_websockets_with_1001(built: Any) -> None:
    user = built[1]
    result: list[Any] = []
    with serving(routes(built), threads=1) as srv:
        ws = connect(f"ws://127.0.0.1:{srv.port}/user")
        closes = user.counts()[1]

        def reader() -> None:
            try:
                ws.recv(timeout=20)
            except websockets.exceptions.ConnectionClosed as exc:
                result.append(exc.rcvd.code if exc.rcvd else None)

        th = threading.Thread(target=reader)
        th.start()
        time.sleep(0.2)
    th.join(10)
    ws.close()
    assert result == [1001]
    assert wait_for(lambda: user.counts()[1] == closes + 1)
    assert user.counts()[2] == 1001
