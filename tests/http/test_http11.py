"""End-to-end HTTP/1.1 tests of the engine over raw sockets: keep-alive, pipelining, bodies,
100-continue, HEAD, every rejection, timeouts, routing errors, handler failures, shutdown.

Every server listens on 127.0.0.1 and an ephemeral port and is stopped by the test."""

from __future__ import annotations

import select
import socket
import threading
import time

import pytest

from _rawhttp import Conn, get, request, serving
from cyserve._core import Headers, Request, Response, Server

pytestmark = pytest.mark.native


def echo(req: Request) -> Response:
    return Response(req.body, headers=[("X-Method", req.method), ("X-Len", str(len(req.body)))])


def describe(req: Request) -> dict:
    return {"method": req.method, "path": req.path, "query": req.query, "target": req.target,
            "version": req.http_version, "params": req.params,
            "ua": req.headers.get("user-agent"), "host": req.headers["HOST"],
            "has_host": "Host" in req.headers}


def boom(req: Request) -> str:
    raise RuntimeError("handler failure on purpose")


def late_body(req: Request) -> Response:
    r = Response("x")
    r.body = 5  # checked when set, not only in the constructor
    return r


# Set when slow() begins: a test that needs the handler running waits for it, not for a fixed
# time (a loaded machine may take longer than any such time to get there). The handler then runs
# until the test sets slow_release (at most 30 s): a stop that must find it in flight begins
# first, however long the test takes to get there.
slow_entered = threading.Event()
slow_release = threading.Event()


def slow(req: Request) -> str:
    slow_entered.set()
    slow_release.wait(30)
    return "slow done"


ROUTES = [
    ("path", "/plaintext", ("GET",), "static",
     (200, [("Content-Type", "text/plain")], b"Hello, World!")),
    ("path", "/py", None, "python", lambda req: "Hello, World!"),
    ("path", "/", ("GET",), "python", lambda req: f"root {req.path} {req.query}"),
    ("path", "/echo", None, "python", echo),
    ("path", "/describe/{id:int}/{name}", ("GET", "POST"), "python", describe),
    ("path", "/boom", None, "python", boom),
    ("path", "/slow", None, "python", slow),
    ("path", "/bytes", None, "python", lambda req: b"\x00\x01"),
    ("path", "/json", None, "python", lambda req: {"a": [1, 2]}),
    ("path", "/list", None, "python", lambda req: [1, "x"]),
    ("path", "/none", None, "python", lambda req: None),
    ("path", "/bad-return", None, "python", lambda req: 3.5),
    ("path", "/created", None, "python",
     lambda req: Response("made", status=201, headers={"X-A": "1"}, content_type="text/x")),
    ("path", "/only-post", ("POST",), "python", lambda req: "posted"),
    ("path", "/interim", None, "python", lambda req: Response("x", status=100)),
    ("path", "/late-body", None, "python", late_body),
    ("path", "/nan", None, "python", lambda req: {"x": float("nan")}),
    ("path", "/ctl-header", None, "python", lambda req: Response("x", headers={"X-A": "a\x01"})),
    ("path", "/server-header", None, "python", lambda req: Response("x", headers={"Server": "a"})),
    ("path", "/server-twice", None, "python",
     lambda req: Response("x", headers=[("Server", "a"), ("server", "b")])),
    ("path", "/static-server", ("GET",), "static", (404, [("Server", "mine/2")], b"gone")),
    ("path", "/204-body", None, "python", lambda req: Response("x", status=204)),
    ("path", "/length-ok", None, "python",
     lambda req: Response("four", headers=[("Content-Length", " 4 ")])),
    ("path", "/length-wrong", None, "python",
     lambda req: Response("four", headers=[("Content-Length", "5")])),
    ("path", "/length-bad", None, "python",
     lambda req: Response("four", headers=[("Content-Length", "+4")])),
    ("path", "/304-length", None, "python",
     lambda req: Response(b"", status=304, headers={"Content-Length": "100"})),
    # What GET would send, announced by an empty answer to HEAD (the GET gets a 500).
    ("path", "/length-for-head", None, "python",
     lambda req: Response(b"", headers={"Content-Length": "1234"}, content_type="text/x")),
    ("prefix", "/pre", None, "python", lambda req: "prefix " + req.path),
    ("regex", "/re/([0-9]+)", None, "python", lambda req: "re " + req.params["1"]),
]


