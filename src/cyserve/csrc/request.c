/* request.c: the request core: the dispatch of a parsed request to its handler kind (static
 * target, GIL-free handler, Python handler through the offload hooks, files), and the request
 * API behind cyserve._core's nogil functions.
 *
 * Python handlers. A SERVER_PYTHON target is called through sched_offload(), so that the GIL is
 * taken once per batch of calls on a worker by the offload hooks (server_set_offload_hooks); the
 * call runs on the worker's own stack, never in the coroutine. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "request.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "access_log.h"
#include "clock.h"
#include "conn.h"
#include "handoff.h"
#include "handler_files.h"
#include "handler_static.h"
#include "http1_inline.h"
#include "http2.h"
#include "sched.h"
#include "server_int.h"
#include "stream.h"
#include "ws_nogil.h"

/* A GIL-free handler that fails gets a 500, and the operator a line on standard error (a Python
 * handler's failure gets a logged traceback), at most one a second for the whole process, so that
 * a route failing on every request can neither flood the log nor slow the server down. */
void request_note_failure(const struct http_request *req, int hrc)
{
    static struct clock_once_a_second gate;
    unsigned long long more;
    if (!clock_once_a_second(&gate, &more))
        return;
    char line[512], tail[64] = "";
    if (more)
        snprintf(tail, sizeof(tail), " (and %llu more failures)", more);
    int plen = req->path_len > 256 ? 256 : (int)req->path_len;
    char what[80];
    if (hrc == REQUEST_NO_CONTENT_BODY)
        snprintf(what, sizeof(what),
                 "gave a body or trailers to a status without content (204, 205, 304)");
    else
        snprintf(what, sizeof(what), "returned %d", hrc);
    int n = snprintf(line, sizeof(line),
                     "cyserve: GIL-free handler for %.*s %.*s %s; answered 500%s\n",
                     (int)req->method_len, req->method, plen, req->path, what, tail);
    if (n > 0) {
        ssize_t w = write(2, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
        (void)w; /* nothing to do if standard error is gone */
    }
}

struct py_job {
    const struct server_target *t;
    cyserve_request *req;
    struct cyserve_response *resp;
    struct conn *c;  /* the connection */
    uint64_t queued; /* clock_mono_ns() when the call was offloaded */
    int gone;        /* set instead of calling: the client had gone */
};

/* A call that waited this long for its turn is checked first: is its client still there? Far
 * above a queue's normal wait (well under a millisecond), so that a busy server pays nothing;
 * a call that waited behind blocking ones pays one recv(MSG_PEEK) syscall. The calls of one
 * connection share the check: a peek that found the peer there less than this long ago answers
 * for them all (the staleness every check accepts), as one HTTP/2 connection's streams queue
 * their calls side by side, and 64 connections of 10 streams each wait longer than this in a
 * queue of 640 calls of some 15 microseconds: a peek per call was most of their recvs. */
#define REQUEST_GONE_CHECK_NS (10 * 1000 * 1000ull)

/* Has the peer of connection c closed its side or reset it? A peek, so nothing is
 * consumed; bytes waiting (a pipelined request) mean it is still there. A client that shut
 * down only its sending side after the request counts as gone, as nginx and uvicorn count it. */
static int request_peer_gone(struct conn *c, uint64_t now)
{
    /* safety: relaxed, a hint (conn.h): a stale time only costs one more peek. */
    if (now - __atomic_load_n(&c->peer_seen, __ATOMIC_RELAXED) < REQUEST_GONE_CHECK_NS)
        return 0;
    char b;
    ssize_t n = recv(c->io.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0)
        return 1;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return 1;
    /* safety: relaxed, a hint (conn.h); racing stores write times alike. */
    __atomic_store_n(&c->peer_seen, now, __ATOMIC_RELAXED);
    return 0;
}

static void py_trampoline(void *arg)
{
    struct py_job *j = arg;
    /* A call queued behind slow ones, whose client has meanwhile gone (it gave up, reset), is
     * dropped without running: ten clients that send and reset at once must not cost ten calls
     * of the slow handler. */
    /* safety: peer_reset is a relaxed hint (conn.h). A request read after its client reset
     * (the kernel keeps the bytes it had received) is dropped too. */
    uint64_t now = clock_mono_ns();
    if (UNLIKELY(__atomic_load_n(&j->c->peer_reset, __ATOMIC_RELAXED)) ||
        (UNLIKELY(now - j->queued > REQUEST_GONE_CHECK_NS) && request_peer_gone(j->c, now))) {
        j->gone = 1;
        return;
    }
    /* Which route this thread is in, for the worker-timeout's log (publish_once). */
    struct server_worker *w = NULL;
    int id = sched_worker_id();
    if (LIKELY(id >= 0)) {
        w = &j->c->home->srv->workers[id];
        /* safety: this thread is the only writer of its slot; the publisher reads it relaxed
         * and any recent value will do. */
        atomic_store_explicit(&w->calling_since, now, memory_order_relaxed);
        atomic_store_explicit(&w->calling, j->t, memory_order_relaxed);
    }
    j->t->py_call(j->t->opaque, j->req, j->resp);
    if (LIKELY(w != NULL))
        atomic_store_explicit(&w->calling, NULL, memory_order_relaxed);
}

int request_header_value(const struct request *rq, const char *name, size_t nlen, const char **v,
                         size_t *vlen)
{
    for (size_t i = 0; i < rq->head.num_headers; i++) {
        const struct http_header *h = &rq->hdrs[i];
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

int request_te_lists_trailers(const char *v, size_t len)
{
    size_t i = 0;
    while (i < len) {
        const char *comma = memchr(v + i, ',', len - i);
        size_t end = comma ? (size_t)(comma - v) : len;
        size_t a = i, b = end;
        while (a < b && (v[a] == ' ' || v[a] == '\t'))
            a++;
        while (b > a && (v[b - 1] == ' ' || v[b - 1] == '\t'))
            b--;
        if (b - a == 8 && strncasecmp(v + a, "trailers", 8) == 0)
            return 1;
        i = end + 1;
    }
    return 0;
}

int request_head_accepts_trailers(const struct http_request *head)
{
    /* Every TE field, not only the first: a list may be split over several lines. */
    for (size_t i = 0; i < head->num_headers; i++) {
        const struct http_header *h = &head->headers[i];
        if (h->name_len == 2 && strncasecmp(h->name, "te", 2) == 0 &&
            request_te_lists_trailers(h->value, h->value_len))
            return 1;
    }
    return 0;
}

int request_accepts_trailers(const struct request *rq)
{
    return request_head_accepts_trailers(&rq->head);
}

void request_answer_simple(struct request_answer *a, char *buf, size_t cap, int status,
                           const char *body, const char *extra)
{
    size_t blen = strlen(body);
    int n = snprintf(buf, cap, "Content-Type: text/plain; charset=utf-8\r\n%s", extra ? extra : "");
    if (n < 0 || (size_t)n >= cap)
        n = 0;
    *a = (struct request_answer){
        .kind = REQUEST_BODY_BYTES,
        .status = status,
        .lines = buf,
        .lines_len = (size_t)n,
        .length = blen,
        .body = body,
        .body_len = blen,
        .fd = -1,
    };
}

/* The short answers of the request core: 256 bytes of header lines at most, as always. */
static void answer_simple(struct request *rq, int status, const char *body, const char *extra)
{
    request_answer_simple(&rq->answer, rq->answer_lines, 256, status, body, extra);
}

void request_leave_defer(struct request *rq)
{
    handoff_leave(rq->defer);
    rq->defer = NULL;
}

struct gone_job {
    const struct server_target *t;
    struct handoff *h;
};

static void gone_trampoline(void *arg)
{
    struct gone_job *j = arg;
    j->t->py_stream(j->t->opaque, j->h, NULL, SERVER_STREAM_ABANDON);
}

struct body_job {
    struct handoff *h;
    const char *data;
    size_t len;
    int more;
};

static void body_trampoline(void *arg)
{
    struct body_job *j = arg;
    j->h->body_cb(j->h, j->data, j->len, j->more);
}

/* A piece of a streamed body is at most this: what one receive() message carries. */
#define BODY_PIECE_MAX 65536

static const char body_continue_line[] = "HTTP/1.1 100 Continue\r\n\r\n";

/* The next piece of rq's streamed body into piece[0..*n): BODY_PIECE_MAX bytes, or what is left
 * of the body when that is less (what the buffer holds first, then reads from the socket, each
 * waiting up to body_timeout), so that receive() gets pieces of one size whatever the reads
 * gave. 0, -ETIMEDOUT, or -ECONNRESET (end of stream, or an error: the client left). */
static int body_piece(struct request *rq, char *piece, size_t *n)
{
    struct conn *c = rq->c;
    size_t want = rq->body_left < BODY_PIECE_MAX ? (size_t)rq->body_left : BODY_PIECE_MAX;
    size_t got = 0;
    if (rq->body_at < rq->body_end) {
        got = rq->body_end - rq->body_at;
        if (got > want)
            got = want;
        memcpy(piece, c->buf + rq->body_at, got);
        rq->body_at += got;
    }
    if (got < want && rq->body_continue) {
        rq->body_continue = 0;
        struct iovec iov = {(void *)body_continue_line, sizeof(body_continue_line) - 1};
        if (conn_sendv(c, &iov, 1, 0) < 0)
            return -ECONNRESET;
    }
    while (got < want) {
        ssize_t r = c->tp->recv(c, piece + got, want - got);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (r != -EAGAIN)
            return -ECONNRESET;
        int ev = sched_io_wait(&c->io, EPOLLIN, conn_deadline_after(rq->srv->cfg.body_timeout_ns));
        if (ev == -ETIMEDOUT)
            return -ETIMEDOUT;
        if (ev < 0)
            return -ECONNRESET;
    }
    rq->body_left -= got;
    *n = got;
    return 0;
}

/* A streamed chunked body ended with `left` bytes of what came next (a pipelined request) at
 * rest: put them where the serving loop reads on from (rq->body_rest, up to c->len). Those that
 * came from the buffer are still there, just before body_at; those a socket read brought are
 * copied after the buffer's end when it has room, and dropped otherwise (body_overread), since
 * moving the buffer would move the request head's views that the access log reads later. */
static void rest_of_chunked(struct request *rq, const char *rest, size_t left, int from_buf)
{
    struct conn *c = rq->c;
    if (from_buf) {
        rq->body_rest = rq->body_at - left;
    } else if (left <= c->cap - c->len) {
        rq->body_rest = c->len;
        memcpy(c->buf + c->len, rest, left);
        c->len += left;
    } else {
        rq->body_rest = c->len;
        rq->body_overread = 1;
    }
    if (rq->body_rest < c->len)
        c->drained = 0; /* a next request is in the buffer: parse it before reading again */
}

/* The next piece of rq's streamed chunked body into piece[0..*n): the decoded bytes of what the
 * buffer holds, then of reads from the socket (each waiting up to body_timeout), as soon as
 * there are any, BODY_PIECE_MAX at most; *n is 0 only for the end. The raw bytes are read into
 * piece and decoded there (http_chunked_decode works in place). 0, -ETIMEDOUT, -ECONNRESET (the
 * client left), -EMSGSIZE (the body goes past max_body_bytes) or -EBADMSG (bad framing). */
static int body_piece_chunked(struct request *rq, char *piece, size_t *n)
{
    struct conn *c = rq->c;
    const struct server_config *cfg = &rq->srv->cfg;
    size_t got = 0;
    while (got < BODY_PIECE_MAX) {
        size_t raw;
        int raw_from_buf = rq->body_at < rq->body_end;
        if (raw_from_buf) {
            raw = rq->body_end - rq->body_at;
            if (raw > BODY_PIECE_MAX - got)
                raw = BODY_PIECE_MAX - got;
            memcpy(piece + got, c->buf + rq->body_at, raw);
            rq->body_at += raw;
        } else {
            if (got > 0)
                break; /* what came so far goes now rather than after another wait */
            if (rq->body_continue) {
                rq->body_continue = 0;
                struct iovec iov = {(void *)body_continue_line, sizeof(body_continue_line) - 1};
                if (conn_sendv(c, &iov, 1, 0) < 0)
                    return -ECONNRESET;
            }
            ssize_t r = c->tp->recv(c, piece, BODY_PIECE_MAX);
            if (r == -EAGAIN) {
                int ev = sched_io_wait(&c->io, EPOLLIN, conn_deadline_after(cfg->body_timeout_ns));
                if (ev == -ETIMEDOUT)
                    return -ETIMEDOUT;
                if (ev < 0)
                    return -ECONNRESET;
                continue;
            }
            if (r <= 0)
                return -ECONNRESET;
            raw = (size_t)r;
        }
        size_t l = raw;
        int64_t left = http_chunked_decode(&rq->body_ch, piece + got, &l,
                                           cfg->limits.max_header_bytes);
        if (left == -1)
            return rq->body_ch.status == 431 ? -EMSGSIZE : -EBADMSG;
        got += l;
        /* A chunk announced bigger than what the limit leaves is refused now, not after
         * max_body_bytes of it have been read (remaining only grows while a size is read). */
        if (rq->body_ch.total > cfg->max_body_bytes ||
            (left == -2 && rq->body_ch.remaining > cfg->max_body_bytes - rq->body_ch.total))
            return -EMSGSIZE;
        if (left >= 0) {
            rq->body_left = 0;
            rest_of_chunked(rq, piece + got, (size_t)left, raw_from_buf);
            break;
        }
    }
    *n = got;
    return 0;
}

/* Wait for the producer's answer on h while watching the client: one that hangs up meanwhile
 * (end of stream, a reset) is told to the producer at once, through target t's py_stream with
 * SERVER_STREAM_ABANDON (an ASGI app's receive() then returns http.disconnect while the app still
 * works, as uvicorn tells it), and the request ends. A half-closed client counts as gone, as
 * with uvicorn. Bytes of a next, pipelined request stay in the socket for the serving loop. A
 * streamed body (rq->body_left) is read here, a piece each time the producer asks (a body that
 * does not progress within body_timeout counts as a client gone).
 * 0, -ECONNRESET (the client left), -ECANCELED (the server stops), or -EMSGSIZE / -EBADMSG (a
 * streamed body over max_body_bytes or badly framed; the producer was told it is gone). */
static int await_watching(struct request *rq, struct handoff *h, const struct server_target *t)
{
    struct conn *c = rq->c;
    char *piece = NULL;
    handoff_track(rq->srv, h, 1);
    int rc;
    for (;;) {
        /* While body bytes are still in the socket, its readiness is the body's, not a sign. */
        uint32_t watch = rq->body_left ? EPOLLRDHUP : EPOLLIN | EPOLLRDHUP;
        rc = sched_io_wait_signal(&c->io, watch, -1, &h->ready);
        if (rc < 0)
            break;
        if (rc & (int)SCHED_SIGNALED) {
            /* safety: acquire pairs with the producer's release stores of body_asked and given
             * (handoff.c): body_cb and resp are read after them. */
            if (__atomic_exchange_n(&h->body_asked, 0, __ATOMIC_ACQUIRE)) {
                struct body_job job = {h, NULL, 0, 0};
                if (rq->body_left) {
                    if (!piece && !(piece = malloc(BODY_PIECE_MAX))) {
                        rc = -ENOMEM;
                        break;
                    }
                    int brc = rq->body_chunked ? body_piece_chunked(rq, piece, &job.len)
                                               : body_piece(rq, piece, &job.len);
                    if (brc == -EMSGSIZE || brc == -EBADMSG) {
                        /* The client's fault, told to it (await_deferred answers 413 or 400)
                         * rather than as a connection gone; the app's receive() says
                         * http.disconnect all the same. */
                        struct gone_job gj = {t, h};
                        sched_offload(gone_trampoline, &gj);
                        rc = brc;
                        break;
                    }
                    if (brc < 0)
                        goto gone;
                    job.data = piece;
                }
                job.more = rq->body_left > 0;
                if (sched_offload(body_trampoline, &job) < 0) {
                    rc = -ECANCELED;
                    break;
                }
            }
            if (__atomic_exchange_n(&h->given, 0, __ATOMIC_ACQUIRE)) {
                rc = 0;
                break;
            }
            continue;
        }
        char b;
        if (!(rc & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && conn_sock_peek(c->io.fd, &b) != 0) {
            /* A next request's bytes (or a spurious edge): the serving loop reads them after
             * this answer, since this wait consumed the readiness. */
            c->drained = 0;
            continue;
        }
    gone:;
        struct gone_job job = {t, h};
        sched_offload(gone_trampoline, &job); /* refused only by a stop, which cancels h too */
        access_log_note(rq, 499, 0);
        rc = -ECONNRESET;
        break;
    }
    free(piece);
    handoff_track(rq->srv, h, 0);
    return rc;
}

/* await_watching for an HTTP/2 stream, in its task: the connection's coroutine is the socket's
 * one reader (http2.c), so the stream is watched through it (http2_stream_watch): a reset, or
 * the connection's end, is told to the producer (http.disconnect) as a client's leaving is
 * over HTTP/1.1, and a streamed body's pieces are taken from what the coroutine received, one
 * each time the producer asks. Same returns as await_watching. */
static int await_h2(struct request *rq, struct handoff *h, const struct server_target *t)
{
    char *piece = NULL;
    int asked = 0, rc;
    handoff_track(rq->srv, h, 1);
    http2_stream_watch(rq, &h->ready);
    for (;;) {
        rc = sched_signal_wait(&h->ready);
        if (rc < 0)
            break;
        /* safety: acquire pairs with the producer's release stores of body_asked and given
         * (handoff.c), as in await_watching. */
        if (__atomic_exchange_n(&h->body_asked, 0, __ATOMIC_ACQUIRE))
            asked = 1;
        if (asked) {
            struct body_job job = {h, NULL, 0, 0};
            int more = 0;
            int brc = 1;
            if (rq->body_left) {
                if (!piece && !(piece = malloc(BODY_PIECE_MAX))) {
                    rc = -ENOMEM;
                    break;
                }
                brc = http2_body_take(rq, piece, BODY_PIECE_MAX, &job.len, &more);
                if (brc < 0)
                    goto gone;
                job.data = piece;
            }
            if (brc > 0) {
                asked = 0;
                if (!more)
                    rq->body_left = 0;
                job.more = more;
                if (sched_offload(body_trampoline, &job) < 0) {
                    rc = -ECANCELED;
                    break;
                }
            }
        }
        if (__atomic_exchange_n(&h->given, 0, __ATOMIC_ACQUIRE)) {
            rc = 0;
            break;
        }
        if (!http2_stream_gone(rq))
            continue;
    gone:;
        struct gone_job job = {t, h};
        sched_offload(gone_trampoline, &job); /* refused only by a stop, which cancels h too */
        access_log_note(rq, 499, 0);
        rc = -ECONNRESET;
        break;
    }
    http2_stream_unwatch(rq);
    free(piece);
    handoff_track(rq->srv, h, 0);
    return rc;
}

int request_await_answer(struct request *rq, struct handoff *h, const struct server_target *t)
{
    if (!t->py_stream)
        return handoff_await(rq->srv, h);
    return rq->http2 ? await_h2(rq, h, t) : await_watching(rq, h, t);
}

/* The handler deferred its answer to another thread (handoff.h): wait for it, without holding
 * the worker, and take it into rq->resp as if the handler had made it. 0, or -ECANCELED (the
 * server stops; the handoff is left), -ECONNRESET (the client left; the producer was told) or
 * -ENOMEM; or 1 when a streamed body was refused (413, 400) and rq->answer says so. */
static int await_deferred(struct request *rq, const struct server_target *t)
{
    struct handoff *h = rq->resp.defer;
    rq->resp.defer = NULL;
    rq->defer = h;
    int rc = request_await_answer(rq, h, t);
    if (LIKELY(rc == 0))
        rc = resp_take(&rq->resp, &h->resp);
    if (UNLIKELY(rc == -EMSGSIZE || rc == -EBADMSG)) {
        /* A streamed body broke a limit or its framing before the app answered: the client
         * gets the status, the app's answer (if it comes) goes nowhere, and the connection
         * closes, since the rest of the body is still in the socket. */
        request_leave_defer(rq);
        resp_reset(&rq->resp);
        rq->resp.close = 1;
        if (rc == -EMSGSIZE)
            answer_simple(rq, 413, "413 Content Too Large\n", NULL);
        else
            answer_simple(rq, 400, "400 Bad Request: bad chunked framing\n", NULL);
        rq->answer.close = 1;
        return 1;
    }
    if (UNLIKELY(rc < 0)) {
        request_leave_defer(rq);
        resp_reset(&rq->resp);
        return rc;
    }
    if (!rq->resp.stream && !h->ws)
        request_leave_defer(rq); /* the whole answer is here: the producer is done */
    /* A WebSocket's 101 keeps the handoff: it is the connection's channel from now on, which
     * the protocol (http1.c) takes over. */
    return 0;
}

int request_streams_body(struct request *rq)
{
    struct router_match m;
    int rc = router_match(rq->srv->router, ROUTER_METHOD_BIT(rq->head.method_id), rq->head.path,
                          rq->head.path_len, &m);
    if (rc < 0)
        return 0;
    const struct server_target *t = m.target;
    return t->kind == SERVER_PYTHON && t->stream_body;
}

int request_reads_body(struct request *rq)
{
    struct router_match m;
    int rc = router_match(rq->srv->router, ROUTER_METHOD_BIT(rq->head.method_id), rq->head.path,
                          rq->head.path_len, &m);
    if (rc < 0)
        return 0; /* 404, 405, 500: answered without it */
    const struct server_target *t = m.target;
    return t->kind != SERVER_STATIC && t->kind != SERVER_FILES;
}

int request_body_streams(struct request *rq)
{
    struct router_match m;
    if (router_match(rq->srv->router, ROUTER_METHOD_BIT(rq->head.method_id), rq->head.path,
                     rq->head.path_len, &m) < 0)
        return 0;
    const struct server_target *t = m.target;
    return t->kind == SERVER_PYTHON && t->body_stream;
}

static int dispatch_call(struct request *rq, const struct router_match *m, const char *body,
                         size_t body_len);

/* --limit-concurrency: one count per process (struct server), taken around the handler call
 * only, so the answers that need no handler (static, files, 404) and the inline path never
 * touch it, and with no limit the request path pays one predictable branch. A relaxed
 * fetch-add is enough: the count orders nothing, it only bounds. Past the limit the client is
 * told to come back (Retry-After) on a new connection: closing spreads a retrying client over
 * the other processes of the SO_REUSEPORT group, where keeping the connection would bring it
 * back to the busy one. */
static int dispatch_limited(struct request *rq, const struct router_match *m, const char *body,
                            size_t body_len)
{
    struct server *s = rq->srv;
    unsigned was = atomic_fetch_add_explicit(&s->in_handlers, 1, memory_order_relaxed);
    if (was >= s->cfg.limit_concurrency) {
        atomic_fetch_sub_explicit(&s->in_handlers, 1, memory_order_relaxed);
        /* The engine's own answer, as a refusal: no route answered it. */
        rq->mkind = METRICS_NONE;
        metrics_note_limit(server_metrics_self(s));
        answer_simple(rq, 503, "503 Service Unavailable: too many requests at once\n",
                      "Retry-After: 1\r\n");
        rq->answer.close = 1;
        return 0;
    }
    int rc = dispatch_call(rq, m, body, body_len);
    atomic_fetch_sub_explicit(&s->in_handlers, 1, memory_order_relaxed);
    return rc;
}

int request_dispatch(struct request *rq, const char *body, size_t body_len)
{
    struct http_request *req = &rq->head;
    struct request_answer *a = &rq->answer;
    struct router_match m;
    int rc = router_match(rq->srv->router, ROUTER_METHOD_BIT(req->method_id), req->path,
                          req->path_len, &m);
    rq->mkind = rc < 0 ? METRICS_NONE : server_target_mkind(m.target);
    if (rc == -ENOENT) {
        answer_simple(rq, 404, "404 Not Found\n", NULL);
        return 0;
    }
    if (rc == -ENOTSUP) {
        char allow[128], line[160];
        router_format_allow(m.allow, allow, sizeof(allow));
        snprintf(line, sizeof(line), "Allow: %s\r\n", allow);
        answer_simple(rq, 405, "405 Method Not Allowed\n", line);
        return 0;
    }
    if (UNLIKELY(rc < 0)) {
        answer_simple(rq, 500, "500 Internal Server Error\n", NULL);
        return 0;
    }
    const struct server_target *t = m.target;
    if (UNLIKELY(rq->srv->trust.host)) {
        /* The forwarded host replaces the Host field before any handler reads the head
         * (request_client resolves once per request, and the rest of it lazily otherwise). */
        const char *scheme;
        request_client(rq, &scheme);
    }
    if (UNLIKELY(t->kind == SERVER_STATIC && t->static_health) && server_health_failing(rq->srv)) {
        answer_simple(rq, 503, "503 Service Unavailable: draining\n", NULL);
        return 0;
    }
    if (t->kind == SERVER_STATIC) {
        *a = (struct request_answer){
            .kind = REQUEST_BODY_STATIC,
            .status = t->static_status,
            .length = t->static_body_len,
            .body = t->static_body,
            .body_len = t->static_body_len,
            .fd = t->static_fd,
            .t = t,
        };
        return 0;
    }
    if (t->kind == SERVER_FILES) {
        hfiles_serve(rq, t, &m);
        return 0;
    }
    if (LIKELY(rq->srv->cfg.limit_concurrency == 0))
        return dispatch_call(rq, &m, body, body_len);
    return dispatch_limited(rq, &m, body, body_len);
}

/* request_dispatch's handler call: a GIL-free handler, or a Python one offloaded to the
 * worker's batch (and an ASGI answer awaited). Its return is request_dispatch's. m is
 * request_dispatch's own, which outlives this call: the view's params point into it, not into
 * a copy (the copy of its 16 parameter slots cost about 90 instructions a request). */
static int dispatch_call(struct request *rq, const struct router_match *m, const char *body,
                         size_t body_len)
{
    struct http_request *req = &rq->head;
    int head_only = req->method_id == HTTP_HEAD;
    struct request_answer *a = &rq->answer;
    const struct server_target *t = m->target;
    int rc;
    cyserve_request creq;
    request_view(&creq, req, m, body, body_len, rq);
    resp_reset(&rq->resp);
    int hrc;
    if (t->kind == SERVER_NOGIL) {
        /* safety: see inline_note. */
        if (atomic_load_explicit(&t->inline_state, memory_order_relaxed) < INLINE_LEARN) {
            uint64_t t0 = inline_ticks();
            hrc = t->fn(&creq, &rq->resp, t->ctx);
            uint64_t took = inline_ticks() - t0;
            size_t blen;
            resp_body(&rq->resp, &blen);
            inline_note(t, took, blen);
        } else {
            hrc = t->fn(&creq, &rq->resp, t->ctx);
        }
        if (LIKELY(hrc == 0))
            hrc = request_nogil_content(&rq->resp);
    } else if (t->kind == SERVER_NOGIL_WS) {
        int st = wsn_open(rq, t, &creq);
        if (UNLIKELY(st < 0))
            return st;
        if (st > 0) {
            /* A bad handshake (RFC 6455 4.2.2: 426 names the version spoken), then close. */
            if (st == 426)
                answer_simple(rq, 426, "426 Upgrade Required\n",
                              "Sec-WebSocket-Version: 13\r\nUpgrade: websocket\r\n");
            else
                answer_simple(rq, 400, "400 Bad Request: not a valid WebSocket handshake\n", NULL);
            a->close = 1;
            rq->resp.close = 1;
            return 0;
        }
        hrc = 0;
    } else {
        struct py_job job = {t, &creq, &rq->resp, rq->c, clock_mono_ns(), 0};
        rc = sched_offload(py_trampoline, &job);
        if (UNLIKELY(rc < 0))
            return rc; /* cancelled: the server is stopping */
        if (UNLIKELY(job.gone)) {
            /* Logged as nginx logs it: 499, client closed the request. */
            access_log_note(rq, 499, 0);
            return -ECONNRESET;
        }
        hrc = 0;
        if (UNLIKELY(rq->resp.defer != NULL)) {
            rc = await_deferred(rq, t);
            if (UNLIKELY(rc < 0))
                return rc;
            if (UNLIKELY(rc > 0))
                return 0; /* refused for its body: the answer is made */
        }
    }
    if (server_draining(rq->srv)) {
        /* The server started shutting down while the handler ran: this is the last answer on
         * this connection, and the client is told so. */
        rq->resp.close = 1;
    }
    if (UNLIKELY(hrc != 0)) {
        request_note_failure(&rq->head, hrc);
        int close = rq->resp.close;
        resp_reset(&rq->resp);
        rq->resp.close = close;
        answer_simple(rq, 500, "500 Internal Server Error\n", NULL);
        a->close = close;
        return 0;
    }
    if (UNLIKELY(rq->resp.stream)) {
        *a = (struct request_answer){
            .kind = REQUEST_BODY_STREAM,
            .status = rq->resp.status,
            .close = rq->resp.close,
            .fd = -1,
            .t = t,
        };
        return 0;
    }
    rc = request_answer_resp(a, &rq->resp, head_only);
    if (UNLIKELY(rc)) {
        access_log_note(rq, rq->resp.status, 0);
        return rc;
    }
    if (UNLIKELY(rq->resp.body_fd >= 0)) {
        /* A body in a file (a WSGI file wrapper): the answer takes the descriptor, closed by
         * request_answer_done once sent. */
        int bodyless = a->status == 204 || a->status == 304 || a->status == 205;
        if (!rq->resp.has_content_type && !bodyless) {
            static const char ct[] = "Content-Type: text/plain; charset=utf-8\r\n";
            if (UNLIKELY(wbuf_append(&rq->resp.headers, ct, sizeof(ct) - 1)))
                return -ENOMEM;
            a->lines = rq->resp.headers.ptr;
            a->lines_len = rq->resp.headers.len;
        }
        a->kind = REQUEST_BODY_FILE;
        a->fd = rq->resp.body_fd;
        a->offset = rq->resp.body_file_offset;
        a->length = bodyless ? 0 : rq->resp.body_file_len;
        a->body_len = bodyless ? 0 : (size_t)rq->resp.body_file_len;
        rq->resp.body_fd = -1;
        return 0;
    }
    /* A large body the handler promised outlives the server goes out of a memfd snapshot
     * (handler_static.c); a HEAD sends no body, so it makes none. A lent body lives only as
     * long as its answer: it is sent from where it is. */
    if (rq->resp.body_static && !rq->resp.lease && !head_only && a->body_len > STATIC_MEMFD_MIN) {
        a->fd = static_ext_memfd(rq->srv, a->body, a->body_len);
        a->offset = 0;
    }
    return 0;
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

/* The host a trusted proxy named (--forwarded-host) replaces the request's Host: the field's
 * value and the head's host are views of it from now on, for every handler, WSGI's HTTP_HOST
 * and SERVER_NAME, ASGI's host header, as werkzeug's ProxyFix (x_host) and hypercorn's
 * ProxyFixMiddleware do. A request without a Host field (HTTP/1.0) keeps having none: the head
 * has no spare field to add it to. */
static void request_forwarded_host(struct http_request *h, const char *host, size_t host_len)
{
    h->host = host;
    h->host_len = host_len;
    for (size_t i = 0; i < h->num_headers; i++) {
        struct http_header *f = &h->headers[i];
        if (f->name_len == 4 && strncasecmp(f->name, "host", 4) == 0) {
            f->value = host;
            f->value_len = host_len;
        }
    }
}

const char *request_client(struct request *rq, const char **scheme)
{
    struct server *s = rq->srv;
    if (LIKELY(!s->proxy_headers) || rq->client_done == REQUEST_CLIENT_NO_HEAD) {
        /* No proxy headers, or none to read (an error answer before a head was parsed): the
         * connection's own scheme, as server_req_scheme says it. */
        *scheme = rq->c->tp != &conn_plain ? "https" : "http";
        return conn_peer(rq->c); /* cached on the connection after its first call */
    }
    if (rq->client_done == REQUEST_CLIENT_TODO) {
        rq->client_done = REQUEST_CLIENT_DONE;
        /* The connection's own scheme, unless a trusted proxy's headers say otherwise. */
        rq->scheme = rq->c->tp != &conn_plain ? "https" : "http";
        rq->client[0] = 0;
        struct conn *c = rq->c;
        if (!c->peer_trust) {
            struct sockaddr_storage sa;
            socklen_t len = sizeof(sa);
            c->peer_trust = 2;
            if (getpeername(c->io.fd, (struct sockaddr *)&sa, &len) == 0 &&
                proxy_trusted_peer(&s->trust, (struct sockaddr *)&sa))
                c->peer_trust = 1;
        }
        if (c->peer_trust == 1) {
            const char *host = NULL;
            size_t host_len = 0;
            proxy_resolve(&s->trust, &rq->head, rq->client, &rq->scheme, &host, &host_len);
            if (host)
                request_forwarded_host(&rq->head, host, host_len);
        }
    }
    *scheme = rq->scheme;
    return rq->client[0] ? rq->client : conn_peer(rq->c);
}

const char *server_req_scheme(const cyserve_request *req)
{
    struct request *rq = req->engine;
    const char *scheme = rq && rq->c->tp != &conn_plain ? "https" : "http";
    /* Without proxy headers the answer is known: no peer lookup for it. */
    if (rq && rq->srv->proxy_headers)
        request_client(rq, &scheme);
    return scheme;
}

int server_req_peer(const cyserve_request *req, const char **out)
{
    struct request *rq = req->engine;
    if (!rq)
        return -ENOTCONN;
    const char *scheme;
    const char *peer = request_client(rq, &scheme);
    if (peer[0] == '-')
        return -ENOTCONN;
    *out = peer;
    return 0;
}

uint64_t server_req_body_pending(const cyserve_request *req)
{
    struct request *rq = req->engine;
    return rq ? rq->body_left : 0;
}

unsigned server_req_conn(const cyserve_request *req, const char **peer)
{
    struct request *rq = req->engine;
    *peer = NULL;
    if (!rq)
        return 0;
    const char *scheme;
    const char *p = request_client(rq, &scheme);
    if (p[0] != '-')
        *peer = p;
    return (rq->c->tp != &conn_plain ? SERVER_REQ_TLS : 0u) | (rq->http2 ? SERVER_REQ_HTTP2 : 0u) |
           (scheme[4] == 's' ? SERVER_REQ_HTTPS : 0u);
}

int server_req_tls(const cyserve_request *req)
{
    struct request *rq = req->engine;
    return rq && rq->c->tp != &conn_plain;
}

int server_req_http2(const cyserve_request *req)
{
    struct request *rq = req->engine;
    return rq && rq->http2;
}

int server_req_header(const cyserve_request *req, const char *name, size_t nlen, cyserve_str *out)
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
