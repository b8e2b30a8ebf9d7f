"""The coroutine benchmark of bench/coro/README.md, reproduced on this machine in one run
(`make bench-coro`).

Two workloads, each measured in a fresh process per run, medians of --runs runs (min and max
kept), with every figure also given as a ratio to the other systems of the same run:

1. Empty coroutines (the write-up's table): spawn time, run time and total time for n (500,000)
   empty coroutines in cyserve (1 worker: cyserve-1, all workers: cyserve-all), asyncio,
   asyncio + uvloop, gevent, and Go goroutines (GOMAXPROCS=1: go-1, all CPUs: go-all).
2. Scaling (the write-up's second test): many coroutines each computing Fibonacci(100,000) with
   uint32 wrap-around, on 1..N workers (N = the CPUs this process may use), cyserve against Go
   with GOMAXPROCS=k; throughput and speed-up against 1 worker. The sums of the results
   (checksums) of cyserve and Go are compared with the value computed here in Python, which
   shows that neither compiler folded the loop away.

It also measures what a parked cyserve scheduler costs: CPU time over 5 s with no work.

Output: a Markdown table on stdout, and bench/results/coro-latest.json (or --out) shaped as
{"systems": {"<name>": {"spawn_s", "run_s", "total_s", ...}}, "scaling": {...}, "parked": {...},
"ratios": {...}, "machine": {...}, "date": "..."}.

The peers that need something installed get it here: uvloop and gevent from the pinned
bench/coro/requirements.txt into bench/coro/.venv, and the Go program in bench/coro/go/ built
into bench/coro/.build/ (needs `go` on PATH). A peer that cannot be set up is reported with a
clear line and null figures, and the run goes on.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:  # run as a script: bench/common is imported from the checkout
    sys.path.insert(0, str(ROOT))

from bench.common.procfs import cpu_busy_share, machine_busy_s  # noqa: E402
from bench.common.stats import spread  # noqa: E402

PEER_VENV = HERE / ".venv"
BUILD_DIR = HERE / ".build"
GO_BIN = BUILD_DIR / "corobench"
DEFAULT_OUT = ROOT / "bench" / "results" / "coro-latest.json"

ALL_SYSTEMS = ("cyserve-1", "cyserve-all", "asyncio", "uvloop", "gevent", "go-1", "go-all")
SCALING_SYSTEMS = ("cyserve", "go")
LANGUAGE = {"cyserve-1": "C/Cython", "cyserve-all": "C/Cython", "asyncio": "Python",
            "uvloop": "Python", "gevent": "Python", "go-1": "Go", "go-all": "Go"}
FIGURES = ("spawn_s", "run_s", "total_s")

# Exit status of peer_cyserve.py when cyserve has no benchmark functions (cyserve._testhooks).
NOT_AVAILABLE = 3
# One measurement may not take longer than this (gevent's 500,000 greenlets take ~7 s here).
RUN_TIMEOUT_S = 300
# A run during which other processes took more than this share of the machine's CPUs is
# "disturbed" and done again, up to --retries times (the least disturbed attempt is kept). On a
# machine shared with builds and fuzzers, one busy second can double a 0.5 s figure; 10% is
# what an idle Linux box with a shell and an editor stays well below.
DISTURBED_SHARE = 0.10
# With --wait-idle, every attempt first waits (at most this long) for half a second in which
# other processes use less than DISTURBED_SHARE of the CPUs: other work on a shared machine is
# often bursty (a build step, a load test), and a run fits in the gaps.
GAP_WAIT_S = 30.0


class PeerUnavailable(Exception):
    """A peer cannot run on this machine (not installed, not built); the message says why."""


class PeerFailed(Exception):
    """A peer ran and failed: a crash, bad output, a wrong checksum."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpus_available() -> int:
    return len(os.sched_getaffinity(0))


