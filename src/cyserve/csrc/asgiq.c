/* asgiq.c: the queue from the workers to the ASGI event loop; the design is in asgiq.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "asgiq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "compat.h"
#include "handoff.h"

int asgiq_init(struct asgiq *q)
{
    q->head = NULL;
    q->active = 0;
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return q->efd < 0 ? -errno : 0;
}

void asgiq_set_active(struct asgiq *q, int on)
{
    /* safety: release/acquire (asgiq_active): a worker that sees the queue active also sees
     * the consumer's setup before it (its reader registered). Pushes made after it is cleared
     * are the caller's to exclude (the server has stopped). */
    __atomic_store_n(&q->active, on, __ATOMIC_RELEASE);
}

int asgiq_active(const struct asgiq *q)
{
    return __atomic_load_n(&q->active, __ATOMIC_ACQUIRE);
}

/* Copy s into the item's bytes at *at, and return the view of the copy. */
static cyserve_str copy_str(char **at, cyserve_str s)
{
    cyserve_str out = {*at, s.len};
    if (s.len)
        memcpy(*at, s.ptr, s.len);
    *at += s.len;
    return out;
}

int asgiq_start_new(const cyserve_request *req, void *opaque, uint64_t body_pending, int http2,
                    int https, const char *peer, struct handoff *h, struct asgiq_item **out)
{
    size_t n = req->num_headers;
    size_t bytes = req->method.len + req->target.len + req->path.len + req->query.len +
                   req->body.len + (peer ? strlen(peer) + 1 : 0);
    for (size_t i = 0; i < n; i++)
        bytes += req->headers[i].name.len + req->headers[i].value.len;
    struct asgiq_item *it = malloc(sizeof(*it) + n * sizeof(cyserve_header) + bytes);
    if (UNLIKELY(!it))
        return -ENOMEM;
    char *at = (char *)(it->hdrs + n);
    *it = (struct asgiq_item){.kind = ASGIQ_START,
                              .h = h,
                              .opaque = opaque,
                              .body_pending = body_pending,
                              .http2 = http2,
                              .https = https};
    it->req.method = copy_str(&at, req->method);
    it->req.target = copy_str(&at, req->target);
    it->req.path = copy_str(&at, req->path);
    it->req.query = copy_str(&at, req->query);
    it->req.minor_version = req->minor_version;
    for (size_t i = 0; i < n; i++) {
        it->hdrs[i].name = copy_str(&at, req->headers[i].name);
        it->hdrs[i].value = copy_str(&at, req->headers[i].value);
    }
    it->req.headers = it->hdrs;
    it->req.num_headers = n;
    it->req.body = copy_str(&at, req->body);
    if (peer) {
        size_t pl = strlen(peer) + 1;
        memcpy(at, peer, pl);
        it->peer = at;
    }
    *out = it;
    return 0;
}

int asgiq_push(struct asgiq *q, struct asgiq_item *it)
{
    /* safety: release on success publishes the item's contents to the consumer's acquire
     * exchange (asgiq_take); relaxed on failure, which only reloads the head to link to. The
     * stack is only ever pushed one item at a time and taken whole, so a head seen again is
     * the same list (no ABA). */
    struct asgiq_item *old = __atomic_load_n(&q->head, __ATOMIC_RELAXED);
    do {
        it->next = old;
    } while (!__atomic_compare_exchange_n(&q->head, &old, it, 1, __ATOMIC_RELEASE,
                                          __ATOMIC_RELAXED));
    if (old != NULL)
        return 0; /* not the first since the last take: that push's wake-up covers this one */
    uint64_t one = 1;
    if (write(q->efd, &one, sizeof(one)) != (ssize_t)sizeof(one))
        return errno == EAGAIN ? 0 : -errno; /* EAGAIN: the counter is full, the wake is due */
    return 0;
}

int asgiq_notify(struct asgiq *q, int kind, struct handoff *h, char *data, size_t len, int more)
{
    struct asgiq_item *it = malloc(sizeof(*it));
    if (UNLIKELY(!it)) {
        free(data);
        return -ENOMEM;
    }
    *it = (struct asgiq_item){.kind = kind, .h = h, .data = data, .len = len, .more = more};
    handoff_hold(h);
    asgiq_push(q, it); /* queued even when the wake-up failed: the next one carries it */
    return 0;
}

struct asgiq_item *asgiq_take(struct asgiq *q)
{
    uint64_t n;
    /* The wake-up first, then the stack: a push after the take finds the stack empty and
     * writes again (asgiq.h). Nothing to read (EAGAIN) is fine. */
    ssize_t r = read(q->efd, &n, sizeof(n));
    (void)r;
    /* safety: acquire pairs with the pushes' release CAS: the items' contents are seen. */
    struct asgiq_item *it = __atomic_exchange_n(&q->head, NULL, __ATOMIC_ACQUIRE);
    struct asgiq_item *fifo = NULL;
    while (it) {
        struct asgiq_item *next = it->next;
        it->next = fifo;
        fifo = it;
        it = next;
    }
    return fifo;
}

struct handoff *asgiq_item_take_handoff(struct asgiq_item *it)
{
    struct handoff *h = it->h;
    it->h = NULL;
    return h;
}

void asgiq_item_free(struct asgiq_item *it)
{
    if (it->h)
        handoff_release(it->h);
    free(it->data);
    free(it);
}

void asgiq_drop_all(struct asgiq *q)
{
    struct asgiq_item *it = asgiq_take(q);
    while (it) {
        struct asgiq_item *next = it->next;
        asgiq_item_free(it);
        it = next;
    }
}
