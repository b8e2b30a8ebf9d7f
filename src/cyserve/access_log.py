"""Custom access log formats: gunicorn's ``%(h)s %(r)s ...`` atoms, compiled once.

``--access-log-format`` takes a named format (``common``, ``combined``, ``json``) or a format
string of gunicorn's atoms. The string is compiled here, once at start, into a list of steps
(text to copy, or an atom) that the engine's access log (csrc/access_log.c, struct
access_log_op) runs for each line: no format is parsed per request, and each line still goes
out in one write(2). An atom the engine does not have is an error at start, not a line of
garbage later.

The atoms (as gunicorn's documentation names them)::

    h  client address         l  "-"                     u  "-" (no user name)
    t  [date]                 r  request line            m  method
    U  path, no query         q  query string            H  protocol
    s  status                 b  body bytes, or "-"      B  body bytes, or 0
    f  referer                a  user agent              T  seconds taken
    M  milliseconds taken     D  microseconds taken      L  seconds, 6 decimals
    p  <pid>                  {Header}i  a request header

``%%`` is a literal ``%``. The response's headers (``{Header}o``) and the environment
(``{NAME}e``) are not available: the engine builds answers in several places and keeps no
response header list to read them from.
"""

from __future__ import annotations

import re

__all__ = ["NAMED_FORMATS", "ATOMS", "compile_format"]

# The engine's own formats, chosen by name.
NAMED_FORMATS = ("common", "combined", "json")

# Each atom letter and the name the engine knows it by (enum access_log_atom in csrc/server.h,
# without its ACCESS_LOG_ prefix).
ATOMS = {
    "h": "HOST", "l": "DASH", "u": "DASH", "t": "TIME", "r": "REQLINE", "m": "METHOD",
    "U": "PATH", "q": "QUERY", "H": "PROTOCOL", "s": "STATUS", "b": "BYTES", "B": "BYTES0",
    "f": "REFERER", "a": "AGENT", "T": "SECONDS", "M": "MILLIS", "D": "MICROS", "L": "DECIMAL",
    "p": "PID",
}

# A format string is short: the line it makes is cut at the engine's line buffer anyway.
_MAX_FORMAT = 2048
_MAX_HEADERS = 16

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_ATOM = re.compile(r"%\(([^)]*)\)s|%%|%")


def compile_format(fmt: str) -> list[tuple[str, str]]:
    """The steps of format ``fmt``: (``"TEXT"``, text), (atom name, "") or (``"HEADER"``,
    lower-case header name). Raises ValueError with a one-line message naming what is wrong
    (an unknown atom, a stray ``%``, a response header, a format too long)."""
    if not isinstance(fmt, str):
        raise ValueError(f"must be a format string, got {type(fmt).__name__}")
    if len(fmt) > _MAX_FORMAT:
        raise ValueError(f"a format of {len(fmt)} characters is longer than {_MAX_FORMAT}")
    if not fmt.isascii() or any(c in fmt for c in "\r\n\0"):
        raise ValueError("a format is one line of ASCII text")
    ops: list[tuple[str, str]] = []
    text = ""
    headers = 0
    pos = 0
    for m in _ATOM.finditer(fmt):
        text += fmt[pos:m.start()]
        pos = m.end()
        if m.group(0) == "%%":
            text += "%"
            continue
        atom = m.group(1)
        if atom is None:
            raise ValueError(f"a '%' at column {m.start() + 1} starts no %(name)s atom "
                             f"(write %% for a percent sign)")
        if text:
            ops.append(("TEXT", text))
            text = ""
        if atom in ATOMS:
            ops.append((ATOMS[atom], ""))
            continue
        if atom.startswith("{") and atom.endswith("}i") and _TOKEN.fullmatch(atom[1:-2]):
            headers += 1
            if headers > _MAX_HEADERS:
                raise ValueError(f"more than {_MAX_HEADERS} header atoms")
            ops.append(("HEADER", atom[1:-2].lower()))
            continue
        if atom.startswith("{") and atom.endswith(("}o", "}e")):
            raise ValueError(f"atom %({atom})s is not supported: the log can name request "
                             f"headers (%({{Name}}i)s), not response headers or the environment")
        raise ValueError(f"unknown atom %({atom})s (known: "
                         + " ".join(f"%({a})s" for a in ATOMS) + " %({Header}i)s)")
    text += fmt[pos:]
    if text:
        ops.append(("TEXT", text))
    if not any(kind != "TEXT" for kind, _ in ops):
        raise ValueError("a format needs at least one %(name)s atom")
    return ops
