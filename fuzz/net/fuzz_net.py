"""Network fuzzing of a whole running cyserve server (run it against the ASan/UBSan build).

    python fuzz/net/fuzz_net.py --seconds 600 [--seed N] [--clients 4] [--wrk]

It starts `python -m cyserve fuzz.net.app:app` (every kind of route: fuzz/net/app.py) with two
worker threads and the access log on, then sends mutated requests from several client threads:
valid requests and the parser's seed corpus (fuzz/corpus/), with bit flips, byte swaps for
CR/LF/colon/NUL/0xff, inserted and deleted runs, duplicated lines, splices of two inputs and
truncations; each is written in random splits with small pauses, and the connection is then read
(2 s), half-closed, or reset. Meanwhile a watchdog keeps one keep-alive connection asking
`GET /plaintext` and fails the run if an answer is wrong or takes over 3 s (a stall), and with
--wrk, wrk loads /plaintext too. The run fails if the server dies, if its standard error holds a
sanitizer report, or if it does not stop cleanly on SIGTERM; the last inputs sent are then kept
in fuzz/net/crashes/ (copy the one that broke something into fuzz/regression-net/ with a name
saying what). Every file in fuzz/regression-net/ is sent first, on every run.
Exit status 0 when the server held; a summary line says what was sent and answered.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "fuzz" / "corpus"
REGRESSION = ROOT / "fuzz" / "regression-net"
CRASHES = ROOT / "fuzz" / "net" / "crashes"
REPORTS = ("AddressSanitizer", "UndefinedBehaviorSanitizer", "runtime error:", "LeakSanitizer",
           "Segmentation fault", "Fatal Python error")

VALID = [
    b"GET /plaintext HTTP/1.1\r\nHost: f\r\n\r\n",
    b"GET /py HTTP/1.1\r\nHost: f\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: f\r\n\r\n",
    b"GET /fibonacci HTTP/1.1\r\nHost: f\r\n\r\n",
    b"GET /users/42 HTTP/1.1\r\nHost: f\r\n\r\n",
    b"GET /files/index.html HTTP/1.1\r\nHost: f\r\nRange: bytes=3-40\r\n\r\n",
    b"HEAD /files/hello.txt HTTP/1.1\r\nHost: f\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: f\r\nContent-Length: 11\r\n\r\nhello world",
    b"POST /echo HTTP/1.1\r\nHost: f\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"POST /wsgi/x?a=1 HTTP/1.1\r\nHost: f\r\nContent-Length: 4\r\n"
    b"Expect: 100-continue\r\n\r\nbody",
    b"GET /sleep HTTP/1.1\r\nHost: f\r\n\r\n",
    b"GET /plaintext HTTP/1.1\r\nHost: f\r\n\r\nGET /py HTTP/1.1\r\nHost: f\r\n\r\n",
    b"GET /plaintext HTTP/1.0\r\n\r\n",
]
SPECIAL = b"\r\n: \x00\xff\t;=,\"%/?#0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seeds() -> list[bytes]:
    out = list(VALID)
    if CORPUS.is_dir():
        out += [p.read_bytes() for p in sorted(CORPUS.iterdir()) if p.is_file()]
    return out


def mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        if not b:
            b += rng.choice(pool)
        i = rng.randrange(len(b))
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.choice(SPECIAL)
        elif op == 2:
            b[i:i] = bytes(rng.choice(SPECIAL) for _ in range(rng.randint(1, 8)))
        elif op == 3:
            del b[i:i + rng.randint(1, 16)]
        elif op == 4:
            lines = bytes(b).split(b"\r\n")
            j = rng.randrange(len(lines))
            lines.insert(j, lines[j])
            b = bytearray(b"\r\n".join(lines))
        elif op == 5:
            other = rng.choice(pool)
            b = b[:i] + other[rng.randrange(len(other) + 1):]
        elif op == 6:
            del b[i:]
        else:
            b[i:i] = bytes(b[i:i + rng.randint(1, 64)]) * rng.randint(2, 200)
    return bytes(b)


class Server:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.out = open(workdir / "stdout.log", "wb")
        self.err_path = workdir / "stderr.log"
        self.err = open(self.err_path, "wb")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [p for p in [env.get("PYTHONPATH"), str(ROOT / "src"), str(ROOT)] if p])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cyserve", "fuzz.net.app:app", "--port", str(self.port),
             "--threads", "2", "--access-log", "--header-timeout", "2", "--body-timeout", "2",
             "--keepalive-timeout", "2", "--graceful-timeout", "3"],
            cwd=ROOT, env=env, stdout=self.out, stderr=self.err, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited at start:\n{self.stderr()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    s.sendall(VALID[0])
                    if s.recv(64):
                        return
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not answer within 60 s") from None
                time.sleep(0.1)

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                return -9
        return self.proc.returncode


def send_one(port: int, data: bytes, rng: random.Random, stats: collections.Counter[str]) -> None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        stats["connect failed"] += 1
        return
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pos = 0
        while pos < len(data):
            n = rng.randint(1, max(1, len(data) - pos)) if rng.random() < 0.7 else len(data) - pos
            s.sendall(data[pos:pos + n])
            pos += n
            if rng.random() < 0.2:
                time.sleep(rng.random() * 0.01)
        end = rng.random()
        if end < 0.1:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            stats["reset"] += 1
            return
        if end < 0.3:
            s.shutdown(socket.SHUT_WR)
            stats["half-closed"] += 1
        got = b""
        while len(got) < 1 << 20:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
            if rng.random() < 0.5:
                break
        m = re.match(rb"HTTP/1\.[01] (\d{3})", got)
        stats[m.group(1).decode() if m else ("closed" if not got else "other")] += 1
    except (socket.timeout, TimeoutError):
        stats["read timeout"] += 1
    except OSError:
        stats["connection error"] += 1
    finally:
        s.close()


def watchdog(port: int, stop: threading.Event, failures: list[str]) -> None:
    want = b"Hello, World!"
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.settimeout(5)
                while not stop.is_set():
                    t0 = time.monotonic()
                    s.sendall(VALID[0])
                    got = b""
                    while not got.endswith(want):
                        chunk = s.recv(4096)
                        if not chunk:
                            break
                        got += chunk
                    took = time.monotonic() - t0
                    if not got.endswith(want):
                        break  # keep-alive timeout or stop: reconnect
                    if not got.startswith(b"HTTP/1.1 200"):
                        failures.append(f"watchdog: wrong answer {got[:80]!r}")
                    if took > 3.0:
                        failures.append(f"watchdog: /plaintext took {took:.1f} s")
                    time.sleep(0.05)
        except OSError as exc:
            if not stop.is_set():
                failures.append(f"watchdog: {exc}")
                time.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--wrk", action="store_true", help="load /plaintext with wrk meanwhile")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    pool = seeds()
    regression = ([p.read_bytes() for p in sorted(REGRESSION.iterdir())]
                  if REGRESSION.is_dir() else [])
    workdir = Path(tempfile.mkdtemp(prefix="cyserve-fuzz-net-"))
    srv = Server(workdir)
    stats: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    recent: collections.deque[bytes] = collections.deque(maxlen=64)
    lock = threading.Lock()
    stop = threading.Event()
    wd = threading.Thread(target=watchdog, args=(srv.port, stop, failures), daemon=True)
    wd.start()
    wrk = None
    if args.wrk and shutil.which("wrk"):
        wrk = subprocess.Popen(["wrk", "-t1", "-c16", f"-d{int(args.seconds) + 5}s",
                                f"http://127.0.0.1:{srv.port}/plaintext"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sent = [0]
    deadline = time.monotonic() + args.seconds

    def client(k: int) -> None:
        rng = random.Random(seed * 131 + k)
        todo = list(regression) if k == 0 else []
        while time.monotonic() < deadline and not failures:
            data = todo.pop(0) if todo else mutate(rng, rng.choice(pool), pool)
            with lock:
                recent.append(data)
                sent[0] += 1
            send_one(srv.port, data, rng, stats)
            if srv.proc.poll() is not None:
                failures.append(f"the server exited with {srv.proc.returncode}")
                return

    clients = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    stop.set()
    wd.join(10)
    if wrk:
        wrk.terminate()
        wrk.wait()
    rc = srv.stop()
    err = srv.stderr()
    if rc not in (0, -signal.SIGTERM):
        failures.append(f"the server's exit status on SIGTERM was {rc}")
    for word in REPORTS:
        if word in err:
            failures.append(f"standard error holds {word!r}")
    print(f"seed {seed}: {sent[0]} inputs in {args.seconds:.0f} s, answers "
          + ", ".join(f"{k} {v}" for k, v in sorted(stats.items())))
    if failures:
        keep = CRASHES / time.strftime("%Y%m%d-%H%M%S")
        keep.mkdir(parents=True, exist_ok=True)
        for i, data in enumerate(recent):
            (keep / f"input-{i:02d}").write_bytes(data)
        (keep / "stderr.log").write_text(err)
        print("FAILED:\n  " + "\n  ".join(dict.fromkeys(failures)) + f"\nlast inputs: {keep}\n"
              + err[-4000:], file=sys.stderr)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
