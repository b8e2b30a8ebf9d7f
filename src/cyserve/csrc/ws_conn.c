/* ws_conn.c: a WebSocket connection in the engine; ws_conn.h has the design.
 *
 * The coroutine's loop: read frames from what the buffer holds (the codec unmasks them in
 * place), answer control frames, hand each whole message to the producer; send what the producer
 * queued; read the socket until EAGAIN; then wait for readable OR the producer's signal. An
 * unfragmented message (the common case) is handed over from the read buffer itself; fragments
 * are gathered in a buffer of the coroutine's until the last one. The read buffer grows to the
 * frame being read (at most WSCONN_MAX_MESSAGE and its head: the codec refuses a larger one from
 * its head alone).
 *
 * Closing: when the client sends close, its code is echoed (RFC 6455 5.5.1) and the TCP
 * connection closed by the server, as 7.1.1 wants. When the producer (or a protocol error, or a
 * stop) closes, the close frame goes out after what was queued, and the client's close is
 * awaited for WSCONN_CLOSE_WAIT_NS, data frames meanwhile dropped. A stop cancels the handoff's
 * signal (handoff_cancel_all, after the grace period): the client gets 1001.
 *
 * A client that broke a rule after messages were handed to the producer gets its close frame
 * only once the producer took the close event queued behind them (wsconn_fail): the producer runs
 * on another thread, so its answers to those messages would otherwise race the close, and lose
 * when the broken frame came in the same segment as the messages. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ws_conn.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "compat.h"
#include "conn.h"
#include "coro.h"
#include "handoff.h"
#include "sched.h"
#include "server_int.h"
#include "wbuf.h"
#include "ws_zlend.h"

int wsconn_attach(struct handoff *h, wsconn_deliver_fn deliver, const struct ws_pmd_params *pmd)
{
    if (pmd && (!pmd->server_no_context_takeover || !pmd->client_no_context_takeover))
        return -EINVAL; /* a lent stream must not carry a window from one message to the next */
    struct wsconn_chan *ch = calloc(1, sizeof(*ch));
    if (UNLIKELY(!ch))
        return -ENOMEM;
    ch->deliver = deliver;
    if (pmd) {
        ch->deflate = 1;
        ch->pmd = *pmd;
    }
    pthread_mutex_init(&ch->lock, NULL);
    h->ws = ch;
    return 0;
}

void wsconn_chan_free(struct wsconn_chan *ch)
{
    struct wsconn_out *o = ch->head;
    while (o) {
        struct wsconn_out *next = o->next;
        free(o);
        o = next;
    }
    pthread_mutex_destroy(&ch->lock);
    free(ch);
}

int wsconn_send(struct handoff *h, int opcode, const char *p, size_t n)
{
    struct wsconn_chan *ch = h->ws;
    if (handoff_gone(h))
        return -EPIPE;
    struct wsconn_out *o = malloc(sizeof(*o) + WS_HEAD_MAX + n);
    if (UNLIKELY(!o))
        return -ENOMEM;
    size_t hl = ws_frame_head((unsigned char *)o->data, opcode, 1, n);
    if (n)
        memcpy(o->data + hl, p, n);
    o->len = hl + n;
    o->next = NULL;
    pthread_mutex_lock(&ch->lock);
    if (ch->close_req) {
        pthread_mutex_unlock(&ch->lock);
        free(o);
        return -EPIPE;
    }
    if (ch->tail)
        ch->tail->next = o;
    else
        ch->head = o;
    ch->tail = o;
    ch->bytes += o->len;
    int over = ch->bytes > WSCONN_HIGH_WATER;
    if (over)
        ch->want_drained = 1;
    pthread_mutex_unlock(&ch->lock);
    sched_signal_set(&h->ready); /* the lock ordered the queue before the engine's look */
    return over;
}

int wsconn_close(struct handoff *h, int code, const char *reason, size_t n)
{
    struct wsconn_chan *ch = h->ws;
    if (handoff_gone(h))
        return -EPIPE;
    pthread_mutex_lock(&ch->lock);
    int rc = -EPIPE;
    if (!ch->close_req) {
        ch->close_req = 1;
        ch->close_code = code;
        ch->close_len = ws_close_payload(ch->close_reason, code, reason, n);
        rc = 0;
    }
    pthread_mutex_unlock(&ch->lock);
    if (rc == 0)
        sched_signal_set(&h->ready);
    return rc;
}

