"""The queue that hands ASGI requests from the workers to the event loop without the GIL
(csrc/asgiq.h, native/asgi.pyx): which requests take it, and that the notices that follow a
request (each streamed piece written, each body piece read, the client gone) come through it too,
while what the app sees stays the same. The queue's own counters say what went through it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from _rawhttp import Conn, get, request
from test_asgi import serving_app

from cyserve._core import _asgiq_counts

pytestmark = pytest.mark.native

Scope = dict[str, Any]


async def app(scope: Scope, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        raise RuntimeError("no lifespan here")
    got = b""
    pieces = 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            return
        got += msg["body"]
        pieces += 1
        if not msg["more_body"]:
            break
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(5):
            await send({"type": "http.response.body", "body": b"%d" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b"%s %s %d %d" % (scope["method"].encode(), scope["path"].encode(), len(got), pieces)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


def test_requests_and_their_notices_go_through_the_queue() -> None:
    with serving_app(app) as port:
        starts, notices = _asgiq_counts()
        for i in range(5):
            assert request(port, get(f"/r{i}")).body == f"GET /r{i} 0 1".encode()
        after = _asgiq_counts()
        assert after[0] - starts == 5, "each plain request came through the queue"
        assert after[1] == notices, "a whole answer needs no notice"

        r = request(port, get("/stream"))
        assert r.body == b"01234"
        streamed = _asgiq_counts()
        assert streamed[0] - after[0] == 1
        # Each piece written is told to the app (that is what paces it): five pieces, then the
        # empty last one.
        assert streamed[1] - after[1] >= 5

        # A body read as it arrives: each piece the app asks for comes as a notice.
        body = b"y" * 200_000
        r = request(port, b"POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body))
        assert r.body == b"POST /up 200000 4"  # 64 KiB pieces: 3 full and the rest
        uploaded = _asgiq_counts()
        assert uploaded[0] - streamed[0] == 1
        assert uploaded[1] - streamed[1] == 4

        # An Upgrade field that is no WebSocket handshake is looked at on the worker (the
        # offloaded call), and answered the same.
        r = request(port, get("/up2", extra="Upgrade: something\r\n"))
        assert r.body == b"GET /up2 0 1"
        assert _asgiq_counts()[0] == uploaded[0], "the offloaded call, not the queue"


def test_a_client_gone_is_told_through_the_queue() -> None:
    told = threading.Event()

    async def waits(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise RuntimeError("no lifespan here")
        await receive()
        msg = await asyncio.wait_for(receive(), 10)  # only the client's leaving ends this
        if msg["type"] == "http.disconnect":
            told.set()

    with serving_app(waits) as port:
        before = _asgiq_counts()
        with Conn(port) as c:
            c.send(get("/wait"))
            for _ in range(200):
                if _asgiq_counts()[0] > before[0]:
                    break
                threading.Event().wait(0.01)
        assert told.wait(10), "http.disconnect reached the app"
        after = _asgiq_counts()
        assert after[0] - before[0] == 1 and after[1] - before[1] == 1


@pytest.mark.parametrize("asgi_loops", ["thread"])
def test_a_loop_per_worker_thread_keeps_the_batches(asgi_loops: str) -> None:
    # With a loop per worker thread each worker's batch feeds its own loop: the process's
    # queue stays unused.
    with serving_app(app, asgi_loops=asgi_loops) as port:
        before = _asgiq_counts()
        assert request(port, get("/t")).body == b"GET /t 0 1"
        assert request(port, get("/stream")).body == b"01234"
        assert _asgiq_counts() == before
