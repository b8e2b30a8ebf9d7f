/* asgiq.h: the queue that hands ASGI requests, and what happens to them afterwards, from the
 * workers to the event loop thread without the GIL (prefix asgiq_).
 *
 * Why a queue in C. A worker used to reach an ASGI application by a Python call in its offload
 * batch: take the GIL (from the loop thread, which holds it whenever it runs Python), build the
 * scope and the exchange, queue the start, hand the batch over with call_soon_threadsafe. Only
 * the building needs Python, and the loop thread runs Python anyway; what the worker has is the
 * request, in C. So the worker copies the request head into one item (one malloc), pushes it
 * here and parks its coroutine on the item's handoff (handoff.h) as before; the loop thread,
 * woken once for whatever the workers pushed since its last look, builds the scopes and starts
 * the tasks in one pass under the GIL it holds anyway. The notices that follow a request (a
 * piece written, a body piece read, the client gone) travel the same way, so for an ASGI
 * request over this queue a worker never takes the GIL.
 *
 * The structure. A Treiber stack of items (head), pushed by any thread with a CAS, and taken
 * whole by the one consumer with an exchange (never popped one by one, so no ABA), then
 * reversed: the consumer sees the items in the order of their pushes, which is what keeps a
 * request's notices behind its start (its start is pushed before any of them, by program order
 * of the coroutine that pushes both, on whichever thread it runs). The wake-up is an eventfd:
 * the push that finds the stack empty writes it, and no other; the consumer reads the eventfd
 * *before* taking the stack, so a push after the take finds the stack empty and writes again
 * (a push between the read and the take is taken by it; at worst the consumer wakes once more
 * and finds nothing). So under load one write and one wake-up carry every request the workers
 * parsed meanwhile, however many workers pushed.
 *
 * Ownership. An item owns what it carries: its copy of the head, its body piece (malloc'd,
 * freed with it) and one reference to its handoff (for a start, the producer's reference,
 * which the consumer takes over: asgiq_item_take_handoff). Error convention 0 or -errno. */
#ifndef CYSERVE_ASGIQ_H
#define CYSERVE_ASGIQ_H

#include <stddef.h>
#include <stdint.h>

#include "cyserve/handler.h"

struct handoff;

enum asgiq_kind {
    ASGIQ_START = 1, /* a request to start: the head below, the producer's reference */
    ASGIQ_NEXT,      /* the last piece of the answer was written: give the next */
    ASGIQ_GONE,      /* the engine gave up on the answer (the client left, a bad body) */
    ASGIQ_BODY,      /* a piece of the request body that the producer asked for */
};

struct asgiq_item {
    struct asgiq_item *next;
    int kind;
    struct handoff *h; /* a reference of the item's own; NULL once taken over */
    /* ASGIQ_BODY: data[0..len) (owned, may be NULL when len is 0); more: 0 for the last. */
    char *data;
    size_t len;
    int more;
    /* ASGIQ_START: the target's opaque, and the head, copied: req's views point into hdrs and
     * the bytes after it (req.engine is NULL, req.params empty). */
    void *opaque;
    uint64_t body_pending; /* body bytes still in the socket (read as receive() asks) */
    int http2;
    int https;        /* the request's scheme is https (a trusted proxy said so) */
    const char *peer; /* "host:port", NUL-terminated, or NULL when unknown */
    cyserve_request req;
    cyserve_header hdrs[];
};

struct asgiq {
    struct asgiq_item *head; /* atomic: the items pushed since the last take, newest first */
    int efd;                 /* the eventfd the consumer watches; -1 before asgiq_init */
    int active;              /* atomic: a consumer drains it (the engine pushes only then) */
};

/* Make q's eventfd (non-blocking). Returns 0 or -errno. q zeroed before; once per queue. */
int asgiq_init(struct asgiq *q);

/* Whether a consumer drains q: set by the consumer's thread before the workers may push (the
 * server starts after), cleared after they stopped pushing. Any thread. */
void asgiq_set_active(struct asgiq *q, int on);
int asgiq_active(const struct asgiq *q);

/* A start item for request req (a worker's view of it, valid during the call) whose answer comes
 * through h: copies the method, target, path, query, headers, body and peer into one
 * allocation. The item gets no reference of h: the caller's (the producer's) goes with it.
 * Returns 0 or -ENOMEM. Any thread. */
int asgiq_start_new(const cyserve_request *req, void *opaque, uint64_t body_pending, int http2,
                    int https, const char *peer, struct handoff *h, struct asgiq_item **out);

/* Push it. Returns 0, or -errno when the wake-up could not be written (the item is queued
 * all the same; the consumer sees it at its next wake-up). Any thread. */
int asgiq_push(struct asgiq *q, struct asgiq_item *it);

/* Push a notice of kind (ASGIQ_NEXT, ASGIQ_GONE, ASGIQ_BODY) about h, holding a reference of
 * its own to h; for ASGIQ_BODY, data (malloc'd, or NULL when len is 0) becomes the item's.
 * Returns 0 or -ENOMEM (data is then freed). Any thread. */
int asgiq_notify(struct asgiq *q, int kind, struct handoff *h, char *data, size_t len, int more);

/* The consumer: everything pushed so far, oldest first (linked by next; NULL when nothing),
 * after clearing the wake-up. The consumer's thread, one at a time. */
struct asgiq_item *asgiq_take(struct asgiq *q);

/* The item's handoff with its reference, which the caller now owns (the item keeps none). */
struct handoff *asgiq_item_take_handoff(struct asgiq_item *it);

/* Free an item: its data, and its reference to its handoff if it still has it. Any thread. */
void asgiq_item_free(struct asgiq_item *it);

/* Free everything still queued (after the last push, e.g. once the server stopped). The
 * consumer's thread. */
void asgiq_drop_all(struct asgiq *q);

#endif
