"""Summaries, the Markdown report and the plots of an HTTP suite result (bench/http/run.py writes
it).

summarize() and markdown() are stdlib only (the CI smoke test calls them). plots() needs
matplotlib, which lives in bench/.venv: write_all() runs this file there as
`python bench/http/report.py --plots RESULT.json OUTDIR` when the calling interpreter lacks it.

Ratios are taken within a round (a server's figure divided by nginx's, or fasthttp's, measured in
the same round and mode), then the median over rounds is reported, so slow drifts of the machine
between rounds cancel out.
"""

import json
import os
import statistics
import subprocess
import sys

# bench.common, also when this file runs as a script (the plots, in bench/.venv): the checkout's
# root goes on the path (never bench/ itself, whose http/ would hide the standard library's).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common.report import cell as _cell  # noqa: E402
from bench.common.report import num as _num  # noqa: E402
from bench.common.report import table  # noqa: E402
from bench.common.stats import spread  # noqa: E402

REFS = {"pct_nginx": ("nginx", 100.0), "x_fasthttp": ("go-fasthttp", 1.0),
        "x_fastpysgi": ("fastpysgi-wsgi", 1.0)}
# The reference the Python rows are read against: the fastest Python server of the public runs.
PY_REF = "fastpysgi-wsgi"
PY_GROUPS = ("python-wsgi", "python-async")
PY_CYSERVE = ("cyserve-py", "cyserve-wsgi")
MODES = ("pinned", "allcore", "hey")


_stats = spread  # {"median", "min", "max", "n"}, or None without a value


def _mode_runs(result, mode):
    """The runs of a mode; for allcore only each server's largest thread count (the rest are the
    scaling points)."""
    runs = [r for r in result["runs"] if r["mode"] == mode and r["status"] == "ok"]
    if mode == "allcore":
        top = {}
        for r in runs:
            top[r["server"]] = max(top.get(r["server"], 0), r["threads"])
        runs = [r for r in runs if r["threads"] == top[r["server"]]]
    return runs


def summarize(result):
    """{mode: {workload: {server: figures}}, "scaling": {workload: {server: {threads: rps}}}}."""
    out = {}
    for mode in MODES:
        runs = _mode_runs(result, mode)
        index = {(r["round"], r["workload"], r["server"]): r for r in runs}
        table = {}
        for r in runs:
            table.setdefault(r["workload"], {}).setdefault(r["server"], []).append(r)
        summary = {}
        for w, by_server in table.items():
            summary[w] = {}
            for name, rs in by_server.items():
                fig = {
                    "rps": _stats([r["rps"] for r in rs]),
                    "requests_per_cpu_s": _stats([r.get("requests_per_cpu_s") for r in rs]),
                    "p50_ms": _stats([r.get("p50_ms") for r in rs]),
                    "p99_ms": _stats([r.get("p99_ms") for r in rs]),
                    "rss_peak_kib": max((r.get("rss_peak_kib") or 0) for r in rs),
                    "errors": sum(r.get("errors", 0) + r.get("non2xx", 0) for r in rs),
                    "threads": rs[0]["threads"],
                }
                for key, (ref, scale) in REFS.items():
                    ratios, cpu_ratios = [], []
                    for r in rs:
                        base = index.get((r["round"], w, ref))
                        if base and base["rps"]:
                            ratios.append(scale * r["rps"] / base["rps"])
                        if base and base.get("requests_per_cpu_s") and r.get("requests_per_cpu_s"):
                            cpu_ratios.append(scale * r["requests_per_cpu_s"] / base["requests_per_cpu_s"])
                    fig[key] = _stats(ratios)
                    fig[key + "_cpu"] = _stats(cpu_ratios)
                summary[w][name] = fig
        out[mode] = summary
    scaling = {}
    for r in result["runs"]:
        if r["mode"] == "allcore" and r["status"] == "ok" and result["servers"].get(r["server"], {}).get("scales") \
                and r["workload"] in result["config"].get("scaling_workloads", ()):
            scaling.setdefault(r["workload"], {}).setdefault(r["server"], {}).setdefault(str(r["threads"]), []).append(r["rps"])
    out["scaling"] = {w: {s: {t: statistics.median(v) for t, v in sorted(ts.items(), key=lambda kv: int(kv[0]))}
                          for s, ts in by.items()} for w, by in scaling.items()}
    return out