def fib32(k: int) -> int:
    """Fibonacci(k) modulo 2**32, iteratively, as cyserve's and Go's coroutines compute it."""
    a, b = 0, 1
    for _ in range(k):
        a, b = b, (a + b) & 0xFFFFFFFF
    return a


# ---- setting up the peers ----

def peer_python(setup: dict[str, Any], install: bool) -> str:
    """The interpreter of bench/coro/.venv with uvloop and gevent installed from the pinned
    requirements, creating or updating it when the requirements changed."""
    if "python" in setup:
        return setup["python"]
    if "error" in setup:
        raise PeerUnavailable(setup["error"])
    try:
        req = HERE / "requirements.txt"
        digest = hashlib.sha256(req.read_bytes()).hexdigest()
        stamp = PEER_VENV / ".req-stamp"
        py = PEER_VENV / "bin" / "python"
        if not (py.exists() and stamp.exists() and stamp.read_text().strip() == digest):
            if not install:
                raise PeerUnavailable(f"{PEER_VENV} is not set up and --no-install was given")
            log(f"setting up {PEER_VENV.relative_to(ROOT)} from {req.relative_to(ROOT)} ...")
            if not py.exists():
                subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True,
                               stdout=subprocess.DEVNULL)
            subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            "-r", str(req)], check=True, stdout=subprocess.DEVNULL)
            stamp.write_text(digest + "\n")
        setup["python"] = str(py)
        return str(py)
    except (OSError, subprocess.CalledProcessError, PeerUnavailable) as exc:
        setup["error"] = f"cannot set up the uvloop/gevent environment: {exc}"
        raise PeerUnavailable(setup["error"]) from exc


