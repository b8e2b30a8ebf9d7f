# The HTTP engine's Cython layer, included in cyserve._core: Server (start/stop the C engine),
# Request and Response (the Python handler API), the trampoline that runs Python handlers, and
# the exported nogil handler API declared in native/http_api.pxi.
#
# The GIL: the workers never hold it, except between the offload hooks below, which the engine
# runs around each batch of ready Python handler calls on a worker (one PyGILState_Ensure per
# batch, not per request). Server.start() and Server.stop() release it while C runs.
import atexit as _atexit
import json as _json
import logging as _logging
import os as _os
import re as _re
import weakref as _weakref
from collections.abc import Mapping as _Mapping

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.pycapsule cimport (PyCapsule_New, PyCapsule_GetPointer, PyCapsule_GetName,
                                PyCapsule_CheckExact)
from libc.stdint cimport uint64_t, int64_t
from libc.stdlib cimport calloc, free
from libc.string cimport strlen, strcmp

from cyserve.native.includes cimport server as cs
from cyserve.native.includes.router cimport (router_t, router_new, router_free, router_add,
                                             files_root_t, files_root_new, files_root_free,
                                             ROUTER_PATH, ROUTER_PREFIX, ROUTER_REGEX)

cdef extern from *:
    """
    /* The offload hooks: the engine calls begin before a batch of Python handler calls on a
     * worker and end after it, on the worker's own stack, always in pairs. */
    static _Thread_local PyGILState_STATE cyserve__gil_state;
    static void cyserve__offload_begin(void *ud) { (void)ud; cyserve__gil_state = PyGILState_Ensure(); }
    static void cyserve__offload_end(void *ud) { (void)ud; PyGILState_Release(cyserve__gil_state); }
    """
    void cyserve__offload_begin(void *ud) noexcept nogil
    void cyserve__offload_end(void *ud) noexcept nogil

_error_log = _logging.getLogger("cyserve.error")

_METHOD_BITS = {"GET": 1, "HEAD": 2, "POST": 3, "PUT": 4, "DELETE": 5, "PATCH": 6,
                "OPTIONS": 7, "CONNECT": 8, "TRACE": 9}
_INT_PARAM = _re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*):int\}")
_TOKEN = _re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


# ---- the exported nogil API (declared in native/http_api.pxi) ----

cdef int cyserve_req_header(const cyserve_request *req, const char *name, size_t name_len,
                            cyserve_str *out) noexcept nogil:
    return cs.server_req_header(<const cs.req_t *>req, name, name_len, out)

cdef int cyserve_resp_status(cyserve_response *resp, int status) noexcept nogil:
    return cs.resp_set_status(<cs.resp_t *>resp, status)

cdef int cyserve_resp_header(cyserve_response *resp, const char *name, size_t name_len,
                             const char *value, size_t value_len) noexcept nogil:
    return cs.resp_add_header(<cs.resp_t *>resp, name, name_len, value, value_len)

cdef int cyserve_resp_set_content_type(cyserve_response *resp, const char *value,
                                       size_t value_len) noexcept nogil:
    return cs.resp_set_content_type(<cs.resp_t *>resp, value, value_len)

cdef int cyserve_resp_write(cyserve_response *resp, const char *data, size_t len) noexcept nogil:
    return cs.resp_write(<cs.resp_t *>resp, data, len)

cdef int cyserve_resp_set_body_static(cyserve_response *resp, const char *data,
                                      size_t len) noexcept nogil:
    return cs.resp_set_body_static(<cs.resp_t *>resp, data, len)

cdef void *cyserve_resp_alloc(cyserve_response *resp, size_t size) noexcept nogil:
    return cs.resp_alloc(<cs.resp_t *>resp, size)

cdef object cyserve_handler_capsule(cyserve_nogil_handler fn):
    if fn == NULL:
        raise ValueError("cyserve_handler_capsule: NULL handler")
    return PyCapsule_New(<void *>fn, b"cyserve.nogil_handler", NULL)


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


