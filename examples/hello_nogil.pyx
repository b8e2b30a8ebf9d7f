# cython: language_level=3
"""Two GIL-free handlers (a root and /fibonacci), written against cyserve's public C-level API.

Both run on a worker thread without the GIL, straight from C: nothing here touches a Python
object except the two capsules made at import time. Build it with examples/build.py (make build
does), then register the capsules:

    from examples import hello_nogil
    app.nogil("/", hello_nogil.ROOT)
    app.nogil("/fibonacci", hello_nogil.FIBONACCI)
"""

from libc.stdio cimport snprintf

from cyserve._core cimport (
    cyserve_handler_capsule,
    cyserve_request,
    cyserve_resp_set_content_type,
    cyserve_resp_status,
    cyserve_resp_write,
    cyserve_response,
)


cdef int handle_root(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    cdef int rc = cyserve_resp_status(resp, 200)
    if rc != 0:
        return rc
    rc = cyserve_resp_set_content_type(resp, b"text/plain", 10)
    if rc != 0:
        return rc
    return cyserve_resp_write(resp, b"Hello, World!", 13)


cdef unsigned int fibonacci(unsigned int n) noexcept nogil:
    # 32-bit unsigned arithmetic on purpose: the seed's benchmark is defined by its wrap-around
    # (Fibonacci(10^6) mod 2^32 = 1884755131), and it keeps the work a fixed CPU loop.
    cdef unsigned int i, a = 0, b = 1, t
    for i in range(n):
        t = a + b
        a = b
        b = t
    return a


cdef int handle_fibonacci(cyserve_request *req, cyserve_response *resp,
                          void *ctx) noexcept nogil:
    # "Fibonacci(10^6) = " + at most 10 digits + " (with overflow)\n" is under 64 bytes.
    cdef char buf[64]
    cdef int n = snprintf(buf, sizeof(buf), b"Fibonacci(10^6) = %u (with overflow)\n",
                          fibonacci(1000000))
    cdef int rc
    if n < 0 or n >= <int>sizeof(buf):
        return -1
    rc = cyserve_resp_status(resp, 200)
    if rc != 0:
        return rc
    rc = cyserve_resp_set_content_type(resp, b"text/plain", 10)
    if rc != 0:
        return rc
    # The response copies the bytes (the stack buffer dies when this returns).
    return cyserve_resp_write(resp, buf, <size_t>n)


ROOT = cyserve_handler_capsule(handle_root)
FIBONACCI = cyserve_handler_capsule(handle_fibonacci)
