"""The mechanical style gates, run as tests so that `make test` keeps the tree to them: ruff over
the Python, mypy over the typed package (src/cyserve ships py.typed and _core.pyi), cython-lint
over the Cython layer, and clang-format over the C files listed in .clang-format-files.

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


def clang_format_files() -> list[str]:
    lines = (ROOT / ".clang-format-files").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_clang_format_list_names_existing_files() -> None:
    files = clang_format_files()
    assert files
    missing = [f for f in files if not (ROOT / f).is_file()]
    assert not missing, f"listed in .clang-format-files but absent: {missing}"


def test_clang_format() -> None:
    files = [f for f in clang_format_files() if (ROOT / f).is_file()]
    proc = run_tool("clang-format", "--style=file", "--dry-run", "--Werror", *files)
    assert proc.returncode == 0, report(proc)
