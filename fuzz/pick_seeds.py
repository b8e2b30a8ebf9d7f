"""Picks the committed seed corpora from a full fuzzing corpus: the fewest inputs that reach every
basic block the full corpus reaches, so that the replay in `make test` keeps the coverage without
committing thousands of generated files. Needs gcc only (no clang).

The replay binaries are built once more with gcc's -fsanitize-coverage=trace-pc and cov_trace.c,
each input is replayed alone, and a greedy set cover keeps, at each step, the input that adds the
most blocks not yet reached (the smaller input on a tie). For the parser, the SIMD and the scalar
builds count separately, and fuzz/regression/ is replayed anyway, so what it reaches is not asked
of the seeds.

Usage (from the repository root or fuzz/):
    python3 fuzz/pick_seeds.py http   [DIR...]   # default DIRs: corpus build/new build/min
    python3 fuzz/pick_seeds.py router [DIR...]   # default DIRs: corpus-router build/new-router
Writes the chosen inputs into corpus/ (or corpus-router/), replacing what was there."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = HERE / "build" / "cov"
CFLAGS = ["-g", "-O1", "-std=gnu11", "-no-pie", f"-I{ROOT}/src/cyserve",
          f"-I{ROOT}/src/cyserve/include", "-DFUZZ_REPLAY"]

TARGETS = {
    "http": {"source": "fuzz_http_parse.c",
             "builds": {"simd": [], "scalar": ["-DHTTP_PARSE_NO_SIMD"]},
             "inputs": ["corpus", "build/new", "build/min"], "always": ["regression"],
             "out": "corpus"},
    "router": {"source": "fuzz_router.c", "builds": {"router": []},
               "inputs": ["corpus-router", "build/new-router"], "always": [],
               "out": "corpus-router"},
}


def build(target: dict) -> dict[str, Path]:
    BUILD.mkdir(parents=True, exist_ok=True)
    rt = BUILD / "cov_trace.o"
    subprocess.run(["gcc", "-O1", "-c", str(HERE / "cov_trace.c"), "-o", str(rt)], check=True)
    binaries = {}
    for name, extra in target["builds"].items():
        obj, exe = BUILD / f"{name}.o", BUILD / name
        subprocess.run(["gcc", *CFLAGS, *extra, "-fsanitize-coverage=trace-pc", "-c",
                        str(HERE / target["source"]), "-o", str(obj)], check=True)
        subprocess.run(["gcc", "-no-pie", str(obj), str(rt), "-o", str(exe)], check=True)
        binaries[name] = exe
    return binaries


def blocks(binaries: dict[str, Path], path: Path, scratch: Path) -> set[str]:
    reached: set[str] = set()
    for name, exe in binaries.items():
        subprocess.run([str(exe), str(path)], env=dict(os.environ, COV_OUT=str(scratch)),
                       check=True, capture_output=True, timeout=60)
        reached.update(f"{name}:{pc}" for pc in scratch.read_text().split())
    return reached


def files_in(dirs: list[Path]) -> list[Path]:
    found = []
    for d in dirs:
        if d.is_dir():
            found += sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith("."))
    return found


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in TARGETS:
        print(__doc__, file=sys.stderr)
        return 2
    target = TARGETS[argv[0]]
    dirs = [Path(d).resolve() for d in argv[1:]] or [HERE / d for d in target["inputs"]]
    binaries = build(target)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "cov"
        covered: set[str] = set()
        for path in files_in([HERE / d for d in target["always"]]):
            covered |= blocks(binaries, path, scratch)
        base = len(covered)
        candidates: dict[bytes, set[str]] = {}
        for path in files_in(dirs):
            data = path.read_bytes()
            if data not in candidates:
                candidates[data] = blocks(binaries, path, scratch)
    total = len(covered.union(*candidates.values()))
    chosen: list[bytes] = []
    while True:
        best = max(candidates, key=lambda d: (len(candidates[d] - covered), -len(d)), default=None)
        if best is None or not candidates[best] - covered:
            break
        chosen.append(best)
        covered |= candidates.pop(best)
    out = HERE / target["out"]
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for data in chosen:
        (out / hashlib.sha1(data).hexdigest()).write_bytes(data)
    print(f"{len(chosen) + len(candidates)} distinct inputs reach {total} blocks "
          f"({base} through {', '.join(target['always']) or 'nothing replayed anyway'}); "
          f"{len(chosen)} of them, written to {out.relative_to(ROOT)}, reach them all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
