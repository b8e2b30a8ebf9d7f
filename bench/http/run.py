"""cyserve's benchmark suite (docs/benchmarks.md): every server, every workload, one command.

    python bench/http/run.py --quick     a smoke run, a second per cell, 5 routes (make bench-quick)
    python bench/http/run.py --full      the real run: 3 interleaved rounds of 5 s cells (make bench),
                                         about 70 minutes on 2 cores; --duration 2 makes it about 35
    options: --servers a,b  --workloads x,y  --rounds N  --duration S  --no-setup  --out DIR

It installs what it needs first (wrk, nginx, hey, libev-dev with apt when root and missing; the
Python peers in bench/.venv from bench/peers/python/requirements.txt; the Go peers of bench/peers/go
into bench/.build; the nogil Cython app), prints one line for each peer that cannot run and why,
then measures:

  pinned   the primary mode: the server on CPU 0 (taskset) with one worker, wrk on CPU 1
           (-t1 -c64), so each figure is what one server core does
  allcore  the server with one worker per core, wrk unpinned (-t<cores>): flagged, because the
           client takes CPU from the server on the same machine
  hey      the second client, hey -n 2000 -c 50 (against the pinned server: one CPU)
  scaling  requests/s against worker threads, on /fib

Servers are interleaved: each round visits every server once, in an order rotated per round, and
the summary takes medians over rounds with min-max. Results: bench/results/<timestamp>.json and
latest.json, latest.md and PNG plots (bench/http/report.py).
"""

import argparse
import datetime
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)

from bench.common import interpreter, processes  # noqa: E402
from bench.common.procfs import tree_cpu_seconds  # noqa: E402
from bench.http import harness, report  # noqa: E402
from bench.http import servers as S  # noqa: E402
from bench.http import workloads as W  # noqa: E402

RESULTS = os.path.join(BENCH, "results")
CONNECTIONS = 64
SERVER_CPU, CLIENT_CPU = "0", "1"
SLOW = ("fib", "loop")  # a million Python iterations per request: ~80 ms in a Python handler

MODES = {
    # name: rounds, seconds per wrk cell, warm-up seconds, all-core workloads, hey paths, scaling
    # quick keeps under 3 minutes: all-core and scaling cells only where they say something.
    # (allcore_servers, hey_servers, scaling_servers: None for all)
    # quick measures five of the seven routes (/welcome is /plaintext's kind, /loop is /fib's);
    # all seven are still validated, byte for byte, in every server.
    "quick": dict(rounds=1, duration=1, warmup=0, allcore=("plaintext", "fib"), allcore_scalable_only=True,
                  workloads=("plaintext", "fib", "msgpack", "json", "transfer"),
                  hey=("plaintext",), scaling=("fib",),
                  allcore_servers=("cyserve-nogil", "go-fasthttp", "nginx"),
                  # the hey table: nginx, gunicorn, waitress and the minimal designs (plus ours)
                  # (not min-forking: 2,000 requests at ~900/s would take a tenth of the budget)
                  hey_servers=("nginx", "gunicorn-sync", "gunicorn-gevent", "waitress", "min-sequential",
                               "min-threading", "min-asyncio", "cyserve-nogil",
                               "cyserve-static", "cyserve-py", "go-fasthttp"),
                  scaling_servers=("cyserve-nogil", "go-fasthttp")),
    # full: every workload pinned; all-core on /plaintext, /fib and /json (the all-core figures
    # are flagged anyway: on 2 cores the client takes half the machine).
    "full": dict(rounds=3, duration=5, warmup=1, allcore=("plaintext", "fib", "json"), allcore_scalable_only=False,
                 hey=("welcome", "plaintext"), scaling=("fib", "plaintext"), allcore_servers=None,
                 hey_servers=None, scaling_servers=None),
}


def say(msg):
    print(msg, flush=True)


def sh(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, **kw)


# ---------------------------------------------------------------------------------------------
# Setup: every step reports what it could not do instead of failing the run.

