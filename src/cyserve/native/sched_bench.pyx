# The coroutine benchmark drivers, included in the test hooks (cyserve._testhooks), not in the
# product module: bench/coro/peer_cyserve.py and tests/unit/test_sched.py call them. They time the
# runtime in C with the GIL released, and reach it only through the exported API of
# native/sched_api.pxi (cimport cyserve._core), as any other Cython module would.
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport calloc, free

from cyserve._core cimport (cyserve_sched, cyserve_coro, cyserve_sched_new, cyserve_sched_free,
                            cyserve_spawn, cyserve_run, cyserve_start, cyserve_stop,
                            cyserve_join)

include "sched_checks.pxi"

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int CLOCK_MONOTONIC
    int clock_gettime(int clk, timespec *ts)
    int nanosleep(const timespec *req, timespec *rem)

cdef extern from "<sys/resource.h>" nogil:
    cdef struct timeval:
        time_t tv_sec
        long tv_usec
    cdef struct rusage:
        timeval ru_utime
        timeval ru_stime
    int RUSAGE_SELF
    int getrusage(int who, rusage *usage)


cdef inline double _now_s() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9

cdef inline double _cpu_s() noexcept nogil:
    cdef rusage ru
    getrusage(RUSAGE_SELF, &ru)
    return (<double>ru.ru_utime.tv_sec + <double>ru.ru_utime.tv_usec * 1e-6 +
            <double>ru.ru_stime.tv_sec + <double>ru.ru_stime.tv_usec * 1e-6)


cdef int _empty_body(cyserve_coro *co, void *arg) noexcept nogil:
    return 0

cdef int _fib_body(cyserve_coro *co, void *arg) noexcept nogil:
    # Fibonacci(n) with uint32 wrap-around, as the Go and Python peers in bench/coro/ compute it.
    cdef uint32_t *slot = <uint32_t *>arg
    cdef uint32_t n = slot[0]
    cdef uint32_t a = 0, b = 1, t
    cdef uint32_t i
    for i in range(n):
        t = a + b
        a = b
        b = t
    slot[0] = a
    return 0


def bench_empty(int workers, long n, size_t stack_size=65536):
    """Spawn n empty coroutines from this thread before the workers start, then run them all.
    Returns {spawn_s, run_s, total_s}: total from before sched_new to after sched_free, spawn the
    spawning loop, run sched_run until idle. CLOCK_MONOTONIC, GIL released throughout."""
    _check_workers(workers)
    _check_stack(stack_size)
    if n < 0:
        raise ValueError("n must be >= 0")
    cdef cyserve_sched *s = NULL
    cdef double t0 = 0, t1 = 0, t2 = 0, t3 = 0, t4 = 0
    cdef int err = 0
    cdef long i
    with nogil:
        t0 = _now_s()
        err = cyserve_sched_new(&s, <unsigned>workers, stack_size, 0)  # batch mode
        if err == 0:
            t1 = _now_s()
            for i in range(n):
                err = cyserve_spawn(s, _empty_body, NULL)
                if err:
                    break
            t2 = _now_s()
            if err == 0:
                err = cyserve_run(s)
            t3 = _now_s()
            cyserve_sched_free(s)
        t4 = _now_s()
    if err:
        raise _sched_error(err, "bench_empty")
    return {"spawn_s": t2 - t1, "run_s": t3 - t2, "total_s": t4 - t0}


def bench_fib(int workers, long n, unsigned fib_n):
    """n coroutines each computing Fibonacci(fib_n) with uint32 wrap-around. Returns
    {spawn_s, run_s, total_s, checksum}; checksum is the sum of the n results."""
    _check_workers(workers)
    if n < 0:
        raise ValueError("n must be >= 0")
    cdef uint32_t *slots = <uint32_t *>calloc(max(n, 1), sizeof(uint32_t))
    if slots == NULL:
        raise MemoryError()
    cdef cyserve_sched *s = NULL
    cdef double t0 = 0, t1 = 0, t2 = 0, t3 = 0, t4 = 0
    cdef int err = 0
    cdef long i
    cdef uint64_t checksum = 0
    with nogil:
        for i in range(n):
            slots[i] = fib_n
        t0 = _now_s()
        err = cyserve_sched_new(&s, <unsigned>workers, 0, 0)  # default stacks, batch mode
        if err == 0:
            t1 = _now_s()
            for i in range(n):
                err = cyserve_spawn(s, _fib_body, &slots[i])
                if err:
                    break
            t2 = _now_s()
            if err == 0:
                err = cyserve_run(s)
            t3 = _now_s()
            cyserve_sched_free(s)
        t4 = _now_s()
        for i in range(n):
            checksum += slots[i]
    free(slots)
    if err:
        raise _sched_error(err, "bench_fib")
    return {"spawn_s": t2 - t1, "run_s": t3 - t2, "total_s": t4 - t0, "checksum": checksum}


def parked_cpu(int workers, double seconds):
    """Start a server-mode scheduler with no work, measure this process's CPU time (user +
    system, getrusage) over `seconds` of wall time, stop it. Returns {cpu_s, wall_s}."""
    _check_workers(workers)
    if not seconds >= 0:
        raise ValueError("seconds must be >= 0")
    cdef cyserve_sched *s = NULL
    cdef int err
    cdef double c0 = 0, c1 = 0, w0 = 0, w1 = 0
    cdef timespec req
    with nogil:
        err = cyserve_sched_new(&s, <unsigned>workers, 0, 1)  # server mode
        if err == 0:
            err = cyserve_start(s)
            if err == 0:
                req.tv_sec = <time_t>seconds
                req.tv_nsec = <long>((seconds - <double>req.tv_sec) * 1e9)
                c0 = _cpu_s()
                w0 = _now_s()
                nanosleep(&req, NULL)
                c1 = _cpu_s()
                w1 = _now_s()
                cyserve_stop(s)
                cyserve_join(s)
            cyserve_sched_free(s)
    if err:
        raise _sched_error(err, "parked_cpu")
    return {"cpu_s": c1 - c0, "wall_s": w1 - w0}
