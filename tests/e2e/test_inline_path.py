"""The inline path (csrc/http1_inline.c): a lone, complete, bodiless keep-alive request
for a static response or a GIL-free handler is answered on the worker's loop without a
coroutine. Its answers must be byte for byte those of the coroutine path (which pipelined
requests still take), an answer the socket will not take whole must still arrive whole, and a
GIL-free route must earn the path (quick calls) and lose it (slow ones). Server.stats() tells
which path a request took: "inline" counts inline answers, "spawned" coroutines."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from _cython_ext import build_user_module
from _rawhttp import Conn, Reply, get, serving
from cyserve._core import Server

pytestmark = pytest.mark.native

TESTS = Path(__file__).parent.parent
LEARN = 64  # INLINE_LEARN in csrc/http1_inline.h
BIG = bytes(range(256)) * 11 + b"tail"  # 2,820 bytes: the answer still fits one read buffer


@pytest.fixture(scope="module")
def hello(tmp_path_factory):
    return build_user_module(TESTS / "cython_ext" / "hello.pyx",
                             tmp_path_factory.mktemp("cython_ext"))


def static_routes():
    return [
        ("path", "/plaintext", None, "static",
         (200, [("Content-Type", "text/plain"), ("X-Extra", "1")], b"Hello, World!")),
        ("path", "/big", None, "static",
         (200, [("Content-Type", "application/octet-stream")], BIG)),
        ("path", "/gone", None, "static", (410, [], b"")),
    ]


def same(a: Reply, b: Reply) -> bool:
    """Equal but for the Date field, which may tick between the two."""
    da, db = dict(a.headers), dict(b.headers)
    da.pop("date"), db.pop("date")
    return (a.status, a.reason, da, a.body) == (b.status, b.reason, db, b.body)


def inline_then_coroutine(srv, req: bytes, head_only: bool = False) -> tuple[Reply, Reply]:
    """req answered alone (inline), then twice in one write (pipelined: the coroutine)."""
    with Conn(srv.port) as c:
        c.send(get("/plaintext"))  # the connection is open and idle before counting
        c.reply()
        before = srv.stats()["inline"]
        c.send(req)
        alone = c.reply(head_only)
        assert srv.stats()["inline"] == before + 1, "the lone request was not answered inline"
        c.send(req + req)
        first, second = c.reply(head_only), c.reply(head_only)
        assert srv.stats()["inline"] == before + 1, "a pipelined request was answered inline"
        assert same(first, second)
        return alone, first


def test_keepalive_requests_are_answered_without_a_coroutine():
    with serving(static_routes(), threads=1) as srv, Conn(srv.port) as c:
        c.send(get("/plaintext"))
        assert c.reply().body == b"Hello, World!"
        st0 = srv.stats()
        for _ in range(200):
            c.send(get("/plaintext"))
            r = c.reply()
            assert (r.status, r.body) == (200, b"Hello, World!")
        st1 = srv.stats()
        assert st1["inline"] - st0["inline"] == 200
        assert st1["spawned"] == st0["spawned"]


def test_stats_after_and_during_stop():
    # stats() read the workers' array that stop() frees: after stop() it crashed the process
    # (SIGSEGV), and while stop() ran on another thread it could read freed memory.
    srv = Server(static_routes(), host="127.0.0.1", port=0, threads=2)
    srv.start()
    with Conn(srv.port) as c:
        for _ in range(5):
            c.send(get("/plaintext"))
            assert c.reply().status == 200
    during: list[dict[str, int]] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            during.append(srv.stats())

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        srv.stop(grace=0.2)
    finally:
        done.set()
        poller.join()
    after = srv.stats()
    assert after == {"live": 0, "inline": after["inline"], "spawned": after["spawned"]}
    assert after["inline"] >= 4  # what the run counted is kept
    assert during and all(d["inline"] <= after["inline"] for d in during)


@pytest.mark.parametrize("req, head_only", [
    (get("/plaintext"), False),
    (b"HEAD /plaintext HTTP/1.1\r\nHost: t\r\n\r\n", True),
    (b"GET /plaintext HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", False),
    (get("/big", extra="X-A: b\r\n"), False),
    (get("/gone?q=1"), False),
])
def test_static_answers_match_the_coroutine_path(req, head_only):
    with serving(static_routes(), threads=1) as srv:
        alone, piped = inline_then_coroutine(srv, req, head_only)
        assert same(alone, piped)
        if b"HTTP/1.0" in req:
            assert alone.header("connection") == "keep-alive"


def test_what_the_inline_path_leaves_to_the_coroutine():
    with serving(static_routes(), threads=1) as srv:
        cases = [
            get("/nowhere"),                                    # 404
            b"POST /plaintext HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nab",  # a body
            b"GET /plaintext HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",     # closing
            b"GET /plaintext HTTP/1.1\r\n\r\n",                 # 400: no Host
        ]
        for req in cases:
            before = srv.stats()["inline"]
            with Conn(srv.port) as c:
                c.send(req)
                r = c.reply()
                assert r.status in (200, 400, 404), r
            assert srv.stats()["inline"] == before, req


def shrink_server_side(client: socket.socket) -> None:
    """The server runs in this process: find its end of client's connection among our own fds
    and give it the smallest send buffer the kernel allows, so that a few answers fill it."""
    want = (client.getpeername(), client.getsockname())
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = os.dup(int(name))
        except OSError:
            continue  # the listing's own descriptor, closed by now
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)  # not a socket
            continue
        with s:
            try:
                if (s.getsockname(), s.getpeername()) == want:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                    return
            except OSError:
                continue
    raise AssertionError("the server's end of the connection was not found")


def test_an_answer_the_socket_will_not_take_whole_is_finished_by_the_coroutine():
    # The client reads nothing until the end, and both ends' buffers are small: after a few
    # answers the server's send takes part of one, or nothing. Each request goes alone (a pause
    # between them), so they are answered inline until one is cut; the coroutine sends its rest,
    # then serves what follows. Every answer must arrive whole and in order.
    n = 40
    with serving(static_routes(), threads=1) as srv:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each request goes alone
        sock.connect(("127.0.0.1", srv.port))
        sock.settimeout(10)
        c = Conn.__new__(Conn)
        c.sock, c.buf = sock, b""
        with c:
            c.send(get("/plaintext"))
            c.reply()
            shrink_server_side(sock)
            st0 = srv.stats()
            for i in range(n):
                c.send(get("/big" if i % 2 == 0 else "/plaintext"))
                time.sleep(0.005)
            for i in range(n):
                r = c.reply()
                assert (r.status, r.body) == (200, BIG if i % 2 == 0 else b"Hello, World!"), i
            st1 = srv.stats()  # once every answer is in: the server may lag behind the sends
        assert st1["inline"] - st0["inline"] >= 2, "nothing was answered inline"
        assert st1["spawned"] > st0["spawned"], "no answer was left to the coroutine"


def nogil_server(hello, threads=1):
    return serving([
        ("path", "/", None, "nogil", hello.ROOT),
        ("path", "/fibonacci", None, "nogil", hello.FIBONACCI),
        ("path", "/inspect/{id:int}", None, "nogil", hello.INSPECT),
        ("path", "/fail", None, "nogil", hello.FAIL),
        ("path", "/maybe", None, "nogil", hello.MAYBE),
        ("path", "/big", None, "nogil", hello.BIG_STATIC),
        ("path", "/own-server", None, "nogil", hello.OWN_SERVER),
        ("path", "/no-content-body", None, "nogil", hello.NO_CONTENT_BODY),
    ], threads=threads)


def calls(c: Conn, path: str, k: int) -> list[Reply]:
    out = []
    for _ in range(k):
        c.send(get(path))
        out.append(c.reply())
    return out


def test_a_nogil_route_runs_inline_after_its_learning_calls(hello):
    with nogil_server(hello) as srv, Conn(srv.port) as c:
        before = srv.stats()["inline"]
        assert [r.body for r in calls(c, "/", LEARN)] == [b"Hello, World!"] * LEARN
        assert srv.stats()["inline"] == before, "inline before the route was learnt"
        calls(c, "/", 20)
        # A learning call preempted in the middle counts as slow and is not counted as quick,
        # which only delays the switch by a call or two.
        assert srv.stats()["inline"] - before >= 15


@pytest.mark.parametrize("req, head_only", [
    (get("/inspect/42?a=b", extra="X-Test: v1\r\n"), False),
    (b"HEAD /inspect/7 HTTP/1.1\r\nHost: t\r\n\r\n", True),
    (get("/fail"), False),
    (b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", False),
    (get("/own-server"), False),
    (get("/no-content-body"), False),
])
def test_nogil_answers_match_the_coroutine_path(hello, req, head_only):
    with nogil_server(hello) as srv:
        with Conn(srv.port) as c:  # learn every route the requests use
            for path in ("/", "/inspect/1", "/fail", "/own-server", "/no-content-body"):
                calls(c, path, LEARN + 8)
        alone, piped = inline_then_coroutine(srv, req, head_only)
        assert same(alone, piped)
        if b"/fail" in req or b"/no-content-body" in req:
            assert alone.status == 500  # a 204 with a body is the handler's failure too
        # One Server line on both paths: the handler's where it set one, else the engine's.
        for r in (alone, piped):
            assert r.raw_head.lower().count(b"\r\nserver:") == 1
            if b"/own-server" in req:
                assert (r.header("server"), r.body) == ("hello-nogil", b"rc=0,-17")
            else:
                assert r.header("server") == "cyserve"


def test_a_slow_route_never_runs_inline(hello):
    with nogil_server(hello) as srv, Conn(srv.port) as c:
        before = srv.stats()["inline"]
        rs = calls(c, "/fibonacci", LEARN + 16)
        assert {r.body for r in rs} == {b"Fibonacci(10^6) = 1884755131 (with overflow)\n"}
        assert srv.stats()["inline"] == before


def test_a_large_body_sends_a_route_back_to_coroutines(hello):
    # 150,000 bytes: the coroutine sends it without a copy; the inline path would copy it.
    with nogil_server(hello) as srv, Conn(srv.port) as c:
        before = srv.stats()["inline"]
        for r in calls(c, "/big", LEARN + 8):
            assert len(r.body) == 150000
        assert srv.stats()["inline"] == before


def test_isolated_slow_calls_keep_the_path_and_a_streak_of_them_loses_it(hello):
    with nogil_server(hello) as srv, Conn(srv.port) as c:
        calls(c, "/maybe", LEARN + 8)
        inline = lambda: srv.stats()["inline"]  # noqa: E731
        n0 = inline()
        assert calls(c, "/maybe?30", 1)[0].body == b"slow"  # one slow call (30 ms), inline
        calls(c, "/maybe", 5)
        assert inline() - n0 == 6, "one slow call cost the route its inline path"
        n1 = inline()
        for _ in range(3):  # INLINE_SLOW_STREAK slow calls in a row: run inline, then the verdict
            assert calls(c, "/maybe?30", 1)[0].body == b"slow"
        assert inline() - n1 == 3
        calls(c, "/maybe", 10)
        assert inline() - n1 == 3, "the route still runs inline after a streak of slow calls"


def test_a_full_read_after_an_inline_answer_still_reads_the_rest():
    # An inline answer leaves the connection idle; the next readiness brings more than one read
    # buffer (4 KiB) of pipelined requests, the first ones ending exactly at 4,096 bytes. The
    # coroutine that takes over must read the rest from the socket, not take the socket for
    # drained because the previous, inline read was short.
    with serving(static_routes(), threads=1) as srv, Conn(srv.port, timeout=5) as c:
        c.send(get("/plaintext"))
        assert c.reply().body == b"Hello, World!"
        one = get("/plaintext", extra="X-Pad: " + "p" * 200 + "\r\n")
        k, rest = divmod(4096, len(one))
        batch = one * (k - 1) + get("/plaintext", extra="X-Pad: " + "p" * (200 + rest) + "\r\n")
        assert len(batch) == 4096
        c.send(batch + get("/plaintext"))
        for _ in range(k + 1):
            assert c.reply().body == b"Hello, World!"


def test_a_route_registered_with_inline_false_never_runs_inline(hello):
    routes = [("path", "/", None, "nogil", (hello.ROOT, None, False)),
              ("path", "/on", None, "nogil", hello.ROOT)]
    with serving(routes, threads=1) as srv, Conn(srv.port) as c:
        before = srv.stats()["inline"]
        assert {r.body for r in calls(c, "/", LEARN + 16)} == {b"Hello, World!"}
        assert srv.stats()["inline"] == before
        calls(c, "/on", LEARN + 16)  # the same handler on a default route does
        assert srv.stats()["inline"] - before >= 10


def test_a_malformed_nogil_target_is_refused(hello):
    import cyserve._core
    with pytest.raises(TypeError, match=r"\(capsule, ctx, inline: bool\)"):
        cyserve._core.Server([("path", "/", None, "nogil", (hello.ROOT, None, "yes"))],
                             host="127.0.0.1", port=0, threads=1)


def python_routes():
    return [("path", "/py", None, "python", lambda req: b"from python"),
            ("path", "/echo", ("POST",), "python", lambda req: req.body)]


@pytest.mark.parametrize("with_static", [False, True], ids=["python-only", "with-static"])
def test_python_routes_are_read_inline_and_served_by_the_coroutine(with_static):
    # A server without a static or GIL-free route only reads on the inline path
    # (server_config.inline_routes): the bytes it read must reach the coroutine whole, whatever
    # they are. The same requests on a server that also has a static route, which parses and
    # routes them inline first, must get the same answers.
    routes = python_routes() + (static_routes() if with_static else [])
    with serving(routes, threads=1) as srv, Conn(srv.port, timeout=5) as c:
        for _ in range(3):  # lone keep-alive requests
            c.send(get("/py"))
            assert c.reply().body == b"from python"
        head = get("/py")
        c.send(head[:10])  # a head in two reads: the first one is not a request yet
        time.sleep(0.05)
        c.send(head[10:])
        assert c.reply().body == b"from python"
        c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nab")
        assert c.reply().body == b"ab"
        c.send(b"\r\n")  # the stray CRLF a client may send after a body: not a request
        c.send(get("/py") + get("/nowhere"))  # pipelined
        assert c.reply().body == b"from python"
        assert c.reply().status == 404
        if with_static:
            before = srv.stats()["inline"]
            c.send(get("/plaintext"))
            assert c.reply().body == b"Hello, World!"
            assert srv.stats()["inline"] == before + 1, "the static route lost the inline path"
        else:
            assert srv.stats()["inline"] == 0