cdef class Request:
    """One HTTP request, as a Python handler sees it. Built lazily from the engine's views: a
    field becomes a Python object only when the handler reads it. Valid only during the handler
    call (reading an attribute not read before afterwards raises RuntimeError)."""

    cdef const cyserve_request *_req
    cdef object _int_params
    cdef object _method, _path, _query, _target, _headers, _body, _params, _client

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
        if self._body is None:
            self._check()
            self._body = PyBytes_FromStringAndSize(self._req.body.ptr,
                                                   <Py_ssize_t>self._req.body.len)
        return self._body

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
    def client(self):
        """The client's address as (host, port), or None when it is not known."""
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


# ---- Response ----

cdef class Response:
    """A response returned by a Python handler: Response(body=b"", status=200, headers=None,
    content_type=None). body is bytes or str (UTF-8); status a final status, 200..599; headers a
    dict or a list of (name, value) pairs. body and status are checked whenever they are set."""

    cdef object _body
    cdef int _status
    cdef public object headers
    cdef public object content_type

    def __init__(self, body=b"", int status=200, headers=None, content_type=None):
        self.body = body
        self.status = status
        self.headers = headers
        self.content_type = content_type

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
        raise ValueError(f"{what}: Content-Type given twice")
    raise MemoryError(what)


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object u)
    const char *PyUnicode_AsUTF8AndSize(object u, Py_ssize_t *size) except NULL


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


cdef int _set_body(cs.resp_t *resp, bytes b) except -1:
    return _check_rc(cs.resp_write(resp, PyBytes_AS_STRING(b), <size_t>PyBytes_GET_SIZE(b)),
                     "body")


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
        return _set_body(resp, (<str>result).encode("utf-8"))
    if isinstance(result, bytes):
        _set_ct(resp, b"application/octet-stream")
        return _set_body(resp, <bytes>result)
    if isinstance(result, (dict, list)):
        _set_ct(resp, b"application/json")
        # allow_nan=False: NaN and Infinity are not JSON; a ValueError naming them gives a 500.
        return _set_body(resp, _json.dumps(result, separators=(",", ":"),
                                           allow_nan=False).encode("utf-8"))
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
        if length is not None and length != len(body) and r._status != 204 and r._status != 304:
            # The engine writes Content-Length from the body (none for 204 and 304, whose
            # length is GET's). A handler's own value is checked against it, but an empty body
            # may announce a length when answering HEAD (what GET would send, as WSGI apps do).
            if body or not head:
                raise ValueError(f"Content-Length {length} does not match the body's "
                                 f"{len(body)} bytes")
            _check_rc(cs.resp_set_head_length(resp, <int64_t>length), "Content-Length")
        if body and (r._status == 204 or r._status == 304):
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
        return _set_body(resp, body)
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


cdef void _py_call(void *opaque, cs.req_t *req, cs.resp_t *resp) noexcept nogil:
    # Runs on a worker thread between the offload hooks, so the GIL is already held; `with gil`
    # only re-enters it (a counter increment), and keeps this correct should a caller not hold it.
    with gil:
        _py_call_impl(<object>opaque, <cyserve_request *>req, resp)


cdef void _py_call_impl(tuple info, cyserve_request *req, cs.resp_t *resp) noexcept:
    cdef Request r = Request.__new__(Request)
    r._req = req
    r._int_params = info[1]
    handler = info[0]
    try:
        result = handler(r)
        head = req.method.len == 4 and (<const char *>req.method.ptr)[:4] == b"HEAD"
        if type(result) is _WSGIAnswer:  # native/wsgi.pyx
            _fill_wsgi(<_WSGIAnswer>result, resp, head)
        else:
            _fill_response(result, resp, head)
    except BaseException:
        _answer_500(resp)
        try:
            _error_log.exception("handler %s failed for %s %s", info[2],
                                 _latin1(req.method), _latin1(req.target))
        except BaseException:
            pass
    finally:
        r._req = NULL


# ---- Server ----

_running_servers = _weakref.WeakSet()