void wsconn_consumed(struct handoff *h, size_t n)
{
    struct wsconn_chan *ch = h->ws;
    if (handoff_gone(h))
        return;
    n += WSCONN_MSG_COST;
    pthread_mutex_lock(&ch->lock);
    ch->in_held = ch->in_held > n ? ch->in_held - n : 0;
    int wake = ch->want_room && ch->in_held < WSCONN_IN_WINDOW;
    if (wake)
        ch->want_room = 0;
    pthread_mutex_unlock(&ch->lock);
    if (wake)
        sched_signal_set(&h->ready);
}

/* ---- the engine's side ---- */

struct wsconn_session {
    struct conn *c;
    struct server *srv;
    struct handoff *h;
    struct wsconn_chan *ch;
    struct ws_reader r;
    struct wbuf frag;      /* a fragmented message so far */
    struct ws_pmd z;       /* permessage-deflate, when negotiated: its inflater is the thread's,
                            * lent while a compressed message arrives (ws_zlend.h) */
    struct ws_buf msg;     /* a compressed message, inflated so far (lent as the inflater) */
    int64_t ping_at;       /* when the next ping goes out (< 0: no pings) */
    int64_t pong_deadline; /* a ping awaits its pong until then (< 0: none awaited) */
    uint64_t ping_id;      /* the payload of the ping awaited */
    int close_sent;
    int closed_told; /* the producer got WSCONN_EV_CLOSED */
    int delivered;   /* a message went to the producer */
    int failing;     /* the client broke a rule: the close code, sent by wsconn_fail */
    int64_t close_deadline;
    /* The close decided first, ours or the client's (0: none yet), and who began it (enum
     * metrics_ws_by): what the metrics count when the session ends. */
    int end_code;
    int end_by;
};

struct wsconn_job {
    struct handoff *h;
    int event;
    const char *data;
    size_t len;
    int code;
};

static void wsconn_deliver_call(void *arg)
{
    struct wsconn_job *j = arg;
    j->h->ws->deliver(j->h, j->event, j->data, j->len, j->code);
}

/* Hand an event to the producer (an offloaded call). 0, or -ECANCELED when the server stops
 * (offloads are refused then; the producer learns from the gone handoff). */
static int wsconn_deliver(struct wsconn_session *ws, int event, const char *data, size_t len,
                          int code)
{
    struct wsconn_job job = {ws->h, event, data, len, code};
    if (event == WSCONN_EV_CLOSED)
        ws->closed_told = 1;
    if (event == WSCONN_EV_TEXT || event == WSCONN_EV_BINARY) {
        ws->delivered = 1;
        pthread_mutex_lock(&ws->ch->lock);
        ws->ch->in_held += len + WSCONN_MSG_COST;
        pthread_mutex_unlock(&ws->ch->lock);
    }
    return sched_offload(wsconn_deliver_call, &job);
}

/* The close begun by (enum metrics_ws_by) with code, unless one was begun before: the metrics
 * count a session's end by the first, as the client sees it. */
static void wsconn_decide(struct wsconn_session *ws, int code, int by)
{
    if (!ws->end_code) {
        ws->end_code = code;
        ws->end_by = by;
    }
}

/* Send one frame, opcode with payload p[0..n). 0 or -errno. */
static int wsconn_send_frame(struct wsconn_session *ws, int opcode, const char *p, size_t n)
{
    unsigned char head[WS_HEAD_MAX];
    struct iovec iov[2] = {{head, ws_frame_head(head, opcode, 1, n)}, {(void *)p, n}};
    return conn_sendv(ws->c, iov, n ? 2 : 1, 0);
}

/* Send our close frame with code and its payload (p[0..n), made by ws_close_payload), once, and
 * start waiting for the client's. */
static int wsconn_send_close(struct wsconn_session *ws, const char *p, size_t n)
{
    if (ws->close_sent)
        return 0;
    ws->close_sent = 1;
    ws->close_deadline = conn_deadline_after(WSCONN_CLOSE_WAIT_NS);
    return wsconn_send_frame(ws, WS_OP_CLOSE, p, n);
}

static int wsconn_send_close_code(struct wsconn_session *ws, int code)
{
    char p[WS_CONTROL_MAX];
    size_t n = ws_close_payload(p, code, NULL, 0);
    return wsconn_send_close(ws, p, n);
}

