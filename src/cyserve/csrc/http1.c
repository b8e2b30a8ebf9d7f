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
#include <sys/socket.h>
#include <sys/uio.h>

#include "access_log.h"
#include "clock.h"
#include "handler_static.h"
#include "sched.h"
#include "server_int.h"

int http1_static_head(int status, const char *lines, size_t lines_len, size_t body_len,
                      char **out, size_t *out_len)
{
    struct wbuf h;
    wbuf_init(&h, NULL, 0);
    size_t rlen;
    const char *reason = http_reason(status, &rlen);
    char line[96];
    int n = snprintf(line, sizeof(line), "HTTP/1.1 %03d %.*s\r\nServer: cyserve\r\n", status,
                     (int)rlen, reason);
    int rc = wbuf_append(&h, line, (size_t)n);
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

static void serve_cleanup(void *arg)
{
    struct http1_session *sv = arg;
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
    int n = http_write_error(&sv->out, status, detail, head_only, http1_date());
    access_log_note(&sv->rq, status, n < 0 ? -1 : n);
    access_log_write(&sv->rq);
    if (n >= 0 && http1_flush(sv) == 0)
        conn_linger_close(sv->c);
    return SERVE_CLOSE;
}

/* A short response that keeps the connection (404, 405, 500 ...). extra: header lines. */
int http1_simple_put(struct wbuf *out, int status, const char *body, const char *extra,
                     int minor, int keep, int head_only)
{
    size_t blen = strlen(body);
    char lines[256];
    int n = snprintf(lines, sizeof(lines), "Content-Type: text/plain; charset=utf-8\r\n%s",
                     extra ? extra : "");
    if (n < 0 || (size_t)n >= sizeof(lines))
        n = 0;
    int rc = http_write_head(out, status, minor, keep, blen, lines, (size_t)n, http1_date());
    if (!rc && !head_only)
        rc = wbuf_append(out, body, blen);
    return rc;
}

int http1_simple_response(struct http1_session *sv, int status, const char *body,
                          const char *extra, int keep, int head_only)
{
    access_log_note(&sv->rq, status, head_only ? 0 : (int64_t)strlen(body));
    return http1_simple_put(&sv->out, status, body, extra, sv->rq.head.minor_version, keep,
                            head_only);
}

int http1_send_resp(struct http1_session *sv, int keep, int head_only)
{
    struct cyserve_response *r = &sv->rq.resp;
    if (r->close)
        keep = 0;
    size_t blen = 0, body_len;
    const char *body = resp_body(r, &body_len);
    int rc = http1_resp_head_put(&sv->out, r, sv->rq.head.minor_version, keep, head_only, &blen);
    access_log_note(&sv->rq, r->status, head_only ? 0 : (int64_t)blen);
    if (UNLIKELY(rc))
        return rc;
    if (head_only || !blen)
        return 0;
    if (blen <= BODY_COPY_MAX)
        return wbuf_append(&sv->out, body, blen);
    int fd =
        r->body_static && blen > STATIC_MEMFD_MIN ? static_ext_memfd(sv->srv, body, blen) : -1;
    if (fd < 0)
        return http1_flush_with(sv, body, blen, 0);
    rc = http1_flush_with(sv, NULL, 0, MSG_MORE);
    return rc ? rc : conn_sendfile(sv->c, fd, 0, blen);
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

/* Read the body of the request whose head ends at head_end. On success *body, *body_len are set
 * and *next is where the next request starts; returns 0. Otherwise returns SERVE_CLOSE after
 * answering (413, 400, 408) or on a dead connection. */
static int read_body(struct http1_session *sv, size_t off, size_t head_len, const char **body,
                     size_t *body_len, size_t *next)
{
    struct conn *c = sv->c;
    struct server *s = sv->srv;
    size_t head_end = off + head_len;
    char *old_buf = c->buf;
    int sent_continue = 0;
    *body = NULL;
    *body_len = 0;
    if (sv->rq.head.chunked) {
        struct http_chunked st;
        memset(&st, 0, sizeof(st));
        size_t dec = 0; /* decoded body bytes at head_end */
        for (;;) {
            size_t l = c->len - (head_end + dec);
            int64_t r = http_chunked_decode(&st, c->buf + head_end + dec, &l,
                                            s->cfg.limits.max_header_bytes);
            if (r == -1)
                return http1_error_close(sv, 400, "invalid chunked body");
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
            if (conn_reserve(sv->c, c->len + 4096) < 0)
                return http1_error_close(sv, 413, "request body too large");
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
            if (conn_reserve(sv->c, need) < 0)
                return http1_error_close(sv, 413, "request body too large");
            while (c->len < need) {
                ssize_t n = conn_read_wait(sv->c, conn_deadline_after(s->cfg.body_timeout_ns));
                if (n == -ETIMEDOUT)
                    return http1_error_close(sv, 408, "request body timed out");
                if (n <= 0)
                    return SERVE_CLOSE;
            }
        }
        *body_len = (size_t)cl;
        *next = need;
    } else {
        *next = head_end;
    }
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

/* Whether b[0..n) is nothing but complete empty lines (CRLF pairs), which RFC 9112 2.2 lets a
 * server ignore before a request line. */
static int only_empty_lines(const char *b, size_t n)
{
    if (n == 0 || n % 2)
        return 0;
    for (size_t i = 0; i < n; i += 2)
        if (b[i] != '\r' || b[i + 1] != '\n')
            return 0;
    return 1;
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
        if (n == -2 && only_empty_lines(c->buf + off, c->len - off)) {
            /* A stray CRLF after a request (clients send one after a POST body) is not the
             * start of a head: drop it and let the connection go idle, rather than start the
             * head deadline and answer 408 to a request nobody sent. */
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
        if (n < 0)
            return http1_error_close(sv, sv->rq.head.status ? sv->rq.head.status : 400,
                               sv->rq.head.error ? sv->rq.head.error : "malformed request");
        head_deadline = -1;
        if (UNLIKELY(s->cfg.access_log_fd >= 0)) {
            sv->rq.log_have_req = 1;
            sv->rq.log_t0 = clock_mono_ns();
        }
        const char *body = NULL;
        size_t body_len = 0, next = off;
        if (read_body(sv, off, (size_t)n, &body, &body_len, &next))
            return SERVE_CLOSE;
        int keep = sv->rq.head.keep_alive && !server_draining(s);
        int rc = request_dispatch(sv, body, body_len, keep);
        if (UNLIKELY(s->cfg.access_log_fd >= 0)) {
            access_log_write(&sv->rq);
            sv->rq.log_have_req = 0;
        }
        if (rc < 0)
            return SERVE_CLOSE;
        if (sv->rq.resp.close)
            keep = 0;
        off = next;
        if (!keep) {
            http1_flush(sv);
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

