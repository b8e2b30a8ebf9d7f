#!/bin/bash
# Instructions (callgrind) or system calls (STRACE=1, strace -c -f) per HTTPS keep-alive request
# in the server process: cyserve's static /plaintext app with one worker thread, or with
# SERVER=nginx nginx 1.22 in one process with the suite's protocol configuration
# (bench/peers/nginx/nginx-proto.conf.template), both on the same ECDSA P-256 certificate.
#
#   bench/micro/cg_tls_request.sh TREE [N] [OUT]
#
# TREE: a cyserve checkout built with `make build`. The client (Python's ssl, OpenSSL's client:
# TLS 1.3, X25519, TLS_AES_128_GCM_SHA256, which both servers put first, ALPN http/1.1, as wrk
# in the suite's `https` workload) opens one connection, sends 300 requests one after another
# on it (each answer read before the next request), the counters are zeroed (or strace
# attaches), N (2000) more requests go out the same way and the counters are dumped (strace
# detaches). So the handshake is left out: the figure is the cost of one request on a warm
# keep-alive TLS connection. With callgrind, the calls per request of the TLS and allocator
# functions that matter are printed too (SSL_read_ex, SSL_write_ex, malloc, free...).
# Wall-clock rates on a shared machine are noise; these counts are not.
set -euo pipefail
TREE=$(cd "$1" && pwd); N=${2:-2000}; OUT=${3:-/tmp/cg-tls-req.out}
PORT=$((20000 + RANDOM % 20000))
WORK=$(mktemp -d /tmp/cg-tls-req.XXXXXX)
. "$(dirname "$0")/tls_server.sh"  # the certificate and the server: VP, $OUT.log
python3 - "$PORT" "$N" "$VP" "${STRACE:-0}" "$OUT" <<'PY'
import socket, ssl, subprocess, sys, time
port, n, pid, strace, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", sys.argv[5]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["http/1.1"])
req = b"GET /plaintext HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
for _ in range(3000):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=120).close(); break
    except OSError: time.sleep(0.1)
else:
    sys.exit("the server did not start")
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=120),
                    server_hostname="localhost")
buf = b""
def recv():
    got = s.recv(65536)
    if not got:
        sys.exit("the server closed the connection")
    return got
def requests(k):
    global buf
    for _ in range(k):
        s.sendall(req)
        while b"\r\n\r\n" not in buf:
            buf += recv()
        head, _, buf = buf.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
        while len(buf) < length:
            buf += recv()
        assert buf[:length] == b"Hello, World!", buf
        buf = buf[length:]
requests(300)
print(f"{s.version()} {s.cipher()[0]}", file=sys.stderr)
tracer = None
if strace:
    tracer = subprocess.Popen(["strace", "-c", "-f", "-o", out + ".strace", "-p", pid])
    time.sleep(3.0)  # until it is attached to every thread
else:
    subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
requests(n)
if strace:
    time.sleep(0.5)
    tracer.terminate(); tracer.wait()
else:
    subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
s.close()
PY
kill -TERM $VP; wait $VP || true
if [ "${STRACE:-0}" = 1 ]; then
  # The Python main thread's sleeps are left out.
  echo "system calls of the server per keep-alive HTTPS request (${SERVER:-cyserve}):"
  python3 - "$OUT.strace" "$N" <<'PY'
import sys
calls = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) in (5, 6) and f[0][0].isdigit() and f[-1] not in ("total", "clock_nanosleep"):
        calls[f[-1]] = (int(f[3]), int(f[4]) if len(f) == 6 else 0)
n = int(sys.argv[2])
for k, (c, e) in sorted(calls.items(), key=lambda kv: -kv[1][0]):
    print(f"  {k:14} {c / n:6.2f}" + (f" ({e / n:.2f} failed)" if e else ""))
print(f"  {'all':14} {sum(c for c, _ in calls.values()) / n:6.2f} over {n} requests")
PY
else
  DUMP=$(ls "$OUT".* | grep -v '\.log$' | head -1)
  TOTAL=$(grep -h '^summary:\|^totals:' "$DUMP" | head -1 | awk '{print $2}')
  echo "${SERVER:-cyserve} https keep-alive: $TOTAL instructions / $N = $((TOTAL / N)) per request ($DUMP)"
  # Calls per request of a few functions: callgrind writes each call as "cfn=(id)" followed by
  # "calls=COUNT ..." (the id's name is given where it first appears, in an fn= or cfn= line).
  python3 - "$DUMP" "$N" <<'PY'
import re, sys
names, counts, cur = {}, {}, None
want = ("SSL_read_ex", "SSL_read", "SSL_write_ex", "SSL_write", "CRYPTO_malloc", "CRYPTO_free",
        "malloc", "free", "read", "recv", "write", "sendto", "writev", "epoll_wait")
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"(c?)fn=\((\d+)\)(?: (.*))?", line)
    if m:
        # A name is given with its id the first time, in an fn= or a cfn= line.
        if m.group(3):
            names[m.group(2)] = m.group(3).strip()
        cur = names.get(m.group(2)) if m.group(1) else None
        continue
    if cur and line.startswith("calls="):
        counts[cur] = counts.get(cur, 0) + int(line[6:].split()[0])
        cur = None
n = int(sys.argv[2])
for w in want:
    for k, v in counts.items():
        if k.split("'")[0] == w:
            print(f"  calls of {k}: {v / n:.2f} per request")
PY
fi
rm -rf "$WORK"
