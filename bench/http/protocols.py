"""The protocol workloads of the suite (docs/benchmarks.md, "Protocols"): WebSocket echo, HTTPS
keep-alive, new TLS handshakes, HTTP/2 over TLS and in cleartext (h2c).

Same method as bench/http/run.py: each server pinned to CPU 0 with one worker, the client pinned
to CPU 1, the server's CPU time read from /proc around each cell (its whole process tree), rounds
interleaved with the order rotated each round, medians over rounds with min-max, and every ratio
taken within a round before its median. Never HTTP/1.1 pipelining: one message in flight per
WebSocket, one request per connection at a time for wrk; h2load's `-m 10` is HTTP/2's own
multiplexing (ten streams open per connection), as the workload asks.

  ws-echo     64 WebSockets, each with one 32-byte text message in flight: send, read the echo,
              check it, send the next (bench/peers/goproto/load, Go, gorilla/websocket)
  https       wrk -t1 -c64 over HTTPS with keep-alive on /plaintext, handshakes excluded: wrk
              opens its 64 connections at the start of the cell, so their handshakes' server CPU
              (64 times the cost per handshake the same round's tls-new cell measured) is taken
              out of the cell's server CPU time
  tls-new     new TLS connections, 16 at once: handshake, GET /plaintext, close (the Go load client)
  tls-resume  the same with a session cache, so every handshake after the first resumes
  h2-tls      h2load -c 64 -m 10 -t 1 on /plaintext, HTTP/2 by ALPN over TLS
  h2c         the same in cleartext, HTTP/2 with prior knowledge

Every server gets the same certificate (ECDSA P-256, made by openssl at the start of the run) and
OpenSSL's defaults on both sides: TLS 1.3, the suite each pair negotiates is recorded per server.

    python bench/http/protocols.py --quick            one round of 1 s cells
    python bench/http/protocols.py --rounds 3 --duration 2
    options: --servers a,b  --workloads x,y  --no-setup  --out DIR  --report RESULT.json

Results: bench/results/protocols-<timestamp>.json, protocols-latest.json and protocols-latest.md.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)

from bench.common import processes  # noqa: E402
from bench.common.pinning import pinned  # noqa: E402
from bench.common.procfs import CLK_TCK, RssSampler, tree_cpu_seconds  # noqa: E402
from bench.common.stats import spread  # noqa: E402
from bench.http import harness  # noqa: E402
from bench.http import servers as S  # noqa: E402

RESULTS = os.path.join(BENCH, "results")
SERVER_CPU, CLIENT_CPU = "0", "1"
WS_CONNECTIONS, WS_SIZE = 64, 32
WRK_CONNECTIONS = 64
TLS_CONNECTORS = 16
H2_CLIENTS, H2_STREAMS = 64, 10
MIN_CPU_S = 50 / CLK_TCK  # as in harness.py: below it the ratio is mostly tick rounding
GO_SRC = os.path.join(BENCH, "peers", "goproto")
GO_SERVER = os.path.join(S.BUILD, "goproto-server")
GO_LOAD = os.path.join(S.BUILD, "goproto-load")

# workload: (transport the server is started for, unit of the figure)
WORKLOADS = {
    "ws-echo": ("ws", "round trips"),
    "https": ("tls", "requests"),
    "tls-new": ("tls", "handshakes"),
    "tls-resume": ("tls", "handshakes"),
    "h2-tls": ("tls", "requests"),
    "h2c": ("h2c", "requests"),
}
TRANSPORTS = ("ws", "tls", "h2c")

# The ratios each workload's table shows, per server CPU-second: the references of the targets.
REFS = {
    "ws-echo": ("uvicorn-ws", "granian-asgi-ws", "go-ws"),
    "https": ("nginx",),
    "tls-new": ("nginx",),
    "tls-resume": ("nginx",),
    "h2-tls": ("nginx", "granian-rsgi"),
    "h2c": ("nginx", "granian-rsgi"),
}

# (workload, server, reference, at least): the targets, per server CPU-second (median of the
# per-round ratios).
TARGETS = [
    ("ws-echo", "cyserve-asgi-ws", "uvicorn-ws", 2.0),
    ("ws-echo", "cyserve-asgi-ws", "granian-asgi-ws", 1.5),
    ("ws-echo", "cyserve-nogil-ws", "go-ws", 1.0),
    ("https", "cyserve-static", "nginx", 1.1),
    ("tls-new", "cyserve-static", "nginx", 1.0),
    ("tls-resume", "cyserve-static", "nginx", 1.0),
    ("h2-tls", "cyserve-static", "nginx", 1.0),
    ("h2-tls", "cyserve-static", "granian-rsgi", 2.0),
    ("h2-tls", "cyserve-py", "granian-rsgi", 1.5),
    ("h2c", "cyserve-static", "nginx", 1.0),
    ("h2c", "cyserve-static", "granian-rsgi", 2.0),
    ("h2c", "cyserve-py", "granian-rsgi", 1.5),
]


def say(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# Servers: how each starts for a transport ("ws": cleartext HTTP/1.1 with /ws, "tls": HTTPS with
# HTTP/2 by ALPN where it has it, "h2c": cleartext with HTTP/2 by prior knowledge).

class ProtoServer:
    def __init__(self, name, label, group, command, workloads, requires=(), app=None, note="",
                 missing=None):
        self.name, self.label, self.group = name, label, group
        self.missing = missing  # why, when its app module does not exist yet
        self._command = command
        self.workloads = tuple(workloads)
        self.requires = requires  # Python modules the server imports (checked in bench/.venv)
        self.app = app  # cyserve's: the module its app comes from (checked the same way)
        self.note = note

    def command(self, transport, port, tls, tmp):
        """(argv, env, cleanup); tls is (certfile, keyfile)."""
        return self._command(transport, port, tls, tmp)


def _cyserve(app_ref):
    def cmd(transport, port, tls, tmp):
        env = S.py_env()
        env["PYTHONPATH"] += os.pathsep + S.BUILD
        argv = [S.VENV_PY, "-m", "cyserve", app_ref, "--host", "127.0.0.1", "--port", str(port),
                "--threads", "1"]
        if transport == "tls":
            argv += ["--ssl-certfile", tls[0], "--ssl-keyfile", tls[1]]
        return argv, env, None
    return cmd


def _granian(interface, app_ref):
    def cmd(transport, port, tls, tmp):
        argv = [S.VENV_PY, "-m", "granian", "--interface", interface, "--host", "127.0.0.1",
                "--port", str(port), "--workers", "1", "--log-level", "warning"]
        if transport == "tls":
            argv += ["--ssl-certificate", tls[0], "--ssl-keyfile", tls[1]]
        elif transport == "h2c":
            argv += ["--http", "2"]
        return argv + [app_ref], S.py_env(), None
    return cmd


def _uvicorn(transport, port, tls, tmp):
    return [S.VENV_PY, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--loop", "uvloop", "--http", "httptools", "--ws", "websockets", "--no-access-log",
            "--log-level", "warning", "bench.peers.python.ws_asgi_app:app"], S.py_env(), None


def _go(transport, port, tls, tmp):
    argv = [GO_SERVER, "-addr", f"127.0.0.1:{port}", "-threads", "1"]
    if transport == "tls":
        argv += ["-cert", tls[0], "-key", tls[1]]
    elif transport == "h2c":
        argv += ["-h2c"]
    return argv, None, None


def nginx_conf(transport, port, prefix, tls):
    """nginx's configuration for a transport (bench/peers/nginx/nginx-proto.conf.template)."""
    with open(os.path.join(BENCH, "peers", "nginx", "nginx-proto.conf.template")) as f:
        conf = f.read()
    listen = {"tls": "ssl http2", "h2c": "http2"}.get(transport, "")
    # The same TLS 1.3 suite as cyserve in every cell: cyserve's order wins and puts
    # AES-128-GCM first (csrc/tls.c), nginx would follow the client, and wrk's and h2load's
    # OpenSSL offers AES-256-GCM first; unequal suites would not be the same workload.
    tls_lines = (f"ssl_certificate {tls[0]};\n        ssl_certificate_key {tls[1]};\n"
                 "        ssl_prefer_server_ciphers on;\n        ssl_conf_command Ciphersuites "
                 "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256;"
                 if transport == "tls" else "")
    for k, v in {"@WORKERS@": "1", "@PREFIX@": prefix, "@PORT@": str(port), "@LISTEN@": listen,
                 "@TLS@": tls_lines}.items():
        conf = conf.replace(k, v)
    return conf


