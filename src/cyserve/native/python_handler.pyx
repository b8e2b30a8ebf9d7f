# The Python handler kind, included in cyserve._core: Request and Response (the Python handler
# API), turning a handler's result into the engine's response, and the trampoline the engine calls
# on a worker to run a Python handler. native/wsgi.pyx builds on it for WSGI applications.
#
# The GIL: the workers never hold it, except between the offload hooks below, which the engine
# runs around each batch of ready Python handler calls on a worker (one GIL acquisition per
# batch, not per request). Server (native/server_type.pyx) installs them.
#
# Python state: each worker thread gets one Python thread state, on its first batch, and keeps
# it until the thread ends, as a thread Python started would. So what an application keeps per
# thread (a threading.local: a database connection, a session) lives as long as the thread and is
# released when it ends, and the thread shows in `threading` as cyserve-worker-N. Each handler
# call runs in a context of its own (contextvars), so that a variable one request sets does not
# leak into the next on the same thread, and a streamed WSGI answer runs each piece in the
# context of the call that made it (Flask's stream_with_context pushes there and pops there).
import errno as _errno
import json as _json
import os as _os_ph
import logging as _logging
from io import BytesIO as _BytesIO
from collections.abc import Mapping as _Mapping

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcmp, strlen
from posix.unistd cimport usleep

from cyserve.native.includes cimport server as cs

cdef extern from *:
    """
    #include <pthread.h>
    #include <stdatomic.h>
    #include <stdint.h>
    #include <unistd.h>

    /* The offload hooks: the engine calls begin before a batch of Python handler calls on a
     * worker and end after it, on the worker's own stack, always in pairs.
     *
     * A thread Python does not know gets its thread state from PyGILState_Ensure on its first
     * batch, and keeps it: end only releases the GIL (PyEval_SaveThread), begin takes it back
     * with the same state (PyEval_RestoreThread). The GIL-state counter stays at 1 meanwhile, so
     * a nested PyGILState_Ensure (Cython's `with gil`) finds the state and only counts. When the
     * thread ends, the exit hook (cyserve__offload_exit, run by the engine's worker and relief
     * threads from their start routine) gives the state back with PyGILState_Release, which
     * clears and deletes it (and with it the thread's threading.local values), as at the end
     * of any Python thread. A key destructor does the same for a thread that ends some other
     * way; it cannot be the usual path: glibc empties a thread's keys before their destructors
     * run, the interpreter's GIL-state key among them, so the interpreter's own check that the
     * GIL is held (PyGILState_Check, which its debug allocator makes on every free: `python -X
     * dev`, PYTHONMALLOC=debug) fails there and aborts the process.
     * A thread that already had a state (one Python started) is served as before: Ensure and
     * Release around each batch. */
    /* The thread-locals below are the fields of one: in the extension (a shared object loaded
     * with dlopen) each access to a thread-local is a call to __tls_get_addr, which the compiler
     * repeats for each access rather than keep the address in a register, so a hook that reads
     * several (the end hook) takes the address once, made opaque by an empty asm. */
    static _Thread_local struct cyserve__tl {
        PyThreadState *tstate;
        int borrowed;
        PyGILState_STATE gil_state;
        int asgi_queued;
        int asgi_wake_fd;
        PyObject *tcache;
    } cyserve__tl = {.asgi_wake_fd = -1};
    #define cyserve__tstate (cyserve__tl.tstate)
    #define cyserve__borrowed (cyserve__tl.borrowed)
    #define cyserve__gil_state (cyserve__tl.gil_state)
    static pthread_key_t cyserve__tstate_key;
    static pthread_once_t cyserve__tstate_once = PTHREAD_ONCE_INIT;
    /* Set by the module at import: names the thread in `threading`, and forgets it at exit. */
    static void (*cyserve__thread_born)(unsigned long n);
    static void (*cyserve__thread_dies)(void);
    /* Only numbers threads for their names: no ordering needed. */
    static atomic_ulong cyserve__threads_seen;

    static int cyserve__finalizing(void)
    {
    #if PY_VERSION_HEX >= 0x030D0000
        return Py_IsFinalizing();
    #else
        return _Py_IsFinalizing();
    #endif
    }

    static void cyserve__tstate_drop(void *arg)
    {
        PyThreadState *ts = arg;
        /* Past the interpreter's finalisation start, taking the GIL would end this thread
         * inside its own destructor: the finalisation clears the state instead. */
        if (cyserve__finalizing())
            return;
        PyEval_RestoreThread(ts);
        if (cyserve__thread_dies)
            cyserve__thread_dies();
        /* Not PyGILState_Release: glibc has already emptied the GIL-state key of this exiting
         * thread (keys are reset before their destructors run), so it would find no state.
         * This is how a thread Python started ends: clear, then delete and release the GIL. */
        PyThreadState_Clear(ts);
        PyThreadState_DeleteCurrent();
    }

    /* The exit hook (see above): this thread's state, if begin made one, given back while the
     * thread's keys are still whole. The key is emptied first, so that its destructor finds
     * nothing left to do. */
    static void cyserve__offload_exit(void *ud)
    {
        PyThreadState *ts = cyserve__tstate;
        (void)ud;
        if (!ts)
            return;
        cyserve__tstate = NULL;
        (void)pthread_setspecific(cyserve__tstate_key, NULL);
        if (cyserve__finalizing())
            return; /* as in cyserve__tstate_drop */
        PyEval_RestoreThread(ts);
        if (cyserve__thread_dies)
            cyserve__thread_dies();
        PyGILState_Release(PyGILState_UNLOCKED); /* the counter's 1 from begin's Ensure: 0 */
    }

    static void cyserve__tstate_key_make(void)
    {
        (void)pthread_key_create(&cyserve__tstate_key, cyserve__tstate_drop);
    }

    static void cyserve__offload_begin(void *ud)
    {
        (void)ud;
        if (cyserve__tstate) {
            PyEval_RestoreThread(cyserve__tstate);
            return;
        }
        if (PyGILState_GetThisThreadState() != NULL) {
            cyserve__borrowed = 1;
            cyserve__gil_state = PyGILState_Ensure();
            return;
        }
        (void)PyGILState_Ensure();
        cyserve__tstate = PyThreadState_Get();
        pthread_once(&cyserve__tstate_once, cyserve__tstate_key_make);
        (void)pthread_setspecific(cyserve__tstate_key, cyserve__tstate);
        if (cyserve__thread_born)
            cyserve__thread_born(atomic_fetch_add_explicit(&cyserve__threads_seen, 1,
                                                           memory_order_relaxed) + 1);
    }

    /* ASGI (native/asgi.pyx): set when this batch queued calls for the event loop, which the
     * end hook hands over in one wake-up before the GIL goes. Per thread: on a free-threaded
     * interpreter the batches of several workers run at once, and each flushes its own. */
    #define cyserve__asgi_queued (cyserve__tl.asgi_queued)
    /* This thread's _ThreadCache (below), a strong reference, or NULL before its first use:
     * dropped by _thread_dies when a worker thread ends. */
    #define cyserve__tcache (cyserve__tl.tcache)
    static void (*cyserve__asgi_flush)(void);
    /* The event loop's wake-up descriptor (an eventfd) that the flush asks this thread to
     * write once the GIL is released, or -1: the loop thread, woken while the worker still
     * held the GIL, would only block on it and be switched out again (native/asgi.pyx). */
    #define cyserve__asgi_wake_fd (cyserve__tl.asgi_wake_fd)

    /* tl: this thread's cyserve__tl, which the end hook has at hand (a field of it, not a
     * thread-local of its own: one __tls_get_addr less a batch). */
    static void cyserve__asgi_wake(struct cyserve__tl *tl)
    {
        int fd = tl->asgi_wake_fd;
        uint64_t one = 1;
        ssize_t rc;
        if (fd < 0)
            return;
        tl->asgi_wake_fd = -1;
        /* EAGAIN (the counter full) still leaves the loop readable: nothing to retry. */
        rc = write(fd, &one, sizeof one);
        (void)rc;
    }

    static void cyserve__offload_end(void *ud)
    {
        struct cyserve__tl *tl = &cyserve__tl; /* one __tls_get_addr: see above */
        __asm__("" : "+r"(tl));
        (void)ud;
        if (tl->asgi_queued && cyserve__asgi_flush)
            cyserve__asgi_flush();
        if (tl->borrowed) {
            tl->borrowed = 0;
            PyGILState_Release(tl->gil_state);
            cyserve__asgi_wake(tl);
            return;
        }
        (void)PyEval_SaveThread();
        cyserve__asgi_wake(tl);
    }
    """
    void cyserve__offload_begin(void *ud) noexcept nogil
    void cyserve__offload_end(void *ud) noexcept nogil
    void cyserve__offload_exit(void *ud) noexcept nogil
    void (*cyserve__thread_born)(unsigned long n) noexcept
    void (*cyserve__thread_dies)() noexcept
    PyObject *cyserve__tcache

