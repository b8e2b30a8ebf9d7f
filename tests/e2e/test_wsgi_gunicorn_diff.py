"""Flask and Django WSGI applications (tests/e2e/diffapps/), and raw WSGI callables that get things
wrong on purpose, served by cyserve and by gunicorn (the WSGI server users come from; its gthread
worker, which keeps connections alive as cyserve does), each as a user starts it, asked the same
raw requests: the answers must match.

The rules are those of test_frameworks_uvicorn_diff.py (its docstring), gunicorn's answer the
reference, and these for gunicorn:
- Connection: gunicorn names the persistence of every answer ("Connection: keep-alive" on
  HTTP/1.1, where it is the default, RFC 9112 9.3); cyserve says only "close". The header is
  compared by what it does: whether each server kept the connection open.
- cyserve's --max-body-bytes (1 MiB by default) is 8 MiB here, as in the uvicorn test.
- Repeated request header lines reach the environ joined by "," on gunicorn and ", " on cyserve
  (both RFC 9110 5.3): the echoing app splits them.
- gunicorn answers an HTTP/1.0 request with an "HTTP/1.0" status line; cyserve, as uvicorn,
  says "HTTP/1.1", the version it speaks (RFC 9110 2.5: a server sends the highest version it
  conforms to whose major number the client's has). The rest of the answer is compared.
Where the two differ on purpose, a test of its own says why and what each does:
- an application whose Content-Length is wrong (test_a_wrong_content_length_from_the_app);
- start_response called again with exc_info before the head is out
  (test_exc_info_before_the_head_replaces_the_answer);
- a chunked request body (test_a_chunked_body_has_its_length_on_cyserve);
- two Cookie lines (test_two_cookie_lines_are_joined_as_cookies);
- a request target with bytes outside ASCII (test_a_target_with_raw_bytes_is_refused_by_both);
- HEAD answered by a generator that takes its time after its first piece
  (test_head_with_a_slow_generator_is_not_held_by_its_rest).
A response header value outside ASCII (latin-1, from Flask, Django and a raw app) is sent as the
same bytes by both.

What this test found, both fixed in native/wsgi.pyx:
- bytes an app gave write() while its generator made the pieces of a streamed answer were kept
  for the head already sent, and lost; they now go out before the next piece, in order
  (raw-write-and-yield);
- start_response called with exc_info once the head of a streamed answer was out was taken as
  a new answer, never sent, and the app's next piece went out as if nothing had failed; it now
  raises the app's error again (PEP 3333) and the answer is cut short, as on gunicorn
  (test_exc_info_after_the_head_cuts_the_answer_as_gunicorn)."""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from _diffserve import APPS, Reply, exchange, get, multipart, normalised, post, sequence, \
    server_pairs
from test_asgi_uvicorn_diff import Client, chunked

pytestmark = pytest.mark.native

SERVERS = ("cyserve", "gunicorn")
MODULES = {"flask": "wsgi_flask", "django": "wsgi_django"}


def command_lines(framework: str, cy: int, gu: int) -> tuple[list[str], list[str]]:
    """An application served by cyserve on port cy and by gunicorn (gthread) on port gu."""
    target = f"{MODULES[framework]}:app"
    return ([sys.executable, "-m", "cyserve", target, "--port", str(cy), "--threads", "2",
             "--app-dir", str(APPS), "--max-body-bytes", str(8 << 20)],
            [sys.executable, "-m", "gunicorn", target, "--bind", f"127.0.0.1:{gu}",
             "--worker-class", "gthread", "--threads", "2", "--workers", "1", "--chdir",
             str(APPS), "--log-level", "warning"])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], dict[str, int]]]:
    """Starts an application's two servers the first time a test asks for them."""
    with server_pairs(tmp_path_factory, SERVERS, command_lines) as start:
        yield start


