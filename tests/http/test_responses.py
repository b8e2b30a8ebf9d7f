"""Conformance of the framing of answers (csrc/http1.c, http1_write.c, http2.c) against the cases
in tests/http/responses/*.md, through every kind of answer: a static route, a GIL-free handler, a
Python handler, a WSGI app (a list, a generator, wsgi.file_wrapper) and an ASGI app (one body
message, or pieces with more_body). The requests' conformance is tests/http/*.md
(test_parser.py); these are the answers'.

Format of a case file (one topic per file, as the request cases):

    ## Title of the case

    A sentence saying why the case exists, and what RFC 9110/9112/9113 ask.

    ```answer
    kinds: python, wsgi-iter             (which kinds can say it; `all` for every kind)
    status: 200
    header: X-A: 1                       (repeatable: fields the application gives)
    piece: hello                         (repeatable: the body, piece by piece)
    trailer: X-T: 1                      (repeatable)
    ```

    ```expect
    GET 1.1: 200 length=5 body="hello"
    GET 1.1 @asgi-stream: 200 chunked body="hello"
    ```

A piece or a quoted value takes the escapes of the request cases (`\\r`, `\\n`, `\\t`, `\\xNN`,
`\\\\`); a piece of `\\` alone is an empty piece. Each expect line is a request form, then
optionally `@kind ...` (the line is for those kinds only, and overrides the line without), then
the status and the framing the answer must have:

- `length=N`: Content-Length: N and exactly N bytes of body (no Transfer-Encoding);
- `chunked`: Transfer-Encoding: chunked, well-formed chunks, then the trailer section;
- `none`: neither field, and nothing after the head (a status without content, or HEAD);
- `eof`: neither field, the body ends when the server closes.

then `key=value` pairs: `body` (the exact body bytes, default empty), `trailers` (the trailer
fields received, `name: value` joined by `|`, default none), `then` (`keep`: the connection
answers the next request right, the default for HTTP/1.1 and HTTP/2; `close`: the server closes
it after this answer, and sends nothing more, the default for HTTP/1.0; `reset`: an HTTP/2
stream ends with RST_STREAM), `reason` (the status line's reason phrase, when it is not the
standard one) and, for `CONTINUE 1.1`, `continue` (`yes`, the default: `100 Continue` comes
first; `no`: the answer comes at once, and the client then sends the body all the same).

Request forms: `GET 1.1`, `HEAD 1.1`, `GET 1.0`, `GET h2` and `HEAD h2` must be given for every
case (so that no case checks less than those without saying so); `GET 1.1 TE`, `GET h2 TE` (the
request says `TE: trailers`), `HEAD 1.0` and `CONTINUE 1.1` (a POST of 3 bytes with `Expect:
100-continue`: the client waits for `100 Continue` before it sends them) may be added.

What each form checks on the wire: the exact status line, the framing fields, the exact body;
over HTTP/1.1 the next request on the same connection (a static route) must then be answered
right, which is what catches an answer that writes more or less than its framing says; over
HTTP/2 (h2c with prior knowledge, read with the h2 library, which refuses DATA that does not
match a content-length or comes after END_STREAM) a bodyless answer (HEAD, 1xx, 204, 304) must be
a HEADERS frame with END_STREAM and no DATA, and a second stream on the connection must be
answered right.

One server serves every case and kind (each at /KIND/N), started once for the module.
"""

from __future__ import annotations

import http
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from _cython_ext import build_user_module
from _rawhttp import Conn

import cyserve
from cyserve import Response
from cyserve.config import Config
from cyserve.start import serve

pytestmark = pytest.mark.native

CASE_DIR = Path(__file__).parent / "responses"
TESTS = Path(__file__).parent.parent
KINDS = ("static", "nogil", "python", "wsgi", "wsgi-iter", "wsgi-file", "asgi", "asgi-stream")
BASE_FORMS = ("GET 1.1", "HEAD 1.1", "GET 1.0", "GET h2", "HEAD h2")
FORMS = BASE_FORMS + ("GET 1.1 TE", "GET h2 TE", "HEAD 1.0", "CONTINUE 1.1")
TIMEOUT = 10.0

