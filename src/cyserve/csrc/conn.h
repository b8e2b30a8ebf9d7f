/* conn.h: connections: the struct every accepted socket gets, its protocol and transport, the
 * per-worker caches of read buffers and connection structs, and the reads and writes with
 * deadlines that a protocol's coroutine makes. The design (who owns which field, on which
 * thread; the timeouts) is at the top of conn.c.
 *
 * Internal to the engine (csrc/conn.c, listen.c, http1*.c ...); error convention 0 or -errno. */
#ifndef CYSERVE_CONN_H
#define CYSERVE_CONN_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include "compat.h"
#include "sched.h"
#include "server_int.h"

struct conn;

/* What speaks on a connection: HTTP/1.1 today (http1_proto, http1_inline.c). The listener
 * picks it for the connections it accepts (conn_open); a protocol that takes a connection over
 * (WebSocket after an Upgrade) sets c->proto and c->proto_data from its coroutine. There is no
 * on_writable: sched reports only the readable readiness of an idle connection, and a protocol
 * that must wait to write does so in its coroutine (conn_sendv waits), as HTTP/1 does. */
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
    /* When the idle connection's timer is due (sched_now_ns() clock), 0 for never; NULL: its
     * idle_since plus the keep-alive timeout, as for HTTP/1. Home's loop lock held. */
    uint64_t (*idle_deadline)(struct conn *c);
};

/* How bytes cross a connection: plain sockets (conn_plain) or TLS (tls_transport, tls.h). Each returns bytes moved (recv: 0 at end of stream) or -errno; -EAGAIN
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
    /* c is being destroyed: free c->tp_data (called only when it is set). Home's loop lock
     * held, or no worker runs any more. May be NULL for a transport that keeps no state. */
    void (*close)(struct conn *c);
    /* Complete the transport's handshake before the protocol reads, waiting in the coroutine,
     * so that the protocol the client chose by ALPN is known: CONN_ALPN_HTTP1 (http/1.1, or no
     * ALPN), CONN_ALPN_H2, 0 when the client left first, or -errno. Called by HTTP/1's
     * coroutine when it starts (every connection starts as HTTP/1), cheap once done. NULL for
     * a transport without a handshake (plain sockets). */
    int (*handshake)(struct conn *c);
    /* One read without waiting by a thread other than c's coroutine, while the coroutine waits
     * for it (a handler reading a streamed body, body.c): as recv, and on -EAGAIN *events says
     * what to poll(2) for (POLLIN, or POLLOUT when a read has to write first). NULL for plain
     * sockets, which body.c reads with conn_sock_recv. */
    ssize_t (*recv_nowait)(struct conn *c, void *buf, size_t len, short *events);
    /* One write without waiting, outside c's coroutine, by c's home while no coroutine serves
     * c (a stop's sweep of idle connections, which holds the home's loop lock): as send(2) with
     * MSG_DONTWAIT, -EAGAIN when the socket is full. NULL for plain sockets, which
     * conn_send_nowait writes with conn_sock_send. */
    ssize_t (*send_nowait)(struct conn *c, const void *buf, size_t len);
};

enum { CONN_ALPN_HTTP1 = 1, CONN_ALPN_H2 = 2 };

struct conn {
    struct sched_io io; /* io.data == this; io.fd is the socket */
    const struct conn_proto *proto;
    void *proto_data; /* the protocol's, NULL for HTTP/1 */
    const struct conn_transport *tp;
    void *tp_data;              /* the transport's state (a TLS session), NULL for plain sockets */
    struct server_worker *home; /* the worker whose epoll holds io */
    struct conn *prev, *next;   /* home->conns; home worker only */
    struct sched_timer idle;    /* lazy keep-alive timer; home worker only */
    uint64_t idle_since;        /* sched_now_ns() when it last went idle */
    char *buf;                  /* read buffer, NULL while idle */
    size_t cap, len;            /* buf size, bytes held */
    size_t pend;                /* buf[0..pend): the unsent rest of an inline answer */
    int pend_close;             /* ... after which the connection closes */
    int drained;                /* the last read was short: nothing more to read */
    /* 1: a coroutine serves it (or is about to), counted in the home's busy count;
     * CONN_BUSY_UNCOUNTED: a readiness callback looks at it (conn_on_ready), which the inline
     * path may answer and leave idle within the callback; 0: idle. Home worker only. */
    int busy;
    int timer_armed; /* idle is armed; home worker only */
    int fresh; /* accepted, and nothing read from it yet (no readiness seen); home worker only */
    int stray_crlf; /* HTTP/1: a lone CRLF was let go since the last request */
    char *peer;     /* "address:port" for the access log, made on its first line */
    int peer_trust; /* proxy headers: 0 not asked yet, 1 the peer is trusted, 2 it is not */
    int pp_wait;    /* a PROXY protocol header is due before anything else (conn_proxy_preface) */
    /* safety (field): set (relaxed) by on_ready when the readiness that woke the connection
     * said the peer reset it (EPOLLHUP/EPOLLERR): whatever request is still in the buffer has
     * nobody to answer. Read as a hint by the request's Python call (request.c). */
    int peer_reset;
    /* safety (field): clock_mono_ns() when a Python call's peek last found the peer there,
     * stored and read relaxed by the threads that run the calls (request.c): a hint that spares
     * the calls of one connection queued together (HTTP/2's streams) a peek each. */
    uint64_t peer_seen;
};

