/* server.h: the HTTP/1.1 engine: per-worker listeners, connections, the request loop.
 *
 * Error convention: 0 or -errno. The design is told at the top of server.c (the map of the
 * engine's files) and of each engine file for its part. In short: every
 * worker of the scheduler (sched.h) owns a SO_REUSEPORT listening socket and the connections it
 * accepted; a connection is served by a coroutine only while it has bytes to process, and an idle
 * keep-alive connection holds no coroutine and no stack. The engine knows nothing of Python:
 * Python handlers are an opaque pointer plus a C callback that the Cython layer supplies, run
 * through sched_offload() so that the GIL is taken once per batch by the offload hooks.
 *
 * Threads: server_new/server_add_target/server_start/server_shutdown/server_free run on one
 * control thread (the Python thread that owns the Server object), never on a worker. */
#ifndef CYSERVE_SERVER_H
#define CYSERVE_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "cyserve/handler.h"
#include "http_parse.h"
#include "http1_write.h"
#include "resp.h"
#include "wbuf.h"

struct server;
struct router;
struct files_root;
struct conn_transport;
struct metrics_proc;

enum server_target_kind {
    SERVER_STATIC = 1, /* a response serialised once at startup, served in C */
    SERVER_NOGIL,      /* cyserve_nogil_handler called on the worker thread */
    SERVER_PYTHON,     /* py_call(opaque, req, resp) via sched_offload */
    SERVER_FILES,      /* files_open + sendfile beneath a root */
    SERVER_NOGIL_WS,   /* a WebSocket whose cyserve_ws_handler runs on the worker (ws_nogil.h) */
};

/* What a route points at. The router stores a pointer to it; the caller keeps it alive (and
 * unchanged) until server_free(). Build one with server_target_static() for SERVER_STATIC; fill
 * the fields by hand for the other kinds. */
struct server_target {
    enum server_target_kind kind;
    /* SERVER_STATIC: the HTTP/1 head, kept serialised by the HTTP/1 module (http1_static_head):
     * "HTTP/1.1 <status> <reason>\r\n", the server's fields (struct http_head: Server, unless
     * the user's lines hold one, and the --header lines), "Content-Length: N\r\n", the user's
     * header lines (owned, malloc'd); Date (unless static_no_date), Connection and the final
     * CRLF are added per request, then the body. static_status: the status alone. */
    char *static_head;
    size_t static_head_len;
    int static_status;
    char *static_body;
    size_t static_body_len;
    /* A sealed memfd with the body when it is large (sent by sendfile, no copy per response),
     * else -1. Owned; closed by server_target_clear(). */
    int static_fd;
    /* SERVER_STATIC, set by the caller after server_target_static(): the health path, answered
     * 503 instead once server_fail_health() was called or a stop began. */
    int static_health;
    /* SERVER_STATIC: the server writes no Date field (struct http_head's no_date). */
    int static_no_date;
    /* The route's pattern, NUL-terminated (borrowed like the target; NULL: unnamed): what the
     * metrics region names as the route of a call that runs too long (--worker-timeout). */
    const char *route;
    /* SERVER_NOGIL (and ctx for SERVER_NOGIL_WS) */
    cyserve_nogil_handler fn;
    void *ctx;
    /* SERVER_NOGIL_WS: the callbacks, kept alive by the caller as the target is */
    const cyserve_ws_handler *ws;
    /* Whether fn may run inline, on the worker's loop (http1_inline.c): below
     * INLINE_LEARN, the number of quick calls seen so far; INLINE_LEARN: yes; above: never.
     * Zero when the target is made (zeroed memory). */
    _Atomic unsigned inline_state;
    _Atomic unsigned inline_slow; /* slow calls in a row */
    /* SERVER_PYTHON: called between the offload hooks, on the worker's own stack. It fills resp
     * (status, headers, body); it must not keep req or resp after returning. */
    void (*py_call)(void *opaque, cyserve_request *req, struct cyserve_response *resp);
    /* SERVER_PYTHON, when py_call left resp->stream set: called the same way, between the
     * offload hooks, with op SERVER_STREAM_NEXT to put the next piece of the body into resp's
     * body (returns 1: more follows, 0: that was the end, -1: the handler failed, nothing more
     * can be sent; on 0 and -1 the stream is released), or with op SERVER_STREAM_ABANDON when
     * the engine gives up on it (the client left): release it (returns 0). Never called again
     * for a stream after it was released. */
    int (*py_stream)(void *opaque, void *stream, struct cyserve_response *resp, int op);
    void *opaque;
    /* SERVER_PYTHON whose answer is deferred (handoff.h): a Content-Length body is not read
     * before py_call but piece by piece as the producer asks (handoff_ask_body), each piece
     * read when asked for (an ASGI app's receive()). */
    int stream_body;
    /* SERVER_PYTHON: 1 when py_call reads a large body as a stream (body.h) rather than whole
     * in req->body. */
    int body_stream;
    /* SERVER_PYTHON: what the metrics call its route kind (enum metrics_kind, metrics.h:
     * METRICS_PYTHON, METRICS_WSGI or METRICS_ASGI); 0 counts as METRICS_PYTHON. */
    unsigned metrics_kind;
    /* SERVER_FILES */
    struct files_root *root;
};

