"""h2spec (the HTTP/2 conformance suite, a Go program) against a server on this tree's build,
once over h2c (prior knowledge) and once over TLS (ALPN h2, a self-signed certificate made for
the run), each on a static route. `make h2spec` runs this file, which prints h2spec's summary
line for each and the cases that failed, and exits 1 when a case fails;
tests/e2e/test_h2spec.py runs the same from `make test` and skips, saying why, where Go or its
module proxy is missing.

h2spec is built once, with `go build -mod=readonly` from tests/h2spec/ (a go.mod and go.sum of
ours that pin h2spec 2.2.1 and every module it needs), into build/h2spec/<hash of those two
files>/ (ignored by git, like the build's other products) and reused afterwards; a change of the
pins builds anew. Two runs at once (two checkouts' tests, `make h2spec` beside `make test`) take
a lock around the build, and the binary is put in place by a rename, so neither sees a
half-written file.

No case is expected to fail. http2/3.5/2 ("Sends invalid connection preface") on the cleartext
port, which serves HTTP/1.1 and h2c side by side, sends bytes shaped like the preface's first
line that are no HTTP/1 request ("INVALID CONNECTION PREFACE" and an empty line): the server
closes without an HTTP/1.1 answer, as RFC 9113 3.4 asks (http1.c, not_http1_version)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cyserve
from cyserve._core import Server

# The pinned release (tests/h2spec/go.mod), and how many cases it has (its generic, http2 and
# hpack sections): a run must pass all of them, so a case that went missing would be seen as well
# as one that failed.
PACKAGE = "github.com/summerwind/h2spec/cmd/h2spec"
CASES = 145
PINS = Path(__file__).resolve().parent / "h2spec"
CACHE = Path(__file__).resolve().parent.parent / "build" / "h2spec"
# `go build` compiles for about 70 s of CPU (40 s on 2 free cores, 4 minutes measured on a
# 2-core machine at load average 6-9) when Go's own caches are empty; seconds when they are warm.
# A module proxy that cannot be reached ends it sooner, with one of the errors below; with the
# pinned modules already in Go's module cache it is not asked at all.
INSTALL_TIMEOUT = 600.0
# What Go says when it cannot reach the module proxy (or is told not to): a missing network is
# the machine's, not this tree's, so it skips; any other failure of `go build` is an error.
OFFLINE = re.compile(r"dial tcp|no such host|connection refused|i/o timeout|TLS handshake timeout|"
                     r"network is unreachable|connection timed out|connection reset|proxyconnect|"
                     r"server misbehaving|GOPROXY=off|temporary failure in name resolution",
                     re.IGNORECASE)


class Unavailable(Exception):
    """h2spec cannot be installed here for a reason outside this tree: no Go, or no proxy."""


@dataclass
class Outcome:
    name: str  # "h2c" or "TLS"
    summary: str  # h2spec's own line, "145 tests, 145 passed, 0 skipped, 0 failed"
    total: int
    passed: int
    failed: set[str]


def go_command() -> str | None:
    """The go command: $GO, else the PATH's, else the official tarball's place."""
    for go in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if go and os.access(go, os.X_OK):
            return go
    return None


def pins_digest() -> str:
    """A short hash of tests/h2spec/go.mod and go.sum: the build folder, so new pins build anew."""
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        h.update((PINS / name).read_bytes())
    return h.hexdigest()[:12]


def install(cache: Path | None = None) -> str:
    """The path of the pinned h2spec, built into cache (build/h2spec/<pins' hash>/ by default)
    when missing. Raises Unavailable without Go or without the pinned modules (neither in Go's
    module cache nor from a reachable proxy)."""
    cache = cache if cache is not None else CACHE / pins_digest()
    binary = cache / "h2spec"
    if binary.exists():
        return str(binary)
    go = go_command()
    if go is None:
        raise Unavailable("no Go toolchain (no `go` on the PATH, none in /usr/local/go/bin)")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():  # another run built it while this one waited for the lock
            return str(binary)
        # The sanitizers' runtime preloaded by `make test-asan` is the interpreter's to carry.
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            command = [go, "build", "-mod=readonly", "-o", str(Path(tmp) / "h2spec"), PACKAGE]
            try:
                r = subprocess.run(command, cwd=PINS, env=env, capture_output=True, text=True,
                                   timeout=INSTALL_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"go build {PACKAGE} (tests/h2spec) ran past "
                                   f"{INSTALL_TIMEOUT:.0f} s") from None
            if r.returncode != 0:
                first = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "no message"
                if OFFLINE.search(r.stderr):
                    raise Unavailable(f"the Go module proxy is unreachable ({first})")
                raise RuntimeError(f"go build {PACKAGE} (tests/h2spec) failed:\n{r.stderr}")
            os.replace(Path(tmp) / "h2spec", binary)
    return str(binary)


def run_h2spec(h2spec: str, port: int, tls: bool) -> tuple[str, set[str]]:
    args = [h2spec, "-h", "127.0.0.1", "-p", str(port), "-P", "/plaintext", "-o", "3", "-j",
            "/dev/null"]
    if tls:
        args += ["-t", "-k"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600).stdout
    summary = next((line for line in reversed(out.splitlines()) if " tests, " in line), out)
    # The failures section repeats each failed case under its section numbers.
    failed: set[str] = set()
    section: list[str] = []
    in_failures = False
    for line in out.splitlines():
        if line.startswith("Failures:"):
            in_failures = True
            continue
        if not in_failures:
            continue
        m = re.match(r"^(\s*)(\d+(?:\.\d+)*)\. ", line)
        if m:
            depth = len(m.group(1)) // 2
            section = section[:max(depth - 1, 0)] + [m.group(2)]
            continue
        m = re.match(r"^\s*× (\d+):", line)
        if m:
            failed.add("http2/" + section[-1] + "/" + m.group(1) if section else m.group(1))
    return summary.strip(), failed


def conformance(h2spec: str) -> list[Outcome]:
    """h2spec over h2c, then over TLS, each against a server of its own on a static route."""
    app = cyserve.App()
    app.static("/plaintext", b"Hello, World!", content_type="text/plain")
    routes = app.build()
    outcomes = []
    with tempfile.TemporaryDirectory() as d:
        cert, key = str(Path(d) / "cert.pem"), str(Path(d) / "key.pem")
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=localhost"], check=True,
                       capture_output=True, env=env)
        for name, tls in (("h2c", False), ("TLS", True)):
            options = {"ssl_certfile": cert, "ssl_keyfile": key} if tls else {}
            srv = Server(routes, host="127.0.0.1", port=0, threads=2, **options)
            srv.start()
            try:
                summary, failed = run_h2spec(h2spec, srv.port, tls)
            finally:
                srv.stop(grace=2.0)
            m = re.match(r"(\d+) tests, (\d+) passed", summary)
            total, passed = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
            outcomes.append(Outcome(name, summary, total, passed, failed))
    return outcomes


def main() -> int:
    try:
        h2spec = sys.argv[1] if len(sys.argv) > 1 else install()
    except Unavailable as e:
        print(f"h2spec not run: {e}")
        return 1
    bad = 0
    for o in conformance(h2spec):
        print(f"h2spec over {o.name}: {o.summary}")
        for case in sorted(o.failed):
            print(f"  failed: {case}")
        if o.failed or o.total != CASES or o.passed != CASES:
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
