# WSGI (PEP 3333) on the Python handler path, included in cyserve._core after server.pyx.
# cyserve/wsgi.py documents the mapping (what the environ holds, what happens to the app's
# headers); this is its implementation, in Cython because it runs once per request: the environ
# is built straight from the engine's views of the request, and the answer goes into the engine's
# response without a Response object in between.
#
# A WSGIHandler is the target of an ordinary "python" route (app.wsgi mounts one under a prefix),
# so it runs on a worker thread holding the GIL, between the offload hooks, like any handler.
from io import BytesIO as _BytesIO
import sys as _sys
from wsgiref.util import FileWrapper as _FileWrapper

from cpython.dict cimport PyDict_Copy, PyDict_GetItem, PyDict_SetItem
from cpython.unicode cimport PyUnicode_DecodeLatin1
from cpython.ref cimport PyObject
from libc.string cimport memchr

cdef extern from "<strings.h>" nogil:
    int strncasecmp(const char *a, const char *b, size_t n)

_HOP_BY_HOP_ERRORS = frozenset({"transfer-encoding", "te", "trailer", "upgrade"})
_WSGI_DROPPED = frozenset({"date", "server", "keep-alive"})
_METHODS_INTERNED = {}
# The environ key of each request header name seen, by its bytes as received (names repeat on
# every request; computing "HTTP_" + upper per header would cost more than the rest together).
# None for a name that gets no key. Bounded: past it, keys are computed each time.
cdef dict _wsgi_keys = {}
DEF WSGI_KEYS_MAX = 512


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


cdef object _env_key(const char *name, size_t n):
    """The environ key of header name[0..n): "HTTP_" + upper-cased name with '-' as '_',
    CONTENT_TYPE for Content-Type, None for Content-Length (the body's length is given as
    CONTENT_LENGTH) and for a name holding '_' (X_User must not pass for X-User)."""
    cdef bytes raw = PyBytes_FromStringAndSize(name, <Py_ssize_t>n)
    cdef PyObject *hit = PyDict_GetItem(_wsgi_keys, raw)
    if hit != NULL:
        return <object>hit
    cdef str lname = raw.decode("latin-1").lower()
    if lname == "content-type":
        key = "CONTENT_TYPE"
    elif lname == "content-length" or "_" in lname:
        key = None
    else:
        key = "HTTP_" + lname.upper().replace("-", "_")
    if len(_wsgi_keys) < WSGI_KEYS_MAX:
        _wsgi_keys[raw] = key
    return key


cdef class WSGIHandler:
    """A Python handler (a callable taking a Request) that runs the WSGI application ``app``
    mounted at ``script_name`` (cyserve/wsgi.py)."""

    cdef readonly object app
    cdef readonly str script_name
    cdef dict _base  # the environ's keys that are the same on every request

    def __init__(self, app, str script_name=""):
        if not callable(app):
            raise TypeError(f"a WSGI application must be callable, got {type(app).__name__}")
        self.app = app
        self.script_name = script_name.rstrip("/")
        self._base = {
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
        }

    def bind(self, str host, int port, int threads, bint processes):
        """Where the app runs, set by cyserve.serve() before requests arrive: SERVER_NAME and
        SERVER_PORT for a request without Host, wsgi.multithread, wsgi.multiprocess."""
        base = dict(self._base)
        base["SERVER_NAME"] = host or "localhost"
        base["SERVER_PORT"] = str(port)
        base["wsgi.multithread"] = threads > 1
        base["wsgi.multiprocess"] = bool(processes)
        self._base = base  # replaced whole: a request being served keeps the one it copied

    def __repr__(self):
        name = getattr(self.app, "__qualname__", type(self.app).__name__)
        return f"<WSGIHandler {getattr(self.app, '__module__', '?')}.{name}>"

    def environ(self, Request request):
        """The PEP 3333 environ of request (valid during its handler call)."""
        request._check()
        return self._environ(request._req)

    cdef dict _environ(self, const cyserve_request *req):
        cdef dict env = PyDict_Copy(self._base)
        cdef size_t i, slen = len(self.script_name)
        cdef const cyserve_header *h
        cdef const char *peer
        cdef const char *colon
        cdef const char *p
        cdef size_t n
        env["REQUEST_METHOD"] = _method_str(req.method)
        # The router matched the prefix on a segment boundary: the path starts with it.
        if slen and req.path.len >= slen:
            env["PATH_INFO"] = _unquote_latin1(req.path.ptr + slen, req.path.len - slen)
        else:
            env["PATH_INFO"] = _unquote_latin1(req.path.ptr, req.path.len)
        env["QUERY_STRING"] = _str_of(req.query)
        env["SERVER_PROTOCOL"] = "HTTP/1.1" if req.minor_version == 1 else "HTTP/1.0"
        cdef bytes body = PyBytes_FromStringAndSize(req.body.ptr, <Py_ssize_t>req.body.len)
        env["wsgi.input"] = _BytesIO(body)
        cdef bint had_length = False
        for i in range(req.num_headers):
            h = &req.headers[i]
            key = _env_key(h.name.ptr, h.name.len)
            if key is None:
                if h.name.len == 14 and strncasecmp(h.name.ptr, "content-length", 14) == 0:
                    had_length = True
                continue
            value = _str_of(h.value)
            old = env.get(key)
            if old is None:
                env[key] = value
            else:  # a repeated field: one value, as Request.headers joins them
                env[key] = old + ("; " if key == "HTTP_COOKIE" else ", ") + value
        if req.body.len or had_length:
            env["CONTENT_LENGTH"] = str(req.body.len)
        host = env.get("HTTP_HOST")
        if host:
            name, port = _split_host(host)
            env["SERVER_NAME"] = name
            env["SERVER_PORT"] = port or "80"
        if cs.server_req_peer(<const cs.req_t *>req, &peer) == 0:
            n = strlen(peer)
            colon = peer + n
            while colon > peer and colon[0] != c':':
                colon -= 1
            if colon > peer:
                p = peer
                if p[0] == c'[':  # [v6]:port
                    env["REMOTE_ADDR"] = PyUnicode_DecodeLatin1(p + 1, colon - p - 2, NULL)
                else:
                    env["REMOTE_ADDR"] = PyUnicode_DecodeLatin1(p, colon - p, NULL)
                env["REMOTE_PORT"] = PyUnicode_DecodeLatin1(colon + 1, peer + n - colon - 1,
                                                            NULL)
        return env

    def __call__(self, Request request):
        request._check()
        env = self._environ(request._req)
        cdef _WSGIAnswer answer = _WSGIAnswer.__new__(_WSGIAnswer)
        answer.chunks = []
        result = self.app(env, answer.start_response)
        try:
            for chunk in result:
                if not isinstance(chunk, bytes):
                    if not isinstance(chunk, (bytearray, memoryview)):
                        raise WSGIError(f"the WSGI application yielded a {type(chunk).__name__},"
                                        f" not bytes")
                    chunk = bytes(chunk)
                if chunk:
                    if answer.status == 0:
                        raise WSGIError("the WSGI application sent body bytes before calling "
                                        "start_response")
                    answer.chunks.append(chunk)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if answer.status == 0:
            raise WSGIError("the WSGI application returned without calling start_response")
        return answer


