#!/bin/sh
# Build the repository's Dockerfile and prove the image serves the demo, with no Docker daemon
# and no Docker Hub: buildah builds (chroot isolation, vfs storage: no daemon, no overlay mount,
# no user namespaces needed), podman runs, and the base image is made here with debootstrap from
# the Debian mirror apt already uses (Debian's own python3 and python3-venv, standing in for
# python:3.12-slim-bookworm, the Dockerfile's default BASE_IMAGE).
#
# What it checks: the image builds from a clean tree; the server in it answers requests sent
# from outside the container through a published port (/ from the GIL-free Cython module,
# /plaintext from C, /py from Python, /healthz); the image's HEALTHCHECK passes; the server runs
# as an unprivileged user; SIGTERM (what `docker stop` and `podman stop` send) stops it
# gracefully: a request in flight when the signal comes is answered, then the process exits 0
# well before the stop timeout. It prints the image's size.
#
# Run as root on Debian or Ubuntu (it installs buildah, podman, runc, debootstrap and curl with apt
# when they are missing): `make test-docker`, or this script from the repository's root.
# Everything it makes lives under $WORK (default /var/tmp/cyserve-docker): the base image is
# made once and reused (REBUILD_BASE=1 makes it again); `rm -rf $WORK` removes it all.
#
# Environment: WORK, SUITE (Debian release of the base, default bookworm), MIRROR (default: the
# first Debian mirror in /etc/apt/sources.list*), PORT (the host port, default 18080), KEEP=1
# (leave the container behind), SKIP_BUILD=1 (run the image the last run built, if any).
set -eu

WORK=${WORK:-/var/tmp/cyserve-docker}
SUITE=${SUITE:-bookworm}
PORT=${PORT:-18080}
BASE=localhost/cyserve-base:$SUITE
IMAGE=localhost/cyserve-demo:test
CTR=cyserve-demo-test
STORE="--root $WORK/storage --runroot $WORK/run --storage-driver vfs"
# runc, not podman's default crun: crun refuses a host whose cgroups are mixed v1 and v2 (as
# this script's first host's were), runc runs on either.
PODMAN="podman $STORE --runtime runc"
ROOT_DIR=$(cd "$(dirname "$0")/../.." && pwd)

say() { printf '== %s\n' "$*"; }
fail() { printf 'test-local-build: FAILED: %s\n' "$*" >&2; exit 1; }

[ -f "$ROOT_DIR/Dockerfile" ] || fail "no Dockerfile in $ROOT_DIR"
[ "$(id -u)" = 0 ] || fail "run as root (debootstrap and rootful buildah/podman need it)"

missing=""
for tool in buildah podman runc debootstrap curl; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
if [ -n "$missing" ]; then
    command -v apt-get >/dev/null 2>&1 || fail "missing:$missing (and no apt-get to install them)"
    say "installing$missing"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
fi

if [ -z "${MIRROR:-}" ]; then
    # The mirror apt uses (one-line or deb822 sources), so that a machine that reaches only its
    # own mirror works too.
    MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | sed -n -e 's/^deb \(\[[^]]*\] \)\{0,1\}\(https\{0,1\}:[^ ]*debian\/\{0,1\}\) .*/\2/p' \
                 -e 's/^URIs: *\(https\{0,1\}:[^ ]*debian\/\{0,1\}\)$/\1/p' | head -1)
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi

mkdir -p "$WORK"
started=$(date +%s)

cleanup() {
    if [ "${KEEP:-0}" != 1 ]; then
        $PODMAN rm -f -t 0 "$CTR" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# The base image: a minimal Debian with python3 and its venv module, from the mirror.
if [ "${REBUILD_BASE:-0}" = 1 ] || ! buildah $STORE inspect --type image "$BASE" >/dev/null 2>&1; then
    say "base image $BASE: debootstrap $SUITE from $MIRROR"
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$WORK/rootfs" "$MIRROR" \
        > "$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log"; fail "debootstrap"; }
    # As in Debian's own images: no package cache or lists (apt-get update fetches them).
    rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb "$WORK/rootfs/var/lib/apt/lists/"*
    ctr=$(buildah $STORE from scratch)
    mnt=$(buildah $STORE mount "$ctr")
    cp -a "$WORK/rootfs/." "$mnt/"
    # The base trusts the certificate authorities this machine trusts, and pip is told to use
    # them: behind a TLS-intercepting proxy pip (which otherwise trusts only its own certifi
    # bundle) would refuse PyPI. On an open network this changes nothing.
    mkdir -p "$mnt/etc/ssl/certs" "$mnt/usr/local/share/ca-certificates"
    cp /etc/ssl/certs/ca-certificates.crt "$mnt/etc/ssl/certs/"
    cp -r /usr/local/share/ca-certificates/. "$mnt/usr/local/share/ca-certificates/" 2>/dev/null || true
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$mnt/etc/pip.conf"
    buildah $STORE umount "$ctr" >/dev/null
    buildah $STORE config --cmd python3 \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 "$ctr"
    buildah $STORE commit --rm -q "$ctr" "$BASE" >/dev/null
    rm -rf "$WORK/rootfs"
fi

if [ "${SKIP_BUILD:-0}" = 1 ] && $PODMAN image exists "$IMAGE"; then
    say "SKIP_BUILD=1: running $IMAGE as built before, not the Dockerfile as it is now"
else
    say "building $IMAGE from $ROOT_DIR/Dockerfile (BASE_IMAGE=$BASE)"
    build_started=$(date +%s)
    # --format docker keeps HEALTHCHECK (the OCI format has no such field); --pull=false: the base
    # is local, and Docker Hub is not asked for anything. No layer cache: with vfs storage every
    # cached step is a whole copy of the image's files (gigabytes, and minutes of copying), and the
    # `COPY . .` of a changed tree would invalidate the steps that take time anyway.
    buildah $STORE bud --isolation chroot --format docker --pull=false --layers=false \
        --build-arg BASE_IMAGE="$BASE" -t "$IMAGE" -f "$ROOT_DIR/Dockerfile" "$ROOT_DIR" \
        > "$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; fail "the image does not build (log: $WORK/build.log)"; }
    build_s=$(( $(date +%s) - build_started ))
    say "built in ${build_s}s"
fi
size=$($PODMAN image inspect --format '{{.Size}}' "$IMAGE")
base_size=$($PODMAN image inspect --format '{{.Size}}' "$BASE")
say "image $(( size / 1000000 )) MB, of which the base $(( base_size / 1000000 )) MB"

say "running it, port $PORT on the host -> 8000 in the container"
$PODMAN rm -f -t 0 "$CTR" >/dev/null 2>&1 || true
# The limits: podman's defaults (1048576 files) mean raising the hard limits,
# which a host that is itself a container may refuse; the host's own limit on files is kept.
# The healthcheck's timer needs systemd, which a container host may lack (podman says so, and
# goes on): the check is run by hand below, as docker's daemon runs it.
$PODMAN run -d --name "$CTR" -p "127.0.0.1:$PORT:8000" \
    --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096 \
    "$IMAGE" >/dev/null || fail "podman run"

url=http://127.0.0.1:$PORT
i=0
until curl -fsS -o /dev/null "$url/healthz" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -ge 100 ] || [ "$($PODMAN inspect --format '{{.State.Running}}' "$CTR")" != true ]; then
        $PODMAN logs "$CTR" >&2 || true
        fail "the server did not answer $url/healthz within 20 s"
    fi
    sleep 0.2
