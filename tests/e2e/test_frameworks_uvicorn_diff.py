"""Real ASGI frameworks (FastAPI, Starlette, Django, Quart: tests/e2e/diffapps/) served by cyserve
and by uvicorn, each as a user starts it, asked the same raw requests and the same WebSocket
conversations: the answers must match.

The rules are those of test_asgi_uvicorn_diff.py (its docstring), applied to applications that
frameworks wrote:
- Date and Server are each server's own, and so is the reason phrase (ASGI gives none, and a
  client ignores it, RFC 9112 4): cyserve's are RFC 9110's ("Unprocessable Content", "Range Not
  Satisfiable"), uvicorn's Python's http.HTTPStatus ones ("Unprocessable Entity").
- cyserve refuses a request body past --max-body-bytes (1 MiB by default, as nginx's
  client_max_body_size) where uvicorn has no limit: cyserve runs here with 8 MiB, so that the
  uploads of a few MiB are compared.
- Framing: where uvicorn sends the application's Content-Length, cyserve must send the same and
  no Transfer-Encoding; where uvicorn chunks (the application gave no length), cyserve may send
  a length or chunks (RFC 9112 6.1-6.3), and the bodies are compared once decoded.
- Connection: compared where both kept the connection open; a request that asked for keep-alive
  keeps it open on both, except after an answer the server made for an application that failed,
  where either may close (RFC 9112 9.6).
- A gzip body (GZipMiddleware) is compared once decompressed: its header holds the time it was
  made (RFC 1952 2.3.1, MTIME), which differs between two runs of the same application.
- The body of a 500 the server made itself (the application raised before answering) is each
  server's own words; a 500 the framework made (its error page) is compared byte for byte. After
  an application raised (FastAPI's error middleware answers, then raises again for the server to
  log), uvicorn closes the connection and cyserve keeps it: the answer is whole, so either is
  right (RFC 9112 9.6).
- What a framework does with the extensions a server offers is the framework's: cyserve offers
  http.response.pathsend and uvicorn does not, so Starlette's FileResponse sends its file by path
  on cyserve, and its GZipMiddleware, which leaves such answers alone, adds no
  "Vary: Accept-Encoding" there (the body is not compressed on either): Vary is not compared on
  the answers of a file.
- A multipart/byteranges boundary is random (RFC 9110 14.6): compared once replaced by a fixed
  word. An Allow header is compared as a set of methods (Werkzeug, under Quart, builds it from a
  Python set, whose order follows each process's hash seed).
- WebSocket: when the client closes, both servers echo its close code (RFC 6455 5.5.1), and
  uvicorn (the websockets library) echoes its reason too while cyserve sends none; the RFC asks
  only for the code, so the reason is compared where the server closed. An answer the server
  made itself to refuse a handshake (the application closed before accepting: 403, or raised:
  500) is compared by its status: its Content-Type and words are the server's own (uvicorn sends
  "Content-Type: text/plain" on an empty 403).
Everything else, the status, every other header in the order the application gave it, and the
body, must be the same. For WebSocket: the subprotocol chosen, every message in order, the close
code and reason on both sides, and for a denial the status, headers (by the rules above) and
body of the HTTP answer."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _diffserve import (APPS, FRAMING, OWN, Reply, asks_keep_alive, exchange, get, multipart,
                        normalised, post, sequence, server_pairs)
from test_asgi_uvicorn_diff import chunked
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

pytestmark = pytest.mark.native

SERVERS = ("cyserve", "uvicorn")
# Starlette's and Django's apps are served under a root path on both (the mount and root_path
# cases; Django's views say what they see of it).
ROOT_PATH = {"starlette": "/api", "django": "/dj"}
MODULES = {"fastapi": "asgi_fastapi", "starlette": "asgi_starlette", "django": "asgi_django",
           "quart": "asgi_quart"}


def command_lines(framework: str, cy: int, uv: int) -> tuple[list[str], list[str]]:
    """A framework's app served by cyserve on port cy and by uvicorn on port uv."""
    target = f"{MODULES[framework]}:app"
    root = ["--root-path", ROOT_PATH[framework]] if framework in ROOT_PATH else []
    return ([sys.executable, "-m", "cyserve", target, "--port", str(cy), "--threads", "2",
             "--app-dir", str(APPS), "--loop", "asyncio", "--lifespan", "auto",
             "--max-body-bytes", str(8 << 20), *root],
            [sys.executable, "-m", "uvicorn", target, "--port", str(uv), "--host", "127.0.0.1",
             "--app-dir", str(APPS), "--loop", "asyncio", "--http", "h11", "--ws", "websockets",
             "--lifespan", "auto", "--no-access-log", "--log-level", "warning", *root])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], dict[str, int]]]:
    """Starts a framework's two servers the first time a test asks for them, once per module."""
    with server_pairs(tmp_path_factory, SERVERS, command_lines) as start:
        yield start


