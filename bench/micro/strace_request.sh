#!/bin/bash
# System calls per keep-alive request in the server process, counted by `strace -c`, which a
# busy or shared machine moves far less than wall-clock rates (the counts depend on how requests
# batch, not on how fast they are served).
#
#   bench/micro/strace_request.sh TREE APP PATH [N] [OUT]
#
# Same arguments and environment as cg_request.sh (SERVER_PY, SERVER_CMD, CONNS), and the same
# client: the server runs with one worker thread, 300 warm-up requests go out, then strace
# attaches to every thread of the server (-f: threads started later too), N requests (2000) are
# sent and strace detaches. OUT (default /tmp/strace-req.txt) is `strace -c`'s table; the last
# line printed is each system call's count per request. With CONNS=1 each request is answered
# before the next is sent, so the counts are the same from run to run; with CONNS > 1 the
# requests in flight batch as under load, and the counts move a little with the batching.
# Whether the worker parks between two requests (light load) or finds the next one waiting
# depends on the client's speed: PACE_MS (0) makes the client wait that long after each round
# of answers, so that the worker parks before every request and the counts are those of a
# server under light load, the same from run to run.
set -euo pipefail
TREE=$(cd "$1" && pwd); APP=$2; TARGET=$3; N=${4:-2000}; OUT=${5:-/tmp/strace-req.txt}
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
cd "$TREE"
PYTHONHASHSEED=0 PYTHONPATH="$TREE/src:$TREE${PYTHONPATH:+:$PYTHONPATH}" "${CMD[@]}" \
  > "$OUT.log" 2>&1 &
SP=$!
python3 - "$PORT" "$TARGET" "$N" "$SP" "${CONNS:-1}" "$OUT" "${PACE_MS:-0}" <<'PY'
import os, signal, socket, subprocess, sys, time
port, target, n, pid, conns, out = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
                                    sys.argv[4], int(sys.argv[5]), sys.argv[6])
pace = float(sys.argv[7]) / 1000
req = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
for _ in range(600):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=60).close(); break
    except OSError: time.sleep(0.1)
else:
    sys.exit("the server did not start")
socks = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(conns)]
bufs = [b""] * conns
def answer(i):
    s, buf = socks[i], bufs[i]
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, _, buf = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
    while len(buf) < length:
        buf += s.recv(262144)
    bufs[i] = buf[length:]
def rounds(total):
    for _ in range(total // conns):
        for s in socks: s.sendall(req)
        for i in range(conns): answer(i)
        if pace: time.sleep(pace)
rounds(300)
# -p of the process with -f attaches every thread it has ("attached with N threads").
st = subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", pid], stderr=subprocess.PIPE)
while b"attached" not in st.stderr.readline():
    if st.poll() is not None:
        sys.exit("strace ended before attaching")
time.sleep(0.5)
rounds(n)
time.sleep(0.2)
st.send_signal(signal.SIGINT)
st.wait()
PY
kill -TERM $SP; wait $SP || true
awk -v n="$N" 'NR > 2 && $1 ~ /^[0-9.]+$/ { printf "%s %.2f  ", $NF, $4 / n } END { print "" }' "$OUT"
