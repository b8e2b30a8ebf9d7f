"""The demo app (examples/demo/app.py) served by the real engine: every route, exact bodies.

The server runs in this process on port 0 with two workers; requests go over real sockets
(http.client, and a raw socket where the bytes on the wire matter).
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cyserve.config import Config

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "examples" / "demo" / "static"
FIB = b"Fibonacci(10^6) = 1884755131 (with overflow)\n"


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    sys.path.insert(0, str(ROOT))
    try:
        from examples.demo.app import app
    finally:
        sys.path.remove(str(ROOT))
    from cyserve._core import Server

    kwargs = Config(port=0, threads=2).server_kwargs()
    srv = Server(app.build(), **kwargs)
    srv.start()
    try:
        assert srv.running
        yield srv.port
    finally:
        srv.stop(grace=5.0)
    assert not srv.running


def request(port: int, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes, read until the server closes (the request asks it to)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        chunks: list[bytes] = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


@pytest.mark.parametrize(("path", "body"), [
    ("/", b"Hello, World!"),
    ("/fibonacci", FIB),
    ("/plaintext", b"Hello, World!"),
    ("/py", b"Hello, World!"),
])
def test_hello_routes(port: int, path: str, body: bytes) -> None:
    status, headers, data = request(port, "GET", path)
    assert (status, data) == (200, body)
    assert headers["content-length"] == str(len(body))
    assert headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_echo_returns_the_body(port: int, method: str) -> None:
    payload = bytes(range(256)) * 40 + b"end"
    status, _, data = request(port, method, "/echo", body=payload,
                              headers={"Content-Type": "application/octet-stream"})
    assert (status, data) == (200, payload)


def test_echo_without_a_body(port: int) -> None:
    status, headers, data = request(port, "GET", "/echo")
    assert (status, data) == (200, b"")
    assert headers["content-length"] == "0"


def test_echo_chunked_upload(port: int) -> None:
    reply = raw_exchange(port, b"POST /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                               b"Transfer-Encoding: chunked\r\n\r\n"
                               b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert body == b"hello world"


@pytest.mark.parametrize(("path", "expected"), [
    ("/users/42", {"id": 42}),
    ("/users/0", {"id": 0}),
    ("/users/9223372036854775807", {"id": 9223372036854775807}),
])
def test_users_route_answers_json(port: int, path: str, expected: dict[str, Any]) -> None:
    status, headers, data = request(port, "GET", path)
    assert status == 200
    assert headers["content-type"].startswith("application/json")
    assert json.loads(data) == expected


@pytest.mark.parametrize("path", ["/users/abc", "/users/", "/users/4/2", "/nope"])
def test_unknown_paths_are_404(port: int, path: str) -> None:
    status, _, _ = request(port, "GET", path)
    assert status == 404


def test_wrong_method_is_405_with_allow(port: int) -> None:
    status, headers, _ = request(port, "POST", "/py", body=b"x")
    assert status == 405
    assert headers["allow"] == "GET, HEAD"


def test_head_has_headers_and_no_body(port: int) -> None:
    reply = raw_exchange(port, b"HEAD /py HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    head, sep, body = reply.partition(b"\r\n\r\n")
    assert sep and body == b""
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"\r\ncontent-length: 13" in head.lower()


@pytest.mark.parametrize(("path", "name", "content_type"), [
    ("/files/hello.txt", "hello.txt", "text/plain"),
    ("/files/index.html", "index.html", "text/html"),
    ("/files/", "index.html", "text/html"),
])
def test_files(port: int, path: str, name: str, content_type: str) -> None:
    status, headers, data = request(port, "GET", path)
    assert status == 200
    assert data == (STATIC / name).read_bytes()
    assert headers["content-type"].startswith(content_type)


@pytest.mark.parametrize("path", ["/files/../app.py", "/files/%2e%2e/app.py",
                                  "/files/missing.txt"])
def test_files_outside_the_root_or_missing_are_not_served(port: int, path: str) -> None:
    status, _, data = request(port, "GET", path)
    assert status in (400, 403, 404)
    assert b"import" not in data


def test_keep_alive_across_every_kind_of_route(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for _ in range(50):
            for path, body in (("/", b"Hello, World!"), ("/plaintext", b"Hello, World!"),
                               ("/py", b"Hello, World!"), ("/fibonacci", FIB)):
                conn.request("GET", path)
                resp = conn.getresponse()
                assert (resp.status, resp.read()) == (200, body)
            conn.request("POST", "/echo", body=b"ping")
            resp = conn.getresponse()
            assert resp.read() == b"ping"
    finally:
        conn.close()


def test_pipelined_requests_are_answered_in_order(port: int) -> None:
    reqs = b"".join(b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % p
                    for p in (b"/py", b"/users/7", b"/plaintext"))
    reply = raw_exchange(port, reqs + b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert reply.count(b"HTTP/1.1 200 ") == 4
    first = reply.index(b"Hello, World!")
    assert first < reply.index(b'"id"') < reply.index(b"Hello, World!", first + 1)


def test_the_hello_example() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from examples import hello
    finally:
        sys.path.remove(str(ROOT))
    from cyserve._core import Server

    srv = Server(hello.app.build(), **Config(port=0, threads=1).server_kwargs())
    srv.start()
    try:
        assert request(srv.port, "GET", "/")[::2] == (200, b"Hello, World!")
        assert request(srv.port, "GET", "/plaintext")[::2] == (200, b"Hello, World!")
        status, headers, data = request(srv.port, "GET", "/hello/bob")
        assert (status, json.loads(data)) == (200, {"hello": "bob"})
    finally:
        srv.stop(grace=5.0)