enum { SERVER_STREAM_NEXT = 0, SERVER_STREAM_ABANDON = 1 };

/* Fill t as SERVER_STATIC: headers are serialised "Name: value\r\n" lines (the caller checked
 * them; may be NULL/0); fields: those of the server it will serve on (its
 * server_config.head; NULL: http_head_default), baked into the head now. Copies everything.
 * Returns 0, -EINVAL (status outside 200..599), -ENOMEM. Release with server_target_clear(). */
int server_target_static(struct server_target *t, const struct http_head *fields, int status,
                         const char *headers, size_t headers_len, const char *body,
                         size_t body_len);

/* From now on the health path (a target with static_health) answers 503, as it does once a stop
 * begins: a load balancer then takes this server out before its listeners close. Any thread. */
void server_fail_health(struct server *s);

/* Free what server_target_static() allocated; leaves t zeroed. */
void server_target_clear(struct server_target *t);

/* Keep SERVER_NOGIL target t off the inline path: every call runs in a coroutine. Before the
 * server starts. */
void server_target_never_inline(struct server_target *t);

/* A listener beyond the one host and port of struct server_config. */
struct server_listen {
    const char *host; /* TCP: numeric address or name; one SO_REUSEPORT listener per worker */
    int port;         /* TCP: 0 for an ephemeral port (the same for every worker) */
    int fd;           /* -1 for TCP; else a listening stream socket (a Unix socket, one inherited
                       * from systemd) that every worker accepts from. Borrowed: the caller keeps
                       * it open until server_shutdown() returns and closes it itself. The engine
                       * makes it non-blocking and never shuts it down, since other processes
                       * may accept from it too (see listen.c). */
};

/* The access log's line formats (access_log.c). ACCESS_LOG_CUSTOM: the op list
 * server_config.access_log_ops describes. */
enum { ACCESS_LOG_COMMON = 0, ACCESS_LOG_COMBINED = 1, ACCESS_LOG_JSON = 2, ACCESS_LOG_CUSTOM = 3 };

/* One step of a custom access log line: text to copy, or a field of the request (gunicorn's
 * atoms: the letter each stands for is in the comment). */
