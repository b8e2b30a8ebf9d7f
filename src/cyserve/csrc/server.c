/* server.c: the HTTP/1.1 engine.
 *
 * Design
 * ------
 * Workers. The scheduler (sched.h) runs N worker threads. The control thread binds N listening
 * sockets with SO_REUSEPORT before the workers start (so a port in use is reported at once, and
 * port 0 resolves to one port for all of them); each worker's start hook registers its own
 * listener in its own epoll (sched_io_add). The kernel spreads new connections over the
 * listeners by hash, so accepting needs no lock and no cross-thread hand-off. This is lwan's and
 * nginx's reuseport layout.
 *
 * Accepting. A listener's readiness calls listener_on_ready() on its worker, which spawns a short
 * accept coroutine: accept4() until EAGAIN (in batches of ACCEPT_BATCH, yielding between
 * batches so one flood of connections cannot starve the requests of this worker), register each
 * connection edge-triggered on the worker that runs the accept (it becomes the connection's
 * home), then sched_io_release() the listener so that its next readiness calls on_ready again.
 *
 * Connections. A connection is a struct conn: its sched_io, a read buffer taken from a
 * per-worker cache only while it has bytes to hold, a lazy idle timer, and list links. When an
 * idle connection becomes readable, conn_on_ready() (on the home worker, not in a coroutine)
 * marks it busy and first tries the inline path (below: a lone request whose answer needs
 * nothing that can wait is answered right there), else spawns conn_serve(). The coroutine reads,
 * parses, dispatches and writes; pipelined requests are parsed from the buffer before reading
 * again, and their responses are batched in one output buffer, flushed when nothing complete is
 * left to parse. When the buffer is empty and the last read was short (the socket is drained, so
 * no read is spent on EAGAIN), the coroutine calls sched_io_release(): if readable readiness
 * arrived meanwhile it keeps serving, otherwise the connection is idle again and the coroutine
 * ends. An idle keep-alive connection therefore holds no coroutine, no stack and no buffer: only
 * its struct. That is the "1,000 idle connections" requirement.
 *
 * Ownership. Everything about a connection that outlives a request (its list links, busy flag,
 * idle_since, timer) is home state: it is touched only with the home worker's loop lock held
 * (sched.h, "home sections"). on_ready and timer callbacks run with it (on the home worker, or on
 * an idle worker rescuing a home stuck in a long handler); the serving coroutine gets it from
 * sched_io_release() returning 0 (conn_go_idle runs inside that home section) or from
 * sched_io_del() (conn_destroy); the acceptor takes its own worker's with sched_home_enter()
 * around conn_open(). The per-worker caches of buffers and connection structs are per thread
 * instead: each is touched only by the worker thread it belongs to (current_worker()), whatever
 * connection the memory comes from or goes to. The fields used while serving (buffer, lengths)
 * are touched only by the one coroutine serving the connection, wherever it runs; on_ready never
 * spawns a second coroutine for a busy connection because sched only calls on_ready for an idle
 * sched_io. The only other cross-thread state is in struct server: the draining flag and the
 * live connection counter, both atomics.
 *
 * Timeouts. The head of a request must be complete within header_timeout of the moment its first
 * bytes were seen (absolute deadline, so a slowloris sending a byte a second is cut). A body, and
 * a response write, must make progress every body_timeout (relative deadline renewed on each
 * read or write that moves bytes, so a slow but steady upload is never cut; for a write, bytes
 * leaving the socket's send queue count too, see conn_wait_writable). The idle keep-alive
 * timer is lazy: it is armed once when the connection first goes idle and, when it fires, either
 * closes the connection, re-arms itself for the remaining time (the connection was busy in
 * between) or does nothing (the connection is busy now; it re-arms when it goes idle). So the
 * hot path of a keep-alive request neither cancels nor re-arms a timer.
 *
 * Shutdown (server_shutdown). 1. Set the draining flag: every coroutine answers its current
 * request with Connection: close and closes. 2. Wake every worker through its control eventfd;
 * on the worker, ctl_on_ready() shuts the listener down (shutdown(SHUT_RD): no new connections,
 * accept fails) and arms a zero-delay timer that closes every idle connection in the same loop
 * turn (from the timer pass, never from inside the event batch) unless its next request has
 * already arrived: that one is answered with Connection: close, as is one a coroutine finds in
 * its socket when it would otherwise close (one non-blocking read, nothing waited for). 3. Wait up to grace for the live
 * connection count to reach zero. 4. sched_stop() cancels what is left and the workers are
 * joined. 5. With no worker running, close the listeners and free every connection.
 *
 * Not done on purpose: no per-request heap allocation on the static and nogil paths (the
 * response builder starts in inline storage, the serving state lives on the coroutine's stack);
 * no Python anywhere in this file. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <linux/sockios.h> /* SIOCOUTQ */
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h> /* __rdtsc, for timing inline handlers */
#endif

#include "compat.h"
#include "coro.h"
#include "files.h"
#include "router.h"
#include "sched.h"

/* Connections accepted before the accept coroutine yields to the requests of its worker. */
#define ACCEPT_BATCH 64
/* Read buffer of a connection; grown (up to the limits) only for large heads and bodies. 4 KiB
 * holds any benchmark request and most browser requests. */
#define CONN_BUF_INITIAL 4096
/* Output buffer kept in the serving state; responses of pipelined requests accumulate in it. */
#define OUT_INLINE 4096
#define OUT_FLUSH_AT 16384

/* The two system calls of a keep-alive request, made directly. glibc's read/recv/send/sendmsg
 * are cancellation points whose wrappers toggle asynchronous cancellation around the call, and
 * cyserve never cancels a thread; the kernel's read path (vfs_read, fdget_pos, sock_read_iter)
 * and sendmsg's msghdr and iovec copies are work that recvfrom and sendto skip. Together ~3% of
 * the CPU time per /plaintext request in a profile; measured: +1.4% (static) and +2.0% (nogil)
 * requests per server CPU-second (bench/micro/plaintext_floor.py, 5 interleaved rounds, medians).
 * Under ASan or TSan the libc calls stay, so that the sanitizers' interceptors still check and
 * annotate the buffers. Both return the byte count or -1 with errno set, like the libc calls. */
static inline ssize_t sock_recv(int fd, void *buf, size_t len)
{
#if defined(CYSERVE_ASAN) || defined(CYSERVE_TSAN)
    return recv(fd, buf, len, 0);
#else
    return syscall(SYS_recvfrom, fd, buf, len, 0, NULL, NULL);
#endif
}

/* An absolute-form target may have an empty path ("GET http://a HTTP/1.1"); RFC 9110 4.2.3 makes
 * it "/". The parser leaves it empty so that its views stay inside the buffer. */
static inline void empty_path_is_root(struct http_request *req)
{
    if (UNLIKELY(req->path_len == 0)) {
        req->path = "/";
        req->path_len = 1;
    }
}

/* Whether a byte waits to be read: > 0 yes, 0 end of stream, < 0 nothing (or an error). */
static ssize_t sock_recv_peek(int fd, char *b)
{
    return recv(fd, b, 1, MSG_PEEK | MSG_DONTWAIT);
}

static inline ssize_t sock_send(int fd, const void *buf, size_t len, int flags)
{
#if defined(CYSERVE_ASAN) || defined(CYSERVE_TSAN)
    return send(fd, buf, len, flags);
#else
    return syscall(SYS_sendto, fd, buf, len, flags, NULL, 0);
#endif
}

/* Bodies up to this size are copied behind the head (one write); larger ones go out by writev
 * without a copy. */
#define BODY_COPY_MAX 16384
/* Static bodies larger than this are kept in a sealed memfd and sent with sendfile(): the kernel
 * then hands the page-cache pages to the socket instead of copying the body from user memory on
 * every response (on /transfer, 133 KiB, that copy, _copy_from_iter, was 18% of the server's
 * CPU in perf). Smaller ones stay on the copy path above: one write per batch of pipelined
 * responses, where sendfile would cost a second syscall per response. Same value as
 * BODY_COPY_MAX, so every static body is either copied into the output buffer or never copied at
 * all. Measured just above it (server on one CPU, wrk -c64 on another, requests per server
 * CPU-second, medians of 3): 17,000 bytes 175k by writev, 184k by sendfile; 64 KiB 103k vs
 * 119k; 133,622 bytes 24k vs 80k. So sendfile already wins at the threshold; whether it would
 * below it was not measured. */
#define STATIC_MEMFD_MIN BODY_COPY_MAX
/* Distinct large handler bodies (resp_set_body_static) that get a memfd of their own; any more
 * are sent by writev from the handler's memory. */
#define EXT_MEMFD_MAX 64
/* Per-worker caches of free read buffers and connection structs. */
#define BUF_CACHE_MAX 64
#define CONN_CACHE_MAX 1024
/* Header slots that live in the serving state; a larger configured max_headers uses the arena. */
#define INLINE_HEADERS 100
/* Lingering close after an error response: the client's unread bytes would make close() send a
 * RST that can destroy our response before the client reads it, so read and discard for a
 * little while first. */
#define LINGER_NS (500ull * 1000 * 1000)
#define LINGER_MAX_BYTES (1u << 20)

struct server_worker;
struct conn;

/* What speaks on a connection: HTTP/1.1 today (http1_proto). A protocol that takes a
 * connection over (WebSocket after an Upgrade) swaps c->proto and c->proto_data from its
 * coroutine. There is no on_writable: sched reports only the readable readiness of an idle
 * connection, and a protocol that must wait to write does so in its coroutine
 * (conn_wait_writable), as every write of HTTP/1 does. */
struct conn_proto {
    /* The idle connection is readable (or hung up: events says which). Home's loop lock held,
     * not in a coroutine; c->busy is set. Serve it inline, or spawn a coroutine; either way the
     * connection ends idle again (sched_io_idle / sched_io_release) or destroyed. */
    void (*on_readable)(struct conn *c, uint32_t events);
    /* The keep-alive timer expired on the idle connection. Home's loop lock held. */
    void (*on_timeout)(struct conn *c);
    /* c is being destroyed: free c->proto_data. May be NULL. Home's loop lock held, or no
     * worker runs any more. */
    void (*close)(struct conn *c);
};

/* How bytes cross a connection: plain sockets today (conn_plain); a TLS transport slides in
 * under the same calls. Each returns bytes moved (recv: 0 at end of stream) or -errno; -EAGAIN
 * when the socket would block, after which the caller waits on c->io. Called from the coroutine
 * that serves c. The plain transport is called directly, not through these pointers (see
 * conn_tp_recv). */
struct conn_transport {
    ssize_t (*recv)(struct conn *c, void *buf, size_t len);
    /* flags: 0 or MSG_MORE (more of the same answer follows at once). */
    ssize_t (*sendv)(struct conn *c, struct iovec *iov, int cnt, int flags);
    /* count bytes of file fd from *off, which it advances. */
    ssize_t (*sendfile)(struct conn *c, int fd, off_t *off, size_t count);
    /* shutdown(2)'s how. 0 or -errno. */
    int (*shutdown)(struct conn *c, int how);
};

struct conn {
    struct sched_io io;          /* io.data == this; io.fd is the socket */
    const struct conn_proto *proto;
    void *proto_data;            /* the protocol's, NULL for HTTP/1 */
    const struct conn_transport *tp;
    struct server_worker *home;  /* the worker whose epoll holds io */
    struct conn *prev, *next;    /* home->conns; home worker only */
    struct sched_timer idle;     /* lazy keep-alive timer; home worker only */
    uint64_t idle_since;         /* sched_now_ns() when it last went idle */
    char *buf;                   /* read buffer, NULL while idle */
    size_t cap, len;             /* buf size, bytes held */
    size_t pend;                 /* buf[0..pend): the unsent rest of an inline answer */
    int pend_close;              /* ... after which the connection closes */
    int drained;                 /* the last read was short: nothing more to read */
    int busy;                    /* a coroutine serves it (or is about to); home worker only */
    int timer_armed;             /* idle is armed; home worker only */
    char *peer;                  /* "address:port" for the access log, made on its first line */
};

/* ---- the plain transport ---- */

static ssize_t plain_recv(struct conn *c, void *buf, size_t len)
{
    ssize_t n = sock_recv(c->io.fd, buf, len);
    return n < 0 ? -errno : n;
}

static ssize_t plain_sendv(struct conn *c, struct iovec *iov, int cnt, int flags)
{
    /* MSG_NOSIGNAL: a client that went away must not kill the process with SIGPIPE. */
    ssize_t n;
    if (cnt == 1) {
        n = sock_send(c->io.fd, iov->iov_base, iov->iov_len, MSG_NOSIGNAL | flags);
    } else {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        n = sendmsg(c->io.fd, &mh, MSG_NOSIGNAL | flags);
    }
    return n < 0 ? -errno : n;
}

