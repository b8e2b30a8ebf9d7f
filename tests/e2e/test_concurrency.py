"""Hundreds of concurrent connections against every kind of route, over a single-threaded
selector client so that the server, not the client, decides the interleaving."""

from __future__ import annotations

import selectors
import socket

import pytest

from _rawhttp import serving

pytestmark = pytest.mark.native

N_CONN = 400


def _run_clients(port: int, requests_per_conn: int, pipeline: int = 1,
                 path: bytes = b"/plaintext") -> list[bytes]:
    """Open N_CONN connections, send requests_per_conn requests on each (pipeline at a time),
    read every response; returns the concatenated bytes per connection."""
    sel = selectors.DefaultSelector()
    req = b"GET " + path + b" HTTP/1.1\r\nHost: t\r\n\r\n"
    state = {}
    for _ in range(N_CONN):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.setblocking(False)
        state[s] = {"sent": 0, "got": 0, "buf": b"", "all": b""}
        sel.register(s, selectors.EVENT_WRITE)
    done = 0
    try:
        while done < N_CONN:
            events = sel.select(timeout=10)
            assert events, "no progress for 10 s"
            for key, mask in events:
                s, st = key.fileobj, state[key.fileobj]
                if mask & selectors.EVENT_WRITE:
                    n = min(pipeline, requests_per_conn - st["sent"])
                    s.sendall(req * n)
                    st["sent"] += n
                    sel.modify(s, selectors.EVENT_READ)
                    continue
                data = s.recv(65536)
                assert data, "server closed a keep-alive connection"
                st["buf"] += data
                st["all"] += data
                while b"\r\n\r\n" in st["buf"]:
                    head, _, rest = st["buf"].partition(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                    if len(rest) < length:
                        break
                    st["buf"] = rest[length:]
                    st["got"] += 1
                if st["got"] == st["sent"]:
                    if st["sent"] == requests_per_conn:
                        sel.unregister(s)
                        done += 1
                    else:
                        sel.modify(s, selectors.EVENT_WRITE)
    finally:
        for s in state:
            s.close()
    return [st["all"] for st in state.values()]


def _python(req):
    return "py " + req.path


ROUTES = [
    ("path", "/plaintext", None, "static", (200, [("Content-Type", "text/plain")], b"Hello!")),
    ("prefix", "/py", None, "python", _python),
]


@pytest.mark.parametrize("threads", [1, 2])
def test_many_connections_static(threads):
    with serving(ROUTES, threads=threads) as srv:
        outs = _run_clients(srv.port, requests_per_conn=5)
        assert all(o.count(b"HTTP/1.1 200 OK") == 5 and o.count(b"Hello!") == 5 for o in outs)


def test_many_connections_python_pipelined():
    with serving(ROUTES, threads=2) as srv:
        outs = _run_clients(srv.port, requests_per_conn=6, pipeline=3, path=b"/py/x")
        assert all(o.count(b"py /py/x") == 6 for o in outs)


def test_connections_are_released_when_clients_leave():
    with serving(ROUTES, threads=2) as srv:
        _run_clients(srv.port, requests_per_conn=1)
        import time
        end = time.monotonic() + 10
        while srv.live_connections and time.monotonic() < end:
            time.sleep(0.01)
        assert srv.live_connections == 0
