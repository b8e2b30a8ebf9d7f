"""Python's own http.server.ThreadingHTTPServer, HTTP/1.1 with keep-alive.

Run: python -m bench.peers.python.stdlib_threading PORT
"""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.peers.python.routes import handle


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like every other peer

    def do_GET(self):
        status, body, ctype = handle(self.path)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - the stdlib's name
        pass  # as every minimal design: no request is printed during the benchmark


class Server(ThreadingHTTPServer):
    request_queue_size = 128  # as every minimal design: a listen backlog of 128


def main():
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()


if __name__ == "__main__":
    main()
