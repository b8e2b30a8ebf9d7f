"""The worker's side of recycling (cyserve/supervisor.py, point 5): each worker draws its own
--max-requests and --max-lifetime from the jitter, within the documented range, and says once
on its pipe which limit it reached. The end-to-end tests (tests/e2e/test_lifecycle.py) pass the
jitter options but cannot see the limits they drew; here they are read one worker at a time."""

from __future__ import annotations

import os
import random
import types
from collections.abc import Iterator

import pytest

from cyserve import supervisor
from cyserve.config import Config


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    yield r, w
    os.close(r)
    os.close(w)


@pytest.fixture
def seeded() -> Iterator[None]:
    """Draws that are the same on every run, the generator left as it was found."""
    state = random.getstate()
    random.seed(17)
    yield
    random.setstate(state)


def said(r: int) -> bytes:
    try:
        return os.read(r, 64)
    except BlockingIOError:
        return b""


def drawn_request_limit(config: Config, pipe: tuple[int, int], highest: int) -> int:
    """The request count at which one new worker says "M" (its drawn --max-requests)."""
    r, w = pipe
    tick = supervisor._recycle_tick(config, w)
    assert tick is not None
    srv = types.SimpleNamespace(requests=0)
    while srv.requests <= highest:
        tick(srv)
        told = said(r)
        if told:
            assert told == b"M"
            srv.requests += 1000  # far past it: a worker says it once, whatever comes next
            tick(srv)
            assert said(r) == b""
            return srv.requests - 1000
        srv.requests += 1
    raise AssertionError(f"no limit up to {highest} requests")


def test_each_worker_draws_its_max_requests_within_the_jitter(
        pipe: tuple[int, int], seeded: None) -> None:
    config = Config(max_requests=100, max_requests_jitter=20)
    limits = [drawn_request_limit(config, pipe, 130) for _ in range(200)]
    assert min(limits) >= 100 and max(limits) <= 120, limits
    # Spread over the range, not one value for every worker: that is the jitter's purpose.
    assert len(set(limits)) >= 10, sorted(set(limits))


def test_without_jitter_every_worker_has_the_same_limit(pipe: tuple[int, int]) -> None:
    config = Config(max_requests=50)
    assert {drawn_request_limit(config, pipe, 60) for _ in range(20)} == {50}


def test_each_worker_draws_its_max_lifetime_within_the_jitter(
        pipe: tuple[int, int], seeded: None, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(supervisor, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    r, w = pipe
    config = Config(max_lifetime=10.0, max_lifetime_jitter=5.0)
    srv = types.SimpleNamespace(requests=0)
    lifetimes = []
    for _ in range(100):
        tick = supervisor._recycle_tick(config, w)
        assert tick is not None
        start = now[0]
        tick(srv)  # the first tick: the worker serves, its lifetime starts now
        while not said(r):
            now[0] += 0.05
            assert now[0] - start < 20, "no lifetime limit within 20 s"
            tick(srv)
        lifetimes.append(now[0] - start)
    # Each within 10..15 s (and one clock step, 0.05 s, past its drawn end).
    assert min(lifetimes) >= 10.0 and max(lifetimes) <= 15.0 + 0.05 + 1e-9, lifetimes
    assert max(lifetimes) - min(lifetimes) > 2.5, sorted(lifetimes)


def test_no_limit_means_no_tick() -> None:
    assert supervisor._recycle_tick(Config(), -1) is None
