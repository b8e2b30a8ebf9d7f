"""The same ASGI application served by cyserve and by uvicorn (the reference most users know),
each as a user starts it (a subprocess on a loopback port), asked the same raw requests: the
status, the headers and the body must match.

What may differ, by rule rather than by a list of ignored headers:
- Date and Server: each server's own.
- The framing of a body the application did not size (no Content-Length in its
  http.response.start): a server may send it with Content-Length or chunked (RFC 9112 6.1-6.3),
  so those two headers are compared only where the application set Content-Length itself; the
  bodies are compared once decoded.
- Connection: close where the server ends the connection after an answer (RFC 9112 9.6): a server
  may close after any answer, so the header is compared only on answers where both kept the
  connection open; but an answer to a request that asked for keep-alive must keep it open on
  both, and one to a request that did not must close on both. After the 500 a server makes
  for an application that failed before answering, uvicorn closes and cyserve keeps the
  connection: the answer is whole and framed, so either is right (RFC 9112 9.3, 9.6).
- The body of a 500 that the server made itself (the application failed before answering): the
  words of a server's own error page are its own.
Everything else, the status line's code and every other header (repeated ones one by one, in
the order the application gave them), must be the same. Where cyserve differs on purpose, a test
of its own says why (absolute-form targets, a body on a 204).

What this test found (session 17): a full answer from an application that never read a small
request body (an early 403 to a POST) closed cyserve's connection, where uvicorn keeps it; cyserve
now skips such a body when it came whole with the head (http1.c)."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _subserve import free_port, running

pytestmark = pytest.mark.native

APP = r'''
import hashlib, json

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    if path == "/early":  # answers without reading the body
        await send({"type": "http.response.start", "status": 403, "headers": [
            (b"content-type", b"text/plain"), (b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"no"})
        return
    body = b""
    pieces = 0
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        pieces += 1
        if not msg.get("more_body"):
            break
    if path == "/boom":
        raise RuntimeError("the application failed")
    if path in ("/no-content-body", "/no-content-later"):  # a 204 with a body: the app's mistake
        await send({"type": "http.response.start", "status": 204, "headers": []})
        if path == "/no-content-later":
            await send({"type": "http.response.body", "body": b"", "more_body": True})
        await send({"type": "http.response.body", "body": b"late"})
        return
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"part %d\n" % i,
                        "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/unsized":
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"no length given"})
        return
    if path == "/cookies":
        out = b"two cookies"
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"set-cookie", b"a=1; Path=/"), (b"content-type", b"text/plain"),
            (b"set-cookie", b"b=2; HttpOnly"), (b"content-length", b"%d" % len(out))]})
        await send({"type": "http.response.body", "body": out})
        return
    if path not in ("/", "/echo"):
        out = b"not here"
        await send({"type": "http.response.start", "status": 404, "headers": [
            (b"content-type", b"text/plain"), (b"content-length", b"%d" % len(out))]})
        await send({"type": "http.response.body", "body": out})
        return
    seen = {
        "method": scope["method"], "http_version": scope["http_version"],
        "scheme": scope["scheme"], "path": scope["path"],
        "raw_path": scope["raw_path"].decode("latin-1"),
        "query_string": scope["query_string"].decode("latin-1"),
        "root_path": scope["root_path"],
        "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
        "body_sha256": hashlib.sha256(body).hexdigest(), "body_len": len(body),
    }
    out = json.dumps(seen, sort_keys=True).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]})
    await send({"type": "http.response.body", "body": out})
'''

OWN = {"date", "server"}
FRAMING = {"content-length", "transfer-encoding"}


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    interim: list[int] = field(default_factory=list)  # 1xx codes before the final answer
    closed: bool = False  # the server ended the connection after the answer

    def get(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]


class Client:
    """A raw HTTP/1.1 client that keeps every header line as sent, in order."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def _fill(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        self.buf += data
        return bool(data)

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            if not self._fill():
                raise ConnectionError(f"closed before {marker!r}: {self.buf!r}")
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionError(f"closed after {len(self.buf)} of {n} bytes")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def head(self) -> tuple[int, list[tuple[str, str]]]:
        lines = self._until(b"\r\n\r\n")[:-4].decode("latin-1").split("\r\n")
        version, code = lines[0].split(" ", 2)[:2]
        assert version == "HTTP/1.1", lines[0]
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.append((name.strip().lower(), value.strip()))
        return int(code), headers

    def answer(self, method: str, interim: list[int] | None = None,
               see_close: bool = False) -> Answer:
        interim = list(interim or [])
        while True:
            status, headers = self.head()
            if status >= 200:
                break
            interim.append(status)
        a = Answer(status, headers, b"", interim)
        length = a.get("content-length")
        if method == "HEAD" or status in (204, 304):
            pass
        elif length:
            a.body = self._exact(int(length[0]))
        elif a.get("transfer-encoding") == ["chunked"]:
            while True:
                size = int(self._until(b"\r\n")[:-2], 16)
                if size == 0:
                    assert self._until(b"\r\n") == b"\r\n"
                    break
                a.body += self._exact(size)
                assert self._exact(2) == b"\r\n"
        else:  # read to the end (RFC 9112 6.3, rule 8)
            while self._fill():
                pass
            a.body, self.buf = self.buf, b""
        if see_close:
            # Whether the server kept the connection: a second request gets an answer on it (a
            # 404), or the end of the connection. (Waiting 0.15 s for the end took a server
            # that closed a little later, as a loaded machine makes it, for one that kept it.)
            try:
                self.sock.sendall(b"GET /probe-after HTTP/1.1\r\nHost: t\r\n\r\n")
                self.head()
                a.closed = False
            except ConnectionError:  # the end, a reset, or a broken pipe
                a.closed = True
        return a

    def close(self) -> None:
        self.sock.close()


