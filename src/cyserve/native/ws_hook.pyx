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
    struct ws_frame:
        int opcode
        int fin
        int first
        char *payload
        uint64_t len
        int code
        const char *reason
        size_t reason_len
    void ws_reader_init(ws_reader *r, uint64_t max_message)
    ssize_t ws_read_frame(ws_reader *r, char *buf, size_t len, ws_frame *f)


_OPS = {0x1: "text", 0x2: "binary", 0x8: "close", 0x9: "ping", 0xA: "pong"}


cdef class WSReader:
    """The frame reader over a growing buffer: feed(bytes) returns the frames complete so far, as
    tuples, and ("error", code, why) once the reader refuses (it then reads nothing more)."""
    cdef ws_reader r
    cdef char *buf
    cdef size_t len, cap
    cdef bint failed

    def __cinit__(self, uint64_t max_message=0):
        ws_reader_init(&self.r, max_message)
        self.buf = NULL
        self.len = self.cap = 0

    def __dealloc__(self):
        free(self.buf)

    def feed(self, bytes data):
        cdef size_t n = <size_t>PyBytes_GET_SIZE(data)
        cdef ws_frame f
        cdef ssize_t rc
        cdef size_t pos = 0
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
