/* http_write.h: HTTP/1.1 response serialisation, the per-thread Date cache, growable byte
 * buffers, and the cyserve_response builder that GIL-free and Python handlers fill.
 *
 * Error convention of this module: 0 or -errno (-ENOMEM, -EINVAL). Nothing here does I/O: the
 * engine (server.c) owns the sockets and decides when bytes go out. Nothing here is shared
 * between threads: a response, its buffers and its arena belong to the coroutine serving the
 * request, and the Date cache is per thread. */
#ifndef CYSERVE_HTTP_WRITE_H
#define CYSERVE_HTTP_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "http_date.h"

#include "cyserve/handler.h"

/* ---- growable byte buffers ---- */

/* A byte buffer that starts in caller-provided storage (often on the coroutine stack) and moves
 * to the heap when it outgrows it. */
struct wbuf {
    char *ptr;
    size_t len;
    size_t cap;
    char *heap; /* == ptr once on the heap, else NULL */
};

/* Start b empty over storage[0..cap) (storage may be NULL with cap 0). Any thread. */
void wbuf_init(struct wbuf *b, char *storage, size_t cap);

/* The slow half of wbuf_reserve: move to a larger heap buffer. Returns 0 or -ENOMEM. */
int wbuf_grow(struct wbuf *b, size_t extra);

/* Make room for extra more bytes. Returns 0 or -ENOMEM (b unchanged). Inline: on every
 * response's path, and nearly always a comparison. */
static inline int wbuf_reserve(struct wbuf *b, size_t extra)
{
    if (__builtin_expect(b->cap - b->len >= extra, 1))
        return 0;
    return wbuf_grow(b, extra);
}

/* Append n bytes. Returns 0 or -ENOMEM. */
static inline int wbuf_append(struct wbuf *b, const void *data, size_t n)
{
    int rc = wbuf_reserve(b, n);
    if (__builtin_expect(rc != 0, 0))
        return rc;
    if (n)
        memcpy(b->ptr + b->len, data, n);
    b->len += n;
    return 0;
}

/* Free heap storage, if any; b must be wbuf_init()ed again before reuse. */
void wbuf_free(struct wbuf *b);

/* ---- request-scoped arena ---- */

/* Blocks freed together when the request ends: cyserve_resp_alloc() memory. */
struct resp_arena {
    struct resp_arena_block *head;
};

/* 16-byte aligned memory that lives until resp_arena_reset(). Returns NULL on ENOMEM. */
void *resp_arena_alloc(struct resp_arena *a, size_t size);
void resp_arena_reset(struct resp_arena *a);

/* ---- the response builder ---- */

#define RESP_INLINE_HEADERS 256
#define RESP_INLINE_BODY 1024

/* What a handler fills. Lives in the serving coroutine's frame; handlers see it as the opaque
 * cyserve_response. Header lines are kept serialised ("Name: value\r\n"), so emitting the
 * response head is one copy. */
struct cyserve_response {
    int status;               /* 200 unless set */
    int close;                /* the handler asked for Connection: close */
    int has_content_type;     /* a Content-Type line is in headers */
    struct wbuf headers;      /* "Name: value\r\n" lines added by the handler */
    struct wbuf body;
    /* A body the handler promised outlives the server (resp_set_body_static): sent straight from
     * there, never copied into body. NULL when unset; then body is the body. */
    const char *body_static;
    size_t body_static_len;
    /* The Content-Length an answer to HEAD announces when the body is empty: what the same
     * request with GET would carry (a WSGI app answers HEAD with no body but its length). -1
     * when unset: then the body's own length. Never used for other methods. */
    int64_t head_length;
    /* Set by a Python handler whose body is still being produced (resp_set_stream): the engine
     * sends the head and the body so far, then asks the target's py_stream for the rest, piece
     * by piece (server.c, "streamed answers"). NULL for a whole answer. Not owned here. */
    void *stream;
    /* The Content-Length a streamed body announced, or -1: then it goes out chunked. */
    int64_t stream_length;
    struct resp_arena arena;  /* cyserve_resp_alloc() */
    char inline_headers[RESP_INLINE_HEADERS];
    char inline_body[RESP_INLINE_BODY];
};

/* Prepare r for a request (status 200, no headers, empty body). */
void resp_init(struct cyserve_response *r);

/* Forget the previous response's content but keep heap buffers for the next one. */
void resp_reset(struct cyserve_response *r);

/* Free everything r holds. */
void resp_free(struct cyserve_response *r);

