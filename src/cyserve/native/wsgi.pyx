# WSGI (PEP 3333) on the Python handler path, included in cyserve._core after python_handler.pyx.
# cyserve/wsgi.py documents the mapping (what the environ holds, what happens to the app's
# headers); this is its implementation, in Cython because it runs once per request: the environ
# is built straight from the engine's views of the request, and the answer goes into the engine's
# response without a Response object in between.
#
# A WSGIHandler is the target of an ordinary "python" route (app.wsgi mounts one under a prefix),
# so it runs on a worker thread holding the GIL, between the offload hooks, like any handler.
import io as _io
from io import BytesIO as _BytesIO
import os as _os
import stat as _stat
import sys as _sys
from wsgiref.util import FileWrapper as _FileWrapper

cimport cython

from cpython.dict cimport PyDict_Copy, PyDict_GetItem, PyDict_GetItemWithError
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_Check, PyUnicode_DecodeLatin1
from cpython.object cimport PyTypeObject
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memchr, memcmp, memcpy

cdef extern from "<strings.h>" nogil:
    int strncasecmp(const char *a, const char *b, size_t n)


cdef extern from *:
    """
    /* Whether the 4 bytes at p spell "host" in any case, as strncasecmp(p, "host", 4) == 0:
     * every request has the header, and the call costs about four times this. Bit 5 is the
     * only bit in which a letter's two cases differ, so a byte with it set equals 'h' only
     * when it was 'h' or 'H' (and so for the others). */
    #include <string.h>
    static inline int cyserve__is_host(const char *p)
    {
        uint32_t w, host;
        memcpy(&w, p, 4);
        memcpy(&host, "host", 4);
        return (w | 0x20202020u) == host;
    }
    """
    bint _is_host "cyserve__is_host"(const char *p) noexcept nogil

cdef tuple _NO_ARGS = ()


# The environ's own keys and constant values as interned strs. On a free-threaded build (3.14t)
# a str the starting thread made is shared with the workers: each environ, a copy of the
# connection's part, takes a reference to every key and value it holds and drops them when the
# request ends, and for a shared object each is an atomic operation on a count that every worker
# writes (about a dozen pairs a request, measured with bench/micro/cg_request.sh). Interned strs
# are immortal there, with no count to write. Cython's own constants are interned only when they
# look like identifiers, and sys.intern may return another str equal to the one given (whichever
# was interned first), so the strs used are the ones it returns. On a GIL build this changes
# nothing but which equal str is used.
cdef str _intern_str(str s):
    return _sys.intern(s) if type(s) is str else s


cdef dict _interned(dict d):
    """d with its str keys and str values interned (the same pairs, in the same order)."""
    return {_intern_str(k): (_intern_str(v) if type(v) is str else v) for k, v in d.items()}


cdef str _K_INPUT = _intern_str("wsgi.input")
cdef str _K_SCHEME = _intern_str("wsgi.url_scheme")
cdef str _HTTP2 = _intern_str("HTTP/2")
cdef str _HTTP11 = _intern_str("HTTP/1.1")
cdef str _HTTP10 = _intern_str("HTTP/1.0")
cdef object _NO_VALUE = object()  # an argument not given (_start_response_general)
# The classes a request uses, as C globals: a module global is a dict lookup on each use (about
# 120 instructions on Python 3.12, where Cython no longer caches them by the dict's version).
cdef object _BYTESIO = _BytesIO
cdef object _FILE_WRAPPER = _FileWrapper
_HOP_BY_HOP_ERRORS = frozenset({"transfer-encoding", "te", "trailer", "upgrade"})
_WSGI_DROPPED = frozenset({"date", "keep-alive"})
# The reason phrase to send for each WSGI status line seen: None where it is the engine's own for
# the code (then the head is the engine's common one), else its bytes. Apps use a few constant
# status lines, so this saves validating them on every request. Bounded: past it, computed each
# time.
_WSGI_REASONS = {}
_METHODS_INTERNED = {}
# The environ key of each request header name seen, by its bytes as received (names repeat on
# every request; computing "HTTP_" + upper per header would cost more than the rest together).
# None for a name that gets no key. A table of WSGI_KEYS_SLOTS slots indexed by a hash of the
# name's bytes, each holding the last name seen there and its key: a hit costs a hash and a
# memcmp, no bytes object and no dict lookup (a siphash of a new object); a collision only
# recomputes. So it is bounded, whatever names clients send. One table per thread
# (_ThreadCache, native/python_handler.pyx): its slots are overwritten while serving.
#
# The dicts below (_WSGI_REASONS, _METHOD_STRS, _HEADER_KINDS, _WSGI_STATUSES) are shared by all
# threads, and read with PyDict_GetItem's borrowed reference. That stays safe on a free-threaded
# interpreter because they only grow: an entry is added with setdefault, which never replaces a
# value another thread may hold borrowed, and is never removed, so the dict keeps every value
# alive (a dict is itself safe to read and insert into from several threads at once). Two
# threads that miss together compute the same value; one of them is kept. Their bounds are
# checked without a lock, so they may pass by a few entries.

# How many empty pieces an iterator may yield after its body filled its Content-Length before it
# is closed (_stream_step): enough for any that ends soon after, bounded for one that never does.
DEF WSGI_EMPTY_PAST_LENGTH = 64

# An answer with a Content-Length is collected whole up to this many bytes, then streamed.
DEF WSGI_STREAM_AFTER = 65536
# start_response's view of a response header name: kept, the Content-Length (checked, then
# written by the engine), dropped (the engine writes its own), Connection (only "close" means
# something), or a hop-by-hop header the app must not set.
DEF _H_KEEP = 0
DEF _H_LENGTH = 1
DEF _H_DROP = 2
DEF _H_CONNECTION = 3
DEF _H_ERROR = 4
# Kept, and spelt "Content-Type" exactly: written with resp_set_content_type, which checks the
# value but not the name (a known token the engine does not reserve), nor compares the name
# with the five the engine treats apart, as resp_add_header does for any other name.
DEF _H_CTYPE = 5


class WSGIError(Exception):
    """What a WSGI application did wrong: reported as a 500 and a logged error, like an
    exception raised by the application."""


cdef inline str _str_of(cyserve_str s):
    return PyUnicode_DecodeLatin1(s.ptr, <Py_ssize_t>s.len, NULL)


cdef inline int _hexval(char c) noexcept nogil:
    if c'0' <= c <= c'9':
        return c - c'0'
    if c'a' <= c <= c'f':
        return c - c'a' + 10
    if c'A' <= c <= c'F':
        return c - c'A' + 10
    return -1


cdef str _unquote_latin1(const char *p, size_t n):
    """p[0..n) percent-decoded, each byte a latin-1 character (PEP 3333's PATH_INFO). A '%' not
    followed by two hex digits stays as it is, as urllib.parse.unquote_to_bytes leaves it."""
    cdef size_t i = 0, j = 0
    cdef int hi, lo
    if memchr(p, c'%', n) == NULL:
        return PyUnicode_DecodeLatin1(p, <Py_ssize_t>n, NULL)
    cdef bytearray out = bytearray(n)
    cdef char *o = out
    while i < n:
        if p[i] == c'%' and i + 2 < n:
            hi = _hexval(p[i + 1])
            lo = _hexval(p[i + 2])
            if hi >= 0 and lo >= 0:
                o[j] = <char>(hi * 16 + lo)
                j += 1
                i += 3
                continue
        o[j] = p[i]
        j += 1
        i += 1
    return PyUnicode_DecodeLatin1(o, <Py_ssize_t>j, NULL)


cdef inline unsigned _fnv1a(const char *p, size_t n) noexcept:
    """FNV-1a of p[0..n): the slot of a per-thread table of names or paths (this file's and
    native/asgi.pyx's, included after it)."""
    cdef size_t i
    cdef unsigned h = 2166136261u
    for i in range(n):
        h = (h ^ <unsigned char>p[i]) * 16777619u
    return h


# Paths longer than this are decoded on each request: hashing them would cost about what decoding
# does, and a long path is rarely asked for twice in a row.
DEF WSGI_PATH_CACHED = 96


cdef str _path_str(const char *p, size_t n, _ThreadCache cache):
    """_unquote_latin1(p, n) (PATH_INFO), taken from this thread's table of the paths it decoded
    last (_ThreadCache.path_raw and path_strs, WSGI_PATH_SLOTS slots indexed by a hash of the
    bytes): a client asks for the same few paths again and again, and a hit costs a hash and a
    memcmp instead of a new str and its deallocation. The str is the same value either way, and
    immutable: an app cannot tell a shared one from a new one. A collision only decodes again."""
    if n > WSGI_PATH_CACHED:
        return _unquote_latin1(p, n)
    cdef Py_ssize_t slot = <Py_ssize_t>(_fnv1a(p, n) & (WSGI_PATH_SLOTS - 1))
    cdef object seen = <object>PyList_GET_ITEM(cache.path_raw, slot)
    if (seen is not None and <size_t>PyBytes_GET_SIZE(seen) == n
            and memcmp(PyBytes_AS_STRING(seen), p, n) == 0):
        return <str>PyList_GET_ITEM(cache.path_strs, slot)
    cdef str s = _unquote_latin1(p, n)
    cdef bytes raw = PyBytes_FromStringAndSize(p, <Py_ssize_t>n)
    # This thread's own table: no other thread reads it between the two stores (which cannot
    # fail: both objects are made).
    cache.path_strs[slot] = s
    cache.path_raw[slot] = raw
    return s


cdef object _env_key(const char *name, size_t n, _ThreadCache cache):
    """The environ key of header name[0..n): "HTTP_" + upper-cased name with '-' as '_',
    CONTENT_TYPE for Content-Type, None for Content-Length (the body's length is given as
    CONTENT_LENGTH) and for a name holding '_' (X_User must not pass for X-User). cache: this
    thread's (_tcache()), looked up once per request by the caller."""
    cdef Py_ssize_t slot = <Py_ssize_t>(_fnv1a(name, n) & (WSGI_KEYS_SLOTS - 1))
    cdef object seen = <object>PyList_GET_ITEM(cache.key_names, slot)
    if (seen is not None and <size_t>PyBytes_GET_SIZE(seen) == n
            and memcmp(PyBytes_AS_STRING(seen), name, n) == 0):
        return <object>PyList_GET_ITEM(cache.key_values, slot)
    cdef bytes raw = PyBytes_FromStringAndSize(name, <Py_ssize_t>n)
    cdef str lname = raw.decode("latin-1").lower()
    if lname == "content-type":
        key = "CONTENT_TYPE"
    elif lname == "content-length" or "_" in lname:
        key = None
    else:
        key = "HTTP_" + lname.upper().replace("-", "_")
    # This thread's own table: no other thread reads it between the two stores.
    cache.key_values[slot] = key
    cache.key_names[slot] = raw
    return key


