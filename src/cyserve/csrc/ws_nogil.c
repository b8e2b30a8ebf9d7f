/* ws_nogil.c: GIL-free WebSocket routes; ws_nogil.h has the design.
 *
 * One batch: a readable event takes a coroutine (wsn_on_readable), which reads the socket until
 * it is drained, hands each whole message to on_message straight from the read buffer (the codec
 * unmasked it in place; fragments are gathered first), answers pings, and writes what the
 * callbacks sent in one send per batch (wsn->out). Then sched_io_release: the connection is idle
 * again (wsn_go_idle) and the coroutine ends, its read buffer back in the worker's cache unless
 * a frame is half in. So an idle WebSocket costs its struct conn and its struct wsn.
 *
 * Closing follows ws_conn.c: a client's close is echoed with its code and the TCP connection is
 * closed; the handler's close (or a rule the client broke, or a failed on_message) sends a close
 * frame and waits up to WSCONN_CLOSE_WAIT_NS for the client's, idle meanwhile. on_close runs from
 * wsn_proto.close, when the connection is destroyed: after the coroutine ended it, or from a
 * stop's sweep of idle connections (the home's loop lock held, not in a coroutine), which first
 * tries to send 1001 without waiting. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ws_nogil.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>

#include "compat.h"
#include "conn.h"
#include "request.h"
#include "sched.h"
#include "server.h"
#include "server_int.h"
#include "ws_conn.h"
#include "ws_zlend.h"

/* A message at least this long is written from the handler's memory at once (after what the
 * batch queued) rather than copied into the batch's output. */
#define WSN_DIRECT_MIN (16u << 10)
/* The batch's output is written once it holds this much, without waiting for the batch's end. */
#define WSN_OUT_FLUSH_AT (64u << 10)

static int wsn_header_is(const cyserve_header *h, const char *name, size_t n)
{
    return h->name.len == n && strncasecmp(h->name.ptr, name, n) == 0;
}

/* The zlib streams of a connection that negotiated permessage-deflate are the thread's, lent
 * for one message (ws_zlend.h): answered with no context takeover either way (wsn_negotiate), a
 * connection keeps no window between messages. */
static void wsn_zreturn_in(struct wsn *w, int dirty)
{
    wsz_return_in(&w->z, &w->zmsg, dirty);
}

static void wsn_zborrow_in(struct wsn *w)
{
    wsz_borrow_in(&w->z, &w->zmsg);
}

/* permessage-deflate for the request's offers (its Sec-WebSocket-Extensions fields, joined as
 * one list): the first acceptable, answered with no context takeover both ways. Returns the
 * answer's length in out with *p filled, or 0 to speak uncompressed (no acceptable offer, or
 * no memory to read them). */
static size_t wsn_negotiate(const cyserve_request *creq, struct ws_pmd_params *p,
                            char out[WS_PMD_RESPONSE_MAX])
{
    size_t total = 0;
    for (size_t i = 0; i < creq->num_headers; i++)
        if (wsn_header_is(&creq->headers[i], "sec-websocket-extensions", 24))
            total += creq->headers[i].value.len + 1;
    if (!total)
        return 0;
    char *v = malloc(total);
    if (UNLIKELY(!v))
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < creq->num_headers; i++) {
        const cyserve_header *h = &creq->headers[i];
        if (!wsn_header_is(h, "sec-websocket-extensions", 24))
            continue;
        if (n)
            v[n++] = ',';
        memcpy(v + n, h->value.ptr, h->value.len);
        n += h->value.len;
    }
    size_t len = ws_pmd_negotiate(v, n, p, out);
    free(v);
    if (!len)
        return 0;
    p->server_no_context_takeover = 1;
    p->client_no_context_takeover = 1;
    return ws_pmd_response(p, out);
}

