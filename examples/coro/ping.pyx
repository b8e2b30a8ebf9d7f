# cython: language_level=3
# examples/coro/ping.pyx: coroutines on cyserve's work-stealing scheduler, from your own Cython
# module. Each coroutine takes `rounds` steps and yields between them; the steps are counted per
# coroutine, so the result is exact whichever worker ran each step. Nothing here holds the GIL.
from libc.stdlib cimport calloc, free

from cyserve._core cimport (cyserve_sched, cyserve_coro, cyserve_sched_new, cyserve_sched_free,
                            cyserve_spawn, cyserve_run, cyserve_yield, cyserve_sleep_ns,
                            cyserve_worker_id, cyserve_coro_defer)


cdef struct Ping:
    int rounds
    int steps          # written only by this coroutine
    int last_worker    # the worker that ran its last step
    int cleaned_up     # set by the deferred call when the coroutine ends


cdef void cleanup(void *arg) noexcept nogil:
    (<Ping *>arg).cleaned_up = 1


cdef int ping(cyserve_coro *co, void *arg) noexcept nogil:
    cdef Ping *p = <Ping *>arg
    cdef int i
    cyserve_coro_defer(co, cleanup, p)   # runs when ping returns, or if it is cancelled
    for i in range(p.rounds):
        p.steps += 1
        p.last_worker = cyserve_worker_id()
        if i == 0:
            cyserve_sleep_ns(100000)      # 0.1 ms: parks the coroutine on its worker's timers
        elif cyserve_yield() != 0:        # -ECANCELED: the scheduler is stopping
            return 1
    return 0


def run(int workers, int coroutines, int rounds):
    """Run `coroutines` pings of `rounds` steps on `workers` threads (0: one per CPU).
    Returns (total steps, coroutines cleaned up, set of workers seen)."""
    cdef cyserve_sched *s = NULL
    cdef Ping *pings = <Ping *>calloc(coroutines, sizeof(Ping))
    cdef int i, err = 0
    if pings == NULL:
        raise MemoryError()
    with nogil:                           # the workers never need the GIL
        err = cyserve_sched_new(&s, workers, 0, 0)   # 0: default stacks; 0: batch mode
        if err == 0:
            for i in range(coroutines):
                pings[i].rounds = rounds
                err = cyserve_spawn(s, ping, &pings[i])
                if err:
                    break
            if err == 0:
                err = cyserve_run(s)      # returns when no coroutine is left
            cyserve_sched_free(s)
    try:
        if err:
            raise OSError(-err, "cyserve scheduler error")
        return (sum(pings[i].steps for i in range(coroutines)),
                sum(pings[i].cleaned_up for i in range(coroutines)),
                {pings[i].last_worker for i in range(coroutines)})
    finally:
        free(pings)
