# cython: language_level=3
# Extern declarations of csrc/http_parse.h and http_method.h, for the engine's Cython code and
# the parser test hook. Compiled into cyserve._core and, for the parser hooks,
# cyserve._testhooks (each links its own copy of csrc/http_parse.c). Contracts: see the headers.
from libc.stdint cimport int64_t, uint64_t

# The method enum: the parser gives each request one, the router keeps a bit per value. Its
# values come from the header, never numbered again in Cython.
cdef extern from "csrc/http_method.h" nogil:
    enum http_method:
        HTTP_OTHER
        HTTP_GET
        HTTP_HEAD
        HTTP_POST
        HTTP_PUT
        HTTP_DELETE
        HTTP_PATCH
        HTTP_OPTIONS
        HTTP_CONNECT
        HTTP_TRACE

cdef extern from "csrc/http_parse.h" nogil:
    struct http_header:
        const char *name
        size_t name_len
        const char *value
        size_t value_len

    struct http_limits:
        size_t max_header_bytes
        size_t max_target_bytes
        unsigned max_headers

    struct http_request:
        const char *method
        size_t method_len
        http_method method_id
        const char *target
        size_t target_len
        const char *path
        size_t path_len
        const char *query
        size_t query_len
        int minor_version
        http_header *headers
        size_t num_headers
        int64_t content_length
        int chunked
        int keep_alive
        int expect_continue
        int upgrade
        const char *host
        size_t host_len
        int status
        const char *error

    void http_limits_default(http_limits *lim)
    int http_parse_request(const char *buf, size_t len, http_request *req,
                           const http_limits *lim)

    struct http_chunked:
        uint64_t remaining
        int state
        uint64_t total
        size_t trailer_bytes
        unsigned aux
        int status
        const char *error

    enum:
        HTTP_CHUNK_EXT_MAX

    int64_t http_chunked_decode(http_chunked *st, char *buf, size_t *len,
                                size_t max_trailer_bytes)
