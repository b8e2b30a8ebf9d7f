# cython: language_level=3, boundscheck=False, wraparound=False
"""cyserve's GIL-free handlers for the benchmark: /plaintext, /fib, /welcome, /loop, /transfer.

Compiled by bench/http/build_nogil.py against cyserve.get_include() into bench/.build/. Each handler
is `noexcept nogil`: the worker calls it straight from C, inside the connection's coroutine, and
the GIL is never taken. /msgpack and /json need Python objects and are measured in cyserve-py.
"""

from libc.stdio cimport snprintf
from libc.stdlib cimport malloc
from libc.string cimport memcpy

from cyserve._core cimport (cyserve_request, cyserve_response, cyserve_resp_status,
                            cyserve_resp_write, cyserve_resp_set_content_type,
                            cyserve_resp_set_body_static,
                            cyserve_handler_capsule)

from bench.http import workloads as _workloads

# The transfer body, copied once into memory that lives as long as the process (never freed): the
# handler reads it without the GIL, so it cannot borrow a Python bytes object's buffer, and
# cyserve_resp_set_body_static may hand it to the server without a copy per response.
cdef char *TRANSFER = NULL
cdef size_t TRANSFER_LEN = 0


cdef int _load_transfer() except -1:
    global TRANSFER, TRANSFER_LEN
    with open(_workloads.TRANSFER_PATH, "rb") as f:
        data = f.read()
    TRANSFER = <char *>malloc(len(data))
    if TRANSFER == NULL:
        raise MemoryError()
    memcpy(TRANSFER, <const char *>data, len(data))
    TRANSFER_LEN = len(data)
    return 0


_load_transfer()


cdef inline int _text(cyserve_response *resp, const char *body, size_t n) noexcept nogil:
    cdef int rc = cyserve_resp_status(resp, 200)
    if rc == 0:
        rc = cyserve_resp_set_content_type(resp, b"text/plain", 10)
    if rc == 0:
        rc = cyserve_resp_write(resp, body, n)
    return rc


cdef unsigned int fibonacci(unsigned int n) noexcept nogil:
    # the /fib workload's loop; unsigned int wraps at 2^32 like Go's uint32.
    cdef unsigned int i, a = 0, b = 1, t
    for i in range(n):
        t = a + b
        a = b
        b = t
    return a


cdef long long loop_value() noexcept nogil:
    cdef long long i, acc = 0
    for i in range(1000000):
        acc += i * 3
        if acc > 1000000007:
            acc -= 1000000007
    return acc


cdef int h_plaintext(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    return _text(resp, b"Hello, World!", 13)


cdef int h_welcome(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    return _text(resp, b"Welcome!\n", 9)


cdef int h_fib(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    cdef char buf[64]
    cdef int n = snprintf(buf, sizeof(buf), b"Fibonacci(10^6) = %u (with overflow)\n",
                          fibonacci(1000000))
    return _text(resp, buf, <size_t>n)


cdef int h_loop(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    cdef char buf[32]
    cdef int n = snprintf(buf, sizeof(buf), b"%lld\n", loop_value())
    return _text(resp, buf, <size_t>n)


cdef int h_transfer(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    cdef int rc = cyserve_resp_status(resp, 200)
    if rc == 0:
        rc = cyserve_resp_set_content_type(resp, b"application/json", 16)
    if rc == 0:
        # TRANSFER lives as long as the process: the server sends it from there, no copy.
        rc = cyserve_resp_set_body_static(resp, TRANSFER, TRANSFER_LEN)
    return rc


HANDLERS = {
    "/plaintext": cyserve_handler_capsule(h_plaintext),
    "/fib": cyserve_handler_capsule(h_fib),
    "/welcome": cyserve_handler_capsule(h_welcome),
    "/loop": cyserve_handler_capsule(h_loop),
    "/transfer": cyserve_handler_capsule(h_transfer),
}