def compare(cy: Reply, uv: Reply, data: bytes, app_raised: bool = False,
            unkept: frozenset[str] = frozenset()) -> None:
    """The module docstring's rules, uvicorn's answer the reference."""
    assert (cy.status, cy.interim) == (uv.status, uv.interim), (cy, uv)
    assert cy.version == uv.version == "HTTP/1.1", (cy, uv)
    assert normalised(cy, set(unkept)) == normalised(uv, set(unkept)), (cy, uv)
    if uv.get("content-length") and not uv.get("content-encoding"):
        assert cy.get("content-length") == uv.get("content-length"), (cy, uv)
        assert cy.get("transfer-encoding") == [], (cy, uv)
    if not cy.closed and not uv.closed:
        assert cy.get("connection") == uv.get("connection"), (cy, uv)
    if not app_raised:
        assert cy.closed == uv.closed == (not asks_keep_alive(data)), (cy, uv)


UPLOAD = random.Random(3).randbytes(3 * 1024 * 1024 + 17)
UPLOAD_BODY, UPLOAD_TYPE = multipart("file", "big.bin", UPLOAD, {})
DJANGO_UPLOAD_BODY, DJANGO_UPLOAD_TYPE = multipart("file", "big.bin", UPLOAD, {"field": "v"})

# (framework, case) -> the request. A value that is a pair is a head and the body sent after
# the 100 Continue.
CASES: dict[tuple[str, str], bytes] = {
    ("fastapi", "json-ok"): post("/items/", b'{"name": "pen", "price": 2.5}', "application/json"),
    ("fastapi", "json-422"): post("/items/", b'{"name": "pen", "price": "free"}',
                                  "application/json"),
    ("fastapi", "json-malformed-422"): post("/items/", b'{"name": ', "application/json"),
    ("fastapi", "path-query-escapes"): get("/names/caf%C3%A9%20au%2Flait?q=%E2%9C%93+x%26y&n=3"),
    ("fastapi", "query-not-an-int-422"): get("/names/x?n=three"),
    ("fastapi", "upload"): post("/upload", UPLOAD_BODY, UPLOAD_TYPE),
    ("fastapi", "stream"): get("/stream"),
    ("fastapi", "stream-http-1.0"): b"GET /stream HTTP/1.0\r\nHost: t\r\n\r\n",
    ("fastapi", "head-on-get-route"): b"HEAD /names/x HTTP/1.1\r\nHost: t\r\n\r\n",
    ("fastapi", "method-not-allowed"): (b"PUT /names/x HTTP/1.1\r\nHost: t\r\n"
                                        b"Content-Length: 0\r\n\r\n"),
    ("fastapi", "redirect-slashes"): get("/items"),
    ("fastapi", "not-found"): get("/nowhere"),
    ("fastapi", "http-exception-headers"): get("/teapot"),
    ("fastapi", "exception-500"): get("/boom"),
    ("fastapi", "chunked-json"): (b"POST /items/ HTTP/1.1\r\nHost: t\r\nContent-Type: "
                                  b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  + chunked(b'{"name": "ink", ', b'"price": 10}')),
    ("fastapi", "connection-close"): get("/", "Connection: close\r\n"),
    ("starlette", "file"): get("/file"),
    ("starlette", "file-range"): get("/file", "Range: bytes=10-19\r\n"),
    ("starlette", "file-suffix-range"): get("/file", "Range: bytes=-5\r\n"),
    ("starlette", "file-ranges"): get("/file", "Range: bytes=0-1, 100-101\r\n"),
    ("starlette", "file-range-unsatisfiable"): get("/file", "Range: bytes=70000-\r\n"),
    ("starlette", "file-head"): b"HEAD /file HTTP/1.1\r\nHost: t\r\n\r\n",
    ("starlette", "file-if-range-stale"): get("/file", "Range: bytes=0-3\r\n"
                                          "If-Range: \"not-the-etag\"\r\n"),
    ("starlette", "event-stream"): get("/events", "Accept: text/event-stream\r\n"),
    ("starlette", "lifespan-state"): get("/state"),
    ("starlette", "root-path"): get("/where"),
    ("starlette", "root-path-in-target"): get("/api/where"),
    ("starlette", "mount"): get("/sub/caf%C3%A9"),
    ("starlette", "gzip"): get("/big", "Accept-Encoding: gzip\r\n"),
    ("starlette", "gzip-not-asked"): get("/big"),
    ("starlette", "gzip-head"): b"HEAD /big HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\n\r\n",
    ("starlette", "stream-in-chunked"): (b"POST /stream-in HTTP/1.1\r\nHost: t\r\n"
                                         b"Transfer-Encoding: chunked\r\n\r\n"
                                         + chunked(*[bytes([i]) * 40_000 for i in range(20)])),
    ("starlette", "stream-in-length"): post("/stream-in", UPLOAD, "application/octet-stream"),
    ("starlette", "form"): post("/form", b"a=caf%C3%A9&a=2&b=+x+&c=",
                                "application/x-www-form-urlencoded"),
    ("django", "async-view"): get("/hello/?a=1&a=2&b=caf%C3%A9"),
    ("django", "sync-view"): get("/names/caf%C3%A9?q=%20x"),
    ("django", "append-slash"): get("/hello"),
    ("django", "not-found"): get("/nowhere/"),
    ("django", "csrf-rejected"): post("/form/", b"a=1", "application/x-www-form-urlencoded"),
    ("django", "json-post"): post("/echo/", b'{"k": [1, 2]}', "application/json"),
    ("django", "chunked-post"): (b"POST /echo/ HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked"
                                 b"\r\nContent-Type: text/plain\r\n\r\n"
                                 + chunked(b"hello ", b"chunked")),
    ("django", "upload"): post("/upload/", DJANGO_UPLOAD_BODY, DJANGO_UPLOAD_TYPE),
    ("django", "stream"): get("/stream/"),
    ("django", "file"): get("/file/"),
    ("django", "exception-500"): get("/boom/"),
    ("django", "latin1-header"): get("/latin1/"),
    ("django", "head"): b"HEAD /hello/ HTTP/1.1\r\nHost: t\r\n\r\n",
    ("fastapi", "obs-text-header"): get("/names/x", "X-Name: caf\xe9\r\n"),
    ("fastapi", "body-on-get"): (b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"),
    ("fastapi", "path-semicolon-and-slash"): get("/names/a%3Bb;c?q=%2F"),
    ("fastapi", "options"): b"OPTIONS /names/x HTTP/1.1\r\nHost: t\r\n\r\n",
    ("starlette", "head-event-stream"): b"HEAD /events HTTP/1.1\r\nHost: t\r\n\r\n",
    ("starlette", "gzip-stream"): get("/events", "Accept-Encoding: gzip\r\n"),
    ("django", "head-stream"): b"HEAD /stream/ HTTP/1.1\r\nHost: t\r\n\r\n",
    ("django", "upload-connection-close"): post("/upload/", DJANGO_UPLOAD_BODY, DJANGO_UPLOAD_TYPE,
                                             "Connection: close\r\n"),
    ("quart", "route"): get("/"),
    ("quart", "path-query"): get("/names/caf%C3%A9?q=a%2Bb"),
    ("quart", "json"): post("/json", b'{"x": 1}', "application/json"),
    ("quart", "abort-403"): get("/forbidden"),
    ("quart", "not-found"): get("/nowhere"),
    ("quart", "method-not-allowed"): post("/names/x", b"", "text/plain"),
    ("quart", "stream"): get("/stream"),
    ("quart", "head"): b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n",
}

# The application raised after its framework answered (the docstring: either may close).
APP_RAISES = {("fastapi", "exception-500")}
# A whole file that Starlette sends by path where the server offers pathsend (the docstring).
SENT_BY_PATH = {("starlette", "file"), ("starlette", "file-if-range-stale")}


@pytest.mark.parametrize(("framework", "case"), list(CASES))
def test_same_answer_as_uvicorn(served: Callable[[str], dict[str, int]], framework: str,
                                case: str) -> None:
    ports = served(framework)
    data = CASES[framework, case]
    cy, uv = exchange(ports["cyserve"], data), exchange(ports["uvicorn"], data)
    compare(cy, uv, data, app_raised=(framework, case) in APP_RAISES,
            unkept=frozenset({"vary"}) if (framework, case) in SENT_BY_PATH else frozenset())
    if case == "upload":  # the application saw every byte, on both
        assert json.loads(cy.body)["sha256"] == hashlib.sha256(UPLOAD).hexdigest()


@pytest.mark.parametrize("framework", list(MODULES))
def test_keep_alive_sequence_as_uvicorn(served: Callable[[str], dict[str, int]],
                                        framework: str) -> None:
    """A framework's requests above on one connection: what one answer leaves behind (an
    unread body, a stream, a file) does not change the next one. (Vary is left out for the
    answers of a file, as above, and the app that raises is left out: uvicorn closes there.)"""
    ports = served(framework)
    requests = [data for (fw, case), data in CASES.items()
                if fw == framework and (fw, case) not in APP_RAISES]
    cy, uv = (sequence(ports[s], requests) for s in SERVERS)
    assert cy == uv


def test_expect_100_continue_as_uvicorn(served: Callable[[str], dict[str, int]]) -> None:
    ports = served("fastapi")
    body = b'{"name": "cup", "price": 4}'
    head = (b"POST /items/ HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
    cy = exchange(ports["cyserve"], head, body_after_continue=body)
    uv = exchange(ports["uvicorn"], head, body_after_continue=body)
    compare(cy, uv, head)
    assert cy.interim == [100]


def test_background_task_runs_after_the_answer_as_uvicorn(
        served: Callable[[str], dict[str, int]]) -> None:
    ports = served("fastapi")
    for port in ports.values():
        a = exchange(port, post("/later", b"", "text/plain"))
        assert (a.status, a.body) == (202, b"accepted")
    seen = {}
    for server, port in ports.items():
        deadline = time.monotonic() + 5
        while True:
            seen[server] = json.loads(exchange(port, get("/later")).body)
            if "ran" in seen[server] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    assert seen["cyserve"].count("ran") == seen["uvicorn"].count("ran") >= 1


def test_http10_keep_alive_is_honoured_where_uvicorn_closes(
        served: Callable[[str], dict[str, int]]) -> None:
    """An HTTP/1.0 request with "Connection: keep-alive": cyserve keeps the connection and says
    so, as RFC 9112 9.3 lets a server that honours HTTP/1.0's keep-alive (and as gunicorn and
    nginx do); uvicorn's h11 never keeps an HTTP/1.0 connection and says "close". Either is the
    RFC's; the rest of the answer is the same."""
    ports = served("fastapi")
    data = b"GET / HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\n\r\n"
    cy, uv = exchange(ports["cyserve"], data), exchange(ports["uvicorn"], data)
    assert (cy.status, normalised(cy, set())) == (uv.status, normalised(uv, set()))
    assert (cy.get("connection"), cy.closed) == (["keep-alive"], False)
    assert (uv.get("connection"), uv.closed) == (["close"], True)


WS_HEAD = (b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")


@pytest.mark.parametrize(("data", "cyserve_status", "uvicorn_status"), [
    pytest.param(b"GET /names/caf\xc3\xa9?q=\xc3\xa9 HTTP/1.1\r\nHost: t\r\n\r\n", 400, 400,
                 id="raw-bytes-in-target"),
    pytest.param(WS_HEAD.replace(b"Version: 13", b"Version: 8") + b"\r\n", 426, 400,
                 id="websocket-version-8"),
    pytest.param(WS_HEAD.replace(b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", b"")
                 + b"\r\n", 400, 400, id="websocket-without-key"),
    pytest.param(WS_HEAD.replace(b"GET", b"POST") + b"Content-Length: 0\r\n\r\n", 400, 400,
                 id="websocket-by-post"),
])
def test_what_the_server_refuses_itself(served: Callable[[str], dict[str, int]], data: bytes,
                                        cyserve_status: int, uvicorn_status: int) -> None:
    """Requests the server refuses before the application sees them: the words are each
    server's own, and both close. A WebSocket handshake of a version the server does not speak
    gets 426 and "Sec-WebSocket-Version: 13" from cyserve, as RFC 6455 4.4 asks, and a 400
    from uvicorn."""
    ports = served("fastapi")
    cy, uv = exchange(ports["cyserve"], data), exchange(ports["uvicorn"], data)
    assert (cy.status, cy.closed) == (cyserve_status, True), cy
    assert (uv.status, uv.closed) == (uvicorn_status, True), uv
    if cyserve_status == 426:
        assert cy.get("sec-websocket-version") == ["13"]


# ---- WebSocket ------------------------------------------------------------------------------

def conversation(port: int, path: str, messages: list[Any], close_first: bool = False,
                 subprotocols: list[str] | None = None, drain: int = 0,
                 ping: bool = False) -> dict[str, Any]:
    """What a client sees of a WebSocket conversation: the subprotocol, each answer, and the
    close (code and reason, on the side that received it), or the HTTP answer of a denial."""
    try:
        ws = connect(f"ws://127.0.0.1:{port}{path}", subprotocols=subprotocols,  # type: ignore[arg-type]
                     open_timeout=10, close_timeout=5)
    except InvalidStatus as e:
        r = e.response
        headers = [(k.lower(), v) for k, v in r.headers.raw_items()
                   if k.lower() not in OWN | {"connection"}]
        return {"denied": r.status_code, "headers": headers, "body": r.body}
    got: dict[str, Any] = {"subprotocol": ws.subprotocol, "answers": []}
    with ws:
        for m in messages:
            ws.send(m)  # a list is sent as one message in fragments (RFC 6455 5.4)
            if ping:
                ws.ping(b"are you there").wait(10)
            try:
                got["answers"].append(ws.recv(timeout=10))
            except ConnectionClosed:
                break
        # Then whatever the server sends of its own, up to its close.
        with contextlib.suppress(ConnectionClosed):
            for _ in range(drain):
                got["answers"].append(ws.recv(timeout=10))
        if close_first:
            ws.close(1000, "client done")
    got["close"] = (ws.close_code, ws.close_reason)
    return got


WS_CASES: dict[tuple[str, str], dict[str, Any]] = {
    ("fastapi", "subprotocol-and-echo"): {
        "path": "/ws", "subprotocols": ["chat", "superchat"],
        "messages": ["hello", b"\x00\xffbytes", "caf\u00e9"], "close_first": True},
    ("fastapi", "server-closes-with-code-and-reason"): {
        "path": "/ws", "messages": ["one", "close please"]},
    ("fastapi", "fragments-and-pings"): {
        "path": "/ws", "messages": [["frag", "men", "ted"], [b"by", b"tes"], "after"],
        "ping": True, "close_first": True},
    ("fastapi", "no-subprotocol"): {"path": "/ws", "messages": ["x"], "close_first": True},
    ("fastapi", "denied-by-close-before-accept"): {"path": "/ws-deny", "messages": [],
                                                   "server_answers": 403},
    ("fastapi", "denied-with-a-response"): {"path": "/ws-deny-response", "messages": []},
    ("fastapi", "raises-before-accept"): {"path": "/ws-raise", "messages": [],
                                          "server_answers": 500},
    ("fastapi", "no-such-route"): {"path": "/ws-nowhere", "messages": [], "server_answers": 403},
    ("fastapi", "scope"): {"path": "/ws-scope/caf%C3%A9?a=1&b=%20x", "messages": [],
                           "subprotocols": ["p1", "p2"], "drain": 1},
    ("fastapi", "big-message-then-burst"): {"path": "/ws-burst",
                                            "messages": ["\u00e9" * 100_000], "drain": 6},
    ("quart", "echo-and-server-close"): {"path": "/ws", "messages": ["a", "close please"]},
}


@pytest.mark.parametrize(("framework", "case"), list(WS_CASES))
def test_same_websocket_conversation_as_uvicorn(served: Callable[[str], dict[str, int]],
                                                framework: str, case: str) -> None:
    ports = served(framework)
    spec = WS_CASES[framework, case]
    cy, uv = (conversation(ports[s], spec["path"], spec["messages"],
                           spec.get("close_first", False), spec.get("subprotocols"),
                           spec.get("drain", 0), spec.get("ping", False))
              for s in SERVERS)
    if spec.get("server_answers"):  # the server's own refusal: its status (the docstring)
        assert cy.keys() == uv.keys() == {"denied", "headers", "body"}, (cy, uv)
        assert cy["denied"] == uv["denied"] == spec["server_answers"], (cy, uv)
        return
    for got in (cy, uv):
        got["headers"] = [h for h in got.get("headers", []) if h[0] not in FRAMING]
        if spec.get("close_first"):  # the echo of the client's close: its code (the docstring)
            got["close"] = got["close"][0]
    assert cy == uv


def test_the_app_sees_the_clients_close_code_as_under_uvicorn(
        served: Callable[[str], dict[str, int]]) -> None:
    ports = served("fastapi")
    seen = {}
    for server, port in ports.items():
        conversation(port, "/ws", ["bye"], close_first=True)
        deadline = time.monotonic() + 5
        while True:
            seen[server] = json.loads(exchange(port, get("/ws-closes")).body)
            if seen[server] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    assert seen["cyserve"][-1:] == seen["uvicorn"][-1:] == ["ws closed 1000"]