def ask(port: int, data: bytes) -> Answer:
    """One request on a connection of its own: the answer, and whether the server closed."""
    c = Client(port)
    try:
        c.sock.sendall(data)
        return c.answer(data.split(b" ", 1)[0].decode(), see_close=True)
    finally:
        c.close()


def ask_with_continue(port: int) -> Answer:
    """A POST with Expect: 100-continue whose body is sent only once the 100 has come."""
    body = b"x" * 1000
    c = Client(port)
    try:
        c.sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body))
        status, headers = c.head()
        assert (status, headers) == (100, []), (status, headers)
        c.sock.sendall(body)
        return c.answer("POST", interim=[100], see_close=True)
    finally:
        c.close()


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


POST_BODY = b"name=caf%C3%A9&n=1"
REQUESTS: dict[str, bytes] = {
    "get": b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n",
    "get-query-escapes": b"GET /echo?x=%41%20b&y=caf%C3%A9&z=a%2Fb&e= HTTP/1.1\r\nHost: t\r\n\r\n",
    "get-path-escapes": b"GET /ech%6F HTTP/1.1\r\nHost: t\r\n\r\n",
    "repeated-headers": (b"GET /echo HTTP/1.1\r\nHost: t\r\nX-Multi: one\r\n"
                         b"Accept: text/html\r\nx-multi: two, three\r\n\r\n"),
    "head": b"HEAD /echo HTTP/1.1\r\nHost: t\r\n\r\n",
    "post-length": (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(POST_BODY)) + POST_BODY,
    "post-chunked": (b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunked(b"hello ", b"chunked ", b"world")),
    "post-empty": b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n",
    "http-1.0": b"GET /echo HTTP/1.0\r\nHost: t\r\n\r\n",
    "http-1.0-stream": b"GET /stream HTTP/1.0\r\nHost: t\r\n\r\n",
    "connection-close": b"GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    "header-whitespace": (b"GET /echo HTTP/1.1\r\nHost: t\r\nX-Pad: \t padded \t\r\n"
                          b"X-Empty:\r\n\r\n"),
    "chunk-extensions-trailers": (b"POST /echo HTTP/1.1\r\nHost: t\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\n"
                                  b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n"),
    "stream": b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n",
    "head-stream": b"HEAD /stream HTTP/1.1\r\nHost: t\r\n\r\n",
    "unsized": b"GET /unsized HTTP/1.1\r\nHost: t\r\n\r\n",
    "repeated-response-headers": b"GET /cookies HTTP/1.1\r\nHost: t\r\n\r\n",
    "not-found": b"GET /nowhere HTTP/1.1\r\nHost: t\r\n\r\n",
    "head-unsized": b"HEAD /unsized HTTP/1.1\r\nHost: t\r\n\r\n",
    "post-early-answer": (b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n"
                          b"hello"),
    "app-raises": b"GET /boom HTTP/1.1\r\nHost: t\r\n\r\n",
}