int wsn_open(struct request *rq, const struct server_target *t, cyserve_request *creq)
{
    struct ws_handshake hs;
    memset(&hs, 0, sizeof(hs));
    for (size_t i = 0; i < creq->num_headers; i++) {
        const cyserve_header *h = &creq->headers[i];
        if (wsn_header_is(h, "upgrade", 7)) {
            if (ws_token_list_has(h->value.ptr, h->value.len, "websocket"))
                hs.upgrade_websocket = 1;
        } else if (wsn_header_is(h, "connection", 10)) {
            if (ws_token_list_has(h->value.ptr, h->value.len, "upgrade"))
                hs.connection_upgrade = 1;
        } else if (wsn_header_is(h, "sec-websocket-key", 17)) {
            if (!hs.key) {
                hs.key = h->value.ptr;
                hs.key_len = h->value.len;
            }
        } else if (wsn_header_is(h, "sec-websocket-version", 21)) {
            if (!hs.version) {
                hs.version = h->value.ptr;
                hs.version_len = h->value.len;
            }
        }
    }
    hs.is_get = cyserve_str_eq(creq->method, "GET", 3);
    hs.minor_version = creq->minor_version;
    const char *why = NULL;
    int status = ws_handshake_check(&hs, &why);
    if (status)
        return status;
    if (rq->http2)
        return 400; /* WebSocket over HTTP/2 (RFC 8441) is not spoken: HTTP/1.1 only */
    char accept[WS_ACCEPT_LEN];
    if (ws_accept(hs.key, hs.key_len, accept) != 0)
        return 400; /* checked by ws_handshake_check: not reached */
    struct wsn *w = calloc(1, sizeof(*w));
    if (UNLIKELY(!w))
        return -ENOMEM;
    const struct server_config *cfg = &rq->srv->cfg;
    w->t = t;
    w->c = rq->c;
    ws_reader_init(&w->r, cfg->ws_max_message ? cfg->ws_max_message : WSCONN_MAX_MESSAGE);
    char pmd_answer[WS_PMD_RESPONSE_MAX];
    size_t pmd_len = cfg->ws_deflate ? wsn_negotiate(creq, &w->z.p, pmd_answer) : 0;
    wbuf_init(&w->frag, NULL, 0);
    wbuf_init(&w->out, NULL, 0);
    w->ping_at = w->pong_deadline = w->close_deadline = -1;
    w->close_code = WS_CLOSE_ABNORMAL;
    w->state = WSN_OPENING;
    if (t->ws->on_open((cyserve_ws *)w, creq, &rq->resp, t->ctx) != 0) {
        /* Refused: the handler's answer (403 unless it chose a status), and the connection
         * closes, since the client may still send frames behind its handshake. */
        if (rq->resp.status == 200)
            resp_set_status(&rq->resp, 403);
        rq->resp.close = 1;
        w->state = WSN_DONE; /* on_close is for accepted connections only */
        wbuf_free(&w->out);
        free(w);
        return 0;
    }
    resp_set_switching(&rq->resp);
    int rc = resp_add_header(&rq->resp, "Upgrade", 7, "websocket", 9);
    if (!rc)
        rc = resp_add_header(&rq->resp, "Connection", 10, "Upgrade", 7);
    if (!rc)
        rc = resp_add_header(&rq->resp, "Sec-WebSocket-Accept", 20, accept, WS_ACCEPT_LEN);
    if (!rc && pmd_len) {
        rc = resp_add_header(&rq->resp, "Sec-WebSocket-Extensions", 24, pmd_answer, pmd_len);
        w->r.deflate = 1;
    }
    if (UNLIKELY(rc)) {
        wsn_discard(w);
        return -ENOMEM;
    }
    rq->wsn = w;
    return 0;
}

/* Tell on_close (once) and free w. */
static void wsn_free(struct wsn *w)
{
    int told = w->state == WSN_DONE;
    w->state = WSN_DONE;
    if (!told && w->t->ws->on_close)
        w->t->ws->on_close((cyserve_ws *)w, w->close_code, w->t->ctx);
    wbuf_free(&w->frag);
    wbuf_free(&w->out);
    ws_pmd_free(&w->z); /* an inflater lent for a message that never ended */
    free(w->zmsg.ptr);
    free(w);
}

void wsn_discard(struct wsn *w)
{
    w->close_code = WS_CLOSE_ABNORMAL;
    wsn_free(w);
}

/* ---- sending ---- */

/* Append a frame (opcode, payload p[0..n)) to the batch's output. 0 or -ENOMEM. */
static int wsn_queue(struct wsn *w, int opcode, const char *p, size_t n)
{
    if (UNLIKELY(wbuf_reserve(&w->out, WS_HEAD_MAX + n)))
        return -ENOMEM;
    w->out.len += ws_frame_head((unsigned char *)w->out.ptr + w->out.len, opcode, 1, n);
    if (n)
        memcpy(w->out.ptr + w->out.len, p, n);
    w->out.len += n;
    return 0;
}

