/* http1.h: HTTP/1.1 on a connection: the coroutine that serves it (http1.c), the inline path
 * (http1_inline.c), and the framing of answers both share. Internal to the engine; error
 * convention 0 or -errno. */
#ifndef CYSERVE_HTTP1_H
#define CYSERVE_HTTP1_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "body.h"
#include "compat.h"
#include "conn.h"
#include "coro.h"
#include "http_date.h"
#include "http_parse.h"
#include "http1_write.h"
#include "resp.h"
#include "request.h"
#include "server.h"

/* Output buffer kept in the serving state; responses of pipelined requests accumulate in it. */
#define HTTP1_OUT_INLINE 4096
#define HTTP1_OUT_FLUSH_AT 16384

/* The HTTP/1 serving state of a connection, on its coroutine's stack: the output buffer in
 * which the answers of pipelined requests accumulate, and the request being served. */
struct http1_session {
    struct conn *c;
    struct server *srv;
    struct wbuf out;
    char out_inline[HTTP1_OUT_INLINE];
    struct request rq;
    uint64_t body_held;    /* bytes of the server's body budget this request holds (http1.c) */
    struct body_reader br; /* the request's body when it is streamed (rq.body_rd points here) */
};

/* HTTP/1.1 as a connection's protocol (conn_proto): on_readable tries the inline path, then
 * spawns http1_serve. Every connection starts with it. */
extern const struct conn_proto http1_proto;

/* The coroutine serving connection arg (a struct conn *) until it is idle again or closed.
 * Spawned by http1_proto's on_readable. */
int http1_serve(struct coro *co, void *arg);

/* conn_proto.on_timeout of HTTP/1: an idle keep-alive connection past its time is closed. */
void http1_on_timeout(struct conn *c);

/* The Date field's value for now (IMF-fixdate, HTTP_DATE_LEN bytes), cached per second. */
static inline const char *http1_date(void)
{
    return http_date_cached(time(NULL));
}

/* An absolute-form target may have an empty path ("GET http://a HTTP/1.1"); RFC 9110 4.2.3 makes
 * it "/". The parser leaves it empty so that its views stay inside the buffer. */
static inline void http1_empty_path_is_root(struct http_request *req)
{
    if (UNLIKELY(req->path_len == 0)) {
        req->path = "/";
        req->path_len = 1;
    }
}

/* Room http1_static_head_put() needs at most. */
#define HTTP1_STATIC_HEAD_MAX(t) ((t)->static_head_len + 64 + HTTP_DATE_LEN)

/* Write the head of static target t at p (HTTP1_STATIC_HEAD_MAX bytes of room): its serialised
 * lines, Date (unless the server writes none: t->static_no_date), the Connection field when it is not the version's default, the empty line.
 * Returns the end. */
static inline char *http1_static_head_put(char *p, const struct server_target *t, int keep,
                                          int minor)
{
    memcpy(p, t->static_head, t->static_head_len);
    p += t->static_head_len;
    if (LIKELY(!t->static_no_date)) {
        memcpy(p, "Date: ", 6);
        p += 6;
        memcpy(p, http1_date(), HTTP_DATE_LEN);
        p += HTTP_DATE_LEN;
        memcpy(p, "\r\n", 2);
        p += 2;
    }
    if (!keep) {
        memcpy(p, "Connection: close\r\n", 19);
        p += 19;
    } else if (minor == 0) {
        memcpy(p, "Connection: keep-alive\r\n", 24);
        p += 24;
    }
    memcpy(p, "\r\n", 2);
    return p + 2;
}

/* The head of answer a into out with the server's fields head (http_write_head, or
 * http_write_head_own when the handler set its own Server or reason phrase). 0 or -ENOMEM. */
static inline int http1_answer_head(struct wbuf *out, const struct http_head *head,
                                    const struct request_answer *a, int minor, int keep)
{
    if (UNLIKELY(a->own_head))
        return http_write_head_own(out, head, a->status, a->reason, a->reason_len,
                                   a->own_head & RESP_OWN_SERVER, minor, keep, a->length, a->lines,
                                   a->lines_len, http1_date());
    return http_write_head(out, head, a->status, minor, keep, a->length, a->lines, a->lines_len,
                           http1_date());
}

/* Frame answer a, whose body is in memory (REQUEST_BODY_BYTES), into out: its head, then its
 * body unless head_only. 0 or -ENOMEM. For the inline path, which sends out at once. */
static inline int http1_put_answer(struct wbuf *out, const struct http_head *head,
                                   const struct request_answer *a, int minor, int keep,
                                   int head_only)
{
    int rc = http1_answer_head(out, head, a, minor, keep);
    if (!rc && !head_only && a->body_len)
        rc = wbuf_append(out, a->body, a->body_len);
    return rc;
}

/* Whether answer a (a whole body, in memory or a file) goes out framed for its trailers: it has
 * some (RESP_OWN_TRAILERS), the client speaks HTTP/1.1 (an HTTP/1.0 body cannot be chunked: its
 * trailers are dropped and it keeps its Content-Length) and the status has content (1xx, 204
 * and 304 have none for trailers to follow). Then its body is one chunk, whatever the client's
 * TE, as an ASGI app's that announced trailers: the head does not depend on a request field
 * read only for the trailer section. Pure. */
static inline int http1_trailed(const struct request_answer *a, int minor)
{
    /* own_head alone first: http1_answer_head, which follows, tests it too, and the compiler
     * threads the two tests into one where it is 0, so the usual answer pays nothing here. */
    return UNLIKELY(a->own_head) && (a->own_head & RESP_OWN_TRAILERS) && minor >= 1 &&
           a->status >= 200 && a->status != 204 && a->status != 304 && a->status != 205;
}

/* Frame answer a, whose body is in memory and which http1_trailed, into out: its head with
 * Transfer-Encoding: chunked (as GET's for a HEAD), then unless head_only its body as one chunk
 * (none when empty) and the end of the chunked body with trailers[0..tlen) (resp_add_trailer's
 * lines; tlen 0 when the client did not ask for them). 0 or -ENOMEM. The serving coroutine or
 * the inline path, on out. */
int http1_put_answer_trailed(struct wbuf *out, const struct http_head *head,
                             const struct request_answer *a, int minor, int keep, int head_only,
                             const char *trailers, size_t tlen);

/* The pre-serialised head of a static answer (status, the server's fields head -- less its
 * Server line when lines hold their own --, Content-Length unless the status has no body, then
 * the headers lines[0..lines_len)): *out
 * (malloc'd, the caller frees it) and *out_len. Returns 0 or -ENOMEM. Date, Connection and the
 * empty line are added per request by http1_static_head_put(). */
int http1_static_head(const struct http_head *head, int status, const char *lines, size_t lines_len,
                      size_t body_len, char **out, size_t *out_len);

/* Write sv's output buffer, then extra[0..extra_len) if any, in one send. flags: as conn_sendv.
 * 0 or -errno. The serving coroutine. */
int http1_flush_with(struct http1_session *sv, const void *extra, size_t extra_len, int flags);

/* Write sv's output buffer if it holds anything. 0 or -errno. */
int http1_flush(struct http1_session *sv);

/* Frame and send sv->rq.answer, which the request core filled (request_dispatch): into the
 * output buffer behind earlier pipelined answers, large bodies and files straight out. keep:
 * the connection may stay open (the answer may still close it). Releases the answer's file.
 * 0 or -errno (the connection must close). The serving coroutine. */
int http1_send_answer(struct http1_session *sv, int keep);

#endif
