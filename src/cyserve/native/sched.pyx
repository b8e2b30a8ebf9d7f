# The coroutine runtime's Cython layer, included in cyserve._core: the exported nogil API
# declared in native/sched_api.pxi and the Scheduler class for tests and tools (the benchmark
# drivers are in the test hooks, native/sched_bench.pyx). Python never runs on a coroutine stack:
# everything spawned from here is a C body.
from libc.stdint cimport uint32_t, uint64_t, int64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset

from cyserve.native.includes cimport sched as csched


# ---- the exported C-level API (declared in sched_api.pxi) ----

cdef int cyserve_sched_new(cyserve_sched **out, unsigned workers, size_t stack_size,
                           int keep_alive) noexcept nogil:
    cdef csched.sched_config cfg
    memset(&cfg, 0, sizeof(cfg))  # fields added later (relief) default to 0
    cfg.workers = workers
    cfg.stack_size = stack_size
    cfg.runq_capacity = 0
    cfg.randomize = 0
    cfg.seed = 0
    cfg.keep_alive = keep_alive
    return csched.sched_new(<csched.sched **>out, &cfg)

cdef void cyserve_sched_free(cyserve_sched *s) noexcept nogil:
    csched.sched_free(<csched.sched *>s)

cdef unsigned cyserve_sched_workers(cyserve_sched *s) noexcept nogil:
    return csched.sched_workers(<csched.sched *>s)

cdef int cyserve_spawn(cyserve_sched *s, cyserve_coro_fn fn, void *arg) noexcept nogil:
    # The body types differ only in the name of the opaque coroutine struct: same ABI.
    return csched.sched_spawn(<csched.sched *>s, <csched.coro_fn>fn, arg)

cdef int cyserve_run(cyserve_sched *s) noexcept nogil:
    return csched.sched_run(<csched.sched *>s)

cdef int cyserve_start(cyserve_sched *s) noexcept nogil:
    return csched.sched_start(<csched.sched *>s)

cdef void cyserve_stop(cyserve_sched *s) noexcept nogil:
    csched.sched_stop(<csched.sched *>s)

cdef int cyserve_join(cyserve_sched *s) noexcept nogil:
    return csched.sched_join(<csched.sched *>s)

cdef int cyserve_yield() noexcept nogil:
    return csched.sched_yield_coro()

cdef int cyserve_sleep_ns(uint64_t ns) noexcept nogil:
    return csched.sched_sleep_ns(ns)

cdef int cyserve_wait_fd(int fd, uint32_t events, int64_t timeout_ns) noexcept nogil:
    return csched.sched_wait_fd(fd, events, timeout_ns)

cdef int cyserve_worker_id() noexcept nogil:
    return csched.sched_worker_id()

cdef cyserve_coro *cyserve_current() noexcept nogil:
    return <cyserve_coro *>csched.sched_current()

cdef void *cyserve_coro_malloc(cyserve_coro *co, size_t size) noexcept nogil:
    return csched.coro_malloc(<csched.coro *>co, size)

cdef int cyserve_coro_defer(cyserve_coro *co, void (*fn)(void *) noexcept nogil,
                            void *arg) noexcept nogil:
    return csched.coro_defer(<csched.coro *>co, fn, arg)


# ---- helpers ----

include "sched_checks.pxi"


# ---- C bodies spawned from Python ----

cdef struct _yield_job:
    int yields
    uint64_t *steps  # shared counter, updated atomically

cdef extern from *:
    """
    static inline void cyserve__atomic_add_u64(uint64_t *p, uint64_t v)
    {
        /* safety: a statistics counter shared by coroutines on every worker. */
        __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    }
    static inline uint64_t cyserve__atomic_load_u64(const uint64_t *p)
    {
        /* safety: read by Python while workers count; approximate until they are idle. */
        return __atomic_load_n(p, __ATOMIC_RELAXED);
    }
    """
    void cyserve__atomic_add_u64(uint64_t *p, uint64_t v) noexcept nogil
    uint64_t cyserve__atomic_load_u64(const uint64_t *p) noexcept nogil

cdef int _yielder_body(csched.coro *co, void *arg) noexcept nogil:
    cdef _yield_job *job = <_yield_job *>arg
    cdef int i
    cyserve__atomic_add_u64(job.steps, 1)
    for i in range(job.yields):
        if csched.sched_yield_coro() != 0:
            return -1
        cyserve__atomic_add_u64(job.steps, 1)
    return 0


