# cython: language_level=3
# Extern declarations of csrc/server.h and csrc/resp.h, for the native/*.pyx of the HTTP engine
# (http_api, python_handler, wsgi, server_type). Compiled into cyserve._core only (the C symbols
# live there). Contracts: see the headers.
#
# The public types (cyserve_request, cyserve_response) are declared here again under _t names so
# that this file does not depend on _core.pxd; the .pyx files cast between the two spellings, which
# name the same C types.
from libc.stdint cimport uint64_t, int64_t

from cyserve.native.includes.http_parse cimport http_limits
from cyserve.native.includes.router cimport router_t, files_root_t

cdef extern from "cyserve/handler.h" nogil:
    ctypedef struct req_t "cyserve_request":
        pass
    ctypedef struct resp_t "cyserve_response":
        pass
    ctypedef struct ws_handler_t "cyserve_ws_handler":
        pass

# Function pointer types of struct server_target's fields (Cython-side names; the C fields are
# cyserve_nogil_handler and an unnamed pointer type of the same signature).
ctypedef int (*nogil_fn_t)(req_t *req, resp_t *resp, void *ctx) noexcept nogil
ctypedef void (*py_call_t)(void *opaque, req_t *req, resp_t *resp) noexcept nogil
ctypedef int (*py_stream_t)(void *opaque, void *stream, resp_t *resp, int op) noexcept nogil

cdef extern from "csrc/resp.h" nogil:
    struct resp_lease_list:
        pass
    struct resp_lease:
        resp_lease *next
        void *owner
    resp_lease *resp_lease_new(void *owner, resp_lease_list *back)
    int resp_lease_pending(resp_lease_list *l)
    resp_lease *resp_lease_take_all(resp_lease_list *l)
    void resp_lease_free(resp_lease *lease)
    int resp_set_body_lent(resp_t *r, const void *data, size_t len, resp_lease *lease)
    int resp_set_body_file(resp_t *r, int fd, uint64_t offset, uint64_t len)
    void resp_init(resp_t *r)
    void resp_reset(resp_t *r)
    void resp_free(resp_t *r)
    int resp_set_status(resp_t *r, int status)
    void resp_set_switching(resp_t *r)
    int resp_add_header(resp_t *r, const char *name, size_t nlen, const char *value, size_t vlen)
    int resp_add_trailer(resp_t *r, const char *name, size_t nlen, const char *value, size_t vlen)
    int resp_set_reason(resp_t *r, const char *reason, size_t len)
    int resp_set_content_type(resp_t *r, const char *value, size_t vlen)
    int resp_write(resp_t *r, const void *data, size_t len)
    int resp_set_body_static(resp_t *r, const void *data, size_t len)
    int resp_set_head_length(resp_t *r, int64_t n)
    int resp_set_stream(resp_t *r, void *stream, int64_t length)
    int RESP_LENGTH_UNKNOWN
    void *resp_alloc(resp_t *r, size_t size)

cdef extern from "csrc/metrics.h" nogil:
    ctypedef struct metrics_proc_t "struct metrics_proc":
        int64_t pid
        uint64_t beat_ns
        uint64_t stuck_ns
    ctypedef struct metrics_region_t "struct metrics_region":
        unsigned nprocs
        unsigned nshards
    ctypedef struct metrics_listener_t "struct metrics_listener":
        pass
    enum:
        METRICS_PYTHON
        METRICS_WSGI
        METRICS_ASGI
        METRICS_TEXT_MAX
    int metrics_region_new(metrics_region_t **out, unsigned nprocs, unsigned nshards)
    void metrics_region_free(metrics_region_t *r)
    metrics_proc_t *metrics_proc_at(metrics_region_t *r, unsigned i)
    int metrics_claim(metrics_region_t *r, int pid)
    void metrics_retire(metrics_region_t *r, unsigned i)
    size_t metrics_get_route(const metrics_proc_t *p, char *out, size_t cap)
    ssize_t metrics_format(metrics_region_t *r, char *buf, size_t cap)
    int metrics_listen_start(metrics_listener_t **out, metrics_region_t *r, int fd)
    void metrics_listen_stop(metrics_listener_t *l)

