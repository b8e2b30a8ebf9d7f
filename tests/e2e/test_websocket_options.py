"""WebSocket options end to end: permessage-deflate (RFC 7692) negotiated and spoken both ways,
declined when off, a deflate bomb closed with 1009 at ws_max_size, the server's keep-alive
pings and their pong timeout (1011), and the inbound window: an application that does not call
receive() stops the server reading the socket (TCP holds the client back) instead of letting it
buffer without bound."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
import zlib
from typing import Any

import pytest
from test_asgi import serving_app
from test_websocket import close_code_of, echo_app, frame, handshake, read_frame

from cyserve import cli

websockets = pytest.importorskip("websockets")
from websockets.sync.client import connect  # noqa: E402

pytestmark = pytest.mark.native

Scope = dict[str, Any]
DEFLATE = "Sec-WebSocket-Extensions: permessage-deflate\r\n"
BOTH = b"permessage-deflate; server_no_context_takeover; client_no_context_takeover"


def compressed_frame(op: int, data: bytes) -> bytes:
    """A client's compressed message: RSV1, the deflate data without its 00 00 FF FF tail."""
    c = zlib.compressobj(wbits=-15)
    payload = c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
    assert payload.endswith(b"\x00\x00\xff\xff")
    return frame(op, payload[:-4], rsv=0x40)


