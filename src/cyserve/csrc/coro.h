/* coro.h: stackful coroutines with pooled, guarded stacks, a per-coroutine arena and a defer list.
 *
 * Error convention of this module: 0 or -errno; pointers are NULL on failure.
 *
 * A coroutine is created without a stack. It takes one from a stack pool when it is first
 * resumed and gives it back when it finishes, so 500,000 coroutines spawned before any of them
 * runs hold 500,000 small structs, not 500,000 stacks. Stack pools are per thread: every call
 * that names a pool must be made on the thread that owns it.
 *
 * A coroutine body returns an int (its exit value). Inside the body, coro_yield() suspends it
 * and hands a value to whoever resumed it; the scheduler (sched.h) uses these values, user code
 * normally calls sched_yield() and friends instead. */
#ifndef CYSERVE_CORO_H
#define CYSERVE_CORO_H

#include <stddef.h>
#include <stdint.h>

struct coro;
struct coro_pool;

typedef int (*coro_fn)(struct coro *co, void *arg);

/* What coro_resume() returns once the coroutine has run its body to the end. Any other value
 * is what the coroutine passed to coro_yield(); yield values must be >= 0. */
#define CORO_FINISHED (-1)

/* Smallest and largest accepted stack sizes (bytes, before rounding up to whole pages). */
#define CORO_STACK_MIN (16u * 1024u)
#define CORO_STACK_MAX (256u * 1024u * 1024u)
#define CORO_STACK_DEFAULT (64u * 1024u)

/* Create a stack pool handing out stacks of stack_size bytes (rounded up to whole pages), each
 * with a PROT_NONE guard page below it. Returns 0 and sets *out, -EINVAL for a size outside
 * [CORO_STACK_MIN, CORO_STACK_MAX], -ENOMEM. The calling thread becomes the owner. */
int coro_pool_new(struct coro_pool **out, size_t stack_size);

/* Unmap every cached stack and free the pool. Coroutines still holding one of its stacks must be
 * finished or freed first. Owner thread only. */
void coro_pool_free(struct coro_pool *pool);

/* Allocate a coroutine that will run fn(co, arg). No stack is taken yet. Returns NULL on ENOMEM.
 * The struct comes from pool's slab of coroutine structs (no malloc per coroutine); it may be
 * resumed later from any thread, with that thread's own pool. Owner thread of pool only. */
struct coro *coro_new(struct coro_pool *pool, coro_fn fn, void *arg);

/* Run co until it yields or finishes. On its first resume it takes a stack from pool; when it
 * finishes it runs its deferred calls, frees its arena and gives the stack back to pool. Returns
 * the yielded value (>= 0) or CORO_FINISHED. Resumes nest: a coroutine may resume another one,
 * and each coro_yield() returns to its own resumer. pool must be the calling thread's pool. */
int coro_resume(struct coro *co, struct coro_pool *pool);

/* Suspend the running coroutine co, returning value (>= 0) from the coro_resume() that ran it.
 * Returns whatever the next coro_resume() passes in via coro_set_resume_value() (0 if none).
 * Only from inside co. */
int coro_yield(struct coro *co, int value);

/* Value that the next coro_yield() of co will return (e.g. -ETIMEDOUT for a timed-out wait).
 * Only while co is suspended, by the thread about to resume it. */
void coro_set_resume_value(struct coro *co, int value);

/* Free a coroutine that has finished or never ran; a suspended one is first cancelled: its
 * deferred calls run (last registered first) and its stack goes back to pool. pool must be the
 * calling thread's pool; the struct goes back to that pool's slab. */
void coro_free(struct coro *co, struct coro_pool *pool);

/* Allocate size bytes from co's arena, 16-byte aligned. The memory lives until co finishes or is
 * freed: callers never free it. Returns NULL on ENOMEM. From inside co, or by its resumer. */
void *coro_malloc(struct coro *co, size_t size);

/* Register fn(arg) to run when co finishes or is freed; deferred calls run last-in first-out.
 * Returns 0 or -ENOMEM. From inside co, or by its resumer. */
int coro_defer(struct coro *co, void (*fn)(void *), void *arg);

/* The exit value returned by co's body; meaningful once it has finished. */
int coro_exit_value(const struct coro *co);

/* Per-coroutine user data (one pointer), for the scheduler and the HTTP engine. */
void *coro_get_data(const struct coro *co);
void coro_set_data(struct coro *co, void *data);

#endif
