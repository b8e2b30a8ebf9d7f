"""Conformance of the WebSocket frame reader (csrc/ws.c) against the cases in tests/ws/*.md.

Format of a case file (one topic per file, as tests/http/):

    ## Title of the case

    A sentence saying why the case exists.

    <!-- meta={"max_message": 10} -->          (optional: the reader's maximum message size)

    ```frames                                  (what the client sends, one frame per line)
    text "Hello"                               a masked, final text frame
    text "Hel" nofin                           a first fragment
    cont "lo"                                  a continuation; also binary, close, ping, pong
    op=3 ""                                    any opcode by number
    binary 126*"a"                             N*"..." repeats the payload
    text "hi" nomask rsv=0x40                  unmasked; RSV bits set
    close code=1000 "bye"                      a close frame with a code and a reason
    raw 81 02 68 69                            bytes as they are (hex)
    text "Hel" len=10                          a frame whose head announces 10 bytes of payload
                                               and that stops after the 3 given (not yet whole)
    text "Hello" deflate                       compressed (RFC 7692) by the case's compressor,
                                               which keeps its context from frame to frame; RSV1
                                               set unless a continuation; a final frame loses
                                               its 00 00 FF FF tail
    text "Hello" deflatefresh                  the same by a compressor of its own (no context)
    text "Hello" deflatefinal                  the same, the stream ended by a BFINAL block
    ```

    <!-- meta={"deflate": true} -->            permessage-deflate negotiated (also
                                               "client_no_context_takeover": true); a compressed
                                               frame is expected with the bytes it inflates to

    ```expect                                  (what the reader returns, in order)
    text first fin "Hello"                     data frames: first/cont and fin/more flags
    text cont more "Hel"
    ping "x"
    close 1000 "bye"                           (close 1005 "" for an empty close)
    error 1002                                 the reader refused: the close code to send
    ```

Payload strings use Python's escapes (\\xNN, \\u00e9 for UTF-8 text). Every case is fed whole,
then split in two at every byte, then one byte at a time: the frames returned, and the error,
must be the same every time (the reader's rules do not depend on how bytes arrive)."""

from __future__ import annotations

import ast
import json
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from cyserve import _testhooks

pytestmark = pytest.mark.native

CASE_DIR = Path(__file__).parent
HEADING = re.compile(r"^##\s+(.*\S)\s*$")
META = re.compile(r"^<!--\s*meta=(\{.*\})\s*-->\s*$")
OPS = {"cont": 0, "text": 1, "binary": 2, "close": 8, "ping": 9, "pong": 10}
MASK = b"\x37\xfa\x21\x3d"
PAYLOAD = re.compile(r'(?:(\d+)\*)?("(?:[^"\\]|\\.)*")')


def payload_of(text: str) -> tuple[bytes, str]:
    """The payload in a line (N*"..." or "..."), and the line without it."""
    m = PAYLOAD.search(text)
    if not m:
        return b"", text
    lit = m.group(2)
    if "\\u" in lit or any(ord(c) > 0x7F for c in lit):
        data = ast.literal_eval(lit).encode("utf-8")  # characters, as UTF-8
    else:
        data = ast.literal_eval("b" + lit)  # \xNN is a byte
    if m.group(1):
        data *= int(m.group(1))
    return data, text[:m.start()] + text[m.end():]


def deflated(comp: Any, data: bytes, fin: bool) -> bytes:
    """data compressed as a permessage-deflate sender does: a sync flush, and at the message's end
    the 00 00 FF FF tail removed (RFC 7692 7.2.1)."""
    out = comp.compress(data) + comp.flush(zlib.Z_SYNC_FLUSH)
    if fin:
        assert out.endswith(b"\x00\x00\xff\xff")
        out = out[:-4]
    return out


