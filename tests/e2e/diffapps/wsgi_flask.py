"""A Flask application, and a few raw WSGI callables beside it under /raw/, served by cyserve and
by gunicorn alike (tests/e2e/test_wsgi_gunicorn_diff.py)."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from flask import Flask, Response, abort, jsonify, request, send_file, stream_with_context

flask_app = Flask(__name__)
Environ = dict[str, Any]
StartResponse = Callable[..., Any]


@flask_app.get("/")
def root() -> Any:
    return jsonify(hello="world")


@flask_app.post("/items/")
def create_item() -> Any:
    data = request.get_json(silent=True)
    if not isinstance(data, dict) or not isinstance(data.get("price"), (int, float)):
        return jsonify(detail="price must be a number"), 422
    return jsonify(name=data.get("name"), with_tax=round(data["price"] * 1.2, 2))


@flask_app.get("/items/")
def list_items() -> Any:
    return jsonify(["pen"])


@flask_app.get("/names/<name>")
def names(name: str) -> Any:
    return jsonify(name=name, q=request.args.get("q"), n=request.args.get("n", type=int))


@flask_app.post("/upload")
def upload() -> Any:
    f = request.files["file"]
    data = f.read()
    return jsonify(filename=f.filename, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                   field=request.form.get("field"))


@flask_app.post("/echo")
def echo() -> Any:
    body = request.get_data()
    return jsonify(len=len(body), sha256=hashlib.sha256(body).hexdigest(),
                   content_type=request.content_type)


@flask_app.get("/stream")
def stream() -> Any:
    def pieces() -> Iterator[str]:
        for i in range(4):
            yield f"piece {i} of {request.path}\n"

    return Response(stream_with_context(pieces()), mimetype="text/plain")


@flask_app.get("/file")
def a_file() -> Any:
    return send_file(os.environ["DIFFAPP_FILE"], mimetype="application/octet-stream",
                     etag=False, last_modified=None, conditional=True)


@flask_app.get("/teapot")
def teapot() -> Any:
    abort(Response("short and stout", status=418, headers={"X-Reason": "teapot"}))


@flask_app.get("/boom")
def boom() -> Any:
    raise ValueError("the view failed")


@flask_app.get("/cookies")
def cookies() -> Any:
    return jsonify(request.cookies.to_dict())


@flask_app.get("/latin1")
def latin1() -> Any:
    r = Response("a header outside ASCII")
    r.headers["X-Name"] = "caf\u00e9"
    return r


# ---- raw WSGI: what frameworks do not let an application get wrong --------------------------

def generator(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    for i in range(3):
        yield b"generated %d\n" % i


def write_and_yield(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    """The write() callable and a generator together: written bytes go before the next piece."""
    write = start_response("200 OK", [("Content-Type", "text/plain")])
    write(b"written first, ")

    def pieces() -> Iterator[bytes]:
        yield b"yielded, "
        write(b"written between, ")
        yield b"yielded again, "
        write(b"written last")

    return pieces()


def file_wrapper(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    f = open(os.environ["DIFFAPP_FILE"], "rb")  # noqa: SIM115 (the server closes it)
    start_response("200 OK", [("Content-Type", "application/octet-stream"),
                              ("Content-Length", str(os.path.getsize(f.name)))])
    wrapped: Iterable[bytes] = environ["wsgi.file_wrapper"](f, 8192)
    return wrapped


def too_long(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "5")])
    return [b"0123456789"]


def too_short(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "20")])
    return [b"0123456789"]


def stream_too_long(environ: Environ, start_response: StartResponse) -> Iterator[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "5")])
    yield b"01234"
    yield b"56789"


def stream_too_short(environ: Environ, start_response: StartResponse) -> Iterator[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "20")])
    yield b"01234"
    yield b"56789"


def head_slow(environ: Environ, start_response: StartResponse) -> Iterator[bytes]:
    """A generator that announces its length and takes its time before its second piece."""
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "10")])
    yield b"01234"
    time.sleep(1.5)
    yield b"56789"


def latin1_raw(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("X-Name", "caf\u00e9 \u00ff"),
                              ("Content-Length", "2")])
    return [b"ok"]


def exc_info_before_body(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("X-First", "1")])
    try:
        raise RuntimeError("changed its mind")
    except RuntimeError:
        start_response("503 Service Unavailable", [("Content-Type", "text/plain"),
                                                   ("Content-Length", "5")], sys.exc_info())
    return [b"later"]


def exc_info_after_body(environ: Environ, start_response: StartResponse) -> Iterator[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    yield b"first part\n"
    try:
        raise RuntimeError("failed midway")
    except RuntimeError:
        # The head is out: start_response raises the error again (PEP 3333).
        start_response("500 Internal Server Error", [("Content-Type", "text/plain")],
                       sys.exc_info())
    yield b"never sent\n"


def environ_echo(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    body = environ["wsgi.input"].read()
    keys = ("REQUEST_METHOD", "SCRIPT_NAME", "PATH_INFO", "QUERY_STRING", "CONTENT_TYPE",
            "CONTENT_LENGTH", "SERVER_PROTOCOL", "HTTP_HOST", "HTTP_X_MULTI",
            "HTTP_TRANSFER_ENCODING", "HTTP_EXPECT", "HTTP_COOKIE", "HTTP_X_EMPTY",
            "wsgi.url_scheme")
    seen: dict[str, Any] = {k: environ.get(k) for k in keys}
    # Repeated header lines are joined with a comma, and a space after it is optional (RFC 9110
    # 5.3): gunicorn writes "one,two", cyserve "one, two". The app sees the same list either way.
    if seen["HTTP_X_MULTI"] is not None:
        seen["HTTP_X_MULTI"] = [v.strip() for v in seen["HTTP_X_MULTI"].split(",")]
    seen["body"] = hashlib.sha256(body).hexdigest()
    seen["body_len"] = len(body)
    out = repr(sorted(seen.items())).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(out)))])
    return [out]


RAW = {"/raw/generator": generator, "/raw/file-wrapper": file_wrapper,
       "/raw/write-and-yield": write_and_yield,
       "/raw/too-long": too_long, "/raw/too-short": too_short, "/raw/latin1": latin1_raw,
       "/raw/stream-too-long": stream_too_long, "/raw/stream-too-short": stream_too_short,
       "/raw/head-slow": head_slow,
       "/raw/exc-info-before-body": exc_info_before_body,
       "/raw/exc-info-after-body": exc_info_after_body, "/raw/environ": environ_echo}


def app(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
    path = environ.get("PATH_INFO", "")
    raw = environ_echo if path.startswith("/raw/environ/") else RAW.get(path)
    if raw is not None:
        return raw(environ, start_response)
    return flask_app(environ, start_response)
