"""The servers of the suite: how to start each, which routes it has, whether it can run here.

A Server's `command(port, threads, tmp)` returns (argv, env, cleanup). `threads` is the number of
worker threads or processes the server is allowed: 1 in the pinned mode (one CPU), the machine's
core count in the all-core mode; servers that cannot use more than one core say so with
scales=False and are run the same way in both modes.

To add a server: write its app (bench/peers/python/ for a Python peer, bench/http/apps/ for one of
cyserve's, bench/peers/ for the rest) answering the routes of bench/http/workloads.py, append a
Server(...) to SERVERS below with its command, its routes (`workloads`; the others are reported
"n/a") and an `available` check that returns None or a reason. The runner validates every route before measuring, so a wrong body shows up as "invalid".
"""

import os
import shutil
import tempfile

from bench.http import workloads as W

HERE = os.path.dirname(os.path.abspath(__file__))
# bench/: the peers, the data, and what setup builds (bench/.venv, bench/.build), shared by the
# HTTP suite's drivers and bench/micro/.
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
BUILD = os.path.join(BENCH, ".build")
VENV = os.path.join(BENCH, ".venv")
# CYSERVE_BENCH_PYTHON replaces bench/.venv's interpreter (the CI smoke test runs the stdlib-only
# peers with cyserve's own venv, which has none of the third-party servers).
VENV_PY = os.environ.get("CYSERVE_BENCH_PYTHON") or os.path.join(VENV, "bin", "python")
# The interpreter of the *-ft servers: a free-threaded CPython (3.14t, `make python-ft`) with
# cyserve built for it in src/cyserve and msgpack installed. Beside the GIL build's rows in the
# same run, they compare N threads of one process with N processes.
FT_PY = os.environ.get("CYSERVE_BENCH_PYTHON_FT") or VENV_PY
ALL = tuple(W.WORKLOADS)
STATIC = ("plaintext", "welcome", "transfer")
NOGIL = ("plaintext", "fib", "welcome", "loop", "transfer")


