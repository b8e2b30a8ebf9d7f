/* handoff.c: answers produced off the workers; the design is in handoff.h. */
#include "handoff.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "compat.h"
#include "server_int.h"
#include "ws_conn.h"

int handoff_new(struct handoff **out)
{
    struct handoff *h = calloc(1, sizeof(*h));
    if (UNLIKELY(!h))
        return -ENOMEM;
    sched_signal_init(&h->ready);
    h->refs = 2;
    resp_init(&h->resp);
    *out = h;
    return 0;
}

void handoff_release(struct handoff *h)
{
    /* safety: acq_rel: every access of either side happens before the free. */
    if (__atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        TSAN_ACQUIRE(h); /* see handoff_give */
        resp_free(&h->resp);
        if (h->ws)
            wsconn_chan_free(h->ws);
        free(h);
    }
}

int handoff_gone(const struct handoff *h)
{
    /* safety: acquire pairs with handoff_leave's release. */
    return __atomic_load_n(&h->gone, __ATOMIC_ACQUIRE);
}

int handoff_give(struct handoff *h, int more)
{
    if (handoff_gone(h))
        return -EPIPE;
    h->more = more;
    /* safety: release pairs with the engine's acquire exchange of given (request.c): resp and
     * more, written before, are seen by the engine that finds given set. The signal's own
     * release is not enough there: the engine may find given set before this set, woken by
     * an earlier one (a body asked for) or by its socket, and read resp with no order at all
     * (ThreadSanitizer under a free-threaded interpreter reported it; on a weakly ordered CPU
     * it would be a stale answer). */
    __atomic_store_n(&h->given, 1, __ATOMIC_RELEASE);
    sched_signal_set(&h->ready); /* orders resp and more before the engine's reads */
    /* The producer's reference is dropped later, by the object that owns it (the Python side's
     * exchange, freed by the interpreter's reference counting on whichever thread lets go of
     * it last): that orders this set before the free, through code TSan does not see. */
    TSAN_RELEASE(h);
    return 0;
}

int handoff_ask_body(struct handoff *h,
                     void (*cb)(struct handoff *h, const char *data, size_t len, int more))
{
    if (handoff_gone(h))
        return -EPIPE;
    h->body_cb = cb;
    /* safety: release pairs with the engine's acquire exchange of body_asked, for body_cb (as
     * given is for resp: see handoff_give). */
    __atomic_store_n(&h->body_asked, 1, __ATOMIC_RELEASE);
    sched_signal_set(&h->ready);
    TSAN_RELEASE(h); /* as in handoff_give */
    return 0;
}

void handoff_track(struct server *s, struct handoff *h, int on)
{
    pthread_mutex_lock(&s->handoff_lock);
    if (on && !s->handoffs_cancelled) {
        h->prev = NULL;
        h->next = s->handoffs;
        if (s->handoffs)
            s->handoffs->prev = h;
        s->handoffs = h;
        h->tracked = 1;
    } else if (on) {
        sched_signal_cancel(&h->ready); /* the stop already cancelled the others */
    } else if (h->tracked) {
        if (h->prev)
            h->prev->next = h->next;
        else
            s->handoffs = h->next;
        if (h->next)
            h->next->prev = h->prev;
        h->tracked = 0;
    }
    pthread_mutex_unlock(&s->handoff_lock);
}

int handoff_await(struct server *s, struct handoff *h)
{
    handoff_track(s, h, 1);
    int rc = sched_signal_wait(&h->ready);
    handoff_track(s, h, 0);
    return rc;
}

void handoff_leave(struct handoff *h)
{
    /* safety: release: the producer that sees gone stops giving. */
    __atomic_store_n(&h->gone, 1, __ATOMIC_RELEASE);
    handoff_release(h);
}

void handoff_cancel_all(struct server *s)
{
    pthread_mutex_lock(&s->handoff_lock);
    s->handoffs_cancelled = 1;
    for (struct handoff *h = s->handoffs; h; h = h->next)
        sched_signal_cancel(&h->ready);
    pthread_mutex_unlock(&s->handoff_lock);
}
