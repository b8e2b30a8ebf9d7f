"""cyserve-py's app, except that /json encodes a copy of the cached records of the thread's own
(made on its first /json request) instead of the one list all threads share.

A diagnostic for free-threaded CPython: there, an object's reference count is a plain add for
the thread that created it and an atomic on a shared cache line for every other thread, and the
JSON encoder also locks each dict it walks. If /json's requests per CPU-second fall from 1 to N
threads with cyserve-py-ft and not with this, what the threads contend on is the app's shared
records, not the server; if they fall with both, it is elsewhere."""

import copy
import json
import threading

import cyserve

from bench.http.apps import cyserve_py
from bench.peers.python import routes

app = cyserve.App()
_own = threading.local()


def encode_json(req):
    records = getattr(_own, "records", None)
    if records is None:
        if routes.CACHE is None:
            raise RuntimeError("msgpack is not installed: no cached records")
        records = _own.records = copy.deepcopy(routes.CACHE)
    return b"%d\n" % len(json.dumps(records, separators=(",", ":")))


for _path, _fn in routes.ROUTES.items():
    if _path == "/json":
        app.get(_path)(encode_json)
    else:
        app.get(_path)(cyserve_py._route(_fn))
