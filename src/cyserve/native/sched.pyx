# The coroutine runtime's Cython layer, included in cyserve._core: the exported nogil API
# declared in native/sched_api.pxi, the Scheduler class for tests and tools, and the benchmark
# entry points used by bench/coro/run.py. Python never runs on a coroutine stack: everything
# spawned from here is a C body.
from libc.errno cimport ENOMEM
from libc.stdint cimport uint32_t, uint64_t, int64_t
from libc.stdlib cimport calloc, free
from libc.string cimport strerror

from cyserve.native.includes cimport sched as csched

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

cdef extern from "<errno.h>":
    int ESHUTDOWN


# ---- the exported C-level API (declared in sched_api.pxi) ----

cdef int cyserve_sched_new(cyserve_sched **out, unsigned workers, size_t stack_size,
                           int keep_alive) noexcept nogil:
    cdef csched.sched_config cfg
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

cdef inline double _now_s() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9

cdef inline double _cpu_s() noexcept nogil:
    cdef rusage ru
    getrusage(RUSAGE_SELF, &ru)
    return (<double>ru.ru_utime.tv_sec + <double>ru.ru_utime.tv_usec * 1e-6 +
            <double>ru.ru_stime.tv_sec + <double>ru.ru_stime.tv_usec * 1e-6)

cdef object _sched_error(int err, str what):
    if err == -ESHUTDOWN:
        return RuntimeError(f"{what}: the scheduler is stopped")
    if err == -ENOMEM:
        return MemoryError(what)
    return OSError(-err, f"{what}: {strerror(-err).decode()}")

cdef inline int _check_workers(object workers) except -1:
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"workers must be an int, not {type(workers).__name__}")
    if workers < 0:
        raise ValueError(f"workers must be >= 0 (0: one per CPU), got {workers}")
    if workers > csched.SCHED_MAX_WORKERS:
        raise ValueError(f"workers must be <= {csched.SCHED_MAX_WORKERS}, got {workers}")
    return 0

cdef inline int _check_stack(object stack_size) except -1:
    if isinstance(stack_size, bool) or not isinstance(stack_size, int):
        raise TypeError(f"stack_size must be an int, not {type(stack_size).__name__}")
    if stack_size < csched.CORO_STACK_MIN or stack_size > csched.CORO_STACK_MAX:
        raise ValueError(f"stack_size must be between {csched.CORO_STACK_MIN} (16 KiB) and "
                         f"{csched.CORO_STACK_MAX} (256 MiB) bytes, got {stack_size}")
    return 0


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

cdef int _empty_body(csched.coro *co, void *arg) noexcept nogil:
    return 0

cdef int _fib_body(csched.coro *co, void *arg) noexcept nogil:
    # Fibonacci(n) with uint32 wrap-around, as seed 002 and the Go reference compute it.
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


# ---- benchmark entry points (bench/coro/run.py) ----

def bench_empty(int workers, long n, size_t stack_size=65536):
    """Spawn n empty coroutines from this thread before the workers start, then run them all.
    Returns {spawn_s, run_s, total_s}: total from before sched_new to after sched_free, spawn the
    spawning loop, run sched_run until idle. CLOCK_MONOTONIC, GIL released throughout."""
    _check_workers(workers)
    _check_stack(stack_size)
    if n < 0:
        raise ValueError("n must be >= 0")
    cdef csched.sched *s = NULL
    cdef csched.sched_config cfg
    cdef double t0 = 0, t1 = 0, t2 = 0, t3 = 0, t4 = 0
    cdef int err = 0
    cdef long i
    cfg.workers = workers
    cfg.stack_size = stack_size
    cfg.runq_capacity = 0
    cfg.randomize = 0
    cfg.seed = 0
    cfg.keep_alive = 0
    with nogil:
        t0 = _now_s()
        err = csched.sched_new(&s, &cfg)
        if err == 0:
            t1 = _now_s()
            for i in range(n):
                err = csched.sched_spawn(s, _empty_body, NULL)
                if err:
                    break
            t2 = _now_s()
            if err == 0:
                err = csched.sched_run(s)
            t3 = _now_s()
            csched.sched_free(s)
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
    cdef csched.sched *s = NULL
    cdef csched.sched_config cfg
    cdef double t0 = 0, t1 = 0, t2 = 0, t3 = 0, t4 = 0
    cdef int err = 0
    cdef long i
    cdef uint64_t checksum = 0
    cfg.workers = workers
    cfg.stack_size = 0
    cfg.runq_capacity = 0
    cfg.randomize = 0
    cfg.seed = 0
    cfg.keep_alive = 0
    with nogil:
        for i in range(n):
            slots[i] = fib_n
        t0 = _now_s()
        err = csched.sched_new(&s, &cfg)
        if err == 0:
            t1 = _now_s()
            for i in range(n):
                err = csched.sched_spawn(s, _fib_body, &slots[i])
                if err:
                    break
            t2 = _now_s()
            if err == 0:
                err = csched.sched_run(s)
            t3 = _now_s()
            csched.sched_free(s)
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
    cdef csched.sched *s = NULL
    cdef csched.sched_config cfg
    cdef int err
    cdef double c0 = 0, c1 = 0, w0 = 0, w1 = 0
    cdef timespec req
    cfg.workers = workers
    cfg.stack_size = 0
    cfg.runq_capacity = 0
    cfg.randomize = 0
    cfg.seed = 0
    cfg.keep_alive = 1
    with nogil:
        err = csched.sched_new(&s, &cfg)
        if err == 0:
            err = csched.sched_start(s)
            if err == 0:
                req.tv_sec = <time_t>seconds
                req.tv_nsec = <long>((seconds - <double>req.tv_sec) * 1e9)
                c0 = _cpu_s()
                w0 = _now_s()
                nanosleep(&req, NULL)
                c1 = _cpu_s()
                w1 = _now_s()
                csched.sched_stop(s)
                csched.sched_join(s)
            csched.sched_free(s)
    if err:
        raise _sched_error(err, "parked_cpu")
    return {"cpu_s": c1 - c0, "wall_s": w1 - w0}
