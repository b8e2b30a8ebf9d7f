# ASGI 3 applications (the http scope), included in cyserve._core after python_handler.pyx and
# wsgi.pyx. cyserve/asgi.py runs the event loop and lifespan; docs/architecture.md ("ASGI") has
# the design and its measurements.
#
# Who runs what: an ASGI route is a Python target whose call (_asgi_call, on a worker in its
# offload batch, GIL held) builds the scope and an _Exchange, queues the application's start for
# the loop, and defers the answer (cs.resp_set_defer) through the exchange's handoff
# (csrc/handoff.h): the request's coroutine then parks without holding the worker. At the end of
# the batch the offload hook calls _asgi_flush, which appends every start and every notice the
# batch queued to the loop's pending list, and the hook wakes the loop once (its eventfd) after
# the GIL is released (_ASGILoop.wake_fd). On the loop thread the app's send() fills the handoff's
# response and gives the turn to the engine (a scheduler signal, no GIL on the engine's side).
# A streamed body goes back and forth once per piece: the engine writes the piece, then asks for
# the next through the target's py_stream (_asgi_stream, offloaded), which resolves the pending
# send(): awaiting send() on a slow reader suspends the app, nothing queues without bound.
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject_Call
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.version cimport PY_VERSION_HEX
from libc.errno cimport errno
from posix.unistd cimport close, read

# The offload end hook (python_handler.pyx) calls cyserve__asgi_flush, GIL held, when
# cyserve__asgi_queued says this batch queued something for the loop.
cdef extern from *:
    int cyserve__asgi_queued
    void (*cyserve__asgi_flush)() noexcept
    int cyserve__asgi_wake_fd

# The loop's own wake-up (_ASGILoop.wake_fd): an eventfd the loop reads, which a worker writes
# after its batch released the GIL. It relies on the GIL to make a flush's append and the
# loop's drain exclusive, so a free-threaded build keeps call_soon_threadsafe.
cdef extern from *:
    """
    #include <sys/eventfd.h>
    #ifdef Py_GIL_DISABLED
    #define CYSERVE__ASGI_OWN_WAKE 0
    #else
    #define CYSERVE__ASGI_OWN_WAKE 1
    #endif
    """
    int eventfd(unsigned int initval, int flags)
    int EFD_NONBLOCK, EFD_CLOEXEC
    int CYSERVE__ASGI_OWN_WAKE

# h.producer, the exchange, is read by a worker (_asgi_stream_impl) while the loop thread may be
# deallocating that exchange. With the GIL the two cannot overlap. On a free-threaded
# interpreter, the read takes a reference only if the object is still alive
# (PyUnstable_TryIncRef), under a lock that __dealloc__ also takes to clear the field: so the
# memory stays the object's until the worker has its reference or knows it is gone. The lock is
# one word for the module, taken once per streamed ASGI piece and once per exchange's end.
cdef extern from *:
    """
    #if defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030E0000
    static PyMutex cyserve__producer_mu;
    static void cyserve__producer_enable(PyObject *o) { PyUnstable_EnableTryIncRef(o); }
    static PyObject *cyserve__producer_get(void **slot)
    {
        PyObject *p;
        PyMutex_Lock(&cyserve__producer_mu);
        p = (PyObject *)*slot;
        if (p != NULL && !PyUnstable_TryIncRef(p))
            p = NULL; /* being deallocated: as good as gone */
        PyMutex_Unlock(&cyserve__producer_mu);
        return p;
    }
    static void cyserve__producer_clear(void **slot)
    {
        PyMutex_Lock(&cyserve__producer_mu);
        *slot = NULL;
        PyMutex_Unlock(&cyserve__producer_mu);
    }
    #else
    /* The GIL makes the read and the reference one step. (3.13t lacks PyUnstable_TryIncRef:
     * ASGI streaming there has the race above, as it always had.) */
    static void cyserve__producer_enable(PyObject *o) { (void)o; }
    static PyObject *cyserve__producer_get(void **slot)
    {
        PyObject *p = (PyObject *)*slot;
        Py_XINCREF(p);
        return p;
    }
    static void cyserve__producer_clear(void **slot) { *slot = NULL; }
    #endif
    """
    void cyserve__producer_enable(PyObject *o)
    PyObject *cyserve__producer_get(void **slot)
    void cyserve__producer_clear(void **slot)
    void Py_DecRef(PyObject *o)

import logging as _logging_asgi

_asgi_log = _logging_asgi.getLogger("cyserve.asgi")
import os as _os_pathsend
import stat as _stat_pathsend

# The loop the applications run on: cyserve.asgi sets it when it starts the loop thread, before
# the server takes requests, and clears it after the server stopped; the workers only read it
# meanwhile (and cyserve.asgi keeps the loop alive beyond that). What the current batch queued
# for its thread's loop, (callable, argument) pairs, is in the thread's _ThreadCache.asgi_queue:
# each worker's batch flushes its own, so that on a free-threaded interpreter one worker's flush
# can neither take another's half-made batch nor clear its flag.
cdef object _asgi_loop = None


# An iterator that is over before it starts: asking it for its next item gives NULL without an
# exception, which `await` (CPython's SEND, Cython's yield-from) reads as a return of None. It is
# exhausted here, once, so that it is never written again: threads share it.
cdef object _ASGI_DONE_ITER = iter(())
next(_ASGI_DONE_ITER, None)


cdef class _Taken:
    """The awaitable send() returns when it took its message at once. Awaiting a done future
    went through the future's iterator, which ends by raising StopIteration (an exception object
    made and caught, about 1,100 instructions per await on CPython 3.12); this one's iterator
    ends without an exception. It is awaitable as the spec asks and nothing else: an app that
    wraps it (asyncio.ensure_future, gather, wait_for) gets a task that ends at once."""

    def __await__(self):
        return _ASGI_DONE_ITER


cdef object _ASGI_TAKEN = _Taken()


