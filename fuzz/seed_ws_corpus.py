"""Seeds fuzz/corpus-ws/ with the WebSocket conformance cases of tests/ws/*.md: one file per
case, its first byte the maximum message size / 4 that fuzz_ws.c reads (0: none), after a byte
0xFF (0xFE: with client_no_context_takeover) for a case with permessage-deflate on, then the
case's bytes. Run from anywhere: python3 fuzz/seed_ws_corpus.py"""

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "ws"))

import test_ws_codec  # noqa: E402  (the case loader; imports cyserve._testhooks lazily)


def main() -> None:
    out = ROOT / "fuzz" / "corpus-ws"
    out.mkdir(exist_ok=True)
    for case in test_ws_codec.CASES:
        data, _expect, meta = case.values
        max_byte = min(255, meta.get("max_message", 0) // 4)
        blob = bytes([max_byte]) + data[:4096]
        if meta.get("deflate"):
            blob = (b"\xfe" if meta.get("client_no_context_takeover") else b"\xff") + blob
        (out / hashlib.sha1(blob).hexdigest()[:16]).write_bytes(blob)


if __name__ == "__main__":
    main()
