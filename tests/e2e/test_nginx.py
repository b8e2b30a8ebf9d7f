"""A real nginx in front of cyserve, as in a deployment: nginx's http proxy over TCP and over a
Unix socket with X-Forwarded-For/-Proto (--proxy-headers), and nginx's stream proxy sending the
PROXY protocol (--proxy-protocol). The application sees the client's address and scheme, an
upload streams through, and a graceful stop behind nginx finishes the request in flight.

nginx is Debian's package (`make test` installs nginx and libnginx-mod-stream as root with apt,
as `make bench` does); without it these tests are skipped and say why."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _served import TIMEOUT, Served, free_port

pytestmark = pytest.mark.native

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
STREAM_MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"

if not os.access(NGINX, os.X_OK):
    pytest.skip("nginx is not installed (Debian: apt-get install nginx; `make test` as root "
                "installs it)", allow_module_level=True)

APP = """
import pathlib
import time

import cyserve

app = cyserve.App()


@app.get("/who")
def who(request):
    client = "%s:%s" % request.client if request.client else "-"
    return f"{client} {request.scheme}"


@app.post("/upload")
def upload(request):
    return f"{len(request.body)} {request.body[:4].decode()}"


@app.get("/slow")
def slow(request):
    pathlib.Path("slow-started").write_text("now")  # in the folder the test started it in
    time.sleep(1.5)
    return "finished"


def wsgi(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{environ['REMOTE_ADDR']} {environ['wsgi.url_scheme']}".encode()]


app.wsgi("/wsgi", wsgi)
"""

# The test client names itself with X-Test-Client: nginx's realip module makes that its
# $remote_addr (from 127.0.0.1 only), as if the request came from that address on the Internet.
HTTP_CONF = """
@USER@
daemon off;
master_process off;
worker_processes 1;
pid @PREFIX@/nginx.pid;
error_log @PREFIX@/error.log warn;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path @PREFIX@/client_body;
    proxy_temp_path @PREFIX@/proxy;
    fastcgi_temp_path @PREFIX@/fastcgi;
    uwsgi_temp_path @PREFIX@/uwsgi;
    scgi_temp_path @PREFIX@/scgi;
    client_max_body_size 8m;
    set_real_ip_from 127.0.0.1;
    real_ip_header X-Test-Client;
    server {
        listen 127.0.0.1:@PORT@;
        location / {
            proxy_pass http://@UPSTREAM@;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto https;
        }
    }
}
"""

STREAM_CONF = """
@USER@
load_module @MODULE@;
daemon off;
master_process off;
worker_processes 1;
pid @PREFIX@/nginx.pid;
error_log @PREFIX@/error.log warn;
events { worker_connections 256; }
stream {
    server {
        listen 127.0.0.1:@PORT@;
        proxy_pass @UPSTREAM@;
        proxy_protocol on;
    }
}
"""


class Nginx:
    """nginx in the foreground from a config of its own, in a prefix of its own."""

    def __init__(self, template: str, upstream: str, **extra: str) -> None:
        # Not under pytest's tmp_path: with nginx started by root its worker may run as another
        # user, which must reach the prefix (and the upstream's socket).
        self.prefix = tempfile.mkdtemp(prefix="cyserve-nginx-")
        os.chmod(self.prefix, 0o755)
        self.port = free_port()
        conf = template
        values = {"@PREFIX@": self.prefix, "@PORT@": str(self.port), "@UPSTREAM@": upstream,
                  "@MODULE@": STREAM_MODULE,
                  "@USER@": "user root;" if os.geteuid() == 0 else "", **extra}
        for k, v in values.items():
            conf = conf.replace(k, v)
        path = os.path.join(self.prefix, "nginx.conf")
        with open(path, "w") as f:
            f.write(conf)
        # nginx is not what is tested: not under the sanitizers' runtime the suite may preload.
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self.proc = subprocess.Popen([NGINX, "-p", self.prefix, "-c", path], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + TIMEOUT
        while True:
            assert self.proc.poll() is None, self.error_log()
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, self.error_log()
                time.sleep(0.05)

    def error_log(self) -> str:
        try:
            return Path(self.prefix, "error.log").read_text()
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        shutil.rmtree(self.prefix, ignore_errors=True)


@pytest.fixture
def running() -> Iterator[list[Served | Nginx]]:
    started: list[Served | Nginx] = []
    yield started
    for s in reversed(started):
        s.close()


def http(port: int, method: str, path: str, body: bytes = b"",
         headers: dict[str, str] | None = None) -> tuple[int, bytes, socket.socket]:
    """One request to nginx on a connection of its own: (status, body, the socket's own
    address as seen from nginx: its local port)."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        lines = [f"{method} {path} HTTP/1.1", "Host: example.test", "Connection: close",
                 f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), rest, s


