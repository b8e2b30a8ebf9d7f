"""The server's own share of an app-bound request, counted in instructions (issue 14).

    bench/.venv/bin/python -m bench.http.share SERVER PATH [--conns C] [--requests N] [--warmup W]

SERVER is one of cyserve-wsgi, cyserve-py, bjoern, fastpysgi-wsgi, or the no-op server:
loop-wsgi / loop-py call the same app callable directly in a loop, in the same interpreter, with
a prepared environ (loop-py: the App route's handler, with no request). Either runs under
`valgrind --tool=callgrind`: W warm-up requests (or calls), then the counters are zeroed
(`callgrind_control -z`), N are made and the counters dumped (`callgrind_control -d`), so
start-up and imports are left out. A server gets its requests on C keep-alive connections at
once, one on each, then every answer is read (N and W multiples of C), as
bench/micro/cg_request.sh does; no pipelining.

It prints one JSON line, per request: the whole process's instructions (every thread; with
--valgrind-arg=--separate-threads=yes also each thread's), the app's call as the server makes it
(the inclusive cost of the server's call into the app, APP_CALLS, less the server's own
start_response inside it), the server's share (the rest), the garbage collector's
(`gc_collect_main`) and the relief monitor's (`mon_main`) inclusive counts, and the answers'
bodies, so that every server can be seen to do the same work. The no-op loop's count is the
other reading of the app's cost (the issue's "total minus the app, with a no-op server
baseline"); docs/benchmarks.md, "Session 18", says why on /json and /msgpack the app's count
moves between processes by more than a server's whole share, so that the share is read from the
same process there. PYTHONHASHSEED=0 throughout.

The interpreter is this one: run it with bench/.venv/bin/python (bjoern, fastpysgi, msgpack),
cyserve being imported from this tree's src/, built for that interpreter.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WSGI_APP = "bench.peers.python.wsgi_app:app"

# {port} is replaced. cyserve's keep-alive timeout is raised: under callgrind a round of 64
# requests to /json takes longer than its default 5 s, and an idle connection would be closed.
SERVERS = {
    "cyserve-wsgi": ["-m", "cyserve", WSGI_APP, "--host", "127.0.0.1", "--port", "{port}",
                     "--threads", "1", "--keepalive-timeout", "600"],
    "cyserve-py": ["-m", "cyserve", "bench.http.apps.cyserve_py:app", "--host", "127.0.0.1",
                   "--port", "{port}", "--threads", "1", "--keepalive-timeout", "600"],
    "bjoern": ["-m", "bench.peers.python.bjoern_app", "{port}"],
    "fastpysgi-wsgi": ["-m", "bench.peers.python.fastpysgi_app", "wsgi", "{port}"],
}
LOOPS = ("loop-wsgi", "loop-py")

# Where each server calls the app (caller -> callee in callgrind's call graph: the inclusive cost
# of that edge is the app's call, as the server makes it), and the server's own start_response
# (called from inside the app's call, so counted back to the server). Read from the servers'
# profiles: bjoern's wsgi.c, fastpysgi's call_wsgi_app (its start_response has no symbol in the
# wheel: the address is that of fastpysgi 0.6's build in bench/.venv), cyserve's WSGIHandler._run
# and the App API's _py_call_impl.
APP_CALLS = {
    "cyserve-wsgi": (("__pyx_f_7cyserve_5_core_11WSGIHandler__run", "PyObject_Vectorcall"),
                     ("cyserve__sr_vectorcall",)),
    "cyserve-py": (("__pyx_f_7cyserve_5_core__py_call_impl", "__Pyx_PyObject_FastCallDict.constprop.0"), ()),
    "bjoern": (("wsgi_call_application", "PyObject_CallFunctionObjArgs"), ("start_response",)),
    "fastpysgi-wsgi": (("call_wsgi_app", "PyObject_CallFunctionObjArgs"), ("0x0000000000025ff0",)),
}


def _env():
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), ROOT]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _valgrind(out, argv, extra=()):
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *extra, sys.executable, *argv]


def _control(pid, flag):
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True)


def _answer(s, buf):
    """One answer from s: (body, rest of buf)."""
    while b"\r\n\r\n" not in buf:
        buf += _recv(s)
    head, _, buf = buf.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        sys.exit(f"not a 200: {head[:200]!r}")
    length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))
    while len(buf) < length:
        buf += _recv(s)
    return buf[:length], buf[length:]


def _recv(s):
    got = s.recv(262144)
    if not got:
        sys.exit("the server closed a connection")
    return got


def count_server(name, path, conns, n, warmup, out, server_args=(), valgrind_args=()):
    with socket.socket() as probe:  # a port free now (a fixed guess collided on a busy machine)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [a.replace("{port}", str(port)) for a in SERVERS[name]] + list(server_args)
    log = open(out + ".log", "w")
    p = subprocess.Popen(_valgrind(out, argv, valgrind_args), cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(3000):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=600).close()
                break
            except OSError:
                if p.poll() is not None:
                    sys.exit(f"{name} exited: see {out}.log")
                time.sleep(0.1)
        else:
            sys.exit(f"{name} did not start")
        socks = [socket.create_connection(("127.0.0.1", port), timeout=600) for _ in range(conns)]
        bufs = [b""] * conns
        req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        bodies = set()

        def rounds(total):
            for _ in range(total // conns):
                for s in socks:
                    s.sendall(req)
                for i, s in enumerate(socks):
                    body, bufs[i] = _answer(s, bufs[i])
                    bodies.add(body)

        rounds(warmup)
        _control(p.pid, "-z")
        rounds(n)
        _control(p.pid, "-d")
        for s in socks:
            s.close()
    finally:
        p.terminate()
        p.wait()
        log.close()
    return bodies


def count_loop(name, path, n, warmup, out):
    """The no-op server: the app called directly, counted between the same two controls."""
    p = subprocess.Popen(_valgrind(out, ["-m", "bench.http.share", "--serve-loop", name, path,
                                         "--requests", str(n), "--warmup", str(warmup)]),
                         cwd=ROOT, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=open(out + ".log", "w"), text=True)
    try:
        if p.stdout.readline().strip() != "ready":
            sys.exit(f"the loop did not start: see {out}.log")
        _control(p.pid, "-z")
        p.stdin.write("go\n")
        p.stdin.flush()
        body = p.stdout.readline().strip()
        _control(p.pid, "-d")
        p.stdin.write("quit\n")
        p.stdin.flush()
    finally:
        p.wait()
    return {bytes.fromhex(body)}


def serve_loop(name, path, n, warmup):
    """Runs inside valgrind: warm up, say ready, wait, call n times, say the body, wait."""
    if name == "loop-wsgi":
        import wsgiref.util

        from bench.peers.python.wsgi_app import app

        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "",
                   "HTTP_HOST": "127.0.0.1", "SERVER_PROTOCOL": "HTTP/1.1",
                   "REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "40000"}
        wsgiref.util.setup_testing_defaults(environ)

        def start_response(status, headers, exc_info=None):
            pass

        args = (environ, start_response)
    else:
        from bench.http.apps import cyserve_py
        from bench.peers.python import routes

        app = cyserve_py._route(routes.ROUTES[path])
        args = (None,)
    # The app is called straight from the loop (no wrapper function, whose call would count as
    # the app's); what the loop adds is its own iteration, a few dozen instructions.
    for _ in range(warmup):
        result = app(*args)
    print("ready", flush=True)
    sys.stdin.readline()
    if name == "loop-wsgi":
        environ, start_response = args
        for _ in range(n):
            result = app(environ, start_response)
        body = b"".join(result)
    else:
        for _ in range(n):
            result = app(None)
        body = result
    print(body.hex(), flush=True)
    sys.stdin.readline()


def _dumps(out):
    """The files of the first dump (callgrind_control -d): OUT.1, or OUT.1-NN, one a thread,
    with --separate-threads=yes."""
    folder, base = os.path.dirname(out) or ".", os.path.basename(out)
    dumps = sorted(f for f in os.listdir(folder) if re.fullmatch(re.escape(base) + r"\.1(-\d+)?", f))
    if not dumps:
        sys.exit(f"no dump beside {out}")
    return [os.path.join(folder, f) for f in dumps]


def inclusive(dump, names):
    """Inclusive instructions of each function named (0 where it did not run)."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
                          check=True, capture_output=True, text=True).stdout
    got = dict.fromkeys(names, 0)
    for line in text.splitlines():
        # "  1,234 (5.6%)  file.c:name.isra.0 [obj]"; a recursive entry (name'2) counts its
        # frames again, so only the outermost one is read.
        m = re.match(r"\s*([\d,]+)\s.*?:([\w.']+)(?:\s|$)", line)
        if m and "'" not in m.group(2):
            name = m.group(2).split(".")[0]
            if name in got:
                got[name] = max(got[name], int(m.group(1).replace(",", "")))
    return got