def compare(cy: Reply, gu: Reply, data: bytes) -> None:
    """The module docstring's rules, gunicorn's answer the reference."""
    assert (cy.status, cy.interim, cy.reason) == (gu.status, gu.interim, gu.reason), (cy, gu)
    # gunicorn's status line echoes an HTTP/1.0 request's version (the docstring).
    assert cy.version == "HTTP/1.1", cy
    assert gu.version == data.split(b"\r\n", 1)[0].rsplit(b" ", 1)[1].decode(), gu
    assert normalised(cy, set()) == normalised(gu, set()), (cy, gu)
    if gu.get("content-length") and not gu.get("content-encoding"):
        assert cy.get("content-length") == gu.get("content-length"), (cy, gu)
        assert cy.get("transfer-encoding") == [], (cy, gu)
    head = data.split(b"\r\n\r\n", 1)[0]
    keep_alive = (b"HTTP/1.1" in head.split(b"\r\n", 1)[0] and b"Connection: close" not in head
                  or b"Connection: keep-alive" in head)
    assert cy.closed == gu.closed == (not keep_alive), (cy, gu)


UPLOAD = bytes(range(256)) * (12 * 1024 + 3)  # 3 MiB and a little
UPLOAD_BODY, UPLOAD_TYPE = multipart("file", "big.bin", UPLOAD, {"field": "v"})
CHUNKED_ECHO = (b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunked(b"hello ", b"chunked ", b"world"))

CASES: dict[tuple[str, str], bytes] = {
    ("flask", "json-ok"): post("/items/", b'{"name": "pen", "price": 2.5}', "application/json"),
    ("flask", "json-422"): post("/items/", b'{"name": "pen", "price": "free"}',
                                "application/json"),
    ("flask", "path-query-escapes"): get("/names/caf%C3%A9%20au%2Flait?q=%E2%9C%93+x%26y&n=3"),
    ("flask", "upload"): post("/upload", UPLOAD_BODY, UPLOAD_TYPE),
    ("flask", "stream"): get("/stream"),
    ("flask", "head-on-get-route"): b"HEAD /names/x HTTP/1.1\r\nHost: t\r\n\r\n",
    ("flask", "head-stream"): b"HEAD /stream HTTP/1.1\r\nHost: t\r\n\r\n",
    ("flask", "method-not-allowed"): (b"PUT /names/x HTTP/1.1\r\nHost: t\r\n"
                                      b"Content-Length: 0\r\n\r\n"),
    ("flask", "redirect-slashes"): get("/items?x=1"),
    ("flask", "not-found"): get("/nowhere"),
    ("flask", "abort-with-headers"): get("/teapot"),
    ("flask", "exception-500"): get("/boom"),
    ("flask", "chunked-body"): CHUNKED_ECHO % b"/echo",
    ("flask", "send-file"): get("/file"),
    ("flask", "send-file-range"): get("/file", "Range: bytes=10-19\r\n"),
    ("flask", "latin1-header"): get("/latin1"),
    ("flask", "connection-close"): get("/", "Connection: close\r\n"),
    ("flask", "raw-generator"): get("/raw/generator"),
    ("flask", "raw-generator-http-1.0"): b"GET /raw/generator HTTP/1.0\r\nHost: t\r\n\r\n",
    ("flask", "raw-head-generator"): b"HEAD /raw/generator HTTP/1.1\r\nHost: t\r\n\r\n",
    ("flask", "raw-write-and-yield"): get("/raw/write-and-yield"),
    ("flask", "raw-file-wrapper"): get("/raw/file-wrapper"),
    ("flask", "raw-head-file-wrapper"): b"HEAD /raw/file-wrapper HTTP/1.1\r\nHost: t\r\n\r\n",
    ("flask", "raw-environ-get"): get("/raw/environ?a=%41%20b&c=caf%C3%A9",
                                      "X-Multi: one\r\nx-multi: two\r\n"),
    ("flask", "raw-environ-post"): post("/raw/environ", b"name=caf%C3%A9", "text/plain"),
    ("flask", "raw-latin1-header"): get("/raw/latin1"),
    ("flask", "obs-text-header"): get("/raw/environ", "X-Multi: caf\xe9\r\n"),
    ("flask", "escapes-in-path-info"): get("/raw/environ/caf%C3%A9/%2F%20x;p?q=caf%C3%A9"),
    ("flask", "empty-header"): get("/raw/environ", "X-Empty:\r\n"),
    ("flask", "http-1.0"): b"GET / HTTP/1.0\r\nHost: t\r\n\r\n",
    ("flask", "http-1.0-keep-alive"): (b"GET / HTTP/1.0\r\nHost: t\r\n"
                                       b"Connection: keep-alive\r\n\r\n"),
    ("flask", "body-on-get"): b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
    ("flask", "path-semicolon-and-slash"): get("/raw/environ;x=1/a%2Fb?q=%2F"),
    ("flask", "options"): b"OPTIONS /names/x HTTP/1.1\r\nHost: t\r\n\r\n",
    ("django", "view"): get("/hello/?a=1&a=2&b=caf%C3%A9"),
    ("django", "sync-view"): get("/names/caf%C3%A9?q=%20x"),
    ("django", "append-slash"): get("/hello"),
    ("django", "not-found"): get("/nowhere/"),
    ("django", "csrf-rejected"): post("/form/", b"a=1", "application/x-www-form-urlencoded"),
    ("django", "json-post"): post("/echo/", b'{"k": [1, 2]}', "application/json"),
    ("django", "upload"): post("/upload/", UPLOAD_BODY, UPLOAD_TYPE),
    ("django", "stream"): get("/stream/"),
    ("django", "file"): get("/file/"),
    ("django", "exception-500"): get("/boom/"),
    ("django", "latin1-header"): get("/latin1/"),
    ("django", "head"): b"HEAD /hello/ HTTP/1.1\r\nHost: t\r\n\r\n",
}


