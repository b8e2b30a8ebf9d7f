/* http1.c: HTTP/1.1 served by a connection's coroutine: heads (with their deadline), 100-continue,
 * bodies (Content-Length or chunked, within max_body_bytes), pipelining (answers batched in one
 * output buffer, flushed when nothing complete is left to parse), keep-alive and the framing of
 * answers; the request core (request.c) routes each request to its handler kind.
 *
 * The loop (serve_loop). Requests are parsed from the connection's buffer before it is read
 * again. When the buffer is empty and the last read was short (the socket is drained, so no
 * read is spent on EAGAIN), the coroutine calls sched_io_release(): if readable readiness
 * arrived meanwhile it keeps serving, otherwise the connection is idle again (conn_go_idle) and
 * the coroutine ends. Errors in a request (400, 408, 413, 431) are answered and the connection
 * closes after a lingering read (conn_linger_close). While the server drains, a request the
 * client has already sent is answered with Connection: close; nothing more is waited for. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "http1.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "access_log.h"
#include "clock.h"
#include "handoff.h"
#include "http2.h"
#include "stream.h"
#include "sched.h"
#include "server_int.h"
#include "ws_conn.h"
#include "ws_nogil.h"

/* The request core says "no length" with its own name; the head writer takes it as is. */
_Static_assert(REQUEST_LENGTH_NONE == HTTP_LENGTH_UNTIL_CLOSE, "one value for 'no length'");

/* Whether the serialised lines[0..len) hold a Server line of their own. */
static int lines_have_server(const char *lines, size_t len)
{
    for (size_t i = 0; i + 7 <= len;) {
        if (strncasecmp(lines + i, "server:", 7) == 0)
            return 1;
        const char *nl = memchr(lines + i, '\n', len - i);
        if (!nl)
            break;
        i = (size_t)(nl - lines) + 1;
    }
    return 0;
}

int http1_static_head(const struct http_head *head, int status, const char *lines, size_t lines_len,
                      size_t body_len, char **out, size_t *out_len)
{
    struct wbuf h;
    wbuf_init(&h, NULL, 0);
    size_t rlen;
    const char *reason = http_reason(status, &rlen);
    char line[96];
    /* A route's own Server replaces the server's (decided once here, not per request). */
    int n = snprintf(line, sizeof(line), "HTTP/1.1 %03d %.*s\r\n", status, (int)rlen, reason);
    size_t skip = lines_have_server(lines, lines_len) ? head->server_len : 0;
    int rc = wbuf_append(&h, line, (size_t)n);
    if (head->len > skip)
        rc = rc ? rc : wbuf_append(&h, head->lines + skip, head->len - skip);
    if (status >= 200 && status != 204 && status != 304) {
        n = snprintf(line, sizeof(line), "Content-Length: %zu\r\n", body_len);
        rc = rc ? rc : wbuf_append(&h, line, (size_t)n);
    }
    rc = rc ? rc : wbuf_append(&h, lines, lines_len);
    if (UNLIKELY(rc)) {
        wbuf_free(&h);
        return -ENOMEM;
    }
    *out = h.ptr;
    *out_len = h.len;
    return 0;
}

enum { SERVE_IDLE = 0, SERVE_CLOSE = 1 };

/* ---- the server-wide body budget ---- */

/* Give back what this request holds of the budget. Any path: after the answer, and at the
 * session's end (serve_cleanup, which also runs when a stop cancels the coroutine). */
static void body_budget_release(struct http1_session *sv)
{
    if (sv->body_held) {
        /* safety: a counter; see body_budget_hold. */
        atomic_fetch_sub_explicit(&sv->srv->body_held, sv->body_held, memory_order_relaxed);
        sv->body_held = 0;
        sv->rq.body_left = 0;
    }
}

/* Hold `total` bytes of the budget for this request's body (the part it holds already counts).
 * While the budget is spent, wait without reading (the client's sends back up: TCP pushes back),
 * looking again every few milliseconds, until deadline. A request may always hold its body when
 * nothing else is held, so that one body as large as the budget still passes. Returns 0, or
 * -EBUSY at the deadline (the caller answers 503). */
static int body_budget_hold(struct http1_session *sv, uint64_t total, int64_t deadline)
{
    struct server *s = sv->srv;
    uint64_t cap = s->cfg.body_budget;
    if (!cap || total <= sv->body_held)
        return 0;
    uint64_t more = total - sv->body_held;
    for (;;) {
        /* safety: relaxed: the counter only bounds memory; no data is published through it. */
        uint64_t cur = atomic_load_explicit(&s->body_held, memory_order_relaxed);
        if (cur + more <= cap || cur == sv->body_held) {
            if (atomic_compare_exchange_weak_explicit(&s->body_held, &cur, cur + more,
                                                      memory_order_relaxed, memory_order_relaxed)) {
                sv->body_held += more;
                return 0;
            }
            continue;
        }
        if (deadline >= 0 && sched_now_ns() >= (uint64_t)deadline)
            return -EBUSY;
        if (sched_sleep_ns(5 * 1000 * 1000) < 0)
            return -EBUSY; /* stopping */
    }
}

/* The minimum rate (cfg.min_body_rate, after a grace of body_timeout): got bytes since t0. */
static int body_too_slow(const struct server *s, uint64_t t0, uint64_t got)
{
    uint64_t rate = s->cfg.min_body_rate;
    if (!rate)
        return 0;
    uint64_t el = sched_now_ns() - t0;
    return el > s->cfg.body_timeout_ns && got < rate * (el / 1000000000ull);
}

static void serve_cleanup(void *arg)
{
    struct http1_session *sv = arg;
    body_budget_release(sv);
    if (sv->rq.body_rd) {
        body_end(sv->rq.body_rd);
        sv->rq.body_rd = NULL;
    }
    if (sv->rq.defer)
        request_leave_defer(&sv->rq);
    resp_free(&sv->rq.resp);
    wbuf_free(&sv->out);
}

/* Write the output buffer, then extra[0..extra_len) if any: one send, or one sendmsg when both
 * are there.
 * flags: as conn_sendv. */