/* Write the batch's output. 0 or -errno. The connection's coroutine, after the 101. */
static int wsn_flush(struct wsn *w)
{
    if (!w->out.len)
        return 0;
    struct iovec iov = {w->out.ptr, w->out.len};
    w->out.len = 0;
    return conn_sendv(w->c, &iov, 1, 0);
}

/* Compress p[0..n) with the thread's deflater and queue it as one frame with RSV1 set (RFC 7692
 * 6). 0, -ENOMEM, or -EAGAIN when it could not be compressed (the caller sends it as it is,
 * which is always allowed). */
static int wsn_queue_deflated(struct wsn *w, int op, const char *p, size_t n)
{
    const struct ws_buf *z;
    int rc = wsz_deflate(&w->z.p, p, n, &z);
    if (rc)
        return rc == -ENOMEM ? rc : -EAGAIN;
    if (UNLIKELY(wbuf_reserve(&w->out, WS_HEAD_MAX + z->len)))
        return -ENOMEM;
    unsigned char *head = (unsigned char *)w->out.ptr + w->out.len;
    size_t hl = ws_frame_head(head, op, 1, z->len);
    head[0] |= 0x40; /* RSV1: a compressed message */
    memcpy(w->out.ptr + w->out.len + hl, z->ptr, z->len);
    w->out.len += hl + z->len;
    return 0;
}

int wsn_send(struct wsn *w, int opcode, const char *p, size_t n)
{
    if (opcode != CYSERVE_WS_TEXT && opcode != CYSERVE_WS_BINARY)
        return -EINVAL;
    if (w->state != WSN_OPEN && w->state != WSN_OPENING)
        return -EPIPE;
    if (n && !p)
        return -EINVAL;
    if (opcode == CYSERVE_WS_TEXT) {
        /* The client must fail a connection that sends it invalid UTF-8 (RFC 6455 8.1): the
         * handler's mistake is reported to it instead. */
        uint32_t st = 0;
        if (ws_utf8_feed(&st, (const unsigned char *)p, n) != 0 || st != 0)
            return -EINVAL;
    }
    int op = opcode == CYSERVE_WS_TEXT ? WS_OP_TEXT : WS_OP_BINARY;
    if (w->r.deflate && n >= WSCONN_DEFLATE_MIN) {
        int rc = wsn_queue_deflated(w, op, p, n);
        if (rc != -EAGAIN) {
            if (rc == 0 && w->out.len >= WSN_OUT_FLUSH_AT && w->state == WSN_OPEN)
                rc = wsn_flush(w);
            return rc;
        }
    }
    if (n >= WSN_DIRECT_MIN && w->state == WSN_OPEN) {
        /* Large: written from where it is, behind what the batch queued. */
        int rc = wsn_flush(w);
        if (rc)
            return rc;
        unsigned char head[WS_HEAD_MAX];
        struct iovec iov[2] = {{head, ws_frame_head(head, op, 1, n)}, {(void *)p, n}};
        return conn_sendv(w->c, iov, 2, 0);
    }
    int rc = wsn_queue(w, op, p, n);
    if (rc == 0 && w->out.len >= WSN_OUT_FLUSH_AT && w->state == WSN_OPEN)
        rc = wsn_flush(w);
    return rc;
}

/* The close begun by (enum metrics_ws_by) with code, unless one was begun before: the metrics
 * count a connection's end by the first (wsn_on_close), as the client sees it. */
static void wsn_decide(struct wsn *w, int code, int by)
{
    if (!w->end_code) {
        w->end_code = code;
        w->end_by = by;
    }
}

/* Queue our close frame with code and reason, once; the client's is awaited from now on. */
static int wsn_start_close(struct wsn *w, int code, const char *reason, size_t n)
{
    char p[WS_CONTROL_MAX];
    size_t pl = ws_close_payload(p, code, reason, n);
    wsn_decide(w, code, METRICS_WS_BY_SERVER);
    w->state = WSN_CLOSING;
    w->close_code = code;
    w->close_deadline = conn_deadline_after(WSCONN_CLOSE_WAIT_NS);
    return wsn_queue(w, WS_OP_CLOSE, p, pl);
}

int wsn_close(struct wsn *w, int code, const char *reason, size_t n)
{
    if (!ws_close_code_valid(code) || (n && !reason))
        return -EINVAL;
    if (w->state != WSN_OPEN && w->state != WSN_OPENING)
        return -EPIPE;
    return wsn_start_close(w, code, reason, n);
}

/* ---- reading ---- */

