"""The benchmark suite's choice of interpreter (bench/common/interpreter.py) and how the runner
remakes bench/.venv and builds cyserve for it (bench/http/run.py).

Nothing is installed: the interpreters are this one and small shell scripts standing in for
others, and the runner's venv and build steps run against a temporary bench folder."""

import os
import platform
import stat
import sys
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench.common import interpreter  # noqa: E402

# This interpreter's label, from what it is: a free-threaded build (3.14t) says so, since a
# figure measured on one is not comparable with one measured on the GIL build of its version.
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
GIL_NOW = not hasattr(sys, "_is_gil_enabled") or sys._is_gil_enabled()
THIS = f"CPython {platform.python_version()}" + (
    (" free-threaded" + (" (GIL on)" if GIL_NOW else "")) if FREE_THREADED else "")
MM = "%d.%d" % sys.version_info[:2]


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _fake_pyenv(tmp_path, versions):
    """A PYENV_ROOT whose versions/X/bin/pythonM.m run this interpreter, for each X in versions
    (so each "is" this interpreter's version: only the folder name differs)."""
    root = tmp_path / "pyenv"
    for v in versions:
        mm = ".".join(v.split(".")[:2])
        b = root / "versions" / v / "bin"
        b.mkdir(parents=True)
        _script(b / f"python{mm}", f'exec "{sys.executable}" "$@"\n')
    return str(root)


def test_describe_and_label_this_interpreter(monkeypatch):
    # The probe runs a fresh interpreter: its GIL is this one's at start (PYTHON_GIL as here).
    info = interpreter.describe(sys.executable)
    assert info["version"] == platform.python_version() and info["major_minor"] == MM
    assert info["free_threaded"] is FREE_THREADED
    assert interpreter.label(info) == THIS
    assert interpreter.describe("/nonexistent/python") is None
    assert interpreter.label(None) == "?"
    # Started with its GIL on (a GIL build ignores PYTHON_GIL=1): still the build it is.
    monkeypatch.setenv("PYTHON_GIL", "1")
    info = interpreter.describe(sys.executable)
    assert info["gil"] is True and info["free_threaded"] is FREE_THREADED
    assert interpreter.label(info) == f"CPython {platform.python_version()}" + (
        " free-threaded (GIL on)" if FREE_THREADED else "")


@pytest.mark.parametrize("info, said", [
    ({"free_threaded": False, "gil": True}, "CPython 3.14.0"),
    ({"free_threaded": True, "gil": False}, "CPython 3.14.0 free-threaded"),
    ({"free_threaded": True, "gil": True}, "CPython 3.14.0 free-threaded (GIL on)"),
    # Described before the build was probed: a GIL that was off means a free-threaded build.
    ({"gil": True}, "CPython 3.14.0"),
    ({"gil": False}, "CPython 3.14.0 free-threaded"),
])
def test_the_label_names_a_free_threaded_build_whatever_its_gil_does(info, said):
    assert interpreter.label({"implementation": "CPython", "version": "3.14.0", **info}) == said


def test_a_version_is_found_in_pyenv_newest_patch_first(tmp_path, monkeypatch):
    root = _fake_pyenv(tmp_path, [f"{MM}.2", f"{MM}.10", f"{MM}.0rc1"])
    monkeypatch.setenv("PYENV_ROOT", root)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    path, info, how = interpreter.choose({interpreter.ENV: MM})
    assert path == os.path.join(root, "versions", f"{MM}.10", "bin", f"python{MM}")
    assert info["major_minor"] == MM and how == f"chosen by {interpreter.ENV}={MM}"


