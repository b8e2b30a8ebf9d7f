/* stream.c: streamed answers of Python handlers: the calls that pull each piece from the
 * handler or give the stream back, and the streams a stop leaves orphaned. The protocol frames
 * the pieces (HTTP/1: http1_send_answer).
 *
 * A Python handler (a WSGI app yielding its body as it goes: a download, server-sent events) may
 * leave resp->stream set: the body so far is in resp, and the rest comes from further calls of
 * the target's py_stream, each offloaded like the handler itself (one GIL batch per piece, so the
 * worker serves its other connections in between) and each piece written before the next is
 * asked for, so that a slow client slows the producer down instead of piling the body up in
 * memory; each write may wait body_timeout for progress, as any answer's. The body goes out
 * chunked to an HTTP/1.1 client, and until the connection closes to an HTTP/1.0 one. A handler
 * that fails midway can no longer be answered with a 500: the connection is closed without the
 * last chunk, which tells an HTTP/1.1 client that the body is incomplete. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "stream.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compat.h"
#include "handoff.h"
#include "request.h"
#include "sched.h"
#include "server_int.h"

struct py_stream_job {
    const struct server_target *t;
    void *stream;
    struct cyserve_response *resp;
    int op;
    int rc;
};

static void py_stream_trampoline(void *arg)
{
    struct py_stream_job *j = arg;
    j->rc = j->t->py_stream(j->t->opaque, j->stream, j->resp, j->op);
}

/* A stream whose handler cannot be called any more (the stop cancels offloads): kept for
 * server_take_orphan. Out of memory, it is leaked. */
static void stream_orphan(struct server *s, const struct server_target *t, void *stream)
{
    pthread_mutex_lock(&s->orphan_lock);
    if (s->n_orphans == s->cap_orphans) {
        size_t cap = s->cap_orphans ? s->cap_orphans * 2 : 8;
        struct orphan *o = realloc(s->orphans, cap * sizeof(*o));
        if (o) {
            s->orphans = o;
            s->cap_orphans = cap;
        }
    }
    if (s->n_orphans < s->cap_orphans)
        s->orphans[s->n_orphans++] = (struct orphan){t, stream};
    pthread_mutex_unlock(&s->orphan_lock);
}

void stream_abandon(struct request *rq, const struct server_target *t, void *stream)
{
    struct py_stream_job job = {t, stream, &rq->resp, SERVER_STREAM_ABANDON, 0};
    if (sched_offload(py_stream_trampoline, &job) < 0 && stream != rq->defer)
        stream_orphan(rq->srv, t, stream);
    /* A deferred stream is not kept as an orphan: its producer runs on a thread of its own, and
     * learns from handoff_gone() (the handoff is left with the answer) that the client went. */
}

/* The next piece of a deferred answer (handoff.h): tell the producer, by an offloaded call of
 * py_stream, that the last one was written (that is what paces it), then wait for it to give
 * the next. */
static int stream_next_deferred(struct request *rq, const struct server_target *t,
                                struct handoff *h, int *more)
{
    struct py_stream_job job = {t, h, &rq->resp, SERVER_STREAM_NEXT, 0};
    int rc = sched_offload(py_stream_trampoline, &job);
    if (LIKELY(rc == 0))
        rc = request_await_answer(rq, h, t);
    if (UNLIKELY(rc < 0))
        return rc; /* the server stops, or the client left; the handoff is left with the answer */
    *more = h->more;
    size_t len;
    const char *body = resp_body(&h->resp, &len);
    rc = wbuf_append(&rq->resp.body, body, len);
    /* Trailers come with the last piece (an ASGI app's http.response.trailers): kept in the
     * request's response until the protocol ends the body with them. */
    if (UNLIKELY(h->resp.trailers.len) && !rc)
        rc = wbuf_append(&rq->resp.trailers, h->resp.trailers.ptr, h->resp.trailers.len);
    resp_reset(&h->resp);
    if (UNLIKELY(rc))
        *more = -1;
    return 0;
}

int stream_next(struct request *rq, const struct server_target *t, void *stream, int *more)
{
    if (stream == rq->defer)
        return stream_next_deferred(rq, t, rq->defer, more);
    struct py_stream_job job = {t, stream, &rq->resp, SERVER_STREAM_NEXT, 0};
    int rc = sched_offload(py_stream_trampoline, &job);
    if (UNLIKELY(rc < 0)) {
        stream_orphan(rq->srv, t, stream); /* the server is stopping */
        return rc;
    }
    *more = job.rc;
    return 0;
}

int server_take_orphan(struct server *s, const struct server_target **t, void **stream)
{
    int got = 0;
    pthread_mutex_lock(&s->orphan_lock);
    if (s->n_orphans) {
        struct orphan o = s->orphans[--s->n_orphans];
        *t = o.t;
        *stream = o.stream;
        got = 1;
    }
    pthread_mutex_unlock(&s->orphan_lock);
    return got;
}
