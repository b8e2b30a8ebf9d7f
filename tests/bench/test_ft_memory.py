"""bench/http/ft_memory.py: the floor it measures a server against (no server, the same imports
and work, the server's process model), and that it leaves no process behind."""

from __future__ import annotations

import sys
import time

import pytest

from bench.common.procfs import process_tree, tree_threads
from bench.http.ft_memory import detail, floor_process


def _alive(pid: int) -> bool:
    """Running, not only a zombie waiting to be reaped (an orphan's parent is init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_threads_floor_is_one_process_whose_threads_stay() -> None:
    # The free-threaded side's model: one process, the main thread and N threads that did the
    # work and are still there when the memory is read (as workers are).
    with floor_process(sys.executable, "wsgi", 3, True, ["/plaintext"], 2) as proc:
        tree = process_tree(proc.pid)
        assert tree == [proc.pid]
        assert tree_threads(proc.pid) == 4
    assert _gone(tree)


def test_processes_floor_forks_n_children_of_the_importing_parent() -> None:
    with floor_process(sys.executable, "wsgi", 2, False, ["/plaintext"], 2) as proc:
        tree = process_tree(proc.pid)
        assert len(tree) == 3
        assert "threads {" in detail(proc.pid)
    assert _gone(tree)


def test_processes_floor_of_one_forks_nothing() -> None:
    # `--processes 1` serves from one process: its floor is one process too.
    with floor_process(sys.executable, "wsgi", 1, False, ["/plaintext"], 2) as proc:
        assert process_tree(proc.pid) == [proc.pid]


def test_a_route_that_fails_fails_the_floor() -> None:
    # The floor must have done the same work as the server: a path that does not answer 200
    # (here one that does not exist) is an error, not a lower floor.
    with pytest.raises(RuntimeError, match="floor's program failed"):
        with floor_process(sys.executable, "wsgi", 2, True, ["/no-such-route"], 1):
            pass
