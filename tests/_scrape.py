"""Reading cyserve's metrics endpoint in tests: one scrape parsed by prometheus_client (a real
Prometheus-format parser), and the connection states it reports."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from _served import TIMEOUT

STATES = ("idle", "active", "python")


def scrape(port: int) -> dict[str, float]:
    """Every sample of the endpoint, by name and labels ("name{k=v,...}", labels sorted)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def states(mport: int) -> tuple[int, ...]:
    """The open connections by state (STATES' order); the states split the open ones."""
    m = scrape(mport)
    got = tuple(int(m[f"cyserve_connections{{state={s}}}"]) for s in STATES)
    assert sum(got) == m["cyserve_open_connections"], m
    return got