static ssize_t plain_sendfile(struct conn *c, int fd, off_t *off, size_t count)
{
    ssize_t n = sendfile(c->io.fd, fd, off, count);
    return n < 0 ? -errno : n;
}

static int plain_shutdown(struct conn *c, int how)
{
    return shutdown(c->io.fd, how) < 0 ? -errno : 0;
}

static const struct conn_transport conn_plain = {plain_recv, plain_sendv, plain_sendfile,
                                                 plain_shutdown};

/* The transport calls of the serving coroutine. The plain transport is tested for and called
 * directly, so that a plain connection pays a compare, not an indirect call, per system call. */
static inline ssize_t conn_tp_recv(struct conn *c, void *buf, size_t len)
{
    if (LIKELY(c->tp == &conn_plain))
        return plain_recv(c, buf, len);
    return c->tp->recv(c, buf, len);
}

static inline ssize_t conn_tp_sendv(struct conn *c, struct iovec *iov, int cnt, int flags)
{
    if (LIKELY(c->tp == &conn_plain))
        return plain_sendv(c, iov, cnt, flags);
    return c->tp->sendv(c, iov, cnt, flags);
}

static inline ssize_t conn_tp_sendfile(struct conn *c, int fd, off_t *off, size_t count)
{
    if (LIKELY(c->tp == &conn_plain))
        return plain_sendfile(c, fd, off, count);
    return c->tp->sendfile(c, fd, off, count);
}

static inline int conn_tp_shutdown(struct conn *c, int how)
{
    if (LIKELY(c->tp == &conn_plain))
        return plain_shutdown(c, how);
    return c->tp->shutdown(c, how);
}

/* Per worker: the listener, the control eventfd and the list of connections homed here are home
 * state (under the worker's loop lock); the caches are per thread (touched only by the worker's
 * own thread, see current_worker()). */
struct server_worker {
    struct server *srv;
    unsigned id;
    int lfd;                  /* listening socket, opened by the control thread */
    struct sched_io lio;
    int lio_added;
    int ctl_fd;               /* eventfd written by server_shutdown */
    struct sched_io ctl_io;
    int ctl_added;
    struct sched_timer ctl_timer; /* closes the idle connections once shutdown begins */
    struct conn *conns;       /* every live connection homed here */
    struct conn *free_conns;  /* cache, linked through next */
    unsigned nfree_conns;
    char *free_bufs[BUF_CACHE_MAX];
    unsigned nfree_bufs;
    _Atomic uint64_t inline_ok; /* requests answered inline by this thread */
} CACHE_ALIGNED;

struct server {
    struct server_config cfg;
    char *host;
    const struct router *router;
    struct sched *sched;
    struct server_worker *workers;
    unsigned nworkers;
    int port;
    void (*off_begin)(void *);
    void (*off_end)(void *);
    void *off_ud;
    _Atomic int running;
    _Atomic int draining;
    _Atomic uint64_t live;
    _Atomic int stopping;            /* a server_shutdown is in progress or done */
    _Atomic uint64_t stop_deadline;  /* when the grace period of the shutdown ends */
    /* memfds of large process-lifetime handler bodies, see ext_memfd_for(). Entries
     * [0, ext_count) are immutable once published; ext_lock serialises the writers. */
    pthread_mutex_t ext_lock;
    /* stats_lock: server_get_stats (any thread, e.g. Python's while stop() runs on another)
     * against start and teardown, which publish and free sched and workers under it. The
     * counters of runs that ended are kept, so that stats() after stop() still tells. */
    pthread_mutex_t stats_lock;
    uint64_t ended_inline, ended_spawned;
    /* Streams (server.c, "streamed answers") a stop cancelled before their handler could be
     * told: no call can be offloaded any more. server_take_orphan() hands them to the caller of
     * the stop, which releases them with their target's py_stream. Under orphan_lock (any
     * worker, while stopping). */
    pthread_mutex_t orphan_lock;
    struct orphan {
        const struct server_target *t;
        void *stream;
    } *orphans;
    size_t n_orphans, cap_orphans;
    _Atomic unsigned ext_count;
    struct ext_memfd {
        const char *ptr;
        size_t len;
        int fd; /* -1: no memfd could be made, send from ptr */
    } ext[EXT_MEMFD_MAX];
};

/* ---- static targets ---- */

/* A sealed memfd holding body[0..len), or -1 when the kernel cannot give one (no memfd_create,
 * no memory): the caller then serves from the copy in memory, which is only slower. The seals
 * make the contents immutable for the life of the fd, so concurrent sendfile() calls with their
 * own offsets need no coordination. */
static int static_memfd(const char *body, size_t len)
{
    int fd = memfd_create("cyserve-static", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (UNLIKELY(fd < 0))
        return -1;
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, body + done, len - done);
        if (UNLIKELY(n < 0 && errno == EINTR))
            continue;
        if (UNLIKELY(n <= 0))
            goto fail;
        done += (size_t)n;
    }
    if (UNLIKELY(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)))
        goto fail;
    return fd;
fail:
    close(fd);
    return -1;
}

int server_target_static(struct server_target *t, int status, const char *headers,
                         size_t headers_len, const char *body, size_t body_len)
{
    if (UNLIKELY(status < 200 || status > 599))
        return -EINVAL;
    memset(t, 0, sizeof(*t));
    t->kind = SERVER_STATIC;
    t->static_fd = -1;
    struct wbuf h;
    wbuf_init(&h, NULL, 0);
    size_t rlen;
    const char *reason = http_reason(status, &rlen);
    char line[96];
    int n = snprintf(line, sizeof(line), "HTTP/1.1 %03d %.*s\r\nServer: cyserve\r\n", status,
                     (int)rlen, reason);
    int rc = wbuf_append(&h, line, (size_t)n);
    if (status >= 200 && status != 204 && status != 304) {
        n = snprintf(line, sizeof(line), "Content-Length: %zu\r\n", body_len);
        rc = rc ? rc : wbuf_append(&h, line, (size_t)n);
    } else {
        body_len = 0; /* these statuses never carry a body */
    }
    rc = rc ? rc : wbuf_append(&h, headers, headers_len);
    char *b = malloc(body_len ? body_len : 1);
    if (UNLIKELY(rc || !b)) {
        wbuf_free(&h);
        free(b);
        return -ENOMEM;
    }
    if (body_len)
        memcpy(b, body, body_len);
    t->static_head = h.ptr;
    t->static_head_len = h.len;
    t->static_body = b;
    t->static_body_len = body_len;
    if (body_len > STATIC_MEMFD_MIN)
        t->static_fd = static_memfd(b, body_len);
    return 0;
}

void server_target_clear(struct server_target *t)
{
    if (t->kind == SERVER_STATIC) {
        free(t->static_head);
        free(t->static_body);
        if (t->static_fd >= 0)
            close(t->static_fd);
    }
    memset(t, 0, sizeof(*t));
}

/* ---- configuration and lifetime ---- */

void server_config_default(struct server_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->host = "127.0.0.1";
    cfg->port = 8000;
    cfg->threads = 0;
    cfg->backlog = 1024;
    cfg->access_log_fd = -1;
    http_limits_default(&cfg->limits);
    cfg->max_body_bytes = 1u << 20;
    cfg->keepalive_ns = 5000000000ull;
    cfg->header_timeout_ns = 10000000000ull;
    cfg->body_timeout_ns = 10000000000ull;
}

int server_new(struct server **out, const struct server_config *cfg, const struct router *router)
{
    if (UNLIKELY(!cfg || !router || cfg->port < 0 || cfg->port > 65535 || cfg->backlog < 1 ||
                 cfg->limits.max_header_bytes < 64 || cfg->limits.max_headers < 1))
        return -EINVAL;
    struct server *s = calloc(1, sizeof(*s));
    if (UNLIKELY(!s))
        return -ENOMEM;
    s->cfg = *cfg;
    s->host = strdup(cfg->host ? cfg->host : "127.0.0.1");
    if (UNLIKELY(!s->host)) {
        free(s);
        return -ENOMEM;
    }
    s->cfg.host = s->host;
    s->router = router;
    pthread_mutex_init(&s->ext_lock, NULL);
    pthread_mutex_init(&s->stats_lock, NULL);
    pthread_mutex_init(&s->orphan_lock, NULL);
    *out = s;
    return 0;
}

void server_set_offload_hooks(struct server *s, void (*begin)(void *), void (*end)(void *),
                              void *ud)
{
    s->off_begin = begin;
    s->off_end = end;
    s->off_ud = ud;
}

int server_port(const struct server *s)
{
    return s->port;
}

int server_running(const struct server *s)
{
    /* safety: a plain flag read by any thread; the control thread is its only writer. */
    return atomic_load_explicit(&s->running, memory_order_acquire);
}

uint64_t server_live_connections(const struct server *s)
{
    /* safety: a counter read for tests; no other memory is published through it. */
    return atomic_load_explicit(&s->live, memory_order_relaxed);
}

static int is_draining(const struct server *s)
{
    /* safety: the flag only makes coroutines finish sooner; a late observation just serves one
     * more request, so relaxed ordering is enough. */
    return atomic_load_explicit(&s->draining, memory_order_relaxed);
}

/* ---- per-worker caches ---- */

/* The worker running the calling thread: its caches are this thread's alone. Not the home of
 * anything: use c->home for home state. */
static struct server_worker *current_worker(struct server *s)
{
    int id = sched_worker_id();
    return &s->workers[id < 0 ? 0 : id];
}

static char *buf_get(struct server_worker *w)
{
    if (w->nfree_bufs)
        return w->free_bufs[--w->nfree_bufs];
    return malloc(CONN_BUF_INITIAL);
}

static void buf_put(struct server_worker *w, char *buf, size_t cap)
{
    if (cap == CONN_BUF_INITIAL && w->nfree_bufs < BUF_CACHE_MAX)
        w->free_bufs[w->nfree_bufs++] = buf;
    else
        free(buf);
}

/* ---- connections ---- */

static void conn_on_ready(struct sched_io *io, uint32_t events);
static void conn_idle_timeout(struct sched_timer *t);
static int conn_serve(struct coro *co, void *arg);
static int conn_serve_inline(struct conn *c);
static void http1_on_readable(struct conn *c, uint32_t events);
static void http1_on_timeout(struct conn *c);

/* HTTP/1.1, the protocol every connection starts with. */
static const struct conn_proto http1_proto = {http1_on_readable, http1_on_timeout, NULL};

/* Close and free c. Called from a callback holding the home's loop lock, or from c's coroutine
 * (sched_io_del enters the home section, which lasts until the coroutine ends). */
static void conn_destroy(struct conn *c)
{
    sched_io_del(&c->io);
    struct server_worker *w = c->home;
    if (UNLIKELY(sched_home_held() != (int)w->id)) {
        /* Defensive: without the home's lock its list is not ours to touch. close_workers()
         * closes and frees the connection once every worker has been joined. */
        return;
    }
    if (c->timer_armed) {
        sched_timer_cancel(&c->idle);
        c->timer_armed = 0;
    }
    if (c->proto->close)
        c->proto->close(c);
    close(c->io.fd);
    free(c->peer);
    c->peer = NULL;
    struct server_worker *mine = current_worker(w->srv);
    if (c->buf)
        buf_put(mine, c->buf, c->cap);
    c->buf = NULL;
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (mine->nfree_conns < CONN_CACHE_MAX) {
        c->next = mine->free_conns;
        mine->free_conns = c;
        mine->nfree_conns++;
    } else {
        free(c);
    }
    /* safety: counts connections for the shutdown wait; the waiter polls it and needs no
     * ordering with the connection's memory. */
    atomic_fetch_sub_explicit(&w->srv->live, 1, memory_order_relaxed);
}

/* Register an accepted fd on the worker running the acceptor (its home from now on). Acceptor
 * coroutine, outside any home section: it enters its own worker's for the registration. */
static void conn_open(struct server *s, int fd, const struct conn_proto *proto,
                      const struct conn_transport *tp)
{
    int home = sched_home_enter(-1);
    if (UNLIKELY(home < 0)) {
        close(fd);
        return;
    }
    /* Our own worker, so no hop: its caches are this thread's too. */
    struct server_worker *w = &s->workers[home];
    struct conn *c = w->free_conns;
    if (c) {
        w->free_conns = c->next;
        w->nfree_conns--;
    } else {
        c = malloc(sizeof(*c));
        if (UNLIKELY(!c)) {
            sched_home_exit();
            close(fd);
            return;
        }
    }
    memset(c, 0, sizeof(*c));
    c->home = w;
    c->proto = proto;
    c->tp = tp;
    c->idle.cb = conn_idle_timeout;
    c->idle.data = c;
    c->io.data = c; /* before sched_io_add: its events are delivered from then on */
    int one = 1;
    /* Responses go out in one write; Nagle would only delay them. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int rc = sched_io_add(&c->io, fd, conn_on_ready);
    if (UNLIKELY(rc < 0)) {
        sched_home_exit();
        close(fd);
        c->next = w->free_conns;
        w->free_conns = c;
        w->nfree_conns++;
        return;
    }
    /* A client that connects and never sends a byte is an idle connection too: it gets the
     * keep-alive timer from the start. */
    c->idle_since = sched_now_ns();
    sched_timer_arm(&c->idle, c->idle_since + s->cfg.keepalive_ns);
    c->timer_armed = 1;
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    /* safety: see conn_destroy. */
    atomic_fetch_add_explicit(&s->live, 1, memory_order_relaxed);
    sched_home_exit();
}

