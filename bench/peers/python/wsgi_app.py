"""The WSGI peer app: gunicorn (sync, gevent), waitress, bjoern, granian --interface wsgi."""

from bench.peers.python.routes import handle

_REASONS = {200: "200 OK", 404: "404 Not Found", 500: "500 Internal Server Error"}


def app(environ, start_response):
    status, body, ctype = handle(environ.get("PATH_INFO", "/"))
    start_response(_REASONS[status], [("Content-Type", ctype), ("Content-Length", str(len(body)))])
    return [body]