# ---------------------------------------------------------------------------------------------
# Markdown.

def _status(result, server, workload):
    info = result["servers"][server]
    if not info["available"]:
        return "unavailable"
    if workload not in info["workloads"]:
        return "n/a"
    v = info["validation"].get(workload)
    if v is None:
        return "not run"
    if v != "ok":
        return "invalid"
    # Validated but never measured: the run was limited to other workloads (--workloads).
    if not any(r["server"] == server and r["workload"] == workload for r in result["runs"]):
        return "not run"
    return "none completed"


def overview(result):
    """One matrix for the pinned mode: a row per server, a column per workload, each cell
    "req/s · req/CPU-s" (medians), or why there is no figure."""
    s = result["summary"].get("pinned", {})
    ws = result["workloads"]
    lines = ["| server (pinned, one core) | " + " | ".join(f"/{w}" for w in ws) + " |",
             "|---|" + "---:|" * len(ws)]

    def key(name):
        f = s.get("plaintext", {}).get(name)
        return -(f["requests_per_cpu_s"]["median"] if f and f["requests_per_cpu_s"] else 0)

    for name in sorted(result["servers"], key=key):
        cells = []
        for w in ws:
            f = s.get(w, {}).get(name)
            if f and f["rps"]:
                per = f["requests_per_cpu_s"]["median"] if f["requests_per_cpu_s"] else None
                cells.append(f"{f['rps']['median']:,.0f} · {_num(per)}")
            else:
                cells.append(_status(result, name, w))
        lines.append(f"| {result['servers'][name]['label']} | " + " | ".join(cells) + " |")
    return lines


def python_reference(result):
    """The Python rows against fastpysgi WSGI: a row per Python server (cyserve's Python and WSGI
    paths first), a column per workload, each cell the median of the per-round ratios of
    requests per server CPU-second (pinned), min–max beside. Empty when fastpysgi did not run."""
    s = result["summary"].get("pinned", {})
    ws = [w for w in result["workloads"] if PY_REF in s.get(w, {})]
    if not ws:
        return []
    names = [n for n in result["servers"] if _cyserve_of(result, n) in PY_CYSERVE]
    names += [n for n, i in result["servers"].items() if i.get("group") in PY_GROUPS and n != PY_REF]
    lines = ["| server (pinned, per server CPU-second) | " + " | ".join(f"/{w}" for w in ws) + " |",
             "|---|" + "---:|" * len(ws)]
    for name in names:
        cells = []
        for w in ws:
            f = s.get(w, {}).get(name)
            cells.append(_cell(f["x_fastpysgi_cpu"], "{:.2f}", True) if f else _status(result, name, w))
        lines.append(f"| {result['servers'][name]['label']} | " + " | ".join(cells) + " |")
    return lines


def _cyserve_of(result, name):
    """The cyserve server a row is (NAME-base rows of a --baseline run are their NAME)."""
    return name[:-5] if name.endswith("-base") else name


def _pythons(result):
    """The interpreters the Python servers ran on: "CPython 3.12.1 (all)", or each with its
    servers when a row ran on another (the free-threaded rows, or a result from before the
    interpreter was recorded: the runner's own)."""
    by = {}
    for name, info in result["servers"].items():
        if info.get("python"):
            by.setdefault(info["python"], []).append(name)
    if not by:
        bench = result.get("bench_python")
        return f"{bench} (bench/.venv)" if bench else f"Python {result['machine']['python']} (the runner's; not recorded per server)"
    if len(by) == 1:
        return f"{next(iter(by))} (all)"
    return "; ".join(f"{py}: {', '.join(names)}" for py, names in by.items())


