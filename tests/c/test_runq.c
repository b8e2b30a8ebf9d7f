/* test_runq.c: the bounded steal-half run queue, with capacity 4 to reach every edge, and a
 * concurrent stress test (also built under ThreadSanitizer). */
#include "csrc/runq.h"

#include <pthread.h>

#include "tap.h"

/* Fake coroutines: only the scheduler node is touched by runq.h. */
#define NITEMS 64
static struct coro_sched_node items[NITEMS];

static struct coro *item(int i)
{
    return (struct coro *)(void *)&items[i];
}

static int index_of(struct coro *c)
{
    return (int)((struct coro_sched_node *)(void *)c - items);
}

static void test_basic(void)
{
    struct runq q;
    is_int(runq_init(&q, 3), -EINVAL, "capacity must be a power of two");
    is_int(runq_init(&q, 1), -EINVAL, "capacity must be >= 2");
    is_int(runq_init(&q, 4), 0, "capacity 4");
    ok(runq_pop(&q) == NULL, "empty pop");
    struct coro *first, *last;
    unsigned n;
    for (int i = 0; i < 4; i++)
        is_int(runq_push(&q, item(i), &first, &last, &n), 1, "push into free slot");
    is_int(runq_len(&q), 4, "len 4");
    is_int(index_of(runq_pop(&q)), 0, "FIFO pop 0");
    is_int(index_of(runq_pop(&q)), 1, "FIFO pop 1");
    runq_push(&q, item(4), &first, &last, &n);
    runq_push(&q, item(5), &first, &last, &n);
    is_int(runq_len(&q), 4, "len 4 after wrap");
    /* Full: the push overflows half (2, 3) plus the new one (6). */
    is_int(runq_push(&q, item(6), &first, &last, &n), 0, "push into a full ring overflows");
    is_int(n, 3, "half the ring plus the new coroutine");
    is_int(index_of(first), 2, "oldest first");
    struct coro *mid = items[2].next;
    is_int(index_of(mid), 3, "then the next oldest");
    is_int(index_of(items[3].next), 6, "then the new one");
    ok(last == item(6) && items[6].next == NULL, "last is the new one, list terminated");
    is_int(runq_len(&q), 2, "two left");
    is_int(index_of(runq_pop(&q)), 4, "remaining order kept (4)");
    is_int(index_of(runq_pop(&q)), 5, "remaining order kept (5)");
    ok(runq_pop(&q) == NULL, "empty again");
    runq_destroy(&q);
}

static void test_steal(void)
{
    struct runq a, b;
    runq_init(&a, 4);
    runq_init(&b, 4);
    struct coro *first, *last;
    unsigned n;
    ok(runq_steal(&b, &a) == NULL, "nothing to steal from an empty queue");
    runq_push(&a, item(0), &first, &last, &n);
    is_int(index_of(runq_steal(&b, &a)), 0, "steal the only one");
    is_int(runq_len(&a), 0, "victim empty");
    is_int(runq_len(&b), 0, "the stolen one is returned, not queued");
    for (int i = 1; i <= 3; i++)
        runq_push(&a, item(i), &first, &last, &n);
    struct coro *got = runq_steal(&b, &a);
    is_int(index_of(got), 2, "steal ceil(3/2) = 2: returns the newer of them");
    is_int(runq_len(&b), 1, "and queues the other");
    is_int(index_of(runq_pop(&b)), 1, "the older stolen one");
    is_int(runq_len(&a), 1, "victim keeps the rest");
    is_int(index_of(runq_pop(&a)), 3, "victim's remaining one");
    /* A thief whose own ring is more than half full does not steal. */
    for (int i = 10; i < 13; i++)
        runq_push(&b, item(i), &first, &last, &n);
    runq_push(&a, item(20), &first, &last, &n);
    ok(runq_steal(&b, &a) == NULL, "no steal into a ring without room for half");
    /* A pending thief (steal != real) blocks other thieves and makes overflow hand out one. */
    runq_destroy(&a);
    runq_destroy(&b);
    runq_init(&a, 4);
    for (int i = 0; i < 4; i++)
        runq_push(&a, item(i), &first, &last, &n);
    a.head = runq_pack(0, 1); /* as if a thief had claimed slot 0 and not finished */
    struct runq c;
    runq_init(&c, 4);
    ok(runq_steal(&c, &a) == NULL, "a second thief backs off while one is copying");
    is_int(runq_push(&a, item(4), &first, &last, &n), 0, "full while a thief copies");
    ok(n == 1 && first == item(4), "overflow hands out only the new coroutine");
    runq_destroy(&a);
    runq_destroy(&c);
}

/* ---- concurrent stress ---- */

enum { STRESS_N = 200000, THIEVES = 3 };
static struct coro_sched_node *stress_items;
static int *seen; /* atomic counters, one per item */
static struct runq owner_q;
static int owner_done; /* atomic */
static long overflowed;

static void consume(struct coro *c)
{
    long i = (struct coro_sched_node *)(void *)c - stress_items;
    /* safety: counts how often each item was taken; must end at exactly 1. */
    __atomic_fetch_add(&seen[i], 1, __ATOMIC_RELAXED);
}

static void *thief(void *arg)
{
    struct runq mine;
    runq_init(&mine, 4);
    for (;;) {
        /* safety: acquire pairs with the owner's release after its last push. */
        int done = __atomic_load_n(&owner_done, __ATOMIC_ACQUIRE);
        struct coro *c = runq_steal(&mine, &owner_q);
        if (c) {
            consume(c);
            while ((c = runq_pop(&mine)))
                consume(c);
        } else if (done && runq_len(&owner_q) == 0) {
            break;
        }
    }
    runq_destroy(&mine);
    return NULL;
}

static void test_stress(void)
{
    stress_items = calloc(STRESS_N, sizeof(*stress_items));
    seen = calloc(STRESS_N, sizeof(*seen));
    runq_init(&owner_q, 4);
    pthread_t t[THIEVES];
    for (int i = 0; i < THIEVES; i++)
        pthread_create(&t[i], NULL, thief, NULL);
    for (int i = 0; i < STRESS_N; i++) {
        struct coro *first = NULL, *last = NULL;
        unsigned n;
        if (!runq_push(&owner_q, (struct coro *)(void *)&stress_items[i], &first, &last, &n)) {
            overflowed += n;
            for (struct coro *c = first; c; c = coro_sched_node(c)->next)
                consume(c);
        }
        if (i % 3 == 0) {
            struct coro *c = runq_pop(&owner_q);
            if (c)
                consume(c);
        }
    }
    struct coro *c;
    while ((c = runq_pop(&owner_q)))
        consume(c);
    __atomic_store_n(&owner_done, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < THIEVES; i++)
        pthread_join(t[i], NULL);
    int exact = 1;
    for (int i = 0; i < STRESS_N; i++)
        exact &= seen[i] == 1;
    ok(exact, "every one of 200,000 items taken exactly once (owner pops, 3 thieves, overflow)");
    note("overflowed to the inject path: %ld", overflowed);
    runq_destroy(&owner_q);
    free(stress_items);
    free(seen);
}

int main(void)
{
    test_basic();
    test_steal();
    test_stress();
    return done_testing();
}
