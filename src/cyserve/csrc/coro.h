/* coro.h: stackful coroutines with pooled, guarded stacks, a per-coroutine arena and a defer list.
 *
 * Error convention of this module: 0 or -errno; pointers are NULL on failure.
 *
 * A coroutine is created without a stack. It takes one from a stack pool when it is first
 * resumed and gives it back when it finishes, so 500,000 coroutines spawned before any of them
 * runs hold 500,000 small structs, not 500,000 stacks. Stack pools are per thread: every call
 * that names a pool must be made on the thread that owns it. Pools made with
 * coro_pool_new_shared share a depot of free stacks (under a mutex), so that stacks freed on one
 * thread serve the coroutines another thread starts.
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

/* Scheduler bookkeeping embedded at the start of every coroutine, so that the scheduler needs no
 * allocation of its own per spawn. sched.c owns these fields; coro.c never reads them. They are
 * touched only by the thread that currently holds the coroutine (runs it, queues it or parks
 * it); the queues that hand a coroutine to another thread publish them with release/acquire. */
struct coro_sched_node {
    struct coro *next; /* run/inject/remote queue link, or parked-list link */
    struct coro *prev; /* parked-list link */
    void *wait;        /* what the coroutine waits for (a record on its own stack) */
    int32_t home;      /* worker to hop to, see sched.c */
    uint32_t flags;
};

/* The node of co. struct coro begins with its node, so this is a cast, not a call. */
static inline struct coro_sched_node *coro_sched_node(struct coro *co)
{
    return (struct coro_sched_node *)(void *)co;
}

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
 * [CORO_STACK_MIN, CORO_STACK_MAX], -ENOMEM. The calling thread becomes the owner.
 *
 * Guard pages cost two memory mappings per stack and the kernel caps mappings per process
 * (vm.max_map_count). Past a budget of a quarter of that cap for all guarded stacks of the
 * process, new stacks are mapped without a guard page and carry a canary instead, checked every
 * time the coroutine switches out; a smashed canary prints "cyserve: coroutine stack overflow"
 * and aborts. A one-time warning on stderr says when this fallback starts. Why not -ENOMEM: a
 * server under a burst would then fail requests that fit in memory; the canary still turns
 * most overflows into a clean abort, and the budget leaves three quarters of the mappings to
 * the rest of the process.
 *
 * The first pool created on a thread also gives the thread an alternate signal stack, and the
 * first pool of the process installs a SIGSEGV handler (chained to the previous one) that
 * recognises a fault on the guard page of the coroutine running on that thread, writes
 * "cyserve: coroutine stack overflow" to stderr and dies by SIGSEGV. */
int coro_pool_new(struct coro_pool **out, size_t stack_size);

/* Same as coro_pool_new, but coroutine structs come from the same slab as share's, so that a
 * coroutine created with one pool may be freed with the other (the scheduler gives one pool to
 * every worker and one to outside threads). share must stay alive until this call returns;
 * the slab's memory is released with the last pool that uses it. */
int coro_pool_new_shared(struct coro_pool **out, size_t stack_size, struct coro_pool *share);

/* The usable size of the pool's stacks, in bytes. */
size_t coro_pool_stack_size(const struct coro_pool *pool);

/* Cache at most `stacks` free stacks in the pool itself (at least CORO_STACK_MAG, at most the
 * default: 8 MiB of stacks, at least 4); more go to the depot its slab shares with the other
 * pools of that slab. For a thread that finishes coroutines it did not start (a relief thread),
 * whose stacks are wanted by the threads that start them. It only lowers the bound: for stacks
 * of over 256 KiB, whose default is less than a magazine, the pool keeps its default (and
 * unmaps beyond it, as a worker's does). Owner thread of pool only. */
void coro_pool_set_cache(struct coro_pool *pool, unsigned stacks);

/* Stacks move between a pool and its slab's depot in magazines of this many. */
#define CORO_STACK_MAG 32u