cdef class Scheduler:
    """A server-mode coroutine scheduler: N worker threads that run C coroutines.

    Scheduler(workers=0, stack_size=65536, runq_capacity=256, randomize=False). workers=0 means
    one per CPU this process may use. Python code never runs on the workers; this class exists
    to start and stop a scheduler, spawn the built-in C test bodies and read statistics."""

    cdef csched.sched *_s
    cdef int _started
    cdef int _stopped
    cdef uint64_t _steps
    cdef _yield_job *_jobs_pool  # one job per spawn_yielders call, kept until dealloc
    cdef list _jobs

    def __cinit__(self):
        self._s = NULL
        self._jobs = []

    def __init__(self, workers=0, stack_size=65536, runq_capacity=256, randomize=False):
        _check_workers(workers)
        _check_stack(stack_size)
        if isinstance(runq_capacity, bool) or not isinstance(runq_capacity, int):
            raise TypeError("runq_capacity must be an int")
        if runq_capacity < 2 or runq_capacity > (1 << 20) or runq_capacity & (runq_capacity - 1):
            raise ValueError(f"runq_capacity must be a power of two in [2, 2**20], "
                             f"got {runq_capacity}")
        if self._s != NULL:
            raise RuntimeError("Scheduler.__init__ called twice")
        cdef csched.sched_config cfg
        memset(&cfg, 0, sizeof(cfg))  # fields added later (relief) default to 0
        cfg.workers = workers
        cfg.stack_size = stack_size
        cfg.runq_capacity = runq_capacity
        cfg.randomize = 1 if randomize else 0
        cfg.seed = 0
        cfg.keep_alive = 1
        cdef int err = csched.sched_new(&self._s, &cfg)
        if err:
            self._s = NULL
            raise _sched_error(err, "creating the scheduler")

    def __dealloc__(self):
        if self._s != NULL:
            if self._started:
                with nogil:
                    csched.sched_stop(self._s)
                    csched.sched_join(self._s)
            csched.sched_free(self._s)
            self._s = NULL
        for p in self._jobs:
            free(<void *><size_t>p)

    cdef int _check_open(self) except -1:
        if self._s == NULL:
            raise RuntimeError("the scheduler was not initialised")
        return 0

    @property
    def workers(self):
        """Number of worker threads."""
        self._check_open()
        return csched.sched_workers(self._s)

    def start(self):
        """Start the worker threads (they park until work arrives)."""
        self._check_open()
        if self._stopped:
            raise RuntimeError("a stopped scheduler cannot be started again")
        if self._started:
            raise RuntimeError("the scheduler is already started")
        cdef int err
        with nogil:
            err = csched.sched_start(self._s)
        if err:
            raise _sched_error(err, "starting the workers")
        self._started = 1

    def stop(self):
        """Ask the workers to stop: suspended coroutines are cancelled and finish. Returns at
        once; call join() to wait."""
        self._check_open()
        self._stopped = 1
        with nogil:
            csched.sched_stop(self._s)

    def join(self):
        """Wait for the workers to exit (after stop())."""
        self._check_open()
        with nogil:
            csched.sched_join(self._s)
        self._started = 0

    def spawn_yielders(self, n, yields=0):
        """Spawn n C coroutines that each count one step, then yield and count `yields` more
        times (stats()['steps']). RuntimeError once the scheduler is stopped."""
        self._check_open()
        if n < 0 or yields < 0:
            raise ValueError("n and yields must be >= 0")
        cdef _yield_job *job = <_yield_job *>calloc(1, sizeof(_yield_job))
        if job == NULL:
            raise MemoryError()
        self._jobs.append(<size_t>job)
        job.yields = yields
        job.steps = &self._steps
        cdef long i, count = n
        cdef int err = 0
        with nogil:
            for i in range(count):
                err = csched.sched_spawn(self._s, _yielder_body, job)
                if err:
                    break
        if err:
            raise _sched_error(err, "spawning")

    def stats(self):
        """Counters over all workers: spawned, finished, steals, parks, hops, offloads, steps
        (approximate while the workers run)."""
        self._check_open()
        cdef csched.sched_stats st
        csched.sched_get_stats(self._s, &st)
        return {"spawned": st.spawned, "finished": st.finished, "steals": st.steals,
                "parks": st.parks, "hops": st.hops, "offloads": st.offloads,
                "steps": cyserve__atomic_load_u64(&self._steps), "workers": csched.sched_workers(self._s)}