def _nginx(transport, port, tls, tmp):
    prefix = tempfile.mkdtemp(prefix="nginx-", dir=tmp)
    os.chmod(prefix, 0o755)
    with open(os.path.join(prefix, "nginx.conf"), "w") as f:
        f.write(nginx_conf(transport, port, prefix, tls))
    return [shutil.which("nginx") or "/usr/sbin/nginx", "-p", prefix, "-c",
            os.path.join(prefix, "nginx.conf")], None, None


TLS_H2 = ("https", "tls-new", "tls-resume", "h2-tls", "h2c")
SERVERS = [
    ProtoServer("cyserve-asgi-ws", "cyserve (ASGI echo)", "cyserve",
                _cyserve("bench.peers.python.ws_asgi_app:app"), ("ws-echo",),
                app="bench.peers.python.ws_asgi_app",
                note="bench/peers/python/ws_asgi_app.py, the same app uvicorn and granian serve"),
    ProtoServer("cyserve-nogil-ws", "cyserve (GIL-free echo)", "cyserve",
                _cyserve("bench.http.apps.cyserve_ws_nogil_app:app"), ("ws-echo",),
                app="bench.http.apps.cyserve_ws_nogil_app",
                note="examples/ws_echo_nogil.pyx: callbacks in C on the worker, without the GIL "
                     "(bench/http/apps/cyserve_ws_nogil_app.py)"),
    ProtoServer("cyserve-app-ws", "cyserve (@app.websocket echo)", "cyserve",
                _cyserve("bench.http.apps.cyserve_ws_app:app"), ("ws-echo",),
                app="bench.http.apps.cyserve_ws_app",
                note="a blocking handler on the event loop's default executor, one thread per open "
                     "WebSocket: min(32, CPUs + 4) WebSockets served at once, the others wait"),
    ProtoServer("uvicorn-ws", "uvicorn (websockets)", "python-async", _uvicorn, ("ws-echo",),
                requires=("uvicorn", "uvloop", "httptools", "websockets")),
    ProtoServer("granian-asgi-ws", "granian ASGI", "python-async",
                _granian("asgi", "bench.peers.python.ws_asgi_app:app"), ("ws-echo",),
                requires=("granian",)),
    ProtoServer("go-ws", "Go net/http + gorilla/websocket", "go", _go, ("ws-echo",)),
    ProtoServer("cyserve-static", "cyserve (app.static)", "cyserve",
                _cyserve("bench.http.apps.cyserve_static_app:app"), TLS_H2,
                app="bench.http.apps.cyserve_static_app", note="the C core answers alone"),
    ProtoServer("cyserve-py", "cyserve (Python handler)", "cyserve",
                _cyserve("bench.http.apps.cyserve_py:app"), ("h2-tls", "h2c"),
                app="bench.http.apps.cyserve_py", requires=("msgpack",),
                note="the suite's Python handlers (bench/http/apps/cyserve_py.py)"),
    ProtoServer("nginx", "nginx", "c", _nginx, TLS_H2,
                note="bench/peers/nginx/nginx-proto.conf.template; session tickets on (its default)"),
    ProtoServer("granian-rsgi", "granian RSGI", "python-async",
                _granian("rsgi", "bench.peers.python.rsgi_app:app"), TLS_H2,
                requires=("granian", "msgpack"),
                note="a Python handler (bench/peers/python/rsgi_app.py); HTTP/2 by ALPN over TLS, "
                     "--http 2 in cleartext"),
    ProtoServer("go-nethttp", "Go net/http", "go", _go, TLS_H2,
                note="bench/peers/goproto/server; h2c through http.Protocols"),
]
BY_NAME = {s.name: s for s in SERVERS}


