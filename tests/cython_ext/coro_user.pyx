# cython: language_level=3
# A third-party Cython module using cyserve's coroutine runtime through `cimport cyserve._core`
# only (no header, no link against cyserve): built by tests/e2e/test_examples_coro.py into a
# temporary folder. Everything here runs without the GIL on cyserve's worker threads.
from libc.stdlib cimport calloc, free

from cyserve._core cimport (cyserve_sched, cyserve_coro, cyserve_sched_new, cyserve_sched_free,
                            cyserve_sched_workers, cyserve_spawn, cyserve_run, cyserve_yield,
                            cyserve_sleep_ns, cyserve_worker_id, cyserve_current,
                            cyserve_coro_malloc, cyserve_coro_defer)


cdef struct Job:
    int yields
    int steps          # only this job's coroutine writes it
    int bad_worker     # set if the body ever ran off the workers
    int defer_ran
    int arena_ok
    int children_done  # written by the children this job spawned (one each, distinct slots)


cdef struct Child:
    Job *parent
    int index


cdef void mark_defer(void *arg) noexcept nogil:
    (<Job *>arg).defer_ran += 1


cdef int child_body(cyserve_coro *co, void *arg) noexcept nogil:
    cdef Child *c = <Child *>arg
    if cyserve_sleep_ns(1000) != 0:
        return -1
    c.index = -c.index - 1  # marks this child as done; the parent's checker counts them
    return 0


cdef int body(cyserve_coro *co, void *arg) noexcept nogil:
    cdef Job *job = <Job *>arg
    cdef int i
    cdef char *scratch
    if cyserve_current() != co:
        job.bad_worker = 1
    cyserve_coro_defer(co, mark_defer, job)
    scratch = <char *>cyserve_coro_malloc(co, 100)
    job.arena_ok = scratch != NULL and (<size_t>scratch) % 16 == 0
    for i in range(job.yields):
        job.steps += 1
        if cyserve_worker_id() < 0:
            job.bad_worker = 1
        if cyserve_yield() != 0:
            return -1
    job.steps += 1
    return 0


def run(int workers, int n, int yields):
    """Run n coroutines that each yield `yields` times; returns a list of (steps, defer_ran,
    arena_ok, bad_worker) per coroutine, and the number of workers used."""
    cdef cyserve_sched *s = NULL
    cdef Job *jobs = <Job *>calloc(n, sizeof(Job))
    cdef int i, err = 0
    cdef unsigned nw = 0
    if jobs == NULL:
        raise MemoryError()
    with nogil:
        err = cyserve_sched_new(&s, workers, 0, 0)
        if err == 0:
            nw = cyserve_sched_workers(s)
            for i in range(n):
                jobs[i].yields = yields
                err = cyserve_spawn(s, body, &jobs[i])
                if err:
                    break
            if err == 0:
                err = cyserve_run(s)
            cyserve_sched_free(s)
    try:
        if err:
            raise OSError(-err, "cyserve scheduler error")
        return [(jobs[i].steps, jobs[i].defer_ran, jobs[i].arena_ok, jobs[i].bad_worker)
                for i in range(n)], nw
    finally:
        free(jobs)


def run_children(int workers, int n):
    """Spawn n children that sleep 1 us each; returns how many finished."""
    cdef cyserve_sched *s = NULL
    cdef Child *kids = <Child *>calloc(n, sizeof(Child))
    cdef int i, err = 0, done = 0
    if kids == NULL:
        raise MemoryError()
    with nogil:
        err = cyserve_sched_new(&s, workers, 0, 0)
        if err == 0:
            for i in range(n):
                kids[i].index = i
                err = cyserve_spawn(s, child_body, &kids[i])
                if err:
                    break
            if err == 0:
                err = cyserve_run(s)
            cyserve_sched_free(s)
        for i in range(n):
            if kids[i].index == -i - 1:
                done += 1
    free(kids)
    if err:
        raise OSError(-err, "cyserve scheduler error")
    return done
