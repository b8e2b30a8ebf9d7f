/* clock.h: the monotonic clock, read now (vDSO, no system call). One reading for the whole C
 * runtime: the scheduler's loop time, the access log's request times, the shutdown's grace
 * period and the rate limit of failure notes all use it. sched_now_ns() is this clock cached at
 * the loop's last poll: a request served within one loop turn would take 0 s by it. */
#ifndef CYSERVE_CLOCK_H
#define CYSERVE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC. Any thread. */
static inline uint64_t clock_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
