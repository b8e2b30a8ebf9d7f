"""Python state that real applications keep between requests: what they put in a thread-local
(a database connection, a session) lives as long as the worker thread that runs them, the
threads show up in `threading` with a name, a context variable set by one request does not leak
into the next, and a streamed answer's pieces all run in the context of the call that made it
(Flask's `stream_with_context`)."""

from __future__ import annotations

import contextvars
import gc
import os
import sqlite3
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import flask
import pytest

import cyserve
from _rawhttp import get, request, serving

# The thread-state hooks are C in the extension: run under the sanitizers too.
pytestmark = pytest.mark.native


def answers(port: int, path: str, n: int) -> list[str]:
    out = []
    for _ in range(n):
        r = request(port, get(path))
        assert r.status == 200, r
        out.append(r.body.decode())
    return out


def test_a_thread_local_lives_as_long_as_its_thread() -> None:
    local = threading.local()

    def count(req: Any) -> str:
        local.n = getattr(local, "n", 0) + 1
        return str(local.n)

    with serving([("path", "/count", None, "python", count)], threads=1) as srv:
        # One worker thread: every request runs on it, and sees what the one before left.
        assert answers(srv.port, "/count", 5) == ["1", "2", "3", "4", "5"]


def test_a_database_connection_per_thread_is_opened_once() -> None:
    local = threading.local()
    opened: list[tuple[int, sqlite3.Connection]] = []

    def query(req: Any) -> str:
        db = getattr(local, "db", None)
        if db is None:
            # Closed by the test at the end, from its own thread (hence check_same_thread).
            db = local.db = sqlite3.connect(":memory:", check_same_thread=False)
            local.opener = threading.get_ident()
            opened.append((local.opener, db))
        assert local.opener == threading.get_ident()
        return str(db.execute("select 40 + 2").fetchone()[0])

    try:
        with serving([("path", "/q", None, "python", query)], threads=2) as srv:
            assert answers(srv.port, "/q", 8) == ["42"] * 8
        # One per worker thread at most, kept across requests (it was one per request).
        assert 1 <= len(opened) <= 2, len(opened)
    finally:
        for _, db in opened:
            db.close()


def test_what_a_thread_kept_is_released_when_the_server_stops() -> None:
    local = threading.local()
    kept: list[weakref.ref[Any]] = []

    class Resource:
        pass

    def keep(req: Any) -> str:
        if not hasattr(local, "r"):
            local.r = Resource()
            kept.append(weakref.ref(local.r))
        return "ok"

    with serving([("path", "/k", None, "python", keep)], threads=1) as srv:
        assert answers(srv.port, "/k", 3) == ["ok"] * 3
    gc.collect()
    # The worker's thread state was cleared at its exit, and with it the thread-local's value,
    # as for any Python thread that ends.
    assert len(kept) == 1 and kept[0]() is None


# A child process: its interpreter runs in development mode (`-X dev`, whose debug allocator checks
# on every free that the GIL is held, as PYTHONMALLOC=debug does). It serves a Python handler, a
# WSGI app, an ASGI app, and a handler that blocks past the relief threshold on one worker, so
# that a relief thread starts and runs Python too; then it stops the server, and every one of
# those threads gives its thread state back as it ends.
_DEV_MODE_CHILD = r"""
import threading, time
import cyserve
from cyserve.config import Config
from cyserve.start import serve
from _rawhttp import Conn, get, request

def wsgi_app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"wsgi"]

async def asgi_app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"asgi"})

def python_threads_of_the_engine():
    # Each engine thread that ran Python is named in `threading` (cyserve-worker-N), relief
    # threads too. (Not /proc's comm: on 3.14 naming a thread in `threading` renames it there.)
    return sum(t.name.startswith("cyserve-worker-") for t in threading.enumerate())

app = cyserve.App()
app.add_route("/py", lambda req: "py")
slow_entered = threading.Event()

def slow_route(req):
    slow_entered.set()
    time.sleep(1.0)
    return "slow"

app.add_route("/slow", slow_route)
app.wsgi("/w", wsgi_app)
app.asgi("/a", asgi_app)
stop = threading.Event()
failures = []

def client(port):
    try:
        for path, body in (("/py", b"py"), ("/w/", b"wsgi"), ("/a/", b"asgi")):
            r = request(port, get(path))
            assert (r.status, r.body) == (200, body), (path, r)
        # The one worker is inside a call that sleeps: the next answer comes from a relief
        # thread, which runs Python with a thread state of its own.
        with Conn(port) as slow:
            slow.send(get("/slow"))
            assert slow_entered.wait(10)
            r = request(port, get("/py"))
            assert (r.status, r.body) == (200, b"py"), r
            assert python_threads_of_the_engine() >= 2  # the one worker, and relief
            assert slow.reply().body == b"slow"
    except BaseException as e:
        failures.append(e)
    finally:
        stop.set()

def ready(server):
    threading.Thread(target=client, args=(server.port,)).start()

serve(app, Config.from_options(host="127.0.0.1", port=0, threads=1, blocking_threads=2),
      stop_event=stop, ready=ready)
assert not failures, failures
print("stopped", flush=True)
"""