@pytest.fixture(scope="module")
def port():
    with serving(ROUTES, max_body_bytes=4096, max_header_bytes=1024, max_target_bytes=256,
                 max_headers=20) as srv:
        yield srv.port


def test_static_response(port):
    r = request(port, get("/plaintext"))
    assert (r.status, r.body) == (200, b"Hello, World!")
    assert r.raw_head.startswith(b"HTTP/1.1 200 OK\r\nServer: cyserve\r\n")
    assert r.header("content-type") == "text/plain"
    assert r.header("content-length") == "13"
    assert r.header("date") and r.header("date").endswith(" GMT")
    assert r.header("connection") is None


def test_keep_alive_many_requests(port):
    with Conn(port) as c:
        for i in range(300):
            path = ("/plaintext", "/py", f"/pre/x{i}")[i % 3]
            c.send(get(path))
            r = c.reply()
            assert r.status == 200
            assert r.body in (b"Hello, World!", f"prefix /pre/x{i}".encode())
        assert r.header("connection") is None


def test_pipelined_requests_answered_in_order(port):
    reqs = b"".join(get(f"/pre/{i}") for i in range(20))
    reqs += get("/plaintext") + b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc"
    reqs += get("/pre/last")
    with Conn(port) as c:
        c.send(reqs)
        for i in range(20):
            assert c.reply().body == f"prefix /pre/{i}".encode()
        assert c.reply().body == b"Hello, World!"
        assert c.reply().body == b"abc"
        assert c.reply().body == b"prefix /pre/last"


def test_pipelined_requests_split_at_every_byte(port):
    data = get("/pre/a") + b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nxy" + \
        get("/pre/b")
    with Conn(port) as c:
        for i in range(len(data)):
            c.send(data[i:i + 1])
        assert c.reply().body == b"prefix /pre/a"
        assert c.reply().body == b"xy"
        assert c.reply().body == b"prefix /pre/b"


def test_request_fields(port):
    r = request(port, b"GET /describe/-7/bob?q=1&r HTTP/1.1\r\nHost: h.example\r\n"
                      b"User-Agent: t/1\r\n\r\n")
    assert r.status == 200
    assert r.header("content-type") == "application/json"
    import json
    d = json.loads(r.body)
    assert d == {"method": "GET", "path": "/describe/-7/bob", "query": "q=1&r",
                 "target": "/describe/-7/bob?q=1&r", "version": "1.1",
                 "params": {"id": -7, "name": "bob"}, "ua": "t/1", "host": "h.example",
                 "has_host": True}


@pytest.mark.parametrize("path,status,ctype,body", [
    ("/bytes", 200, "application/octet-stream", b"\x00\x01"),
    ("/json", 200, "application/json", b'{"a":[1,2]}'),
    ("/list", 200, "application/json", b'[1,"x"]'),
    ("/none", 204, None, b""),
    ("/created", 201, "text/x", b"made"),
    ("/bad-return", 500, "text/plain; charset=utf-8", b"500 Internal Server Error\n"),
    # Mistakes a handler makes are a 500 and a logged error naming them, never sent on.
    ("/interim", 500, "text/plain; charset=utf-8", b"500 Internal Server Error\n"),
    ("/late-body", 500, "text/plain; charset=utf-8", b"500 Internal Server Error\n"),
    ("/nan", 500, "text/plain; charset=utf-8", b"500 Internal Server Error\n"),
    ("/ctl-header", 500, "text/plain; charset=utf-8", b"500 Internal Server Error\n"),
    ("/server-header", 200, "text/plain; charset=utf-8", b"x"),
    ("/server-twice", 500, "text/plain; charset=utf-8", b"500 Internal Server Error\n"),
    ("/204-body", 500, "text/plain; charset=utf-8", b"500 Internal Server Error\n"),
    ("/length-ok", 200, "text/plain; charset=utf-8", b"four"),
    ("/304-length", 304, None, b""),  # a 304's Content-Length is GET's: not checked
    ("/length-wrong", 500, "text/plain; charset=utf-8", b"500 Internal Server Error\n"),
    ("/length-bad", 500, "text/plain; charset=utf-8", b"500 Internal Server Error\n"),
    ("/length-for-head", 500, "text/plain; charset=utf-8", b"500 Internal Server Error\n"),
])
def test_return_values(port, path, status, ctype, body, caplog):
    r = request(port, get(path))
    assert (r.status, r.header("content-type"), r.body) == (status, ctype, body)
    if status == 500:
        why = {"/bad-return": "float", "/interim": "200..599", "/late-body": "int",
               "/nan": "JSON", "/ctl-header": "X-A",
               "/server-twice": "header 'server' given twice",
               "/204-body": "a 204 response cannot have a body",
               "/length-wrong": "Content-Length 5 does not match the body's 4 bytes",
               "/length-bad": "invalid Content-Length '+4'",
               "/length-for-head": "Content-Length 1234 does not match the body's 0 bytes",
               }[path]
        assert any(why in rec.getMessage() or why in (rec.exc_text or "")
                   for rec in caplog.records), [rec.getMessage() for rec in caplog.records]
    if status == 204:
        assert r.header("content-length") is None
    if path == "/created":
        assert r.header("x-a") == "1"
    # The handler's own Server replaces the engine's, which every other answer carries (a 500
    # too: the refused answer's Server is gone with it).
    assert r.raw_head.lower().count(b"\r\nserver:") == 1
    assert r.header("server") == ("a" if path == "/server-header" else "cyserve")


