"""--env-file: variables for the application, read from a file of KEY=VALUE lines before it is
imported (the format of python-dotenv and docker's --env-file, which that package is not
needed to read).

    # a comment, and blank lines, are skipped
    export DATABASE_URL=postgres://db/app     # "export " is allowed, so that sh can source it
    NAME = value                              # spaces around '=' and the value's ends dropped
    GREETING='single quotes: taken as written, $HOME and \\n too'
    MOTD="double quotes: \\n \\t \\" \\\\ escapes, ${NAME} replaced"
    KEY="a value over
    several lines, in quotes"
    URL=http://${HOST}:8000/x                 # ${VAR} replaced in unquoted values too

``${VAR}`` is the variable as the file has set it so far, else as the environment has it, else
empty; nothing else is interpolated (no ``$VAR``, no defaults, no commands). A variable the
environment already has keeps its value, as python-dotenv (and so uvicorn's --env-file) does:
the file gives defaults that a deployment can override. Anything else is an EnvFileError that
names the file and the line."""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping

__all__ = ["EnvFileError", "parse_env_file", "load_env_file"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_ASSIGN = re.compile(r"[ \t]*(?:export[ \t]+)?([^=\s]*)[ \t]*=[ \t]*")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$"}


class EnvFileError(ValueError):
    """A line of the file cannot be read; the message names the file and the line."""


def parse_env_file(path: str, environ: MutableMapping[str, str] | None = None
                   ) -> list[tuple[str, str]]:
    """The (name, value) pairs of the file, in order. ``environ`` is where a ${VAR} not set by
    the file is looked up (os.environ by default). EnvFileError when the file cannot be read
    or a line is not one of the forms above."""
    env = os.environ if environ is None else environ
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise EnvFileError(f"--env-file {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise EnvFileError(f"--env-file {path}: not UTF-8 text ({exc.reason} at byte "
                           f"{exc.start})") from None
    lines = text.split("\n")
    found: dict[str, str] = {}
    out: list[tuple[str, str]] = []
    i = 0

    def fail(lineno: int, why: str) -> EnvFileError:
        return EnvFileError(f"--env-file {path}, line {lineno}: {why}")

    def expand(value: str) -> str:
        return _VAR.sub(lambda m: found.get(m.group(1), env.get(m.group(1), "")), value)

    while i < len(lines):
        lineno = i + 1
        line = lines[i].rstrip("\r")
        i += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = _ASSIGN.match(line)
        if m is None:
            shown = stripped if len(stripped) <= 40 else stripped[:40] + "..."
            raise fail(lineno, f"expected NAME=VALUE, got {shown!r}")
        name = m.group(1)
        if not _NAME.fullmatch(name):
            raise fail(lineno, f"{name!r} is not a variable name (letters, digits, '_', '.'; "
                               "not first a digit)")
        rest = line[m.end():]
        if rest[:1] in ("'", '"'):
            quote = rest[0]
            body = rest[1:]
            # The value may go on over the next lines until its closing quote.
            while True:
                end = _closing(body, quote)
                if end >= 0:
                    break
                if i >= len(lines):
                    raise fail(lineno, f"the value's {quote} is not closed")
                body += "\n" + lines[i].rstrip("\r")
                i += 1
            after = body[end + 1:].strip()
            if after and not after.startswith("#"):
                raise fail(lineno, f"text after the quoted value: {after!r}")
            value = body[:end]
            if quote == '"':
                value = expand(_unescape(value))
        else:
            # An unquoted value ends at a " #" comment; its ends are not part of it.
            value = re.split(r"[ \t]#", rest, maxsplit=1)[0].strip()
            value = expand(value)
        if "\0" in value:
            raise fail(lineno, "a value cannot hold a NUL character")
        found[name] = value
        out.append((name, value))
    return out


def _closing(body: str, quote: str) -> int:
    """Where the closing quote is in body (-1: not there); in double quotes a backslash escapes
    the next character."""
    j = 0
    while j < len(body):
        c = body[j]
        if c == "\\" and quote == '"':
            j += 2
            continue
        if c == quote:
            return j
        j += 1
    return -1


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value,
                  flags=re.DOTALL)


def load_env_file(path: str, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Put the file's variables into ``environ`` (os.environ by default), but not over one it
    already has; return the names set. EnvFileError as parse_env_file."""
    env = os.environ if environ is None else environ
    pairs = parse_env_file(path, env)
    set_names = []
    for name, value in pairs:
        if name not in env:
            env[name] = value
            set_names.append(name)
    return set_names
