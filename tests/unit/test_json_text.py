"""The App API's JSON answers by the json module: the text and the errors of
json.dumps(doc, separators=(",", ":"), allow_nan=False), which _core's encoder reproduces by
making the standard library's C encoder itself (without orjson, or where orjson hands over)."""

from __future__ import annotations

import collections
import json
import math

import pytest

from cyserve import _core


class Sub(dict):
    pass


class IntSub(int):
    def __repr__(self) -> str:  # json writes int's own text, not this
        return "nope"


DOCUMENTS = [
    {},
    [],
    {"id": 1, "name": "caf\u00e9 \u2603 \U0001f600", "tags": ["a", "b"], "nested": {"x": 1.5}},
    [1, 2.25, "three", False, True, None, {"four": []}, (5, 6)],
    {"big": 2**70, "small": -(2**63), "neg0": -0.0, "tiny": 5e-324, "huge": 1e300},
    {1: "int key", False: "bool key", 2.5: "float key", None: "none key"},
    {"ctl": "\x00\x1f\"\\\n\t", "lone surrogate": "\ud800"},
    Sub(a=1, b=Sub(c=[])),
    collections.OrderedDict([("z", 1), ("a", 2)]),
    [IntSub(3)],
    [[[[[[[[[[[]]]]]]]]]]],
]


def reference(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_the_same_text_as_json_dumps(doc: object) -> None:
    out = _core._json_body(doc, False)
    assert type(out) is bytes
    assert out == reference(doc)
    assert out.isascii()


def failure(fn, doc: object) -> tuple[type, str]:
    with pytest.raises((ValueError, TypeError)) as e:
        fn(doc)
    return type(e.value), str(e.value)


@pytest.mark.parametrize("make", [
    lambda: {"x": [math.nan]},
    lambda: [math.inf],
    lambda: {"v": object()},
    lambda: {"v": {1, 2}},
    lambda: {(1, 2): "tuple key"},
    lambda: b"bytes",
])
def test_the_same_errors_as_json_dumps(make) -> None:
    assert failure(lambda d: _core._json_body(d, False), make()) == failure(reference, make())


def test_a_circular_document_is_refused_and_leaves_nothing_behind() -> None:
    loop: list = [1]
    loop.append({"back": loop})
    assert failure(lambda d: _core._json_body(d, False), loop) == failure(reference, loop)
    # The encoder that failed kept the document's objects in its circular-reference table; the
    # next answer gets a fresh one, so the same (no longer circular) objects encode.
    loop[1]["back"] = None
    assert _core._json_body(loop, False) == b'[1,{"back":null}]'
    shared = [1]
    assert _core._json_body([shared, shared], False) == b"[[1],[1]]"  # shared is not circular


def test_a_failed_encoding_does_not_poison_the_next() -> None:
    doc = {"a": [1, 2, {"b": 3}]}
    for _ in range(3):
        with pytest.raises(TypeError):
            _core._json_body({"a": doc["a"], "z": object()}, False)
        assert _core._json_body(doc, False) == reference(doc)