import threading as _threading
from cpython.contextvars cimport PyContext_New, PyContext_Enter, PyContext_Exit


cdef void _thread_born(unsigned long n) noexcept:
    # A worker thread's first batch, GIL held: its entry in `threading`, with a name.
    try:
        _threading.current_thread().name = f"cyserve-worker-{n}"
    except BaseException:
        pass


cdef void _thread_dies() noexcept:
    # The thread is ending (its state is deleted next): take it out of `threading`'s table, as
    # a thread Python started removes itself. threading keeps no public call for a thread it
    # did not start; its table has had this name and lock since Python 3.
    global cyserve__tcache
    cdef PyObject *cache = cyserve__tcache
    if cache != NULL:
        cyserve__tcache = NULL
        Py_DECREF(<object>cache)
    try:
        with _threading._active_limbo_lock:
            _threading._active.pop(_threading.get_ident(), None)
    except BaseException:
        pass


cyserve__thread_born = _thread_born
cyserve__thread_dies = _thread_dies

_error_log = _logging.getLogger("cyserve.error")


# ---- per-thread state ----
DEF WSGI_KEYS_SLOTS = 512  # native/wsgi.pyx, _env_key
DEF WSGI_ENV_SET_BITS = 7  # native/wsgi.pyx, WSGIHandler._conn_part: 128 sets
DEF WSGI_ENV_WAYS = 4  # ... of four parts each
DEF WSGI_ENV_SLOTS = (1 << WSGI_ENV_SET_BITS) * WSGI_ENV_WAYS  # ... in all: 512
DEF WSGI_KINDS_SLOTS = 64  # native/wsgi.pyx, _header_kind
DEF WSGI_STATUS_SLOTS = 16  # native/wsgi.pyx, _start_response
DEF WSGI_PATH_SLOTS = 64  # native/wsgi.pyx, _path_str
DEF ASGI_NAMES_SLOTS = 256  # native/asgi.pyx, _asgi_name
DEF ASGI_PEER_SLOTS = 256   # native/asgi.pyx, _asgi_client
# What the handler kinds remember between requests and change while serving (the WSGI environ
# key of each header name, the environ's part of each connection, what an ASGI batch queued for
# the loop) is kept per thread, not per module. With the GIL, a module-wide table was safe
# because only one worker ran Python at a time; on a free-threaded interpreter the workers run
# their batches at once, and a table they all write would need a lock on every request (and its
# cache line would move between cores on every hit). Per thread, a worker reads and writes only
# its own, without any synchronisation, and a GIL build pays one thread-local load per use. Each
# worker warms its own copy: a few hundred bytes for the name tables, up to WSGI_ENV_SLOTS
# environ parts of about 1 KiB each for WSGI, and a miss costs what the first request always
# cost.

cdef class _ThreadCache:
    cdef list key_names     # native/wsgi.pyx, _env_key: the header name seen in each slot
    cdef list key_values    # ... and its environ key
    cdef list env_parts     # native/wsgi.pyx, WSGIHandler._conn_part: the entry in each slot
    cdef list asgi_queue    # native/asgi.pyx: what this thread's batch queued for its loop
    cdef object asgi_loop   # native/asgi.pyx: that loop (an _ASGILoop, _asgi_here), or None
    cdef list asgi_names    # native/asgi.pyx, _asgi_name: the header name seen in each slot
    cdef list asgi_lower    # ... and the lower-cased bytes the scope gives for it
    cdef list peer_keys     # native/asgi.pyx, _asgi_client: the peer address seen in each slot
    cdef list peer_values   # ... and the scope's client tuple for it
    cdef object wsgi_write  # native/wsgi.pyx, _method_for: the write last made, or None
    cdef object wsgi_answer  # native/wsgi.pyx, _answer_for: the answer last made, or None
    cdef list kind_names    # native/wsgi.pyx, _header_kind: the response header name in each slot
    cdef signed char kind_codes[WSGI_KINDS_SLOTS]  # ... and its kind
    cdef list status_objs   # native/wsgi.pyx, _start_response: the status line in each slot
    cdef list status_reasons  # ... its reason phrase to send (_wsgi_reason's)
    cdef int status_codes[WSGI_STATUS_SLOTS]  # ... and its code
    cdef list path_raw      # native/wsgi.pyx, _path_str: the request path seen in each slot
    cdef list path_strs     # ... and its PATH_INFO
    cdef object env_last    # native/wsgi.pyx, WSGIHandler._conn_part: the part used last, or None
    cdef const char *env_last_peer  # ... and the peer's address as the engine gave it (compared)
    cdef object ctx         # _context_for: the context the last call ran in, or None


cdef inline _ThreadCache _tcache():
    """This thread's cache (made on its first use). Python state attached (a worker's batch)."""
    if cyserve__tcache != NULL:
        return <_ThreadCache>cyserve__tcache
    return _tcache_new()


cdef _ThreadCache _tcache_new():
    global cyserve__tcache
    cdef _ThreadCache c = _ThreadCache.__new__(_ThreadCache)
    c.key_names = [None] * WSGI_KEYS_SLOTS
    c.key_values = [None] * WSGI_KEYS_SLOTS
    c.env_parts = [None] * WSGI_ENV_SLOTS
    c.asgi_queue = []
    c.asgi_names = [None] * ASGI_NAMES_SLOTS
    c.asgi_lower = [None] * ASGI_NAMES_SLOTS
    c.peer_keys = [None] * ASGI_PEER_SLOTS
    c.peer_values = [None] * ASGI_PEER_SLOTS
    c.wsgi_write = None
    c.wsgi_answer = None
    c.kind_names = [None] * WSGI_KINDS_SLOTS
    c.status_objs = [None] * WSGI_STATUS_SLOTS
    c.status_reasons = [None] * WSGI_STATUS_SLOTS
    c.path_raw = [None] * WSGI_PATH_SLOTS
    c.path_strs = [None] * WSGI_PATH_SLOTS
    c.env_last = None
    c.env_last_peer = NULL
    c.ctx = None
    Py_INCREF(c)  # the thread's reference, dropped by _thread_dies
    cyserve__tcache = <PyObject *>c
    return c


# ---- Request ----

class Headers(_Mapping):
    """The request's header fields: a read-only, case-insensitive mapping. Repeated fields are
    joined with ", " (RFC 9110 5.3), Cookie lines with "; " (RFC 6265 5.4: a cookie value may
    hold a comma); items() gives the lower-cased names."""

    __slots__ = ("_d",)

    def __init__(self, pairs):
        d = {}
        for k, v in pairs:
            if k in d:
                d[k] = d[k] + ("; " if k == "cookie" else ", ") + v
            else:
                d[k] = v
        self._d = d

    def __getitem__(self, key):
        if not isinstance(key, str):
            raise KeyError(key)
        return self._d[key.lower()]

    def __contains__(self, key):
        return isinstance(key, str) and key.lower() in self._d

    def get(self, key, default=None):
        return self._d.get(key.lower(), default) if isinstance(key, str) else default

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)

    def __repr__(self):
        return f"Headers({self._d!r})"


