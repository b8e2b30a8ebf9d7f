# Argument checks and errors shared by the Scheduler class (native/sched.pyx, in cyserve._core)
# and the benchmark drivers (native/sched_bench.pyx, in the test hooks), so that both word a bad
# worker count or a failed scheduler call the same way.
from libc.errno cimport ENOMEM
from libc.string cimport strerror

from cyserve.native.includes cimport sched as csched

cdef extern from "<errno.h>":
    int ESHUTDOWN


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
