"""The WebSocket echo of the protocol workloads (bench/http/protocols.py), as a plain ASGI app:
uvicorn (websockets), granian --interface asgi and cyserve serve it unmodified. /ws accepts and
sends every message back as it came (text as text, bytes as bytes); every other scope goes to
the ASGI peers' app (bench/peers/python/asgi_app.py), so /plaintext answers as there."""

from bench.peers.python import asgi_app


async def app(scope, receive, send):
    if scope["type"] != "websocket":
        await asgi_app.app(scope, receive, send)
        return
    msg = await receive()  # websocket.connect
    if msg["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    while True:
        msg = await receive()
        if msg["type"] != "websocket.receive":
            return  # websocket.disconnect
        text = msg.get("text")
        if text is not None:
            await send({"type": "websocket.send", "text": text})
        else:
            await send({"type": "websocket.send", "bytes": msg.get("bytes") or b""})
