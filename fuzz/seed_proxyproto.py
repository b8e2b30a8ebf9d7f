"""Writes corpus-proxyproto/: one seed per conformance case of tests/http/proxyproto/*.md (the
input of each ```proxy block), named after its file and title. Run from fuzz/ after adding cases:
    python3 seed_proxyproto.py"""
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests" / "http"))
from test_parser import block_bytes  # noqa: E402

out = HERE / "corpus-proxyproto"
out.mkdir(exist_ok=True)
for path in sorted((HERE.parent / "tests" / "http" / "proxyproto").glob("*.md")):
    title, lines, i = None, path.read_text().splitlines(), 0
    while i < len(lines):
        if lines[i].startswith("## "):
            title = lines[i][3:].strip()
        elif lines[i].strip() == "```proxy":
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            name = f"{path.stem}-" + re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
            (out / name).write_bytes(block_bytes(lines[i + 1:j]))
            i = j
        i += 1
