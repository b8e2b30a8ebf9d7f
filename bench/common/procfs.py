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


def tree_threads(root):
    """How many threads root's tree has now (the Threads: line of each process's status)."""
    total = 0
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
        except (OSError, StopIteration):
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


# Where a process's anonymous memory lives, told apart by the shape of its mappings (smaps has no
# owner field). The shapes are those of the allocators a cyserve process on CPython runs:
# - mimalloc (CPython's object allocator on a free-threaded build, and its raw allocator there)
#   reserves its arenas 1 GiB at a time: any anonymous mapping of 256 MiB or more;
# - glibc malloc's main arena is [heap]; each further arena (one per thread that mallocs, up to
#   8 x cores unless MALLOC_ARENA_MAX says otherwise) is a 64 MiB reservation aligned on 64 MiB,
#   its used part readable and writable and the rest PROT_NONE;
# - a thread's stack (glibc's, 8 MiB by default) and a coroutine stack (csrc/coro.c) both sit
#   above a PROT_NONE guard page: 1 MiB or more is a thread's, less a coroutine's;
# - the rest (glibc's mmap'd large blocks, cyserve's coroutine slabs and buffers) is "other".
# A guessing game by nature: the total is exact, the split is as good as these shapes.
ANON_KINDS = ("mimalloc", "glibc_main", "glibc_arenas", "thread_stacks", "coro_stacks", "other")
_GLIBC_HEAP = 64 << 20


def anon_breakdown(smaps_text):
    """{kind: KiB of Rss} over the anonymous mappings of one /proc/PID/smaps text (kinds in
    ANON_KINDS, plus "main_stack"); file-backed mappings are left out."""
    maps = []  # (start, end, perms, name, rss_kib)
    for line in smaps_text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            maps.append([lo, hi, head[1], head[5].strip() if len(head) > 5 else "", 0])
        elif line.startswith("Rss:") and maps:
            maps[-1][4] = int(line.split()[1])
    out = dict.fromkeys(ANON_KINDS + ("main_stack",), 0)
    for i, (lo, hi, _perms, name, rss) in enumerate(maps):
        if name == "[heap]":
            out["glibc_main"] += rss
            continue
        if name == "[stack]":
            out["main_stack"] += rss
            continue
        if name or not rss:  # a file, [vdso] and the like; or nothing resident
            continue
        size = hi - lo
        prev = maps[i - 1] if i else None
        nxt = maps[i + 1] if i + 1 < len(maps) else None
        guarded = prev is not None and prev[1] == lo and prev[2].startswith("---")
        if size >= 256 << 20:
            kind = "mimalloc"
        elif lo % _GLIBC_HEAP == 0 and (size == _GLIBC_HEAP or (
                nxt is not None and nxt[0] == hi and nxt[2].startswith("---")
                and nxt[1] - lo == _GLIBC_HEAP)):
            kind = "glibc_arenas"
        elif guarded:
            kind = "thread_stacks" if size >= 1 << 20 else "coro_stacks"
        else:
            kind = "other"
        out[kind] += rss
    return out


def anon_breakdown_kib(pid):
    """anon_breakdown() of a live process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps") as f:
            return anon_breakdown(f.read())
    except OSError:
        return None


def rss_pss_kib(pid):
    """(VmRSS, Pss, Anonymous) of one process in KiB, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        pss = anon = 0
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith("Anonymous:"):
                    anon = int(line.split()[1])
    except (OSError, StopIteration):
        return None
    return rss, pss, anon
