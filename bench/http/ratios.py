"""Per-round ratios of one server's figures over another's, from a result of bench/http/run.py.

    python bench/http/ratios.py RESULT.json A B [--mode pinned]

For every workload both servers ran, prints A ÷ B in each round (requests/s and requests per
server CPU-second), then the median over rounds. The two are measured in the same round, one
after the other, so a slow drift of a shared machine between rounds cancels out of each ratio;
what stays is the noise within a round, which every round shows (docs/benchmarks.md). Made for
A/Bs of one option, e.g. cyserve-static-metrics ÷ cyserve-static: the metrics' cost.
Standard library only.
"""

import argparse
import json
import statistics


def pair_ratios(result, a, b, mode="pinned"):
    """{workload: {"rps": [per-round ratios], "cpu": [...], "rounds": [round numbers]}} of a
    over b, for the rounds in which both were measured."""
    index = {(r["round"], r["workload"], r["server"]): r for r in result["runs"]
             if r["mode"] == mode and r["status"] == "ok"}
    out = {}
    for (rnd, w, server), ra in sorted(index.items()):
        if server != a:
            continue
        rb = index.get((rnd, w, b))
        if rb is None or not rb["rps"]:
            continue
        row = out.setdefault(w, {"rps": [], "cpu": [], "rounds": []})
        row["rounds"].append(rnd)
        row["rps"].append(ra["rps"] / rb["rps"])
        if ra.get("requests_per_cpu_s") and rb.get("requests_per_cpu_s"):
            row["cpu"].append(ra["requests_per_cpu_s"] / rb["requests_per_cpu_s"])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--mode", default="pinned")
    args = ap.parse_args(argv)
    with open(args.result) as f:
        result = json.load(f)
    load = result.get("machine", {})
    print(f"{args.a} ÷ {args.b}, {args.mode}; load average at start {load.get('loadavg_start')}, "
          f"at end {load.get('loadavg_end')}")
    pairs = pair_ratios(result, args.a, args.b, args.mode)
    if not pairs:
        print("no round measured both")
        return 1
    for w, row in pairs.items():
        for key, label in (("rps", "requests/s"), ("cpu", "per server CPU-second")):
            if row[key]:
                rounds = " ".join(f"{x:.3f}" for x in row[key])
                print(f"/{w} {label}: median {statistics.median(row[key]):.3f} ({rounds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
