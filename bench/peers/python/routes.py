"""The workloads in plain Python, shared by every Python peer (bench/peers/python/*.py) and by
cyserve-py (bench/http/apps/cyserve_py.py).

Each handler returns (body bytes, content type). The records are decoded once at import into the
cache that /json encodes (/json: "having cached the previous step"); /msgpack decodes the
1,000 pre-encoded records again on every request. Where msgpack is not installed (the stdlib-only
CI smoke test), /msgpack and /json answer 500 and the harness marks those cells invalid.
"""

import json

from bench.http import workloads

try:
    import msgpack
except ImportError:  # pragma: no cover - the bench venv always has it
    msgpack = None

with open(workloads.TRANSFER_PATH, "rb") as _f:
    TRANSFER = _f.read()
with open(workloads.RECORDS_PATH, "rb") as _f:
    _PACKED = _f.read()

if msgpack is not None:
    PREENCODED = msgpack.unpackb(_PACKED)
    CACHE = [msgpack.unpackb(r) for r in PREENCODED]
else:
    PREENCODED = CACHE = None

TEXT = "text/plain"
JSON = "application/json"


def plaintext():
    return b"Hello, World!", TEXT


def welcome():
    return b"Welcome!\n", TEXT


def fib():
    a, b = 0, 1
    for _ in range(1_000_000):
        a, b = b, (a + b) & 0xFFFFFFFF
    return b"Fibonacci(10^6) = %d (with overflow)\n" % a, TEXT


def decode_msgpack():
    if msgpack is None:
        raise RuntimeError("msgpack is not installed")
    unpackb = msgpack.unpackb
    out = [unpackb(r) for r in PREENCODED]
    return b"%d\n" % len(out), TEXT


def encode_json():
    if CACHE is None:
        raise RuntimeError("msgpack is not installed: no cached records")
    return b"%d\n" % len(json.dumps(CACHE, separators=(",", ":"))), TEXT


def transfer():
    return TRANSFER, JSON


def loop():
    acc = 0
    for i in range(1_000_000):
        acc += i * 3
        if acc > 1_000_000_007:
            acc -= 1_000_000_007
    return b"%d\n" % acc, TEXT


ROUTES = {
    "/plaintext": plaintext,
    "/fib": fib,
    "/welcome": welcome,
    "/msgpack": decode_msgpack,
    "/json": encode_json,
    "/transfer": transfer,
    "/loop": loop,
}


def handle(path):
    """(status, body, content type) for a path; 404 for unknown paths, 500 when a handler fails."""
    h = ROUTES.get(path.split("?", 1)[0])
    if h is None:
        return 404, b"not found\n", TEXT
    try:
        body, ctype = h()
    except Exception as e:  # the harness sees the 500 and marks the cell invalid
        return 500, (f"{type(e).__name__}: {e}\n").encode(), TEXT
    return 200, body, ctype
