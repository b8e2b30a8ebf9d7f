/* coro.c: stackful coroutines, their stack pools, slabs of coroutine structs, arenas and defers.
 *
 * Memory, and who owns it:
 * - struct coro comes from a slab: chunks of CORO_SLAB_CHUNK bytes carved into structs. A pool
 *   keeps a private free list (no locking on the hot path). Structs migrate between pools of the
 *   same slab (created on one worker, freed on another), so a pool whose free list grows past
 *   two magazines gives one magazine back to the shared slab (mutex), and a pool that runs dry
 *   takes a magazine from there before it carves a new chunk. Chunks are freed with the slab,
 *   when its last pool is freed (reference count).
 * - Stacks are mmap'd: [guard page][usable stack][struct coro_stack header at the very top].
 *   A coroutine takes one on its first resume from the resuming thread's pool and gives it back
 *   to the pool of the thread where it finishes. Each pool caches a bounded number of stacks;
 *   past that it gives them, a magazine at a time, to the depot its slab shares with the other
 *   pools (mutex), and a pool that runs dry takes a magazine from there before it maps a new
 *   stack. The depot is bounded too, and what it held unused for a whole second is unmapped.
 *   A thread that has been idle a second trims its pool (coro_pool_trim, called from the
 *   scheduler's park): it keeps a few stacks (a worker a magazine, a relief thread none), their
 *   pages given back, unmaps the rest,
 *   and empties a depot that nobody touched for a second, so that an idle server does not keep
 *   what a burst left behind (the policy and its measurements: docs/architecture.md,
 *   "Coroutine stacks under many streams"). Stacks are plain mappings, so any pool may unmap any
 *   stack.
 * - The arena is a list of malloc'd chunks owned by the coroutine; defer records live in it.
 *
 * Switching: coro_switch_ctx (coro_switch_<arch>.S) saves the callee-saved registers on the
 * running stack and swaps stack pointers. Under AddressSanitizer every switch is announced with
 * __sanitizer_start/finish_switch_fiber (ASan must know which stack is live to tell a stack
 * access from a wild one), and under ThreadSanitizer every coroutine is a TSan fiber, switched
 * with __tsan_switch_to_fiber, so that a coroutine resumed on another thread keeps its own
 * happens-before history instead of inheriting the worker's. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* MAP_STACK, and so that a test including coro.c then sched.c sees it */
#endif
#include "coro.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "compat.h"

#if defined(CORO_USE_UCONTEXT)
#include <ucontext.h>
#endif

#if defined(CYSERVE_ASAN)
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
                                     size_t *size_old);
void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#endif
#if defined(CYSERVE_TSAN)
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void *fiber);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
#endif

#if !defined(CORO_USE_UCONTEXT)
/* Defined in coro_switch_<arch>.S. */
void coro_switch_ctx(void **save_sp, void *load_sp);
void coro_trampoline(void);
#endif

enum coro_state { CORO_NEW, CORO_RUNNING, CORO_SUSPENDED, CORO_DONE };

/* Header at the top of every stack mapping. */
struct coro_stack {
    struct coro_stack *next;     /* pool free list, or the rest of a magazine */
    struct coro_stack *next_mag; /* the depot's next magazine (in a magazine's first stack) */
    char *map;                   /* start of the mapping (the guard page, if any) */
    size_t map_size;
    char *lo; /* lowest usable byte */
    char *hi; /* one past the highest usable byte (this header starts here) */
    int guarded;
};

struct coro_arena_chunk {
    struct coro_arena_chunk *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
};

struct coro_defer_rec {
    struct coro_defer_rec *next;
    void (*fn)(void *);
    void *arg;
};

struct coro {
    struct coro_sched_node node; /* must stay first: see coro_sched_node() */
#if defined(CORO_USE_UCONTEXT)
    ucontext_t ctx, caller_ctx;
#else
    void *sp;        /* saved stack pointer while suspended */
    void *caller_sp; /* the resumer's, while running */
#endif
    struct coro_stack *stack;
    coro_fn fn;
    void *arg;
    struct coro_arena_chunk *arena;
    struct coro_defer_rec *defers;
    void *data;
    int state;
    int transfer;     /* value handed across the switch: the yield value or CORO_FINISHED */
    int resume_value; /* what the next coro_yield() returns */
    int exit_value;
#if defined(CYSERVE_ASAN)
    void *asan_fake;
    const void *caller_bottom;
    size_t caller_size;
#endif
#if defined(CYSERVE_TSAN)
    void *tsan_fiber;
    void *tsan_caller;
#endif
};

/* ---- slab of coroutine structs ---- */

/* 2 MiB chunks, 2 MiB-aligned so that the kernel may back them with a huge page where THP is
 * "always". Not madvise(MADV_HUGEPAGE): with the common defrag=madvise setting that makes the
 * first touch compact memory synchronously, and a stall of 0.19 s for 64 MiB was measured here;
 * since spawns from outside the workers became records (sched.c), the slab holds only live
 * coroutines and stays small and hot. An idle server reserves one chunk. Magazines of 256
 * structs bound what a pool hoards. */
#define CORO_SLAB_CHUNK (2u << 20)
#define CORO_MAGAZINE 256u

struct coro_slab_chunk {
    struct coro_slab_chunk *next;
};

/* Chunks of freed slabs, kept for the next slab of the process (up to CORO_CHUNK_CACHE of them,
 * 64 MiB): a process that creates schedulers repeatedly (tests, benchmarks, a server restarted
 * in-process) reuses memory that is already faulted in instead of having the kernel zero fresh
 * pages again, which costs more than the spawns themselves. The price is that a process keeps
 * up to 64 MiB after its largest burst, like any allocator that does not return memory. */
#define CORO_CHUNK_CACHE 32u
static pthread_mutex_t coro_chunk_lock = PTHREAD_MUTEX_INITIALIZER;
static struct coro_slab_chunk *coro_chunk_cache; /* under coro_chunk_lock */
static unsigned coro_chunk_cached;               /* under coro_chunk_lock */