# ---------------------------------------------------------------------------------------------
# Setup.

def setup(notes, no_setup=False):
    """Install h2load (Debian's nghttp2-client) the way run.py installs wrk and nginx, build the
    GIL-free modules (bench/http/build_nogil.py) and the Go peer and load client
    (bench/peers/goproto, its own module: gorilla/websocket)."""
    if not no_setup and not processes.have("h2load") and os.geteuid() == 0 and processes.have("apt-get"):
        say("setup: apt-get install nghttp2-client")
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
        r = subprocess.run(["apt-get", "install", "-y", "-qq", "nghttp2-client"], capture_output=True,
                           text=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        if r.returncode != 0:
            notes.append(f"apt-get install nghttp2-client failed: {r.stderr.strip()[-200:]}")
    for tool in ("wrk", "h2load", "nginx", "openssl"):
        if not processes.have(tool):
            notes.append(f"{tool}: not installed")
    if no_setup:
        return
    # The Python peers (granian, uvicorn with websockets) in bench/.venv, as run.py installs them:
    # a venv made before a peer joined bench/peers/python/requirements.txt gets it now.
    from bench.http.run import setup_cyserve, setup_nogil, setup_venv
    setup_venv(notes)
    if os.path.exists(S.VENV_PY):
        # cyserve's extension for bench/.venv's interpreter (3.12 by default), beside .venv's.
        why = setup_cyserve(notes)
        if why:
            notes.append(why)
        # The GIL-free WebSocket echo (examples/ws_echo_nogil.pyx) into bench/.build/.
        why = setup_nogil(notes)
        if why:
            notes.append(why)
    if not processes.have("go"):
        notes.append("Go peer and load client: `go` is not installed")
        return
    os.makedirs(S.BUILD, exist_ok=True)
    newest = max(os.path.getmtime(os.path.join(d, f)) for d, _, fs in os.walk(GO_SRC) for f in fs)
    for pkg, out in (("./server", GO_SERVER), ("./load", GO_LOAD)):
        if os.path.exists(out) and os.path.getmtime(out) >= newest:
            continue
        say(f"setup: go build {pkg} (bench/peers/goproto)")
        r = subprocess.run(["go", "build", "-o", out, pkg], cwd=GO_SRC, capture_output=True, text=True)
        if r.returncode != 0:
            notes.append(f"goproto {pkg}: go build failed: {r.stderr.strip()[-300:]}")


def make_certificate(tmp):
    """(certfile, keyfile): one self-signed ECDSA P-256 certificate for every server."""
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "7", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    os.chmod(key, 0o644)  # nginx's workers run as nobody when started by root
    return cert, key


def availability(servers):
    """{name: None or why it cannot run}."""
    from bench.http.run import probe_modules  # the same probe as the HTTP suite's
    mods = sorted({m for s in servers for m in s.requires} | {s.app for s in servers if s.app})
    env = S.py_env()
    env["PYTHONPATH"] += os.pathsep + S.BUILD
    probe = probe_modules(S.VENV_PY, mods + ["cyserve"], env) if os.path.exists(S.VENV_PY) else {}
    out = {}
    for s in servers:
        why = None
        if s.group == "go":
            why = None if os.path.exists(GO_SERVER) else "Go peer not built (see setup notes)"
        elif s.name == "nginx":
            why = None if processes.have("nginx") else "nginx not installed"
        elif not os.path.exists(S.VENV_PY):
            why = "bench/.venv missing (python bench/http/run.py --quick makes it)"
        else:
            for m in ((s.app,) if s.app else ()) + tuple(s.requires):
                v = probe.get(m, "ERROR not probed")
                if v.startswith("ERROR"):
                    why = f"{m}: {v[6:]}"
                    if m == s.app and s.missing and f"No module named '{m}'" in v:
                        why = s.missing
                    break
        out[s.name] = why
    return out


# ---------------------------------------------------------------------------------------------
# Clients. Each returns {"count", "errors", "p50_ms", "p99_ms", ...}.

def client(argv, timeout):
    """(stdout, stderr, returncode) of a load client pinned to the client CPU; one that outlives
    `timeout` is killed and reported with what it printed (returncode None), never raised: one
    stuck cell must not lose the run."""
    try:
        p = subprocess.run(pinned(argv, CLIENT_CPU), capture_output=True, text=True, timeout=timeout)
        return p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        def text(b):
            return b.decode("utf-8", "replace") if isinstance(b, bytes) else (b or "")
        return text(e.stdout), text(e.stderr) + f"\nkilled after {timeout} s", None


def parse_h2load(out):
    """Figures from h2load's summary: requests done and succeeded, 2xx, the mean request time
    (h2load prints no percentiles) and the protocol it negotiated."""
    res = {"client": "h2load", "count": 0, "errors": 0, "p50_ms": None, "p99_ms": None,
           "mean_ms": None, "protocol": None}
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                  r"(\d+) errored, (\d+) timeout", out)
    if m:
        total, started, done, ok, failed, errored, timeout = (int(x) for x in m.groups())
        res["count"] = ok
        res["errors"] = failed + errored + timeout
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if m:
        res["count"] = min(res["count"], int(m.group(1))) if res["count"] else int(m.group(1))
        res["errors"] += int(m.group(3)) + int(m.group(4))
    m = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out)
    if m:
        res["mean_ms"] = harness._ms(m.group(3))
    m = re.search(r"Application protocol: (\S+)", out)
    if m:
        res["protocol"] = m.group(1)
    return res


