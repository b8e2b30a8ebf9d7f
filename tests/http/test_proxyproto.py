"""Conformance of the PROXY protocol parser (csrc/proxyproto.c) against the cases in
tests/http/proxyproto/*.md, in the format of the HTTP parser's cases (test_parser.py), with
```proxy input blocks and these expectations: `result` (ok, incomplete, invalid), `consumed`
(default: the whole input), `version` (1 or 2), `client` ("host:port", or none when the header
names no client).

The parser keeps no state between calls (a header is short; the engine peeks at it until it is
whole), so feeding a case split at byte k is parsing its first k bytes and then the whole: every
case is parsed whole, then every prefix. A prefix of an accepted header must be incomplete (-2);
for a refused one, prefixes are incomplete until one is refused, and every longer one is refused
too, so that a stream that can never become a header is refused as soon as it shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from cyserve import _testhooks
from test_parser import HEADING, block_bytes

pytestmark = pytest.mark.native

CASE_DIR = Path(__file__).parent / "proxyproto"


def load_cases() -> list:  # type: ignore[type-arg]
    cases = []
    for path in sorted(CASE_DIR.glob("*.md")):
        title, data = None, None
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = HEADING.match(lines[i])
            if m:
                title, data = m.group(1), None
            elif lines[i].startswith("```") and lines[i].strip() != "```":
                lang = lines[i].strip()[3:]
                j = i + 1
                while lines[j].strip() != "```":
                    j += 1
                body = lines[i + 1:j]
                if lang == "proxy":
                    data = block_bytes(body)
                elif lang == "expect":
                    assert title and data is not None, f"{path.name}: expect without a case"
                    expect = dict(e.split(":", 1) for e in body)
                    expect = {k.strip(): v.strip() for k, v in expect.items()}
                    cases.append(pytest.param(data, expect, id=f"{path.stem}: {title}"))
                else:
                    raise ValueError(f"{path.name}: unknown block ```{lang}")
                i = j
            i += 1
    return cases


CASES = load_cases()


def test_enough_cases() -> None:
    assert len(CASES) >= 40, f"only {len(CASES)} cases"


@pytest.mark.parametrize("data, expect", CASES)
def test_case(data: bytes, expect: dict[str, str]) -> None:
    rc, version, client = _testhooks._proxyproto_parse(data)
    result = expect["result"]
    if result == "ok":
        assert rc == int(expect.get("consumed", len(data))), rc
        if "version" in expect:
            assert version == int(expect["version"])
        want = expect.get("client", "none")
        assert client == (None if want == "none" else want)
        for k in range(rc):
            assert _testhooks._proxyproto_parse(data[:k])[0] == -2, f"prefix of {k} bytes"
    elif result == "incomplete":
        assert rc == -2
        for k in range(len(data)):
            assert _testhooks._proxyproto_parse(data[:k])[0] == -2, f"prefix of {k} bytes"
    else:
        assert result == "invalid"
        assert rc == -1
        refused = False
        for k in range(len(data) + 1):
            r = _testhooks._proxyproto_parse(data[:k])[0]
            assert r in (-1, -2), f"prefix of {k} bytes: {r}"
            assert not (refused and r == -2), f"prefix of {k} bytes: incomplete after refused"
            refused = refused or r == -1