def markdown(result):
    s = result["summary"]
    m = result["machine"]
    cfg = result["config"]
    lines = [
        f"# cyserve benchmark: {result['mode']} run, {result['started']}",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}, Linux {m['kernel']}; the runner on Python {m['python']}",
        f"- Python servers: {_pythons(result)}",
        f"- Command: `{result['command']}` (git {result['git']}), {result['elapsed_s']:.0f} s",
        f"- Client: {cfg['client']} {m['tools'].get('wrk', '')}, keep-alive, {cfg['connections']} connections, "
        f"no pipelining; {cfg['rounds']} round(s) of {cfg['duration_s']} s cells (warm-up {cfg['warmup_s']} s), "
        "servers interleaved; median (min–max) over rounds.",
        "- **pinned** (primary): server on CPU 0 with one worker, wrk on CPU 1. "
        "**req/CPU-s**: requests served per second of server CPU time (user+system, whole process tree, /proc). "
        "**% nginx**, **× fasthttp**: ratios within each round. n/a: the server has no such handler; "
        "invalid: wrong status or body (not measured); "
        "none completed: the cell ran but no response came back within it.",
        "",
        "## Overview: requests/s · requests per server CPU-second (pinned)",
        "",
    ] + overview(result) + [""]
    ref = python_reference(result)
    if ref:
        lines += ["## The Python rows against fastpysgi WSGI (× its requests per CPU-second, "
                  "per-round ratios: median (min–max))", ""] + ref + [""]
    for mode, title in (("pinned", "Pinned: one server core"),
                        ("allcore", "All cores (flagged: the client shares the cores with the server)"),
                        ("hey", f"Second client: {cfg['hey']}, server pinned to one CPU")):
        lines += [f"## {title}", ""]
        for w in result["workloads"]:
            rows = s.get(mode, {}).get(w, {})
            if not rows and mode != "pinned":
                continue
            lines += [f"### /{w}", "",
                      "| server | req/s | req/CPU-s | % nginx | × fasthttp | p50 ms | p99 ms | peak RSS MiB | threads |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
            order = sorted(rows, key=lambda n: -(rows[n]["rps"]["median"] if rows[n]["rps"] else 0))
            for name in order:
                f = rows[name]
                err = f" ⚠ {f['errors']} errors" if f["errors"] else ""
                lines.append(
                    f"| {result['servers'][name]['label']}{err} | {_cell(f['rps'])} | {_cell(f['requests_per_cpu_s'])} "
                    f"| {_cell(f['pct_nginx'], '{:.1f}', False)} | {_cell(f['x_fasthttp'], '{:.2f}', False)} "
                    f"| {_cell(f['p50_ms'], '{:.2f}', False)} | {_cell(f['p99_ms'], '{:.2f}', False)} "
                    f"| {f['rss_peak_kib'] / 1024:.1f} | {f['threads']} |")
            if mode == "pinned":
                missing = [n for n in result["servers"] if n not in rows]
                for name in missing:
                    lines.append(f"| {result['servers'][name]['label']} | {_status(result, name, w)} | | | | | | | |")
            lines.append("")
    if s.get("scaling"):
        lines += ["## Scaling: requests/s against worker threads (all-core, flagged)", ""]
        for w, by in s["scaling"].items():
            threads = sorted({int(t) for v in by.values() for t in v})
            lines += [f"### /{w}", "", "| server | " + " | ".join(f"{t} thr" for t in threads) + " |",
                      "|---|" + "---:|" * len(threads)]
            for name, pts in by.items():
                lines.append(f"| {result['servers'][name]['label']} | "
                             + " | ".join(_num(pts.get(str(t))) for t in threads) + " |")
            lines.append("")
    if "coro" in result:
        lines += ["## Coroutines (bench/coro)", ""] + _coro_table(result["coro"]) + [""]
    lines += ["## Servers", "", "| server | version | Python | status | note |", "|---|---|---|---|---|"]
    for info in result["servers"].values():
        status = "ok" if info["available"] else info["reason"]
        bad = {w: v for w, v in info["validation"].items() if v != "ok"}
        if bad:
            status += "; " + "; ".join(f"/{w} {v}" for w, v in bad.items())
        lines.append(f"| {info['label']} | {info['version']} | {info.get('python') or ''} "
                     f"| {status.replace('|', '/')} | {info['note']} |")
    if result.get("setup_notes"):
        lines += ["", "Setup notes:", ""] + [f"- {n}" for n in result["setup_notes"]]
    plots = [f"plot-{w}.png" for w in result["workloads"] if s.get("pinned", {}).get(w)]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
        if s.get("scaling"):
            lines.append("![scaling](plot-scaling.png)")
    return "\n".join(lines) + "\n"


def _coro_table(coro):
    """bench/coro's own renderer when it can be imported (it knows its result's shape); else a
    generic rendering: a list of flat dicts becomes a table, anything else a JSON block."""
    try:
        from bench.coro.run import render
        return render(coro).splitlines()
    except Exception as e:  # its shape may change under us: fall back rather than fail the report
        note = [f"(bench/coro's renderer failed: {type(e).__name__}: {e}; raw figures below)", ""]
    return note + table(coro)


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, from bench/.venv).

