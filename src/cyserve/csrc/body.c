/* body.c: request bodies streamed to their handler.
 *
 * When. A body that arrived whole with its head is handed over whole, as before (no cost). A
 * larger one (BODY_STREAM_MIN: a Content-Length over it, or a chunked body that has decoded
 * that much and not ended) to a handler that reads bodies as streams (a Python handler or a WSGI
 * application over plain TCP: server_target.body_stream) is not read before the call: the
 * handler reads it as it goes (wsgi.input, Request.read and Request.stream), through a window
 * of BODY_WINDOW bytes, and the socket is not read while the handler does not ask, so TCP
 * pushes back on the client. Smaller bodies are still read whole by the connection's
 * coroutine before the call, so that a slow client of a small upload costs no blocked call.
 *
 * Who reads. The handler's call runs on a worker's (or relief) thread, outside the coroutine,
 * which waits for the call meanwhile: the call reads the socket itself, and waits for it with
 * poll(2), its GIL released. That blocks the thread, not the server: a thread stuck in a call
 * has its worker's other connections taken over by a relief thread (sched_relief.c.h). The
 * coroutine and the call never touch the reader at once: the call runs between the coroutine's
 * offload and its resumption. Over TLS the call reads through OpenSSL (the transport's
 * recv_nowait, tls_recv_nowait) in the same turns, so the session is never used by two threads
 * at once; a TLS read that must write first (a key update's answer into a full socket) waits
 * for the socket to take bytes, on the call's thread with poll(2) or in the coroutine
 * (br->wait_out).
 *
 * The rules while the handler reads: max_body_bytes on the decoded bytes (a Content-Length over
 * it is refused before the call, as before); body_timeout for each wait for the client; the
 * minimum rate over the time spent waiting for the client only (a handler that pauses between
 * reads holds the client back, which is not the client's fault). An error is sticky and says
 * what the client should be answered (413, 408, 400), which the Python layer answers when the
 * handler lets the exception through. The stop: a wait ends once the grace period is over.
 *
 * After the call (and a streamed answer) the coroutine finishes the body: what the handler did
 * not read is dropped (within a bound, otherwise the connection closes after the answer), and
 * what a chunked body's last read brought past its end (the next pipelined request) goes back
 * into the connection's buffer. A Content-Length body is never read past its end. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "body.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "conn.h"
#include "request.h"
#include "server_int.h"

/* A wait for the client is cut in slices this long, to see a stop's deadline. */
#define BODY_WAIT_SLICE_MS 100

int body_fail(struct body_reader *br, int err, int status, const char *reason)
{
    br->err = err;
    br->status = status;
    br->reason = reason;
    return err;
}

int body_start(struct body_reader *br, struct conn *c, struct server *s, const char *prefix,
               size_t n, int64_t length, const struct http_chunked *st)
{
    memset(br, 0, sizeof(*br));
    br->c = c;
    br->s = s;
    br->fd = c->io.fd;
    br->length = length;
    br->chunked = length < 0;
    if (st)
        br->st = *st;
    br->cap = n > BODY_WINDOW ? n : BODY_WINDOW;
    br->win = malloc(br->cap);
    if (!br->win)
        return -ENOMEM;
    memcpy(br->win, prefix, n);
    br->end = br->tail = n;
    br->got = n;
    if (!br->chunked) {
        br->left = (uint64_t)length - n;
        br->done = br->left == 0;
    }
    return 0;
}

int body_slot_take(struct server *s)
{
    unsigned cap = (s->cfg.blocking_threads + 1) / 2;
    /* safety: relaxed: a counter bounding how many bodies stream; it publishes nothing. */
    unsigned cur = atomic_load_explicit(&s->body_streams, memory_order_relaxed);
    while (cur < cap)
        if (atomic_compare_exchange_weak_explicit(&s->body_streams, &cur, cur + 1,
                                                  memory_order_relaxed, memory_order_relaxed))
            return 1;
    return 0;
}