def run_h2load(port, tls, duration):
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/plaintext"
    # -N: a connection that stays silent for 5 s is dropped rather than waited for (h2load's
    # timing mode otherwise waits for every connection to finish).
    argv = ["h2load", "-c", str(H2_CLIENTS), "-m", str(H2_STREAMS), "-t", "1", "-D", str(duration),
            "-N", "5", url]
    out, err, rc = client(argv, duration + 30)
    res = parse_h2load(out)
    if res["protocol"] != ("h2" if tls else "h2c") or rc is None:
        res["errors"] += 1  # not HTTP/2 (the figure would be another workload's), or killed
    res["raw"] = out[-1500:] + err[-500:]
    return res


def run_wrk_https(port, duration):
    argv = ["wrk", "--latency", "-t", "1", "-c", str(WRK_CONNECTIONS), "-d", f"{duration}s",
            "--timeout", "4s", f"https://127.0.0.1:{port}/plaintext"]
    out, err, rc = client(argv, duration + 30)
    res = harness.parse_wrk(out)
    res["count"] = res.pop("requests")
    res["errors"] += res.pop("non2xx") + (rc != 0)
    res["raw"] = out[-1500:] + err[-500:]
    return res


def run_load(args, duration):
    """bench/peers/goproto/load: ws or tls; its JSON line, with count/errors as the others."""
    out, err, rc = client([GO_LOAD] + args + ["-d", f"{duration}s"], duration + 30)
    try:
        res = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"client": "goproto-load", "count": 0, "errors": 1, "p50_ms": None, "p99_ms": None,
                "raw": out[-500:] + err[-1000:]}
    res["client"] = "goproto-load"
    res["errors"] = res.get("errors", 0) + res.get("mismatches", 0)
    res.pop("per_s", None)
    return res


