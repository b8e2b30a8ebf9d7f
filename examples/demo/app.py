"""The demo served by `make run`: one route of each kind cyserve offers.

    /            nogil Cython handler (examples/hello_nogil.pyx): "Hello, World!"
    /fibonacci   nogil Cython handler: "Fibonacci(10^6) = 1884755131 (with overflow)\\n"
    /plaintext   static response served from C: "Hello, World!"
    /py          Python handler: "Hello, World!"
    /echo        Python handler, any method: 200 with the request body echoed back
    /users/{id:int}  Python handler: {"id": <id>} as JSON
    /files/      the files under examples/demo/static

Run it with `make run` (HOST=, PORT=, THREADS=) or
`python -m cyserve examples.demo.app:app --port 8000`.
"""

from __future__ import annotations

import os

import cyserve
from cyserve import Request, Response

try:
    from .. import hello_nogil
except ImportError as exc:  # the extension is built by `make build` (examples/build.py)
    raise ImportError(f"examples/hello_nogil.pyx is not built: run `make build` ({exc})") from exc

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")

app = cyserve.App()

app.nogil("/", hello_nogil.ROOT, methods=["GET"])
app.nogil("/fibonacci", hello_nogil.FIBONACCI, methods=["GET"])
app.static("/plaintext", "Hello, World!", content_type="text/plain")
app.files("/files/", STATIC_DIR)


@app.get("/py")
def hello(request: Request) -> str:
    return "Hello, World!"


@app.route("/echo")
def echo(request: Request) -> Response:
    # Echo the body as bytes, with the type the client sent, if any.
    content_type = request.headers.get("content-type", "application/octet-stream")
    return Response(request.body, status=200, content_type=content_type)


@app.get("/users/{id:int}")
def user(request: Request) -> dict[str, int]:
    return {"id": request.params["id"]}
