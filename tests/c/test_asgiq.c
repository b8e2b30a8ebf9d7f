/* test_asgiq.c: the queue from the workers to the ASGI event loop (csrc/asgiq.c): a start item
 * copies its request, items come out in the order they went in, the eventfd is written once per
 * empty-to-full turn and never missed, notices hold a reference of their own; and a stress of
 * four producers against a consumer that sleeps on the eventfd (also under ThreadSanitizer). The
 * handoff's two reference functions are this file's counters of its refs: the queue touches
 * nothing else of a handoff. */
#include "csrc/asgiq.c"

#include <poll.h>
#include <pthread.h>

#include "tap.h"

void handoff_hold(struct handoff *h)
{
    __atomic_add_fetch(&h->refs, 1, __ATOMIC_RELAXED);
}

void handoff_release(struct handoff *h)
{
    __atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL);
}

/* The eventfd's counter: how many wake-ups were written since the last read (0 when none). */
static uint64_t wakes(struct asgiq *q)
{
    uint64_t n = 0;
    if (read(q->efd, &n, sizeof(n)) != (ssize_t)sizeof(n))
        return 0;
    return n;
}

static struct asgiq_item *start_item(size_t seq)
{
    cyserve_request req = {.method = {"GET", 3}, .target = {"/", 1}, .path = {"/", 1}};
    struct asgiq_item *it;
    if (asgiq_start_new(&req, NULL, 0, 0, 0, NULL, NULL, &it))
        return NULL;
    it->opaque = (void *)seq;
    return it;
}

static void test_copy(void)
{
    char method[] = "POST", target[] = "/a/b?x=1", name[] = "Host", value[] = "example.org",
         body[] = "hello", peer[] = "127.0.0.1:5555";
    cyserve_header hdrs[2] = {{{name, 4}, {value, 11}}, {{"X-Empty", 7}, {"", 0}}};
    cyserve_request req = {.method = {method, 4},
                           .target = {target, 8},
                           .path = {target, 4},
                           .query = {target + 5, 3},
                           .minor_version = 0,
                           .headers = hdrs,
                           .num_headers = 2,
                           .body = {body, 5}};
    struct handoff h = {.refs = 1};
    struct asgiq_item *it = NULL;
    is_int(asgiq_start_new(&req, (void *)&h, 42, 1, 1, peer, &h, &it), 0, "start item made");
    /* The originals change (the connection's buffer is reused): the copy must not. */
    memset(method, 'Z', 4);
    memset(target, 'Z', 8);
    memset(name, 'Z', 4);
    memset(value, 'Z', 11);
    memset(body, 'Z', 5);
    memset(peer, 'Z', sizeof(peer) - 1);
    is_int(it->kind, ASGIQ_START, "kind");
    is_mem(it->req.method.ptr, it->req.method.len, "POST", "method copied");
    is_mem(it->req.target.ptr, it->req.target.len, "/a/b?x=1", "target copied");
    is_mem(it->req.path.ptr, it->req.path.len, "/a/b", "path copied");
    is_mem(it->req.query.ptr, it->req.query.len, "x=1", "query copied");
    is_int(it->req.minor_version, 0, "minor version");
    is_int(it->req.num_headers, 2, "two headers");
    is_mem(it->req.headers[0].name.ptr, it->req.headers[0].name.len, "Host", "name copied");
    is_mem(it->req.headers[0].value.ptr, it->req.headers[0].value.len, "example.org",
           "value copied");
    is_mem(it->req.headers[1].name.ptr, it->req.headers[1].name.len, "X-Empty", "second name");
    is_int(it->req.headers[1].value.len, 0, "empty value");
    is_mem(it->req.body.ptr, it->req.body.len, "hello", "body copied");
    ok(it->peer && strcmp(it->peer, "127.0.0.1:5555") == 0, "peer copied: %s",
       it->peer ? it->peer : "(null)");
    is_int(it->body_pending, 42, "body pending");
    ok(it->http2 == 1 && it->https == 1, "flags kept");
    ok(it->req.engine == NULL && it->req.num_params == 0, "no engine, no params");
    ok(asgiq_item_take_handoff(it) == &h && it->h == NULL, "the handoff is taken over");
    asgiq_item_free(it);
    is_int(h.refs, 1, "a taken handoff is not released by the item");

    cyserve_request bare = {.method = {"GET", 3}};
    is_int(asgiq_start_new(&bare, NULL, 0, 0, 0, NULL, &h, &it), 0, "a bare request");
    ok(it->peer == NULL && it->req.num_headers == 0 && it->req.body.len == 0, "nothing else");
    asgiq_item_free(it);
    is_int(h.refs, 0, "an item that still has the handoff releases it");
}

