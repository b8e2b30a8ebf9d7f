#!/bin/bash
# Instructions per TLS connection (handshake, one HTTP/1.1 request with Connection: close, the
# close) in the server process, counted by callgrind, for new or resumed handshakes; and, with
# STRACE=1, the server's system calls per connection (strace -c -f) instead. Mode plain makes the
# same connections without TLS (plain HTTP/1.1 on both servers): the accept and close path alone.
# With CPU=1 the server runs bare and the script prints connections per server CPU-second over
# the N connections instead (utime + stime of every thread, /proc/PID/stat, in clock ticks of
# 10 ms: take N large enough, 2000 or more), with the user and system (kernel) shares; a timed
# figure, so the machine's load moves it. With PERF=1 the server runs bare and perf (its
# tracepoints, not sampling) counts, over the N connections, the server's system calls, its
# epoll_wait returns (its wake-ups: every return, with events or not) and the events those
# returned, per connection: what callgrind's instructions and `strace -c` leave out is how often
# the worker goes round its loop, and perf's tracepoints barely slow the server, so the client's
# bytes arrive at the moments they would untraced.
#
#   bench/micro/cg_tls_handshake.sh TREE new|resume|plain [N] [OUT]
#
# TREE: a cyserve checkout built with `make build`. The server is cyserve (bench.http.apps'
# static /plaintext app, one worker thread) or, with SERVER=nginx, nginx 1.22 with the suite's
# protocol configuration (bench/peers/nginx/nginx-proto.conf.template) in one process (no
# master), both on the same ECDSA P-256 certificate. The client (Python's ssl, OpenSSL's client:
# TLS 1.3, X25519, as the suite's `load tls`) makes 30 connections to warm up, the counters are
# zeroed, then N (300) more are made one after another and the counters dumped; with resume,
# each connection offers the ticket of the one before (every one after the first resumes; the
# script checks that they did). Wall-clock rates on a shared machine are noise; these are not.
set -euo pipefail
TREE=$(cd "$1" && pwd); MODE=$2; N=${3:-300}; OUT=${4:-/tmp/cg-tls.out}
PORT=$((20000 + RANDOM % 20000))
WORK=$(mktemp -d /tmp/cg-tls.XXXXXX)
[ "$MODE" = plain ] && PLAIN=1
. "$(dirname "$0")/tls_server.sh"  # the certificate and the server: VP, $OUT.log
python3 - "$PORT" "$MODE" "$N" "$VP" "${STRACE:-0}" "$OUT" "${CPU:-0}" "${PERF:-0}" <<'PY'
import os, signal, socket, ssl, subprocess, sys, time
port, mode, n, pid, strace, out = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1", sys.argv[6]
cpu, perf = sys.argv[7] == "1", sys.argv[8] == "1"
def cpu_ticks():
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])  # utime and stime of every thread
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["http/1.1"])
req = b"GET /plaintext HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
sess = None
def one():
    global sess
    with socket.create_connection(("127.0.0.1", port), timeout=120) as raw:
        if mode == "plain":
            return read_all(raw, None)
        with ctx.wrap_socket(raw, server_hostname="localhost",
                             session=sess if mode == "resume" else None) as s:
            return read_all(s, s)
def read_all(s, tls):
    global sess
    s.sendall(req)
    body = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        body += d
    assert b"Hello, World!" in body, body
    if tls is None:
        return False
    sess = tls.session
    return tls.session_reused
for _ in range(3000):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=120).close(); break
    except OSError: time.sleep(0.1)
else:
    sys.exit("the server did not start")
for _ in range(30):
    one()
tracer = None
if strace:
    tracer = subprocess.Popen(["strace", "-c", "-f", "-o", out + ".strace", "-p", pid])
    time.sleep(3.0)  # until it is attached to every thread
elif cpu:
    t0 = cpu_ticks()
elif perf:
    tracer = subprocess.Popen(["perf", "record", "-q", "-e", "raw_syscalls:sys_enter", "-e",
                               "syscalls:sys_exit_epoll_wait", "-p", pid, "-o", out + ".perf"],
                              stdout=subprocess.DEVNULL)
    time.sleep(2.0)  # until it is attached to every thread
else:
    subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
got = sum(one() for _ in range(n))
if cpu:
    t1, hz = cpu_ticks(), os.sysconf("SC_CLK_TCK")
    user, system = (t1[0] - t0[0]) / hz, (t1[1] - t0[1]) / hz
    print(f"{mode}: {n} connections in {user + system:.2f} s of server CPU ({user:.2f} user, "
          f"{system:.2f} system): {n / (user + system):,.0f} per CPU-second")