def plots(result, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    s = result["summary"]
    for w in result["workloads"]:
        rows = s.get("pinned", {}).get(w)
        if not rows:
            continue
        names = sorted(rows, key=lambda n: rows[n]["rps"]["median"])
        fig, axes = plt.subplots(1, 2, figsize=(12, 0.35 * len(names) + 1.6), sharey=True)
        for ax, key, title in ((axes[0], "rps", "requests/s (one server core)"),
                               (axes[1], "requests_per_cpu_s", "requests per server CPU-second")):
            vals = [rows[n][key]["median"] if rows[n][key] else 0 for n in names]
            lo = [v - (rows[n][key]["min"] if rows[n][key] else 0) for n, v in zip(names, vals)]
            hi = [(rows[n][key]["max"] if rows[n][key] else 0) - v for n, v in zip(names, vals)]
            colors = ["#d62728" if result["servers"][n]["group"] == "cyserve" else
                      "#1f77b4" if result["servers"][n]["group"] in ("go", "c") else "#7f7f7f" for n in names]
            ax.barh(range(len(names)), [max(v, 1e-3) for v in vals], xerr=[lo, hi], color=colors, capsize=2)
            ax.set_xscale("log")
            ax.set_title(title, fontsize=10)
            ax.grid(axis="x", which="both", alpha=0.3)
        axes[0].set_yticks(range(len(names)))
        axes[0].set_yticklabels([result["servers"][n]["label"] for n in names], fontsize=8)
        fig.suptitle(f"/{w} — pinned mode, median and min–max over rounds ({result['started'][:10]})", fontsize=11)
        fig.tight_layout()
        path = os.path.join(outdir, f"plot-{w}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    if s.get("scaling"):
        ws = list(s["scaling"])
        fig, axes = plt.subplots(1, len(ws), figsize=(6 * len(ws), 4), squeeze=False)
        for ax, w in zip(axes[0], ws):
            for name, pts in s["scaling"][w].items():
                ts = sorted(pts, key=int)
                ax.plot([int(t) for t in ts], [pts[t] for t in ts], marker="o", label=result["servers"][name]["label"])
            ax.set_xlabel("worker threads / processes")
            ax.set_ylabel("requests/s")
            ax.set_title(f"/{w}: scaling (all cores; client on the same machine)", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(outdir, "plot-scaling.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def write_all(result, outdir, plot_python=None):
    """latest.md, and the plots (through plot_python when this interpreter lacks matplotlib).
    Returns the paths written; a plot failure is printed, not raised."""
    md = os.path.join(outdir, "latest.md")
    with open(md, "w") as f:
        f.write(markdown(result))
    written = [os.path.join(outdir, "latest.json"), md]
    try:
        import matplotlib  # noqa: F401
        return written + plots(result, outdir)
    except ImportError:
        pass
    if plot_python and os.path.exists(plot_python):
        src = os.path.join(outdir, "latest.json")
        r = subprocess.run([plot_python, os.path.abspath(__file__), "--plots", src, outdir],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return written + [ln for ln in r.stdout.splitlines() if ln.endswith(".png")]
        print(f"plots failed: {r.stderr.strip()[-500:]}", flush=True)
    else:
        print("plots skipped: matplotlib is not installed (it comes with bench/.venv)", flush=True)
    return written


DOCS_START, DOCS_END = "<!-- results:start -->", "<!-- results:end -->"


def docs_section(result):
    """The "Latest results" body of docs/benchmarks.md for a result (plots linked from
    bench/results/)."""
    r, m, cfg = result, result["machine"], result["config"]
    kind = "a full `make bench` run" if r["mode"] == "full" else "a `make bench-quick` run"
    lines = [
        f"From {kind}: {r['started']}, git {r['git']}, `{r['command']}`, {r['elapsed_s'] / 60:.0f} min. "
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}, Linux {m['kernel']}; Python servers: "
        f"{_pythons(r)}; {m['tools'].get('wrk', 'no wrk')}; load average {m.get('loadavg_start', '?')} at the start, "
        f"{m.get('loadavg_end', '?')} at the end. {cfg['rounds']} interleaved round(s) of {cfg['duration_s']} s cells "
        f"(warm-up {cfg['warmup_s']} s). The whole report, with min–max, p50/p99, peak RSS, % nginx and × fasthttp "
        "per cell, is [bench/results/latest.md](../bench/results/latest.md); raw figures in "
        "`bench/results/latest.json`.",
        "",
        "### Overview: requests/s · requests per server CPU-second, pinned mode (one server core), medians",
        "",
    ] + overview(r) + [
        "",
        "none completed: the cell ran but no response came back within it (a server that runs every "
        "queued ~80 ms Python request before answering any). n/a: no handler for that route. "
        "unavailable: see the server table in the report (Lwan needs `LWAN_BIN`).",
        "",
    ]
    ref = python_reference(r)
    if ref:
        lines += ["### The Python rows against fastpysgi WSGI: × its requests per server CPU-second "
                  "(pinned; per-round ratios, median (min–max))", ""] + ref + [""]
    hey = r["summary"].get("hey", {})
    for w, rows in hey.items():
        lines += [f"### The second client on /{w}: {cfg['hey']}, server pinned to one CPU", "",
                  "| server | req/s | % nginx | p50 ms | p99 ms |", "|---|---:|---:|---:|---:|"]
        for n in sorted(rows, key=lambda n: -rows[n]["rps"]["median"]):
            f = rows[n]
            lines.append(f"| {r['servers'][n]['label']} | {f['rps']['median']:,.0f} "
                         f"| {_cell(f['pct_nginx'], '{:.1f}', False)} | {_cell(f['p50_ms'], '{:.2f}', False)} "
                         f"| {_cell(f['p99_ms'], '{:.2f}', False)} |")
        lines.append("")
    if r["summary"].get("scaling"):
        lines += ["### Scaling (all-core, flagged: the client shares the cores), requests/s", ""]
        for w, by in r["summary"]["scaling"].items():
            for n, pts in by.items():
                lines.append(f"- /{w}, {r['servers'][n]['label']}: "
                             + ", ".join(f"{t} worker(s) {v:,.0f}" for t, v in pts.items()))
        lines.append("")
    lines += [f"![/{w}](../bench/results/plot-{w}.png)" for w in r["workloads"]
              if r["summary"].get("pinned", {}).get(w)]
    if r["summary"].get("scaling"):
        lines.append("![scaling](../bench/results/plot-scaling.png)")
    lines += ["", "### Versions", "", "| server | version | Python |", "|---|---|---|"]
    lines += [f"| {i['label']} | {i['version']} | {i.get('python') or ''} |" for i in r["servers"].values()]
    return "\n".join(lines) + "\n"


def update_docs(result, path):
    """Replace the text between the results markers of docs/benchmarks.md."""
    with open(path) as f:
        doc = f.read()
    head, rest = doc.split(DOCS_START, 1)
    _, tail = rest.split(DOCS_END, 1)
    with open(path, "w") as f:
        f.write(head + DOCS_START + "\n" + docs_section(result) + DOCS_END + tail)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--docs":
        with open(sys.argv[2]) as f:
            update_docs(json.load(f), sys.argv[3])
        sys.exit(0)
    if len(sys.argv) == 4 and sys.argv[1] == "--plots":
        with open(sys.argv[2]) as f:
            res = json.load(f)
        for p in plots(res, sys.argv[3]):
            print(p)
    elif len(sys.argv) == 2:
        with open(sys.argv[1]) as f:
            res = json.load(f)
        sys.stdout.write(markdown(res))
    else:
        sys.exit("usage: report.py RESULT.json | report.py --plots RESULT.json OUTDIR"
                 " | report.py --docs RESULT.json docs/benchmarks.md")
