# The Server type, included in cyserve._core: it turns the route list of cyserve.app into the C
# engine's router and targets (one per handler kind: python, nogil, static, files) and starts and
# stops the engine. Server.start() and Server.stop() release the GIL while C runs.
import atexit as _atexit
import os as _os
import re as _re
import sys as _sys
import weakref as _weakref

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_GetName, PyCapsule_CheckExact
from libc.stdint cimport uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport strlen, strcmp

from cyserve.native.includes cimport server as cs
from cyserve.native.includes.router cimport (router_t, router_new, router_free, router_add,
                                             files_root_t, files_root_new, files_root_free,
                                             files_type_t, files_root_set_types,
                                             files_root_set_encodings, FILES_ENC_BR,
                                             FILES_ENC_ZSTD, FILES_ENC_GZIP,
                                             ROUTER_PATH, ROUTER_PREFIX, ROUTER_REGEX)

# The values of enum http_method (csrc/http_method.h), which the parser gives each request and
# the router keeps one bit for (bit 1 << value): taken from the header so the two cannot drift.
from cyserve.native.includes.http_parse cimport (HTTP_GET, HTTP_HEAD, HTTP_POST, HTTP_PUT,
                                                 HTTP_DELETE, HTTP_PATCH, HTTP_OPTIONS,
                                                 HTTP_CONNECT, HTTP_TRACE)

# A route's method names (cyserve.app.METHODS) to their enum http_method values.
_METHOD_BITS = {"GET": HTTP_GET, "HEAD": HTTP_HEAD, "POST": HTTP_POST, "PUT": HTTP_PUT,
                "DELETE": HTTP_DELETE, "PATCH": HTTP_PATCH, "OPTIONS": HTTP_OPTIONS,
                "CONNECT": HTTP_CONNECT, "TRACE": HTTP_TRACE}
_INT_PARAM = _re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*):int\}")
_TOKEN = _re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


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