cdef extern from "csrc/server.h" nogil:
    enum:
        ACCESS_LOG_COMMON
        ACCESS_LOG_COMBINED
        ACCESS_LOG_JSON
        ACCESS_LOG_CUSTOM
    enum:
        ACCESS_LOG_TEXT
        ACCESS_LOG_HOST
        ACCESS_LOG_DASH
        ACCESS_LOG_TIME
        ACCESS_LOG_REQLINE
        ACCESS_LOG_METHOD
        ACCESS_LOG_PATH
        ACCESS_LOG_QUERY
        ACCESS_LOG_PROTOCOL
        ACCESS_LOG_STATUS
        ACCESS_LOG_BYTES
        ACCESS_LOG_BYTES0
        ACCESS_LOG_REFERER
        ACCESS_LOG_AGENT
        ACCESS_LOG_SECONDS
        ACCESS_LOG_MILLIS
        ACCESS_LOG_MICROS
        ACCESS_LOG_DECIMAL
        ACCESS_LOG_PID
        ACCESS_LOG_HEADER
    ctypedef struct access_log_op_t "struct access_log_op":
        int atom
        const char *arg
        size_t arg_len
    ctypedef struct server_t "struct server":
        pass

    enum:
        SERVER_STREAM_NEXT
        SERVER_STREAM_ABANDON

    enum server_target_kind:
        SERVER_STATIC
        SERVER_NOGIL
        SERVER_PYTHON
        SERVER_FILES
        SERVER_NOGIL_WS

    ctypedef struct http_head_t "struct http_head":
        const char *lines
        size_t len
        size_t server_len
        int no_date

    ctypedef struct server_target_t "struct server_target":
        server_target_kind kind
        nogil_fn_t fn
        void *ctx
        const ws_handler_t *ws
        py_call_t py_call
        py_stream_t py_stream
        void *opaque
        int stream_body
        int body_stream
        int static_health
        const char *route
        unsigned metrics_kind
        files_root_t *root

    ctypedef struct server_listen_t "struct server_listen":
        const char *host
        int port
        int fd

    ctypedef struct server_config_t "struct server_config":
        const server_listen_t *listen
        unsigned nlisten
        const char *host
        int port
        unsigned threads
        unsigned blocking_threads
        int relief_waiting_only
        uint64_t body_budget
        uint64_t min_body_rate
        int backlog
        int access_log_fd
        int access_log_format
        const access_log_op_t *access_log_ops
        unsigned access_log_nops
        int shared_port
        http_limits limits
        uint64_t max_body_bytes
        uint64_t keepalive_ns
        uint64_t header_timeout_ns
        uint64_t body_timeout_ns
        const char *forwarded_allow_ips
        int forwarded_header
        int forwarded_host
        const char *proxy_protocol_from
        const void *transport
        void *transport_ctx
        int http2
        unsigned http2_max_streams
        unsigned limit_concurrency
        int parent_pid
        uint64_t parent_grace_ns
        metrics_proc_t *metrics
        unsigned metrics_shards
        uint64_t ws_max_message
        uint64_t ws_ping_interval_ns
        uint64_t ws_ping_timeout_ns
        int ws_deflate
        int inline_routes
        http_head_t head

    void server_fail_health(server_t *s)
    void http_head_init(http_head_t *h, const char *lines, size_t len, size_t server_len,
                        int no_date)
    int server_target_static(server_target_t *t, const http_head_t *head, int status,
                             const char *headers,
                             size_t headers_len, const char *body, size_t body_len)
    void server_target_clear(server_target_t *t)
    void server_target_never_inline(server_target_t *t)
    void server_config_default(server_config_t *cfg)
    int server_new(server_t **out, const server_config_t *cfg, const router_t *router)
    void server_set_offload_hooks(server_t *s, void (*begin)(void *) noexcept nogil,
                                  void (*end)(void *) noexcept nogil,
                                  void (*exit_hook)(void *) noexcept nogil, void *ud)
    void server_share_offloads(server_t *s, int shared)
    void server_set_on_bound(server_t *s, int (*fn)(void *ud, int port) noexcept nogil,
                             void *ud)
    int server_start(server_t *s, char *errmsg, size_t errlen)
    int server_port(const server_t *s)
    int server_listen_port(const server_t *s, unsigned i)
    int server_running(const server_t *s)
    int server_stopped_fd(const server_t *s)
    int server_shutdown(server_t *s, uint64_t grace_ns)
    void server_free(server_t *s)
    uint64_t server_live_connections(const server_t *s)
    ctypedef struct server_stats_t "struct server_stats":
        uint64_t live
        uint64_t inline_ok
        uint64_t requests
        uint64_t spawned
    void server_get_stats(server_t *s, server_stats_t *out)
    int server_req_header(const req_t *req, const char *name, size_t nlen, void *out)
    int server_req_peer(const req_t *req, const char **out)
    int server_req_tls(const req_t *req)
    uint64_t server_req_body_pending(const req_t *req)
    int server_req_http2(const req_t *req)
    const char *server_req_scheme(const req_t *req)
    enum:
        SERVER_REQ_TLS
        SERVER_REQ_HTTP2
        SERVER_REQ_HTTPS
    unsigned server_req_conn(const req_t *req, const char **peer)
    int server_take_orphan(server_t *s, const server_target_t **t, void **stream)

