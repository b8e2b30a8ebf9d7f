# cython: language_level=3
"""A GIL-free WebSocket echo, written against cyserve's public C-level API.

Its callbacks run on a worker thread without the GIL, straight from C, in the connection's
coroutine; between messages the connection is idle and holds no coroutine. Build it with
examples/build.py (make build does), then register the capsule:

    from examples import ws_echo_nogil
    app.nogil_websocket("/echo", ws_echo_nogil.ECHO)
"""

from cyserve._core cimport (
    cyserve_request,
    cyserve_response,
    cyserve_ws,
    cyserve_ws_handler,
    cyserve_ws_handler_capsule,
    cyserve_ws_send,
)


cdef int on_open(cyserve_ws *ws, cyserve_request *req, cyserve_response *resp,
                 void *ctx) noexcept nogil:
    return 0  # accept every valid handshake


cdef int on_message(cyserve_ws *ws, int opcode, const char *data, size_t length,
                    void *ctx) noexcept nogil:
    # The same kind of message back; the engine copies it (data lives until we return).
    return cyserve_ws_send(ws, opcode, data, length)


cdef cyserve_ws_handler HANDLER
HANDLER.on_open = on_open
HANDLER.on_message = on_message
HANDLER.on_close = NULL

ECHO = cyserve_ws_handler_capsule(&HANDLER)