static void test_order_and_wakes(void)
{
    struct asgiq q;
    is_int(asgiq_init(&q), 0, "init");
    ok(asgiq_take(&q) == NULL, "empty at first");
    is_int(wakes(&q), 0, "no wake-up before a push");
    for (size_t i = 1; i <= 3; i++)
        is_int(asgiq_push(&q, start_item(i)), 0, "push");
    is_int(wakes(&q), 1, "one wake-up for three pushes onto an empty queue");
    struct asgiq_item *it = asgiq_take(&q);
    size_t seen = 0;
    int in_order = 1;
    while (it) {
        struct asgiq_item *next = it->next;
        in_order &= (size_t)it->opaque == ++seen;
        asgiq_item_free(it);
        it = next;
    }
    is_int(seen, 3, "all three taken");
    ok(in_order, "oldest first");
    asgiq_push(&q, start_item(4));
    it = asgiq_take(&q);
    ok(it != NULL && (size_t)it->opaque == 4 && it->next == NULL, "a push after a take is taken");
    if (it)
        asgiq_item_free(it);
    /* The take read the wake-up that push wrote. */
    is_int(wakes(&q), 0, "and its wake-up was consumed by the take");
    close(q.efd);

    struct asgiq r;
    asgiq_init(&r);
    struct handoff h = {.refs = 1};
    is_int(asgiq_notify(&r, ASGIQ_NEXT, &h, NULL, 0, 0), 0, "notice");
    char *data = malloc(3);
    memcpy(data, "abc", 3);
    is_int(asgiq_notify(&r, ASGIQ_BODY, &h, data, 3, 1), 0, "body notice");
    is_int(h.refs, 3, "each notice holds a reference");
    it = asgiq_take(&r);
    ok(it && it->kind == ASGIQ_NEXT && it->next && it->next->kind == ASGIQ_BODY &&
           it->next->len == 3 && memcmp(it->next->data, "abc", 3) == 0 && it->next->more == 1,
       "notices in order, the piece with its item");
    while (it) {
        struct asgiq_item *next = it->next;
        asgiq_item_free(it);
        it = next;
    }
    is_int(h.refs, 1, "freeing them releases their references");
    asgiq_notify(&r, ASGIQ_GONE, &h, NULL, 0, 0);
    asgiq_drop_all(&r);
    is_int(h.refs, 1, "drop_all frees what is left");
    ok(asgiq_take(&r) == NULL, "and leaves it empty");
    asgiq_set_active(&r, 1);
    ok(asgiq_active(&r), "active");
    asgiq_set_active(&r, 0);
    ok(!asgiq_active(&r), "inactive");
    close(r.efd);
}

#define PRODUCERS 4
#define PER_PRODUCER 20000

static struct asgiq stress_q;

static void *producer(void *arg)
{
    size_t id = (size_t)arg;
    for (size_t i = 0; i < PER_PRODUCER; i++) {
        struct asgiq_item *it = start_item(id * PER_PRODUCER + i);
        if (!it)
            abort();
        asgiq_push(&stress_q, it);
    }
    return NULL;
}

static void test_stress(void)
{
    asgiq_init(&stress_q);
    pthread_t th[PRODUCERS];
    for (size_t i = 0; i < PRODUCERS; i++)
        pthread_create(&th[i], NULL, producer, (void *)i);
    /* The consumer sleeps on the eventfd between takes, as the loop does: a lost wake-up would
     * leave items behind with nobody woken, which the 10 s poll turns into a failure. */
    size_t next[PRODUCERS] = {0}, got = 0, takes = 0;
    int in_order = 1, stalled = 0;
    while (got < PRODUCERS * PER_PRODUCER) {
        struct pollfd p = {stress_q.efd, POLLIN, 0};
        if (poll(&p, 1, 10000) != 1) {
            stalled = 1;
            break;
        }
        struct asgiq_item *it = asgiq_take(&stress_q);
        takes++;
        while (it) {
            struct asgiq_item *nx = it->next;
            size_t v = (size_t)it->opaque, id = v / PER_PRODUCER;
            in_order &= id < PRODUCERS && v % PER_PRODUCER == next[id];
            if (id < PRODUCERS)
                next[id]++;
            got++;
            asgiq_item_free(it);
            it = nx;
        }
    }
    for (size_t i = 0; i < PRODUCERS; i++)
        pthread_join(th[i], NULL);
    ok(!stalled, "no wake-up lost (got %zu of %d)", got, PRODUCERS * PER_PRODUCER);
    is_int(got, PRODUCERS * PER_PRODUCER, "every item taken once");
    ok(in_order, "each producer's items in the order it pushed them");
    ok(takes <= got, "fewer takes than items (%zu for %zu)", takes, got);
    ok(asgiq_take(&stress_q) == NULL, "nothing left");
    close(stress_q.efd);
}

int main(void)
{
    test_copy();
    test_order_and_wakes();
    test_stress();
    return done_testing();
}