cdef inline str _latin1(cyserve_str s):
    return PyBytes_FromStringAndSize(s.ptr, <Py_ssize_t>s.len).decode("latin-1")


# ---- a request body streamed from the connection ----

class RequestBodyError(OSError):
    """The request body could not be read to its end. ``status`` is what the client is
    answered when the handler lets the exception through (413, 408, 400), 0 when nobody is
    left to answer (the client went away, the server stopped)."""

    status = 0


class RequestBodyTooLarge(RequestBodyError):
    """The body is larger than max_body_bytes (413)."""

    status = 413


class RequestBodyTimeout(RequestBodyError, TimeoutError):
    """The client sent nothing for body_timeout, or less than min_body_rate (408)."""

    status = 408


class RequestBodyMalformed(RequestBodyError):
    """The chunked framing of the body is invalid (400; 431 for a trailer section too
    large)."""

    status = 400


class ClientDisconnectedError(RequestBodyError, ConnectionResetError):
    """The client closed or reset the connection before the body's end."""


cdef object _body_error(cs.body_reader_t *br, Py_ssize_t rc):
    cdef const char *reason
    cdef int answer = cs.body_error_status(br, &reason)
    msg = (<bytes>reason).decode("latin-1")
    code = -rc
    if code == _errno.EFBIG:
        return RequestBodyTooLarge(code, msg + " (over max_body_bytes)")
    if code == _errno.ETIMEDOUT:
        return RequestBodyTimeout(code, msg)
    if code == _errno.EBADMSG:
        e = RequestBodyMalformed(code, msg)
        e.status = answer
        return e
    if code == _errno.ECONNRESET:
        return ClientDisconnectedError(code, msg)
    if code == _errno.ENOMEM:
        return MemoryError(msg)
    return RequestBodyError(code, msg)


# What one read of RequestBody asks the engine for when the caller gave no size.
DEF BODY_READ_PIECE = 65536


cdef class RequestBody:
    """A request body read from the connection as the handler asks for it (wsgi.input, and
    behind Request.read() and Request.stream() when the body is streamed): read(n), read(),
    readline(), readlines(), iteration over lines. A read waits for the client (the GIL is
    released meanwhile) under the body's rules: max_body_bytes, body_timeout, min_body_rate;
    breaking one raises a RequestBodyError naming it. Valid during the handler's call (and a
    WSGI answer's iteration); afterwards a read raises ValueError."""

    cdef cs.body_reader_t *_br
    cdef bint _kept  # handed to a streamed WSGI answer, which ends it
    cdef bint _busy  # a read is in progress (its GIL released)

    def __init__(self):
        raise TypeError("RequestBody objects are created by the server")

    cdef int _check(self) except -1:
        if self._br == NULL:
            raise ValueError("the request body can no longer be read: its handler has returned")
        return 0

    cdef int _enter(self) except -1:
        self._check()
        if self._busy:
            raise RuntimeError("the request body is being read by another thread")
        self._busy = True
        return 0

    cdef void _detach(self) noexcept:
        # A read another thread of the app is making (the handler's call has returned) must
        # end first: the engine frees the reader once the call returns.
        while self._busy:
            with nogil:
                usleep(1000)
        self._br = NULL

    @property
    def length(self):
        """The Content-Length, or None for a chunked body."""
        self._check()
        return self._br.length if self._br.length >= 0 else None

    cdef bytes _piece(self, Py_ssize_t n, bint line):
        """One read of up to n bytes (up to a newline when line): what has arrived, waiting
        only when nothing has; b"" at the end."""
        self._enter()
        cdef bytes b
        cdef char *p
        cdef Py_ssize_t r
        cdef cs.body_reader_t *br = self._br
        try:
            b = PyBytes_FromStringAndSize(NULL, n)
            p = PyBytes_AS_STRING(b)
            with nogil:
                r = cs.body_read(br, p, <size_t>n, line)
        finally:
            self._busy = False
        if r < 0:
            raise _body_error(br, r)
        if r == n:
            return b
        return b[:r]

    def read(self, size=-1):
        """size bytes (fewer only at the end), or the whole rest when size is negative or
        None."""
        cdef Py_ssize_t n, got = 0, r
        cdef bytes b
        cdef char *p
        cdef cs.body_reader_t *br
        self._check()
        if size is None or size < 0:
            pieces = []
            while True:
                piece = self._piece(BODY_READ_PIECE, False)
                if not piece:
                    return b"".join(pieces)
                pieces.append(piece)
        n = size
        if n == 0:
            return b""
        self._enter()
        br = self._br
        try:
            b = PyBytes_FromStringAndSize(NULL, n)
            p = PyBytes_AS_STRING(b)
            while got < n:
                with nogil:
                    r = cs.body_read(br, p + got, <size_t>(n - got), 0)
                if r < 0:
                    raise _body_error(br, r)
                if r == 0:
                    break
                got += r
        finally:
            self._busy = False
        return b if got == n else b[:got]

    def read1(self, size=-1):
        """What has arrived, up to size bytes (64 KiB when size is negative), waiting only when
        nothing has; b"" at the end."""
        return self._piece(BODY_READ_PIECE if size is None or size < 0 else size, False)

    def readline(self, size=-1):
        """One line with its newline (the last one may have none), of at most size bytes."""
        cdef Py_ssize_t left = -1 if size is None or size < 0 else size
        pieces = []
        while left != 0:
            piece = self._piece(BODY_READ_PIECE if left < 0 or left > BODY_READ_PIECE else left,
                                True)
            if not piece:
                break
            pieces.append(piece)
            if left > 0:
                left -= len(piece)
            if piece[-1] == 10:
                break
        return b"".join(pieces)

    def readlines(self, hint=-1):
        """The lines left, stopping once hint bytes were read when hint is positive."""
        lines = []
        total = 0
        while True:
            line = self.readline()
            if not line:
                return lines
            lines.append(line)
            total += len(line)
            if hint is not None and 0 < hint <= total:
                return lines

    def __iter__(self):
        return self

    def __next__(self):
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def readable(self):
        return True

    def close(self):
        """Nothing to do: the server finishes the body after the handler."""

    def __repr__(self):
        return "<RequestBody (expired)>" if self._br == NULL else "<RequestBody>"


cdef object _tls_text(const cs.req_t *req, int what):
    """One text of req's TLS session (tls_conn_text: a PEM or a subject name), or None."""
    cdef char *p = NULL
    cdef size_t n = 0
    cdef int rc = cs.server_req_tls_text(req, what, &p, &n)
    if rc == -_errno.ENOENT or rc == -_errno.ENOTCONN:
        return None
    if rc != 0:
        raise MemoryError()
    try:
        return PyBytes_FromStringAndSize(p, <Py_ssize_t>n).decode("utf-8", "replace")
    finally:
        free(p)


cdef list _pem_split(str pems):
    """Several PEM certificates in one text, one string each, in order."""
    end = "-----END CERTIFICATE-----\n"
    return [piece + end for piece in pems.split(end) if piece.strip()] if pems else []


