# cython: language_level=3
"""cyserve._core: the one native extension. It owns the C runtime in csrc/ and exports the
C-level API declared in _core.pxd to other Cython modules (see STYLE.md section 2(c)).

The pieces live in native/*.pyx and are included here because they share C state."""

include "native/sched.pyx"
include "native/server.pyx"
include "native/wsgi.pyx"
include "native/parser_hook.pyx"
