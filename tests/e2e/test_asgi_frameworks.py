"""Starlette, FastAPI, Django and Quart applications served unmodified (cyserve/asgi.py): routes,
path and query parameters, JSON bodies, dependency injection, a 5 MiB UploadFile, StreamingResponse,
background tasks, lifespan state, a Starlette app and Django's handler mounted under a prefix of a
cyserve.App, Django's async and sync views, Quart's routes and WebSocket, and `cyserve module:app`
telling a FastAPI app for an ASGI one."""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import threading
import time
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from _rawhttp import Conn, get, request
from _subserve import env_with_src, free_port, running
from fastapi import BackgroundTasks, Depends, FastAPI, Form, UploadFile
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from test_asgi import serving_app

import cyserve
import cyserve.asgi

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


def test_a_failed_startup_in_worker_processes_is_said_as_in_one_process(tmp_path: Path) -> None:
    # Each worker process runs the lifespan after the fork: its failure was an uncaught
    # exception there, two chained tracebacks (LifespanError, then the CyserveError wrapping it)
    # per worker started. Now each worker says the one sentence the single process says.
    (tmp_path / "fa_bad.py").write_text(
        "import contextlib\n"
        "from starlette.applications import Starlette\n"
        "@contextlib.asynccontextmanager\n"
        "async def lifespan(app):\n"
        "    raise RuntimeError('database unreachable')\n"
        "    yield\n"
        "app = Starlette(lifespan=lifespan)\n")
    proc = subprocess.run([sys.executable, "-m", "cyserve", "fa_bad:app", "--port",
                           str(free_port()), "--app-dir", str(tmp_path), "--threads", "1",
                           "--processes", "2"],
                          env=env_with_src(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    said = proc.stderr.count("cyserve: the ASGI application's lifespan startup failed:")
    assert said >= 1 and proc.stderr.count("RuntimeError: database unreachable") == said, \
        proc.stderr
    assert "CyserveError" not in proc.stderr and "LifespanError" not in proc.stderr, proc.stderr
    assert "direct cause" not in proc.stderr, proc.stderr


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


# ---- FastAPI UploadFile: a 5 MiB multipart upload ----------------------------------------

UPLOAD_SIZE = 5 * 1024 * 1024


@fastapi_app.post("/upload")
async def upload(file: UploadFile, note: str = Form()) -> dict[str, Any]:
    digest = hashlib.sha256()
    size = 0
    while piece := await file.read(256 * 1024):
        digest.update(piece)
        size += len(piece)
    return {"filename": file.filename, "content_type": file.content_type, "size": size,
            "sha256": digest.hexdigest(), "note": note}


def multipart(boundary: bytes, note: bytes, payload: bytes) -> bytes:
    return (b"--%s\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\n%s\r\n"
            b"--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\n"
            b"Content-Type: application/octet-stream\r\n\r\n" % (boundary, note, boundary)
            + payload + b"\r\n--%s--\r\n" % boundary)


@pytest.fixture(scope="module")
def upload_port() -> Iterator[int]:
    # 1 MiB is the default limit of a body (as nginx's client_max_body_size): an upload route
    # is served with a larger one, as its users would.
    with serving_app(fastapi_app, max_body_bytes=8 * 1024 * 1024) as port:
        yield port


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_fastapi_upload_file_of_5_mib(upload_port: int, framing: str) -> None:
    # Bytes of every value, with CRLFs and dashes, so that a parser that split or cut the parts
    # wrongly would change the digest.
    payload = hashlib.sha256(b"seed").digest() * (UPLOAD_SIZE // 32)
    boundary = b"----cyserve-upload-7f3a"
    body = multipart(boundary, b"caf\xc3\xa9", payload)
    head = (b"POST /upload HTTP/1.1\r\nHost: t\r\n"
            b"Content-Type: multipart/form-data; boundary=%s\r\n" % boundary)
    with Conn(upload_port, timeout=30) as c:
        if framing == "content-length":
            c.send(head + b"Content-Length: %d\r\n\r\n" % len(body))
            for i in range(0, len(body), 64 * 1024):
                c.send(body[i:i + 64 * 1024])
        else:
            c.send(head + b"Transfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(body), 100_000):
                piece = body[i:i + 100_000]
                c.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            c.send(b"0\r\n\r\n")
        r = c.reply()
    assert r.status == 200, r
    assert json.loads(r.body) == {
        "filename": "big.bin", "content_type": "application/octet-stream", "size": UPLOAD_SIZE,
        "sha256": hashlib.sha256(payload).hexdigest(), "note": "café"}


# ---- Django: its ASGI handler, an async view and a sync one --------------------------------

DJANGO_URLS = "cyserve_test_django_urls"


def _django_views() -> list[Any]:
    from asgiref.sync import sync_to_async
    from django.db import connection
    from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
    from django.urls import path, reverse

    async def hello(request: HttpRequest) -> HttpResponse:
        return JsonResponse({"path": request.path, "path_info": request.path_info,
                             "method": request.method, "q": request.GET.getlist("q"),
                             "body": request.body.decode(), "link": reverse("count"),
                             "header": request.headers.get("X-Thing"),
                             "thread": threading.current_thread().name.rstrip("-0123456789")})

    def count_rows() -> int:
        # The database layer is synchronous: it must run in Django's own thread
        # (sync_to_async's thread_sensitive default), as Django's docs ask.
        with connection.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS hits (n INTEGER)")
            cur.execute("INSERT INTO hits VALUES (1)")
            cur.execute("SELECT COUNT(*) FROM hits")
            return int(cur.fetchone()[0])

    async def count(request: HttpRequest) -> HttpResponse:
        return JsonResponse({"rows": await sync_to_async(count_rows)()})

    def sync_view(request: HttpRequest) -> HttpResponse:
        # A plain view: Django's ASGI handler runs it with sync_to_async, in a thread of its
        # own rather than on the event loop's.
        loop_thread = threading.current_thread().name.startswith("cyserve-asgi")
        return HttpResponse(f"on the loop's thread: {loop_thread}", content_type="text/plain")

    async def stream(request: HttpRequest) -> StreamingHttpResponse:
        async def pieces() -> AsyncIterator[bytes]:
            for i in range(3):
                yield b"piece %d\n" % i

        return StreamingHttpResponse(pieces(), content_type="text/plain")

    return [path("hello/", hello), path("count/", count, name="count"),
            path("sync/", sync_view), path("stream/", stream)]


@pytest.fixture(scope="module")
def django_app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Django's ASGI application with settings made here (the process's only Django: settings
    are process-wide), its URLs in a module of their own and a SQLite file database."""
    from django.conf import settings
    from django.core.asgi import get_asgi_application

    if not settings.configured:
        urls = types.ModuleType(DJANGO_URLS)
        sys.modules[DJANGO_URLS] = urls
        settings.configure(
            DEBUG=False, SECRET_KEY="cyserve-test", ALLOWED_HOSTS=["*"], ROOT_URLCONF=DJANGO_URLS,
            INSTALLED_APPS=[], MIDDLEWARE=["django.middleware.common.CommonMiddleware"],
            USE_TZ=True, DATABASES={"default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(tmp_path_factory.mktemp("django") / "db.sqlite3")}})
        application = get_asgi_application()
        urls.urlpatterns = _django_views()  # type: ignore[attr-defined]
        return application
    return get_asgi_application()


def test_django_async_and_sync_views_mounted_under_a_prefix(django_app: Any) -> None:
    app = cyserve.App()
    app.asgi("/dj", django_app)
    app.static("/ping", "pong")
    with serving_app(app) as port:
        data = (b"POST /dj/hello/?q=1&q=caf%C3%A9 HTTP/1.1\r\nHost: t\r\nX-Thing: yes\r\n"
                b"Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello")
        # Django takes root_path as its script name: the path keeps the prefix, path_info and
        # the URLs it makes are under it.
        assert body_json(port, data) == {
            "path": "/dj/hello/", "path_info": "/hello/", "method": "POST",
            "q": ["1", "café"], "body": "hello", "link": "/dj/count/", "header": "yes",
            "thread": "cyserve-asgi"}
        assert body_json(port, get("/dj/count/")) == {"rows": 1}
        assert body_json(port, get("/dj/count/")) == {"rows": 2}
        r = request(port, get("/dj/sync/"))
        assert (r.status, r.body) == (200, b"on the loop's thread: False")
        with Conn(port) as c:
            c.send(get("/dj/stream/"))
            r = c.reply()
            assert (r.status, r.body) == (200, b"piece 0\npiece 1\npiece 2\n")
            # CommonMiddleware's APPEND_SLASH answer, and the connection goes on.
            c.send(get("/dj/hello"))
            r = c.reply()
            assert (r.status, r.header("location")) == (301, "/dj/hello/")
            c.send(get("/dj/nowhere/"))
            assert c.reply().status == 404
        assert request(port, get("/ping")).body == b"pong"


# ---- Quart -------------------------------------------------------------------------------

def _quart_app() -> Any:
    from quart import Quart, jsonify, websocket
    from quart import request as qrequest

    qapp = Quart(__name__)
    started: list[str] = []

    @qapp.before_serving
    async def startup() -> None:
        started.append("yes")

    @qapp.get("/items/<int:item_id>")
    async def item(item_id: int) -> Any:
        return jsonify(item_id=item_id, q=qrequest.args.get("q"), started=started)

    @qapp.post("/echo")
    async def echo() -> Any:
        data = await qrequest.get_json()
        return jsonify(got=data)

    @qapp.get("/stream")
    async def stream() -> Any:
        async def pieces() -> AsyncIterator[bytes]:
            for i in range(3):
                yield b"q%d\n" % i

        return pieces(), 200, {"Content-Type": "text/plain"}

    @qapp.websocket("/ws")
    async def ws() -> None:
        while True:
            text = await websocket.receive()
            await websocket.send(f"quart:{text}")

    return qapp


def test_quart_routes_json_streaming_and_websocket() -> None:
    from websockets.sync.client import connect

    # Each event loop runs the app's lifespan, so before_serving runs once per loop: one loop
    # with the GIL, one per worker thread without it (asgi_loops "auto", cyserve/asgi.py).
    threads = 2
    loops = threads if cyserve.asgi.loops_per_thread() else 1
    with serving_app(_quart_app(), threads=threads) as port:
        assert body_json(port, get("/items/3?q=x")) == {"item_id": 3, "q": "x",
                                                         "started": ["yes"] * loops}
        payload = b'{"a": [1, 2]}'
        data = (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(payload)) + payload
        assert body_json(port, data) == {"got": {"a": [1, 2]}}
        with Conn(port) as c:
            c.send(get("/stream"))
            r = c.reply()
            assert (r.status, r.body) == (200, b"q0\nq1\nq2\n")
            c.send(get("/items/nope"))
            assert c.reply().status == 404
        with connect(f"ws://127.0.0.1:{port}/ws") as ws:
            ws.send("hi")
            assert ws.recv(timeout=5) == "quart:hi"