cdef object _tls_extension(const cs.req_t *req):
    """The ASGI TLS extension of req's connection (scope["extensions"]["tls"]), or None over
    cleartext: the server's certificate, the client's chain (its certificate first) and
    subject, why that did not verify, the protocol version and cipher suite as numbers."""
    cdef cs.tls_info_t info
    if cs.server_req_tls_info(req, &info) != 0:
        return None
    return {
        "server_cert": _tls_text(req, cs.TLS_TEXT_SERVER_CERT),
        "client_cert_chain": (_pem_split(_tls_text(req, cs.TLS_TEXT_PEER_CHAIN))
                              if info.peer_cert else []),
        "client_cert_name": _tls_text(req, cs.TLS_TEXT_PEER_NAME) if info.peer_cert else None,
        "client_cert_error": (info.verify_text.decode("utf-8", "replace")
                              if info.verify_text != NULL else None),
        "tls_version": info.version,
        "cipher_suite": info.cipher,
    }


cdef int _tls_environ(dict env, const cs.req_t *req) except -1:
    """The TLS variables of a WSGI environ, as Apache's mod_ssl names them: HTTPS, SSL_PROTOCOL,
    SSL_CIPHER, SSL_TLS_SNI, SSL_CLIENT_VERIFY (NONE, SUCCESS or FAILED:reason) and, with a
    client certificate, SSL_CLIENT_CERT (PEM), SSL_CLIENT_S_DN and SSL_CLIENT_CERT_CHAIN_n."""
    cdef cs.tls_info_t info
    if cs.server_req_tls_info(req, &info) != 0:
        return 0
    env["HTTPS"] = "on"
    env["SSL_PROTOCOL"] = info.version_name.decode("ascii", "replace")
    if info.cipher_name != NULL:
        env["SSL_CIPHER"] = info.cipher_name.decode("ascii", "replace")
    if info.server_name != NULL:
        env["SSL_TLS_SNI"] = info.server_name.decode("ascii", "replace")
    if not info.peer_cert:
        env["SSL_CLIENT_VERIFY"] = "NONE"
        return 0
    env["SSL_CLIENT_VERIFY"] = ("SUCCESS" if info.verify_text == NULL else
                                "FAILED:" + info.verify_text.decode("utf-8", "replace"))
    chain = _pem_split(_tls_text(req, cs.TLS_TEXT_PEER_CHAIN))
    if chain:
        env["SSL_CLIENT_CERT"] = chain[0]
        for i, pem in enumerate(chain[1:]):
            env[f"SSL_CLIENT_CERT_CHAIN_{i}"] = pem
    name = _tls_text(req, cs.TLS_TEXT_PEER_NAME)
    if name is not None:
        env["SSL_CLIENT_S_DN"] = name
    return 0


cdef class Request:
    """One HTTP request, as a Python handler sees it. Built lazily from the engine's views: a
    field becomes a Python object only when the handler reads it. Valid only during the handler
    call (reading an attribute not read before afterwards raises RuntimeError)."""

    cdef const cyserve_request *_req
    cdef object _int_params
    cdef object _method, _path, _query, _target, _headers, _body, _params, _client
    # A RequestBody when the body is streamed, then (or else) a BytesIO over the whole body
    # once read() or stream() was used: what they read from.
    cdef object _input

    def __init__(self):
        raise TypeError("Request objects are created by the server")

    cdef inline int _check(self) except -1:
        if self._req == NULL:
            raise RuntimeError("this Request is no longer valid: its handler has returned")
        return 0

    @property
    def method(self):
        if self._method is None:
            self._check()
            self._method = _latin1(self._req.method)
        return self._method

    @property
    def path(self):
        if self._path is None:
            self._check()
            self._path = _latin1(self._req.path)
        return self._path

    @property
    def query(self):
        if self._query is None:
            self._check()
            self._query = _latin1(self._req.query)
        return self._query

    @property
    def target(self):
        if self._target is None:
            self._check()
            self._target = _latin1(self._req.target)
        return self._target

    @property
    def http_version(self):
        self._check()
        if cs.server_req_http2(<const cs.req_t *>self._req):
            return "2"
        return "1.1" if self._req.minor_version == 1 else "1.0"

    @property
    def headers(self):
        cdef size_t i
        if self._headers is None:
            self._check()
            pairs = []
            for i in range(self._req.num_headers):
                pairs.append((_latin1(self._req.headers[i].name).lower(),
                              _latin1(self._req.headers[i].value)))
            self._headers = Headers(pairs)
        return self._headers

    @property
    def body(self):
        """The whole body. A large body being streamed is read to its end on first use
        (within max_body_bytes), so it cannot follow a read() or stream() that took part of
        it."""
        if self._body is None:
            self._check()
            if type(self._input) is RequestBody:
                if (<RequestBody>self._input)._br.taken:
                    raise RuntimeError("the request body was already read in part through "
                                       "read() or stream()")
                self._body = self._input.read()
            else:
                self._body = PyBytes_FromStringAndSize(self._req.body.ptr,
                                                       <Py_ssize_t>self._req.body.len)
        return self._body

    cdef object _reader(self):
        self._check()
        if self._input is None or (self._body is not None and type(self._input) is RequestBody):
            self._input = _BytesIO(self.body)
        return self._input

    def read(self, size=-1):
        """size bytes of the body (fewer only at its end), or all the rest when size is
        negative: read from the connection as they arrive when the body is large."""
        return self._reader().read(size)

    def stream(self, Py_ssize_t chunk_size=65536):
        """An iterator over the body's pieces as they arrive, each at most chunk_size
        bytes, without holding the whole body: for uploads too large to keep in memory."""
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        rd = self._reader()
        return _body_pieces(rd, chunk_size)

    @property
    def params(self):
        cdef size_t i
        if self._params is None:
            self._check()
            d = {}
            for i in range(self._req.num_params):
                name = _latin1(self._req.params[i].name)
                if name in self._int_params:
                    d[name] = self._req.params[i].ival
                else:
                    d[name] = _latin1(self._req.params[i].value)
            self._params = d
        return self._params

    @property
    def scheme(self):
        """"http", or "https" over TLS, or when a trusted proxy says the client used it."""
        self._check()
        return (<bytes>cs.server_req_scheme(<const cs.req_t *>self._req)).decode("ascii")

    @property
    def tls(self):
        """The connection's TLS session as a dict, or None over cleartext: the keys of the ASGI
        TLS extension (server_cert, client_cert_chain, client_cert_name, client_cert_error,
        tls_version, cipher_suite)."""
        self._check()
        return _tls_extension(<const cs.req_t *>self._req)

    @property
    def client_cert(self):
        """The client's certificate (PEM) when it sent one over TLS, else None. It was verified
        against --ssl-ca-certs during the handshake (--ssl-cert-reqs 1 or 2)."""
        self._check()
        chain = _tls_text(<const cs.req_t *>self._req, cs.TLS_TEXT_PEER_CHAIN)
        return _pem_split(chain)[0] if chain else None

    @property
    def client(self):
        """The client's address as (host, port), or None when it is not known. With proxy
        headers on and a trusted peer, the client its headers name, with port 0."""
        cdef const char *peer
        if self._client is None:
            self._check()
            self._client = False
            if cs.server_req_peer(<const cs.req_t *>self._req, &peer) == 0:
                host, _, port = (<bytes>peer).decode("ascii").rpartition(":")
                if host.startswith("["):
                    host = host[1:-1]
                self._client = (host, int(port))
        return self._client or None

    def __repr__(self):
        if self._req == NULL and self._method is None:
            return "<Request (expired)>"
        return f"<Request {self.method} {self.target}>"


def _body_pieces(rd, Py_ssize_t chunk_size):
    while True:
        piece = (<RequestBody>rd)._piece(chunk_size, False) if type(rd) is RequestBody \
            else rd.read(chunk_size)
        if not piece:
            return
        yield piece


# ---- Response ----