int http1_flush_with(struct http1_session *sv, const void *extra, size_t extra_len, int flags)
{
    struct iovec iov[2];
    int cnt = 0;
    if (sv->out.len) {
        iov[cnt].iov_base = sv->out.ptr;
        iov[cnt].iov_len = sv->out.len;
        cnt++;
    }
    if (extra_len) {
        iov[cnt].iov_base = (void *)extra;
        iov[cnt].iov_len = extra_len;
        cnt++;
    }
    int rc = conn_sendv(sv->c, iov, cnt, flags);
    sv->out.len = 0;
    return rc;
}

int http1_flush(struct http1_session *sv)
{
    if (!sv->out.len)
        return 0;
    return http1_flush_with(sv, NULL, 0, 0);
}

/* Answer status with a short text body naming the problem, then close (the caller returns
 * SERVE_CLOSE). */
static int http1_error_close(struct http1_session *sv, int status, const char *detail)
{
    /* A HEAD gets no body, even in an error (when its method was read at all). */
    int head_only = sv->rq.head.method_id == HTTP_HEAD;
    int n = http_write_error(&sv->out, &sv->srv->cfg.head, status, detail, head_only, http1_date());
    access_log_note(&sv->rq, status, n < 0 ? -1 : n);
    if (UNLIKELY(sv->srv->metrics_on))
        metrics_note_reject(server_metrics_self(sv->srv), status);
    access_log_write(&sv->rq);
    if (n >= 0 && http1_flush(sv) == 0)
        conn_linger_close(sv->c);
    return SERVE_CLOSE;
}

/* A static target's answer: its cached head, and its body copied behind it, sent from memory,
 * or from its memfd by sendfile. */
static int send_static(struct http1_session *sv, const struct server_target *t, int keep,
                       int head_only)
{
    struct wbuf *out = &sv->out;
    if (UNLIKELY(sv->srv->cfg.access_log_fd >= 0))
        access_log_note(&sv->rq, t->static_status, head_only ? 0 : (int64_t)t->static_body_len);
    int rc = wbuf_reserve(out, HTTP1_STATIC_HEAD_MAX(t));
    if (UNLIKELY(rc))
        return rc;
    char *p = http1_static_head_put(out->ptr + out->len, t, keep, sv->rq.head.minor_version);
    out->len = (size_t)(p - out->ptr);
    if (head_only || !t->static_body_len)
        return 0;
    if (t->static_body_len <= BODY_COPY_MAX)
        return wbuf_append(out, t->static_body, t->static_body_len);
    if (t->static_fd < 0)
        return http1_flush_with(sv, t->static_body, t->static_body_len, 0);
    /* The head (behind any earlier pipelined responses) is corked with MSG_MORE and leaves with
     * the first pages of the body. */
    rc = http1_flush_with(sv, NULL, 0, MSG_MORE);
    return rc ? rc : conn_sendfile(sv->c, t->static_fd, 0, t->static_body_len);
}

/* Write the head (if still in sv->out) and data[0..len) as one piece of a streamed body. */
static int send_piece(struct http1_session *sv, const char *data, size_t len, int chunked)
{
    if (!len)
        return http1_flush(sv);
    if (!chunked)
        return http1_flush_with(sv, data, len, 0);
    char size[24];
    int n = snprintf(size, sizeof(size), "%zx\r\n", len);
    if (UNLIKELY(wbuf_append(&sv->out, size, (size_t)n)))
        return -ENOMEM;
    struct iovec iov[3] = {{sv->out.ptr, sv->out.len}, {(void *)data, len}, {(void *)"\r\n", 2}};
    int rc = conn_sendv(sv->c, iov, 3, 0);
    sv->out.len = 0;
    return rc;
}

/* A streamed answer: the head, then each piece as it comes (chunked to an HTTP/1.1 client when
 * no length was announced; to an HTTP/1.0 one the connection's close ends the body). */
static int send_stream(struct http1_session *sv, const struct server_target *t, int keep,
                       int head_only)
{
    struct cyserve_response *r = &sv->rq.resp;
    void *stream = r->stream;
    r->stream = NULL; /* from here on, this function owns the duty to release it */
    /* A status that has no content (1xx, 204, 304: RFC 9110 6.4.1) ends with its head, which
     * announces no framing (http_write_head): what the producer streams is taken from it and
     * dropped, as request_answer_resp drops such a body, so that no chunk framing (nor a
     * trailer section) follows the head, where the client would read it as the start of the
     * next response on the connection. The producer still runs to its end, as it would for a
     * body sent; the connection stays open whatever the version. */
    int bodyless = r->status < 200 || r->status == 204 || r->status == 304;
    /* A 205 has no content either (RFC 9110 15.3.6), but its head says Content-Length: 0;
     * what the producer streams is dropped the same way. */
    int reset_content = r->status == 205;
    if (UNLIKELY(reset_content))
        bodyless = 1;
    /* With a length announced, the pieces go out as they are and the connection can stay
     * open; without one, an HTTP/1.1 client gets chunks, an HTTP/1.0 one the close. */
    int64_t length = bodyless ? -1 : r->stream_length;
    int chunked = length < 0 && sv->rq.head.minor_version >= 1 && !bodyless;
    if ((length < 0 && !chunked && !bodyless) || r->close)
        keep = 0;
    if (!keep)
        r->close = 1; /* serve_loop closes after this answer */
    size_t body_len;
    const char *body = resp_body(r, &body_len);
    if (!r->has_content_type && !bodyless) {
        static const char ct[] = "Content-Type: text/plain; charset=utf-8\r\n";
        if (UNLIKELY(wbuf_append(&r->headers, ct, sizeof(ct) - 1))) {
            stream_abandon(&sv->rq, t, stream);
            return -ENOMEM;
        }
    }
    uint64_t announce = length >= 0     ? (uint64_t)length
                        : chunked       ? HTTP_LENGTH_CHUNKED
                        : reset_content ? 0
                                        : HTTP_LENGTH_UNTIL_CLOSE;
    int rc = UNLIKELY(r->own_head)
                 ? http_write_head_own(&sv->out, &sv->srv->cfg.head, r->status, r->reason,
                                       r->reason_len, r->own_head & RESP_OWN_SERVER,
                                       sv->rq.head.minor_version, keep, announce, r->headers.ptr,
                                       r->headers.len, http1_date())
                 : http_write_head(&sv->out, &sv->srv->cfg.head, r->status,
                                   sv->rq.head.minor_version, keep, announce, r->headers.ptr,
                                   r->headers.len, http1_date());
    if (UNLIKELY(rc) || head_only) {
        stream_abandon(&sv->rq, t, stream);
        access_log_note(&sv->rq, r->status, 0);
        return rc;
    }
    uint64_t sent = 0;
    int more = 1;
    for (;;) {
        if (UNLIKELY(bodyless))
            body_len = 0; /* flushes the head alone */
        else if (length >= 0 && sent + body_len > (uint64_t)length)
            body_len = (size_t)((uint64_t)length - sent); /* never more than announced */
        sent += body_len;
        rc = send_piece(sv, body, body_len, chunked);
        if (rc || !more || (length >= 0 && sent == (uint64_t)length))
            break;
        r->body.len = 0;
        resp_body_return(r); /* this piece is written: a lent one goes back */
        rc = stream_next(&sv->rq, t, stream, &more);
        if (UNLIKELY(rc < 0))
            return rc; /* the server is stopping: an orphan now */
        if (UNLIKELY(more < 0)) {
            access_log_note(&sv->rq, r->status, (int64_t)sent);
            return -EIO; /* released; close without the last chunk */
        }
        /* more == 0: released, and this piece is the last */
        body = resp_body(r, &body_len);
    }
    if (more) /* the client left, or the announced length is reached */
        stream_abandon(&sv->rq, t, stream);
    access_log_note(&sv->rq, r->status, (int64_t)sent);
    if (rc)
        return rc;
    if (length >= 0 && sent < (uint64_t)length)
        return -EIO; /* the body ended short of its Content-Length: only a close can say so */
    if (!chunked)
        return 0; /* trailers, if any, are dropped: only a chunked body can carry them */
    /* Trailers only to a client that said it takes them (TE: trailers), and read from its
     * head only when there are some. */
    size_t tlen = r->trailers.len;
    if (UNLIKELY(tlen) && !request_accepts_trailers(&sv->rq))
        tlen = 0;
    return http_write_chunked_end(&sv->out, r->trailers.ptr, tlen);
}

