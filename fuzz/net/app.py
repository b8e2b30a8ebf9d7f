"""The app the network fuzzer attacks: every kind of route cyserve serves (the demo's static,
files, GIL-free and Python handlers, a body echo), plus a WSGI app that reads its body and streams
its answer, and a Python handler that sleeps (so calls queue and relief threads run)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from cyserve import Request
from examples.demo.app import app


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    yield b"got "
    yield str(len(body)).encode()
    yield b"\n"


app.wsgi("/wsgi", wsgi_app)


@app.get("/sleep")
def sleep(request: Request) -> str:
    time.sleep(0.02)
    return "slept"