# The requests whose answer the application sized itself (its Content-Length).
SIZED_BY_THE_APP = {name for name, data in REQUESTS.items()
                    if data.split(b" ")[1].startswith((b"/echo", b"/ech%6F", b"/cookies",
                                                       b"/nowhere"))}


def compared(a: Answer) -> dict[str, object]:
    """What must be equal between the two servers (the module docstring's rules)."""
    headers = [(k, v) for k, v in a.headers if k not in OWN and k != "connection"]
    # A 500 the server made for an application that failed before it answered: its words are
    # the server's own (uvicorn "Internal Server Error", cyserve "500 Internal Server Error\n"),
    # like its Date and Server.
    body = a.body if a.status != 500 else b"(the server's own words)"
    return {"status": a.status, "interim": a.interim, "body": body,
            "headers": [(k, v) for k, v in headers if k not in FRAMING]}


def asks_keep_alive(data: bytes) -> bool:
    """Whether a request lets the connection go on after its answer (RFC 9112 9.3)."""
    head = data.split(b"\r\n\r\n", 1)[0]
    return b"HTTP/1.1" in head.split(b"\r\n", 1)[0] and b"Connection: close" not in head


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    folder = tmp_path_factory.mktemp("diffapp")
    (folder / "diffapp.py").write_text(APP)
    cy, uv = free_port(), free_port()
    cy_argv = [sys.executable, "-m", "cyserve", "diffapp:app", "--port", str(cy), "--threads",
               "2", "--app-dir", str(folder), "--loop", "asyncio"]
    uv_argv = [sys.executable, "-m", "uvicorn", "diffapp:app", "--port", str(uv), "--host",
               "127.0.0.1", "--app-dir", str(folder), "--loop", "asyncio", "--http", "h11",
               "--no-access-log", "--log-level", "warning"]
    with running(cy_argv, cy), running(uv_argv, uv, cwd=Path(folder)):
        yield {"cyserve": cy, "uvicorn": uv}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_same_answer_as_uvicorn(servers: dict[str, int], name: str) -> None:
    data = REQUESTS[name]
    cy = ask(servers["cyserve"], data)
    uv = ask(servers["uvicorn"], data)
    assert compared(cy) == compared(uv), (cy, uv)
    # Content-Length, where the application gave it, is the application's on both.
    if name in SIZED_BY_THE_APP:
        assert cy.get("content-length") == uv.get("content-length") != []
        assert cy.get("transfer-encoding") == uv.get("transfer-encoding") == []
    if not cy.closed and not uv.closed:
        assert cy.get("connection") == uv.get("connection")
    if uv.status == 500:
        pass  # either may close: the module docstring
    elif asks_keep_alive(data):
        assert not cy.closed and not uv.closed, (cy, uv)
    else:
        assert cy.closed and uv.closed, (cy, uv)
    if name in ("get", "get-query-escapes", "repeated-headers", "post-length", "post-chunked"):
        # The application's own view of the request (its scope and the body it read) is the
        # same on both, header for header.
        seen_cy, seen_uv = json.loads(cy.body), json.loads(uv.body)
        assert seen_cy == seen_uv