cdef class _ASGILoop:
    """An event loop that runs ASGI requests, the requests' tasks it holds, and the state its
    lifespans made. The process's one loop, or on a free-threaded interpreter without the GIL
    (or when asked for) one of the loops that cyserve.asgi starts, one per worker thread, which
    a worker takes on its first ASGI request."""
    cdef public object loop
    # The requests' tasks, held until they end: the loop itself keeps only weak references, and
    # a task that awaits a future only its exchange refers to (a WebSocket's next message, a
    # long poll) is an unreachable cycle that the garbage collector would destroy while it
    # waits. One set per loop: only its loop's thread touches it.
    cdef public set tasks
    cdef public bint closed  # set by cyserve.asgi once the loop is stopped: not handed out again
    # ASGIHandler -> the state its app's lifespan made on this loop, of which every request on
    # this loop gets a shallow copy. Filled by cyserve.asgi before the server starts; only read
    # while it serves.
    cdef public dict states
    # What send() returns when it took the message at once (_ASGI_TAKEN, the same for every
    # loop): awaiting it neither suspends nor costs a coroutine.
    cdef readonly object ready
    # asyncio.Task, which _asgi_spawn calls itself while the loop has no task factory: the
    # loop's create_task (uvloop's, asyncio's) adds an argument parse and a call per request.
    cdef object task_type
    # Python 3.12+: the tasks start eagerly (Task's eager_start), see _asgi_spawn.
    cdef bint eager
    # Task's keyword arguments there, {"loop": loop, "eager_start": True}, made once: passed
    # as they are (PyObject_Call), they spare each call the dict that a call with keywords
    # builds from its names (Task.__init__ only reads it).
    cdef dict task_kwargs
    # The loop's thread, as _asgi_spawn and _asgi_ws_spawn find it: send() takes a message at
    # once only there (see _Exchange.send).
    cdef unsigned long ident
    # The batches' hand-off (_asgi_flush): the workers append what their batches queued to
    # `pending` under the GIL, and the first to find the loop not yet told (`armed` false)
    # writes wake_fd once its GIL is released (cyserve__offload_end); the loop's reader,
    # _drain, reads it, clears `armed` and runs what is pending, all under the GIL. Waking the
    # loop after the release, rather than with call_soon_threadsafe while the GIL is held,
    # spares the loop thread a wake-up that would only block on the GIL. -1 when the loop is
    # woken by call_soon_threadsafe instead (a free-threaded build).
    cdef readonly int wake_fd
    cdef list pending
    cdef bint armed

    def __init__(self, loop):
        import asyncio  # imported already: the loop exists
        self.loop = loop
        self.tasks = set()
        self.closed = False
        self.states = {}
        self.ready = _ASGI_TAKEN
        self.task_type = asyncio.Task
        self.eager = PY_VERSION_HEX >= 0x030C0000
        self.task_kwargs = {"loop": loop, "eager_start": True}
        self.pending = []
        self.armed = False
        self.wake_fd = -1
        if CYSERVE__ASGI_OWN_WAKE:
            fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
            if fd < 0:
                raise OSError(errno, "eventfd() for the ASGI event loop failed")
            try:
                # Before the loop runs: add_reader is then safe from this thread.
                loop.add_reader(fd, self._drain)
            except BaseException:
                close(fd)
                raise
            self.wake_fd = fd

    def _drain(self):
        """The loop's reader of wake_fd, on its thread: run what the workers' batches handed
        over since the last wake-up."""
        cdef uint64_t count
        if read(self.wake_fd, &count, sizeof(count)) < 0:
            pass  # EAGAIN: a wake-up already taken by an earlier drain
        self.armed = False
        if self.pending:
            batch = self.pending
            self.pending = []
            _asgi_run_batch(batch)

    def close_wake(self):
        """Stop reading wake_fd and close it: after the server stopped (no worker writes it any
        more) and the loop's thread ended."""
        if self.wake_fd >= 0:
            self.loop.remove_reader(self.wake_fd)
            close(self.wake_fd)
            self.wake_fd = -1


# The process's loop (_asgi_loop's), and with one loop per worker thread the callable that
# hands a worker thread its loop (cyserve.asgi), None otherwise.
cdef _ASGILoop _asgi_main = None
cdef object _asgi_new_loop = None


cdef _ASGILoop _asgi_here(_ThreadCache cache):
    """The loop that the requests this thread parses run on: its own loop when there is one per
    worker thread (taken on the thread's first ASGI request and kept for its life), the
    process's otherwise. Python state attached."""
    cdef _ASGILoop lp = cache.asgi_loop
    if lp is not None and not lp.closed:
        return lp
    if _asgi_new_loop is None:
        lp = _asgi_main
    else:
        lp = <_ASGILoop?>_asgi_new_loop()
    if lp is None:
        raise RuntimeError("the ASGI event loop is not running")
    cache.asgi_loop = lp
    return lp


# Headers the engine writes itself: an application's are dropped (a Content-Length is used as the
# announced length of a streamed body, or of a HEAD answer). _asgi_header_kind tells them, and
# Content-Type, from the others, in any case, without a lower-cased copy of each name
# (_ASGI_ENGINE_HEADERS names them for the WebSocket scope's denial response).
cdef frozenset _ASGI_ENGINE_HEADERS = frozenset((b"content-length", b"transfer-encoding",
                                                 b"date", b"connection"))
DEF _H_OTHER = 0
DEF _H_ENGINE = 1  # Transfer-Encoding, Date
DEF _H_LENGTH = 2
DEF _H_TYPE = 3
DEF _H_CONNECTION = 4


cdef int _asgi_header_kind(const char *n, Py_ssize_t k) noexcept:
    if k == 14 and strncasecmp(n, "content-length", 14) == 0:
        return _H_LENGTH
    if k == 12 and strncasecmp(n, "content-type", 12) == 0:
        return _H_TYPE
    if ((k == 17 and strncasecmp(n, "transfer-encoding", 17) == 0)
            or (k == 4 and strncasecmp(n, "date", 4) == 0)):
        return _H_ENGINE
    if k == 10 and strncasecmp(n, "connection", 10) == 0:
        return _H_CONNECTION
    return _H_OTHER


cdef inline object _mget(object message, str key, object default):
    """message.get(key, default), without the method call for a dict (what apps send). The keys
    are exact str, whose hash cannot fail: a NULL from the lookup is a missing key."""
    cdef PyObject *v
    if type(message) is dict:
        v = PyDict_GetItemWithError(message, key)
        return default if v == NULL else <object>v
    return message.get(key, default)


# Whether a message's type is the ASCII text lit[0..n), compared by its bytes. The apps' type
# strings ("http.response.start") are not interned (they are no identifiers), so a comparison
# with our constant was a PyUnicode_Compare of different objects, about 80 instructions each,
# three per request. An exact str only, as before (a subclass is no type the spec names).
cdef extern from *:
    """
    static inline int cyserve__asgi_str_is(PyObject *s, const char *lit, Py_ssize_t n)
    {
        return PyUnicode_CheckExact(s) && PyUnicode_IS_COMPACT_ASCII(s) &&
               PyUnicode_GET_LENGTH(s) == n && memcmp(PyUnicode_DATA(s), lit, (size_t)n) == 0;
    }
    """
    bint cyserve__asgi_str_is(object s, const char *lit, Py_ssize_t n) noexcept


cdef object _asgi_length(object v):
    """An app's Content-Length: 1*DIGIT (RFC 9110 8.6), with the OWS around a field value; a
    ValueError naming it otherwise (int() alone would take "+5", "1_0" and other digits)."""
    cdef bytes b = v if type(v) is bytes else bytes(v)
    cdef const char *p = PyBytes_AS_STRING(b)
    cdef Py_ssize_t i, n = PyBytes_GET_SIZE(b)
    cdef long long x = 0
    if 0 < n <= 18:
        for i in range(n):
            if not (c'0' <= p[i] <= c'9'):
                break
            x = x * 10 + (p[i] - c'0')
        else:
            return x
    s = b.strip(b" \t")
    if 0 < len(s) <= 18 and s.isdigit():
        return int(s)
    raise ValueError(f"ASGI: invalid Content-Length {v!r}")
