"""`make h2spec`: h2spec (the HTTP/2 conformance suite, a Go program) against a server on this
tree's build, once over h2c (prior knowledge) and once over TLS (ALPN h2, a self-signed
certificate made for the run), each on a static route. Prints h2spec's summary line for each and
the cases that failed; exits 1 when a case fails.

No case is expected to fail. http2/3.5/2 ("Sends invalid connection preface") on the cleartext
port, which serves HTTP/1.1 and h2c side by side, sends bytes shaped like the preface's first
line that are no HTTP/1 request ("INVALID CONNECTION PREFACE" and an empty line): the server
closes without an HTTP/1.1 answer, as RFC 9113 3.4 asks (http1.c, not_http1_version)."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import cyserve
from cyserve._core import Server

EXPECTED_H2C: set[str] = set()


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


def main() -> int:
    h2spec = sys.argv[1]
    app = cyserve.App()
    app.static("/plaintext", b"Hello, World!", content_type="text/plain")
    routes = app.build()
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        cert, key = str(Path(d) / "cert.pem"), str(Path(d) / "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
        for name, tls in (("h2c", False), ("TLS", True)):
            options = {"ssl_certfile": cert, "ssl_keyfile": key} if tls else {}
            srv = Server(routes, host="127.0.0.1", port=0, threads=2, **options)
            srv.start()
            try:
                summary, failed = run_h2spec(h2spec, srv.port, tls)
            finally:
                srv.stop(grace=2.0)
            expected = EXPECTED_H2C if not tls else set()
            print(f"h2spec over {name}: {summary}")
            for case in sorted(failed):
                note = " (expected: see tests/h2spec_run.py)" if case in expected else ""
                print(f"  failed: {case}{note}")
            bad += len(failed - expected)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