enum { WSN_GO_ON = 0, WSN_END = 1 };

/* A whole message to on_message; a failure there closes with 1011. */
static void wsn_deliver(struct wsn *w, int opcode, const char *p, size_t n)
{
    if (w->state != WSN_OPEN || !w->t->ws->on_message)
        return; /* closing: the handler said it wants nothing more */
    int ev = opcode == WS_OP_TEXT ? CYSERVE_WS_TEXT : CYSERVE_WS_BINARY;
    if (w->t->ws->on_message((cyserve_ws *)w, ev, p, n, w->t->ctx) != 0 && w->state == WSN_OPEN)
        wsn_start_close(w, WS_CLOSE_INTERNAL, NULL, 0);
}

/* Read the frames the buffer holds. WSN_GO_ON, or WSN_END when the connection must close
 * (after the batch's output is written). */
static int wsn_read_frames(struct wsn *w)
{
    struct conn *c = w->c;
    size_t pos = 0;
    int rc = WSN_GO_ON;
    while (pos < c->len && rc == WSN_GO_ON) {
        struct ws_frame f;
        ssize_t n = ws_read_frame(&w->r, c->buf + pos, c->len - pos, &f);
        if (n == -2)
            break;
        if (n < 0) {
            /* The client broke a rule: close with the RFC's code at once. */
            if (w->state != WSN_CLOSING && w->state != WSN_DONE)
                wsn_start_close(w, w->r.error, NULL, 0);
            w->close_code = w->r.error;
            rc = WSN_END;
            break;
        }
        pos += (size_t)n;
        switch (f.opcode) {
        case WS_OP_PING:
            if (w->state == WSN_OPEN && wsn_queue(w, WS_OP_PONG, f.payload, (size_t)f.len))
                rc = WSN_END;
            break;
        case WS_OP_PONG:
            /* The answer to our keep-alive ping ends its wait; others are ignored (5.5.3). */
            if (w->pong_deadline >= 0 && f.len == sizeof(w->ping_id) &&
                memcmp(f.payload, &w->ping_id, sizeof(w->ping_id)) == 0)
                w->pong_deadline = -1;
            break;
        case WS_OP_CLOSE:
            if (w->state == WSN_OPEN) {
                /* Echo its code (none for none), then close the TCP connection (7.1.1). */
                char p[WS_CONTROL_MAX];
                size_t pl = ws_close_payload(p, f.code, NULL, 0);
                wsn_queue(w, WS_OP_CLOSE, p, pl);
                w->state = WSN_CLOSING;
                w->close_code = f.code;
                wsn_decide(w, f.code, METRICS_WS_BY_CLIENT);
            }
            rc = WSN_END;
            break;
        default:
            if (f.compressed) {
                if (f.first)
                    wsn_zborrow_in(w);
                if (ws_pmd_inflate(&w->z, &w->r, &f, &w->zmsg) != 0) {
                    /* Bad deflate data or UTF-8 (1007), too big (1009), no memory (1011). */
                    wsn_zreturn_in(w, 1);
                    if (w->state != WSN_CLOSING && w->state != WSN_DONE)
                        wsn_start_close(w, w->r.error, NULL, 0);
                    w->close_code = w->r.error;
                    rc = WSN_END;
                    break;
                }
                if (f.fin) {
                    wsn_deliver(w, f.opcode, w->zmsg.ptr, w->zmsg.len);
                    wsn_zreturn_in(w, 0);
                }
                break;
            }
            if (f.first && f.fin) {
                wsn_deliver(w, f.opcode, f.payload, (size_t)f.len);
                break;
            }
            if (f.first)
                w->frag.len = 0;
            if (f.len && wbuf_append(&w->frag, f.payload, (size_t)f.len)) {
                rc = WSN_END;
                break;
            }
            if (f.fin) {
                wsn_deliver(w, f.opcode, w->frag.ptr, w->frag.len);
                wbuf_free(&w->frag); /* a large message's room is not kept while idle */
                wbuf_init(&w->frag, NULL, 0);
            }
            break;
        }
    }
    if (pos) {
        memmove(c->buf, c->buf + pos, c->len - pos);
        c->len -= pos;
    }
    return rc;
}

/* The deadlines of an open connection: the keep-alive ping, its pong, our close's answer.
 * Sends a ping when one is due. Returns WSN_END when the connection must close. */
