/* stream.c: streamed answers of Python handlers, and the streams a stop leaves orphaned.
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
#include <sys/uio.h>

#include "access_log.h"
#include "conn.h"
#include "http1.h"
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

/* Give the stream back to its handler (the client left, or the stop cut the answer). */
static void stream_abandon(struct http1_session *sv, const struct server_target *t,
                           void *stream, struct cyserve_response *r)
{
    struct py_stream_job job = {t, stream, r, SERVER_STREAM_ABANDON, 0};
    if (sched_offload(py_stream_trampoline, &job) < 0)
        stream_orphan(sv->srv, t, stream);
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

/* Write the head (if still in sv->out) and data[0..len) as one piece of a streamed body. */
static int stream_send_piece(struct http1_session *sv, const char *data, size_t len,
                             int chunked)
{
    if (!len)
        return http1_flush(sv);
    if (!chunked)
        return http1_flush_with(sv, data, len, 0);
    char size[24];
    int n = snprintf(size, sizeof(size), "%zx\r\n", len);
    if (UNLIKELY(wbuf_append(&sv->out, size, (size_t)n)))
        return -ENOMEM;
    struct iovec iov[3] = {
        {sv->out.ptr, sv->out.len}, {(void *)data, len}, {(void *)"\r\n", 2}};
    int rc = conn_sendv(sv->c, iov, 3, 0);
    sv->out.len = 0;
    return rc;
}

int stream_send(struct http1_session *sv, const struct server_target *t, int keep, int head_only)
{
    struct cyserve_response *r = &sv->rq.resp;
    void *stream = r->stream;
    r->stream = NULL; /* from here on, this function owns the duty to release it */
    /* With a length announced, the pieces go out as they are and the connection can stay
     * open; without one, an HTTP/1.1 client gets chunks, an HTTP/1.0 one the close. */
    int64_t length = r->stream_length;
    int chunked = length < 0 && sv->rq.head.minor_version >= 1;
    if ((length < 0 && !chunked) || r->close)
        keep = 0;
    if (!keep)
        r->close = 1; /* serve_loop closes after this answer */
    size_t body_len;
    const char *body = resp_body(r, &body_len);
    if (!r->has_content_type) {
        static const char ct[] = "Content-Type: text/plain; charset=utf-8\r\n";
        if (UNLIKELY(wbuf_append(&r->headers, ct, sizeof(ct) - 1))) {
            stream_abandon(sv, t, stream, r);
            return -ENOMEM;
        }
    }
    uint64_t announce = length >= 0 ? (uint64_t)length
                        : chunked ? HTTP_LENGTH_CHUNKED : HTTP_LENGTH_UNTIL_CLOSE;
    int rc = http_write_head(&sv->out, r->status, sv->rq.head.minor_version, keep, announce,
                             r->headers.ptr, r->headers.len, http1_date());
    if (UNLIKELY(rc) || head_only) {
        stream_abandon(sv, t, stream, r);
        access_log_note(&sv->rq, r->status, 0);
        return rc;
    }
    uint64_t sent = 0;
    int more = 1;
    for (;;) {
        if (length >= 0 && sent + body_len > (uint64_t)length)
            body_len = (size_t)((uint64_t)length - sent); /* never more than announced */
        sent += body_len;
        rc = stream_send_piece(sv, body, body_len, chunked);
        if (rc || !more || (length >= 0 && sent == (uint64_t)length))
            break;
        r->body.len = 0;
        struct py_stream_job job = {t, stream, r, SERVER_STREAM_NEXT, 0};
        rc = sched_offload(py_stream_trampoline, &job);
        if (UNLIKELY(rc < 0)) {
            stream_orphan(sv->srv, t, stream); /* the server is stopping */
            return rc;
        }
        if (UNLIKELY(job.rc < 0)) {
            access_log_note(&sv->rq, r->status, (int64_t)sent);
            return -EIO; /* released; close without the last chunk */
        }
        more = job.rc; /* 0: released, and this piece is the last */
        body = resp_body(r, &body_len);
    }
    if (more)
        stream_abandon(sv, t, stream, r); /* the client left, or the announced length is reached */
    access_log_note(&sv->rq, r->status, (int64_t)sent);
    if (rc)
        return rc;
    if (length >= 0 && sent < (uint64_t)length)
        return -EIO; /* the body ended short of its Content-Length: only a close can say so */
    return chunked ? wbuf_append(&sv->out, "0\r\n\r\n", 5) : 0;
}