/* Replace *op's frame, made uncompressed by wsconn_send, by its compressed form (RSV1 set) when
 * permessage-deflate is on and the message is long enough to gain. The thread's deflater does
 * it (negotiated without context takeover: nothing is kept between messages), its output copied
 * into the new frame before anything yields. 0 or -ENOMEM; on failure to compress, the frame
 * goes as it was (uncompressed is always allowed). */
static int wsconn_compress(struct wsconn_session *ws, struct wsconn_out **op)
{
    struct wsconn_out *o = *op;
    size_t hl = (unsigned char)o->data[1] == 126 ? 4 : (unsigned char)o->data[1] == 127 ? 10 : 2;
    size_t n = o->len - hl;
    int opcode = o->data[0] & 0x0F;
    const struct ws_buf *z;
    if (n < WSCONN_DEFLATE_MIN || wsz_deflate(&ws->z.p, o->data + hl, n, &z) != 0)
        return 0;
    struct wsconn_out *c = malloc(sizeof(*c) + WS_HEAD_MAX + z->len);
    if (UNLIKELY(!c))
        return -ENOMEM;
    size_t chl = ws_frame_head((unsigned char *)c->data, opcode, 1, z->len);
    c->data[0] |= 0x40; /* RSV1: a compressed message (RFC 7692 6) */
    memcpy(c->data + chl, z->ptr, z->len);
    c->len = chl + z->len;
    c->next = o->next;
    free(o);
    *op = c;
    return 0;
}

/* Send what the producer queued, then its close if it asked. 0 or -errno. */
static int wsconn_send_queued(struct wsconn_session *ws)
{
    struct wsconn_chan *ch = ws->ch;
    pthread_mutex_lock(&ch->lock);
    struct wsconn_out *list = ch->head;
    ch->head = ch->tail = NULL;
    ch->bytes = 0;
    int drained = ch->want_drained && list;
    ch->want_drained = 0;
    int close_req = ch->close_req;
    pthread_mutex_unlock(&ch->lock);
    int rc = 0;
    while (list) {
        /* Up to 16 frames per send. */
        struct iovec iov[16];
        struct wsconn_out *batch[16];
        int cnt = 0;
        while (list && cnt < 16) {
            if (ws->ch->deflate && !ws->close_sent && wsconn_compress(ws, &list) != 0) {
                rc = -ENOMEM;
                break;
            }
            batch[cnt] = list;
            iov[cnt].iov_base = list->data;
            iov[cnt].iov_len = list->len;
            cnt++;
            list = list->next;
        }
        if (rc == 0 && !ws->close_sent && cnt)
            rc = conn_sendv(ws->c, iov, cnt, 0);
        for (int i = 0; i < cnt; i++)
            free(batch[i]);
        if (rc == -ENOMEM)
            while (list) {
                struct wsconn_out *next = list->next;
                free(list);
                list = next;
            }
    }
    if (rc == 0 && drained)
        wsconn_deliver(ws, WSCONN_EV_DRAINED, NULL, 0, 0);
    if (rc == 0 && close_req && !ws->close_sent && !ws->failing) {
        /* The close fields are written once, before close_req, under the lock we took. */
        wsconn_decide(ws, ch->close_code, METRICS_WS_BY_SERVER);
        rc = wsconn_send_close(ws, ch->close_reason, ch->close_len);
    }
    return rc;
}

/* A data frame: a whole message goes to the producer from where it lies; fragments are gathered
 * first, and a compressed message is inflated as its frames come. 0, -EPROTO (the reader's
 * error says the close code) or -errno. */
