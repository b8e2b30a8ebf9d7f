/* http1_inline.c: HTTP/1's on_readable, and the inline path it tries first.
 *
 * Most of the time an idle keep-alive connection becomes readable with exactly one small,
 * complete request in its socket. When that request needs nothing that can wait, HTTP/1's
 * on_readable answers it right there, on the worker's own stack, within the poll's batch: one
 * read, the parse, the route, the handler, one write, and the connection is idle again. No
 * coroutine is spawned, switched to or freed, and no run queue is touched: on /plaintext that
 * was ~4% of the server's CPU time per request (docs/benchmarks.md).
 *
 * Everything else falls back to the coroutine, which is the complete engine: the bytes already
 * read stay in c->buf (http1_serve parses them first), and an answer the socket would not take
 * whole waits at the start of c->buf (c->pend) for the coroutine to send it first. So this path
 * only has to be right for what it takes: a read shorter than the buffer, one request consuming
 * exactly that read (nothing pipelined behind it), no body, keep-alive, no access log, not
 * draining, and a static target whose answer fits the buffer or a GIL-free handler. Python
 * handlers never run here: they wait for the GIL, which is what coroutines are for. So a server
 * without a static route or a GIL-free handler (a WSGI or ASGI app, Python handlers only) only
 * reads here: parsing and routing its requests here would be done again by the coroutine
 * (server_config.inline_routes).
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

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "http1_inline.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "conn.h"
#include "http1.h"
#include "request.h"
#include "router.h"
#include "sched.h"

void server_target_never_inline(struct server_target *t)
{
    atomic_store_explicit(&t->inline_state, INLINE_NEVER, memory_order_relaxed);
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
        sent = conn_sock_send(c->io.fd, out, len, MSG_NOSIGNAL);
    while (UNLIKELY(sent < 0 && errno == EINTR));
    if (UNLIKELY(mine->m != NULL) && sent > 0)
        metrics_add(&mine->m->bytes_out, (uint64_t)sent);
    if (LIKELY(sent == (ssize_t)len)) {
        if (!keep) {
            conn_destroy(c);
            return 1;
        }
        c->idle_since = sched_now_ns();
        conn_idle_inline(c, mine);
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
        conn_buf_put(mine, c->buf, c->cap);
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
static int inline_nogil(struct conn *c, struct server_worker *mine, const struct server_target *t,
                        const struct http_request *req, const struct router_match *m)
{
    struct server *s = c->home->srv;
    cyserve_request creq;
    request_view(&creq, req, m, NULL, 0, NULL);
    struct cyserve_response resp;
    resp_init(&resp);
    uint64_t t0 = inline_ticks();
    int hrc = t->fn(&creq, &resp, t->ctx);
    uint64_t took = inline_ticks() - t0;
    if (LIKELY(hrc == 0))
        hrc = request_nogil_content(&resp);
    int head_only = req->method_id == HTTP_HEAD;
    int keep = !resp.close && !server_draining(s);
    char store[HTTP1_OUT_INLINE];
    struct wbuf out;
    wbuf_init(&out, store, sizeof(store));
    size_t blen = 0;
    struct request_answer a;
    char lines[256];
    int rc;
    if (UNLIKELY(hrc != 0)) {
        request_note_failure(req, hrc);
        request_answer_simple(&a, lines, sizeof(lines), 500, "500 Internal Server Error\n", NULL);
        rc = 0;
    } else {
        rc = request_answer_resp(&a, &resp, head_only);
        if (!rc)
            blen = a.body_len;
    }
    if (!rc && http1_trailed(&a, req->minor_version)) {
        /* Trailers only to a client that said it takes them (TE: trailers), as http1.c's. */
        size_t tlen = request_head_accepts_trailers(req) ? resp.trailers.len : 0;
        rc = http1_put_answer_trailed(&out, &s->cfg.head, &a, req->minor_version, keep, head_only,
                                      resp.trailers.ptr, tlen);
    } else if (!rc) {
        rc = http1_put_answer(&out, &s->cfg.head, &a, req->minor_version, keep, head_only);
    }
    inline_note(t, took, blen);
    if (UNLIKELY(mine->m != NULL))
        metrics_note_request(mine->m, METRICS_NOGIL, a.status, clock_mono_ns() - sched_now_ns());
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
static int inline_serve(struct conn *c)
{
    struct server *s = c->home->srv;
    if (UNLIKELY(c->buf || s->cfg.access_log_fd >= 0 || server_draining(s) ||
                 c->tp != &conn_plain || c->pp_wait || s->cfg.http2 == 2))
        return 0; /* (HTTP/2 only: the coroutine answers a request 505, or takes the preface) */
    struct server_worker *mine = server_worker_self(s);
    char *buf = conn_buf_get(mine);
    if (UNLIKELY(!buf))
        return 0;
    c->buf = buf;
    c->cap = CONN_BUF_INITIAL;
    c->len = 0;
    ssize_t n;
    do
        n = conn_sock_recv(c->io.fd, buf, CONN_BUF_INITIAL);
    while (UNLIKELY(n < 0 && errno == EINTR));
    if (UNLIKELY(n <= 0)) {
        if (n < 0 && errno == EAGAIN) {
            conn_idle_inline(c, mine); /* a spurious wake-up: nothing arrived */
            return 1;
        }
        return 0; /* end of stream or an error: the coroutine sees it again and closes */
    }
    c->len = (size_t)n;
    if (UNLIKELY(mine->m != NULL))
        metrics_add(&mine->m->bytes_in, (uint64_t)n);
    if (UNLIKELY((size_t)n == CONN_BUF_INITIAL))
        return 0; /* maybe more behind it */
    c->drained = 1;
    if (!s->cfg.inline_routes)
        return 0; /* no route could be answered here: the coroutine parses what was read */

    struct http_header hdrs[INLINE_HEADERS];
    struct http_request req;
    req.headers = hdrs;
    req.num_headers = INLINE_HEADERS;
    if (http_parse_request(buf, (size_t)n, &req, &s->cfg.limits) != (int)n)
        return 0;
    c->stray_crlf = 0; /* a request came: the next one may be followed by a CRLF again */
    http1_empty_path_is_root(&req);
    if (req.content_length > 0 || req.chunked || !req.keep_alive || UNLIKELY(req.upgrade))
        return 0; /* an upgrade (h2c) is the coroutine's to decide */
    struct router_match m;
    if (router_match(s->router, ROUTER_METHOD_BIT(req.method_id), req.path, req.path_len, &m) < 0)
        return 0;
    const struct server_target *t = m.target;
    if (t->kind == SERVER_NOGIL) {
        /* A forwarded host replaces the Host field the handler reads: request_dispatch's
         * work, in the coroutine (a static answer does not read it). */
        if (UNLIKELY(s->trust.host))
            return 0;
        /* safety: see inline_note; a stale value runs at most one more call inline. */
        if (atomic_load_explicit(&t->inline_state, memory_order_relaxed) != INLINE_LEARN)
            return 0;
        return inline_nogil(c, mine, t, &req, &m);
    }
    if (t->kind != SERVER_STATIC || UNLIKELY(t->static_health && server_health_failing(s)))
        return 0; /* a failing health check is answered 503 by the coroutine (request.c) */
    size_t body_len = req.method_id == HTTP_HEAD ? 0 : t->static_body_len;
    if (HTTP1_STATIC_HEAD_MAX(t) + body_len > CONN_BUF_INITIAL)
        return 0;
    /* The request's views are not needed any more: the answer is built over them. */
    char *p = http1_static_head_put(buf, t, 1, req.minor_version);
    memcpy(p, t->static_body, body_len);
    /* Counted without a clock read: an answer made here is in the first duration bucket
     * (metrics.h, quick). static_status is 200..599 (server_target_static). */
    if (UNLIKELY(mine->m != NULL))
        metrics_add(&mine->m->quick[(unsigned)t->static_status / 100u - 1u], 1);
    return inline_send(c, mine, buf, (size_t)(p - buf) + body_len, 1);
}


/* conn_proto.on_readable of HTTP/1: a lone request is answered inline when it can be, else
 * the coroutine serves the connection. */
static void http1_on_readable(struct conn *c, uint32_t events)
{
    if (!(events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && inline_serve(c))
        return;
    conn_busy_pay(c);
    int rc = sched_spawn(c->home->srv->sched, http1_serve, c);
    if (UNLIKELY(rc < 0))
        conn_destroy(c); /* shutting down or out of memory: drop the connection */
}

const struct conn_proto http1_proto = {
    .on_readable = http1_on_readable,
    .on_timeout = http1_on_timeout,
    .close = NULL, /* HTTP/1 keeps nothing of its own on an idle connection */
};