done

check() {  # check PATH EXPECTED_BODY
    body=$(curl -fsS --max-time 5 "$url$1") || fail "GET $1: no 2xx answer"
    [ "$body" = "$2" ] || fail "GET $1 answered '$body', not '$2'"
    printf '   GET %-10s -> %s\n' "$1" "$body"
}
check / "Hello, World!"
check /plaintext "Hello, World!"
check /py "Hello, World!"
check /users/42 '{"id":42}'
check /healthz ok

$PODMAN healthcheck run "$CTR" || fail "the image's HEALTHCHECK does not pass"
say "HEALTHCHECK passes"

uid=$($PODMAN top "$CTR" user | sed -n 2p | tr -d ' ')
[ -n "$uid" ] && [ "$uid" != root ] && [ "$uid" != 0 ] || fail "the server runs as '$uid', not an unprivileged user"
say "the server runs as user $uid"

# SIGTERM with a request in flight: the request's headers and the first half of its body are
# sent, the container is told to stop, then the rest of the body: the answer must still come,
# and the process must exit 0 by itself, within the stop timeout.
say "SIGTERM with a request in flight (podman stop -t 10)"
python3 - "$PORT" "$CTR" "$PODMAN" <<'EOF' || fail "graceful stop"
import socket, subprocess, sys, time

port, ctr, podman = int(sys.argv[1]), sys.argv[2], sys.argv[3].split()
sock = socket.create_connection(("127.0.0.1", port), timeout=10)
sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
             b"Connection: close\r\n\r\nhello")
time.sleep(0.3)
t0 = time.monotonic()
stop = subprocess.Popen([*podman, "stop", "-t", "10", ctr], stdout=subprocess.DEVNULL)
# The stop has begun once the listener is closed: new connections are refused (or reset), while
# the one in flight stays open.
while True:
    try:
        probe = socket.create_connection(("127.0.0.1", port), timeout=2)
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answered = probe.recv(100)
        probe.close()
        if not answered:
            break
    except OSError:
        break
    if time.monotonic() - t0 > 8:
        sys.exit("the listener was still open 8 s after podman stop")
    time.sleep(0.05)
print(f"   listener closed {time.monotonic() - t0:.1f} s after podman stop; sending the rest")
sock.sendall(b"world")
reply = b""
while True:
    chunk = sock.recv(65536)
    if not chunk:
        break
    reply += chunk
stop.wait(timeout=30)
took = time.monotonic() - t0
head, _, body = reply.partition(b"\r\n\r\n")
status = head.split(b"\r\n", 1)[0].decode()
print(f"   in-flight POST /echo -> {status!r}, body {body!r}; stopped after {took:.1f} s")
if not status.startswith("HTTP/1.1 200") or body != b"helloworld":
    sys.exit("the request in flight was not answered in full")
if took >= 9.5:
    sys.exit("the server did not stop before the stop timeout (it was killed)")
EOF
code=$($PODMAN inspect --format '{{.State.ExitCode}}' "$CTR")
[ "$code" = 0 ] || { $PODMAN logs "$CTR" >&2; fail "the server exited $code after SIGTERM, not 0"; }
say "stopped gracefully: exit status 0"
if curl -fsS --max-time 2 -o /dev/null "$url/healthz" 2>/dev/null; then
    fail "something still answers on port $PORT after the stop"
fi

say "OK: the Dockerfile builds on a local $SUITE base and the image serves the demo ($(( $(date +%s) - started ))s in all)"
