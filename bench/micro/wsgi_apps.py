"""WSGI apps for measuring a server's own cost per request (bench/micro/cg_request.sh), and a
way to serve any WSGI app with the C peers, so that every server runs the very same app.

    noop: 200 with an empty body (Content-Length: 0): what a request costs a server whose app
          does nothing beyond start_response and a constant body.
    hello: the /plaintext answer of the peers' app, from constants (no routing, no str(len)).

Run a peer: python -m bench.micro.wsgi_apps fastpysgi|bjoern MODULE:APP PORT
cyserve serves the same apps directly: python -m cyserve bench.micro.wsgi_apps:noop.
"""

import importlib
import sys

_EMPTY_HEADERS = [("Content-Type", "text/plain"), ("Content-Length", "0")]
_EMPTY = [b""]
_HELLO_HEADERS = [("Content-Type", "text/plain"), ("Content-Length", "13")]
_HELLO = [b"Hello, World!"]


def noop(environ, start_response):
    start_response("200 OK", _EMPTY_HEADERS)
    return _EMPTY


def hello(environ, start_response):
    start_response("200 OK", _HELLO_HEADERS)
    return _HELLO


def main():
    server, target, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    module, _, name = target.partition(":")
    app = getattr(importlib.import_module(module), name or "app")
    if server == "fastpysgi":
        import fastpysgi

        fastpysgi.server.init(app, "127.0.0.1", port, loglevel=0)
        fastpysgi.server.run()
    elif server == "bjoern":
        import bjoern

        bjoern.run(app, "127.0.0.1", port)
    else:
        sys.exit(f"unknown server {server!r}: fastpysgi or bjoern")


if __name__ == "__main__":
    main()
