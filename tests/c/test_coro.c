/* test_coro.c: unit tests of csrc/coro.c (switching, nesting, defers, arena, stacks, overflow). */
#include <stdint.h>

/* The depot's clock (coro.c's CORO_CLOCK_NS), which the tests move forward by whole periods
 * instead of sleeping through them, and which nothing else moves: on the real clock, a test
 * slowed past a period between two steps (ThreadSanitizer on a loaded machine did it) saw a
 * decay it did not make and counted magazines that were gone. It starts far from 0, where the
 * depot's first mark is, as the real clock does. */
static uint64_t test_clock_skew = 1000000000000ull;
#define CORO_CLOCK_NS() ((void)coro_coarse_ns, test_clock_skew) /* the real one, unused */
/* What coro_stack_counts does between its two loads (coro.c's CORO_COUNTS_GAP): nothing, but in
 * test_stack_counts, which maps and unmaps a stack there, as another thread may at any time. */
static void (*test_counts_gap)(void);
#define CORO_COUNTS_GAP() (test_counts_gap ? test_counts_gap() : (void)0)
#include "csrc/coro.c"

#include <sys/wait.h>

#include "tap.h"

static struct coro_pool *pool;

/* ---- switch and values ---- */

static int body_yield_three(struct coro *co, void *arg)
{
    int *seen = arg;
    seen[0] = coro_yield(co, 10);
    seen[1] = coro_yield(co, 20);
    seen[2] = coro_yield(co, 30);
    return 42;
}

static void test_switch(void)
{
    int seen[3] = {-1, -1, -1};
    struct coro *co = coro_new(pool, body_yield_three, seen);
    ok(co != NULL, "coro_new");
    ok(!coro_is_started(co), "not started before the first resume");
    is_int(coro_resume(co, pool), 10, "first yield value");
    ok(coro_is_started(co), "started after the first resume");
    coro_set_resume_value(co, 7);
    is_int(coro_resume(co, pool), 20, "second yield value");
    is_int(coro_resume(co, pool), 30, "third yield value");
    coro_set_resume_value(co, -110);
    is_int(coro_resume(co, pool), CORO_FINISHED, "finished");
    is_int(coro_exit_value(co), 42, "exit value");
    is_int(seen[0], 7, "resume value reaches coro_yield");
    is_int(seen[1], 0, "resume value resets to 0");
    is_int(seen[2], -110, "negative resume value");
    coro_free(co, pool);
}

/* ---- nesting ---- */

static int body_inner(struct coro *co, void *arg)
{
    int *log = arg;
    log[log[0]++ + 1] = 2;
    coro_yield(co, 5);
    log[log[0]++ + 1] = 4;
    return 0;
}

static int body_outer(struct coro *co, void *arg)
{
    int *log = arg;
    log[log[0]++ + 1] = 1;
    struct coro *inner = coro_new(pool, body_inner, log);
    int v = coro_resume(inner, pool);
    log[log[0]++ + 1] = 3;
    coro_yield(co, v * 10); /* must return to main, not to inner */
    v = coro_resume(inner, pool);
    log[log[0]++ + 1] = v == CORO_FINISHED ? 5 : -1;
    coro_free(inner, pool);
    return 0;
}

static void test_nested(void)
{
    int log[16] = {0};
    struct coro *co = coro_new(pool, body_outer, log);
    is_int(coro_resume(co, pool), 50, "outer yields inner's value to main");
    is_int(coro_resume(co, pool), CORO_FINISHED, "outer finishes");
    is_int(log[0], 5, "five steps");
    int in_order = 1;
    for (int i = 1; i <= 5; i++)
        in_order &= log[i] == i;
    ok(in_order, "nested resumes interleave in order");
    coro_free(co, pool);
}

/* ---- defers ---- */

struct defer_log {
    int order[8];
    int n;
};

static struct defer_log dlog;

static void record(void *arg)
{
    dlog.order[dlog.n++] = (int)(intptr_t)arg;
}

static void record_and_defer_more(void *arg)
{
    record(arg);
}

static int body_defers(struct coro *co, void *arg)
{
    coro_defer(co, record, (void *)1);
    coro_defer(co, record, (void *)2);
    coro_defer(co, record_and_defer_more, (void *)3);
    if (arg)
        coro_yield(co, 0);
    return 0;
}

static void test_defers(void)
{
    memset(&dlog, 0, sizeof(dlog));
    struct coro *co = coro_new(pool, body_defers, NULL);
    is_int(coro_resume(co, pool), CORO_FINISHED, "defer body finishes");
    is_int(dlog.n, 3, "three deferred calls ran on finish");
    ok(dlog.order[0] == 3 && dlog.order[1] == 2 && dlog.order[2] == 1, "defers run LIFO");
    coro_free(co, pool);

    memset(&dlog, 0, sizeof(dlog));
    co = coro_new(pool, body_defers, (void *)1);
    is_int(coro_resume(co, pool), 0, "suspended");
    is_int(dlog.n, 0, "no defer while suspended");
    unsigned free_before = pool->n_free_stacks;
    coro_free(co, pool);
    is_int(dlog.n, 3, "cancelling a suspended coroutine runs its defers");
    ok(dlog.order[0] == 3 && dlog.order[2] == 1, "cancel runs defers LIFO");
    is_int(pool->n_free_stacks, free_before + 1, "cancel gives the stack back");

    memset(&dlog, 0, sizeof(dlog));
    co = coro_new(pool, body_defers, NULL);
    coro_defer(co, record, (void *)9);
    coro_free(co, pool);
    is_int(dlog.n, 1, "freeing a never-run coroutine runs defers registered by its creator");
}

