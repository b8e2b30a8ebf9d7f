"""ASGI http.disconnect while the application still works: the request's coroutine waits for the
answer and watches its socket at once (sched_io_wait_signal), so a client that leaves is told to
the app's receive() at once, and a send() afterwards raises an OSError (as with uvicorn);
pipelined requests behind a slow answer are not mistaken for a departure."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import pytest
from test_asgi import serving_app

from cyserve._core import ClientDisconnected

pytestmark = pytest.mark.native

Scope = dict[str, Any]


def test_disconnect_reaches_a_working_app() -> None:
    events: list[Any] = []
    working = threading.Event()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        assert (await receive())["type"] == "http.request"
        working.set()
        # A long computation that listens for the client going away (as SSE or long polling).
        msg = await asyncio.wait_for(receive(), timeout=30)
        events.append(msg["type"])
        try:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"late"})
        except ClientDisconnected as exc:
            events.append(isinstance(exc, OSError))

    with serving_app(app) as port:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
        # The app is about to wait in its second receive() (a close before it gets there is
        # found there too).
        assert working.wait(20), "the request did not reach the app"
        t0 = time.monotonic()
        s.close()
        while len(events) < 2 and time.monotonic() - t0 < 20:
            time.sleep(0.01)
        assert events == ["http.disconnect", True]
        # Told at once, not when the app gave up (30 s): a bound well short of that, with room
        # for a loaded machine.
        assert time.monotonic() - t0 < 10


def test_pipelined_request_behind_a_slow_answer() -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        if scope["path"] == "/slow":
            await asyncio.sleep(0.3)
        body = scope["path"].encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    with serving_app(app) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
            time.sleep(0.1)  # the second request arrives while the first is worked on
            s.sendall(b"GET /next HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        assert data.count(b"HTTP/1.1 200 ") == 2
        assert data.index(b"/slow") < data.index(b"/next")
