# Test hook for the PROXY protocol parser (csrc/proxyproto.c), included in cyserve._testhooks:
# tests/http/test_proxyproto.py runs the conformance cases of tests/http/proxyproto/*.md through
# it. Not a public API: the engine calls the C parser itself, without the GIL.
cdef extern from "csrc/proxyproto.h" nogil:
    struct proxyproto_hdr:
        int version
        int family
    int proxyproto_parse(const char *buf, size_t len, proxyproto_hdr *out)
    int proxyproto_client(const proxyproto_hdr *h, char *out, size_t cap)


def _proxyproto_parse(bytes data):
    """(rc, version, client) for the header at the start of data: rc as the C parser returns
    it (the length, -1 invalid, -2 incomplete); version and client ("host:port", or None when
    the header names no client) only when rc > 0."""
    cdef proxyproto_hdr h
    cdef char out[64]
    cdef int rc = proxyproto_parse(data, len(data), &h)
    if rc <= 0:
        return rc, None, None
    if proxyproto_client(&h, out, sizeof(out)) != 0:
        return rc, h.version, None
    return rc, h.version, out.decode("ascii")
