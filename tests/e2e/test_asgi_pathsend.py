"""The ASGI Path Send extension (native/asgi.pyx, _Exchange._pathsend): advertised in the http
scope; `http.response.pathsend` after the start sends the file as the engine sends any file body
(resp_set_body_file) over HTTP/1.1, TLS, h2c and h2 by ALPN, with HEAD getting the file's length
and no body; a relative path is opened from the working directory the app shares; a missing
file, a directory, a pathsend before the start or after the body began are refused by send() (a
500 when the app lets the error go). Starlette's FileResponse, which uses the extension when the
scope offers it, serves a large file whole, and a relative one."""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _procfd import fd_targets
from _rawhttp import Conn, get, request
from test_asgi import serving_app
from test_http2 import H2
from _certs import self_signed

pytestmark = pytest.mark.native

Scope = dict[str, Any]
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A small file, a large one (6 MiB, not periodic, so that a piece sent twice or out of order
    shows in its digest) and a directory."""
    d = tmp_path_factory.mktemp("pathsend")
    small = d / "small.txt"
    small.write_bytes(b"hello from a file\n")
    large = d / "large.bin"
    with large.open("wb") as f:
        for k in range(6 * MIB // 32):
            f.write(hashlib.sha256(k.to_bytes(8, "big")).digest())
    sub = d / "sub"
    sub.mkdir()
    return {"dir": d, "small": small, "large": large, "sub": sub}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return self_signed(tmp_path_factory.mktemp("pathsend-tls"))


def make_app(files: dict[str, Any]) -> Any:
    """/small and /large send their file by path; /refused/<case> tries a pathsend that send()
    must refuse, and answers with the error's type (the body it then sends is the app's own);
    /missing lets the error go (a 500)."""
    seen: list[Any] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        seen.append(scope["extensions"])
        if path in ("/small", "/large"):
            name = str(files[path[1:]])
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/octet-stream"),
                                    (b"x-via", b"pathsend")]})
            await send({"type": "http.response.pathsend", "path": name})
            return
        if path == "/relative":
            # Opened as the app's own open() would: from the process's working directory.
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.pathsend", "path": "small.txt"})
            return
        if path == "/announced":
            # HEAD answered as Starlette answers it: GET's length, an empty body.
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"18")]})
            await send({"type": "http.response.body", "body": b""})
            return
        if path == "/missing":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.pathsend",
                        "path": str(files["dir"] / "not-there")})
            return
        case = path.rsplit("/", 1)[-1]
        message = {"type": "http.response.pathsend", "path": str(files["small"])}
        try:
            if case == "before-start":
                await send(message)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            if case == "directory":
                await send({"type": "http.response.pathsend", "path": str(files["sub"])})
            elif case == "after-body":
                await send({"type": "http.response.body", "body": b"begun,", "more_body": True})
                await send(message)
        except Exception as exc:
            if case == "before-start":
                await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": type(exc).__name__.encode()})
            return
        await send({"type": "http.response.body", "body": b"not refused"})

    app.seen = seen  # type: ignore[attr-defined]
    return app


def open_copies(*paths: Path) -> int:
    """How many descriptors of this process (the server runs in it) have one of paths open."""
    names = {str(p) for p in paths}
    return sum(target in names for target in fd_targets().values())


def no_file_left_open(*paths: Path) -> bool:
    """The engine closes a sent file's descriptor once the answer is written, which may be a
    moment after the client read its last byte."""
    deadline = time.monotonic() + 5
    while open_copies(*paths) and time.monotonic() < deadline:
        time.sleep(0.01)
    return open_copies(*paths) == 0


def test_advertised_and_sent_over_http1(files: dict[str, Any]) -> None:
    app = make_app(files)
    large = files["large"].read_bytes()
    with serving_app(app) as port, Conn(port) as c:
        c.send(get("/small"))
        r = c.reply()
        assert (r.status, r.body) == (200, b"hello from a file\n")
        assert (r.header("content-type"), r.header("x-via")) == ("application/octet-stream",
                                                                  "pathsend")
        assert r.header("content-length") == "18" and r.header("transfer-encoding") is None
        c.send(get("/large"))  # the same connection: the file body ended the answer cleanly
        r = c.reply()
        assert r.header("content-length") == str(len(large))
        assert hashlib.sha256(r.body).digest() == hashlib.sha256(large).digest()
        # HEAD: the file's length, no body (the next answer would be read as one otherwise).
        c.send(b"HEAD /large HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply(head_only=True)
        assert (r.status, r.header("content-length")) == (200, str(len(large)))
        c.send(get("/small"))
        assert c.reply().body == b"hello from a file\n"
        c.send(b"HEAD /announced HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply(head_only=True)
        assert (r.status, r.header("content-length")) == (200, "18")
        c.send(get("/small"))
        assert c.reply().body == b"hello from a file\n"
        assert no_file_left_open(files["small"], files["large"])
    assert app.seen and all(e == {"http.response.pathsend": {}, "http.response.trailers": {}}
                            for e in app.seen)


def test_refusals_a_missing_file_and_a_relative_path(files: dict[str, Any],
                                                     caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.ERROR, logger="cyserve.asgi")
    with serving_app(make_app(files)) as port:
        for case, error in (("before-start", b"RuntimeError"),
                            ("directory", b"IsADirectoryError")):
            r = request(port, get(f"/refused/{case}"))
            assert (case, r.status, r.body) == (case, 200, error)
        # After a streamed piece the pathsend is refused and the app ends its body itself.
        with Conn(port) as c:
            c.send(get("/refused/after-body"))
            head = c.read_until(b"\r\n\r\n")
            assert b"transfer-encoding: chunked" in head.lower()
            assert c.read_chunked() == b"begun,RuntimeError"
        r = request(port, get("/missing"))
        assert (r.status, r.body) == (500, b"500 Internal Server Error\n")
        # A relative path is the app's working directory's: missing from here, found there.
        assert request(port, get("/relative")).status == 500
        monkeypatch.chdir(files["dir"])
        r = request(port, get("/relative"))
        assert (r.status, r.body) == (200, b"hello from a file\n")
        assert request(port, get("/small")).body == b"hello from a file\n"  # serves on
        # A refused pathsend leaves nothing open either (the directory was opened, then closed).
        assert no_file_left_open(files["small"], files["sub"])
    assert "FileNotFoundError" in caplog.text and "not-there" in caplog.text


def test_over_tls_h2c_and_h2(files: dict[str, Any], certs: dict[str, str]) -> None:
    large = files["large"].read_bytes()
    small = files["small"].read_bytes()
    app = make_app(files)
    with serving_app(app) as port, H2(port) as c:
        status, headers, body = c.get("/large")
        assert (status, headers.get("content-length"), len(body)) == (200, str(len(large)),
                                                                       len(large))
        assert body == large
        status, headers, body = c.get("/large", method="HEAD")
        assert (status, headers.get("content-length"), body) == (200, str(len(large)), b"")
        assert c.get("/small")[2] == small
        assert no_file_left_open(files["small"], files["large"])
    with serving_app(app, ssl_certfile=certs["cert"], ssl_keyfile=certs["key"]) as port:
        ctx = ssl.create_default_context(cafile=certs["cert"])
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        with H2(port, tls=ctx) as c:
            status, _, body = c.get("/large")
            assert status == 200 and body == large
            assert c.get("/small")[2] == small
        ctx1 = ssl.create_default_context(cafile=certs["cert"])
        conn = http.client.HTTPSConnection("localhost", port, context=ctx1, timeout=10)
        try:
            conn.request("GET", "/large")
            resp = conn.getresponse()
            assert resp.version == 11 and resp.getheader("content-length") == str(len(large))
            assert resp.read() == large
            conn.request("GET", "/small")  # the connection is kept
            assert conn.getresponse().read() == small
        finally:
            conn.close()
        assert no_file_left_open(files["small"], files["large"])
    # Over TLS the scope has both extensions.
    assert {"tls", "http.response.pathsend"} <= set(app.seen[-1])


@pytest.fixture
def starlette_app(files: dict[str, Any]) -> Iterator[tuple[Any, list[str]]]:
    from starlette.applications import Starlette
    from starlette.responses import FileResponse
    from starlette.routing import Route

    async def large(request: Any) -> FileResponse:
        return FileResponse(files["large"], media_type="application/octet-stream")

    async def relative(request: Any) -> FileResponse:
        return FileResponse("small.txt")  # passed on as given: a relative path

    inner = Starlette(routes=[Route("/large", large, methods=["GET", "HEAD"]),
                              Route("/relative", relative)])
    sent: list[str] = []

    async def recording(scope: Scope, receive: Any, send: Any) -> None:
        # The message types Starlette sends: proof that it took the extension.
        async def spy(message: dict[str, Any]) -> None:
            if scope["type"] == "http":
                sent.append(message["type"])
            await send(message)

        await inner(scope, receive, spy)

    yield recording, sent


def test_starlette_file_response(starlette_app: tuple[Any, list[str]],
                                 files: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    app, sent = starlette_app
    large = files["large"].read_bytes()
    stat = os.stat(files["large"])
    with serving_app(app) as port, Conn(port) as c:
        c.send(get("/large"))
        r = c.reply()
        assert (r.status, r.header("content-length")) == (200, str(stat.st_size))
        assert r.header("content-type") == "application/octet-stream"
        assert r.header("etag") and r.header("last-modified")
        assert hashlib.sha256(r.body).digest() == hashlib.sha256(large).digest()
        assert sent == ["http.response.start", "http.response.pathsend"]
        sent.clear()
        c.send(b"HEAD /large HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply(head_only=True)
        assert (r.status, r.header("content-length")) == (200, str(stat.st_size))
        c.send(get("/large"))  # nothing of the HEAD's body came before this answer
        assert len(c.reply().body) == len(large)
        monkeypatch.chdir(files["dir"])
        sent.clear()
        c.send(get("/relative"))
        r = c.reply()
        assert (r.status, r.body) == (200, b"hello from a file\n")
        assert sent == ["http.response.start", "http.response.pathsend"]

