"""WebSocket handlers of the native App API: ``@app.websocket("/ws")``.

The decorated function is an ordinary (synchronous) Python function that gets a ``WebSocket`` and
may block in it: ``receive()`` waits for the client's next message, ``send()`` for room in the
server's queue. It runs on a thread of the route's own pool, and talks to the engine through
the same websocket scope as an ASGI application (``native/asgi_ws.pyx``): the engine reads and
writes frames, answers pings and makes the close handshake; this module only turns the scope's
messages into calls. Each open WebSocket holds one thread while its handler runs, so a route
serves at most ``max_connections`` at once (``app.websocket(path, max_connections=N)``, default
1000; threads are made as needed and kept for the next connection). One more is refused before
the handshake with 503 and ``Retry-After``, never left open without an answer (it once ran on
the event loop's default executor, min(32, CPUs + 4) threads: on a 2-core machine the seventh
WebSocket got its 101 and then no answer until another closed). Thousands of WebSockets at once
are ASGI's job: a coroutine each, not a thread.

    @app.websocket("/echo")
    def echo(ws):
        for message in ws:          # str or bytes, until the client closes
            ws.send(message)

The handshake is accepted before the function is called (``app.websocket(path,
subprotocols=[...])`` picks the first of the client's offers that the route speaks). A plain HTTP
request to the path is answered 426 Upgrade Required. When the function returns the connection
is closed with 1000; when it raises, with 1011 (and the traceback is logged)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["WebSocket", "WebSocketClosed"]

_log = logging.getLogger("cyserve.websocket")


class WebSocketClosed(Exception):
    """The connection is closed: ``code`` is the client's close code (1005 when it gave none,
    1006 when it went without a close frame) or the one the server closed with."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(f"WebSocket closed with code {code}" + (f": {reason}" if reason else ""))
        self.code = code
        self.reason = reason


class WebSocket:
    """One WebSocket connection, as the handler sees it. Its methods block; call them from the
    handler's thread (or any thread but the event loop's)."""

    def __init__(self, scope: dict[str, Any], receive: Any, send: Any,
                 loop: asyncio.AbstractEventLoop, subprotocol: str | None) -> None:
        self.scope = scope
        self.path: str = scope["path"]
        self.query_string: bytes = scope["query_string"]
        self.headers: list[tuple[bytes, bytes]] = scope["headers"]
        self.client: tuple[str, int] | None = scope.get("client")
        self.subprotocol = subprotocol
        self._receive = receive
        self._send = send
        self._loop = loop
        self.closed: WebSocketClosed | None = None

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def receive(self) -> str | bytes:
        """The client's next message: a str (text) or bytes (binary). Raises WebSocketClosed once
        the connection is closed."""
        if self.closed is not None:
            raise self.closed
        msg = self._call(self._receive())
        if msg["type"] == "websocket.disconnect":
            self.closed = WebSocketClosed(msg.get("code", 1005), msg.get("reason") or "")
            raise self.closed
        text = msg.get("text")
        data: str | bytes = text if text is not None else msg["bytes"]
        return data

    def __iter__(self) -> Iterator[str | bytes]:
        """The messages until the client closes."""
        while True:
            try:
                yield self.receive()
            except WebSocketClosed:
                return

    def send(self, data: str | bytes) -> None:
        """Send a text (str) or binary (bytes) message; waits while the server already holds
        256 KiB for a slow client. Raises WebSocketClosed once the connection is closed."""
        if self.closed is not None:
            raise self.closed
        msg: dict[str, Any]
        if isinstance(data, str):
            msg = {"type": "websocket.send", "text": data}
        else:
            msg = {"type": "websocket.send", "bytes": bytes(data)}
        try:
            self._call(self._send(msg))
        except OSError:
            self.closed = WebSocketClosed(1006)
            raise self.closed from None

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Close with code and reason (sent after what is queued). Closing twice does nothing."""
        if self.closed is not None:
            return
        self._call(self._send({"type": "websocket.close", "code": code, "reason": reason}))
        self.closed = WebSocketClosed(code, reason)


class SyncWebSocketApp:
    """The ASGI application behind an ``@app.websocket`` route: it accepts, then runs the
    handler on an executor thread."""

    def __init__(self, handler: Callable[[WebSocket], Any],
                 subprotocols: list[str] | None = None, max_connections: int = 1000) -> None:
        self.handler = handler
        self.subprotocols = list(subprotocols or ())
        self.max_connections = max_connections
        self.__qualname__ = getattr(handler, "__qualname__", type(handler).__name__)
        # Made on the first connection (a route never used costs no pool); touched only on the
        # event loop's thread, as is the count of handlers running.
        self._pool: ThreadPoolExecutor | None = None
        self._running = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                kind = msg["type"].rsplit(".", 1)[-1]  # startup or shutdown
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] == "http":
            body = b"426 Upgrade Required: this path speaks WebSocket\n"
            await send({"type": "http.response.start", "status": 426,
                        "headers": [(b"upgrade", b"websocket"),
                                    (b"sec-websocket-version", b"13"),
                                    (b"content-type", b"text/plain; charset=utf-8")]})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # websocket.connect
        if self._running >= self.max_connections:
            # Refused before the handshake (the denial response extension): the client gets an
            # answer it can act on instead of an open socket nobody serves.
            _log.warning("WebSocket %s: %d connections already, the most this route serves at "
                         "once (max_connections); answered 503", scope["path"],
                         self._running)
            body = b"503 Service Unavailable: too many WebSocket connections on this path\n"
            await send({"type": "websocket.http.response.start", "status": 503,
                        "headers": [(b"retry-after", b"1"),
                                    (b"content-type", b"text/plain; charset=utf-8")]})
            await send({"type": "websocket.http.response.body", "body": body})
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_connections,
                                            thread_name_prefix="cyserve-websocket")
        offered = scope.get("subprotocols") or []
        sub = next((p for p in offered if p in self.subprotocols), None)
        await send({"type": "websocket.accept", "subprotocol": sub})
        loop = asyncio.get_running_loop()
        ws = WebSocket(scope, receive, send, loop, sub)
        code = 1000
        self._running += 1
        try:
            await loop.run_in_executor(self._pool, self.handler, ws)
        except WebSocketClosed:
            pass  # the client left while the handler used the connection
        except Exception:
            _log.exception("WebSocket handler %s failed for %s", self.__qualname__,
                           scope["path"])
            code = 1011
        finally:
            self._running -= 1
        if ws.closed is None:
            ws.closed = WebSocketClosed(code)
            await send({"type": "websocket.close", "code": code})