def py_env(python=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + os.path.join(ROOT, "src")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONWARNINGS", None)
    return env


class Server:
    def __init__(self, name, label, group, command, workloads=ALL, scales=True, requires=(),
                 note="", python=VENV_PY):
        self.name, self.label, self.group = name, label, group
        self._command = command
        self.workloads = tuple(workloads)
        self.scales = scales
        self.requires = requires  # Python modules the app imports (checked in bench/.venv)
        self.note = note
        self.python = python

    def command(self, port, threads, tmp):
        return self._command(self, port, threads, tmp)

    def __repr__(self):
        return f"Server({self.name})"


def _py(module_args):
    def cmd(s, port, threads, tmp):
        return [s.python, "-m"] + [a.format(port=port, threads=threads) for a in module_args], py_env(), None
    return cmd


def _go(binary):
    def cmd(s, port, threads, tmp):
        return [os.path.join(BUILD, binary), "-addr", f"127.0.0.1:{port}", "-threads", str(threads),
                "-data", W.DATA], None, None
    return cmd


def _nginx(s, port, threads, tmp):
    prefix = tempfile.mkdtemp(prefix="nginx-", dir=tmp)
    with open(os.path.join(BENCH, "peers", "nginx", "nginx.conf.template")) as f:
        conf = f.read()
    for k, v in {"@WORKERS@": str(threads), "@PREFIX@": prefix, "@PORT@": str(port)}.items():
        conf = conf.replace(k, v)
    with open(os.path.join(prefix, "nginx.conf"), "w") as f:
        f.write(conf)
    # A copy inside the temporary prefix: nginx's workers run as `nobody` when started by root and
    # must be able to read the file.
    shutil.copy(W.TRANSFER_PATH, os.path.join(prefix, "transfer.json"))
    os.chmod(prefix, 0o755)
    os.chmod(os.path.join(prefix, "transfer.json"), 0o644)
    return [shutil.which("nginx") or "/usr/sbin/nginx", "-p", prefix, "-c",
            os.path.join(prefix, "nginx.conf")], None, None


def _lwan(s, port, threads, tmp):
    # Lwan serves a folder of files named after the routes (its own static file handler).
    root = tempfile.mkdtemp(prefix="lwan-", dir=tmp)
    bodies = W.expected_bodies()
    for w in STATIC:
        with open(os.path.join(root, w), "wb") as f:
            f.write(bodies[w])
    os.chmod(root, 0o755)
    # A configuration file rather than -r/-l: with those, Lwan still looks for ./lwan.conf and
    # exits when it is missing. Lwan's threads follow the run mode like every other server's.
    conf = os.path.join(tmp, f"lwan-{port}.conf")
    with open(conf, "w") as f:
        f.write(f"threads = {threads}\nlistener 127.0.0.1:{port}\n"
                f"site {{\n    serve_files / {{\n        path = {root}\n    }}\n}}\n")
    return [os.environ["LWAN_BIN"], "-c", conf], None, None


def _cyserve(app_ref, processes=False, extra=()):
    """processes=True: N worker processes of one thread each instead of one process of N
    threads, for Python handlers (one GIL per process), like granian's and uvicorn's --workers."""
    def cmd(s, port, threads, tmp):
        env = py_env()
        env["PYTHONPATH"] += os.pathsep + BUILD  # the compiled nogil handlers
        scale = ["--processes", str(threads), "--threads", "1"] if processes and threads > 1 \
            else ["--threads", str(threads)]
        return [s.python, "-m", "cyserve", app_ref, "--host", "127.0.0.1", "--port", str(port)] \
            + scale + list(extra), env, None
    return cmd


def _gunicorn(worker):
    def cmd(s, port, threads, tmp):
        # gunicorn's documented default for sync workers is 2 x cores + 1; gevent: one per core.
        n = 2 * threads + 1 if worker == "sync" else threads
        argv = [s.python, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", "-w", str(n), "-k", worker,
                "--backlog", "2048", "--log-level", "warning", "bench.peers.python.wsgi_app:app"]
        if worker == "gevent":
            argv[argv.index("-k") + 2:argv.index("-k") + 2] = ["--worker-connections", "1000"]
        return argv, py_env(), None
    return cmd


# --metrics-bind on a port the kernel picks: the *-metrics rows count, nobody scrapes them.
METRICS_ON = ("--metrics-bind", "127.0.0.1:0")

SERVERS = [
    Server("cyserve-nogil", "cyserve (nogil Cython handlers)", "cyserve",
           _cyserve("bench.http.apps.cyserve_nogil_app:app"), workloads=NOGIL,
           note="GIL-free Cython handlers (bench/http/apps/cyserve_nogil.pyx); /msgpack and /json need "
                "Python objects and are measured in cyserve-py"),
    Server("cyserve-static", "cyserve (app.static)", "cyserve",
           _cyserve("bench.http.apps.cyserve_static_app:app"), workloads=STATIC,
           note="responses registered with app.static(): the C core answers alone"),
    Server("cyserve-files", "cyserve (app.files)", "cyserve",
           _cyserve("bench.http.apps.cyserve_files_app:app"), workloads=STATIC,
           note="the same bodies as files on disk: opened, checked and sent with sendfile per request"),
    Server("cyserve-py", "cyserve (Python handlers)", "cyserve",
           _cyserve("bench.http.apps.cyserve_py:app", processes=True), requires=("msgpack",),
           note="all-core mode: --processes N --threads 1 (one GIL per process)"),
    Server("cyserve-wsgi", "cyserve (WSGI app)", "cyserve",
           _cyserve("bench.peers.python.wsgi_app:app", processes=True), requires=("msgpack",),
           note="the WSGI peers' app, unmodified (cyserve/wsgi.py); --processes N --threads 1"),
    # The metrics' cost (--metrics-bind): the same apps with the counters on and their endpoint
    # never scraped, on a port of the kernel's choosing. Beside the plain rows in the same
    # rounds, each round's ratio is what counting costs (docs/benchmarks.md, "Session 16").
    Server("cyserve-static-metrics", "cyserve (app.static, metrics on)", "cyserve",
           _cyserve("bench.http.apps.cyserve_static_app:app", extra=METRICS_ON), workloads=STATIC,
           note="cyserve-static with --metrics-bind (counted, never scraped)"),
    Server("cyserve-wsgi-metrics", "cyserve (WSGI app, metrics on)", "cyserve",
           _cyserve("bench.peers.python.wsgi_app:app", processes=True, extra=METRICS_ON),
           requires=("msgpack",),
           note="cyserve-wsgi with --metrics-bind (counted, never scraped)"),
    Server("cyserve-asgi", "cyserve (ASGI app)", "cyserve",
           _cyserve("bench.peers.python.asgi_app:app", processes=True), requires=("msgpack",),
           note="the ASGI peers' app (uvicorn's, granian's), unmodified (cyserve/asgi.py); "
                "--processes N --threads 1, one event loop thread per process"),
    Server("cyserve-py-ft", "cyserve (Python handlers, free-threaded)", "cyserve",
           _cyserve("bench.http.apps.cyserve_py:app"), requires=("msgpack",), python=FT_PY,
           note="one process of N threads on a free-threaded CPython (CYSERVE_BENCH_PYTHON_FT): "
                "the Python handlers run on every worker at once"),
    Server("cyserve-py-own-ft", "cyserve (Python handlers, free-threaded, records per thread)",
           "cyserve", _cyserve("bench.http.apps.cyserve_py_own:app"), requires=("msgpack",),
           python=FT_PY,
           note="cyserve-py-ft with a copy of /json's records per thread "
                "(bench/http/apps/cyserve_py_own.py): tells contention on the app's shared "
                "objects from the server's"),
    Server("cyserve-wsgi-ft", "cyserve (WSGI app, free-threaded)", "cyserve",
           _cyserve("bench.peers.python.wsgi_app:app"), requires=("msgpack",), python=FT_PY,
           note="the WSGI peers' app, one process of N threads on a free-threaded CPython "
                "(CYSERVE_BENCH_PYTHON_FT)"),
    Server("cyserve-asgi-ft", "cyserve (ASGI app, free-threaded)", "cyserve",
           _cyserve("bench.peers.python.asgi_app:app", extra=("--asgi-loops", "thread")),
           requires=("msgpack",), python=FT_PY,
           note="the ASGI peers' app, one process of N threads on a free-threaded CPython "
                "(CYSERVE_BENCH_PYTHON_FT), each worker thread with an event loop of its own"),
    Server("go-fasthttp", "Go fasthttp", "go", _go("go-fasthttp")),
    Server("go-nethttp", "Go net/http", "go", _go("go-nethttp")),
    Server("nginx", "nginx", "c", _nginx, workloads=STATIC,
           note="return 200 / a static file; no handler for the computed routes (n/a)"),
    Server("lwan", "Lwan (LWAN_BIN)", "c", _lwan, workloads=STATIC, scales=False,
           note="optional: a binary built by the user from Lwan's source, named by LWAN_BIN"),
    Server("granian-rsgi", "granian RSGI", "python-async",
           _py(["granian", "--interface", "rsgi", "--host", "127.0.0.1", "--port", "{port}",
                "--workers", "{threads}", "--log-level", "warning", "bench.peers.python.rsgi_app:app"]),
           requires=("granian", "msgpack")),
    Server("granian-asgi", "granian ASGI", "python-async",
           _py(["granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", "{port}",
                "--workers", "{threads}", "--log-level", "warning", "bench.peers.python.asgi_app:app"]),
           requires=("granian", "msgpack")),
    Server("granian-wsgi", "granian WSGI", "python-wsgi",
           _py(["granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", "{port}",
                "--workers", "{threads}", "--log-level", "warning", "bench.peers.python.wsgi_app:app"]),
           requires=("granian", "msgpack")),
    # granian on a free-threaded CPython runs its --workers as threads of one process (it says
    # so at start: "Spawning worker-1 with TID"), the peer of the cyserve-*-ft rows.
    Server("granian-asgi-ft", "granian ASGI (free-threaded)", "python-async",
           _py(["granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", "{port}",
                "--workers", "{threads}", "--log-level", "warning", "bench.peers.python.asgi_app:app"]),
           requires=("granian", "msgpack"), python=FT_PY,
           note="N worker threads of one process on a free-threaded CPython (CYSERVE_BENCH_PYTHON_FT)"),
    Server("granian-wsgi-ft", "granian WSGI (free-threaded)", "python-wsgi",
           _py(["granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", "{port}",
                "--workers", "{threads}", "--log-level", "warning", "bench.peers.python.wsgi_app:app"]),
           requires=("granian", "msgpack"), python=FT_PY,
           note="N worker threads of one process on a free-threaded CPython (CYSERVE_BENCH_PYTHON_FT)"),
    Server("uvicorn", "uvicorn (uvloop, httptools)", "python-async",
           _py(["uvicorn", "--host", "127.0.0.1", "--port", "{port}", "--workers", "{threads}",
                "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning",
                "bench.peers.python.asgi_app:app"]),
           requires=("uvicorn", "uvloop", "httptools", "msgpack")),
    Server("gunicorn-sync", "gunicorn (sync)", "python-wsgi", _gunicorn("sync"),
           requires=("gunicorn", "msgpack"), note="2 x cores + 1 workers; closes every connection"),
    Server("gunicorn-gevent", "gunicorn (gevent)", "python-wsgi", _gunicorn("gevent"),
           requires=("gunicorn", "gevent", "msgpack")),
    Server("waitress", "waitress", "python-wsgi",
           _py(["waitress", "--listen=127.0.0.1:{port}", "--threads=4", "--backlog=2048",
                "bench.peers.python.wsgi_app:app"]),
           scales=False, requires=("waitress", "msgpack"), note="one process, 4 threads"),
    Server("bjoern", "bjoern", "python-wsgi", _py(["bench.peers.python.bjoern_app", "{port}"]),
           scales=False, requires=("bjoern", "msgpack"), note="one process, one thread (C event loop)"),
    Server("fastpysgi-wsgi", "fastpysgi WSGI", "python-wsgi",
           _py(["bench.peers.python.fastpysgi_app", "wsgi", "{port}", "{threads}"]),
           requires=("fastpysgi", "msgpack"),
           note="the WSGI peers' app; C on libuv and llhttp; all-core mode: its own worker processes"),
    Server("fastpysgi-asgi", "fastpysgi ASGI", "python-async",
           _py(["bench.peers.python.fastpysgi_app", "asgi", "{port}", "{threads}"]),
           requires=("fastpysgi", "msgpack"),
           note="the ASGI peers' app; all-core mode: its own worker processes"),
    Server("socketify", "socketify", "python-async", _py(["bench.peers.python.socketify_app", "{port}"]),
           scales=False, requires=("socketify", "msgpack"), note="one process"),
    Server("stdlib-threading", "http.server ThreadingHTTPServer", "python-minimal",
           _py(["bench.peers.python.stdlib_threading", "{port}"]), scales=False),
    Server("min-sequential", "minimal: sequential", "python-minimal",
           _py(["bench.peers.python.minimal", "sequential", "{port}"]), scales=False,
           note="one request per connection (Connection: close), as in the minimal designs"),
    Server("min-forking", "minimal: forking", "python-minimal",
           _py(["bench.peers.python.minimal", "forking", "{port}"]), scales=False,
           note="a process per connection, one request each"),
    Server("min-threading", "minimal: threading", "python-minimal",
           _py(["bench.peers.python.minimal", "threading", "{port}"]), scales=False,
           note="a thread per connection, one request each"),
    Server("min-asyncio", "minimal: asyncio", "python-minimal",
           _py(["bench.peers.python.minimal", "asyncio", "{port}"]), scales=False,
           note="asyncio streams, one request per connection"),
]

BY_NAME = {s.name: s for s in SERVERS}


def from_tree(server, tree):
    """`server` (a cyserve one) run from another checkout's build, as NAME-base: that tree's src/
    (built there with `make build`) goes first on the path, the apps and everything else stay
    this checkout's. Measured in the same rounds as `server`, it is an A/B of two builds on the
    same machine state (`bench/http/run.py --baseline TREE`)."""
    tree = os.path.abspath(tree)
    mine = os.path.join(ROOT, "src")

    def cmd(s, port, threads, tmp):
        argv, env, cleanup = server.command(port, threads, tmp)
        parts = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(os.path.join(tree, "src") if p == mine else p for p in parts)
        return argv, env, cleanup
    base = Server(server.name + "-base", f"{server.label} [base]", server.group, cmd,
                  workloads=server.workloads, scales=server.scales, requires=server.requires,
                  note=f"{server.note}; built from {tree}".lstrip("; "), python=server.python)
    base.tree = tree
    base.app_of = server.name
    return base