static int wsn_timers(struct wsn *w)
{
    const struct server_config *cfg = &w->c->home->srv->cfg;
    int64_t now = (int64_t)sched_now_ns();
    if (w->state == WSN_CLOSING)
        return now >= w->close_deadline ? WSN_END : WSN_GO_ON;
    if (w->pong_deadline >= 0 && now >= w->pong_deadline) {
        /* No pong within ws_ping_timeout: the peer is gone or stuck (1011, as ws_conn.c). */
        wsn_start_close(w, WS_CLOSE_INTERNAL, NULL, 0);
        return WSN_END;
    }
    if (w->ping_at >= 0 && now >= w->ping_at && w->pong_deadline < 0) {
        w->ping_id = (uint64_t)now;
        if (wsn_queue(w, WS_OP_PING, (const char *)&w->ping_id, sizeof(w->ping_id)))
            return WSN_END;
        w->ping_at = now + (int64_t)cfg->ws_ping_interval_ns;
        if (cfg->ws_ping_timeout_ns)
            w->pong_deadline = now + (int64_t)cfg->ws_ping_timeout_ns;
    }
    return WSN_GO_ON;
}

/* The earliest deadline of w (sched_now_ns() clock), 0 for none. */
static uint64_t wsn_deadline(const struct wsn *w)
{
    if (w->state == WSN_CLOSING)
        return (uint64_t)w->close_deadline;
    int64_t d = w->ping_at;
    if (w->pong_deadline >= 0 && (d < 0 || w->pong_deadline < d))
        d = w->pong_deadline;
    return d < 0 ? 0 : (uint64_t)d;
}

/* Idle after sched_io_release() returned 0 (in the home section): the read buffer goes back
 * unless a frame is half in it, the batch's output room is given back, and the idle timer is
 * set to w's next deadline (none: the connection may stay idle for ever, as TCP keep-alive
 * alone watches it). */
static void wsn_go_idle(struct conn *c, struct wsn *w)
{
    if (c->buf && c->len == 0) {
        conn_buf_put(server_worker_self(c->home->srv), c->buf, c->cap);
        c->buf = NULL;
        c->cap = 0;
    }
    if (w->out.cap > 4096) {
        wbuf_free(&w->out);
        wbuf_init(&w->out, NULL, 0);
    }
    c->idle_since = sched_now_ns();
    c->drained = 0;
    /* Through the busy accounting: the readable event (or the timer) that took the connection
     * counted it busy (conn_busy_pay, wsn_on_timeout), and the count must come back with it, or
     * every GIL-free WebSocket would read busy for ever after its first message. */
    conn_set_busy(c, 0);
    /* The timer stays as it is when it is already armed for the same deadline (the usual case
     * with pings on: ping_at moves once per interval, not per message). */
    uint64_t d = wsn_deadline(w);
    if (c->timer_armed && (!d || w->timer_at != d)) {
        sched_timer_cancel(&c->idle);
        c->timer_armed = 0;
    }
    if (d && !c->timer_armed) {
        sched_timer_arm(&c->idle, d);
        c->timer_armed = 1;
        w->timer_at = d;
    }
}

/* The coroutine's work: every batch until the socket is drained. 0 when the connection went
 * idle, 1 when it must be destroyed. */
static int wsn_serve(struct conn *c, struct wsn *w)
{
    struct server *s = c->home->srv;
    for (;;) {
        int end = wsn_read_frames(w);
        if (end == WSN_GO_ON && UNLIKELY(server_draining(s)) && w->state == WSN_OPEN) {
            /* Stopping: nothing is in progress on a GIL-free WebSocket between callbacks, so
             * it goes away now rather than after the grace period. */
            wsn_start_close(w, WS_CLOSE_GOING_AWAY, NULL, 0);
            end = WSN_END;
        }
        if (end == WSN_GO_ON)
            end = wsn_timers(w);
        if (wsn_flush(w) < 0 || end == WSN_END)
            return 1;
        if (c->drained) {
            int rc = sched_io_release(&c->io);
            if (rc == 0) {
                wsn_go_idle(c, w);
                return 0;
            }
            if (rc == -ECANCELED && w->state == WSN_OPEN) {
                /* The scheduler stops: going away, said without waiting for an answer. */
                wsn_start_close(w, WS_CLOSE_GOING_AWAY, NULL, 0);
                wsn_flush(w);
            }
            if (rc != -EAGAIN)
                return 1;
            c->drained = 0;
        }
        /* Room for the frame being read: the codec said how large it is once its head is in. */
        size_t want = w->r.need > c->cap ? (size_t)w->r.need : c->cap;
        if (c->len == c->cap && c->cap)
            want = c->cap * 2 > want ? c->cap * 2 : want;
        if (conn_reserve(c, want ? want : CONN_BUF_INITIAL) < 0)
            return 1;
        ssize_t n = conn_read_once(c);
        if (n > 0 || n == -EAGAIN)
            continue; /* after EAGAIN, drained is set: release on the next turn */
        return 1;     /* the client went without a close frame: 1006 */
    }
}