cdef extern from "Python.h":
    object _PyDict_NewPresized(Py_ssize_t minused)
    PyObject *PyDict_SetDefault(object d, object key, object value) except NULL  # borrowed
    Py_ssize_t PyDict_GET_SIZE(object d)
    object _bind_method "PyMethod_New"(object func, object self)  # cpython.method's has 3 args


cdef extern from *:
    """
    /* Point the bound method m at self instead of its object, when nothing but the caller's
     * table refers to m (no reference and no weak reference elsewhere): then nobody can tell
     * it from a new method bound to self. 1 when done, 0 otherwise. GIL held (or, free-threaded,
     * m is the calling thread's own: a count of 1 means no other thread can reach it). */
    #include <stdatomic.h>
    static int cyserve__rebind(PyObject *m, PyObject *self)
    {
        if (!PyMethod_Check(m) || Py_REFCNT(m) != 1 || ((PyMethodObject *)m)->im_weakreflist)
            return 0;
    #ifdef Py_GIL_DISABLED
        /* The count was read without ordering; the thread that dropped the last other
         * reference (an app's, on the event loop's thread) did its own reads of m before it
         * released it, and those must not be reordered after the writes below. */
        atomic_thread_fence(memory_order_acquire);
    #endif
        Py_INCREF(self);
        Py_SETREF(((PyMethodObject *)m)->im_self, self);
        return 1;
    }
    """
    int _rebind "cyserve__rebind"(PyObject *m, PyObject *self)


cdef object _method_for(_ThreadCache cache, func, self):
    """func bound to self, as PyMethod_New(func, self) gives it: the method this thread made
    last time (write, which start_response returns), rebound, once nothing else holds it (the
    app dropped it when its request ended, as apps do); otherwise a new one, which the thread
    keeps for next time. Saves the method's allocation and deallocation (about 350
    instructions) on each request."""
    cdef PyObject *m = <PyObject *>cache.wsgi_write
    if _rebind(m, <PyObject *>self):
        return <object>m
    bound = _bind_method(func, self)
    cache.wsgi_write = bound
    return bound


cdef extern from *:
    """
    /* Is the caller's reference to o the only one, with no weak reference to o either? Then
     * nothing but the caller can reach o, nor tell whether it is reused. GIL held (or,
     * free-threaded, o is the calling thread's own, as in cyserve__rebind). */
    static int cyserve__sole(PyObject *o)
    {
        Py_ssize_t off = Py_TYPE(o)->tp_weaklistoffset;
        if (Py_REFCNT(o) != 1 || off < 0 || (off > 0 && *(PyObject **)((char *)o + off) != NULL))
            return 0;
    #ifdef Py_GIL_DISABLED
        /* As in cyserve__rebind: the last other holder's reads of o come before our writes. */
        atomic_thread_fence(memory_order_acquire);
    #endif
        return 1;
    }
    """
    int _sole "cyserve__sole"(PyObject *o)


cdef _WSGIAnswer _answer_for(_ThreadCache cache):
    """A fresh answer for this thread's next request: the one it made last time, reset, once
    nothing but the thread holds it (the app dropped start_response and write with its request,
    as apps do); otherwise a new one, which the thread keeps for next time. An answer has no
    state of its own beyond its fields, all set again here, so the app cannot tell it from a new
    one; it saves the allocation and deallocation of the answer (a GC-tracked object) and of its
    list, 200-300 instructions a request net of the reset (docs/benchmarks.md, session 19)."""
    cdef PyObject *a = <PyObject *>cache.wsgi_answer
    cdef _WSGIAnswer answer
    if a != <PyObject *>None and _sole(a):
        answer = <_WSGIAnswer>a
        _answer_clear(answer)  # done when its request ended, unless that was elsewhere
        answer.status = 0
        answer.skip = 0
        answer.in_resp = False
        answer.total = 0
        answer.close = False
        answer.head_cut = False
        answer.sent = False  # else a streamed answer's would refuse the next one's exc_info
        answer.past = False
        answer.file_offset = 0
        answer.file_len = 0
        return answer
    answer = _WSGIAnswer.__new__(_WSGIAnswer)
    answer.vc = cyserve__sr_vectorcall
    answer.chunks = []
    cache.wsgi_answer = answer
    return answer


cdef extern from *:
    """
    /* Empty the answer's list of body pieces in place, keeping its array of items for the next
     * request's pieces: PyList_SetSlice (or list.clear) frees the array, and the next append
     * allocates it again, a malloc and a free on every request. The list is the answer's own
     * (write() appends to it, no app holds it) and holds exact bytes only (_wsgi_take and
     * write() make them so: bytes() of a subclass may give another subclass), whose
     * deallocation runs no code. Should one ever run some (a write() the app kept, appending),
     * the list is whole at every drop: the last piece is taken off before its reference goes,
     * until the list is empty. An array grown past CYSERVE__CHUNKS_KEPT pieces (an answer of
     * many writes) is freed, the slice's way: kept, each worker thread would hold the largest
     * one any of its answers made for good (8 bytes a piece: 4 MB for 500,000 writes). On a
     * free-threaded build, where a list's array is freed by other rules, the slice's way too. */
    #define CYSERVE__CHUNKS_KEPT 64
    static int cyserve__chunks_empty(PyObject *lst)
    {
    #ifdef Py_GIL_DISABLED
        return PyList_SetSlice(lst, 0, PyList_GET_SIZE(lst), NULL);
    #else
        PyListObject *l = (PyListObject *)lst;
        Py_ssize_t n;
        if (l->allocated > CYSERVE__CHUNKS_KEPT)
            return PyList_SetSlice(lst, 0, Py_SIZE(l), NULL);
        while ((n = Py_SIZE(l)) > 0) {
            PyObject *item = l->ob_item[n - 1];
            l->ob_item[n - 1] = NULL;
            Py_SET_SIZE(l, n - 1);
            Py_DECREF(item);
        }
        return 0;
    #endif
    }
    """
    int _chunks_empty "cyserve__chunks_empty"(object lst) noexcept  # fails only on no memory


cdef void _answer_clear(_WSGIAnswer answer) noexcept:
    """Drop what the answer holds (the body's pieces, the headers, a file's descriptor, which
    closes), as its deallocation would: called when its request is answered or failed, so that
    a thread never keeps a request's objects alive until its next one."""
    answer.resp = NULL
    if answer.chunks:
        _chunks_empty(answer.chunks)
    answer.reason = None
    answer.headers = None
    answer.length = None
    answer.it = None
    answer.result = None
    answer.file_fd = None


cdef void _methods_release(_ThreadCache cache) noexcept:
    """At the end of a request's call: bind the thread's kept method to None again where only
    the thread holds it, or drop it when something else still holds it (a streamed answer's
    generator, a traceback), so that the thread never keeps an answer alive: each is freed with
    its request, not when the thread serves its next one."""
    cdef PyObject *m = <PyObject *>cache.wsgi_write
    if m != <PyObject *>None and not _rebind(m, <PyObject *>None):
        cache.wsgi_write = None


cdef extern from *:
    """
    /* wsgi.input's reuse (native/wsgi.pyx, WSGIHandler._environ): BytesIO's own tell() and
     * getvalue(), found once at import (cyserve__input_setup) and called straight through their
     * C functions, as the methods' descriptors would call them. NULL: no reuse, every request
     * without a body gets a new BytesIO, as before. */
    static PyTypeObject *cyserve__bio_type;
    static PyCFunction cyserve__bio_tell, cyserve__bio_getvalue;

    static PyCFunction cyserve__noargs_method(PyObject *type, const char *name)
    {
        PyCFunction f = NULL;
        PyObject *d = PyObject_GetAttrString(type, name);
        if (d == NULL) {
            PyErr_Clear();
            return NULL;
        }
        if (Py_IS_TYPE(d, &PyMethodDescr_Type)
                && ((PyMethodDescrObject *)d)->d_method->ml_flags == METH_NOARGS)
            f = ((PyMethodDescrObject *)d)->d_method->ml_meth;
        Py_DECREF(d);  /* the type keeps it, and what it points to */
        return f;
    }

    /* Take type (io.BytesIO, kept alive by the module's global) as the one to reuse, when its
     * instances keep their __dict__ and weak references at fixed offsets and tell() and
     * getvalue() take no arguments, as on CPython 3.11 and 3.12; else leave reuse off. */
    static void cyserve__input_setup(PyObject *type)
    {
        PyTypeObject *tp = (PyTypeObject *)type;
        if (!PyType_Check(type) || tp->tp_dictoffset <= 0 || tp->tp_weaklistoffset <= 0)
            return;
        cyserve__bio_tell = cyserve__noargs_method(type, "tell");
        cyserve__bio_getvalue = cyserve__noargs_method(type, "getvalue");
        if (cyserve__bio_tell == NULL || cyserve__bio_getvalue == NULL)
            cyserve__bio_tell = cyserve__bio_getvalue = NULL;
        else
            cyserve__bio_type = tp;
    }

    /* Is o (a connection part's wsgi.input, held by the part's dict and by the part: two
     * references) as a new BytesIO() is, with nothing but the part able to reach it? Then no
     * app can tell it from a new one: no reference elsewhere (an app that kept it, or the
     * environ holding it), no weak reference, no attribute set on it, not closed (tell()
     * raises), at position 0 and empty (a write, even one truncated away, moves the position
     * or leaves bytes). GIL held (or, free-threaded, o is the calling thread's own: with no
     * other reference no other thread can reach it). */
    static int cyserve__input_fresh(PyObject *o)
    {
        PyObject *v;
        Py_ssize_t n;
        if (cyserve__bio_type == NULL || !Py_IS_TYPE(o, cyserve__bio_type) || Py_REFCNT(o) != 2)
            return 0;
        if (*(PyObject **)((char *)o + cyserve__bio_type->tp_weaklistoffset) != NULL
                || *(PyObject **)((char *)o + cyserve__bio_type->tp_dictoffset) != NULL)
            return 0;
    #ifdef Py_GIL_DISABLED
        /* As in cyserve__rebind: the last other holder's use of o comes before ours. */
        atomic_thread_fence(memory_order_acquire);
    #endif
        v = cyserve__bio_tell(o, NULL);
        if (v == NULL) {  /* closed */
            PyErr_Clear();
            return 0;
        }
        n = PyLong_AsSsize_t(v);
        Py_DECREF(v);
        if (n != 0) {
            PyErr_Clear();  /* none: a position is a Py_ssize_t */
            return 0;
        }
        v = cyserve__bio_getvalue(o, NULL);
        if (v == NULL) {
            PyErr_Clear();
            return 0;
        }
        n = PyBytes_Check(v) ? PyBytes_GET_SIZE(v) : -1;
        Py_DECREF(v);
        return n == 0;
    }
    """
    void _input_setup "cyserve__input_setup"(object type)
    bint _input_fresh "cyserve__input_fresh"(PyObject *o) noexcept