cdef dict _METHOD_STRS = {}


cdef str _method_str(cyserve_str m):
    # The same few methods on every request: one str each, not one per request.
    cdef bytes raw = PyBytes_FromStringAndSize(m.ptr, <Py_ssize_t>m.len)
    cdef PyObject *hit = PyDict_GetItem(_METHOD_STRS, raw)
    if hit != NULL:
        return <str>hit
    s = raw.decode("latin-1")
    if len(_METHOD_STRS) < 64:
        _METHOD_STRS[raw] = s
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


cdef class _WSGIAnswer:
    """start_response and write() of one request, and then the answer itself: the handler
    returns it and _fill_response copies it into the engine's response."""

    cdef int status  # 0 until start_response
    cdef list headers
    cdef list chunks
    cdef object length  # the app's Content-Length, or None
    cdef bint close

    def start_response(self, status, headers, exc_info=None):
        if self.status != 0 and exc_info is None:
            raise WSGIError("start_response called a second time without exc_info")
        # Nothing is sent before the app has finished, so an error page may always replace the
        # first answer (PEP 3333 re-raises exc_info only once headers went out).
        exc_info = None  # no reference cycle through the traceback
        cdef int code = _wsgi_status(status)
        if not isinstance(headers, list):
            raise WSGIError(f"WSGI response headers must be a list of (name, value) tuples, "
                            f"got {type(headers).__name__}")
        out = []
        length = None
        close = False
        for item in headers:
            if not (type(item) is tuple and len(<tuple>item) == 2
                    and isinstance((<tuple>item)[0], str) and isinstance((<tuple>item)[1], str)):
                raise WSGIError(f"invalid WSGI response header {item!r}: must be a (str, str) "
                                "tuple")
            name = (<tuple>item)[0]
            lname = name.lower()
            if lname == "content-type":
                out.append(item)
            elif lname == "content-length":
                length = item[1]
            elif lname in _WSGI_DROPPED:
                continue
            elif lname == "connection":
                if "close" in [t.strip() for t in item[1].lower().split(",")]:
                    close = True
            elif lname in _HOP_BY_HOP_ERRORS:
                raise WSGIError(f"the WSGI application set the hop-by-hop header {name!r}, "
                                "which is the server's to write")
            else:
                out.append(item)
        self.status = code
        self.headers = out
        self.length = length
        self.close = close
        del self.chunks[:]  # what write() sent for the answer this one replaces
        return self.write

    def write(self, data):
        if self.status == 0:
            raise WSGIError("write() called before start_response")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise WSGIError(f"write() takes bytes, not {type(data).__name__}")
        self.chunks.append(bytes(data))


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


cdef int _fill_wsgi(_WSGIAnswer a, cs.resp_t *resp, bint head) except -1:
    cdef bytes body
    cdef object length
    if cs.resp_set_status(resp, a.status):
        _check_rc(-22, f"status {a.status}")
    for name, value in a.headers:
        _add_header(resp, name, value)
    if a.close:
        _add_header(resp, "Connection", "close")
    chunks = a.chunks
    if not chunks:
        body = b""
    elif len(chunks) == 1:
        body = chunks[0]
    else:
        body = b"".join(chunks)
    if body and (a.status == 204 or a.status == 304):
        raise ValueError(f"a {a.status} response cannot have a body ({len(body)} bytes given)")
    if a.length is not None and a.status != 204 and a.status != 304:
        length = _content_length(a.length)
        if length != len(body):
            # What GET would send, announced by an answer to HEAD without a body (Werkzeug).
            if body or not head:
                raise ValueError(f"Content-Length {length} does not match the body's "
                                 f"{len(body)} bytes")
            _check_rc(cs.resp_set_head_length(resp, <uint64_t>length), "Content-Length")
    if body:
        return _set_body(resp, body)
    return 0
