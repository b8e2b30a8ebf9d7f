"""/proc: a process tree, its CPU time and its memory, and how busy the whole machine is.

Server CPU time is utime+stime of every process in the server's tree, read before and after a
run, plus the cutime+cstime of reaped children (a forking server's), so requests per server
CPU-second counts every cycle the server spent, in whatever process."""

import os
import threading
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _read_stat(pid):
    """(ppid, utime+stime, cutime+cstime) in ticks, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = data[data.rindex(b")") + 2:].split()
    # fields[0] is field 3 (state); utime is field 14, stime 15, cutime 16, cstime 17.
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def process_tree(root):
    """The pids of root and all its descendants that are alive now."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _read_stat(int(name))
        if st is not None:
            children.setdefault(st[0], []).append(int(name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def tree_cpu_seconds(root):
    """CPU seconds (user+system) used so far by root's tree, reaped children included.

    A descendant that exits between two samples takes its time with it unless its parent reaps
    it (then it moves into the parent's cutime); servers here reap their workers, so the loss is
    limited to processes that die unreaped, which none of the measured servers leave behind."""
    total = 0
    for pid in process_tree(root):
        st = _read_stat(pid)
        if st is not None:
            total += st[1] + st[2]
    return total / CLK_TCK


def tree_rss_kib(root):
    """Sum of VmRSS over root's tree, in KiB (shared pages counted once per process)."""
    total = 0
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total


def tree_pss_kib(root):
    """Sum of Pss over root's tree, in KiB: a page shared by k processes counts 1/k in each, so
    the sum is the tree's own memory once (forked workers sharing the interpreter and the
    modules imported before the fork are not counted once per worker, as the RSS sum does)."""
    total = 0
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total


class RssSampler:
    """Samples tree_rss_kib(root) every `interval` seconds in a thread; .peak is the largest."""

    def __init__(self, root, interval=0.2):
        self.root, self.interval, self.peak = root, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            self.peak = max(self.peak, tree_rss_kib(self.root))
            if self._stop.wait(self.interval):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss_kib(self.root))


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all CPUs, not idle or iowait) since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_busy_share(window_s: float = 2.0) -> float | None:
    """The share of all CPUs that was busy (not idle or iowait) over window_s, from /proc/stat:
    what other processes are taking from the machine right now. None where /proc is missing."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields[:8]), idle
    try:
        total0, idle0 = sample()
        time.sleep(window_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 == total0:
        return 0.0
    return 1.0 - (idle1 - idle0) / (total1 - total0)