struct coro_magazine {
    struct coro_magazine *next_mag; /* overlays the first free struct of the magazine */
};

/* The depot: free stacks shared by the pools of a slab (the threads of one scheduler), in
 * magazines of CORO_STACK_MAG. It holds at most CORO_DEPOT_BYTES of stacks (address space; what
 * is resident is the pages their earlier coroutines touched), and every CORO_DEPOT_DECAY_NS it
 * unmaps as many magazines as it held throughout the period just ended (its low-water mark):
 * stacks nobody needed for a second. The decay is looked at when a magazine comes or goes (one
 * lock per magazine, no timer), and by a pool's idle trim (coro_pool_trim), which empties a depot
 * that no magazine entered or left for a period: without it, a server that goes quiet kept what
 * the depot held (up to CORO_DEPOT_BYTES) until its next burst. */
#define CORO_DEPOT_BYTES (32u << 20)
#define CORO_DEPOT_DECAY_NS 1000000000ull

struct coro_slab {
    pthread_mutex_t lock;
    unsigned refs;                  /* pools using this slab; under lock */
    struct coro_slab_chunk *chunks; /* under lock */
    struct coro *mags;              /* magazines: lists of CORO_MAGAZINE free structs; under lock */
    struct coro_stack *depot;       /* magazines of free stacks, through next_mag; under lock */
    unsigned depot_mags;            /* magazines in the depot; written under lock, see below */
    unsigned depot_low;             /* fewest magazines held since depot_mark; under lock */
    unsigned depot_max;             /* the bound, in magazines (0: no depot); set at creation */
    size_t depot_stack_size;        /* the stack size the depot takes (its first pool's) */
    uint64_t depot_mark;            /* CLOCK_MONOTONIC_COARSE ns of the last decay; under lock */
    uint64_t depot_moved; /* the same clock when a magazine last came or went; under lock */
};

struct coro_pool {
    struct coro_slab *slab;
    struct coro *free_structs; /* linked through node.next */
    unsigned n_free_structs;
    char *carve, *carve_end; /* the unused tail of this pool's current chunk */
    /* Free stacks: free_stacks, those used since the pool's last trim (their pages hold what
     * their coroutines touched), taken first; clean_stacks, those the last trim kept with their
     * pages given back (at most CORO_STACK_MAG). n_free_stacks counts both, n_clean the second:
     * the fast paths touch only free_stacks, and an empty free_stacks tells coro_pool_trim_due
     * that nothing was used since the trim. */
    struct coro_stack *free_stacks, *clean_stacks;
    unsigned n_free_stacks, n_clean, max_free_stacks;
    size_t stack_size; /* usable bytes, page multiple */
    size_t page;
};

/* ---- per-thread state for the overflow handler and nesting ---- */

/* The stack of the coroutine running on this thread (NULL on the thread's own stack). Read by
 * the SIGSEGV handler, which runs on the same thread. */
static __thread struct coro_stack *coro_tls_running;

/* The address of this thread's coro_tls_running, computed afresh on every call: a coroutine
 * that resumes another may itself have moved to another thread since its last call, and a
 * compiler may otherwise reuse a thread-local address computed before the move (see
 * sched_self() in sched.c for the full story). */
static NOINLINE struct coro_stack **coro_tls_running_slot(void)
{
    struct coro_stack **slot = &coro_tls_running;
    __asm__ volatile("" : "+r"(slot));
    return slot;
}

/* Process-wide budget of guarded stacks, counted in mappings (two per guarded stack). */
static long coro_guard_budget = -1; /* set once under coro_once */
static long coro_guard_used;        /* atomic */
static int coro_guard_warned;       /* atomic */
static pthread_once_t coro_once = PTHREAD_ONCE_INIT;
static struct sigaction coro_old_segv;

static const uint64_t coro_canary = 0x6379736572766521ull; /* "cyserve!" */

/* Stacks mapped and unmapped since the process started (coro_stack_counts). */
static uint64_t coro_stacks_mapped, coro_stacks_unmapped; /* atomic */

/* Between the two loads of coro_stack_counts: nothing, but where a test (tests/c/test_coro.c)
 * maps and unmaps a stack, as another thread may do there at any time. */
#ifndef CORO_COUNTS_GAP
#define CORO_COUNTS_GAP() ((void)0)
#endif

void coro_stack_counts(uint64_t *mapped, uint64_t *unmapped)
{
    /* safety: unmapped is read first, with acquire, then mapped: mapped less unmapped (the
     * metrics' gauge of stacks mapped now) is then never below the true count at either load,
     * and never below 0. A stack is counted mapped before it is published to any coroutine or
     * thread, so its mapped increment happens before its unmapped one (coro_stack_unmap, a
     * release; the counter changes only by read-modify-writes, so each later one continues
     * that release sequence). Every unmap this acquire load counts is thus counted in the
     * mapped read after it, which may count more maps, never fewer: the gauge may be above the
     * truth by the stacks mapped between the two loads, not below it. Read the other way
     * round, a stack mapped and unmapped between the loads was counted unmapped, not mapped,
     * and the gauge dipped below the truth (tests/c/test_coro.c, test_stack_counts). */
    *unmapped = __atomic_load_n(&coro_stacks_unmapped, __ATOMIC_ACQUIRE);
    CORO_COUNTS_GAP();
    *mapped = __atomic_load_n(&coro_stacks_mapped, __ATOMIC_RELAXED);
}

static void coro_write_stderr(const char *msg)
{
    size_t len = strlen(msg);
    while (len > 0) {
        ssize_t n = write(2, msg, len);
        if (n <= 0)
            return;
        msg += n;
        len -= (size_t)n;
    }
}