cdef class Response:
    """A response returned by a Python handler: Response(body=b"", status=200, headers=None,
    content_type=None, trailers=None). body is bytes or str (UTF-8); status a final status,
    200..599; headers a dict or a list of (name, value) pairs. trailers, as headers, are fields
    sent after the body to a client whose request had TE: trailers (RFC 9110 6.5), and dropped
    for others (and after an HTTP/1.0 request); an HTTP/1.1 body with trailers goes out chunked.
    body, status and trailers are checked whenever they are set: a trailer that cannot be one is
    a ValueError naming it."""

    cdef object _body
    cdef int _status
    cdef public object headers
    cdef public object content_type
    # The trailers as checked (name, value) pairs of bytes, or None: _fill_response adds them.
    cdef tuple _trailers

    def __init__(self, body=b"", int status=200, headers=None, content_type=None,
                 trailers=None):
        self.body = body
        self.status = status
        self.headers = headers
        self.content_type = content_type
        if trailers is not None:
            self.trailers = trailers

    @property
    def trailers(self):
        """The trailer fields, as (name, value) pairs of bytes, or None."""
        return self._trailers

    @trailers.setter
    def trailers(self, value):
        self._trailers = _check_trailers(value) if value is not None else None

    @property
    def body(self):
        return self._body

    @body.setter
    def body(self, value):
        if not isinstance(value, (bytes, bytearray, memoryview, str)):
            raise TypeError(f"Response body must be bytes or str, not {type(value).__name__}")
        self._body = value

    @property
    def status(self):
        return self._status

    @status.setter
    def status(self, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"Response status must be an int, not {type(value).__name__}")
        if value < 200 or value > 599:
            raise ValueError(f"Response status must be a final status in 200..599, got {value}")
        self._status = value

    def __repr__(self):
        return f"<Response {self._status}>"


cdef int _check_rc(int rc, str what) except -1:
    if rc == 0:
        return 0
    if rc == -22:  # EINVAL
        raise ValueError(f"invalid {what}")
    if rc == -1:  # EPERM
        raise ValueError(f"{what}: this header is written by the server")
    if rc == -17:  # EEXIST
        raise ValueError(f"{what} given twice")
    raise MemoryError(what)


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object u)
    const char *PyUnicode_AsUTF8AndSize(object u, Py_ssize_t *size) except NULL


cdef bytes _field_bytes(v, str what):
    if isinstance(v, bytes):
        return <bytes>v
    if isinstance(v, str):
        try:
            return (<str>v).encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError(f"{what} {v!r} is not Latin-1") from None
    raise TypeError(f"{what} must be str or bytes, not {type(v).__name__}")


cdef int _trailer_rc(int rc, bytes name) except -1:
    # resp_add_trailer's refusals, as the ASGI extension words them (native/asgi.pyx).
    if rc == -22:  # EINVAL
        raise ValueError(f"invalid trailer {name!r}: a name must be a token (no pseudo-header), "
                         "a value must hold no CR, LF, NUL or other control character")
    if rc == -1:  # EPERM
        raise ValueError(f"{name!r} cannot be a trailer: the recipient needs it before the "
                         "body, or it belongs to the connection (RFC 9110 6.5.1)")
    return _check_rc(rc, "trailer")


cdef tuple _check_trailers(value):
    """Response.trailers' value (a mapping or (name, value) pairs, str or bytes) as checked
    pairs of bytes. The check is resp_add_trailer's own, on a response of its own, so that the
    rules are the engine's and a handler learns of a bad field where it set it."""
    cdef cs.resp_t scratch
    cdef list out = []
    cdef bytes bn, bv
    items = value.items() if isinstance(value, _Mapping) else value
    cs.resp_init(&scratch)
    try:
        for item in items:
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise TypeError(f"trailers must be (name, value) pairs, got {item!r}")
            bn = _field_bytes(item[0], "trailer name")
            bv = _field_bytes(item[1], f"the value of trailer {bn!r}:")
            _trailer_rc(cs.resp_add_trailer(&scratch, PyBytes_AS_STRING(bn),
                                            <size_t>PyBytes_GET_SIZE(bn), PyBytes_AS_STRING(bv),
                                            <size_t>PyBytes_GET_SIZE(bv)), bn)
            out.append((bn, bv))
    finally:
        cs.resp_free(&scratch)
    return tuple(out)


cdef int _add_trailers(cs.resp_t *resp, tuple trailers, int status) except -1:
    if status == 204 or status == 304 or status == 205:
        # The engine would drop them without a word: these have no content for them to follow.
        raise ValueError(f"a {status} response cannot have trailers ({len(trailers)} given)")
    cdef bytes bn, bv
    for bn, bv in trailers:
        _trailer_rc(cs.resp_add_trailer(resp, PyBytes_AS_STRING(bn),
                                        <size_t>PyBytes_GET_SIZE(bn), PyBytes_AS_STRING(bv),
                                        <size_t>PyBytes_GET_SIZE(bv)), bn)
    return 0


cdef int _add_header(cs.resp_t *resp, name, value) except -1:
    # An ASCII str's UTF-8 form is its own buffer (its latin-1 bytes too): no copy for the
    # usual header; anything else is encoded.
    cdef Py_ssize_t nlen, vlen
    cdef bytes bn, bv
    cdef const char *n
    cdef const char *v
    if type(name) is str and PyUnicode_IS_ASCII(name):
        n = PyUnicode_AsUTF8AndSize(name, &nlen)
    else:
        bn = name if isinstance(name, bytes) else str(name).encode("latin-1")
        n = PyBytes_AS_STRING(bn)
        nlen = PyBytes_GET_SIZE(bn)
    if type(value) is str and PyUnicode_IS_ASCII(value):
        v = PyUnicode_AsUTF8AndSize(value, &vlen)
    else:
        bv = value if isinstance(value, bytes) else str(value).encode("latin-1")
        v = PyBytes_AS_STRING(bv)
        vlen = PyBytes_GET_SIZE(bv)
    cdef int rc = cs.resp_add_header(resp, n, <size_t>nlen, v, <size_t>vlen)
    if rc:  # the message only when it is needed: it costs a repr
        _check_rc(rc, f"header {name!r}")
    return 0


# ---- lent bodies ----
# A large bytes body is not copied into the engine's response: the engine sends it from the
# object's own buffer (writev of head and body) and holds a reference meanwhile. The engine's
# threads cannot drop that reference (no GIL), so they hand each lease back to this list, and
# the next Python call on any worker (or Server.stop, once the engine has stopped) drops them
# all: one atomic exchange per batch of returned bodies, no GIL acquisition of its own.
# Smaller bodies are copied: a lease costs 15-25 ns (a malloc, a free, two atomic operations;
# bench/micro/lend_vs_copy.c), plus the list's cache line moving between cores when another
# worker drains it, and copying 4 KiB costs about 100 ns, 8 KiB about 110 ns, 1 KiB 23 ns. From
# 8 KiB lending wins with a margin for that move. (Up to 16 KiB the engine still copies the body
# behind the head, BODY_COPY_MAX: lending saves the first of two copies there, all of it above.)
DEF LEND_MIN = 8192

cdef extern from *:
    """
    #include "csrc/resp.h"
    /* The leases of lent bodies the engine is done with (csrc/resp.h); zero-initialised. */
    static struct resp_lease_list cyserve__leases_back;
    """
    cs.resp_lease_list cyserve__leases_back


cdef inline void _leases_drain() noexcept:
    """Drop the references of every body the engine handed back. GIL held. Inline: one relaxed
    load on every Python call, the loop only when there is something to drop."""
    if cs.resp_lease_pending(&cyserve__leases_back):
        _leases_drop()
    if cyserve__pins_any():  # bodies kept in a memfd: let go of those no longer sent
        cyserve__pins_sweep(0)


cdef void _leases_drop() noexcept:
    cdef cs.resp_lease *nxt
    cdef cs.resp_lease *lease = cs.resp_lease_take_all(&cyserve__leases_back)
    while lease != NULL:
        nxt = lease.next
        Py_DECREF(<object>lease.owner)
        cs.resp_lease_free(lease)
        lease = nxt


