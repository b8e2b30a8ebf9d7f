"""bench/common/procfs.py: the memory sums the benchmarks report."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.common.procfs import (anon_breakdown, anon_breakdown_kib, process_tree, tree_pss_kib,
                                 tree_rss_kib, tree_threads)


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


def _smaps(*maps: tuple[int, int, str, str, int]) -> str:
    out = []
    for lo, hi, perms, name, rss in maps:
        out.append(f"{lo:x}-{hi:x} {perms} 00000000 00:00 0 {name}".rstrip())
        out.append(f"Size: {(hi - lo) >> 10} kB")
        out.append(f"Rss: {rss} kB")
    return "\n".join(out) + "\n"


def test_anon_breakdown_tells_the_allocators_apart_by_their_mappings() -> None:
    mib = 1 << 20
    text = _smaps(
        (0x400000, 0x401000, "r-xp", "/usr/bin/python3", 4),  # a file: not counted
        (0x1000000, 0x1100000, "rw-p", "[heap]", 900),  # glibc's main arena
        (0x7f0040000000, 0x7f0040000000 + 1024 * mib, "rw-p", "", 5000),  # a mimalloc arena
        (0x7f0100000000, 0x7f0100000000 + 2 * mib, "rw-p", "", 1200),  # a glibc arena's used part
        (0x7f0100000000 + 2 * mib, 0x7f0104000000, "---p", "", 0),  # ... and its reserve
        (0x7f0200000000, 0x7f0200001000, "---p", "", 0),  # a guard page
        (0x7f0200001000, 0x7f0200801000, "rw-p", "", 40),  # a thread's 8 MiB stack
        (0x7f0300000000, 0x7f0300001000, "---p", "", 0),  # a guard page
        (0x7f0300001000, 0x7f0300042000, "rw-p", "", 12),  # a coroutine's stack
        (0x7f0400000000, 0x7f0400200000, "rw-p", "", 300),  # anything else
        (0x7ffc00000000, 0x7ffc00021000, "rw-p", "[stack]", 20))
    assert anon_breakdown(text) == {"mimalloc": 5000, "glibc_main": 900, "glibc_arenas": 1200,
                                    "thread_stacks": 40, "coro_stacks": 12, "other": 300,
                                    "main_stack": 20}


def test_anon_breakdown_and_threads_of_a_live_process() -> None:
    split = anon_breakdown_kib(os.getpid())
    assert split is not None and sum(split.values()) > 0
    assert tree_threads(os.getpid()) >= 1
    assert anon_breakdown_kib(2 ** 22 + 12345) is None  # no such process
