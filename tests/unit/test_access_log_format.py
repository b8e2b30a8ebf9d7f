"""cyserve.access_log: gunicorn's atoms compiled once into the engine's steps; every mistake in
a format is a one-line error before anything starts."""

from __future__ import annotations

import pytest

from cyserve.config import Config
from cyserve.errors import ConfigError
from cyserve.access_log import ATOMS, compile_format

GUNICORN_DEFAULT = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'


def test_gunicorns_default_format_compiles_to_steps() -> None:
    assert compile_format(GUNICORN_DEFAULT) == [
        ("HOST", ""), ("TEXT", " "), ("DASH", ""), ("TEXT", " "), ("DASH", ""), ("TEXT", " "),
        ("TIME", ""), ("TEXT", ' "'), ("REQLINE", ""), ("TEXT", '" '), ("STATUS", ""),
        ("TEXT", " "), ("BYTES", ""), ("TEXT", ' "'), ("REFERER", ""), ("TEXT", '" "'),
        ("AGENT", ""), ("TEXT", '"')]


def test_every_atom_and_request_headers() -> None:
    for letter, name in ATOMS.items():
        assert compile_format(f"%({letter})s") == [(name, "")]
    assert compile_format("id=%({X-Request-ID}i)s 50%% %(D)sus") == [
        ("TEXT", "id="), ("HEADER", "x-request-id"), ("TEXT", " 50% "), ("MICROS", ""),
        ("TEXT", "us")]


@pytest.mark.parametrize(("fmt", "says"), [
    ("%(h)s %(x)s", "unknown atom %(x)s"),
    ("%(h)s %({Content-Type}o)s", "is not supported"),
    ("%(h)s %({HOME}e)s", "is not supported"),
    ("%(h)s %({bad header}i)s", "unknown atom"),
    ("%(h)s 100%", "a '%' at column 10 starts no %(name)s atom"),
    ("%(h)d", "a '%' at column 1 starts no %(name)s atom"),
    ("no atoms %%", "needs at least one %(name)s atom"),
    ("%(h)s\n", "one line of ASCII"),
    ("%(h)s é", "one line of ASCII"),
    ("%(h)s" + " " * 3000, "longer than"),
    (" ".join(["%({X}i)s"] * 17), "more than 16 header atoms"),
])
def test_mistakes_are_one_line_errors(fmt: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        compile_format(fmt)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_config_takes_a_format_of_atoms_and_refuses_a_bad_one() -> None:
    assert Config(access_log_format=GUNICORN_DEFAULT).access_log_format == GUNICORN_DEFAULT
    with pytest.raises(ConfigError) as info:
        Config(access_log_format="%(h)s %(nope)s")
    assert info.value.for_cli().startswith(
        "invalid --access-log-format '%(h)s %(nope)s': unknown atom %(nope)s (known: ")