cdef inline int _set_body(cs.resp_t *resp, bytes b) except -1:
    cdef Py_ssize_t n = PyBytes_GET_SIZE(b)
    if n >= LEND_MIN and _lend_body(resp, b, n):
        return 0
    cdef int rc = cs.resp_write(resp, PyBytes_AS_STRING(b), <size_t>n)
    return _check_rc(rc, "body") if rc else 0


cdef inline int _set_body_str(cs.resp_t *resp, str s) except -1:
    """s's UTF-8 as the body. An ASCII str under LEND_MIN is copied from its own buffer, which is
    its UTF-8 (no bytes object made for it); anything else is encoded, as it always was."""
    cdef Py_ssize_t n
    cdef const char *p
    cdef int rc
    if PyUnicode_IS_ASCII(s):
        p = PyUnicode_AsUTF8AndSize(s, &n)
        if n < LEND_MIN:
            rc = cs.resp_write(resp, p, <size_t>n)
            return _check_rc(rc, "body") if rc else 0
    return _set_body(resp, s.encode("utf-8"))


cdef bint _lend_body(cs.resp_t *resp, bytes b, Py_ssize_t n) noexcept:
    """Lend b to resp: True, or False when it cannot be (no memory, or a body already set: the
    copy then says why). Whoever lends also drops what came back: so the references held for
    written bodies stay bounded whatever calls _set_body (a handler trampoline that does not
    drain itself, another thread holding the GIL)."""
    _leases_drain()
    cdef cs.resp_lease *lease = cs.resp_lease_new(<void *>b, &cyserve__leases_back)
    if lease == NULL:
        return False
    if cs.resp_set_body_lent(resp, PyBytes_AS_STRING(b), <size_t>n, lease) != 0:
        cs.resp_lease_free(lease)
        return False
    Py_INCREF(b)  # the lease's reference, dropped by _leases_drop
    return True


# ---- bodies sent again and again: kept in a memfd while they are ----
# A lent body still costs the kernel a copy into the socket's buffers on every response: for
# 133,622 bytes over loopback that is most of the request's CPU (system time per request 64-78
# us, against 29 us for the same bytes sent by sendfile from a static route's memfd, whose pages
# the socket takes without a copy; bench/micro/cpu_request.sh, docs/benchmarks.md). A body that
# is the same bytes object response after response (a module constant, a cached page) is copied
# once into a sealed memfd, and each response sends from a descriptor of that memfd (a dup: the
# response owns and closes it, so the cache may let go of the memfd at any time), as a file body
# (wsgi.file_wrapper's path, sendfile). Its memfd is found by the object's identity, which is only
# sound while the cache holds a reference: an object is cached once it comes back while one of a
# few candidate slots held it from its previous response, so a body made afresh per response is
# never cached (only kept a little longer, at most 8 of them). Entries and candidates not
# used for a second are let go at the next Python call (and all of them when a server stops),
# so that an idle server holds no body: the guarantee of lent bodies, within about a second.
# Bounded in number and bytes; past the bounds a body is lent as before. Only whole bodies (not
# streamed pieces), not answers to HEAD, of more than 16 KiB (BODY_COPY_MAX: below it the engine
# copies a body behind the head anyway) and at most PIN_MAX_LEN.
DEF PIN_MIN = 16385
DEF PIN_MAX_LEN = 2 * 1024 * 1024

cdef extern from *:
    """
    #include <fcntl.h>
    #include <time.h>
    #include <unistd.h>
    #include "csrc/handler_static.h"

    #define CYSERVE__PIN_MAX 64
    #define CYSERVE__PIN_MAX_BYTES (32u << 20)
    #define CYSERVE__PIN_SEEN 8
    #define CYSERVE__PIN_SWEEP_MS 250

    struct cyserve__pin {
        PyObject *obj; /* a reference; NULL: a free slot (candidates only) */
        int fd;        /* the sealed memfd (-1 for candidates) */
        size_t len;
        uint64_t used; /* CLOCK_MONOTONIC_COARSE, ms */
    };
    /* Entries and candidates, under one lock: on a free-threaded interpreter handlers run on
     * several threads at once. Taken only for bodies above 16 KiB and by the sweep; never held
     * across a reference drop (a bytes object's deallocation runs no Python, but a lock held
     * there would have to be reasoned about again whenever that changes). */
    static pthread_mutex_t cyserve__pins_lock = PTHREAD_MUTEX_INITIALIZER;
    static struct cyserve__pin cyserve__pins[CYSERVE__PIN_MAX];
    static struct cyserve__pin cyserve__seen[CYSERVE__PIN_SEEN];
    static int cyserve__npins;
    static int cyserve__seen_next;
    static size_t cyserve__pins_bytes;
    static uint64_t cyserve__pins_swept;
    /* How long an unused entry or candidate is kept (_bodies_kept_idle_ms changes it). */
    static uint64_t cyserve__pin_idle_ms = 1000;
    /* Entries plus candidates held: read without the lock by every Python call (relaxed: a
     * sweep missed now is made by a later call). */
    static _Atomic int cyserve__pins_held;

    static uint64_t cyserve__pins_ms(void)
    {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
        return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
    }

    static void cyserve__pins_count(void)
    {
        int held = cyserve__npins;
        for (int i = 0; i < CYSERVE__PIN_SEEN; i++)
            held += cyserve__seen[i].obj != NULL;
        atomic_store_explicit(&cyserve__pins_held, held, memory_order_relaxed);
    }

    /* A new descriptor of the memfd holding b's bytes p[0..n), the caller's to close; or -1:
     * b is not (or cannot be) kept, send it from memory. The GIL held (or, free-threaded, the
     * caller's reference to b). */
    static int cyserve__pinned_fd(PyObject *b, const char *p, size_t n)
    {
        PyObject *drop = NULL;
        int fd = -1;
        uint64_t now = cyserve__pins_ms();
        struct cyserve__pin *c = NULL;
        pthread_mutex_lock(&cyserve__pins_lock);
        for (int i = 0; i < cyserve__npins; i++) {
            if (cyserve__pins[i].obj == b) {
                cyserve__pins[i].used = now;
                fd = fcntl(cyserve__pins[i].fd, F_DUPFD_CLOEXEC, 0);
                goto out;
            }
        }
        if (cyserve__npins == CYSERVE__PIN_MAX || cyserve__pins_bytes + n > CYSERVE__PIN_MAX_BYTES)
            goto out;
        for (int i = 0; i < CYSERVE__PIN_SEEN && !c; i++)
            if (cyserve__seen[i].obj == b)
                c = &cyserve__seen[i];
        if (c) {
            /* Back while the slot held it: the same object, so it outlives its responses. The
             * copy is made once, under the lock: a racing thread waits for it, not redoes it. */
            int mfd = static_body_memfd(p, n);
            if (mfd < 0)
                goto out;
            fd = fcntl(mfd, F_DUPFD_CLOEXEC, 0);
            if (fd < 0) {
                close(mfd);
                goto out;
            }
            /* The slot's reference becomes the entry's. */
            cyserve__pins[cyserve__npins++] = (struct cyserve__pin){b, mfd, n, now};
            cyserve__pins_bytes += n;
            c->obj = NULL;
        } else {
            /* The candidates are replaced in turn: a body is kept when it comes back before
             * CYSERVE__PIN_SEEN other large bodies were sent. */
            c = &cyserve__seen[cyserve__seen_next];
            cyserve__seen_next = (cyserve__seen_next + 1) % CYSERVE__PIN_SEEN;
            drop = c->obj;
            Py_INCREF(b);
            *c = (struct cyserve__pin){b, -1, n, now};
        }
        cyserve__pins_count();
    out:
        pthread_mutex_unlock(&cyserve__pins_lock);
        Py_XDECREF(drop);
        return fd;
    }

    /* Let go of the entries and candidates unused for cyserve__pin_idle_ms (all of them with
     * all != 0), at most every CYSERVE__PIN_SWEEP_MS unless all. GIL held. */
    static void cyserve__pins_sweep(int all)
    {
        PyObject *drop[CYSERVE__PIN_MAX + CYSERVE__PIN_SEEN];
        int fds[CYSERVE__PIN_MAX];
        int nd = 0, nf = 0;
        uint64_t now = cyserve__pins_ms();
        pthread_mutex_lock(&cyserve__pins_lock);
        if (!all && now - cyserve__pins_swept < CYSERVE__PIN_SWEEP_MS) {
            pthread_mutex_unlock(&cyserve__pins_lock);
            return;
        }
        cyserve__pins_swept = now;
        int kept = 0;
        for (int i = 0; i < cyserve__npins; i++) {
            struct cyserve__pin *e = &cyserve__pins[i];
            if (all || now - e->used > cyserve__pin_idle_ms) {
                drop[nd++] = e->obj;
                fds[nf++] = e->fd;
                cyserve__pins_bytes -= e->len;
            } else {
                cyserve__pins[kept++] = *e;
            }
        }
        cyserve__npins = kept;
        for (int i = 0; i < CYSERVE__PIN_SEEN; i++) {
            struct cyserve__pin *c = &cyserve__seen[i];
            if (c->obj && (all || now - c->used > cyserve__pin_idle_ms)) {
                drop[nd++] = c->obj;
                c->obj = NULL;
            }
        }
        cyserve__pins_count();
        pthread_mutex_unlock(&cyserve__pins_lock);
        /* A response sending from an entry's memfd has its own descriptor. */
        for (int i = 0; i < nf; i++)
            close(fds[i]);
        for (int i = 0; i < nd; i++)
            Py_DECREF(drop[i]);
    }

    static inline int cyserve__pins_any(void)
    {
        return atomic_load_explicit(&cyserve__pins_held, memory_order_relaxed) != 0;
    }
    """
    int cyserve__pinned_fd(PyObject *b, const char *p, size_t n)
    void cyserve__pins_sweep(int all)
    bint cyserve__pins_any()
    int cyserve__close "close"(int fd)
    uint64_t cyserve__pin_idle_ms


