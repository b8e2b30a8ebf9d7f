# cython: language_level=3
"""cyserve._core: the one native extension. It owns the C runtime in csrc/ and exports the
C-level API declared in _core.pxd to other Cython modules (see STYLE.md section 2(c)).

The pieces live in native/*.pyx and are included here because they share C state: the coroutine
runtime's API (sched.pyx), the exported nogil handler API (http_api.pyx), one file per Python-level
handler kind (python_handler.pyx, then wsgi.pyx and asgi.pyx, which build on it), and the Server type that
routes to them (server_type.pyx). Hooks for tests and benchmarks are in the separate extension
cyserve._testhooks, built only for them."""

include "native/sched.pyx"
include "native/http_api.pyx"
include "native/ws_api.pyx"
include "native/python_handler.pyx"
include "native/wsgi.pyx"
include "native/asgi.pyx"
include "native/asgi_ws.pyx"
include "native/metrics.pyx"
include "native/server_type.pyx"
