/* handoff.c: what it costs to hand a call to another thread and get the answer back, against
 * making the call on the calling thread. This is the price of running Python handlers on a pool
 * of Python threads beside the connection workers (so that a blocking handler cannot stall the
 * C routes), instead of inline on the worker as today.
 *
 * A "worker" thread hands N calls, one at a time, to a "python" thread and waits for each answer
 * (the worst case: no batching, the pool idle between calls, as at low load), through
 *   - eventfd:  write to the other's eventfd, block in read on one's own (what sched's workers
 *               already use to wake each other);
 *   - futex:    a word per direction, FUTEX_WAKE / FUTEX_WAIT (the cheapest blocking hand-off);
 *   - spin:     both threads spin on an atomic word (the floor: no sleeping, no syscall; only
 *               sensible while there is work);
 * and, as the baseline, the same call made inline. The call itself is a few arithmetic steps.
 *
 *   gcc -O2 -pthread bench/micro/handoff.c -o /tmp/handoff && /tmp/handoff [N]
 *
 * Each thread is pinned to its own CPU when there are two (the hand-off crosses cores, as it
 * would between a worker and a Python thread). Prints ns per round trip, median of 5 runs. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum mode { EVENTFD, FUTEX, SPIN };

static long n_calls = 200000;
static int efd_to_py, efd_to_worker;
static _Atomic uint32_t to_py, to_worker; /* futex/spin words: a sequence number each way */
static volatile uint64_t sink;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static uint64_t the_call(uint64_t x)
{
    return x * 2654435761u + 7;
}

static void futex_wait(_Atomic uint32_t *w, uint32_t seen)
{
    /* Sleeps only while *w still holds seen: a wake that came first is not lost. */
    while (atomic_load_explicit(w, memory_order_acquire) == seen)
        syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

static void futex_post(_Atomic uint32_t *w)
{
    atomic_fetch_add_explicit(w, 1, memory_order_release);
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

struct args {
    enum mode mode;
    int cpu;
};

static void *python_thread(void *p)
{
    struct args *a = p;
    if (a->cpu >= 0)
        pin(a->cpu);
    uint64_t v;
    uint32_t seen = 0;
    for (long i = 0; i < n_calls; i++) {
        switch (a->mode) {
        case EVENTFD:
            if (read(efd_to_py, &v, sizeof(v)) != sizeof(v))
                abort();
            sink = the_call((uint64_t)i);
            v = 1;
            if (write(efd_to_worker, &v, sizeof(v)) != sizeof(v))
                abort();
            break;
        case FUTEX:
            futex_wait(&to_py, seen);
            seen++;
            sink = the_call((uint64_t)i);
            futex_post(&to_worker);
            break;
        case SPIN:
            while (atomic_load_explicit(&to_py, memory_order_acquire) == seen)
                ;
            seen++;
            sink = the_call((uint64_t)i);
            atomic_fetch_add_explicit(&to_worker, 1, memory_order_release);
            break;
        }
    }
    return NULL;
}

static double run(enum mode mode, int two_cpus)
{
    atomic_store(&to_py, 0);
    atomic_store(&to_worker, 0);
    struct args a = {mode, two_cpus ? 1 : -1};
    pthread_t t;
    pthread_create(&t, NULL, python_thread, &a);
    if (two_cpus)
        pin(0);
    uint64_t v = 1;
    uint32_t seen = 0;
    uint64_t t0 = now_ns();
    for (long i = 0; i < n_calls; i++) {
        switch (mode) {
        case EVENTFD:
            if (write(efd_to_py, &v, sizeof(v)) != sizeof(v) ||
                read(efd_to_worker, &v, sizeof(v)) != sizeof(v))
                abort();
            break;
        case FUTEX:
            futex_post(&to_py);
            futex_wait(&to_worker, seen);
            seen++;
            break;
        case SPIN:
            atomic_fetch_add_explicit(&to_py, 1, memory_order_release);
            while (atomic_load_explicit(&to_worker, memory_order_acquire) == seen)
                ;
            seen++;
            break;
        }
    }
    uint64_t t1 = now_ns();
    pthread_join(t, NULL);
    return (double)(t1 - t0) / (double)n_calls;
}

static double inline_calls(void)
{
    uint64_t t0 = now_ns();
    for (long i = 0; i < n_calls; i++)
        sink = the_call((uint64_t)i);
    return (double)(now_ns() - t0) / (double)n_calls;
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        n_calls = atol(argv[1]);
    efd_to_py = eventfd(0, 0);
    efd_to_worker = eventfd(0, 0);
    cpu_set_t allowed;
    int two = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_ISSET(0, &allowed) &&
              CPU_ISSET(1, &allowed);
    const char *names[] = {"eventfd", "futex", "spin"};
    printf("%ld round trips a run, median of 5 runs, threads on %s\n", n_calls,
           two ? "CPUs 0 and 1" : "one CPU");
    double r[5];
    for (int i = 0; i < 5; i++)
        r[i] = inline_calls();
    qsort(r, 5, sizeof(r[0]), cmp);
    printf("%-8s %8.1f ns per call\n", "inline", r[2]);
    for (int m = EVENTFD; m <= SPIN; m++) {
        if (m == SPIN && !two)
            continue; /* two spinners on one CPU only measure the scheduler's time slice */
        for (int i = 0; i < 5; i++)
            r[i] = run((enum mode)m, two);
        qsort(r, 5, sizeof(r[0]), cmp);
        printf("%-8s %8.1f ns per round trip\n", names[m], r[2]);
    }
    return 0;
}