@pytest.mark.parametrize(("framework", "case"), list(CASES))
def test_same_answer_as_gunicorn(served: Callable[[str], dict[str, int]], framework: str,
                                 case: str) -> None:
    ports = served(framework)
    data = CASES[framework, case]
    cy, gu = exchange(ports["cyserve"], data), exchange(ports["gunicorn"], data)
    compare(cy, gu, data)
    if case == "upload":  # the application saw every byte, on both
        assert json.loads(cy.body)["sha256"] == hashlib.sha256(UPLOAD).hexdigest()


@pytest.mark.parametrize("framework", list(MODULES))
def test_keep_alive_sequence_as_gunicorn(served: Callable[[str], dict[str, int]],
                                         framework: str) -> None:
    """An application's requests above on one connection: what one answer leaves behind (an
    unread body, a stream, a file) does not change the next one."""
    ports = served(framework)
    requests = [data for (fw, _), data in CASES.items() if fw == framework]
    cy, gu = (sequence(ports[s], requests) for s in SERVERS)
    assert cy == gu


@pytest.mark.parametrize("framework", list(MODULES))
def test_expect_100_continue_as_gunicorn(served: Callable[[str], dict[str, int]],
                                         framework: str) -> None:
    ports = served(framework)
    body = b'{"name": "cup", "price": 4}'
    target = b"/echo" if framework == "flask" else b"/echo/"
    head = (b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (target, len(body)))
    cy = exchange(ports["cyserve"], head, body_after_continue=body)
    gu = exchange(ports["gunicorn"], head, body_after_continue=body)
    compare(cy, gu, head)
    assert cy.interim == [100]


def raw_exchange(port: int, data: bytes, until: bytes | None = None) -> tuple[bytes, bytes, bool]:
    """The head and what followed it up to the close, or up to the end of `until`, and whether
    the server closed: for answers a framing-aware client cannot read."""
    c = Client(port)
    try:
        c.sock.sendall(data)
        head = c._until(b"\r\n\r\n")
        while until is None or not c.buf.endswith(until):
            if not c._fill():
                return head, c.buf, True
        return head, c.buf, False
    finally:
        c.close()


def test_exc_info_before_the_head_replaces_the_answer(
        served: Callable[[str], dict[str, int]]) -> None:
    """start_response("200 OK", ...) and then, before any body, start_response("503 ...",
    headers, exc_info): PEP 3333 has the second call replace the first ("the server may change
    the status and headers"). cyserve sends the 503 with the second call's headers alone;
    gunicorn 27 sends the 503 with the first call's headers still in it, then the second's
    (Content-Type twice, X-First of the answer that was given up): gunicorn's mistake, left
    to it."""
    ports = served("flask")
    data = get("/raw/exc-info-before-body")
    cy, gu = exchange(ports["cyserve"], data), exchange(ports["gunicorn"], data)
    assert cy.status == gu.status == 503
    assert cy.body == gu.body == b"later"
    assert normalised(cy, set())[0] == [("content-type", "text/plain")]
    assert normalised(gu, set())[0] == [("content-type", "text/plain"), ("x-first", "1"),
                                        ("content-type", "text/plain")]