def call_graph(dump):
    """(self cost by function, inclusive cost by (caller, callee) edge) from callgrind's file."""
    names, self_cost, edges = {}, {}, {}
    fn = cfn = None
    pending = False

    def name(field):
        # Compressed names: "(12) name" the first time, "(12)" after.
        m = re.match(r"\((\d+)\)(?: (.*))?", field)
        if not m:
            return field
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names[m.group(1)]

    with open(dump) as f:
        for line in f:
            if line.startswith("fn="):
                fn, pending = name(line[3:].rstrip("\n")), False
            elif line.startswith("cfn="):
                cfn = name(line[4:].rstrip("\n"))
            elif line.startswith("calls="):
                pending = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                v = int(line.split()[-1])
                if pending:
                    edges[(fn, cfn)] = edges.get((fn, cfn), 0) + v
                    pending = False
                else:
                    self_cost[fn] = self_cost.get(fn, 0) + v
    return self_cost, edges


def app_share(dumps, server):
    """(the app's call, the server's start_response inside it), summed over the dumps."""
    (caller, callee), srs = APP_CALLS[server]
    app = sr = 0
    for d in dumps:
        self_cost, edges = call_graph(d)
        app += edges.get((caller, callee), 0)
        for f in srs:
            sr += self_cost.get(f, 0) + sum(v for (a, _), v in edges.items() if a == f)
    return app, sr


