"""--reload: which files under the watched folders changed (the .py files, and those that
--reload-include names, less those --reload-exclude names), asked by the supervisor's main
loop between its other duties (supervisor.py turns a change into a SIGHUP reload: the new
workers serve before the old ones stop, so a development server loses nothing either).

Asked, not a thread that calls back: the supervisor forks its workers, and a thread of ours
running at a fork could hold a lock (the import lock, a logging handler's) that the child then
finds taken forever. With watchfiles installed, its watcher (inotify, from its own native
thread, which takes no Python lock) is asked without blocking; without it, the folders are
walked at most every --reload-delay seconds (POLL_SECONDS by default) and each file's
modification time and size compared.
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["Watcher", "POLL_SECONDS", "watched"]

POLL_SECONDS = 0.5
# Folders never worth watching: caches, version control, virtual environments.
_SKIP_DIRS = ("__pycache__", "node_modules", "site-packages")
# Always watched, as uvicorn does; --reload-exclude '*.py' takes them out again.
_DEFAULT_INCLUDES = ("*.py",)


def watched(relpath: str, includes: Sequence[str], excludes: Sequence[str]) -> bool:
    """Whether a file, by its path below a watched folder ('/' between parts), counts: its name
    or that path matches a pattern of ``includes`` (or is a .py file) and none of
    ``excludes``."""
    name = relpath.rsplit("/", 1)[-1]

    def hit(patterns: Sequence[str]) -> bool:
        return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(relpath, p)
                   for p in patterns)

    return hit(_DEFAULT_INCLUDES + tuple(includes)) and not hit(excludes)


class Watcher:
    """The files under ``dirs`` that changed (written, made or removed) since the last ask:
    the .py files and those ``includes`` names, less those ``excludes`` names (glob patterns,
    see ``watched``)."""

    def __init__(self, dirs: Sequence[str], includes: Sequence[str] = (),
                 excludes: Sequence[str] = (), delay: float = POLL_SECONDS, *,
                 use_watchfiles: bool = True) -> None:
        self.dirs = [os.path.abspath(d) for d in dirs]
        self.includes = tuple(includes)
        self.excludes = tuple(excludes)
        self.delay = delay
        self._events: Iterator[Any] | None = None
        self._pending: list[str] = []
        self.uses = "polling"
        try:
            if not use_watchfiles:
                raise ImportError
            import watchfiles  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            self._snapshot = self._scan()
            self._last = time.monotonic()
        else:
            # Short waits: the supervisor's loop must not block on the watcher. rust_timeout is
            # in milliseconds; yield_on_timeout makes an empty answer instead of waiting.
            # debounce gathers the changes of --reload-delay into one answer.
            self._events = iter(watchfiles.watch(*self.dirs,
                                                 watch_filter=self._filter,
                                                 debounce=max(1, int(delay * 1000)), step=10,
                                                 rust_timeout=1, yield_on_timeout=True,
                                                 raise_interrupt=False))
            # The generator makes its inotify watcher on its first step, not here: a file
            # written before the supervisor first asked (its workers still starting, or the
            # machine busy) was never reported. One step now starts the watcher; what that
            # step saw is kept for the first ask.
            self._pending = self._next_changes()
            self.uses = "watchfiles"

    def _relative(self, path: str) -> str | None:
        """``path`` below the watched folder it is in, '/' between parts; None when it is
        inside a folder never watched."""
        for top in self.dirs:
            if path.startswith(top + os.sep):
                parts = os.path.relpath(path, top).split(os.sep)
                if any(p.startswith(".") or p in _SKIP_DIRS for p in parts[:-1]):
                    return None
                return "/".join(parts)
        return None

    def _filter(self, change: Any, path: str) -> bool:
        rel = self._relative(path)
        return rel is not None and watched(rel, self.includes, self.excludes)

    def _next_changes(self) -> list[str]:
        assert self._events is not None
        try:
            return sorted({path for _, path in next(self._events)})
        except StopIteration:
            self._events = None
            return []

    def changed(self) -> list[str]:
        if self._events is not None:
            got = self._pending + self._next_changes()
            self._pending = []
            return sorted(set(got))
        now = time.monotonic()
        if now - self._last < self.delay:
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
                    path = os.path.join(folder, name)
                    rel = os.path.relpath(path, top).replace(os.sep, "/")
                    if watched(rel, self.includes, self.excludes):
                        try:
                            st = os.stat(path)
                        except OSError:
                            continue  # removed while walking: the next scan says so
                        seen[path] = (st.st_mtime_ns, st.st_size)
        return seen