def go_binary(setup: dict[str, Any]) -> str:
    """Build bench/coro/go into bench/coro/.build/corobench (go's cache makes a rebuild cheap)."""
    if "go" in setup:
        return setup["go"]
    if "go_error" in setup:
        raise PeerUnavailable(setup["go_error"])
    go = shutil.which("go")
    if go is None:
        setup["go_error"] = "go is not on PATH (install Go 1.22 or later to measure goroutines)"
        raise PeerUnavailable(setup["go_error"])
    BUILD_DIR.mkdir(exist_ok=True)
    # GOTOOLCHAIN=local: build with the Go that is installed, never download another one.
    env = dict(os.environ, GOTOOLCHAIN="local")
    proc = subprocess.run([go, "build", "-o", str(GO_BIN), "."], cwd=HERE / "go", env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        setup["go_error"] = f"go build failed: {proc.stderr.strip()[-500:]}"
        raise PeerUnavailable(setup["go_error"])
    setup["go"] = str(GO_BIN)
    return str(GO_BIN)


# ---- one measurement: a fresh process ----

def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_json(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one measurement in a fresh process and return its JSON, with others_cpu_share added:
    the share of the machine's CPUs that processes other than the measured one used meanwhile
    (the machine's busy time minus the child's own CPU time, over wall time × CPUs)."""
    busy0, child0, wall0 = machine_busy_s(), children_cpu_s(), time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise PeerFailed(f"{' '.join(cmd)}: no result after {RUN_TIMEOUT_S} s") from exc
    busy1, child1, wall1 = machine_busy_s(), children_cpu_s(), time.monotonic()
    others_s = max(0.0, (busy1 - busy0) - (child1 - child0))
    if proc.returncode == NOT_AVAILABLE and "peer_cyserve.py" in cmd[1]:
        raise PeerUnavailable(proc.stderr.strip())
    if proc.returncode != 0:
        raise PeerFailed(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError) as exc:
        raise PeerFailed(f"{' '.join(cmd)}: no JSON on stdout: {proc.stdout[-300:]!r}") from exc
    for key in FIGURES:
        if not isinstance(out.get(key), (int, float)):
            raise PeerFailed(f"{' '.join(cmd)}: {key} missing from {out}")
    # /proc/stat counts in clock ticks (10 ms), so a short run can read a little over 100%.
    share = others_s / ((wall1 - wall0) * cpus_available())
    out["others_cpu_share"] = round(min(1.0, share), 4)
    return out


def wait_for_gap(max_wait_s: float) -> None:
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        busy = cpu_busy_share(0.5)
        if busy is None or busy < DISTURBED_SHARE:
            return


def measure_quietly(what: str, retries: int, fn: Callable[[], dict[str, Any]],
                    gap_wait_s: float = 0.0) -> dict[str, Any]:
    """fn() once, and again (at most `retries` more times) while other processes disturbed it;
    the least disturbed attempt is kept, with the number of attempts. With gap_wait_s, each
    attempt first waits that long at most for a quiet moment."""
    best = None
    for attempt in range(1 + retries):
        if gap_wait_s > 0:
            wait_for_gap(gap_wait_s)
        out = fn()
        if best is None or out["others_cpu_share"] < best["others_cpu_share"]:
            best = out
        if out["others_cpu_share"] <= DISTURBED_SHARE:
            break
        log(f"{what}: other processes took {out['others_cpu_share']:.0%} of the CPUs; "
            + ("again" if attempt < retries else "keeping the least disturbed attempt"))
    assert best is not None
    best["attempts"] = attempt + 1
    return best


def cmd_cyserve(mode: str, workers: int, **kw: Any) -> list[str]:
    cmd = [sys.executable, str(HERE / "peer_cyserve.py"), mode, "--workers", str(workers)]
    for key, value in kw.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def go_env(procs: int) -> dict[str, str]:
    return dict(os.environ, GOMAXPROCS=str(procs))


def measure_empty(system: str, n: int, ncpu: int, setup: dict[str, Any],
                  install: bool) -> dict[str, Any]:
    if system in ("cyserve-1", "cyserve-all"):
        workers = 1 if system == "cyserve-1" else ncpu
        return run_json(cmd_cyserve("empty", workers, n=n))
    if system == "asyncio":
        return run_json([sys.executable, str(HERE / "peer_asyncio.py"), "--n", str(n)])
    if system == "uvloop":
        py = peer_python(setup, install)
        return run_json([py, str(HERE / "peer_asyncio.py"), "--uvloop", "--n", str(n)])
    if system == "gevent":
        py = peer_python(setup, install)
        return run_json([py, str(HERE / "peer_gevent.py"), "--n", str(n)])
    if system in ("go-1", "go-all"):
        procs = 1 if system == "go-1" else ncpu
        return run_json([go_binary(setup), "-mode", "empty", "-n", str(n)], env=go_env(procs))
    raise ValueError(f"unknown system {system!r}")


def measure_fib(system: str, workers: int, n: int, fib_n: int,
                setup: dict[str, Any]) -> dict[str, Any]:
    if system == "cyserve":
        out = run_json(cmd_cyserve("fib", workers, n=n, fib=fib_n))
    elif system == "go":
        out = run_json([go_binary(setup), "-mode", "fib", "-n", str(n), "-fib", str(fib_n)],
                       env=go_env(workers))
    else:
        raise ValueError(f"unknown scaling system {system!r}")
    if not isinstance(out.get("checksum"), int):
        raise PeerFailed(f"{system} fib on {workers} workers returned no checksum: {out}")
    return out


# ---- statistics ----

def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of each figure over the runs, with min and max kept."""
    out: dict[str, Any] = {}
    for key in FIGURES:
        figure = spread([r[key] for r in runs])
        out[key] = figure["median"]
        out.setdefault("min", {})[key] = figure["min"]
        out.setdefault("max", {})[key] = figure["max"]
    shares = spread([r["others_cpu_share"] for r in runs if "others_cpu_share" in r])
    if shares:
        out["others_cpu_share"] = shares["median"]
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# ---- the two workloads ----

def bench_empty(systems: list[str], n: int, runs: int, ncpu: int, setup: dict[str, Any],
                install: bool, retries: int,
                gap_wait_s: float) -> tuple[dict[str, Any], list[str]]:
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    problems: dict[str, str] = {}
    failures: list[str] = []
    for rnd in range(runs):
        # Rotate the order every round, so that no system always runs first (on a cold cache)
        # or right after the heaviest one.
        order = systems[rnd % len(systems):] + systems[:rnd % len(systems)]
        for system in order:
            if system in problems:
                continue
            try:
                results[system].append(measure_quietly(
                    system, retries, lambda: measure_empty(system, n, ncpu, setup, install),
                    gap_wait_s))
            except PeerUnavailable as exc:
                problems[system] = f"not available: {exc}"
                log(f"{system}: {problems[system]}")
            except PeerFailed as exc:
                problems[system] = f"failed: {exc}"
                failures.append(f"{system}: {exc}")
                log(f"{system}: {problems[system]}")
        log(f"empty coroutines: round {rnd + 1}/{runs} done")

    out: dict[str, Any] = {}
    for system in systems:
        entry: dict[str, Any] = {"language": LANGUAGE[system], "n": n}
        if system in ("cyserve-1", "go-1"):
            entry["workers"] = 1
        elif system in ("cyserve-all", "go-all"):
            entry["workers"] = ncpu
        else:
            entry["workers"] = 1  # one event loop on one thread
        if system in problems:
            entry.update({k: None for k in FIGURES})
            entry["available"] = False
            entry["reason"] = problems[system]
        else:
            entry.update(summarise(results[system]))
            entry["available"] = True
            entry["runs"] = results[system]
            version = results[system][0].get("version") or results[system][0].get("go_version")
            if version:
                entry["version"] = version
        out[system] = entry
    return out, failures


def calibrate_fib(systems: list[str], fib_n: int, target_s: float,
                  setup: dict[str, Any]) -> tuple[int, str]:
    """Choose the number of coroutines so one run on one worker takes about target_s: time a
    small batch on one worker (cyserve, else Go) and scale."""
    probe = 2000
    for system in systems:
        try:
            out = measure_fib(system, 1, probe, fib_n, setup)
        except (PeerUnavailable, PeerFailed) as exc:
            log(f"calibration on {system} impossible: {exc}")
            continue
        per_coro = out["total_s"] / probe
        n = max(100, int(round(target_s / per_coro, -2)))
        return n, f"{system}, 1 worker: {per_coro * 1e6:.1f} us per coroutine on {probe}"
    return 20_000, "no system could calibrate; default 20,000"


def bench_scaling(systems: list[str], workers_list: list[int], n: int, fib_n: int, runs: int,
                  setup: dict[str, Any], how: str, retries: int,
                  gap_wait_s: float) -> tuple[dict[str, Any], list[str]]:
    expected = n * fib32(fib_n)
    results: dict[str, dict[int, list[dict[str, Any]]]] = {
        s: {k: [] for k in workers_list} for s in systems}
    problems: dict[str, str] = {}
    failures: list[str] = []
    bad_checksums: list[str] = []
    for rnd in range(runs):
        for k in workers_list:
            for system in systems:
                if system in problems:
                    continue
                try:
                    out = measure_quietly(f"scaling {system} on {k} workers", retries,
                                          lambda: measure_fib(system, k, n, fib_n, setup),
                                          gap_wait_s)
                except PeerUnavailable as exc:
                    problems[system] = f"not available: {exc}"
                    log(f"scaling {system}: {problems[system]}")
                    continue
                except PeerFailed as exc:
                    problems[system] = f"failed: {exc}"
                    failures.append(f"scaling {system}: {exc}")
                    log(f"scaling {system}: {problems[system]}")
                    continue
                if out["checksum"] != expected:
                    bad_checksums.append(f"{system} on {k} workers: {out['checksum']}")
                results[system][k].append(out)
        log(f"scaling: round {rnd + 1}/{runs} done")

    if bad_checksums:
        failures.append(f"checksum differs from {expected}: " + "; ".join(bad_checksums))
    scaling: dict[str, Any] = {
        "workload": f"Fibonacci({fib_n}) in uint32 (wrapping) in each of {n} coroutines",
        "fib_n": fib_n,
        "coroutines": n,
        "calibration": how,
        "workers": workers_list,
        "expected_checksum": expected,
        "checksum_ok": not bad_checksums and any(
            results[s][k] for s in systems for k in workers_list),
        "systems": {},
    }
    for system in systems:
        if system in problems:
            scaling["systems"][system] = {"available": False, "reason": problems[system]}
            continue
        per_k: dict[str, Any] = {}
        base = None
        for k in workers_list:
            entry = summarise(results[system][k])
            entry["throughput"] = n / entry["total_s"]  # coroutines per second
            entry["checksum"] = results[system][k][0]["checksum"]
            entry["runs"] = results[system][k]
            if base is None:
                base = entry["throughput"]
            entry["speedup"] = entry["throughput"] / base
            per_k[str(k)] = entry
        scaling["systems"][system] = {"available": True, "by_workers": per_k}
    if all(scaling["systems"].get(s, {}).get("available") for s in ("cyserve", "go")):
        scaling["cyserve_vs_go_throughput"] = {
            str(k): scaling["systems"]["cyserve"]["by_workers"][str(k)]["throughput"]
            / scaling["systems"]["go"]["by_workers"][str(k)]["throughput"]
            for k in workers_list}
    return scaling, failures


def bench_parked(workers: int, seconds: float) -> dict[str, Any]:
    cmd = cmd_cyserve("parked", workers, seconds=seconds)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                              timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"available": False, "reason": f"no result after {RUN_TIMEOUT_S} s"}
    if proc.returncode == NOT_AVAILABLE:
        return {"available": False, "reason": f"not available: {proc.stderr.strip()}"}
    if proc.returncode != 0:
        return {"available": False, "reason": f"failed: {proc.stderr.strip()[-500:]}"}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"available": True, "workers": workers, "seconds": seconds, **out}


