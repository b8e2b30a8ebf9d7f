/* runq.h: a worker's bounded run queue: one owner pushes and pops, any thread steals half.
 *
 * Design (tokio's queue.rs, rewritten for C). A ring of `capacity` coroutine pointers
 * (a power of two; 256 by default, 4 in the tests to reach every edge). Three indices, all
 * free-running u32 counters that wrap (only differences are meaningful):
 *
 * - tail: the next slot the owner writes. Written only by the owner.
 * - head.real: the next slot to take. Advanced by the owner's pop and by a thief's claim.
 * - head.steal: the oldest slot that may still be read. Equal to real except while a thief
 *   copies the slots it claimed; then [steal, real) belongs to that thief, and the owner must
 *   not overwrite those slots (push checks tail - steal, not tail - real).
 *
 * real and steal are packed into one u64 so that a single compare-and-swap moves both: that is
 * what makes "claim n slots" and "finish the copy" atomic without a lock, and it removes ABA
 * (a stale head cannot match, because the indices only grow modulo 2^32 and a wrap-around
 * would need 2^32 operations between a load and its CAS).
 *
 * Steal-half: a thief claims ceil(len/2) slots with one CAS (real += n, steal unchanged),
 * copies them into its own ring, then sets steal = real with a second CAS (retried, because the
 * owner may pop meanwhile and move real). Only one thief at a time: a thief that sees
 * steal != real gives up on this victim and tries another. Stealing half rather than one
 * amortises the cross-core traffic and spreads load quickly (one steal per doubling).
 *
 * Overflow: when the ring is full the owner moves half of it (plus the new coroutine) out in one
 * batch, which the scheduler puts on the global inject queue: the cost of the mutex is paid once
 * per capacity/2 coroutines. If a thief is mid-copy the owner cannot take the half; it hands out
 * only the new coroutine.
 *
 * Memory ordering: slot contents are published by the owner's release store of tail and read
 * by a thief after an acquire load of tail; a thief's claim CAS is acq_rel so that the owner,
 * reading head with acquire, sees the claim before it reuses slots. Slots themselves are
 * accessed with relaxed atomics: ordering comes from the indices, the atomics keep the accesses
 * well-defined (and ThreadSanitizer quiet) where the owner and a thief touch the same slot in
 * different laps.
 *
 * Rejected: Chase-Lev deque (LIFO for the owner, which hurts fairness across yields, and it needs
 * a seq_cst fence on every pop); a mutex-protected deque (a lock per pop). */
#ifndef CYSERVE_RUNQ_H
#define CYSERVE_RUNQ_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "compat.h"
#include "coro.h"

struct runq {
    uint64_t head CACHE_ALIGNED; /* steal << 32 | real; CAS by the owner and by thieves */
    uint32_t tail CACHE_ALIGNED; /* written by the owner only */
    uint32_t mask;               /* capacity - 1 */
    struct coro **buf;
};

static inline uint64_t runq_pack(uint32_t steal, uint32_t real)
{
    return ((uint64_t)steal << 32) | real;
}

static inline uint32_t runq_steal_of(uint64_t head)
{
    return (uint32_t)(head >> 32);
}

static inline uint32_t runq_real_of(uint64_t head)
{
    return (uint32_t)head;
}

/* Initialise q with capacity slots (a power of two >= 2). Returns 0, -EINVAL or -ENOMEM.
 * Before the queue is shared. */
static inline int runq_init(struct runq *q, unsigned capacity)
{
    if (capacity < 2 || (capacity & (capacity - 1)) != 0)
        return -EINVAL;
    q->buf = calloc(capacity, sizeof(*q->buf));
    if (UNLIKELY(!q->buf))
        return -ENOMEM;
    q->head = 0;
    q->tail = 0;
    q->mask = capacity - 1;
    return 0;
}

/* Free the ring (not the coroutines in it). When no thread uses q any more. */
static inline void runq_destroy(struct runq *q)
{
    free(q->buf);
    q->buf = NULL;
}

static inline unsigned runq_capacity(const struct runq *q)
{
    return q->mask + 1;
}

/* Number of queued coroutines, exact for the owner, a snapshot for anyone else. Any thread. */
static inline unsigned runq_len(struct runq *q)
{
    /* safety: acquire pairs with the owner's release of tail and the claim CASes of head. */
    uint64_t head = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
    /* safety: as above; a stale tail only makes the snapshot older. */
    uint32_t tail = __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE);
    return tail - runq_real_of(head);
}

/* Slots the owner can fill without overflowing: capacity minus the live and being-stolen slots.
 * It only grows behind the owner's back (thieves free slots), so the owner may rely on it.
 * Owner only. */
static inline unsigned runq_free_slots(struct runq *q)
{
    /* safety: acquire: a finished steal frees its slots only once we see steal move. */
    uint64_t head = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
    return q->mask + 1 - (q->tail - runq_steal_of(head));
}

/* Push co at the back. Returns 1 when queued. Returns 0 when the ring was full: then co and
 * (unless a thief was mid-copy) the older half of the ring were taken out and linked through
 * their node.next, oldest first, into *first .. *last (*n of them), for the caller to put on the
 * inject queue. Owner only. */
