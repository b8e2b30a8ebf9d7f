#!/bin/bash
# Instructions per WebSocket round trip in the server process with permessage-deflate, counted by
# callgrind (a busy or shared machine does not move it), and the bytes the server sent for them.
#
#   bench/micro/cg_ws_roundtrip.sh TREE APP [N] [OUT]
#
# TREE: a cyserve checkout built with `make build`; APP: module:app serving an echo at /ws
# (bench.peers.python.ws_asgi_app:app, the raw ASGI echo; bench.http.apps.cyserve_ws_app:app, the
# App's @app.websocket echo). The server runs with one worker thread under
# `valgrind --tool=callgrind`; a client in another process opens one WebSocket offering
# `permessage-deflate; client_max_window_bits` (what browsers offer), keeps or drops its own
# context as the server's answer says, sends 200 warm-up messages, then the counters are zeroed,
# N messages (1000) are echoed one at a time and the counters dumped. The messages are the
# sample text below: JSON events of about 200 bytes, alike but not equal (a chat or a feed), so
# that a window kept across messages has something to find. The script prints the server's answer,
# the instructions per round trip and the compression ratio of the server's frames (their
# payload bytes against the messages' own).
# PYTHONHASHSEED=0: a random seed moves the counts by a few hundred per message.
set -euo pipefail
TREE=$(cd "$1" && pwd); APP=$2; N=${3:-1000}; OUT=${4:-/tmp/cg-ws.out}
PORT=$((20000 + RANDOM % 20000))
PY=${SERVER_PY:-$TREE/.venv/bin/python}
rm -f "$OUT" "$OUT".*
cd "$TREE"
PYTHONHASHSEED=0 PYTHONPATH="$TREE/src:$TREE${PYTHONPATH:+:$PYTHONPATH}" valgrind --tool=callgrind \
  --callgrind-out-file="$OUT" "$PY" -m cyserve "$APP" --host 127.0.0.1 --port "$PORT" \
  --threads 1 --ws-ping-interval 0 > "$OUT.log" 2>&1 &
VP=$!
python3 - "$PORT" "$N" "$VP" <<'PY'
import base64, json, os, socket, struct, subprocess, sys, time, zlib
port, n, pid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def message(i):
    return json.dumps({"type": "message", "id": 100000 + i, "room": f"room-{i % 7}",
                       "user": {"id": 4000 + i % 13, "name": ["ada", "grace", "linus", "ken"][i % 4]},
                       "text": f"message number {i} in the sample feed, about the same as the others",
                       "ts": 1764100000 + 3 * i, "flags": ["seen", "delivered"][: 1 + i % 2]}).encode()

for _ in range(3000):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=120).close(); break
    except OSError: time.sleep(0.1)
else:
    sys.exit("the server did not start")
s = socket.create_connection(("127.0.0.1", port), timeout=120)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
          f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
          f"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
assert head.startswith(b"HTTP/1.1 101"), head
ext = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-extensions:")]
assert ext, "permessage-deflate was not negotiated"
ext = ext[0].decode()
print(f"answer: {ext}")
client_nct = "client_no_context_takeover" in ext
server_nct = "server_no_context_takeover" in ext
comp = zlib.compressobj(wbits=-15)
inflater = zlib.decompressobj(wbits=-15)
buf = b""
def exact(k):
    global buf
    while len(buf) < k:
        buf += s.recv(65536)
    out, buf = buf[:k], buf[k:]
    return out
def roundtrip(i):
    global comp, inflater
    data = message(i)
    if client_nct:
        comp = zlib.compressobj(wbits=-15)
    payload = (comp.compress(data) + comp.flush(zlib.Z_SYNC_FLUSH))[:-4]
    mask = os.urandom(4)
    hdr = bytes([0xC1]) + (bytes([0x80 | len(payload)]) if len(payload) < 126 else bytes([0x80 | 126]) + struct.pack("!H", len(payload)))
    s.sendall(hdr + mask + bytes(b ^ mask[j % 4] for j, b in enumerate(payload)))
    b0, b1 = exact(2)
    k = b1 & 0x7F
    if k == 126:
        k = struct.unpack("!H", exact(2))[0]
    got = exact(k)
    if b0 & 0x40:
        if server_nct:
            inflater = zlib.decompressobj(wbits=-15)
        back = inflater.decompress(got + b"\x00\x00\xff\xff")
    else:
        back = got
    assert back == data, (back[:60], data[:60])
    return len(got), len(data), len(payload)
for i in range(200):
    roundtrip(i)
subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
sent = plain = client = 0
for i in range(200, 200 + n):
    a, b, c = roundtrip(i)
    sent += a; plain += b; client += c
subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
print(f"messages: {n} of {plain / n:.0f} bytes on average; the server's frames: {sent / n:.1f} bytes "
      f"(ratio {plain / sent:.2f}); the client's: {client / n:.1f} bytes (ratio {plain / client:.2f})")
PY
kill -TERM $VP; wait $VP || true
DUMP=$(ls "$OUT".* | grep -v '\.log$' | head -1)
TOTAL=$(grep -h '^summary:\|^totals:' "$DUMP" | head -1 | awk '{print $2}')
echo "$APP: $TOTAL instructions / $N = $((TOTAL / N)) per round trip ($DUMP)"