# ---- the machine and the report ----

def wait_until_idle(max_wait_s: float, busy_limit: float = 0.1) -> float | None:
    """Wait (at most max_wait_s) until other processes use less than busy_limit of the CPUs, so
    that a shared machine's other work does not land in the figures. Returns the last busy
    share measured."""
    deadline = time.monotonic() + max_wait_s
    busy = cpu_busy_share()
    while busy is not None and busy >= busy_limit and time.monotonic() < deadline:
        log(f"waiting for an idle machine: {busy:.0%} of the CPUs busy")
        busy = cpu_busy_share(5.0)
    return busy


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    go_version = None
    go = shutil.which("go")
    if go:
        proc = subprocess.run([go, "version"], capture_output=True, text=True)
        go_version = proc.stdout.strip() or None
    commit = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip() or None
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus_online": os.cpu_count(),
        "cpus_available": cpus_available(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "go": go_version,
        "cyserve_commit": commit,
        "loadavg_start": list(os.getloadavg()),
    }


def fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def fmt_pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def fmt_ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}×"


def render(report: dict[str, Any]) -> str:
    systems = report["systems"]
    n = next(iter(systems.values()))["n"] if systems else 0
    runs = report["method"]["runs"]
    runs_text = f"{runs} run{'s' if runs != 1 else ''}"
    lines = [f"### {n:,} empty coroutines ({runs_text} each, medians; "
             f"a fresh process per run)", "",
             "| Name | Language | Workers | Spawn (s) | Run (s) | Total (s) | Total min–max (s) "
             "| Total vs go-all | Total vs asyncio | Others' CPU |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    go_all = systems.get("go-all", {}).get("total_s")
    asyncio_total = systems.get("asyncio", {}).get("total_s")
    for name, e in systems.items():
        if not e.get("available"):
            lines.append(f"| {name} | {e['language']} | {e['workers']} | – | – | – | – | – | – "
                         "| – |")
            continue
        lines.append(
            f"| {name} | {e['language']} | {e['workers']} | {fmt(e['spawn_s'])} "
            f"| {fmt(e['run_s'])} | {fmt(e['total_s'])} "
            f"| {fmt(e['min']['total_s'])}–{fmt(e['max']['total_s'])} "
            f"| {fmt_ratio(ratio(e['total_s'], go_all))} "
            f"| {fmt_ratio(ratio(e['total_s'], asyncio_total))} "
            f"| {fmt_pct(e.get('others_cpu_share'))} |")
    unavailable = [f"- {name}: {e['reason']}" for name, e in systems.items()
                   if not e.get("available")]
    if unavailable:
        lines += ["", *unavailable]
    lines += ["", "Spawn = creating/queuing the n coroutines; run = running them until all have "
              "finished; total = spawn + run + creating and freeing the loop or scheduler. "
              "Others' CPU = median share of the CPUs that other processes used during the "
              "runs (0% on an idle machine). "
              "Go's goroutines (and, with GOMAXPROCS=1, preemption) start running during the "
              "spawn loop, so Go's spawn contains part of its run; compare totals."]

    r = report["ratios"]
    lines += ["", "Targets:"]
    for key, label, target in (
            ("cyserve-all/go-all", "cyserve-all total / go-all total", "≤ 0.5"),
            ("cyserve-all/asyncio", "cyserve-all total / asyncio total", "≤ 0.05")):
        v = r.get(key)
        verdict = "" if v is None else (" (met)" if v <= float(target.split()[1])
                                        else " (NOT met)")
        lines.append(f"- {label} = {fmt(v)} (target {target}){verdict}")

    sc = report.get("scaling")
    if sc:
        lines += ["", f"### Scaling: {sc['workload']} ({runs_text} each, medians)", "",
                  "| Workers | cyserve total (s) | cyserve coroutines/s | cyserve speed-up "
                  "| Go total (s) | Go coroutines/s | Go speed-up | cyserve/Go throughput "
                  "| Others' CPU (cyserve, Go) |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        cy = sc["systems"].get("cyserve", {})
        go = sc["systems"].get("go", {})
        for k in sc["workers"]:
            c = cy.get("by_workers", {}).get(str(k), {})
            g = go.get("by_workers", {}).get(str(k), {})
            lines.append(
                f"| {k} | {fmt(c.get('total_s'))} | {fmt(c.get('throughput'), 0)} "
                f"| {fmt_ratio(c.get('speedup'))} | {fmt(g.get('total_s'))} "
                f"| {fmt(g.get('throughput'), 0)} | {fmt_ratio(g.get('speedup'))} "
                f"| {fmt_ratio(ratio(c.get('throughput'), g.get('throughput')))} "
                f"| {fmt_pct(c.get('others_cpu_share'))}, {fmt_pct(g.get('others_cpu_share'))} |")
        for name, e in sc["systems"].items():
            if not e.get("available"):
                lines.append(f"\n- {name}: {e['reason']}")
        lines.append("")
        matched = [{"cyserve": "cyserve", "go": "Go"}[name]
                   for name, e in sc["systems"].items() if e.get("available")]
        if sc["checksum_ok"]:
            verdict = (f"{' and '.join(matched)} agree{'s' if len(matched) == 1 else ''} with "
                       "it on every run: the loop was not folded away.")
        else:
            verdict = "MISMATCH or nothing measured, see above."
        lines.append(f"Checksum (sum of the results; expected {sc['expected_checksum']}, "
                     f"computed here in Python): {verdict}")
        if 2 in sc["workers"] and cy.get("available"):
            s2 = cy["by_workers"]["2"]["speedup"]
            lines.append(f"- cyserve 2 workers / 1 worker throughput = {s2:.3f} "
                         f"(target ≥ 1.9){' (met)' if s2 >= 1.9 else ' (NOT met)'}")

    p = report.get("parked")
    if p:
        lines.append("")
        if p.get("available"):
            share = p["cpu_s"] / p["wall_s"] * 100 if p["wall_s"] else 0.0
            lines.append(f"Parked scheduler ({p['workers']} workers, no work): "
                         f"{p['cpu_s'] * 1e3:.2f} ms of CPU over {p['wall_s']:.2f} s "
                         f"({share:.3f} % of one CPU; the target is none).")
        else:
            lines.append(f"Parked scheduler CPU: {p['reason']}")

    m = report["machine"]
    busy = m.get("cpu_busy_before")
    if busy is not None and busy >= 0.1:
        lines += ["", f"WARNING: other processes used {busy:.0%} of the CPUs just before the "
                      "run (and the load average is in the line below): the figures are "
                      "disturbed; rerun on an idle machine (--wait-idle 600)."]
    lines += ["", f"Machine: {m['cpu']}, {m['cpus_available']} CPUs available, Linux "
                  f"{m['kernel']}, Python {m['python']}, {m['go'] or 'no Go'}; load average "
                  f"{m['loadavg_start'][0]:.2f} at the start, {m['loadavg_end'][0]:.2f} at the "
                  f"end; cyserve {m['cyserve_commit']}; {report['date']}."]
    return "\n".join(lines)


# ---- main ----

def parse_workers(text: str | None, ncpu: int) -> list[int]:
    if text:
        ks = sorted({int(x) for x in text.split(",")})
        if not ks or ks[0] < 1:
            raise argparse.ArgumentTypeError("--workers takes positive counts, e.g. 1,2,4")
        return ks
    if ncpu <= 4:
        return list(range(1, ncpu + 1))
    ks, k = [], 1
    while k < ncpu:
        ks.append(k)
        k *= 2
    return ks + [ncpu]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The coroutine benchmark: cyserve against "
                                             "asyncio, uvloop, gevent and Go.")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 3 runs, 50,000 coroutines, a 0.2 s scaling workload, 1 s "
                         "parked")
    ap.add_argument("--runs", type=int, help="runs per measurement (default 5; quick: 3)")
    ap.add_argument("--n", type=int, help="empty coroutines (default 500,000; quick: 50,000)")
    ap.add_argument("--systems", default=",".join(ALL_SYSTEMS),
                    help="comma-separated subset of " + ",".join(ALL_SYSTEMS))
    ap.add_argument("--scaling-systems", default=",".join(SCALING_SYSTEMS),
                    help="comma-separated subset of cyserve,go; empty to skip the scaling test")
    ap.add_argument("--workers", help="worker counts for the scaling test (default 1..N, or "
                                      "powers of two and N past 4 CPUs)")
    ap.add_argument("--fib-n", type=int, default=100_000, help="Fibonacci index (100,000)")
    ap.add_argument("--fib-coros", type=int, default=0,
                    help="coroutines in the scaling test (default: calibrated so one run on one "
                         "worker takes ~0.75 s)")
    ap.add_argument("--parked-seconds", type=float,
                    help="how long to measure a parked scheduler (default 5; quick: 1; 0 skips)")
    ap.add_argument("--no-install", action="store_true",
                    help="do not create bench/coro/.venv: peers needing it are reported "
                         "unavailable")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="first wait up to SECONDS until other processes use < 10%% of the "
                         "CPUs, then before every run wait up to 30 s for a quiet half second "
                         "(default: do not wait, only measure and report it)")
    ap.add_argument("--retries", type=int, default=2,
                    help="redo a run at most this many times while other processes took more "
                         "than 10%% of the CPUs during it (default 2)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON file to write")
    args = ap.parse_args(argv)

    runs = args.runs or (3 if args.quick else 5)
    n = args.n or (50_000 if args.quick else 500_000)
    parked_s = args.parked_seconds if args.parked_seconds is not None else (
        1.0 if args.quick else 5.0)
    target_fib_s = 0.2 if args.quick else 0.75
    systems = [s for s in args.systems.split(",") if s]
    scaling_systems = [s for s in args.scaling_systems.split(",") if s]
    for s in systems:
        if s not in ALL_SYSTEMS:
            ap.error(f"unknown system {s!r}; known: {', '.join(ALL_SYSTEMS)}")
    for s in scaling_systems:
        if s not in SCALING_SYSTEMS:
            ap.error(f"unknown scaling system {s!r}; known: {', '.join(SCALING_SYSTEMS)}")
    if runs < 1 or n < 1 or args.fib_n < 1 or args.fib_coros < 0 or args.retries < 0:
        ap.error("--runs, --n and --fib-n must be positive, --fib-coros and --retries not "
                 "negative")
    ncpu = cpus_available()
    try:
        workers_list = parse_workers(args.workers, ncpu)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        ap.error(str(exc))

    setup: dict[str, Any] = {}
    busy = wait_until_idle(args.wait_idle) if args.wait_idle > 0 else cpu_busy_share(1.0)
    machine = machine_info()
    machine["cpu_busy_before"] = busy
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    failures: list[str] = []

    gap_wait_s = GAP_WAIT_S if args.wait_idle > 0 else 0.0
    empty, fails = bench_empty(systems, n, runs, ncpu, setup, not args.no_install, args.retries,
                               gap_wait_s)
    failures += fails
    report: dict[str, Any] = {"systems": empty}

    if scaling_systems:
        if args.fib_coros:
            fib_coros, how = args.fib_coros, "given with --fib-coros"
        else:
            fib_coros, how = calibrate_fib(scaling_systems, args.fib_n, target_fib_s, setup)
        report["scaling"], fails = bench_scaling(scaling_systems, workers_list, fib_coros,
                                                 args.fib_n, runs, setup, how, args.retries,
                                                 gap_wait_s)
        failures += fails
    else:
        report["scaling"] = {}

    if parked_s > 0:
        report["parked"] = bench_parked(ncpu, parked_s)

    def total(name: str) -> float | None:
        return empty.get(name, {}).get("total_s")

    report["ratios"] = {
        "cyserve-all/go-all": ratio(total("cyserve-all"), total("go-all")),
        "cyserve-all/asyncio": ratio(total("cyserve-all"), total("asyncio")),
        "cyserve-1/go-1": ratio(total("cyserve-1"), total("go-1")),
        "cyserve-all/uvloop": ratio(total("cyserve-all"), total("uvloop")),
        "cyserve-all/gevent": ratio(total("cyserve-all"), total("gevent")),
    }
    machine["loadavg_end"] = list(os.getloadavg())
    report["machine"] = machine
    report["date"] = date
    report["method"] = {
        "runs": runs,
        "statistic": "median of the runs; min and max kept per figure",
        "process": "a fresh process per measurement; runs interleaved across systems "
                   "(rotated order each round)",
        "timing": "cyserve: CLOCK_MONOTONIC in C with the GIL released (cyserve._testhooks."
                  "bench_empty/bench_fib); Python peers: time.perf_counter(); Go: time.Now()",
        "disturbance": f"each run records others_cpu_share, the share of the CPUs other "
                       f"processes used during it; a run above {DISTURBED_SHARE:.0%} is redone "
                       f"up to {args.retries} times and the least disturbed attempt kept",
        "wait_idle_s": args.wait_idle,
        "pinning": "no CPU pinning; workers float over the CPUs available; peer versions "
                   "pinned in bench/coro/requirements.txt, Go from the machine",
        "wall_s": round(time.monotonic() - t0, 1),
    }
    if failures:
        report["failures"] = failures

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    print(f"\n(wrote {args.out})")
    if failures:
        log("FAILURES:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