_input_setup(_BYTESIO)


# The keys a dict's table of 32 slots holds (CPython's USABLE_FRACTION: two thirds).
DEF DICT_USABLE_32 = 21
# The most keys _tls_environ adds, but for a client certificate's chain.
DEF TLS_ENVIRON_KEYS = 7


cdef dict _presized(dict items, Py_ssize_t n):
    """items in a dict that holds n keys without a resize: made by inserting them, when it can
    be the table of 32 slots that insertion gives (for up to DICT_USABLE_32 keys), else
    presized. PyDict_Copy clones a dict's table with its size and layout, so the environ (a copy
    of the connection's part) keeps the request's keys without a resize either. The smaller
    table is the one to have where it suffices: insertion makes a table of str keys alone
    (16-byte entries, no hash) that fits CPython's small-object allocator, about 400 bytes,
    while _PyDict_NewPresized makes a general one (24-byte entries) of 64 slots, about 1.1 KiB
    from malloc: a copy that costs twice as much to make and to free. Same keys, same
    order."""
    cdef dict d
    if n <= DICT_USABLE_32:
        d = {}
    else:
        d = _PyDict_NewPresized(n)
    for k, v in items.items():
        d[k] = v
    return d


cdef class WSGIHandler:
    """A Python handler (a callable taking a Request) that runs the WSGI application ``app``
    mounted at ``script_name`` (cyserve/wsgi.py)."""

    cdef readonly object app
    cdef readonly str script_name
    # The environ's keys that are the same on every request: replaced whole by bind() before
    # requests arrive, then only read (copied) by every worker.
    cdef dict _base
    # The server's root path (set_root_path), None without one.
    cdef str _outer
    cdef bytes _outer_b

    def __init__(self, app, str script_name=""):
        if not callable(app):
            raise TypeError(f"a WSGI application must be callable, got {type(app).__name__}")
        self.app = app
        self.script_name = script_name.rstrip("/")
        self._base = _interned({
            "SCRIPT_NAME": self.script_name,
            "SERVER_NAME": "localhost",
            "SERVER_PORT": "80",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.errors": _sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "wsgi.input_terminated": True,
            "wsgi.file_wrapper": _FileWrapper,
        })

    def bind(self, str host, int port, int threads, bint processes):
        """Where the app runs, set by cyserve.serve() before requests arrive: SERVER_NAME and
        SERVER_PORT for a request without Host, wsgi.multithread, wsgi.multiprocess."""
        base = dict(self._base)
        base["SERVER_NAME"] = host or "localhost"
        base["SERVER_PORT"] = str(port)
        base["wsgi.multithread"] = threads > 1
        base["wsgi.multiprocess"] = bool(processes)
        self._base = _interned(base)  # replaced whole: a request being served keeps its copy

    def set_root_path(self, str root):
        """The server's root path (--root-path; "" for none), set before requests arrive:
        SCRIPT_NAME is it followed by the mount's prefix (_root_environ)."""
        self._outer = root or None
        self._outer_b = root.encode("ascii") if root else None

    def __repr__(self):
        name = getattr(self.app, "__qualname__", type(self.app).__name__)
        return f"<WSGIHandler {getattr(self.app, '__module__', '?')}.{name}>"

    def environ(self, Request request):
        """The PEP 3333 environ of request (valid during its handler call)."""
        request._check()
        inp = request._input if type(request._input) is RequestBody else None
        return self._environ(request._req, inp, _tcache())

    cdef dict _environ(self, const cyserve_request *req, RequestBody inp, _ThreadCache cache):
        """cache: this thread's (_tcache()), looked up once per request by the caller."""
        cdef size_t i, slen = len(self.script_name)
        cdef const cyserve_header *h
        cdef const char *peer
        cdef const char *host = NULL
        cdef size_t host_n = 0, peer_n = 0
        cdef int n_host = 0
        cdef bint host_first = False
        # The connection's facts in one call (TLS, HTTP/2, the scheme, the peer).
        cdef unsigned conn = cs.server_req_conn(<const cs.req_t *>req, &peer)
        cdef bint tls = (conn & cs.SERVER_REQ_TLS) != 0
        for i in range(req.num_headers):
            h = &req.headers[i]
            if h.name.len == 4 and _is_host(h.name.ptr):
                n_host += 1
                host = h.value.ptr
                host_n = h.value.len
                host_first = i == 0
        if peer != NULL:
            peer_n = strlen(peer)
        cdef int flags = (
            (2 if conn & cs.SERVER_REQ_HTTP2 else
             1 if req.minor_version == 1 else 0)
            | (4 if tls else 0)
            # "http" unless a trusted proxy said "https" (X-Forwarded-Proto, Forwarded: proto=).
            | (8 if conn & cs.SERVER_REQ_HTTPS else 0)
            | (16 if n_host == 1 else 0)
            | (32 if peer != NULL else 0)
            # The one Host is the first header: its HTTP_HOST is the connection part's too.
            | (64 if n_host == 1 and host_first else 0))
        if n_host != 1:
            host = NULL
            host_n = 0
        # The keys a request may add to the part's (the headers not in it, TLS's), for its size.
        cdef Py_ssize_t extra = (<Py_ssize_t>req.num_headers - (1 if flags & 64 else 0)
                                 + (TLS_ENVIRON_KEYS if tls else 0))
        cdef _EnvPart part = self._conn_part(cache, flags, peer, peer_n, host, host_n, extra)
        cdef bint prefixed = slen and req.path.len >= slen
        # REQUEST_METHOD and PATH_INFO go into the connection's part before it is copied: they
        # are the same str objects as on the connection's previous request more often than not
        # (_method_str's and _path_str's), and then the copy has them already. The part is this
        # thread's own and only ever copied, so no app sees it change.
        method = _method_str(req.method)
        if method is not part.method:
            part.env["REQUEST_METHOD"] = method
            part.method = method
        # The router matched the prefix on a segment boundary: the path starts with it.
        if prefixed:
            path = _path_str(req.path.ptr + slen, req.path.len - slen, cache)
        else:
            path = _path_str(req.path.ptr, req.path.len, cache)
        if path is not part.path:
            part.env["PATH_INFO"] = path
            part.path = path
        # wsgi.input for a request without a body: the part's own empty BytesIO, which the copy
        # then has already, when no earlier request's app kept it or changed it (_input_fresh);
        # otherwise a new one, kept by the part for the next request.
        if inp is None and req.body.len == 0 and not _input_fresh(<PyObject *>part.inp):
            # BytesIO.__new__ alone: the very object BytesIO() gives (its __init__ with no
            # initial value only resets the empty state __new__ made), without the call's
            # argument parsing.
            fresh = (<PyTypeObject *>_BYTESIO).tp_new(<type>_BYTESIO, <PyObject *>_NO_ARGS, NULL)
            part.env[_K_INPUT] = fresh
            part.inp = fresh
        # The keys set below are already in the copy, in the order they had when each request
        # inserted them (_conn_part): each is a replacement, cheaper than an insertion.
        cdef dict env = PyDict_Copy(part.env)
        if prefixed:
            # Both decoded alike (PEP 3333); the prefix's bytes as this request spelt them.
            env["SCRIPT_NAME"] = _unquote_latin1(req.path.ptr, slen)
        if self._outer is not None:
            _root_environ(self, env, req)
        if req.query.len:  # else the part's ""
            env["QUERY_STRING"] = _str_of(req.query)
        if inp is not None:  # a large body, read from the connection as the app reads
            env[_K_INPUT] = inp
        elif req.body.len:  # else the part's, above
            env[_K_INPUT] = _BYTESIO(
                PyBytes_FromStringAndSize(req.body.ptr, <Py_ssize_t>req.body.len))
        cdef bint had_length = False
        cdef Py_ssize_t used
        # With flag 64 the first header (the Host) is in the part already, as HTTP_HOST.
        for i in range(1 if flags & 64 else 0, req.num_headers):
            h = &req.headers[i]
            key = _env_key(h.name.ptr, h.name.len, cache)
            if key is None:
                if h.name.len == 14 and strncasecmp(h.name.ptr, "content-length", 14) == 0:
                    had_length = True
                continue
            value = _str_of(h.value)
            # One lookup that inserts, rather than a get and a set; the dict grew when the name
            # was new (not "the value came back": one-character and empty strs are shared).
            used = PyDict_GET_SIZE(env)
            old = <object>PyDict_SetDefault(env, key, value)
            if PyDict_GET_SIZE(env) == used:  # repeated: one value, as Request.headers joins them
                env[key] = old + ("; " if key == "HTTP_COOKIE" else ", ") + value
        if inp is not None:
            if inp._br.length >= 0:  # chunked: no length; wsgi.input ends where the body does
                env["CONTENT_LENGTH"] = str(inp._br.length)
        elif req.body.len or had_length:
            env["CONTENT_LENGTH"] = str(req.body.len)
        if tls:
            _tls_environ(env, <const cs.req_t *>req)
        if n_host > 1:  # one value joined from them all, as HTTP_HOST gives it
            _env_host(env, env["HTTP_HOST"], tls)
        return env

    cdef _EnvPart _conn_part(self, _ThreadCache cache, int flags, const char *peer,
                             size_t peer_n, const char *host, size_t host_n, Py_ssize_t extra):
        """The environ's keys that depend only on the connection and its Host (the base, then
        SERVER_PROTOCOL, wsgi.url_scheme, SERVER_NAME and SERVER_PORT from the one Host header,
        REMOTE_ADDR and REMOTE_PORT from the peer, the request's own keys with placeholder
        values, and HTTP_HOST when the one Host is the first header): a dict that each request
        copies. They are the same on every request of a keep-alive connection, so they are made
        once for it and kept in this thread's table (_ThreadCache.env_parts: WSGI_ENV_SLOTS
        slots in sets of WSGI_ENV_WAYS, the one used last first). Each entry is a function of
        what it is looked up by (the base dict, flags, the peer's and the Host's bytes), all
        compared on a hit: an entry can be reused by another connection only where it would be
        made the same. So a request sees exactly the keys and values it would get without the
        table. A miss (the set full of others) makes the part again, as the first request did.
        The set is found by a multiplicative hash of the engine's pointer to the peer's address,
        which is the same on every request of a connection (the connection keeps the text it
        made on its first request; behind a trusted proxy, the request's buffer for the client
        its headers name), mixed with flags and the Host's length: no byte is read for it. The
        pointer only picks the set: a connection whose memory the engine gives to a new one
        lands in the old one's set, where the part is compared in full and made again when the
        new peer differs. Why this hash and sets of four: with 64 connections served in
        turn, FNV-1a over the peer's and the Host's bytes (about 150 instructions) into 256 sets
        of two missed on 2-3 % of the requests (three ports in one set evict each other in
        turn), each miss about 11,000 instructions; the engine's pointers, made one after
        another, step evenly through memory, and a Fibonacci hash spreads an even step evenly
        over the sets, so that 64 connections in 128 sets of four miss on none (a simulation and
        the counts: docs/benchmarks.md, "Session 20: the environ's connection parts at 64
        connections"; sets of one and two: "Session 18").
        The part used last is tried first, before the hash: a keep-alive connection's requests
        that come one after another find it with one pointer comparison before the full one.
        extra: how many keys the request that makes it may add to a copy (_presized)."""
        cdef _EnvPart part
        if peer == cache.env_last_peer and cache.env_last is not None:
            part = <_EnvPart>cache.env_last
            if _part_is(part, self._base, flags, peer, peer_n, host, host_n):
                return part
        # The set: a multiplicative (Fibonacci) hash of the engine's pointer to the peer's
        # address, the same on every request of a connection, with flags and the Host's length:
        # no bytes read. Pointers of connections made one after another are spread over the sets
        # evenly by it (docs/benchmarks.md, "Session 20: the environ's connection parts"). Without
        # a peer (a Unix socket) the Host's bytes are hashed (FNV-1a) instead, so that requests
        # for several hosts are not all in one set.
        cdef uint64_t key
        cdef size_t i
        cdef unsigned fnv
        if peer != NULL:
            key = <uint64_t><uintptr_t>peer >> 4
        else:
            fnv = 2166136261u
            for i in range(host_n):
                fnv = (fnv ^ <unsigned char>host[i]) * 16777619u
            key = fnv
        key = (key ^ <uint64_t>flags ^ (<uint64_t>host_n << 7)) * 0x9E3779B97F4A7C15u
        # The set's first slot: the product's top bits, the well-mixed ones.
        cdef Py_ssize_t slot = <Py_ssize_t>(key >> (64 - WSGI_ENV_SET_BITS)) * WSGI_ENV_WAYS
        cdef Py_ssize_t way, j
        cdef object seen
        cdef list parts = cache.env_parts
        for way in range(WSGI_ENV_WAYS):
            seen = <object>PyList_GET_ITEM(parts, slot + way)
            if seen is None:
                break  # a set fills from its first slot: nothing behind an empty one
            part = <_EnvPart>seen
            if _part_is(part, self._base, flags, peer, peer_n, host, host_n):
                # Used last now: first in its set, the ones before it one slot down (the set is
                # kept in the order of use, so a miss lets the least recently used go).
                if way:
                    j = way
                    while j:
                        parts[slot + j] = parts[slot + j - 1]
                        j -= 1
                    parts[slot] = part
                cache.env_last = part
                cache.env_last_peer = peer
                return part
        cdef const char *colon
        cdef const char *p
        # The keys below: SERVER_PROTOCOL, REMOTE_ADDR, REMOTE_PORT, the request's four, HTTP_HOST.
        cdef dict env = _presized(self._base, PyDict_GET_SIZE(self._base) + 8 + extra)
        env["SERVER_PROTOCOL"] = (_HTTP2 if flags & 3 == 2 else
                                  _HTTP11 if flags & 3 == 1 else _HTTP10)
        if flags & 12:  # TLS, or a trusted proxy's "https"
            env[_K_SCHEME] = "https"
        cdef str host_s = None
        if host != NULL:
            host_s = PyUnicode_DecodeLatin1(host, <Py_ssize_t>host_n, NULL)
            _env_host(env, host_s, flags & 4 != 0)
        if peer != NULL:
            colon = peer + peer_n
            while colon > peer and colon[0] != c':':
                colon -= 1
            if colon > peer:
                p = peer
                if p[0] == c'[':  # [v6]:port
                    env["REMOTE_ADDR"] = PyUnicode_DecodeLatin1(p + 1, colon - p - 2, NULL)
                else:
                    env["REMOTE_ADDR"] = PyUnicode_DecodeLatin1(p, colon - p, NULL)
                env["REMOTE_PORT"] = PyUnicode_DecodeLatin1(colon + 1, peer + peer_n - colon - 1,
                                                            NULL)
        # The request's own keys, with the values each request replaces (an empty query string
        # stays as it is), in the order _environ used to insert them: so that the copy only
        # replaces values, and the app sees the keys in the same order as before. Then the Host's
        # HTTP_HOST when the Host is the first header, where the header loop would insert it.
        env["REQUEST_METHOD"] = "GET"  # replaced by _environ, in the part or in its copy
        env["PATH_INFO"] = ""
        env["QUERY_STRING"] = ""
        env[_K_INPUT] = None
        if flags & 64:
            env["HTTP_HOST"] = host_s
        part = _EnvPart.__new__(_EnvPart)
        part.base = self._base
        part.flags = flags
        part.peer = PyBytes_FromStringAndSize(peer, <Py_ssize_t>peer_n) if peer_n else b""
        part.host = PyBytes_FromStringAndSize(host, <Py_ssize_t>host_n) if host_n else b""
        part.peer_p = PyBytes_AS_STRING(part.peer)
        part.host_p = PyBytes_AS_STRING(part.host)
        part.peer_n = peer_n
        part.host_n = host_n
        part.env = env
        part.method = "GET"
        part.path = ""
        part.inp = None
        # This thread's own table: nobody else reads it (entries are replaced whole). The set's
        # entries move one slot down, and its last one (used least recently) is let go.
        for j in range(WSGI_ENV_WAYS - 1, 0, -1):
            parts[slot + j] = parts[slot + j - 1]
        parts[slot] = part
        cache.env_last = part
        cache.env_last_peer = peer
        return part

    def __call__(self, Request request):
        request._check()
        inp = request._input if type(request._input) is RequestBody else None
        return self._call(request._req, inp)

    cdef _WSGIAnswer _call(self, const cyserve_request *req, RequestBody inp=None,
                           cs.resp_t *resp=NULL, _ThreadCache cache=None):
        """The answer to req (the handler trampoline calls this directly: a WSGI app has no use
        for a Request object); inp: its body when streamed; resp: the engine's response that
        _fill_wsgi fills afterwards, where start_response may write the headers at once (NULL:
        none, they are kept in the answer); cache: this thread's, when the caller has it."""
        if cache is None:
            cache = _tcache()
        env = self._environ(req, inp, cache)
        cdef _WSGIAnswer answer = _answer_for(cache)
        answer.resp = resp
        try:
            return self._run(req, env, answer, cache)
        except BaseException:
            _answer_clear(answer)  # no answer: what it held goes now (see _answer_clear)
            raise
        finally:
            # Only while the app's call runs: a start_response called later (from a streamed
            # body's pieces) must not write into a response the engine has moved on with.
            answer.resp = NULL
            _methods_release(cache)

    cdef _WSGIAnswer _run(self, const cyserve_request *req, dict env, _WSGIAnswer answer,
                          _ThreadCache cache):
        # The app called through a borrowed pointer: self.app is set once, before the server
        # starts, and self lives as long as its route (Server keeps the route's tuple), so the
        # app outlives the call without a reference of the call's own. A reference taken and
        # dropped here would be, on a free-threaded build, two atomic operations on the count
        # of an object another thread made (the app's function), shared by every worker's
        # cache on each request. args[0] is the slot PY_VECTORCALL_ARGUMENTS_OFFSET lends.
        cdef PyObject *args[3]
        args[0] = NULL
        args[1] = <PyObject *>env
        args[2] = <PyObject *>answer  # start_response (_start_response)
        result = _vectorcall(<PyObject *>self.app, &args[1], 2 | _VC_ARGS_OFFSET, NULL)
        cdef bint head = req.method.len == 4 and memcmp(req.method.ptr, "HEAD", 4) == 0
        cdef bint streaming = False
        try:
            if type(result) is _FILE_WRAPPER and _wsgi_file(answer, <object>result):
                pass  # sent from the file, with sendfile; closed below
            elif type(result) is list or type(result) is tuple:
                # The whole body at once: nothing can be gained by streaming it.
                for chunk in result:
                    _wsgi_take(answer, chunk)
            else:
                streaming = _wsgi_collect(answer, iter(result), result, head)
        finally:
            # A list or a tuple has no close (and, exact types, no subclass to add one).
            if not streaming and type(result) is not list and type(result) is not tuple:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        if answer.status == 0:
            if streaming:
                _wsgi_close(answer.result)
            raise WSGIError("the WSGI application returned without calling start_response")
        return answer


