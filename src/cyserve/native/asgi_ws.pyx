# ASGI 3 applications, the websocket scope; included in cyserve._core after asgi.pyx, whose loop,
# batching and handoffs it shares. docs/architecture.md ("WebSocket") has the design.
#
# A request to an ASGI route that asks for a WebSocket (Upgrade: websocket) is checked here
# (csrc/ws.c: GET, Connection, Version 13, the key's shape): a bad handshake is answered at once
# (400, or 426 with Sec-WebSocket-Version: 13) without the application. A good one becomes a
# websocket scope and a _WSExchange, whose answer is deferred through a handoff as an http
# request's: websocket.accept fills a 101 there and attaches the handoff as the connection's
# channel (csrc/ws_conn.h); a close or a websocket.http.response before accepting is an ordinary
# HTTP answer (403 for a bare close). After the 101 the connection's coroutine reads the client's
# frames and hands each message to _ws_deliver (on a worker, in its batch of Python calls), which
# queues it for the loop with the batch's other calls; the app's sends queue frames in C and set
# the handoff's signal, from the loop thread, without the GIL on the engine's side.
from libc.string cimport memcmp, memset

cdef dict _WS_ASGI_VERSION = {"version": "3.0", "spec_version": "2.4"}
cdef int _WS_CONNECTING = 0, _WS_OPEN = 1, _WS_CLOSED = 2


cdef inline bint _name_is(const cyserve_header *h, const char *name, size_t n) noexcept:
    cdef size_t i
    cdef char c
    if h.name.len != n:
        return False
    for i in range(n):
        c = h.name.ptr[i]
        if c >= c'A' and c <= c'Z':
            c = c + 32
        if c != name[i]:
            return False
    return True


cdef bint _asgi_ws_wanted(const cyserve_request *req) noexcept:
    """Whether the request has an Upgrade field: only then is the handshake looked at."""
    cdef size_t i
    for i in range(req.num_headers):
        if _name_is(&req.headers[i], "upgrade", 7):
            return True
    return False


cdef void _ws_deliver(cs.handoff_t *h, int event, const char *data, size_t n,
                      int code) noexcept with gil:
    # The engine's deliver (csrc/ws_conn.h), on a worker in its batch: queue the event for the
    # loop; the batch's end hands it over with the batch's other calls.
    # The exchange, with a reference of our own (asgi.pyx: cyserve__producer_get).
    cdef PyObject *p = cyserve__producer_get(&h.producer)
    if p == NULL:
        return  # the exchange is gone: nobody listens
    ex = <_WSExchange>p
    Py_DecRef(p)  # ex holds its own reference
    try:
        payload = PyBytes_FromStringAndSize(data, <Py_ssize_t>n) if n else b""
        _asgi_queue_call(ex.lp, ex._on_event, (event, payload, code))
    except BaseException:
        _asgi_log.exception("handing a WebSocket message to the event loop failed")


