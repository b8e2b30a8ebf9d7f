"""The Python API of the coroutine runtime (cyserve._core.Scheduler, and the benchmark entry
points in cyserve._testhooks): argument checking, lifecycle, exact step counts, and the shape of
the measurements.
Timing is never asserted; the benchmark (bench/coro/run.py) reports it."""

from __future__ import annotations

import time

import pytest

from cyserve import _core, _testhooks

pytestmark = pytest.mark.native


def wait_for(pred, limit_s=60.0):
    """Poll pred() until it is true; a bound against hanging, not a timing assertion."""
    deadline = time.monotonic() + limit_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.mark.parametrize("workers", [-1, 1025])
def test_bad_worker_count(workers):
    with pytest.raises(ValueError, match="workers"):
        _core.Scheduler(workers=workers)


@pytest.mark.parametrize("workers", [1.5, "2", None, True])
def test_worker_count_type(workers):
    with pytest.raises(TypeError, match="workers"):
        _core.Scheduler(workers=workers)


@pytest.mark.parametrize("size", [0, 16 * 1024 - 1, 256 * 1024 * 1024 + 1])
def test_bad_stack_size(size):
    with pytest.raises(ValueError, match="stack_size"):
        _core.Scheduler(stack_size=size)


@pytest.mark.parametrize("cap", [0, 1, 3, 100])
def test_bad_runq_capacity(cap):
    with pytest.raises(ValueError, match="runq_capacity"):
        _core.Scheduler(runq_capacity=cap)


def test_bench_functions_check_arguments():
    with pytest.raises(ValueError, match="workers"):
        _testhooks.bench_empty(-1, 10)
    with pytest.raises(ValueError, match="stack_size"):
        _testhooks.bench_empty(1, 10, 1024)
    with pytest.raises(ValueError, match="workers"):
        _testhooks.parked_cpu(2000, 0.01)


def test_default_workers():
    import os

    s = _core.Scheduler()
    assert s.workers == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("workers,cap,randomize", [(1, 256, False), (2, 256, False),
                                                   (3, 4, True)])
def test_lifecycle_and_exact_steps(workers, cap, randomize):
    s = _core.Scheduler(workers=workers, runq_capacity=cap, randomize=randomize)
    assert s.workers == workers
    s.start()
    s.spawn_yielders(200, yields=9)
    s.spawn_yielders(50)
    assert wait_for(lambda: s.stats()["finished"] == 250)
    st = s.stats()
    assert st["spawned"] == 250
    assert st["steps"] == 200 * 10 + 50
    s.stop()
    s.join()
    with pytest.raises(RuntimeError, match="stopped"):
        s.spawn_yielders(1)
    with pytest.raises(RuntimeError, match="stopped"):
        s.start()


def test_stop_with_coroutines_running():
    s = _core.Scheduler(workers=2)
    s.start()
    s.spawn_yielders(1000, yields=1000)
    s.stop()
    s.join()
    st = s.stats()
    # Every coroutine either finished its loop or saw -ECANCELED and returned: none is left.
    assert st["finished"] == st["spawned"] == 1000


def test_dealloc_without_stop_is_clean():
    s = _core.Scheduler(workers=2)
    s.start()
    s.spawn_yielders(10, yields=3)
    del s  # __dealloc__ stops and joins the workers


def test_bench_empty_shape():
    r = _testhooks.bench_empty(2, 1000)
    assert set(r) == {"spawn_s", "run_s", "total_s"}
    assert all(v >= 0 for v in r.values())
    assert r["total_s"] >= r["spawn_s"] + r["run_s"]


def test_bench_fib_checksum():
    # Fibonacci(100) mod 2**32 computed in Python, summed over 10 coroutines.
    a, b = 0, 1
    for _ in range(100):
        a, b = b, (a + b) % 2**32
    for workers in (1, 2):
        r = _testhooks.bench_fib(workers, 10, 100)
        assert r["checksum"] == 10 * a


def test_parked_cpu_shape():
    r = _testhooks.parked_cpu(2, 0.05)
    assert set(r) == {"cpu_s", "wall_s"}
    assert r["wall_s"] > 0 and r["cpu_s"] >= 0