def _gil_enabled():
    # Whether this interpreter runs with a GIL now: always before 3.13; on a free-threaded
    # build, unless it was turned on (-X gil=1, or an extension that does not declare itself
    # free-threading safe).
    is_enabled = getattr(_sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


cdef bytes _serialise_headers(headers, str where):
    parts = []
    cdef bint server = False  # a Server line: it replaces the engine's, and one at most
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
        if name.lower() == "server":
            if server:
                raise ValueError(f"{where}: header {name!r} given twice")
            server = True
        parts.append(f"{name}: {value}\r\n".encode("latin-1"))
    return b"".join(parts)


def default_head(headers=(), bint server_header=True, bint date_header=True):
    """The fields a server writes on every answer (csrc/http1_write.h, struct http_head), as
    (lines, server_len, no_date). The Server line comes first: headers' own Server when they
    name one (it replaces the engine's, even with server_header off, as in uvicorn), else
    "Server: cyserve" unless server_header is off; a handler's own Server replaces either.
    Then the other headers ((name, value) pairs): a bad name, a CR/LF/NUL in a value, a field
    the engine writes itself or a second Server is a ValueError."""
    headers = list(headers)
    where = "header"
    _serialise_headers(headers, where)  # validates the whole list (one Server at most)
    own = [h for h in headers if str(h[0]).lower() == "server"]
    rest = [h for h in headers if str(h[0]).lower() != "server"]
    server = _serialise_headers(own, where) if own else (
        b"Server: cyserve\r\n" if server_header else b"")
    return server + _serialise_headers(rest, where), len(server), 0 if date_header else 1


cdef const char *keep_b(list keep, bytes b):
    """b's bytes, kept alive by keep for as long as the caller holds it."""
    keep.append(b)
    return b


cdef int _tls_load(cs.tls_ctx_t **ctx, bint reload, str certfile, str keyfile, str password,
                   str ciphers, str ca_certs, int cert_reqs, int http2, sni, str ocsp_file,
                   ticket_rotation) except -1:
    """Make a TLS context (reload false: ctx[0] set) or load ctx[0]'s files again (reload true)
    from certificate and key files: ValueError with OpenSSL's reason and the file's name when
    they cannot be used (a reload then keeps the certificates it had). sni: (name, certfile,
    keyfile or None) for each more name served with a certificate of its own."""
    cdef cs.tls_options_t o
    cdef char err[512]
    cdef cs.tls_sni_option_t *so = NULL
    cdef Py_ssize_t i
    cdef int rc
    keep = []
    fs = _os.fsencode
    sni = list(sni or ())
    if not 0 <= ticket_rotation <= 1 << 30:
        raise ValueError(f"ssl_ticket_rotation must be 0..2**30 seconds, got {ticket_rotation}")
    # Empty strings mean "not given" to tls_ctx_new.
    o.certfile = keep_b(keep, fs(certfile))
    o.keyfile = keep_b(keep, fs(keyfile) if keyfile else b"")
    o.ciphers = keep_b(keep, ciphers.encode("ascii", "replace") if ciphers else b"")
    o.password = keep_b(keep, password.encode("utf-8") if password else b"")
    o.ca_certs = keep_b(keep, fs(ca_certs) if ca_certs else b"")
    o.ocsp_file = keep_b(keep, fs(ocsp_file) if ocsp_file else b"")
    o.cert_reqs = cert_reqs
    o.http2 = http2  # 0 HTTP/1.1 only, 1 h2 and http/1.1, 2 h2 only (tls.h)
    o.ticket_period_s = <unsigned>ticket_rotation
    so = <cs.tls_sni_option_t *>calloc(max(1, len(sni)), sizeof(cs.tls_sni_option_t))
    if so == NULL:
        raise MemoryError()
    try:
        for i, entry in enumerate(sni):
            name, sni_cert, sni_key = entry
            so[i].name = keep_b(keep, str(name).encode("idna"))
            so[i].certfile = keep_b(keep, fs(sni_cert))
            so[i].keyfile = keep_b(keep, fs(sni_key) if sni_key else b"")
        o.sni = so
        o.nsni = len(sni)
        err[0] = 0
        if reload:
            rc = cs.tls_ctx_reload(ctx[0], &o, err, sizeof(err))
        else:
            rc = cs.tls_ctx_new(&o, ctx, err, sizeof(err))
    finally:
        free(so)
    if rc != 0:
        raise ValueError(err.decode("utf-8", "replace"))
    return 0


def _tls_args(str ssl_certfile, str ssl_keyfile=None, str ssl_keyfile_password=None,
              str ssl_ciphers=None, str ssl_ca_certs=None, int ssl_cert_reqs=0,
              ssl_sni=None, str ssl_ocsp_file=None, ssl_ticket_rotation=0):
    """The TLS keyword arguments in _tls_load's order (without ctx, reload and http2)."""
    return (ssl_certfile, ssl_keyfile, ssl_keyfile_password, ssl_ciphers, ssl_ca_certs,
            ssl_cert_reqs, ssl_sni, ssl_ocsp_file, ssl_ticket_rotation)


def check_tls(*tls_args, **tls_kwargs):
    """Load the certificates and keys as a server would, and let them go: ValueError naming the
    file when they cannot be used (the process supervisor checks once, before forking, and
    again before a reload)."""
    cdef cs.tls_ctx_t *ctx = NULL
    a = _tls_args(*tls_args, **tls_kwargs)
    _tls_load(&ctx, False, a[0], a[1], a[2], a[3], a[4], a[5], True, a[6], a[7], a[8])
    cs.tls_ctx_free(ctx)


def kernel_tls():
    """Whether TLS connections of this process send files with kernel TLS (the kernel has the
    `tls` ULP): True, or False for the read-and-encrypt loop. Known once a TLS server (or
    check_tls) has run in this process; False before."""
    return bool(cs.tls_kernel_tls())


cdef int _server_on_bound(void *ud, int port) noexcept nogil:
    # server_start's on_bound call (server.h): the workers are not started yet. A failure is kept
    # on the Server and raised by start(), which sees the start cancelled.
    with gil:
        srv = <Server>ud
        try:
            srv._on_bound(port)
        except BaseException as exc:
            srv._bound_error = exc
            return -125  # ECANCELED
    return 0


cdef _files_configure(files_root_t *root, str directory, str where):
    # The content types (mimetypes' table, cyserve.static_files) and the precompressed siblings
    # the directory holds are decided here, once, so that the engine's file answers look up a
    # table and open a sibling only where one can exist.
    from cyserve import static_files
    table = [(ext.encode("ascii"), mime.encode("ascii"))
             for ext, mime in static_files.content_types()]
    cdef size_t n = len(table)
    cdef files_type_t *types = <files_type_t *>calloc(n if n else 1, sizeof(files_type_t))
    if types == NULL:
        raise MemoryError()
    cdef Py_ssize_t i
    try:
        for i in range(<Py_ssize_t>n):
            types[i].ext = table[i][0]
            types[i].type = table[i][1]
        rc = files_root_set_types(root, types, n)  # copies the strings
    finally:
        free(types)
    if rc != 0:
        raise ValueError(f"{where}: the content type table was refused ({_os.strerror(-rc)})")
    bits = {"br": FILES_ENC_BR, "zstd": FILES_ENC_ZSTD, "gzip": FILES_ENC_GZIP}
    cdef unsigned mask = 0
    for name in static_files.precompressed_encodings(directory):
        mask |= <unsigned>bits[name]
    files_root_set_encodings(root, mask)


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
    cdef object _on_bound
    cdef object _bound_error
    cdef cs.server_listen_t *_listen
    cdef unsigned _nlisten
    cdef cs.tls_ctx_t *_tls
    cdef tuple _tls_args  # what _tls was made from: reload_tls() reads the same files again
    cdef int _tls_http2
    cdef readonly str scheme
    cdef object _metrics  # the Metrics whose slot the engine counts into (kept alive here)
    cdef bint _ws_deflate  # ASGI routes negotiate permessage-deflate (set before the routes)
    cdef cs.http_head_t _head  # the fields on every answer (static heads bake them in)
    cdef object __weakref__

    def __cinit__(self):
        self._srv = NULL
        self._router = NULL
        self._targets = NULL
        self._ntargets = 0
        self._keep = []
        self._listen = NULL
        self._nlisten = 0
        self._tls = NULL

    def __init__(self, list routes, *, str host, int port, int threads, int backlog=1024,
                 int max_header_bytes=8192, int max_target_bytes=8192, int max_headers=100,
                 max_body_bytes=1048576, double keepalive_timeout=5.0,
                 double header_timeout=10.0, double body_timeout=10.0, bint shared_port=False,
                 bint access_log=False, int access_log_fd=1, str access_log_format="common",
                 int blocking_threads=16, body_budget=64 << 20,
                 min_body_rate=500, listen=None, forwarded_allow_ips=None,
                 str forwarded_header="x-forwarded", bint forwarded_host=False,
                 str ssl_certfile=None,
                 str ssl_keyfile=None, str ssl_keyfile_password=None, str ssl_ciphers=None,
                 str ssl_ca_certs=None, int ssl_cert_reqs=0, ssl_sni=None,
                 str ssl_ocsp_file=None, ssl_ticket_rotation=0, bint http2=True,
                 str http="auto", int http2_max_concurrent_streams=100, Metrics metrics=None,
                 unsigned int limit_concurrency=0,
                 int metrics_slot=-1, proxy_protocol_from=None, ws_max_size=16 << 20,
                 ws_ping_interval=20.0, ws_ping_timeout=20.0,
                 bint ws_per_message_deflate=True, int parent_pid=0,
                 double parent_grace=10.0, headers=(), bint server_header=True,
                 bint date_header=True):
        if self._router != NULL:
            raise RuntimeError("Server.__init__ called twice")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        if threads < 0:
            raise ValueError(f"threads must be >= 0, got {threads}")
        if not 0 <= body_budget <= 1 << 40 or not 0 <= min_body_rate <= 1 << 40:
            raise ValueError("body_budget and min_body_rate must be in 0..2**40")
        if not 0 <= blocking_threads <= 1024:
            raise ValueError(f"blocking_threads must be in 0..1024, got {blocking_threads}")
        if backlog < 1:
            raise ValueError(f"backlog must be >= 1, got {backlog}")
        if http not in ("auto", "1", "2"):
            raise ValueError(f"http must be 'auto', '1' or '2', got {http!r}")
        # server.h's cfg.http2: 0 HTTP/1.1 only, 1 both (auto), 2 HTTP/2 only. http2=False is
        # the older spelling of http="1" (Config refuses the two saying different things).
        cdef int http2_mode = 0 if (not http2 or http == "1") else (2 if http == "2" else 1)
        if not 1 <= http2_max_concurrent_streams <= 1 << 20:
            raise ValueError("http2_max_concurrent_streams must be in 1..2**20, got "
                             f"{http2_max_concurrent_streams}")
        if max_header_bytes < 64 or max_target_bytes < 1 or max_headers < 1:
            raise ValueError("max_header_bytes must be >= 64, max_target_bytes and max_headers "
                             ">= 1")
        if max_body_bytes < 0:
            raise ValueError(f"max_body_bytes must be >= 0, got {max_body_bytes}")
        if not 1 <= ws_max_size <= 1 << 40:
            raise ValueError(f"ws_max_size must be in 1..2**40, got {ws_max_size}")
        for name, value in (("ws_ping_interval", ws_ping_interval),
                            ("ws_ping_timeout", ws_ping_timeout)):
            # None or 0: off (uvicorn's None).
            if value is not None and not 0 <= value <= 1e9:
                raise ValueError(f"{name} must be in 0..1e9 seconds or None, got {value}")
        self._ws_deflate = ws_per_message_deflate
        head_b, server_len, no_date = default_head(headers, server_header, date_header)
        cs.http_head_init(&self._head, keep_b(self._keep, head_b), len(head_b), server_len,
                          no_date)
        for name, value in (("keepalive_timeout", keepalive_timeout),
                            ("header_timeout", header_timeout), ("body_timeout", body_timeout)):
            # The nanoseconds must fit a uint64 (1.8e10 s); past it the cast wrapped to 0.
            if not 0 < value <= 1e9:
                raise ValueError(f"{name} must be > 0 and at most 1e9 seconds, got {value}")
        self.host = host
        self._port = port
        self.threads = threads
        self.scheme = "http"
        if ssl_certfile:
            self._tls_args = _tls_args(ssl_certfile, ssl_keyfile, ssl_keyfile_password,
                                       ssl_ciphers, ssl_ca_certs, ssl_cert_reqs, ssl_sni,
                                       ssl_ocsp_file, ssl_ticket_rotation)
            self._tls_http2 = http2_mode
            self._tls_reload(False)
            self.scheme = "https"
        elif (ssl_keyfile or ssl_keyfile_password or ssl_ciphers or ssl_ca_certs or ssl_cert_reqs
              or ssl_sni or ssl_ocsp_file):
            raise ValueError("the ssl_* options need ssl_certfile")
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
        # Only static routes and GIL-free handlers are ever answered inline (http1_inline.c);
        # without one, the inline path would parse and route every request for nothing.
        cfg.inline_routes = 0
        for i in range(self._ntargets):
            if self._targets[i].kind == cs.SERVER_STATIC or self._targets[i].kind == cs.SERVER_NOGIL:
                cfg.inline_routes = 1
        host_b = host.encode("idna") if host else b"0.0.0.0"
        self._keep.append(host_b)
        cfg.host = host_b
        cfg.port = port
        cfg.threads = threads
        cfg.blocking_threads = blocking_threads
        # Without a GIL a computing Python call holds up no other thread: relief for it would
        # only add threads (each keeping its own allocator heaps) on the same CPUs.
        cfg.relief_waiting_only = 0 if _gil_enabled() else 1
        cfg.body_budget = body_budget
        cfg.min_body_rate = min_body_rate
        cfg.backlog = backlog
        cfg.shared_port = 1 if shared_port else 0
        if forwarded_allow_ips is not None:
            # Proxy headers on: the peers whose forwarding headers are believed (csrc/proxy.h).
            fw = str(forwarded_allow_ips).encode("ascii")
            self._keep.append(fw)
            cfg.forwarded_allow_ips = fw
        if forwarded_header not in ("x-forwarded", "forwarded"):
            raise ValueError(f"forwarded_header must be x-forwarded or forwarded, got "
                             f"{forwarded_header!r}")
        cfg.forwarded_header = 1 if forwarded_header == "forwarded" else 0
        # With proxy headers: the host they name becomes the request's Host (csrc/proxy.h).
        cfg.forwarded_host = 1 if forwarded_host else 0
        if proxy_protocol_from is not None:
            # Connections from these peers begin with a PROXY protocol header (csrc/proxyproto.h).
            pp = str(proxy_protocol_from).encode("ascii")
            self._keep.append(pp)
            cfg.proxy_protocol_from = pp
        if listen:
            self._set_listen(listen)
            cfg.listen = self._listen
            cfg.nlisten = self._nlisten
        # The access log goes to access_log_fd (standard output unless a file was opened for
        # it), one write(2) per line from the workers.
        if access_log and access_log_fd < 0:
            raise ValueError(f"access_log_fd must be a file descriptor, got {access_log_fd}")
        cfg.access_log_fd = access_log_fd if access_log else -1
        formats = {"common": cs.ACCESS_LOG_COMMON, "combined": cs.ACCESS_LOG_COMBINED,
                   "json": cs.ACCESS_LOG_JSON}
        if access_log_format in formats:
            cfg.access_log_format = formats[access_log_format]
        elif "%" in access_log_format:
            cfg.access_log_ops = self._access_log_ops(access_log_format, &cfg.access_log_nops)
            cfg.access_log_format = cs.ACCESS_LOG_CUSTOM
        else:
            raise ValueError(f"access_log_format must be one of common, combined, json, or "
                             f"a format of %(name)s atoms; got {access_log_format!r}")
        cfg.limits.max_header_bytes = max_header_bytes
        cfg.limits.max_target_bytes = max_target_bytes
        cfg.limits.max_headers = max_headers
        cfg.max_body_bytes = max_body_bytes
        cfg.keepalive_ns = <uint64_t>(keepalive_timeout * 1e9)
        cfg.header_timeout_ns = <uint64_t>(header_timeout * 1e9)
        cfg.body_timeout_ns = <uint64_t>(body_timeout * 1e9)
        cfg.http2 = http2_mode
        cfg.http2_max_streams = http2_max_concurrent_streams
        cfg.ws_max_message = ws_max_size
        cfg.ws_ping_interval_ns = <uint64_t>((ws_ping_interval or 0) * 1e9)
        cfg.ws_ping_timeout_ns = <uint64_t>((ws_ping_timeout or 0) * 1e9)
        cfg.ws_deflate = ws_per_message_deflate  # GIL-free routes; ASGI ones ask _ws_deflate
        cfg.limit_concurrency = limit_concurrency
        cfg.head = self._head
        # A worker process's supervisor: the engine stops this process if it dies
        # (csrc/server.h, server_config.parent_pid), with or without the GIL.
        if parent_pid < 0 or parent_grace < 0:
            raise ValueError("parent_pid and parent_grace must be >= 0")
        cfg.parent_pid = parent_pid
        cfg.parent_grace_ns = <uint64_t>(parent_grace * 1e9)
        if self._tls != NULL:
            cfg.transport = cs.tls_transport_ptr
            cfg.transport_ctx = <void *>self._tls
        if metrics is not None:
            # Counted into slot metrics_slot of the shared region (csrc/metrics.h).
            cfg.metrics = metrics._slot(metrics_slot)
            if cfg.metrics == NULL:
                raise ValueError(f"metrics_slot {metrics_slot} is not a slot of the region")
            cfg.metrics_shards = metrics.nshards
            self._metrics = metrics
        rc = cs.server_new(&self._srv, &cfg, self._router)
        if rc != 0 and (forwarded_allow_ips is not None or proxy_protocol_from is not None):
            raise ValueError(f"invalid forwarded_allow_ips "
                             f"{forwarded_allow_ips or proxy_protocol_from!r}: addresses "
                             "or networks (CIDR) separated by commas, or *")
        if rc != 0:
            raise ValueError(f"invalid server configuration (error {-rc})")
        cs.server_set_offload_hooks(self._srv, cyserve__offload_begin, cyserve__offload_end,
                                    cyserve__offload_exit, NULL)

    cdef const cs.access_log_op_t *_access_log_ops(self, str fmt, unsigned *n) except NULL:
        # The steps of a custom access log format (cyserve.access_log compiles it), in a
        # bytearray this Server keeps: the engine borrows them until server_free().
        from cyserve.access_log import compile_format
        atoms = {"TEXT": cs.ACCESS_LOG_TEXT, "HOST": cs.ACCESS_LOG_HOST,
                 "DASH": cs.ACCESS_LOG_DASH, "TIME": cs.ACCESS_LOG_TIME,
                 "REQLINE": cs.ACCESS_LOG_REQLINE, "METHOD": cs.ACCESS_LOG_METHOD,
                 "PATH": cs.ACCESS_LOG_PATH, "QUERY": cs.ACCESS_LOG_QUERY,
                 "PROTOCOL": cs.ACCESS_LOG_PROTOCOL, "STATUS": cs.ACCESS_LOG_STATUS,
                 "BYTES": cs.ACCESS_LOG_BYTES, "BYTES0": cs.ACCESS_LOG_BYTES0,
                 "REFERER": cs.ACCESS_LOG_REFERER, "AGENT": cs.ACCESS_LOG_AGENT,
                 "SECONDS": cs.ACCESS_LOG_SECONDS, "MILLIS": cs.ACCESS_LOG_MILLIS,
                 "MICROS": cs.ACCESS_LOG_MICROS, "DECIMAL": cs.ACCESS_LOG_DECIMAL,
                 "PID": cs.ACCESS_LOG_PID, "HEADER": cs.ACCESS_LOG_HEADER}
        try:
            steps = compile_format(fmt)
        except ValueError as e:
            raise ValueError(f"access_log_format {fmt!r}: {e}") from None
        store = bytearray(len(steps) * sizeof(cs.access_log_op_t))
        self._keep.append(store)
        cdef cs.access_log_op_t *ops = <cs.access_log_op_t *><char *>store
        cdef Py_ssize_t i
        cdef bytes arg
        for i, (kind, text) in enumerate(steps):
            arg = text.encode("ascii")
            self._keep.append(arg)
            ops[i].atom = atoms[kind]
            ops[i].arg = arg
            ops[i].arg_len = len(arg)
        n[0] = len(steps)
        return ops

    cdef _set_listen(self, listen):
        # listen: the addresses to serve, each (host, port) for TCP (one SO_REUSEPORT listener
        # per worker) or an int, a listening socket's descriptor that every worker accepts from
        # (kept open by the caller until stop() returns).
        items = list(listen)
        self._listen = <cs.server_listen_t *>calloc(len(items), sizeof(cs.server_listen_t))
        if self._listen == NULL:
            raise MemoryError()
        self._nlisten = len(items)
        cdef Py_ssize_t i
        for i, item in enumerate(items):
            if isinstance(item, int) and not isinstance(item, bool):
                if item < 0:
                    raise ValueError(f"listen: a descriptor must be >= 0, got {item}")
                self._listen[i].fd = item
                self._listen[i].host = NULL
                continue
            try:
                host, port = item
            except (TypeError, ValueError):
                raise ValueError(f"listen: expected (host, port) or a descriptor, got {item!r}")
            if not isinstance(port, int) or not 0 <= port <= 65535:
                raise ValueError(f"listen: port must be in 0..65535, got {port!r}")
            hb = str(host).encode("idna") if host else b"0.0.0.0"
            self._keep.append(hb)
            self._listen[i].fd = -1
            self._listen[i].host = hb
            self._listen[i].port = port

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
            # Called holding the GIL (python_handler.pyx, _py_call): cast through void *, as
            # Cython warns on a direct cast that it circumvents its GIL validation.
            t.py_call = <cs.py_call_t><void *>_py_call
            t.py_stream = _py_stream  # native/wsgi.pyx: WSGI bodies streamed piece by piece
            t.body_stream = 1  # large request bodies are read as the handler asks (RequestBody)
            t.metrics_kind = cs.METRICS_PYTHON
            if isinstance(target, WSGIHandler):
                t.metrics_kind = cs.METRICS_WSGI
            if isinstance(target, ASGIHandler):  # native/asgi.pyx: answers made on the loop
                t.py_call = _asgi_call
                t.py_stream = _asgi_stream
                target.ws_deflate = self._ws_deflate  # offered permessage-deflate is taken
                t.stream_body = 1  # receive() gets the body as it arrives
                t.body_stream = 0  # not the WSGI/App stream (body.h): receive() reads its own
                t.metrics_kind = cs.METRICS_ASGI
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
        elif kind == "nogil_ws":
            cap, ctx_cap = target
            if not PyCapsule_CheckExact(cap) or PyCapsule_GetName(cap) == NULL or \
                    strcmp(PyCapsule_GetName(cap), b"cyserve.nogil_ws_handler") != 0:
                raise TypeError(f"{where}: a nogil_ws target must be a PyCapsule named "
                                f"'cyserve.nogil_ws_handler' (from cyserve_ws_handler_capsule)")
            ctx = NULL
            if ctx_cap is not None:
                if not PyCapsule_CheckExact(ctx_cap):
                    raise TypeError(f"{where}: the nogil_ws context must be a PyCapsule or None")
                ctx = PyCapsule_GetPointer(ctx_cap, PyCapsule_GetName(ctx_cap))
            self._keep.append(target)
            t.kind = cs.SERVER_NOGIL_WS
            t.ws = <const cs.ws_handler_t *>PyCapsule_GetPointer(cap, b"cyserve.nogil_ws_handler")
            t.ctx = ctx
        elif kind == "static" or kind == "health":
            # "health": a static answer that turns 503 once fail_health() is called or a stop
            # begins (the --health-path route).
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
            rc = cs.server_target_static(t, &self._head, status, hb, len(hb), body, len(body))
            if rc == -22:
                raise ValueError(f"{where}: invalid status {status!r}")
            if rc != 0:
                raise MemoryError()
            t.static_health = kind == "health"
        elif kind == "files":
            path_b = _os.fsencode(target)
            rc = files_root_new(path_b, &root)
            if rc != 0:
                import os
                raise ValueError(f"{where}: cannot serve files from {target!r}: "
                                 f"{os.strerror(-rc)}")
            t.kind = cs.SERVER_FILES
            t.root = root  # freed with the targets from here on, whatever fails below
            _files_configure(root, target, where)
        else:
            raise ValueError(f"{where}: kind must be 'python', 'nogil', 'nogil_ws', 'static' or "
                             f"'files', got {kind!r}")
        pat = pattern.encode("utf-8")
        t.route = keep_b(self._keep, pat)  # named in the --worker-timeout log
        err[0] = 0
        rc = router_add(self._router, kinds[match], pat, len(pat), mask, t, err, sizeof(err))
        if rc != 0:
            msg = err[:strlen(err)].decode("utf-8", "replace") if err[0] else f"error {-rc}"
            if rc == -17:
                msg = "another route already has this pattern and one of these methods"
            raise ValueError(f"{where}: {msg}")

    cdef int _tls_reload(self, bint reload) except -1:
        a = self._tls_args
        _tls_load(&self._tls, reload, a[0], a[1], a[2], a[3], a[4], a[5], self._tls_http2,
                  a[6], a[7], a[8])
        return 0

    def fail_health(self):
        """Answer the health route (kind "health": --health-path) with 503 from now on, as it is
        once a stop begins: a load balancer's checks fail while everything else is served."""
        if self._srv != NULL:
            cs.server_fail_health(self._srv)

    def reload_tls(self):
        """Read the certificate, key, CA and OCSP files again: new handshakes use them,
        connections already made keep theirs. ValueError (OpenSSL's reason, the file's name)
        when they cannot be used: the server then goes on with the ones it had."""
        if self._tls == NULL:
            raise RuntimeError("this server does not speak TLS")
        self._tls_reload(True)

    def rotate_ticket_keys(self):
        """Move the session ticket keys on by one period now, as the clock does every
        ssl_ticket_rotation seconds: tickets of the period before still resume (and are
        renewed), older ones make a full handshake."""
        if self._tls == NULL:
            raise RuntimeError("this server does not speak TLS")
        cs.tls_ctx_rotate_ticket_keys(self._tls)

    def start(self, on_bound=None):
        """Bind and start the workers; returns at once. Raises OSError (port in use, ...).

        on_bound(port), if given, is called once the listeners are bound (port: the first TCP
        listener's, as ``port`` says afterwards) and before any worker starts: whatever the
        handlers read about where they run is set there, before they can run. What it raises
        cancels the start and is raised here."""
        cdef char err[256]
        cdef int rc
        if self._srv == NULL:
            raise RuntimeError("Server was not initialised")
        if self._started:
            raise RuntimeError("Server.start() called twice")
        err[0] = 0
        self._on_bound = on_bound
        self._bound_error = None
        if on_bound is not None:
            cs.server_set_on_bound(self._srv, _server_on_bound, <void *>self)
        # With a GIL, the Python calls of every thread run one at a time anyway: one queue of
        # calls, taken oldest first by whoever holds the GIL, keeps a worker and its relief
        # threads from starving each other's connections. Without one (3.14t), a queue per
        # thread, so that the batches run in parallel. Asked here, not at import: an extension
        # imported meanwhile may have turned the GIL on.
        cs.server_share_offloads(self._srv, 1 if _gil_enabled() else 0)
        try:
            with nogil:
                rc = cs.server_start(self._srv, err, sizeof(err))
        finally:
            cs.server_set_on_bound(self._srv, NULL, NULL)
            self._on_bound = None
        if self._bound_error is not None:
            exc, self._bound_error = self._bound_error, None
            raise exc
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
        _leases_drain()  # bodies lent to answers the stop ended (python_handler.pyx)
        cyserve__pins_sweep(1)  # and the bodies kept in a memfd: none is kept past a stop

    @property
    def running(self):
        return self._srv != NULL and cs.server_running(self._srv) != 0

    @property
    def stopped_fd(self):
        """A descriptor that becomes readable once the server has stopped (``running`` is then
        False), whoever stopped it, and stays so: poll it, never read or close it; -1 once the
        server is freed."""
        return cs.server_stopped_fd(self._srv) if self._srv != NULL else -1

    @property
    def port(self):
        return self._port

    @property
    def ports(self):
        """The bound port of each listener (in the order of ``listen``; 0 for a descriptor),
        once started."""
        if self._srv == NULL or not self._started:
            return []
        n = self._nlisten if self._nlisten else 1
        return [cs.server_listen_port(self._srv, i) for i in range(n)]

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

    @property
    def requests(self):
        """Requests answered since the server was made (every run), approximate while it
        serves: what --max-requests counts."""
        cdef cs.server_stats_t st
        if self._srv == NULL:
            return 0
        cs.server_get_stats(self._srv, &st)
        return st.requests

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
        if self._listen != NULL:
            free(self._listen)
            self._listen = NULL
            self._targets = NULL
        if self._router != NULL:
            router_free(self._router)
            self._router = NULL
        if self._tls != NULL:  # after server_free: no connection uses it any more
            cs.tls_ctx_free(self._tls)
            self._tls = NULL