static void coro_segv_handler(int sig, siginfo_t *info, void *uctx)
{
    struct coro_stack *st = coro_tls_running;
    char *addr = info->si_addr;
    /* A frame larger than the guard page may jump past it; accept faults up to 64 KiB below
     * the usable stack, which is still inside (or just below) this stack's reservation. */
    if (st && st->guarded && addr < st->lo && addr >= st->map - 65536) {
        coro_write_stderr("cyserve: coroutine stack overflow (fault on the guard page)\n");
        signal(SIGSEGV, SIG_DFL);
        return; /* the faulting access repeats and the default action kills the process */
    }
    /* Not ours: give the previous handler its fault back by reinstalling it; the access repeats. */
    sigaction(SIGSEGV, &coro_old_segv, NULL);
}

static void coro_init_once(void)
{
    long max_maps = 65530;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
        if (fscanf(f, "%ld", &max_maps) != 1)
            max_maps = 65530;
        fclose(f);
    }
    coro_guard_budget = max_maps / 4;

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = coro_segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &coro_old_segv);
}

/* The alternate signal stack, so that the overflow handler can run when a coroutine stack is
 * exhausted, belongs to the thread, not to a pool: a pool may be freed on another thread than the
 * one that made it (the server is stopped from a helper thread while the main thread, which made
 * the scheduler, goes on taking SIGINT on that stack, SA_ONSTACK being Python's choice too).
 * Unmapping it from the pool once crashed the next Ctrl-C. So a thread keeps the stack we gave
 * it until it exits (a key destructor, which runs on that thread, takes it down); the main thread
 * keeps its 64 KiB for the life of the process. */
#define CORO_ALTSTACK_SIZE (64 * 1024)
static pthread_key_t coro_altstack_key;
static pthread_once_t coro_altstack_once = PTHREAD_ONCE_INIT;

static void coro_altstack_release(void *mem)
{
    stack_t cur;
    if (sigaltstack(NULL, &cur) == 0 && cur.ss_sp == mem && !(cur.ss_flags & SS_DISABLE)) {
        stack_t off = {.ss_sp = NULL, .ss_size = 0, .ss_flags = SS_DISABLE};
        if (sigaltstack(&off, NULL) != 0)
            return; /* still in use (we are on it): leak it rather than pull it away */
    }
    munmap(mem, CORO_ALTSTACK_SIZE);
}

static void coro_altstack_key_init(void)
{
    if (pthread_key_create(&coro_altstack_key, coro_altstack_release) != 0)
        coro_altstack_key = (pthread_key_t)-1;
}

/* Give the calling thread an alternate signal stack unless it has one (ours or anybody's). */
static void coro_install_altstack(void)
{
    pthread_once(&coro_altstack_once, coro_altstack_key_init);
    stack_t cur;
    if (sigaltstack(NULL, &cur) == 0 && !(cur.ss_flags & SS_DISABLE))
        return;
    void *mem = mmap(NULL, CORO_ALTSTACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (UNLIKELY(mem == MAP_FAILED))
        return;
    stack_t ss = {.ss_sp = mem, .ss_size = CORO_ALTSTACK_SIZE, .ss_flags = 0};
    if (UNLIKELY(sigaltstack(&ss, NULL) != 0)) {
        munmap(mem, CORO_ALTSTACK_SIZE);
        return;
    }
    /* Without a key (it could not be made) the stack simply stays for the life of the thread's
     * mapping, which is the process's. */
    if (coro_altstack_key != (pthread_key_t)-1)
        pthread_setspecific(coro_altstack_key, mem);
}

/* ---- pools ---- */

/* The free stacks a pool of stacks of this size caches by default: 8 MiB of them, at least 4.
 * Enough to absorb bursts of short coroutines without a syscall, little enough to matter
 * nothing next to a worker's RSS. */
static unsigned coro_cache_default(size_t stack_size)
{
    unsigned n = (unsigned)((8u << 20) / stack_size);
    return n < 4 ? 4 : n;
}

static int coro_pool_create(struct coro_pool **out, size_t stack_size, struct coro_slab *slab)
{
    if (stack_size < CORO_STACK_MIN || stack_size > CORO_STACK_MAX)
        return -EINVAL;
    pthread_once(&coro_once, coro_init_once);
    struct coro_pool *pool = calloc(1, sizeof(*pool));
    if (UNLIKELY(!pool))
        return -ENOMEM;
    pool->page = (size_t)sysconf(_SC_PAGESIZE);
    pool->stack_size = (stack_size + pool->page - 1) & ~(pool->page - 1);
    pool->max_free_stacks = coro_cache_default(pool->stack_size);
    if (slab) {
        pthread_mutex_lock(&slab->lock);
        slab->refs++;
        pthread_mutex_unlock(&slab->lock);
    } else {
        slab = calloc(1, sizeof(*slab));
        if (UNLIKELY(!slab)) {
            free(pool);
            return -ENOMEM;
        }
        pthread_mutex_init(&slab->lock, NULL);
        slab->refs = 1;
        slab->depot_stack_size = pool->stack_size;
        slab->depot_max = (unsigned)(CORO_DEPOT_BYTES / (pool->stack_size * CORO_STACK_MAG));
    }
    pool->slab = slab;
    coro_install_altstack();
    *out = pool;
    return 0;
}

int coro_pool_new(struct coro_pool **out, size_t stack_size)
{
    return coro_pool_create(out, stack_size, NULL);
}

int coro_pool_new_shared(struct coro_pool **out, size_t stack_size, struct coro_pool *share)
{
    return coro_pool_create(out, stack_size, share->slab);
}

size_t coro_pool_stack_size(const struct coro_pool *pool)
{
    return pool->stack_size;
}

void coro_pool_set_cache(struct coro_pool *pool, unsigned stacks)
{
    if (stacks < CORO_STACK_MAG)
        stacks = CORO_STACK_MAG; /* the least that spills a magazine to the depot */
    /* Never more than the default: for stacks of over 256 KiB a magazine is more than 8 MiB, and
     * the pool then keeps its default, smaller than a magazine, unmapping what is beyond it as a
     * worker's pool of that size does (coro_stack_put). */
    unsigned dflt = coro_cache_default(pool->stack_size);
    pool->max_free_stacks = stacks < dflt ? stacks : dflt;
}

static void coro_stack_unmap(struct coro_stack *st)
{
    if (st->guarded)
        /* safety: a plain counter of mappings; relaxed is enough for a budget. */
        __atomic_fetch_sub(&coro_guard_used, 2, __ATOMIC_RELAXED);
    /* safety: an event counter, released so that coro_stack_counts, which acquires it, sees
     * this stack's mapped increment (made before the stack was published) too. */
    __atomic_fetch_add(&coro_stacks_unmapped, 1, __ATOMIC_RELEASE);
    munmap(st->map, st->map_size);
}

/* Unmap every stack of a chain of magazines (through next_mag, each a list through next). */
static void coro_unmap_mags(struct coro_stack *mags)
{
    while (mags) {
        struct coro_stack *st = mags;
        mags = mags->next_mag;
        while (st) {
            struct coro_stack *next = st->next;
            coro_stack_unmap(st);
            st = next;
        }
    }
}

static uint64_t coro_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The depot's clock. A test that includes this file may define CORO_CLOCK_NS() first (e.g. as
 * coro_coarse_ns() plus an offset it moves), to pass periods without sleeping through them. */