def test_static_route_with_its_own_server(port):
    # A static route's Server replaces the engine's in its pre-built head, keep-alive or not.
    for req in (get("/static-server"), b"GET /static-server HTTP/1.0\r\n\r\n"):
        r = request(port, req)
        assert (r.status, r.body, r.header("server")) == (404, b"gone", "mine/2")
        assert r.raw_head.startswith(b"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n")
        assert r.raw_head.lower().count(b"\r\nserver:") == 1


def test_head_announces_the_length_an_empty_response_gives(port):
    r = request(port, b"HEAD /length-for-head HTTP/1.1\r\nHost: t\r\n\r\n")
    assert (r.status, r.header("content-length"), r.header("content-type")) == (200, "1234",
                                                                                "text/x")
    r = request(port, b"HEAD /length-ok HTTP/1.1\r\nHost: t\r\n\r\n")
    assert (r.status, r.header("content-length")) == (200, "4")


def test_response_checks_what_is_set() -> None:
    r = Response("x")
    with pytest.raises(TypeError, match="body must be bytes or str, not int"):
        r.body = 5
    for bad in (100, 101, 199, 600, 999):
        with pytest.raises(ValueError, match="final status in 200..599"):
            Response("x", status=bad)
        with pytest.raises(ValueError, match="final status"):
            r.status = bad
    with pytest.raises(TypeError, match="status must be an int"):
        r.status = "200"
    r.status, r.body = 404, b"gone"
    assert (r.status, r.body) == (404, b"gone")


def test_content_length_body_split(port):
    with Conn(port) as c:
        c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n01")
        time.sleep(0.05)
        c.send(b"2345")
        time.sleep(0.05)
        c.send(b"6789" + get("/py"))
        r = c.reply()
        assert (r.status, r.body, r.header("x-method")) == (200, b"0123456789", "POST")
        assert c.reply().body == b"Hello, World!"


def test_chunked_upload_split_at_odd_places(port):
    body = b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n"
    head = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    cuts = [0, 3, 9, 13, 17, 20, 25, 31, 40, 45, len(body)]  # inside sizes, CRLFs, data, trailer
    with Conn(port) as c:
        c.send(head)
        for a, b in zip(cuts, cuts[1:]):
            time.sleep(0.01)
            c.send(body[a:b])
        r = c.reply()
        assert (r.status, r.body) == (200, b"hello 0123456789")


def test_chunked_upload_byte_by_byte_then_next_request(port):
    body = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    data = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + body + \
        get("/pre/next")
    with Conn(port) as c:
        for i in range(len(data)):
            c.send(data[i:i + 1])
        assert c.reply().body == b"abcde"
        assert c.reply().body == b"prefix /pre/next"