def build_frame(line: str, comp: Any = None) -> bytes:
    words = line.split()
    if words[0] == "raw":
        return bytes.fromhex("".join(words[1:]))
    data, rest = payload_of(line)
    words = rest.split()
    head, flags = words[0], words[1:]
    op = int(head[3:], 0) if head.startswith("op=") else OPS[head]
    fin, mask, rsv, code, deflate, announced = True, True, 0, None, None, None
    for flag in flags:
        if flag in ("deflate", "deflatefresh", "deflatefinal"):
            deflate = flag
        elif flag == "nofin":
            fin = False
        elif flag == "nomask":
            mask = False
        elif flag.startswith("rsv="):
            rsv = int(flag[4:], 0)
        elif flag.startswith("code="):
            code = int(flag[5:])
        elif flag.startswith("len="):
            announced = int(flag[4:])
        else:
            raise ValueError(f"unknown flag {flag!r} in {line!r}")
    if code is not None:
        data = struct.pack("!H", code) + data
    if deflate:
        fresh = zlib.compressobj(wbits=-15)
        if deflate == "deflatefinal":
            data = fresh.compress(data) + fresh.flush()  # a stream ended by a BFINAL block
        else:
            data = deflated(comp if deflate == "deflate" else fresh, data, fin)
        if op != 0:
            rsv |= 0x40
    n = len(data) if announced is None else announced
    assert n >= len(data), f"len= below the payload given in {line!r}"
    b0 = (0x80 if fin else 0) | rsv | op
    mbit = 0x80 if mask else 0
    if n < 126:
        out = bytes([b0, mbit | n])
    elif n < 65536:
        out = bytes([b0, mbit | 126]) + struct.pack("!H", n)
    else:
        out = bytes([b0, mbit | 127]) + struct.pack("!Q", n)
    if not mask:
        return out + data
    return out + MASK + bytes(b ^ MASK[i % 4] for i, b in enumerate(data))


def expected_event(line: str) -> tuple:
    data, rest = payload_of(line)
    words = rest.split()
    kind = words[0]
    if kind == "error":
        return ("error", int(words[1]))
    if kind == "close":
        return ("close", int(words[1]), data)
    if kind in ("ping", "pong"):
        return (kind, data)
    first = words[1] == "first"
    fin = words[2] == "fin"
    return (kind, first, fin, data)


def load_cases() -> list:
    cases = []
    for path in sorted(CASE_DIR.glob("*.md")):
        title, meta, data = None, {}, None
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            m = HEADING.match(line)
            if m:
                title, meta, data = m.group(1), {}, None
                i += 1
                continue
            m = META.match(line)
            if m:
                meta = json.loads(m.group(1))
                i += 1
                continue
            if line.startswith("```") and line.strip() != "```":
                lang = line.strip()[3:]
                j = i + 1
                while lines[j].strip() != "```":
                    j += 1
                body = [b for b in lines[i + 1:j] if b.strip()]
                if lang == "frames":
                    comp = zlib.compressobj(wbits=-15)
                    data = b"".join(build_frame(b.strip(), comp) for b in body)
                elif lang == "expect":
                    assert title and data is not None, f"{path.name}: expect without frames"
                    expect = [expected_event(b.strip()) for b in body]
                    cases.append(pytest.param(data, expect, meta, id=f"{path.stem}: {title}"))
                else:
                    raise ValueError(f"{path.name}: unknown block ```{lang}")
                i = j + 1
                continue
            i += 1
    return cases


CASES = load_cases()


def run(pieces: list[bytes], meta: dict) -> list[tuple]:
    reader = _testhooks.WSReader(meta.get("max_message", 0), meta.get("deflate", False),
                                 meta.get("client_no_context_takeover", False))
    out: list[tuple] = []
    for piece in pieces:
        for ev in reader.feed(piece):
            out.append(ev[:2] if ev[0] == "error" else ev)
    return out


def test_enough_cases() -> None:
    assert len(CASES) >= 30, f"only {len(CASES)} conformance cases"


@pytest.mark.parametrize("data,expect,meta", CASES)
def test_case(data: bytes, expect: list[tuple], meta: dict) -> None:
    assert run([data], meta) == expect, "fed whole"
    for k in range(1, len(data)):
        assert run([data[:k], data[k:]], meta) == expect, f"split at byte {k}"
    if len(data) <= 4096:
        assert run([data[i:i + 1] for i in range(len(data))], meta) == expect, \
            "fed a byte at a time"
