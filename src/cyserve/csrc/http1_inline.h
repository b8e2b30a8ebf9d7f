/* http1_inline.h: the learning state of GIL-free routes on the inline path (http1_inline.c):
 * whether a route may run its handler in the readiness callback. The coroutine path times a
 * route's first calls with the same helpers (request.c). Internal to the engine. */
#ifndef CYSERVE_HTTP1_INLINE_H
#define CYSERVE_HTTP1_INLINE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h> /* __rdtsc, for timing inline handlers */
#endif

#include "clock.h"
#include "compat.h"
#include "server.h"
#include "server_int.h"

/* The clock of the timing: x86's time-stamp counter (two reads ~15 ns here, against ~35 ns for
 * two vDSO clock_gettime calls, on every inline request), elsewhere the monotonic clock. */
#if defined(__x86_64__) || defined(__i386__)
static inline uint64_t inline_ticks(void)
{
    return __rdtsc();
}
/* Invariant TSC cycles: 20 us at 5 GHz, 100 us at 1 GHz. Either way a coroutine's ~1 us is a
 * few percent of such a call, and its neighbours can be stolen while it runs. */
#define INLINE_SLOW_TICKS 100000u
#else
static inline uint64_t inline_ticks(void)
{
    return clock_mono_ns();
}
#define INLINE_SLOW_TICKS (50u * 1000) /* ns */
#endif
/* Quick calls a route needs before it runs inline; past it the state says "inline", then
 * "never". */
#define INLINE_LEARN 64u
#define INLINE_NEVER (INLINE_LEARN + 1)
#define INLINE_SLOW_STREAK 3u

/* Record a timed call of t's handler (any worker). took: its run time in ticks; blen: its body. */
static inline void inline_note(const struct server_target *t, uint64_t took, size_t blen)
{
    /* The target is the engine's own mutable memory (calloc'd by the Cython layer); it is const
     * only in the router's view. safety: the two counters publish no other memory, so relaxed
     * ordering is enough. The CAS keeps concurrent learners from counting past INLINE_LEARN or
     * from leaving INLINE_NEVER; the streak is approximate across workers (a quick call on one
     * may reset another's streak), which only delays the verdict. */
    struct server_target *mt = (struct server_target *)t;
    if (UNLIKELY(blen > BODY_COPY_MAX)) {
        atomic_store_explicit(&mt->inline_state, INLINE_NEVER, memory_order_relaxed);
        return;
    }
    if (UNLIKELY(took > INLINE_SLOW_TICKS)) {
        if (atomic_fetch_add_explicit(&mt->inline_slow, 1, memory_order_relaxed) + 1 >=
            INLINE_SLOW_STREAK)
            atomic_store_explicit(&mt->inline_state, INLINE_NEVER, memory_order_relaxed);
        return;
    }
    if (UNLIKELY(atomic_load_explicit(&mt->inline_slow, memory_order_relaxed)))
        atomic_store_explicit(&mt->inline_slow, 0, memory_order_relaxed);
    unsigned v = atomic_load_explicit(&mt->inline_state, memory_order_relaxed);
    while (v < INLINE_LEARN &&
           !atomic_compare_exchange_weak_explicit(&mt->inline_state, &v, v + 1,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

#endif