/* The head of a chunked answer with its body whole: a's, with Transfer-Encoding: chunked
 * instead of its length. */
static int put_chunked_head(struct wbuf *out, const struct http_head *head,
                            const struct request_answer *a, int minor, int keep)
{
    struct request_answer c = *a;
    c.length = HTTP_LENGTH_CHUNKED;
    return http1_answer_head(out, head, &c, minor, keep);
}

int http1_put_answer_trailed(struct wbuf *out, const struct http_head *head,
                             const struct request_answer *a, int minor, int keep, int head_only,
                             const char *trailers, size_t tlen)
{
    int rc = put_chunked_head(out, head, a, minor, keep);
    if (rc || head_only)
        return rc;
    if (a->body_len) {
        char size[24];
        int n = snprintf(size, sizeof(size), "%zx\r\n", a->body_len);
        if (wbuf_append(out, size, (size_t)n) || wbuf_append(out, a->body, a->body_len) ||
            wbuf_append(out, "\r\n", 2))
            return -ENOMEM;
    }
    return http_write_chunked_end(out, trailers, tlen);
}

/* send_body for an answer that http1_trailed: its body as one chunk (from memory, or its memfd
 * or file by sendfile between the chunk's size line and its CRLF), then the trailer section. */
static int send_body_trailed(struct http1_session *sv, const struct request_answer *a, int keep,
                             int head_only)
{
    struct cyserve_response *r = &sv->rq.resp;
    /* Trailers only to a client that said it takes them (TE: trailers), as send_stream's. */
    size_t tlen = request_accepts_trailers(&sv->rq) ? r->trailers.len : 0;
    if (a->fd < 0 && a->body_len <= BODY_COPY_MAX)
        return http1_put_answer_trailed(&sv->out, &sv->srv->cfg.head, a, sv->rq.head.minor_version,
                                        keep, head_only, r->trailers.ptr, tlen);
    int rc = put_chunked_head(&sv->out, &sv->srv->cfg.head, a, sv->rq.head.minor_version, keep);
    if (rc || head_only)
        return rc;
    char size[24];
    int n = snprintf(size, sizeof(size), "%zx\r\n", a->body_len);
    if (UNLIKELY(wbuf_append(&sv->out, size, (size_t)n)))
        return -ENOMEM;
    if (a->fd < 0) {
        rc = http1_flush_with(sv, a->body, a->body_len, 0);
    } else {
        rc = http1_flush_with(sv, NULL, 0, MSG_MORE);
        if (!rc)
            rc = conn_sendfile(sv->c, a->fd, a->offset, a->body_len);
    }
    if (rc)
        return rc;
    /* The chunk's CRLF and the end wait in the output buffer for the caller's flush. */
    if (UNLIKELY(wbuf_append(&sv->out, "\r\n", 2)))
        return -ENOMEM;
    return http_write_chunked_end(&sv->out, r->trailers.ptr, tlen);
}

/* An answer with its body in memory (copied behind the head when small, else sent from there
 * or from its memfd) or in a file (sendfile after the head). */
static int send_body(struct http1_session *sv, const struct request_answer *a, int keep,
                     int head_only)
{
    access_log_note(&sv->rq, a->status, head_only ? 0 : (int64_t)a->body_len);
    if (http1_trailed(a, sv->rq.head.minor_version))
        return send_body_trailed(sv, a, keep, head_only);
    int rc = http1_answer_head(&sv->out, &sv->srv->cfg.head, a, sv->rq.head.minor_version, keep);
    if (UNLIKELY(rc) || head_only || !a->body_len)
        return rc;
    if (a->kind == REQUEST_BODY_FILE) {
        /* Corked, as a memfd's below: the head leaves with the first pages of the file, not in
         * a segment of its own. */
        rc = http1_flush_with(sv, NULL, 0, MSG_MORE);
        return rc ? rc : conn_sendfile(sv->c, a->fd, a->offset, a->body_len);
    }
    if (a->fd < 0 && a->body_len <= BODY_COPY_MAX)
        return wbuf_append(&sv->out, a->body, a->body_len);
    if (a->fd < 0)
        return http1_flush_with(sv, a->body, a->body_len, 0);
    rc = http1_flush_with(sv, NULL, 0, MSG_MORE);
    return rc ? rc : conn_sendfile(sv->c, a->fd, a->offset, a->body_len);
}