def tls_probe(port):
    """(version, cipher, alpn) a default OpenSSL client (Python's ssl, as wrk and h2load) gets."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                ctx.wrap_socket(raw) as s:
            return s.version(), s.cipher()[0], s.selected_alpn_protocol()
    except (OSError, ssl.SSLError) as e:
        return None, f"{type(e).__name__}: {e}", None


def ws_probe(port):
    """None when /ws echoes one text message, or why not (a stdlib client: the handshake and one
    masked frame each way)."""
    import base64
    key = base64.b64encode(os.urandom(16)).decode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    return "closed during the handshake"
                data += chunk
            head, rest = data.split(b"\r\n\r\n", 1)
            if not head.startswith(b"HTTP/1.1 101"):
                return f"handshake answered {head.splitlines()[0][:80]!r}"
            payload, mask = b"probe-0123456789-0123456789-0123", os.urandom(4)
            s.sendall(bytes([0x81, 0x80 | len(payload)]) + mask
                      + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
            while len(rest) < 2 + len(payload):
                chunk = s.recv(4096)
                if not chunk:
                    return "closed before the echo"
                rest += chunk
            if rest[:2 + len(payload)] != bytes([0x81, len(payload)]) + payload:
                return f"echo was {rest[:40]!r}"
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


# ---------------------------------------------------------------------------------------------
# Measuring.

def measure(run, workload, duration, warmup):
    """One cell on a running server: the client's figures plus server_cpu_s, per_cpu_s, per_s
    and the peak RSS of the server's tree."""
    # The warm-up is a cell of its own, before the server's CPU time is read (not h2load's
    # --warm-up-time, which the server's CPU time would include): the first connections' TLS
    # handshakes, the allocator's and the caches' first growth happen there.
    if workload == "https" and warmup:
        run_wrk_https(run.port, warmup)
    elif workload in ("h2-tls", "h2c") and warmup:
        run_h2load(run.port, workload == "h2-tls", warmup)
    cpu0 = tree_cpu_seconds(run.pid)
    with RssSampler(run.pid) as rss:
        if workload == "ws-echo":
            res = run_load(["ws", "-url", f"ws://127.0.0.1:{run.port}/ws", "-c", str(WS_CONNECTIONS),
                            "-size", str(WS_SIZE)], duration)
        elif workload == "https":
            res = run_wrk_https(run.port, duration)
        elif workload in ("tls-new", "tls-resume"):
            res = run_load(["tls", "-addr", f"127.0.0.1:{run.port}", "-c", str(TLS_CONNECTORS)]
                           + (["-resume"] if workload == "tls-resume" else []), duration)
        else:
            res = run_h2load(run.port, workload == "h2-tls", duration)
    cpu = tree_cpu_seconds(run.pid) - cpu0
    res["server_cpu_s"] = round(cpu, 3)
    res["per_s"] = res["count"] / duration
    res["per_cpu_s"] = res["count"] / cpu if cpu >= MIN_CPU_S and res["count"] else None
    res["rss_peak_kib"] = rss.peak
    return res


def wait_idle(run, limit=1.0):
    end = time.monotonic() + limit
    prev = tree_cpu_seconds(run.pid)
    while time.monotonic() < end:
        time.sleep(0.05)
        cur = tree_cpu_seconds(run.pid)
        if cur - prev < 0.005:
            return True
        prev = cur
    return False


def visit(server, workloads, rnd, cfg, tmp, tls, runs, probes, t0):
    """One round's visit to one server: one pinned instance per transport, its cells in turn."""
    for transport in TRANSPORTS:
        mine = [w for w in workloads if w in server.workloads and WORKLOADS[w][0] == transport]
        if not mine:
            continue
        port = processes.free_port()
        argv, env, cleanup = server.command(transport, port, tls, tmp)
        log = os.path.join(tmp, f"{server.name}-{transport}-{port}.log")
        try:
            run = processes.start_server(argv, port, log, env=env, cwd=ROOT, cpus=SERVER_CPU,
                                         cleanup=cleanup)
        except RuntimeError as e:
            say(f"  {server.name} ({transport}): failed to start: {str(e)[:300]}")
            for w in mine:
                runs.append({"round": rnd, "server": server.name, "workload": w,
                             "status": f"failed to start: {str(e)[:200]}"})
            continue
        try:
            if transport == "tls" and server.name not in probes:
                probes[server.name] = dict(zip(("tls_version", "cipher", "alpn"), tls_probe(port)))
            if transport == "ws" and rnd == 0:
                why = ws_probe(port)
                if why:
                    say(f"  {server.name}: /ws does not echo: {why}")
            for w in mine:
                res = measure(run, w, cfg["duration"], cfg["warmup"])
                # A WebSocket that never got an answer is counted (stalled) and shown, not
                # an error that voids the cell: the others' round trips are still the figure.
                status = "ok" if res["count"] and not res.get("mismatches") and \
                    res["errors"] <= res.get("stalled_connections", 0) else \
                    ("none completed" if not res["count"] else "errors")
                if status == "ok":
                    res.pop("raw", None)
                rec = {"round": rnd, "server": server.name, "workload": w, "status": status}
                rec.update(res)
                runs.append(rec)
                per = f"{res['per_cpu_s']:>9.0f}/cpu-s" if res.get("per_cpu_s") else " " * 15
                lat = (f"p99 {res['p99_ms']:.2f} ms" if res.get("p99_ms") else
                       f"mean {res['mean_ms']:.2f} ms" if res.get("mean_ms") else "")
                extra = f" stalled {res['stalled_connections']}" if res.get("stalled_connections") else ""
                if res.get("errors"):
                    extra += f" errors {res['errors']}"
                    if res.get("first_error"):
                        extra += f" ({res['first_error'][:120]})"
                say(f"[{time.monotonic() - t0:6.1f}s] r{rnd} {server.name:<16} {w:<10} "
                    f"{res['per_s']:>9.0f}/s {per} {lat}{extra}")
                if not wait_idle(run):
                    say(f"  {server.name}: still busy a second after {w}")
        finally:
            run.stop()


