"""The ASGI peer app: uvicorn (uvloop + httptools), granian --interface asgi."""

from bench.peers.python.routes import handle


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    status, body, ctype = handle(scope["path"])
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})