def test_large_bodies_both_ways():
    # Bodies far beyond the connection's initial 4 KiB buffer: the buffer grows (moving the
    # parsed head, whose views must follow) and the response goes out by writev.
    big = bytes(range(256)) * 2000  # 512,000 bytes
    routes = ROUTES + [("path", "/big", None, "python", lambda req: big)]
    with serving(routes, threads=2) as srv:
        with Conn(srv.port) as c:
            c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(big))
            c.send(big)
            r = c.reply()
            assert (r.status, r.header("x-method"), r.header("x-len")) == (200, "POST", "512000")
            assert r.body == big
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(big[i:i + 7000]), big[i:i + 7000])
                              for i in range(0, len(big), 7000))
            c.send(b"PUT /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" +
                   chunks + b"0\r\n\r\n")
            r = c.reply()
            assert (r.status, r.header("x-method"), r.body == big) == (200, "PUT", True)
            c.send(get("/big"))
            assert c.reply().body == big


def test_expect_100_continue(port):
    with Conn(port) as c:
        c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n"
               b"Expect: 100-continue\r\n\r\n")
        interim = c.read_until(b"\r\n\r\n")
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        c.send(b"data")
        r = c.reply()
        assert (r.status, r.body) == (200, b"data")


@pytest.mark.parametrize("target,status", [
    (b"/nowhere", 404), (b"/plaintext", 405),
], ids=["no-route", "method-not-allowed"])
def test_expect_100_continue_is_answered_after_routing(port, target, status):
    # The final answer comes instead of 100 Continue, so the client never uploads for nothing;
    # the body it did not send is not waited for, and the connection closes after the answer.
    with Conn(port) as c:
        c.send(b"POST " + target + b" HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n"
               b"Expect: 100-continue\r\n\r\n")
        r = c.reply()
        assert (r.status, r.header("connection")) == (status, "close")
        assert c.is_closed()


def test_expect_100_continue_not_sent_when_body_is_there(port):
    with Conn(port) as c:
        c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n"
               b"Expect: 100-continue\r\n\r\ndata")
        r = c.reply()
        assert (r.status, r.body) == (200, b"data")


def test_head_has_get_headers_and_no_body(port):
    with Conn(port) as c:
        c.send(get("/py"))
        g = c.reply()
        c.send(b"HEAD /py HTTP/1.1\r\nHost: t\r\n\r\n")
        h = c.reply(head_only=True)
        assert h.status == 200
        assert h.header("content-length") == g.header("content-length") == "13"
        assert h.header("content-type") == g.header("content-type")
        c.send(b"HEAD /plaintext HTTP/1.1\r\nHost: t\r\n\r\n")
        h2 = c.reply(head_only=True)
        assert h2.header("content-length") == "13"
        # Had any body bytes followed a HEAD reply, this reply would not parse.
        c.send(get("/plaintext"))
        assert c.reply().body == b"Hello, World!"


def test_http10_closes_by_default_and_keeps_alive_on_request(port):
    with Conn(port) as c:
        c.send(b"GET /py HTTP/1.0\r\n\r\n")
        r = c.reply()
        assert (r.status, r.header("connection")) == (200, "close")
        assert c.is_closed()
    with Conn(port) as c:
        c.send(b"GET /py HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        r = c.reply()
        assert r.header("connection") == "keep-alive"
        c.send(b"GET /plaintext HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert c.reply().body == b"Hello, World!"


def test_connection_close_honoured(port):
    with Conn(port) as c:
        c.send(get("/py", extra="Connection: close\r\n") + get("/py"))
        r = c.reply()
        assert r.header("connection") == "close"
        assert c.is_closed()


@pytest.mark.parametrize("raw,status", [
    (b"GET /py HTTP/1.1\r\n\r\n", 400),  # no Host in HTTP/1.1
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
     400),
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1x\r\n\r\n", 400),
    (b"GET /py HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n  folded\r\n\r\n", 400),
    (b"GET /py HTTP/1.1\r\nHost : t\r\n\r\n", 400),
    (b"GET /py HTTP/1.1\r\nHost: t\rX: y\r\n\r\n", 400),
    (b"G\x00T /py HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: snappy, chunked\r\n\r\n", 501),
    (b"GET /py HTTP/2.0\r\nHost: t\r\n\r\n", 505),
    (b"GET /" + b"a" * 300 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414),
    (b"GET /py HTTP/1.1\r\nHost: t\r\nX-Big: " + b"b" * 2000 + b"\r\n\r\n", 431),
    (b"GET /py HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(30)) +
     b"\r\n", 431),
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n", 413),
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2000\r\n" +
     b"z" * 0x2000 + b"\r\n0\r\n\r\n", 413),
    (b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
], ids=["no-host", "cl-and-te", "two-cl", "bad-cl", "obs-fold", "space-before-colon", "bare-cr",
        "nul-in-method", "unknown-te", "http2", "long-target", "big-header", "many-headers",
        "body-over-limit", "chunked-over-limit", "bad-chunk-size"])
def test_rejections_answer_and_close(port, raw, status):
    with Conn(port) as c:
        c.send(raw)
        r = c.reply()
        assert r.status == status, r.body
        assert r.header("connection") == "close"
        assert r.body.startswith(str(status).encode())
        assert c.is_closed()


def test_a_chunk_announced_over_the_limit_is_refused_at_once(port):
    # The limit is 4096 bytes; the chunk-size line alone says the body is over it. The server
    # must not wait for (or read) 4096 bytes of it first.
    with Conn(port) as c:
        c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
               b"Expect: 100-continue\r\n\r\n")
        assert c.reply(head_only=True).status == 100
        c.send(b"FFFFFF\r\nabc")
        r = c.reply()
        assert (r.status, r.header("connection")) == (413, "close")


