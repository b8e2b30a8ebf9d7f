"""The HTTP half of the measuring: check a server's answers, load it with a client, and read the
server's CPU time and memory around the load (bench/common/ starts, pins and stops it).

Stdlib only, so the CI smoke test (tests/bench/test_bench_smoke.py) can drive it from cyserve's own venv.

Method (docs/benchmarks.md):
- wrk with keep-alive and no pipelining (no Lua script at all), `--latency` for p50/p99;
  hey -n 2000 -c 50 as the second client; a small Python client as a fallback where
  neither is installed (CI), whose figures measure the client more than the server.
- Server CPU time: utime+stime of every process in the server's tree, read from /proc before and
  after a run, plus the cutime+cstime of reaped children (a forking server's), so requests per
  server CPU-second counts every cycle the server spent, in whatever process.
- Peak RSS: the largest sum of VmRSS over the tree among samples taken every 0.2 s during the run;
  final RSS and the tree's threads: read once the client has finished.
"""

import http.client
import re
import subprocess
import threading
import time

from bench.common.pinning import pinned
from bench.common.procfs import CLK_TCK, RssSampler, tree_cpu_seconds, tree_rss_kib, tree_threads

# Shortest server CPU time worth dividing by: 50 ticks, so one tick of rounding at either end
# moves requests per CPU-second by at most 4%.
MIN_CPU_S = 50 / CLK_TCK


# ---------------------------------------------------------------------------------------------
# Servers: check their answers.

def http_get(port, path, timeout=30.0):
    """(status, body) of one GET over a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def validate(port, expected, workloads):
    """{workload: "ok" | "invalid: why"} after one GET of /<workload> each, checked byte for byte."""
    out = {}
    for w in workloads:
        try:
            status, body = http_get(port, "/" + w)
        except (OSError, http.client.HTTPException) as e:
            out[w] = f"invalid: {type(e).__name__}: {e}"
            continue
        if status != 200:
            out[w] = f"invalid: status {status}: {body[:80]!r}"
        elif body != expected[w]:
            out[w] = f"invalid: body {body[:60]!r} ({len(body)} bytes), want {expected[w][:60]!r} ({len(expected[w])} bytes)"
        else:
            out[w] = "ok"
    return out


# ---------------------------------------------------------------------------------------------
# Clients. Each returns a dict: rps, p50_ms, p99_ms, requests, errors, non2xx, client, raw.

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def _ms(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def parse_wrk(out):
    """Figures from `wrk --latency` output (keep-alive, no script)."""
    res = {"client": "wrk", "rps": 0.0, "p50_ms": None, "p99_ms": None, "requests": 0,
           "errors": 0, "non2xx": 0}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m:
        res["rps"] = float(m.group(1))
    m = re.search(r"(\d+) requests in", out)
    if m:
        res["requests"] = int(m.group(1))
    for pct, key in (("50", "p50_ms"), ("99", "p99_ms")):
        m = re.search(rf"^\s+{pct}(?:\.000)?%\s+(\S+)", out, re.M)
        if m:
            res[key] = _ms(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        res["errors"] = sum(int(x) for x in m.groups())
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        res["non2xx"] = int(m.group(1))
    return res


def run_wrk(port, path, duration, connections, threads, cpus=None):
    argv = ["wrk", "--latency", "-t", str(threads), "-c", str(connections), "-d", f"{duration}s",
            "--timeout", "4s", f"http://127.0.0.1:{port}{path}"]
    argv = pinned(argv, cpus)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30)
    res = parse_wrk(p.stdout)
    if p.returncode != 0:
        res["errors"] += 1
    res["raw"] = p.stdout[-2000:] + p.stderr[-500:]
    return res


def parse_hey(out):
    res = {"client": "hey", "rps": 0.0, "p50_ms": None, "p99_ms": None, "requests": 0,
           "errors": 0, "non2xx": 0}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m:
        res["rps"] = float(m.group(1))
    for pct, key in (("50", "p50_ms"), ("99", "p99_ms")):
        m = re.search(rf"^\s+{pct}%+ in ([\d.]+) secs", out, re.M)
        if m:
            res[key] = float(m.group(1)) * 1e3
    for code, count in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out):
        res["requests"] += int(count)
        if not code.startswith("2"):
            res["non2xx"] += int(count)
    m = re.search(r"Error distribution:\n((?:\s+\[\d+\].*\n?)+)", out)
    if m:
        res["errors"] = sum(int(x) for x in re.findall(r"\[(\d+)\]", m.group(1)))
    return res


def run_hey(port, path, n=2000, c=50, cpus=None, timeout=120):
    argv = ["hey", "-n", str(n), "-c", str(c), "-t", "10", f"http://127.0.0.1:{port}{path}"]
    argv = pinned(argv, cpus)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    res = parse_hey(p.stdout)
    res["raw"] = p.stdout[-1500:] + p.stderr[-500:]
    return res


def run_python_client(port, path, duration, connections=4):
    """Fallback load: `connections` threads, each a keep-alive http.client connection, for
    `duration` seconds. Used where wrk is absent (CI); it measures mostly itself."""
    stop_at = time.monotonic() + duration
    lat, lock = [], threading.Lock()
    errors = [0]
    non2xx = [0]

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine = []
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
                if resp.will_close:
                    conn.close()
            except (OSError, http.client.HTTPException):
                errors[0] += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                continue
            mine.append(time.perf_counter() - t0)
            if not 200 <= resp.status < 300:
                non2xx[0] += 1
        conn.close()
        with lock:
            lat.extend(mine)

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    lat.sort()

    def pct(q):
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3 if lat else None

    return {"client": "python", "rps": len(lat) / elapsed, "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "requests": len(lat), "errors": errors[0], "non2xx": non2xx[0], "raw": ""}


def measure(run, path, duration, connections, client="wrk", client_threads=1, client_cpus=None):
    """One cell: load `path` on a running server; adds server_cpu_s, rps_per_cpu_s, rss_peak_kib,
    and what the tree holds once the load has ended: rss_final_kib and threads_final (a server
    that starts threads under load, relief threads for instance, keeps them)."""
    cpu0 = tree_cpu_seconds(run.pid)
    with RssSampler(run.pid) as rss:
        if client == "wrk":
            res = run_wrk(run.port, path, duration, connections, client_threads, client_cpus)
        elif client == "hey":
            res = run_hey(run.port, path, cpus=client_cpus)
        else:
            res = run_python_client(run.port, path, duration)
    cpu = tree_cpu_seconds(run.pid) - cpu0
    res["server_cpu_s"] = round(cpu, 3)
    # /proc counts CPU time in clock ticks (10 ms): below MIN_CPU_S the ratio would be mostly
    # rounding (hey's 2,000 requests take ~50 ms of server CPU, read as 0, 1 or 2 ticks).
    res["requests_per_cpu_s"] = (res["requests"] / cpu) if cpu >= MIN_CPU_S else None
    res["rss_peak_kib"] = rss.peak
    res["rss_final_kib"] = tree_rss_kib(run.pid)
    res["threads_final"] = tree_threads(run.pid)
    return res