def test_exc_info_after_the_head_cuts_the_answer_as_gunicorn(
        served: Callable[[str], dict[str, int]]) -> None:
    """A generator that yielded its first piece, then calls start_response with exc_info: the
    head is out, so start_response raises the app's error again (PEP 3333) and both servers
    end the answer there: the first piece, then the close, with no last chunk, so the client
    knows it is cut. (A chunk's size is hex in either case: gunicorn writes B, cyserve b.)"""
    ports = served("flask")
    data = get("/raw/exc-info-after-body")
    got = {}
    for server, port in ports.items():
        head, rest, closed = raw_exchange(port, data)
        assert head.startswith(b"HTTP/1.1 200 ") and b"Transfer-Encoding: chunked" in head
        got[server] = (rest.lower(), closed)
    assert got["cyserve"] == got["gunicorn"] == (b"b\r\nfirst part\n\r\n", True)


@pytest.mark.parametrize(("path", "cyserve_sends", "gunicorn_sends"), [
    # A list of 10 bytes under "Content-Length: 5": cyserve refuses it, gunicorn cuts it.
    ("/raw/too-long", None, b"01234"),
    # 10 bytes of the 20 announced: gunicorn sends them and keeps the connection.
    ("/raw/too-short", None, b"0123456789"),
    # A generator that yields past its length: both cut it there (the same answer).
    ("/raw/stream-too-long", b"01234", b"01234"),
    # A generator that ends short of its length: cyserve has it whole before answering.
    ("/raw/stream-too-short", None, b"0123456789"),
])
def test_a_wrong_content_length_from_the_app(served: Callable[[str], dict[str, int]], path: str,
                                             cyserve_sends: bytes | None,
                                             gunicorn_sends: bytes) -> None:
    """An app that announces a Content-Length its body does not have. cyserve collects a body
    it can hold before it sends the head, so it answers 500 and logs the mistake
    (tests/e2e/test_wsgi.py, "wrong content-length"), the connection kept; a body that goes
    past its length is cut there, as on gunicorn. gunicorn sends the app's head: a body too
    long is cut at the announced length; too short, it sends what there is and keeps the
    connection, so the client waits for the missing bytes and takes the next answer's for
    them. cyserve's answer is the one a client can trust."""
    ports = served("flask")
    data = get(path) + get("/")
    last = b'{"hello":"world"}\n'  # the end of the second answer
    cy_head, cy_rest, _ = raw_exchange(ports["cyserve"], data, until=last)
    if cyserve_sends is None:
        assert cy_head.startswith(b"HTTP/1.1 500 ")
        assert cy_rest.startswith(b"500 Internal Server Error\n")
    else:
        assert cy_head.startswith(b"HTTP/1.1 200 ")
        assert cy_rest.startswith(cyserve_sends + b"HTTP/1.1 200 OK")
    assert b"HTTP/1.1 200 OK" in cy_rest
    gu_head, gu_rest, _ = raw_exchange(ports["gunicorn"], data, until=last)
    assert gu_head.startswith(b"HTTP/1.1 200 ")
    assert gu_rest.startswith(gunicorn_sends + b"HTTP/1.1 200 OK")


def test_two_cookie_lines_are_joined_as_cookies(served: Callable[[str], dict[str, int]]) -> None:
    """Two Cookie lines (a client should send one, RFC 6265 5.4; HTTP/2 clients send one a
    cookie, RFC 9113 8.2.3): cyserve joins them with "; ", as the cookie syntax separates them,
    so Flask reads both; gunicorn joins them with ",", as other repeated headers, and Flask
    reads one cookie "a" whose value is "1,b=2"."""
    ports = served("flask")
    data = get("/cookies", "Cookie: a=1\r\nCookie: b=2\r\n")
    cy, gu = exchange(ports["cyserve"], data), exchange(ports["gunicorn"], data)
    assert json.loads(cy.body) == {"a": "1", "b": "2"}
    assert json.loads(gu.body) == {"a": "1,b=2"}