static inline int runq_push(struct runq *q, struct coro *co, struct coro **first,
                            struct coro **last, unsigned *n)
{
    unsigned cap = q->mask + 1;
    for (;;) {
        /* safety: acquire so that a thief's claim (and its reads of those slots) is seen before
         * we decide whether a slot may be overwritten. */
        uint64_t head = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
        uint32_t steal = runq_steal_of(head), real = runq_real_of(head);
        uint32_t tail = q->tail; /* only this thread writes tail */
        if (LIKELY(tail - steal < cap)) {
            /* safety: slot tail is free ([steal, tail) are the live or being-read slots). */
            __atomic_store_n(&q->buf[tail & q->mask], co, __ATOMIC_RELAXED);
            /* safety: release publishes the slot's content to thieves that acquire tail. */
            __atomic_store_n(&q->tail, tail + 1, __ATOMIC_RELEASE);
            return 1;
        }
        coro_sched_node(co)->next = NULL;
        if (steal != real) {
            /* A thief is copying: it will make room soon; hand out just this one. */
            *first = *last = co;
            *n = 1;
            return 0;
        }
        uint32_t half = cap / 2;
        uint64_t want = runq_pack(real + half, real + half);
        /* safety: acq_rel: acquire orders our slot reads after the claim; release is for
         * symmetry with thieves' claims (they read head with acquire). Failure means a thief
         * claimed first: there is room now, so retry the push. */
        if (!__atomic_compare_exchange_n(&q->head, &head, want, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            continue;
        struct coro *prev = NULL;
        for (uint32_t i = 0; i < half; i++) {
            /* safety: these slots are ours after the successful claim. */
            struct coro *c = __atomic_load_n(&q->buf[(real + i) & q->mask], __ATOMIC_RELAXED);
            if (prev)
                coro_sched_node(prev)->next = c;
            else
                *first = c;
            prev = c;
        }
        coro_sched_node(prev)->next = co;
        *last = co;
        *n = half + 1;
        return 0;
    }
}

/* Pop the oldest coroutine, or NULL if empty. Owner only. */
static inline struct coro *runq_pop(struct runq *q)
{
    /* safety: acquire: see thieves' claims before taking a slot. */
    uint64_t head = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t steal = runq_steal_of(head), real = runq_real_of(head);
        if (real == q->tail) /* only this thread writes tail */
            return NULL;
        uint64_t next = steal == real ? runq_pack(real + 1, real + 1) : runq_pack(steal, real + 1);
        /* safety: the CAS makes slot `real` ours alone; on failure head is reloaded (a thief
         * claimed or finished) and we retry. */
        if (__atomic_compare_exchange_n(&q->head, &head, next, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            /* safety: the slot was written by this thread (the owner), ordered by program
             * order. */
            return __atomic_load_n(&q->buf[real & q->mask], __ATOMIC_RELAXED);
    }
}

/* Steal about half of src's coroutines into dst (the thief's own, empty-enough ring). Returns one
 * of them for the thief to run at once, or NULL if there was nothing to take or another thief
 * is busy on src. Thief (owner of dst) only; src is another worker's. */
static inline struct coro *runq_steal(struct runq *dst, struct runq *src)
{
    uint32_t dst_tail = dst->tail; /* dst is ours */
    /* safety: acquire: a thief of dst may be copying; its steal index bounds our room. */
    uint64_t dst_head = __atomic_load_n(&dst->head, __ATOMIC_ACQUIRE);
    unsigned cap = dst->mask + 1;
    if (dst_tail - runq_steal_of(dst_head) > cap / 2)
        return NULL; /* no room for half of a full ring */

    /* safety: acquire pairs with the owner's and other thieves' CASes. */
    uint64_t prev = __atomic_load_n(&src->head, __ATOMIC_ACQUIRE);
    uint32_t first, n;
    uint64_t claimed;
    for (;;) {
        uint32_t steal = runq_steal_of(prev), real = runq_real_of(prev);
        if (steal != real)
            return NULL; /* another thief is copying from src */
        /* safety: acquire pairs with the owner's release of tail: slots below it are written. */
        uint32_t src_tail = __atomic_load_n(&src->tail, __ATOMIC_ACQUIRE);
        n = src_tail - real;
        n -= n / 2;
        if (n == 0)
            return NULL;
        if (n > cap / 2)
            n = cap / 2; /* src may be larger than dst (not in practice: same capacity) */
        first = real;
        claimed = runq_pack(steal, real + n);
        /* safety: the claim: [first, first + n) become ours; steal stays at first so the
         * owner will not overwrite them until we finish. */
        if (__atomic_compare_exchange_n(&src->head, &prev, claimed, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            break;
    }
    for (uint32_t i = 0; i < n; i++) {
        /* safety: claimed slots, written before the tail we acquired. */
        struct coro *c = __atomic_load_n(&src->buf[(first + i) & src->mask], __ATOMIC_RELAXED);
        /* safety: dst slots past dst_tail are free (room checked above). */
        __atomic_store_n(&dst->buf[(dst_tail + i) & dst->mask], c, __ATOMIC_RELAXED);
    }
    /* Finish: steal catches up with real. The owner may have popped meanwhile (moving real), so
     * retry with the fresh head until the CAS lands. */
    prev = claimed;
    for (;;) {
        uint32_t real = runq_real_of(prev);
        /* safety: release: our slot reads happen before the owner may reuse the slots. */
        if (__atomic_compare_exchange_n(&src->head, &prev, runq_pack(real, real), 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            break;
    }
    n -= 1;
    /* safety: written by this thread just above. */
    struct coro *ret = __atomic_load_n(&dst->buf[(dst_tail + n) & dst->mask], __ATOMIC_RELAXED);
    if (n > 0)
        /* safety: release publishes the copied slots to thieves of dst. */
        __atomic_store_n(&dst->tail, dst_tail + n, __ATOMIC_RELEASE);
    return ret;
}

#endif