/* ---- arena ---- */

static int body_arena(struct coro *co, void *arg)
{
    int good = 1;
    unsigned char *ptrs[64];
    for (int i = 0; i < 64; i++) {
        size_t sz = (size_t)(i * 37 % 300) + 1;
        ptrs[i] = coro_malloc(co, sz);
        good &= ptrs[i] != NULL && ((uintptr_t)ptrs[i] & 15) == 0;
        memset(ptrs[i], i, sz);
    }
    for (int i = 0; i < 64; i++)
        good &= ptrs[i][0] == (unsigned char)i;
    unsigned char *big = coro_malloc(co, 100000);
    good &= big != NULL;
    memset(big, 0xab, 100000);
    good &= big[99999] == 0xab && ptrs[63][0] == 63;
    *(int *)arg = good;
    return 0;
}

static void test_arena(void)
{
    int good = 0;
    struct coro *co = coro_new(pool, body_arena, &good);
    is_int(coro_resume(co, pool), CORO_FINISHED, "arena body finishes");
    ok(good, "arena allocations are 16-byte aligned, distinct and usable (ASan checks the rest)");
    coro_free(co, pool);
}

/* ---- stacks ---- */

static int body_frame(struct coro *co, void *arg)
{
    *(uintptr_t *)arg = (uintptr_t)__builtin_frame_address(0);
    return 0;
}

static int body_align(struct coro *co, void *arg)
{
    /* A 16-byte aligned local forces the compiler to rely on the ABI's incoming alignment
     * only when it does not realign; the frame address checks the incoming rule directly. */
    uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
    *(int *)arg = (fp & 15) == 0;
    return 0;
}

static void test_stacks(void)
{
    uintptr_t a = 0, b = 0;
    struct coro *c1 = coro_new(pool, body_frame, &a);
    coro_resume(c1, pool);
    coro_free(c1, pool);
    struct coro *c2 = coro_new(pool, body_frame, &b);
    coro_resume(c2, pool);
    coro_free(c2, pool);
    ok(a != 0 && a == b, "a finished coroutine's stack is reused by the next one");

    int aligned = 0;
    struct coro *c3 = coro_new(pool, body_align, &aligned);
    coro_resume(c3, pool);
    coro_free(c3, pool);
    ok(aligned, "frame pointer is 16-byte aligned on entry (ABI stack alignment)");

    /* 20,000 coroutines created before any runs take no stack until they run. */
    enum { N = 20000 };
    static struct coro *many[N];
    unsigned stacks_before = pool->n_free_stacks;
    for (int i = 0; i < N; i++)
        many[i] = coro_new(pool, body_frame, &a);
    is_int(pool->n_free_stacks, stacks_before, "creating coroutines maps no stack");
    int all = 1;
    for (int i = 0; i < N; i++)
        all &= coro_resume(many[i], pool) == CORO_FINISHED;
    ok(all, "20,000 coroutines ran to the end");
    for (int i = 0; i < N; i++)
        coro_free(many[i], pool);
    is_int(pool->n_free_stacks, stacks_before, "and all shared one cached stack");
}

/* ---- the stack counters ---- */

/* One stack mapped and unmapped: a coroutine run on a pool of its own, whose free unmaps it. */
static void map_and_unmap_one(void)
{
    struct coro_pool *p;
    uintptr_t a = 0;
    if (coro_pool_new(&p, CORO_STACK_DEFAULT) != 0)
        return;
    struct coro *co = coro_new(p, body_frame, &a);
    coro_resume(co, p);
    coro_free(co, p);
    coro_pool_free(p);
}

/* The gauge of stacks mapped now (metrics' cyserve_coroutine_stacks) is mapped less unmapped,
 * two counters read one after the other while any thread may map or unmap. Read mapped first,
 * a stack mapped and unmapped between the two loads counted as unmapped but not as mapped: one
 * below the true count, which was the same before and after. */
static void test_stack_counts(void)
{
    uint64_t m0, u0, m, u, m1, u1;
    coro_stack_counts(&m0, &u0);
    test_counts_gap = map_and_unmap_one;
    coro_stack_counts(&m, &u);
    test_counts_gap = NULL;
    coro_stack_counts(&m1, &u1);
    ok(m1 - m0 == 1 && u1 - u0 == 1, "a stack was mapped and unmapped between the loads");
    long truth = (long)m0 - (long)u0, seen = (long)m - (long)u;
    ok(seen >= truth, "the gauge read meanwhile is not below the true count (%ld >= %ld)", seen,
       truth);
    ok(seen <= truth + 1, "and above it by the one stack at most (%ld)", seen);
}

/* ---- the depot of free stacks ---- */

