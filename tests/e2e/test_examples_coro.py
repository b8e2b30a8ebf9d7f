"""The cimport-able coroutine API from a separately compiled Cython module:
tests/cython_ext/coro_user.pyx is built against the package (cimport cyserve._core,
include_dirs=[get_include()]) into a temporary folder and run, and examples/coro/ builds and runs
the same way a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _cython_ext import build_user_module

TESTS = Path(__file__).parent.parent
ROOT = TESTS.parent


@pytest.fixture(scope="module")
def coro_user(tmp_path_factory):
    return build_user_module(TESTS / "cython_ext" / "coro_user.pyx",
                             tmp_path_factory.mktemp("coro_ext"))


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_exact_steps(coro_user, workers):
    results, nw = coro_user.run(workers, 300, 7)
    assert nw == workers
    assert len(results) == 300
    assert all(r == (8, 1, 1, 0) for r in results), [r for r in results if r != (8, 1, 1, 0)][:5]


def test_default_workers(coro_user):
    results, nw = coro_user.run(0, 10, 2)
    assert nw == len(os.sched_getaffinity(0))
    assert [r[0] for r in results] == [3] * 10


def test_sleeping_children(coro_user):
    assert coro_user.run_children(2, 200) == 200


def test_example_builds_and_runs(tmp_path):
    src = ROOT / "examples" / "coro"
    for name in ("ping.pyx", "build.py", "run.py"):
        shutil.copy(src / name, tmp_path / name)
    proc = subprocess.run([sys.executable, "build.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    proc = subprocess.run([sys.executable, "run.py", "--workers", "2", "--coroutines", "50",
                           "--rounds", "4"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "50 coroutines x 4 rounds: 200 steps" in proc.stdout
