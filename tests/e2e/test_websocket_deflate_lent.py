"""permessage-deflate (RFC 7692) on the ASGI and App WebSocket paths (csrc/ws_conn.c): answered
with no context takeover both ways whatever the offer said, so the engine keeps no zlib stream
per connection and lends each message the worker thread's (csrc/ws_zlend.c). Each server message
inflates alone; a client that keeps its context after being told not to is closed with 1007; a
compressed message in pieces holds an inflater while other connections' messages on the same
thread get theirs; many connections interleaved; the App's blocking echo the same way."""

from __future__ import annotations

import socket
import time
import zlib
from typing import Any

import pytest
from test_asgi import serving_app
from test_nogil_websocket_deflate import BOTH, NO_TAKEOVER_ANSWERS, OFFER, inflate
from test_websocket import close_code_of, echo_app, frame, handshake
from test_websocket_options import compressed_frame, header_of, read_raw_frame

from cyserve import App

websockets = pytest.importorskip("websockets")
from websockets.sync.client import connect  # noqa: E402

pytestmark = pytest.mark.native



def app_echo() -> App:
    app = App()

    @app.websocket("/echo")
    def echo(ws: Any) -> None:
        for message in ws:
            ws.send(message)

    return app


@pytest.fixture(scope="module", params=["asgi", "app"])
def port(request: Any) -> Any:
    # One worker thread: every connection borrows the same thread's streams.
    with serving_app(echo_app if request.param == "asgi" else app_echo(), threads=1) as p:
        yield p


@pytest.mark.parametrize("offer,answer", NO_TAKEOVER_ANSWERS)
def test_negotiation_adds_no_context_takeover(port: int, offer: str, answer: bytes | None) -> None:
    s, head = handshake(port, extra=f"Sec-WebSocket-Extensions: {offer}\r\n")
    with s:
        assert head.startswith(b"HTTP/1.1 101 ")
        assert header_of(head, b"sec-websocket-extensions") == answer


def test_websockets_client_echoes_compressed(port: int) -> None:
    with connect(f"ws://127.0.0.1:{port}/echo") as ws:
        assert ws.response.headers.get("Sec-WebSocket-Extensions") == BOTH.decode()
        text = "compressible é " * 2000
        for _ in range(3):
            ws.send(text)
            assert ws.recv(timeout=5) == text


def test_each_server_message_inflates_alone(port: int) -> None:
    s, head = handshake(port, extra="Sec-WebSocket-Extensions: permessage-deflate; "
                                    "server_max_window_bits=10\r\n")
    with s:
        text = b"0123456789abcdef" * 100
        sizes = set()
        for _ in range(3):
            s.sendall(compressed_frame(2, text))
            b0, payload = read_raw_frame(s)
            assert b0 == 0xC2, "FIN, RSV1, binary"
            assert inflate(payload, wbits=-10) == text  # a 1 KiB window, no context
            sizes.add(len(payload))
        # With context the second and third would be a few bytes (one back-reference).
        assert len(sizes) == 1 and min(sizes) < len(text) // 4


def test_client_context_takeover_breaks_the_promise(port: int) -> None:
    # The second message refers back to the first: the client was told not to (1007).
    s, head = handshake(port, extra=OFFER)
    with s:
        text = b"the same words again and again " * 8
        c = zlib.compressobj(wbits=-15)
        first = (c.compress(text) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]
        second = (c.compress(text) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]
        s.sendall(frame(2, first, rsv=0x40))
        b0, payload = read_raw_frame(s)
        assert b0 == 0xC2 and inflate(payload) == text
        s.sendall(frame(2, second, rsv=0x40))
        assert close_code_of(s) == 1007


def test_message_in_pieces_holds_its_inflater_while_others_borrow(port: int) -> None:
    text = ("fragmented and compressed ü " * 300).encode()
    c = zlib.compressobj(wbits=-15)
    data = (c.compress(text) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]
    half = len(data) // 2
    a, _ = handshake(port, extra=OFFER)
    b, _ = handshake(port, extra=OFFER)
    with a, b:
        a.sendall(frame(1, data[:half], fin=False, rsv=0x40))
        time.sleep(0.05)  # a waits for its rest, holding the thread's inflater
        for i in range(3):
            other = f"meanwhile {i} ".encode() * 40
            b.sendall(compressed_frame(1, other))
            b0, payload = read_raw_frame(b)
            assert b0 == 0xC1 and inflate(payload) == other
        a.sendall(frame(0, data[half:]))
        b0, payload = read_raw_frame(a)
        assert b0 == 0xC1 and inflate(payload) == text
        a.sendall(compressed_frame(1, text))  # and its next message inflates alone
        b0, payload = read_raw_frame(a)
        assert b0 == 0xC1 and inflate(payload) == text


def test_bad_deflate_data_closes_1007_and_others_go_on(port: int) -> None:
    good, _ = handshake(port, extra=OFFER)
    with good:
        bad, _ = handshake(port, extra=OFFER)
        with bad:
            bad.sendall(frame(2, b"\xff\xff\xff\xff\xff", rsv=0x40))
            assert close_code_of(bad) == 1007
        # The inflater that failed was not lent again.
        msg = b"still fine " * 30
        good.sendall(compressed_frame(2, msg))
        b0, payload = read_raw_frame(good)
        assert b0 == 0xC2 and inflate(payload) == msg


def test_many_connections_share_the_threads_streams(port: int) -> None:
    socks: list[socket.socket] = []
    try:
        for _ in range(20):
            s, _ = handshake(port, extra=OFFER)
            socks.append(s)
        for round_ in range(3):
            for i, s in enumerate(socks):
                s.sendall(compressed_frame(1, f"connection {i} round {round_} ".encode() * 20))
            for i, s in enumerate(socks):
                b0, payload = read_raw_frame(s)
                assert b0 == 0xC1
                assert inflate(payload) == f"connection {i} round {round_} ".encode() * 20
    finally:
        for s in socks:
            s.close()
