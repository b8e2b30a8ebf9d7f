"""--user and --group: a worker process gives up root before it imports or serves anything.

The supervisor stays as it was started (root): it made the listening sockets, privileged ports
and Unix socket files included, before forking, and it needs root again for the next worker it
forks (a replacement, a reload). A worker switches right after the fork: supplementary groups
first (the user's own, as initgroups(3) gives them, or none), then the group, then the user, in
that order because once the user is switched the process may no longer change the others."""

from __future__ import annotations

import importlib
import os

__all__ = ["drop_privileges"]


def drop_privileges(owner: tuple[int, int, str | None]) -> None:
    """Switch this process to (uid, gid, user name or None) for good: real, effective and saved
    ids alike, so that nothing can switch back. OSError when the system refuses."""
    uid, gid, name = owner
    # What the import system loads lazily comes from the interpreter's own files, which the new
    # user may not be allowed to read (an interpreter under a home of mode 0700, as pyenv's):
    # CPython 3.13's invalidate_caches() imports importlib.metadata, and a --no-preload worker
    # calls it before importing the app. Load it while this process still can.
    importlib.invalidate_caches()
    if os.geteuid() == 0:
        if name is not None:
            os.initgroups(name, gid)
        else:
            os.setgroups([gid])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