cdef dict _ASGI_VERSION = {"version": "3.0", "spec_version": "2.4"}
# The Path Send extension's entry in the http scope (_Exchange._pathsend): its value is an empty
# dict, shared, as the spec gives it no keys. The HTTP Trailers extension's
# (_Exchange._body_trailed, _Exchange._trailers) likewise.
cdef dict _ASGI_PATHSEND = {}
cdef dict _ASGI_TRAILERS = {}
# The extensions of an http scope over plain TCP, of which each request gets a copy (a copy of a
# small dict costs less than building it key by key).
cdef dict _ASGI_EXTENSIONS = {"http.response.pathsend": _ASGI_PATHSEND,
                              "http.response.trailers": _ASGI_TRAILERS}
cdef Py_ssize_t _ASGI_CHUNK = 65536  # receive() hands a large body over in pieces of this size


def _asgi_set_loop(_ASGILoop lp, new_loop=None):
    """The process's loop (None once it stopped) and, for one loop per worker thread, the
    callable that hands a worker thread its loop. Set before the server starts, cleared after it
    stopped: the workers only read them meanwhile."""
    global _asgi_loop, _asgi_main, _asgi_new_loop
    _asgi_main = lp
    _asgi_loop = None if lp is None else lp.loop
    _asgi_new_loop = new_loop if lp is not None else None


cdef void _asgi_flush() except *:
    """Hand what this batch queued to the loop, in one wake-up. GIL held."""
    global cyserve__asgi_queued, cyserve__asgi_wake_fd
    cyserve__asgi_queued = 0
    cdef _ThreadCache cache = _tcache()
    if not cache.asgi_queue:
        return
    batch = cache.asgi_queue
    cache.asgi_queue = []
    # Everything queued is for this thread's loop (_asgi_queue_call sends the rest directly).
    cdef _ASGILoop lp = cache.asgi_loop
    if lp is None or lp.closed:
        return
    if lp.wake_fd >= 0:
        if lp.pending:
            lp.pending.extend(batch)
        else:
            lp.pending = batch
        if not lp.armed:
            lp.armed = True
            cyserve__asgi_wake_fd = lp.wake_fd  # written once the GIL is released
        return
    try:
        lp.loop.call_soon_threadsafe(_asgi_run_batch, batch)
    except RuntimeError:  # the loop is closed: the stop cancels what is left
        pass


def _asgi_run_batch(list batch):
    # An _Exchange is a request to start (_asgi_spawn); anything else a (callable, argument).
    # Everything in a batch is for one loop (_asgi_flush), whose task factory is looked up once:
    # -1 not yet, 1 none (the tasks are made directly), 0 the app set one.
    cdef int direct = -1
    for item in batch:
        try:
            if type(item) is _Exchange:
                if direct < 0:
                    direct = (<_Exchange>item).lp.loop.get_task_factory() is None
                _asgi_spawn(<_Exchange>item, direct)
            else:
                fn, arg = item
                fn(arg)
        except BaseException:
            _asgi_log.exception("ASGI dispatch failed")


cdef inline void _asgi_queue_call(_ASGILoop lp, fn, arg) except *:
    """fn(arg) on lp's thread: with this batch's other calls when lp is this thread's loop (the
    only one the batch's flush wakes), at once otherwise (a request whose coroutine moved to
    another worker, or to a relief thread, after its loop was chosen)."""
    global cyserve__asgi_queued
    cdef _ThreadCache cache = _tcache()
    cdef _ASGILoop here = cache.asgi_loop
    if (here is None or here.closed) and _asgi_new_loop is None:
        # One loop per process: every thread's batches go to it (a relief thread's too).
        here = cache.asgi_loop = _asgi_main
    if lp is here:
        cache.asgi_queue.append((fn, arg))
        cyserve__asgi_queued = 1
    elif not lp.closed:
        try:
            lp.loop.call_soon_threadsafe(fn, arg)
        except RuntimeError:  # the loop is closed: the stop cancels what is left
            pass


cdef inline void _asgi_queue_start(_Exchange ex) except *:
    global cyserve__asgi_queued
    cdef _ThreadCache cache = _tcache()
    ex.lp = _asgi_here(cache)
    cache.asgi_queue.append(ex)
    cyserve__asgi_queued = 1


cdef void _asgi_flush_hook() noexcept with gil:
    try:
        _asgi_flush()
    except BaseException:
        _asgi_log.exception("handing ASGI calls to the event loop failed")


cyserve__asgi_flush = _asgi_flush_hook


class ClientDisconnected(OSError):
    """send() after the client went away (as uvicorn raises)."""


# An http scope's send is the request's _Exchange itself, called through vectorcall (as WSGI's
# start_response is its _WSGIAnswer, wsgi.pyx): the app's `await send(message)` reaches
# _asgi_send_impl with its message as it is, without a bound method made and freed per request
# and, on each of its calls, the method's call of the function and Cython's parse of the
# argument (about 550 instructions a request, CPython 3.12, two messages). Any other call
# (keywords, another count of arguments) goes through _Exchange.send bound to the exchange,
# which parses it as a method would and raises its TypeError.
cdef extern from *:
    """
    static PyObject *(*cyserve__asgi_send_impl)(PyObject *, PyObject *);
    static PyObject *cyserve__asgi_send_fn; /* _Exchange.send, set at import, never cleared */

    static PyObject *cyserve__asgi_send_vectorcall(PyObject *self, PyObject *const *args,
                                                   size_t nargsf, PyObject *kwnames)
    {
        PyObject *m, *r;
        if (kwnames == NULL && PyVectorcall_NARGS(nargsf) == 1)
            return cyserve__asgi_send_impl(self, args[0]);
        m = PyMethod_New(cyserve__asgi_send_fn, self);
        if (m == NULL)
            return NULL;
        r = PyObject_Vectorcall(m, args, nargsf, kwnames);
        Py_DECREF(m);
        return r;
    }
    """
    object (*cyserve__asgi_send_impl)(object, object)
    PyObject *cyserve__asgi_send_fn
    PyObject *cyserve__asgi_send_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                            PyObject *kwnames) noexcept