def setup_tools(notes):
    missing = [p for p, tool in (("wrk", "wrk"), ("nginx", "nginx"), ("hey", "hey"))
               if not processes.have(tool)]
    if not os.path.exists("/usr/include/ev.h"):
        missing.append("libev-dev")  # bjoern's build needs libev's header
    if missing and os.geteuid() == 0 and processes.have("apt-get"):
        say(f"setup: apt-get install {' '.join(missing)}")
        sh(["apt-get", "update", "-qq"])
        for pkg in missing:
            r = sh(["apt-get", "install", "-y", "-qq", pkg], env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
            if r.returncode != 0:
                notes.append(f"apt-get install {pkg} failed: {r.stderr.strip()[-200:]}")
    if not processes.have("hey") and processes.have("go"):
        gobin = S.BUILD
        r = sh(["go", "install", "github.com/rakyll/hey@v0.1.4"], env=dict(os.environ, GOBIN=gobin))
        if r.returncode == 0:
            os.environ["PATH"] = gobin + os.pathsep + os.environ["PATH"]
        else:
            notes.append(f"hey: go install failed: {r.stderr.strip()[-200:]}")
    for tool in ("wrk", "nginx", "hey"):
        if not processes.have(tool):
            notes.append(f"{tool}: not installed (run as root with apt-get, or install it)")


def choose_interpreter():
    """(path, description, how it was chosen) of the interpreter bench/.venv is made from
    (bench/common/interpreter.py); a CYSERVE_BENCH_INTERPRETER that names none stops the run."""
    try:
        return interpreter.choose()
    except interpreter.InterpreterError as e:
        raise SystemExit(f"bench: {e}") from None


def setup_venv(notes):
    """bench/.venv on the chosen interpreter, with the pinned peers. A bench/.venv made from
    another interpreter (an older default, another BENCH_PYTHON) is made again: every Python
    server of a run must run on the one interpreter the run reports."""
    req = os.path.join(BENCH, "peers", "python", "requirements.txt")
    stamp = os.path.join(S.VENV, ".req-stamp")
    if os.environ.get("CYSERVE_BENCH_PYTHON"):
        say(f"setup: CYSERVE_BENCH_PYTHON={S.VENV_PY}: the Python servers run on it, bench/.venv is not used")
        base = None
    else:
        base, want, how = choose_interpreter()
        say(f"setup: the Python servers run on {interpreter.label(want)} ({base}; {how})")
        have = interpreter.venv_info(S.VENV)
        remake = None
        if have is None and os.path.lexists(S.VENV_PY):
            remake = "bench/.venv's interpreter does not run"
        elif have is not None and interpreter.label(have) != interpreter.label(want):
            remake = f"bench/.venv is {interpreter.label(have)}"
        if remake:
            say(f"setup: {remake}: making it again on {interpreter.label(want)}")
            if os.path.islink(S.VENV):
                os.unlink(S.VENV)
            else:
                shutil.rmtree(S.VENV)
    if not os.path.exists(S.VENV_PY) and base:
        say("setup: creating bench/.venv")
        r = sh([base, "-m", "venv", S.VENV])
        if r.returncode != 0:
            notes.append(f"bench/.venv: venv failed: {r.stderr.strip()[-200:]}")
            return
    if not os.path.exists(stamp) or os.path.getmtime(stamp) < os.path.getmtime(req):
        say("setup: pip install -r bench/peers/python/requirements.txt (into bench/.venv)")
        pip = [S.VENV_PY, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        r = sh(pip + ["-r", req])
        if r.returncode != 0:
            # Install one by one so that one peer without a wheel does not take the others down.
            with open(req) as f:
                pkgs = [ln.split("#")[0].strip() for ln in f]
            for pkg in pkgs:
                if pkg:
                    r1 = sh(pip + [pkg])
                    if r1.returncode != 0:
                        notes.append(f"{pkg}: pip install failed: {r1.stderr.strip().splitlines()[-1:]}")
        else:
            open(stamp, "w").close()
    # cyserve from this checkout, the way the main .venv sees it: src/ on the path.
    r = sh([S.VENV_PY, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    if r.returncode == 0:
        with open(os.path.join(r.stdout.strip(), "cyserve-src.pth"), "w") as f:
            f.write(os.path.join(ROOT, "src") + "\n")


def setup_go(notes):
    if not processes.have("go"):
        notes.append("Go peers: `go` is not installed")
        return
    src = os.path.join(BENCH, "peers", "go")
    os.makedirs(S.BUILD, exist_ok=True)
    newest = max(os.path.getmtime(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs)
    for name in ("nethttp", "fasthttp"):
        out = os.path.join(S.BUILD, f"go-{name}")
        if os.path.exists(out) and os.path.getmtime(out) >= newest:
            continue
        say(f"setup: go build {name}")
        r = sh(["go", "build", "-o", out, f"./{name}"], cwd=src)
        if r.returncode != 0:
            notes.append(f"go-{name}: go build failed: {r.stderr.strip()[-300:]}")


# What the extension is built from (the Makefile's CORE_SOURCES): a newer one means a rebuild.
CORE_SOURCES = ("src/cyserve/*.pyx", "src/cyserve/*.pxd", "src/cyserve/native/*.pyx", "src/cyserve/native/*.pxi",
                "src/cyserve/native/includes/*.pxd", "src/cyserve/csrc/*.c", "src/cyserve/csrc/*.h",
                "src/cyserve/csrc/*.S", "src/cyserve/include/cyserve/*.h", "setup.py")


def cyserve_extension(python):
    """The path of cyserve's extension built in place for `python` (its file name carries the
    interpreter's tag), or None when `python` does not run."""
    r = sh([python, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"])
    if r.returncode != 0 or not r.stdout.strip():
        return None
    return os.path.join(ROOT, "src", "cyserve", "_core" + r.stdout.strip())


def setup_cyserve(notes):
    """cyserve's extension for bench/.venv's interpreter, built in place in src/cyserve (the
    suite runs cyserve from the source tree, PYTHONPATH=src): its file name carries the
    interpreter's version, so it sits beside the one `make build` makes for cyserve's own .venv
    and neither replaces the other. Built when missing or older than a source; returns None or
    why cyserve cannot run on that interpreter."""
    so = cyserve_extension(S.VENV_PY)
    if so is None:
        return f"{S.VENV_PY} does not run"
    newest = max(os.path.getmtime(p) for g in CORE_SOURCES for p in glob.glob(os.path.join(ROOT, g)))
    if os.path.exists(so) and os.path.getmtime(so) >= newest:
        return None
    say(f"setup: building cyserve's extension for {interpreter.label(interpreter.describe(S.VENV_PY))} "
        f"({os.path.relpath(so, ROOT)})")
    env = dict(os.environ)
    for k in ("CYSERVE_DEBUG", "CYSERVE_SANITIZE", "CYSERVE_CORO_UCONTEXT"):
        env.pop(k, None)  # the benchmarked build is the release one, whatever this shell has set
    r = sh([S.VENV_PY, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT, env=env)
    if r.returncode != 0 or not os.path.exists(so):
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "rror" in ln), lines[-1] if lines else "no extension was written")
        return f"cyserve's extension does not build for {S.VENV_PY}: {why.strip()[:240]}"
    # setuptools skips an extension it deems up to date; the mtime marks this check as done.
    os.utime(so)
    return None


def setup_nogil(notes):
    """Build the nogil app; returns None or why it cannot be built."""
    r = sh([S.VENV_PY, os.path.join(HERE, "build_nogil.py")], cwd=ROOT, env=S.py_env())
    if r.returncode != 0:
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        # Cython's own diagnostic ("file.pyx:12:0: message") says more than its banner line.
        why = next((ln for ln in lines if ".pyx:" in ln and ": " in ln.split(".pyx:", 1)[1]),
                   next((ln for ln in lines if "rror" in ln), lines[-1] if lines else "?"))
        return f"nogil app does not build: {why.strip()[:240]}"
    return None


# ---------------------------------------------------------------------------------------------
# Availability and versions.

PROBE = r"""
import importlib, importlib.metadata as md, json, sys
out = {}
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
        try:
            out[m] = md.version(m)
        except md.PackageNotFoundError:
            out[m] = getattr(sys.modules[m], "__version__", "?")
    except Exception as e:
        out[m] = "ERROR " + type(e).__name__ + ": " + str(e).splitlines()[0][:200]
print(json.dumps(out))
"""


def probe_modules(python, modules, env=None):
    r = sh([python, "-c", PROBE] + list(modules), env=env or S.py_env(), cwd=ROOT)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {m: "ERROR " + (r.stderr.strip().splitlines() or ["no python"])[-1] for m in modules}


# The module each cyserve server imports its app from: probed before the run, so that an app that
# does not import is one "skip" line instead of a server that fails to start.
CYSERVE_APPS = {"cyserve-py": "bench.http.apps.cyserve_py", "cyserve-static": "bench.http.apps.cyserve_static_app",
                "cyserve-nogil": "bench.http.apps.cyserve_nogil_app", "cyserve-wsgi": "bench.peers.python.wsgi_app",
                "cyserve-asgi": "bench.peers.python.asgi_app",
                "cyserve-static-metrics": "bench.http.apps.cyserve_static_app",
                "cyserve-wsgi-metrics": "bench.peers.python.wsgi_app",
                "cyserve-files": "bench.http.apps.cyserve_files_app",
                "cyserve-py-ft": "bench.http.apps.cyserve_py", "cyserve-wsgi-ft": "bench.peers.python.wsgi_app",
                "cyserve-py-own-ft": "bench.http.apps.cyserve_py_own",
                "cyserve-asgi-ft": "bench.peers.python.asgi_app"}


def availability(servers, nogil_error):
    """{name: None or reason} and {name: version string}."""
    reasons, versions = {}, {}
    have_py = os.path.exists(S.VENV_PY)
    mods = sorted({m for s in servers for m in s.requires})
    probe = probe_modules(S.VENV_PY, mods) if have_py else {}
    cy = {}
    if have_py and any(s.group == "cyserve" for s in servers):
        env = S.py_env()
        env["PYTHONPATH"] += os.pathsep + S.BUILD
        cy = probe_modules(S.VENV_PY, ["cyserve", *CYSERVE_APPS.values()], env)
    go_ver = sh(["go", "version"]).stdout.strip() if processes.have("go") else ""
    go_mods = {}
    try:
        with open(os.path.join(BENCH, "peers", "go", "go.mod")) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].startswith("github.com/"):
                    go_mods[parts[0]] = parts[1]
    except OSError:
        pass
    for s in servers:
        why = None
        if s.group == "cyserve":
            app_mod = CYSERVE_APPS[getattr(s, "app_of", s.name)]
            if not have_py:
                why = "bench/.venv missing"
            elif cy.get("cyserve", "").startswith("ERROR"):
                why = cy["cyserve"][6:]
            elif getattr(s, "app_of", s.name) == "cyserve-nogil" and nogil_error:
                why = nogil_error
            elif cy.get(app_mod, "ERROR ?").startswith("ERROR"):
                why = cy.get(app_mod, "ERROR ?")[6:]
            else:
                why = cyserve_engine_missing()
            if why:
                why = f"cyserve: not available yet ({why})"
            versions[s.name] = f"cyserve {cy.get('cyserve', '?')} ({git_rev(getattr(s, 'tree', ROOT))})"
        elif s.group == "go":
            exe = os.path.join(S.BUILD, s.name)
            why = None if os.path.exists(exe) else "Go peer not built (see setup notes)"
            lib = "github.com/valyala/fasthttp" if s.name == "go-fasthttp" else "net/http"
            versions[s.name] = f"{go_ver}; {lib} {go_mods.get(lib, '')}".strip()
        elif s.name == "nginx":
            why = None if processes.have("nginx") else "nginx not installed"
            if not why:
                versions[s.name] = sh(["nginx", "-v"]).stderr.strip()
        elif s.name == "lwan":
            why = None if os.environ.get("LWAN_BIN") else "LWAN_BIN is not set (build Lwan yourself and point LWAN_BIN at its `lwan` binary)"
            versions[s.name] = os.environ.get("LWAN_BIN", "")
        else:
            if not have_py:
                why = "bench/.venv missing"
            for m in s.requires:
                v = probe.get(m, "ERROR not probed")
                if v.startswith("ERROR"):
                    why = f"{m}: {v[6:]}"
                    break
            versions[s.name] = ", ".join(f"{m} {probe.get(m, '?')}" for m in s.requires) or "the standard library"
        reasons[s.name] = why
    return reasons, versions


PYTHON_GROUPS = ("cyserve", "python-async", "python-wsgi", "python-minimal")


def server_interpreters(servers):
    """{name: "CPython 3.12.1"} for every Python server (its own interpreter: bench/.venv's, or
    CYSERVE_BENCH_PYTHON_FT's for the free-threaded rows); None for the others."""
    seen, out = {}, {}
    for s in servers:
        if s.group not in PYTHON_GROUPS:
            out[s.name] = None
            continue
        if s.python not in seen:
            seen[s.python] = interpreter.label(interpreter.describe(s.python)) if os.path.exists(s.python) else None
        out[s.name] = seen[s.python]
    return out


def _by_value(mapping):
    out = {}
    for k, v in mapping.items():
        if v:
            out.setdefault(v, []).append(k)
    return out


def cyserve_engine_missing():
    """Why cyserve cannot serve yet, or None: the CLI needs cyserve._core.Server."""
    r = sh([S.VENV_PY, "-c", "import cyserve._core as c; c.Server"], env=S.py_env(), cwd=ROOT)
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or ["?"])[-1][:200]
    return None


_rev = {}


def git_rev(tree=ROOT):
    if tree not in _rev:
        r = sh(["git", "-C", tree, "rev-parse", "--short", "HEAD"])
        _rev[tree] = r.stdout.strip() or "?"
    return _rev[tree]


def machine_info():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            kib = next((int(ln.split()[1]) for ln in f if ln.startswith("MemTotal")), 0)
        mem = f"{kib / 1048576:.1f} GiB"
    except OSError:
        pass
    tools = {}
    if processes.have("wrk"):
        tools["wrk"] = (sh(["wrk", "-v"]).stdout.splitlines() or ["?"])[0].strip()
    if processes.have("hey"):
        tools["hey"] = shutil.which("hey")
    return {"cpu": model, "cores": os.cpu_count(), "memory": mem, "kernel": platform.release(),
            "os": platform.platform(), "python": platform.python_version(), "tools": tools}


# ---------------------------------------------------------------------------------------------
# Measuring.

class Session:
    def __init__(self, args, mode, tmp, expected):
        self.args, self.mode, self.tmp, self.expected = args, mode, tmp, expected
        self.runs, self.validation = [], {}
        self.t0 = time.monotonic()
        self.client = "wrk" if processes.have("wrk") else "python"

    def start(self, server, threads, pinned):
        port = processes.free_port()
        argv, env, cleanup = server.command(port, threads, self.tmp)
        log = os.path.join(self.tmp, f"{server.name}-{threads}-{port}.log")
        return processes.start_server(argv, port, log, env=env, cwd=ROOT,
                                    cpus=SERVER_CPU if pinned else None, cleanup=cleanup)

    def wait_idle(self, run, limit=1.0):
        """True once the server's tree used under 5 ms of CPU in 50 ms (it drained what the
        last client left queued); False after `limit` seconds."""
        end = time.monotonic() + limit
        prev = tree_cpu_seconds(run.pid)
        while time.monotonic() < end:
            time.sleep(0.05)
            cur = tree_cpu_seconds(run.pid)
            if cur - prev < 0.005:
                return True
            prev = cur
        return False

    def cell(self, run, server, workload, rnd, kind, threads, pinned, client=None, last=False):
        """Measure one cell and record it; returns the (possibly restarted) Running. `last`: the
        instance is stopped next, so whatever work is left queued does not matter."""
        client = client or self.client
        path = "/" + workload
        cfg = self.mode
        if client != "hey" and cfg["warmup"] and workload not in SLOW:
            # No warm-up on the slow routes: a Python server would still be working through the
            # warm-up's abandoned requests when the measured cell starts, and complete none.
            harness.run_wrk(run.port, path, cfg["warmup"], CONNECTIONS, 1, CLIENT_CPU if pinned else None)
            if not self.wait_idle(run):
                run.stop(grace=0.3)
                run = self.start(server, threads, pinned)
        if client == "hey":
            res = harness.measure(run, path, 0, 50, client="hey", client_cpus=CLIENT_CPU if pinned else None)
        else:
            res = harness.measure(run, path, cfg["duration"], CONNECTIONS, client=client,
                                  client_threads=1 if pinned else (os.cpu_count() or 1),
                                  client_cpus=CLIENT_CPU if pinned else None)
        if res.get("requests"):
            res.pop("raw", None)  # wrk's text is kept only where a cell failed
        rec = {"round": rnd, "mode": kind, "server": server.name, "workload": workload,
               "threads": threads, "pinned": pinned, "status": "ok" if res["requests"] else "none completed"}
        rec.update(res)
        self.runs.append(rec)
        rps = f"{res['rps']:>10.0f} req/s"
        per = f"{res['requests_per_cpu_s']:>9.0f} req/cpu-s" if res.get("requests_per_cpu_s") else " " * 19
        p99 = f"p99 {res['p99_ms']:.1f} ms" if res.get("p99_ms") is not None else ""
        say(f"[{time.monotonic() - self.t0:6.1f}s] r{rnd} {kind:<7} t{threads} {server.name:<17} "
            f"{workload:<9} {rps} {per} {p99} ({client})")
        if not last and not self.wait_idle(run):
            # A slow server still working through the requests the client abandoned would pollute
            # the next cell: restart it.
            run.stop(grace=0.3)
            run = self.start(server, threads, pinned)
        return run

    def validated(self, run, server):
        if server.name not in self.validation:
            self.validation[server.name] = harness.validate(run.port, self.expected, server.workloads)
            bad = {w: v for w, v in self.validation[server.name].items() if v != "ok"}
            for w, v in bad.items():
                say(f"  {server.name} /{w}: {v}")
        return [w for w in self.args.workloads if self.validation[server.name].get(w) == "ok"]

    def visit(self, server, rnd):
        """One round's visit to one server: pinned wrk cells and hey (the server on one CPU, like
        the machine the minimal designs were first measured on), then all-core cells, then the
        scaling points."""
        cfg, cores = self.mode, os.cpu_count() or 1
        try:
            run = self.start(server, 1, pinned=True)
        except RuntimeError as e:
            say(f"  {server.name}: failed to start: {e}")
            self.validation.setdefault(server.name, {w: f"invalid: failed to start: {str(e)[:200]}"
                                                     for w in server.workloads})
            return
        try:
            ok = self.validated(run, server)
            # hey first, then the slow routes last: the cell after a slow one may need a restart
            # (queued abandoned requests), and the last cell of an instance never does.
            hey = [w for w in ok if w in cfg["hey"]] if processes.have("hey") and self.client == "wrk" else []
            if cfg["hey_servers"] is not None and server.name not in cfg["hey_servers"]:
                hey = []
            for w in hey:
                run = self.cell(run, server, w, rnd, "hey", 1, True, client="hey")
            order = [w for w in ok if w not in SLOW] + [w for w in ok if w in SLOW]
            for i, w in enumerate(order):
                run = self.cell(run, server, w, rnd, "pinned", 1, True, last=i == len(order) - 1)
        finally:
            run.stop()
        allcore = [w for w in ok if w in cfg["allcore"] and (w not in cfg["scaling"] or cfg["scaling_servers"] is None
                                                            or server.name in cfg["scaling_servers"])]
        if cfg["allcore_servers"] is not None and server.name not in cfg["allcore_servers"]:
            allcore = []
        if allcore and (server.scales or not cfg["allcore_scalable_only"]):
            threads = cores if server.scales else 1
            run = self.start(server, threads, pinned=False)
            try:
                for i, w in enumerate(allcore):
                    run = self.cell(run, server, w, rnd, "allcore", threads, False, last=i == len(allcore) - 1)
            finally:
                run.stop()
        # Scaling: the all-core cell above is the point at `cores` threads; add 1..cores-1.
        scaling = [w for w in ok if w in cfg["scaling"] and w in cfg["allcore"]] if server.scales else []
        if cfg["scaling_servers"] is not None and server.name not in cfg["scaling_servers"]:
            scaling = []
        for t in range(1, cores):
            if not scaling:
                break
            run = self.start(server, t, pinned=False)
            try:
                for i, w in enumerate(scaling):
                    run = self.cell(run, server, w, rnd, "allcore", t, False, last=i == len(scaling) - 1)
            finally:
                run.stop()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="smoke run: ~1 s per cell, one round")
    g.add_argument("--full", action="store_true", help="3 rounds of 5 s cells (default)")
    ap.add_argument("--servers", help="comma-separated server names (default: all)")
    ap.add_argument("--workloads", help="comma-separated workloads (default: all)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--duration", type=int, help="seconds per wrk cell")
    ap.add_argument("--no-setup", action="store_true", help="install and build nothing")
    ap.add_argument("--client", choices=("wrk", "python"), help="force a client (python: no wrk, no hey)")
    ap.add_argument("--out", default=RESULTS, help="results folder (default bench/results)")
    ap.add_argument("--list", action="store_true", help="list the servers and exit")
    ap.add_argument("--baseline", metavar="TREE",
                    help="also run each chosen cyserve server from the checkout TREE (built there with "
                         "make build), as NAME-base, in the same rounds: an A/B of two builds")
    args = ap.parse_args(argv)
    if args.list:
        for s in S.SERVERS:
            print(f"{s.name:<18} {s.label}  [{', '.join(s.workloads)}]")
        return 0
    mode_name = "quick" if args.quick else "full"
    mode = dict(MODES[mode_name])
    if args.rounds:
        mode["rounds"] = args.rounds
    if args.duration:
        mode["duration"] = args.duration
    args.workloads = (args.workloads.split(",") if args.workloads
                      else list(mode.get("workloads", W.WORKLOADS)))
    # The free-threaded rows are run when asked for by name, or when an interpreter for them is
    # given (CYSERVE_BENCH_PYTHON_FT): on the GIL build they would only repeat a slower cyserve-py.
    # The *-metrics rows only when asked for by name: they repeat their plain row with the
    # counters on, an A/B of one option, not a server of the comparison.
    chosen = [S.BY_NAME[n] for n in args.servers.split(",")] if args.servers else \
        [s for s in S.SERVERS if not s.name.endswith("-metrics")
         and (not s.name.endswith("-ft") or os.environ.get("CYSERVE_BENCH_PYTHON_FT"))]
    if args.baseline:
        chosen += [S.from_tree(s, args.baseline) for s in chosen if s.group == "cyserve"]

    notes = []
    nogil_error = None
    t_setup = time.monotonic()
    if not args.no_setup:
        setup_tools(notes)
        setup_venv(notes)
        setup_go(notes)
    elif not os.environ.get("CYSERVE_BENCH_PYTHON") and os.path.exists(S.VENV_PY):
        have, (_, want, how) = interpreter.venv_info(S.VENV), choose_interpreter()
        if interpreter.label(have) != interpreter.label(want):
            notes.append(f"bench/.venv is {interpreter.label(have)}, not {interpreter.label(want)} ({how}): "
                         "--no-setup does not make it again")
    cyserve_error = None
    if any(s.group == "cyserve" and s.python == S.VENV_PY for s in chosen) and os.path.exists(S.VENV_PY):
        # Also with --no-setup, like the nogil app below: cyserve's rows must run this tree's code.
        cyserve_error = setup_cyserve(notes)
    if any(s.name == "cyserve-nogil" for s in chosen):
        nogil_error = cyserve_error or (setup_nogil(notes) if os.path.exists(S.VENV_PY) else "bench/.venv missing")
    for n in notes:
        say(f"setup: {n}")
    reasons, versions = availability(chosen, nogil_error)
    pythons = server_interpreters(chosen)
    if cyserve_error:
        for s in chosen:
            if s.group == "cyserve" and s.python == S.VENV_PY and not reasons[s.name]:
                reasons[s.name] = f"cyserve: not available yet ({cyserve_error})"
    for label_, names in sorted(_by_value(pythons).items()):
        say(f"Python servers on {label_}: {', '.join(names)}")
    for name, why in reasons.items():
        if why:
            say(f"skip {name}: {why}")
    live = [s for s in chosen if not reasons[s.name]]
    say(f"setup done in {time.monotonic() - t_setup:.0f} s; measuring {len(live)} servers "
        f"({mode_name}: {mode['rounds']} round(s), {mode['duration']} s cells, client "
        f"{'wrk' if processes.have('wrk') and args.client != 'python' else 'python (figures measure the client)'})")

    expected = W.expected_bodies()
    load_start = [round(x, 2) for x in os.getloadavg()]  # others' load on a shared machine: noise
    started = datetime.datetime.now(datetime.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="cyserve-bench-") as tmp:
        os.chmod(tmp, 0o755)  # nginx's workers (user nobody when run as root) read files below it
        sess = Session(args, mode, tmp, expected)
        if args.client == "python":
            sess.client = "python"
            mode["hey"] = ()
        for rnd in range(mode["rounds"]):
            order = live[rnd % len(live):] + live[:rnd % len(live)] if live else []
            for server in order:
                sess.visit(server, rnd)
    elapsed = time.monotonic() - sess.t0

    result = {
        "schema": 1,
        "started": started.isoformat(timespec="seconds"),
        "elapsed_s": round(elapsed, 1),
        "command": " ".join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT)
                             else sys.executable, "bench/http/run.py"] + (argv if argv is not None else sys.argv[1:])),
        "mode": mode_name,
        "config": {"rounds": mode["rounds"], "duration_s": mode["duration"], "warmup_s": mode["warmup"],
                   "connections": CONNECTIONS, "server_cpu": SERVER_CPU, "client_cpu": CLIENT_CPU,
                   "client": sess.client, "allcore_workloads": list(mode["allcore"]),
                   "hey_workloads": list(mode["hey"]), "scaling_workloads": list(mode["scaling"]),
                   "hey": "hey -n 2000 -c 50", "pipelining": False},
        # The interpreter of bench/.venv (every Python server's unless its row says otherwise);
        # machine["python"] is the runner's own.
        "bench_python": interpreter.label(interpreter.describe(S.VENV_PY)) if os.path.exists(S.VENV_PY) else None,
        "machine": dict(machine_info(), loadavg_start=load_start,
                        loadavg_end=[round(x, 2) for x in os.getloadavg()]),
        "git": git_rev(),
        "workloads": list(W.WORKLOADS),
        "servers": {s.name: {"label": s.label, "group": s.group, "note": s.note, "scales": s.scales,
                             "workloads": list(s.workloads), "version": versions.get(s.name, ""),
                             "python": pythons.get(s.name),
                             "available": not reasons[s.name], "reason": reasons[s.name],
                             "validation": sess.validation.get(s.name, {})}
                    for s in chosen},
        "setup_notes": notes,
        "runs": sess.runs,
    }
    result["summary"] = report.summarize(result)
    coro = os.path.join(RESULTS, "coro-latest.json")
    if os.path.exists(coro):
        try:
            with open(coro) as f:
                result["coro"] = json.load(f)
        except ValueError as e:
            result["coro"] = {"error": f"coro-latest.json unreadable: {e}"}
    os.makedirs(args.out, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    for name in (f"{stamp}.json", "latest.json"):
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(result, f, indent=1, sort_keys=False)
            f.write("\n")
    written = report.write_all(result, args.out, S.VENV_PY)
    say(f"done in {elapsed:.0f} s: {', '.join(os.path.relpath(p, ROOT) for p in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