static int wsconn_on_data(struct wsconn_session *ws, const struct ws_frame *f)
{
    int ev = f->opcode == WS_OP_TEXT ? WSCONN_EV_TEXT : WSCONN_EV_BINARY;
    if (ws->close_sent)
        return 0; /* closing: the producer said it wants nothing more */
    if (f->compressed) {
        if (f->first)
            wsz_borrow_in(&ws->z, &ws->msg);
        if (ws_pmd_inflate(&ws->z, &ws->r, f, &ws->msg) != 0) {
            wsz_return_in(&ws->z, &ws->msg, 1);
            return -EPROTO;
        }
        if (!f->fin)
            return 0; /* the inflater stays with the message until its last frame */
        /* The inflater goes back before the delivery, which yields; the buffer after it. */
        wsz_return_in(&ws->z, NULL, 0);
        int rc = wsconn_deliver(ws, ev, ws->msg.ptr, ws->msg.len, 0);
        wsz_return_buf(&ws->msg);
        return rc;
    }
    if (f->first && f->fin)
        return wsconn_deliver(ws, ev, f->payload, (size_t)f->len, 0);
    if (f->first)
        ws->frag.len = 0;
    if (f->len && wbuf_append(&ws->frag, f->payload, (size_t)f->len))
        return -ENOMEM;
    if (!f->fin)
        return 0;
    int rc = wsconn_deliver(ws, ev, ws->frag.ptr, ws->frag.len, 0);
    wbuf_free(&ws->frag);
    wbuf_init(&ws->frag, NULL, 0);
    return rc;
}

enum { WS_GO_ON = 0, WS_END = 1, WS_FAIL = 2 };

/* The client broke a rule (code, the close code to send). With no message handed to the
 * producer, close at once: WS_END. Otherwise the producer may still be answering them: tell it
 * (the close event comes after its messages and counts in in_held until it takes it) and let
 * wsconn_fail close: WS_FAIL. */
static int wsconn_broken(struct wsconn_session *ws, int code)
{
    wsconn_decide(ws, code, METRICS_WS_BY_SERVER);
    if (ws->delivered && !ws->closed_told && !ws->close_sent) {
        ws->failing = code;
        pthread_mutex_lock(&ws->ch->lock);
        ws->ch->in_held += WSCONN_MSG_COST; /* given back when the producer takes the close */
        pthread_mutex_unlock(&ws->ch->lock);
        wsconn_deliver(ws, WSCONN_EV_CLOSED, NULL, 0, code);
        return WS_FAIL;
    }
    wsconn_send_close_code(ws, code);
    if (!ws->closed_told)
        wsconn_deliver(ws, WSCONN_EV_CLOSED, NULL, 0, code);
    return WS_END;
}

/* Read the frames the buffer holds. WS_GO_ON, or WS_END when the connection must close. */
static int wsconn_read_frames(struct wsconn_session *ws)
{
    struct conn *c = ws->c;
    size_t pos = 0;
    int rc = WS_GO_ON;
    while (pos < c->len) {
        struct ws_frame f;
        ssize_t n = ws_read_frame(&ws->r, c->buf + pos, c->len - pos, &f);
        if (n == -2)
            break;
        if (n < 0) /* the client broke a rule: close with the RFC's code */
            return wsconn_broken(ws, ws->r.error);
        pos += (size_t)n;
        switch (f.opcode) {
        case WS_OP_PING:
            if (!ws->close_sent && wsconn_send_frame(ws, WS_OP_PONG, f.payload, (size_t)f.len))
                return WS_END;
            break;
        case WS_OP_PONG:
            /* The answer to our keep-alive ping ends its wait; others (unsolicited, or to an
             * older ping) are ignored (5.5.3). */
            if (ws->pong_deadline >= 0 && f.len == sizeof(ws->ping_id) &&
                memcmp(f.payload, &ws->ping_id, sizeof(ws->ping_id)) == 0)
                ws->pong_deadline = -1;
            break;
        case WS_OP_CLOSE:
            if (!ws->close_sent) {
                /* Echo its code (none for none), then close the TCP connection. */
                wsconn_decide(ws, f.code, METRICS_WS_BY_CLIENT);
                char p[WS_CONTROL_MAX];
                size_t pl = ws_close_payload(p, f.code, NULL, 0);
                wsconn_send_close(ws, p, pl);
            }
            if (!ws->closed_told)
                wsconn_deliver(ws, WSCONN_EV_CLOSED, f.reason, f.reason_len, f.code);
            return WS_END;
        default: {
            int drc = wsconn_on_data(ws, &f);
            if (drc == -EPROTO)
                return wsconn_broken(ws, ws->r.error);
            if (drc)
                return WS_END;
            break;
        }
        }
    }
    if (pos) {
        memmove(c->buf, c->buf + pos, c->len - pos);
        c->len -= pos;
    }
    return rc;
}

/* The keep-alive ping (server_config.ws_ping_interval_ns): send one when it is due and none is
 * awaited. Returns the deadline the wait must respect for it (< 0: none). */