# ---------------------------------------------------------------------------------------------
# Summary and report (stdlib only: tests/bench/test_protocols_report.py checks them).

def exclude_handshakes(runs, connections):
    """Copies of the runs where each https cell's per_cpu_s leaves out the server CPU time of its
    connections' handshakes: `connections` times the CPU cost of one new connection measured by
    the same server's tls-new cell of the same round (kept raw as per_cpu_s_raw). Without such a
    cell the figure stays as it is, flagged handshakes_in."""
    hs = {(r["round"], r["server"]): r["per_cpu_s"] for r in runs
          if r["workload"] == "tls-new" and r.get("per_cpu_s")}
    out = []
    for r in runs:
        if r["workload"] == "https" and r.get("per_cpu_s"):
            r = dict(r, per_cpu_s_raw=r["per_cpu_s"])
            per_hs = hs.get((r["round"], r["server"]))
            cpu = r["server_cpu_s"] - connections / per_hs if per_hs else 0
            if per_hs and cpu > 0:
                r["per_cpu_s"] = r["count"] / cpu
            else:
                r["handshakes_in"] = True
        out.append(r)
    return out


def summarize(result):
    """{workload: {server: {"per_s", "per_cpu_s", "p99_ms", "mean_ms", "errors", "stalled",
    "x_<ref>": spread of the per-round ratios per server CPU-second}}}."""
    runs = exclude_handshakes([r for r in result["runs"] if r.get("status") == "ok"],
                              result["config"]["wrk_connections"])
    index = {(r["round"], r["workload"], r["server"]): r for r in runs}
    out = {}
    for r in runs:
        out.setdefault(r["workload"], {}).setdefault(r["server"], []).append(r)
    summary = {}
    for w, by_server in out.items():
        summary[w] = {}
        for name, rs in by_server.items():
            fig = {"per_s": spread([r["per_s"] for r in rs]),
                   "per_cpu_s": spread([r.get("per_cpu_s") for r in rs]),
                   "p99_ms": spread([r.get("p99_ms") for r in rs]),
                   "mean_ms": spread([r.get("mean_ms") for r in rs]),
                   "stalled": max(r.get("stalled_connections", 0) for r in rs),
                   "handshakes_in": sum(1 for r in rs if r.get("handshakes_in")),
                   "resumed_share": (sum(r.get("resumed", 0) for r in rs) / sum(r["count"] for r in rs)
                                     if w == "tls-resume" else None),
                   "rss_peak_kib": max(r.get("rss_peak_kib") or 0 for r in rs)}
            for ref in REFS.get(w, ()):
                ratios = []
                for r in rs:
                    base = index.get((r["round"], w, ref))
                    if base and base.get("per_cpu_s") and r.get("per_cpu_s"):
                        ratios.append(r["per_cpu_s"] / base["per_cpu_s"])
                fig["x_" + ref] = spread(ratios)
            summary[w][name] = fig
    return summary


def _n(v, fmt="{:,.0f}"):
    return "–" if v is None else fmt.format(v)


def _cell(st, fmt="{:,.0f}"):
    if not st:
        return "–"
    if st["n"] > 1 and st["min"] != st["max"]:
        return f"{fmt.format(st['median'])} ({fmt.format(st['min'])}–{fmt.format(st['max'])})"
    return fmt.format(st["median"])


def _why_missing(result, server, workload):
    info = result["servers"].get(server, {})
    if not info.get("available", True):
        return f"unavailable: {info.get('reason')}"
    rs = [r for r in result["runs"] if r["server"] == server and r["workload"] == workload]
    if not rs:
        return "not run"
    bad = rs[-1]
    why = bad.get("status", "?")
    if bad.get("first_error"):
        why += f": {bad['first_error'][:100]}"
    elif why == "errors" and bad.get("errors"):
        why += f" ({bad['errors']})"
    return why


