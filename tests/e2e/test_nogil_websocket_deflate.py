"""permessage-deflate (RFC 7692) on GIL-free WebSocket routes (csrc/ws_nogil.c): negotiated with
no context takeover both ways whatever the offer said (so an idle connection keeps no zlib
state), spoken both ways, a compressed message in fragments across batches, the client's
broken deflate data (1007) and a deflate bomb (1009), and offers left unanswered when the option
is off. The echo is examples/ws_echo_nogil.pyx, built as a user builds it."""

from __future__ import annotations

import os
import socket
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from test_websocket import close_code_of, frame, handshake
from test_websocket_options import compressed_frame, header_of, read_raw_frame

from _cython_ext import build_user_module
from _rawhttp import serving

websockets = pytest.importorskip("websockets")
from websockets.sync.client import connect  # noqa: E402

pytestmark = pytest.mark.native

ROOT = Path(__file__).parent.parent.parent
BOTH = b"permessage-deflate; server_no_context_takeover; client_no_context_takeover"
OFFER = "Sec-WebSocket-Extensions: permessage-deflate\r\n"


@pytest.fixture(scope="module")
def echo(tmp_path_factory: Any) -> Any:
    return build_user_module(ROOT / "examples" / "ws_echo_nogil.pyx",
                             tmp_path_factory.mktemp("ws_echo_deflate"))


def routes(echo: Any) -> list[Any]:
    return [("path", "/echo", ("GET",), "nogil_ws", (echo.ECHO, None))]


@pytest.fixture(scope="module")
def port(echo: Any) -> Any:
    with serving(routes(echo), threads=2, ws_max_size=1 << 20) as srv:
        yield srv.port


def inflate(payload: bytes, wbits: int = -15) -> bytes:
    # No context takeover: every server message inflates alone.
    return zlib.decompressobj(wbits=wbits).decompress(payload + b"\x00\x00\xff\xff")


# Offers and the answer due to each, on every path that speaks permessage-deflate (also
# test_websocket_deflate_lent.py's): no context takeover both ways, whatever the offer said.
NO_TAKEOVER_ANSWERS = [
    ("permessage-deflate", BOTH),
    ("permessage-deflate; client_max_window_bits", BOTH),
    ("permessage-deflate; server_no_context_takeover; client_no_context_takeover", BOTH),
    ("permessage-deflate; server_max_window_bits=8, permessage-deflate; server_max_window_bits=10",
     BOTH + b"; server_max_window_bits=10"),
    ("x-webkit-deflate-frame, permessage-deflate; unknown=1", None),
]


@pytest.mark.parametrize("offer,answer", NO_TAKEOVER_ANSWERS)
def test_negotiation_adds_no_context_takeover(port: int, offer: str, answer: bytes | None) -> None:
    s, head = handshake(port, path="/echo", extra=f"Sec-WebSocket-Extensions: {offer}\r\n")
    with s:
        assert head.startswith(b"HTTP/1.1 101 ")
        assert header_of(head, b"sec-websocket-extensions") == answer


def test_offers_in_several_fields_are_one_list(port: int) -> None:
    extra = ("Sec-WebSocket-Extensions: x-unknown\r\n"
             "Sec-WebSocket-Extensions: permessage-deflate; server_max_window_bits=12\r\n")
    s, head = handshake(port, path="/echo", extra=extra)
    with s:
        assert header_of(head, b"sec-websocket-extensions") == BOTH + b"; server_max_window_bits=12"


def test_websockets_client_echoes_compressed(port: int) -> None:
    with connect(f"ws://127.0.0.1:{port}/echo") as ws:
        assert ws.response.headers.get("Sec-WebSocket-Extensions") == BOTH.decode()
        text = "compressible é " * 2000
        for _ in range(3):
            ws.send(text)
            assert ws.recv(timeout=5) == text
        data = os.urandom(50_000)  # incompressible: still right
        ws.send(data)
        assert ws.recv(timeout=5) == data
        ws.send("short")
        assert ws.recv(timeout=5) == "short"


