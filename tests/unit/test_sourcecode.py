"""The mechanical style gates, run as tests so that `make test` keeps the tree to them: ruff over
the Python, mypy over the typed package (src/cyserve ships py.typed and _core.pyi), cython-lint
over the Cython layer, and clang-format over every C source and header (src/cyserve/csrc,
src/cyserve/include, tests/c, fuzz/*.c, bench/micro/*.c; the assembly is not formatted).

Each tool is pinned in requirements-dev.txt and installed beside the interpreter that runs the
tests; its configuration is in pyproject.toml (.clang-format for the C). A failure shows the
tool's own report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run_tool(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    assert exe.exists(), f"{exe} is missing: `make build` installs requirements-dev.txt"
    # cython-lint starts pycodestyle by name: the virtual environment's bin/ comes first.
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([str(exe), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)


def report(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def test_ruff() -> None:
    proc = run_tool("ruff", "check", "--no-cache", ".")
    assert proc.returncode == 0, report(proc)


def test_mypy() -> None:
    # The files to check and the strictness are in pyproject.toml's [tool.mypy].
    proc = run_tool("mypy", "--cache-dir", str(ROOT / "build" / "mypy-cache"))
    assert proc.returncode == 0, report(proc)


def cython_sources() -> list[str]:
    found = []
    for top in ("src", "tests", "examples", "bench"):
        for ext in ("pyx", "pxd", "pxi"):
            for path in (ROOT / top).rglob(f"*.{ext}"):
                rel = path.relative_to(ROOT)
                # Build outputs, and virtual environments (bench/.venv holds other projects').
                if not any(part in ("build", ".build") or part.startswith(".venv")
                           for part in rel.parts):
                    found.append(str(rel))
    return sorted(found)


# A range loop over a counter declared `cdef int i` compiles to a plain C loop; cython-lint asks
# for an underscore name when the body does not read the counter, which would only rename it.
ACCEPTED_CYTHON_LINT = ("Loop control variable",)


def test_cython_lint() -> None:
    files = cython_sources()
    assert files
    proc = run_tool("cython-lint", *files)
    findings = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines()
                if line.strip() and not any(a in line for a in ACCEPTED_CYTHON_LINT)]
    assert not findings, "\n".join(findings)


# Where the C lives: (folder, pattern), searched below the folder for the first three.
C_SOURCES = (
    ("src/cyserve/csrc", "**/*.[ch]"),
    ("src/cyserve/include", "**/*.h"),
    ("tests/c", "**/*.[ch]"),
    ("fuzz", "*.c"),
    ("bench/micro", "*.c"),
)


def c_sources() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for top, pattern in C_SOURCES:
        files = []
        for path in (ROOT / top).glob(pattern):
            rel = path.relative_to(ROOT)
            # Build outputs (tests/c builds into build/) are not sources.
            if path.is_file() and not any(part in ("build", ".build") for part in rel.parts):
                files.append(str(rel))
        found[top] = sorted(files)
    return found


def test_c_sources_found() -> None:
    # A folder moved or renamed would otherwise leave its files unchecked without a word.
    empty = [top for top, files in c_sources().items() if not files]
    assert not empty, f"no C files found under {empty}: update C_SOURCES"


def test_clang_format() -> None:
    files = [f for group in c_sources().values() for f in group]
    proc = run_tool("clang-format", "--style=file", "--dry-run", "--Werror", *files)
    assert proc.returncode == 0, report(proc)
