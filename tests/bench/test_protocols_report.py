"""bench/http/protocols.py's parsing, summary and report, and the HTTP/2 frames of
bench/http/idle_memory.py --h2-tls: what docs/benchmarks.md quotes from them is checked here on
made-up runs, with no network, no peer and no load client installed."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench.http import idle_memory  # noqa: E402
from bench.http import protocols as P  # noqa: E402

H2LOAD_OUT = (
    "starting benchmark...\n"
    "spawning thread #0: 64 total client(s). Timing-based test with 0s of warm-up time and 2s of "
    "main duration for measurements.\n"
    "Application protocol: h2c\n"
    "Main benchmark duration is over for thread #0. Stopping all clients.\n"
    "\n"
    "finished in 2.01s, 100000.00 req/s, 7.33MB/s\n"
    "requests: 200000 total, 200640 started, 200000 done, 199990 succeeded, 10 failed, 0 errored, "
    "0 timeout\n"
    "status codes: 199990 2xx, 0 3xx, 0 4xx, 0 5xx\n"
    "traffic: 14.66MB (15372221) total, 8.71MB (9131888) headers (space savings 52.17%), "
    "2.57MB (2635100) data\n"
    "                     min         max         mean         sd        +/- sd\n"
    "time for request:       74us     42.08ms      3.87ms      7.06ms    83.23%\n"
    "time for connect:       70us       183us       149us        53us    75.00%\n"
)


def test_parse_h2load_counts_successes_errors_and_protocol():
    res = P.parse_h2load(H2LOAD_OUT)
    assert res["count"] == 199990
    assert res["errors"] == 10
    assert res["mean_ms"] == 3.87
    assert res["protocol"] == "h2c"
    empty = P.parse_h2load("connect: Connection refused\n")
    assert empty["count"] == 0 and empty["protocol"] is None


def test_nginx_configuration_per_transport(tmp_path):
    tls = P.nginx_conf("tls", 8443, str(tmp_path), ("/c/cert.pem", "/c/key.pem"))
    assert "listen 127.0.0.1:8443 ssl http2 backlog=4096;" in tls
    assert "ssl_certificate /c/cert.pem;" in tls and "ssl_certificate_key /c/key.pem;" in tls
    assert "TLSv1.3" in tls
    h2c = P.nginx_conf("h2c", 8080, str(tmp_path), None)
    assert "listen 127.0.0.1:8080 http2 backlog=4096;" in h2c
    assert "ssl_certificate " not in h2c
    assert "@" not in h2c.replace("@PREFIX", "")  # every placeholder filled


def test_every_target_names_known_servers_and_workloads():
    for w, name, ref, _ in P.TARGETS:
        assert w in P.WORKLOADS
        assert w in P.BY_NAME[name].workloads and w in P.BY_NAME[ref].workloads
        assert ref in P.REFS[w]


def run(rnd, server, workload, count, cpu, **kw):
    r = {"round": rnd, "server": server, "workload": workload, "status": "ok", "count": count,
         "per_s": count / 2, "server_cpu_s": cpu, "per_cpu_s": count / cpu, "p99_ms": 1.0}
    r.update(kw)
    return r


def result(runs, servers):
    res = {"started": "2026-11-26T04:00:00+00:00", "git": "abc1234",
           "config": {"rounds": 3, "duration_s": 2, "server_cpu": "0", "client_cpu": "1",
                      "ws_connections": 64, "wrk_connections": 64},
           "machine": {"loadavg_start": [1.0, 1.0, 1.0], "loadavg_end": [1.0, 1.0, 1.0]},
           "descriptions": {}, "tls": {}, "setup_notes": [], "runs": runs,
           "servers": {n: {"label": n, "group": "x", "note": "", "version": "",
                           "workloads": list(P.BY_NAME[n].workloads), "available": why is None,
                           "reason": why} for n, why in servers.items()}}
    res["summary"] = P.summarize(res)
    return res


NOGIL_WHY = "bench.http.apps.cyserve_ws_nogil_app: ModuleNotFoundError"


def test_a_missing_app_module_gives_the_servers_own_reason(monkeypatch):
    # No server of the driver waits for its app any more (the GIL-free echo's exists now), so
    # the mechanism is checked on one made up for the test.
    from bench.http import run as R
    monkeypatch.setattr(P.S, "VENV_PY", sys.executable)  # an interpreter that exists
    future = P.ProtoServer("cyserve-future-ws", "cyserve (future)", "cyserve", None, ("ws-echo",),
                           app="bench.http.apps.cyserve_future_app",
                           missing="the engine has no future API yet")
    nogil = P.BY_NAME["cyserve-nogil-ws"]
    gone = (future.app, nogil.app)

    def probe(python, mods, env=None):
        return {m: f"ERROR ModuleNotFoundError: No module named '{m}'" if m in gone else "1.0"
                for m in mods}
    monkeypatch.setattr(R, "probe_modules", probe)
    why = P.availability([future, nogil, P.BY_NAME["cyserve-asgi-ws"]])
    assert why["cyserve-future-ws"] == "the engine has no future API yet"
    # A server whose app exists reports the import error itself: it is a real failure.
    assert why["cyserve-nogil-ws"].startswith(f"{nogil.app}: ModuleNotFoundError")
    assert why["cyserve-asgi-ws"] is None


def test_ws_ratios_are_per_round_medians_and_targets_say_met_or_missed():
    runs = []
    # cyserve's ASGI echo: 3x, 2x, 10x uvicorn per CPU-second (the outlier round loses the
    # median); 1.2x granian in every round; the GIL-free echo is not there.
    for rnd, x in enumerate((3.0, 2.0, 10.0)):
        runs.append(run(rnd, "uvicorn-ws", "ws-echo", 10_000, 1.0))
        runs.append(run(rnd, "granian-asgi-ws", "ws-echo", 25_000, 1.0))
        runs.append(run(rnd, "cyserve-asgi-ws", "ws-echo", int(10_000 * x), 1.0))
    runs.append(run(0, "cyserve-app-ws", "ws-echo", 500, 1.0, stalled_connections=58))
    res = result(runs, {"cyserve-asgi-ws": None, "uvicorn-ws": None, "granian-asgi-ws": None,
                        "cyserve-app-ws": None,
                        "cyserve-nogil-ws": NOGIL_WHY,
                        "go-ws": None})
    fig = res["summary"]["ws-echo"]["cyserve-asgi-ws"]
    assert fig["x_uvicorn-ws"]["median"] == 3.0
    assert fig["x_granian-asgi-ws"]["median"] == 1.2
    md = P.markdown(res)
    assert "| ws-echo | cyserve-asgi-ws | uvicorn-ws | ≥ 2× | 3.00× | met |" in md
    assert "| ws-echo | cyserve-asgi-ws | granian-asgi-ws | ≥ 1.5× | 1.20× | missed |" in md
    assert "| ws-echo | cyserve-nogil-ws | go-ws | ≥ 1× | – | not measured: unavailable: " \
           "bench.http.apps.cyserve_ws_nogil_app: ModuleNotFoundError |" in md
    assert "cyserve-app-ws (58 of 64 connections unanswered during the cell)" in md
    # The table is sorted by round trips per CPU-second, the best first.
    table = md.split("## ws-echo")[1].split("##")[0]
    order = [table.index(f"| {n}") for n in ("cyserve-asgi-ws", "granian-asgi-ws", "uvicorn-ws")]
    assert order == sorted(order)


def test_https_leaves_the_cells_handshakes_out():
    # nginx: 1,000 handshakes per CPU-second, so its 64 connections cost 0.064 s of the cell's
    # 1.064 s; cyserve without a tls-new cell keeps its figure and says so.
    runs = [run(0, "nginx", "tls-new", 1000, 1.0),
            run(0, "nginx", "tls-resume", 1000, 0.5, resumed=990),
            run(0, "nginx", "https", 100_000, 1.064),
            run(0, "cyserve-static", "https", 110_000, 1.0)]
    res = result(runs, {"nginx": None, "cyserve-static": None})
    s = res["summary"]["https"]
    assert round(s["nginx"]["per_cpu_s"]["median"]) == 100_000
    assert round(s["cyserve-static"]["x_nginx"]["median"], 2) == 1.10
    md = P.markdown(res)
    assert "cyserve-static (handshakes included in 1 round(s): no tls-new figure)" in md
    assert "| nginx (99% resumed) | 500 | 2,000 |" in md
    assert "| https | cyserve-static | nginx | ≥ 1.1× | 1.10× | met |" in md


def test_failed_cells_are_said_not_dropped():
    runs = [run(0, "nginx", "h2c", 100_000, 1.0),
            dict(run(0, "cyserve-static", "h2c", 0, 1.0), status="none completed", per_cpu_s=None,
                 first_error="connection reset"),
            run(0, "nginx", "h2-tls", 100_000, 1.0),
            dict(run(0, "cyserve-static", "h2-tls", 1000, 0.2), per_cpu_s=None)]  # too little CPU
    md = P.markdown(result(runs, {"nginx": None, "cyserve-static": None}))
    assert "| h2-tls | cyserve-static | nginx | ≥ 1× | – | not measured: no round with a figure " \
           "per CPU-second for both (a cell under 0.5 s of server CPU) |" in md
    assert "| cyserve-static | none completed: connection reset |" in md
    assert "| h2c | cyserve-static | nginx | ≥ 1× | – | not measured: none completed: connection " \
           "reset |" in md


def test_h2_frames_of_the_idle_memory_client():
    assert idle_memory.h2_frame(4, 1, 0) == b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"  # SETTINGS ACK
    get = idle_memory.h2_get("/plaintext")
    size = int.from_bytes(get[:3], "big")
    assert len(get) == 9 + size
    assert get[3:9] == b"\x01\x05\x00\x00\x00\x01"  # HEADERS, END_STREAM|END_HEADERS, stream 1
    block = get[9:]
    assert block == b"\x82\x87\x04\x0a/plaintext\x01\x09127.0.0.1"
    try:  # the block as an HPACK decoder reads it, where one is installed (the dev requirements)
        import hpack
    except ImportError:
        return
    assert hpack.Decoder().decode(block) == [(":method", "GET"), (":scheme", "https"),
                                             (":path", "/plaintext"), (":authority", "127.0.0.1")]
