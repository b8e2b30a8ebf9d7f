"""--root-path, through a served process: ASGI's root_path and the path before it (uvicorn's
reading: the proxy removed the root path, and the scope's path and raw_path carry it again),
WSGI's SCRIPT_NAME (gunicorn's: a path that still begins with it has it moved out of PATH_INFO),
and how it composes with app.asgi()/app.wsgi() mounts. Native routes match the path as it came."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from _served import TIMEOUT, Served, free_port
from _rawhttp import request as raw_request

pytestmark = pytest.mark.native

APP = """
import json

import cyserve


async def asgi_app(scope, receive, send):
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": json.dumps(
            {"root_path": scope["root_path"], "path": scope["path"],
             "raw_path": scope["raw_path"].decode("latin-1")})})
        await send({"type": "websocket.close"})
        return
    if scope["type"] != "http":
        return
    body = json.dumps({"root_path": scope["root_path"], "path": scope["path"],
                       "raw_path": scope["raw_path"].decode("latin-1")}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def wsgi_app(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps({"SCRIPT_NAME": environ["SCRIPT_NAME"],
                        "PATH_INFO": environ["PATH_INFO"]}).encode()]


app = cyserve.App()
app.asgi("/a", asgi_app)
app.wsgi("/w", wsgi_app)


@app.get("/native/{rest:path}")
def native(request):
    return request.path
"""


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.close()


def _get(port: int, path: str) -> tuple[int, str]:
    reply = raw_request(port, f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
                        .encode())
    return reply.status, reply.body.decode("latin-1")


def test_asgi_scope_has_the_root_path_before_its_path(tmp_path: Path,
                                                      served: list[Served]) -> None:
    port = free_port()
    s = Served(tmp_path, "--port", str(port), "--threads", "1", "--root-path", "/svc",
               "--interface", "asgi", app=APP + "\napp = asgi_app\n")
    served.append(s)
    status, body = _get(port, "/x/%C3%A9?q=1")
    assert status == 200
    assert json.loads(body) == {"root_path": "/svc", "path": "/svc/x/\u00e9",
                                "raw_path": "/svc/x/%C3%A9"}
    # As uvicorn: the root path is put before the path whatever the path is (the proxy is
    # expected to have removed it).
    assert json.loads(_get(port, "/svc/x")[1])["path"] == "/svc/svc/x"


@pytest.mark.parametrize(("path", "script_name", "path_info"), [
    ("/x", "/svc", "/x"),
    ("/svc/x", "/svc", "/x"),  # passed on by the proxy: moved out of PATH_INFO
    ("/svc", "/svc", ""),
    ("/svcx/y", "/svc", "/svcx/y"),  # not on a segment boundary: not the root path
    ("/a%2Fb", "/svc", "/a/b"),
])
def test_wsgi_script_name_is_the_root_path(tmp_path: Path, served: list[Served], path: str,
                                           script_name: str, path_info: str) -> None:
    port = free_port()
    s = Served(tmp_path, "--port", str(port), "--threads", "1",
               app=APP + "\napp = wsgi_app\n", env={"CYSERVE_ROOT_PATH": "/svc"})
    served.append(s)
    status, body = _get(port, path)
    assert status == 200
    assert json.loads(body) == {"SCRIPT_NAME": script_name, "PATH_INFO": path_info}


def test_mounts_put_their_prefix_after_the_root_path(tmp_path: Path,
                                                     served: list[Served]) -> None:
    port = free_port()
    conf = tmp_path / "cyserve.toml"
    conf.write_text('root-path = "/svc"\n')
    s = Served(tmp_path, "--port", str(port), "--threads", "2", "--config", str(conf), app=APP)
    served.append(s)
    assert json.loads(_get(port, "/w/x")[1]) == {"SCRIPT_NAME": "/svc/w", "PATH_INFO": "/x"}
    assert json.loads(_get(port, "/a/y?z")[1]) == {"root_path": "/svc/a", "path": "/svc/a/y",
                                                    "raw_path": "/svc/a/y"}
    # Routing is unchanged: the routes match the path as received.
    assert _get(port, "/native/p") == (200, "/native/p")
    assert _get(port, "/svc/w/x")[0] == 404


def test_a_websocket_scope_has_the_root_path_too(tmp_path: Path,
                                                 served: list[Served]) -> None:
    websockets = pytest.importorskip("websockets")
    from websockets.sync.client import connect

    assert websockets is not None
    port = free_port()
    s = Served(tmp_path, "--port", str(port), "--threads", "1", "--root-path", "/svc", app=APP)
    served.append(s)
    with connect(f"ws://127.0.0.1:{port}/a/chat", open_timeout=TIMEOUT) as ws:
        got = json.loads(ws.recv(timeout=TIMEOUT))
    assert got == {"root_path": "/svc/a", "path": "/svc/a/chat", "raw_path": "/svc/a/chat"}


def test_without_a_root_path_the_mounts_are_as_before(tmp_path: Path,
                                                      served: list[Served]) -> None:
    port = free_port()
    s = Served(tmp_path, "--port", str(port), "--threads", "1", app=APP)
    served.append(s)
    assert json.loads(_get(port, "/w/x")[1]) == {"SCRIPT_NAME": "/w", "PATH_INFO": "/x"}
    assert json.loads(_get(port, "/a/y")[1]) == {"root_path": "/a", "path": "/a/y",
                                                  "raw_path": "/a/y"}


@pytest.mark.parametrize(("value", "reason"), [
    ("api", "must begin with '/', e.g. /api"),
    ("/api/", "must not end with '/'"),
    ("/", "must not end with '/'"),
    ("/a b", "must be path segments"),
    ("/a%20b", "must be path segments"),
    ("/a//b", "must be path segments"),
])
def test_a_bad_root_path_is_one_line_at_start(tmp_path: Path, value: str, reason: str) -> None:
    (tmp_path / "m.py").write_text(APP)
    out = subprocess.run([sys.executable, "-m", "cyserve", "m:app", "--root-path", value],
                         cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 2
    assert out.stderr.startswith(f"cyserve: invalid --root-path {value!r}: {reason}"), out.stderr
    assert out.stderr.count("\n") == 1


def test_config_and_run_take_root_path() -> None:
    from cyserve.config import Config
    from cyserve.errors import ConfigError

    assert Config.from_options(root_path="/svc").root_path == "/svc"
    assert Config().root_path == ""
    with pytest.raises(ConfigError, match="root_path"):
        Config(root_path="svc")