def test_absolute_form_target_is_served_as_its_path(servers: dict[str, int]) -> None:
    """Where cyserve and uvicorn differ: a request target in absolute form (RFC 9112 3.2.2, which
    a server must accept) is the origin-form path for cyserve, so the application sees /echo and
    a=1. uvicorn 0.54 (h11) hands the application the whole URL as its path (here a 404 from
    the application); cyserve's is the RFC's reading, and what a proxy-facing app expects."""
    port = servers["cyserve"]
    absolute = ask(port, b"GET http://t/echo?a=1 HTTP/1.1\r\nHost: t\r\n\r\n")
    origin = ask(port, b"GET /echo?a=1 HTTP/1.1\r\nHost: t\r\n\r\n")
    assert absolute.status == 200
    assert compared(absolute) == compared(origin)
    assert json.loads(absolute.body)["path"] == "/echo"


def test_expect_100_continue_as_uvicorn(servers: dict[str, int]) -> None:
    cy = ask_with_continue(servers["cyserve"])
    uv = ask_with_continue(servers["uvicorn"])
    assert compared(cy) == compared(uv), (cy, uv)
    assert json.loads(cy.body)["body_len"] == 1000


def test_keep_alive_sequence_as_uvicorn(servers: dict[str, int]) -> None:
    """The requests above one after the other on one connection (a new one after those that end
    it): what one answer leaves behind (an unread body, a streamed answer) does not change the
    next one."""
    answers = {}
    for server, port in servers.items():
        c = Client(port)
        try:
            got = []
            for data in REQUESTS.values():
                c.sock.sendall(data)
                a = c.answer(data.split(b" ", 1)[0].decode())
                got.append(compared(a))
                if not asks_keep_alive(data) or a.status == 500:  # the server ends it
                    c.close()
                    c = Client(port)
            answers[server] = got
        finally:
            c.close()
    assert answers["cyserve"] == answers["uvicorn"]


def test_no_100_continue_for_an_application_that_never_reads(servers: dict[str, int]) -> None:
    """An application that answers without calling receive() (an early 403) gets its answer to
    the client with no 100 Continue before it (RFC 9110 10.1.1), on both servers. What follows
    may differ: the client was not told to send its body, so the server may close (cyserve) or
    wait for what the client does next (uvicorn); both are the RFC's."""
    for port in servers.values():
        c = Client(port)
        try:
            c.sock.sendall(b"POST /early HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                           b"Content-Length: 1000\r\n\r\n")
            a = c.answer("POST")
        finally:
            c.close()
        assert (a.status, a.interim, a.body) == (403, [], b"no")


def test_a_request_behind_an_unread_body_as_uvicorn(servers: dict[str, int]) -> None:
    """A POST whose body the application never reads, with the next request right behind it in
    the same packet: the body is skipped, not taken for the next request's head."""
    answers = {}
    for server, port in servers.items():
        c = Client(port)
        try:
            c.sock.sendall(REQUESTS["post-early-answer"] + REQUESTS["get-query-escapes"])
            answers[server] = [compared(c.answer("POST")), compared(c.answer("GET"))]
        finally:
            c.close()
    assert answers["cyserve"] == answers["uvicorn"]
    assert [a["status"] for a in answers["cyserve"]] == [403, 200]


@pytest.mark.parametrize(("path", "cyserve_status"), [("/no-content-body", 500),
                                                      ("/no-content-later", 204)])
def test_a_body_on_a_204_is_the_apps_error_on_both(servers: dict[str, int], path: str,
                                                   cyserve_status: int) -> None:
    """Body bytes after a 204's start: both servers raise in the app's send() (uvicorn's h11
    "Too much data for declared Content-Length", its httptools protocol "Response content
    longer than Content-Length"; cyserve names the status) and log the app's traceback.
    uvicorn writes the head at http.response.start, so its 204 is out already, and it closes
    the connection. cyserve's head waits for the body's first message: bytes there make the
    answer a 500 (as its WSGI answers such a body), the connection kept; after an empty first
    message, which completes the 204, the client keeps that 204 and the connection. (granian
    2.8 drops the bytes without a word.)"""
    cy = ask(servers["cyserve"], b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % path.encode())
    uv = ask(servers["uvicorn"], b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % path.encode())
    assert (cy.status, cy.closed) == (cyserve_status, False), cy
    assert (uv.status, uv.closed) == (204, True), uv
