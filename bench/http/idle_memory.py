"""Resident memory of a server holding many idle keep-alive connections (docs/benchmarks.md).

For each server: start it (pinned like the suite's primary mode when --cpus is given), read the
RSS of its whole process tree, open N connections that each send one keep-alive GET and read the
answer, so every connection has been served and is now idle, wait, read the RSS again, close.
The figure is the growth per idle connection. Servers run one after the other, in rounds, and
the median over rounds is reported.

    .venv/bin/python bench/http/idle_memory.py --servers cyserve-static,go-nethttp --conns 1000

--h2-tls: the same with HTTP/2 over TLS. Every server gets one self-signed certificate made for
the run and is started as bench/http/protocols.py starts it for its "tls" transport (its server
names); each connection does the TLS handshake with ALPN h2, the connection preface and one GET
/plaintext stream (frames made here, stdlib only), acknowledges the server's SETTINGS and is then
left idle.

    .venv/bin/python bench/http/idle_memory.py --h2-tls --servers cyserve-static,nginx
"""

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import processes  # noqa: E402
from bench.common.procfs import tree_pss_kib, tree_rss_kib  # noqa: E402
from bench.http import harness  # noqa: E402
from bench.http import servers as S  # noqa: E402


def open_idle(port, n, path="/plaintext"):
    conns = []
    req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(req)
        conns.append(s)
    for s in conns:  # every connection answered, so each one is idle on the server now
        s.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                raise RuntimeError("server closed a connection")
            data += chunk
    return conns


# HTTP/2 frames (RFC 9113 4.1): a 9-byte head, then the payload.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_DATA, H2_HEADERS, H2_RST_STREAM, H2_SETTINGS, H2_GOAWAY = 0, 1, 3, 4, 7
H2_END_STREAM, H2_ACK, H2_END_HEADERS = 0x1, 0x1, 0x4


def h2_frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def h2_get(path, authority="127.0.0.1"):
    """One HEADERS frame on stream 1 for GET https://authority/path: HPACK's static table for
    :method GET (2) and :scheme https (7), literals without indexing for :path (4) and
    :authority (1), no Huffman coding."""
    block = bytes([0x82, 0x87, 0x04, len(path)]) + path.encode() + bytes([0x01, len(authority)]) \
        + authority.encode()
    return h2_frame(H2_HEADERS, H2_END_STREAM | H2_END_HEADERS, 1, block)


def h2_open_idle(port, n, ctx, path="/plaintext"):
    """n TLS connections speaking HTTP/2, each with one stream answered and its SETTINGS
    acknowledged both ways: idle on the server as a browser's connection between requests."""
    conns = []
    for _ in range(n):
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        s = ctx.wrap_socket(raw)
        if s.selected_alpn_protocol() != "h2":
            raise RuntimeError(f"ALPN chose {s.selected_alpn_protocol()!r}, not h2")
        s.sendall(H2_PREFACE + h2_frame(H2_SETTINGS, 0, 0) + h2_get(path))
        buf, done, acked = b"", False, False
        while not (done and acked):
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError("server closed an HTTP/2 connection")
            buf += chunk
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                size = int.from_bytes(buf[:3], "big")
                kind, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                buf = buf[9 + size:]
                if kind == H2_SETTINGS and not flags & H2_ACK:
                    s.sendall(h2_frame(H2_SETTINGS, H2_ACK, 0))
                elif kind == H2_SETTINGS:
                    acked = True  # the server took our SETTINGS
                elif kind in (H2_GOAWAY, H2_RST_STREAM):
                    raise RuntimeError(f"server sent frame type {kind} on stream {stream}")
                elif stream == 1 and kind in (H2_DATA, H2_HEADERS) and flags & H2_END_STREAM:
                    done = True
        conns.append(s)
    return conns


def h2_closed_count(conns):
    """How many of the idle connections the server has closed or sent something on (a GOAWAY):
    each is read without waiting; an open, idle one has nothing to read."""
    import ssl
    closed = 0
    for s in conns:
        s.setblocking(False)
        try:
            s.recv(1)
            closed += 1  # b"" (closed) or a frame: not idle any more
        except (ssl.SSLWantReadError, BlockingIOError):
            pass
        except OSError:
            closed += 1
    return closed


