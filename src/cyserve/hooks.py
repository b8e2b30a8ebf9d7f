"""Server hooks, as gunicorn calls them: functions of a Python configuration file
(``--config FILE.py``) or keyword arguments of ``cyserve.run`` and ``Config``.

    on_starting(server)          before anything is bound (the supervisor, or the one process)
    when_ready(server)           once the server serves: with a supervisor, once its first
                                 workers all answer (they make the TCP listeners themselves)
    post_fork(server, worker)    in each new worker process, right after the fork (and after
                                 --user/--group took effect), before it imports or serves
    worker_exit(server, worker)  in the worker process, once it has stopped serving
    on_exit(server)              last, once every worker has stopped

``server`` is a HookServer (pid: the supervisor's, or the one process's; config: the Config;
log: the "cyserve" logger; worker_pids: the worker processes alive when the hook is called,
in the supervisor). ``worker`` is a HookWorker (pid, ppid: the supervisor's, age: 1 for the
first worker started, 2 for the next ..., config, log). post_fork and worker_exit need worker
processes: a configuration that has either runs its worker under a supervisor even with one
process.

There is no per-request hook (gunicorn's pre_request and post_request): most requests are
answered by the engine in C without entering Python at all (static and file routes, GIL-free
handlers, the health path), and the others would pay a Python call each; a WSGI or ASGI
middleware, or a handler's own code, does it where it is wanted.

A hook that raises has its traceback printed. In on_starting it stops the command before
anything is bound (HookError); in post_fork the worker exits with status 1 and is replaced as a
worker that failed to start; in the others the server goes on.
"""

from __future__ import annotations

import inspect
import logging
import os
import traceback
from collections.abc import Callable
from typing import Any

from .errors import ConfigError, CyserveError

__all__ = ["HOOKS", "HookError", "HookServer", "HookWorker", "call_hook", "check_hook",
           "hook_refusal"]

# The hooks cyserve calls, with how many arguments each takes.
HOOKS = {"on_starting": 1, "when_ready": 1, "post_fork": 2, "worker_exit": 2, "on_exit": 1}
# gunicorn's other hooks: a Python configuration file that defines one is told it is not called.
_GUNICORN_ONLY = ("on_reload", "pre_fork", "post_worker_init", "worker_int", "worker_abort",
                  "pre_exec", "child_exit", "nworkers_changed", "ssl_context",
                  "pre_request", "post_request")

log = logging.getLogger("cyserve")


class HookError(CyserveError):
    """A hook that must succeed (on_starting) raised; the message names it."""


class HookServer:
    """The ``server`` argument of every hook."""

    def __init__(self, config: Any, pid: int | None = None) -> None:
        self.config = config
        self.pid = os.getpid() if pid is None else pid
        self.log = log
        self.worker_pids: list[int] = []

    def __repr__(self) -> str:
        return f"<cyserve server pid {self.pid}>"


class HookWorker:
    """The ``worker`` argument of post_fork and worker_exit."""

    def __init__(self, config: Any, age: int, ppid: int) -> None:
        self.config = config
        self.pid = os.getpid()
        self.ppid = ppid
        self.age = age
        self.log = log

    def __repr__(self) -> str:
        return f"<cyserve worker {self.age} pid {self.pid}>"


def hook_refusal(name: str) -> str | None:
    """Why a Python configuration file may not define ``name``, or None when it may (a hook
    cyserve calls, or not a hook at all)."""
    if name in ("pre_request", "post_request"):
        return (f"{name}: cyserve calls no per-request hook: most requests are answered in C "
                "without entering Python (a WSGI or ASGI middleware can do it)")
    if name in _GUNICORN_ONLY:
        return (f"{name}: a gunicorn hook that cyserve does not call (it calls "
                + ", ".join(HOOKS) + ")")
    return None


def check_hook(name: str, fn: object) -> None:
    """ConfigError unless ``fn`` can be called with the arguments of hook ``name``."""
    if not callable(fn):
        raise ConfigError(name, repr(fn), "must be a function")
    try:
        inspect.signature(fn).bind(*range(HOOKS[name]))
    except TypeError:
        args = "(server)" if HOOKS[name] == 1 else "(server, worker)"
        raise ConfigError(name, getattr(fn, "__qualname__", repr(fn)),
                          f"must take {args}") from None
    except ValueError:  # no signature to read (a builtin): trust it
        pass


def call_hook(config: Any, name: str, *args: Any, must: bool = False) -> None:
    """Call hook ``name`` of ``config`` (if it has one) with ``args``. Its exception is printed
    with its traceback, then raised as HookError when ``must``, else swallowed."""
    fn: Callable[..., Any] | None = getattr(config, name, None)
    if fn is None:
        return
    try:
        fn(*args)
    except Exception as exc:
        traceback.print_exc()
        if must:
            raise HookError(f"the {name} hook failed: {type(exc).__name__}: {exc}") from exc
        log.error("the %s hook failed: %s: %s", name, type(exc).__name__, exc)
