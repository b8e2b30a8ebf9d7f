#!/bin/bash
# Instructions per keep-alive request in the server process, counted by callgrind, which a busy
# or shared machine does not move (wall-clock rates do).
#
#   bench/micro/cg_request.sh TREE APP PATH [N] [OUT]
#
# TREE: a cyserve checkout built with `make build` (its .venv runs the server); APP: module:app
# (bench.peers.python.asgi_app:app, bench.peers.python.wsgi_app:app, bench.http.apps.cyserve_py:app);
# PATH: the request target. The server runs with one worker thread under
# `valgrind --tool=callgrind`; a client in another process sends 300 warm-up requests, then the
# counters are zeroed (callgrind_control -z), N requests (2000) are sent on the same connection
# and the counters dumped (callgrind_control -d). So start-up, imports and the first requests'
# caches are left out, and the profile in OUT (default /tmp/cg-req.out) is the steady state:
# `callgrind_annotate --inclusive=yes OUT` shows where a request's instructions go.
# PYTHONHASHSEED=0: a random seed moves the counts by a few hundred per request.
# SERVER_PY overrides the interpreter (another tree's bench/.venv for the peers' servers);
# CONNS (1): requests go out on CONNS connections at once, one on each, then the answers are
# read, so that the server batches them as under load (N a multiple of CONNS).
# SERVER_CMD replaces the whole server command ({port} is replaced), e.g. fastpysgi's.
# WARMUP (300): the requests sent before the counters are zeroed; an app-bound route (/json,
# about 20 million instructions a request) is read with fewer, e.g. WARMUP=10 N=20.
set -euo pipefail
TREE=$(cd "$1" && pwd); APP=$2; TARGET=$3; N=${4:-2000}; OUT=${5:-/tmp/cg-req.out}
PORT=$((20000 + RANDOM % 20000))
PY=${SERVER_PY:-$TREE/.venv/bin/python}
if [ -n "${SERVER_CMD:-}" ]; then
  read -r -a CMD <<< "${SERVER_CMD//\{port\}/$PORT}"
else
  CMD=("$PY" -m cyserve "$APP" --host 127.0.0.1 --port "$PORT" --threads 1)
fi
# SERVER_ARGS: more options for cyserve (split on spaces), e.g. "--metrics-bind 127.0.0.1:0".
if [ -n "${SERVER_ARGS:-}" ]; then
  read -r -a MORE <<< "$SERVER_ARGS"
  CMD+=("${MORE[@]}")
fi
rm -f "$OUT" "$OUT".*
cd "$TREE"
PYTHONHASHSEED=0 PYTHONPATH="$TREE/src:$TREE${PYTHONPATH:+:$PYTHONPATH}" valgrind --tool=callgrind \
  --callgrind-out-file="$OUT" "${CMD[@]}" > "$OUT.log" 2>&1 &
VP=$!
python3 - "$PORT" "$TARGET" "$N" "$VP" "${CONNS:-1}" "${WARMUP:-300}" <<'PY'
import socket, subprocess, sys, time
port, target, n, pid, conns = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
warmup = int(sys.argv[6])
req = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
for _ in range(3000):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=120).close(); break
    except OSError: time.sleep(0.1)
else:
    sys.exit("the server did not start")
socks = [socket.create_connection(("127.0.0.1", port), timeout=120) for _ in range(conns)]
bufs = [b""] * conns
def recv(s, n):
    # A connection the server closed (its keep-alive timeout, on a slow machine) would
    # otherwise make these loops spin on b"" for ever.
    got = s.recv(n)
    if not got:
        sys.exit("the server closed a connection (raise CYSERVE_KEEPALIVE_TIMEOUT)")
    return got
def answer(i):
    s, buf = socks[i], bufs[i]
    while b"\r\n\r\n" not in buf:
        buf += recv(s, 65536)
    head, _, buf = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
    while len(buf) < length:
        buf += recv(s, 262144)
    bufs[i] = buf[length:]
def rounds(total):
    # One request on each connection, then every answer: CONNS requests in flight at once.
    for _ in range(total // conns):
        for s in socks: s.sendall(req)
        for i in range(conns): answer(i)
rounds(warmup)
subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
rounds(n)
subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
PY
kill -TERM $VP; wait $VP || true
# The dump made by -d is OUT.<n> (its counts start at the zeroing); the final one is OUT.
DUMP=$(ls "$OUT".* | grep -v '\.log$' | head -1)
TOTAL=$(grep -h '^summary:\|^totals:' "$DUMP" | head -1 | awk '{print $2}')
echo "$APP $TARGET: $TOTAL instructions / $N = $((TOTAL / N)) per request ($DUMP)"