enum access_log_atom {
    ACCESS_LOG_TEXT,     /* arg[0..arg_len) as it is */
    ACCESS_LOG_HOST,     /* h: the client's address, without its port */
    ACCESS_LOG_DASH,     /* l, u: "-" (no identd, no authenticated user) */
    ACCESS_LOG_TIME,     /* t: "[26/Nov/2026:03:25:03 +0000]" */
    ACCESS_LOG_REQLINE,  /* r: "GET /x?y HTTP/1.1" */
    ACCESS_LOG_METHOD,   /* m */
    ACCESS_LOG_PATH,     /* U: the target without its query */
    ACCESS_LOG_QUERY,    /* q: the query without its '?', "" when none */
    ACCESS_LOG_PROTOCOL, /* H: "HTTP/1.1" */
    ACCESS_LOG_STATUS,   /* s */
    ACCESS_LOG_BYTES,    /* b: body bytes, "-" when unknown */
    ACCESS_LOG_BYTES0,   /* B: body bytes, 0 when unknown */
    ACCESS_LOG_REFERER,  /* f: the Referer, "-" when none */
    ACCESS_LOG_AGENT,    /* a: the User-Agent, "-" when none */
    ACCESS_LOG_SECONDS,  /* T: whole seconds the request took */
    ACCESS_LOG_MILLIS,   /* M: milliseconds */
    ACCESS_LOG_MICROS,   /* D: microseconds */
    ACCESS_LOG_DECIMAL,  /* L: seconds with six decimals */
    ACCESS_LOG_PID,      /* p: "<pid>" */
    ACCESS_LOG_HEADER,   /* {name}i: the request header arg (lower case), "-" when none */
};

struct access_log_op {
    int atom;        /* enum access_log_atom */
    const char *arg; /* ACCESS_LOG_TEXT: the text; ACCESS_LOG_HEADER: the lower-case name */
    size_t arg_len;
};

