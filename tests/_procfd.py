"""The descriptors a process holds, read from /proc: what the tests that check for leaks count.

Counting every descriptor of a process fails on any that another thread opens meanwhile (the
test runner's, the engine's lazily made ones), so the tests count by what a descriptor is open
on; this is the one place that reads them."""

from __future__ import annotations

import os


def fd_targets(pid: int | str = "self") -> dict[int, str]:
    """Each open descriptor of process pid and what it is open on (a path, "socket:[N]",
    "pipe:[N]", "anon_inode:[eventfd]", ...); empty when the process is gone. A descriptor
    closed between the listing and its reading (the listing's own among them) is left out."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    targets = {}
    for name in names:
        try:
            targets[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            pass
    return targets