#ifndef CORO_CLOCK_NS
#define CORO_CLOCK_NS() coro_coarse_ns()
#endif

/* Set the depot's magazine count. Under slab->lock; the count is also read without the lock, as
 * a hint, by coro_pool_trim_due, hence the atomic store. */
static void coro_depot_count(struct coro_slab *slab, unsigned n)
{
    /* safety: every write is under slab->lock, which orders them; the relaxed atomic store only
     * lets coro_pool_trim_due read a whole value without the lock (a stale one costs a park
     * with or without a timeout, nothing else). */
    __atomic_store_n(&slab->depot_mags, n, __ATOMIC_RELAXED);
}

/* Under slab->lock. Once a period has passed since the last decay, take out of the depot as many
 * magazines as it held throughout that period, and return them (through next_mag) for the
 * caller to unmap after it unlocks. `now` was read before the lock was taken, so it can be
 * older than the mark that another thread, which read the clock later but took the lock first,
 * has just set: that is no period passed (unsigned, the difference would be 2^64 less a few
 * milliseconds, and the depot, its low-water mark just reset to its count, would be emptied
 * whole and its mark moved back). */
static struct coro_stack *coro_depot_decay_locked(struct coro_slab *slab, uint64_t now)
{
    if ((int64_t)(now - slab->depot_mark) < (int64_t)CORO_DEPOT_DECAY_NS)
        return NULL;
    struct coro_stack *drop = NULL;
    for (unsigned n = slab->depot_low; n > 0 && slab->depot; n--) {
        struct coro_stack *mag = slab->depot;
        slab->depot = mag->next_mag;
        coro_depot_count(slab, slab->depot_mags - 1);
        mag->next_mag = drop;
        drop = mag;
    }
    slab->depot_mark = now;
    slab->depot_low = slab->depot_mags;
    return drop;
}

/* Give a magazine (CORO_STACK_MAG stacks of pool's size, through next) to the depot, or unmap
 * it if the depot is full or takes another size. */
static NOINLINE void coro_depot_put(struct coro_pool *pool, struct coro_stack *mag)
{
    struct coro_slab *slab = pool->slab;
    uint64_t now = CORO_CLOCK_NS();
    pthread_mutex_lock(&slab->lock);
    struct coro_stack *drop = coro_depot_decay_locked(slab, now);
    if (slab->depot_stack_size == pool->stack_size && slab->depot_mags < slab->depot_max) {
        mag->next_mag = slab->depot;
        slab->depot = mag;
        coro_depot_count(slab, slab->depot_mags + 1);
        slab->depot_moved = now;
        mag = NULL;
    }
    pthread_mutex_unlock(&slab->lock);
    if (mag) {
        mag->next_mag = drop;
        drop = mag;
    }
    coro_unmap_mags(drop);
}

/* A magazine from the depot (CORO_STACK_MAG stacks through next), or NULL if it has none. */
static NOINLINE struct coro_stack *coro_depot_take(struct coro_pool *pool)
{
    struct coro_slab *slab = pool->slab;
    uint64_t now = CORO_CLOCK_NS();
    pthread_mutex_lock(&slab->lock);
    struct coro_stack *drop = coro_depot_decay_locked(slab, now);
    struct coro_stack *mag = NULL;
    if (slab->depot && slab->depot_stack_size == pool->stack_size) {
        mag = slab->depot;
        slab->depot = mag->next_mag;
        coro_depot_count(slab, slab->depot_mags - 1);
        slab->depot_moved = now;
        if (slab->depot_mags < slab->depot_low)
            slab->depot_low = slab->depot_mags;
    }
    pthread_mutex_unlock(&slab->lock);
    coro_unmap_mags(drop);
    return mag;
}

/* Take CORO_STACK_MAG stacks out of the pool's cache (which holds at least that many), the clean
 * ones first (a clean stack is one that nobody used since the last trim, so the least wanted),
 * and give them to the depot. */
static void coro_pool_spill(struct coro_pool *pool)
{
    struct coro_stack *mag = NULL;
    for (unsigned i = 0; i < CORO_STACK_MAG; i++) {
        struct coro_stack *st;
        if (pool->clean_stacks) {
            st = pool->clean_stacks;
            pool->clean_stacks = st->next;
            pool->n_clean--;
        } else {
            st = pool->free_stacks;
            pool->free_stacks = st->next;
        }
        st->next = mag;
        mag = st;
    }
    pool->n_free_stacks -= CORO_STACK_MAG;
    coro_depot_put(pool, mag);
}

/* Give back the pages of a free stack (madvise MADV_DONTNEED) but its top one, which holds the
 * header; an unguarded stack's canary is written again. */
