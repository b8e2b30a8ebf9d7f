"""A FastAPI application served by cyserve and by uvicorn alike (tests/e2e/
test_frameworks_uvicorn_diff.py): validation, path and query parameters, an upload, a stream, a
background task, HTTPException, an exception, and WebSocket routes."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import BackgroundTasks, FastAPI, HTTPException, UploadFile, WebSocket
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel
from starlette.websockets import WebSocketDisconnect

app = FastAPI()
done: list[str] = []


class Item(BaseModel):
    name: str
    price: float


@app.get("/")
async def root() -> dict[str, str]:
    return {"hello": "world"}


@app.post("/items/")
async def create_item(item: Item) -> dict[str, Any]:
    return {"name": item.name, "with_tax": round(item.price * 1.2, 2)}


@app.get("/items/")
async def list_items() -> list[str]:
    return ["pen"]


@app.get("/names/{name}")
async def read_name(name: str, q: str | None = None, n: int = 0) -> dict[str, Any]:
    return {"name": name, "q": q, "n": n}


@app.post("/upload")
async def upload(file: UploadFile) -> dict[str, Any]:
    data = await file.read()
    return {"filename": file.filename, "content_type": file.content_type, "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


@app.get("/stream")
async def stream() -> StreamingResponse:
    async def pieces() -> AsyncIterator[bytes]:
        for i in range(5):
            yield f"piece {i}\n".encode()

    return StreamingResponse(pieces(), media_type="text/plain")


@app.post("/later")
async def later(background: BackgroundTasks) -> PlainTextResponse:
    background.add_task(done.append, "ran")
    return PlainTextResponse("accepted", status_code=202)


@app.get("/later")
async def later_done() -> list[str]:
    return done


@app.get("/teapot")
async def teapot() -> None:
    raise HTTPException(status_code=418, detail="short and stout",
                        headers={"X-Reason": "teapot", "Retry-After": "5"})


@app.get("/boom")
async def boom() -> None:
    raise ValueError("the route failed")


@app.websocket("/ws")
async def ws_echo(websocket: WebSocket) -> None:
    offered = websocket.scope["subprotocols"]
    await websocket.accept(subprotocol=offered[-1] if offered else None)
    try:
        while True:
            msg = await websocket.receive()
            if msg["type"] == "websocket.disconnect":
                done.append(f"ws closed {msg.get('code')}")
                return
            if msg.get("text") == "close please":
                await websocket.close(code=4001, reason="asked to close")
                return
            if msg.get("text") is not None:
                await websocket.send_text("echo " + msg["text"])
            else:
                await websocket.send_bytes(b"echo " + msg["bytes"])
    except WebSocketDisconnect:
        return


@app.get("/ws-closes")
async def ws_closes() -> list[str]:
    return [d for d in done if d.startswith("ws closed")]


@app.websocket("/ws-deny")
async def ws_deny(websocket: WebSocket) -> None:
    await websocket.close(code=1008)


@app.websocket("/ws-deny-response")
async def ws_deny_response(websocket: WebSocket) -> None:
    await websocket.send_denial_response(
        PlainTextResponse("no entry", status_code=401, headers={"WWW-Authenticate": "Basic"}))


@app.websocket("/ws-raise")
async def ws_raise(websocket: WebSocket) -> None:
    raise RuntimeError("the route failed before accepting")


@app.websocket("/ws-scope/{name}")
async def ws_scope(websocket: WebSocket, name: str) -> None:
    """The scope as the application sees it, sent as its one message (the handshake's random
    key, the Host with its port and the client's agent left out: they differ per server and per
    client)."""
    await websocket.accept()
    scope = websocket.scope
    await websocket.send_json({
        "name": name, "path": scope["path"], "raw_path": scope["raw_path"].decode("latin-1"),
        "query_string": scope["query_string"].decode("latin-1"), "scheme": scope["scheme"],
        "http_version": scope["http_version"], "root_path": scope["root_path"],
        "subprotocols": scope["subprotocols"],
        "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]
                    if k not in (b"sec-websocket-key", b"user-agent", b"host")],
        "query": dict(websocket.query_params)})
    await websocket.close(code=1000)


@app.websocket("/ws-burst")
async def ws_burst(websocket: WebSocket) -> None:
    """Several messages sent without waiting for the client, then a close with a code of the
    application's range."""
    await websocket.accept()
    big = await websocket.receive_text()
    await websocket.send_text(big[::-1])
    for i in range(5):
        await websocket.send_bytes(bytes([i]) * (i * 1000))
    await websocket.close(code=4999, reason="r\u00e9sum\u00e9")