cdef extern from "csrc/resp.h" nogil:
    int resp_set_defer(resp_t *r, void *h)

cdef extern from "csrc/body.h" nogil:
    ctypedef struct body_reader_t "struct body_reader":
        int64_t length
        uint64_t taken
    body_reader_t *body_of(const req_t *req)
    Py_ssize_t body_read(body_reader_t *br, void *dst, size_t n, int line)
    int body_error_status(const body_reader_t *br, const char **reason)

cdef extern from "csrc/handoff.h" nogil:
    ctypedef struct handoff_t "struct handoff":
        resp_t resp
        void *producer
    int handoff_new(handoff_t **out)
    void handoff_release(handoff_t *h)
    int handoff_give(handoff_t *h, int more)
    int handoff_gone(const handoff_t *h)
    int handoff_ask_body(handoff_t *h, void (*cb)(handoff_t *h, const char *data, size_t n,
                                                  int more) noexcept)

cdef extern from "csrc/ws.h" nogil:
    enum:
        WS_OP_TEXT
        WS_OP_BINARY
        WS_CLOSE_NO_STATUS
        WS_ACCEPT_LEN
    ctypedef struct ws_handshake_t "struct ws_handshake":
        int is_get
        int minor_version
        int connection_upgrade
        int upgrade_websocket
        const char *key
        size_t key_len
        const char *version
        size_t version_len
    int ws_handshake_check(const ws_handshake_t *h, const char **why)
    int ws_accept(const char *key, size_t key_len, char *out)
    int ws_token_list_has(const char *v, size_t n, const char *tok)
    int ws_close_code_valid(int code)
    ctypedef struct ws_pmd_params_t "struct ws_pmd_params":
        int server_no_context_takeover
        int client_no_context_takeover
        int server_max_window_bits
    enum:
        WS_PMD_RESPONSE_MAX
    size_t ws_pmd_negotiate(const char *v, size_t n, ws_pmd_params_t *p, char *out)
    size_t ws_pmd_response(const ws_pmd_params_t *p, char *out)

cdef extern from "csrc/ws_conn.h" nogil:
    enum:
        WSCONN_EV_TEXT
        WSCONN_EV_BINARY
        WSCONN_EV_CLOSED
        WSCONN_EV_DRAINED
    ctypedef void (*wsconn_deliver_fn)(handoff_t *h, int event, const char *data, size_t len,
                                       int code) noexcept
    int wsconn_attach(handoff_t *h, wsconn_deliver_fn deliver, const ws_pmd_params_t *pmd)
    void wsconn_consumed(handoff_t *h, size_t n)
    int wsconn_send(handoff_t *h, int opcode, const char *p, size_t n)
    int wsconn_close(handoff_t *h, int code, const char *reason, size_t n)

cdef extern from "csrc/ws_nogil.h" nogil:
    ctypedef struct wsn_t "struct wsn":
        pass
    int wsn_send(wsn_t *w, int opcode, const char *p, size_t n)
    int wsn_close(wsn_t *w, int code, const char *reason, size_t n)
    void wsn_set_data(wsn_t *w, void *data)
    void *wsn_data(wsn_t *w)


cdef extern from "csrc/tls.h" nogil:
    ctypedef struct tls_ctx_t "struct tls_ctx":
        pass
    ctypedef struct tls_sni_option_t "struct tls_sni_option":
        const char *name
        const char *certfile
        const char *keyfile
    ctypedef struct tls_options_t "struct tls_options":
        const char *certfile
        const char *keyfile
        const char *password
        const char *ciphers
        const char *ca_certs
        int cert_reqs
        int http2
        const tls_sni_option_t *sni
        size_t nsni
        const char *ocsp_file
        unsigned ticket_period_s
    ctypedef struct tls_info_t "struct tls_info":
        int version
        const char *version_name
        int cipher
        const char *cipher_name
        int peer_cert
        long verify
        const char *verify_text
        const char *server_name
    enum:
        TLS_TEXT_SERVER_CERT
        TLS_TEXT_PEER_CHAIN
        TLS_TEXT_PEER_NAME
    int tls_ctx_new(const tls_options_t *o, tls_ctx_t **out, char *err, size_t errlen)
    int tls_ctx_reload(tls_ctx_t *t, const tls_options_t *o, char *err, size_t errlen)
    void tls_ctx_rotate_ticket_keys(tls_ctx_t *t)
    int tls_kernel_tls()
    void tls_ctx_free(tls_ctx_t *t)
    # Declared in server.h (made in tls.c).
    int server_req_tls_info(const req_t *req, tls_info_t *out)
    int server_req_tls_text(const req_t *req, int what, char **out, size_t *len)
    const void *tls_transport_ptr "(const void *)&tls_transport"