cdef bint _wsgi_file(_WSGIAnswer answer, wrapper) except -1:
    """When wrapper (wsgi.file_wrapper's) reads a regular file in binary mode and the answer can
    be all of its rest, take a descriptor of the file into answer (its body, sent with sendfile
    from the file's current position to its end) and return True. Otherwise False: the wrapper
    is iterated as any iterable, with the same outcome for the app as before."""
    if (answer.status == 0 or answer.status == 204 or answer.status == 304
            or answer.status == 205 or answer.chunks):
        return False
    f = getattr(wrapper, "filelike", None)
    if not isinstance(f, (_io.BufferedIOBase, _io.RawIOBase)):
        return False  # a text file would yield str (the app's error), a socket is no file
    try:
        fd = f.fileno()
        st = _os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode):
            return False
        pos = f.tell()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    rest = max(0, st.st_size - pos)
    length = answer.length_value()
    if length is not None and length != rest:
        return False  # what iterating gives (a mismatch is the app's error)
    answer.file_fd = _OwnedFd.__new__(_OwnedFd)
    answer.file_fd.fd = _os.dup(fd)  # the app's file is closed next; this stays open
    answer.file_offset = pos
    answer.file_len = rest
    return True


cdef bytes _exact_bytes(data):
    """bytes(data) as an exact bytes object. bytes() of a bytes subclass calls its __bytes__,
    which may return another subclass, whose deallocation may run the app's code: a copy then,
    so that an answer's pieces run none when they go (_chunks_empty)."""
    data = bytes(data)
    if type(data) is not bytes:
        data = PyBytes_FromStringAndSize(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    return <bytes>data


cdef int _wsgi_take(_WSGIAnswer answer, chunk) except -1:
    """Add one piece of the body the app yielded to answer.chunks: 1 when it had bytes."""
    if type(chunk) is not bytes:
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise WSGIError(f"the WSGI application yielded a {type(chunk).__name__}, not bytes")
        chunk = _exact_bytes(chunk)  # also a bytes subclass: the engine takes exact bytes
    if not chunk:
        return 0
    if answer.status == 0:
        raise WSGIError("the WSGI application sent body bytes before calling start_response")
    answer.chunks.append(chunk)
    answer.total += len(<bytes>chunk)
    return 1


# The iterators whose rest _wsgi_collect looks at before the answer goes out.
# C globals, as _BYTESIO is: each answer's collection compares its iterator's type with them.
cdef object _LIST_ITERATOR = type(iter([]))
cdef object _TUPLE_ITERATOR = type(iter(()))


cdef extern from "Python.h":
    # NULL at the end (no error set), or with the iterator's error set (raised here).
    PyObject *_iter_next "PyIter_Next"(object it) except? NULL


# A body's iterator is read with PyIter_Next, not with a for loop: the loop calls iter() on what
# is already an iterator (iter(result) made it), and an iterator written in Python (Werkzeug's
# ClosingIterator, which wraps every Flask answer) runs its __iter__ for that, a Python call of
# about 500 instructions, each time a loop begins: once per answer in _wsgi_collect, and once
# per piece of a streamed one (_stream_step).
cdef object _END = object()  # _next_piece's "the iterator has ended": no piece can be it


cdef inline object _next_piece(it):
    """The iterator's next piece, or _END at its end; its error is raised."""
    cdef PyObject *p = _iter_next(it)
    if p == NULL:
        return _END
    piece = <object>p
    Py_DECREF(piece)  # PyIter_Next's reference: piece holds its own
    return piece


cdef bint _wsgi_collect(_WSGIAnswer answer, it, result, bint head) except -1:
    """Collect what a body iterator yields, up to where the answer can start: its end, the
    Content-Length the app announced, or, when the body had better be streamed (a length not
    announced, or a long one), its first piece. Returns True when the rest is to be streamed:
    answer then holds the iterator, and the duty to close result.

    PEP 3333 has the head wait for the first piece with bytes (or write()'s) or the iterator's
    end, "the only possible exception" an announced "Content-Length: 0": until then the app may
    still replace its answer (start_response with exc_info), and an error gives a 500. So an
    empty piece moves nothing on, unless the announced length is filled by then (0, or by what
    write() gave): then it is the body's last piece, as a piece with bytes that fills it is.

    An answer to HEAD sends no body: its head is known at that same point, and the rest of an
    iterator that may run the app's code is not read (head_cut): it could run for as long as
    the app likes (a slow generator, server-sent events, an endless one), holding the connection
    and a worker for bytes nobody gets. result.close() ends it, as PEP 3333 lets a server end
    an iteration early. gunicorn reads it to its end and drops it (its worker spins for ever on
    an endless one): docs/architecture.md, "Answers to HEAD". A list's or a tuple's rest runs
    no code of the app and is read as GET's is, so that a HEAD is refused where GET is."""
    cdef object length
    cdef bint full = False, took
    cdef bint plain = type(it) is _LIST_ITERATOR or type(it) is _TUPLE_ITERATOR
    while True:
        chunk = _next_piece(it)
        if chunk is _END:
            return False  # the end
        took = _wsgi_take(answer, chunk)
        if full:
            if took:
                # A piece past a body that filled its Content-Length exactly: dropped, the
                # body sent as announced, and the mistake logged by the caller (answer.past),
                # as a streamed body's piece past its length is (_stream_count); gunicorn sends
                # the same bytes. (A piece that crosses the length is a body that cannot be
                # sent as announced: _fill_wsgi's 500.)
                answer.total -= len(<bytes>answer.chunks.pop())
                answer.past = True
                return False
            continue
        if answer.status == 0:
            continue  # an empty piece before start_response (bytes there are refused)
        length = answer.length_value()
        if not took and (length is None or answer.total < length):
            continue  # an empty piece: nothing moves on (see above)
        if head and (length is None or not plain):
            answer.head_cut = True  # _fill_wsgi checks what came, then sends the head
            return False
        if length is None:
            # Unknown length: the first piece goes out now (server-sent events must not wait
            # for the next one).
            break
        if answer.total > length:
            return False  # more than announced: _fill_wsgi's 500
        if answer.total < length:
            if answer.total >= WSGI_STREAM_AFTER and not head:
                break
            continue
        # Everything announced is here. The rest of the iterator should give nothing more
        # (PEP 3333 has the server iterate to the end anyway): stopping here cut a body that
        # went on in another piece without a word. A list's or a tuple's rest is looked at
        # now, which runs no code of the app. Any other iterator may run the app's code for as
        # long as it likes before it ends (work after its last piece, a wait, empty pieces for
        # ever): the body goes out first, as gunicorn writes each piece as it comes, and the
        # rest is looked at once it is sent (streamed: _stream_step lets go at the length).
        if plain:
            full = True
            continue
        break
    answer.it = it
    answer.result = result
    return True


cdef void _wsgi_close(result) noexcept:
    """result.close() for a stream the engine let go of; a failure is logged, not raised."""
    try:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    except BaseException:
        try:
            _error_log.exception("closing a WSGI answer failed")
        except BaseException:
            pass


cdef class _WSGIStream:
    """What the engine holds (one reference) while a body is streamed: the iterator, and what
    to close at the end."""
    cdef object it
    cdef object result
    cdef bytes label
    cdef object ctx  # the contextvars context of the call that made the answer
    cdef RequestBody inp  # wsgi.input when streamed: readable until the answer's end
    # The bytes of the announced Content-Length not yet given to the engine, or -1 (none
    # announced). A piece that goes past it is cut by the engine, which sends exactly what the
    # head announced (more would be read as the next answer); the app cannot be told (its
    # generator is not in a send() to raise in), so the cut is logged, once, with the request
    # (label: its method and target, as bytes: decoded only for that line, which few answers
    # need, where the str made for every answer cost about 500 instructions).
    cdef int64_t announced, left
    # The answer, for its write(): what the app writes while it makes a piece goes out before
    # that piece (_stream_step).
    cdef _WSGIAnswer answer


cdef int _py_stream(void *opaque, void *stream, cs.resp_t *resp, int op) noexcept nogil:
    # The target's py_stream (csrc/server.h), called between the offload hooks like _py_call.
    with gil:
        return _py_stream_impl(<object>opaque, <PyObject *>stream, resp, op)


cdef int _py_stream_impl(tuple info, PyObject *ref, cs.resp_t *resp, int op) noexcept:
    cdef _WSGIStream st = <_WSGIStream>ref
    cdef int rc = -1
    cdef bint entered = False
    _leases_drain()  # the piece before this one, among others
    try:
        # Every piece, and the close, in the context the app's call ran in: what the call set
        # (Flask's request context) is there, and what a piece sets is there for the next.
        PyContext_Enter(st.ctx)
        entered = True
    except BaseException:
        _stream_failed(info)
    if entered:
        rc = _stream_step(info, st, resp, op)
    if rc == 1:
        _context_exit(st.ctx)
        return 1  # the engine keeps its reference: more to come
    if st.inp is not None:
        # The engine finishes the body once the answer is done (and after a stop, the
        # connection is gone before the app's close() runs).
        st.inp._detach()
    _wsgi_close(st.result)
    if entered:
        _context_exit(st.ctx)
    Py_DECREF(st)  # the engine's reference: released
    return rc


cdef int _stream_step(tuple info, _WSGIStream st, cs.resp_t *resp, int op) noexcept:
    """The next piece into resp: 1 when there is one, 0 at the end (or abandoned), -1 when the
    app failed (logged)."""
    cdef list written
    try:
        if op == cs.SERVER_STREAM_NEXT:
            written = st.answer.chunks
            while True:
                chunk = _next_piece(st.it)
                if chunk is _END:
                    break
                if type(chunk) is not bytes:
                    if not isinstance(chunk, (bytes, bytearray, memoryview)):
                        raise WSGIError(f"the WSGI application yielded a "
                                        f"{type(chunk).__name__}, not bytes")
                    chunk = _exact_bytes(chunk)
                if written:  # write() while the piece was made: those bytes came first
                    written.append(chunk)
                    chunk = b"".join(written)
                    del written[:]
                if chunk:
                    _stream_count(info, st, len(<bytes>chunk))
                    _set_body(resp, <bytes>chunk)
                    return 1
            if written:  # write() after the last piece
                chunk = b"".join(written)
                del written[:]
                _stream_count(info, st, len(<bytes>chunk))
                _set_body(resp, <bytes>chunk)
                return 1
        elif st.left == 0:
            # Let go once the pieces filled the announced length exactly: the engine asks for
            # nothing past it, so a body that goes on would be cut without a word (one that
            # crosses the length in a piece is logged by _stream_count). Look for a next
            # piece, as PEP 3333's server iterates to the end, and log it the same way. Empty
            # pieces are read on, but not for ever: an iterator that yields nothing but empty
            # ones past its length would hold the GIL and this connection for good, so after
            # WSGI_EMPTY_PAST_LENGTH of them it is closed (PEP 3333 lets a server end an
            # iteration early), with a line that says so.
            if st.answer.chunks:  # write() after the last piece
                _stream_count(info, st, 1)
            else:
                empty = 0
                while True:
                    chunk = _next_piece(st.it)
                    if chunk is _END:
                        break
                    if not isinstance(chunk, (bytes, bytearray, memoryview)):
                        raise WSGIError(f"the WSGI application yielded a "
                                        f"{type(chunk).__name__}, not bytes")
                    if len(chunk) or st.answer.chunks:
                        _stream_count(info, st, 1)
                        break
                    empty += 1
                    if empty == WSGI_EMPTY_PAST_LENGTH:
                        _error_log.error(
                            "handler %s: the body of its answer to %s filled its "
                            "Content-Length %d, then its iterator gave %d empty pieces without "
                            "ending: closed", info[2], st.label.decode("latin-1"), st.announced,
                            empty)
                        break
        return 0
    except BaseException:
        _stream_failed(info)
        return -1


cdef int _stream_count(tuple info, _WSGIStream st, Py_ssize_t n) except -1:
    """A piece of n bytes goes to the engine: logs the first that goes past the announced
    Content-Length (the engine sends the part that fits, and asks for no more)."""
    if st.left < 0:
        return 0
    if n > st.left:
        _log_past_length(info[2], st.label.decode("latin-1"), st.announced)
        st.left = -1  # once: the engine asks for no more
        return 0
    st.left -= n
    return 0


cdef int _log_past_length(handler, str request, int64_t length) except -1:
    """The error line for an answer whose body went on past the Content-Length its app
    announced (the app cannot be told: it is in no call that could raise)."""
    _error_log.error("handler %s: the body of its answer to %s goes on past its "
                     "Content-Length %d: only those bytes are sent, the rest is dropped",
                     handler, request, length)
    return 0


cdef void _stream_failed(tuple info) noexcept:
    try:
        _error_log.exception("handler %s failed while streaming its answer (the "
                             "connection is closed)", info[2])
    except BaseException:
        pass


cdef dict _METHOD_STRS = {}


cdef str _method_str(cyserve_str m):
    # The same few methods on every request: one str each, not one per request; GET and POST
    # without even a lookup.
    if m.len == 3 and memcmp(m.ptr, "GET", 3) == 0:
        return "GET"
    if m.len == 4 and memcmp(m.ptr, "POST", 4) == 0:
        return "POST"
    cdef bytes raw = PyBytes_FromStringAndSize(m.ptr, <Py_ssize_t>m.len)
    cdef PyObject *hit = PyDict_GetItem(_METHOD_STRS, raw)
    if hit != NULL:
        return <str>hit
    s = raw.decode("latin-1")
    if len(_METHOD_STRS) < 64:
        return _METHOD_STRS.setdefault(raw, s)  # never replaces: see _WSGI_REASONS
    return s


cdef tuple _split_host(str host):
    cdef Py_ssize_t end
    if host.startswith("["):  # [v6]:port
        end = host.find("]")
        if end < 0:
            return host, ""
        return host[1:end], (host[end + 2:] if host[end + 1:end + 2] == ":" else "")
    name, sep, port = host.rpartition(":")
    return (name, port) if sep else (host, "")


cdef int _env_host(dict env, str host, bint tls) except -1:
    """SERVER_NAME and SERVER_PORT from the request's Host (PEP 3333: HTTP_HOST first): its name,
    unless it has none (":80", then the server's own from the base), and its port, or the
    scheme's default."""
    if not host:
        return 0
    name, port = _split_host(host)
    if name:
        env["SERVER_NAME"] = name
    env["SERVER_PORT"] = port or ("443" if tls else "80")
    return 0


cdef extern from *:
    """
    /* Are a[0..n) and b[0..n) the same bytes? A peer's "127.0.0.1:54321" and most Hosts are 8
     * to 16 bytes: two 8-byte words each, the second ending where the bytes do (they overlap
     * below 16), compare them without memcmp's call and its length dispatch. */
    static inline int cyserve__same_bytes(const char *a, const char *b, size_t n)
    {
        uint64_t a0, a1, b0, b1;
        if (n < 8 || n > 16)
            return n == 0 || memcmp(a, b, n) == 0;  /* no Host: b is NULL */
        memcpy(&a0, a, 8);
        memcpy(&b0, b, 8);
        memcpy(&a1, a + n - 8, 8);
        memcpy(&b1, b + n - 8, 8);
        return ((a0 ^ b0) | (a1 ^ b1)) == 0;
    }
    """
    bint _same_bytes "cyserve__same_bytes"(const char *a, const char *b, size_t n)


cdef inline bint _part_is(_EnvPart part, base, int flags, const char *peer, size_t peer_n,
                          const char *host, size_t host_n):
    """Whether part was made from these (WSGIHandler._conn_part): then it is the one to use.
    Read through the part's C fields: no reference taken to its bytes objects."""
    return (part.base is base and part.flags == flags
            and part.peer_n == peer_n and part.host_n == host_n
            and _same_bytes(part.peer_p, peer, peer_n)
            and _same_bytes(part.host_p, host, host_n))


cdef class _EnvPart:
    """One entry of a thread's table of connection parts (WSGIHandler._conn_part): what it was
    made from, and the dict."""
    cdef object base
    cdef int flags
    cdef bytes peer
    cdef bytes host
    # The bytes of peer and host and their lengths, for _part_is: pointers into the two bytes
    # objects, which the part holds for as long as it lives and which never change.
    cdef const char *peer_p
    cdef const char *host_p
    cdef size_t peer_n
    cdef size_t host_n
    cdef dict env
    # The values of env's REQUEST_METHOD and PATH_INFO (WSGIHandler._environ replaces them when
    # a request's differ), compared by identity.
    cdef object method
    cdef object path
    # env's wsgi.input: an empty BytesIO that each request without a body gets in its copy,
    # while _input_fresh finds it untouched; None before the first (WSGIHandler._environ).
    cdef object inp


cdef class _OwnedFd:
    """A descriptor of a wsgi.file_wrapper's file that the answer owns until the engine's
    response takes it (fd -1 then); closed when the answer fails before that. A holder of its
    own, so that _WSGIAnswer needs no __dealloc__ (whose error-state save and restore every
    answer would pay)."""
    cdef int fd

    def __cinit__(self):
        self.fd = -1

    def __dealloc__(self):
        if self.fd >= 0:
            _os.close(self.fd)


cdef extern from "Python.h":
    ctypedef PyObject *(*vectorcallfunc)(PyObject *callable, PyObject *const *args,
                                         size_t nargsf, PyObject *kwnames)
    object _vectorcall "PyObject_Vectorcall"(PyObject *callable, PyObject *const *args,
                                             size_t nargsf, PyObject *kwnames)
    size_t _VC_ARGS_OFFSET "PY_VECTORCALL_ARGUMENTS_OFFSET"
    Py_ssize_t PyVectorcall_NARGS(size_t nargsf)
    tuple PyList_AsTuple(object lst)


cdef extern from *:
    """
    /* start_response is the request's answer itself (_WSGIAnswer), called through vectorcall:
     * the app's call reaches _start_response with its two or three arguments as they are,
     * without a bound method to make and free, a descriptor's call, or Cython's parsing of
     * keywords. A call with keywords, or with a wrong count, takes the general way, which
     * parses them as a Python function would (and raises its TypeError). */
    static PyObject *(*cyserve__sr_impl)(PyObject *, PyObject *, PyObject *, PyObject *);
    static PyObject *(*cyserve__sr_general)(PyObject *, PyObject *const *, size_t, PyObject *);

    static PyObject *cyserve__sr_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                            PyObject *kwnames)
    {
        Py_ssize_t n = PyVectorcall_NARGS(nargsf);
        if (kwnames == NULL && (n == 2 || n == 3))
            return cyserve__sr_impl(self, args[0], args[1], n == 3 ? args[2] : Py_None);
        return cyserve__sr_general(self, args, nargsf, kwnames);
    }

    /* Make the instances of tp callable through the vectorcallfunc each holds at offset
     * (NULL: a TypeError from PyVectorcall_Call), as a type declares with
     * __vectorcalloffset__. Called once at import, before any instance exists: CPython reads
     * these fields on each call, and a type that no class can derive from (_WSGIAnswer is
     * final to Python: a subclass is never made) has no copy of them to update. */
    static void cyserve__sr_make_callable(PyTypeObject *tp, Py_ssize_t offset)
    {
        tp->tp_vectorcall_offset = offset;
        tp->tp_call = PyVectorcall_Call;
        tp->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
    }
    """
    object (*cyserve__sr_impl)(object, object, object, object)
    object (*cyserve__sr_general)(object, PyObject *const *, size_t, PyObject *)
    PyObject *cyserve__sr_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) noexcept
    void cyserve__sr_make_callable(PyTypeObject *tp, Py_ssize_t offset)