@pytest.mark.parametrize("raw,status", [
    (b"HEAD /py HTTP/1.1\r\n\r\n", 400),
    (b"HEAD /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n", 413),
    (b"HEAD /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
], ids=["no-host", "body-over-limit", "unknown-te"])
def test_rejections_of_head_have_no_body(port, raw, status):
    with Conn(port) as c:
        c.send(raw)
        r = c.reply(head_only=True)
        assert (r.status, r.header("connection")) == (status, "close")
        assert c.buf == b"" and c.sock.recv(100) == b""  # no body after the head, then the close


def test_default_limits_say_414_for_a_long_target():
    # Default limits: 8192 bytes for the target and for the head, so a long target also
    # overflows the head; it is still the target that is too long (RFC 9112 3: MUST be 414).
    with serving(ROUTES) as srv, Conn(srv.port) as c:
        c.send(b"GET /" + b"a" * 8192 + b" HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply()
        assert (r.status, r.header("connection")) == (414, "close")
        assert c.is_closed()


@pytest.mark.parametrize("target,body", [
    (b"http://h.example", b"root / "),
    (b"http://h.example?q=1", b"root / q=1"),
    (b"HTTP://h.example:80/?q", b"root / q"),
])
def test_absolute_form_with_an_empty_path_is_the_root(port, target, body):
    # RFC 9110 4.2.3: an empty path is "/", on the coroutine path and on the inline one.
    with Conn(port) as c:
        for _ in range(2):
            c.send(b"GET " + target + b" HTTP/1.1\r\nHost: h.example\r\n\r\n")
            assert c.reply().body == body


def test_404_and_405_keep_the_connection(port):
    with Conn(port) as c:
        c.send(get("/nowhere"))
        r = c.reply()
        assert r.status == 404
        c.send(get("/only-post"))
        r = c.reply()
        assert r.status == 405
        assert r.header("allow") == "POST"
        c.send(b"DELETE /plaintext HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply()
        assert (r.status, r.header("allow")) == (405, "GET, HEAD")
        c.send(get("/py"))
        assert c.reply().status == 200


def test_handler_exception_gives_500_and_server_keeps_serving(port, caplog):
    with caplog.at_level("ERROR", logger="cyserve.error"):
        with Conn(port) as c:
            c.send(get("/boom"))
            r = c.reply()
            assert r.status == 500
            c.send(get("/py"))
            assert c.reply().body == b"Hello, World!"
    assert any("handler failure on purpose" in (rec.exc_text or "") or
               (rec.exc_info and "handler failure" in str(rec.exc_info[1]))
               for rec in caplog.records)


def test_request_object_expires_after_the_handler():
    kept = []
    routes = [("path", "/keep", None, "python", lambda req: kept.append(req) or req.method)]
    with serving(routes, threads=1) as srv:
        assert request(srv.port, get("/keep")).body == b"GET"
    assert kept[0].method == "GET"  # read during the call: cached
    with pytest.raises(RuntimeError):
        kept[0].body


def test_header_slowloris_gets_408():
    with serving(ROUTES, threads=1, header_timeout=0.5) as srv:
        with Conn(srv.port) as c:
            data = get("/py")
            for b in data[:-4]:
                try:
                    c.send(bytes([b]))
                except OSError:
                    break
                time.sleep(0.1)
                if c.buf or _readable(c.sock):
                    break
            r = c.reply()
            assert r.status == 408
            assert c.is_closed()


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def test_idle_keep_alive_connection_is_closed():
    with serving(ROUTES, threads=1, keepalive_timeout=0.3) as srv:
        with Conn(srv.port) as c:
            c.send(get("/py"))
            assert c.reply().status == 200
            # Blocks until the server closes the idle connection (socket timeout: 10 s).
            assert c.is_closed()
        assert _wait_for(lambda: srv.live_connections == 0)


def test_stray_crlf_after_a_request_leaves_the_connection_idle():
    # Clients send a CRLF after a POST body now and then (RFC 9112 2.2 lets a server ignore
    # it). It used to start a head deadline: 408 "request head not received" for a request
    # nobody sent, instead of the quiet keep-alive close. The head deadline is far from the
    # keep-alive timeout, so that a loaded machine's delays cannot blur the two.
    with serving(ROUTES, threads=1, keepalive_timeout=0.3, header_timeout=6.0) as srv:
        with Conn(srv.port) as c:
            c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi\r\n")
            assert c.reply().body == b"hi"
            t0 = time.monotonic()
            assert c.is_closed() and c.buf == b""
            assert time.monotonic() - t0 < 4.0  # the keep-alive timeout, not the head deadline
    # The CRLF alone, after the connection went idle, on a server whose keep-alive timeout this
    # client's pauses cannot reach (0.3 s left a loaded machine 0.2 s to send all of it).
    with serving(ROUTES, threads=1) as srv:
        with Conn(srv.port) as c:
            c.send(get("/py"))
            assert c.reply().status == 200
            time.sleep(0.05)
            c.send(b"\r\n")
            time.sleep(0.05)
            c.send(get("/py"))  # and a request after it is served
            assert c.reply().body == b"Hello, World!"


def test_silent_connection_is_closed():
    with serving(ROUTES, threads=1, keepalive_timeout=0.3) as srv:
        with Conn(srv.port) as c:
            assert c.is_closed()  # never sent a byte: closed by the keep-alive timer


def test_slow_but_steady_body_is_not_cut():
    # Progress restarts body_timeout; the minimum rate (below) is turned off for this one.
    # body_timeout is well above the pause, which a loaded machine may stretch.
    with serving(ROUTES, threads=1, body_timeout=1.0, min_body_rate=0) as srv:
        with Conn(srv.port) as c:
            c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 12\r\n\r\n")
            for i in range(12):  # 12 x 0.15 s: longer than body_timeout in total
                time.sleep(0.15)
                c.send(b"%x" % i)
            r = c.reply()
            assert (r.status, r.body) == (200, b"0123456789ab")


def test_body_below_the_minimum_rate_gets_408():
    # A byte every 0.15 s restarts body_timeout each time, but averages far below
    # min_body_rate once body_timeout (the grace) has passed: 408, as Apache's MinRate.
    with serving(ROUTES, threads=1, body_timeout=1.0, min_body_rate=100) as srv:
        with Conn(srv.port) as c:
            c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
            t0 = time.monotonic()
            try:
                for _ in range(40):
                    time.sleep(0.15)
                    c.send(b"x")
            except OSError:
                pass
            r = c.reply()
            assert (r.status, r.body) == (408, b"408 Request Timeout: request body too slow\n")
            assert time.monotonic() - t0 < 4.0


def test_bodies_past_the_budget_wait_unread_then_go_on():
    # A budget for one body: the second waits (its bytes stay in the kernel) until the first
    # is answered, then is read and answered too.
    with serving(ROUTES, threads=1, body_budget=60_000, body_timeout=5.0) as srv:
        with Conn(srv.port) as a, Conn(srv.port) as b:
            a.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 50000\r\n\r\n")
            a.send(b"a" * 1000)
            time.sleep(0.5)  # a holds 50,000 of the budget now
            b.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 50000\r\n\r\n")
            b.send(b"b" * 50000)
            b.sock.settimeout(0.5)
            with pytest.raises(TimeoutError):  # b waits: nothing comes back yet
                b.sock.recv(1)
            b.sock.settimeout(10)
            a.send(b"a" * 49000)
            assert a.reply().body == b"a" * 50000
            assert b.reply().body == b"b" * 50000


def test_a_body_that_waits_past_body_timeout_for_the_budget_gets_503():
    # a holds the budget while b waits for it past body_timeout. body_timeout is far above a's
    # pauses between bytes (0.1 s), which a loaded machine may stretch: a's body timing out
    # first would free the budget for b.
    with serving(ROUTES, threads=1, body_budget=60_000, body_timeout=2.0,
                 min_body_rate=0) as srv:
        with Conn(srv.port) as a, Conn(srv.port) as b:
            a.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 50000\r\n"
                   b"Expect: 100-continue\r\n\r\n")
            # The only worker sends 100 Continue and takes a's share of the budget before it
            # can read anything of b's: b comes second, however late the worker gets to a.
            assert a.reply(head_only=True).status == 100
            b.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 50000\r\n\r\n")
            b.send(b"b" * 100)
            deadline = time.monotonic() + 30
            while not select.select([b.sock], [], [], 0.1)[0] and time.monotonic() < deadline:
                a.send(b"a")  # keeps a's body alive (progress within body_timeout)
            r = b.reply()
            assert (r.status, r.header("connection")) == (503, "close")


def test_stalled_body_gets_408():
    with serving(ROUTES, threads=1, body_timeout=0.3) as srv:
        with Conn(srv.port) as c:
            c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 12\r\n\r\nab")
            r = c.reply()
            assert r.status == 408
            assert c.is_closed()


@pytest.mark.timeout(60)
def test_shutdown_lets_in_flight_request_finish_and_closes_idle_at_once():
    srv = Server(ROUTES, host="127.0.0.1", port=0, threads=2)
    srv.start()
    idle = [Conn(srv.port) for _ in range(5)]
    for c in idle:
        c.send(get("/plaintext"))
        assert c.reply().status == 200
    busy = Conn(srv.port)
    slow_entered.clear()
    slow_release.clear()
    busy.send(get("/slow"))
    assert slow_entered.wait(10)  # the handler runs now, until released
    stopper = threading.Thread(target=srv.stop, kwargs={"grace": 30.0})
    stopper.start()
    # The stop has begun once it closes an idle connection: only then may the handler end.
    stop_began = _wait_for(lambda: srv.live_connections < len(idle) + 1)
    slow_release.set()
    assert stop_began, "no idle connection closed while a request was in flight"
    r = busy.reply()
    assert (r.status, r.body, r.header("connection")) == (200, b"slow done", "close")
    for c in idle:
        assert c.is_closed()
        c.close()
    busy.close()
    # With grace=30 this join only returns early because nothing is left in flight.
    stopper.join()
    assert not srv.running
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=2).close()
    srv.stop()  # idempotent


def test_shutdown_answers_a_request_that_already_arrived():
    # One worker, busy in a Python handler; meanwhile an idle keep-alive connection sends its next
    # request, which the kernel holds. Shutdown used to close that connection as idle, over the
    # unread request (a reset, the request lost); it must be answered, with Connection: close.
    # No relief threads: with them the worker's loop is taken over and the request answered at
    # once (tests/e2e/test_blocking_handlers.py); this is the case where none is left.
    srv = Server(ROUTES, host="127.0.0.1", port=0, threads=1, blocking_threads=0)
    srv.start()
    try:
        waiting = Conn(srv.port)
        waiting.send(get("/py"))
        assert waiting.reply().status == 200
        busy = Conn(srv.port)
        slow_entered.clear()
        slow_release.clear()
        busy.send(get("/slow"))
        assert slow_entered.wait(10)  # the only worker is in the handler now, until released
        waiting.send(get("/py"))
        time.sleep(0.1)
        stopping = threading.Event()

        def stop() -> None:
            stopping.set()
            srv.stop(grace=30.0)

        stopper = threading.Thread(target=stop)
        stopper.start()
        # The handler may end once the stop has begun. Nothing shows that while the only worker
        # is in the handler; the stop's first step (the server marked draining) follows the call
        # at once, and 1 s leaves it room on a loaded machine where 0.4 s once had to hold the
        # whole way from the handler's start.
        assert stopping.wait(10)
        time.sleep(1.0)
        slow_release.set()
        r = waiting.reply()
        assert (r.status, r.body, r.header("connection")) == (200, b"Hello, World!", "close")
        assert waiting.is_closed()
        assert busy.reply().body == b"slow done"
        stopper.join()
        waiting.close()
        busy.close()
    finally:
        slow_release.set()
        srv.stop()


@pytest.mark.timeout(60)
def test_shutdown_cancels_what_outlives_the_grace_period():
    srv = Server(ROUTES, host="127.0.0.1", port=0, threads=2)
    srv.start()
    with Conn(srv.port) as stuck:
        stuck.send(b"GET /py HTTP/1.1\r\nHost: t\r\n")  # a head that never completes
        time.sleep(0.1)
        srv.stop(grace=0.3)  # with a 10 s header timeout, only the cancel ends this request
        assert not srv.running
        assert stuck.is_closed()


def test_stop_from_a_handler_is_refused():
    holder = {}

    def stopper(req):
        try:
            holder["srv"].stop()
        except RuntimeError as exc:
            return str(exc)
        return "stopped?"

    with serving([("path", "/stop", None, "python", stopper)], threads=1) as srv:
        holder["srv"] = srv
        r = request(srv.port, get("/stop"))
        assert r.status == 200 and b"cannot be called from a handler" in r.body
        assert srv.running


def test_port_in_use_raises_oserror():
    with serving(ROUTES, threads=1) as srv:
        other = Server(ROUTES, host="127.0.0.1", port=srv.port, threads=1)
        with pytest.raises(OSError) as exc:
            other.start()
        assert "in use" in str(exc.value)
        assert not other.running


def test_unknown_host_raises_oserror():
    srv = Server(ROUTES, host="no-such-host.invalid", port=0, threads=1)
    with pytest.raises(OSError):
        srv.start()


@pytest.mark.parametrize("route,exc", [
    (("path", "no-slash", None, "python", str), ValueError),
    (("path", "/x", None, "python", 42), TypeError),
    (("path", "/x", None, "nogil", object()), TypeError),
    (("path", "/x", None, "static", (200, [("Bad Name", "v")], b"")), ValueError),
    (("path", "/x", None, "static", (200, [("X", "a\r\nb")], b"")), ValueError),
    (("path", "/x", ("FETCH",), "python", str), ValueError),
    (("glob", "/x", None, "python", str), ValueError),
    (("path", "/x", None, "teleport", str), ValueError),
    (("regex", "/x(", None, "python", str), ValueError),
    (("path", "/x", None, "files", "/no/such/dir"), ValueError),
])
def test_bad_routes_are_rejected(route, exc):
    with pytest.raises(exc) as info:
        Server([route], host="127.0.0.1", port=0, threads=1)
    assert repr(route[1]) in str(info.value) or route[1] in str(info.value)


def _wait_for(pred, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_server_refuses_timeouts_its_clock_cannot_hold():
    # keepalive_timeout=1e12 became 0 ns after the cast: every keep-alive connection was closed
    # at once, and a split head got 408 at once.
    for name in ("keepalive_timeout", "header_timeout", "body_timeout"):
        with pytest.raises(ValueError, match=f"{name} must be > 0 and at most 1e9 seconds"):
            Server(ROUTES, host="127.0.0.1", port=0, threads=1, **{name: 1e12})


def test_headers_mapping_joins_and_keys() -> None:
    h = Headers([("cookie", "a=1"), ("x", "1"), ("cookie", "b=2"), ("x", "2")])
    # Cookie lines join with "; " (RFC 6265 5.4): ", " made http.cookies read a="1,".
    assert h["Cookie"] == "a=1; b=2" and h["X"] == "1, 2"
    with pytest.raises(KeyError):
        h[1]  # a KeyError, as any mapping gives, not an AttributeError from .lower()
    assert h.get(1, "d") == "d" and 1 not in h
