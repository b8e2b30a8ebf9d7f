# cython: language_level=3
"""A GIL-free handler that answers what its ctx describes, for the response framing suite
(tests/http/test_responses.py): one handler serves every case, so that the suite builds one
module, however many cases the data files hold. It cimports cyserve._core and is built with
include_dirs=[cyserve.get_include()], as a user's module is.

An answer is described by answer(status, headers, pieces, trailers); the PyCapsule it returns
points at a blob this module keeps alive: records of a kind byte, a name, NUL, a value, NUL,
ended by a NUL kind byte. Kinds: b"H" a header, b"T" a trailer, b"B" a piece of the body
(name empty), b"S" the status (value in decimal). A NUL inside a value cannot be described."""

from libc.stdlib cimport atoi
from libc.string cimport strlen
from cpython.pycapsule cimport PyCapsule_New

from cyserve._core cimport (
    cyserve_handler_capsule, cyserve_request, cyserve_response, cyserve_resp_status,
    cyserve_resp_header, cyserve_resp_write, cyserve_resp_trailer,
)

# The blobs the capsules point at: kept for the life of the module, as the routes are.
_KEPT = []


cdef int handle_answer(cyserve_request *req, cyserve_response *resp, void *ctx) noexcept nogil:
    # Every call of the API is checked: a refusal (-EPERM for a field the engine writes) is the
    # handler's failure, which the engine answers with a 500, as it would for a user's handler.
    cdef const char *p = <const char *>ctx
    cdef const char *name
    cdef const char *value
    cdef size_t nlen, vlen
    cdef char kind
    cdef int rc = 0
    while p[0] != 0 and rc == 0:
        kind = p[0]
        name = p + 1
        nlen = strlen(name)
        value = name + nlen + 1
        vlen = strlen(value)
        p = value + vlen + 1
        if kind == b"S":
            rc = cyserve_resp_status(resp, atoi(value))
        elif kind == b"H":
            rc = cyserve_resp_header(resp, name, nlen, value, vlen)
        elif kind == b"T":
            rc = cyserve_resp_trailer(resp, name, nlen, value, vlen)
        elif kind == b"B":
            rc = cyserve_resp_write(resp, value, vlen)
    return rc


HANDLER = cyserve_handler_capsule(handle_answer)


def _record(bytes kind, bytes name, bytes value):
    if b"\0" in name or b"\0" in value:
        raise ValueError("a NUL cannot be described")
    return kind + name + b"\0" + value + b"\0"


def answer(int status, list headers, list pieces, list trailers):
    """The ctx capsule of an answer: headers and trailers as (name, value) pairs of bytes, the
    body as its pieces (bytes)."""
    blob = _record(b"S", b"", str(status).encode())
    for name, value in headers:
        blob += _record(b"H", name, value)
    for piece in pieces:
        blob += _record(b"B", b"", piece)
    for name, value in trailers:
        blob += _record(b"T", name, value)
    blob += b"\0"
    _KEPT.append(blob)
    return PyCapsule_New(<void *><const char *>blob, b"framing.answer", NULL)