@cython.final
cdef class _Exchange:
    """One request of an ASGI application: its receive() and send(), and the handoff its answer
    goes through. The exchange is the app's send itself (cyserve__asgi_send_vectorcall)."""
    cdef vectorcallfunc vc   # cyserve__asgi_send_vectorcall, set by ASGIHandler._start
    cdef cs.handoff_t *h
    cdef object handler      # the ASGIHandler
    cdef bytes body          # the request body, whole (the engine reads it before the call)
    cdef Py_ssize_t body_off
    cdef bint body_done, started, complete, gone, head, streaming
    # The HTTP Trailers extension: trailers is http.response.start's `trailers`; body_ended is
    # set by the body's last message of such a response, which then ends with the last
    # http.response.trailers message instead (_body_trailed, _trailers).
    cdef bint trailers, body_ended
    # The status has no content (1xx, 204, 304: RFC 9110 6.4.1): the answer is complete with
    # its head, as one to HEAD is, and the body's and trailers' messages that follow are taken:
    # empty ones and trailers dropped, body bytes refused (_no_content). Streamed instead, the
    # engine would have nothing to send (HTTP/1.1 must not chunk it, HTTP/2 ends the stream
    # with the HEADERS) and would tell the app that the client had gone, which it has not.
    cdef bint bodyless
    cdef int status
    cdef list headers        # the response's (name, value) pairs, checked at start
    cdef object length       # the app's Content-Length, or None
    # A streamed body with a Content-Length: the bytes given so far (the engine never sends
    # more than announced), and whether they reached it, which ended the response (_streamed).
    cdef int64_t streamed
    cdef bint filled
    cdef object written      # the future a streamed send() waits on
    cdef object ended        # the future receive() waits on for http.disconnect
    cdef bint body_stream    # the body comes piece by piece as receive() asks (body is b"")
    cdef object body_wait    # the future receive() waits on for the next piece
    cdef object task         # the task running _run, held in lp.tasks until _run ends
    cdef _ASGILoop lp        # the loop it runs on: its futures are that loop's
    cdef object app, scope   # what _asgi_spawn starts _run with (cleared then)
    cdef bint ran            # _run ended (within the eager first step, for _asgi_spawn)
    cdef readonly str label

    def __dealloc__(self):
        if self.h != NULL:
            cyserve__producer_clear(&self.h.producer)
            cs.handoff_release(self.h)
            self.h = NULL

    async def receive(self):
        if self.body_stream and not self.body_done:
            # The engine reads the next piece when asked (handoff_ask_body): an upload streams
            # through with one piece in memory, and a slow app slows the client down.
            if self.gone or self.complete:
                return {"type": "http.disconnect"}
            self.body_wait = self.lp.loop.create_future()
            if cs.handoff_ask_body(self.h, _asgi_body_piece) != 0:
                self._mark_gone()
            piece = await self.body_wait
            self.body_wait = None
            if piece is None:
                return {"type": "http.disconnect"}
            data, more = piece
            if not more:
                self.body_done = True
            return {"type": "http.request", "body": data, "more_body": more}
        if not self.body_done:
            n = len(self.body)
            end = self.body_off + _ASGI_CHUNK
            if end >= n:
                chunk = self.body if self.body_off == 0 else self.body[self.body_off:]
                self.body_done = True
                self.body = b""
                return {"type": "http.request", "body": chunk, "more_body": False}
            chunk = self.body[self.body_off:end]
            self.body_off = end
            return {"type": "http.request", "body": chunk, "more_body": True}
        if not (self.complete or self.gone):
            if self.ended is None:
                self.ended = self.lp.loop.create_future()
            # asyncio is imported here, not at the module's import: a server without an ASGI
            # app does not pay its ~6 MiB (it pulls in ssl and more). By now the loop runs, so
            # it is imported already and this is a dict lookup.
            import asyncio
            await asyncio.shield(self.ended)
        return {"type": "http.disconnect"}

    def send(self, message):
        # Not a coroutine function: send() does its work when called and returns an awaitable,
        # as the spec allows (granian's send is no coroutine either). A message taken at once
        # gives the loop's done future, which an await goes through without suspending; a
        # streamed piece gives the future of its write. A coroutine per message cost the loop
        # thread about a thousand instructions each. Called from another thread (as in
        # asyncio.run_coroutine_threadsafe(send(message), loop)), it gives a coroutine, which
        # takes the message on the loop's thread when it runs there.
        if PyThread_get_thread_ident() != self.lp.ident:
            return self._send_on_loop(message)
        return self._send(message)

    async def _send_on_loop(self, message):
        await self._send(message)

    cdef object _send(self, message):
        t = _mget(message, "type", None) if type(message) is dict else message["type"]
        if t is None:
            t = message["type"]  # the KeyError, as before
        if cyserve__asgi_str_is(t, "http.response.start", 19):
            if self.started:
                raise RuntimeError("ASGI: http.response.start sent twice")
            self.status = int(message["status"])
            # A 205 has no content either (RFC 9110 15.3.6); the engine frames it with
            # Content-Length: 0.
            self.bodyless = (self.status < 200 or self.status == 204 or self.status == 304
                             or self.status == 205)
            hdrs = _mget(message, "headers", None)
            self.headers = list(hdrs or ())
            # `trailers` is looked up only when the message has a key besides type, status and
            # headers: the usual start pays a size test, not a lookup.
            if type(message) is not dict or PyDict_GET_SIZE(message) > (2 if hdrs is None else 3):
                self.trailers = bool(message.get("trailers", False))
                if self.trailers and self.bodyless:
                    # Trailers follow a body, which this status cannot have: they would be
                    # dropped without a word (the Python API and GIL-free handlers refuse them
                    # too). Nothing has gone out, so an app that lets it go gets a 500.
                    self.trailers = False
                    raise RuntimeError(f"ASGI: http.response.start announces trailers for a "
                                       f"{self.status} response, which has no body for them "
                                       f"to follow")
            self.started = True
            return self.lp.ready
        if not cyserve__asgi_str_is(t, "http.response.body", 18):
            if cyserve__asgi_str_is(t, "http.response.pathsend", 22):
                return self._pathsend(message)
            if cyserve__asgi_str_is(t, "http.response.trailers", 22):
                return self._trailers(message)
            raise RuntimeError(f"ASGI: unexpected message {t!r} in the http scope")
        if not self.started:
            raise RuntimeError("ASGI: http.response.body before http.response.start")
        if self.gone:
            raise ClientDisconnected("the client went away")
        if self.complete:
            if self.head or self.bodyless:
                # An answer to HEAD, or of a status without content, is complete with its head:
                # the rest goes nowhere (but a body of a status without content is refused).
                if self.bodyless:
                    self._no_content(len(_mget(message, "body", b"")))
                return self.lp.ready
            if self.filled:
                return self._past_length(_mget(message, "body", b""))
            raise RuntimeError("ASGI: http.response.body after the response was complete")
        if self.trailers:
            return self._body_trailed(message)
        body = _mget(message, "body", b"")
        more = bool(_mget(message, "more_body", False))
        if self.bodyless:
            self._no_content(len(body))
        cdef cs.resp_t *resp = &self.h.resp
        if not self.streaming:
            if self.head and self.length is None and not more:
                self.length = len(body)  # what GET would carry: announced, not sent
            self._fill_head(resp)
            if (not more and not self.bodyless and self.length is not None
                    and self.length != len(body) and (body or not self.head)):
                # The whole body in one message, and a Content-Length that does not match it:
                # the app's error, found before anything is sent (a 500), as uvicorn raises
                # it in send(), not a length the engine would quietly correct. (An answer to
                # HEAD without a body announces GET's length: Starlette's.)
                raise RuntimeError(f"ASGI: Content-Length {self.length} does not match the "
                                   f"body's {len(body)} bytes")
            if self.head or self.bodyless:
                self._give(0)
                return self.lp.ready
            if more:
                announced = -1 if self.length is None else self.length
                _check_rc(cs.resp_set_stream(resp, <void *>self.h, announced), "ASGI response")
                self.streaming = True
        if self.streaming and self.length is not None:
            return self._streamed(body, more)
        if body:
            _set_body(resp, body if type(body) is bytes else bytes(body))
        if not more:
            self._give(0)
            return self.lp.ready
        self.written = self.lp.loop.create_future()
        self._give(1)
        # The engine writes the piece, then asks for the next (_asgi_stream): that resolves it.
        return self.written

    cdef int _no_content(self, int64_t n) except -1:
        # Body bytes for a status without content (1xx, 204, 205, 304): the app's mistake,
        # raised in its send() as uvicorn raises it, not dropped without a word. Before the head
        # went out (the body's first message: the head waits for it) nothing was sent and the
        # app's error makes the answer a 500, as cyserve's WSGI answers a body on such a status
        # (the message is WSGI's); after it (an empty first message that completed the answer)
        # the client has its answer and keeps the connection, and the error is logged with the
        # app's traceback (_run). The same to HEAD: its answer is GET's. Empty messages are
        # fine: a framework ends every response with one. n: the bytes given (a file's, for
        # http.response.pathsend).
        if n:
            raise RuntimeError(f"ASGI: a {self.status} response cannot have a body "
                               f"({n} bytes given)")
        return 0

    cdef object _streamed(self, body, bint more):
        # A piece of a streamed body whose length was announced. The piece that reaches the
        # length ends the response (the client has the whole answer its framing announced, and
        # the connection goes on); bytes past it are the app's error, raised in its send() as
        # uvicorn raises it ("Response content longer than Content-Length"), not dropped
        # without a word. The bytes that fit are sent first, so that the wire is what it was
        # when the engine cut them off itself.
        cdef int64_t left = <int64_t>self.length - self.streamed
        cdef Py_ssize_t n = len(body)
        if n > left:
            self.streamed += left
            self._last_piece(body[:left])
            self.filled = True
            raise RuntimeError(f"ASGI: Content-Length {self.length}, but the body goes on past "
                               f"it: {self.streamed - left + n} bytes or more")
        self.streamed += n
        if n == left:
            # More may be announced (more_body True) but cannot fit: empty messages may still
            # follow (_past_length).
            self.filled = more
            return self._last_piece(body)
        if body:
            _set_body(&self.h.resp, body if type(body) is bytes else bytes(body))
        if not more:
            self._give(0)  # short of the length: the engine closes (or resets the stream)
            return self.lp.ready
        self.written = self.lp.loop.create_future()
        self._give(1)
        return self.written

    cdef object _last_piece(self, body):
        if body:
            _set_body(&self.h.resp, body if type(body) is bytes else bytes(body))
        self._give(0)
        return self.lp.ready

    cdef object _past_length(self, body):
        # A message after the piece that reached the announced length: an empty one (the usual
        # more_body False that ends a stream) is fine; bytes are past the length.
        if not body:
            return self.lp.ready
        raise RuntimeError(f"ASGI: Content-Length {self.length}, but the body goes on past it: "
                           f"{self.length + len(body)} bytes or more")

    cdef object _body_trailed(self, message):
        # The body of a response that announced trailers. It goes out as a stream whatever
        # Content-Length the app gave: on HTTP/1.1 only a chunked body can end with trailers.
        # Its last message (more_body False) is sent like any piece, and the response ends
        # with the last http.response.trailers (_trailers).
        if self.body_ended:
            raise RuntimeError("ASGI: http.response.body after the body's last message (more_body "
                               "False): the response waits for http.response.trailers")
        body = message.get("body", b"")
        more = bool(message.get("more_body", False))
        if self.bodyless:
            self._no_content(len(body))
        cdef cs.resp_t *resp = &self.h.resp
        if not self.streaming:
            self._fill_head(resp)
            if self.head or self.bodyless:
                # An answer to HEAD is complete with its head, and GET's body would be chunked:
                # no length to announce. The trailers that follow go nowhere; so do they after
                # a status without content, complete with its head too.
                if self.head:
                    _check_rc(cs.resp_set_head_length(resp, cs.RESP_LENGTH_UNKNOWN),
                              "ASGI HEAD length")
                self._give(0)
                return self.lp.ready
            _check_rc(cs.resp_set_stream(resp, <void *>self.h, -1), "ASGI response")
            self.streaming = True
        if body:
            _set_body(resp, body if type(body) is bytes else bytes(body))
        if not more:
            self.body_ended = True
        self.written = self.lp.loop.create_future()
        self._give(1)
        return self.written

    cdef object _trailers(self, message):
        # The HTTP Trailers extension: fields sent after the body. They are added to the
        # handoff's response, whose turn is the app's again once the body's last piece was
        # written (the future that send() returned for it is done); the last message
        # (more_trailers False) gives the turn with the end of the body. The engine sends them
        # to a client that sent TE: trailers, as the extension says, and drops them otherwise
        # (and after an HTTP/1.0 request, whose body is not chunked).
        if not self.started:
            raise RuntimeError("ASGI: http.response.trailers before http.response.start")
        if not self.trailers:
            raise RuntimeError("ASGI: http.response.trailers, but http.response.start did not "
                               "announce them (trailers: True)")
        if self.gone:
            raise ClientDisconnected("the client went away")
        if self.complete:
            if self.head or self.bodyless:
                return self.lp.ready  # the answer went out with its head
            raise RuntimeError("ASGI: http.response.trailers after the response was complete")
        if not self.body_ended:
            raise RuntimeError("ASGI: http.response.trailers before the body's last message "
                               "(http.response.body with more_body False)")
        if self.written is not None and not self.written.done():
            raise RuntimeError("ASGI: http.response.trailers before the body's last message "
                               "was written (await send())")
        more = bool(message.get("more_trailers", False))
        cdef cs.resp_t *resp = &self.h.resp
        cdef bytes bname, bvalue
        cdef int rc
        for name, value in message.get("headers", None) or ():
            bname = name if type(name) is bytes else bytes(name)
            bvalue = value if type(value) is bytes else bytes(value)
            rc = cs.resp_add_trailer(resp, PyBytes_AS_STRING(bname),
                                     <size_t>PyBytes_GET_SIZE(bname), PyBytes_AS_STRING(bvalue),
                                     <size_t>PyBytes_GET_SIZE(bvalue))
            if rc == -22:  # EINVAL
                raise ValueError(f"ASGI: invalid trailer {bname!r}: a name must be a token "
                                 "(no pseudo-header), a value must hold no CR, LF, NUL or other "
                                 "control character")
            if rc == -1:  # EPERM
                raise ValueError(f"ASGI: {bname!r} cannot be a trailer: the recipient needs it "
                                 "before the body, or it belongs to the connection (RFC 9110 "
                                 "6.5.1)")
            _check_rc(rc, "ASGI trailer")
        if not more:
            self._give(0)
        return self.lp.ready

    cdef object _pathsend(self, message):
        # The Path Send extension: the file at an absolute path is the whole body. The engine
        # sends it as it sends any file body (resp_set_body_file: sendfile on plain TCP and
        # kTLS, read and encrypted in bounded pieces over TLS, DATA frames read from the file
        # over HTTP/2), so no byte of it passes through Python. The response ends with it, as
        # the body's last message would end it.
        if not self.started:
            raise RuntimeError("ASGI: http.response.pathsend before http.response.start")
        if self.gone:
            raise ClientDisconnected("the client went away")
        if self.complete and self.head:
            return self.lp.ready  # as a body after a complete answer to HEAD: goes nowhere
        if self.complete or self.streaming:
            raise RuntimeError("ASGI: http.response.pathsend after the response body began")
        # Opened here, on the loop's thread, so that a missing or unreadable file is the app's
        # exception from send() (a 500 when it lets it go, as nothing went out yet). The spec
        # asks for an absolute path; a relative one is opened as the app's own open() would
        # open it, since the app shares the server's process and working directory: Starlette's
        # FileResponse passes its path on as it was given, and FileResponse("static/a.css")
        # must not fail because the extension is offered (granian opens it so too).
        fd = _os_pathsend.open(message["path"], _os_pathsend.O_RDONLY | _os_pathsend.O_CLOEXEC)
        cdef cs.resp_t *resp = &self.h.resp
        try:
            st = _os_pathsend.fstat(fd)
            if not _stat_pathsend.S_ISREG(st.st_mode):
                raise IsADirectoryError(f"ASGI: http.response.pathsend: {message['path']!r} is "
                                        "not a regular file")
            if self.bodyless and st.st_size:
                self._no_content(st.st_size)
            if self.head and self.length is None:
                self.length = st.st_size  # what GET would carry: announced, not sent
            self._fill_head(resp)
            if not self.head:
                _check_rc(cs.resp_set_body_file(resp, fd, 0, <uint64_t>st.st_size),
                          "ASGI pathsend")
                fd = -1  # the response's now
        finally:
            if fd >= 0:
                _os_pathsend.close(fd)
        self._give(0)
        return self.lp.ready

    cdef int _fill_head(self, cs.resp_t *resp) except -1:
        cdef bint ct = False
        cdef bytes bname, bvalue
        cdef int kind, rc
        _check_rc(cs.resp_set_status(resp, self.status), "ASGI status")
        for name, value in self.headers:
            bname = name if type(name) is bytes else bytes(name)
            kind = _asgi_header_kind(PyBytes_AS_STRING(bname), PyBytes_GET_SIZE(bname))
            if kind == _H_LENGTH:
                # For HEAD the app's Content-Length wins over the length of the body it sent:
                # an answer to HEAD has its GET's length and an empty body (Starlette's).
                if self.length is None or self.head:
                    self.length = _asgi_length(value)
                continue
            if kind == _H_ENGINE:
                continue
            bvalue = value if type(value) is bytes else bytes(value)
            if kind == _H_CONNECTION:
                # The engine writes Connection itself; an app's "close" (a list may hold it)
                # closes the connection after this answer, as uvicorn does; other tokens are
                # the engine's business.
                if b"close" in [t.strip() for t in bvalue.lower().split(b",")]:
                    _check_rc(cs.resp_add_header(resp, b"Connection", 10, b"close", 5),
                              "header 'Connection'")
                continue
            if kind == _H_TYPE:
                if ct:
                    continue
                ct = True
                _set_ct(resp, bvalue)
                continue
            rc = cs.resp_add_header(resp, PyBytes_AS_STRING(bname), <size_t>PyBytes_GET_SIZE(bname),
                                    PyBytes_AS_STRING(bvalue), <size_t>PyBytes_GET_SIZE(bvalue))
            if rc:  # the message only when it is needed
                _check_rc(rc, f"header {bname.decode('latin-1')!r}")
        if self.head:
            announced = cs.RESP_LENGTH_UNKNOWN if self.length is None else self.length
            _check_rc(cs.resp_set_head_length(resp, announced), "ASGI HEAD length")
        return 0

    cdef inline void _give(self, int more) noexcept:
        if more == 0:
            self._finish()
        if cs.handoff_give(self.h, more) != 0:
            self._mark_gone()

    cdef void _finish(self) noexcept:
        self.complete = True
        if self.body_wait is not None and not self.body_wait.done():
            self.body_wait.set_result(None)
        if self.ended is not None and not self.ended.done():
            self.ended.set_result(None)

    cdef void _mark_gone(self) noexcept:
        self.gone = True
        if self.body_wait is not None and not self.body_wait.done():
            self.body_wait.set_result(None)
        if self.written is not None and not self.written.done():
            self.written.set_exception(ClientDisconnected("the client went away"))
        if self.ended is not None and not self.ended.done():
            self.ended.set_result(None)

    def _body_piece(self, piece):
        if self.body_wait is not None and not self.body_wait.done():
            self.body_wait.set_result(piece)

    def _piece_written(self, _):
        if self.written is not None and not self.written.done():
            self.written.set_result(None)

    def _client_gone(self, _):
        self._mark_gone()

    async def _run(self, app, scope):
        try:
            await app(scope, _bind_method(_EX_RECEIVE, self), self)
        except BaseException as exc:
            _asgi_log.error("Exception in ASGI application %s for %s %s", self.label,
                            scope["method"], scope["raw_path"].decode("latin-1"),
                            exc_info=exc)
            self._failed()
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            # The task is still running (this is its last step), so the loop holds it now.
            self.lp.tasks.discard(self.task)
            self.task = None
            self.ran = True
        if not self.complete and not self.gone:
            if self.body_ended:
                _asgi_log.error("ASGI application %s announced trailers but returned without "
                                "sending http.response.trailers (more_trailers False) to %s %s",
                                self.label, scope["method"], scope["raw_path"].decode("latin-1"))
            elif not self.started or not self.streaming:
                _asgi_log.error("ASGI application %s returned without completing its "
                                "response to %s %s", self.label, scope["method"],
                                scope["raw_path"].decode("latin-1"))
            self._failed()

    def cancel(self):
        """The server stops: the engine no longer waits for this answer."""
        self._mark_gone()

    cdef void _failed(self) noexcept:
        # Before the head went out: a 500. After it: the connection is closed without the last
        # chunk, which tells the client the body is incomplete.
        if self.complete or self.gone:
            return
        cdef cs.resp_t *resp = &self.h.resp
        if not self.streaming:
            _answer_500(resp)
            self._give(0)
        else:
            self._finish()
            if cs.handoff_give(self.h, -1) != 0:
                self._mark_gone()