def markdown(result):
    s = result["summary"]
    cfg = result["config"]
    lines = [f"# Protocol workloads, {result['started']}", "",
             f"Pinned: each server on CPU {cfg['server_cpu']} with one worker, the client on CPU "
             f"{cfg['client_cpu']}; {cfg['rounds']} round(s) of {cfg['duration_s']} s cells, servers "
             f"interleaved; medians over rounds (min–max). Per server CPU-second: the count divided by "
             f"the server tree's CPU time over the cell. Ratios: the median of the per-round ratios "
             f"per server CPU-second. Git {result['git']}; load average {result['machine']['loadavg_start']} "
             f"at the start, {result['machine']['loadavg_end']} at the end.", ""]
    for w, (_, unit) in WORKLOADS.items():
        names = [n for n, i in result["servers"].items() if w in i["workloads"]]
        if not names:
            continue
        refs = [r for r in REFS.get(w, ()) if r in result["servers"]]
        lat = "p99 ms" if w in ("ws-echo", "https", "tls-new", "tls-resume") else "mean ms"
        lines += [f"## {w}", "", result["descriptions"].get(w, ""), "",
                  f"| server | {unit}/s | {unit} per server CPU-s | {lat} | "
                  + "".join(f"× {r} | " for r in refs),
                  "|---|---:|---:|---:|" + "---:|" * len(refs)]

        def key(n):
            f = s.get(w, {}).get(n)
            return -(f["per_cpu_s"]["median"] if f and f["per_cpu_s"] else -1)

        for n in sorted(names, key=key):
            f = s.get(w, {}).get(n)
            label = result["servers"][n]["label"]
            if not f:
                lines.append(f"| {label} | {_why_missing(result, n, w)} |  |  |" + " |" * len(refs))
                continue
            latst = f["p99_ms"] if lat == "p99 ms" else f["mean_ms"]
            stalled = f" ({f['stalled']} of {cfg['ws_connections']} connections unanswered " \
                "during the cell)" if f.get("stalled") else ""
            if f.get("resumed_share") is not None:
                stalled += f" ({f['resumed_share']:.0%} resumed)"
            if f.get("handshakes_in"):
                stalled += f" (handshakes included in {f['handshakes_in']} round(s): no tls-new figure)"
            lines.append(f"| {label}{stalled} | {_cell(f['per_s'])} | {_cell(f['per_cpu_s'])} | "
                         f"{_cell(latst, '{:.2f}')} | "
                         + "".join(f"{_cell(f.get('x_' + r), '{:.2f}')} | " for r in refs))
        lines.append("")
    lines += ["## Targets", "", "| workload | server | against | target | measured | |",
              "|---|---|---|---:|---:|---|"]
    for w, name, ref, want in TARGETS:
        if name not in result["servers"] or ref not in result["servers"]:
            continue
        st = s.get(w, {}).get(name, {}).get("x_" + ref)
        if st:
            verdict = "met" if st["median"] >= want else "missed"
            got = f"{st['median']:.2f}×"
        else:
            if not s.get(w, {}).get(name):
                why = _why_missing(result, name, w)
            elif not s.get(w, {}).get(ref):
                why = _why_missing(result, ref, w)
            else:  # both served, but never both with enough CPU time to divide by in one round
                why = f"no round with a figure per CPU-second for both (a cell under {MIN_CPU_S:g} s " \
                      "of server CPU)"
            verdict = "not measured: " + why
            got = "–"
        lines.append(f"| {w} | {name} | {ref} | ≥ {want:g}× | {got} | {verdict} |")
    lines.append("")
    tls_rows = [(n, p) for n, p in result.get("tls", {}).items()]
    if tls_rows:
        lines += ["## TLS negotiated (a default OpenSSL client, as wrk and h2load)", "",
                  "| server | version | cipher | ALPN |", "|---|---|---|---|"]
        for n, p in tls_rows:
            lines.append(f"| {result['servers'][n]['label']} | {p.get('tls_version') or '–'} | "
                         f"{p.get('cipher') or '–'} | {p.get('alpn') or '–'} |")
        lines.append("")
    lines += ["## Servers", "", "| server | version | note |", "|---|---|---|"]
    for n, i in result["servers"].items():
        lines.append(f"| {i['label']} (`{n}`) | {i.get('version', '')} | "
                     f"{i['note'] or ''}{'; ' if i['note'] and i['reason'] else ''}"
                     f"{('unavailable: ' + i['reason']) if i['reason'] else ''} |")
    if result.get("setup_notes"):
        lines += ["", "Setup: " + "; ".join(result["setup_notes"])]
    return "\n".join(lines) + "\n"


DESCRIPTIONS = {
    "ws-echo": f"{WS_CONNECTIONS} WebSockets, one {WS_SIZE}-byte text message in flight on each "
               "(bench/peers/goproto/load ws).",
    "https": f"wrk -t1 -c{WRK_CONNECTIONS} https://…/plaintext, keep-alive, after a warm-up cell; per "
             f"server CPU-second without the {WRK_CONNECTIONS} handshakes of the cell's connections "
             "(their cost from the same round's tls-new cell).",
    "tls-new": f"New TLS connections, {TLS_CONNECTORS} at once, each: full handshake, GET /plaintext, "
               "close (bench/peers/goproto/load tls).",
    "tls-resume": "The same with a client session cache: every handshake after the first resumes "
                  "(TLS 1.3 ticket, PSK with ECDHE).",
    "h2-tls": f"h2load -c {H2_CLIENTS} -m {H2_STREAMS} -t 1 https://…/plaintext (ALPN h2).",
    "h2c": f"h2load -c {H2_CLIENTS} -m {H2_STREAMS} -t 1 http://…/plaintext (prior knowledge).",
}


