"""bench/soak.py in a short run: the mixed load runs, samples are taken, the report and the plot
are written, and nothing fails (no worker is killed in 15 s; `make soak` runs ten minutes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_soak_short_run(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--seconds", "15",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    verdict = report["verdict"]
    assert verdict["passed"] and verdict["failed"] == 0 and verdict["requests_ok"] > 100
    assert len(report["samples"]) >= 2
    assert (tmp_path / "plot.svg").read_text().startswith("<svg")
    assert "| s | RSS MiB" in (tmp_path / "report.md").read_text()
