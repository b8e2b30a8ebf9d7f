"""Builds the C unit tests in tests/c under the sanitizers and runs each binary as one test.

A binary passes when it exits 0, prints no "not ok" line and the sanitizers report nothing
(ASan/UBSan/TSan write their reports to stderr and make the process exit non-zero)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CDIR = Path(__file__).parent.parent / "c"
SOURCES = sorted(p.stem for p in CDIR.glob("test_*.c"))
TSAN_TESTS = {"test_sched", "test_runq", "test_router", "test_server", "test_metrics"}

CASES = [(name, "asan") for name in SOURCES] + [
    (name, "tsan") for name in SOURCES if name in TSAN_TESTS
]


@pytest.fixture(scope="session")
def c_build():
    jobs = str(os.cpu_count() or 2)
    proc = subprocess.run(["make", "-s", "-C", str(CDIR), "-j", jobs], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.fail(f"building the C tests failed:\n{proc.stdout}\n{proc.stderr}")
    return CDIR / "build"


# The first test's setup builds all the binaries (c_build): 22 sanitizer builds, more than the
# suite's 300 s on a 2-core machine busy with other builds, where every C test then errored on
# that timeout. Each binary's own run stays bounded below (240 s); this bound is the build's.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name,kind", CASES, ids=[f"{n}[{k}]" for n, k in CASES])
def test_c_unit(c_build, name, kind):
    binary = c_build / f"{name}.{kind}"
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    env["TSAN_OPTIONS"] = "halt_on_error=1:second_deadlock_stack=1"
    try:
        proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=240,
                              env=env, cwd=str(CDIR))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{binary.name} did not finish in {exc.timeout} s:\n{exc.stdout}")
    out = proc.stdout
    failed = [line for line in out.splitlines() if line.startswith("not ok")]
    report = f"{out}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode == 0, f"{binary.name} exited {proc.returncode}\n{report}"
    assert not failed, f"{binary.name}: {len(failed)} failed\n{report}"
    assert "1.." in out, f"{binary.name} printed no TAP plan\n{report}"
    print(out, file=sys.stderr)
