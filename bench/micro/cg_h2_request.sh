#!/bin/bash
# Instructions per HTTP/2 stream in the server process, counted by callgrind (as cg_request.sh
# counts HTTP/1.1 requests): h2c by prior knowledge, one connection, M streams sent at once and
# all answered before the next M, so the connection goes idle (and is woken again) once per M
# streams, as a client's page load does.
#
#   bench/micro/cg_h2_request.sh TREE APP PATH [N] [M] [OUT]
#
# TREE: a cyserve checkout built with `make build`; APP: module:app (for the static route,
# bench.http.apps.cyserve_static_app:app); PATH: the request target. The server runs with one
# worker thread under `valgrind --tool=callgrind`; the client sends 300 warm-up streams, then
# the counters are zeroed, N streams (2000, a multiple of M, 10 by default) are sent and the
# counters dumped, so OUT (default /tmp/cg-h2.out) is the steady state.
set -euo pipefail
TREE=$(cd "$1" && pwd); APP=$2; TARGET=$3; N=${4:-2000}; M=${5:-10}; OUT=${6:-/tmp/cg-h2.out}
PORT=$((20000 + RANDOM % 20000))
PY=${SERVER_PY:-$TREE/.venv/bin/python}
rm -f "$OUT" "$OUT".*
cd "$TREE"
PYTHONHASHSEED=0 PYTHONPATH="$TREE/src:$TREE${PYTHONPATH:+:$PYTHONPATH}" valgrind --tool=callgrind \
  --callgrind-out-file="$OUT" "$PY" -m cyserve "$APP" --host 127.0.0.1 --port "$PORT" \
  --threads 1 > "$OUT.log" 2>&1 &
VP=$!
python3 - "$PORT" "$TARGET" "$N" "$VP" "$M" <<'PY'
import socket, subprocess, sys, time
port, target, n, pid, m = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
for _ in range(6000):  # valgrind starts the interpreter slowly on a loaded machine
    try:
        socket.create_connection(("127.0.0.1", port), timeout=120).close(); break
    except OSError: time.sleep(0.1)
else:
    sys.exit("the server did not start")
def frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload
# GET: :method GET (2) and :scheme http (6) from HPACK's static table, :path and :authority as
# literals without indexing, END_STREAM | END_HEADERS.
block = bytes([0x82, 0x86, 0x04, len(target)]) + target.encode() + bytes([0x01, 9]) + b"127.0.0.1"
s = socket.create_connection(("127.0.0.1", port), timeout=120)
s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
buf, sid = b"", 1
def batch():
    global buf, sid
    ids = set()
    out = b""
    for _ in range(m):
        out += frame(1, 0x5, sid, block); ids.add(sid); sid += 2
    s.sendall(out)
    while ids:
        while len(buf) < 9 or len(buf) < 9 + int.from_bytes(buf[:3], "big"):
            chunk = s.recv(262144)
            if not chunk:
                sys.exit("the server closed the connection")
            buf += chunk
        size = int.from_bytes(buf[:3], "big")
        kind, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
        buf = buf[9 + size:]
        if kind == 4 and not flags & 1:
            s.sendall(frame(4, 1, 0))
        elif kind in (3, 7):
            sys.exit(f"frame type {kind} on stream {stream}")
        elif kind in (0, 1) and flags & 1:
            ids.discard(stream)
for _ in range(300 // m):
    batch()
subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
for _ in range(n // m):
    batch()
subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
PY
kill -TERM $VP; wait $VP || true
DUMP=$(ls "$OUT".* | grep -v '\.log$' | head -1)
TOTAL=$(grep -h '^summary:\|^totals:' "$DUMP" | head -1 | awk '{print $2}')
echo "$APP $TARGET h2c x$M: $TOTAL instructions / $N = $((TOTAL / N)) per stream ($DUMP)"
