"""Does a Python handler that blocks stall the routes the engine serves in C?

    .venv/bin/python bench/http/blocking.py [--threads 1] [--blocking 4] [--rounds 3] [--seconds 5]

For each of two servers -- cyserve as configured (`--blocking-threads B`) and cyserve with
`--blocking-threads 0` (no relief: how it was before) -- and each round, it measures wrk on
`/plaintext` (a static route, served in C; 64 connections, no pipelining) three times:
- idle: nothing else happens;
- blocked: B requests to `/block` (a handler in `time.sleep(60)`, as a slow database call
  would be) are in flight on connections of their own, opened before wrk starts;
- after resets: ten clients each send `/block` and reset at once, then wrk runs.
It prints requests/s and wrk's p99 for each, with the ratios blocked/idle, medians over the
rounds. With --threads 1 the server is pinned to CPU 0 and wrk to CPU 1 (on a machine with at
least two CPUs); with --threads T on a machine with at least 2T CPUs, the server gets CPUs 0..T-1
and wrk (T threads) the first T of the upper half. The numbers are for docs/benchmarks.md;
nothing here is a test.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

APP = '''
import time
import cyserve
app = cyserve.App()
app.static("/plaintext", "Hello, World!")

@app.get("/block")
def block(request):
    time.sleep(60)
    return "done"
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def placement(threads: int) -> tuple[str, str] | None:
    """(server CPUs, wrk CPUs) for taskset, or None where the machine is too small to separate
    them."""
    cores = os.cpu_count() or 1
    if threads == 1 and cores >= 2:
        return "0", "1"
    if cores >= 2 * threads:
        half = cores // 2
        return f"0-{threads - 1}", f"{half}-{half + threads - 1}"
    return None


def start(threads: int, blocking: int, app_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [sys.executable, "-m", "cyserve", "blockapp:app", "--port", str(port),
           "--threads", str(threads), "--blocking-threads", str(blocking),
           "--app-dir", str(app_dir), "--graceful-timeout", "0"]
    if placement(threads):
        cmd = ["taskset", "-c", placement(threads)[0], *cmd]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /plaintext HTTP/1.1\r\nHost: b\r\n\r\n")
                if s.recv(100):
                    return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the server did not start")


def wrk(port: int, seconds: float, threads: int) -> tuple[float, float]:
    cmd = ["wrk", f"-t{threads if placement(threads) else 1}", "-c64", f"-d{seconds:g}s",
           "--latency", f"http://127.0.0.1:{port}/plaintext"]
    if placement(threads):
        cmd = ["taskset", "-c", placement(threads)[1], *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    r = re.search(r"Requests/sec:\s+([\d.]+)", out)
    m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", out)
    if not r or not m or float(r.group(1)) == 0:  # no response within the cell: a stall
        return 0.0, float("inf")
    return float(r.group(1)), float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def block(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /block HTTP/1.1\r\nHost: b\r\n\r\n")
        socks.append(s)
    time.sleep(0.5)  # every call started (and, with relief, every stuck worker relieved)
    return socks


def resets(port: int, n: int = 10) -> None:
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /block HTTP/1.1\r\nHost: b\r\n\r\n")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    time.sleep(0.2)


def measure(threads: int, blocking: int, seconds: float,
            app_dir: Path) -> dict[str, tuple[float, float]]:
    out = {}
    proc, port = start(threads, blocking, app_dir)
    try:
        out["idle"] = wrk(port, seconds, threads)
        socks = block(port, max(blocking, 1))
        out["blocked"] = wrk(port, seconds, threads)
        for s in socks:
            s.close()
    finally:
        proc.kill()
        proc.wait()
    proc, port = start(threads, blocking, app_dir)
    try:
        resets(port)
        out["resets"] = wrk(port, seconds, threads)
    finally:
        proc.kill()
        proc.wait()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--blocking", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "blockapp.py").write_text(APP)
        runs: dict[int, list[dict[str, tuple[float, float]]]] = {args.blocking: [], 0: []}
        for r in range(args.rounds):
            for b in (args.blocking, 0):
                m = measure(args.threads, b, args.seconds, Path(tmp))
                runs[b].append(m)
                print(f"round {r} blocking-threads {b}: " + ", ".join(
                    f"{k} {v[0]:,.0f} req/s p99 {v[1]:.2f} ms" for k, v in m.items()), flush=True)
    print(f"\n--threads {args.threads}, {args.blocking} calls blocked, wrk -c64 {args.seconds} s "
          f"on /plaintext, medians of {args.rounds} rounds\n")
    print("| server | idle req/s | idle p99 ms | blocked req/s | blocked p99 ms | blocked/idle "
          "req/s | blocked/idle p99 | after 10 resets req/s | p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b, ms in runs.items():
        med = {k: (statistics.median(m[k][0] for m in ms), statistics.median(m[k][1] for m in ms))
               for k in ("idle", "blocked", "resets")}
        ratio_rps = statistics.median(m["blocked"][0] / m["idle"][0] for m in ms)
        ratio_p99 = statistics.median(m["blocked"][1] / m["idle"][1] for m in ms)
        print(f"| --blocking-threads {b} | {med['idle'][0]:,.0f} | {med['idle'][1]:.2f} | "
              f"{med['blocked'][0]:,.0f} | {med['blocked'][1]:.2f} | {ratio_rps:.2f} | "
              f"{ratio_p99:.2f} | {med['resets'][0]:,.0f} | {med['resets'][1]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
