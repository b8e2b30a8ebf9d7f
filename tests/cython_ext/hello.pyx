# cython: language_level=3
"""A third-party Cython module written against cyserve's public C-level API (STYLE.md 2(c)):
a root and a Fibonacci handler, plus handlers that exercise the rest of the nogil API for
tests/test_nogil_handlers.py. It cimports cyserve._core and is built with
include_dirs=[cyserve.get_include()]."""

from libc.stdio cimport snprintf
from libc.string cimport strlen
from cpython.pycapsule cimport PyCapsule_New

from cyserve._core cimport (
    cyserve_handler_capsule, cyserve_request, cyserve_response, cyserve_str, cyserve_str_eq,
    cyserve_req_header, cyserve_resp_status, cyserve_resp_header, cyserve_resp_write,
    cyserve_resp_alloc, cyserve_resp_set_content_type, cyserve_resp_set_body_static,
    cyserve_resp_trailer,
)


cdef int handle_root(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    return cyserve_resp_write(resp, b"Hello, World!", 13)


cdef unsigned int fibonacci(unsigned int n) noexcept nogil:
    # uint32 wrap-around on purpose: the /fib workload defines the answer by it
    # (docs/benchmarks.md#where-the-workloads-come-from).
    cdef unsigned int i, a = 0, b = 1, t
    for i in range(n):
        t = a + b
        a = b
        b = t
    return a


cdef int handle_fibonacci(cyserve_request *req, cyserve_response *resp,
                          void *ctx) noexcept nogil:
    cdef char buf[80]
    cdef int n = snprintf(buf, sizeof(buf), b"Fibonacci(10^6) = %u (with overflow)\n",
                          fibonacci(1000000))
    return cyserve_resp_write(resp, buf, <size_t>n)


cdef int put(cyserve_response *resp, const char *label, cyserve_str s) noexcept nogil:
    cdef int rc = cyserve_resp_write(resp, label, strlen(label))
    if rc == 0:
        rc = cyserve_resp_write(resp, s.ptr, s.len)
    if rc == 0:
        rc = cyserve_resp_write(resp, b"\n", 1)
    return rc


cdef int handle_inspect(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    # Everything a handler can read, echoed one field per line.
    cdef cyserve_str v
    cdef size_t i
    cdef char *scratch
    cdef int n
    put(resp, b"method=", req.method)
    put(resp, b"path=", req.path)
    put(resp, b"query=", req.query)
    put(resp, b"body=", req.body)
    if cyserve_req_header(req, b"x-test", 6, &v) == 0:
        put(resp, b"x-test=", v)
    else:
        cyserve_resp_write(resp, b"x-test absent\n", 14)
    for i in range(req.num_params):
        put(resp, b"param=", req.params[i].value)
    # Request-scoped memory: never freed by the handler.
    scratch = <char *>cyserve_resp_alloc(resp, 64)
    if scratch == NULL:
        return -1
    n = snprintf(scratch, 64, b"headers=%d method-is-post=%d\n", <int>req.num_headers,
                 <int>cyserve_str_eq(req.method, b"POST", 4))
    cyserve_resp_write(resp, scratch, <size_t>n)
    cyserve_resp_status(resp, 201)
    cyserve_resp_header(resp, b"X-Nogil", 7, b"yes", 3)
    return cyserve_resp_set_content_type(resp, b"text/x-inspect", 14)


cdef int handle_fail(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    cyserve_resp_write(resp, b"partial", 7)
    return -1


cdef int handle_no_content_body(cyserve_request *req, cyserve_response *resp,
                                void *ctx) noexcept nogil:
    # Every call succeeds; the mistake is the answer's: a 204 has no content (a 500 then).
    cdef int rc = cyserve_resp_status(resp, 204)
    return rc if rc else cyserve_resp_write(resp, b"oops", 4)


cdef int handle_no_content_trailer(cyserve_request *req, cyserve_response *resp,
                                   void *ctx) noexcept nogil:
    # A 304 given a trailer: no body for it to follow, the answer's mistake too (a 500).
    cdef int rc = cyserve_resp_status(resp, 304)
    return rc if rc else cyserve_resp_trailer(resp, b"X-Checksum", 10, b"abc", 3)


cdef int handle_fail_closing(cyserve_request *req, cyserve_response *resp,
                             void *ctx) noexcept nogil:
    cyserve_resp_header(resp, b"Connection", 10, b"close", 5)
    return -1


cdef int handle_bad_header(cyserve_request *req, cyserve_response *resp,
                           void *ctx) noexcept nogil:
    # The API refuses header injection; the handler reports what it was told.
    cdef char buf[64]
    cdef int rc = cyserve_resp_header(resp, b"X-Evil", 6, b"a\r\nSet-Cookie: x", 16)
    cdef int n = snprintf(buf, sizeof(buf), b"rc=%d", rc)
    return cyserve_resp_write(resp, buf, <size_t>n)


cdef int handle_own_server(cyserve_request *req, cyserve_response *resp,
                           void *ctx) noexcept nogil:
    # The handler's Server replaces the engine's; a second one is refused (not a list).
    cdef char buf[64]
    cdef int rc1 = cyserve_resp_header(resp, b"Server", 6, b"hello-nogil", 11)
    cdef int rc2 = cyserve_resp_header(resp, b"Server", 6, b"again", 5)
    cdef int n = snprintf(buf, sizeof(buf), b"rc=%d,%d", rc1, rc2)
    return cyserve_resp_write(resp, buf, <size_t>n)


cdef int handle_ctx(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    cdef const char *s = <const char *>ctx
    return cyserve_resp_write(resp, s, strlen(s))


cdef extern from *:
    """
    #include <stdatomic.h>
    #include <time.h>
    /* A CPU-bound handler that spins until released (or max_ms), and its probes: shared by
     * every worker thread, hence atomics. */
    static atomic_int hello_spinning;
    static atomic_int hello_release;
    static void hello_spin(int max_ms)
    {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        atomic_store(&hello_release, 0);
        atomic_store(&hello_spinning, 1);
        while (!atomic_load(&hello_release)) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 >= max_ms)
                break;
        }
        atomic_store(&hello_spinning, 0);
    }
    static int hello_is_spinning(void) { return atomic_load(&hello_spinning); }
    static void hello_do_release(void) { atomic_store(&hello_release, 1); }
    """
    void hello_spin(int max_ms) noexcept nogil
    int hello_is_spinning() noexcept nogil
    void hello_do_release() noexcept nogil


cdef int handle_hog(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    hello_spin(5000)
    return cyserve_resp_write(resp, b"hog done", 8)


cdef int handle_probe(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    if hello_is_spinning():
        return cyserve_resp_write(resp, b"spinning", 8)
    return cyserve_resp_write(resp, b"free", 4)


cdef int handle_release(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    hello_do_release()
    return cyserve_resp_write(resp, b"released", 8)


cdef int handle_maybe(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    # Quick, unless the query is a number of milliseconds to spin for first (for the inline
    # path's verdicts, tests/test_inline_path.py).
    cdef int ms = 0
    cdef size_t i
    for i in range(req.query.len):
        if req.query.ptr[i] < 48 or req.query.ptr[i] > 57:
            return -1
        ms = ms * 10 + (req.query.ptr[i] - 48)
    if ms > 0:
        hello_spin(ms)
        return cyserve_resp_write(resp, b"slow", 4)
    return cyserve_resp_write(resp, b"quick", 5)


# A body that lives as long as the process, for cyserve_resp_set_body_static; byte i is
# (i * 7 + i // 251) & 0xff, so a misplaced or repeated chunk shows. Larger than the engine's
# copy threshold, so it goes out by writev straight from here.
cdef enum:
    BIG_LEN = 150000
cdef unsigned char BIG[BIG_LEN]
cdef size_t _i
for _i in range(BIG_LEN):
    BIG[_i] = (_i * 7 + _i // 251) & 0xff


cdef int handle_big(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    cdef int rc = cyserve_resp_set_content_type(resp, b"application/octet-stream", 24)
    if rc == 0:
        rc = cyserve_resp_set_body_static(resp, <const char *>BIG, BIG_LEN)
    return rc


cdef int handle_big_tail(cyserve_request *req, cyserve_response *resp,
                         void *ctx) noexcept nogil:
    # The same memory from another start and length: a different body for the server.
    return cyserve_resp_set_body_static(resp, <const char *>BIG + 1000, BIG_LEN - 1000)


cdef int handle_static_exclusive(cyserve_request *req, cyserve_response *resp,
                                 void *ctx) noexcept nogil:
    # A static body and written bytes do not mix, in either order; the codes are reported in a
    # header and the static body (a small one here) is what is sent.
    cdef char buf[64]
    cdef int a, b, c, n
    a = cyserve_resp_set_body_static(resp, b"static!", 7)
    b = cyserve_resp_write(resp, b"x", 1)
    c = cyserve_resp_set_body_static(resp, b"again", 5)
    n = snprintf(buf, sizeof(buf), b"%d %d %d", a, b, c)
    return cyserve_resp_header(resp, b"X-Codes", 7, buf, <size_t>n)


cdef const char *CTX_TEXT = b"context says hi"

cdef int handle_trailers(cyserve_request *req, cyserve_response *resp,
                         void *ctx) noexcept nogil:
    # Trailer fields after the body (none with ?empty: a gRPC-style error); the codes of the
    # fields the API must refuse go out in X-Refused, and none of those fields may be sent.
    cdef char buf[96]
    cdef int bad_name = cyserve_resp_trailer(resp, b"bad name", 8, b"1", 1)
    cdef int crlf = cyserve_resp_trailer(resp, b"X-Split", 7, b"1\r\nX-Evil: 2", 13)
    cdef int nul = cyserve_resp_trailer(resp, b"X-Nul", 5, b"a\x00b", 3)
    cdef int length = cyserve_resp_trailer(resp, b"Content-Length", 14, b"3", 1)
    cdef int te = cyserve_resp_trailer(resp, b"TE", 2, b"trailers", 8)
    cdef int n = snprintf(buf, sizeof(buf), b"%d,%d,%d,%d,%d", bad_name, crlf, nul, length, te)
    cdef int rc = cyserve_resp_header(resp, b"X-Refused", 9, buf, <size_t>n)
    if rc == 0:
        rc = cyserve_resp_header(resp, b"Trailer", 7, b"X-Checksum, Grpc-Status", 23)
    if rc == 0 and not cyserve_str_eq(req.query, b"empty", 5):
        rc = cyserve_resp_write(resp, b"hello world", 11)
    if rc == 0:
        rc = cyserve_resp_trailer(resp, b"X-Checksum", 10, b"abc", 3)
    if rc == 0:
        rc = cyserve_resp_trailer(resp, b"Grpc-Status", 11, b"0", 1)
    return rc


ROOT = cyserve_handler_capsule(handle_root)
TRAILERS = cyserve_handler_capsule(handle_trailers)
FIBONACCI = cyserve_handler_capsule(handle_fibonacci)
INSPECT = cyserve_handler_capsule(handle_inspect)
FAIL = cyserve_handler_capsule(handle_fail)
FAIL_CLOSING = cyserve_handler_capsule(handle_fail_closing)
NO_CONTENT_BODY = cyserve_handler_capsule(handle_no_content_body)
NO_CONTENT_TRAILER = cyserve_handler_capsule(handle_no_content_trailer)
BAD_HEADER = cyserve_handler_capsule(handle_bad_header)
OWN_SERVER = cyserve_handler_capsule(handle_own_server)
HOG = cyserve_handler_capsule(handle_hog)
PROBE = cyserve_handler_capsule(handle_probe)
RELEASE = cyserve_handler_capsule(handle_release)
MAYBE = cyserve_handler_capsule(handle_maybe)
BIG_STATIC = cyserve_handler_capsule(handle_big)
BIG_TAIL = cyserve_handler_capsule(handle_big_tail)
STATIC_EXCLUSIVE = cyserve_handler_capsule(handle_static_exclusive)
CTX = (cyserve_handler_capsule(handle_ctx), PyCapsule_New(<void *>CTX_TEXT, b"hello.ctx", NULL))
