# Test hooks for the WebSocket codec (csrc/ws.c), included in cyserve._testhooks. They run the
# frame reader over bytes fed in pieces, as the engine does with its read buffer, so that
# tests/ws/test_ws_codec.py can run the conformance cases in tests/ws/*.md whole and split at
# every byte. Not a public API.
from libc.string cimport memcpy, memmove
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from libc.stdint cimport uint64_t
from libc.stdlib cimport realloc, free

cdef extern from "csrc/ws.h" nogil:
    struct ws_reader:
        uint64_t need
        int error
        const char *error_text
        int deflate
    struct ws_frame:
        int opcode
        int fin
        int first
        int compressed
        char *payload
        uint64_t len
        int code
        const char *reason
        size_t reason_len
    void ws_reader_init(ws_reader *r, uint64_t max_message)
    ssize_t ws_read_frame(ws_reader *r, char *buf, size_t len, ws_frame *f)
    struct ws_pmd_params:
        int server_no_context_takeover
        int client_no_context_takeover
        int server_max_window_bits
    struct ws_buf:
        char *ptr
        size_t len
        size_t cap
    struct ws_pmd:
        pass
    enum:
        WS_PMD_RESPONSE_MAX
    size_t ws_pmd_negotiate(const char *v, size_t n, ws_pmd_params *p, char *out)
    void ws_pmd_init(ws_pmd *z, const ws_pmd_params *p)
    void ws_pmd_free(ws_pmd *z)
    int ws_pmd_inflate(ws_pmd *z, ws_reader *r, const ws_frame *f, ws_buf *out)
    int ws_pmd_deflate(ws_pmd *z, const char *p, size_t n, ws_buf *out)


_OPS = {0x1: "text", 0x2: "binary", 0x8: "close", 0x9: "ping", 0xA: "pong"}


def pmd_negotiate(bytes offers):
    """ws_pmd_negotiate over a Sec-WebSocket-Extensions value: (response, (server_no_context_
    takeover, client_no_context_takeover, server_max_window_bits)), or None when declined."""
    cdef ws_pmd_params p
    cdef char out[WS_PMD_RESPONSE_MAX]
    cdef size_t n = ws_pmd_negotiate(PyBytes_AS_STRING(offers), <size_t>PyBytes_GET_SIZE(offers),
                                     &p, out)
    if n == 0:
        return None
    return (PyBytes_FromStringAndSize(out, <Py_ssize_t>n),
            (p.server_no_context_takeover, p.client_no_context_takeover,
             p.server_max_window_bits))


cdef class PMDCompressor:
    """ws_pmd_deflate with the given parameters: compress(bytes) returns a message's payload as
    the server sends it (RSV1 set on its frame)."""
    cdef ws_pmd z
    cdef ws_buf out

    def __cinit__(self, int server_no_context_takeover=0, int server_max_window_bits=15):
        cdef ws_pmd_params p
        p.server_no_context_takeover = server_no_context_takeover
        p.client_no_context_takeover = 0
        p.server_max_window_bits = server_max_window_bits
        ws_pmd_init(&self.z, &p)
        self.out.ptr = NULL
        self.out.len = self.out.cap = 0

    def __dealloc__(self):
        ws_pmd_free(&self.z)
        free(self.out.ptr)

    def compress(self, bytes data):
        if ws_pmd_deflate(&self.z, PyBytes_AS_STRING(data), <size_t>PyBytes_GET_SIZE(data),
                          &self.out) != 0:
            raise MemoryError()
        return PyBytes_FromStringAndSize(self.out.ptr, <Py_ssize_t>self.out.len)


cdef class WSReader:
    """The frame reader over a growing buffer: feed(bytes) returns the frames complete so far, as
    tuples, and ("error", code, why) once the reader refuses (it then reads nothing more). With
    deflate, permessage-deflate is on (client_no_context_takeover as negotiated): a compressed
    message's frames are inflated by ws_pmd_inflate, each frame's tuple carrying the bytes its
    payload inflated to, as the engine does."""
    cdef ws_reader r
    cdef ws_pmd z
    cdef ws_buf msg
    cdef char *buf
    cdef size_t len, cap
    cdef bint failed

    def __cinit__(self, uint64_t max_message=0, bint deflate=False,
                  bint client_no_context_takeover=False):
        cdef ws_pmd_params p
        ws_reader_init(&self.r, max_message)
        self.r.deflate = deflate
        p.server_no_context_takeover = 0
        p.client_no_context_takeover = client_no_context_takeover
        p.server_max_window_bits = 15
        ws_pmd_init(&self.z, &p)
        self.msg.ptr = NULL
        self.msg.len = self.msg.cap = 0
        self.buf = NULL
        self.len = self.cap = 0

    def __dealloc__(self):
        free(self.buf)
        free(self.msg.ptr)
        ws_pmd_free(&self.z)

    def feed(self, bytes data):
        cdef size_t n = <size_t>PyBytes_GET_SIZE(data)
        cdef ws_frame f
        cdef ssize_t rc
        cdef size_t pos = 0
        cdef size_t before
        out = []
        if self.failed:
            return out
        if self.len + n > self.cap:
            self.cap = (self.len + n) * 2 + 16
            self.buf = <char *>realloc(self.buf, self.cap)
            if self.buf == NULL:
                raise MemoryError()
        memcpy(self.buf + self.len, PyBytes_AS_STRING(data), n)
        self.len += n
        while pos < self.len:
            rc = ws_read_frame(&self.r, self.buf + pos, self.len - pos, &f)
            if rc == -2:
                if self.r.need and self.r.need < self.len - pos:
                    raise AssertionError("need is smaller than what the buffer holds")
                break
            if rc == -1:
                self.failed = True
                out.append(("error", self.r.error, (<bytes>self.r.error_text).decode()))
                return out
            if f.payload < self.buf + pos or f.payload + f.len > self.buf + pos + <size_t>rc:
                raise AssertionError("payload outside its frame")
            pos += <size_t>rc
            if f.compressed:
                before = 0 if f.first else self.msg.len
                if ws_pmd_inflate(&self.z, &self.r, &f, &self.msg) != 0:
                    self.failed = True
                    out.append(("error", self.r.error, (<bytes>self.r.error_text).decode()))
                    return out
                payload = (PyBytes_FromStringAndSize(self.msg.ptr + before,
                                                     <Py_ssize_t>(self.msg.len - before))
                           if self.msg.len > before else b"")
            else:
                payload = PyBytes_FromStringAndSize(f.payload, <Py_ssize_t>f.len)
            op = _OPS[f.opcode]
            if f.opcode == 0x8:
                out.append(("close", f.code,
                            PyBytes_FromStringAndSize(f.reason, <Py_ssize_t>f.reason_len)
                            if f.reason != NULL else b""))
            elif f.opcode >= 0x8:
                out.append((op, payload))
            else:
                out.append((op, bool(f.first), bool(f.fin), payload))
        memmove(self.buf, self.buf + pos, self.len - pos)
        self.len -= pos
        return out
