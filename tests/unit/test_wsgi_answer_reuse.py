"""A thread reuses its WSGI answer object for its next request (native/wsgi.pyx, _answer_for),
which promises that the app "cannot tell it from a new one": every field is set again there or
in _answer_clear. A field added later and left out of both carries one request's state into the
next (it happened: the `sent` mark of a streamed answer made the next request's error page a
500). This reads the class's fields from the source and checks that each is reset."""

from __future__ import annotations

import re
from pathlib import Path

WSGI_PYX = Path(__file__).resolve().parents[2] / "src" / "cyserve" / "native" / "wsgi.pyx"

# Set once when the object is made and the same for every request: the vectorcall slot, the
# weak-reference slot, and the body's list, which _answer_clear empties in place.
MADE_ONCE = {"vc", "__weakref__", "chunks"}


def _body(source: str, header: str) -> str:
    """The indented block that follows the line starting with header."""
    start = source.index(header)
    lines = source[start:].split("\n")
    block = [lines[0]]
    for line in lines[1:]:
        if line and not line.startswith((" ", "\t")):
            break
        block.append(line)
    return "\n".join(block)


def test_every_field_of_a_reused_answer_is_set_again() -> None:
    source = WSGI_PYX.read_text()
    cls = _body(source, "cdef class _WSGIAnswer:")
    fields = set(re.findall(r"^    cdef (?:[\w.]+ \*?)+?(\w+)\s*(?:#.*)?$", cls, re.M))
    assert {"status", "sent", "resp", "file_len"} <= fields, fields  # the parse found them
    reset = _body(source, "cdef _WSGIAnswer _answer_for(") + \
        _body(source, "cdef void _answer_clear(")
    code = "\n".join(line.split("#", 1)[0] for line in reset.split("\n"))  # not comments
    assigned = set(re.findall(r"\banswer\.(\w+) = ", code))
    assert fields - MADE_ONCE - assigned == set()
