"""`cyserve --help` says every option's default (cli._HelpWithDefaults)."""

from __future__ import annotations

import argparse

from cyserve import cli


def test_help_names_a_default_for_every_option() -> None:
    parser = cli.build_parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.default is argparse.SUPPRESS:
            continue  # the app argument, --help, --version
        shown = formatter._expand_help(action)
        assert "default" in shown, (action.option_strings, shown)
    text = " ".join(parser.format_help().split())
    assert "--max-body-bytes BYTES largest request body (413 beyond) (default 1048576)" in text
    assert "on shutdown (default 5.0)" in text
    assert "the seconds the request took) (default: off)" in text
