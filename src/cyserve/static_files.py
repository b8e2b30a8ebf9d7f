"""Static file routes: their content types, from the standard library's ``mimetypes``, and the
precompressed siblings (``x.br``, ``x.zst``, ``x.gz`` beside ``x``) their directory holds.

``app.files()`` routes answer with the Content-Type their file's extension names. The engine looks
the extension up in a table (``files_root_set_types`` in csrc/files.h) that this module builds
once, when a server's routes are built: the C path per file answer is a binary search, whatever
the table's size, and nothing here runs per request.

The table is ``mimetypes.types_map`` (the interpreter's defaults, the system's ``mime.types``
files that ``mimetypes.init()`` reads, and whatever the application added with
``mimetypes.add_type()`` before the server started), then :data:`OVERRIDES`, which win: the
few types ``mimetypes`` gets wrong for the web or lacks on some Python versions. Text types
are served with ``; charset=utf-8``, as the built-in table always did.
"""

from __future__ import annotations

import mimetypes

import os

__all__ = ["OVERRIDES", "SCAN_LIMIT", "content_type", "content_types",
           "precompressed_encodings"]

# What mimetypes says differently, or not at all on every supported Python: JavaScript is
# text/javascript (RFC 9239; some mime.types files still say application/javascript or
# application/x-javascript), .mjs and .wasm are missing before 3.12 or 3.11, fonts and the web
# manifest are missing, and compressed files are served as themselves (mimetypes maps .gz, .br
# and .zst to an encoding, not a type).
OVERRIDES: dict[str, str] = {
    "js": "text/javascript",
    "mjs": "text/javascript",
    "cjs": "text/javascript",
    "wasm": "application/wasm",
    "json": "application/json",
    "map": "application/json",
    "webmanifest": "application/manifest+json",
    "woff": "font/woff",
    "woff2": "font/woff2",
    "ttf": "font/ttf",
    "otf": "font/otf",
    "avif": "image/avif",
    "webp": "image/webp",
    "ico": "image/x-icon",
    "md": "text/markdown",
    "gz": "application/gzip",
    "br": "application/x-brotli",
    "zst": "application/zstd",
}

# The longest extension the engine's table takes (FILES_EXT_MAX in csrc/files.h).
_EXT_MAX = 31


def _with_charset(mime: str) -> str:
    # Text is UTF-8 unless the type says otherwise; a browser guesses the charset of text
    # without one, and guesses wrong on a page of non-ASCII text.
    if mime.startswith("text/") and "charset=" not in mime:
        return mime + "; charset=utf-8"
    return mime


def content_types() -> list[tuple[str, str]]:
    """Every (extension, Content-Type) pair the engine serves, extensions lower case without
    their dot, sorted. Built from mimetypes each call (a server's routes are built once)."""
    if not mimetypes.inited:
        mimetypes.init()
    table: dict[str, str] = {}
    for ext, mime in mimetypes.types_map.items():
        key = ext.lstrip(".").lower()
        # An extension with a dot inside (".tar.gz" in some mime.types) cannot be told apart from
        # its last part by the engine, which looks at the last extension only.
        if key and "." not in key and len(key) <= _EXT_MAX and mime.isascii() \
                and mime.isprintable() and len(mime) <= 100:
            table[key] = mime
    table.update(OVERRIDES)
    return sorted((ext, _with_charset(mime)) for ext, mime in table.items())


def content_type(name: str) -> str:
    """The Content-Type a file named ``name`` is served with (for tests and tools: the engine
    uses the table, not this function)."""
    base = name.rsplit("/", 1)[-1]
    dot = base.rfind(".")
    if dot <= 0:
        return "application/octet-stream"
    return dict(content_types()).get(base[dot + 1:].lower(), "application/octet-stream")


# The suffix of each precompressed sibling, and the Content-Encoding it is served with.
_SIBLINGS = {".br": "br", ".zst": "zstd", ".gz": "gzip"}

# How many directory entries precompressed_encodings() reads before it gives up and says every
# encoding may be there (the engine then looks for each sibling a client accepts).
SCAN_LIMIT = 50_000


def precompressed_encodings(directory: str) -> frozenset[str]:
    """The encodings ("br", "zstd", "gzip") of the precompressed siblings under ``directory``: a
    file ``x.br``, ``x.zst`` or ``x.gz`` beside a file ``x``. The engine looks, per request, only
    for the siblings of these encodings, so a tree without any pays nothing. Read once, when the
    routes are built: a kind of sibling that first appears later is served after a restart or
    a reload. Symbolic links to directories are not followed (a tree larger than SCAN_LIMIT
    entries counts as having all three)."""
    found: set[str] = set()
    seen = 0
    for _dir, _subdirs, files in os.walk(directory):
        seen += len(files) + len(_subdirs)
        if seen > SCAN_LIMIT:
            return frozenset(_SIBLINGS.values())
        names = set(files)
        for name in files:
            base, ext = os.path.splitext(name)
            encoding = _SIBLINGS.get(ext)
            if encoding is not None and base in names:
                found.add(encoding)
        if len(found) == len(_SIBLINGS):
            break
    return frozenset(found)