@cython.final
cdef class _WSGIAnswer:
    """One request's start_response (the app calls this object: _start_response) and write(),
    and then the answer itself: the handler returns it and _fill_wsgi copies it into the
    engine's response."""

    cdef vectorcallfunc vc  # cyserve__sr_vectorcall once the handler made it (_call)
    cdef object __weakref__  # as the bound method start_response was, it may be referenced weakly
    cdef int status  # 0 until start_response
    cdef object reason  # the app's own reason phrase as bytes, or None: the engine's
    # The app's headers as a tuple (a snapshot: the app may change its list afterwards), and a
    # bit for each of the first 64 that is not sent as it is (Content-Length, the dropped ones,
    # Connection): start_response builds no list of those it keeps.
    cdef tuple headers
    cdef uint64_t skip
    # The engine's response while the app's call runs from the handler trampoline (_call),
    # else NULL. start_response then checks the app's headers and writes those it keeps into
    # it at once (in_resp), instead of keeping a snapshot of them until the app returns: the
    # app's list and its tuples are freed with the app's own frame, as any server that copies
    # them out frees them, and no tuple is made for them.
    cdef cs.resp_t *resp
    cdef bint in_resp  # the headers of the current start_response are in resp already
    cdef list chunks
    cdef Py_ssize_t total  # bytes in chunks
    cdef object length  # the app's Content-Length header, or None
    cdef bint close
    # An answer to HEAD whose iterator was closed once its head was known, before its end
    # (_wsgi_collect): chunks hold what came up to there, which _fill_wsgi checks, not sends.
    cdef bint head_cut
    cdef object it  # the rest of the body, when it is streamed
    cdef object result
    # The head went to the engine with the first piece of a streamed answer: from then on an
    # error page can no longer replace it (_start_response).
    cdef bint sent
    # A piece came after the body had filled its Content-Length exactly: dropped by
    # _wsgi_collect, logged by the caller of _fill_wsgi (_py_call_impl), which knows the route.
    cdef bint past
    # A body in a file (wsgi.file_wrapper, _wsgi_file): our descriptor of it, or None.
    cdef _OwnedFd file_fd
    cdef uint64_t file_offset
    cdef uint64_t file_len

    cdef object length_value(self):
        """The announced Content-Length as an int, or None (none, or a 204/304's)."""
        if self.length is None or self.status == 204 or self.status == 304:
            return None
        if type(self.length) is not int:
            self.length = _wsgi_length(self.length)
        return self.length

    cdef int64_t length_int(self) except -2:
        """length_value() as a C integer, -1 for none: the answer's own path (_fill_wsgi) reads
        the app's digits without making an int object, nor one for the body's length to compare
        it with."""
        if self.length is None or self.status == 204 or self.status == 304:
            return -1
        if type(self.length) is int:  # length_value() made it (a streamed body's collection)
            return <int64_t>self.length
        return _wsgi_length_int(self.length)

    def write(self, data):
        if self.status == 0:
            raise WSGIError("write() called before start_response")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise WSGIError(f"write() takes bytes, not {type(data).__name__}")
        data = _exact_bytes(data)
        self.chunks.append(data)
        self.total += len(<bytes>data)


