"""The smallest cyserve application, run as a script: `python examples/hello.py`.

The same app can be served by the command line instead: `cyserve hello:app --port 8000`
(from this folder), which is what `cyserve.run` below does with its defaults.
"""

from __future__ import annotations

import cyserve

app = cyserve.App()

# Served entirely from C: the response is serialised once, at startup.
app.static("/plaintext", "Hello, World!")


@app.get("/")
def hello(request: cyserve.Request) -> str:
    return "Hello, World!"


@app.get("/hello/{name}")
def hello_name(request: cyserve.Request) -> dict[str, str]:
    return {"hello": request.params["name"]}


if __name__ == "__main__":
    # threads=0: one worker per CPU this process may run on. Ctrl-C stops it gracefully.
    cyserve.run(app, host="127.0.0.1", port=8000, threads=0)
