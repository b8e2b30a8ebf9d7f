"""HTTP/2 (csrc/http2.c) with httpx as the client, a third one beside tests/e2e/test_http2.py's
h2 library and curl: httpx decides for itself how to frame requests, when to open windows and
how to share one connection between requests. Over h2c by prior knowledge (httpx's
`http1=False, http2=True`) and over TLS by ALPN; GET, POST, bodies streamed both ways, on each
kind of route (static, GIL-free, Python, WSGI, ASGI), and several requests in flight at once on
one connection."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from _certs import self_signed

import cyserve
from cyserve.config import Config
from cyserve.start import serve

pytestmark = pytest.mark.native

BIG = bytes(range(256)) * 400  # 102,400 bytes: past the initial 64 KiB flow-control window
PIECES = [bytes([65 + i]) * 30000 for i in range(5)]  # an upload streamed in five pieces
# The uploads sent beside each other stay inside the initial 64 KiB windows, all of them
# together: httpcore 1.0.9 can deadlock when two of its streams wait for window at once (one
# task reads the WINDOW_UPDATE meant for another, which then waits on the socket for a frame
# that never comes: pydantic/httpx2 issue 1133, in its fork of httpcore). Seen here as one
# upload stalling with window left to send until the server's body timeout; one upload at a
# time (test_every_route_kind) goes past the windows.
SMALL = [b"s" * 1000] * 3
HELD = 5  # requests that the ASGI app answers only once all of them have arrived


def wsgi_app(environ: dict[str, Any], start_response: Any) -> Any:
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "text/plain")])
    if environ["PATH_INFO"] == "/stream":
        return (b"w" * 30000 for _ in range(5))
    return [f"{environ['SERVER_PROTOCOL']} {environ['REQUEST_METHOD']} {len(body)} "
            f"{environ['REMOTE_PORT']}".encode()]


class AsgiApp:
    """Answers with what it received; /stream streams its answer in pieces, and /held answers
    only once HELD requests to it have arrived (a barrier), so that they were all in flight at
    once."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(HELD)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            raise RuntimeError("no lifespan here")
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        path = scope["path"][len(scope["root_path"]):]
        if path == "/stream":
            for _ in range(4):
                await send({"type": "http.response.body", "body": b"a" * 20000,
                            "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        text = f"{scope['http_version']} {scope['method']} {len(body)} {scope['client'][1]}"
        if path == "/held":
            # The wait is on a thread: the loop goes on serving the other streams meanwhile.
            try:
                await asyncio.to_thread(self.barrier.wait, 30)
                text += " met"
            except threading.BrokenBarrierError:
                text += " alone"
        await send({"type": "http.response.body", "body": text.encode()})


def build_app(asgi: AsgiApp) -> cyserve.App:
    from examples import hello_nogil

    app = cyserve.App()
    app.static("/plaintext", b"Hello, World!", content_type="text/plain")
    app.static("/big", BIG, content_type="application/octet-stream")
    app.nogil("/nogil", hello_nogil.ROOT)

    @app.route("/py", methods=["GET", "POST"])
    def py(req: Any) -> str:
        size = sum(len(piece) for piece in req.stream())
        return f"{req.http_version} {req.method} {size} {req.client[1]}"

    app.wsgi("/wsgi", wsgi_app)
    app.asgi("/asgi", asgi)
    return app


@contextlib.contextmanager
def serving_app(app: cyserve.App, **options: Any) -> Iterator[int]:
    """serve() in a thread, as tests/e2e/test_asgi.py runs apps with an ASGI mount; stopped (and
    waited for) at the end."""
    config = Config(host="127.0.0.1", port=0, threads=2, graceful_timeout=2.0, **options)
    stop = threading.Event()
    ready: list[Any] = []
    th = threading.Thread(target=serve, args=(app, config),
                          kwargs={"stop_event": stop, "ready": ready.append}, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not ready and th.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ready, "the server did not start"
    try:
        yield ready[0].port
    finally:
        stop.set()
        th.join(30)
        assert not th.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return self_signed(tmp_path_factory.mktemp("httpx-tls"))


@pytest.fixture(scope="module")
def asgi() -> AsgiApp:
    return AsgiApp()


@pytest.fixture(scope="module", params=["h2c", "tls"])
def server(request: pytest.FixtureRequest, certs: dict[str, str],
           asgi: AsgiApp) -> Iterator[dict[str, Any]]:
    """The app served over h2c or TLS, and the httpx client options that reach it."""
    if request.param == "tls":
        ctx = ssl.create_default_context(cafile=certs["cert"])
        with serving_app(build_app(asgi), ssl_certfile=certs["cert"],
                         ssl_keyfile=certs["key"]) as port:
            # httpx offers h2 and http/1.1 by ALPN: the server picks h2.
            yield {"base_url": f"https://localhost:{port}", "verify": ctx, "http2": True}
    else:
        with serving_app(build_app(asgi)) as port:
            # Over cleartext httpx speaks HTTP/2 only by prior knowledge, with HTTP/1.1 off.
            yield {"base_url": f"http://127.0.0.1:{port}", "http1": False, "http2": True}


def pieces() -> Iterator[bytes]:
    yield from PIECES


async def small_pieces() -> AsyncIterator[bytes]:
    for piece in SMALL:
        yield piece


def port_of(r: httpx.Response) -> str:
    """The client port that the handler saw, the answer's last word."""
    return r.text.split()[-1]


def test_every_route_kind(server: dict[str, Any]) -> None:
    """GET and POST on each kind of route, uploads whole and streamed (no Content-Length, the
    body's end is the stream's end), answers whole and streamed; all on one connection."""
    size = sum(map(len, PIECES))
    with httpx.Client(timeout=20, **server) as c:
        r = c.get("/plaintext")
        assert (r.status_code, r.http_version, r.content) == (200, "HTTP/2", b"Hello, World!")
        assert r.headers["content-type"] == "text/plain" and r.headers["server"] == "cyserve"
        r = c.get("/big")
        assert (r.http_version, r.content) == ("HTTP/2", BIG)
        r = c.get("/nogil")
        assert r.http_version == "HTTP/2" and r.status_code == 200
        assert r.content.startswith(b"Hello")
        ports = set()
        for path, version in (("/py", "2"), ("/wsgi", "HTTP/2"), ("/asgi", "2")):
            r = c.get(path)
            assert (r.status_code, r.http_version) == (200, "HTTP/2")
            assert r.text.startswith(f"{version} GET 0 "), r.text
            ports.add(port_of(r))
            r = c.post(path, content=BIG)
            assert r.http_version == "HTTP/2"
            assert r.text.startswith(f"{version} POST {len(BIG)} "), r.text
            ports.add(port_of(r))
            r = c.post(path, content=pieces())
            assert r.http_version == "HTTP/2"
            assert r.text.startswith(f"{version} POST {size} "), r.text
            ports.add(port_of(r))
        assert len(ports) == 1, f"httpx used {len(ports)} connections, not one"
        for path, expected in (("/wsgi/stream", b"w" * 150000), ("/asgi/stream", b"a" * 80000)):
            with c.stream("GET", path) as r:
                assert r.http_version == "HTTP/2"
                chunks = list(r.iter_bytes())
            assert b"".join(chunks) == expected
        r = c.get("/nope")
        assert (r.status_code, r.http_version) == (404, "HTTP/2")


def test_requests_in_flight_at_once_share_one_connection(server: dict[str, Any],
                                                         asgi: AsgiApp) -> None:
    """HELD requests to an ASGI route that answers none of them before all of them have
    arrived: only streams multiplexed at once get through. The other kinds of route are asked
    at the same time, and everything comes over one connection.

    (The app holds its answers, not the client its reading: httpcore 1.0.9 lets a stream
    blocked in a read keep the connection's read lock while the answers of other streams wait
    behind it, so a client-side rendezvous on the first bytes of each answer stalls in httpcore
    itself; the frames were seen arriving in time.)"""

    async def main() -> None:
        asgi.barrier.reset()
        async with httpx.AsyncClient(timeout=40, **server) as c:
            held = [c.get("/asgi/held") for _ in range(HELD)]
            others = []
            for path in ("/py", "/wsgi", "/asgi"):
                others += [c.get(path), c.post(path, content=small_pieces()),
                           c.post(path, content=b"b" * 5000)]
            others += [c.get("/plaintext"), c.get("/big"), c.get("/nogil")]
            answers = await asyncio.gather(*held, *others)
        assert all(r.status_code == 200 and r.http_version == "HTTP/2" for r in answers)
        for r in answers[:HELD]:
            assert r.text.startswith("2 GET 0 ") and r.text.endswith(" met"), r.text
        sizes = [r.text.split()[2] for r in answers[HELD:HELD + 9]]
        assert sizes == ["0", "3000", "5000"] * 3, sizes
        assert answers[-2].content == BIG
        ports = {r.text.split()[-2] for r in answers[:HELD]}
        ports |= {port_of(r) for r in answers[HELD:HELD + 9]}
        assert len(ports) == 1, f"httpx used {len(ports)} connections, not one"

    asyncio.run(main())
