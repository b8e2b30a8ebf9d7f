"""Autobahn|Testsuite's fuzzingclient against cyserve's WebSocket echo (`make autobahn`).

The suite (autobahntestsuite 0.8.2) runs on Python 2.7 only. It is installed as a new user
would: `pip install --target .cache/autobahn/lib autobahntestsuite==0.8.2` with a Python 2.7
found as $AUTOBAHN_PYTHON, pyenv's 2.7.x, or python2.7 on the PATH. This script then serves
three echoes in one cyserve process, a raw ASGI application (/asgi), an App's blocking
@app.websocket handler (/app) and the GIL-free echo of examples/ws_echo_nogil.pyx (/nogil, built
by `make build`), runs the fuzzing client against each, and prints the outcome of each case
section by section (OK, NON-STRICT, INFORMATIONAL, UNIMPLEMENTED, FAILED). Each echo gets a
fuzzing client of its own, one after the other or, with --parallel, all at once; the reports
(HTML and JSON) are left in .cache/autobahn/reports/<agent>/ (--reports DIR: DIR/<agent>/).

    python tests/autobahn/run.py                    # every case but 9.* (performance), 12.* and
                                                    # 13.* (compression: long on a small machine)
    python tests/autobahn/run.py --cases all        # every case
    python tests/autobahn/run.py --cases '1.*,13.1.*' --agents nogil

Exit status 1 when any case FAILED, 2 when the suite cannot be installed or run."""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

HOME = ROOT / ".cache" / "autobahn"
LIB = HOME / "lib"
REPORTS = HOME / "reports"
PACKAGE = "autobahntestsuite==0.8.2"
DEFAULT_EXCLUDE = ["9.*", "12.*", "13.*"]
AGENTS = {"asgi": "cyserve-asgi", "app": "cyserve-app", "nogil": "cyserve-nogil"}


def python2() -> str:
    """A Python 2.7 interpreter, or exit saying where one was looked for."""
    candidates = [os.environ.get("AUTOBAHN_PYTHON", "")]
    pyenv = shutil.which("pyenv")
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")]
    if pyenv:
        out = subprocess.run([pyenv, "root"], capture_output=True, text=True)
        roots.insert(0, out.stdout.strip())
    for root in roots:
        if root:
            candidates += sorted(glob.glob(os.path.join(root, "versions", "2.7*", "bin",
                                                        "python")), reverse=True)
    candidates.append(shutil.which("python2.7") or "")
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    sys.exit("autobahn: the suite needs Python 2.7 (set AUTOBAHN_PYTHON, or `pyenv install "
             "2.7.18`)")


def install(py2: str) -> None:
    if (LIB / "autobahntestsuite").is_dir():
        return
    print(f"autobahn: installing {PACKAGE} into {LIB} with {py2}", flush=True)
    LIB.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([py2, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                           "--target", str(LIB), PACKAGE])
    if proc.returncode != 0:
        sys.exit(2)


async def asgi_echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "websocket":
        return
    await receive()
    await send({"type": "websocket.accept"})
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            return
        if msg.get("text") is not None:
            await send({"type": "websocket.send", "text": msg["text"]})
        else:
            await send({"type": "websocket.send", "bytes": msg["bytes"]})


def make_app() -> Any:
    import cyserve

    app = cyserve.App()
    app.asgi("/asgi", asgi_echo)

    @app.websocket("/app")
    def echo(ws: Any) -> None:
        for message in ws:
            ws.send(message)

    sys.path.insert(0, str(ROOT))
    try:
        from examples import ws_echo_nogil
    except ImportError as e:
        sys.exit(f"autobahn: the GIL-free echo is not built ({e}): run `make build`")
    app.nogil_websocket("/nogil", ws_echo_nogil.ECHO)
    return app


def serve_in_thread(threads: int) -> tuple[int, threading.Event, threading.Thread]:
    from cyserve.config import Config
    from cyserve.start import serve

    config = Config(host="127.0.0.1", port=0, threads=threads, graceful_timeout=1.0)
    stop = threading.Event()
    ready: list[Any] = []
    th = threading.Thread(target=serve, args=(make_app(), config),
                          kwargs={"stop_event": stop, "ready": ready.append}, daemon=True)
    th.start()
    deadline = time.monotonic() + 30
    while not ready and time.monotonic() < deadline:
        time.sleep(0.05)
    if not ready:
        sys.exit("autobahn: the server did not start")
    return ready[0].port, stop, th


