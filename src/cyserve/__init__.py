"""cyserve: a multi-core HTTP server for Python whose core is C and Cython."""

from __future__ import annotations

import os
from typing import Any

__version__ = "0.1.0"

# Imported after __version__: cli.py, loaded through these, reads it.
from .app import App  # noqa: E402
from .errors import ConfigError, CyserveError, ListenError, RouteError  # noqa: E402
from .start import run  # noqa: E402


def get_include() -> str:
    """The folder holding cyserve's C headers (cyserve/handler.h), for extensions that cimport
    cyserve._core: pass it in include_dirs."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


# Names that live in the native extension (the request and its body, the response, the errors
# a streamed body's reads raise).
_NATIVE = ("Request", "Response", "RequestBody", "RequestBodyError", "RequestBodyTooLarge",
           "RequestBodyTimeout", "RequestBodyMalformed", "ClientDisconnectedError")


def __getattr__(name: str) -> Any:
    # Request and Response live in the native extension. Importing them lazily keeps
    # `import cyserve` (and get_include(), which builds need before _core exists) working
    # without the extension.
    if name in _NATIVE:
        from . import _core

        return getattr(_core, name)
    raise AttributeError(f"module 'cyserve' has no attribute {name!r}")


__all__ = ["App", "Request", "Response", "run", "get_include", "ConfigError", "CyserveError",
           "ListenError", "RouteError", "__version__", "RequestBody", "RequestBodyError",
           "RequestBodyTooLarge", "RequestBodyTimeout", "RequestBodyMalformed",
           "ClientDisconnectedError"]