int http1_send_answer(struct http1_session *sv, int keep)
{
    struct request_answer *a = &sv->rq.answer;
    int head_only = sv->rq.head.method_id == HTTP_HEAD;
    if (a->close)
        keep = 0;
    int rc;
    switch (a->kind) {
    case REQUEST_BODY_STATIC:
        rc = send_static(sv, a->t, keep, head_only);
        break;
    case REQUEST_BODY_STREAM:
        rc = send_stream(sv, a->t, keep, head_only);
        break;
    default:
        rc = send_body(sv, a, keep, head_only);
        break;
    }
    request_answer_done(&sv->rq);
    /* Whatever happened, the body is written or will never be: a lent one goes back now rather
     * than at the next request, so that an idle keep-alive connection holds no Python object. */
    resp_body_return(&sv->rq.resp);
    return rc;
}

static int parse_head(struct http1_session *sv, size_t off)
{
    sv->rq.head.headers = sv->rq.hdrs;
    sv->rq.head.num_headers = sv->rq.max_headers;
    int n = http_parse_request(sv->c->buf + off, sv->c->len - off, &sv->rq.head,
                               &sv->srv->cfg.limits);
    if (n > 0)
        http1_empty_path_is_root(&sv->rq.head);
    return n;
}

/* Whether the rejected bytes at b[0..n) have the shape of the HTTP/2 client preface's first
 * line gone wrong: a line of exactly three words, the third of which cannot begin "HTTP/",
 * followed at once by an empty line (the preface is "PRI * HTTP/2.0", an empty line, "SM", an
 * empty line). Such bytes are no HTTP/1 request (which has a version, and its empty line ends
 * its fields): on a cleartext port that also serves h2c by prior knowledge they are a client
 * preface gone wrong, which RFC 9113 3.4 answers by closing the connection, not with an
 * HTTP/1.1 400 the client cannot read. Anything else that is rejected (a PROXY line from a peer
 * that is not a balancer, a TLS hello, a malformed request) still gets its 400. Pure. */
static int not_http1_version(const char *b, size_t n)
{
    const char *eol = memchr(b, '\n', n);
    if (!eol || eol == b || eol[-1] != '\r' || (size_t)(b + n - eol) < 3 || eol[1] != '\r' ||
        eol[2] != '\n')
        return 0;
    const char *end = eol - 1; /* the CR */
    const char *sp1 = memchr(b, ' ', (size_t)(end - b));
    if (!sp1 || sp1 == b)
        return 0;
    const char *sp2 = memchr(sp1 + 1, ' ', (size_t)(end - sp1 - 1));
    if (!sp2 || sp2 == sp1 + 1 || sp2 + 1 == end || memchr(sp2 + 1, ' ', (size_t)(end - sp2 - 1)))
        return 0;
    size_t k = (size_t)(end - sp2 - 1);
    return memcmp(sp2 + 1, "HTTP/", k < 5 ? k : 5) != 0;
}

static const char continue_line[] = "HTTP/1.1 100 Continue\r\n\r\n";

/* Send 100 Continue if the client asked for it and we have not yet. */
static int maybe_continue(struct http1_session *sv, int *sent)
{
    if (!sv->rq.head.expect_continue || *sent)
        return 0;
    *sent = 1;
    int rc = http1_flush(sv);
    if (rc)
        return rc;
    return wbuf_append(&sv->out, continue_line, sizeof(continue_line) - 1) ?: http1_flush(sv);
}

/* ---- bodies streamed to the handler (body.c) ---- */

/* What the coroutine drops of a streamed body the handler left unread before the connection
 * serves its next request; a larger rest closes the connection after the answer instead. */
#define HTTP1_DRAIN_MAX (1u << 20)

/* Hand the body whose first decoded bytes are c->buf[head_end..c->len) to a reader the handler
 * reads from (rq.body_rd), rather than read it whole: length its Content-Length, or -1 with st
 * the chunked decoder's state. The caller took a stream slot (body_slot_take), which the reader
 * now holds. The buffer keeps the head only. 0, or SERVE_CLOSE after answering. */
static int start_stream(struct http1_session *sv, size_t head_end, int64_t length,
                        const struct http_chunked *st)
{
    struct conn *c = sv->c;
    if (body_start(&sv->br, c, sv->srv, c->buf + head_end, c->len - head_end, length, st) < 0) {
        body_end(&sv->br);
        body_slot_give(sv->srv);
        return http1_error_close(sv, 503, "no memory for the request body");
    }
    c->len = head_end;
    sv->br.slot = 1; /* taken by the caller; body_end gives it back */
    sv->rq.body_rd = &sv->br;
    /* The budget bounds the bodies the server reads whole; a streamed one holds its window. */
    body_budget_release(sv);
    return 0;
}

/* After the handler's call, before its answer is framed: may the connection stay open? Not
 * after an error reading the body (its framing is lost) or with a large rest unread. What has
 * already arrived is dropped now; a streamed answer's rest is left alone (the application may
 * read the body while it answers). */
static int stream_keep(struct http1_session *sv, int keep)
{
    struct body_reader *br = sv->rq.body_rd;
    if (br->err)
        return 0;
    if (sv->rq.answer.kind == REQUEST_BODY_STREAM)
        return keep;
    uint64_t budget = HTTP1_DRAIN_MAX;
    int rc = body_drain(br, &budget);
    if (rc == 0)
        return keep;
    if (rc == -EAGAIN && !br->chunked && br->left <= budget)
        return keep;
    return 0;
}

/* After the answer: drop the rest of the streamed body (within HTTP1_DRAIN_MAX and
 * body_timeout per wait) and put what was read past its end back into the buffer, behind the
 * head (c->len), for the next request. 0, or -1 when the connection must close (it is lingered
 * over, so that the client reads the answer). */
