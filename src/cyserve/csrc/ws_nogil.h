/* ws_nogil.h: GIL-free WebSocket routes (prefix wsn_): a route whose callbacks
 * (cyserve_ws_handler, cyserve/handler.h) are C functions run on the worker, in the connection's
 * coroutine, without the GIL and without a handoff to another thread.
 *
 * Unlike the channel of ws_conn.h (an application on another thread, so a coroutine that lives
 * as long as the connection and waits for "readable OR signal"), nothing here waits for anyone
 * but the socket: the connection becomes a protocol of its own (wsn_proto) and, between
 * messages, is idle like a keep-alive HTTP/1 connection. It holds its struct conn, one struct
 * wsn and its epoll registration; no coroutine, no stack and no read buffer (a frame that
 * arrived in part keeps the buffer until its rest comes). A readable event takes a coroutine
 * (wsn_proto.on_readable), which reads every frame there is, runs the callbacks, writes their
 * frames in one send, and goes idle again once the socket is drained. The keep-alive ping
 * (server_config.ws_ping_interval_ns / ws_ping_timeout_ns) and the wait for the client's close
 * are deadlines of the connection's idle timer (conn_proto.idle_deadline).
 *
 * permessage-deflate (server_config.ws_deflate) is answered with server_no_context_takeover and
 * client_no_context_takeover whatever the offer said (RFC 7692 lets a server add both): neither
 * side keeps a window between messages, so an idle connection keeps no zlib state. The thread's
 * zlib streams (ws_zlend.h, shared with ws_conn.c) are lent to a connection for one message
 * and taken back when it is whole; only a compressed message that arrives in pieces across
 * batches keeps an inflater while it waits for the rest.
 *
 * Error convention 0 or -errno. */
#ifndef CYSERVE_WS_NOGIL_H
#define CYSERVE_WS_NOGIL_H

#include <stddef.h>
#include <stdint.h>

#include "cyserve/handler.h"
#include "wbuf.h"
#include "ws.h"

struct conn;
struct request;
struct server_target;

/* A GIL-free WebSocket connection; the public cyserve_ws is this struct. Owned by its
 * connection (c->proto_data once accepted), freed when the connection is destroyed. */
struct wsn {
    const struct server_target *t; /* its route: t->ws (the callbacks) and t->ctx */
    struct conn *c;
    struct ws_reader r;
    struct wbuf frag;       /* a fragmented message so far (heap; freed once delivered) */
    struct wbuf out;        /* frames the callbacks made, sent at the end of the batch */
    struct ws_pmd z;        /* permessage-deflate, when negotiated (r.deflate); its zlib
                             * streams are lent by the thread while a message is in flight */
    struct ws_buf zmsg;     /* a compressed message inflated so far (lent as the streams) */
    int64_t ping_at;        /* when the next ping goes out (< 0: no pings) */
    int64_t pong_deadline;  /* a ping awaits its pong until then (< 0: none awaited) */
    uint64_t ping_id;       /* the payload of the ping awaited */
    int64_t close_deadline; /* our close was sent: the client's is awaited until then */
    uint64_t timer_at;      /* the idle timer's deadline when this armed it (home only) */
    int state;              /* enum wsn_state */
    int close_code;         /* what on_close is told */
    int end_code;           /* the first close decided, ours or the client's (0: none yet) */
    int end_by;             /* who began it (enum metrics_ws_by); both for the metrics */
    void *user;             /* the handler's (cyserve_ws_set_data) */
};

enum wsn_state {
    WSN_OPENING = 0, /* on_open runs; frames queue behind the 101 */
    WSN_OPEN = 1,
    WSN_CLOSING = 2, /* our close frame is queued or sent; the client's is awaited */
    WSN_DONE = 3     /* on_close ran or runs: nothing more is sent */
};

/* Request core (request_dispatch, a SERVER_NOGIL_WS target): check the handshake of rq and call
 * on_open. Returns 0 when resp is the answer (a 101 with rq->wsn set, or the handler's refusal,
 * which closes the connection), a status (400, 426) for a bad handshake that the caller answers
 * (426 with Sec-WebSocket-Version: 13), or -ENOMEM. The serving coroutine. */
int wsn_open(struct request *rq, const struct server_target *t, cyserve_request *creq);

/* HTTP/1 (its coroutine), once the 101 went out: the connection speaks WebSocket from here on,
 * the client's first bytes (if any) at c->buf[off..c->len). Returns 0 when it went idle, 1 when
 * it must be destroyed (conn_destroy then tells on_close). */
int wsn_take_over(struct conn *c, struct wsn *w, size_t off);

/* Give up w before it took the connection over (the 101 could not be sent): on_close with
 * 1006, then free it. */
void wsn_discard(struct wsn *w);

/* The public API (cyserve._core's cyserve_ws_* functions), from w's own callbacks only. */

/* Send a message (CYSERVE_WS_TEXT, which must be valid UTF-8, or CYSERVE_WS_BINARY) of
 * p[0..n). Small ones are copied into the batch's output, sent when the callbacks of the batch
 * are done; large ones go out at once from p. 0, -EINVAL (opcode, UTF-8), -EPIPE (closing or
 * closed), -ENOMEM, or the socket's -errno. */
int wsn_send(struct wsn *w, int opcode, const char *p, size_t n);

/* Close with code (1000-1003, 1007-1014 or 3000-4999) and reason[0..n) (cut at 123 bytes at a
 * character edge): the close frame follows what was sent, then the client's close is awaited
 * for WSCONN_CLOSE_WAIT_NS; messages meanwhile are dropped. 0, -EINVAL (code), -EPIPE. */
int wsn_close(struct wsn *w, int code, const char *reason, size_t n);

/* The handler's own pointer for w (NULL until set). */
static inline void wsn_set_data(struct wsn *w, void *data)
{
    w->user = data;
}

static inline void *wsn_data(const struct wsn *w)
{
    return w->user;
}

extern const struct conn_proto wsn_proto;

#endif
