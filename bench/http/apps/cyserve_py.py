"""cyserve with Python handlers (the App API): every workload, the same code as the Python peers
(bench/peers/python/routes.py). A handler's bytes are the body; the content type stays cyserve's
default for bytes."""

import cyserve

from bench.peers.python import routes

app = cyserve.App()


def _route(fn):
    def handler(req):
        body, _ctype = fn()
        return body
    handler.__name__ = fn.__name__
    return handler


for _path, _fn in routes.ROUTES.items():
    app.get(_path)(_route(_fn))
