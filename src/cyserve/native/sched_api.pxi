# The coroutine runtime's C-level API (STYLE.md 2(c)), included in _core.pxd. Another Cython
# module `cimport`s these from cyserve._core; no header is needed (the types are opaque here and
# the functions are reached through _core's exported function table). Build the module with
# include_dirs=[cyserve.get_include()] as for the handler API. See examples/coro/.
#
# Every function is `noexcept nogil` and returns 0 or -errno unless its comment says otherwise.
# "Coroutine only": call it from inside a coroutine body run by a cyserve scheduler.
from libc.stdint cimport uint32_t, uint64_t, int64_t

# Opaque handles: a scheduler, and a running coroutine. Declared in C before any prototype that
# names them (a forward declaration inside a parameter list would be a different type).
cdef extern from *:
    """
    struct cyserve_sched;
    struct cyserve_coro;
    """
    cdef struct cyserve_sched
    cdef struct cyserve_coro

# A coroutine body: returns its exit value; runs on a worker thread, without the GIL.
ctypedef int (*cyserve_coro_fn)(cyserve_coro *co, void *arg) noexcept nogil

# Create a scheduler with `workers` threads (0: the CPUs this process may use) and stacks of
# stack_size bytes (0: 64 KiB). keep_alive 0: batch mode (cyserve_run returns when no coroutine
# is left); 1: server mode (cyserve_start, then cyserve_stop + cyserve_join). -EINVAL, -ENOMEM.
cdef int cyserve_sched_new(cyserve_sched **out, unsigned workers, size_t stack_size,
                           int keep_alive) noexcept nogil
# Free a scheduler whose workers are not running; coroutines still queued are cancelled.
cdef void cyserve_sched_free(cyserve_sched *s) noexcept nogil
# Number of worker threads.
cdef unsigned cyserve_sched_workers(cyserve_sched *s) noexcept nogil
# Spawn fn(co, arg). Any thread. -ESHUTDOWN after cyserve_stop, -ENOMEM.
cdef int cyserve_spawn(cyserve_sched *s, cyserve_coro_fn fn, void *arg) noexcept nogil
# Batch mode: run until no coroutine is left. Blocks the caller (release the GIL first).
cdef int cyserve_run(cyserve_sched *s) noexcept nogil
# Server mode: start the workers and return.
cdef int cyserve_start(cyserve_sched *s) noexcept nogil
# Ask the workers to stop (async-signal-safe); suspended coroutines get -ECANCELED and finish.
cdef void cyserve_stop(cyserve_sched *s) noexcept nogil
# Wait for the workers after cyserve_stop.
cdef int cyserve_join(cyserve_sched *s) noexcept nogil

# Coroutine only: let others run; 0 or -ECANCELED (stopping: finish).
cdef int cyserve_yield() noexcept nogil
# Coroutine only: sleep at least ns nanoseconds; 0 or -ECANCELED.
cdef int cyserve_sleep_ns(uint64_t ns) noexcept nogil
# Coroutine only: wait until fd is ready for events (EPOLLIN=1, EPOLLOUT=4) or timeout_ns passes
# (< 0: never); the ready events (> 0), -ETIMEDOUT, -ECANCELED or -errno.
cdef int cyserve_wait_fd(int fd, uint32_t events, int64_t timeout_ns) noexcept nogil
# The worker index of the calling thread, or -1 off the workers.
cdef int cyserve_worker_id() noexcept nogil
# The running coroutine, or NULL.
cdef cyserve_coro *cyserve_current() noexcept nogil
# Coroutine-scoped memory (16-byte aligned, freed when the coroutine ends); NULL on ENOMEM.
cdef void *cyserve_coro_malloc(cyserve_coro *co, size_t size) noexcept nogil
# Run fn(arg) when the coroutine ends or is cancelled, last registered first.
cdef int cyserve_coro_defer(cyserve_coro *co, void (*fn)(void *) noexcept nogil,
                            void *arg) noexcept nogil
