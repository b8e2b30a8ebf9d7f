/* clock.h: the monotonic clock, read now (vDSO, no system call). One reading for the whole C
 * runtime: the scheduler's loop time, the access log's request times, the shutdown's grace
 * period and the rate limit of failure notes all use it. sched_now_ns() is this clock cached at
 * the loop's last poll: a request served within one loop turn would take 0 s by it. */
#ifndef CYSERVE_CLOCK_H
#define CYSERVE_CLOCK_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC. Any thread. */
static inline uint64_t clock_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A once-a-second gate for notes on standard error (a failing route, an accept at its descriptor
 * limit): zero-initialised static storage, shared by every thread. */
struct clock_once_a_second {
    _Atomic uint64_t next_ns;
    _Atomic uint64_t suppressed;
};

/* 1 when the caller may write its note now, with *more set to the notes held back since the
 * last one; 0 when a note went out less than a second ago (this one is counted). Any thread.
 * safety: next_ns only rate-limits, so relaxed order suffices; the CAS makes exactly one thread
 * a second the writer. */
static inline int clock_once_a_second(struct clock_once_a_second *g, unsigned long long *more)
{
    uint64_t now = clock_mono_ns();
    uint64_t due = atomic_load_explicit(&g->next_ns, memory_order_relaxed);
    if (now < due ||
        !atomic_compare_exchange_strong_explicit(&g->next_ns, &due, now + 1000000000ull,
                                                 memory_order_relaxed, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&g->suppressed, 1, memory_order_relaxed);
        return 0;
    }
    *more = atomic_exchange_explicit(&g->suppressed, 0, memory_order_relaxed);
    return 1;
}

#endif
