# Extern declarations of the coroutine runtime (csrc/coro.h, csrc/sched.h), for the Cython code
# inside cyserve._core. Declarations only; the contracts are in the headers.
from libc.stdint cimport uint32_t, uint64_t, int64_t

cdef extern from "csrc/coro.h" nogil:
    cdef struct coro
    ctypedef int (*coro_fn)(coro *co, void *arg) noexcept nogil
    int CORO_FINISHED
    size_t CORO_STACK_MIN
    size_t CORO_STACK_MAX
    size_t CORO_STACK_DEFAULT
    void *coro_malloc(coro *co, size_t size)
    int coro_defer(coro *co, void (*fn)(void *) noexcept nogil, void *arg)
    void *coro_get_data(const coro *co)
    void coro_set_data(coro *co, void *data)

cdef extern from "csrc/sched.h" nogil:
    cdef struct sched
    cdef struct sched_config:
        unsigned workers
        size_t stack_size
        unsigned runq_capacity
        int randomize
        uint64_t seed
        int keep_alive
        unsigned relief
        int relief_waiting_only
    cdef struct sched_stats:
        uint64_t spawned
        uint64_t finished
        uint64_t steals
        uint64_t parks
        uint64_t hops
        uint64_t offloads
    unsigned SCHED_MAX_WORKERS

    int sched_new(sched **out, const sched_config *cfg)
    unsigned sched_workers(const sched *s)
    void sched_free(sched *s)
    int sched_spawn(sched *s, coro_fn fn, void *arg)
    int sched_run(sched *s)
    int sched_start(sched *s)
    void sched_stop(sched *s)
    int sched_join(sched *s)
    coro *sched_current()
    int sched_worker_id()
    int sched_yield_coro()
    int sched_sleep_ns(uint64_t ns)
    int sched_wait_fd(int fd, uint32_t events, int64_t timeout_ns)
    int sched_offload(void (*fn)(void *) noexcept nogil, void *arg)
    uint64_t sched_now_ns()
    void sched_get_stats(const sched *s, sched_stats *out)