cdef object _start_response(object obj, object status, object headers, object exc_info):
    """start_response(status, response_headers, exc_info=None) of the answer obj (PEP 3333): the
    status line and the headers checked as they come, kept in the answer; returns write."""
    cdef _WSGIAnswer self = <_WSGIAnswer>obj
    if exc_info is not None and self.sent:
        # The head went out with the first piece of a streamed answer: an error page cannot
        # replace it, so the app's error is raised again, from start_response (PEP 3333), and
        # the stream ends cut short, as gunicorn ends it.
        raise exc_info[1].with_traceback(exc_info[2])
    if self.status != 0 and exc_info is None:
        raise WSGIError("start_response called a second time without exc_info")
    # Nothing is sent before the app has finished its call or, for a streamed answer, yielded
    # its first piece, so until then an error page may replace the first answer.
    cdef _ThreadCache cache = _tcache()
    cdef int code
    # The status line by the object's address in this thread's table, as _header_kind_of finds
    # a header name: apps pass the same constant str on every request. The table holds each
    # str it keeps, and an exact str cannot change, so a hit is that very line, checked before.
    cdef Py_ssize_t slot = <Py_ssize_t>((<size_t><PyObject *>status >> 4)
                                        & (WSGI_STATUS_SLOTS - 1))
    if PyList_GET_ITEM(cache.status_objs, slot) == <PyObject *>status:
        code = cache.status_codes[slot]
        reason = <object>PyList_GET_ITEM(cache.status_reasons, slot)
    else:
        code, reason = _wsgi_status_line(status)
        if type(status) is str:
            # This thread's own table: no other thread reads it between the stores, and
            # what they release (exact str, bytes, None) runs no code of an app's.
            cache.status_codes[slot] = code
            cache.status_reasons[slot] = reason
            cache.status_objs[slot] = status
    if not isinstance(headers, list):
        raise WSGIError(f"WSGI response headers must be a list of (name, value) tuples, "
                        f"got {type(headers).__name__}")
    if self.resp != NULL:
        _sr_into_resp(self, <list>headers, cache, code, reason)
        return _method_for(cache, _WRITE, self)
    cdef tuple items = PyList_AsTuple(headers)
    cdef Py_ssize_t i, n = PyTuple_GET_SIZE(items)
    cdef uint64_t skip = 0
    cdef bint close = False, filtered = False
    cdef int kind
    cdef PyObject *item
    cdef PyObject *name
    length = None
    for i in range(n):
        item = PyTuple_GET_ITEM(items, i)
        if not (PyTuple_CheckExact(<object>item) and PyTuple_GET_SIZE(<object>item) == 2
                and PyUnicode_Check(<object>PyTuple_GET_ITEM(<object>item, 0))
                and PyUnicode_Check(<object>PyTuple_GET_ITEM(<object>item, 1))):
            raise WSGIError(f"invalid WSGI response header {<object>item!r}: must be a (str, "
                            "str) tuple")
        name = PyTuple_GET_ITEM(<object>item, 0)
        kind = _header_kind_of(<object>name, cache)
        if kind == _H_KEEP or kind == _H_CTYPE:
            continue
        if i < 64:
            skip |= (<uint64_t>1) << i
        else:
            filtered = True
        if kind == _H_LENGTH:
            length = <object>PyTuple_GET_ITEM(<object>item, 1)
        elif kind == _H_CONNECTION:
            value = <object>PyTuple_GET_ITEM(<object>item, 1)
            if "close" in [t.strip() for t in value.lower().split(",")]:
                close = True
        elif kind != _H_DROP:
            raise WSGIError(f"the WSGI application set the hop-by-hop header {<object>name!r}, "
                            "which is the server's to write")
    if filtered:  # past the mask's 64: those kept, as a tuple of their own
        items = tuple([it for it in items
                       if _header_kind_of(it[0], cache) in (_H_KEEP, _H_CTYPE)])
        skip = 0
    self.status = code
    self.reason = reason
    self.headers = items
    self.skip = skip
    self.in_resp = False
    self.length = length
    self.close = close
    if self.chunks:
        del self.chunks[:]  # what write() sent for the answer this one replaces
    self.total = 0
    return _method_for(cache, _WRITE, self)