def test_server_frames_are_compressed_without_context(port: int) -> None:
    s, head = handshake(port, path="/echo",
                        extra="Sec-WebSocket-Extensions: permessage-deflate; "
                              "server_max_window_bits=9\r\n")
    with s:
        text = b"0123456789abcdef" * 100
        for _ in range(3):
            s.sendall(compressed_frame(2, text))
            b0, payload = read_raw_frame(s)
            assert b0 == 0xC2, "FIN, RSV1, binary"
            assert len(payload) < len(text) // 4
            assert inflate(payload, wbits=-9) == text  # a 512-byte window, no context
        # A short message goes uncompressed (RSV1 clear), which the RFC allows.
        s.sendall(compressed_frame(1, b"hi"))
        assert read_raw_frame(s) == (0x81, b"hi")
        # An uncompressed client message is still welcome (RSV1 is per message).
        s.sendall(frame(1, b"plain " * 30))
        b0, payload = read_raw_frame(s)
        assert b0 == 0xC1 and inflate(payload) == b"plain " * 30


def test_compressed_message_in_fragments_across_batches(port: int) -> None:
    text = ("fragmented and compressed ü " * 300).encode()
    c = zlib.compressobj(wbits=-15)
    data = (c.compress(text) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]
    cut = [0, 7, len(data) // 2, len(data)]
    frames = []
    for i in range(3):
        op = (1 if i == 0 else 0)
        frames.append(frame(op, data[cut[i]:cut[i + 1]], fin=(i == 2),
                            rsv=0x40 if i == 0 else 0))
    s, head = handshake(port, path="/echo", extra=OFFER)
    with s:
        s.sendall(frames[0])
        time.sleep(0.05)  # the connection goes idle holding the message's inflater
        s.sendall(frame(9, b"ping in between"))
        assert read_raw_frame(s) == (0x8A, b"ping in between")
        s.sendall(frames[1])
        time.sleep(0.05)
        s.sendall(frames[2])
        b0, payload = read_raw_frame(s)
        assert b0 == 0xC1 and inflate(payload) == text


def test_client_context_takeover_breaks_the_promise(port: int) -> None:
    # The second message refers back to the first: the client was told not to (1007).
    s, head = handshake(port, path="/echo", extra=OFFER)
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


def deflated(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return (c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]


@pytest.mark.parametrize("payload,code", [
    (b"\xff\xff\xff\xff\xff", 1007),     # not deflate data
    (deflated(b"ok \xc0\xaf"), 1007),   # inflates to invalid UTF-8
    (deflated(b"ok \xe2\x82"), 1007),   # ends inside a character
])
def test_bad_compressed_messages_close(port: int, payload: bytes, code: int) -> None:
    s, head = handshake(port, path="/echo", extra=OFFER)
    with s:
        s.sendall(frame(1, payload, rsv=0x40))
        assert close_code_of(s) == code
        assert s.recv(10) == b""


def test_deflate_bomb_closes_1009_at_max_size(port: int) -> None:
    c = zlib.compressobj(wbits=-15)
    bomb = (c.compress(b"\0" * (4 << 20)) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]
    assert len(bomb) < 8 << 10
    s, head = handshake(port, path="/echo", extra=OFFER)
    with s:
        s.sendall(frame(2, bomb, rsv=0x40))
        assert close_code_of(s) == 1009


def test_rsv1_without_the_extension_is_1002(port: int) -> None:
    s, head = handshake(port, path="/echo")
    with s:
        assert header_of(head, b"sec-websocket-extensions") is None
        s.sendall(compressed_frame(1, b"x" * 100))
        assert close_code_of(s) == 1002


def test_deflate_off_leaves_offers_unanswered(echo: Any) -> None:
    with serving(routes(echo), threads=1, ws_per_message_deflate=False) as srv:
        s, head = handshake(srv.port, path="/echo",
                            extra=OFFER)
        with s:
            assert head.startswith(b"HTTP/1.1 101 ")
            assert header_of(head, b"sec-websocket-extensions") is None
            s.sendall(compressed_frame(1, b"x" * 100))
            assert close_code_of(s) == 1002


def test_many_connections_share_the_threads_streams(port: int) -> None:
    # Messages on many connections at once, interleaved: each inflates and deflates alone.
    socks: list[socket.socket] = []
    try:
        for _ in range(20):
            s, head = handshake(port, path="/echo",
                                extra=OFFER)
            socks.append(s)
        for round_ in range(3):
            for i, s in enumerate(socks):
                s.sendall(compressed_frame(1, f"connection {i} round {round_} ".encode() * 20))
            for i, s in enumerate(socks):
                b0, payload = read_raw_frame(s)
                assert inflate(payload) == f"connection {i} round {round_} ".encode() * 20
    finally:
        for s in socks:
            s.close()
