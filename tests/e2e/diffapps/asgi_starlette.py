"""A Starlette application served by cyserve and by uvicorn alike (tests/e2e/
test_frameworks_uvicorn_diff.py): a FileResponse asked for ranges, an event stream, lifespan
state, mounts read under a root path, and GZipMiddleware."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.responses import StreamingResponse
from starlette.routing import Mount, Route

# The file is made where the test asks (both servers read the same one), 64 KiB of known bytes.
FILE = Path(os.environ.get("DIFFAPP_FILE", "/nonexistent"))


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
    yield {"greeting": "hello from lifespan"}


async def file(request: Request) -> Response:
    return FileResponse(FILE, media_type="application/octet-stream")


async def events(request: Request) -> Response:
    async def stream() -> AsyncIterator[str]:
        for i in range(3):
            yield f"id: {i}\nevent: tick\ndata: tick {i}\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def state(request: Request) -> Response:
    return PlainTextResponse(request.state.greeting)


async def where(request: Request) -> Response:
    scope = request.scope
    return JSONResponse({"path": scope["path"], "root_path": scope["root_path"],
                         "raw_path": scope["raw_path"].decode("latin-1"),
                         "url": str(request.url), "params": request.path_params,
                         "url_for": str(request.url_for("inner", name="x"))})


async def big(request: Request) -> Response:
    return PlainTextResponse("compress me, " * 2000)


async def stream_in(request: Request) -> Response:
    """The request body read as it comes (request.stream()): its size and digest."""
    size, digest = 0, hashlib.sha256()
    async for piece in request.stream():
        size += len(piece)
        digest.update(piece)
    return JSONResponse({"size": size, "sha256": digest.hexdigest()})


async def form(request: Request) -> Response:
    async with request.form() as data:
        return JSONResponse({k: data.getlist(k) for k in data})


app = Starlette(
    routes=[
        Route("/file", file),
        Route("/events", events),
        Route("/state", state),
        Route("/where", where),
        Route("/big", big),
        Route("/stream-in", stream_in, methods=["POST"]),
        Route("/form", form, methods=["POST"]),
        Mount("/sub", routes=[Route("/{name}", where, name="inner")]),
    ],
    lifespan=lifespan,
    middleware=[Middleware(GZipMiddleware, minimum_size=500)],
)
