"""A Quart application served by cyserve and by uvicorn alike (tests/e2e/
test_frameworks_uvicorn_diff.py): routes, JSON, an abort, a stream and a WebSocket echo."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from quart import Quart, abort, jsonify, request, websocket

app = Quart(__name__)


@app.get("/")
async def root() -> Any:
    return jsonify(hello="world")


@app.route("/names/<name>", methods=["GET"])
async def names(name: str) -> Any:
    return jsonify(name=name, q=request.args.get("q"))


@app.post("/json")
async def post_json() -> Any:
    data = await request.get_json()
    return jsonify(got=data)


@app.get("/forbidden")
async def forbidden() -> Any:
    abort(403)


@app.get("/stream")
async def stream() -> Any:
    async def pieces() -> AsyncIterator[bytes]:
        for i in range(3):
            yield b"quart %d\n" % i

    return pieces(), 200, {"Content-Type": "text/plain"}


@app.websocket("/ws")
async def ws() -> None:
    await websocket.accept()
    while True:
        text = await websocket.receive()
        if text == "close please":
            await websocket.close(4002, "quart closes")
            return
        await websocket.send(f"quart {text}")
