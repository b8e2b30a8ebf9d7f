#!/bin/bash
# CPU time, page faults and context switches per keep-alive request in the server process, read
# from /proc around a wrk run, so that the kernel's share of a request (what callgrind does not
# count and `strace -c` counts only as calls) shows beside the user's.
#
#   bench/micro/cpu_request.sh TREE APP PATH [SECONDS] [CONNS]
#
# Same TREE, APP, PATH, SERVER_PY and SERVER_CMD as cg_request.sh. The server runs with one
# worker thread pinned to CPU 0 (taskset; SERVER_CPU overrides), wrk -t1 -cCONNS (64) on CPU 1
# (CLIENT_CPU) for SECONDS (5) after a 1 s warm-up. Printed per request, over the requests wrk
# counted: user and system CPU time in microseconds (utime and stime of /proc/PID/stat, in
# clock ticks, so read over thousands of requests), minor page faults, and the voluntary and
# involuntary context switches of all the server's threads (/proc/PID/task/*/status).
# These are per-request ratios, not rates: a shared machine moves them far less than the
# requests per second, though a preempted server still pays for its involuntary switches.
# CONNS=1 is light load (the worker parks between requests).
set -euo pipefail
TREE=$(cd "$1" && pwd); APP=$2; TARGET=$3; SECS=${4:-5}; CONNS=${5:-64}
PORT=$((20000 + RANDOM % 20000))
PY=${SERVER_PY:-$TREE/.venv/bin/python}
if [ -n "${SERVER_CMD:-}" ]; then
  read -r -a CMD <<< "${SERVER_CMD//\{port\}/$PORT}"
else
  CMD=("$PY" -m cyserve "$APP" --host 127.0.0.1 --port "$PORT" --threads 1)
fi
cd "$TREE"
PYTHONHASHSEED=0 PYTHONPATH="$TREE/src:$TREE${PYTHONPATH:+:$PYTHONPATH}" \
  taskset -c "${SERVER_CPU:-0}" "${CMD[@]}" > /tmp/cpu-req.$$.log 2>&1 &
SP=$!
trap 'kill -TERM $SP 2>/dev/null; wait $SP 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  curl -sf -o /dev/null "http://127.0.0.1:$PORT$TARGET" && break
  sleep 0.1
done
counters() {  # utime stime (ticks) minflt voluntary involuntary
  local st vol=0 inv=0 v i
  st=$(sed 's/^.*) //' "/proc/$SP/stat")
  for t in /proc/"$SP"/task/*/status; do
    v=$(awk '/^voluntary_ctxt_switches/ {print $2}' "$t" 2>/dev/null || echo 0)
    i=$(awk '/^nonvoluntary_ctxt_switches/ {print $2}' "$t" 2>/dev/null || echo 0)
    vol=$((vol + ${v:-0})); inv=$((inv + ${i:-0}))
  done
  # After the "(comm) " prefix, field 1 is state: minflt is field 8, utime 12, stime 13.
  echo "$st" | awk -v vol=$vol -v inv=$inv '{print $12, $13, $8, vol, inv}'
}
taskset -c "${CLIENT_CPU:-1}" wrk -t1 -c"$CONNS" -d1 "http://127.0.0.1:$PORT$TARGET" > /dev/null
A=$(counters)
OUTW=$(taskset -c "${CLIENT_CPU:-1}" wrk -t1 -c"$CONNS" -d"$SECS" "http://127.0.0.1:$PORT$TARGET")
B=$(counters)
if [ -n "${THREADS:-}" ]; then  # each thread's user+system ticks over the whole run
  for t in /proc/"$SP"/task/*; do
    echo "  thread $(cat $t/comm): $(sed 's/^.*) //' $t/stat | awk '{print "utime", $12, "stime", $13}') $(awk '/ctxt/ {printf "%s %s ", $1, $2}' $t/status)"
  done
fi
REQS=$(echo "$OUTW" | awk '/requests in/ {print $1}')
if echo "$OUTW" | grep -q "Non-2xx"; then echo "$OUTW" >&2; exit 1; fi
HZ=$(getconf CLK_TCK)
echo "$A $B" | awk -v n="$REQS" -v hz="$HZ" -v what="$APP $TARGET c$CONNS" '{
  printf "%s: %d requests; per request: user %.2f us, sys %.2f us, total %.2f us, minflt %.3f, vol cs %.3f, invol cs %.3f\n",
    what, n, ($6-$1)*1e6/hz/n, ($7-$2)*1e6/hz/n, ($6-$1+$7-$2)*1e6/hz/n, ($8-$3)/n, ($9-$4)/n, ($10-$5)/n }'