static void coro_stack_clean(struct coro_pool *pool, struct coro_stack *st)
{
    uintptr_t top = (uintptr_t)st->hi & ~(uintptr_t)(pool->page - 1);
    if (top > (uintptr_t)st->lo)
        /* Best effort: on failure the pages stay, as they were. */
        (void)madvise(st->lo, top - (uintptr_t)st->lo, MADV_DONTNEED);
    if (!st->guarded)
        memcpy(st->lo, &coro_canary, sizeof(coro_canary));
}

int coro_pool_trim_due(const struct coro_pool *pool)
{
    /* safety: a hint read without the lock (coro_depot_count). A depot that fills after this
     * read was filled by a thread that used stacks, whose own next park sees them. */
    return pool->free_stacks != NULL ||
           __atomic_load_n(&pool->slab->depot_mags, __ATOMIC_RELAXED) != 0;
}

unsigned coro_pool_trim(struct coro_pool *pool, unsigned keep)
{
    unsigned unmapped = 0;
    if (keep > CORO_STACK_MAG)
        keep = CORO_STACK_MAG;
    /* Clean stacks past keep (a caller that keeps fewer than last time). */
    while (pool->n_clean > keep) {
        struct coro_stack *st = pool->clean_stacks;
        pool->clean_stacks = st->next;
        pool->n_clean--;
        coro_stack_unmap(st);
        unmapped++;
    }
    /* The stacks used since the last trim: clean as many as keep leaves room for, unmap the
     * rest. */
    while (pool->free_stacks) {
        struct coro_stack *st = pool->free_stacks;
        pool->free_stacks = st->next;
        if (pool->n_clean < keep) {
            coro_stack_clean(pool, st);
            st->next = pool->clean_stacks;
            pool->clean_stacks = st;
            pool->n_clean++;
        } else {
            coro_stack_unmap(st);
            unmapped++;
        }
    }
    pool->n_free_stacks = pool->n_clean;
    /* The depot: empty it if no magazine came or went for a whole period (every stack in it was
     * then unused that long); otherwise those who move them decay it. */
    struct coro_slab *slab = pool->slab;
    struct coro_stack *drop = NULL;
    uint64_t now = CORO_CLOCK_NS();
    pthread_mutex_lock(&slab->lock);
    if (slab->depot && now >= slab->depot_moved + CORO_DEPOT_DECAY_NS) {
        drop = slab->depot;
        slab->depot = NULL;
        unmapped += slab->depot_mags * CORO_STACK_MAG;
        coro_depot_count(slab, 0);
        slab->depot_low = 0;
        slab->depot_mark = now;
    }
    pthread_mutex_unlock(&slab->lock);
    coro_unmap_mags(drop);
    return unmapped;
}

/* Hand the pool's free structs back to the slab as magazines (the pool is going away). */
static void coro_pool_return_structs(struct coro_pool *pool)
{
    struct coro_slab *slab = pool->slab;
    while (pool->free_structs) {
        struct coro *head = pool->free_structs, *cur = head;
        unsigned n = 1;
        while (n < CORO_MAGAZINE && cur->node.next) {
            cur = cur->node.next;
            n++;
        }
        pool->free_structs = cur->node.next;
        cur->node.next = NULL;
        pthread_mutex_lock(&slab->lock);
        head->node.prev = slab->mags; /* magazines are chained through the head's prev */
        slab->mags = head;
        pthread_mutex_unlock(&slab->lock);
    }
    pool->n_free_structs = 0;
}

void coro_pool_free(struct coro_pool *pool)
{
    if (!pool)
        return;
    /* The cached stacks go to the depot for the slab's other pools (a relief thread that exits
     * leaves its stacks to the workers); the depot unmaps what it has no room for. */
    while (pool->n_free_stacks >= CORO_STACK_MAG)
        coro_pool_spill(pool);
    struct coro_stack *lists[2] = {pool->free_stacks, pool->clean_stacks};
    for (unsigned i = 0; i < 2; i++) {
        while (lists[i]) {
            struct coro_stack *st = lists[i];
            lists[i] = st->next;
            coro_stack_unmap(st);
        }
    }
    pool->free_stacks = pool->clean_stacks = NULL;
    pool->n_free_stacks = pool->n_clean = 0;
    coro_pool_return_structs(pool);
    struct coro_slab *slab = pool->slab;
    pthread_mutex_lock(&slab->lock);
    unsigned refs = --slab->refs;
    pthread_mutex_unlock(&slab->lock);
    if (refs == 0) {
        coro_unmap_mags(slab->depot);
        slab->depot = NULL;
        while (slab->chunks) {
            struct coro_slab_chunk *c = slab->chunks;
            slab->chunks = c->next;
            pthread_mutex_lock(&coro_chunk_lock);
            if (coro_chunk_cached < CORO_CHUNK_CACHE) {
                c->next = coro_chunk_cache;
                coro_chunk_cache = c;
                coro_chunk_cached++;
                c = NULL;
            }
            pthread_mutex_unlock(&coro_chunk_lock);
            if (c)
                munmap(c, CORO_SLAB_CHUNK);
        }
        pthread_mutex_destroy(&slab->lock);
        free(slab);
    }
    free(pool);
}

static size_t coro_struct_size(void)
{
    return (sizeof(struct coro) + 15) & ~(size_t)15;
}

/* Make mem (a chunk) the pool's carving chunk and carve the first struct. */
static struct coro *coro_struct_use_chunk(struct coro_pool *pool, char *mem)
{
    struct coro_slab *slab = pool->slab;
    struct coro_slab_chunk *chunk = (struct coro_slab_chunk *)(void *)mem;
    pthread_mutex_lock(&slab->lock);
    chunk->next = slab->chunks;
    slab->chunks = chunk;
    pthread_mutex_unlock(&slab->lock);
    pool->carve = mem + 64;
    pool->carve_end = mem + CORO_SLAB_CHUNK;
    struct coro *co = (struct coro *)(void *)pool->carve;
    pool->carve += coro_struct_size();
    return co;
}