def upstream_for(family: str, tmp: str) -> tuple[list[str], str, str]:
    """cyserve's arguments, nginx's http upstream and its stream upstream for family."""
    if family == "tcp":
        port = free_port()
        return ["--port", str(port)], f"127.0.0.1:{port}", f"127.0.0.1:{port}"
    path = os.path.join(tmp, "cyserve.sock")
    return ["--uds", path, "--uds-perms", "666"], f"unix:{path}:", f"unix:{path}"


@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_behind_nginx_the_app_sees_the_client(tmp_path: Path, running: list[Served | Nginx],
                                              family: str) -> None:
    tmp = tempfile.mkdtemp(prefix="cyserve-up-")
    os.chmod(tmp, 0o755)
    try:
        args, upstream, _ = upstream_for(family, tmp)
        srv = Served(tmp_path, *args, "--threads", "2", "--proxy-headers", app=APP)
        running.append(srv)
        nginx = Nginx(HTTP_CONF, upstream)
        running.append(nginx)
        client = {"X-Test-Client": "203.0.113.50"}
        status, body, _ = http(nginx.port, "GET", "/who", headers=client)
        assert status == 200, nginx.error_log()
        assert body == b"203.0.113.50:0 https"
        status, body, _ = http(nginx.port, "GET", "/wsgi", headers=client)
        assert body == b"203.0.113.50 https"
        # An upload of 3 MiB streams through nginx to the handler (over the 1 MiB default
        # --max-body-bytes, raised for it).
        srv.stop()
        srv = Served(tmp_path, *args, "--threads", "2", "--proxy-headers", "--max-body-bytes",
                     str(4 << 20), app=APP)
        running.append(srv)
        up = b"DATA" + os.urandom(3 << 20)
        status, body, _ = http(nginx.port, "POST", "/upload", up)
        assert (status, body) == (200, f"{len(up)} DATA".encode()), nginx.error_log()
        # A graceful stop behind nginx: the request in flight is answered.
        result: list[tuple[int, bytes]] = []
        t = threading.Thread(target=lambda: result.append(
            http(nginx.port, "GET", "/slow")[:2]))
        t.start()
        deadline = time.monotonic() + TIMEOUT
        while not (tmp_path / "slow-started").exists():  # the request is in the handler
            assert time.monotonic() < deadline, "the slow request never reached the handler"
            time.sleep(0.01)
        os.killpg(srv.proc.pid, signal.SIGTERM)
        t.join(TIMEOUT)
        assert result == [(200, b"finished")], nginx.error_log()
        assert srv.proc.wait(TIMEOUT) == 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.skipif(not os.path.exists(STREAM_MODULE),
                    reason="nginx's stream module is not installed (Debian: apt-get install "
                           "libnginx-mod-stream; `make test` as root installs it)")
@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_behind_nginx_stream_with_the_proxy_protocol(tmp_path: Path,
                                                     running: list[Served | Nginx],
                                                     family: str) -> None:
    tmp = tempfile.mkdtemp(prefix="cyserve-up-")
    os.chmod(tmp, 0o755)
    try:
        args, _, upstream = upstream_for(family, tmp)
        srv = Served(tmp_path, *args, "--threads", "2", "--proxy-protocol", app=APP)
        running.append(srv)
        nginx = Nginx(STREAM_CONF, upstream)
        running.append(nginx)
        for path in ("/who", "/wsgi"):
            with socket.create_connection(("127.0.0.1", nginx.port), timeout=TIMEOUT) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                          .encode())
                mine = s.getsockname()
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), (data, nginx.error_log())
            # The client's own port: only the PROXY header could have told it.
            want = f"{mine[0]}:{mine[1]} http" if path == "/who" else f"{mine[0]} http"
            assert body.decode() == want
        assert srv.stop() == 0, srv.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