def test_the_default_is_3_12_and_without_it_the_runners_own(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    # A pyenv with a 3.12 folder whose interpreter reports another version is not taken for 3.12.
    monkeypatch.setenv("PYENV_ROOT", _fake_pyenv(tmp_path, ["3.12.9"]))
    if MM == "3.12":
        path, info, how = interpreter.choose({})
        assert how == "the default, CPython 3.12" and path.endswith("3.12.9/bin/python3.12")
    else:
        path, info, how = interpreter.choose({})
        assert how.startswith("no CPython 3.12 in pyenv or on the PATH: falling back")
        assert path == interpreter.runner_base() and info["major_minor"] == MM


@pytest.mark.parametrize("asked, message", [
    ("3.99", "no CPython 3.99 in pyenv"),
    ("/nonexistent/python3", "no such interpreter"),
    ("no-such-command-here", "no such interpreter"),
])
def test_an_interpreter_that_cannot_be_found_is_an_error(asked, message, tmp_path, monkeypatch):
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    with pytest.raises(interpreter.InterpreterError, match=message):
        interpreter.choose({interpreter.ENV: asked})


def test_a_file_that_is_no_interpreter_is_an_error(tmp_path):
    bad = _script(tmp_path / "python", "echo not python; exit 3\n")
    with pytest.raises(interpreter.InterpreterError, match="does not run as a Python interpreter"):
        interpreter.choose({interpreter.ENV: bad})
    with pytest.raises(interpreter.InterpreterError):
        interpreter.choose({interpreter.ENV: str(tmp_path / "missing")})


@pytest.fixture
def bench_dir(tmp_path, monkeypatch):
    """The runner's setup pointed at a temporary bench/ (its .venv, its requirements) with no
    CYSERVE_BENCH_PYTHON, and pip and venv replaced by recorders."""
    monkeypatch.delenv("CYSERVE_BENCH_PYTHON", raising=False)
    from bench.http import run
    from bench.http import servers as S
    venv = tmp_path / ".venv"
    monkeypatch.setattr(S, "VENV", str(venv))
    monkeypatch.setattr(S, "VENV_PY", str(venv / "bin" / "python"))
    monkeypatch.setattr(run, "BENCH", str(tmp_path))
    (tmp_path / "peers" / "python").mkdir(parents=True)
    (tmp_path / "peers" / "python" / "requirements.txt").write_text("# nothing\n")
    calls = []

    def sh(argv, **kw):
        calls.append(list(argv))

        class R:
            returncode, stdout, stderr = 0, "", ""
        if argv[1:3] == ["-m", "venv"]:
            # A venv whose python is the interpreter it was made from, as `-m venv` makes it.
            (venv / "bin").mkdir(parents=True)
            os.symlink(argv[0], venv / "bin" / "python")
        elif argv[1:2] == ["-c"]:
            R.stdout = str(tmp_path / "site") + "\n"
            (tmp_path / "site").mkdir(exist_ok=True)
        return R
    monkeypatch.setattr(run, "sh", sh)
    return run, venv, calls


def test_setup_makes_bench_venv_on_the_chosen_interpreter_and_remakes_another(
        bench_dir, monkeypatch, capsys):
    run, venv, calls = bench_dir
    monkeypatch.setenv(interpreter.ENV, sys.executable)
    # A bench/.venv made from another interpreter (a stand-in that says it is CPython 3.0.1).
    (venv / "bin").mkdir(parents=True)
    _script(venv / "bin" / "python", 'echo \'{"implementation": "CPython", "version": "3.0.1", '
                                     '"major_minor": "3.0", "gil": true}\'\n')
    (venv / "stale-file").write_text("x")
    run.setup_venv([])
    out = capsys.readouterr().out
    assert f"the Python servers run on {THIS}" in out
    assert f"bench/.venv is CPython 3.0.1: making it again on {THIS}" in out
    assert not (venv / "stale-file").exists(), "the old venv was not removed"
    assert [sys.executable, "-m", "venv", str(venv)] in calls
    assert interpreter.label(interpreter.venv_info(str(venv))) == THIS
    # Made on the right interpreter: a second setup keeps it.
    calls.clear()
    run.setup_venv([])
    assert "making it again" not in capsys.readouterr().out
    assert not [c for c in calls if c[1:3] == ["-m", "venv"]]


def test_setup_stops_on_an_interpreter_that_cannot_be_found(bench_dir, monkeypatch):
    run, venv, calls = bench_dir
    monkeypatch.setenv(interpreter.ENV, "/nonexistent/python3.12")
    with pytest.raises(SystemExit,
                       match="bench: CYSERVE_BENCH_INTERPRETER=/nonexistent/python3.12: no such"):
        run.setup_venv([])
    assert calls == [], "nothing may be made for an interpreter that was not found"


def test_cyserve_is_built_for_the_bench_interpreter_when_missing_or_stale(
        monkeypatch, tmp_path, capsys):
    from bench.http import run
    from bench.http import servers as S
    monkeypatch.setattr(S, "VENV_PY", sys.executable)
    so = tmp_path / "_core.cpython-3XX-test.so"
    monkeypatch.setattr(run, "cyserve_extension", lambda python: str(so))
    builds, fail = [], []

    class R:
        returncode, stdout, stderr = 0, "", ""

    def sh(argv, **kw):
        assert argv[:2] == [sys.executable, "setup.py"] and "--inplace" in argv
        assert kw["cwd"] == run.ROOT
        assert "CYSERVE_SANITIZE" not in kw["env"] and "CYSERVE_DEBUG" not in kw["env"]
        builds.append(argv)
        r = R()
        if fail:
            r.returncode = 1
            r.stderr = "src/cyserve/csrc/x.c:1:1: error: something broke\nerror: command failed\n"
        else:
            so.write_bytes(b"built")
        return r
    monkeypatch.setattr(run, "sh", sh)
    monkeypatch.setenv("CYSERVE_SANITIZE", "address")
    # Missing: built, and said so with the interpreter's name.
    assert run.setup_cyserve([]) is None and len(builds) == 1
    assert f"building cyserve's extension for {THIS}" in capsys.readouterr().out
    # Current: not built again.
    assert run.setup_cyserve([]) is None and len(builds) == 1
    # Older than a source: built again.
    os.utime(so, (0, 0))
    assert run.setup_cyserve([]) is None and len(builds) == 2
    # A build that fails says why, with the compiler's own line, and leaves no extension behind.
    so.unlink()
    fail.append(True)
    why = run.setup_cyserve([])
    assert why == (f"cyserve's extension does not build for {sys.executable}: "
                   "src/cyserve/csrc/x.c:1:1: error: something broke")
    # An interpreter that does not run is said so, and nothing is built.
    monkeypatch.setattr(run, "cyserve_extension", lambda python: None)
    assert run.setup_cyserve([]) == f"{sys.executable} does not run" and len(builds) == 3