static NOINLINE struct coro *coro_struct_refill(struct coro_pool *pool)
{
    struct coro_slab *slab = pool->slab;
    size_t sz = coro_struct_size();
    if ((size_t)(pool->carve_end - pool->carve) >= sz) {
        struct coro *co = (struct coro *)(void *)pool->carve;
        pool->carve += sz;
        return co;
    }
    pthread_mutex_lock(&slab->lock);
    struct coro *mag = slab->mags;
    if (mag)
        slab->mags = mag->node.prev;
    pthread_mutex_unlock(&slab->lock);
    if (mag) {
        /* Count exactly: a pool being freed may hand back a short last magazine. */
        unsigned n = 0;
        for (struct coro *c = mag->node.next; c; c = c->node.next)
            n++;
        pool->free_structs = mag->node.next;
        pool->n_free_structs = n;
        return mag;
    }
    /* A fresh chunk. mmap rather than malloc: the chunk is page-aligned, zero-filled lazily and
     * returned to the kernel as a whole when the slab goes away. */
    pthread_mutex_lock(&coro_chunk_lock);
    struct coro_slab_chunk *cached = coro_chunk_cache;
    if (cached) {
        coro_chunk_cache = cached->next;
        coro_chunk_cached--;
    }
    pthread_mutex_unlock(&coro_chunk_lock);
    if (cached)
        return coro_struct_use_chunk(pool, (char *)cached);
    char *raw = mmap(NULL, 2 * (size_t)CORO_SLAB_CHUNK, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (UNLIKELY(raw == MAP_FAILED))
        return NULL;
    /* Keep the 2 MiB-aligned 2 MiB inside the 4 MiB reservation, give the rest back. */
    char *mem = (char *)(((uintptr_t)raw + CORO_SLAB_CHUNK - 1) &
                         ~(uintptr_t)(CORO_SLAB_CHUNK - 1));
    if (mem > raw)
        munmap(raw, (size_t)(mem - raw));
    if (raw + 2 * (size_t)CORO_SLAB_CHUNK > mem + CORO_SLAB_CHUNK)
        munmap(mem + CORO_SLAB_CHUNK,
               (size_t)(raw + 2 * (size_t)CORO_SLAB_CHUNK - (mem + CORO_SLAB_CHUNK)));
    return coro_struct_use_chunk(pool, mem);
}

static void coro_struct_put(struct coro_pool *pool, struct coro *co)
{
    co->node.next = pool->free_structs;
    pool->free_structs = co;
    if (UNLIKELY(++pool->n_free_structs >= 2 * CORO_MAGAZINE)) {
        /* Give the oldest magazine's worth back: walk CORO_MAGAZINE structs and cut there. */
        struct coro *cut = pool->free_structs;
        for (unsigned i = 1; i < CORO_MAGAZINE; i++)
            cut = cut->node.next;
        struct coro *mag = cut->node.next;
        cut->node.next = NULL;
        struct coro *rest = pool->free_structs;
        pool->free_structs = mag;
        pool->n_free_structs -= CORO_MAGAZINE;
        pthread_mutex_lock(&pool->slab->lock);
        rest->node.prev = pool->slab->mags;
        pool->slab->mags = rest;
        pthread_mutex_unlock(&pool->slab->lock);
    }
}

struct coro *coro_new(struct coro_pool *pool, coro_fn fn, void *arg)
{
    struct coro *co = pool->free_structs;
    if (LIKELY(co)) {
        pool->free_structs = co->node.next;
        pool->n_free_structs--;
    } else {
        co = coro_struct_refill(pool);
        if (UNLIKELY(!co))
            return NULL;
    }
    /* Field by field rather than memset: the struct is mostly context storage that the first
     * resume writes anyway, and spawning is the hot path of the 500,000-coroutine benchmark. */
    co->node.next = NULL;
    co->node.prev = NULL;
    co->node.wait = NULL;
    co->node.home = -1;
    co->node.flags = 0;
    co->stack = NULL;
    co->fn = fn;
    co->arg = arg;
    co->arena = NULL;
    co->defers = NULL;
    co->data = NULL;
    co->state = CORO_NEW;
    co->transfer = 0;
    co->resume_value = 0;
    co->exit_value = 0;
#if defined(CYSERVE_ASAN)
    co->asan_fake = NULL;
#endif
#if defined(CYSERVE_TSAN)
    co->tsan_fiber = NULL;
#endif
    return co;
}

/* ---- stacks ---- */

static NOINLINE struct coro_stack *coro_stack_map(struct coro_pool *pool)
{
    size_t page = pool->page;
    size_t header = (sizeof(struct coro_stack) + 63) & ~(size_t)63;
    /* safety: a budget counter; a few stacks over budget in a race are harmless. */
    long used = __atomic_add_fetch(&coro_guard_used, 2, __ATOMIC_RELAXED);
    int guarded = used <= coro_guard_budget;
    if (!guarded) {
        __atomic_fetch_sub(&coro_guard_used, 2, __ATOMIC_RELAXED);
        /* safety: exchange makes exactly one thread print the warning. */
        if (!__atomic_exchange_n(&coro_guard_warned, 1, __ATOMIC_RELAXED))
            coro_write_stderr("cyserve: warning: guarded coroutine stacks exceed a quarter of "
                              "vm.max_map_count; new stacks use a canary instead of a guard "
                              "page\n");
    }
    size_t guard = guarded ? page : 0;
    size_t map_size = guard + pool->stack_size + page; /* + one page for the header */
    char *map = mmap(NULL, map_size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (UNLIKELY(map == MAP_FAILED)) {
        if (guarded)
            /* safety: undo our reservation in the budget counter. */
            __atomic_fetch_sub(&coro_guard_used, 2, __ATOMIC_RELAXED);
        return NULL;
    }
    if (guarded && UNLIKELY(mprotect(map, page, PROT_NONE) != 0)) {
        /* safety: undo our reservation in the budget counter. */
        __atomic_fetch_sub(&coro_guard_used, 2, __ATOMIC_RELAXED);
        munmap(map, map_size);
        return NULL;
    }
    /* safety: an event counter (coro_stack_counts). */
    __atomic_fetch_add(&coro_stacks_mapped, 1, __ATOMIC_RELAXED);
    struct coro_stack *st = (struct coro_stack *)(void *)(map + map_size - header);
    st->next = NULL;
    st->next_mag = NULL;
    st->map = map;
    st->map_size = map_size;
    st->lo = map + guard;
    st->hi = (char *)st;
    st->guarded = guarded;
    if (!guarded)
        memcpy(st->lo, &coro_canary, sizeof(coro_canary));
    return st;
}

static struct coro_stack *coro_stack_get(struct coro_pool *pool)
{
    struct coro_stack *st = pool->free_stacks;
    if (LIKELY(st)) {
        pool->free_stacks = st->next;
        pool->n_free_stacks--;
        return st;
    }
    st = pool->clean_stacks;
    if (st) {
        /* One the last trim kept: its pages fault in afresh as its coroutine touches them. */
        pool->clean_stacks = st->next;
        pool->n_clean--;
        pool->n_free_stacks--;
        return st;
    }
    st = coro_depot_take(pool);
    if (st) {
        pool->free_stacks = st->next;
        pool->n_free_stacks = CORO_STACK_MAG - 1;
        st->next = NULL;
        return st;
    }
    return coro_stack_map(pool);
}

static void coro_stack_put(struct coro_pool *pool, struct coro_stack *st)
{
#if defined(CYSERVE_ASAN)
    /* A cancelled coroutine leaves its frames' redzones poisoned; the next user must not trip on
     * them. */
    __asan_unpoison_memory_region(st->lo, (size_t)(st->hi - st->lo));
#endif
    if (UNLIKELY(st->map_size - (size_t)(st->lo - st->map) - pool->page != pool->stack_size)) {
        /* A stack of another size (a pool of another scheduler). */
        coro_stack_unmap(st);
        return;
    }
    if (UNLIKELY(pool->n_free_stacks >= pool->max_free_stacks &&
                 pool->max_free_stacks < CORO_STACK_MAG)) {
        /* A full cache too small to spill a magazine from (stacks of over 256 KiB). */
        coro_stack_unmap(st);
        return;
    }
    st->next = pool->free_stacks;
    pool->free_stacks = st;
    if (UNLIKELY(++pool->n_free_stacks > pool->max_free_stacks))
        coro_pool_spill(pool);
}

void coro_stack_trim(struct coro *co)
{
    struct coro_stack *st = co->stack;
    char here;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)st->lo; /* page-aligned: the mapping's start or its guard's end */
    uintptr_t hi = ((uintptr_t)&here & ~(page - 1)) - page;
    if (hi <= lo || hi > (uintptr_t)st->hi)
        return;
    /* Best effort: on failure the pages stay, as they were. */
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
    if (!st->guarded)
        memcpy(st->lo, &coro_canary, sizeof(coro_canary));
}

static void coro_check_canary(struct coro *co)
{
    if (LIKELY(co->stack->guarded))
        return;
    if (UNLIKELY(memcmp(co->stack->lo, &coro_canary, sizeof(coro_canary)) != 0)) {
        coro_write_stderr("cyserve: coroutine stack overflow (canary smashed)\n");
        abort();
    }
}

/* ---- switching ---- */

static void coro_main(struct coro *co);

#if defined(CORO_USE_UCONTEXT)
static void coro_ucontext_entry(unsigned hi, unsigned lo)
{
    coro_main((struct coro *)(((uintptr_t)hi << 32) | (uintptr_t)lo));
}
#endif

static void coro_prepare(struct coro *co)
{
    char *top = (char *)((uintptr_t)co->stack->hi & ~(uintptr_t)15);
#if defined(CORO_USE_UCONTEXT)
    getcontext(&co->ctx);
    co->ctx.uc_stack.ss_sp = co->stack->lo;
    co->ctx.uc_stack.ss_size = (size_t)(top - co->stack->lo);
    co->ctx.uc_link = NULL;
    uintptr_t p = (uintptr_t)co;
    makecontext(&co->ctx, (void (*)(void))coro_ucontext_entry, 2, (unsigned)(p >> 32),
                (unsigned)(p & 0xffffffffu));
#elif defined(__x86_64__)
    /* The frame coro_switch_ctx pops (see the table in coro_switch_x86_64.S): MXCSR/x87 word,
     * r15, r14, r13 = entry, r12 = co, rbx, rbp = 0, return address = trampoline. After the
     * final ret the stack pointer is `top`, 16-byte aligned. The new coroutine starts with the
     * floating-point control state of the thread that first resumes it. */
    uint64_t *f = (uint64_t *)(void *)top - 8;
    uint32_t mxcsr;
    uint16_t fpucw;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
    f[0] = (uint64_t)mxcsr | ((uint64_t)fpucw << 32);
    f[1] = 0;
    f[2] = 0;
    f[3] = (uint64_t)(uintptr_t)coro_main;
    f[4] = (uint64_t)(uintptr_t)co;
    f[5] = 0;
    f[6] = 0;
    f[7] = (uint64_t)(uintptr_t)coro_trampoline;
    co->sp = f;
#elif defined(__aarch64__)
    /* 176-byte frame (see coro_switch_aarch64.S): x19 = co, x20 = entry, x29 = 0,
     * x30 = trampoline, d8-d15 = 0, FPCR = the resuming thread's. */
    uint64_t *f = (uint64_t *)(void *)(top - 176);
    memset(f, 0, 176);
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    f[0] = (uint64_t)(uintptr_t)co;
    f[1] = (uint64_t)(uintptr_t)coro_main;
    f[11] = (uint64_t)(uintptr_t)coro_trampoline;
    f[20] = fpcr;
    co->sp = f;
#else
#error "no context switch for this architecture: build with CORO_USE_UCONTEXT=1"
#endif
}

/* Switch from the resumer into co. */
static ALWAYS_INLINE void coro_switch_in(struct coro *co)
{
#if defined(CYSERVE_TSAN)
    co->tsan_caller = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(co->tsan_fiber, 0);
#endif
#if defined(CYSERVE_ASAN)
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, co->stack->lo, (size_t)(co->stack->hi - co->stack->lo));
#endif
#if defined(CORO_USE_UCONTEXT)
    swapcontext(&co->caller_ctx, &co->ctx);
#else
    coro_switch_ctx(&co->caller_sp, co->sp);
#endif
#if defined(CYSERVE_ASAN)
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

/* Switch from inside co back to its resumer. finished: co will never run again. */
static ALWAYS_INLINE void coro_switch_out(struct coro *co, int finished)
{
#if defined(CYSERVE_TSAN)
    __tsan_switch_to_fiber(co->tsan_caller, 0);
#endif
#if defined(CYSERVE_ASAN)
    __sanitizer_start_switch_fiber(finished ? NULL : &co->asan_fake, co->caller_bottom,
                                   co->caller_size);
#endif
#if defined(CORO_USE_UCONTEXT)
    swapcontext(&co->ctx, &co->caller_ctx);
#else
    coro_switch_ctx(&co->sp, co->caller_sp);
#endif
#if defined(CYSERVE_ASAN)
    /* Back inside co, resumed by (perhaps) another thread: learn the new resumer's stack. */
    __sanitizer_finish_switch_fiber(co->asan_fake, &co->caller_bottom, &co->caller_size);
#endif
}

static void coro_main(struct coro *co)
{
#if defined(CYSERVE_ASAN)
    __sanitizer_finish_switch_fiber(NULL, &co->caller_bottom, &co->caller_size);
#endif
    co->exit_value = co->fn(co, co->arg);
    co->state = CORO_DONE;
    co->transfer = CORO_FINISHED;
    coro_switch_out(co, 1);
    /* Not reached: a finished coroutine is never resumed. */
    abort();
}

static void coro_run_defers(struct coro *co)
{
    /* A deferred call may register another; keep popping until the list is empty. */
    while (co->defers) {
        struct coro_defer_rec *d = co->defers;
        co->defers = d->next;
        d->fn(d->arg);
    }
}

static void coro_free_arena(struct coro *co)
{
    while (co->arena) {
        struct coro_arena_chunk *c = co->arena;
        co->arena = c->next;
        free(c);
    }
}

/* Run defers, free the arena, give the stack back: co is done with all its resources. */
static void coro_release(struct coro *co, struct coro_pool *pool)
{
    coro_run_defers(co);
    coro_free_arena(co);
    if (co->stack) {
        coro_stack_put(pool, co->stack);
        co->stack = NULL;
    }
#if defined(CYSERVE_TSAN)
    if (co->tsan_fiber) {
        __tsan_destroy_fiber(co->tsan_fiber);
        co->tsan_fiber = NULL;
    }
#endif
}

int coro_resume(struct coro *co, struct coro_pool *pool)
{
    if (UNLIKELY(co->state == CORO_NEW)) {
        co->stack = coro_stack_get(pool);
        if (UNLIKELY(!co->stack))
            return -ENOMEM;
#if defined(CYSERVE_TSAN)
        co->tsan_fiber = __tsan_create_fiber(0);
#endif
        coro_prepare(co);
    }
    co->state = CORO_RUNNING;
    struct coro_stack **running = coro_tls_running_slot();
    struct coro_stack *outer = *running; /* resumes nest: restore the outer one */
    *running = co->stack;
    coro_switch_in(co);
    *running = outer; /* same thread: only co moved while we waited here */
    coro_check_canary(co);
    int value = co->transfer;
    if (value == CORO_FINISHED)
        coro_release(co, pool);
    else
        co->state = CORO_SUSPENDED;
    return value;
}

int coro_yield(struct coro *co, int value)
{
    co->transfer = value;
    coro_switch_out(co, 0);
    int r = co->resume_value;
    co->resume_value = 0;
    return r;
}

void coro_set_resume_value(struct coro *co, int value)
{
    co->resume_value = value;
}

void coro_free(struct coro *co, struct coro_pool *pool)
{
    if (!co)
        return;
    coro_release(co, pool);
    coro_struct_put(pool, co);
}

int coro_is_started(const struct coro *co)
{
    return co->state == CORO_RUNNING || co->state == CORO_SUSPENDED;
}

/* ---- arena and defers ---- */

void *coro_malloc(struct coro *co, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    struct coro_arena_chunk *c = co->arena;
    if (LIKELY(c && c->size - c->used >= size)) {
        void *p = c->data + c->used;
        c->used += size;
        return p;
    }
    /* A new chunk of 4 KiB, or exactly the request if it is bigger; the old chunk's tail is
     * wasted, which keeps the arena a simple bump allocator. */
    size_t cap = size > 4096 - sizeof(*c) ? size : 4096 - sizeof(*c);
    if (UNLIKELY(cap > SIZE_MAX - sizeof(*c)))
        return NULL;
    c = malloc(sizeof(*c) + cap);
    if (UNLIKELY(!c))
        return NULL;
    c->size = cap;
    c->used = size;
    c->next = co->arena;
    co->arena = c;
    return c->data;
}

int coro_defer(struct coro *co, void (*fn)(void *), void *arg)
{
    struct coro_defer_rec *d = coro_malloc(co, sizeof(*d));
    if (UNLIKELY(!d))
        return -ENOMEM;
    d->fn = fn;
    d->arg = arg;
    d->next = co->defers;
    co->defers = d;
    return 0;
}

int coro_exit_value(const struct coro *co)
{
    return co->exit_value;
}

void *coro_get_data(const struct coro *co)
{
    return co->data;
}

void coro_set_data(struct coro *co, void *data)
{
    co->data = data;
}
