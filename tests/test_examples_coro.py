"""The cimport-able coroutine API from a separately compiled Cython module:
tests/cython_ext/coro_user.pyx is built against the package (cimport cyserve._core,
include_dirs=[get_include()]) into a temporary folder and run, and examples/coro/ builds and runs
the same way a user would."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cyserve

HERE = Path(__file__).parent
ROOT = HERE.parent

BUILD = textwrap.dedent("""
    import sys
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    inc, pkg_parent = sys.argv[1], sys.argv[2]
    setup(name="coro-user",
          ext_modules=cythonize([Extension("coro_user", ["coro_user.pyx"], include_dirs=[inc])],
                                include_path=[pkg_parent], quiet=True,
                                compiler_directives={"language_level": "3"}),
          script_args=["-q", "build_ext", "--inplace"])
""")


@pytest.fixture(scope="module")
def coro_user(tmp_path_factory):
    d = tmp_path_factory.mktemp("coro_ext")
    shutil.copy(HERE / "cython_ext" / "coro_user.pyx", d / "coro_user.pyx")
    (d / "build_coro_user.py").write_text(BUILD)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(cyserve.__file__)))
    proc = subprocess.run([sys.executable, "build_coro_user.py", cyserve.get_include(),
                           pkg_parent], cwd=d, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"building coro_user.pyx failed:\n{proc.stdout}\n{proc.stderr}"
    so = next(d.glob("coro_user*.so"))
    spec = importlib.util.spec_from_file_location("coro_user", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