struct server_config {
    const struct server_listen *listen; /* nlisten listeners (copied by server_new); when
                                         * nlisten is 0, host and port make the only one */
    unsigned nlisten;
    const char *host;           /* numeric address or name, e.g. "127.0.0.1", "::", "localhost" */
    int port;                   /* 0: an ephemeral port, the same for every worker */
    unsigned threads;           /* workers; 0: the CPUs this process may use */
    unsigned blocking_threads;  /* relief threads: how many Python calls may block at once while
                                 * every worker's connections are still served (sched.h) */
    int relief_waiting_only;    /* 1: relieve only calls asleep in the kernel (sched.h's
                                 * relief_waiting_only); the Python layer sets it without a GIL */
    int backlog;                /* listen() backlog per worker */
    int access_log_fd;          /* -1 (default): no access log; else one line per response is
                                 * written to it, each line in one write(2) (see access_log.c) */
    int access_log_format;      /* ACCESS_LOG_COMMON (0, default), _COMBINED, _JSON or _CUSTOM */
    int shared_port;            /* 1: join the SO_REUSEPORT group already on host:port (process
                                 * workers, cyserve/processes.py); 0: fail if the port is taken */
    struct http_limits limits;  /* header block, target, header count */
    uint64_t max_body_bytes;    /* over it: 413 */
    uint64_t keepalive_ns;      /* idle keep-alive connection is closed after this */
    uint64_t header_timeout_ns; /* whole head must arrive within this, from its first byte: 408 */
    uint64_t body_timeout_ns;   /* a body (or a response write) without progress for this: 408 */
    uint64_t body_budget;       /* request body bytes all connections may hold at once while
                                 * bodies arrive; past it, bodies are not read (TCP pushes back)
                                 * until it frees, 503 after body_timeout; 0: no bound */
    uint64_t min_body_rate;     /* bytes/s a body must average once body_timeout has passed since
                                 * it began (Apache's MinRate): slower gets 408; 0: no minimum */
    /* Proxy headers: NULL (default) ignores them; else the peers whose X-Forwarded-For,
     * X-Forwarded-Proto and Forwarded say who the client is (proxy.h's list: addresses, CIDR
     * networks, "*"). The client they name is then the one server_req_peer, server_req_scheme
     * and the access log tell. */
    const char *forwarded_allow_ips;
    int forwarded_header; /* with proxy headers: 0 reads X-Forwarded-For/-Proto, 1 RFC 7239
                           * Forwarded; the other family is ignored (proxy.h) */
    int forwarded_host;   /* with proxy headers: 1 also takes the host they name
                           * (X-Forwarded-Host, Forwarded's host=) as the request's Host field,
                           * which every handler then reads (request_client); 0 (default) never */
    /* The PROXY protocol (proxyproto.h): NULL (default) off; else the peers (proxy.h's list) whose
     * connections must begin with a PROXY protocol header, version 1 or 2, naming the client
     * (conn_proxy_preface); other peers' connections are served as they come. */
    const char *proxy_protocol_from;
    /* ACCESS_LOG_CUSTOM: the steps of each line, compiled once from the format
     * (cyserve/access_log.py). Borrowed: the caller keeps them until server_free(). */
    const struct access_log_op *access_log_ops;
    unsigned access_log_nops;
    /* How accepted connections carry their bytes: NULL (default) plain TCP, else that transport
     * (tls_transport, tls.h) with transport_ctx its shared state (a struct tls_ctx), borrowed:
     * both must outlive the server. */
    const struct conn_transport *transport;
    void *transport_ctx;
    /* HTTP/2 (http2.c): 1 (default) offers h2 by ALPN over TLS and takes h2c by prior knowledge
     * (the client preface) or Upgrade on plain connections; 0 speaks HTTP/1.1 only; 2 speaks
     * HTTP/2 only: ALPN offers h2 alone, and an HTTP/1.1 request (cleartext, or over TLS
     * without ALPN) is answered 505 and closed. */
    int http2;
    /* SETTINGS_MAX_CONCURRENT_STREAMS: the streams one HTTP/2 connection may have open. */
    unsigned http2_max_streams;
    /* Metrics (metrics.h): NULL (default) counts nothing; else this process's slot of a shared
     * region, borrowed (it must outlive the server): each scheduler thread counts into its shard
     * (the first metrics_shards of them; threads beyond count nothing), and a publisher thread
     * copies the gauges, the scheduler's counters and its heartbeat into the slot every
     * METRICS_PUBLISH_MS while the server runs. */
    struct metrics_proc *metrics;
    unsigned metrics_shards;
    /* WebSocket connections (ws_conn.h): a message longer than ws_max_message closes with 1009
     * (0: WSCONN_MAX_MESSAGE); a ping goes out every ws_ping_interval_ns (0: none), and a pong
     * that does not come within ws_ping_timeout_ns of it closes the connection with 1011 (0:
     * never). Zero-initialised: the defaults, no pings. */
    uint64_t ws_max_message;
    uint64_t ws_ping_interval_ns;
    uint64_t ws_ping_timeout_ns;
    /* GIL-free WebSocket routes (ws_nogil.h) take an offered permessage-deflate (RFC 7692);
     * 0 (zero-initialised) leaves offers unanswered. */
    int ws_deflate;
    /* 1 (server_config_default): some route may be answered in the readiness callback
     * (http1_inline.c: a static route, or a GIL-free handler); 0: none can, every route runs
     * in a coroutine (Python handlers, a WSGI or ASGI app, files). The inline path then only
     * reads what arrived and leaves it to the coroutine, instead of parsing and routing each
     * request to find that out, which the coroutine would do again (docs/benchmarks.md,
     * "Session 18"). */
    int inline_routes;
    /* Requests of this server in a handler at once (GIL-free, Python, WSGI, ASGI: static and
     * file answers take no handler and are not counted); one more is answered 503 with
     * Retry-After and the connection closed (request.c). 0 (default): no limit. */
    unsigned limit_concurrency;
    /* The fields written on every answer besides the framing ones (http1_write.h): Server, the
     * --header lines, Date. server_config_default() sets http_head_default; the lines are
     * borrowed (the caller keeps them until server_free()), and the static targets must have
     * been built with the same (server_target_static). */
    struct http_head head;
    /* The supervisor of a worker process: when parent_pid > 0, a thread of the engine
     * (cyserve-parent) checks getppid() every SERVER_PARENT_POLL_MS while the server runs; once
     * it differs (the supervisor died, even by SIGKILL), that thread begins the graceful stop
     * itself (server_shutdown with parent_grace_ns) and ends the process with _exit(1) if it
     * still runs parent_grace_ns + 1 s later. It needs nothing of the process's other threads,
     * so a worker whose Python thread never gets the GIL again (a C call that holds it) ends
     * all the same. 0 (default): no such thread. */
    int parent_pid;
    uint64_t parent_grace_ns;
};

