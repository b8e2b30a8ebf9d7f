/* handoff.h: answers produced off the workers (prefix handoff_). A Python handler that only
 * starts the work (an ASGI application, run on an event loop thread) leaves a handoff in its
 * response (resp_set_defer); the request's coroutine parks on it, without blocking its worker,
 * until the producing thread has filled the handoff's response and handed its turn over; for a
 * streamed body the turn goes back and forth once per piece.
 *
 * The turn: exactly one side touches resp and more at a time. The producer has it from
 * handoff_new until handoff_give; the engine from the wake-up until it asks for the next piece
 * (the target's py_stream, offloaded: the producer learns there that the piece was written, which
 * is what paces it). The signal orders the two sides' accesses.
 *
 * Lifetime: two references, the producer's and the engine's; the last release frees it. The
 * engine leaves (handoff_leave) when the answer is sent, the client is gone or the server stops;
 * a producer that gives to a handoff the engine left gets -EPIPE and nothing else happens.
 * Error convention 0 or -errno. */
#ifndef CYSERVE_HANDOFF_H
#define CYSERVE_HANDOFF_H

#include "resp.h"
#include "sched.h"

struct server;

struct handoff {
    struct sched_signal ready; /* set when the producer hands its turn to the engine */
    int refs;                  /* atomic */
    int gone;                  /* atomic: the engine left and reads nothing more */
    /* Under the turn: the answer (first time) or the next piece of its body; more: 1 more
     * pieces follow, 0 this is the last, -1 the producer failed midway (close without the last
     * chunk). */
    int more;
    struct cyserve_response resp;
    void *producer; /* the producer's own (Python: its exchange); never read by the engine */
    /* Set by the producer before it gives a 101 answer (wsconn_attach): the connection becomes a
     * WebSocket and the handoff its channel for the connection's life (ws_conn.h). */
    struct wsconn_chan *ws;
    /* atomic: set by handoff_give, taken by the engine's wait for the first answer (which also
     * wakes for body asks, so the signal alone no longer means "answered"). */
    int given;
    /* A body read as it arrives (request.h, body_left): the producer asks for the next piece
     * with handoff_ask_body (body_asked, atomic), the engine hands it to body_cb (offloaded,
     * on a worker in its batch; data valid during the call only; more: 0 for the last). */
    int body_asked;
    void (*body_cb)(struct handoff *h, const char *data, size_t len, int more);
    /* The server's list of handoffs its coroutines wait on, for a stop (handoff_cancel_all);
     * under the server's handoff_lock. */
    struct handoff *prev, *next;
    int tracked;
};

/* A new handoff, holding two references (the producer's, the engine's), its response empty.
 * Returns 0 or -ENOMEM. Any thread. */
int handoff_new(struct handoff **out);

/* Drop one reference; the last frees h. Any thread. */
void handoff_release(struct handoff *h);

/* Producer: hand the turn to the engine, with more as above. Returns 0, or -EPIPE when the
 * engine has left (the piece goes nowhere). Any thread, holding the turn. */
int handoff_give(struct handoff *h, int more);

/* Producer: ask for the next piece of a request body that streams (request.h): it comes to cb
 * (set here; the same every time). Returns 0, or -EPIPE when the engine has left. Any thread. */
int handoff_ask_body(struct handoff *h,
                     void (*cb)(struct handoff *h, const char *data, size_t len, int more));

/* Whether the engine has left. Any thread. */
int handoff_gone(const struct handoff *h);

/* Engine: wait until the producer gives the turn (it may have already), tracked by server s so
 * that a stop can end the wait. Returns 0, or -ECANCELED (the server stops). The request's
 * coroutine. */
int handoff_await(struct server *s, struct handoff *h);

/* Engine: track h (on 1) so that a stop's handoff_cancel_all cancels its signal, or stop
 * tracking it (on 0), around waits on h->ready other than handoff_await's (a WebSocket's, for
 * its connection's life). On a server whose stop already cancelled them, h is cancelled at once.
 * The engine's coroutine. */
void handoff_track(struct server *s, struct handoff *h, int on);

/* Engine: leave h (mark it gone, drop the engine's reference). The request's coroutine. */
void handoff_leave(struct handoff *h);

/* Cancel every wait on a handoff of s: each returns -ECANCELED. Called by the stop once the
 * grace period is over, before the scheduler stops (signals are not seen by its drain). Any
 * thread. */
void handoff_cancel_all(struct server *s);

#endif
