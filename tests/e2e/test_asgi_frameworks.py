"""Starlette and FastAPI applications served unmodified (cyserve/asgi.py): routes, path and query
parameters, JSON bodies, dependency injection, StreamingResponse, background tasks, lifespan
state, a Starlette app mounted under a prefix of a cyserve.App, and `cyserve module:app` telling
a FastAPI app for an ASGI one."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from _rawhttp import Conn, get, request
from _subserve import env_with_src, free_port, running
from fastapi import BackgroundTasks, Depends, FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from test_asgi import serving_app

import cyserve

pytestmark = pytest.mark.native

done_in_background: list[str] = []


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
    yield {"greeting": "hello from lifespan"}


fastapi_app = FastAPI(lifespan=lifespan)


class Item(BaseModel):
    name: str
    price: float


def common(q: str | None = None) -> dict[str, Any]:
    return {"q": q}


COMMON = Depends(common)


@fastapi_app.get("/items/{item_id}")
async def read_item(item_id: int, params: dict[str, Any] = COMMON) -> dict[str, Any]:
    return {"item_id": item_id, **params}


@fastapi_app.post("/items")
async def create_item(item: Item, background: BackgroundTasks) -> dict[str, Any]:
    background.add_task(done_in_background.append, item.name)
    return {"name": item.name, "with_tax": round(item.price * 1.2, 2)}


@fastapi_app.get("/state")
async def state(request: Request) -> PlainTextResponse:
    return PlainTextResponse(request.state.greeting)


@fastapi_app.get("/stream")
async def stream() -> StreamingResponse:
    async def gen() -> AsyncIterator[bytes]:
        for i in range(3):
            yield f"chunk {i}\n".encode()

    return StreamingResponse(gen(), media_type="text/plain")


@fastapi_app.get("/sync")
def sync_route() -> dict[str, str]:  # run in FastAPI's thread pool
    return {"sync": "yes"}


async def hello(request: Request) -> Response:
    return JSONResponse({"path": request.url.path, "root_path": request.scope["root_path"],
                         "query": dict(request.query_params)})


async def sub_hello(request: Request) -> Response:
    return JSONResponse({"sub": request.path_params["name"]})


starlette_app = Starlette(routes=[
    Route("/hello", hello),
    Mount("/inner", routes=[Route("/{name}", sub_hello)]),
])


@pytest.fixture(scope="module")
def fastapi_port() -> Iterator[int]:
    with serving_app(fastapi_app) as port:
        yield port


def body_json(port: int, data: bytes) -> Any:
    r = request(port, data)
    assert r.status == 200, r
    return json.loads(r.body)


def test_fastapi_routes_and_dependencies(fastapi_port: int) -> None:
    assert body_json(fastapi_port, get("/items/42?q=x")) == {"item_id": 42, "q": "x"}
    r = request(fastapi_port, get("/items/notanint"))
    assert r.status == 422 and r.header("content-type") == "application/json"
    assert request(fastapi_port, get("/nowhere")).status == 404
    assert body_json(fastapi_port, get("/sync")) == {"sync": "yes"}


def test_fastapi_json_body_and_background_task(fastapi_port: int) -> None:
    payload = b'{"name": "pen", "price": 2.5}'
    data = (b"POST /items HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload)) + payload
    assert body_json(fastapi_port, data) == {"name": "pen", "with_tax": 3.0}
    # The task runs after the answer went out, as with any ASGI server.
    deadline = time.monotonic() + 5
    while "pen" not in done_in_background and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "pen" in done_in_background


def test_fastapi_lifespan_state_and_streaming(fastapi_port: int) -> None:
    assert request(fastapi_port, get("/state")).body == b"hello from lifespan"
    with Conn(fastapi_port) as c:
        c.send(get("/stream"))
        r = c.reply()
        assert r.header("transfer-encoding") == "chunked"
        assert r.body == b"chunk 0\nchunk 1\nchunk 2\n"
        c.send(b"HEAD /state HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply(head_only=True)
        # FastAPI's GET routes do not take HEAD: its 405 is framed as the answer to a HEAD (the
        # length of the body it would have, no body), and the connection goes on.
        assert (r.status, r.header("content-length")) == (405, "31")
        c.send(get("/state"))
        assert c.reply().body == b"hello from lifespan"


def test_starlette_mounted_under_a_prefix_beside_native_routes() -> None:
    app = cyserve.App()
    app.asgi("/api", starlette_app)
    app.static("/ping", "pong")
    with serving_app(app) as port:
        assert body_json(port, get("/api/hello?a=1")) == {
            "path": "/api/hello", "root_path": "/api", "query": {"a": "1"}}
        assert body_json(port, get("/api/inner/bob")) == {"sub": "bob"}
        assert request(port, get("/ping")).body == b"pong"


@pytest.mark.parametrize("asgi_loops", ["process", "thread"])
def test_a_failed_startup_ends_the_command_with_the_apps_error(tmp_path: Path,
                                                               asgi_loops: str) -> None:
    # With a loop per worker thread, the startup fails on each of the three loops: the error
    # is still said once.
    (tmp_path / "fa_bad.py").write_text(
        "import contextlib\n"
        "from starlette.applications import Starlette\n"
        "@contextlib.asynccontextmanager\n"
        "async def lifespan(app):\n"
        "    raise RuntimeError('database unreachable')\n"
        "    yield\n"
        "app = Starlette(lifespan=lifespan)\n")
    proc = subprocess.run([sys.executable, "-m", "cyserve", "fa_bad:app", "--port",
                           str(free_port()), "--app-dir", str(tmp_path), "--threads", "3",
                           "--asgi-loops", asgi_loops],
                          env=env_with_src(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.count("cyserve: the ASGI application's lifespan startup failed:") == 1
    assert proc.stderr.count("RuntimeError: database unreachable") == 1, proc.stderr
    assert "serving on" not in proc.stdout + proc.stderr
    assert "never retrieved" not in proc.stderr


def test_the_command_serves_a_fastapi_app(tmp_path: Path) -> None:
    (tmp_path / "fa_main.py").write_text(
        "from fastapi import FastAPI\n"
        "app = FastAPI()\n"
        "@app.get('/')\n"
        "async def root():\n"
        "    return {'served': 'by cyserve'}\n")
    port = free_port()
    argv = [sys.executable, "-m", "cyserve", "fa_main:app", "--port", str(port), "--threads",
            "2", "--app-dir", str(tmp_path)]
    with running(argv, port) as srv:
        r = srv.get("/")
        assert (r.status, json.loads(r.body)) == (200, {"served": "by cyserve"})