static int64_t wsconn_keepalive(struct wsconn_session *ws, int paused)
{
    const struct server_config *cfg = &ws->srv->cfg;
    if (ws->ping_at < 0 || ws->close_sent)
        return -1;
    int64_t now = (int64_t)sched_now_ns();
    if (paused) {
        /* Not reading: a pong could not be seen. The application holds the client back, so
         * its liveness is not in question until it reads again. */
        ws->pong_deadline = -1;
        ws->ping_at = now + (int64_t)cfg->ws_ping_interval_ns;
        return -1;
    }
    if (ws->pong_deadline >= 0)
        return ws->pong_deadline;
    if (now >= ws->ping_at) {
        ws->ping_id = (uint64_t)now;
        if (wsconn_send_frame(ws, WS_OP_PING, (const char *)&ws->ping_id, sizeof(ws->ping_id)))
            return -1; /* the next read or write finds the connection broken */
        ws->ping_at = now + (int64_t)cfg->ws_ping_interval_ns;
        if (cfg->ws_ping_timeout_ns) {
            ws->pong_deadline = now + (int64_t)cfg->ws_ping_timeout_ns;
            return ws->pong_deadline;
        }
    }
    return ws->ping_at;
}

static int64_t wsconn_min_deadline(int64_t a, int64_t b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    return a < b ? a : b;
}

/* After wsconn_broken said WS_FAIL: send what the producer queues until it has taken everything
 * handed to it, the close event last (in_held back to 0: it asked for the next message after
 * answering the last one), or closed itself, or WSCONN_FAIL_WAIT_NS passed; then the close frame
 * with the code of the broken rule. The socket is not read any more (what follows a broken frame
 * is not a frame). */
static void wsconn_fail(struct wsconn_session *ws)
{
    int64_t deadline = conn_deadline_after(WSCONN_FAIL_WAIT_NS);
    for (;;) {
        if (wsconn_send_queued(ws) < 0)
            return;
        pthread_mutex_lock(&ws->ch->lock);
        int done = ws->ch->in_held == 0 || ws->ch->close_req;
        ws->ch->want_room = !done; /* wsconn_consumed wakes us */
        pthread_mutex_unlock(&ws->ch->lock);
        if (done)
            break;
        int rc = sched_io_wait_signal(&ws->c->io, 0, deadline, &ws->h->ready);
        if (rc < 0 || !(rc & SCHED_SIGNALED))
            break; /* timed out, a stop, or the client hung up */
    }
    /* What it queued before taking the close goes first. */
    if (wsconn_send_queued(ws) == 0)
        wsconn_send_close_code(ws, ws->failing);
}

