"""The App API's JSON answers: orjson when it is installed, json otherwise, with the same
meaning either way (the same parsed value, compact, NaN refused)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math

import pytest

from cyserve import _core

orjson = pytest.importorskip("orjson")

DOCUMENTS = [
    {"id": 1, "name": "caf\u00e9 \u2603", "tags": ["a", "b"], "nested": {"x": 1.5, "y": True}},
    [1, 2.25, "three", False, {"four": []}],
    {"big": 2**70, "small": -(2**63)},  # over 64 bits: orjson refuses, json writes it
    {1: "int key", False: "bool key", 2.5: "float key"},  # keys that are not strings
    {"none": None, "list": [None]},
    {},
    [],
]


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_both_encoders_mean_the_same(doc: object) -> None:
    fast = _core._json_body(doc, True)
    slow = _core._json_body(doc, False)
    assert slow == json.dumps(doc, separators=(",", ":")).encode()
    assert json.loads(fast) == json.loads(slow)
    assert b", " not in fast and b": " not in fast  # compact


def test_orjson_is_used_when_installed() -> None:
    assert _core._json_encoder() == "orjson"
    doc = {"name": "caf\u00e9"}
    assert _core._json_body(doc) == orjson.dumps(doc)  # UTF-8, not \u escapes


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused_by_either(value: float) -> None:
    for fast in (True, False):
        with pytest.raises(ValueError):
            _core._json_body({"x": [value]}, fast)


@dataclasses.dataclass
class Point:
    x: int


@pytest.mark.parametrize("value", [Point(1), datetime.date(2026, 1, 1), object(), {1, 2}])
def test_what_json_refuses_either_refuses(value: object) -> None:
    for fast in (True, False):
        with pytest.raises(TypeError):
            _core._json_body({"v": value}, fast)