def _stop_all_at_exit():
    # Workers take the GIL to run Python handlers: they must be gone before the interpreter
    # finalises, or their next PyGILState_Ensure would touch a dead interpreter.
    for srv in list(_running_servers):
        try:
            srv.stop(0.0)
        except BaseException:
            pass


_atexit.register(_stop_all_at_exit)


cdef bytes _serialise_headers(headers, str where):
    parts = []
    for item in headers:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise ValueError(f"{where}: headers must be (name, value) pairs, got {item!r}")
        name = str(name)
        value = str(value)
        if not _TOKEN.match(name):
            raise ValueError(f"{where}: invalid header name {name!r}")
        if "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(f"{where}: header {name!r} has a CR, LF or NUL in its value")
        if name.lower() in ("content-length", "transfer-encoding", "date", "connection"):
            raise ValueError(f"{where}: header {name!r} is written by the server")
        parts.append(f"{name}: {value}\r\n".encode("latin-1"))
    return b"".join(parts)


cdef class Server:
    """The C engine serving a list of routes: see cyserve.app for the route tuples."""

    cdef cs.server_t *_srv
    cdef router_t *_router
    cdef cs.server_target_t *_targets
    cdef Py_ssize_t _ntargets
    cdef list _keep
    cdef readonly str host
    cdef readonly int threads
    cdef int _port
    cdef bint _started
    cdef object __weakref__

    def __cinit__(self):
        self._srv = NULL
        self._router = NULL
        self._targets = NULL
        self._ntargets = 0
        self._keep = []

    def __init__(self, list routes, *, str host, int port, int threads, int backlog=1024,
                 int max_header_bytes=8192, int max_target_bytes=8192, int max_headers=100,
                 max_body_bytes=1048576, double keepalive_timeout=5.0,
                 double header_timeout=10.0, double body_timeout=10.0, bint shared_port=False,
                 bint access_log=False):
        if self._router != NULL:
            raise RuntimeError("Server.__init__ called twice")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        if threads < 0:
            raise ValueError(f"threads must be >= 0, got {threads}")
        if backlog < 1:
            raise ValueError(f"backlog must be >= 1, got {backlog}")
        if max_header_bytes < 64 or max_target_bytes < 1 or max_headers < 1:
            raise ValueError("max_header_bytes must be >= 64, max_target_bytes and max_headers "
                             ">= 1")
        if max_body_bytes < 0:
            raise ValueError(f"max_body_bytes must be >= 0, got {max_body_bytes}")
        for name, value in (("keepalive_timeout", keepalive_timeout),
                            ("header_timeout", header_timeout), ("body_timeout", body_timeout)):
            # The nanoseconds must fit a uint64 (1.8e10 s); past it the cast wrapped to 0.
            if not 0 < value <= 1e9:
                raise ValueError(f"{name} must be > 0 and at most 1e9 seconds, got {value}")
        self.host = host
        self._port = port
        self.threads = threads
        if router_new(&self._router) != 0:
            raise MemoryError()
        self._ntargets = len(routes)
        self._targets = <cs.server_target_t *>calloc(max(1, self._ntargets),
                                                     sizeof(cs.server_target_t))
        if self._targets == NULL:
            raise MemoryError()
        cdef Py_ssize_t i
        for i, route in enumerate(routes):
            self._add_route(i, route)

        cdef cs.server_config_t cfg
        cs.server_config_default(&cfg)
        host_b = host.encode("idna") if host else b"0.0.0.0"
        self._keep.append(host_b)
        cfg.host = host_b
        cfg.port = port
        cfg.threads = threads
        cfg.backlog = backlog
        cfg.shared_port = 1 if shared_port else 0
        # The access log goes to standard output, one write(2) per line from the workers.
        cfg.access_log_fd = 1 if access_log else -1
        cfg.limits.max_header_bytes = max_header_bytes
        cfg.limits.max_target_bytes = max_target_bytes
        cfg.limits.max_headers = max_headers
        cfg.max_body_bytes = max_body_bytes
        cfg.keepalive_ns = <uint64_t>(keepalive_timeout * 1e9)
        cfg.header_timeout_ns = <uint64_t>(header_timeout * 1e9)
        cfg.body_timeout_ns = <uint64_t>(body_timeout * 1e9)
        rc = cs.server_new(&self._srv, &cfg, self._router)
        if rc != 0:
            raise ValueError(f"invalid server configuration (error {-rc})")
        cs.server_set_offload_hooks(self._srv, cyserve__offload_begin, cyserve__offload_end,
                                    NULL)

    cdef _add_route(self, Py_ssize_t i, route):
        cdef cs.server_target_t *t = &self._targets[i]
        cdef char err[256]
        cdef files_root_t *root = NULL
        cdef void *fn
        cdef void *ctx
        try:
            match, pattern, methods, kind, target = route
        except (TypeError, ValueError):
            raise ValueError(f"route {i}: expected (match, pattern, methods, kind, target), "
                             f"got {route!r}")
        where = f"route {pattern!r}"
        kinds = {"path": ROUTER_PATH, "prefix": ROUTER_PREFIX, "regex": ROUTER_REGEX}
        if match not in kinds:
            raise ValueError(f"{where}: match must be 'path', 'prefix' or 'regex', got {match!r}")
        cdef unsigned mask = 0
        if methods is not None:
            for m in methods:
                if m not in _METHOD_BITS:
                    raise ValueError(f"{where}: unsupported method {m!r}")
                mask |= 1u << <int>_METHOD_BITS[m]
        if kind == "python":
            if not callable(target):
                raise TypeError(f"{where}: a python target must be callable")
            int_names = frozenset(_INT_PARAM.findall(pattern)) if match == "path" else frozenset()
            info = (target, int_names, getattr(target, "__qualname__", repr(target)))
            self._keep.append(info)
            t.kind = cs.SERVER_PYTHON
            t.py_call = _py_call
            t.py_stream = _py_stream  # native/wsgi.pyx: WSGI bodies streamed piece by piece
            t.opaque = <void *>info
        elif kind == "nogil":
            inline = True
            if not isinstance(target, tuple):
                cap, ctx_cap = target, None
            elif len(target) == 2:
                cap, ctx_cap = target
            elif len(target) == 3 and isinstance(target[2], bool):
                cap, ctx_cap, inline = target
            else:
                raise TypeError(f"{where}: a nogil target is a capsule, (capsule, ctx) or "
                                f"(capsule, ctx, inline: bool)")
            if not PyCapsule_CheckExact(cap) or PyCapsule_GetName(cap) == NULL or \
                    strcmp(PyCapsule_GetName(cap), b"cyserve.nogil_handler") != 0:
                raise TypeError(f"{where}: a nogil target must be a PyCapsule named "
                                f"'cyserve.nogil_handler' (from cyserve_handler_capsule)")
            fn = PyCapsule_GetPointer(cap, b"cyserve.nogil_handler")
            ctx = NULL
            if ctx_cap is not None:
                if not PyCapsule_CheckExact(ctx_cap):
                    raise TypeError(f"{where}: the nogil context must be a PyCapsule or None")
                ctx = PyCapsule_GetPointer(ctx_cap, PyCapsule_GetName(ctx_cap))
            self._keep.append(target)
            t.kind = cs.SERVER_NOGIL
            t.fn = <cs.nogil_fn_t>fn
            t.ctx = ctx
            if not inline:
                cs.server_target_never_inline(t)
        elif kind == "static":
            try:
                status, headers, body = target
            except (TypeError, ValueError):
                raise ValueError(f"{where}: a static target is (status, headers, body)")
            if not isinstance(body, (bytes, bytearray)):
                raise TypeError(f"{where}: a static body must be bytes")
            body = bytes(body)
            hb = _serialise_headers(headers or (), where)
            if body and not any(str(n).lower() == "content-type" for n, _ in (headers or ())):
                hb += b"Content-Type: text/plain; charset=utf-8\r\n"
            rc = cs.server_target_static(t, status, hb, len(hb), body, len(body))
            if rc == -22:
                raise ValueError(f"{where}: invalid status {status!r}")
            if rc != 0:
                raise MemoryError()
        elif kind == "files":
            path_b = _os.fsencode(target)
            rc = files_root_new(path_b, &root)
            if rc != 0:
                import os
                raise ValueError(f"{where}: cannot serve files from {target!r}: "
                                 f"{os.strerror(-rc)}")
            t.kind = cs.SERVER_FILES
            t.root = root
        else:
            raise ValueError(f"{where}: kind must be 'python', 'nogil', 'static' or 'files', "
                             f"got {kind!r}")
        pat = pattern.encode("utf-8")
        err[0] = 0
        rc = router_add(self._router, kinds[match], pat, len(pat), mask, t, err, sizeof(err))
        if rc != 0:
            msg = err[:strlen(err)].decode("utf-8", "replace") if err[0] else f"error {-rc}"
            if rc == -17:
                msg = "another route already has this pattern and one of these methods"
            raise ValueError(f"{where}: {msg}")

    def start(self):
        """Bind and start the workers; returns at once. Raises OSError (port in use, ...)."""
        cdef char err[256]
        cdef int rc
        if self._srv == NULL:
            raise RuntimeError("Server was not initialised")
        if self._started:
            raise RuntimeError("Server.start() called twice")
        err[0] = 0
        with nogil:
            rc = cs.server_start(self._srv, err, sizeof(err))
        if rc != 0:
            raise OSError(-rc, err[:strlen(err)].decode("utf-8", "replace") or
                          f"cannot start the server (error {-rc})")
        self._started = True
        self._port = cs.server_port(self._srv)
        _running_servers.add(self)

    def stop(self, double grace=5.0):
        """Graceful shutdown: stop accepting, close idle connections, let in-flight requests
        finish for up to grace seconds, cancel the rest, join the workers. Idempotent; a second
        call (from another thread) with a shorter grace shortens the wait."""
        cdef uint64_t ns = <uint64_t>(max(0.0, grace) * 1e9)
        cdef int rc
        if self._srv == NULL:
            return
        with nogil:
            rc = cs.server_shutdown(self._srv, ns)
        if rc != 0:
            raise RuntimeError("Server.stop() cannot be called from a handler of this server; "
                               "call it from another thread")
        self._release_orphans()
        _running_servers.discard(self)

    cdef void _release_orphans(self) noexcept:
        # Streamed answers the stop cut short while no call could be offloaded any more: their
        # iterators are closed here (close() runs, a generator's finally blocks too).
        cdef const cs.server_target_t *t
        cdef void *stream
        while cs.server_take_orphan(self._srv, &t, &stream):
            t.py_stream(t.opaque, stream, NULL, cs.SERVER_STREAM_ABANDON)

    @property
    def running(self):
        return self._srv != NULL and cs.server_running(self._srv) != 0

    @property
    def port(self):
        return self._port

    @property
    def live_connections(self):
        """Connections accepted and not yet closed (for tests)."""
        return cs.server_live_connections(self._srv) if self._srv != NULL else 0

    def stats(self):
        """Counters, totals over the workers (approximate while serving): "live" connections,
        requests answered "inline" on the worker's loop without a coroutine, coroutines
        "spawned" (connections served by the full engine, accept rounds)."""
        cdef cs.server_stats_t st
        if self._srv == NULL:
            return {"live": 0, "inline": 0, "spawned": 0}
        cs.server_get_stats(self._srv, &st)
        return {"live": st.live, "inline": st.inline_ok, "spawned": st.spawned}

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self._srv != NULL:
            with nogil:
                cs.server_shutdown(self._srv, 0)
            self._release_orphans()
            with nogil:
                cs.server_free(self._srv)
            self._srv = NULL
        if self._targets != NULL:
            for i in range(self._ntargets):
                if self._targets[i].kind == cs.SERVER_FILES and self._targets[i].root != NULL:
                    files_root_free(self._targets[i].root)
                    self._targets[i].root = NULL
                cs.server_target_clear(&self._targets[i])
            free(self._targets)
            self._targets = NULL
        if self._router != NULL:
            router_free(self._router)
            self._router = NULL
