/* conn.c: connections: open, destroy, idle and its timer, the plain transport, the per-worker
 * caches, and the reads and writes with deadlines of the coroutine that serves a connection.
 *
 * Connections. A connection is a struct conn: its sched_io, a read buffer taken from a
 * per-worker cache only while it has bytes to hold, a lazy idle timer, and list links. When an
 * idle connection becomes readable, conn_on_ready() (on the home worker, not in a coroutine)
 * marks it busy and calls its protocol's on_readable. HTTP/1 first tries the inline path
 * (http1_inline.c: a lone request whose answer needs nothing that can wait is answered right
 * there), else spawns its coroutine (http1_serve, http1.c). The coroutine reads,
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
 * instead: each is touched only by the worker thread it belongs to (server_worker_self()), whatever
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
 * Protocols and transports. What a connection speaks is c->proto (struct conn_proto), chosen by
 * the listener: conn_on_ready() calls its on_readable, and the idle timer its on_timeout. How
 * its bytes move is c->tp (struct conn_transport): the coroutine's reads and writes below go
 * through it, with the plain transport compared for and called directly. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "conn.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h> /* SIOCOUTQ */
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "proxyproto.h"

/* Lingering close after an error response: the client's unread bytes would make close() send a
 * RST that can destroy our response before the client reads it, so read and discard for a
 * little while first. */
#define CONN_LINGER_NS (500ull * 1000 * 1000)
#define CONN_LINGER_MAX_BYTES (1u << 20)

/* ---- the plain transport ---- */

static ssize_t plain_recv(struct conn *c, void *buf, size_t len)
{
    ssize_t n = conn_sock_recv(c->io.fd, buf, len);
    return n < 0 ? -errno : n;
}

