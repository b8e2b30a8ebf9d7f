"""Conformance of the HTTP/1.1 parser (csrc/http_parse.c) against the cases in tests/http/*.md.

Format of a case file (llhttp-style, one topic per file):

    ## Title of the case

    A sentence saying why the case exists.

    <!-- meta={"max_header_bytes": 64} -->        (optional: limits passed to the parser)

    ```http                                       (a request head) or ```chunked (a body)
    GET / HTTP/1.1
    Host: example.com

    ```

    ```expect
    result: ok                                    (ok, incomplete, or an HTTP status: 400)
    method: GET
    header: Host: example.com
    ```

Input convention: each line of the block ends in CRLF, written by the runner. Inside a line,
`\\r`, `\\n`, `\\t`, `\\0`, `\\xNN` and `\\\\` are escapes, a lone `\\` at the end of a line means
"no line end here", and `{{N*TEXT}}` is TEXT repeated N times (for limit cases).

Expectations for ```http: `result`, `error` (the parser's rule name), `consumed` (default: the
whole input), `method`, `method_id`, `target`, `path`, `query` (`none` when absent), `version`,
`header` (repeatable; when given, the list must match exactly), `headers` (a count),
`content_length`, `chunked`, `keep_alive`, `expect_continue`, `upgrade` (yes/no), `host`.
For ```chunked: `result` (ok, incomplete, invalid), `body`, `rest`, `max_trailer_bytes`.

Every http case is parsed whole, then every prefix is parsed: a prefix must give -2 or the very
same -1 (status and rule) as the whole input. A complete head followed by more bytes must give
the same result (pipelining). Every chunked case is decoded whole, split in two at every byte,
and fed one byte at a time: all must agree.
"""

import json
import re
from pathlib import Path

import pytest

from cyserve import _testhooks

pytestmark = pytest.mark.native

CASE_DIR = Path(__file__).parent

HEADING = re.compile(r"^##\s+(.*\S)\s*$")
META = re.compile(r"^<!--\s*meta=(\{.*\})\s*-->\s*$")
REPEAT = re.compile(r"\{\{(\d+)\*([^}]*)\}\}")