if mode == "resume" and got != n:
    sys.exit(f"only {got} of {n} resumed")
if strace or perf:
    time.sleep(0.5)
    tracer.send_signal(signal.SIGINT if perf else signal.SIGTERM); tracer.wait()
elif not cpu:
    subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
PY
kill -TERM $VP; wait $VP || true
if [ "${CPU:-0}" = 1 ]; then
  :
elif [ "${PERF:-0}" = 1 ]; then
  # Per connection: divided by N. The Python main thread's sleeps (clock_nanosleep, 230) and
  # the tracer's own last calls are left out by counting only the worker threads' calls: the
  # threads that called epoll_wait.
  perf script -i "$OUT.perf" -F tid,event,trace 2>/dev/null | python3 -c '
import collections, re, sys
n = int(sys.argv[1])
calls, per_tid, waits, events, empty = collections.Counter(), collections.Counter(), 0, 0, 0
for line in sys.stdin:
    m = re.match(r"\s*(\d+)\s+(\S+):\s+(.*)", line)
    if not m:
        continue
    tid, ev, rest = m.groups()
    if ev.endswith("sys_exit_epoll_wait"):
        r = int(rest.split("0x")[-1], 16) if "0x" in rest else int(rest.split()[-1])
        waits += 1; events += max(r, 0); empty += r == 0
        per_tid[tid] += 0
    else:
        calls[(tid, int(rest.split("NR ")[1].split()[0]))] += 1
workers = set(per_tid)
by_nr = collections.Counter()
for (tid, nr), c in calls.items():
    if tid in workers:
        by_nr[nr] += c
names = {0: "read", 1: "write", 3: "close", 7: "poll", 20: "writev", 44: "sendto",
         45: "recvfrom", 46: "sendmsg", 48: "shutdown", 54: "setsockopt", 202: "futex",
         228: "clock_gettime", 232: "epoll_wait", 233: "epoll_ctl", 288: "accept4"}
if by_nr[288] != n:
    # perf attached late or lost events: the figures would be of a part of the run.
    sys.exit(f"incomplete trace: {by_nr[288]} accept4 calls for {n} connections")
print(f"per connection over {n}: system calls {sum(by_nr.values()) / n:.2f}, epoll_wait returns "
      f"(wake-ups) {waits / n:.2f} (of which with no event {empty / n:.2f}), events returned "
      f"{events / n:.2f}")
print("  " + ", ".join(f"{names.get(nr, nr)} {c / n:.2f}" for nr, c in by_nr.most_common()))
' "$N"
elif [ "${STRACE:-0}" = 1 ]; then
  # Per connection: divided by the accept4 calls that returned one (strace may have attached
  # to the worker a little late); the Python main thread's sleeps are left out.
  echo "system calls of the server per connection ($MODE):"
  python3 - "$OUT.strace" <<'PY'
import sys
calls = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) in (5, 6) and f[0][0].isdigit() and f[-1] not in ("total", "clock_nanosleep"):
        calls[f[-1]] = (int(f[3]), int(f[4]) if len(f) == 6 else 0)
conns = calls["accept4"][0] - calls["accept4"][1]
for k, (n, e) in sorted(calls.items(), key=lambda kv: -kv[1][0]):
    print(f"  {k:14} {n / conns:6.2f}" + (f" ({e / conns:.2f} failed)" if e else ""))
print(f"  {'all':14} {sum(n for n, _ in calls.values()) / conns:6.2f} over {conns} connections")
PY
else
  DUMP=$(ls "$OUT".* | grep -v '\.log$' | head -1)
  TOTAL=$(grep -h '^summary:\|^totals:' "$DUMP" | head -1 | awk '{print $2}')
  echo "${SERVER:-cyserve} $MODE: $TOTAL instructions / $N = $((TOTAL / N)) per connection ($DUMP)"
  if [ -n "${CALLGRIND_OPTS:-}" ]; then
    # Every event counted (with --cache-sim / --branch-sim: the misses), per connection.
    paste <(grep -h '^events:' "$DUMP" | head -1 | cut -d' ' -f2- | tr ' ' '\n') \
          <(grep -h '^summary:\|^totals:' "$DUMP" | head -1 | cut -d' ' -f2- | tr ' ' '\n') |
      awk -v n="$N" '{printf "  %-5s %12.0f per connection\n", $1, $2 / n}'
  fi
fi
rm -rf "$WORK"