void body_slot_give(struct server *s)
{
    /* safety: see body_slot_take. */
    atomic_fetch_sub_explicit(&s->body_streams, 1, memory_order_relaxed);
}

void body_end(struct body_reader *br)
{
    if (br->slot) {
        body_slot_give(br->s);
        br->slot = 0;
    }
    free(br->win);
    br->win = NULL;
    br->cap = br->pos = br->end = br->tail = 0;
}

/* One read from the socket without waiting. 1: bytes came (maybe only framing), 0: the body has
 * ended, -EAGAIN, or a sticky error. dst[0..n), when given, takes a Content-Length body's bytes
 * directly (the window is then empty); *direct says how many went there. */
static int body_fill(struct body_reader *br, char *dst, size_t n, size_t *direct)
{
    if (br->err)
        return br->err;
    if (br->done)
        return 0;
    if (br->pos == br->end) /* nothing decoded is waiting: the window starts over */
        br->pos = br->end = br->tail = 0;
    char *to;
    size_t want;
    if (dst) {
        to = dst;
        want = n;
    } else {
        if (br->end == br->cap) {
            memmove(br->win, br->win + br->pos, br->end - br->pos);
            br->end -= br->pos;
            br->pos = 0;
        }
        to = br->win + br->end;
        want = br->cap - br->end;
    }
    if (!br->chunked && want > br->left)
        want = (size_t)br->left;
    ssize_t r;
    const struct conn_transport *tp = br->c->tp;
    if (LIKELY(!tp || !tp->recv_nowait)) {
        do
            r = conn_sock_recv(br->fd, to, want);
        while (r < 0 && errno == EINTR);
        if (r < 0)
            r = errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : -ECONNRESET;
    } else {
        short ev = POLLIN;
        r = tp->recv_nowait(br->c, to, want, &ev);
        br->wait_out = r == -EAGAIN && ev == POLLOUT;
    }
    if (r < 0) {
        if (r == -EAGAIN)
            return -EAGAIN;
        return body_fail(br, -ECONNRESET, 0, "the client went away during the request body");
    }
    if (r == 0)
        return body_fail(br, -ECONNRESET, 0,
                         "the client closed the connection before the request body ended");
    br->recvd += (uint64_t)r;
    if (!br->chunked) {
        br->left -= (uint64_t)r;
        br->got += (uint64_t)r;
        br->done = br->left == 0;
        if (dst)
            *direct = (size_t)r;
        else
            br->end = br->tail = br->end + (size_t)r;
        return 1;
    }
    size_t l = (size_t)r;
    int64_t rest = http_chunked_decode(&br->st, to, &l, br->s->cfg.limits.max_header_bytes);
    if (rest == -1)
        return body_fail(br, -EBADMSG, br->st.status, br->st.error);
    br->got += l;
    br->end += l;
    br->tail = br->end;
    uint64_t max = br->s->cfg.max_body_bytes;
    /* A chunk announced larger than what the limit leaves is refused at its size line, before
     * its bytes come (as for a body read whole). */
    if (br->got > max || (rest < 0 && br->st.remaining > max - br->got))
        return body_fail(br, -EFBIG, 413, "request body too large");
    if (rest >= 0) {
        br->done = 1;
        br->tail = br->end + (size_t)rest;
    }
    return 1;
}

/* The minimum rate, over the time spent waiting for the client, once body_timeout of it has
 * passed. */
static int body_below_rate(const struct body_reader *br)
{
    uint64_t rate = br->s->cfg.min_body_rate;
    if (!rate || br->waited_ns <= br->s->cfg.body_timeout_ns)
        return 0;
    return br->recvd < rate * (br->waited_ns / 1000000000ull);
}

int body_stop_due(const struct server *s, uint64_t now)
{
    /* safety: relaxed: a stop's flag and deadline only end a body's reading sooner. */
    return atomic_load_explicit(&s->stopping, memory_order_relaxed) &&
           now >= atomic_load_explicit(&s->stop_deadline, memory_order_relaxed);
}