HEADING = re.compile(r"^##\s+(.*\S)\s*$")
PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def unescape(text: str) -> bytes:
    out = bytearray()
    i = 0
    simple = {"r": b"\r", "n": b"\n", "t": b"\t", "\\": b"\\", '"': b'"'}
    while i < len(text):
        ch = text[i]
        if ch != "\\":
            out += ch.encode("latin-1")
            i += 1
        elif text[i + 1] in simple:
            out += simple[text[i + 1]]
            i += 2
        elif text[i + 1] == "x":
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        else:
            raise ValueError(f"unknown escape in {text!r}")
    return bytes(out)


def field_pair(text: str) -> tuple[str, str]:
    name, _, value = text.partition(":")
    return name.strip(), unescape(value.strip()).decode("latin-1")


@dataclass
class Expect:
    status: int
    framing: str  # length=N, chunked, none, eof
    body: bytes = b""
    trailers: list[tuple[str, str]] = field(default_factory=list)
    then: str = ""
    reason: str | None = None
    interim: bool = True  # CONTINUE: 100 Continue comes before the answer


@dataclass
class Case:
    name: str
    status: int = 200
    kinds: tuple[str, ...] = ()
    headers: list[tuple[str, str]] = field(default_factory=list)
    pieces: list[bytes] = field(default_factory=list)
    trailers: list[tuple[str, str]] = field(default_factory=list)
    # form -> kind (None: every kind) -> expectation
    expect: dict[str, dict[str | None, Expect]] = field(default_factory=dict)

    @property
    def body(self) -> bytes:
        return b"".join(self.pieces)

    def expected(self, form: str, kind: str) -> Expect | None:
        by_kind = self.expect.get(form)
        if by_kind is None:
            return None
        return by_kind.get(kind, by_kind.get(None))


def parse_expect(text: str) -> Expect:
    words = text.split(None, 2)
    e = Expect(int(words[0]), words[1])
    assert re.fullmatch(r"length=\d+|chunked|none|eof", e.framing), text
    for key, value in PAIR.findall(words[2] if len(words) > 2 else ""):
        raw = unescape(value[1:-1]) if value.startswith('"') else value.encode()
        if key == "body":
            e.body = raw
        elif key == "trailers":
            e.trailers = [field_pair(f) for f in raw.decode("latin-1").split("|")]
        elif key == "then":
            assert raw in (b"keep", b"close", b"reset"), text
            e.then = raw.decode()
        elif key == "reason":
            e.reason = raw.decode("latin-1")
        elif key == "continue":
            assert raw in (b"yes", b"no"), text
            e.interim = raw == b"yes"
        else:
            raise ValueError(f"unknown key {key!r} in {text!r}")
    return e


def load_cases() -> list[Case]:
    cases: list[Case] = []
    for path in sorted(CASE_DIR.glob("*.md")):
        lines = path.read_text().splitlines()
        case: Case | None = None
        i = 0
        while i < len(lines):
            m = HEADING.match(lines[i])
            if m:
                case = Case(f"{path.stem}: {m.group(1)}")
                cases.append(case)
                i += 1
                continue
            if not (lines[i].startswith("```") and lines[i].strip() != "```"):
                i += 1
                continue
            lang = lines[i].strip()[3:]
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            assert case is not None, f"{path.name}: a block before any case"
            for entry in lines[i + 1:j]:
                key, _, value = entry.partition(":")
                value = value.strip()
                if lang == "answer":
                    if key == "kinds":
                        case.kinds = KINDS if value == "all" else tuple(
                            k.strip() for k in value.split(","))
                        assert set(case.kinds) <= set(KINDS), entry
                    elif key == "status":
                        case.status = int(value)
                    elif key == "header":
                        case.headers.append(field_pair(value))
                    elif key == "trailer":
                        case.trailers.append(field_pair(value))
                    elif key == "piece":
                        case.pieces.append(b"" if value == "\\" else unescape(value))
                    else:
                        raise ValueError(f"{path.name}: unknown answer key in {entry!r}")
                elif lang == "expect":
                    form, _, at = key.partition("@")
                    form = form.strip()
                    assert form in FORMS, f"{path.name}: unknown form {form!r}"
                    slot = case.expect.setdefault(form, {})
                    for kind in (at.split() or [None]):
                        assert kind is None or kind in KINDS, entry
                        slot[kind] = parse_expect(value)
                else:
                    raise ValueError(f"{path.name}: unknown block ```{lang}")
            i = j + 1
    for case in cases:
        assert case.kinds, f"{case.name}: no kinds"
        missing = [f for f in BASE_FORMS if f not in case.expect]
        assert not missing, f"{case.name}: no expectation for {missing}"
    return cases


