"""GIL-free handlers from a separately compiled Cython module: tests/cython_ext/hello.pyx is
built against the installed package (cimport cyserve._core, include_dirs=[get_include()]) into a
temporary folder, then served through Server."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import cyserve
from _cython_ext import build_user_module
from _rawhttp import Conn, get, request, serving

pytestmark = pytest.mark.native

TESTS = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def hello(tmp_path_factory):
    return build_user_module(TESTS / "cython_ext" / "hello.pyx",
                             tmp_path_factory.mktemp("cython_ext"))


@pytest.fixture(scope="module")
def port(hello):
    routes = [
        ("path", "/", ("GET",), "nogil", hello.ROOT),
        ("path", "/fibonacci", ("GET",), "nogil", hello.FIBONACCI),
        ("path", "/inspect/{id:int}", None, "nogil", hello.INSPECT),
        ("path", "/fail", None, "nogil", hello.FAIL),
        ("path", "/fail-closing", None, "nogil", hello.FAIL_CLOSING),
        ("path", "/no-content-body", None, "nogil", hello.NO_CONTENT_BODY),
        ("path", "/no-content-trailer", None, "nogil", hello.NO_CONTENT_TRAILER),
        ("path", "/bad-header", None, "nogil", hello.BAD_HEADER),
        ("path", "/ctx", None, "nogil", hello.CTX),
        ("path", "/big", None, "nogil", hello.BIG_STATIC),
        ("path", "/big-tail", None, "nogil", hello.BIG_TAIL),
        ("path", "/static-exclusive", None, "nogil", hello.STATIC_EXCLUSIVE),
    ]
    with serving(routes, threads=2) as srv:
        yield srv.port


def test_seed_root(port):
    r = request(port, get("/"))
    assert (r.status, r.body) == (200, b"Hello, World!")
    assert r.header("content-type") == "text/plain; charset=utf-8"


def test_seed_fibonacci(port):
    r = request(port, get("/fibonacci"))
    assert (r.status, r.body) == (200, b"Fibonacci(10^6) = 1884755131 (with overflow)\n")


def test_request_view_and_response_api(port):
    r = request(port, b"POST /inspect/42?a=b HTTP/1.1\r\nHost: t\r\nX-Test: v1\r\n"
                      b"Content-Length: 4\r\n\r\nbody")
    assert r.status == 201
    assert r.header("x-nogil") == "yes"
    assert r.header("content-type") == "text/x-inspect"
    assert r.body.decode().splitlines() == [
        "method=POST", "path=/inspect/42", "query=a=b", "body=body", "x-test=v1", "param=42",
        "headers=3 method-is-post=1"]


def test_header_lookup_is_case_insensitive_and_absent_is_reported(port):
    r = request(port, b"GET /inspect/1 HTTP/1.1\r\nHost: t\r\nx-TEST: V\r\n\r\n")
    assert "x-test=V" in r.body.decode()
    r = request(port, get("/inspect/1"))
    assert "x-test absent" in r.body.decode()


def test_handler_error_gives_500(port, capfd):
    time.sleep(1.05)  # the failure line is written at most once a second, process-wide
    with Conn(port) as c:
        c.send(get("/fail") + get("/"))
        r = c.reply()
        assert (r.status, r.body) == (500, b"500 Internal Server Error\n")
        assert c.reply().body == b"Hello, World!"
    # The operator learns of it, as a Python handler's failure gets a logged traceback.
    assert "cyserve: GIL-free handler for GET /fail returned -1; answered 500" in \
        capfd.readouterr().err


def test_a_body_on_a_status_without_content_is_the_handlers_failure(port, capfd):
    # A 204 given body bytes: the handler's mistake, a 500 with a line that names it, as the
    # Python handlers, WSGI and ASGI refuse it (the body used to be dropped without a word).
    # The inline path's answer is test_inline_path.py's.
    time.sleep(1.05)  # the failure line is written at most once a second, process-wide
    with Conn(port) as c:
        c.send(get("/no-content-body"))
        r = c.reply()
        assert (r.status, r.body) == (500, b"500 Internal Server Error\n")
        c.send(get("/"))
        assert c.reply().body == b"Hello, World!"
    assert ("cyserve: GIL-free handler for GET /no-content-body gave a body or trailers to a "
            "status without content (204, 205, 304); answered 500") in capfd.readouterr().err


def test_trailers_on_a_status_without_content_are_the_handlers_failure(port, capfd):
    # A 304 given a trailer has no body for it to follow: the engine would drop it without a
    # word, so it is the handler's mistake, as a body there is (asked with TE: trailers, which
    # a client must send to get any).
    time.sleep(1.05)  # the failure line is written at most once a second, process-wide
    with Conn(port) as c:
        c.send(b"GET /no-content-trailer HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n")
        r = c.reply()
        assert (r.status, r.body) == (500, b"500 Internal Server Error\n")
        c.send(get("/"))
        assert c.reply().body == b"Hello, World!"
    assert ("cyserve: GIL-free handler for GET /no-content-trailer gave a body or trailers to a "
            "status without content (204, 205, 304); answered 500") in capfd.readouterr().err


def test_a_failing_handler_that_asked_to_close_gets_a_500_that_says_so(port):
    with Conn(port) as c:
        c.send(get("/fail-closing") + get("/"))
        r = c.reply()
        assert (r.status, r.header("connection")) == (500, "close")
        assert c.is_closed()


def test_header_injection_refused(port):
    r = request(port, get("/bad-header"))
    assert r.body == b"rc=-22"
    assert r.header("set-cookie") is None


def test_context_pointer(port):
    assert request(port, get("/ctx")).body == b"context says hi"


def test_head_on_nogil_route(port):
    r = request(port, b"HEAD /fibonacci HTTP/1.1\r\nHost: t\r\n\r\n")
    assert (r.status, r.header("content-length"), r.body) == (200, "45", b"")


BIG = bytes((i * 7 + i // 251) & 0xFF for i in range(150000))


def test_static_body_is_sent_exactly_and_keeps_the_connection(port):
    with Conn(port) as c:
        for _ in range(3):
            c.send(get("/big"))
            r = c.reply()
            assert (r.status, r.header("content-length")) == (200, str(len(BIG)))
            assert r.header("content-type") == "application/octet-stream"
            assert r.body == BIG
        c.send(b"HEAD /big HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.reply(head_only=True)
        assert (r.status, r.header("content-length")) == (200, str(len(BIG)))
        # Nothing of the body followed the HEAD answer: the next reply starts right after it.
        c.send(get("/"))
        assert c.reply().body == b"Hello, World!"


def test_static_body_pipelined_responses_stay_in_order(port):
    with Conn(port) as c:
        c.send(get("/big") + get("/") + get("/big") + get("/ctx"))
        assert c.reply().body == BIG
        assert c.reply().body == b"Hello, World!"
        assert c.reply().body == BIG
        assert c.reply().body == b"context says hi"


def test_static_bodies_are_told_apart_by_pointer_and_length(port):
    with Conn(port) as c:
        c.send(get("/big-tail") + get("/big") + get("/big-tail"))
        assert c.reply().body == BIG[1000:]
        assert c.reply().body == BIG
        assert c.reply().body == BIG[1000:]


def test_static_body_first_use_from_many_connections_at_once(hello):
    # A fresh server: the first responses of both bodies race to set up their memfds on both
    # workers; every client must still get exact bytes.
    routes = [("path", "/big", None, "nogil", hello.BIG_STATIC),
              ("path", "/big-tail", None, "nogil", hello.BIG_TAIL)]
    with serving(routes, threads=2) as srv:
        conns = [Conn(srv.port) for _ in range(16)]
        try:
            for i, c in enumerate(conns):
                c.send(get("/big" if i % 2 else "/big-tail") * 2)
            for i, c in enumerate(conns):
                want = BIG if i % 2 else BIG[1000:]
                assert c.reply().body == want
                assert c.reply().body == want
        finally:
            for c in conns:
                c.close()


def test_static_body_and_write_are_exclusive(port):
    r = request(port, get("/static-exclusive"))
    # -EEXIST is -17 on Linux.
    assert (r.status, r.header("x-codes"), r.body) == (200, "0 -17 -17", b"static!")


@pytest.mark.slow
def test_cpu_bound_handler_does_not_stall_other_connections_of_its_worker(hello):
    routes = [("path", "/", None, "nogil", hello.ROOT), ("path", "/hog", None, "nogil", hello.HOG),
              ("path", "/probe", None, "nogil", hello.PROBE),
              ("path", "/release", None, "nogil", hello.RELEASE)]
    # The connections stay idle while the hog spins (up to 5 s): a keep-alive timeout longer than
    # that keeps a slow run (sanitizers, a loaded machine) from closing them under the test.
    with serving(routes, threads=2, keepalive_timeout=60.0) as srv:
        conns = [Conn(srv.port) for _ in range(12)]
        try:
            for c in conns:  # every connection registered and idle on its home worker
                c.send(get("/"))
                assert c.reply().body == b"Hello, World!"
            hog = conns[0]
            hog.send(get("/hog"))  # spins up to 5 s unless released
            for _ in range(50):  # until the hog is seen spinning (bounded: it stops in 5 s)
                if request(srv.port, get("/probe")).body == b"spinning":
                    break
            else:  # every probe waited for the hog: nobody rescued its worker
                pytest.fail("no probe on a new connection saw the hog spinning")
            # Each probe is answered at once while the hog spins, unless its connection is
            # homed on the hog's worker: then it waits for the hog to end and says "free".
            answers = []
            for c in conns[1:]:
                c.send(get("/probe"))
                answers.append(c.reply().body)
            request(srv.port, get("/release"))
            assert hog.reply().body == b"hog done"
            assert answers == [b"spinning"] * len(answers)
        finally:
            for c in conns:
                c.close()


def test_capsule_with_wrong_name_is_refused():
    import ctypes
    PyCapsule_New = ctypes.pythonapi.PyCapsule_New
    PyCapsule_New.restype = ctypes.py_object
    PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    cap = PyCapsule_New(1234, b"other.name", None)
    with pytest.raises(TypeError, match="cyserve.nogil_handler"):
        cyserve._core.Server([("path", "/", None, "nogil", cap)], host="127.0.0.1", port=0,
                             threads=1)