def test_a_target_with_raw_bytes_is_refused_by_both(
        served: Callable[[str], dict[str, int]]) -> None:
    """Bytes outside ASCII in the request target are not a URI's (RFC 9112 3.2, RFC 3986 2):
    both answer 400 and close, in words of their own (a server's own page, as its 500's)."""
    ports = served("flask")
    data = b"GET /raw/environ/caf\xc3\xa9?q=caf\xc3\xa9 HTTP/1.1\r\nHost: t\r\n\r\n"
    cy = exchange(ports["cyserve"], data)
    assert (cy.status, cy.closed) == (400, True)
    # gunicorn's refusal is read to its close rather than parsed: gunicorn 27.0.1 builds it
    # (gunicorn.util.write_error) with textwrap.dedent, which since Python 3.14 empties a line of
    # only whitespace, so on 3.14 (with the GIL or without) the "\r" of its blank line is lost
    # and its head ends in "\r\n\n", which a client waiting for CRLF CRLF never sees end.
    c = Client(ports["gunicorn"])
    try:
        c.sock.sendall(data)
        while c._fill():  # to the close; a connection left open times out and fails the test
            pass
    finally:
        c.close()
    assert c.buf.startswith(b"HTTP/1.1 400 Bad Request\r\n"), c.buf


@pytest.mark.parametrize("expect", [False, True])
@pytest.mark.parametrize("framework", list(MODULES))
def test_a_chunked_body_has_its_length_on_cyserve(served: Callable[[str], dict[str, int]],
                                                  framework: str, expect: bool) -> None:
    """A chunked request body reaches the app whole on cyserve, with CONTENT_LENGTH its decoded
    length (and wsgi.input_terminated): PEP 3333 lets a server give it, and an app that reads
    CONTENT_LENGTH bytes, as Django does, gets the body. gunicorn gives no CONTENT_LENGTH, so
    Flask (which reads to the end of wsgi.input_terminated input) gets the body on both, and
    Django gets an empty one on gunicorn: a difference in cyserve's favour."""
    ports = served(framework)
    data = CHUNKED_ECHO % (b"/raw/environ" if framework == "flask" else b"/echo/")
    if expect:  # the head first; the body once the 100 Continue came
        head, body = data.split(b"\r\n\r\n", 1)
        head += b"\r\nExpect: 100-continue\r\n\r\n"
        cy, gu = (exchange(ports[s], head, body_after_continue=body) for s in SERVERS)
    else:
        cy, gu = exchange(ports["cyserve"], data), exchange(ports["gunicorn"], data)
    assert (cy.status, cy.interim) == (gu.status, gu.interim) == (200, [100] if expect else [])
    body_sha = hashlib.sha256(b"hello chunked world").hexdigest()
    if framework == "flask":
        cy_env, gu_env = (dict(ast.literal_eval(a.body.decode())) for a in (cy, gu))
        assert cy_env.pop("CONTENT_LENGTH") == "19" and gu_env.pop("CONTENT_LENGTH") is None
        assert cy_env["HTTP_EXPECT"] == ("100-continue" if expect else None)
        assert cy_env == gu_env and cy_env["body"] == body_sha
    else:
        assert json.loads(cy.body)["sha256"] == body_sha
        assert json.loads(gu.body)["len"] == 0


def test_head_with_a_slow_generator_is_not_held_by_its_rest(
        served: Callable[[str], dict[str, int]]) -> None:
    """HEAD answered by a generator that announces its length, yields its first piece and then
    takes 1.5 s before its second: both servers send the same head at once, with GET's
    Content-Length. gunicorn then reads the generator to its end and drops what it yields, so
    the connection's next request waits for it (an endless generator holds its worker for
    ever, spinning on empty pieces); cyserve closes the generator at its first piece, since
    nothing of the rest would be sent (docs/architecture.md, "Answers to HEAD"), and answers
    the next request at once."""
    ports = served("flask")
    heads, took = {}, {}
    for server, port in ports.items():
        c = Client(port)
        try:
            # Timed from before the request: the generator's pause cannot start before it, however
            # late this thread comes back from the send.
            t0 = time.monotonic()
            c.sock.sendall(b"HEAD /raw/head-slow HTTP/1.1\r\nHost: t\r\n\r\n")
            status, headers = c.head()
            heads[server] = (status, [v for k, v in headers if k == "content-length"])
            c.sock.sendall(get("/raw/latin1"))
            assert c.answer("GET").body == b"ok"
            took[server] = time.monotonic() - t0
        finally:
            c.close()
    assert heads["cyserve"] == heads["gunicorn"] == (200, ["10"])
    assert took["cyserve"] < 1.0 and took["gunicorn"] >= 1.4, took
