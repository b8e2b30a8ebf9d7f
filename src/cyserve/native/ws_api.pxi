# The GIL-free WebSocket API of cyserve, included in _core.pxd beside the GIL-free handler API
# (http_api.pxi). A user module cimports these from cyserve._core and builds with
# include_dirs=[cyserve.get_include()]; cyserve/handler.h tells when each callback runs.
#
# A route is a cyserve_ws_handler of three callbacks, each `noexcept nogil`, run on the worker
# in the connection's coroutine without the GIL:
#   int on_open(cyserve_ws *ws, cyserve_request *req, cyserve_response *resp, void *ctx)
#       0 accepts (101), else refuses with resp (403 unless a status was set)
#   int on_message(cyserve_ws *ws, int opcode, const char *data, size_t len, void *ctx)
#       a whole message (CYSERVE_WS_TEXT or CYSERVE_WS_BINARY); non-zero closes with 1011
#   void on_close(cyserve_ws *ws, int code, void *ctx)
#       the last call; ws is freed after it
# Register it from Python with app.nogil_websocket(path, cyserve_ws_handler_capsule(&handler)).

cdef extern from "cyserve/handler.h" nogil:
    ctypedef struct cyserve_ws:
        pass
    enum:
        CYSERVE_WS_TEXT
        CYSERVE_WS_BINARY
    ctypedef struct cyserve_ws_handler:
        int (*on_open)(cyserve_ws *ws, cyserve_request *req, cyserve_response *resp,
                       void *ctx) noexcept nogil
        int (*on_message)(cyserve_ws *ws, int opcode, const char *data, size_t len,
                          void *ctx) noexcept nogil
        void (*on_close)(cyserve_ws *ws, int code, void *ctx) noexcept nogil

# All from ws's own callbacks only (it belongs to its connection's coroutine).

# Send a message: CYSERVE_WS_TEXT (valid UTF-8, else -EINVAL) or CYSERVE_WS_BINARY. Small ones
# are copied and written together when the callbacks of the batch return; one of 16 KiB or more
# is written at once from data. 0, -EINVAL, -EPIPE (closing or closed), -ENOMEM, or the
# socket's -errno.
cdef int cyserve_ws_send(cyserve_ws *ws, int opcode, const char *data,
                         size_t len) noexcept nogil
# Close with code (1000-1003, 1007-1014, 3000-4999; else -EINVAL) and a reason (cut at 123
# bytes); the client's close is awaited 5 s, messages meanwhile are dropped. 0, -EINVAL, -EPIPE.
cdef int cyserve_ws_close(cyserve_ws *ws, int code, const char *reason, size_t len) noexcept nogil
# A pointer of the handler's own for this connection (NULL until set); freeing what it points
# to is the handler's business (on_close).
cdef void cyserve_ws_set_data(cyserve_ws *ws, void *data) noexcept nogil
cdef void *cyserve_ws_data(cyserve_ws *ws) noexcept nogil

# Needs the GIL: a PyCapsule named "cyserve.nogil_ws_handler" for app.nogil_websocket(...).
# handler must outlive the server (a module-level struct); raises ValueError for NULL or for a
# handler without on_open.
cdef object cyserve_ws_handler_capsule(const cyserve_ws_handler *handler)
