# Sourced by cg_tls_handshake.sh and cg_tls_request.sh, not run on its own. With TREE, WORK,
# PORT and OUT set: makes the ECDSA P-256 certificate both servers use, then starts the server
# in the background, its pid in VP, its output in $OUT.log. The server is cyserve's static
# /plaintext app (bench.http.apps) with one worker thread, plus CYSERVE_ARGS if set, or, with
# SERVER=nginx, nginx 1.22 with the suite's protocol configuration
# (bench/peers/nginx/nginx-proto.conf.template) in one process (no master). It runs under
# callgrind, or bare with STRACE=1 (strace attaches later), PERF=1 (perf attaches later) or
# CPU=1; under callgrind, CALLGRIND_OPTS are added to its options (--cache-sim=yes
# --branch-sim=yes: cache and branch misses beside the instructions). With PLAIN=1 both serve plain HTTP on the same port instead (no certificate options,
# nginx's listen without ssl). The shell is left in TREE.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$WORK/k.pem" \
  -out "$WORK/c.pem" -days 1 -subj /CN=localhost 2>/dev/null
if [ "${SERVER:-cyserve}" = nginx ]; then
  mkdir -p "$WORK/ngx"
  if [ "${PLAIN:-0}" = 1 ]; then NGX_LISTEN=""; NGX_TLS=""; else
    # The same TLS 1.3 suite as cyserve's (its order puts AES-128-GCM first, csrc/tls.c), as
    # bench/http/protocols.py gives nginx: nginx would follow the client's order.
    NGX_LISTEN=ssl; NGX_TLS="ssl_certificate $WORK/c.pem; ssl_certificate_key $WORK/k.pem;"
    NGX_TLS+=" ssl_prefer_server_ciphers on; ssl_conf_command Ciphersuites"
    NGX_TLS+=" TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256;"; fi
  sed -e "s#@WORKERS@#1#; s#@PREFIX@#$WORK/ngx#g; s#@PORT@#$PORT#; s#@LISTEN@#$NGX_LISTEN#" \
      -e "s#@TLS@#$NGX_TLS#" \
      -e "s#master_process on#master_process off#" \
      "$TREE/bench/peers/nginx/nginx-proto.conf.template" > "$WORK/ngx/nginx.conf"
  CMD=(/usr/sbin/nginx -p "$WORK/ngx" -c "$WORK/ngx/nginx.conf")
else
  # shellcheck disable=SC2206 # CYSERVE_ARGS is split into words on purpose
  TLS_ARGS=(--ssl-certfile "$WORK/c.pem" --ssl-keyfile "$WORK/k.pem")
  [ "${PLAIN:-0}" = 1 ] && TLS_ARGS=()
  CMD=("$TREE/.venv/bin/python" -m cyserve bench.http.apps.cyserve_static_app:app --host 127.0.0.1
       --port "$PORT" --threads 1 "${TLS_ARGS[@]}" ${CYSERVE_ARGS:-})
fi
rm -f "$OUT" "$OUT".*
cd "$TREE"
if [ "${STRACE:-0}" = 1 ] || [ "${CPU:-0}" = 1 ] || [ "${PERF:-0}" = 1 ]; then
  PYTHONHASHSEED=0 PYTHONPATH="$TREE/src:$TREE" "${CMD[@]}" > "$OUT.log" 2>&1 &
  VP=$!
else
  # shellcheck disable=SC2086 # CALLGRIND_OPTS is split into words on purpose
  PYTHONHASHSEED=0 PYTHONPATH="$TREE/src:$TREE" valgrind --tool=callgrind ${CALLGRIND_OPTS:-} \
    --callgrind-out-file="$OUT" "${CMD[@]}" > "$OUT.log" 2>&1 &
  VP=$!
fi
