/* ws_conn.h: a WebSocket connection in the engine (prefix wsconn_): the protocol that takes a
 * connection over after HTTP/1.1 answered 101, reading frames with the codec (ws.h) in the
 * connection's coroutine and sending what the application's thread hands it.
 *
 * The application runs on a thread of its own (an ASGI event loop, a Python handler's relief
 * thread): the channel between the two is the request's handoff (handoff.h), which stays held
 * for the connection's life. The application's side (the producer) queues whole frames and a
 * close request under the channel's lock and sets the handoff's signal; the coroutine waits for
 * "socket readable OR that signal" (sched_io_wait_signal), so it reads and sends at once without
 * a second coroutine. Messages from the client go to the producer by an offloaded call of the
 * channel's deliver function (on a worker, in its batch of Python calls), one per message. Ping
 * is answered with pong and the close handshake is made here, without the application.
 *
 * Error convention 0 or -errno. */
#ifndef CYSERVE_WS_CONN_H
#define CYSERVE_WS_CONN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ws.h"

struct conn;
struct handoff;

/* A message larger than this (all its fragments) closes the connection with 1009, as uvicorn's
 * default ws_max_size. */
#define WSCONN_MAX_MESSAGE (16u << 20)
/* Bytes queued for sending beyond which wsconn_send asks its caller to wait for
 * WSCONN_EV_DRAINED: a producer faster than its client is slowed down, not buffered for ever. */
#define WSCONN_HIGH_WATER (256u << 10)
/* Bytes of messages handed to the producer and not yet taken by its application
 * (wsconn_consumed) beyond which the engine stops reading the socket until it takes them: an
 * application that never receives holds the client back through TCP, not the server's memory.
 * Each message counts WSCONN_MSG_COST bytes more than its length, so empty ones count too. */
#define WSCONN_IN_WINDOW (64u << 10)
#define WSCONN_MSG_COST 64
/* Messages shorter than this are sent uncompressed even with permessage-deflate: a deflate call
 * costs more than the few bytes it could save. */
#define WSCONN_DEFLATE_MIN 64
/* How long the engine waits for the client's close frame after sending its own. */
#define WSCONN_CLOSE_WAIT_NS (5ull * 1000000000ull)
/* How long a client that broke a rule waits for its close frame while the producer answers the
 * messages that came before the broken frame (it may not ask for the next one). */
#define WSCONN_FAIL_WAIT_NS (2ull * 1000000000ull)

/* What deliver reports to the producer. */
enum wsconn_event {
    WSCONN_EV_TEXT = 1,   /* a whole text message, data[0..len) (valid UTF-8) */
    WSCONN_EV_BINARY = 2, /* a whole binary message */
    /* The connection ended: code is the client's close code (1005: it sent none), or the code
     * the server closed with (1001 a stop; 1002, 1007, 1009 the client broke a rule), or 1006
     * (gone without a close frame); data[0..len) the client's reason. Last event (but for a
     * drain notice when the client broke a rule after messages: the engine then sends what
     * the producer queues until it takes the close, which the producer tells with
     * wsconn_consumed(h, 0)); the handoff is left afterwards. */
    WSCONN_EV_CLOSED = 3,
    /* The queue fell back to empty after wsconn_send returned 1. */
    WSCONN_EV_DRAINED = 4,
};

/* Called on a worker in its batch of offloaded calls (the producer's language runtime is
 * entered there, as for any Python call), with the handoff whose producer it reports to; data
 * is valid during the call only. */
typedef void (*wsconn_deliver_fn)(struct handoff *h, int event, const char *data, size_t len,
                                  int code);

struct wsconn_out {
    struct wsconn_out *next;
    size_t len;
    char data[]; /* the whole frame: head and payload */
};

/* The channel of one WebSocket, owned by its handoff (freed with it). */
struct wsconn_chan {
    wsconn_deliver_fn deliver;
    pthread_mutex_t lock; /* guards what follows */
    struct wsconn_out *head, *tail;
    size_t bytes;     /* queued */
    int want_drained; /* wsconn_send returned 1: report WSCONN_EV_DRAINED */
    int close_req;    /* the producer asked to close with close_code, close_reason */
    size_t in_held;   /* bytes handed to the producer and not yet consumed (WSCONN_IN_WINDOW) */
    int want_room;    /* the engine stopped reading until in_held falls back */
    int close_code;
    size_t close_len;
    char close_reason[WS_CONTROL_MAX];
    int deflate; /* permessage-deflate was negotiated with pmd */
    struct ws_pmd_params pmd;
};

/* Producer, before giving its 101 answer: make h a WebSocket channel reporting through deliver,
 * speaking permessage-deflate with pmd (as ws_pmd_negotiate chose it and the 101 says), or
 * uncompressed when pmd is NULL. pmd must say no context takeover either way (the 101 adds both,
 * as RFC 7692 7.1.1.1 and 7.1.1.2 allow): the connection's zlib streams are the worker thread's,
 * lent for one message (ws_zlend.h), so no window survives a message. 0, -EINVAL (a pmd with
 * context takeover) or -ENOMEM. Any thread, holding the turn. */
int wsconn_attach(struct handoff *h, wsconn_deliver_fn deliver, const struct ws_pmd_params *pmd);

/* Producer: its application took a message of n bytes that deliver handed it (the engine reads
 * on once less than WSCONN_IN_WINDOW is held). Any thread. */
void wsconn_consumed(struct handoff *h, size_t n);

/* Free h's channel (handoff_release does, with the handoff). */
void wsconn_chan_free(struct wsconn_chan *ch);

/* Producer: queue a message (WS_OP_TEXT or WS_OP_BINARY) of p[0..n), copied. Returns 0; 1 when
 * the queue is over WSCONN_HIGH_WATER (the producer should wait for WSCONN_EV_DRAINED before the
 * next); -EPIPE when the connection is gone or closing; -ENOMEM. Any thread. */
int wsconn_send(struct handoff *h, int opcode, const char *p, size_t n);

/* Producer: close with code (ws_close_code_valid, or WS_CLOSE_NO_STATUS for an empty close frame)
 * and reason[0..n) (cut at 123 bytes), after what is queued. 0, or -EPIPE when gone or already
 * closing. Any thread. */
int wsconn_close(struct handoff *h, int code, const char *reason, size_t n);

/* Engine: serve c as a WebSocket after its 101 went out, the client's first bytes (if any) at
 * c->buf[off..c->len), until it closes; then leave h and destroy c. On a coroutine of its own,
 * spawned here, whose stack is trimmed (coro_stack_trim) before it serves: the calling HTTP
 * coroutine's stack, deep from the request and holding its state, goes back to the pool when it
 * returns, so an open WebSocket holds the few stack pages its loop touches. Returns 0 when the
 * connection went to that coroutine (the caller leaves c alone), 1 when it was served here
 * because no coroutine could be spawned (a stop, no memory) and the caller must destroy c. The
 * connection's coroutine. */
int wsconn_take_over(struct conn *c, struct handoff *h, size_t off);

#endif
