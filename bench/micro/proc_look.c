/* proc_look.c: an experiment, not a server. What the relief monitor's look at a stuck thread
 * (csrc/sched_relief.c.h, relief_waiting: does the thread sleep in the kernel, or run?) costs
 * on this machine, each way it could be made, in nanoseconds of the looking thread's CPU:
 *
 *   open-read-close  open /proc/self/task/TID/stat, read it, close it (the look until session 20)
 *   pread            pread of that file kept open (the look since)
 *   cpu-clock        clock_gettime of the thread's CPU-time clock (one call; two are needed to
 *                    see whether it advances)
 *
 * each against a thread that spins and one asleep in read(). Each is timed over ROUNDS looks
 * with the looking thread's own CPU clock (CLOCK_THREAD_CPUTIME_ID), so that time the machine
 * gives to others is not counted; the median of RUNS runs is printed. It also counts, over
 * ROUNDS pairs of back-to-back reads of the spinning thread's CPU clock, how many pairs saw it
 * advance, that is how often the spinning thread was on a CPU while the looking thread ran:
 * where the two share a CPU (a pinned process, a crowded machine), never, which is why the CPU
 * clock cannot replace /proc's state letter (which counts a thread ready to run as running).
 *
 * Build and run (from the repository root):
 *   gcc -O2 -pthread -o /tmp/proc_look bench/micro/proc_look.c && /tmp/proc_look
 * Results and method: docs/benchmarks.md, "Session 20: the server's clocked threads". */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { ROUNDS = 5000, RUNS = 5 };

static int target_tid, stop_spin;
static int sleep_pipe[2];

static void *spinner(void *arg)
{
    (void)arg;
    /* safety: experiment flags shared with the main thread. */
    __atomic_store_n(&target_tid, (int)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&stop_spin, __ATOMIC_SEQ_CST))
        ;
    return NULL;
}

static void *sleeper(void *arg)
{
    (void)arg;
    char c;
    /* safety: as above. */
    __atomic_store_n(&target_tid, (int)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
    ssize_t n = read(sleep_pipe[0], &c, 1);
    (void)n;
    return NULL;
}

static long long cpu_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static clockid_t thread_cpu_clock(int tid)
{
    /* Linux's encoding of a thread's CPU-time clock (what pthread_getcpuclockid returns). */
    return (clockid_t)((~(unsigned)tid << 3) | 6u);
}

static int cmp(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* ns per look, median of RUNS runs: way 0 open-read-close, 1 pread, 2 cpu-clock. */
static long long look_cost(int way, int tid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    clockid_t clock = thread_cpu_clock(tid);
    long long runs[RUNS];
    for (int r = 0; r < RUNS; r++) {
        long long t0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
        for (int i = 0; i < ROUNDS; i++) {
            if (way == 0) {
                int f = open(path, O_RDONLY | O_CLOEXEC);
                ssize_t n = read(f, buf, sizeof(buf) - 1);
                (void)n;
                close(f);
            } else if (way == 1) {
                ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
                (void)n;
            } else {
                (void)cpu_ns(clock);
            }
        }
        runs[r] = (cpu_ns(CLOCK_THREAD_CPUTIME_ID) - t0) / ROUNDS;
    }
    close(fd);
    qsort(runs, RUNS, sizeof(runs[0]), cmp);
    return runs[RUNS / 2];
}

static void measure(const char *what, void *(*fn)(void *))
{
    pthread_t t;
    __atomic_store_n(&target_tid, 0, __ATOMIC_SEQ_CST);
    pthread_create(&t, NULL, fn, NULL);
    while (!__atomic_load_n(&target_tid, __ATOMIC_SEQ_CST))
        usleep(1000);
    usleep(20000); /* the sleeper into its read */
    int tid = __atomic_load_n(&target_tid, __ATOMIC_SEQ_CST);
    printf("%-9s open-read-close %6lld ns   pread %6lld ns   cpu-clock %5lld ns\n", what,
           look_cost(0, tid), look_cost(1, tid), look_cost(2, tid));
    if (fn == spinner) {
        clockid_t clock = thread_cpu_clock(tid);
        int advanced = 0;
        for (int i = 0; i < ROUNDS; i++)
            advanced += cpu_ns(clock) != cpu_ns(clock);
        printf("          its CPU clock advanced between two back-to-back reads in %d of %d "
               "pairs\n",
               advanced, ROUNDS);
        __atomic_store_n(&stop_spin, 1, __ATOMIC_SEQ_CST);
    } else {
        ssize_t n = write(sleep_pipe[1], "x", 1);
        (void)n;
    }
    pthread_join(t, NULL);
}

int main(void)
{
    if (pipe(sleep_pipe) != 0)
        return 1;
    measure("spinning", spinner);
    measure("sleeping", sleeper);
    return 0;
}