/* Callback with the home's loop lock (on the home or a rescuer), not in a coroutine: the idle
 * connection has bytes (or a hang-up) to look at. The coroutine goes on this thread's queue. */
static void conn_on_ready(struct sched_io *io, uint32_t events)
{
    struct conn *c = io->data;
    c->busy = 1;
    c->proto->on_readable(c, events);
}

/* Timer callback, with the home's loop lock. */
static void conn_idle_timeout(struct sched_timer *t)
{
    struct conn *c = t->data;
    c->timer_armed = 0;
    if (c->busy)
        return; /* it re-arms when it goes idle again */
    uint64_t deadline = c->idle_since + c->home->srv->cfg.keepalive_ns;
    if (sched_now_ns() < deadline) {
        sched_timer_arm(&c->idle, deadline);
        c->timer_armed = 1;
        return;
    }
    c->proto->on_timeout(c);
}

/* ---- accepting ---- */

static int acceptor(struct coro *co, void *arg)
{
    struct server_worker *w = arg;
    struct server *s = w->srv;
    for (;;) {
        for (int i = 0; i < ACCEPT_BATCH; i++) {
            int fd = accept4(w->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (LIKELY(fd >= 0)) {
                if (UNLIKELY(is_draining(s)))
                    close(fd);
                else
                    conn_open(s, fd, &http1_proto, &conn_plain);
                continue;
            }
            switch (errno) {
            case EINTR:
            case ECONNABORTED:
            case EPROTO:
                continue; /* that one connection is gone; the next may be fine */
            case EAGAIN:
                goto drained;
            case EMFILE:
            case ENFILE:
            case ENOBUFS:
            case ENOMEM:
                /* Out of descriptors or memory: the pending connection stays queued, and the
                 * edge-triggered registration would not fire again for it, so retry shortly. */
                if (sched_sleep_ns(10 * 1000 * 1000) < 0)
                    return 0;
                continue;
            default:
                /* EINVAL/EBADF: the listener was shut down by server_shutdown. Keep the
                 * registration active so that on_ready is never called again. */
                return 0;
            }
        }
        if (sched_yield() < 0)
            return 0;
        continue;
    drained:
        if (sched_io_release(&w->lio) == -EAGAIN)
            continue;
        return 0;
    }
}

static void listener_on_ready(struct sched_io *io, uint32_t events)
{
    struct server_worker *w = io->data;
    if (UNLIKELY(sched_spawn(w->srv->sched, acceptor, w) < 0))
        return; /* stopping: nothing more to accept */
}

static int ctl_rearm(struct coro *co, void *arg)
{
    struct server_worker *w = arg;
    sched_io_release(&w->ctl_io);
    return 0;
}

/* Timer callback (home's loop lock held) armed by ctl_on_ready: close every idle connection.
 * This runs from the timer pass, after the poll's batch of events: closing connections from
 * inside the batch could free a connection whose event is still waiting further down it. */
static void ctl_close_idle(struct sched_timer *t)
{
    struct server_worker *w = t->data;
    struct conn *c = w->conns;
    while (c) {
        struct conn *next = c->next;
        /* An idle connection whose next request has already arrived (its readiness not yet
         * reported) is left to the poll: its coroutine answers that request with Connection:
         * close. Closing over unread bytes would reset it, and the request would be lost. */
        char b;
        if (!c->busy && sock_recv_peek(c->io.fd, &b) <= 0)
            conn_destroy(c);
        c = next;
    }
}

/* Callback (home's loop lock held), not in a coroutine: server_shutdown wrote our eventfd.
 * One-shot: the io stays active afterwards, so this never runs twice. */
static void ctl_on_ready(struct sched_io *io, uint32_t events)
{
    struct server_worker *w = io->data;
    if (!is_draining(w->srv)) {
        /* Not a shutdown (an eventfd is always writable, and a scheduler may report that):
         * make the registration idle again so that the real wake-up calls us. */
        sched_spawn(w->srv->sched, ctl_rearm, w);
        return;
    }
    /* Stop taking connections here. The descriptor stays open (and registered) until the
     * workers are joined, so no accept coroutine can ever see a reused fd number. */
    shutdown(w->lfd, SHUT_RD);
    w->ctl_timer.cb = ctl_close_idle;
    w->ctl_timer.data = w;
    sched_timer_arm(&w->ctl_timer, 0);
}

static void worker_start(struct sched *sched, unsigned id, void *ud)
{
    struct server *s = ud;
    struct server_worker *w = &s->workers[id];
    /* data before sched_io_add: from then on an event may be handled at once, by this worker or
     * by a rescuer on another thread. */
    w->lio.data = w;
    if (sched_io_add(&w->lio, w->lfd, listener_on_ready) == 0)
        w->lio_added = 1;
    w->ctl_io.data = w;
    if (sched_io_add(&w->ctl_io, w->ctl_fd, ctl_on_ready) == 0)
        w->ctl_added = 1;
}

/* ---- the serving coroutine ---- */

/* One request, from its parsed head to its answer: what a handler's cyserve_request.engine
 * points at. Its views point into the connection's read buffer. */
struct request {
    struct conn *c;
    struct server *srv;
    struct http_request head;
    struct http_header *hdrs;
    unsigned max_headers;
    /* For the access log: the status and body bytes of the response being written (bytes -1:
     * unknown), whether head holds a parsed request, and when it was complete. */
    int log_status;
    int64_t log_bytes;
    int log_have_req;
    uint64_t log_t0;
    struct cyserve_response resp;
    struct http_header hdr_inline[INLINE_HEADERS];
};

/* The HTTP/1 serving state of a connection, on its coroutine's stack: the output buffer in
 * which the answers of pipelined requests accumulate, and the request being served. */
struct serve {
    struct conn *c;
    struct server *srv;
    struct wbuf out;
    char out_inline[OUT_INLINE];
    struct request rq;
};

enum { SERVE_IDLE = 0, SERVE_CLOSE = 1 };

static void serve_cleanup(void *arg)
{
    struct serve *sv = arg;
    resp_free(&sv->rq.resp);
    wbuf_free(&sv->out);
}

static const char *date_now(void)
{
    return http_date_cached(time(NULL));
}

/* Make sure c has a read buffer with at least want bytes of capacity. 0 or -ENOMEM. */
static int conn_reserve(struct serve *sv, size_t want)
{
    struct conn *c = sv->c;
    if (!c->buf) {
        c->buf = buf_get(current_worker(sv->srv));
        if (UNLIKELY(!c->buf))
            return -ENOMEM;
        c->cap = CONN_BUF_INITIAL;
        c->len = 0;
    }
    if (LIKELY(want <= c->cap))
        return 0;
    size_t cap = c->cap;
    while (cap < want)
        cap *= 2;
    char *nb;
    if (c->cap == CONN_BUF_INITIAL) {
        /* The initial buffer may belong to the cache: move, do not realloc. */
        nb = malloc(cap);
        if (UNLIKELY(!nb))
            return -ENOMEM;
        memcpy(nb, c->buf, c->len);
        buf_put(current_worker(sv->srv), c->buf, c->cap);
    } else {
        nb = realloc(c->buf, cap);
        if (UNLIKELY(!nb))
            return -ENOMEM;
    }
    c->buf = nb;
    c->cap = cap;
    return 0;
}

/* One read into the free space of the buffer. Returns bytes read (> 0), 0 at end of stream,
 * -EAGAIN, or -errno. */
static ssize_t conn_read_once(struct serve *sv)
{
    struct conn *c = sv->c;
    if (UNLIKELY(conn_reserve(sv, c->len + 1) < 0))
        return -ENOMEM;
    size_t space = c->cap - c->len;
    for (;;) {
        ssize_t n = conn_tp_recv(c, c->buf + c->len, space);
        if (LIKELY(n > 0)) {
            c->len += (size_t)n;
            c->drained = (size_t)n < space;
            return n;
        }
        if (n == 0)
            return 0;
        if (n == -EINTR)
            continue;
        if (n == -EAGAIN)
            c->drained = 1;
        return n;
    }
}

/* Read at least one byte, waiting for readiness until deadline (absolute ns, < 0: none).
 * Returns > 0, 0 at end of stream, -ETIMEDOUT, -ECANCELED, or -errno. Coroutine only. */
static ssize_t conn_read_wait(struct serve *sv, int64_t deadline)
{
    for (;;) {
        ssize_t n = conn_read_once(sv);
        if (n != -EAGAIN)
            return n;
        int rc = sched_io_wait(&sv->c->io, EPOLLIN | EPOLLRDHUP, deadline);
        if (rc < 0)
            return rc;
    }
}

/* The monotonic clock, read now (vDSO, no system call). sched_now_ns() is the one cached at the
 * loop's last poll: a request served within one loop turn would take 0 s by it. */
static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int64_t deadline_after(uint64_t ns)
{
    return (int64_t)(sched_now_ns() + ns);
}

/* Wait until the socket takes more bytes, or drop a client that stopped reading: returns > 0
 * (ready), -ETIMEDOUT after body_timeout without progress, or -ECANCELED. Progress is not only
 * EPOLLOUT: Linux reports a full socket writable only once about a third of its send buffer has
 * drained, and with a buffer of some MB a slow but steady reader (~100 KB/s against the default
 * 10 s) takes longer than that. So when the deadline passes, the bytes still queued in the socket
 * (SIOCOUTQ: sent but unacknowledged, plus unsent) decide: fewer than when the wait began means
 * the client is reading, and the wait goes on. Coroutine only. */
static int conn_wait_writable(struct serve *sv)
{
    int fd = sv->c->io.fd, queued;
    if (ioctl(fd, SIOCOUTQ, &queued) < 0)
        queued = -1;
    for (;;) {
        int rc = sched_io_wait(&sv->c->io, EPOLLOUT, deadline_after(sv->srv->cfg.body_timeout_ns));
        if (rc != -ETIMEDOUT)
            return rc;
        int now;
        if (queued < 0 || ioctl(fd, SIOCOUTQ, &now) < 0 || now >= queued)
            return -ETIMEDOUT;
        queued = now;
    }
}

/* Send iov[0..cnt) completely, waiting for EPOLLOUT as needed; each wait may last body_timeout
 * (a client that stops reading is dropped). flags: 0, or MSG_MORE when more bytes of the same
 * response follow at once (sendfile), so the kernel does not push the head in a segment of its
 * own. Returns 0 or -errno. Coroutine only. */
static int conn_sendv(struct serve *sv, struct iovec *iov, int cnt, int flags)
{
    while (cnt > 0) {
        ssize_t n = conn_tp_sendv(sv->c, iov, cnt, flags);
        if (UNLIKELY(n < 0)) {
            if (n == -EINTR)
                continue;
            if (n != -EAGAIN)
                return (int)n;
            int rc = conn_wait_writable(sv);
            if (rc < 0)
                return rc;
            continue;
        }
        size_t left = (size_t)n;
        while (cnt > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

/* Write the output buffer, then extra[0..extra_len) if any: one send, or one sendmsg when both
 * are there.
 * flags: as conn_sendv. */
static int flush_with(struct serve *sv, const void *extra, size_t extra_len, int flags)
{
    struct iovec iov[2];
    int cnt = 0;
    if (sv->out.len) {
        iov[cnt].iov_base = sv->out.ptr;
        iov[cnt].iov_len = sv->out.len;
        cnt++;
    }
    if (extra_len) {
        iov[cnt].iov_base = (void *)extra;
        iov[cnt].iov_len = extra_len;
        cnt++;
    }
    int rc = conn_sendv(sv, iov, cnt, flags);
    sv->out.len = 0;
    return rc;
}

static int flush(struct serve *sv)
{
    if (!sv->out.len)
        return 0;
    return flush_with(sv, NULL, 0, 0);
}

/* After an error response: stop writing, read and drop what the client still sends for a short
 * while, so that close() does not reset the connection before the client read our answer. */
static void linger_close(struct serve *sv)
{
    struct conn *c = sv->c;
    conn_tp_shutdown(c, SHUT_WR);
    int64_t deadline = deadline_after(LINGER_NS);
    size_t dropped = 0;
    char sink[2048];
    while (dropped < LINGER_MAX_BYTES) {
        ssize_t n = conn_tp_recv(c, sink, sizeof(sink));
        if (n > 0) {
            dropped += (size_t)n;
            continue;
        }
        if (n == -EINTR)
            continue;
        if (n == -EAGAIN) {
            if (sched_io_wait(&c->io, EPOLLIN | EPOLLRDHUP, deadline) < 0)
                return;
            continue;
        }
        return; /* end of stream or an error */
    }
}

/* ---- access log ----
 *
 * Off unless cfg.access_log_fd >= 0. One line per response, in the Common Log Format that log
 * tools parse, plus the time the request took (from its complete head to its response queued):
 *
 *   127.0.0.1:50212 - - [22/Nov/2026:03:25:03 +0000] "GET /plaintext HTTP/1.1" 200 13 0.000021
 *
 * Each line goes out in one write(2) as it is made, from whichever worker serves the request:
 * lines are short (the target is cut at LOG_TARGET_MAX), so a write to a pipe is atomic and lines
 * of different workers and processes never interleave, and nothing waits in a buffer when the
 * traffic stops. The request line is "-" for a request that was rejected before it was parsed.
 * The parser has already refused control characters, spaces and quotes outside the grammar in the
 * method and the target, so they are written as they came. */
#define LOG_TARGET_MAX 1024

static const char *log_date(void)
{
    static __thread time_t last;
    static __thread char buf[32];
    static const char mon[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    if (now != last || !buf[0]) {
        struct tm tm;
        gmtime_r(&now, &tm);
        snprintf(buf, sizeof(buf), "%02d/%s/%04d:%02d:%02d:%02d +0000", tm.tm_mday,
                 mon[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
        last = now;
    }
    return buf;
}

static const char *log_peer(struct conn *c)
{
    if (c->peer)
        return c->peer;
    struct sockaddr_storage sa;
    socklen_t len = sizeof(sa);
    char host[INET6_ADDRSTRLEN + 2] = "-", port[8] = "";
    if (getpeername(c->io.fd, (struct sockaddr *)&sa, &len) == 0 &&
        getnameinfo((struct sockaddr *)&sa, len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
        size_t n = strlen(host) + strlen(port) + 4;
        c->peer = malloc(n);
        if (c->peer) {
            snprintf(c->peer, n, sa.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
            return c->peer;
        }
    }
    return "-";
}

static void access_log(struct serve *sv)
{
    int fd = sv->srv->cfg.access_log_fd;
    if (LIKELY(fd < 0) || !sv->rq.log_status)
        return;
    char line[LOG_TARGET_MAX + 256];
    char bytes[24] = "-";
    if (sv->rq.log_bytes >= 0)
        snprintf(bytes, sizeof(bytes), "%lld", (long long)sv->rq.log_bytes);
    double secs = sv->rq.log_have_req ? (double)(mono_ns() - sv->rq.log_t0) / 1e9 : 0.0;
    int n;
    if (sv->rq.log_have_req) {
        const struct http_request *r = &sv->rq.head;
        int tlen = r->target_len > LOG_TARGET_MAX ? LOG_TARGET_MAX : (int)r->target_len;
        n = snprintf(line, sizeof(line), "%s - - [%s] \"%.*s %.*s HTTP/1.%d\" %d %s %.6f\n",
                     log_peer(sv->c), log_date(), (int)r->method_len, r->method, tlen, r->target,
                     r->minor_version, sv->rq.log_status, bytes, secs);
    } else {
        n = snprintf(line, sizeof(line), "%s - - [%s] \"-\" %d %s %.6f\n", log_peer(sv->c),
                     log_date(), sv->rq.log_status, bytes, secs);
    }
    if (n > 0) {
        size_t len = (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1;
        /* A failed write drops its line and the server goes on. A write blocks while a pipe on
         * standard output is full: a reader that stalls slows the workers down, as it would
         * nginx's or gunicorn's. */
        ssize_t w;
        do {
            w = write(fd, line, len);
        } while (w < 0 && errno == EINTR);
    }
    sv->rq.log_status = 0;
}

static void log_response(struct serve *sv, int status, int64_t bytes)
{
    sv->rq.log_status = status;
    sv->rq.log_bytes = bytes;
}

/* Answer status with a short text body naming the problem, then close (the caller returns
 * SERVE_CLOSE). */
static int error_close(struct serve *sv, int status, const char *detail)
{
    /* A HEAD gets no body, even in an error (when its method was read at all). */
    int head_only = sv->rq.head.method_id == HTTP_HEAD;
    int n = http_write_error(&sv->out, status, detail, head_only, date_now());
    log_response(sv, status, n < 0 ? -1 : n);
    access_log(sv);
    if (n >= 0 && flush(sv) == 0)
        linger_close(sv);
    return SERVE_CLOSE;
}

/* A short response that keeps the connection (404, 405, 500 ...). extra: header lines. */
static int simple_put(struct wbuf *out, int status, const char *body, const char *extra,
                      int minor, int keep, int head_only)
{
    size_t blen = strlen(body);
    char lines[256];
    int n = snprintf(lines, sizeof(lines), "Content-Type: text/plain; charset=utf-8\r\n%s",
                     extra ? extra : "");
    if (n < 0 || (size_t)n >= sizeof(lines))
        n = 0;
    int rc = http_write_head(out, status, minor, keep, blen, lines, (size_t)n, date_now());
    if (!rc && !head_only)
        rc = wbuf_append(out, body, blen);
    return rc;
}

static int simple_response(struct serve *sv, int status, const char *body, const char *extra,
                           int keep, int head_only)
{
    log_response(sv, status, head_only ? 0 : (int64_t)strlen(body));
    return simple_put(&sv->out, status, body, extra, sv->rq.head.minor_version, keep, head_only);
}

static int send_file_range(struct serve *sv, int fd, uint64_t offset, uint64_t count);

/* Large handler bodies set with resp_set_body_static.
 *
 * Their memory is promised to live, unchanged, as long as the server, so a body is the same
 * bytes every time the same (pointer, length) pair comes back. The first response that sends a
 * pair copies it once into a sealed memfd; every later one, on any worker, sendfile()s from that
 * memfd, which spares the kernel its copy from user memory per response exactly as for
 * SERVER_STATIC targets. (A handler that breaks the promise and changes its buffer keeps getting
 * the first snapshot: stale, never torn.)
 *
 * Concurrency: the table is append-only while the server lives. A reader loads ext_count with
 * acquire and scans the entries below it, which were completely written before the release
 * store that published them; it takes no lock. A miss takes ext_lock, scans again (another
 * worker may have added the pair meanwhile), makes the memfd and publishes the entry with a
 * release store of the new count. The lock is held across memfd_create and the write of the
 * body: that blocks another worker that misses at the same moment, but only until the first
 * response of each distinct body, at most EXT_MEMFD_MAX times in the life of the server.
 * Entries are closed only by server_free(), after the workers are joined, so an fd found here
 * stays open for as long as a coroutine may use it, even across a wait on another worker.
 * Returns the memfd, or -1 (table full, no memfd): send from memory. */
static int ext_memfd_for(struct server *s, const char *ptr, size_t len)
{
    /* safety: acquire pairs with the release store below: entries [0, n) are fully written. */
    unsigned n = atomic_load_explicit(&s->ext_count, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (s->ext[i].ptr == ptr && s->ext[i].len == len)
            return s->ext[i].fd;
    if (n == EXT_MEMFD_MAX)
        return -1;
    pthread_mutex_lock(&s->ext_lock);
    /* safety: writers are serialised by ext_lock, so relaxed reads the latest count here. */
    n = atomic_load_explicit(&s->ext_count, memory_order_relaxed);
    int fd = -1;
    unsigned i;
    for (i = 0; i < n; i++) {
        if (s->ext[i].ptr == ptr && s->ext[i].len == len) {
            fd = s->ext[i].fd;
            break;
        }
    }
    if (i == n && n < EXT_MEMFD_MAX) {
        fd = static_memfd(ptr, len);
        s->ext[n].ptr = ptr;
        s->ext[n].len = len;
        s->ext[n].fd = fd;
        /* safety: release publishes the entry written above to lock-free readers. */
        atomic_store_explicit(&s->ext_count, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&s->ext_lock);
    return fd;
}

/* Room static_head_put() needs at most. */
#define STATIC_HEAD_MAX(t) ((t)->static_head_len + 64 + HTTP_DATE_LEN)

/* Write the head of static target t at p (STATIC_HEAD_MAX bytes of room): its serialised lines,
 * Date, the Connection field when it is not the version's default, the empty line. Returns the
 * end. */
static char *static_head_put(char *p, const struct server_target *t, int keep, int minor)
{
    memcpy(p, t->static_head, t->static_head_len);
    p += t->static_head_len;
    memcpy(p, "Date: ", 6);
    p += 6;
    memcpy(p, date_now(), HTTP_DATE_LEN);
    p += HTTP_DATE_LEN;
    if (!keep) {
        memcpy(p, "\r\nConnection: close", 19);
        p += 19;
    } else if (minor == 0) {
        memcpy(p, "\r\nConnection: keep-alive", 24);
        p += 24;
    }
    memcpy(p, "\r\n\r\n", 4);
    return p + 4;
}

static int send_static(struct serve *sv, const struct server_target *t, int keep, int head_only)
{
    struct wbuf *out = &sv->out;
    if (UNLIKELY(sv->srv->cfg.access_log_fd >= 0)) /* the status is in "HTTP/1.1 NNN ..." */
        log_response(sv, atoi(t->static_head + 9), head_only ? 0 : (int64_t)t->static_body_len);
    int rc = wbuf_reserve(out, STATIC_HEAD_MAX(t));
    if (UNLIKELY(rc))
        return rc;
    char *p = static_head_put(out->ptr + out->len, t, keep, sv->rq.head.minor_version);
    out->len = (size_t)(p - out->ptr);
    if (head_only || !t->static_body_len)
        return 0;
    if (t->static_body_len <= BODY_COPY_MAX)
        return wbuf_append(out, t->static_body, t->static_body_len);
    if (t->static_fd < 0)
        return flush_with(sv, t->static_body, t->static_body_len, 0);
    /* The head (behind any earlier pipelined responses) is corked with MSG_MORE and leaves with
     * the first pages of the body. */
    rc = flush_with(sv, NULL, 0, MSG_MORE);
    return rc ? rc : send_file_range(sv, t->static_fd, 0, t->static_body_len);
}

/* Serialise the handler's response into the output buffer (or straight out for big bodies). */
/* Write the head of handler response r to out; *blen: the body bytes that follow it (0 for
 * statuses without a body). keep: already false when r->close. Returns 0 or -ENOMEM. */
static int resp_head_put(struct wbuf *out, struct cyserve_response *r, int minor, int keep,
                         int head_only, size_t *blen)
{
    int status = r->status;
    int bodyless = status < 200 || status == 204 || status == 304;
    size_t body_len;
    resp_body(r, &body_len);
    if (!r->has_content_type && body_len && !bodyless) {
        static const char ct[] = "Content-Type: text/plain; charset=utf-8\r\n";
        if (UNLIKELY(wbuf_append(&r->headers, ct, sizeof(ct) - 1)))
            return -ENOMEM;
    }
    *blen = bodyless ? 0 : body_len;
    /* An answer to HEAD announces the length GET would have: the handler's own when it gave
     * one and no body (resp_set_head_length). */
    uint64_t announce = *blen;
    if (UNLIKELY(head_only && !body_len && !bodyless && r->head_length != -1))
        announce = r->head_length >= 0 ? (uint64_t)r->head_length : HTTP_LENGTH_UNTIL_CLOSE;
    return http_write_head(out, status, minor, keep, announce, r->headers.ptr, r->headers.len,
                           date_now());
}

static int send_resp(struct serve *sv, int keep, int head_only)
{
    struct cyserve_response *r = &sv->rq.resp;
    if (r->close)
        keep = 0;
    size_t blen, body_len;
    const char *body = resp_body(r, &body_len);
    int rc = resp_head_put(&sv->out, r, sv->rq.head.minor_version, keep, head_only, &blen);
    log_response(sv, r->status, head_only ? 0 : (int64_t)blen);
    if (UNLIKELY(rc))
        return rc;
    if (head_only || !blen)
        return 0;
    if (blen <= BODY_COPY_MAX)
        return wbuf_append(&sv->out, body, blen);
    int fd = r->body_static && blen > STATIC_MEMFD_MIN ? ext_memfd_for(sv->srv, body, blen) : -1;
    if (fd < 0)
        return flush_with(sv, body, blen, 0);
    rc = flush_with(sv, NULL, 0, MSG_MORE);
    return rc ? rc : send_file_range(sv, fd, 0, blen);
}

/* ---- the inline path ----
 *
 * Most of the time an idle keep-alive connection becomes readable with exactly one small,
 * complete request in its socket. When that request needs nothing that can wait, conn_on_ready
 * answers it right there, on the worker's own stack, within the poll's batch: one read, the
 * parse, the route, the handler, one write, and the connection is idle again. No coroutine is
 * spawned, switched to or freed, and no run queue is touched: on /plaintext that was ~4% of the
 * server's CPU time per request (docs/benchmarks.md).
 *
 * Everything else falls back to the coroutine, which is the complete engine: the bytes already
 * read stay in c->buf (conn_serve parses them first), and an answer the socket would not take
 * whole waits at the start of c->buf (c->pend) for the coroutine to send it first. So this path
 * only has to be right for what it takes: a read shorter than the buffer, one request consuming
 * exactly that read (nothing pipelined behind it), no body, keep-alive, no access log, not
 * draining, and a static target whose answer fits the buffer or a GIL-free handler. Python
 * handlers never run here: they wait for the GIL, which is what coroutines are for.
 *
 * GIL-free handlers are user code of unknown cost, and a handler run here holds the worker's
 * loop lock: while it runs, no idle worker can steal its neighbours or rescue its loop (sched.h).
 * So a route earns the inline path: its first calls run in coroutines, timed, and once
 * INLINE_LEARN of them were quick (under INLINE_SLOW_TICKS) and answered with a body small
 * enough to copy, the route runs inline from then on, still timed. INLINE_SLOW_STREAK slow calls
 * in a row, or one large body, send it back to coroutines for good. A CPU-heavy handler (the
 * demo's /fibonacci, ~270 us) therefore never runs inline. Why a streak and not the first slow
 * call: a quick call is "slow" whenever the thread is preempted or takes a burst of network
 * interrupts in the middle of it, which under load happens every few seconds; a streak of those
 * does not. The price: a handler that passed its learning calls and is slow only now and then
 * (isolated slow calls) keeps running inline, and each of its slow calls holds its worker's other
 * connections for as long as it runs, as it would on a single-threaded server. A handler that
 * turns slow for good does that for INLINE_SLOW_STREAK calls. The state is per route
 * (server_target.inline_state and inline_slow), shared by the workers; a quick inline call only
 * reads it. */

/* The clock of the timing: x86's time-stamp counter (two reads ~15 ns here, against ~35 ns for
 * two vDSO clock_gettime calls, on every inline request), elsewhere the monotonic clock. */
#if defined(__x86_64__) || defined(__i386__)
static inline uint64_t inline_ticks(void)
{
    return __rdtsc();
}
/* Invariant TSC cycles: 20 us at 5 GHz, 100 us at 1 GHz. Either way a coroutine's ~1 us is a
 * few percent of such a call, and its neighbours can be stolen while it runs. */
#define INLINE_SLOW_TICKS 100000u
#else
static inline uint64_t inline_ticks(void)
{
    return mono_ns();
}
#define INLINE_SLOW_TICKS (50u * 1000) /* ns */
#endif
/* Quick calls a route needs before it runs inline; past it the state says "inline", then
 * "never". */
#define INLINE_LEARN 64u
#define INLINE_NEVER (INLINE_LEARN + 1)
#define INLINE_SLOW_STREAK 3u

/* Record a timed call of t's handler (any worker). took: its run time in ticks; blen: its body. */
static void inline_note(const struct server_target *t, uint64_t took, size_t blen)
{
    /* The target is the engine's own mutable memory (calloc'd by the Cython layer); it is const
     * only in the router's view. safety: the two counters publish no other memory, so relaxed
     * ordering is enough. The CAS keeps concurrent learners from counting past INLINE_LEARN or
     * from leaving INLINE_NEVER; the streak is approximate across workers (a quick call on one
     * may reset another's streak), which only delays the verdict. */
    struct server_target *mt = (struct server_target *)t;
    if (UNLIKELY(blen > BODY_COPY_MAX)) {
        atomic_store_explicit(&mt->inline_state, INLINE_NEVER, memory_order_relaxed);
        return;
    }
    if (UNLIKELY(took > INLINE_SLOW_TICKS)) {
        if (atomic_fetch_add_explicit(&mt->inline_slow, 1, memory_order_relaxed) + 1 >=
            INLINE_SLOW_STREAK)
            atomic_store_explicit(&mt->inline_state, INLINE_NEVER, memory_order_relaxed);
        return;
    }
    if (UNLIKELY(atomic_load_explicit(&mt->inline_slow, memory_order_relaxed)))
        atomic_store_explicit(&mt->inline_slow, 0, memory_order_relaxed);
    unsigned v = atomic_load_explicit(&mt->inline_state, memory_order_relaxed);
    while (v < INLINE_LEARN &&
           !atomic_compare_exchange_weak_explicit(&mt->inline_state, &v, v + 1,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

void server_target_never_inline(struct server_target *t)
{
    atomic_store_explicit(&t->inline_state, INLINE_NEVER, memory_order_relaxed);
}

/* The inline path is done with c and leaves it idle (callback with the home's loop lock). */
static void inline_idle(struct conn *c, struct server_worker *mine)
{
    buf_put(mine, c->buf, c->cap);
    c->buf = NULL;
    c->cap = c->len = 0;
    c->drained = 0; /* said of this read only: the next one starts knowing nothing */
    c->busy = 0;
    if (!c->timer_armed) {
        sched_timer_arm(&c->idle, c->idle_since + c->home->srv->cfg.keepalive_ns);
        c->timer_armed = 1;
    }
    sched_io_idle(&c->io);
}

/* Send the answer out[0..len) (out may be c->buf) for c's request, which is consumed: c->buf
 * is free. keep: the connection stays open after it. Returns 1 when handled (idle again, or
 * closed), 0 when the rest waits in c->buf for the coroutine to send. */
static int inline_send(struct conn *c, struct server_worker *mine, const char *out, size_t len,
                       int keep)
{
    /* Counted before the send, so that a client that has read the answer sees the count.
     * safety: written by this thread only (its own worker's entry), read by server_get_stats;
     * relaxed atomics only to make that read well defined. */
    atomic_store_explicit(&mine->inline_ok,
                          atomic_load_explicit(&mine->inline_ok, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    ssize_t sent;
    do
        sent = sock_send(c->io.fd, out, len, MSG_NOSIGNAL);
    while (UNLIKELY(sent < 0 && errno == EINTR));
    if (LIKELY(sent == (ssize_t)len)) {
        if (!keep) {
            conn_destroy(c);
            return 1;
        }
        c->idle_since = sched_now_ns();
        inline_idle(c, mine);
        return 1;
    }
    if (sent < 0 && errno != EAGAIN) {
        conn_destroy(c); /* the client is gone */
        return 1;
    }
    /* The socket took part of it (a client slow to read): the coroutine sends the rest when it
     * can. */
    size_t done = sent > 0 ? (size_t)sent : 0, rest = len - done;
    if (rest > c->cap) {
        char *nb = malloc(rest);
        if (UNLIKELY(!nb)) {
            conn_destroy(c);
            return 1;
        }
        buf_put(mine, c->buf, c->cap);
        c->buf = nb;
        c->cap = rest;
    }
    memmove(c->buf, out + done, rest);
    c->pend = rest;
    c->pend_close = !keep;
    c->len = 0;
    return 0;
}

/* Run GIL-free handler t for the request req (no body) inline and send its answer. Returns as
 * inline_send. */
/* A GIL-free handler that fails gets a 500, and the operator a line on standard error (a Python
 * handler's failure gets a logged traceback), at most one a second for the whole process, so that
 * a route failing on every request can neither flood the log nor slow the server down. */
static void note_handler_failure(const struct http_request *req, int hrc)
{
    static _Atomic uint64_t next_ns, suppressed;
    uint64_t now = mono_ns();
    /* safety: next_ns only rate-limits; the CAS makes one thread per second the writer. */
    uint64_t due = atomic_load_explicit(&next_ns, memory_order_relaxed);
    if (now < due || !atomic_compare_exchange_strong_explicit(&next_ns, &due, now + 1000000000ull,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed)) {
        atomic_fetch_add_explicit(&suppressed, 1, memory_order_relaxed);
        return;
    }
    unsigned long long more = atomic_exchange_explicit(&suppressed, 0, memory_order_relaxed);
    char line[512], tail[64] = "";
    if (more)
        snprintf(tail, sizeof(tail), " (and %llu more failures)", more);
    int plen = req->path_len > 256 ? 256 : (int)req->path_len;
    int n = snprintf(line, sizeof(line), "cyserve: GIL-free handler for %.*s %.*s returned %d; "
                     "answered 500%s\n", (int)req->method_len, req->method, plen, req->path,
                     hrc, tail);
    if (n > 0) {
        ssize_t w = write(2, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
        (void)w; /* nothing to do if standard error is gone */
    }
}

static int inline_nogil(struct conn *c, struct server_worker *mine, const struct server_target *t,
                        const struct http_request *req, const struct router_match *m)
{
    struct server *s = c->home->srv;
    cyserve_request creq = {
        .method = {req->method, req->method_len},
        .target = {req->target, req->target_len},
        .path = {req->path, req->path_len},
        .query = {req->query ? req->query : "", req->query ? req->query_len : 0},
        .minor_version = req->minor_version,
        .headers = (const cyserve_header *)(const void *)req->headers,
        .num_headers = req->num_headers,
        .body = {"", 0},
        .params = m->params,
        .num_params = m->num_params,
        .engine = NULL,
    };
    struct cyserve_response resp;
    resp_init(&resp);
    uint64_t t0 = inline_ticks();
    int hrc = t->fn(&creq, &resp, t->ctx);
    uint64_t took = inline_ticks() - t0;
    int head_only = req->method_id == HTTP_HEAD;
    int keep = !resp.close && !is_draining(s);
    char store[OUT_INLINE];
    struct wbuf out;
    wbuf_init(&out, store, sizeof(store));
    size_t blen = 0, body_len;
    const char *body = resp_body(&resp, &body_len);
    int rc;
    if (UNLIKELY(hrc != 0)) {
        note_handler_failure(req, hrc);
        rc = simple_put(&out, 500, "500 Internal Server Error\n", NULL, req->minor_version, keep,
                        head_only);
    } else {
        rc = resp_head_put(&out, &resp, req->minor_version, keep, head_only, &blen);
        if (!rc && !head_only && blen)
            rc = wbuf_append(&out, body, blen);
    }
    inline_note(t, took, blen);
    int handled;
    if (UNLIKELY(rc)) {
        conn_destroy(c); /* out of memory for the answer */
        handled = 1;
    } else {
        handled = inline_send(c, mine, out.ptr, out.len, keep);
    }
    wbuf_free(&out);
    resp_free(&resp);
    return handled;
}

/* Try to serve c's readiness inline. Returns 1 when it was handled (answered and idle again,
 * nothing to read, or the connection closed), 0 to spawn the coroutine. Callback with the home's
 * loop lock. */
static int conn_serve_inline(struct conn *c)
{
    struct server *s = c->home->srv;
    if (UNLIKELY(c->buf || s->cfg.access_log_fd >= 0 || is_draining(s) || c->tp != &conn_plain))
        return 0;
    struct server_worker *mine = current_worker(s);
    char *buf = buf_get(mine);
    if (UNLIKELY(!buf))
        return 0;
    c->buf = buf;
    c->cap = CONN_BUF_INITIAL;
    c->len = 0;
    ssize_t n;
    do
        n = sock_recv(c->io.fd, buf, CONN_BUF_INITIAL);
    while (UNLIKELY(n < 0 && errno == EINTR));
    if (UNLIKELY(n <= 0)) {
        if (n < 0 && errno == EAGAIN) {
            inline_idle(c, mine); /* a spurious wake-up: nothing arrived */
            return 1;
        }
        return 0; /* end of stream or an error: the coroutine sees it again and closes */
    }
    c->len = (size_t)n;
    if (UNLIKELY((size_t)n == CONN_BUF_INITIAL))
        return 0; /* maybe more behind it */
    c->drained = 1;

    struct http_header hdrs[INLINE_HEADERS];
    struct http_request req;
    req.headers = hdrs;
    req.num_headers = INLINE_HEADERS;
    if (http_parse_request(buf, (size_t)n, &req, &s->cfg.limits) != (int)n)
        return 0;
    empty_path_is_root(&req);
    if (req.content_length > 0 || req.chunked || !req.keep_alive)
        return 0;
    struct router_match m;
    if (router_match(s->router, ROUTER_METHOD_BIT(req.method_id), req.path, req.path_len, &m) < 0)
        return 0;
    const struct server_target *t = m.target;
    if (t->kind == SERVER_NOGIL) {
        /* safety: see inline_note; a stale value runs at most one more call inline. */
        if (atomic_load_explicit(&t->inline_state, memory_order_relaxed) != INLINE_LEARN)
            return 0;
        return inline_nogil(c, mine, t, &req, &m);
    }
    if (t->kind != SERVER_STATIC)
        return 0;
    size_t body_len = req.method_id == HTTP_HEAD ? 0 : t->static_body_len;
    if (STATIC_HEAD_MAX(t) + body_len > CONN_BUF_INITIAL)
        return 0;
    /* The request's views are not needed any more: the answer is built over them. */
    char *p = static_head_put(buf, t, 1, req.minor_version);
    memcpy(p, t->static_body, body_len);
    return inline_send(c, mine, buf, (size_t)(p - buf) + body_len, 1);
}

struct py_job {
    const struct server_target *t;
    cyserve_request *req;
    struct cyserve_response *resp;
};

static void py_trampoline(void *arg)
{
    struct py_job *j = arg;
    j->t->py_call(j->t->opaque, j->req, j->resp);
}

/* ---- streamed answers ----
 *
 * A Python handler (a WSGI app yielding its body as it goes: a download, server-sent events) may
 * leave resp->stream set: the body so far is in resp, and the rest comes from further calls of
 * the target's py_stream, each offloaded like the handler itself (one GIL batch per piece, so the
 * worker serves its other connections in between) and each piece written before the next is
 * asked for, so that a slow client slows the producer down instead of piling the body up in
 * memory; each write may wait body_timeout for progress, as any answer's. The body goes out
 * chunked to an HTTP/1.1 client, and until the connection closes to an HTTP/1.0 one. A handler
 * that fails midway can no longer be answered with a 500: the connection is closed without the
 * last chunk, which tells an HTTP/1.1 client that the body is incomplete. */
struct py_stream_job {
    const struct server_target *t;
    void *stream;
    struct cyserve_response *resp;
    int op;
    int rc;
};

static void py_stream_trampoline(void *arg)
{
    struct py_stream_job *j = arg;
    j->rc = j->t->py_stream(j->t->opaque, j->stream, j->resp, j->op);
}

/* A stream whose handler cannot be called any more (the stop cancels offloads): kept for
 * server_take_orphan. Out of memory, it is leaked. */
static void stream_orphan(struct server *s, const struct server_target *t, void *stream)
{
    pthread_mutex_lock(&s->orphan_lock);
    if (s->n_orphans == s->cap_orphans) {
        size_t cap = s->cap_orphans ? s->cap_orphans * 2 : 8;
        struct orphan *o = realloc(s->orphans, cap * sizeof(*o));
        if (o) {
            s->orphans = o;
            s->cap_orphans = cap;
        }
    }
    if (s->n_orphans < s->cap_orphans)
        s->orphans[s->n_orphans++] = (struct orphan){t, stream};
    pthread_mutex_unlock(&s->orphan_lock);
}

/* Give the stream back to its handler (the client left, or the stop cut the answer). */
static void stream_abandon(struct serve *sv, const struct server_target *t, void *stream,
                           struct cyserve_response *r)
{
    struct py_stream_job job = {t, stream, r, SERVER_STREAM_ABANDON, 0};
    if (sched_offload(py_stream_trampoline, &job) < 0)
        stream_orphan(sv->srv, t, stream);
}

int server_take_orphan(struct server *s, const struct server_target **t, void **stream)
{
    int got = 0;
    pthread_mutex_lock(&s->orphan_lock);
    if (s->n_orphans) {
        struct orphan o = s->orphans[--s->n_orphans];
        *t = o.t;
        *stream = o.stream;
        got = 1;
    }
    pthread_mutex_unlock(&s->orphan_lock);
    return got;
}

/* Write the head (if still in sv->out) and data[0..len) as one piece of a streamed body. */
static int send_piece(struct serve *sv, const char *data, size_t len, int chunked)
{
    if (!len)
        return flush(sv);
    if (!chunked)
        return flush_with(sv, data, len, 0);
    char size[24];
    int n = snprintf(size, sizeof(size), "%zx\r\n", len);
    if (UNLIKELY(wbuf_append(&sv->out, size, (size_t)n)))
        return -ENOMEM;
    struct iovec iov[3] = {
        {sv->out.ptr, sv->out.len}, {(void *)data, len}, {(void *)"\r\n", 2}};
    int rc = conn_sendv(sv, iov, 3, 0);
    sv->out.len = 0;
    return rc;
}

static int send_stream(struct serve *sv, const struct server_target *t, int keep, int head_only)
{
    struct cyserve_response *r = &sv->rq.resp;
    void *stream = r->stream;
    r->stream = NULL; /* from here on, this function owns the duty to release it */
    /* With a length announced, the pieces go out as they are and the connection can stay
     * open; without one, an HTTP/1.1 client gets chunks, an HTTP/1.0 one the close. */
    int64_t length = r->stream_length;
    int chunked = length < 0 && sv->rq.head.minor_version >= 1;
    if ((length < 0 && !chunked) || r->close)
        keep = 0;
    if (!keep)
        r->close = 1; /* serve_loop closes after this answer */
    size_t body_len;
    const char *body = resp_body(r, &body_len);
    if (!r->has_content_type) {
        static const char ct[] = "Content-Type: text/plain; charset=utf-8\r\n";
        if (UNLIKELY(wbuf_append(&r->headers, ct, sizeof(ct) - 1))) {
            stream_abandon(sv, t, stream, r);
            return -ENOMEM;
        }
    }
    uint64_t announce = length >= 0 ? (uint64_t)length
                        : chunked ? HTTP_LENGTH_CHUNKED : HTTP_LENGTH_UNTIL_CLOSE;
    int rc = http_write_head(&sv->out, r->status, sv->rq.head.minor_version, keep, announce,
                             r->headers.ptr, r->headers.len, date_now());
    if (UNLIKELY(rc) || head_only) {
        stream_abandon(sv, t, stream, r);
        log_response(sv, r->status, 0);
        return rc;
    }
    uint64_t sent = 0;
    int more = 1;
    for (;;) {
        if (length >= 0 && sent + body_len > (uint64_t)length)
            body_len = (size_t)((uint64_t)length - sent); /* never more than announced */
        sent += body_len;
        rc = send_piece(sv, body, body_len, chunked);
        if (rc || !more || (length >= 0 && sent == (uint64_t)length))
            break;
        r->body.len = 0;
        struct py_stream_job job = {t, stream, r, SERVER_STREAM_NEXT, 0};
        rc = sched_offload(py_stream_trampoline, &job);
        if (UNLIKELY(rc < 0)) {
            stream_orphan(sv->srv, t, stream); /* the server is stopping */
            return rc;
        }
        if (UNLIKELY(job.rc < 0)) {
            log_response(sv, r->status, (int64_t)sent);
            return -EIO; /* released; close without the last chunk */
        }
        more = job.rc; /* 0: released, and this piece is the last */
        body = resp_body(r, &body_len);
    }
    if (more)
        stream_abandon(sv, t, stream, r); /* the client left, or the announced length is reached */
    log_response(sv, r->status, (int64_t)sent);
    if (rc)
        return rc;
    if (length >= 0 && sent < (uint64_t)length)
        return -EIO; /* the body ended short of its Content-Length: only a close can say so */
    return chunked ? wbuf_append(&sv->out, "0\r\n\r\n", 5) : 0;
}

static int header_value(const struct serve *sv, const char *name, size_t nlen, const char **v,
                        size_t *vlen)
{
    for (size_t i = 0; i < sv->rq.head.num_headers; i++) {
        const struct http_header *h = &sv->rq.hdrs[i];
        if (h->name_len == nlen && strncasecmp(h->name, name, nlen) == 0) {
            *v = h->value;
            *vlen = h->value_len;
            return 1;
        }
    }
    *v = NULL;
    *vlen = 0;
    return 0;
}

/* sendfile count bytes of fd from offset, waiting for EPOLLOUT as needed. */
static int send_file_range(struct serve *sv, int fd, uint64_t offset, uint64_t count)
{
    off_t off = (off_t)offset;
    while (count > 0) {
        size_t chunk = count > (1u << 30) ? (1u << 30) : (size_t)count;
        ssize_t n = conn_tp_sendfile(sv->c, fd, &off, chunk);
        if (n > 0) {
            count -= (uint64_t)n;
            continue;
        }
        if (n == 0)
            return -EIO; /* the file shrank under us */
        if (n == -EINTR)
            continue;
        if (n != -EAGAIN)
            return (int)n;
        int rc = conn_wait_writable(sv);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* files_not_modified() over every If-None-Match line: a list may be split across several field
 * lines (RFC 9110 5.3), and a tag matching on any of them counts. Without If-None-Match the
 * (first) If-Modified-Since decides. */
static int not_modified(const struct serve *sv, const struct files_hit *hit)
{
    int seen = 0;
    for (size_t i = 0; i < sv->rq.head.num_headers; i++) {
        const struct http_header *h = &sv->rq.hdrs[i];
        if (h->name_len == 13 && strncasecmp(h->name, "if-none-match", 13) == 0) {
            if (files_not_modified(hit, h->value, h->value_len, NULL, 0))
                return 1;
            seen = 1;
        }
    }
    if (seen)
        return 0;
    const char *ims;
    size_t ims_len;
    header_value(sv, "if-modified-since", 17, &ims, &ims_len);
    return files_not_modified(hit, NULL, 0, ims, ims_len);
}

static int serve_files(struct serve *sv, const struct server_target *t,
                       const struct router_match *m, int keep, int head_only)
{
    enum http_method meth = sv->rq.head.method_id;
    if (meth != HTTP_GET && meth != HTTP_HEAD)
        return simple_response(sv, 405, "405 Method Not Allowed\n", "Allow: GET, HEAD\r\n", keep,
                               0);
    size_t pl = m->prefix_len <= sv->rq.head.path_len ? m->prefix_len : sv->rq.head.path_len;
    struct files_hit hit;
    int rc = files_open(t->root, sv->rq.head.path + pl, sv->rq.head.path_len - pl, &hit);
    if (rc == -EACCES)
        return simple_response(sv, 403, "403 Forbidden\n", NULL, keep, head_only);
    if (rc == -EINVAL)
        return simple_response(sv, 400, "400 Bad Request: invalid path\n", NULL, keep, head_only);
    if (rc == -ENOENT)
        return simple_response(sv, 404, "404 Not Found\n", NULL, keep, head_only);
    /* Out of descriptors or memory is the server's state, not the file's: a 404 would be wrong
     * and cacheable. */
    if (rc == -EMFILE || rc == -ENFILE || rc == -ENOMEM)
        return simple_response(sv, 503, "503 Service Unavailable\n", "Retry-After: 1\r\n", keep,
                               head_only);
    if (rc < 0)
        return simple_response(sv, 500, "500 Internal Server Error\n", NULL, keep, head_only);
    const char *range, *if_range;
    size_t range_len, if_range_len;
    header_value(sv, "range", 5, &range, &range_len);
    header_value(sv, "if-range", 8, &if_range, &if_range_len);
    /* A Range whose If-Range no longer matches is ignored: the client gets the whole new file. */
    if (range && !files_if_range(&hit, if_range, if_range_len))
        range = NULL;
    char lines[512];
    int n = snprintf(lines, sizeof(lines), "ETag: %.*s\r\nLast-Modified: %s\r\n",
                     (int)hit.etag_len, hit.etag, hit.last_modified);
    if (not_modified(sv, &hit)) {
        close(hit.fd);
        log_response(sv, 304, 0);
        return http_write_head(&sv->out, 304, sv->rq.head.minor_version, keep, 0, lines, (size_t)n,
                               date_now());
    }
    int status = 200;
    uint64_t start = 0, end = hit.size ? hit.size - 1 : 0, count = hit.size;
    if (range) {
        int r = files_parse_range(range, range_len, hit.size, &start, &end);
        if (r == -ERANGE) {
            close(hit.fd);
            char cr[96];
            snprintf(cr, sizeof(cr), "Content-Range: bytes */%llu\r\n",
                     (unsigned long long)hit.size);
            return simple_response(sv, 416, "416 Range Not Satisfiable\n", cr, keep, head_only);
        }
        if (r == 0) {
            status = 206;
            count = end - start + 1;
            n += snprintf(lines + n, sizeof(lines) - (size_t)n,
                          "Content-Range: bytes %llu-%llu/%llu\r\n", (unsigned long long)start,
                          (unsigned long long)end, (unsigned long long)hit.size);
        }
    }
    if (status == 200)
        start = 0;
    n += snprintf(lines + n, sizeof(lines) - (size_t)n,
                  "Content-Type: %.*s\r\nAccept-Ranges: bytes\r\n", (int)hit.content_type_len,
                  hit.content_type);
    log_response(sv, status, head_only ? 0 : (int64_t)count);
    rc = http_write_head(&sv->out, status, sv->rq.head.minor_version, keep, count, lines, (size_t)n,
                         date_now());
    if (!rc && !head_only && count) {
        rc = flush(sv);
        if (!rc)
            rc = send_file_range(sv, hit.fd, start, count);
    }
    close(hit.fd);
    return rc;
}

/* Route and answer one parsed request whose body is body[0..body_len). Returns 0 or -errno (the
 * connection must close). */
static int dispatch(struct serve *sv, const char *body, size_t body_len, int keep)
{
    struct http_request *req = &sv->rq.head;
    int head_only = req->method_id == HTTP_HEAD;
    struct router_match m;
    int rc = router_match(sv->srv->router, ROUTER_METHOD_BIT(req->method_id), req->path,
                          req->path_len, &m);
    if (rc == -ENOENT)
        return simple_response(sv, 404, "404 Not Found\n", NULL, keep, head_only);
    if (rc == -ENOTSUP) {
        char allow[128], line[160];
        router_format_allow(m.allow, allow, sizeof(allow));
        snprintf(line, sizeof(line), "Allow: %s\r\n", allow);
        return simple_response(sv, 405, "405 Method Not Allowed\n", line, keep, head_only);
    }
    if (UNLIKELY(rc < 0))
        return simple_response(sv, 500, "500 Internal Server Error\n", NULL, keep, head_only);
    const struct server_target *t = m.target;
    if (t->kind == SERVER_STATIC)
        return send_static(sv, t, keep, head_only);
    if (t->kind == SERVER_FILES)
        return serve_files(sv, t, &m, keep, head_only);

    /* The header views of the parser and of the public ABI have the same layout (checked below),
     * so the request is handed over without a copy. */
    cyserve_request creq = {
        .method = {req->method, req->method_len},
        .target = {req->target, req->target_len},
        .path = {req->path, req->path_len},
        .query = {req->query ? req->query : "", req->query ? req->query_len : 0},
        .minor_version = req->minor_version,
        .headers = (const cyserve_header *)(const void *)sv->rq.hdrs,
        .num_headers = req->num_headers,
        .body = {body_len ? body : "", body_len},
        .params = m.params,
        .num_params = m.num_params,
        .engine = &sv->rq,
    };
    resp_reset(&sv->rq.resp);
    int hrc;
    if (t->kind == SERVER_NOGIL) {
        /* safety: see inline_note. */
        if (atomic_load_explicit(&t->inline_state, memory_order_relaxed) < INLINE_LEARN) {
            uint64_t t0 = inline_ticks();
            hrc = t->fn(&creq, &sv->rq.resp, t->ctx);
            uint64_t took = inline_ticks() - t0;
            size_t blen;
            resp_body(&sv->rq.resp, &blen);
            inline_note(t, took, blen);
        } else {
            hrc = t->fn(&creq, &sv->rq.resp, t->ctx);
        }
    } else {
        struct py_job job = {t, &creq, &sv->rq.resp};
        rc = sched_offload(py_trampoline, &job);
        if (UNLIKELY(rc < 0))
            return rc; /* cancelled: the server is stopping */
        hrc = 0;
    }
    if (is_draining(sv->srv)) {
        /* The server started shutting down while the handler ran: this is the last answer on
         * this connection, and the client is told so. */
        sv->rq.resp.close = 1;
        keep = 0;
    }
    if (UNLIKELY(hrc != 0)) {
        note_handler_failure(&sv->rq.head, hrc);
        int close = sv->rq.resp.close;
        resp_reset(&sv->rq.resp);
        sv->rq.resp.close = close;
        return simple_response(sv, 500, "500 Internal Server Error\n", NULL, keep && !close,
                               head_only);
    }
    if (UNLIKELY(sv->rq.resp.stream))
        return send_stream(sv, t, keep, head_only);
    return send_resp(sv, keep, head_only);
}

_Static_assert(sizeof(struct http_header) == sizeof(cyserve_header), "header layout");
_Static_assert(offsetof(struct http_header, name) == offsetof(cyserve_header, name.ptr),
               "header layout");
_Static_assert(offsetof(struct http_header, name_len) == offsetof(cyserve_header, name.len),
               "header layout");
_Static_assert(offsetof(struct http_header, value) == offsetof(cyserve_header, value.ptr),
               "header layout");
_Static_assert(offsetof(struct http_header, value_len) == offsetof(cyserve_header, value.len),
               "header layout");

static int parse_head(struct serve *sv, size_t off)
{
    sv->rq.head.headers = sv->rq.hdrs;
    sv->rq.head.num_headers = sv->rq.max_headers;
    int n = http_parse_request(sv->c->buf + off, sv->c->len - off, &sv->rq.head,
                               &sv->srv->cfg.limits);
    if (n > 0)
        empty_path_is_root(&sv->rq.head);
    return n;
}

static const char continue_line[] = "HTTP/1.1 100 Continue\r\n\r\n";

/* Send 100 Continue if the client asked for it and we have not yet. */
static int maybe_continue(struct serve *sv, int *sent)
{
    if (!sv->rq.head.expect_continue || *sent)
        return 0;
    *sent = 1;
    int rc = flush(sv);
    if (rc)
        return rc;
    return wbuf_append(&sv->out, continue_line, sizeof(continue_line) - 1) ?: flush(sv);
}

/* Read the body of the request whose head ends at head_end. On success *body, *body_len are set
 * and *next is where the next request starts; returns 0. Otherwise returns SERVE_CLOSE after
 * answering (413, 400, 408) or on a dead connection. */
static int read_body(struct serve *sv, size_t off, size_t head_len, const char **body,
                     size_t *body_len, size_t *next)
{
    struct conn *c = sv->c;
    struct server *s = sv->srv;
    size_t head_end = off + head_len;
    char *old_buf = c->buf;
    int sent_continue = 0;
    *body = NULL;
    *body_len = 0;
    if (sv->rq.head.chunked) {
        struct http_chunked st;
        memset(&st, 0, sizeof(st));
        size_t dec = 0; /* decoded body bytes at head_end */
        for (;;) {
            size_t l = c->len - (head_end + dec);
            int64_t r = http_chunked_decode(&st, c->buf + head_end + dec, &l,
                                            s->cfg.limits.max_header_bytes);
            if (r == -1)
                return error_close(sv, 400, "invalid chunked body");
            dec += l;
            if (dec > s->cfg.max_body_bytes)
                return error_close(sv, 413, "request body too large");
            if (r >= 0) {
                c->len = head_end + dec + (size_t)r;
                break;
            }
            c->len = head_end + dec;
            /* A chunk announced bigger than what the limit leaves is refused now, not after
             * max_body_bytes of it have been read. While a size line is being read, remaining
             * holds its digits so far, which only grow. */
            if (st.remaining > s->cfg.max_body_bytes - dec)
                return error_close(sv, 413, "request body too large");
            if (maybe_continue(sv, &sent_continue))
                return SERVE_CLOSE;
            if (conn_reserve(sv, c->len + 4096) < 0)
                return error_close(sv, 413, "request body too large");
            ssize_t n = conn_read_wait(sv, deadline_after(s->cfg.body_timeout_ns));
            if (n == -ETIMEDOUT)
                return error_close(sv, 408, "request body timed out");
            if (n <= 0)
                return SERVE_CLOSE;
        }
        *body_len = dec;
        *next = head_end + dec;
    } else if (sv->rq.head.content_length > 0) {
        uint64_t cl = (uint64_t)sv->rq.head.content_length;
        if (cl > s->cfg.max_body_bytes)
            return error_close(sv, 413, "request body too large");
        size_t need = head_end + (size_t)cl;
        if (c->len < need) {
            if (maybe_continue(sv, &sent_continue))
                return SERVE_CLOSE;
            if (conn_reserve(sv, need) < 0)
                return error_close(sv, 413, "request body too large");
            while (c->len < need) {
                ssize_t n = conn_read_wait(sv, deadline_after(s->cfg.body_timeout_ns));
                if (n == -ETIMEDOUT)
                    return error_close(sv, 408, "request body timed out");
                if (n <= 0)
                    return SERVE_CLOSE;
            }
        }
        *body_len = (size_t)cl;
        *next = need;
    } else {
        *next = head_end;
    }
    if (c->buf != old_buf) {
        /* The buffer moved while it grew: the head's views must point into the new one. The
         * head bytes themselves did not change, so this parse gives the same result. */
        if (parse_head(sv, off) != (int)head_len)
            return error_close(sv, 400, "request head changed");
    }
    if (*body_len)
        *body = c->buf + head_end;
    return 0;
}

/* Go idle: called right after sched_io_release() returned 0, so in the home section (the home's
 * loop lock is held until the coroutine ends). The buffer goes to this thread's cache. */
static void conn_go_idle(struct serve *sv)
{
    struct conn *c = sv->c;
    if (c->buf) {
        buf_put(current_worker(sv->srv), c->buf, c->cap);
        c->buf = NULL;
        c->cap = c->len = 0;
    }
    c->idle_since = sched_now_ns();
    c->drained = 0; /* said of the last read only: the next one starts knowing nothing */
    c->busy = 0;
    if (!c->timer_armed) {
        sched_timer_arm(&c->idle, c->idle_since + sv->srv->cfg.keepalive_ns);
        c->timer_armed = 1;
    }
}

/* Whether b[0..n) is nothing but complete empty lines (CRLF pairs), which RFC 9112 2.2 lets a
 * server ignore before a request line. */
static int only_empty_lines(const char *b, size_t n)
{
    if (n == 0 || n % 2)
        return 0;
    for (size_t i = 0; i < n; i += 2)
        if (b[i] != '\r' || b[i + 1] != '\n')
            return 0;
    return 1;
}

static int serve_loop(struct serve *sv)
{
    struct conn *c = sv->c;
    struct server *s = sv->srv;
    size_t off = 0;
    int64_t head_deadline = -1;
    int drain_read = 0;
    for (;;) {
        if (off == c->len) {
            off = c->len = 0;
            if (flush(sv) < 0)
                return SERVE_CLOSE;
            if (UNLIKELY(is_draining(s))) {
                /* Shutting down. A request the client has already sent is answered (with
                 * Connection: close) rather than reset by closing over it; nothing is waited
                 * for. One look: an answered request closes the connection anyway. */
                if (drain_read)
                    return SERVE_CLOSE;
                drain_read = 1;
                if (conn_read_once(sv) <= 0)
                    return SERVE_CLOSE;
                continue;
            }
            if (sv->c->drained) {
                int rc = sched_io_release(&c->io);
                if (rc == 0) {
                    conn_go_idle(sv);
                    return SERVE_IDLE;
                }
                if (rc != -EAGAIN)
                    return SERVE_CLOSE;
                sv->c->drained = 0;
            }
            ssize_t n = conn_read_once(sv);
            if (n == -EAGAIN)
                continue; /* drained is set now: release on the next turn */
            if (n <= 0)
                return SERVE_CLOSE;
        }
        int n = parse_head(sv, off);
        if (n == -2 && only_empty_lines(c->buf + off, c->len - off)) {
            /* A stray CRLF after a request (clients send one after a POST body) is not the
             * start of a head: drop it and let the connection go idle, rather than start the
             * head deadline and answer 408 to a request nobody sent. */
            off = c->len;
            head_deadline = -1; /* no head has begun */
            continue;
        }
        if (n == -2) {
            if (head_deadline < 0)
                head_deadline = deadline_after(s->cfg.header_timeout_ns);
            /* Responses to earlier pipelined requests go out before we wait for more. */
            if (flush(sv) < 0)
                return SERVE_CLOSE;
            if (off) {
                memmove(c->buf, c->buf + off, c->len - off);
                c->len -= off;
                off = 0;
            }
            if (c->len == c->cap) {
                /* The parser answers 431/414 before a head outgrows the limits, so growth here
                 * is bounded by max_header_bytes, or max_target_bytes and the method while a
                 * long target arrives; the check is a second line of defence. */
                if (c->cap > s->cfg.limits.max_header_bytes + s->cfg.limits.max_target_bytes +
                                 CONN_BUF_INITIAL)
                    return error_close(sv, 431, "request head too large");
                if (conn_reserve(sv, c->cap * 2) < 0)
                    return SERVE_CLOSE;
            }
            ssize_t r = conn_read_wait(sv, head_deadline);
            if (r == -ETIMEDOUT)
                return error_close(sv, 408, "request head not received in time");
            if (r <= 0)
                return SERVE_CLOSE;
            continue;
        }
        if (n < 0)
            return error_close(sv, sv->rq.head.status ? sv->rq.head.status : 400,
                               sv->rq.head.error ? sv->rq.head.error : "malformed request");
        head_deadline = -1;
        if (UNLIKELY(s->cfg.access_log_fd >= 0)) {
            sv->rq.log_have_req = 1;
            sv->rq.log_t0 = mono_ns();
        }
        const char *body = NULL;
        size_t body_len = 0, next = off;
        if (read_body(sv, off, (size_t)n, &body, &body_len, &next))
            return SERVE_CLOSE;
        int keep = sv->rq.head.keep_alive && !is_draining(s);
        int rc = dispatch(sv, body, body_len, keep);
        if (UNLIKELY(s->cfg.access_log_fd >= 0)) {
            access_log(sv);
            sv->rq.log_have_req = 0;
        }
        if (rc < 0)
            return SERVE_CLOSE;
        if (sv->rq.resp.close)
            keep = 0;
        off = next;
        if (!keep) {
            flush(sv);
            return SERVE_CLOSE;
        }
        if (sv->out.len >= OUT_FLUSH_AT && flush(sv) < 0)
            return SERVE_CLOSE;
    }
}

/* conn_proto.on_readable of HTTP/1: a lone request is answered inline when it can be, else
 * the coroutine serves the connection. */
static void http1_on_readable(struct conn *c, uint32_t events)
{
    if (!(events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && conn_serve_inline(c))
        return;
    int rc = sched_spawn(c->home->srv->sched, conn_serve, c);
    if (UNLIKELY(rc < 0))
        conn_destroy(c); /* shutting down or out of memory: drop the connection */
}

/* conn_proto.on_timeout of HTTP/1: an idle keep-alive connection past its time is closed. */
static void http1_on_timeout(struct conn *c)
{
    conn_destroy(c);
}

static int conn_serve(struct coro *co, void *arg)
{
    struct conn *c = arg;
    struct server *s = c->home->srv;
    /* The serving state lives in this frame: no allocation per coroutine. The scheduler
     * unwinds a coroutine it cancels by resuming it with -ECANCELED, so the cleanup below runs
     * then too; only a coroutine freed while never resumed again would leave the heap parts of
     * its buffers (grown past their inline sizes) behind, and that happens at most once per
     * connection, at shutdown. */
    struct serve state;
    struct serve *sv = &state;
    sv->c = c;
    sv->srv = s;
    sv->rq.c = c;
    sv->rq.srv = s;
    sv->rq.log_status = 0;
    sv->rq.log_have_req = 0;
    resp_init(&sv->rq.resp);
    wbuf_init(&sv->out, sv->out_inline, sizeof(sv->out_inline));
    sv->rq.max_headers = s->cfg.limits.max_headers;
    sv->rq.hdrs = sv->rq.hdr_inline;
    if (sv->rq.max_headers > INLINE_HEADERS) {
        sv->rq.hdrs = coro_malloc(co, sizeof(struct http_header) * sv->rq.max_headers);
        if (UNLIKELY(!sv->rq.hdrs)) {
            conn_destroy(c);
            return 0;
        }
    }
    memset(&sv->rq.head, 0, sizeof(sv->rq.head));
    int rc = SERVE_CLOSE;
    if (c->pend) {
        /* The rest of an answer the inline path began. */
        struct iovec iov = {c->buf, c->pend};
        if (conn_sendv(sv, &iov, 1, 0) < 0 || c->pend_close)
            goto out;
        c->pend = 0;
    }
    rc = serve_loop(sv);
out:
    serve_cleanup(sv);
    if (rc == SERVE_CLOSE)
        conn_destroy(c);
    return 0;
}

/* ---- start and stop ---- */

static int start_fail(char *errmsg, size_t errlen, int rc, const char *fmt, const char *host, int port)
{
    if (errmsg && errlen)
        snprintf(errmsg, errlen, fmt, host, port, strerror(-rc));
    return rc;
}

static int open_listener(const struct addrinfo *ai, int port, int reuseport, int backlog,
                         int *out)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    struct sockaddr_storage sa;
    memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
    if (ai->ai_family == AF_INET6)
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr *)&sa, ai->ai_addrlen) < 0 || listen(fd, backlog) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    *out = fd;
    return 0;
}

static int bound_port(int fd)
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof(sa);
    if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
        return -errno;
    if (sa.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
    return ntohs(((struct sockaddr_in *)&sa)->sin_port);
}

static void close_workers(struct server *s)
{
    for (unsigned i = 0; s->workers && i < s->nworkers; i++) {
        struct server_worker *w = &s->workers[i];
        if (w->lfd >= 0)
            close(w->lfd);
        if (w->ctl_fd >= 0)
            close(w->ctl_fd);
        w->lfd = w->ctl_fd = -1;
        /* No worker runs any more: the connections are plain memory now. */
        while (w->conns) {
            struct conn *c = w->conns;
            w->conns = c->next;
            if (c->proto->close)
                c->proto->close(c);
            close(c->io.fd);
            free(c->buf);
            free(c->peer);
            free(c);
        }
        while (w->free_conns) {
            struct conn *c = w->free_conns;
            w->free_conns = c->next;
            free(c);
        }
        while (w->nfree_bufs)
            free(w->free_bufs[--w->nfree_bufs]);
    }
    free(s->workers);
    s->workers = NULL;
    atomic_store_explicit(&s->live, 0, memory_order_relaxed); /* safety: no worker runs */
}

/* Free the scheduler, then the workers and their connections (the scheduler goes first: freeing
 * it cancels coroutines that may still wait on a connection's sched_io, which lives inside the
 * connection), keeping their counters. No worker may run. */
static void teardown(struct server *s)
{
    pthread_mutex_lock(&s->stats_lock);
    for (unsigned i = 0; s->workers && i < s->nworkers; i++)
        s->ended_inline += atomic_load_explicit(&s->workers[i].inline_ok, memory_order_relaxed);
    if (s->sched) {
        struct sched_stats st;
        sched_get_stats(s->sched, &st);
        s->ended_spawned += st.spawned;
    }
    sched_free(s->sched);
    s->sched = NULL;
    close_workers(s);
    pthread_mutex_unlock(&s->stats_lock);
}

int server_start(struct server *s, char *errmsg, size_t errlen)
{
    if (errmsg && errlen)
        errmsg[0] = 0;
    /* safety: the control thread is the only writer of running. */
    if (atomic_load_explicit(&s->running, memory_order_relaxed) || s->sched)
        return -EALREADY;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int gai = getaddrinfo(s->host, NULL, &hints, &res);
    if (gai != 0 || !res) {
        if (errmsg && errlen)
            snprintf(errmsg, errlen, "cannot resolve host %s: %s", s->host, gai_strerror(gai));
        return -EINVAL;
    }
    /* Probe without SO_REUSEPORT: a reuseport bind would silently join another server's group
     * on the same port instead of failing, and "address already in use" must be reported. With
     * shared_port the group is ours (sibling processes; their supervisor made that probe), so
     * the probe joins it. */
    int probe = -1;
    int rc = open_listener(res, s->cfg.port, s->cfg.shared_port ? 1 : 0, 1, &probe);
    if (rc < 0) {
        freeaddrinfo(res);
        return start_fail(errmsg, errlen, rc, "cannot listen on %s:%d: %s", s->host, s->cfg.port);
    }
    int port = bound_port(probe);
    close(probe);
    struct sched_config sc;
    memset(&sc, 0, sizeof(sc));
    sc.workers = s->cfg.threads;
    sc.keep_alive = 1;
    struct sched *sched;
    rc = sched_new(&sched, &sc);
    if (rc < 0) {
        freeaddrinfo(res);
        return start_fail(errmsg, errlen, rc, "cannot start workers for %s:%d: %s", s->host, port);
    }
    pthread_mutex_lock(&s->stats_lock);
    s->sched = sched;
    s->nworkers = sched_workers(s->sched);
    s->workers = calloc(s->nworkers, sizeof(*s->workers));
    pthread_mutex_unlock(&s->stats_lock);
    if (!s->workers) {
        rc = -ENOMEM;
        goto fail_sched;
    }
    for (unsigned i = 0; i < s->nworkers; i++) {
        s->workers[i].srv = s;
        s->workers[i].id = i;
        s->workers[i].lfd = s->workers[i].ctl_fd = -1;
    }
    for (unsigned i = 0; i < s->nworkers; i++) {
        struct server_worker *w = &s->workers[i];
        rc = open_listener(res, port, 1, s->cfg.backlog, &w->lfd);
        if (rc < 0)
            goto fail_sched;
        w->ctl_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (w->ctl_fd < 0) {
            rc = -errno;
            goto fail_sched;
        }
    }
    freeaddrinfo(res);
    res = NULL;
    s->port = port;
    sched_set_worker_hooks(s->sched, worker_start, NULL, s);
    if (s->off_begin || s->off_end)
        sched_set_offload_hooks(s->sched, s->off_begin, s->off_end, s->off_ud);
    /* safety: workers read draining only after sched_start's thread creation, which orders
     * this store before them. */
    atomic_store_explicit(&s->draining, 0, memory_order_relaxed);
    rc = sched_start(s->sched);
    if (rc < 0)
        goto fail_sched;
    /* safety: release pairs with server_running's acquire. */
    atomic_store_explicit(&s->running, 1, memory_order_release);
    return 0;

fail_sched:
    if (res)
        freeaddrinfo(res);
    teardown(s);
    return start_fail(errmsg, errlen, rc, "cannot listen on %s:%d: %s", s->host, port);
}

int server_shutdown(struct server *s, uint64_t grace_ns)
{
    if (UNLIKELY(sched_worker_id() >= 0))
        return -EDEADLK; /* a handler stopping its own server would wait for itself */
    uint64_t deadline = mono_ns() + grace_ns;
    int expected = 0;
    /* safety: the CAS elects one thread to run the shutdown; a second caller (Ctrl-C pressed
     * twice: "stop now") only pulls the deadline in and waits for the first to finish. */
    if (!atomic_compare_exchange_strong_explicit(&s->stopping, &expected, 1, memory_order_acq_rel,
                                                 memory_order_acquire)) {
        uint64_t cur = atomic_load_explicit(&s->stop_deadline, memory_order_relaxed);
        /* safety: min-update of the deadline; the CAS loop only ever lowers it. */
        while (deadline < cur && !atomic_compare_exchange_weak_explicit(
                                     &s->stop_deadline, &cur, deadline, memory_order_relaxed,
                                     memory_order_relaxed))
            ;
        while (server_running(s)) {
            struct timespec ts = {0, 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        return 0;
    }
    if (!s->sched)
        return 0;
    /* safety: read by a concurrent second caller and by the wait loop below only. */
    atomic_store_explicit(&s->stop_deadline, deadline, memory_order_relaxed);
    /* safety: see is_draining. */
    atomic_store_explicit(&s->draining, 1, memory_order_relaxed);
    for (unsigned i = 0; i < s->nworkers; i++) {
        uint64_t one = 1;
        ssize_t n = write(s->workers[i].ctl_fd, &one, sizeof(one));
        (void)n; /* an eventfd write of 1 only fails on counter overflow, impossible here */
    }
    while (server_live_connections(s) > 0 &&
           mono_ns() < atomic_load_explicit(&s->stop_deadline, memory_order_relaxed)) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    sched_stop(s->sched);
    sched_join(s->sched);
    teardown(s);
    /* safety: the workers are joined; release pairs with server_running's acquire. */
    atomic_store_explicit(&s->running, 0, memory_order_release);
    return 0;
}

void server_free(struct server *s)
{
    if (!s)
        return;
    server_shutdown(s, 0);
    /* safety: the workers are joined, this thread is the only one left touching s. */
    unsigned n = atomic_load_explicit(&s->ext_count, memory_order_relaxed);
    for (unsigned i = 0; i < n; i++)
        if (s->ext[i].fd >= 0)
            close(s->ext[i].fd);
    pthread_mutex_destroy(&s->ext_lock);
    pthread_mutex_destroy(&s->stats_lock);
    pthread_mutex_destroy(&s->orphan_lock);
    free(s->orphans); /* what was not taken is leaked: its owner (Python) is not here */
    free(s->host);
    free(s);
}

void server_get_stats(struct server *s, struct server_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->live = server_live_connections(s);
    pthread_mutex_lock(&s->stats_lock);
    out->inline_ok = s->ended_inline;
    out->spawned = s->ended_spawned;
    for (unsigned i = 0; s->workers && i < s->nworkers; i++)
        out->inline_ok += atomic_load_explicit(&s->workers[i].inline_ok, memory_order_relaxed);
    if (s->sched) {
        struct sched_stats st;
        sched_get_stats(s->sched, &st);
        out->spawned += st.spawned;
    }
    pthread_mutex_unlock(&s->stats_lock);
}

int server_req_peer(const cyserve_request *req, const char **out)
{
    struct request *rq = req->engine;
    if (!rq)
        return -ENOTCONN;
    const char *peer = log_peer(rq->c); /* cached on the connection after its first call */
    if (peer[0] == '-')
        return -ENOTCONN;
    *out = peer;
    return 0;
}

int server_req_header(const cyserve_request *req, const char *name, size_t nlen,
                      cyserve_str *out)
{
    for (size_t i = 0; i < req->num_headers; i++) {
        const cyserve_header *h = &req->headers[i];
        if (h->name.len == nlen && strncasecmp(h->name.ptr, name, nlen) == 0) {
            *out = h->value;
            return 0;
        }
    }
    return -ENOENT;
}
