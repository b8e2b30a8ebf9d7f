"""A mixed soak: does the server stay flat over time, and lose nothing but what a killed worker had?

    .venv/bin/python bench/soak.py [--seconds 600] [--out bench/results/soak]

It serves fuzz/net/app.py (static, files, GIL-free, Python, WSGI and a sleeping handler) with
`--processes 2 --threads 2`, and for --seconds runs at once:
- wrk on /plaintext (8 connections, keep-alive);
- clients that loop over /py, /files/hello.txt, /, a 64 KiB POST to /echo (an upload), a POST to
  the WSGI app and /sleep, on keep-alive connections;
- slow clients (a head sent a few bytes at a time) and clients that reset mid-request;
- every 60 s, kill -9 of one worker process (the supervisor starts a replacement).
Every 10 s it samples the RSS (sum over the server's processes) and the descriptors open in
them. A request fails if it gets a wrong answer or an error; failures within 3 s after a kill
are counted apart (the killed worker's connections are lost with it; that is the one loss
allowed). It writes report.json, report.md and plot.svg (RSS and descriptors over time) to
--out, and exits 1 when a request failed outside a kill's window, when the server died, or when
the RSS after warm-up (the first minute, or the first third of a short run) grew by more than
25 %.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common.procfs import process_tree, tree_rss_kib  # noqa: E402

SAMPLE_S = 10.0
KILL_EVERY_S = 60.0
KILL_GRACE_S = 3.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fds(root: int) -> int:
    n = 0
    for pid in process_tree(root):
        try:
            n += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    return n


def http(s: socket.socket, req: bytes) -> tuple[int, bytes]:
    s.sendall(req)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    low = head.lower()
    if b"transfer-encoding: chunked" in low:
        while not body.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            body += chunk
        body = b"".join(body.split(b"\r\n")[1::2])
    else:
        n = int(low.split(b"content-length: ")[1].split(b"\r\n")[0]) if b"content-length: " in low else 0
        while len(body) < n:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            body += chunk
    return int(head.split(b" ", 2)[1]), body


UPLOAD = b"u" * 65536
REQUESTS = [
    (b"GET /py HTTP/1.1\r\nHost: s\r\n\r\n", 200, b"Hello, World!"),
    (b"GET /files/hello.txt HTTP/1.1\r\nHost: s\r\n\r\n", 200, None),
    (b"GET / HTTP/1.1\r\nHost: s\r\n\r\n", 200, b"Hello, World!"),
    (b"POST /echo HTTP/1.1\r\nHost: s\r\nContent-Length: 65536\r\n\r\n" + UPLOAD, 200, UPLOAD),
    (b"POST /wsgi/x HTTP/1.1\r\nHost: s\r\nContent-Length: 5\r\n\r\nhello", 200, b"got 5\n"),
    (b"GET /sleep HTTP/1.1\r\nHost: s\r\n\r\n", 200, b"slept"),
]


class Soak:
    def __init__(self, seconds: float, out: Path) -> None:
        self.seconds, self.out = seconds, out
        self.port = free_port()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok = 0
        self.failed: list[str] = []
        self.failed_near_kill = 0
        self.kills: list[float] = []
        self.samples: list[dict[str, float]] = []
        self.t0 = 0.0
        self.wrk_summary = ""

    def near_kill(self) -> bool:
        now = time.monotonic()
        return any(0 <= now - k <= KILL_GRACE_S for k in self.kills)

    def note(self, ok: bool, what: str) -> None:
        with self.lock:
            if ok:
                self.ok += 1
            elif self.near_kill():
                self.failed_near_kill += 1
            else:
                self.failed.append(f"{time.monotonic() - self.t0:.0f}s {what}")

    def client(self, k: int) -> None:
        i = k
        s = None
        while not self.stop.is_set():
            req, status, body = REQUESTS[i % len(REQUESTS)]
            i += 1
            try:
                if s is None:
                    s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                got_status, got = http(s, req)
                good = got_status == status and (body is None or got == body)
                self.note(good, f"{req[:24]!r}: {got_status} {got[:40]!r}")
                if not good:
                    s.close()
                    s = None
            except OSError as exc:
                self.note(False, f"{req[:24]!r}: {exc}")
                if s is not None:
                    s.close()
                s = None
                time.sleep(0.05)
        if s is not None:
            s.close()

    def troublemaker(self) -> None:
        """Slow heads and resets, one after another."""
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            except OSError:
                time.sleep(0.1)
                continue
            try:
                if n % 2:
                    for piece in (b"GET /py HT", b"TP/1.1\r\nHo", b"st: s\r\n\r\n"):
                        s.sendall(piece)
                        time.sleep(0.3)
                    status, _ = http(s, b"")
                    self.note(status == 200, f"slow head: {status}")
                else:
                    s.sendall(b"POST /echo HTTP/1.1\r\nHost: s\r\nContent-Length: 100000\r\n\r\n")
                    s.sendall(b"x" * 5000)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError as exc:
                self.note(False, f"slow head: {exc}")
            finally:
                s.close()

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
        log = (self.out / "server.log").open("wb")
        srv = subprocess.Popen([sys.executable, "-m", "cyserve", "fuzz.net.app:app", "--port",
                                str(self.port), "--processes", "2", "--threads", "2"],
                               cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    if http(s, REQUESTS[0][0])[0] == 200:
                        break
            except OSError:
                if time.monotonic() > deadline or srv.poll() is not None:
                    print("the server did not start", file=sys.stderr)
                    return 1
                time.sleep(0.2)
        self.t0 = time.monotonic()
        wrk = subprocess.Popen(["wrk", "-t1", "-c8", f"-d{int(self.seconds)}s",
                                f"http://127.0.0.1:{self.port}/plaintext"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threads = [threading.Thread(target=self.client, args=(k,)) for k in range(4)]
        threads.append(threading.Thread(target=self.troublemaker))
        for t in threads:
            t.start()
        next_kill = self.t0 + KILL_EVERY_S
        next_sample = self.t0
        end = self.t0 + self.seconds
        died = False
        while time.monotonic() < end:
            now = time.monotonic()
            if srv.poll() is not None:
                died = True
                break
            if now >= next_sample:
                self.samples.append({"t": round(now - self.t0, 1),
                                     "rss_mib": round(tree_rss_kib(srv.pid) / 1024, 1),
                                     "fds": fds(srv.pid)})
                next_sample += SAMPLE_S
            if now >= next_kill:
                workers = [p for p in process_tree(srv.pid) if p != srv.pid]
                if workers:
                    with self.lock:
                        self.kills.append(time.monotonic())
                    os.kill(workers[0], signal.SIGKILL)
                next_kill += KILL_EVERY_S
            time.sleep(0.2)
        self.stop.set()
        for t in threads:
            t.join(30)
        wrk.terminate()
        wrk_out = wrk.communicate()[0] or ""
        srv.send_signal(signal.SIGTERM)
        try:
            rc = srv.wait(30)
        except subprocess.TimeoutExpired:
            srv.kill()
            rc = srv.wait()
        return self.report(died, rc, wrk_out)

    def report(self, died: bool, rc: int, wrk_out: str) -> int:
        line = [x for x in wrk_out.splitlines() if "requests in" in x]
        self.wrk_summary = line[0].strip() if line else "no summary"
        warm = min(60.0, self.seconds / 3)
        after = [s for s in self.samples if s["t"] >= warm] or self.samples[-1:]
        base = after[0]["rss_mib"] if after else 0.0
        last = statistics.median(s["rss_mib"] for s in after[-3:]) if after else 0.0
        growth = (last - base) / base if base else 0.0
        verdict = {
            "server_died": died, "exit_status": rc, "requests_ok": self.ok,
            "failed": len(self.failed), "failed_within_3s_of_a_kill": self.failed_near_kill,
            "kills": len(self.kills), "rss_after_warmup_mib": base, "rss_end_mib": last,
            "rss_growth": round(growth, 3), "first_failures": self.failed[:10],
        }
        ok = not died and rc == 0 and not self.failed and growth <= 0.25
        verdict["passed"] = ok
        (self.out / "report.json").write_text(json.dumps(
            {"seconds": self.seconds, "verdict": verdict, "samples": self.samples,
             "wrk": wrk_out}, indent=1))
        rows = "\n".join(f"| {s['t']:.0f} | {s['rss_mib']:.1f} | {s['fds']:.0f} |"
                         for s in self.samples)
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True).stdout.strip() or "unknown"
        (self.out / "report.md").write_text(
            f"# Soak: {self.seconds:.0f} s, --processes 2 --threads 2, a worker killed every "
            f"{KILL_EVERY_S:.0f} s\n\ngit {rev}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{os.cpu_count()} CPUs; wrk: "
            + " ".join(w for w in self.wrk_summary.split() if w) + "\n\n"
            + "\n".join(f"- {k}: {v}" for k, v in verdict.items())
            + "\n\n| s | RSS MiB (all processes) | descriptors |\n|---:|---:|---:|\n" + rows
            + "\n\n![RSS and descriptors](plot.svg)\n")
        (self.out / "plot.svg").write_text(svg(self.samples, self.kills, self.t0))
        print(json.dumps(verdict, indent=1))
        return 0 if ok else 1


def svg(samples: list[dict[str, float]], kills: list[float], t0: float) -> str:
    """RSS (blue) and descriptors (orange) over time, each scaled to its own maximum; kills as
    grey lines. A hand-made SVG: no plotting library needed."""
    w, h, pad = 640, 240, 30
    if not samples:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}"/>'
    tmax = max(s["t"] for s in samples) or 1.0

    def line(key: str, color: str) -> str:
        top = max(s[key] for s in samples) or 1.0
        pts = " ".join(f"{pad + (w - 2 * pad) * s['t'] / tmax:.1f},"
                       f"{h - pad - (h - 2 * pad) * s[key] / top:.1f}" for s in samples)
        return (f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>'
                f'<text x="{w - pad}" y="{pad - 8 if color == "steelblue" else pad + 6}" '
                f'font-size="11" text-anchor="end" fill="{color}">{key} (max {top:g})</text>')
    marks = "".join(
        f'<line x1="{pad + (w - 2 * pad) * (k - t0) / tmax:.1f}" y1="{pad}" '
        f'x2="{pad + (w - 2 * pad) * (k - t0) / tmax:.1f}" y2="{h - pad}" stroke="#bbb"/>'
        for k in kills if k - t0 <= tmax)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">'
            f'<rect width="{w}" height="{h}" fill="white"/>{marks}'
            f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>'
            f'<text x="{pad}" y="{h - 8}" font-size="11">0 s</text>'
            f'<text x="{w - pad}" y="{h - 8}" font-size="11" text-anchor="end">{tmax:.0f} s'
            f'</text>{line("rss_mib", "steelblue")}{line("fds", "darkorange")}</svg>')


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        ap.error("wrk is needed for the keep-alive load and was not found on PATH "
                 "(Debian/Ubuntu: apt-get install wrk; `make test` installs it as root)")
    return Soak(args.seconds, args.out).run()


if __name__ == "__main__":
    raise SystemExit(main())