CASES = load_cases()


def test_enough_cases() -> None:
    assert len(CASES) >= 20, f"only {len(CASES)} response cases"


# ---- the applications: each kind says a case's answer its own way --------------------------

def case_of(path: str) -> Case:
    return CASES[int(path.rsplit("/", 1)[1])]


def python_handler(case: Case) -> Any:
    def handler(req: Any) -> Response:
        return Response(case.body, status=case.status, headers=list(case.headers),
                        trailers=list(case.trailers) or None)
    return handler


def status_line(case: Case) -> str:
    return f"{case.status} {http.HTTPStatus(case.status).phrase}"


def wsgi_app(environ: dict[str, Any], start_response: Any) -> Any:
    kind, _, n = environ["PATH_INFO"].lstrip("/").partition("/")
    case = CASES[int(n)]
    start_response(status_line(case), list(case.headers))
    if kind == "iter":
        def pieces() -> Any:
            yield from case.pieces
        return pieces()
    if kind == "file":
        f = open(environ["files"] / n, "rb")  # noqa: SIM115 (the server closes it)
        return environ["wsgi.file_wrapper"](f)
    return [case.body]


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    kind, _, n = scope["path"].lstrip("/").partition("/")
    if kind.startswith("asgi"):  # the path may keep the mount's prefix (root_path)
        kind, _, n = n.partition("/")
    case = CASES[int(n)]
    start: dict[str, Any] = {"type": "http.response.start", "status": case.status,
                             "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                                         for k, v in case.headers]}
    if case.trailers:
        start["trailers"] = True
    await send(start)
    if kind == "stream":
        for piece in case.pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    else:
        await send({"type": "http.response.body", "body": case.body})
    if case.trailers:
        await send({"type": "http.response.trailers", "more_trailers": False,
                    "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                                for k, v in case.trailers]})


def build_app(framing: Any, files: Path) -> cyserve.App:
    app = cyserve.App()
    app.static("/next", b"next", content_type="text/plain")
    any_method = ("GET", "POST")
    for n, case in enumerate(CASES):
        if "static" in case.kinds:
            app.static(f"/static/{n}", case.body, status=case.status, headers=case.headers,
                       content_type="text/plain", methods=any_method)
        if "nogil" in case.kinds:
            ctx = framing.answer(case.status,
                                 [(k.encode("latin-1"), v.encode("latin-1"))
                                  for k, v in case.headers], list(case.pieces),
                                 [(k.encode("latin-1"), v.encode("latin-1"))
                                  for k, v in case.trailers])
            app.nogil(f"/nogil/{n}", framing.HANDLER, methods=any_method, ctx=ctx)
        if "python" in case.kinds:
            app.route(f"/python/{n}", methods=any_method)(python_handler(case))
        (files / str(n)).write_bytes(case.body)

    def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
        environ["files"] = files
        return wsgi_app(environ, start_response)

    app.wsgi("/wsgi", wsgi)
    app.asgi("/asgi", asgi_app)
    return app


def kind_path(kind: str, n: int) -> str:
    return {"wsgi": f"/wsgi/list/{n}", "wsgi-iter": f"/wsgi/iter/{n}",
            "wsgi-file": f"/wsgi/file/{n}", "asgi": f"/asgi/whole/{n}",
            "asgi-stream": f"/asgi/stream/{n}"}.get(kind, f"/{kind}/{n}")


def serving(app: cyserve.App) -> Iterator[int]:
    """serve() in a thread (an App with an ASGI mount needs its event loop thread), on a free
    port; stopped and waited for at the end."""
    stop = threading.Event()
    ready: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            serve(app, Config(host="127.0.0.1", port=0, threads=2, loop="asyncio",
                              graceful_timeout=2.0), stop_event=stop, ready=ready.append)
        except BaseException as exc:  # handed to the test
            failure.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not ready and not failure and time.monotonic() < deadline:
        time.sleep(0.01)
    if failure:
        raise failure[0]
    assert ready, "the server did not start"
    try:
        yield ready[0].port
    finally:
        stop.set()
        th.join(30)
        assert not th.is_alive(), "the server did not stop"
        if failure:
            raise failure[0]


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Any:
    framing = build_user_module(TESTS / "cython_ext" / "framing.pyx",
                                tmp_path_factory.mktemp("framing_ext"))
    files = tmp_path_factory.mktemp("framing_files")
    yield from serving(build_app(framing, files))


# ---- HTTP/1.x on the wire --------------------------------------------------------------------

@dataclass
class Wire:
    status_line: str
    fields: list[tuple[str, str]]
    framing: str
    body: bytes
    trailers: list[tuple[str, str]]


def read_answer(c: Conn, head_only: bool, version: str) -> Wire:
    head = c.read_until(b"\r\n\r\n")[:-4].decode("latin-1").split("\r\n")
    fields = [(n.strip().lower(), v.strip()) for n, _, v in (h.partition(":") for h in head[1:])]
    names = [n for n, _ in fields]
    lengths = [v for n, v in fields if n == "content-length"]
    te = [v for n, v in fields if n == "transfer-encoding"]
    assert len(lengths) <= 1 and len(te) <= 1, f"framing fields repeated: {head}"
    assert not (lengths and te), f"both Content-Length and Transfer-Encoding: {head}"
    code = int(head[0].split(" ")[1])
    body, trailers = b"", []
    if te:
        assert te[0] == "chunked", head
        assert version == "1.1", f"chunked to an HTTP/1.0 client: {head}"
        framing = "chunked"
    elif lengths:
        framing = f"length={lengths[0]}"
    else:
        framing = "none"
    if head_only or code < 200 or code in (204, 304):
        return Wire(head[0], fields, framing, body, trailers)
    if te:
        while True:
            line = c.read_until(b"\r\n")[:-2]
            assert re.fullmatch(rb"[0-9a-f]+", line), f"bad chunk size line {line!r}"
            size = int(line, 16)
            if size == 0:
                break
            body += c.read_exact(size)
            assert c.read_exact(2) == b"\r\n", "a chunk not ended by CRLF"
        while (line := c.read_until(b"\r\n")) != b"\r\n":
            n, _, v = line[:-2].decode("latin-1").partition(":")
            trailers.append((n.strip().lower(), v.strip()))
    elif lengths:
        # Up to the announced length, or fewer when the server closes first (a streamed body
        # that ended short): the expectation says which.
        want = int(lengths[0])
        while len(c.buf) < want and c._fill():
            pass
        body, c.buf = c.buf[:want], c.buf[want:]
    elif "connection" in names or version == "1.0" or code >= 200:
        while c._fill():
            pass
        body, c.buf = c.buf, b""
        framing = "eof"
    return Wire(head[0], fields, framing, body, trailers)


def closed(c: Conn) -> bool:
    """True when the server closed the connection with nothing more sent; False when it still
    answers (what it sent meanwhile is kept in c.buf), or sent nothing and did not close within
    the socket's timeout (10 s): only a failing case waits that long, and a close that comes
    after real work on a slow (sanitized, loaded) machine is not taken for none."""
    try:
        data = c.sock.recv(65536)
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    c.buf += data
    return data == b""


def request_bytes(form: str, path: str) -> bytes:
    method, version = form.split()[:2]
    extra = "TE: trailers\r\n" if form.endswith(" TE") else ""
    if method == "CONTINUE":
        return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
                f"Expect: 100-continue\r\n\r\n").encode()
    return f"{method} {path} HTTP/{version}\r\nHost: t\r\n{extra}\r\n".encode()


def check_http1(port: int, case: Case, kind: str, form: str, want: Expect, path: str) -> None:
    version = form.split()[1]
    head_only = form.startswith("HEAD")
    then = want.then or ("close" if version == "1.0" else "keep")
    with Conn(port) as c:
        c.send(request_bytes(form, path))
        if form.startswith("CONTINUE") and want.interim:
            assert c.read_until(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            c.send(b"abc")
        got = read_answer(c, head_only, version)
        if form.startswith("CONTINUE") and not want.interim:
            # Answered without the body: a client may send it all the same (RFC 9110 10.1.1),
            # and the engine reads past it (or closes) before the next request.
            c.send(b"abc")
        reason = want.reason or http.HTTPStatus(want.status).phrase
        assert got.status_line == f"HTTP/1.1 {want.status} {reason}", got
        assert got.framing == want.framing, got
        assert got.body == want.body, got
        assert got.trailers == [(n.lower(), v) for n, v in want.trailers], got
        # The answer's own fields came through (Connection only as the engine writes it).
        names = [n for n, _ in got.fields]
        for name, _ in case.headers if want.status == case.status else ():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                assert name.lower() in names, (name, got)
        if then == "close":
            assert closed(c), f"the connection stays open after {got}"
            return
        assert ("connection", "close") not in got.fields, got
        c.send(b"GET /next HTTP/1.1\r\nHost: t\r\n\r\n")
        nxt = read_answer(c, False, "1.1")
        assert (nxt.status_line, nxt.framing, nxt.body) == ("HTTP/1.1 200 OK", "length=4",
                                                            b"next"), nxt


# ---- HTTP/2 ---------------------------------------------------------------------------------

class H2Client:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="latin-1"))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def exchange(self, method: str, path: str, te: bool) -> dict[str, Any]:
        sid = self.conn.get_next_available_stream_id()
        hs = [(":method", method), (":path", path), (":scheme", "http"),
              (":authority", "localhost")] + ([("te", "trailers")] if te else [])
        self.conn.send_headers(sid, hs, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        out: dict[str, Any] = {"headers": None, "data": b"", "data_frames": 0, "trailers": [],
                               "ended_by": None, "reset": None}
        while out["ended_by"] is None and out["reset"] is None:
            data = self.sock.recv(65536)
            assert data, "the server closed the connection"
            for e in self.conn.receive_data(data):
                if getattr(e, "stream_id", sid) != sid:
                    continue
                if isinstance(e, h2.events.ResponseReceived):
                    out["headers"] = list(e.headers)
                    if e.stream_ended is not None:
                        out["ended_by"] = "headers"
                elif isinstance(e, h2.events.InformationalResponseReceived):
                    out.setdefault("informational", []).append(list(e.headers))
                elif isinstance(e, h2.events.DataReceived):
                    out["data"] += e.data
                    out["data_frames"] += 1
                    self.conn.acknowledge_received_data(e.flow_controlled_length, sid)
                    if e.stream_ended is not None:
                        out["ended_by"] = "data"
                elif isinstance(e, h2.events.TrailersReceived):
                    out["trailers"] = list(e.headers)
                    if e.stream_ended is not None:
                        out["ended_by"] = "trailers"
                elif isinstance(e, h2.events.StreamReset):
                    out["reset"] = e.error_code
            pending = self.conn.data_to_send()
            if pending:
                self.sock.sendall(pending)
        return out

    def close(self) -> None:
        self.sock.close()


def check_h2(port: int, case: Case, kind: str, form: str, want: Expect, path: str) -> None:
    method = form.split()[0]
    c = H2Client(port)
    try:
        got = c.exchange(method, path, form.endswith(" TE"))
        if want.then == "reset":
            assert got["reset"] is not None, got
        else:
            assert got["reset"] is None, got
            fields = got["headers"]
            assert fields[0] == (":status", str(want.status)), got
            lengths = [v for n, v in fields if n == "content-length"]
            assert not [n for n, _ in fields if n in ("transfer-encoding", "connection")], got
            framing = f"length={lengths[0]}" if lengths else "none"
            assert framing == want.framing or (want.framing in ("chunked", "eof")
                                               and framing == "none"), got
            assert got["data"] == want.body, got
            assert got["trailers"] == [(n.lower(), v) for n, v in want.trailers], got
            if method == "HEAD" or want.status < 200 or want.status in (204, 304):
                assert (got["ended_by"], got["data_frames"]) == ("headers", 0), got
            elif got["trailers"]:
                assert got["ended_by"] == "trailers", got
        # The connection goes on: another stream on it is answered right.
        nxt = c.exchange("GET", "/next", False)
        assert nxt["headers"][0] == (":status", "200") and nxt["data"] == b"next", nxt
    finally:
        c.close()


PARAMS = [pytest.param(n, kind, id=f"{case.name} [{kind}]")
          for n, case in enumerate(CASES) for kind in case.kinds]


@pytest.mark.parametrize("n,kind", PARAMS)
def test_response_case(port: int, n: int, kind: str) -> None:
    case = CASES[n]
    path = kind_path(kind, n)
    failures = []
    for form in FORMS:
        want = case.expected(form, kind)
        if want is None:
            continue
        check = check_h2 if " h2" in form else check_http1
        try:
            check(port, case, kind, form, want, path)
        except (AssertionError, ConnectionError, OSError, h2.exceptions.ProtocolError) as exc:
            failures.append(f"{form}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures)