static int finish_stream(struct http1_session *sv, int keep)
{
    struct body_reader *br = sv->rq.body_rd;
    struct conn *c = sv->c;
    int rc = -1;
    if (keep && !br->err) {
        uint64_t budget = HTTP1_DRAIN_MAX;
        for (;;) {
            rc = body_drain(br, &budget);
            if (rc != -EAGAIN)
                break;
            /* The answer goes out before the wait: the client may wait for it. */
            if (http1_flush(sv) < 0 ||
                sched_io_wait(&c->io, br->wait_out ? EPOLLOUT : EPOLLIN | EPOLLRDHUP,
                              conn_deadline_after(sv->srv->cfg.body_timeout_ns)) < 0) {
                rc = -ETIMEDOUT;
                break;
            }
        }
    }
    if (rc == 0) {
        const char *p;
        size_t n = body_tail(br, &p);
        if (n && conn_reserve(c, c->len + n) < 0)
            rc = -ENOMEM;
        else if (n) {
            memcpy(c->buf + c->len, p, n);
            c->len += n;
        }
    }
    body_end(br);
    sv->rq.body_rd = NULL;
    c->drained = 0; /* the handler's reads said nothing to the loop: look again */
    if (rc != 0) {
        if (http1_flush(sv) == 0)
            conn_linger_close(c);
        return -1;
    }
    return 0;
}

/* Read the body of the request whose head ends at head_end. On success *body, *body_len are set
 * and *next is where the next request starts; returns 0. A large body for a handler that reads
 * it as a stream is not read: sv->rq.body_rd is set instead (*body_len 0). Otherwise returns
 * SERVE_CLOSE after answering (413, 400, 408) or on a dead connection. */
static int read_body(struct http1_session *sv, size_t off, size_t head_len, const char **body,
                     size_t *body_len, size_t *next)
{
    struct conn *c = sv->c;
    struct server *s = sv->srv;
    size_t head_end = off + head_len;
    char *old_buf = c->buf;
    int sent_continue = 0;
    uint64_t t0 = 0; /* when reading the body began (sched_now_ns), for the minimum rate */
    *body = NULL;
    *body_len = 0;
    if (sv->rq.head.chunked) {
        struct http_chunked st;
        memset(&st, 0, sizeof(st));
        size_t dec = 0;   /* decoded body bytes at head_end */
        int streams = -1; /* does the handler take it as a stream? not asked yet */
        for (;;) {
            size_t l = c->len - (head_end + dec);
            int64_t r = http_chunked_decode(&st, c->buf + head_end + dec, &l,
                                            s->cfg.limits.max_header_bytes);
            if (r == -1) /* the decoder says which: 431 for a trailer section over its bound */
                return http1_error_close(sv, st.status, st.error);
            dec += l;
            if (dec > s->cfg.max_body_bytes)
                return http1_error_close(sv, 413, "request body too large");
            if (r >= 0) {
                c->len = head_end + dec + (size_t)r;
                break;
            }
            c->len = head_end + dec;
            /* A chunk announced bigger than what the limit leaves is refused now, not after
             * max_body_bytes of it have been read. While a size line is being read, remaining
             * holds its digits so far, which only grow. */
            if (st.remaining > s->cfg.max_body_bytes - dec)
                return http1_error_close(sv, 413, "request body too large");
            if (maybe_continue(sv, &sent_continue))
                return SERVE_CLOSE;
            if (dec > BODY_STREAM_MIN && streams && (streams = request_body_streams(&sv->rq)) &&
                body_slot_take(s)) {
                if (start_stream(sv, head_end, -1, &st))
                    return SERVE_CLOSE;
                *next = head_end;
                goto moved;
            }
            if (!t0)
                t0 = sched_now_ns();
            else if (body_too_slow(s, t0, dec))
                return http1_error_close(sv, 408, "request body too slow");
            if (body_budget_hold(sv, dec + 4096, conn_deadline_after(s->cfg.body_timeout_ns)))
                return http1_error_close(sv, 503, "too many request bodies in progress");
            if (conn_reserve(sv->c, c->len + 4096) < 0) /* within the limit: no memory */
                return http1_error_close(sv, 503, "no memory for the request body");
            ssize_t n = conn_read_wait(sv->c, conn_deadline_after(s->cfg.body_timeout_ns));
            if (n == -ETIMEDOUT)
                return http1_error_close(sv, 408, "request body timed out");
            if (n <= 0)
                return SERVE_CLOSE;
        }
        *body_len = dec;
        *next = head_end + dec;
    } else if (sv->rq.head.content_length > 0) {
        uint64_t cl = (uint64_t)sv->rq.head.content_length;
        if (cl > s->cfg.max_body_bytes)
            return http1_error_close(sv, 413, "request body too large");
        size_t need = head_end + (size_t)cl;
        if (c->len < need) {
            if (maybe_continue(sv, &sent_continue))
                return SERVE_CLOSE;
            /* A large body for a handler that reads bodies as streams: its first
             * BODY_STREAM_MIN bytes are read here all the same (a client that sends nothing
             * more than its head costs no call), the rest by the handler as it goes. */
            int stream = cl > BODY_STREAM_MIN && request_body_streams(&sv->rq);
            size_t until = stream ? head_end + BODY_STREAM_MIN : need;
            t0 = sched_now_ns();
            size_t had = c->len;
            for (;;) {
                /* Held before the buffer grows: the budget bounds what the server will hold. */
                if (body_budget_hold(sv, until - head_end,
                                     conn_deadline_after(s->cfg.body_timeout_ns)))
                    return http1_error_close(sv, 503, "too many request bodies in progress");
                if (conn_reserve(sv->c, until) < 0) /* within the limit: no memory */
                    return http1_error_close(sv, 503, "no memory for the request body");
                while (c->len < until) {
                    if (body_too_slow(s, t0, c->len - had))
                        return http1_error_close(sv, 408, "request body too slow");
                    ssize_t n = conn_read_wait(sv->c, conn_deadline_after(s->cfg.body_timeout_ns));
                    if (n == -ETIMEDOUT)
                        return http1_error_close(sv, 408, "request body timed out");
                    if (n <= 0)
                        return SERVE_CLOSE;
                }
                if (!stream || c->len >= need)
                    break; /* whole (a read may have brought it all) */
                if (body_slot_take(s)) {
                    if (start_stream(sv, head_end, (int64_t)cl, NULL))
                        return SERVE_CLOSE;
                    *next = head_end;
                    goto moved;
                }
                /* As many bodies stream as may: this one is read whole, as bodies were. */
                stream = 0;
                until = need;
            }
        }
        *body_len = (size_t)cl;
        *next = need;
    } else {
        *next = head_end;
    }
moved:
    if (c->buf != old_buf) {
        /* The buffer moved while it grew: the head's views must point into the new one. The
         * head bytes themselves did not change, so this parse gives the same result. */
        if (parse_head(sv, off) != (int)head_len)
            return http1_error_close(sv, 400, "request head changed");
    }
    if (*body_len)
        *body = c->buf + head_end;
    return 0;
}

