"""cyserve: a multi-core HTTP server for Python whose core is C and Cython."""

import os

__version__ = "0.1.0"


def get_include() -> str:
    """The folder holding cyserve's C headers (cyserve/handler.h), for extensions that cimport
    cyserve._core: pass it in include_dirs."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


__all__ = ["get_include", "__version__"]