def _bodies_kept_idle_ms(uint64_t ms):
    """Keep a body's memfd this long after its last use (1,000 ms by default); returns the
    previous value. For tests that must not depend on how fast the machine is."""
    global cyserve__pin_idle_ms
    cdef uint64_t was = cyserve__pin_idle_ms
    cyserve__pin_idle_ms = ms
    return was


cdef inline int _set_body_whole(cs.resp_t *resp, bytes b, bint head) except -1:
    """b is the whole body (no piece follows): as _set_body, but a large body that comes back
    as the same object goes out from a memfd (see above)."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(b)
    cdef int fd
    if n >= PIN_MIN and n <= PIN_MAX_LEN and not head:
        fd = cyserve__pinned_fd(<PyObject *>b, PyBytes_AS_STRING(b), <size_t>n)
        if fd >= 0:
            if cs.resp_set_body_file(resp, fd, 0, <uint64_t>n) == 0:
                return 0
            cyserve__close(fd)
    return _set_body(resp, b)


# The App API's JSON answers (a handler returning a dict or a list) are encoded by orjson when it
# is installed (several times faster than the json module on large documents), else by json;
# CYSERVE_JSON=json at import keeps json. Both give compact JSON that parses to the same value
# (orjson writes non-ASCII characters as UTF-8 where json writes \uXXXX escapes).
try:
    import orjson as _orjson
except ImportError:  # an optional dependency
    _orjson = None
if _os_ph.environ.get("CYSERVE_JSON", "") == "json":
    _orjson = None
# Dataclasses and datetimes are passed through to json, which refuses them (a 500) as before.
_ORJSON_OPTS = (_orjson.OPT_NON_STR_KEYS | _orjson.OPT_PASSTHROUGH_DATACLASS
                | _orjson.OPT_PASSTHROUGH_DATETIME) if _orjson is not None else 0


# json.dumps(doc, separators=(",", ":"), allow_nan=False) builds a JSONEncoder for each call
# (its options differ from the defaults), whose encode() builds the C encoder (c_make_encoder)
# and runs it: about 4,800 instructions of Python around the encoding itself. The same C
# encoder, with the same arguments (a fresh circular-reference dict, JSONEncoder.default for what
# it cannot encode, ASCII escapes, compact separators, NaN refused), is made here directly: the
# same text, the same errors. Made per call, not kept: it holds that dict, which a failed
# encoding leaves entries in and which two threads must not share. Where the C encoder is
# missing (an interpreter without _json), json.dumps itself runs.
try:
    from json.encoder import c_make_encoder as _c_make_encoder
    from json.encoder import encode_basestring_ascii as _json_ascii
except ImportError:  # pragma: no cover - CPython always has both
    _c_make_encoder = None
_json_default = _json.JSONEncoder(separators=(",", ":"), allow_nan=False).default


cdef str _json_text(result):
    """The compact JSON of result as an ASCII str, exactly as json.dumps(result, separators=(",",
    ":"), allow_nan=False) writes it (and raising what it raises)."""
    if _c_make_encoder is None:
        return _json.dumps(result, separators=(",", ":"), allow_nan=False)
    enc = _c_make_encoder({}, _json_default, _json_ascii, None, ":", ",", False, False, False)
    # A tuple of one str on CPython 3.11 and later, a list of pieces before.
    return "".join(enc(result, 0))


cdef object _json_out(result, bint fast):
    """The JSON of a handler's dict or list: bytes from orjson when fast and installed, else an
    ASCII str from json (the reference). Raises ValueError (NaN, Infinity) or TypeError (a
    value JSON cannot hold), which the handler's caller turns into a 500, whichever encoder
    runs."""
    if fast and _orjson is not None:
        try:
            out = _orjson.dumps(result, option=_ORJSON_OPTS)
        except TypeError:
            out = None  # an int over 64 bits, a type orjson refuses: json decides below
        # orjson writes NaN and Infinity as null where json refuses them: a document with a
        # null in it is encoded again by json, which raises for them as it always did.
        if out is not None and b"null" not in out:
            return out
    return _json_text(result)


def _json_body(result, bint fast=True):
    """The UTF-8 JSON of a handler's dict or list (see _json_out)."""
    out = _json_out(result, fast)
    return out if type(out) is bytes else (<str>out).encode("utf-8")


def _json_encoder():
    """Which encoder the App API's JSON answers use: "orjson" or "json"."""
    return "orjson" if _orjson is not None else "json"


cdef int _set_ct(cs.resp_t *resp, ct) except -1:
    cdef bytes v = ct if isinstance(ct, bytes) else str(ct).encode("latin-1")
    return _check_rc(cs.resp_set_content_type(resp, PyBytes_AS_STRING(v),
                                              <size_t>PyBytes_GET_SIZE(v)), "content type")


