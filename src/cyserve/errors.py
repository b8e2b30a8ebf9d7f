"""The exceptions cyserve's Python layer raises on purpose.

Each one carries a message meant to be shown to a person as it is: the CLI prints
``cyserve: <message>`` on one line and exits, so messages name the thing that is wrong and the
value that was given, without a trailing period.
"""

from __future__ import annotations

__all__ = ["CyserveError", "ConfigError", "RouteError", "HandlerTypeError", "AppLoadError",
           "ListenError"]


class CyserveError(Exception):
    """Base class of every error cyserve raises on purpose."""


class ConfigError(CyserveError, ValueError):
    """An option has a value cyserve cannot run with.

    ``option`` is the option's Python name (``max_body_bytes``); the CLI shows it as
    ``--max-body-bytes``. ``value`` is the value as given, ``reason`` says what is allowed.
    """

    def __init__(self, option: str, value: object, reason: str) -> None:
        self.option = option
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {option} {value!s}: {reason}")

    @property
    def cli_option(self) -> str:
        """The command line's name of the option (``max-body-bytes``; ``reload-dir`` for the
        field reload_dirs, whose option is given once per folder)."""
        return _CLI_NAMES.get(self.option, self.option).replace("_", "-")

    def for_cli(self) -> str:
        """The message with the option spelt as on the command line."""
        return f"invalid --{self.cli_option} {self.value!s}: {self.reason}"


# Config fields whose command-line option has another name.
_CLI_NAMES = {"reload_dirs": "reload_dir", "reload_includes": "reload_include",
              "reload_excludes": "reload_exclude", "proc_name": "name", "headers": "header"}


class RouteError(CyserveError, ValueError):
    """A route cannot be registered: a bad pattern, a bad handler or a duplicate."""


class HandlerTypeError(RouteError, TypeError):
    """A handler is neither a callable nor a nogil handler capsule (a TypeError as well)."""


class AppLoadError(CyserveError):
    """The ``module:attribute`` given to the CLI does not lead to a cyserve.App."""


class ListenError(CyserveError, OSError):
    """The server could not bind or listen on the address it was given.

    Raised by :func:`cyserve.run` with the message ``cannot listen on HOST:PORT: REASON`` and
    ``errno`` set from the underlying OSError.
    """
