"""--reload: which .py files under the watched folders changed, asked by the supervisor's main
loop between its other duties (supervisor.py turns a change into a SIGHUP reload: the new
workers serve before the old ones stop, so a development server loses nothing either).

Asked, not a thread that calls back: the supervisor forks its workers, and a thread of ours
running at a fork could hold a lock (the import lock, a logging handler's) that the child then
finds taken forever. With watchfiles installed, its watcher (inotify, from its own native
thread, which takes no Python lock) is asked without blocking; without it, the folders are
walked at most every POLL_SECONDS and each file's modification time and size compared.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["Watcher", "POLL_SECONDS"]

POLL_SECONDS = 0.5
# Folders never worth watching: caches, version control, virtual environments.
_SKIP_DIRS = ("__pycache__", "node_modules", "site-packages")


class Watcher:
    """The .py files under ``dirs`` that changed (written, made or removed) since the last
    ask."""

    def __init__(self, dirs: Sequence[str]) -> None:
        self.dirs = [os.path.abspath(d) for d in dirs]
        self._events: Iterator[Any] | None = None
        self.uses = "polling"
        try:
            import watchfiles  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            self._snapshot = self._scan()
            self._last = time.monotonic()
        else:
            # Short waits: the supervisor's loop must not block on the watcher. rust_timeout is
            # in milliseconds; yield_on_timeout makes an empty answer instead of waiting.
            self._events = iter(watchfiles.watch(*self.dirs,
                                                 watch_filter=watchfiles.PythonFilter(),
                                                 debounce=50, step=10, rust_timeout=1,
                                                 yield_on_timeout=True, raise_interrupt=False))
            self.uses = "watchfiles"

    def changed(self) -> list[str]:
        if self._events is not None:
            try:
                return sorted({path for _, path in next(self._events)})
            except StopIteration:
                self._events = None
                return []
        now = time.monotonic()
        if now - self._last < POLL_SECONDS:
            return []
        self._last = now
        snapshot = self._scan()
        changed = sorted(p for p in snapshot.keys() | self._snapshot.keys()
                         if snapshot.get(p) != self._snapshot.get(p))
        self._snapshot = snapshot
        return changed

    def _scan(self) -> dict[str, tuple[int, int]]:
        seen: dict[str, tuple[int, int]] = {}
        for top in self.dirs:
            for folder, subdirs, files in os.walk(top):
                subdirs[:] = [d for d in subdirs
                              if not d.startswith(".") and d not in _SKIP_DIRS]
                for name in files:
                    if name.endswith(".py"):
                        path = os.path.join(folder, name)
                        try:
                            st = os.stat(path)
                        except OSError:
                            continue  # removed while walking: the next scan says so
                        seen[path] = (st.st_mtime_ns, st.st_size)
        return seen