# receive bound to each exchange: the bound method that `ex.receive` gives, without its lookup.
cdef object _EX_RECEIVE = _Exchange.receive
cdef object _EX_SEND = _Exchange.send
cdef object _EX_RUN = _Exchange._run  # called with the exchange: no bound method per request


cdef object _asgi_send_impl(object self, object message):
    """send(message) of the exchange called as the app's send (cyserve__asgi_send_vectorcall)."""
    cdef _Exchange ex = <_Exchange>self
    if PyThread_get_thread_ident() != ex.lp.ident:
        return ex._send_on_loop(message)
    return ex._send(message)


cdef void _asgi_send_callable() except *:
    # The offset of _Exchange.vc, read from an instance: Cython names the C struct, not us.
    global cyserve__asgi_send_fn
    cdef _Exchange probe = _Exchange.__new__(_Exchange)
    cyserve__sr_make_callable(<PyTypeObject *>_Exchange,
                              <Py_ssize_t>(<char *>&probe.vc - <char *><PyObject *>probe))
    Py_INCREF(_EX_SEND)  # the module keeps it too: this reference is the C side's, for ever
    cyserve__asgi_send_fn = <PyObject *>_EX_SEND


cyserve__asgi_send_impl = _asgi_send_impl
_asgi_send_callable()


