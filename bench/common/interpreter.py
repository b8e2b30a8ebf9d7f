"""Which CPython the benchmark suite runs its Python servers on.

Every Python server of the suite (the peers, and cyserve's own rows) runs in bench/.venv, so all
of them run on one interpreter, which is chosen here:

- CYSERVE_BENCH_INTERPRETER (`make bench BENCH_PYTHON=...`) names it: a version ("3.13", looked
  up as below) or the path or command of an interpreter ("/usr/bin/python3"). When it cannot be
  found the run stops with a sentence saying so: a figure measured on another interpreter than
  the one asked for would be read as the one asked for.
- Otherwise CPython 3.12, the newest pyenv has ($PYENV_ROOT/versions/3.12.*), else python3.12
  on the PATH. 3.12 is what most deployments run, and it changed what an ASGI server can do
  (eager tasks) and what the peers cost.
- Otherwise the interpreter the runner itself was made from (the base of cyserve's .venv: on a
  fresh machine the system python3), and the run says so.

Stdlib only, like the rest of bench/common/."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

DEFAULT_VERSION = "3.12"
ENV = "CYSERVE_BENCH_INTERPRETER"

# "free_threaded": how the interpreter was built (Py_GIL_DISABLED, a 3.13t/3.14t build); "gil":
# whether the GIL is on now, which a free-threaded build also allows (PYTHON_GIL=1, -X gil=1).
_PROBE = ("import json, platform, sys, sysconfig; print(json.dumps({'implementation': "
          "platform.python_implementation(), 'version': platform.python_version(), "
          "'major_minor': '%d.%d' % sys.version_info[:2], "
          "'free_threaded': bool(sysconfig.get_config_var('Py_GIL_DISABLED')), "
          "'gil': not hasattr(sys, '_is_gil_enabled') or sys._is_gil_enabled()}))")


class InterpreterError(Exception):
    """The interpreter asked for cannot be found or does not run."""


def describe(python):
    """{"implementation", "version", "major_minor", "free_threaded", "gil", "path"} of the interpreter `python`
    (a path), or None when it does not run."""
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    try:
        info = json.loads(r.stdout)
    except ValueError:
        return None
    info["path"] = python
    return info


def label(info):
    """"CPython 3.12.1", "CPython 3.14.0 free-threaded" for a free-threaded build (what the
    interpreter is, whatever runs on it), with " (GIL on)" when such a build was started with
    its GIL turned on; or "?". A description without "free_threaded" (recorded before it was
    probed) counts a GIL that was off as the free-threaded build it implies."""
    if not info:
        return "?"
    gil = info.get("gil", True)
    free_threaded = info.get("free_threaded", not gil)
    return f"{info['implementation']} {info['version']}" + (
        (" free-threaded" + (" (GIL on)" if gil else "")) if free_threaded else "")


def find_version(version):
    """The path of a CPython `version` ("3.12"): pyenv's newest 3.12.x, else python3.12 on the
    PATH; None when neither runs."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}"))

    def key(path):
        patch = os.path.basename(os.path.dirname(os.path.dirname(path)))[len(version) + 1:]
        return int(patch) if patch.isdigit() else -1
    # Only final releases (3.12.1, not 3.12.0rc1 or a 3.12t build's folder).
    found = sorted((p for p in found if key(p) >= 0), key=key, reverse=True)
    on_path = shutil.which(f"python{version}")
    for path in found + ([on_path] if on_path else []):
        info = describe(path)
        if info and info["major_minor"] == version:
            return path
    return None


def runner_base():
    """The interpreter the running Python was made from: a venv's base, else itself."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return base if os.path.exists(base) else sys.executable


def choose(environ=None):
    """(path, info, why): the interpreter bench/.venv is made from, its description, and one
    sentence saying how it was chosen. Raises InterpreterError when CYSERVE_BENCH_INTERPRETER
    names one that cannot be found or does not run."""
    environ = os.environ if environ is None else environ
    asked = (environ.get(ENV) or "").strip()
    if asked:
        if re.fullmatch(r"\d+\.\d+", asked):
            path = find_version(asked)
            if not path:
                raise InterpreterError(
                    f"{ENV}={asked}: no CPython {asked} in pyenv ({os.environ.get('PYENV_ROOT') or '~/.pyenv'}/"
                    f"versions/{asked}.*) or as python{asked} on the PATH")
        else:
            path = shutil.which(asked) or (asked if os.path.exists(asked) else None)
            if not path:
                raise InterpreterError(f"{ENV}={asked}: no such interpreter (neither a file nor a command "
                                       "on the PATH; give a version such as 3.13, or a path)")
        info = describe(path)
        if not info:
            raise InterpreterError(f"{ENV}={asked}: {path} does not run as a Python interpreter")
        return path, info, f"chosen by {ENV}={asked}"
    path = find_version(DEFAULT_VERSION)
    if path:
        return path, describe(path), f"the default, CPython {DEFAULT_VERSION}"
    path = runner_base()
    info = describe(path)
    if not info:
        raise InterpreterError(f"no CPython {DEFAULT_VERSION} found, and {path} does not run")
    return path, info, (f"no CPython {DEFAULT_VERSION} in pyenv or on the PATH: falling back to the "
                        "interpreter the runner was made from")


def venv_info(venv):
    """The description of the interpreter of the virtual environment `venv`, or None."""
    python = os.path.join(venv, "bin", "python")
    return describe(python) if os.path.exists(python) else None
