"""A short run of the network fuzzer (fuzz/net/fuzz_net.py) against a whole server: mutated
requests in random write splits, half-closes and resets, with a watchdog on /plaintext. In the
sanitizer stage of `make test` the server is the ASan/UBSan build (the environment, LD_PRELOAD
included, is passed on). `make fuzz-net` runs it for ten minutes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.native

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_network_fuzzing_short_run() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "fuzz" / "net" / "fuzz_net.py"),
                           "--seconds", "8", "--clients", "3"],
                          capture_output=True, text=True, timeout=170, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # It did send inputs and got answers (a run that sent nothing would prove nothing).
    assert " inputs in " in proc.stdout and " 400 " in proc.stdout, proc.stdout