cdef object _asgi_name(const char *name, size_t n, _ThreadCache cache):
    """Header name[0..n) lower-cased, as the scope gives it: one bytes object per name seen on
    this thread (a table indexed by its hash, as _env_key's), not one per request."""
    cdef Py_ssize_t slot = <Py_ssize_t>(_fnv1a(name, n) & (ASGI_NAMES_SLOTS - 1))
    cdef object seen = <object>PyList_GET_ITEM(cache.asgi_names, slot)
    if (seen is not None and <size_t>PyBytes_GET_SIZE(seen) == n
            and memcmp(PyBytes_AS_STRING(seen), name, n) == 0):
        return <object>PyList_GET_ITEM(cache.asgi_lower, slot)
    cdef bytes raw = PyBytes_FromStringAndSize(name, <Py_ssize_t>n)
    cdef bytes lower = raw.lower()
    # This thread's own table: no other thread reads it between the two stores.
    cache.asgi_lower[slot] = lower
    cache.asgi_names[slot] = raw
    return lower


cdef dict _asgi_state(ASGIHandler handler, _ThreadCache cache):
    """The scope's state: a shallow copy of what the app's lifespan made on the loop this
    request runs on (each loop ran a lifespan of its own)."""
    cdef PyObject *st = PyDict_GetItem(_asgi_here(cache).states, handler)
    return {} if st == NULL else (<dict>st).copy()