def test_threads_end_cleanly_under_the_debug_allocator() -> None:
    # The engine's threads used to give their thread state back from a pthread key destructor,
    # where glibc has already emptied the interpreter's own GIL-state key: the debug allocator's
    # check failed there and the process aborted at its first worker's exit ("Fatal Python
    # error: _PyMem_DebugFree: Python memory allocator called without holding the GIL").
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, *sys.path]))
    r = subprocess.run([sys.executable, "-X", "dev", "-c", _DEV_MODE_CHILD], env=env,
                       capture_output=True, text=True, timeout=120)
    assert "Fatal Python error" not in r.stderr, r.stderr
    assert r.returncode == 0 and r.stdout.endswith("\nstopped\n"), (r.returncode, r.stdout,
                                                                    r.stderr)


def test_worker_threads_are_named_in_threading() -> None:
    def name(req: Any) -> str:
        t = threading.current_thread()
        return f"{t.name} {t in threading.enumerate()}"

    with serving([("path", "/n", None, "python", name)], threads=1) as srv:
        [answer] = answers(srv.port, "/n", 1)
    assert answer.startswith("cyserve-worker-") and answer.endswith(" True"), answer


VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def test_a_context_variable_does_not_leak_into_the_next_request() -> None:
    def leak(req: Any) -> str:
        before = VAR.get()
        VAR.set("set by an earlier request")
        return before

    with serving([("path", "/v", None, "python", leak)], threads=1) as srv:
        assert answers(srv.port, "/v", 3) == ["unset"] * 3


def streamed_context_app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
    VAR.set(environ["QUERY_STRING"])
    start_response("200 OK", [("Content-Type", "text/plain")])

    def pieces() -> Iterator[bytes]:
        for i in range(3):
            yield f"{i}:{VAR.get()};".encode()
    return pieces()  # no length: streamed, each next() offloaded on its own


def test_a_streamed_answer_runs_in_the_context_that_made_it() -> None:
    app = cyserve.App()
    app.wsgi("/", streamed_context_app)
    with serving(app.build(), threads=1) as srv:
        for q in ("a", "b"):
            r = request(srv.port, get(f"/?{q}"))
            assert r.status == 200 and r.body == f"0:{q};1:{q};2:{q};".encode(), r


def test_flask_stream_with_context() -> None:
    fapp = flask.Flask(__name__)

    @fapp.get("/stream")
    def stream() -> Any:
        def gen() -> Iterator[str]:
            for i in range(3):
                yield f"{i}:{flask.request.args['who']};"
        return flask.Response(flask.stream_with_context(gen()), mimetype="text/plain")

    app = cyserve.App()
    app.wsgi("/", fapp)
    with serving(app.build(), threads=1) as srv:
        r = request(srv.port, get("/stream?who=me"))
        assert r.status == 200 and r.body == b"0:me;1:me;2:me;", r