/* How often the cyserve-parent thread looks at getppid() (server_config.parent_pid). */
#define SERVER_PARENT_POLL_MS 100

/* Defaults: keep-alive 5 s, head 10 s, body 10 s, 8 KiB head/target, 100 headers,
 * 1 MiB body, backlog 1024, host 127.0.0.1, port 8000, threads 0, blocking_threads 16, HTTP/2
 * on with 100 concurrent streams. */
void server_config_default(struct server_config *cfg);

/* Create a server over router (borrowed, must outlive the server; its targets are
 * struct server_target *). Copies cfg (host included). Returns 0, -EINVAL, -ENOMEM. */
int server_new(struct server **out, const struct server_config *cfg, const struct router *router);

/* Hooks around each batch of SERVER_PYTHON calls on a worker (the Cython layer takes and releases
 * the GIL there), and one run by each worker and relief thread as it exits (exit_hook, may be
 * NULL: sched_set_offload_exit). Before server_start. */
void server_set_offload_hooks(struct server *s, void (*begin)(void *), void (*end)(void *),
                              void (*exit_hook)(void *), void *ud);

/* Whether those hooks exclude each other (they take the GIL): the workers' and relief threads'
 * Python calls then wait in one queue, taken oldest first by whichever thread holds the GIL
 * (sched_share_offloads). 0 (the default): a queue per thread, as a free-threaded interpreter
 * wants. Before server_start. */
void server_share_offloads(struct server *s, int shared);

/* A call made by server_start once every listener is bound (port: the first TCP listener's, as
 * server_port() will say) and before any worker starts, on the thread that called server_start:
 * what must know the port before the first request can be served (a WSGI environ's
 * SERVER_PORT) is set there, while nothing else runs, instead of being changed under running
 * workers. A negative return (-errno) cancels the start (nothing is left open). Before
 * server_start; NULL for none. */
void server_set_on_bound(struct server *s, int (*fn)(void *ud, int port), void *ud);

/* Bind one listening socket per worker (SO_REUSEPORT, the first one picks the port when port is
 * 0), then start the workers; returns at once. Returns 0; -EADDRINUSE, -EACCES,
 * -EADDRNOTAVAIL, -EINVAL (unknown host: errmsg says so) or another -errno; on error nothing is
 * left open. errmsg (may be NULL) receives a sentence for the user. Control thread. */
int server_start(struct server *s, char *errmsg, size_t errlen);

/* The bound port (after server_start) of the first TCP listener, 0 when there is none. Any
 * thread. */
int server_port(const struct server *s);

/* The bound port of listener i (in cfg.listen's order) after server_start; 0 for a shared
 * descriptor; -EINVAL when there is no listener i. Any thread. */
int server_listen_port(const struct server *s, unsigned i);

/* Whether the workers are running (started and not yet shut down). Any thread. */
int server_running(const struct server *s);

/* Graceful shutdown: stop accepting, close idle connections at once, let in-flight requests
 * finish (they are answered with Connection: close) for up to grace_ns, then cancel the rest and
 * join the workers. Blocks; idempotent; a concurrent second call only shortens the grace period
 * and waits for the first. Returns 0, or -EDEADLK on a worker thread (a handler cannot stop its
 * own server). Control thread. */
int server_shutdown(struct server *s, uint64_t grace_ns);

/* A descriptor that becomes readable (POLLIN) once server_shutdown has stopped the workers,
 * whoever called it (the supervisor's watcher, another thread), after server_running turns 0,
 * and stays readable: a thread waits for the server to stop by polling it with no timeout, with
 * nothing to wake it before. Never read it or close it; server_free closes it. Any thread. */