/* Yields once, then finishes. */
static int body_yield_once(struct coro *co, void *arg)
{
    coro_yield(co, 1);
    return 0;
}

/* Start n coroutines with pool `start` (each yields once, holding its stack) and finish them
 * with pool `finish`: the shape of a Python call's coroutine under load, started by a worker and
 * finished by the relief thread whose batch ran the call. Returns the stacks mapped meanwhile. */
static uint64_t start_here_finish_there(struct coro_pool *start, struct coro_pool *finish,
                                        struct coro **cos, unsigned n)
{
    uint64_t mapped0, unmapped0, mapped1, unmapped1;
    coro_stack_counts(&mapped0, &unmapped0);
    for (unsigned i = 0; i < n; i++) {
        cos[i] = coro_new(start, body_yield_once, NULL);
        coro_resume(cos[i], start);
    }
    coro_stack_counts(&mapped1, &unmapped1);
    for (unsigned i = 0; i < n; i++) {
        while (coro_resume(cos[i], finish) != CORO_FINISHED)
            ;
        coro_free(cos[i], finish);
    }
    return mapped1 - mapped0;
}

/* Stacks held free by two pools and their depot (no coroutine holds one when this is read). */
static long stacks_held(struct coro_pool *p1, struct coro_pool *p2)
{
    return (long)p1->n_free_stacks + (long)p2->n_free_stacks +
           (long)p1->slab->depot_mags * CORO_STACK_MAG;
}

/* Stacks mapped and not unmapped since the counts m0, u0 were read. */
static long stacks_alive_since(uint64_t m0, uint64_t u0)
{
    uint64_t m, u;
    coro_stack_counts(&m, &u);
    return (long)(m - m0) - (long)(u - u0);
}

static void test_stack_depot(void)
{
    /* Two pools of one slab, as a worker's and a relief thread's (whose cache holds one
     * magazine). */
    struct coro_pool *worker, *relief;
    if (coro_pool_new(&worker, CORO_STACK_DEFAULT) != 0 ||
        coro_pool_new_shared(&relief, CORO_STACK_DEFAULT, worker) != 0) {
        ok(0, "pools for the depot test");
        return;
    }
    coro_pool_set_cache(relief, CORO_STACK_MAG);
    struct coro_slab *slab = worker->slab;
    uint64_t m0, u0;
    coro_stack_counts(&m0, &u0);
    enum { N = 300, BIG = 700 };
    static struct coro *cos[BIG];
    uint64_t first = start_here_finish_there(worker, relief, cos, N);
    is_int((long)first, N, "300 coroutines in flight map 300 stacks");
    ok(relief->n_free_stacks <= CORO_STACK_MAG,
       "the finishing pool keeps one magazine at most (%u)", relief->n_free_stacks);
    is_int(stacks_held(worker, relief), N, "and the depot holds the rest");
    /* Without the depot the relief pool kept 128 and unmapped the others, and the worker, whose
     * cache they never reached, mapped 300 again: an mmap, an mprotect and a munmap per
     * coroutine, as under many HTTP/2 streams waiting on Python calls. */
    uint64_t again = start_here_finish_there(worker, relief, cos, N);
    ok(again < CORO_STACK_MAG, "the same load again maps fewer than a magazine (%llu)",
       (unsigned long long)again);
    is_int(stacks_alive_since(m0, u0), stacks_held(worker, relief),
           "every stack mapped and not unmapped is held free by a pool or the depot");

    /* The depot is bounded: 700 stacks finished elsewhere fill it to its bound and the rest are
     * unmapped. */
    start_here_finish_there(worker, relief, cos, BIG);
    ok(slab->depot_mags == slab->depot_max, "700 fill the depot to its bound (%u of %u)",
       slab->depot_mags, slab->depot_max);
    is_int(stacks_alive_since(m0, u0), stacks_held(worker, relief),
           "and what it had no room for was unmapped");

    /* What the depot held unused for a whole period is unmapped: a depot operation after one
     * period sets the low-water mark (the depot's count then), the next one after another
     * period unmaps that many magazines. Moving the clock past the period makes it certain. */
    test_clock_skew += CORO_DEPOT_DECAY_NS + 50000000ull;
    is_int((long)worker->n_free_stacks, 0, "the worker's cache is empty");
    struct coro *co = coro_new(worker, body_yield_once, NULL);
    while (coro_resume(co, worker) != CORO_FINISHED)
        ; /* its stack is a magazine from the depot */
    coro_free(co, worker);
    is_int((long)slab->depot_mags, (long)slab->depot_max - 1, "a start took one magazine");
    test_clock_skew += CORO_DEPOT_DECAY_NS + 50000000ull;
    struct coro_stack *mag = coro_depot_take(worker);
    ok(mag == NULL, "a period later the magazines unused all period are gone (%u left)",
       slab->depot_mags);
    is_int(stacks_alive_since(m0, u0), stacks_held(worker, relief), "unmapped, not lost");
    coro_pool_free(relief);
    coro_pool_free(worker);
    is_int(stacks_alive_since(m0, u0), 0, "freeing the pools unmaps every stack they held");
}