cdef int _sr_into_resp(_WSGIAnswer self, list headers, _ThreadCache cache, int code,
                       reason) except -1:
    """start_response's work when the engine's response is at hand (self.resp): each header
    checked as _start_response checks it and, when kept, written into the response at once. A
    second call (with exc_info: an error page replacing the first answer, nothing being sent
    before the app returns) first empties the response, which holds nothing but the first
    answer's headers yet. On any failure the response is emptied and the answer has no status
    (the app, should it swallow the error, gets a 500 as for a missing start_response), and the
    error is raised in the app's call, where PEP 3333 lets start_response raise it."""
    cdef cs.resp_t *resp = self.resp
    cdef Py_ssize_t i
    cdef bint close = False
    cdef int kind
    cdef object item, name, value
    if self.status != 0:
        cs.resp_reset(resp)
    self.status = 0
    length = None
    try:
        # By index, the size read on every pass: the list is the app's, and nothing here runs
        # its code (an exact str's kind is computed without it) but a str subclass's lower().
        i = 0
        while i < PyList_GET_SIZE(headers):
            item = <object>PyList_GET_ITEM(headers, i)
            i += 1
            if not (PyTuple_CheckExact(item) and PyTuple_GET_SIZE(item) == 2
                    and PyUnicode_Check(<object>PyTuple_GET_ITEM(item, 0))
                    and PyUnicode_Check(<object>PyTuple_GET_ITEM(item, 1))):
                raise WSGIError(f"invalid WSGI response header {item!r}: must be a (str, "
                                "str) tuple")
            name = <object>PyTuple_GET_ITEM(item, 0)
            value = <object>PyTuple_GET_ITEM(item, 1)
            kind = _header_kind_of(name, cache)
            if kind == _H_KEEP:
                _add_header(resp, name, value)
            elif kind == _H_CTYPE:
                _add_ctype(resp, name, value)
            elif kind == _H_LENGTH:
                length = value
            elif kind == _H_CONNECTION:
                if "close" in [t.strip() for t in value.lower().split(",")]:
                    close = True
            elif kind != _H_DROP:
                raise WSGIError(f"the WSGI application set the hop-by-hop header {name!r}, "
                                "which is the server's to write")
    except BaseException:
        cs.resp_reset(resp)
        self.in_resp = False
        raise
    self.status = code
    self.reason = reason
    self.headers = None
    self.skip = 0
    self.in_resp = True
    self.length = length
    self.close = close
    if self.chunks:
        del self.chunks[:]  # what write() sent for the answer this one replaces
    self.total = 0
    return 0


cdef int _add_ctype(cs.resp_t *resp, name, value) except -1:
    """_add_header(resp, name, value) for the name "Content-Type" (_H_CTYPE): the same line,
    the same checks of the value and the same errors, without those of the name."""
    cdef Py_ssize_t vlen
    cdef const char *v
    cdef int rc
    if type(value) is not str or not PyUnicode_IS_ASCII(value):
        return _add_header(resp, name, value)
    v = PyUnicode_AsUTF8AndSize(value, &vlen)
    rc = cs.resp_set_content_type(resp, v, <size_t>vlen)
    if rc:
        _check_rc(rc, f"header {name!r}")
    return 0


cdef tuple _SR_PARAMS = ("status", "response_headers", "exc_info")


cdef object _start_response_general(object obj, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames):
    """start_response called with keywords, or with a wrong number of arguments: they are
    matched to PEP 3333's parameters as a Python function's would be, with its TypeErrors."""
    cdef Py_ssize_t n = PyVectorcall_NARGS(nargsf), i, j, nkw = 0
    if n > 3:
        raise TypeError(f"start_response() takes from 2 to 3 positional arguments but {n} "
                        "were given")
    values = [<object>args[i] for i in range(n)] + [_NO_VALUE] * (3 - n)
    if kwnames != NULL:
        nkw = PyTuple_GET_SIZE(<tuple>kwnames)
    for i in range(nkw):
        name = (<tuple>kwnames)[i]
        if name not in _SR_PARAMS:
            raise TypeError(f"start_response() got an unexpected keyword argument {name!r}")
        j = _SR_PARAMS.index(name)
        if values[j] is not _NO_VALUE:
            raise TypeError(f"start_response() got multiple values for argument {name!r}")
        values[j] = <object>args[n + i]
    for j in range(2):
        if values[j] is _NO_VALUE:
            raise TypeError(f"start_response() missing required argument {_SR_PARAMS[j]!r}")
    return _start_response(obj, values[0], values[1],
                           None if values[2] is _NO_VALUE else values[2])


cyserve__sr_impl = _start_response
cyserve__sr_general = _start_response_general


cdef void _wsgi_answer_callable() except *:
    # The offset of _WSGIAnswer.vc, read from an instance: Cython names the C struct, not us.
    cdef _WSGIAnswer probe = _WSGIAnswer.__new__(_WSGIAnswer)
    cyserve__sr_make_callable(<PyTypeObject *>_WSGIAnswer,
                              <Py_ssize_t>(<char *>&probe.vc - <char *><PyObject *>probe))


_wsgi_answer_callable()


# write as a function: each request binds it to its answer with PyMethod_New (_bind_method, or
# the method of the thread's rebound by _method_for), which gives the very bound method that
# `answer.write` would, without that attribute lookup through the type and its descriptor (about
# 250 instructions).
cdef object _WRITE = _WSGIAnswer.write


cdef tuple _wsgi_status_line(status):
    """(code, reason) of the WSGI status line status, as _wsgi_status and _wsgi_reason give them,
    from the shared table of those seen (an exact str) or computed."""
    cdef PyObject *hit = NULL
    if type(status) is str:  # an exact str: the lookup cannot fail
        hit = PyDict_GetItemWithError(_WSGI_STATUSES, status)
    if hit != NULL:  # a status line seen (and checked) before
        return <tuple>hit
    code = _wsgi_status(status)
    t = (code, _wsgi_reason(<str>status, code))
    if type(status) is str and len(_WSGI_STATUSES) < 256:
        return _WSGI_STATUSES.setdefault(status, t)  # see _WSGI_REASONS
    return t


