"""Writes every conformance input of tests/http/*.md into fuzz/corpus/ as a seed (then `make -C
fuzz seeds` keeps only those that reach code no other input reaches). Usage:
.venv/bin/python fuzz/seed_corpus.py"""

import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests" / "http"))

import test_parser  # noqa: E402  (the loader of the Markdown cases)


def main():
    out = HERE / "corpus"
    out.mkdir(exist_ok=True)
    count = 0
    for case in test_parser.CASES:
        data = case.values[1]
        name = hashlib.sha1(data).hexdigest()
        (out / name).write_bytes(data)
        count += 1
    print(f"wrote {count} seeds to {out}")


if __name__ == "__main__":
    main()