/* coro_pool_set_cache only lowers a pool's bound: a relief thread's pool asks for one magazine
 * (32 stacks) so that its stacks go to the depot, which for stacks of up to 256 KiB is less
 * than the default (8 MiB of stacks), but for bigger ones would be more: 32 stacks of 1 MiB
 * kept by a thread that starts few coroutines, four times the default. Such a pool keeps its
 * default (8 here), as a worker's of that size does. */
static void test_stack_cache_bound(void)
{
    struct coro_pool *worker, *relief;
    size_t big = 1u << 20;
    if (coro_pool_new(&worker, big) != 0 || coro_pool_new_shared(&relief, big, worker) != 0) {
        ok(0, "pools of 1 MiB stacks");
        return;
    }
    unsigned dflt = relief->max_free_stacks;
    is_int(dflt, 8, "the default for 1 MiB stacks: 8 MiB of them");
    coro_pool_set_cache(relief, CORO_STACK_MAG);
    is_int(relief->max_free_stacks, dflt, "a magazine's worth is more: the default stays");
    enum { N = CORO_STACK_MAG };
    static struct coro *cos[N];
    uint64_t m0, u0;
    coro_stack_counts(&m0, &u0);
    start_here_finish_there(worker, relief, cos, N);
    ok(relief->n_free_stacks <= dflt, "32 finished there leave %u cached (at most %u)",
       relief->n_free_stacks, dflt);
    is_int(stacks_alive_since(m0, u0), stacks_held(worker, relief),
           "the others were unmapped, none lost");
    coro_pool_free(relief);
    coro_pool_free(worker);

    /* Stacks of 64 KiB: the default is 128, and the magazine's worth is the bound. */
    if (coro_pool_new(&worker, 64u << 10) != 0 ||
        coro_pool_new_shared(&relief, 64u << 10, worker) != 0) {
        ok(0, "pools of 64 KiB stacks");
        return;
    }
    coro_pool_set_cache(relief, CORO_STACK_MAG);
    is_int(relief->max_free_stacks, CORO_STACK_MAG, "64 KiB stacks: one magazine");
    coro_pool_free(relief);
    coro_pool_free(worker);
}

/* A thread reads the clock before it takes the slab's lock; another that read it a little later
 * can take the lock first and decay. The first thread's reading is then older than the mark:
 * no period has passed for it, and it must neither empty the depot nor move the mark back. */
static void test_stack_depot_stale_clock(void)
{
    struct coro_pool *worker, *relief;
    if (coro_pool_new(&worker, CORO_STACK_DEFAULT) != 0 ||
        coro_pool_new_shared(&relief, CORO_STACK_DEFAULT, worker) != 0) {
        ok(0, "pools for the stale clock test");
        return;
    }
    coro_pool_set_cache(relief, CORO_STACK_MAG);
    struct coro_slab *slab = worker->slab;
    enum { N = 4 * CORO_STACK_MAG };
    static struct coro *cos[N];
    start_here_finish_there(worker, relief, cos, N);
    unsigned held = slab->depot_mags;
    ok(held >= 2, "the depot holds magazines (%u)", held);
    /* The later thread's decay has just happened: the low-water mark is the depot's count. */
    uint64_t mark = CORO_CLOCK_NS();
    pthread_mutex_lock(&slab->lock);
    slab->depot_mark = mark;
    slab->depot_low = slab->depot_mags;
    struct coro_stack *drop = coro_depot_decay_locked(slab, mark - 4000000); /* 4 ms older */
    pthread_mutex_unlock(&slab->lock);
    ok(drop == NULL, "a clock read before the last decay unmaps nothing");
    coro_unmap_mags(drop);
    is_int((long)slab->depot_mags, (long)held, "the depot keeps its magazines");
    ok(slab->depot_mark == mark, "and its mark does not move back");
    /* A whole period after the mark, the magazines held all along do go. */
    pthread_mutex_lock(&slab->lock);
    drop = coro_depot_decay_locked(slab, mark + CORO_DEPOT_DECAY_NS);
    pthread_mutex_unlock(&slab->lock);
    coro_unmap_mags(drop);
    is_int((long)slab->depot_mags, 0, "a period later they are unmapped");
    coro_pool_free(relief);
    coro_pool_free(worker);
}

/* Two threads whose pools share a slab, each starting coroutines in rounds of more than its
 * cache holds and finishing them: stacks pass from one thread's pool to the other's through the
 * depot, under its mutex. Each coroutine leaves a token on its stack across a yield: a stack
 * handed to two live coroutines at once would show as a token overwritten. */
struct depot_thread {
    struct coro_pool *share; /* the pool whose slab to share */
    unsigned seed;
    long overwritten, ran;
    int failed;
};

static int body_token(struct coro *co, void *arg)
{
    volatile uintptr_t token = (uintptr_t)co ^ (uintptr_t)arg;
    volatile char fill[2048]; /* more of the stack in use, as a real handler's */
    fill[0] = (char)token;
    fill[sizeof(fill) - 1] = (char)(token >> 8);
    coro_yield(co, 1);
    return token != ((uintptr_t)co ^ (uintptr_t)arg) || fill[0] != (char)token ||
           fill[sizeof(fill) - 1] != (char)(token >> 8);
}