/* Wait until the socket is readable (writable when a TLS read must write first): 0, or -ETIMEDOUT (body_timeout without a byte, or too
 * slow) or -ECANCELED (the stop's grace period is over), sticky. A handler's thread. */
static int body_wait(struct body_reader *br)
{
    struct server *s = br->s;
    uint64_t t0 = clock_mono_ns(), now = t0;
    uint64_t deadline = t0 + s->cfg.body_timeout_ns;
    for (;;) {
        if (body_stop_due(s, now))
            return body_fail(br, -ECANCELED, 0, "the server stopped during the request body");
        if (now >= deadline) {
            br->waited_ns += now - t0;
            return body_fail(br, -ETIMEDOUT, 408, "request body timed out");
        }
        uint64_t ms = (deadline - now + 999999) / 1000000;
        struct pollfd p = {.fd = br->fd, .events = br->wait_out ? POLLOUT : POLLIN | POLLRDHUP};
        int r = poll(&p, 1, ms > BODY_WAIT_SLICE_MS ? BODY_WAIT_SLICE_MS : (int)ms);
        now = clock_mono_ns();
        if (r > 0)
            break;
        if (r < 0 && errno != EINTR)
            return body_fail(br, -ECONNRESET, 0, "the client went away during the request body");
    }
    br->waited_ns += now - t0;
    if (body_below_rate(br))
        return body_fail(br, -ETIMEDOUT, 408, "request body too slow");
    return 0;
}

ssize_t body_read(struct body_reader *br, void *dst, size_t n, int line)
{
    if (!n)
        return 0;
    if (br->pull)
        return br->pull(br, dst, n, line);
    for (;;) {
        /* An error comes before what is left in the window: past the limit or inside broken
         * framing, those bytes are not the body's. (A read meets the client's leaving only
         * with the window empty.) */
        if (br->err)
            return br->err;
        size_t avail = br->end - br->pos;
        if (avail) {
            size_t k = avail < n ? avail : n;
            if (line) {
                const char *nl = memchr(br->win + br->pos, '\n', k);
                if (nl)
                    k = (size_t)(nl - (br->win + br->pos)) + 1;
            }
            memcpy(dst, br->win + br->pos, k);
            br->pos += k;
            br->taken += k;
            return (ssize_t)k;
        }
        if (br->done)
            return 0;
        /* A client that keeps sending never waits: the stop is looked at here too. */
        if (UNLIKELY(atomic_load_explicit(&br->s->stopping, memory_order_relaxed)) &&
            body_stop_due(br->s, clock_mono_ns()))
            return body_fail(br, -ECANCELED, 0, "the server stopped during the request body");
        /* A large read of a Content-Length body goes straight into the caller's buffer. */
        size_t direct = 0;
        int direct_ok = !br->chunked && !line && n >= 4096;
        int r = body_fill(br, direct_ok ? dst : NULL, n, &direct);
        if (direct) {
            br->taken += direct;
            return (ssize_t)direct;
        }
        if (r == -EAGAIN)
            r = body_wait(br);
        if (r < 0)
            return r;
    }
}

int body_drain(struct body_reader *br, uint64_t *budget)
{
    for (;;) {
        size_t avail = br->end - br->pos;
        if (avail > *budget)
            return -E2BIG;
        *budget -= avail;
        br->pos = br->end;
        if (br->err)
            return br->err;
        if (br->done)
            return 0;
        int r = body_fill(br, NULL, 0, NULL);
        if (r < 0)
            return r;
    }
}

size_t body_tail(const struct body_reader *br, const char **p)
{
    *p = br->win + br->end;
    return br->done && br->win ? br->tail - br->end : 0;
}

struct body_reader *body_of(const cyserve_request *req)
{
    const struct request *rq = req->engine;
    return rq ? rq->body_rd : NULL;
}
