"""--env-file's reader (cyserve.envfile): the forms it takes, and the line it names when one is
not one of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cyserve.envfile import EnvFileError, load_env_file, parse_env_file


def _parse(tmp_path: Path, text: str, env: dict[str, str] | None = None
           ) -> list[tuple[str, str]]:
    f = tmp_path / "app.env"
    f.write_text(text)
    return parse_env_file(str(f), {} if env is None else env)


def test_the_forms_it_reads(tmp_path: Path) -> None:
    text = ("# a comment\n"
            "\n"
            "export A=1\n"
            "  B = two words   # a comment after the value\n"
            "C='as written: $A ${A} \\n'\n"
            'D="escapes \\t \\" \\\\ \\$ and ${A}"\n'
            'E="over\n'
            'two lines"\n'
            "F=\n"
            "G=${A}${UNSET}-${FROM_ENV}\n"
            "H=a#b\n"
            "I='# not a comment' # but this is\n"
            "J.K=dotted\r\n")
    assert _parse(tmp_path, text, {"FROM_ENV": "env"}) == [
        ("A", "1"), ("B", "two words"), ("C", "as written: $A ${A} \\n"),
        ("D", 'escapes \t " \\ $ and 1'), ("E", "over\ntwo lines"), ("F", ""),
        ("G", "1-env"), ("H", "a#b"), ("I", "# not a comment"), ("J.K", "dotted")]


@pytest.mark.parametrize(("text", "message"), [
    ("A=1\noops\n", "line 2: expected NAME=VALUE, got 'oops'"),
    ("A=1\n\n1A=2\n", "line 3: '1A' is not a variable name"),
    ("=x\n", "line 1: '' is not a variable name"),
    ('A="open\nB=2\n', "line 1: the value's \" is not closed"),
    ("A='x' y\n", "line 1: text after the quoted value: 'y'"),
    ('A="x\\0"\nB="\0"\n', "line 2: a value cannot hold a NUL character"),
])
def test_a_malformed_line_is_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(EnvFileError) as err:
        _parse(tmp_path, text)
    assert str(err.value).startswith(f"--env-file {tmp_path / 'app.env'}, {message}")
    assert "\n" not in str(err.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(EnvFileError, match=r"^--env-file .*nope\.env: cannot read it: No such "
                                           r"file or directory$"):
        parse_env_file(str(tmp_path / "nope.env"))


def test_the_environment_keeps_what_it_has(tmp_path: Path) -> None:
    f = tmp_path / "app.env"
    f.write_text("KEPT=file\nNEW=file\n")
    env = {"KEPT": "env"}
    assert load_env_file(str(f), env) == ["NEW"]
    assert env == {"KEPT": "env", "NEW": "file"}
