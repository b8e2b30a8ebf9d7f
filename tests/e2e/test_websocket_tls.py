"""WebSocket over TLS (wss://) on the three WebSocket paths: an ASGI app (app.asgi), an
@app.websocket handler and a GIL-free route (app.nogil_websocket with examples/ws_echo_nogil.pyx
and tests/cython_ext/ws_user.pyx). Each echoes text and a large binary message; the ASGI
websocket scope carries the TLS extension as the http scope does; and a stop closes idle
WebSockets with 1001 over TLS too: the GIL-free path's goodbye goes through the connection's
transport (conn_send_nowait), as a TLS record, from the stop's sweep.

The TLS clients are websockets' asyncio client, not its sync one: the sync client reads in a
thread of its own while the caller writes, on one ssl socket, and under the sanitizers' timing
its upgrade request was at times never written (the server waited for it, and closed the
connection at its header timeout): a client's hang, seen with strace, not the server's."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_asgi import serving_app

import cyserve
from _cython_ext import build_user_module
from _certs import self_signed

websockets = pytest.importorskip("websockets")
from websockets.asyncio.client import connect as aconnect  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

pytestmark = pytest.mark.native

ROOT = Path(__file__).parent.parent.parent
Scope = dict[str, Any]
BIG = bytes(range(256)) * 1200  # 300 KB: many TLS records, past every socket buffer's start


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return self_signed(tmp_path_factory.mktemp("wss"))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    echo = build_user_module(ROOT / "examples" / "ws_echo_nogil.pyx",
                             tmp_path_factory.mktemp("wss_echo"))
    user = build_user_module(ROOT / "tests" / "cython_ext" / "ws_user.pyx",
                             tmp_path_factory.mktemp("wss_user"))
    return echo, user


def client_ctx(certs: dict[str, str]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certs["cert"])


def make_app(built: tuple[Any, Any], scopes: list[Scope]) -> cyserve.App:
    echo, user = built
    app = cyserve.App()

    async def asgi_echo(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        scopes.append(scope)
        await receive()
        await send({"type": "websocket.accept"})
        while True:
            msg = await receive()
            if msg["type"] == "websocket.disconnect":
                return
            if msg.get("text") is not None:
                await send({"type": "websocket.send", "text": msg["text"]})
            else:
                await send({"type": "websocket.send", "bytes": msg["bytes"]})

    app.asgi("/a", asgi_echo)

    @app.websocket("/s")
    def sync_echo(ws: Any) -> None:
        for message in ws:
            ws.send(message)

    app.nogil_websocket("/n", echo.ECHO)
    app.nogil_websocket("/u", user.HANDLER_CAPSULE)
    return app


@pytest.mark.parametrize("path", ["/a/", "/s", "/n"])
def test_echo_over_wss(built: tuple[Any, Any], certs: dict[str, str], path: str) -> None:
    scopes: list[Scope] = []
    with serving_app(make_app(built, scopes), ssl_certfile=certs["cert"],
                     ssl_keyfile=certs["key"]) as port:

        async def talk() -> None:
            async with aconnect(f"wss://localhost:{port}{path}", ssl=client_ctx(certs)) as ws:
                for i in range(20):
                    await ws.send(f"message {i} é")
                    assert await asyncio.wait_for(ws.recv(), 10) == f"message {i} é"
                await ws.send(BIG)
                assert await asyncio.wait_for(ws.recv(), 10) == BIG

        asyncio.run(talk())
    if path == "/a/":
        # The ASGI websocket scope has the TLS extension, as the http scope over TLS does.
        (scope,) = scopes
        assert scope["scheme"] == "wss"
        tls = scope["extensions"]["tls"]
        assert tls["tls_version"] in (0x0303, 0x0304) and isinstance(tls["cipher_suite"], int)
        assert tls["server_cert"].startswith("-----BEGIN CERTIFICATE-----")
        assert tls["client_cert_chain"] == []
        assert "websocket.http.response" in scope["extensions"]


def test_cleartext_websocket_scope_has_no_tls_extension(built: tuple[Any, Any]) -> None:
    scopes: list[Scope] = []
    with serving_app(make_app(built, scopes)) as port:
        with connect(f"ws://127.0.0.1:{port}/a/") as ws:
            ws.send("x")
            assert ws.recv(timeout=10) == "x"
    (scope,) = scopes
    assert scope["scheme"] == "ws"
    assert scope["extensions"] == {"websocket.http.response": {}}


@pytest.mark.parametrize("path", ["/a/", "/s", "/u"])
def test_stop_closes_idle_websockets_with_1001_over_tls(built: tuple[Any, Any],
                                                       certs: dict[str, str], path: str) -> None:
    user = built[1]
    closes = user.counts()[1]
    result: list[Any] = []
    warmed = threading.Event()

    def client(url: str) -> None:
        async def talk() -> None:
            async with aconnect(url, ssl=client_ctx(certs)) as ws:
                await ws.send("warm")
                result.append(await asyncio.wait_for(ws.recv(), 10))
                warmed.set()
                try:
                    await asyncio.wait_for(ws.recv(), 20)
                except websockets.exceptions.ConnectionClosed as exc:
                    result.append(exc.rcvd.code if exc.rcvd else None)

        asyncio.run(talk())

    with serving_app(make_app(built, []), threads=1, graceful_timeout=0.5,
                     ssl_certfile=certs["cert"], ssl_keyfile=certs["key"]) as port:
        th = threading.Thread(target=client, args=(f"wss://localhost:{port}{path}",))
        th.start()
        assert warmed.wait(10)
        time.sleep(0.2)  # the connection is idle when the stop comes
    th.join(10)
    assert result == ["warm", 1001]
    if path == "/u":
        # The handler's on_close was told the code the client got.
        deadline = time.monotonic() + 5
        while user.counts()[1] != closes + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert user.counts()[1:] == (closes + 1, 1001)