static ssize_t plain_sendv(struct conn *c, struct iovec *iov, int cnt, int flags)
{
    /* MSG_NOSIGNAL: a client that went away must not kill the process with SIGPIPE. */
    ssize_t n;
    if (cnt == 1) {
        n = conn_sock_send(c->io.fd, iov->iov_base, iov->iov_len, MSG_NOSIGNAL | flags);
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

const struct conn_transport conn_plain = {plain_recv, plain_sendv, plain_sendfile, plain_shutdown,
                                          NULL,       NULL,        NULL,           NULL};

ssize_t conn_send_nowait(struct conn *c, const void *buf, size_t len)
{
    if (c->tp == &conn_plain) {
        ssize_t n = conn_sock_send(c->io.fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        return n < 0 ? -errno : n;
    }
    return c->tp->send_nowait ? c->tp->send_nowait(c, buf, len) : -EOPNOTSUPP;
}

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

/* ---- connections ---- */

static void conn_on_ready(struct sched_io *io, uint32_t events);
static void conn_idle_timeout(struct sched_timer *t);

/* Close and free c. Called from a callback holding the home's loop lock, or from c's coroutine
 * (sched_io_del enters the home section, which lasts until the coroutine ends). */
void conn_destroy(struct conn *c)
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
        c->proto->close(c); /* it may read c->busy (a WebSocket's goodbye: idle, or served) */
    conn_set_busy(c, 0);    /* the home's count of busy connections forgets it */
    if (UNLIKELY(c->tp_data != NULL) && c->tp->close)
        c->tp->close(c);
    close(c->io.fd);
    free(c->peer);
    c->peer = NULL;
    c->peer_trust = 0;
    struct server_worker *mine = server_worker_self(w->srv);
    if (c->buf)
        conn_buf_put(mine, c->buf, c->cap);
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

void conn_open(struct server *s, unsigned home, int fd, const struct conn_proto *proto,
               const struct conn_transport *tp)
{
    /* Usually the acceptor runs on its listener's worker and this takes its own lock; on another
     * thread it may hop there (the connection's events are served by that home from now on). */
    int h = sched_home_enter((int)home);
    if (UNLIKELY(h < 0)) {
        close(fd);
        return;
    }
    struct server_worker *w = &s->workers[h];
    /* The caches are this thread's (read after the home section began: it may have hopped). */
    struct server_worker *mine = server_worker_self(s);
    if (UNLIKELY(mine->m != NULL) && sched_worker_id() >= 0)
        metrics_add(&mine->m->accepted, 1);
    int pp_wait = 0;
    if (UNLIKELY(s->proxy_protocol)) {
        /* Decided once per connection: a listed peer must send a PROXY protocol header. */
        struct sockaddr_storage sa;
        socklen_t len = sizeof(sa);
        pp_wait = getpeername(fd, (struct sockaddr *)&sa, &len) == 0 &&
                  proxy_trusted_peer(&s->pp_trust, (struct sockaddr *)&sa);
    }
    struct conn *c = mine->free_conns;
    if (c) {
        mine->free_conns = c->next;
        mine->nfree_conns--;
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
    c->pp_wait = pp_wait;
    c->io.data = c; /* before sched_io_add: its events are delivered from then on */
    c->fresh = 1;
    /* TCP_NODELAY comes from the listener (listen.c: listen_set_nodelay). */
    int rc = sched_io_add(&c->io, fd, conn_on_ready);
    if (UNLIKELY(rc < 0)) {
        sched_home_exit();
        close(fd);
        c->next = mine->free_conns;
        mine->free_conns = c;
        mine->nfree_conns++;
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
    conn_set_busy(c, CONN_BUSY_UNCOUNTED); /* counted if a coroutine takes it: conn_busy_pay */
    c->fresh = 0;
    if (UNLIKELY(events & (EPOLLHUP | EPOLLERR)))
        /* safety: a hint for request.c; see the field. */
        __atomic_store_n(&c->peer_reset, 1, __ATOMIC_RELAXED);
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
    if (c->proto->idle_deadline) {
        deadline = c->proto->idle_deadline(c);
        if (!deadline)
            return; /* the protocol keeps idle connections without a deadline */
    }
    if (sched_now_ns() < deadline) {
        sched_timer_arm(&c->idle, deadline);
        c->timer_armed = 1;
        return;
    }
    c->proto->on_timeout(c);
}

/* Make sure c has a read buffer with at least want bytes of capacity. 0 or -ENOMEM. */
int conn_reserve(struct conn *c, size_t want)
{
    if (!c->buf) {
        c->buf = conn_buf_get(server_worker_self(c->home->srv));
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
        conn_buf_put(server_worker_self(c->home->srv), c->buf, c->cap);
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
ssize_t conn_read_once(struct conn *c)
{
    if (UNLIKELY(conn_reserve(c, c->len + 1) < 0))
        return -ENOMEM;
    size_t space = c->cap - c->len;
    for (;;) {
        ssize_t n = conn_tp_recv(c, c->buf + c->len, space);
        if (LIKELY(n > 0)) {
            struct metrics_shard *m = server_metrics_self(c->home->srv);
            if (UNLIKELY(m != NULL))
                metrics_add(&m->bytes_in, (uint64_t)n);
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
ssize_t conn_read_wait(struct conn *c, int64_t deadline)
{
    for (;;) {
        ssize_t n = conn_read_once(c);
        if (n != -EAGAIN)
            return n;
        int rc = sched_io_wait(&c->io, EPOLLIN | EPOLLRDHUP, deadline);
        if (rc < 0)
            return rc;
    }
}

/* Wait until the socket takes more bytes, or drop a client that stopped reading: returns > 0
 * (ready), -ETIMEDOUT after body_timeout without progress, or -ECANCELED. Progress is not only
 * EPOLLOUT: Linux reports a full socket writable only once about a third of its send buffer has
 * drained, and with a buffer of some MB a slow but steady reader (~100 KB/s against the default
 * 10 s) takes longer than that. So when the deadline passes, the bytes still queued in the socket
 * (SIOCOUTQ: sent but unacknowledged, plus unsent) decide: fewer than when the wait began means
 * the client is reading, and the wait goes on. Coroutine only. */
static int conn_wait_writable(struct conn *c)
{
    int fd = c->io.fd, queued;
    if (ioctl(fd, SIOCOUTQ, &queued) < 0)
        queued = -1;
    for (;;) {
        int rc = sched_io_wait(&c->io, EPOLLOUT,
                               conn_deadline_after(c->home->srv->cfg.body_timeout_ns));
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
int conn_sendv(struct conn *c, struct iovec *iov, int cnt, int flags)
{
    while (cnt > 0) {
        ssize_t n = conn_tp_sendv(c, iov, cnt, flags);
        if (UNLIKELY(n < 0)) {
            if (n == -EINTR)
                continue;
            if (n != -EAGAIN)
                return (int)n;
            int rc = conn_wait_writable(c);
            if (rc < 0)
                return rc;
            continue;
        }
        struct metrics_shard *m = server_metrics_self(c->home->srv);
        if (UNLIKELY(m != NULL))
            metrics_add(&m->bytes_out, (uint64_t)n);
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

/* After an error response: stop writing, read and drop what the client still sends for a short
 * while, so that close() does not reset the connection before the client read our answer. */
void conn_linger_close(struct conn *c)
{
    conn_tp_shutdown(c, SHUT_WR);
    int64_t deadline = conn_deadline_after(CONN_LINGER_NS);
    size_t dropped = 0;
    char sink[2048];
    while (dropped < CONN_LINGER_MAX_BYTES) {
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

int conn_proxy_preface(struct conn *c)
{
    struct server *s = c->home->srv;
    int64_t deadline = conn_deadline_after(s->cfg.header_timeout_ns);
    char buf[PROXYPROTO_MAX];
    struct proxyproto_hdr h;
    int rc;
    for (;;) {
        ssize_t n = recv(c->io.fd, buf, sizeof(buf), MSG_PEEK);
        if (n == 0)
            return -ECONNRESET;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN)
            return -errno;
        rc = n < 0 ? -2 : proxyproto_parse(buf, (size_t)n, &h);
        if (rc == -1)
            return -EPROTO;
        if (rc > 0)
            break;
        /* A prefix of a header: wait for more (new bytes make a new edge). */
        int w = sched_io_wait(&c->io, EPOLLIN | EPOLLRDHUP, deadline);
        if (w < 0)
            return w;
    }
    /* Consume exactly the header: what follows is the transport's. */
    size_t left = (size_t)rc;
    while (left > 0) {
        ssize_t n = recv(c->io.fd, buf, left, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0 ? -ECONNRESET : -errno; /* it was there a moment ago: peeked */
        left -= (size_t)n;
    }
    c->pp_wait = 0;
    char client[64];
    if (proxyproto_client(&h, client, sizeof(client)) == 0) {
        char *peer = strdup(client);
        if (!peer)
            return -ENOMEM;
        free(c->peer);
        c->peer = peer;
        if (s->proxy_headers) {
            /* Whose forwarding headers are believed: the client the header names, not the
             * load balancer that sent it. */
            struct sockaddr_storage sa;
            memset(&sa, 0, sizeof(sa));
            if (h.family == AF_INET) {
                struct sockaddr_in *in = (struct sockaddr_in *)&sa;
                in->sin_family = AF_INET;
                memcpy(&in->sin_addr, h.src, 4);
            } else {
                struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&sa;
                in6->sin6_family = AF_INET6;
                memcpy(&in6->sin6_addr, h.src, 16);
            }
            c->peer_trust = proxy_trusted_peer(&s->trust, (struct sockaddr *)&sa) ? 1 : 2;
        }
    }
    return 0;
}

const char *conn_peer(struct conn *c)
{
    if (c->peer)
        return c->peer;
    struct sockaddr_storage sa;
    socklen_t len = sizeof(sa);
    char host[INET6_ADDRSTRLEN + 2] = "-", port[8] = "";
    if (getpeername(c->io.fd, (struct sockaddr *)&sa, &len) != 0)
        return "-";
    if (sa.ss_family != AF_INET && sa.ss_family != AF_INET6) {
        /* A Unix socket's client has no address to tell (its path is usually empty, and
         * getnameinfo would make one up from the host name): "-", kept, as CLF writes it. */
        c->peer = strdup("-");
        return c->peer ? c->peer : "-";
    }
    if (getnameinfo((struct sockaddr *)&sa, len, host, sizeof(host), port, sizeof(port),
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

/* sendfile count bytes of fd from offset, waiting for EPOLLOUT as needed. */
int conn_sendfile(struct conn *c, int fd, uint64_t offset, uint64_t count)
{
    off_t off = (off_t)offset;
    while (count > 0) {
        size_t chunk = count > (1u << 30) ? (1u << 30) : (size_t)count;
        ssize_t n = conn_tp_sendfile(c, fd, &off, chunk);
        if (n > 0) {
            struct metrics_shard *m = server_metrics_self(c->home->srv);
            if (UNLIKELY(m != NULL))
                metrics_add(&m->bytes_out, (uint64_t)n);
            count -= (uint64_t)n;
            continue;
        }
        if (n == 0)
            return -EIO; /* the file shrank under us */
        if (n == -EINTR)
            continue;
        if (n != -EAGAIN)
            return (int)n;
        int rc = conn_wait_writable(c);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Go idle: called right after sched_io_release() returned 0, so in the home section (the home's
 * loop lock is held until the coroutine ends). The buffer goes to this thread's cache. */
void conn_go_idle(struct conn *c)
{
    uint64_t now;
    int id = sched_worker_now(&now); /* nothing suspends us before both are used */
    if (c->buf) {
        conn_buf_put(&c->home->srv->workers[id < 0 ? 0 : id], c->buf, c->cap);
        c->buf = NULL;
        c->cap = c->len = 0;
    }
    c->idle_since = now;
    c->drained = 0; /* said of the last read only: the next one starts knowing nothing */
    conn_set_busy(c, 0);
    if (!c->timer_armed) {
        sched_timer_arm(&c->idle, c->idle_since + c->home->srv->cfg.keepalive_ns);
        c->timer_armed = 1;
    }
}