static void *depot_thread_main(void *arg)
{
    struct depot_thread *t = arg;
    struct coro_pool *mine;
    if (coro_pool_new_shared(&mine, CORO_STACK_DEFAULT, t->share) != 0) {
        t->failed = 1;
        return NULL;
    }
    enum { MOST = 400 };
    static __thread struct coro *cos[MOST];
    for (int round = 0; round < 60; round++) {
        t->seed = t->seed * 1103515245u + 12345u;
        unsigned n = 100 + (t->seed >> 8) % (MOST - 100);
        for (unsigned i = 0; i < n; i++) {
            cos[i] = coro_new(mine, body_token, t);
            if (!cos[i] || coro_resume(cos[i], mine) != 1) {
                t->failed = 1;
                return NULL;
            }
        }
        for (unsigned i = 0; i < n; i++) {
            if (coro_resume(cos[i], mine) != CORO_FINISHED) {
                t->failed = 1;
                return NULL;
            }
            t->overwritten += coro_exit_value(cos[i]);
            t->ran++;
            coro_free(cos[i], mine);
        }
    }
    coro_pool_free(mine);
    return NULL;
}

static void test_stack_depot_threads(void)
{
    struct coro_pool *base;
    if (coro_pool_new(&base, CORO_STACK_DEFAULT) != 0) {
        ok(0, "a pool for the threaded depot test");
        return;
    }
    uint64_t m0, u0;
    coro_stack_counts(&m0, &u0);
    struct depot_thread t[2] = {{.share = base, .seed = 1}, {.share = base, .seed = 2}};
    pthread_t tid[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&tid[i], NULL, depot_thread_main, &t[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(tid[i], NULL);
    ok(!t[0].failed && !t[1].failed, "two threads ran their rounds (%ld, %ld coroutines)", t[0].ran,
       t[1].ran);
    is_int(t[0].overwritten + t[1].overwritten, 0,
           "no stack was handed to two live coroutines at once");
    /* What the threads' pools held went to the depot when they were freed; the depot and the
     * base pool's cache hold every stack still mapped. */
    is_int(stacks_alive_since(m0, u0),
           (long)base->n_free_stacks + (long)base->slab->depot_mags * CORO_STACK_MAG,
           "the stacks still mapped are the depot's and the base pool's");
    coro_pool_free(base);
    is_int(stacks_alive_since(m0, u0), 0, "freeing the last pool unmaps them all");
}

/* ---- trimming a stack ---- */

/* Resident pages of [lo, hi), page-aligned. */
static size_t resident_pages(uintptr_t lo, uintptr_t hi)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (hi - lo) / page, count = 0;
    unsigned char vec[64];
    if (n > sizeof(vec) || mincore((void *)lo, hi - lo, vec) != 0)
        return (size_t)-1;
    for (size_t i = 0; i < n; i++)
        count += vec[i] & 1;
    return count;
}

/* Touches 40 KiB of stack below its caller (a deep call that came and went). */
static __attribute__((noinline)) void touch_deep(volatile char *sink)
{
    volatile char big[40 * 1024];
    for (size_t i = 0; i < sizeof(big); i += 512)
        big[i] = (char)i;
    *sink = big[sizeof(big) - 1];
}

struct trim_seen {
    size_t before, after, again;
    int guarded, canary_ok;
};

static int body_trim(struct coro *co, void *arg)
{
    struct trim_seen *t = arg;
    volatile char sink;
    char here;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)co->stack->lo, top = ((uintptr_t)&here & ~(page - 1)) - page;
    touch_deep(&sink);
    t->before = resident_pages(lo, top);
    coro_stack_trim(co);
    t->after = resident_pages(lo, top);
    t->guarded = co->stack->guarded;
    t->canary_ok = memcmp(co->stack->lo, &coro_canary, sizeof(coro_canary)) == 0;
    coro_yield(co, 0); /* a switch checks an unguarded stack's canary */
    touch_deep(&sink); /* the trimmed pages work again */
    t->again = resident_pages(lo, top);
    return 0;
}

static void trim_on(struct coro_pool *p, const char *kind)
{
    struct trim_seen t = {0, 0, 0, -1, 0};
    struct coro *co = coro_new(p, body_trim, &t);
    is_int(coro_resume(co, p), 0, "the trimming coroutine yielded");
    is_int(coro_resume(co, p), CORO_FINISHED, "and finished");
    coro_free(co, p);
    note("%s stack", kind);
    ok(t.before >= 8, "a deep call left its stack pages resident (%zu)", t.before);
    /* All of them; an unguarded stack's lowest page comes back with its canary. */
    is_int((long)t.after, t.guarded ? 0 : 1,
           "coro_stack_trim gave back every page below the caller's");
    ok(t.again >= 8, "and they are usable again (%zu resident)", t.again);
    if (!t.guarded)
        ok(t.canary_ok, "an unguarded stack has its canary back after the trim");
}

static void test_stack_trim(void)
{
    struct coro_pool *p;
    trim_on(pool, "a guarded");
    long budget = coro_guard_budget;
    int warned = coro_guard_warned;
    coro_guard_budget = 0; /* no guarded stacks: the new pool's stack gets a canary */
    if (coro_pool_new(&p, CORO_STACK_DEFAULT) == 0) {
        trim_on(p, "an unguarded");
        coro_pool_free(p);
    }
    coro_guard_budget = budget;
    coro_guard_warned = warned; /* test_overflow wants the one-time warning */
}