cdef object _wsgi_length(value):
    """The Content-Length header value an app gave, as an int (_content_length's checks)."""
    return _wsgi_length_int(value)


cdef int64_t _wsgi_length_int(value) except -2:
    """_wsgi_length(value) as a C integer (at most 18 digits: it fits). Digits in an ASCII str,
    the usual case, are read here without the str methods."""
    cdef Py_ssize_t n, i = 0
    cdef const char *p
    cdef long long v = 0
    if type(value) is str and PyUnicode_IS_ASCII(value):
        p = PyUnicode_AsUTF8AndSize(value, &n)
        if 0 < n <= 18:
            while i < n and c'0' <= p[i] <= c'9':
                v = v * 10 + (p[i] - c'0')
                i += 1
            if i == n:
                return v
    return <int64_t>_content_length(value)  # spaces, or not a number: its message


# start_response's view of a response header name (_H_* above), computed once per name an app
# uses (the names are an app's constants), bounded; past the bound, computed each time.
cdef dict _HEADER_KINDS = {}
# The (code, reason) of each valid WSGI status line seen, as _wsgi_status and _wsgi_reason give.
cdef dict _WSGI_STATUSES = {}


cdef int _header_kind_of(name, _ThreadCache cache) except -1:
    """_header_kind(name), remembered by this thread for the name object itself: an app's
    header names are its constants, the same str objects on every request, so the slot of the
    object's address answers when it holds that very object, without hashing or a dict. The
    table holds a reference to each name in it, so no other object can have its address
    meanwhile, and an exact str cannot change: the kind stays right. A collision recomputes."""
    cdef Py_ssize_t slot = <Py_ssize_t>((<size_t><PyObject *>name >> 4) & (WSGI_KINDS_SLOTS - 1))
    if PyList_GET_ITEM(cache.kind_names, slot) == <PyObject *>name:
        return cache.kind_codes[slot]
    cdef int kind = _header_kind(name)
    if type(name) is str:  # a subclass may lower() as it likes: computed each time
        # This thread's own table: no other thread reads it between the two stores.
        cache.kind_codes[slot] = <signed char>kind
        cache.kind_names[slot] = name
    return kind


cdef int _header_kind(name) except -1:
    cdef PyObject *hit = NULL
    if type(name) is str:  # a subclass may hash and compare as it likes
        # PyDict_GetItemWithError: an exact str's hash and comparison cannot fail, and it does
        # not save and restore the error state around the lookup as PyDict_GetItem does (about
        # 100 instructions of each lookup's 170).
        hit = PyDict_GetItemWithError(_HEADER_KINDS, name)
    if hit != NULL:
        return <int><object>hit
    lname = name.lower()
    if type(name) is str and name == "Content-Type":
        kind = _H_CTYPE
    elif lname == "content-length":
        kind = _H_LENGTH
    elif lname in _WSGI_DROPPED:
        kind = _H_DROP
    elif lname == "connection":
        kind = _H_CONNECTION
    elif lname in _HOP_BY_HOP_ERRORS:
        kind = _H_ERROR
    else:
        kind = _H_KEEP
    if type(name) is str and len(_HEADER_KINDS) < 256:
        _HEADER_KINDS.setdefault(name, kind)  # see _WSGI_REASONS
    return kind


cdef int _wsgi_status(status) except -1:
    """The code of a WSGI status line ("200 OK"): a final status, 200..599."""
    cdef str s
    if not isinstance(status, str):
        raise WSGIError(f"WSGI status must be a str such as '200 OK', got "
                        f"{type(status).__name__}")
    s = <str>status
    if (len(s) < 3 or not ("2" <= s[0] <= "5") or not ("0" <= s[1] <= "9")
            or not ("0" <= s[2] <= "9") or (len(s) > 3 and s[3] != " ")
            or "\r" in s or "\n" in s):
        raise WSGIError(f"invalid WSGI status {status!r}: must be a final status such as "
                        "'200 OK' (200..599)")
    return (ord(s[0]) - 48) * 100 + (ord(s[1]) - 48) * 10 + (ord(s[2]) - 48)


cdef extern from "csrc/http1_write.h" nogil:
    const char *http_reason(int code, size_t *len)


cdef object _wsgi_reason(str s, int code):
    """The reason phrase of the valid WSGI status line s (of code) as bytes to send, or None when
    it is the engine's own (or s has none)."""
    cdef PyObject *hit = PyDict_GetItem(_WSGI_REASONS, s)
    if hit != NULL:
        return <object>hit
    cdef size_t rlen
    cdef const char *ours
    reason = None
    if len(s) > 3:
        try:
            b = s[4:].encode("latin-1")
        except UnicodeEncodeError:
            raise WSGIError(f"invalid WSGI status {s!r}: the reason phrase must be latin-1 "
                            "text") from None
        # RFC 9112 4: reason-phrase = *( HTAB / SP / VCHAR / obs-text ).
        for c in b:
            if (c < 0x20 and c != 0x09) or c == 0x7f:
                raise WSGIError(f"invalid WSGI status {s!r}: the reason phrase holds a "
                                "control character")
        ours = http_reason(code, &rlen)
        if <size_t>len(b) != rlen or memcmp(<const char *>b, ours, rlen) != 0:
            reason = b
    if len(_WSGI_REASONS) < 256:
        return _WSGI_REASONS.setdefault(s, reason)  # never replaces (see above)
    return reason


cdef int _fill_wsgi(_WSGIAnswer a, cs.resp_t *resp, bint head, ctx, cyserve_request *req,
                    RequestBody inp=None) except -1:
    cdef bytes body
    cdef int64_t length  # the announced Content-Length, -1 for none
    cdef _WSGIStream st
    cdef tuple items, item
    cdef Py_ssize_t i
    try:
        if cs.resp_set_status(resp, a.status):
            _check_rc(-22, f"status {a.status}")
        if a.reason is not None:
            _check_rc(cs.resp_set_reason(resp, PyBytes_AS_STRING(a.reason),
                                         <size_t>PyBytes_GET_SIZE(a.reason)), "reason phrase")
        if not a.in_resp:  # else start_response wrote them (_sr_into_resp)
            items = a.headers
            for i in range(PyTuple_GET_SIZE(items)):
                if i < 64 and (a.skip >> i) & 1:
                    continue
                item = <tuple>PyTuple_GET_ITEM(items, i)
                _add_header(resp, <object>PyTuple_GET_ITEM(item, 0),
                            <object>PyTuple_GET_ITEM(item, 1))
        if a.close:
            _add_header(resp, "Connection", "close")
        if a.file_fd is not None:
            _check_rc(cs.resp_set_body_file(resp, a.file_fd.fd, a.file_offset, a.file_len),
                      "file body")
            a.file_fd.fd = -1  # the response's now
            return 0
        chunks = a.chunks
        if not chunks:
            body = b""
        elif len(chunks) == 1:
            body = chunks[0]
        else:
            body = b"".join(chunks)
        if body and (a.status == 204 or a.status == 304 or a.status == 205):
            raise ValueError(f"a {a.status} response cannot have a body "
                             f"({len(body)} bytes given)")
        length = a.length_int()
        if a.head_cut:
            # An answer to HEAD whose body was not all read (_wsgi_collect): what came is
            # checked as GET's would be, and the head says GET's length where it is announced.
            # Without one, GET's body would be streamed: no length, since "Content-Length: 0"
            # would be a claim about it.
            if length >= 0 and len(body) > length:
                raise ValueError(f"Content-Length {length} does not match the body's "
                                 f"{len(body)} bytes")
            _check_rc(cs.resp_set_head_length(resp, length if length >= 0
                                              else cs.RESP_LENGTH_UNKNOWN), "Content-Length")
            return 0
        if a.it is not None:
            if body:
                _set_body(resp, body)
            st = _WSGIStream.__new__(_WSGIStream)
            st.it = a.it
            st.result = a.result
            st.answer = a
            # What write() gave so far went out above; from now on it adds to the stream.
            a.chunks = []
            a.total = 0
            st.ctx = ctx
            st.announced = st.left = -1
            if length >= 0:
                st.announced = length
                st.left = length - len(body)
                st.label = _request_line(req)
            _check_rc(cs.resp_set_stream(resp, <void *>st, length), "stream")
            Py_INCREF(st)  # the engine's reference, dropped by _py_stream_impl
            a.sent = True
            if inp is not None:  # the app may read its body while it answers
                st.inp = inp
                inp._kept = True
            a.it = a.result = None
            return 0
        if length >= 0 and length != len(body):
            # What GET would send, announced by an answer to HEAD without a body (Werkzeug).
            if body or not head:
                raise ValueError(f"Content-Length {length} does not match the body's "
                                 f"{len(body)} bytes")
            _check_rc(cs.resp_set_head_length(resp, length), "Content-Length")
        elif head and not body and length < 0:
            # No length announced and no body: GET's length is not known (its body would be
            # streamed), and "Content-Length: 0" would be a claim about it.
            _check_rc(cs.resp_set_head_length(resp, cs.RESP_LENGTH_UNKNOWN), "Content-Length")
        if body:
            return _set_body_whole(resp, body, head)
        return 0
    finally:
        if a.it is not None:  # not handed to the engine: the answer failed
            _wsgi_close(a.result)
            a.it = a.result = None


cdef bytes _request_line(const cyserve_request *req):
    """The request's method and target as one bytes object, "GET /path?q", with no str made."""
    cdef bytes b = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>(req.method.len + 1 + req.target.len))
    cdef char *p = PyBytes_AS_STRING(b)
    memcpy(p, req.method.ptr, req.method.len)
    p[req.method.len] = c' '
    memcpy(p + req.method.len + 1, req.target.ptr, req.target.len)
    return b


cdef void _root_environ(WSGIHandler self, dict env, const cyserve_request *req) except *:
    # SCRIPT_NAME is the root path, then the mount's prefix as the request spelt it. An
    # application mounted at "/" whose request path still begins with the root path (a proxy
    # that passes it on) has it moved from PATH_INFO to SCRIPT_NAME, as gunicorn does with its
    # SCRIPT_NAME: the application sees the same environ either way.
    cdef size_t n = <size_t>len(self._outer_b)
    if (not self.script_name and req.path.len >= n
            and memcmp(req.path.ptr, <const char *>self._outer_b, n) == 0
            and (req.path.len == n or req.path.ptr[n] == c'/')):
        env["SCRIPT_NAME"] = self._outer
        env["PATH_INFO"] = _unquote_latin1(req.path.ptr + n, req.path.len - n)
    else:
        env["SCRIPT_NAME"] = self._outer + env["SCRIPT_NAME"]