def total(dump):
    with open(dump) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    sys.exit(f"no total in {dump}")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.http.share", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("server", choices=[*SERVERS, *LOOPS])
    ap.add_argument("path", help="the request target, e.g. /json, /msgpack, /plaintext")
    ap.add_argument("--conns", type=int, default=1, help="connections with a request in flight (1)")
    ap.add_argument("--requests", type=int, default=64, help="requests counted (64)")
    ap.add_argument("--warmup", type=int, default=16, help="requests before the counters are zeroed (16)")
    ap.add_argument("--out", default="/tmp/share.cg", help="callgrind's output (and .log beside it)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="one more argument for the server, e.g. --server-arg=--blocking-threads=0")
    ap.add_argument("--valgrind-arg", action="append", default=[],
                    help="one more argument for valgrind, e.g. --valgrind-arg=--separate-threads=yes")
    ap.add_argument("--serve-loop", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve_loop:
        serve_loop(a.server, a.path, a.requests, a.warmup)
        return
    if a.requests % a.conns:
        ap.error("--requests must be a multiple of --conns")
    folder = os.path.dirname(os.path.abspath(a.out))
    for f in os.listdir(folder):
        if f.startswith(os.path.basename(a.out) + "."):
            os.remove(os.path.join(folder, f))
    if a.server in LOOPS:
        bodies = count_loop(a.server, a.path, a.requests, a.warmup, a.out)
    else:
        bodies = count_server(a.server, a.path, a.conns, a.requests, a.warmup, a.out,
                              a.server_arg, a.valgrind_arg)
    dumps = _dumps(a.out)
    fns = {"gc_collect_main": 0, "mon_main": 0}
    threads = {}
    for d in dumps:
        for k, v in inclusive(d, tuple(fns)).items():
            fns[k] += v
        threads[d.rsplit("-", 1)[-1] if len(dumps) > 1 else "all"] = total(d) // a.requests
    per_request = sum(total(d) for d in dumps) // a.requests
    if a.server in LOOPS:
        app = per_request
    else:
        app_call, sr = app_share(dumps, a.server)
        app = (app_call - sr) // a.requests
    print(json.dumps({
        "server": a.server, "path": a.path, "conns": a.conns, "requests": a.requests,
        "per_request": per_request,
        # The app's call less the server's start_response in it; the rest is the server's.
        "app_per_request": app,
        "server_per_request": per_request - app,
        "threads": threads,
        "gc_per_request": fns["gc_collect_main"] // a.requests,
        "monitor_per_request": fns["mon_main"] // a.requests,
        "bodies": sorted(b.decode("latin-1") for b in bodies),
        "dump": dumps[0],
    }))


if __name__ == "__main__":
    main()