int wsn_take_over(struct conn *c, struct wsn *w, size_t off)
{
    const struct server_config *cfg = &c->home->srv->cfg;
    c->proto = &wsn_proto;
    c->proto_data = w;
    w->c = c;
    if (w->state == WSN_OPENING)
        w->state = WSN_OPEN;
    if (cfg->ws_ping_interval_ns)
        w->ping_at = conn_deadline_after(cfg->ws_ping_interval_ns);
    if (off) {
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
    }
    return wsn_serve(c, w);
}

/* ---- the protocol ---- */

static int wsn_serve_co(struct coro *co, void *arg)
{
    (void)co;
    struct conn *c = arg;
    if (wsn_serve(c, c->proto_data))
        conn_destroy(c);
    return 0;
}

/* A frame (or a hang-up) on the idle connection: a coroutine serves the batch. */
static void wsn_on_readable(struct conn *c, uint32_t events)
{
    (void)events;
    conn_busy_pay(c);
    if (UNLIKELY(sched_spawn(c->home->srv->sched, wsn_serve_co, c) < 0))
        conn_destroy(c);
}

/* A deadline of the idle connection (a ping due, a pong or a close overdue): a coroutine sees
 * to it, as for a readable event. The connection is busy, and counted so at once (a coroutine
 * takes it, as conn_busy_pay counts a readable event's): wsn_go_idle and conn_destroy take the
 * count back. */
static void wsn_on_timeout(struct conn *c)
{
    sched_io_take(&c->io); /* a readable event meanwhile is this coroutine's, not a second's */
    conn_set_busy(c, 1);
    if (UNLIKELY(sched_spawn(c->home->srv->sched, wsn_serve_co, c) < 0))
        conn_destroy(c);
}

static uint64_t wsn_idle_deadline(struct conn *c)
{
    struct wsn *w = c->proto_data;
    w->timer_at = wsn_deadline(w); /* conn_idle_timeout re-arms the timer for it */
    return w->timer_at;
}

/* The connection is destroyed. From a stop's sweep of idle connections (or the server's
 * teardown), an open WebSocket first gets a 1001 close frame, sent without waiting through the
 * connection's transport (conn_send_nowait: a TLS record over TLS): a client whose socket
 * buffer is full gets none. Then the metrics count its end (the close decided first; none: the
 * client left without one, 1006), and on_close. */
static void wsn_on_close(struct conn *c)
{
    struct wsn *w = c->proto_data;
    if (!w)
        return;
    c->proto_data = NULL;
    if (w->state == WSN_OPEN && !c->busy) {
        /* The stop decided it, whether or not the frame fits in the socket. */
        wsn_decide(w, WS_CLOSE_GOING_AWAY, METRICS_WS_BY_SERVER);
        /* Through the transport (a TLS record over TLS): the sweep runs on c's home, which owns
         * the TLS session while no coroutine serves c, so nothing else writes it meanwhile. */
        char frame[WS_HEAD_MAX + 2];
        size_t hl = ws_frame_head((unsigned char *)frame, WS_OP_CLOSE, 1, 2);
        frame[hl] = (char)(WS_CLOSE_GOING_AWAY >> 8);
        frame[hl + 1] = (char)(WS_CLOSE_GOING_AWAY & 0xFF);
        if (conn_send_nowait(c, frame, hl + 2) == (ssize_t)(hl + 2))
            w->close_code = WS_CLOSE_GOING_AWAY;
    }
    metrics_note_ws_close(server_metrics_self(c->home->srv),
                          w->end_code ? w->end_code : WS_CLOSE_ABNORMAL, (unsigned)w->end_by);
    wsn_free(w);
}

const struct conn_proto wsn_proto = {
    .on_readable = wsn_on_readable,
    .on_timeout = wsn_on_timeout,
    .close = wsn_on_close,
    .idle_deadline = wsn_idle_deadline,
};