def summarize(index: dict[str, Any]) -> tuple[str, int]:
    """A Markdown table of outcomes by agent and section, and the number of FAILED cases."""
    kinds = ["OK", "NON-STRICT", "INFORMATIONAL", "UNIMPLEMENTED", "FAILED"]
    lines = ["| agent | section | " + " | ".join(kinds) + " |",
             "| --- | --- | " + " | ".join("---:" for _ in kinds) + " |"]
    failed = 0
    for agent in sorted(index):
        sections: dict[int, collections.Counter[str]] = collections.defaultdict(
            collections.Counter)
        for case, result in index[agent].items():
            behavior = result["behavior"]
            if behavior == "OK" and result.get("behaviorClose") not in (None, "OK",
                                                                         "INFORMATIONAL"):
                behavior = result["behaviorClose"]
            sections[int(case.split(".")[0])][behavior] += 1
            if behavior == "FAILED":
                failed += 1
        total: collections.Counter[str] = collections.Counter()
        for sec in sorted(sections):
            total += sections[sec]
            lines.append(f"| {agent} | {sec} | " +
                         " | ".join(str(sections[sec][k]) for k in kinds) + " |")
        lines.append(f"| {agent} | all | " + " | ".join(str(total[k]) for k in kinds) + " |")
    return "\n".join(lines), failed


def wstest(py2: str, agent: str, url: str, cases: list[str], exclude: list[str],
           reports: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Start a fuzzing client for one echo; its spec and reports go to reports/<agent>/."""
    outdir = reports / agent
    if outdir.exists():
        shutil.rmtree(outdir)  # a stale index.json must not pass for this run's
    spec: dict[str, Any] = {
        "outdir": str(outdir),
        "servers": [{"agent": AGENTS[agent], "url": url}],
        "cases": cases,
        "exclude-cases": exclude,
        "exclude-agent-cases": {},
    }
    outdir.mkdir(parents=True)
    spec_path = outdir / "fuzzingclient.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    runner = ("import site, sys; site.addsitedir(sys.argv[1]); "
              "from autobahntestsuite import wstest; "
              "sys.argv = ['wstest', '-m', 'fuzzingclient', '-s', sys.argv[2]]; wstest.run()")
    proc = subprocess.Popen([py2, "-c", runner, str(LIB), str(spec_path)], cwd=str(HOME))
    return proc, outdir / "index.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="",
                    help="comma-separated case patterns, or 'all' (default: all but "
                         + ", ".join(DEFAULT_EXCLUDE) + ")")
    ap.add_argument("--agents", default=",".join(AGENTS),
                    help="comma-separated echoes to test, of " + ", ".join(AGENTS)
                         + " (default: all)")
    ap.add_argument("--parallel", action="store_true",
                    help="run the echoes' fuzzing clients at once rather than one by one")
    ap.add_argument("--reports", type=Path, default=REPORTS,
                    help="where each echo's reports go, a folder each (default "
                         f"{REPORTS}; give each of several runs at once its own)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    agents = [a.strip() for a in args.agents.split(",") if a.strip()]
    unknown = [a for a in agents if a not in AGENTS]
    if unknown or not agents:
        ap.error(f"--agents: unknown {unknown}; choose among {', '.join(AGENTS)}")
    py2 = python2()
    install(py2)
    port, stop, th = serve_in_thread(args.threads)
    cases = ["*"] if args.cases in ("", "all") else args.cases.split(",")
    exclude = DEFAULT_EXCLUDE if args.cases == "" else []
    t0 = time.monotonic()
    index: dict[str, Any] = {}
    broken = []
    try:
        running = []
        for agent in agents:
            running.append((agent, *wstest(py2, agent, f"ws://127.0.0.1:{port}/{agent}",
                                           cases, exclude, args.reports.resolve())))
            if not args.parallel:
                running[-1][1].wait()
        for agent, proc, index_path in running:
            rc = proc.wait()
            if rc != 0 or not index_path.exists():
                broken.append(f"{agent} (wstest exited with {rc})")
                continue
            index.update(json.loads(index_path.read_text()))
    finally:
        stop.set()
        th.join(30)
    if broken:
        print(f"autobahn: no report for {', '.join(broken)}", file=sys.stderr)
        return 2
    table, failed = summarize(index)
    print(f"\nAutobahn|Testsuite 0.8.2 fuzzingclient, cases {cases}, excluded {exclude}, "
          f"{time.monotonic() - t0:.0f} s\n")
    print(table)
    print(f"\nreports: {args.reports}/<agent>/index.html")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