/* ---- an idle pool's trim ---- */

/* Touches 40 KiB of its stack, then waits once: a handler of a burst. */
static int body_deep_once(struct coro *co, void *arg)
{
    volatile char sink;
    touch_deep(&sink);
    coro_yield(co, 0);
    return 0;
}

/* Pages of a free stack resident below the page of its header. */
static size_t stack_resident(struct coro_pool *p, struct coro_stack *st)
{
    uintptr_t top = (uintptr_t)st->hi & ~(uintptr_t)(p->page - 1);
    return resident_pages((uintptr_t)st->lo, top);
}

/* Start a deep coroutine on start and run it to its end on finish. */
static void deep_once(struct coro_pool *start, struct coro_pool *finish)
{
    struct coro *co = coro_new(start, body_deep_once, NULL);
    coro_resume(co, start);
    while (coro_resume(co, finish) != CORO_FINISHED)
        ;
    coro_free(co, finish);
}

static void test_pool_idle_trim(void)
{
    struct coro_pool *worker, *relief;
    if (coro_pool_new(&worker, CORO_STACK_DEFAULT) != 0 ||
        coro_pool_new_shared(&relief, CORO_STACK_DEFAULT, worker) != 0) {
        ok(0, "pools for the idle trim test");
        return;
    }
    coro_pool_set_cache(relief, CORO_STACK_MAG);
    struct coro_slab *slab = worker->slab;
    uint64_t m0, u0;
    coro_stack_counts(&m0, &u0);
    ok(!coro_pool_trim_due(worker) && !coro_pool_trim_due(relief),
       "new pools have nothing to trim");

    /* A burst: 400 coroutines at once, each touching 40 KiB of its stack; half end where they
     * started, half on the other pool, as on a worker and a relief thread. */
    enum { N = 400 };
    static struct coro *cos[N];
    for (unsigned i = 0; i < N; i++) {
        cos[i] = coro_new(worker, body_deep_once, NULL);
        coro_resume(cos[i], worker);
    }
    for (unsigned i = 0; i < N; i++) {
        struct coro_pool *fin = i % 2 ? relief : worker;
        while (coro_resume(cos[i], fin) != CORO_FINISHED)
            ;
        coro_free(cos[i], fin);
    }
    unsigned worker_had = worker->n_free_stacks, mags = slab->depot_mags;
    ok(worker_had > CORO_STACK_MAG && mags > 0,
       "the burst left %u stacks in the worker's cache and %u magazines in the depot", worker_had,
       mags);
    ok(coro_pool_trim_due(worker) && coro_pool_trim_due(relief), "a trim is due in both pools");
    ok(stack_resident(worker, worker->free_stacks) >= 8, "a used stack has its pages (%zu)",
       stack_resident(worker, worker->free_stacks));

    /* The worker's trim, less than a period after the depot's last magazine moved. */
    is_int((long)coro_pool_trim(worker, CORO_STACK_MAG), (long)(worker_had - CORO_STACK_MAG),
           "a trim keeping a magazine unmaps the rest of the worker's cache");
    ok(worker->n_free_stacks == CORO_STACK_MAG && worker->n_clean == CORO_STACK_MAG &&
           worker->free_stacks == NULL,
       "and keeps that magazine, clean");
    size_t resident = 0;
    for (struct coro_stack *st = worker->clean_stacks; st; st = st->next)
        resident += stack_resident(worker, st);
    is_int((long)resident, 0, "with no page resident below the stacks' headers");
    is_int((long)slab->depot_mags, (long)mags, "a depot that moved within the period stays");
    ok(coro_pool_trim_due(worker), "so a trim is still due");
    is_int(stacks_alive_since(m0, u0), stacks_held(worker, relief), "unmapped, not lost");

    /* A period later, nobody having touched the depot, the other pool's trim empties it. */
    test_clock_skew += CORO_DEPOT_DECAY_NS;
    unsigned relief_had = relief->n_free_stacks;
    is_int((long)coro_pool_trim(relief, CORO_STACK_MAG), (long)mags * CORO_STACK_MAG,
           "a depot still for a period is unmapped whole");
    is_int((long)slab->depot_mags, 0, "the depot is empty");
    ok(relief_had > 0 && relief->n_clean == relief_had,
       "the relief pool keeps its %u stacks (at most a magazine), clean", relief_had);
    ok(!coro_pool_trim_due(worker) && !coro_pool_trim_due(relief),
       "nothing is due any more: the next sleep has no timeout");
    is_int(stacks_alive_since(m0, u0), CORO_STACK_MAG + relief_had, "what the idle pools hold");

    /* A clean stack serves again: its pages fault back in, and the next trim cleans it. */
    deep_once(worker, worker);
    is_int((long)worker->n_clean, CORO_STACK_MAG - 1, "a start took a clean stack");
    ok(coro_pool_trim_due(worker), "a stack used since makes a trim due");
    ok(stack_resident(worker, worker->free_stacks) >= 8, "its pages came back (%zu)",
       stack_resident(worker, worker->free_stacks));
    is_int((long)coro_pool_trim(worker, CORO_STACK_MAG), 0, "that trim unmaps nothing");
    ok(!coro_pool_trim_due(worker) && worker->n_clean == CORO_STACK_MAG &&
           stack_resident(worker, worker->clean_stacks) == 0,
       "and gives the pages back");

    /* A full cache spills its clean stacks first: they are the ones nobody used. */
    while (relief->n_free_stacks < CORO_STACK_MAG)
        deep_once(worker, relief);
    deep_once(worker, relief);
    ok(relief->n_free_stacks == 1 && relief->n_clean == 0 && relief->free_stacks != NULL,
       "a relief pool one past its magazine keeps a used stack");
    is_int((long)slab->depot_mags, 1, "and gives a magazine to the depot");
    is_int(stacks_alive_since(m0, u0), stacks_held(worker, relief), "none lost");

    /* Keeping none (a relief thread's trim) unmaps every free stack of the pool, clean or not. */
    unsigned worker_has = worker->n_free_stacks;
    ok(worker_has > 0, "the worker holds %u free stacks", worker_has);
    is_int((long)coro_pool_trim(worker, 0), (long)worker_has,
           "a trim keeping none unmaps them all");
    ok(worker->n_free_stacks == 0 && worker->clean_stacks == NULL && worker->free_stacks == NULL,
       "and leaves the pool empty");
    test_clock_skew += CORO_DEPOT_DECAY_NS;
    is_int((long)coro_pool_trim(relief, 0), 1 + CORO_STACK_MAG,
           "with the depot's last magazine a period later");
    ok(!coro_pool_trim_due(worker) && !coro_pool_trim_due(relief), "nothing is due");
    is_int(stacks_alive_since(m0, u0), 0, "and no stack is left");
    deep_once(worker, relief);
    deep_once(worker, worker);
    coro_pool_free(relief);
    coro_pool_free(worker);
    is_int(stacks_alive_since(m0, u0), 0, "freeing the pools unmaps every stack, clean or not");
}