/* Whether the comma-separated list v[0..n) holds token (case-insensitive). */
static int list_has_token(const char *v, size_t n, const char *token, size_t tlen)
{
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t start = i;
        while (i < n && v[i] != ',')
            i++;
        size_t end = i;
        while (end > start && (v[end - 1] == ' ' || v[end - 1] == '\t'))
            end--;
        if (end - start == tlen && strncasecmp(v + start, token, tlen) == 0)
            return 1;
    }
    return 0;
}

static const char upgrade_h2c_line[] =
    "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n";

/* `Upgrade: h2c` on the cleartext request whose head is c->buf[off..off+head_len) (RFC 7540
 * 3.2): 101, then HTTP/2, the request answered as stream 1. Only an HTTP/1.1 request without a
 * body, with one valid HTTP2-Settings field, is upgraded; any other (a POST's body would have
 * to be read whole first, as most servers decline too) is answered over HTTP/1.1, as if it had
 * not asked. Returns SERVE_IDLE or SERVE_CLOSE once upgraded, -1 when not upgraded. */
static int maybe_upgrade_h2c(struct http1_session *sv, size_t off, size_t head_len)
{
    const struct http_request *r = &sv->rq.head;
    if (r->minor_version != 1 || r->content_length > 0 || r->chunked || r->expect_continue ||
        server_draining(sv->srv))
        return -1;
    const char *up = NULL, *settings = NULL;
    size_t up_len = 0, settings_len = 0;
    int nsettings = 0;
    for (size_t i = 0; i < r->num_headers; i++) {
        const struct http_header *hd = &r->headers[i];
        if (hd->name_len == 7 && strncasecmp(hd->name, "upgrade", 7) == 0) {
            up = hd->value;
            up_len = hd->value_len;
        } else if (hd->name_len == 14 && strncasecmp(hd->name, "http2-settings", 14) == 0) {
            settings = hd->value;
            settings_len = hd->value_len;
            nsettings++;
        }
    }
    /* A server MUST NOT upgrade without exactly one HTTP2-Settings (RFC 7540 3.2.1). */
    if (!up || !list_has_token(up, up_len, "h2c", 3) || nsettings != 1 ||
        http2_upgrade_settings(settings, settings_len) < 0)
        return -1;
    if (http1_flush_with(sv, upgrade_h2c_line, sizeof(upgrade_h2c_line) - 1, 0) < 0)
        return SERVE_CLOSE;
    return http2_take_over_upgrade(sv->c, settings, settings_len, r, off + head_len) ? SERVE_CLOSE
                                                                                     : SERVE_IDLE;
}