/* Serve c as a WebSocket until it closes, then leave h (ws_conn.h, wsconn_take_over). */
static void wsconn_serve(struct conn *c, struct handoff *h, size_t off)
{
    struct wsconn_session state = {.c = c, .srv = c->home->srv, .h = h, .ch = h->ws};
    struct wsconn_session *ws = &state;
    const struct server_config *cfg = &ws->srv->cfg;
    ws->close_deadline = -1;
    ws->pong_deadline = -1;
    ws->ping_at = cfg->ws_ping_interval_ns ? conn_deadline_after(cfg->ws_ping_interval_ns) : -1;
    ws_reader_init(&ws->r, cfg->ws_max_message ? cfg->ws_max_message : WSCONN_MAX_MESSAGE);
    ws->r.deflate = ws->ch->deflate;
    ws_pmd_init(&ws->z, &ws->ch->pmd);
    wbuf_init(&ws->frag, NULL, 0);
    if (off) {
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
    }
    handoff_track(ws->srv, h, 1);
    int close_code = WS_CLOSE_ABNORMAL; /* what the producer is told if nothing better is known */
    for (;;) {
        int frc = wsconn_read_frames(ws);
        if (frc == WS_FAIL)
            wsconn_fail(ws);
        if (frc != WS_GO_ON)
            break;
        if (wsconn_send_queued(ws) < 0)
            break;
        /* An application that does not take its messages stops the reading (WSCONN_IN_WINDOW):
         * the socket is then not read, so TCP holds the client back; its wsconn_consumed wakes
         * us through the signal. A close in progress reads on, to see the client's close. */
        pthread_mutex_lock(&ws->ch->lock);
        int paused = ws->ch->in_held >= WSCONN_IN_WINDOW && !ws->close_sent;
        ws->ch->want_room = paused;
        pthread_mutex_unlock(&ws->ch->lock);
        int64_t deadline = wsconn_min_deadline(ws->close_deadline, wsconn_keepalive(ws, paused));
        if (!paused) {
            /* Room for the frame being read: the codec said how large it is once its head is
             * in. */
            size_t want = ws->r.need > c->cap ? (size_t)ws->r.need : c->cap;
            if (c->len == c->cap)
                want = c->cap * 2 > want ? c->cap * 2 : want;
            if (want > c->cap && conn_reserve(c, want) < 0)
                break;
            if (!c->drained) {
                ssize_t n = conn_read_once(c);
                if (n > 0)
                    continue;
                if (n == 0 || n != -EAGAIN)
                    break; /* the client went without a close frame: 1006 */
            }
        }
        if (c->buf && c->len == 0) {
            /* Nothing half read: the buffer goes back to the worker's cache while we wait, so an
             * idle WebSocket holds none (the next read takes one). */
            conn_buf_put(server_worker_self(ws->srv), c->buf, c->cap);
            c->buf = NULL;
            c->cap = 0;
        }
        /* Paused, the wait takes no readiness (events 0): an error or a hang-up still ends it,
         * and readability stays recorded for the wait after the pause. */
        int rc = sched_io_wait_signal(&c->io, paused ? 0 : EPOLLIN, deadline, &h->ready);
        if (rc == -ECANCELED) {
            /* The server stops (after its grace period): going away. */
            wsconn_decide(ws, WS_CLOSE_GOING_AWAY, METRICS_WS_BY_SERVER);
            if (!ws->close_sent)
                wsconn_send_close_code(ws, WS_CLOSE_GOING_AWAY);
            close_code = WS_CLOSE_GOING_AWAY;
            break;
        }
        if (rc == -ETIMEDOUT) {
            int64_t now = (int64_t)sched_now_ns();
            if (ws->close_sent && now >= ws->close_deadline)
                break; /* the client did not answer our close in time */
            if (ws->pong_deadline >= 0 && now >= ws->pong_deadline) {
                /* No pong within ws_ping_timeout: the peer is gone or stuck (1011, as the
                 * websockets library closes then). */
                wsconn_decide(ws, WS_CLOSE_INTERNAL, METRICS_WS_BY_SERVER);
                wsconn_send_close_code(ws, WS_CLOSE_INTERNAL);
                close_code = WS_CLOSE_INTERNAL;
                break;
            }
            continue; /* a ping is due */
        }
        if (rc < 0)
            break;
        if (rc & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
            c->drained = 0;
    }
    if (ws->close_sent && close_code == WS_CLOSE_ABNORMAL) {
        pthread_mutex_lock(&ws->ch->lock);
        if (ws->ch->close_req)
            close_code = ws->ch->close_code;
        pthread_mutex_unlock(&ws->ch->lock);
    }
    if (!ws->closed_told)
        wsconn_deliver(ws, WSCONN_EV_CLOSED, NULL, 0, close_code);
    /* Counted here, once per session, on the thread that ends it (no close decided: the client
     * left without one, 1006). */
    metrics_note_ws_close(server_metrics_self(ws->srv),
                          ws->end_code ? ws->end_code : WS_CLOSE_ABNORMAL, (unsigned)ws->end_by);
    wbuf_free(&ws->frag);
    free(ws->msg.ptr);
    ws_pmd_free(&ws->z); /* an inflater lent for a message that never ended */
    handoff_track(ws->srv, h, 0);
    handoff_leave(h);
}

struct wsconn_start {
    struct conn *c;
    struct handoff *h;
};

static int wsconn_serve_co(struct coro *co, void *arg)
{
    struct wsconn_start st = *(struct wsconn_start *)arg;
    free(arg);
    coro_stack_trim(co);
    wsconn_serve(st.c, st.h, 0);
    conn_destroy(st.c);
    return 0;
}

int wsconn_take_over(struct conn *c, struct handoff *h, size_t off)
{
    if (off) {
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
    }
    struct wsconn_start *st = malloc(sizeof(*st));
    if (LIKELY(st != NULL)) {
        st->c = c;
        st->h = h;
        if (LIKELY(sched_spawn(c->home->srv->sched, wsconn_serve_co, st) == 0))
            return 0;
        free(st);
    }
    wsconn_serve(c, h, 0);
    return 1;
}
