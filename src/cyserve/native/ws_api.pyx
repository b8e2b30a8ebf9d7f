# The exported GIL-free WebSocket API, declared in native/ws_api.pxi and included in
# cyserve._core: thin casts onto the engine's csrc/ws_nogil.h (the public cyserve_ws is its
# struct wsn).

cdef int cyserve_ws_send(cyserve_ws *ws, int opcode, const char *data,
                         size_t len) noexcept nogil:
    return cs.wsn_send(<cs.wsn_t *>ws, opcode, data, len)

cdef int cyserve_ws_close(cyserve_ws *ws, int code, const char *reason,
                          size_t len) noexcept nogil:
    return cs.wsn_close(<cs.wsn_t *>ws, code, reason, len)

cdef void cyserve_ws_set_data(cyserve_ws *ws, void *data) noexcept nogil:
    cs.wsn_set_data(<cs.wsn_t *>ws, data)

cdef void *cyserve_ws_data(cyserve_ws *ws) noexcept nogil:
    return cs.wsn_data(<cs.wsn_t *>ws)

cdef object cyserve_ws_handler_capsule(const cyserve_ws_handler *handler):
    if handler == NULL or handler.on_open == NULL:
        raise ValueError("cyserve_ws_handler_capsule: a handler with on_open is required")
    return PyCapsule_New(<void *>handler, b"cyserve.nogil_ws_handler", NULL)