/* Set the (final) status: 0, or -EINVAL outside 200..599. */
int resp_set_status(struct cyserve_response *r, int status);

/* Add a header line. Names are tokens, values have no control characters but HTAB: -EINVAL
 * otherwise, which is
 * what stops a handler from splitting the response. Content-Length, Transfer-Encoding, Date,
 * Server and Connection are managed by the engine: -EPERM. Returns 0, -EINVAL, -EPERM or -ENOMEM. */
int resp_add_header(struct cyserve_response *r, const char *name, size_t nlen, const char *value,
                    size_t vlen);

/* Set Content-Type (replacing a previous one set this way is not supported: -EEXIST). */
int resp_set_content_type(struct cyserve_response *r, const char *value, size_t vlen);

/* Append to the body. Returns 0, -ENOMEM, or -EEXIST when a static body was set. */
int resp_write(struct cyserve_response *r, const void *data, size_t len);

/* Make data[0..len) the whole body without copying it per response: the engine writes it to the
 * socket from there (or, when large, from a memfd snapshot it takes on first use, server.c). data must stay valid and unchanged as long as the server runs (process-lifetime memory:
 * a static array, or a buffer allocated once and never freed while serving). Exclusive with
 * resp_write: -EEXIST if the body already has bytes or a static body was set; -EINVAL for
 * data == NULL with len > 0. Returns 0. */
int resp_set_body_static(struct cyserve_response *r, const void *data, size_t len);

/* Announce n as the Content-Length of an answer to HEAD whose body is empty (see head_length),
 * or, with RESP_LENGTH_UNKNOWN, announce none (GET's length is not known: its body would be
 * streamed). Returns 0, or -EINVAL for any other negative n. */
#define RESP_LENGTH_UNKNOWN (-2)
int resp_set_head_length(struct cyserve_response *r, int64_t n);

/* Mark r's body as unfinished: stream is the handler's state, handed back to its target's
 * py_stream (server.h) until the body ends; length is the whole body's, when the handler
 * announced it, else -1 (the body then goes out chunked). Returns 0, or -EINVAL for NULL, a
 * static body or a length under -1. */
int resp_set_stream(struct cyserve_response *r, void *stream, int64_t length);

/* http_write_head's content_length for an answer whose length is not known in advance: the
 * body goes out in chunks (HTTP/1.1), or until the connection closes (HTTP/1.0). */
#define HTTP_LENGTH_CHUNKED UINT64_MAX
#define HTTP_LENGTH_UNTIL_CLOSE (UINT64_MAX - 1)

/* The body to send: the static one if set, else the written one. Sets *len. */
static inline const char *resp_body(const struct cyserve_response *r, size_t *len)
{
    if (r->body_static) {
        *len = r->body_static_len;
        return r->body_static;
    }
    *len = r->body.len;
    return r->body.ptr;
}

/* Request-scoped memory for a handler (freed when the next request starts or the connection's
 * coroutine ends; never by the handler). 16-byte aligned; NULL on ENOMEM. */
void *resp_alloc(struct cyserve_response *r, size_t size);

/* ---- serialisation ---- */

/* This thread's cached Date value for wall-clock second now_s: formatted at most once a second
 * per thread. Returns a pointer to HTTP_DATE_LEN bytes, valid until the next call on this
 * thread. */
const char *http_date_cached(time_t now_s);

/* The reason phrase of status (empty for codes not registered with IANA). Sets *len. */
const char *http_reason(int status, size_t *len);

/* Append a response head to out: status line, Server, Date, Content-Length (omitted for 1xx,
 * 204 and 304), Connection: close when !keep_alive (and keep-alive for HTTP/1.0 clients that
 * asked for it), the extra lines (already "Name: value\r\n" serialised, may be NULL), and the
 * empty line. minor_version is the request's (the status line always says HTTP/1.1).
 * Returns 0 or -ENOMEM. */
int http_write_head(struct wbuf *out, int status, int minor_version, int keep_alive,
                    uint64_t content_length, const char *extra, size_t extra_len,
                    const char *date);

/* Append a complete error response (text/plain body "<status> <reason>: <detail>\n") with
 * Connection: close; head_only (the request was HEAD): the same head, no body (RFC 9110 9.3.2).
 * Returns the body bytes appended (0 for head_only; for the access log), or -ENOMEM. */
int http_write_error(struct wbuf *out, int status, const char *detail, int head_only,
                     const char *date);

#endif