cdef object _asgi_client(const char *peer, _ThreadCache cache):
    """The scope's client, (host, port), from the engine's "host:port" or "[v6]:port" (made
    once per connection): one tuple per peer seen on this thread, as _asgi_name."""
    cdef size_t n = strlen(peer)
    cdef Py_ssize_t slot = <Py_ssize_t>(_fnv1a(peer, n) & (ASGI_PEER_SLOTS - 1))
    cdef object seen = <object>PyList_GET_ITEM(cache.peer_keys, slot)
    if (seen is not None and <size_t>PyBytes_GET_SIZE(seen) == n
            and memcmp(PyBytes_AS_STRING(seen), peer, n) == 0):
        return <object>PyList_GET_ITEM(cache.peer_values, slot)
    cdef bytes raw = PyBytes_FromStringAndSize(peer, <Py_ssize_t>n)
    host, _, port = raw.decode("latin-1").rpartition(":")
    client = (host.strip("[]"), int(port))
    cache.peer_values[slot] = client
    cache.peer_keys[slot] = raw
    return client


cdef str _asgi_path(const char *p, size_t n):
    """The scope's path: p[0..n) percent-decoded, then read as UTF-8 (surrogateescape). A path
    of ASCII bytes without '%' is its own text."""
    cdef size_t i
    if memchr(p, c'%', n) == NULL:
        for i in range(n):
            if <unsigned char>p[i] >= 0x80:
                break
        else:
            return PyUnicode_DecodeLatin1(p, <Py_ssize_t>n, NULL)
    return _unquote_latin1(p, n).encode("latin-1").decode("utf-8", "surrogateescape")


cdef class ASGIHandler:
    """The target of an ASGI route: the application and what every scope shares."""
    cdef readonly object app
    cdef readonly str root_path
    cdef bytes _root_b
    cdef readonly object server  # (host, port), set by bind(), in the template too
    cdef str _label
    cdef dict _template         # the scope's keys and constant values (_scope)
    cdef public bint ws_deflate  # negotiate permessage-deflate (the Server's option)
    cdef str _mount             # the mount's prefix ("" at /), root_path without a root path
    cdef str _outer             # the server's root path (set_root_path), None without one
    cdef bytes _outer_b

    def __init__(self, app, str root_path=""):
        self.app = app
        self.root_path = root_path.rstrip("/")
        self._mount = self.root_path
        # Every key of the http scope, in this order; _scope replaces the values marked None but
        # "server", which bind() sets, and those of a request that differs from the common one
        # (HTTP/1.1, GET, plain http, no query string; one PyDict_SetItem fewer, about 200
        # instructions, for each value the copy already has).
        self._template = {
            "type": "http",
            "asgi": _ASGI_VERSION,
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": None,
            "raw_path": None,
            "query_string": b"",
            "root_path": self.root_path,
            "headers": None,
            "client": None,
            "server": None,
            "state": None,
            "extensions": None,
        }
        self._root_b = self.root_path.encode("utf-8")
        self.server = None
        self._label = getattr(app, "__qualname__", None) or type(app).__qualname__
        self.ws_deflate = True

    def bind(self, str host, int port):
        self.server = (host, port)
        self._template["server"] = self.server  # the same for every scope: not set per request

    def set_root_path(self, str root):
        """The server's root path (--root-path; "" for none), set before requests arrive: the
        scope's root_path is it followed by the mount's prefix, and its path and raw_path begin
        with it, as uvicorn (since 0.26) builds them: the proxy in front removed it from the
        path, and an application reads the path the client asked for."""
        self.root_path = root + self._mount
        self._root_b = self.root_path.encode("utf-8")
        self._template["root_path"] = self.root_path
        self._outer = root or None
        self._outer_b = root.encode("ascii") if root else None

    def __call__(self, request):
        # A Python target must be callable; an ASGI route's calls go through _asgi_call.
        raise RuntimeError("an ASGI route is called by the engine, not as a handler")

    def __repr__(self):
        return f"<ASGIHandler {self._label} at {self.root_path or '/'}>"

    cdef dict _scope(self, const cyserve_request *req):
        # A copy of the template (one copy of its key table, no hashing) whose per-request
        # entries are then replaced in place: cheaper than inserting fourteen keys.
        cdef size_t i
        cdef const cyserve_header *h
        cdef const char *peer
        cdef _ThreadCache cache = _tcache()
        cdef Py_ssize_t n = <Py_ssize_t>req.num_headers
        cdef list headers = PyList_New(n)
        for i in range(req.num_headers):
            h = &req.headers[i]
            item = (_asgi_name(h.name.ptr, h.name.len, cache),
                    PyBytes_FromStringAndSize(h.value.ptr, <Py_ssize_t>h.value.len))
            Py_INCREF(item)
            PyList_SET_ITEM(headers, <Py_ssize_t>i, item)
        client = None
        if cs.server_req_peer(<const cs.req_t *>req, &peer) == 0:
            client = _asgi_client(peer, cache)
        cdef dict scope = PyDict_Copy(self._template)
        if cs.server_req_http2(<const cs.req_t *>req):
            scope["http_version"] = "2"
        elif req.minor_version != 1:
            scope["http_version"] = "1.0"
        method = _method_str(req.method)
        if method is not "GET":  # _method_str's GET is the template's: the same constant
            scope["method"] = method
        # "https" over TLS, or when a trusted proxy says so (as the client above).
        if cs.server_req_scheme(<const cs.req_t *>req)[4] == c"s":
            scope["scheme"] = "https"
        scope["path"] = _asgi_path(req.path.ptr, req.path.len)
        scope["raw_path"] = PyBytes_FromStringAndSize(req.path.ptr, <Py_ssize_t>req.path.len)
        if req.query.len:
            scope["query_string"] = PyBytes_FromStringAndSize(req.query.ptr,
                                                              <Py_ssize_t>req.query.len)
        scope["headers"] = headers
        scope["client"] = client
        scope["state"] = _asgi_state(self, cache)
        # The ASGI TLS extension over TLS (its connection's, not a proxy's).
        if cs.server_req_tls(<const cs.req_t *>req):
            scope["extensions"] = {"tls": _tls_extension(<const cs.req_t *>req),
                                   "http.response.pathsend": _ASGI_PATHSEND,
                                   "http.response.trailers": _ASGI_TRAILERS}
        else:
            scope["extensions"] = PyDict_Copy(_ASGI_EXTENSIONS)
        if self._outer is not None:  # set_root_path
            scope["path"] = self._outer + scope["path"]
            scope["raw_path"] = self._outer_b + scope["raw_path"]
        return scope

    cdef _Exchange _start(self, const cyserve_request *req):
        scope = self._scope(req)
        cdef _Exchange ex = _Exchange.__new__(_Exchange)
        ex.vc = cyserve__asgi_send_vectorcall
        ex.handler = self
        ex.label = self._label
        ex.body = PyBytes_FromStringAndSize(req.body.ptr, <Py_ssize_t>req.body.len)
        ex.head = req.method.len == 4 and memcmp(req.method.ptr, "HEAD", 4) == 0
        ex.body_stream = cs.server_req_body_pending(<const cs.req_t *>req) != 0
        # Last, so that nothing can fail between it and resp_set_defer, which hands the
        # engine its reference.
        if cs.handoff_new(&ex.h) != 0:
            raise MemoryError()
        cyserve__producer_enable(<PyObject *>ex)
        ex.h.producer = <void *>ex  # before the handoff is shared: no lock needed
        ex.app = self.app
        ex.scope = scope
        _asgi_queue_start(ex)
        return ex


