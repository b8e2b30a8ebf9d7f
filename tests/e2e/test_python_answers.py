"""What an App handler's str, dict and list come out as on the wire: a str's UTF-8 (an ASCII
one under 8 KiB is copied from the str's own buffer, anything else encoded), a dict or list as
compact JSON, HEAD without the bytes. The sizes on both sides of 8 KiB, ASCII and not."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _rawhttp import Conn, get, serving

import cyserve

pytestmark = pytest.mark.native

TEXTS = {
    "empty": "",
    "ascii": "Hello, World!",
    "ascii-under": "a" * 8191,
    "ascii-at": "b" * 8192,
    "ascii-big": "0123456789" * 20000,
    "latin1": "caf\u00e9",
    "bmp": "\u2603" * 3000,  # 9,000 bytes of UTF-8 from 3,000 characters
    "astral": "\U0001f600 x",
}
DOCS: dict[str, Any] = {
    "dict": {"id": 1, "name": "caf\u00e9 \u2603", "tags": ["a", "b"], "none": None},
    "list": [1, 2.5, "three", None, {"four": []}],
    "big": [{"i": i, "s": "x" * 50, "n": None} for i in range(400)],  # over 8 KiB of JSON
    "empty": {},
}


def app() -> cyserve.App:
    a = cyserve.App()

    @a.get("/text/{name}")
    def text(req: Any) -> str:
        return TEXTS[req.params["name"]]

    @a.get("/doc/{name}")
    def doc(req: Any) -> Any:
        return DOCS[req.params["name"]]

    @a.get("/nan")
    def nan(req: Any) -> Any:
        return {"x": float("nan"), "y": None}

    return a


def test_str_answers_are_their_utf8() -> None:
    with serving(app().build(), threads=1) as srv, Conn(srv.port) as c:
        for name, text in TEXTS.items():
            c.send(get(f"/text/{name}"))
            r = c.reply()
            assert r.status == 200, name
            assert r.header("content-type") == "text/plain; charset=utf-8"
            assert r.body == text.encode("utf-8"), name
            assert r.header("content-length") == str(len(text.encode("utf-8")))
            c.send(f"HEAD /text/{name} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            h = c.reply(head_only=True)
            assert h.header("content-length") == str(len(text.encode("utf-8"))), name
        assert c.buf == b""


def test_dict_and_list_answers_are_compact_json() -> None:
    with serving(app().build(), threads=1) as srv, Conn(srv.port) as c:
        for name, doc in DOCS.items():
            c.send(get(f"/doc/{name}"))
            r = c.reply()
            assert (r.status, r.header("content-type")) == (200, "application/json"), name
            assert json.loads(r.body) == doc
            assert b", " not in r.body and b'": ' not in r.body
        # NaN is not JSON, whichever encoder runs: a 500, and the connection goes on.
        c.send(get("/nan") + get("/doc/empty"))
        assert c.reply().status == 500
        assert c.reply().body == b"{}"
