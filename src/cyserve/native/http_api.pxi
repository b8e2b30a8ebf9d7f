# The GIL-free handler API of cyserve (STYLE.md 2(c)), included in _core.pxd. A user module
# cimports these from cyserve._core and builds with include_dirs=[cyserve.get_include()].
#
# A handler is `cdef int handler(cyserve_request *req, cyserve_response *resp, void *ctx)
# noexcept nogil`: it runs on a worker thread without the GIL, returns 0 when it filled resp, or
# non-zero to make the server answer 500. Everything reachable from req is a view valid until the
# handler returns. Register it from Python with cyserve_handler_capsule(handler).
from libc.stdint cimport int64_t

cdef extern from "cyserve/handler.h" nogil:
    ctypedef struct cyserve_str:
        const char *ptr
        size_t len
    ctypedef struct cyserve_header:
        cyserve_str name
        cyserve_str value
    ctypedef struct cyserve_param:
        cyserve_str name
        cyserve_str value
        int64_t ival
    ctypedef struct cyserve_request:
        cyserve_str method
        cyserve_str target
        cyserve_str path
        cyserve_str query
        int minor_version
        const cyserve_header *headers
        size_t num_headers
        cyserve_str body
        const cyserve_param *params
        size_t num_params
    ctypedef struct cyserve_response:
        pass
    ctypedef int (*cyserve_nogil_handler)(cyserve_request *req, cyserve_response *resp,
                                          void *ctx) noexcept nogil
    # static inline in the header: compiled into the consumer, no call across modules.
    bint cyserve_str_eq(cyserve_str s, const char *lit, size_t n)

# All return 0 or -errno and may be called without the GIL, from a handler, on its req/resp only.

# First header named name[0..name_len) (case-insensitive): 0 and *out set, or -ENOENT.
cdef int cyserve_req_header(const cyserve_request *req, const char *name, size_t name_len,
                            cyserve_str *out) noexcept nogil
# The status (200..599, else -EINVAL: it is the final one). Default 200. A 204, 205 or 304 has no
# content (RFC 9110 6.4.1, 15.3.6): given body bytes as well, the answer is the handler's failure,
# a 500 (and a line on standard error), as the Python handlers, WSGI and ASGI refuse it.
cdef int cyserve_resp_status(cyserve_response *resp, int status) noexcept nogil
# Add a header line. -EINVAL for a name that is not a token or a value with a control character
# other than HTAB; -EPERM for Content-Length, Transfer-Encoding, Date (the server writes them)
# and Connection other than "close"; -ENOMEM. A Server header replaces the server's own
# ("Server: cyserve"); a second one is -EEXIST.
cdef int cyserve_resp_header(cyserve_response *resp, const char *name, size_t name_len,
                             const char *value, size_t value_len) noexcept nogil
# Add a trailer field, sent after the body (RFC 9110 6.5) to a client whose request had
# TE: trailers and dropped for others: on HTTP/1.1 the body then goes out chunked (one chunk, the
# trailer section after it; an HTTP/1.0 client gets the body with its length and no trailers), on
# HTTP/2 the fields are the HEADERS frame that ends the stream. A 204 or 304 has no content for
# them to follow: they are dropped. -EINVAL as cyserve_resp_header's (a name that is no token, a
# control character but HTAB in the value: no CR, LF or NUL); -EPERM for the fields that cannot
# be trailers (RFC 9110 6.5.1): Content-Length, Transfer-Encoding, Trailer, Host, Connection,
# Keep-Alive, Proxy-Connection, TE, Upgrade, Content-Type, Content-Encoding, Content-Range;
# -ENOMEM. A Trailer header naming them (cyserve_resp_header) is the handler's to add.
cdef int cyserve_resp_trailer(cyserve_response *resp, const char *name, size_t name_len,
                              const char *value, size_t value_len) noexcept nogil
# Content-Type (default text/plain; charset=utf-8 when the body is not empty); -EEXIST if set.
cdef int cyserve_resp_set_content_type(cyserve_response *resp, const char *value,
                                       size_t value_len) noexcept nogil
# Append to the body (copied). -ENOMEM; -EEXIST after cyserve_resp_set_body_static.
cdef int cyserve_resp_write(cyserve_response *resp, const char *data, size_t len) noexcept nogil
# Make data[0..len) the whole body WITHOUT copying it: the server writes it to the socket straight
# from there. data must outlive the server and stay unchanged while it runs (a static array, or a
# buffer allocated once at import and never freed). A body over 16 KiB is copied once, on its first
# use, into a sealed memfd that later responses sendfile() from (at most 64 distinct bodies, then
# writev from data): changing data afterwards is not seen. Exclusive with cyserve_resp_write: -EEXIST if
# the body has bytes already or a static body was set; -EINVAL for NULL with len > 0.
cdef int cyserve_resp_set_body_static(cyserve_response *resp, const char *data,
                                      size_t len) noexcept nogil
# size bytes of request-scoped memory (16-byte aligned, freed by the server), or NULL.
cdef void *cyserve_resp_alloc(cyserve_response *resp, size_t size) noexcept nogil

# Needs the GIL: a PyCapsule named "cyserve.nogil_handler" wrapping fn, for app.nogil(...) or a
# "nogil" route. Raises ValueError for NULL.
cdef object cyserve_handler_capsule(cyserve_nogil_handler fn)
