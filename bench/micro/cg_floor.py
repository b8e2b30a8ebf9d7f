"""The interpreter's own cost of a request's Python, without a server: K calls of one of the
workloads below in a loop, for running under callgrind twice, with K and with 0 calls; the
difference of the two totals over K is the instructions one call costs the interpreter.

    valgrind --tool=callgrind --callgrind-out-file=OUT PYTHON bench/micro/cg_floor.py WHAT K

WHAT:
    plaintext: routes.handle("/plaintext") of the peers' routes, what a Python handler's
               /plaintext runs.
    wsgi:      the WSGI peers' app (bench/peers/python/wsgi_app.py) on /plaintext, called as a
               server would call it, with all of it in Python: an environ copied from a dict of
               the keys cyserve gives for a keep-alive GET (PEP 3333's and the client's one Host),
               a start_response that is a Python function keeping its arguments, and the
               returned list's items taken. What any server's WSGI path has to make the
               interpreter run at the least, measured the same way on each build.

Run from the repository root (PYTHONPATH=. for bench, PYTHONHASHSEED=0 as cg_request.sh does).
"""

import io
import sys

from bench.peers.python import routes, wsgi_app

_ENVIRON = {
    "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
    "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
    "SERVER_SOFTWARE": "cyserve", "SCRIPT_NAME": "", "SERVER_NAME": "127.0.0.1",
    "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
    "REMOTE_PORT": "40000", "REQUEST_METHOD": "GET", "PATH_INFO": "/plaintext",
    "QUERY_STRING": "", "wsgi.input": None, "HTTP_HOST": "127.0.0.1:8000",
}


def plaintext(k):
    handle = routes.handle
    for _ in range(k):
        handle("/plaintext")


def wsgi(k):
    app = wsgi_app.app
    answer = []

    def start_response(status, headers, exc_info=None):
        answer.append((status, headers))
        return answer.append

    for _ in range(k):
        env = _ENVIRON.copy()
        env["wsgi.input"] = io.BytesIO()
        for chunk in app(env, start_response):
            answer.append(chunk)
        answer.clear()


if __name__ == "__main__":
    {"plaintext": plaintext, "wsgi": wsgi}[sys.argv[1]](int(sys.argv[2]))