int server_stopped_fd(const struct server *s);

/* Free a server that is not running (never started, or shut down). */
void server_free(struct server *s);

/* Live connections (accepted, not yet closed), for tests. Any thread. */
uint64_t server_live_connections(const struct server *s);

/* Counters, totals over the workers and over every run since server_new (what a stopped run
 * counted is kept); approximate while the server runs. Any thread, also while another one
 * starts or stops the server (a lock orders it against them). */
struct server_stats {
    uint64_t live;      /* open connections */
    uint64_t inline_ok; /* requests answered on the inline path, without a coroutine */
    uint64_t requests;  /* requests answered (inline or not; error answers to a parsed head too) */
    uint64_t spawned;   /* coroutines spawned (connections served, accept rounds) */
};
void server_get_stats(struct server *s, struct server_stats *out);

/* ---- the request API behind cyserve._core's nogil functions ---- */

/* Find header name[0..nlen) (case-insensitive) in req; 0 and *out set to the first match, or
 * -ENOENT. Any thread (req is the caller's). */
int server_req_header(const cyserve_request *req, const char *name, size_t nlen, cyserve_str *out);

/* After server_shutdown(): take one stream a stop cut short before its handler could release
 * it (the stop refuses offloaded calls). 1 and *t, *stream set (release it with t->py_stream,
 * op SERVER_STREAM_ABANDON, resp NULL), or 0 when none is left. Any thread. */
int server_take_orphan(struct server *s, const struct server_target **t, void **stream);

/* The client's address of req's connection as "host:port" ("[v6]:port" for IPv6), NUL-ended
 * (with proxy headers on and a trusted peer, the client its headers name, "host:0"):
 * 0 and *out set, owned by the connection and valid until the handler returns; -ENOTCONN when
 * it is unknown (the socket is gone, or req was not made by a coroutine's serve loop). The
 * handler's thread only (the first call per connection makes it: getpeername, malloc). */
int server_req_peer(const cyserve_request *req, const char **out);

/* The scheme req was made with, "http" or "https": "http" unless a trusted proxy says "https"
 * (server_config.forwarded_allow_ips). Static storage. The handler's thread only. */
const char *server_req_scheme(const cyserve_request *req);
/* 1 when req came over TLS (its connection's transport is not plain TCP), else 0. The thread
 * serving req. */
int server_req_tls(const cyserve_request *req);

/* server_req_conn's flags: what server_req_tls, server_req_http2 and server_req_scheme say. */
enum {
    SERVER_REQ_TLS = 1,   /* server_req_tls */
    SERVER_REQ_HTTP2 = 2, /* server_req_http2 */
    SERVER_REQ_HTTPS = 4, /* server_req_scheme is "https" */
};
/* The connection's facts a WSGI environ reads, in one call rather than four (each looked the
 * request up again, and the scheme and the peer each called request_client): the flags above,
 * and *peer as server_req_peer gives it (NULL where that fails). The handler's thread only. */
unsigned server_req_conn(const cyserve_request *req, const char **peer);
/* The TLS session req came over (tls.h: struct tls_info, tls_conn_info): 0, or -ENOTCONN when
 * it is not TLS. The thread serving req. */
struct tls_info;
int server_req_tls_info(const cyserve_request *req, struct tls_info *out);
/* A text of that session (tls.h: TLS_TEXT_*, tls_conn_text) in a malloc'd buffer the caller
 * frees: 0, -ENOENT, -ENOTCONN or -ENOMEM. The thread serving req. */
int server_req_tls_text(const cyserve_request *req, int what, char **out, size_t *len);
/* 1 when req came over HTTP/2 (a stream of an HTTP/2 connection), else 0. The thread serving
 * req. */
int server_req_http2(const cyserve_request *req);

/* The body bytes of req still to come piece by piece (handoff_ask_body), or 0 when its body,
 * if any, is in req->body. The thread serving req. */
uint64_t server_req_body_pending(const cyserve_request *req);

#endif