cdef class _WSExchange:
    """One WebSocket of an ASGI application: its receive() and send(), and the handoff that is
    first its handshake's answer, then the connection's channel."""
    cdef cs.handoff_t *h
    cdef int state
    cdef bint connect_sent, denial_started, closed_by_app
    cdef bytes accept_key       # Sec-WebSocket-Accept for the client's key
    # Messages for receive(), oldest first. A list, not a deque: an idle WebSocket's empty list
    # is 56 bytes where a deque holds a 64-slot block (760); the engine's inbound window bounds
    # what waits here (WSCONN_IN_WINDOW / WSCONN_MSG_COST entries), so pop(0) stays cheap.
    cdef list inbox
    cdef object waiter          # the future receive() waits on
    cdef object drained         # the future a send() over the high-water mark waits on
    cdef int close_code
    cdef str close_reason
    cdef tuple pending_close    # (code, reason) of a close queued behind messages in inbox
    cdef int denial_status
    cdef list denial_headers
    cdef list denial_body
    cdef readonly str label
    cdef bytes pmd_response     # the Sec-WebSocket-Extensions answer, or None: uncompressed
    cdef cs.ws_pmd_params_t pmd  # what ws_pmd_negotiate chose (with pmd_response)
    cdef _ASGILoop lp           # the loop it runs on: its futures are that loop's

    def __dealloc__(self):
        if self.h != NULL:
            cyserve__producer_clear(&self.h.producer)
            cs.handoff_release(self.h)
            self.h = NULL

    def _on_event(self, args):
        event, payload, code = args
        # Each message keeps its length, which receive() gives back to the engine's inbound
        # window (csrc/ws_conn.h, WSCONN_IN_WINDOW) when the app takes it.
        if event == cs.WSCONN_EV_TEXT:
            self.inbox.append(({"type": "websocket.receive",
                                "text": payload.decode("utf-8")},  # validated by the engine
                               len(payload)))
        elif event == cs.WSCONN_EV_BINARY:
            self.inbox.append(({"type": "websocket.receive", "bytes": payload}, len(payload)))
        elif event == cs.WSCONN_EV_CLOSED:
            reason = payload.decode("utf-8", "replace")
            busy = self.waiter is None or self.waiter.done()  # not waiting in receive()
            if self.inbox or (self.state == _WS_OPEN and busy):
                # The messages that came before the close reach the app first, and it is open
                # for the app until it takes the close: what it sends in answer to them still
                # goes out when the engine is the one closing (a client that broke a rule:
                # csrc/ws_conn.c waits for the app to take the close before its close frame).
                # That holds with an empty inbox too while the app is not waiting in receive():
                # it may still be answering the last message it took, and only its next
                # receive() says it is done (a blocking handler's echo lost that race).
                self.pending_close = (code, reason)
                self.inbox.append((None, 0))
                if self.drained is not None and not self.drained.done():
                    self.drained.set_result(None)  # no drain notice follows a close
            else:
                self._closed(code, reason)
                cs.wsconn_consumed(self.h, 0)  # the close is taken
        elif event == cs.WSCONN_EV_DRAINED:
            if self.drained is not None and not self.drained.done():
                self.drained.set_result(None)
            return
        self._wake()

    cdef void _wake(self) noexcept:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    cdef void _closed(self, int code, str reason) noexcept:
        if self.state != _WS_CLOSED:
            self.state = _WS_CLOSED
            self.close_code = code
            self.close_reason = reason
        if self.drained is not None and not self.drained.done():
            self.drained.set_exception(ClientDisconnected("the WebSocket is closed"))
        self._wake()

    async def receive(self):
        if not self.connect_sent:
            self.connect_sent = True
            return {"type": "websocket.connect"}
        while True:
            if self.inbox:
                message, size = self.inbox.pop(0)
                cs.wsconn_consumed(self.h, <size_t>size)
                if message is not None:
                    return message
                code, reason = self.pending_close  # the close, after the messages before it
                self._closed(code, reason)
                continue
            if self.state == _WS_CLOSED:
                return {"type": "websocket.disconnect", "code": self.close_code,
                        "reason": self.close_reason}
            self.waiter = self.lp.loop.create_future()
            await self.waiter
            self.waiter = None

    def send(self, message):
        # As the http scope's send() (asgi.pyx): the work is done when called, and the caller
        # awaits what it returns: the loop's done future, or the future of the queue's drain
        # when the message filled it past its high-water mark. No coroutine per message, but
        # for a call from another thread (cyserve.websocket's blocking send()), which gets a
        # coroutine that takes the message on the loop's thread.
        if PyThread_get_thread_ident() != self.lp.ident:
            return self._send_on_loop(message)
        return self._send(message)

    async def _send_on_loop(self, message):
        await self._send(message)

    cdef object _send(self, message):
        t = message["type"]
        if t == "websocket.send":
            if self.state != _WS_OPEN:
                if self.state == _WS_CLOSED:
                    raise ClientDisconnected("the WebSocket is closed")
                raise RuntimeError("ASGI: websocket.send before websocket.accept")
            text = message.get("text")
            if text is not None:
                data = text.encode("utf-8")
                op = cs.WS_OP_TEXT
            else:
                data = message.get("bytes")
                if data is None:
                    raise RuntimeError("ASGI: websocket.send needs text or bytes")
                data = bytes(data)
                op = cs.WS_OP_BINARY
            rc = cs.wsconn_send(self.h, op, PyBytes_AS_STRING(data), <size_t>len(data))
            if rc == -32:  # EPIPE
                if self.pending_close is not None:
                    code, reason = self.pending_close
                    self._closed(code, reason)
                else:
                    self._closed(1006, "")
                raise ClientDisconnected("the WebSocket is closed")
            if rc < 0:
                raise MemoryError("WebSocket send")
            if rc == 1:
                self.drained = self.lp.loop.create_future()
                return self.drained
            return self.lp.ready
        if t == "websocket.accept":
            if self.state == _WS_CLOSED and not self.denial_started:
                raise ClientDisconnected("the client went away")
            if self.state != _WS_CONNECTING or self.denial_started:
                raise RuntimeError("ASGI: websocket.accept after the handshake was answered")
            self._accept(message)
            return self.lp.ready
        if t == "websocket.close":
            code = int(message.get("code", 1000))
            reason = message.get("reason") or ""
            if self.state == _WS_CONNECTING and not self.denial_started:
                self._deny(403, [], b"")
                return self.lp.ready
            if self.state == _WS_OPEN:
                if not ws_close_code_ok(code):
                    raise RuntimeError(f"ASGI: invalid WebSocket close code {code}")
                rb = reason.encode("utf-8")
                cs.wsconn_close(self.h, code, rb, <size_t>len(rb))
                self.closed_by_app = True
                self._closed(code, reason)
            return self.lp.ready
        if t == "websocket.http.response.start":
            if self.state != _WS_CONNECTING or self.denial_started:
                raise RuntimeError("ASGI: websocket.http.response.start after the handshake "
                                   "was answered")
            self.denial_started = True
            self.denial_status = int(message["status"])
            self.denial_headers = list(message.get("headers") or ())
            self.denial_body = []
            return self.lp.ready
        if t == "websocket.http.response.body":
            if not self.denial_started or self.state != _WS_CONNECTING:
                raise RuntimeError("ASGI: websocket.http.response.body without its start")
            self.denial_body.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                self._deny(self.denial_status, self.denial_headers, b"".join(self.denial_body))
            return self.lp.ready
        raise RuntimeError(f"ASGI: unexpected message {t!r} in the websocket scope")

    cdef int _accept(self, dict message) except -1:
        cdef cs.resp_t *resp = &self.h.resp
        cs.resp_set_switching(resp)
        _add_header(resp, "Upgrade", "websocket")
        _add_header(resp, "Connection", "Upgrade")
        _add_header(resp, "Sec-WebSocket-Accept", self.accept_key)
        sub = message.get("subprotocol")
        if sub is not None:
            _add_header(resp, "Sec-WebSocket-Protocol", str(sub))
        if self.pmd_response is not None:
            _add_header(resp, "Sec-WebSocket-Extensions", self.pmd_response.decode("ascii"))
        for name, value in message.get("headers") or ():
            lname = bytes(name).lower()
            # Extensions are the engine's: it frames the messages, so only what it negotiated
            # may be announced.
            if lname in (b"upgrade", b"connection", b"sec-websocket-accept", b"content-length",
                         b"transfer-encoding", b"date", b"sec-websocket-extensions"):
                continue
            _add_header(resp, bytes(name).decode("latin-1"), bytes(value).decode("latin-1"))
        cdef int rc = cs.wsconn_attach(self.h, _ws_deliver,
                                       &self.pmd if self.pmd_response is not None else NULL)
        if rc == -22:  # EINVAL: a context takeover, which the handshake never answers
            raise ValueError("permessage-deflate with context takeover")
        if rc != 0:
            raise MemoryError("WebSocket channel")
        self.state = _WS_OPEN
        self.accept_key = None  # not needed after the 101
        if cs.handoff_give(self.h, 0) != 0:
            self._closed(1006, "")
        return 0

    cdef void _deny(self, int status, list headers, bytes body) noexcept:
        # An HTTP answer instead of the 101 (the websocket.http.response extension, or 403).
        cdef cs.resp_t *resp = &self.h.resp
        try:
            _check_rc(cs.resp_set_status(resp, status), "status")
            for name, value in headers:
                lname = bytes(name).lower()
                if lname in _ASGI_ENGINE_HEADERS:
                    continue
                if lname == b"content-type":
                    _set_ct(resp, bytes(value))
                    continue
                _add_header(resp, bytes(name).decode("latin-1"),
                            bytes(value).decode("latin-1"))
            if body:
                _set_body(resp, body)
            _add_header(resp, "Connection", "close")
        except BaseException:
            _asgi_log.exception("ASGI WebSocket denial response %s", self.label)
            _answer_500(resp)
        self.state = _WS_CLOSED
        self.close_code = 1006
        self.close_reason = ""
        cs.handoff_give(self.h, 0)
        self._wake()

    async def _run(self, app, scope):
        try:
            await app(scope, self.receive, self.send)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Cancelled by a stop (cyserve.asgi cancels the requests' tasks): going away.
                self._end(1001)
                raise
            _asgi_log.error("Exception in ASGI application %s for WebSocket %s", self.label,
                            scope["raw_path"].decode("latin-1"), exc_info=exc)
            self._end(1011)
            return
        self._end(1000)

    cdef void _end(self, int code) noexcept:
        # The application returned (or raised): a handshake not answered is a 403 (500 after
        # an exception, as uvicorn answers), an open WebSocket is closed with code.
        if self.state == _WS_CONNECTING:
            if self.denial_started:
                self._deny(500, [], b"")
            else:
                self._deny(403 if code == 1000 else 500, [], b"")
        elif self.state == _WS_OPEN:
            cs.wsconn_close(self.h, code, NULL, 0)
            self._closed(code, "")

    def cancel(self):
        self._closed(1001, "")

    def _client_gone(self, _):
        # The client left while the handshake waited for the app's answer.
        self._closed(1006, "")


cdef bint ws_close_code_ok(int code) noexcept:
    return cs.ws_close_code_valid(code) != 0


cdef dict _ws_extensions(dict http_extensions):
    """The websocket scope's extensions: the denial response, and over TLS the connection's TLS
    extension as the http scope has it (the ASGI TLS extension covers both scopes)."""
    cdef dict ext = {"websocket.http.response": {}}
    tls = http_extensions.get("tls")
    if tls is not None:
        ext["tls"] = tls
    return ext


cdef bint _asgi_ws_start(ASGIHandler handler, const cyserve_request *req,
                         cs.resp_t *resp) except -1:
    """The request asks for an upgrade: if it is for a WebSocket, answer a bad handshake or
    start the websocket scope, and return True; False for any other upgrade (served as http)."""
    cdef cs.ws_handshake_t hs
    cdef const cyserve_header *h
    cdef size_t i
    cdef const char *why = NULL
    cdef char accept[28]
    cdef char pmd_out[cs.WS_PMD_RESPONSE_MAX]
    cdef cs.ws_pmd_params_t pmd
    cdef size_t pmd_len = 0
    memset(&hs, 0, sizeof(hs))
    subprotocols = []
    extensions = []
    for i in range(req.num_headers):
        h = &req.headers[i]
        if _name_is(h, "upgrade", 7):
            if cs.ws_token_list_has(h.value.ptr, h.value.len, "websocket"):
                hs.upgrade_websocket = 1
        elif _name_is(h, "connection", 10):
            if cs.ws_token_list_has(h.value.ptr, h.value.len, "upgrade"):
                hs.connection_upgrade = 1
        elif _name_is(h, "sec-websocket-key", 17):
            if hs.key == NULL:
                hs.key = h.value.ptr
                hs.key_len = h.value.len
        elif _name_is(h, "sec-websocket-version", 21):
            if hs.version == NULL:
                hs.version = h.value.ptr
                hs.version_len = h.value.len
        elif _name_is(h, "sec-websocket-protocol", 22):
            v = PyBytes_FromStringAndSize(h.value.ptr, <Py_ssize_t>h.value.len).decode("latin-1")
            subprotocols.extend(p.strip() for p in v.split(",") if p.strip())
        elif _name_is(h, "sec-websocket-extensions", 24):
            extensions.append(PyBytes_FromStringAndSize(h.value.ptr, <Py_ssize_t>h.value.len))
    if not hs.upgrade_websocket:
        return False
    hs.is_get = req.method.len == 3 and memcmp(req.method.ptr, "GET", 3) == 0
    hs.minor_version = req.minor_version
    cdef int status = cs.ws_handshake_check(&hs, &why)
    if status:
        cs.resp_reset(resp)
        cs.resp_set_status(resp, status)
        if status == 426:
            _add_header(resp, "Sec-WebSocket-Version", "13")
            _add_header(resp, "Upgrade", "websocket")
        msg = f"{status} {(<bytes>why).decode()}\n".encode()
        cs.resp_write(resp, PyBytes_AS_STRING(msg), <size_t>len(msg))
        _add_header(resp, "Connection", "close")
        return True
    if cs.ws_accept(hs.key, hs.key_len, accept) != 0:
        raise ValueError("bad Sec-WebSocket-Key")  # checked above: not reached
    scope = handler._scope(req)
    scope["type"] = "websocket"
    scope.pop("method", None)
    scope["scheme"] = "wss" if scope["scheme"] == "https" else "ws"
    scope["asgi"] = _WS_ASGI_VERSION
    scope["subprotocols"] = subprotocols
    scope["extensions"] = _ws_extensions(scope["extensions"])
    cdef _WSExchange ex = _WSExchange.__new__(_WSExchange)
    ex.label = handler._label
    ex.accept_key = PyBytes_FromStringAndSize(accept, 28)
    ex.inbox = []
    ex.close_code = 1006
    ex.close_reason = ""
    ex.pmd_response = None
    if extensions and handler.ws_deflate:
        # permessage-deflate (RFC 7692), the first offer the engine can honour (csrc/ws.h).
        offers = b", ".join(extensions)
        pmd_len = cs.ws_pmd_negotiate(offers, <size_t>len(offers), &pmd, pmd_out)
        if pmd_len:
            # Answered with no context takeover either way, whatever the offer said (RFC 7692
            # 7.1.1.1 and 7.1.1.2 let a server add both): the engine then keeps no zlib stream
            # per connection, it borrows the worker thread's for each message (csrc/ws_zlend.h),
            # so an idle WebSocket costs no window.
            pmd.server_no_context_takeover = 1
            pmd.client_no_context_takeover = 1
            pmd_len = cs.ws_pmd_response(&pmd, pmd_out)
            ex.pmd = pmd
            ex.pmd_response = PyBytes_FromStringAndSize(pmd_out, <Py_ssize_t>pmd_len)
    if cs.handoff_new(&ex.h) != 0:
        raise MemoryError()
    cyserve__producer_enable(<PyObject *>ex)  # for cyserve__producer_get (asgi.pyx)
    ex.h.producer = <void *>ex
    ex.lp = _asgi_here(_tcache())
    _asgi_queue_call(ex.lp, _asgi_ws_spawn, (ex, handler.app, scope))
    cs.resp_set_defer(resp, <void *>ex.h)
    return True


def _asgi_ws_spawn(args):
    ex, app, scope = args
    cdef _ASGILoop lp = (<_WSExchange>ex).lp
    lp.ident = PyThread_get_thread_ident()
    _asgi_keep_task(lp, lp.loop.create_task((<_WSExchange>ex)._run(app, scope)))