cdef int _fill_response(object result, cs.resp_t *resp, bint head) except -1:
    cdef Response r
    cdef bytes body
    cdef object length = None
    if isinstance(result, str):
        _set_ct(resp, b"text/plain; charset=utf-8")
        return _set_body_str(resp, <str>result)
    if isinstance(result, bytes):
        _set_ct(resp, b"application/octet-stream")
        return _set_body_whole(resp, <bytes>result, head)
    if isinstance(result, (dict, list)):
        _set_ct(resp, b"application/json")
        # NaN and Infinity are not JSON: a ValueError naming them gives a 500.
        out = _json_out(result, True)
        if type(out) is str:
            return _set_body_str(resp, <str>out)
        return _set_body(resp, <bytes>out)
    if result is None:
        return _check_rc(cs.resp_set_status(resp, 204), "status")
    if isinstance(result, Response):
        r = <Response>result
        if cs.resp_set_status(resp, r._status):
            _check_rc(-22, f"status {r._status}")
        has_ct = False
        if r.headers:
            items = r.headers.items() if isinstance(r.headers, _Mapping) else r.headers
            for name, value in items:
                lname = (name.decode("latin-1") if isinstance(name, bytes) else str(name)).lower()
                if lname == "content-type":
                    has_ct = True
                elif lname == "content-length":
                    length = _content_length(value)
                    continue
                _add_header(resp, name, value)
        if isinstance(r._body, str):
            body = (<str>r._body).encode("utf-8")
        else:
            body = bytes(r._body)
        if (length is not None and length != len(body) and r._status != 204
                and r._status != 304 and r._status != 205):
            # The engine writes Content-Length from the body (none for 204 and 304, whose
            # length is GET's). A handler's own value is checked against it, but an empty body
            # may announce a length when answering HEAD (what GET would send, as WSGI apps do).
            if body or not head:
                raise ValueError(f"Content-Length {length} does not match the body's "
                                 f"{len(body)} bytes")
            _check_rc(cs.resp_set_head_length(resp, <int64_t>length), "Content-Length")
        if body and (r._status == 204 or r._status == 304 or r._status == 205):
            # The engine would drop it without a word (RFC 9110: these have no content);
            # app.static refuses the same at registration.
            raise ValueError(f"a {r._status} response cannot have a body "
                             f"({len(body)} bytes given)")
        if not has_ct:
            if r.content_type is not None:
                _set_ct(resp, r.content_type)
            elif isinstance(r._body, str):
                _set_ct(resp, b"text/plain; charset=utf-8")
            elif body:
                _set_ct(resp, b"application/octet-stream")
        if r._trailers:
            _add_trailers(resp, r._trailers, r._status)
        return _set_body_whole(resp, body, head)
    raise TypeError(f"a handler must return str, bytes, dict, list, Response or None, "
                    f"not {type(result).__name__}")


cdef object _content_length(value):
    v = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    v = v.strip(" \t")
    # RFC 9110 8.6: 1*DIGIT; int() alone would also take "+5", "1_0" and other digits.
    if not v or not v.isascii() or not v.isdigit() or len(v) > 18:
        raise ValueError(f"invalid Content-Length {value!r}")
    return int(v)


cdef void _answer_500(cs.resp_t *resp) noexcept nogil:
    cs.resp_reset(resp)
    cs.resp_set_status(resp, 500)
    cs.resp_write(resp, b"500 Internal Server Error\n", 26)


cdef void _py_call(void *opaque, cs.req_t *req, cs.resp_t *resp) noexcept:
    # The target's py_call (csrc/server.h): its one caller, py_trampoline (csrc/request.c), is
    # an offloaded call, which runs only in a batch, between the offload hooks, so the GIL is
    # held (its thread state attached on a free-threaded build) and this is declared as holding
    # it, and cast to the engine's nogil pointer type (server_type.pyx). `with gil` here re-entered
    # it: PyGILState_Ensure and Release, about 110 instructions a request for a counter.
    _py_call_impl(<PyObject *>opaque, <cyserve_request *>req, resp)


cdef void _answer_body_error(cs.resp_t *resp, int status, const char *reason) noexcept nogil:
    # The handler let a failure to read its streamed body through: the client is told what it
    # did (413, 408, 400) rather than 500.
    cs.resp_reset(resp)
    cs.resp_set_status(resp, status)
    cs.resp_write(resp, reason, strlen(reason))
    cs.resp_write(resp, b"\n", 1)


cdef void _py_call_impl(PyObject *info_p, cyserve_request *req, cs.resp_t *resp) noexcept:
    # The route's tuple (handler, int parameter names, label) and its handler are borrowed, not
    # referenced: Server keeps the tuple for as long as it serves (_keep), and a tuple cannot
    # change. A reference taken and dropped on each call would be, on a free-threaded build,
    # atomic operations on the counts of objects the starting thread made, which every worker
    # would write on every request.
    cdef PyObject *handler = PyTuple_GET_ITEM(<tuple>info_p, 0)
    cdef Request r = None
    cdef object ctx = None
    cdef RequestBody inp = None
    cdef _WSGIAnswer answer = None
    cdef cs.body_reader_t *br = cs.body_of(<const cs.req_t *>req)
    cdef const char *reason
    cdef int bstatus
    cdef _ThreadCache cache
    _leases_drain()
    try:
        cache = _tcache()
        # A context of its own for each call (see the top of this file; _context_for).
        ctx = _context_for(cache)
        PyContext_Enter(ctx)
        if br != NULL:  # a large body, read as the handler asks (csrc/body.c)
            inp = RequestBody.__new__(RequestBody)
            inp._br = br
        if type(<object>handler) is WSGIHandler:  # native/wsgi.pyx: no Request needed
            result = (<WSGIHandler>handler)._call(req, inp, resp, cache)
        else:
            r = Request.__new__(Request)
            r._req = req
            r._int_params = <object>PyTuple_GET_ITEM(<tuple>info_p, 1)
            r._input = inp
            result = (<object>handler)(r)
        head = req.method.len == 4 and memcmp(req.method.ptr, "HEAD", 4) == 0
        if type(result) is _WSGIAnswer:  # native/wsgi.pyx
            answer = <_WSGIAnswer>result
            _fill_wsgi(answer, resp, head, ctx, req, inp)
            if answer.past:
                _log_past_length(<object>PyTuple_GET_ITEM(<tuple>info_p, 2),
                                 f"{_latin1(req.method)} {_latin1(req.target)}",
                                 <int64_t>answer.length_value())
        else:
            _fill_response(result, resp, head)
    except BaseException:
        bstatus = cs.body_error_status(br, &reason) if br != NULL else 0
        if bstatus:
            _answer_body_error(resp, bstatus, reason)
        else:
            _answer_500(resp)
        # A body the client broke off or broke a rule with is the client's doing: no
        # traceback for it.
        if br == NULL or not _body_failed(br):
            try:
                _error_log.exception("handler %s failed for %s %s",
                                     <object>PyTuple_GET_ITEM(<tuple>info_p, 2),
                                     _latin1(req.method), _latin1(req.target))
            except BaseException:
                pass
    finally:
        if r is not None:
            r._req = NULL
        if answer is not None:
            # The request is answered: what the answer held goes with it, not with the
            # thread's next request (the thread may reuse the answer itself, _answer_for).
            _answer_clear(answer)
        if inp is not None and not inp._kept:
            inp._detach()
        if ctx is not None:
            _context_exit(ctx)


cdef extern from *:
    """
    #define cyserve__body_failed(br) ((br)->err != 0)
    """
    bint _body_failed "cyserve__body_failed"(cs.body_reader_t *br) noexcept nogil


cdef object _context_for(_ThreadCache cache):
    """A context for the next call, the same as a new one (PyContext_New): the one the thread's
    last call ran in, when that call left no variable set in it and nothing but the thread
    holds it (no reference elsewhere, a streamed answer's, nor a weak one: there is no way to
    reach a context but those), so no call can tell them apart; otherwise a new one, which the
    thread keeps for next time. Saves the context's allocation and deallocation on each call."""
    cdef PyObject *c = <PyObject *>cache.ctx
    if c != <PyObject *>None and _sole(c) and len(<object>c) == 0:
        return <object>c
    ctx = PyContext_New()
    cache.ctx = ctx
    return ctx


cdef void _context_exit(ctx) noexcept:
    # Fails only when the context is not the thread's current one, i.e. when it was never
    # entered (PyContext_Enter failed): then there is nothing to leave.
    try:
        PyContext_Exit(ctx)
    except BaseException:
        pass