static int serve_loop(struct http1_session *sv)
{
    struct conn *c = sv->c;
    struct server *s = sv->srv;
    size_t off = 0;
    int64_t head_deadline = -1;
    int drain_read = 0;
    for (;;) {
        if (off == c->len) {
            off = c->len = 0;
            if (http1_flush(sv) < 0)
                return SERVE_CLOSE;
            if (UNLIKELY(server_draining(s))) {
                /* Shutting down. A request the client has already sent is answered (with
                 * Connection: close) rather than reset by closing over it; nothing is waited
                 * for. One look: an answered request closes the connection anyway. */
                if (drain_read)
                    return SERVE_CLOSE;
                drain_read = 1;
                if (conn_read_once(sv->c) <= 0)
                    return SERVE_CLOSE;
                continue;
            }
            if (sv->c->drained) {
                int rc = sched_io_release(&c->io);
                if (rc == 0) {
                    conn_go_idle(sv->c);
                    return SERVE_IDLE;
                }
                if (rc != -EAGAIN)
                    return SERVE_CLOSE;
                sv->c->drained = 0;
            }
            ssize_t n = conn_read_once(sv->c);
            if (n == -EAGAIN)
                continue; /* drained is set now: release on the next turn */
            if (n <= 0)
                return SERVE_CLOSE;
        }
        int n = parse_head(sv, off);
        if (UNLIKELY(n < 0) && off == 0 && c->buf[0] == 'P' && s->cfg.http2) {
            /* h2c by prior knowledge (RFC 9113 3.3): the client preface, which HTTP/1 cannot
             * parse, starts the connection. Its rest is awaited like a head's. */
            int p = http2_preface_match(c->buf, c->len);
            if (p == 1)
                return http2_take_over(c) ? SERVE_CLOSE : SERVE_IDLE;
            if (p == 2)
                n = -2;
        }
        if (n == -2 && c->len - off == 2 && c->buf[off] == '\r' && c->buf[off + 1] == '\n' &&
            (!c->stray_crlf || UNLIKELY(server_draining(s)))) {
            /* A stray CRLF after a request (clients send one after a POST body) is not the
             * start of a head: drop it and let the connection go idle, rather than start the
             * head deadline and answer 408 to a request nobody sent. One, as RFC 9112 2.2
             * asks: more empty lines are the start of a head, bound by its size limit and its
             * deadline (dropping them all let a client hold a connection for ever with a CRLF
             * every few seconds, each restarting the keep-alive timer). While stopping, no
             * head is waited for after it anyway. */
            c->stray_crlf = 1;
            off = c->len;
            head_deadline = -1; /* no head has begun */
            continue;
        }
        if (n == -2) {
            if (head_deadline < 0)
                head_deadline = conn_deadline_after(s->cfg.header_timeout_ns);
            /* Responses to earlier pipelined requests go out before we wait for more. */
            if (http1_flush(sv) < 0)
                return SERVE_CLOSE;
            if (off) {
                memmove(c->buf, c->buf + off, c->len - off);
                c->len -= off;
                off = 0;
            }
            if (c->len == c->cap) {
                /* The parser answers 431/414 before a head outgrows the limits, so growth here
                 * is bounded by max_header_bytes, or max_target_bytes and the method while a
                 * long target arrives; the check is a second line of defence. */
                if (c->cap > s->cfg.limits.max_header_bytes + s->cfg.limits.max_target_bytes +
                                 CONN_BUF_INITIAL)
                    return http1_error_close(sv, 431, "request head too large");
                if (conn_reserve(sv->c, c->cap * 2) < 0)
                    return SERVE_CLOSE;
            }
            ssize_t r = conn_read_wait(sv->c, head_deadline);
            if (r == -ETIMEDOUT)
                return http1_error_close(sv, 408, "request head not received in time");
            if (r <= 0)
                return SERVE_CLOSE;
            continue;
        }
        if (n < 0) {
            if (UNLIKELY(off == 0 && s->cfg.http2 && c->tp == &conn_plain &&
                         not_http1_version(c->buf, c->len)))
                return SERVE_CLOSE;
            return http1_error_close(sv, sv->rq.head.status ? sv->rq.head.status : 400,
                                     sv->rq.head.error ? sv->rq.head.error : "malformed request");
        }
        head_deadline = -1;
        c->stray_crlf = 0;
        sv->rq.client_done = REQUEST_CLIENT_TODO;
        if (UNLIKELY(s->cfg.access_log_fd >= 0)) {
            sv->rq.log_have_req = 1;
            sv->rq.log_t0 = clock_mono_ns();
        }
        if (UNLIKELY(s->cfg.http2 == 2))
            /* HTTP/2 only (--http 2): an HTTP/1 request, an Upgrade: h2c too, gets an answer an
             * HTTP/1 client can read and show, rather than the HTTP/2 frames and close that
             * an h2-only server's library sends (docs/architecture.md, "HTTP/2"). */
            return http1_error_close(sv, 505,
                                     "this server speaks HTTP/2 only: connect with the "
                                     "HTTP/2 preface (prior knowledge), or h2 by ALPN");
        if (UNLIKELY(sv->rq.head.upgrade) && s->cfg.http2 && c->tp == &conn_plain) {
            int up = maybe_upgrade_h2c(sv, off, (size_t)n);
            if (up >= 0)
                return up;
        }
        uint64_t metrics_t0 = UNLIKELY(s->metrics_on) ? clock_mono_ns() : 0;
        if (UNLIKELY(sv->rq.head.expect_continue) && !request_reads_body(&sv->rq)) {
            /* Routing comes before 100 Continue: a 404, a 405, or a route that reads no body is
             * the answer, so the client never uploads for nothing. What it sends anyway is not
             * read: the connection closes after the answer. (413 comes from read_body's
             * limits, also before 100 Continue.) */
            int rc = request_dispatch(&sv->rq, NULL, 0);
            if (LIKELY(rc == 0))
                rc = http1_send_answer(sv, 0);
            if (UNLIKELY(s->metrics_on) && rc == 0)
                metrics_note_request(server_metrics_self(s), sv->rq.mkind, sv->rq.answer.status,
                                     clock_mono_ns() - metrics_t0);
            if (UNLIKELY(s->cfg.access_log_fd >= 0)) {
                access_log_write(&sv->rq);
                sv->rq.log_have_req = 0;
            }
            http1_flush(sv);
            return SERVE_CLOSE;
        }
        const char *body = NULL;
        size_t body_len = 0, next = off;
        sv->rq.body_left = 0;
        sv->rq.body_chunked = sv->rq.body_overread = 0;
        if (UNLIKELY(sv->rq.head.chunked) && request_streams_body(&sv->rq)) {
            /* A chunked body the handler reads as it arrives: decoded piece by piece as it is
             * asked for (request.c, body_piece_chunked), from what the buffer holds, then from
             * the socket. Its size is known only at its end: max_body_bytes is checked as it
             * goes. */
            size_t head_end = off + (size_t)n;
            memset(&sv->rq.body_ch, 0, sizeof(sv->rq.body_ch));
            sv->rq.body_chunked = 1;
            sv->rq.body_left = REQUEST_BODY_OPEN;
            sv->rq.body_at = head_end;
            sv->rq.body_end = sv->rq.body_rest = next = c->len;
            sv->rq.body_continue = sv->rq.head.expect_continue;
        } else if (sv->rq.head.content_length > 0 && !sv->rq.head.chunked &&
                   UNLIKELY(request_streams_body(&sv->rq))) {
            /* The handler reads the body as it arrives (request.h, body_left): what the buffer
             * holds now is its first part, the rest stays in the socket until asked for. */
            uint64_t cl = (uint64_t)sv->rq.head.content_length;
            if (cl > s->cfg.max_body_bytes)
                return http1_error_close(sv, 413, "request body too large");
            size_t head_end = off + (size_t)n;
            size_t have = c->len - head_end;
            if (have > cl)
                have = (size_t)cl;
            sv->rq.body_left = cl;
            sv->rq.body_at = head_end;
            sv->rq.body_end = next = head_end + have;
            sv->rq.body_continue = sv->rq.head.expect_continue && have < cl;
        } else if (read_body(sv, off, (size_t)n, &body, &body_len, &next)) {
            return SERVE_CLOSE;
        }
        int keep = sv->rq.head.keep_alive && !server_draining(s);
        int rc = request_dispatch(&sv->rq, body, body_len);
        struct handoff *ws = NULL;
        if (UNLIKELY(sv->rq.defer != NULL) && rc == 0 && sv->rq.defer->ws &&
            sv->rq.answer.status == 101) {
            /* A WebSocket accepted: its handoff is the connection's channel from now on, not
             * left with the answer. */
            ws = sv->rq.defer;
            sv->rq.defer = NULL;
            keep = 1;
        }
        struct wsn *wsn = sv->rq.wsn;
        if (UNLIKELY(wsn != NULL)) {
            /* A GIL-free WebSocket accepted: the 101 keeps the connection, whatever its head
             * said about keep-alive. */
            sv->rq.wsn = NULL;
            keep = 1;
        }
        if (UNLIKELY(sv->rq.body_left != 0) && rc == 0 && !sv->rq.body_chunked &&
            sv->rq.answer.kind != REQUEST_BODY_STREAM && !sv->rq.answer.close &&
            sv->rq.body_left == sv->rq.body_end - sv->rq.body_at) {
            /* The handler answered in full without reading a body that came whole with the
             * head (an ASGI app's early 401 or 404 to a POST): it can no longer ask for it, so
             * it is skipped in the buffer, as reading it would have, and the connection stays
             * open, as uvicorn keeps it. A rest still in the socket closes it below. */
            sv->rq.body_at = sv->rq.body_end;
            sv->rq.body_left = 0;
        }
        int body_unread = sv->rq.body_left != 0 || sv->rq.body_overread;
        if (UNLIKELY(sv->rq.body_chunked) && !body_unread)
            next = sv->rq.body_rest; /* what came after the body (request.c, rest_of_chunked) */
        if (UNLIKELY(body_unread))
            keep = 0; /* a body not read whole: the rest is in the socket, where the next
                       * request would be, so this answer closes the connection */
        if (UNLIKELY(sv->rq.body_rd != NULL) && rc == 0)
            keep = stream_keep(sv, keep);
        if (LIKELY(rc == 0))
            rc = http1_send_answer(sv, keep);
        body_budget_release(sv);
        {
            /* --max-requests and Server.stats() read the sum over the threads.
             * safety: written by this thread only (its own worker's entry: a plain store, no
             * locked add), read by server_get_stats; relaxed atomics make that read defined. */
            struct server_worker *mine = server_worker_self(s);
            atomic_store_explicit(&mine->answered,
                                  atomic_load_explicit(&mine->answered, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
            if (UNLIKELY(s->metrics_on) && rc == 0)
                metrics_note_request(server_metrics_self(s), sv->rq.mkind, sv->rq.answer.status,
                                     clock_mono_ns() - metrics_t0);
        }
        if (UNLIKELY(s->cfg.access_log_fd >= 0)) {
            access_log_write(&sv->rq);
            sv->rq.log_have_req = 0;
        }
        sv->rq.client_done = REQUEST_CLIENT_NO_HEAD;
        if (UNLIKELY(sv->rq.body_left != 0))
            sv->rq.body_left = 0;
        if (UNLIKELY(wsn != NULL)) {
            /* The connection becomes the GIL-free WebSocket's (ws_nogil.h), idle between its
             * messages; the bytes behind the handshake are the client's first frames. */
            if (rc == 0 && sv->rq.answer.status == 101)
                rc = http1_flush(sv);
            else if (rc == 0)
                rc = -EPROTO;
            if (rc != 0) {
                wsn_discard(wsn);
                return SERVE_CLOSE;
            }
            return wsn_take_over(c, wsn, next) ? SERVE_CLOSE : SERVE_IDLE;
        }
        if (UNLIKELY(ws != NULL)) {
            /* The connection switches protocol after the 101 (ws_conn.h); the bytes behind
             * the handshake are the client's first frames. */
            if (rc == 0)
                rc = http1_flush(sv);
            if (rc == 0)
                return wsconn_take_over(c, ws, next) ? SERVE_CLOSE : SERVE_IDLE;
            handoff_leave(ws);
            return SERVE_CLOSE;
        }
        if (rc < 0)
            return SERVE_CLOSE;
        if (sv->rq.resp.close)
            keep = 0;
        off = next;
        if (UNLIKELY(sv->rq.body_rd != NULL) && finish_stream(sv, keep) < 0)
            return SERVE_CLOSE;
        if (!keep) {
            http1_flush(sv);
            if (UNLIKELY(body_unread))
                conn_linger_close(c); /* closing over unread bytes would reset the answer */
            return SERVE_CLOSE;
        }
        if (sv->out.len >= HTTP1_OUT_FLUSH_AT && http1_flush(sv) < 0)
            return SERVE_CLOSE;
    }
}

/* conn_proto.on_timeout of HTTP/1: an idle keep-alive connection past its time is closed. */
void http1_on_timeout(struct conn *c)
{
    conn_destroy(c);
}

int http1_serve(struct coro *co, void *arg)
{
    struct conn *c = arg;
    struct server *s = c->home->srv;
    /* The serving state lives in this frame: no allocation per coroutine. The scheduler
     * unwinds a coroutine it cancels by resuming it with -ECANCELED, so the cleanup below runs
     * then too; only a coroutine freed while never resumed again would leave the heap parts of
     * its buffers (grown past their inline sizes) behind, and that happens at most once per
     * connection, at shutdown. */
    struct http1_session state;
    struct http1_session *sv = &state;
    sv->c = c;
    sv->srv = s;
    sv->rq.c = c;
    sv->rq.srv = s;
    sv->rq.log_status = 0;
    sv->rq.log_have_req = 0;
    sv->rq.defer = NULL;
    sv->rq.wsn = NULL;
    sv->rq.body_rd = NULL;
    sv->rq.http2 = 0;
    sv->body_held = 0;
    sv->rq.client_done = REQUEST_CLIENT_NO_HEAD;
    resp_init(&sv->rq.resp);
    wbuf_init(&sv->out, sv->out_inline, sizeof(sv->out_inline));
    sv->rq.max_headers = s->cfg.limits.max_headers;
    sv->rq.hdrs = sv->rq.hdr_inline;
    if (sv->rq.max_headers > INLINE_HEADERS) {
        sv->rq.hdrs = coro_malloc(co, sizeof(struct http_header) * sv->rq.max_headers);
        if (UNLIKELY(!sv->rq.hdrs)) {
            conn_destroy(c);
            return 0;
        }
    }
    memset(&sv->rq.head, 0, sizeof(sv->rq.head));
    int rc = SERVE_CLOSE;
    if (UNLIKELY(c->pp_wait) && conn_proxy_preface(c) < 0)
        goto out; /* a load balancer that does not speak its own protocol: no answer */
    if (UNLIKELY(c->tp->handshake != NULL)) {
        /* TLS: the handshake first, so that ALPN says which protocol speaks. */
        int p = c->tp->handshake(c);
        if (p <= 0)
            goto out;
        if (p == CONN_ALPN_H2 && s->cfg.http2) {
            rc = http2_take_over(c) ? SERVE_CLOSE : SERVE_IDLE;
            goto out;
        }
    }
    if (c->pend) {
        /* The rest of an answer the inline path began. */
        struct iovec iov = {c->buf, c->pend};
        if (conn_sendv(sv->c, &iov, 1, 0) < 0 || c->pend_close)
            goto out;
        c->pend = 0;
    }
    rc = serve_loop(sv);
out:
    serve_cleanup(sv);
    if (rc == SERVE_CLOSE)
        conn_destroy(c);
    return 0;
}
