# Test hooks for the HTTP parser (csrc/http_parse.c), included in cyserve._testhooks. They turn
# the C parse into Python values so that tests/http/test_parser.py can run the conformance cases in
# tests/http/*.md. Not a public API: the server calls the C functions directly, without the GIL.
from libc.string cimport memset
from libc.stdlib cimport malloc, free
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize

from cyserve.native.includes.http_parse cimport (
    http_header, http_limits, http_request, http_chunked, http_limits_default,
    http_parse_request, http_chunked_decode,
)

# The values of enum http_method (csrc/http_method.h), not numbered again here.
from cyserve.native.includes.http_parse cimport (HTTP_OTHER, HTTP_GET, HTTP_HEAD, HTTP_POST,
                                                 HTTP_PUT, HTTP_DELETE, HTTP_PATCH, HTTP_OPTIONS,
                                                 HTTP_CONNECT, HTTP_TRACE)

_METHOD_IDS = {HTTP_OTHER: "OTHER", HTTP_GET: "GET", HTTP_HEAD: "HEAD", HTTP_POST: "POST",
               HTTP_PUT: "PUT", HTTP_DELETE: "DELETE", HTTP_PATCH: "PATCH",
               HTTP_OPTIONS: "OPTIONS", HTTP_CONNECT: "CONNECT", HTTP_TRACE: "TRACE"}


cdef inline bytes _view(const char *base, const char *p, size_t n, Py_ssize_t size):
    # Every view must lie inside the buffer; the hook checks it on every parse it reports.
    if p == NULL:
        return None
    if p < base or p + n > base + size:
        raise AssertionError("parser returned a view outside the buffer")
    return PyBytes_FromStringAndSize(p, <Py_ssize_t>n)


def _parse_request(bytes data, size_t max_header_bytes=8192, size_t max_target_bytes=8192,
                   unsigned max_headers=100, size_t header_capacity=128):
    """Parse one request head. Returns (rc, info): rc is the parser's result (bytes consumed,
    -1 or -2); info is a dict of the parsed request when rc > 0, {"status", "error"} when -1,
    and None when -2."""
    cdef http_limits lim
    cdef http_request req
    cdef const char *buf = PyBytes_AS_STRING(data)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef http_header *headers = <http_header *>malloc(sizeof(http_header) * (header_capacity + 1))
    cdef int rc
    cdef size_t i
    if headers == NULL:
        raise MemoryError()
    try:
        http_limits_default(&lim)
        lim.max_header_bytes = max_header_bytes
        lim.max_target_bytes = max_target_bytes
        lim.max_headers = max_headers
        memset(&req, 0, sizeof(req))
        req.headers = headers
        req.num_headers = header_capacity
        with nogil:
            rc = http_parse_request(buf, <size_t>size, &req, &lim)
        if rc == -2:
            return rc, None
        if rc == -1:
            return rc, {"status": req.status,
                        "error": req.error.decode() if req.error != NULL else None}
        if rc <= 0 or rc > size:
            raise AssertionError(f"parser returned {rc} for {size} bytes")
        info = {
            "method": _view(buf, req.method, req.method_len, size),
            "method_id": _METHOD_IDS[<int>req.method_id],
            "method_code": <int>req.method_id,  # the enum's value itself
            "target": _view(buf, req.target, req.target_len, size),
            "path": _view(buf, req.path, req.path_len, size),
            "query": _view(buf, req.query, req.query_len, size),
            "version": f"1.{req.minor_version}",
            "headers": [(_view(buf, headers[i].name, headers[i].name_len, size),
                         _view(buf, headers[i].value, headers[i].value_len, size))
                        for i in range(req.num_headers)],
            "content_length": req.content_length,
            "chunked": bool(req.chunked),
            "keep_alive": bool(req.keep_alive),
            "expect_continue": bool(req.expect_continue),
            "upgrade": bool(req.upgrade),
            "host": _view(buf, req.host, req.host_len, size),
        }
        return rc, info
    finally:
        free(headers)


def _decode_chunked(chunks, size_t max_trailer_bytes=4096):
    """Feed the chunked decoder the given bytes objects one after another, as separate reads.
    Returns (rc, body, rest): rc is -2 if the body never ended, -1 if invalid, else the count of
    bytes after the body in the whole input; body is the decoded bytes, rest the bytes after the
    body (those of the read where it ended, then any later reads; b"" unless rc >= 0)."""
    cdef http_chunked st
    cdef size_t n
    cdef long long rc = -2
    cdef bytearray work
    cdef char *p
    memset(&st, 0, sizeof(st))
    body = bytearray()
    rest = b""
    chunks = list(chunks)
    for index, chunk in enumerate(chunks):
        work = bytearray(chunk)
        n = <size_t>len(work)
        p = work
        rc = http_chunked_decode(&st, p, &n, max_trailer_bytes)
        body += work[:n]
        if rc == -1:
            return -1, bytes(body), b""
        if rc >= 0:
            if bytes(work[n:n + rc]) != bytes(chunk[len(chunk) - rc:]):
                raise AssertionError("bytes after the body were not moved behind the decoded bytes")
            rest = bytes(work[n:n + rc]) + b"".join(chunks[index + 1:])
            return len(rest), bytes(body), rest
    return rc, bytes(body), rest