/* ---- floating-point control state ---- */

/* The rounding-mode bits of MXCSR / FPCR, read and written directly (libm is not linked). */
#define ROUND_TOWARDZERO 3
static int get_round(void)
{
#if defined(__x86_64__)
    uint32_t m;
    __asm__ volatile("stmxcsr %0" : "=m"(m));
    return (int)((m >> 13) & 3);
#elif defined(__aarch64__)
    uint64_t r;
    __asm__ volatile("mrs %0, fpcr" : "=r"(r));
    return (int)((r >> 22) & 3);
#else
    return 0;
#endif
}

static void set_round_towardzero(void)
{
#if defined(__x86_64__)
    uint32_t m;
    __asm__ volatile("stmxcsr %0" : "=m"(m));
    m |= 3u << 13;
    __asm__ volatile("ldmxcsr %0" : : "m"(m));
#elif defined(__aarch64__)
    uint64_t r;
    __asm__ volatile("mrs %0, fpcr" : "=r"(r));
    r |= 3ull << 22;
    __asm__ volatile("msr fpcr, %0" : : "r"(r));
#endif
}

static int body_round(struct coro *co, void *arg)
{
    set_round_towardzero();
    coro_yield(co, 0);
    *(int *)arg = get_round() == ROUND_TOWARDZERO;
    return 0;
}

static void test_fpu_state(void)
{
    int kept = 0;
    struct coro *co = coro_new(pool, body_round, &kept);
    coro_resume(co, pool);
    is_int(get_round(), 0, "a coroutine's rounding mode does not leak to its resumer");
    coro_resume(co, pool);
    ok(kept, "the coroutine gets its own rounding mode back after a yield");
    coro_free(co, pool);
}

/* ---- migration between threads ---- */

struct migrate {
    struct coro *co;
    int value;
};

static int body_migrate(struct coro *co, void *arg)
{
    int *x = arg;
    *x = 1;
    coro_yield(co, 1);
    *x = 2;
    return 0;
}

static void *migrate_thread(void *arg)
{
    struct migrate *m = arg;
    struct coro_pool *p2;
    if (coro_pool_new_shared(&p2, CORO_STACK_DEFAULT, pool) != 0)
        return NULL;
    m->value = coro_resume(m->co, p2);
    coro_free(m->co, p2); /* the struct goes to p2's free list, the slab is shared */
    coro_pool_free(p2);
    return NULL;
}

static void test_migrate(void)
{
    int x = 0;
    struct migrate m = {.co = coro_new(pool, body_migrate, &x), .value = 99};
    coro_resume(m.co, pool);
    pthread_t t;
    pthread_create(&t, NULL, migrate_thread, &m);
    pthread_join(t, NULL);
    is_int(m.value, CORO_FINISHED, "a coroutine suspended on one thread finishes on another");
    is_int(x, 2, "with its state intact");
}

/* ---- overflow ---- */

static NOINLINE int recurse(int depth)
{
    volatile char buf[512];
    buf[0] = (char)depth;
    buf[511] = (char)depth;
    if (depth > (1 << 30)) /* never true: keeps the compiler from calling this infinite */
        return 0;
    return recurse(depth + 1) + buf[0] + buf[511];
}

