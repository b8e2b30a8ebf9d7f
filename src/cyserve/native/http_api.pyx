# The exported nogil handler API, declared in native/http_api.pxi and included in cyserve._core:
# what a GIL-free handler compiled elsewhere (it cimports cyserve._core) calls to read its request
# and build its response. Each function is a thin cast onto the engine's own (csrc/server.h,
# csrc/resp.h): the public structs in cyserve/handler.h are the engine's, renamed.
from cpython.pycapsule cimport PyCapsule_New

from cyserve.native.includes cimport server as cs


cdef int cyserve_req_header(const cyserve_request *req, const char *name, size_t name_len,
                            cyserve_str *out) noexcept nogil:
    return cs.server_req_header(<const cs.req_t *>req, name, name_len, out)

cdef int cyserve_resp_status(cyserve_response *resp, int status) noexcept nogil:
    return cs.resp_set_status(<cs.resp_t *>resp, status)

cdef int cyserve_resp_header(cyserve_response *resp, const char *name, size_t name_len,
                             const char *value, size_t value_len) noexcept nogil:
    return cs.resp_add_header(<cs.resp_t *>resp, name, name_len, value, value_len)

cdef int cyserve_resp_trailer(cyserve_response *resp, const char *name, size_t name_len,
                              const char *value, size_t value_len) noexcept nogil:
    return cs.resp_add_trailer(<cs.resp_t *>resp, name, name_len, value, value_len)

cdef int cyserve_resp_set_content_type(cyserve_response *resp, const char *value,
                                       size_t value_len) noexcept nogil:
    return cs.resp_set_content_type(<cs.resp_t *>resp, value, value_len)

cdef int cyserve_resp_write(cyserve_response *resp, const char *data, size_t len) noexcept nogil:
    return cs.resp_write(<cs.resp_t *>resp, data, len)

cdef int cyserve_resp_set_body_static(cyserve_response *resp, const char *data,
                                      size_t len) noexcept nogil:
    return cs.resp_set_body_static(<cs.resp_t *>resp, data, len)

cdef void *cyserve_resp_alloc(cyserve_response *resp, size_t size) noexcept nogil:
    return cs.resp_alloc(<cs.resp_t *>resp, size)

cdef object cyserve_handler_capsule(cyserve_nogil_handler fn):
    if fn == NULL:
        raise ValueError("cyserve_handler_capsule: NULL handler")
    return PyCapsule_New(<void *>fn, b"cyserve.nogil_handler", NULL)
