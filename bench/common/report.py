"""Markdown that every driver's report writes the same way: a figure, a median with its spread
(bench/common/stats.py's spread()), and a table of flat rows.

Stdlib only, like the rest of bench/common/."""

import json


def num(v, fmt="{:,.0f}"):
    """v formatted, or an empty cell for None."""
    return "" if v is None else fmt.format(v)


def cell(st, fmt="{:,.0f}", spread=True):
    """A spread() as "median (min–max)"; the median alone with spread=False or one value; an
    empty cell for None."""
    if not st:
        return ""
    s = fmt.format(st["median"])
    if spread and st["n"] > 1:
        s += f" ({fmt.format(st['min'])}–{fmt.format(st['max'])})"
    return s


def table(data):
    """Markdown lines for data whose shape is not known in advance: a list of flat dicts (or a
    dict of them, or a dict holding one under "results") becomes a table with a column per scalar
    key, in order of appearance; anything else a JSON block."""
    rows = data.get("results") if isinstance(data, dict) else data
    if isinstance(rows, dict):
        rows = [dict(name=k, **v) if isinstance(v, dict) else {"name": k, "value": v} for k, v in rows.items()]
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return ["```", json.dumps(data, indent=1)[:3000], "```"]
    cols = []
    for r in rows:
        cols += [k for k in r if k not in cols and not isinstance(r[k], (dict, list))]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return out