def read_raw_frame(s: socket.socket) -> tuple[int, bytes]:
    """A frame with its first byte whole (RSV bits included)."""
    def exact(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = s.recv(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out
    b0, b1 = exact(2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", exact(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", exact(8))[0]
    return b0, exact(n)


def header_of(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name.lower():
            return v.strip()
    return None


@pytest.fixture(scope="module")
def echo_port() -> Any:
    with serving_app(echo_app) as port:
        yield port


def test_websockets_client_negotiates_and_echoes_compressed(echo_port: int) -> None:
    with connect(f"ws://127.0.0.1:{echo_port}/echo") as ws:
        ext = ws.response.headers.get("Sec-WebSocket-Extensions")
        assert ext == ("permessage-deflate; server_no_context_takeover; "
                       "client_no_context_takeover")
        text = "compressible " * 2000
        for _ in range(3):  # each message compresses alone (no context takeover either way)
            ws.send(text)
            assert ws.recv(timeout=5) == text
        ws.send(os.urandom(50_000))  # incompressible: still compressed framing, still right
        assert len(ws.recv(timeout=5)) == 50_000


def test_server_frames_are_compressed(echo_port: int) -> None:
    s, head = handshake(echo_port, extra=DEFLATE)
    with s:
        assert head.startswith(b"HTTP/1.1 101 ")
        assert header_of(head, b"sec-websocket-extensions") == BOTH
        text = b"hello, compressed world! " * 40
        s.sendall(compressed_frame(1, text))
        b0, payload = read_raw_frame(s)
        assert b0 == 0xC1, "FIN, RSV1, text"
        assert len(payload) < len(text)
        d = zlib.decompressobj(wbits=-15)
        assert d.decompress(payload + b"\x00\x00\xff\xff") == text
        # A short message goes uncompressed (RSV1 clear), which the RFC allows.
        s.sendall(compressed_frame(1, b"hi"))
        assert read_raw_frame(s) == (0x81, b"hi")


# No context takeover is added whatever the offer said (tests/e2e/test_websocket_deflate_lent.py).
@pytest.mark.parametrize("offer,answer", [
    ("permessage-deflate; client_max_window_bits", BOTH),
    ("permessage-deflate; server_no_context_takeover; client_no_context_takeover", BOTH),
    ("permessage-deflate; server_max_window_bits=8, permessage-deflate; server_max_window_bits=10",
     BOTH + b"; server_max_window_bits=10"),
    ("x-webkit-deflate-frame, permessage-deflate; unknown=1", None),
])
def test_negotiation_answers(echo_port: int, offer: str, answer: bytes | None) -> None:
    s, head = handshake(echo_port, extra=f"Sec-WebSocket-Extensions: {offer}\r\n")
    with s:
        assert head.startswith(b"HTTP/1.1 101 ")
        assert header_of(head, b"sec-websocket-extensions") == answer


def test_server_no_context_takeover_and_small_window_are_kept(echo_port: int) -> None:
    extra = ("Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; "
             "server_max_window_bits=9\r\n")
    s, head = handshake(echo_port, extra=extra)
    with s:
        text = b"0123456789abcdef" * 100
        for _ in range(2):
            s.sendall(compressed_frame(2, text))
            b0, payload = read_raw_frame(s)
            assert b0 == 0xC2
            # Each message inflates alone (no context) with a 512-byte window.
            d = zlib.decompressobj(wbits=-9)
            assert d.decompress(payload + b"\x00\x00\xff\xff") == text


def test_deflate_off() -> None:
    with serving_app(echo_app, ws_per_message_deflate=False) as port:
        s, head = handshake(port, extra=DEFLATE)
        with s:
            assert head.startswith(b"HTTP/1.1 101 ")
            assert header_of(head, b"sec-websocket-extensions") is None
            s.sendall(compressed_frame(1, b"x" * 100))
            assert close_code_of(s) == 1002  # RSV1 without the extension


def test_deflate_bomb_and_max_size_close_1009() -> None:
    with serving_app(echo_app, ws_max_size=100_000) as port:
        s, head = handshake(port, extra=DEFLATE)
        with s:
            # 64 MiB of zeros in about 64 KiB: refused once 100,000 bytes are inflated.
            c = zlib.compressobj(wbits=-15)
            bomb = b"".join(c.compress(bytes(1 << 20)) for _ in range(64))
            bomb += c.flush(zlib.Z_SYNC_FLUSH)
            s.sendall(frame(2, bomb[:-4], rsv=0x40))
            assert close_code_of(s) == 1009
        s, head = handshake(port)
        with s:
            s.sendall(frame(2, b"a" * 100_000))
            assert read_frame(s) == (2, b"a" * 100_000)
            s.sendall(frame(2, b"a" * 100_001))
            assert close_code_of(s) == 1009


def test_ping_interval_and_pong_timeout() -> None:
    # The timeout is long enough for a loaded machine's client to read a ping and answer it,
    # and the bound below leaves it half of that to read the unanswered one.
    with serving_app(echo_app, ws_ping_interval=0.2, ws_ping_timeout=1.5) as port:
        s, head = handshake(port)
        with s:
            t0 = time.monotonic()
            op, payload = read_frame(s)
            assert op == 9 and time.monotonic() - t0 < 2
            s.sendall(frame(10, payload))  # answered: the connection stays
            op, payload2 = read_frame(s)
            assert op == 9 and payload2 != payload
            # Not answered: closed with 1011 once the timeout passes.
            t1 = time.monotonic()
            assert close_code_of(s) == 1011
            assert 0.75 < time.monotonic() - t1 < 8
            assert s.recv(10) == b""


def test_ping_interval_off() -> None:
    with serving_app(echo_app, ws_ping_interval=None) as port:
        s, head = handshake(port)
        with s:
            s.settimeout(0.6)
            with pytest.raises(socket.timeout):
                s.recv(10)


def test_app_that_does_not_receive_holds_the_client_back() -> None:
    """The app reads nothing until told: the server stops reading past its inbound window, so
    the client's sends block (TCP), and what was sent arrives whole once the app reads."""
    go = threading.Event()
    got: list[int] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        while not go.is_set():
            await asyncio.sleep(0.02)
        while True:
            msg = await receive()
            if msg["type"] == "websocket.disconnect":
                return
            got.append(len(msg["bytes"]))
            if len(got) == total_msgs:
                await send({"type": "websocket.send", "text": "done"})

    piece = frame(2, bytes(64 * 1024))
    total_msgs = 1024  # 64 MiB
    with serving_app(app) as port:
        s, head = handshake(port)
        with s:
            assert head.startswith(b"HTTP/1.1 101 ")
            s.setblocking(False)
            sent = 0
            view = memoryview(piece * 16)  # 1 MiB a write
            stalled_since = None
            while sent < total_msgs * len(piece):
                try:
                    n = s.send(view[sent % len(view):])
                    sent += n
                    stalled_since = None
                except BlockingIOError:
                    stalled_since = stalled_since or time.monotonic()
                    if time.monotonic() - stalled_since > 1.0:
                        break
                    time.sleep(0.01)
            # The kernel's buffers on both sides and the server's window, not 64 MiB.
            assert sent < 40 << 20, f"the server took {sent} bytes the app never asked for"
            go.set()
            s.setblocking(True)
            s.settimeout(30)
            while sent < total_msgs * len(piece):
                sent += s.send(view[sent % len(view):])
            assert read_frame(s) == (1, b"done")
            assert got == [64 * 1024] * total_msgs


def test_cli_ws_options() -> None:
    parser = cli.build_parser()
    c = cli.config_from_args(parser.parse_args(
        ["m:app", "--ws-max-size", "1000", "--ws-ping-interval", "5", "--ws-ping-timeout", "0",
         "--no-ws-per-message-deflate"]))
    assert (c.ws_max_size, c.ws_ping_interval, c.ws_ping_timeout, c.ws_per_message_deflate) == \
        (1000, 5.0, 0.0, False)
    d = cli.config_from_args(parser.parse_args(["m:app"]))
    assert (d.ws_max_size, d.ws_ping_interval, d.ws_ping_timeout, d.ws_per_message_deflate) == \
        (16 << 20, 20.0, 20.0, True)