/* The plain transport: the socket's own system calls. */
extern const struct conn_transport conn_plain;

/* The two system calls of a keep-alive request, made directly. glibc's read/recv/send/sendmsg
 * are cancellation points whose wrappers toggle asynchronous cancellation around the call, and
 * cyserve never cancels a thread; the kernel's read path (vfs_read, fdget_pos, sock_read_iter)
 * and sendmsg's msghdr and iovec copies are work that recvfrom and sendto skip. Together ~3% of
 * the CPU time per /plaintext request in a profile; measured: +1.4% (static) and +2.0% (nogil)
 * requests per server CPU-second (bench/micro/plaintext_floor.py, 5 interleaved rounds, medians).
 * Under ASan or TSan the libc calls stay, so that the sanitizers' interceptors still check and
 * annotate the buffers. Both return the byte count or -1 with errno set, like the libc calls. */
static inline ssize_t conn_sock_recv(int fd, void *buf, size_t len)
{
#if defined(CYSERVE_ASAN) || defined(CYSERVE_TSAN)
    return recv(fd, buf, len, 0);
#else
    return syscall(SYS_recvfrom, fd, buf, len, 0, NULL, NULL);
#endif
}

/* Whether a byte waits to be read: > 0 yes, 0 end of stream, < 0 nothing (or an error). */
static inline ssize_t conn_sock_peek(int fd, char *b)
{
    return recv(fd, b, 1, MSG_PEEK | MSG_DONTWAIT);
}

static inline ssize_t conn_sock_send(int fd, const void *buf, size_t len, int flags)
{
#if defined(CYSERVE_ASAN) || defined(CYSERVE_TSAN)
    return send(fd, buf, len, flags);
#else
    return syscall(SYS_sendto, fd, buf, len, flags, NULL, 0);
#endif
}

static inline char *conn_buf_get(struct server_worker *w)
{
    if (w->nfree_bufs)
        return w->free_bufs[--w->nfree_bufs];
    return malloc(CONN_BUF_INITIAL);
}

static inline void conn_buf_put(struct server_worker *w, char *buf, size_t cap)
{
    if (cap == CONN_BUF_INITIAL && w->nfree_bufs < CONN_BUF_CACHE_MAX)
        w->free_bufs[w->nfree_bufs++] = buf;
    else
        free(buf);
}

/* An absolute deadline ns from now on sched_now_ns()'s clock, as sched_io_wait takes it. */
static inline int64_t conn_deadline_after(uint64_t ns)
{
    return (int64_t)(sched_now_ns() + ns);
}

/* c->busy while a readiness callback has it and has not counted it (conn.h, busy). */
#define CONN_BUSY_UNCOUNTED 2

/* Set c's busy flag (0, 1 or CONN_BUSY_UNCOUNTED), and keep its home's count of busy
 * connections (the metrics' idle and active connections) when metrics are on: the count is of
 * the connections whose flag is 1. A readiness callback marks its connection
 * CONN_BUSY_UNCOUNTED, and pays (1) only when a coroutine takes it (conn_busy_pay): a request
 * the inline path answers is busy for microseconds within one callback, which the publisher's
 * look every 100 ms would not see, and counting it cost two adds per request (metrics.c, "What
 * a request costs"). With the home's loop lock held: the lock makes the home's count
 * single-writer, so a relaxed load and store do (no locked instruction). */
static inline void conn_set_busy(struct conn *c, int busy)
{
    if (UNLIKELY(c->home->srv->metrics_on) && (c->busy == 1) != (busy == 1)) {
        _Atomic uint64_t *n = &c->home->busy;
        /* safety: see above; the publisher reads it relaxed, any recent value will do. */
        atomic_store_explicit(n,
                              atomic_load_explicit(n, memory_order_relaxed) +
                                  (busy == 1 ? 1 : (uint64_t)-1),
                              memory_order_relaxed);
    }
    c->busy = busy;
}

/* A readiness callback hands c to a coroutine: c is busy, and counted, from now on. */
static inline void conn_busy_pay(struct conn *c)
{
    if (c->busy == CONN_BUSY_UNCOUNTED)
        conn_set_busy(c, 1);
}