/* Whether coro_pool_trim has anything to give back, now or once the depot has been still for a
 * period: the pool holds free stacks used since its last trim, or the depot its slab shares
 * holds any. A few loads, no lock: after a trim, for a thread to know whether its next long
 * sleep should again end in one (the scheduler asks this only then: its parks ask a cheaper
 * question of their own). Owner thread of pool only. */
int coro_pool_trim_due(const struct coro_pool *pool);

/* Give back what an idle thread does not need: of the pool's free stacks it keeps at most keep
 * (at most CORO_STACK_MAG), whose pages but the top one (each stack's header) go back to the
 * kernel (madvise MADV_DONTNEED: the mapping stays, a page touched again is a zeroed page
 * fault), and unmaps the others; and it unmaps every stack of the depot if no magazine came or
 * went for a second (all were unused that long; a depot in use decays as its magazines move).
 * Returns the stacks unmapped. A few system calls per stack used since the last trim: for a
 * thread that has been idle CORO_IDLE_TRIM_MS, not for a busy one. Owner thread of pool only. */
unsigned coro_pool_trim(struct coro_pool *pool, unsigned keep);

/* How long an idle thread sleeps before it calls coro_pool_trim: the depot's period (a second)
 * plus a tick of the coarse clock the depot reads (10 ms at the slowest kernel tick, 100 Hz), so
 * that a depot last touched before the sleep began is found still for a whole period at its
 * end. */
#define CORO_IDLE_TRIM_MS 1010

/* Counters of the process's stack mappings since it started: stacks mapped (each an mmap, and
 * an mprotect for its guard page) and unmapped (each a munmap). Any thread; each value is
 * exact, the pair is not one snapshot, but *mapped - *unmapped is never below the stacks
 * mapped at either moment it was read (nor below 0): above it at most by those mapped
 * meanwhile. */
void coro_stack_counts(uint64_t *mapped, uint64_t *unmapped);

/* Unmap every cached stack and free the pool. Coroutines still holding one of its stacks must be
 * finished or freed first. Owner thread only. */
void coro_pool_free(struct coro_pool *pool);

/* Allocate a coroutine that will run fn(co, arg). No stack is taken yet. Returns NULL on ENOMEM.
 * The struct comes from pool's slab of coroutine structs (no malloc per coroutine); it may be
 * resumed later from any thread, with that thread's own pool. Owner thread of pool only. */
struct coro *coro_new(struct coro_pool *pool, coro_fn fn, void *arg);

/* Run co until it yields or finishes. On its first resume it takes a stack from pool; when it
 * finishes it runs its deferred calls, frees its arena and gives the stack back to pool. Returns
 * the yielded value (>= 0), CORO_FINISHED, or -ENOMEM if no stack could be mapped for its first
 * run (co is then untouched and may be resumed again or freed). Resumes nest: a coroutine may
 * resume another one, and each coro_yield() returns to its own resumer. pool must be the calling
 * thread's pool. A suspended coroutine may be resumed by another thread than the one that
 * suspended it, provided the hand-over is ordered (release/acquire) as the run queues do. */
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

/* Give back to the kernel the pages of co's stack below the one its stack pointer is in, less a
 * page of margin for this call (madvise MADV_DONTNEED; an unguarded stack's canary is written
 * again). A pooled stack keeps every page its earlier coroutines touched: a coroutine that will
 * wait long at a shallow depth (an open WebSocket's) trims it when it starts, and holds only the
 * pages it touches from then on. A trimmed page touched again is a zeroed page fault. From
 * inside co only. */
void coro_stack_trim(struct coro *co);

/* Whether co has taken a stack (it has been resumed at least once and has not finished). */
int coro_is_started(const struct coro *co);

/* The exit value returned by co's body; meaningful once it has finished. */
int coro_exit_value(const struct coro *co);

/* Per-coroutine user data (one pointer), for the scheduler and the HTTP engine. */
void *coro_get_data(const struct coro *co);
void coro_set_data(struct coro *co, void *data);

#endif