def versions(servers):
    out = {}
    from bench.common import interpreter
    from bench.http.run import probe_modules
    mods = ["cyserve", "granian", "uvicorn", "websockets"]
    probe = probe_modules(S.VENV_PY, mods) if os.path.exists(S.VENV_PY) else {}
    go = subprocess.run(["go", "version"], capture_output=True, text=True).stdout.strip() \
        if processes.have("go") else ""
    py = interpreter.label(interpreter.describe(S.VENV_PY)) if os.path.exists(S.VENV_PY) else "?"
    for s in servers:
        if s.group == "cyserve":
            out[s.name] = f"cyserve {probe.get('cyserve', '?')}; {py}"
        elif s.group == "go":
            out[s.name] = f"{go}; gorilla/websocket v1.5.3"
        elif s.name == "nginx" and processes.have("nginx"):
            out[s.name] = subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip()
        else:
            out[s.name] = ", ".join(f"{m} {probe.get(m, '?')}" for m in s.requires if m in mods) + f"; {py}"
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round of 1 s cells")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=2, help="seconds per cell")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up seconds (https, h2)")
    ap.add_argument("--servers", help="comma-separated (default: all)")
    ap.add_argument("--workloads", help="comma-separated (default: all)")
    ap.add_argument("--no-setup", action="store_true")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--report", metavar="JSON", help="print the Markdown report of a result file again "
                    "(summarized by this version) and exit")
    args = ap.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            result = json.load(f)
        result["summary"] = summarize(result)
        sys.stdout.write(markdown(result))
        return 0
    if args.quick:
        args.rounds, args.duration = 1, 1
    workloads = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    chosen = [BY_NAME[n] for n in args.servers.split(",")] if args.servers else list(SERVERS)
    chosen = [s for s in chosen if set(s.workloads) & set(workloads)]
    notes = []
    setup(notes, args.no_setup)
    for n in notes:
        say(f"setup: {n}")
    reasons = availability(chosen)
    for name, why in reasons.items():
        if why:
            say(f"skip {name}: {why}")
    live = [s for s in chosen if not reasons[s.name]]
    cfg = {"duration": args.duration, "warmup": args.warmup}
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = [round(x, 2) for x in os.getloadavg()]
    runs, probes = [], {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cyserve-proto-") as tmp:
        os.chmod(tmp, 0o755)
        tls = make_certificate(tmp)
        for rnd in range(args.rounds):
            order = live[rnd % len(live):] + live[:rnd % len(live)] if live else []
            for server in order:
                try:
                    visit(server, workloads, rnd, cfg, tmp, tls, runs, probes, t0)
                except Exception as e:  # noqa: BLE001 - one server's failure is its cells' status
                    say(f"  {server.name}: round {rnd} failed: {type(e).__name__}: {e}")
                    runs.append({"round": rnd, "server": server.name, "workload": "?",
                                 "status": f"failed: {type(e).__name__}: {str(e)[:200]}"})
    from bench.http.run import git_rev, machine_info
    ver = versions(chosen)
    result = {
        "schema": 1, "kind": "protocols",
        "started": started.isoformat(timespec="seconds"),
        "elapsed_s": round(time.monotonic() - t0, 1),
        "command": "bench/http/protocols.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": {"rounds": args.rounds, "duration_s": args.duration, "warmup_s": args.warmup,
                   "server_cpu": SERVER_CPU, "client_cpu": CLIENT_CPU, "ws_connections": WS_CONNECTIONS,
                   "ws_message_bytes": WS_SIZE, "wrk_connections": WRK_CONNECTIONS,
                   "tls_connectors": TLS_CONNECTORS, "h2load": f"-c {H2_CLIENTS} -m {H2_STREAMS} -t 1",
                   "pipelining": False},
        "machine": dict(machine_info(), loadavg_start=load_start,
                        loadavg_end=[round(x, 2) for x in os.getloadavg()]),
        "git": git_rev(),
        "workloads": workloads,
        "descriptions": {w: DESCRIPTIONS[w] for w in workloads},
        "servers": {s.name: {"label": s.label, "group": s.group, "note": s.note,
                             "workloads": [w for w in s.workloads if w in workloads],
                             "version": ver.get(s.name, ""), "available": not reasons[s.name],
                             "reason": reasons[s.name]} for s in chosen},
        "tls": probes,
        "setup_notes": notes,
        "runs": runs,
    }
    result["summary"] = summarize(result)
    os.makedirs(args.out, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    for name in (f"protocols-{stamp}.json", "protocols-latest.json"):
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    md = os.path.join(args.out, "protocols-latest.md")
    with open(md, "w") as f:
        f.write(markdown(result))
    say(f"done: {os.path.relpath(md, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
