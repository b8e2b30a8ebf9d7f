"""fastpysgi (C on libuv and llhttp) serving the WSGI or the ASGI peer app, unmodified.

Run: python -m bench.peers.python.fastpysgi_app wsgi|asgi PORT [WORKERS]

fastpysgi tells WSGI from ASGI by the app itself (a coroutine function is ASGI). WORKERS > 1 is its
own multi-process mode (fork after binding, one event loop per process), as granian's --workers.
"""

import sys

import fastpysgi

from bench.peers.python.asgi_app import app as asgi_app
from bench.peers.python.wsgi_app import app as wsgi_app


def main():
    kind, port = sys.argv[1], int(sys.argv[2])
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    app = {"wsgi": wsgi_app, "asgi": asgi_app}[kind]
    # loglevel 0: no line per request (the others run without access logs too).
    fastpysgi.server.init(app, "127.0.0.1", port, loglevel=0, workers=workers)
    print(f"fastpysgi ({kind}) listening on {port}", flush=True)
    fastpysgi.server.run()


if __name__ == "__main__":
    main()