cdef void _asgi_body_piece(cs.handoff_t *h, const char *data, size_t n,
                           int more) noexcept with gil:
    # The engine's answer to handoff_ask_body, on a worker in its batch: queue the piece for
    # the loop (the batch's end hands it over with the batch's other calls).
    # The exchange, with a reference of our own (see cyserve__producer_get above).
    cdef PyObject *p = cyserve__producer_get(&h.producer)
    if p == NULL:
        return
    ex = <_Exchange>p
    Py_DecRef(p)  # ex holds its own reference
    try:
        _asgi_queue_call(ex.lp, ex._body_piece,
                         (PyBytes_FromStringAndSize(data, <Py_ssize_t>n), more != 0))
    except BaseException:
        _asgi_log.exception("handing a request body piece to the event loop failed")


cdef inline void _asgi_keep_task(_ASGILoop lp, task) except *:
    lp.tasks.add(task)
    task.add_done_callback(lp.tasks.discard)


def _asgi_drop_done_tasks(_ASGILoop lp):
    """Forget the tasks that ended without running (a stop cancelled them before their first
    step, so their _run never dropped them). lp's thread, at a stop."""
    lp.tasks.difference_update([t for t in lp.tasks if t.done()])


cdef void _asgi_spawn(_Exchange ex, bint direct) except *:
    # A stop cancels every task of the loop but the lifespans' (cyserve.asgi).
    app, scope = ex.app, ex.scope
    ex.app = ex.scope = None
    # Held in lp.tasks until _run drops it at its end: cheaper than a done callback, which
    # costs the loop one more callback per request (about a tenth of an ASGI request's work).
    # Where the interpreter offers it (3.12+), the task starts eagerly: its first step runs
    # here, inside this batch's callback, as asyncio's eager task factory would run it, rather
    # than from a callback of its own on the loop's next turn. asyncio.current_task() is the
    # task during that step too, so anyio and Starlette see what they see on any task. An app
    # that answers without suspending (most requests) then costs no scheduled step at all, and
    # its task is over before this returns: nothing to hold.
    cdef _ASGILoop lp = ex.lp
    lp.ident = PyThread_get_thread_ident()
    coro = _EX_RUN(ex, app, scope)
    # A call of Task with keywords cost about 1,300 instructions more than one without
    # (CPython 3.12: the dict made from the call's keyword names, then Task.__init__'s parse
    # of it), so 3.12+ passes a dict made once, and 3.11 none: there Task takes the running
    # loop, which is lp.loop, since a batch runs in one of its callbacks (_drain, or
    # call_soon_threadsafe).
    if not direct:
        task = lp.loop.create_task(coro)
    elif lp.eager:
        task = PyObject_Call(lp.task_type, (coro,), lp.task_kwargs)
        # _run ended in the eager step (nothing in it awaits after its end is marked), so the
        # task is done: a flag rather than a call of task.done().
        if ex.ran:
            return
    else:
        task = lp.task_type(coro)
    lp.tasks.add(task)
    ex.task = task


cdef void _asgi_call(void *opaque, cs.req_t *req, cs.resp_t *resp) noexcept nogil:
    # The target's py_call for an ASGI route, between the offload hooks like _py_call.
    with gil:
        _asgi_call_impl(<object>opaque, <cyserve_request *>req, resp)


cdef void _asgi_call_impl(tuple info, cyserve_request *req, cs.resp_t *resp) noexcept:
    cdef ASGIHandler handler = <ASGIHandler>info[0]
    cdef _Exchange ex
    try:
        if _asgi_loop is None:
            raise RuntimeError("the ASGI event loop is not running")
        if _asgi_ws_wanted(req) and _asgi_ws_start(handler, req, resp):
            return  # a WebSocket handshake (asgi_ws.pyx): answered, or deferred to the app
        ex = handler._start(req)
        # The engine's reference to the handoff: released when the engine leaves it.
        cs.resp_set_defer(resp, <void *>ex.h)
    except BaseException:
        _answer_500(resp)
        try:
            _error_log.exception("ASGI application %s failed for %s %s", info[2],
                                 _latin1(req.method), _latin1(req.target))
        except BaseException:
            pass


cdef int _asgi_stream(void *opaque, void *stream, cs.resp_t *resp, int op) noexcept nogil:
    # The target's py_stream for an ASGI route: the engine wrote the last piece (NEXT) or gave
    # up on the answer (ABANDON). It only tells the producer; the next piece comes through the
    # handoff.
    with gil:
        _asgi_stream_impl(<cs.handoff_t *>stream, op)
    return 2


cdef void _asgi_stream_impl(cs.handoff_t *h, int op) noexcept:
    cdef PyObject *p = cyserve__producer_get(&h.producer)
    if p == NULL:
        return  # the exchange is gone already: nobody to tell
    ex = <object>p  # an _Exchange, or a _WSExchange whose handshake waits
    Py_DecRef(p)  # ex holds its own reference
    cdef _ASGILoop lp = (<_Exchange>ex).lp if type(ex) is _Exchange else (<_WSExchange>ex).lp
    if op == cs.SERVER_STREAM_NEXT:
        _asgi_queue_call(lp, ex._piece_written, None)
    else:
        _asgi_queue_call(lp, ex._client_gone, None)