def unescape_line(line):
    """Returns (bytes, keep_line_end) for one line of an input block."""
    line = REPEAT.sub(lambda m: m.group(2) * int(m.group(1)), line)
    out = bytearray()
    i = 0
    while i < len(line):
        ch = line[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        if i + 1 == len(line):
            return bytes(out), False
        nxt = line[i + 1]
        simple = {"r": b"\r", "n": b"\n", "t": b"\t", "0": b"\0", "\\": b"\\"}
        if nxt in simple:
            out += simple[nxt]
            i += 2
        elif nxt == "x":
            out.append(int(line[i + 2:i + 4], 16))
            i += 4
        else:
            raise ValueError(f"unknown escape \\{nxt} in {line!r}")
    return bytes(out), True


def block_bytes(lines):
    data = bytearray()
    for line in lines:
        chunk, keep_end = unescape_line(line)
        data += chunk
        if keep_end:
            data += b"\r\n"
    return bytes(data)


def load_cases():
    cases = []
    for path in sorted(CASE_DIR.glob("*.md")):
        title, meta, kind, data, expect = None, {}, None, None, None
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            m = HEADING.match(line)
            if m:
                title, meta, kind, data, expect = m.group(1), {}, None, None, None
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
                body = lines[i + 1:j]
                if lang in ("http", "chunked"):
                    kind = lang
                    data = block_bytes(body)
                elif lang == "expect":
                    expect = {}
                    for entry in body:
                        key, _, value = entry.partition(":")
                        expect.setdefault(key.strip(), []).append(value.strip())
                    assert title and kind, f"{path.name}: expect block without a case before it"
                    cases.append(pytest.param(kind, data, expect, meta,
                                              id=f"{path.stem}: {title}"))
                else:
                    raise ValueError(f"{path.name}: unknown block ```{lang}")
                i = j + 1
                continue
            i += 1
    return cases


CASES = load_cases()


def test_enough_cases():
    assert len(CASES) >= 100, f"only {len(CASES)} conformance cases"


def parse(data, meta):
    return _testhooks._parse_request(data, **meta)


def yes_no(value):
    return {"yes": True, "no": False}[value]


def check_http(data, expect, meta):
    rc, info = parse(data, meta)
    result = expect["result"][0]
    if result == "incomplete":
        assert rc == -2, (rc, info)
        return rc, info
    if result != "ok":
        assert rc == -1, f"expected {result}, got rc={rc} {info}"
        assert info["status"] == int(result), info
        if "error" in expect:
            assert info["error"] == expect["error"][0], info
        return rc, info
    assert rc > 0, f"expected a parse, got rc={rc} {info}"
    consumed = int(expect["consumed"][0]) if "consumed" in expect else len(data)
    assert rc == consumed
    str_fields = ("method", "method_id", "target", "path", "host", "version")
    for key in str_fields:
        if key in expect:
            got = info[key]
            got = got.decode("latin-1") if isinstance(got, bytes) else got
            assert got == expect[key][0], (key, got)
    if "query" in expect:
        want = expect["query"][0]
        got = info["query"]
        assert (got is None) if want == "none" else (got == want.encode()), ("query", got)
    if "header" in expect:
        want = []
        for h in expect["header"]:
            name, _, value = h.partition(":")
            want.append((name.strip().encode(), unescape_line(value.strip())[0]))
        assert info["headers"] == want
    if "headers" in expect:
        assert len(info["headers"]) == int(expect["headers"][0])
    if "content_length" in expect:
        assert info["content_length"] == int(expect["content_length"][0])
    for key in ("chunked", "keep_alive", "expect_continue", "upgrade"):
        if key in expect:
            assert info[key] == yes_no(expect[key][0]), (key, info[key])
    return rc, info


@pytest.mark.parametrize("kind,data,expect,meta", [c for c in CASES if c.values[0] == "http"])
def test_http_case(kind, data, expect, meta):
    rc, info = check_http(data, expect, meta)
    # Every prefix: -2, or the same decision as the whole input.
    for k in range(len(data)):
        prc, pinfo = parse(data[:k], meta)
        if rc > 0 and k >= rc:
            # The head is complete: bytes after it (a body) change nothing.
            assert (prc, pinfo) == (rc, info), f"prefix of {k} bytes: {prc} {pinfo}"
            continue
        if prc == -2:
            continue
        assert prc == -1 and rc == -1, f"prefix of {k} bytes gave {prc} {pinfo}, whole {rc}"
        assert pinfo == info, f"prefix of {k} bytes: {pinfo} != {info}"
    # A pipelined follower changes nothing.
    if rc != -2:
        assert parse(data + b"GET / HTTP/1.1\r\n", meta) == (rc, info)


def decode(chunks, meta):
    return _testhooks._decode_chunked(chunks, **meta)


@pytest.mark.parametrize("kind,data,expect,meta", [c for c in CASES if c.values[0] == "chunked"])
def test_chunked_case(kind, data, expect, meta):
    whole = decode([data], meta)
    rc, body, rest = whole
    result = expect["result"][0]
    if result == "ok":
        assert rc >= 0, whole
        assert rc == len(rest)
    elif result == "incomplete":
        assert rc == -2, whole
    else:
        assert result == "invalid"
        assert rc == -1, whole
    if "body" in expect:
        assert body == unescape_line(expect["body"][0])[0]
    if "rest" in expect:
        assert rest == unescape_line(expect["rest"][0])[0]
    for k in range(1, len(data)):
        split = decode([data[:k], data[k:]], meta)
        if rc == -1:
            assert split[0] == -1, (k, split)
        else:
            assert split == whole, (k, split)
    by_byte = decode([data[i:i + 1] for i in range(len(data))], meta)
    if rc == -1:
        assert by_byte[0] == -1
    else:
        assert by_byte == whole
