"""bench/common/procfs.py: the memory sums the benchmarks report."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.common.procfs import process_tree, tree_pss_kib, tree_rss_kib


def test_pss_counts_pages_shared_by_a_fork_once() -> None:
    # A child that touches 64 MiB, forks, and waits: RSS sums the block twice, PSS once.
    code = ("import os, sys, time\n"
            "b = bytearray(64 << 20)\n"
            "for i in range(0, len(b), 4096): b[i] = 1\n"
            "if os.fork() == 0:\n"
            "    time.sleep(30); os._exit(0)\n"
            "print('ready', flush=True); time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while len(process_tree(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(process_tree(proc.pid)) == 2
        rss, pss = tree_rss_kib(proc.pid), tree_pss_kib(proc.pid)
        assert rss >= 2 * 64 * 1024, rss
        assert 64 * 1024 <= pss < rss - 48 * 1024, (pss, rss)
    finally:
        for pid in process_tree(proc.pid)[1:]:
            os.kill(pid, 9)
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