static int body_overflow(struct coro *co, void *arg)
{
    return recurse(0);
}

/* Run fn in a child whose stderr is captured; returns its wait status, fills msg. */
static int run_child(void (*fn)(void), char *msg, size_t msg_size)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        fn();
        _exit(0);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t n;
    while (len + 1 < msg_size && (n = read(fds[0], msg + len, msg_size - 1 - len)) > 0)
        len += (size_t)n;
    msg[len] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

static void child_overflow(void)
{
    struct coro *co = coro_new(pool, body_overflow, NULL);
    coro_resume(co, pool);
}

static int body_smash(struct coro *co, void *arg)
{
    memset(co->stack->lo, 0, 8); /* what a deep overflow would do to an unguarded stack */
    coro_yield(co, 0);
    return 0;
}

static void child_canary(void)
{
    coro_guard_budget = 0; /* no guarded stacks: every new stack gets a canary */
    struct coro_pool *p;
    coro_pool_new(&p, CORO_STACK_DEFAULT);
    struct coro *co = coro_new(p, body_smash, NULL);
    coro_resume(co, p);
}

static void test_overflow(void)
{
    char msg[4096];
    int st = run_child(child_overflow, msg, sizeof(msg));
    ok(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "overflowing child dies by SIGSEGV");
    ok(strstr(msg, "cyserve: coroutine stack overflow") != NULL,
       "and says it was a coroutine stack overflow");
    if (!strstr(msg, "cyserve: coroutine stack overflow"))
        note("child stderr: %s", msg);

    st = run_child(child_canary, msg, sizeof(msg));
    ok(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "smashed canary aborts");
    ok(strstr(msg, "cyserve: coroutine stack overflow (canary smashed)") != NULL,
       "with a clear message");
    ok(strstr(msg, "vm.max_map_count") != NULL, "after a one-time warning about the budget");
}

static void test_bad_sizes(void)
{
    struct coro_pool *p = NULL;
    is_int(coro_pool_new(&p, 1024), -EINVAL, "stack below the minimum");
    is_int(coro_pool_new(&p, (size_t)CORO_STACK_MAX + 1), -EINVAL, "stack above the maximum");
    is_int(coro_pool_new(&p, CORO_STACK_MIN + 1), 0, "odd size accepted");
    is_int(coro_pool_stack_size(p), CORO_STACK_MIN + 4096, "rounded up to pages");
    coro_pool_free(p);
}

/* ASan gives every thread an alternate signal stack of its own, which would hide the one ours
 * installs (the test below checks that one). */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "use_sigaltstack=0";
}

static volatile sig_atomic_t altstack_hits;

static void altstack_handler(int sig)
{
    (void)sig;
    stack_t cur;
    if (sigaltstack(NULL, &cur) == 0 && (cur.ss_flags & SS_ONSTACK))
        altstack_hits++;
}

static void *free_pool_thread(void *arg)
{
    coro_pool_free(arg);
    return NULL;
}

/* A pool freed on another thread must leave the alternate signal stack of the thread that made
 * it alone: the server is stopped from a helper thread, and the main thread's next SA_ONSTACK
 * signal (Python's SIGINT) once ran on an unmapped stack and crashed. */
static void *altstack_owner_thread(void *arg)
{
    (void)arg;
    /* A new thread has no alternate stack: the pool made here installs one. */
    struct coro_pool *p;
    is_int(coro_pool_new(&p, CORO_STACK_DEFAULT), 0, "pool on a fresh thread");
    stack_t cur;
    ok(sigaltstack(NULL, &cur) == 0 && !(cur.ss_flags & SS_DISABLE), "thread has an altstack");
    pthread_t th;
    pthread_create(&th, NULL, free_pool_thread, p);
    pthread_join(th, NULL);
    ok(sigaltstack(NULL, &cur) == 0 && !(cur.ss_flags & SS_DISABLE), "altstack still set");
    raise(SIGUSR1); /* crashed (SI_KERNEL SIGSEGV) when the stack had been unmapped */
    is_int(altstack_hits, 1, "handler ran on the alternate stack");
    return NULL;
}

static void test_altstack_outlives_pool_freed_elsewhere(void)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = altstack_handler;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, &old);
    pthread_t th;
    pthread_create(&th, NULL, altstack_owner_thread, NULL);
    pthread_join(th, NULL);
    sigaction(SIGUSR1, &old, NULL);
}

int main(void)
{
    if (coro_pool_new(&pool, CORO_STACK_DEFAULT) != 0)
        return 1;
    test_switch();
    test_nested();
    test_defers();
    test_arena();
    test_stacks();
    test_stack_counts();
    test_stack_depot();
    test_stack_cache_bound();
    test_stack_depot_stale_clock();
    test_stack_depot_threads();
    test_stack_trim();
    test_pool_idle_trim();
    test_fpu_state();
    test_migrate();
    test_overflow();
    test_bad_sizes();
    test_altstack_outlives_pool_freed_elsewhere();
    coro_pool_free(pool);
    return done_testing();
}