def measure_h2_tls(name, conns, cpus, settle):
    """(RSS before, RSS with `conns` idle HTTP/2 connections over TLS, PSS before, PSS with
    them), in KiB."""
    import ssl

    from bench.http import protocols as P
    server = P.BY_NAME[name]
    port = processes.free_port()
    with tempfile.TemporaryDirectory(prefix="cyserve-idle-") as tmp:
        os.chmod(tmp, 0o755)  # nginx's workers (user nobody when run as root) read below it
        cert = P.make_certificate(tmp)
        argv, env, cleanup = server.command("tls", port, cert, tmp)
        if name.startswith("cyserve"):
            # Its default keep-alive timeout (5 s) is shorter than the time 1,000 handshakes
            # take on a loaded machine: connections would be closed before the RSS is read.
            argv = argv + ["--keepalive-timeout", "300"]
        run = processes.start_server(argv, port, os.path.join(tmp, "log"), env=env, cpus=cpus,
                                     cleanup=cleanup)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        try:
            for s in h2_open_idle(port, 1, ctx):  # warm: the first stream served, caches made
                s.close()
            time.sleep(settle)
            before, pss_before = tree_rss_kib(run.pid), tree_pss_kib(run.pid)
            socks = h2_open_idle(port, conns, ctx)
            time.sleep(settle)
            after, pss_after = tree_rss_kib(run.pid), tree_pss_kib(run.pid)
            closed = h2_closed_count(socks)
            for s in socks:
                s.close()
            if closed:
                raise RuntimeError(f"{name} closed {closed} of the {conns} idle connections "
                                   "before their memory was read")
        finally:
            run.stop()
    return before, after, pss_before, pss_after


def measure(server, conns, threads, cpus, settle):
    port = processes.free_port()
    with tempfile.TemporaryDirectory(prefix="cyserve-idle-") as tmp:
        argv, env, cleanup = server.command(port, threads, tmp)
        run = processes.start_server(argv, port, os.path.join(tmp, "log"), env=env, cpus=cpus,
                                     cleanup=cleanup)
        try:
            harness.http_get(port, "/plaintext")  # warm: first request served, caches made
            time.sleep(settle)
            before = tree_rss_kib(run.pid)
            socks = open_idle(port, conns)
            time.sleep(settle)
            after = tree_rss_kib(run.pid)
            for s in socks:
                s.close()
        finally:
            run.stop()
    return before, after


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="cyserve-static,cyserve-nogil,go-nethttp,go-fasthttp,nginx")
    ap.add_argument("--conns", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpus", default="0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--h2-tls", action="store_true",
                    help="HTTP/2 over TLS (servers named as in bench/http/protocols.py)")
    args = ap.parse_args(argv)
    if args.h2_tls and args.servers == ap.get_default("servers"):
        args.servers = "cyserve-static,nginx,go-nethttp"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.conns + 256)), hard))
    by_name = {s.name: s for s in S.SERVERS}
    names = args.servers.split(",")
    results = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order
            pss = ""
            if args.h2_tls:
                before, after, pss_b, pss_a = measure_h2_tls(name, args.conns, args.cpus,
                                                             args.settle)
                pss = f"; pss {pss_b} KiB -> {pss_a} KiB ({(pss_a - pss_b) * 1024 / args.conns:.0f} B)"
            else:
                before, after = measure(by_name[name], args.conns, args.threads, args.cpus,
                                        args.settle)
            results[name].append((before, after))
            print(f"round {r} {name:16s} rss {before} KiB -> {after} KiB "
                  f"({(after - before) * 1024 / args.conns:.0f} B per idle connection){pss}",
                  flush=True)
    summary = {}
    kind = "idle HTTP/2 over TLS" if args.h2_tls else "idle"
    print(f"\n| server | RSS before (KiB) | RSS with {args.conns} {kind} (KiB) | per idle conn (B) |")
    print("|---|---:|---:|---:|")
    for name, rows in results.items():
        b = statistics.median(x for x, _ in rows)
        a = statistics.median(y for _, y in rows)
        per = statistics.median((y - x) * 1024 / args.conns for x, y in rows)
        summary[name] = {"rss_before_kib": b, "rss_idle_kib": a, "bytes_per_conn": per}
        print(f"| {name} | {b:.0f} | {a:.0f} | {per:.0f} |")
    print(json.dumps({"conns": args.conns, "threads": args.threads, "rounds": args.rounds,
                      "protocol": "h2-tls" if args.h2_tls else "http/1.1", "servers": summary}))


if __name__ == "__main__":
    main()