/* The callback that served c's readiness itself (the inline path) is done with it and leaves
 * it idle: its buffer goes back to the cache of mine (the calling thread's worker), the
 * keep-alive timer is armed if it is not, and its next readable event calls on_readable again.
 * Callback with the home's loop lock. */
static inline void conn_idle_inline(struct conn *c, struct server_worker *mine)
{
    conn_buf_put(mine, c->buf, c->cap);
    c->buf = NULL;
    c->cap = c->len = 0;
    c->drained = 0; /* said of this read only: the next one starts knowing nothing */
    conn_set_busy(c, 0);
    if (!c->timer_armed) {
        sched_timer_arm(&c->idle, c->idle_since + c->home->srv->cfg.keepalive_ns);
        c->timer_armed = 1;
    }
    sched_io_idle(&c->io);
}

/* Register the accepted socket fd on worker `home` (the acceptor's listener's: the connection's
 * home from now on; the acceptor may run on another thread, a rescuer or a relief thread, which
 * must not become a home), spoken by proto over tp. On failure fd is closed. Acceptor
 * coroutine, outside any home section. */
void conn_open(struct server *s, unsigned home, int fd, const struct conn_proto *proto,
               const struct conn_transport *tp);

/* Close and free c (its protocol's close first). From a callback holding the home's loop lock,
 * or from c's coroutine (sched_io_del enters the home section, which lasts until the coroutine
 * ends). */
void conn_destroy(struct conn *c);

/* Go idle after sched_io_release() returned 0 (in the home section): the buffer goes to this
 * thread's cache, the keep-alive timer runs from now. Coroutine only. */
void conn_go_idle(struct conn *c);

/* Make sure c has a read buffer with at least want bytes of capacity. 0 or -ENOMEM. The
 * coroutine serving c. */
int conn_reserve(struct conn *c, size_t want);

/* One read into the free space of the buffer; sets c->drained after a short read or EAGAIN.
 * Returns bytes read (> 0), 0 at end of stream, -EAGAIN, or -errno. The coroutine serving c. */
ssize_t conn_read_once(struct conn *c);

/* Read at least one byte, waiting for readiness until deadline (absolute ns, < 0: none).
 * Returns > 0, 0 at end of stream, -ETIMEDOUT, -ECANCELED, or -errno. Coroutine only. */
ssize_t conn_read_wait(struct conn *c, int64_t deadline);

/* Send iov[0..cnt) completely, waiting as needed; each wait may last body_timeout (a client
 * that stops reading is dropped, see conn_wait_writable in conn.c). flags: 0, or MSG_MORE when
 * more bytes of the same response follow at once (sendfile), so the kernel does not push the
 * head in a segment of its own. Modifies iov. Returns 0 or -errno. Coroutine only. */
int conn_sendv(struct conn *c, struct iovec *iov, int cnt, int flags);

/* Write buf[0..len) to c through its transport without waiting (a goodbye frame from a stop's
 * sweep, see conn_transport.send_nowait): bytes written, or -EAGAIN / -errno. Only by c's home
 * with its loop lock held while c is not busy, or after every worker ended; never SIGPIPE. */
ssize_t conn_send_nowait(struct conn *c, const void *buf, size_t len);

/* Send count bytes of file fd from offset, waiting as conn_sendv does. 0 or -errno (-EIO: the
 * file shrank). Coroutine only. */
int conn_sendfile(struct conn *c, int fd, uint64_t offset, uint64_t count);

/* After an error response: stop writing, read and drop what the client still sends for a short
 * while, so that close() does not reset the connection before the client read our answer.
 * Coroutine only. */
void conn_linger_close(struct conn *c);

/* The client's "address:port" ("[v6]:port"), made on the first call and kept on c, or "-" when
 * it cannot be known. The thread serving c. */
const char *conn_peer(struct conn *c);

/* With server_config.proxy_protocol_from, a connection from a peer listed there (c->pp_wait)
 * begins with a PROXY protocol header (proxyproto.h): read it, and only it, from the socket
 * (peeked, then consumed to its last byte, so that a TLS handshake or the request behind it
 * stays in the socket for the transport), within header_timeout. Its client becomes c's peer
 * (conn_peer, and so the access log, WSGI's REMOTE_ADDR, ASGI's client, Request.client) and the
 * peer whose proxy headers are believed or not; a header that names no client (LOCAL, UNKNOWN)
 * leaves the socket's peer. Returns 0, -EPROTO (not a valid header: close without an answer),
 * -ETIMEDOUT, or -errno. The connection's coroutine, before its first read. */
int conn_proxy_preface(struct conn *c);

#endif
