/* http_write.c: response serialisation, Date cache, byte buffers, the response builder.
 *
 * Everything here is single-threaded by construction: buffers and responses belong to one
 * coroutine, and the Date cache is a thread-local, so no atomics are needed. */
#include "http_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compat.h"

/* ---- wbuf ---- */

void wbuf_init(struct wbuf *b, char *storage, size_t cap)
{
    b->ptr = storage;
    b->len = 0;
    b->cap = storage ? cap : 0;
    b->heap = NULL;
}

int wbuf_grow(struct wbuf *b, size_t extra)
{
    if (UNLIKELY(extra > SIZE_MAX / 2 - b->len))
        return -ENOMEM;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra)
        cap *= 2;
    char *p;
    if (b->heap) {
        p = realloc(b->heap, cap);
        if (UNLIKELY(!p))
            return -ENOMEM;
    } else {
        p = malloc(cap);
        if (UNLIKELY(!p))
            return -ENOMEM;
        if (b->len)
            memcpy(p, b->ptr, b->len);
    }
    b->heap = b->ptr = p;
    b->cap = cap;
    return 0;
}

void wbuf_free(struct wbuf *b)
{
    free(b->heap);
    b->heap = b->ptr = NULL;
    b->len = b->cap = 0;
}

/* ---- arena ---- */

struct resp_arena_block {
    struct resp_arena_block *next;
    size_t size;
    /* 16-byte aligned payload follows */
    _Alignas(16) unsigned char data[];
};

void *resp_arena_alloc(struct resp_arena *a, size_t size)
{
    /* One block per allocation keeps this trivially correct; handlers that need many small
     * pieces are rare, and the block is freed when the request ends. */
    if (UNLIKELY(size > SIZE_MAX - sizeof(struct resp_arena_block)))
        return NULL;
    struct resp_arena_block *blk = malloc(sizeof(*blk) + (size ? size : 1));
    if (UNLIKELY(!blk))
        return NULL;
    blk->size = size;
    blk->next = a->head;
    a->head = blk;
    return blk->data;
}

void resp_arena_reset(struct resp_arena *a)
{
    struct resp_arena_block *blk = a->head;
    while (blk) {
        struct resp_arena_block *next = blk->next;
        free(blk);
        blk = next;
    }
    a->head = NULL;
}

/* ---- response builder ---- */

void resp_init(struct cyserve_response *r)
{
    r->status = 200;
    r->close = 0;
    r->has_content_type = 0;
    wbuf_init(&r->headers, r->inline_headers, sizeof(r->inline_headers));
    wbuf_init(&r->body, r->inline_body, sizeof(r->inline_body));
    r->body_static = NULL;
    r->body_static_len = 0;
    r->head_length = -1;
    r->stream = NULL;
    r->stream_length = -1;
    r->arena.head = NULL;
}

void resp_reset(struct cyserve_response *r)
{
    r->status = 200;
    r->close = 0;
    r->has_content_type = 0;
    r->headers.len = 0;
    r->body.len = 0;
    r->body_static = NULL;
    r->body_static_len = 0;
    r->head_length = -1;
    r->stream = NULL;
    r->stream_length = -1;
    resp_arena_reset(&r->arena);
}

void resp_free(struct cyserve_response *r)
{
    wbuf_free(&r->headers);
    wbuf_free(&r->body);
    resp_arena_reset(&r->arena);
}

int resp_set_status(struct cyserve_response *r, int status)
{
    /* A handler's status is the final one: a 1xx would leave the client waiting for another
     * response (or switching protocols), and RFC 9110 15 defines nothing past 599. */
    if (UNLIKELY(status < 200 || status > 599))
        return -EINVAL;
    r->status = status;
    return 0;
}

/* RFC 9110 tchar. */
static int is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return 1;
    switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+':
    case '-': case '.': case '^': case '_': case '`': case '|': case '~':
        return 1;
    default:
        return 0;
    }
}

static int name_is(const char *name, size_t nlen, const char *lit)
{
    size_t n = strlen(lit);
    if (nlen != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c >= 'A' && c <= 'Z')
            c = (unsigned char)(c + 32);
        if (c != (unsigned char)lit[i])
            return 0;
    }
    return 1;
}

static int append_line(struct wbuf *b, const char *name, size_t nlen, const char *value,
                       size_t vlen)
{
    int rc = wbuf_reserve(b, nlen + vlen + 4);
    if (UNLIKELY(rc))
        return rc;
    char *p = b->ptr + b->len;
    memcpy(p, name, nlen);
    p += nlen;
    *p++ = ':';
    *p++ = ' ';
    if (vlen)
        memcpy(p, value, vlen);
    p += vlen;
    *p++ = '\r';
    *p++ = '\n';
    b->len = (size_t)(p - b->ptr);
    return 0;
}

/* A field value is visible characters, obs-text, SP and HTAB (RFC 9110 5.5). A CR or LF would
 * let a handler inject headers or a second response; the other controls are refused too, as
 * app.static() refuses them, so that no peer sees a value it must reject. */
static int value_ok(const char *value, size_t vlen)
{
    if (UNLIKELY(vlen && !value))
        return 0;
    for (size_t i = 0; i < vlen; i++) {
        unsigned char c = (unsigned char)value[i];
        if (UNLIKELY((c < 0x20 && c != '\t') || c == 0x7f))
            return 0;
    }
    return 1;
}

int resp_add_header(struct cyserve_response *r, const char *name, size_t nlen, const char *value,
                    size_t vlen)
{
    if (UNLIKELY(nlen == 0 || !name || !value_ok(value, vlen)))
        return -EINVAL;
    for (size_t i = 0; i < nlen; i++)
        if (UNLIKELY(!is_tchar((unsigned char)name[i])))
            return -EINVAL;
    if (UNLIKELY(name_is(name, nlen, "content-length") || name_is(name, nlen, "transfer-encoding") ||
                 name_is(name, nlen, "date") || name_is(name, nlen, "server")))
        return -EPERM; /* the engine writes these; Server is not a list, two would be invalid */
    if (name_is(name, nlen, "connection")) {
        /* The engine writes the Connection header itself; a handler may only ask to close. */
        if (vlen == 5 && name_is(value, vlen, "close")) {
            r->close = 1;
            return 0;
        }
        return -EPERM;
    }
    if (name_is(name, nlen, "content-type")) {
        if (UNLIKELY(r->has_content_type))
            return -EEXIST;
        r->has_content_type = 1;
    }
    return append_line(&r->headers, name, nlen, value, vlen);
}

int resp_set_content_type(struct cyserve_response *r, const char *value, size_t vlen)
{
    /* resp_add_header's checks, less those of a name known to be valid and not reserved. */
    if (UNLIKELY(!value_ok(value, vlen)))
        return -EINVAL;
    if (UNLIKELY(r->has_content_type))
        return -EEXIST;
    r->has_content_type = 1;
    return append_line(&r->headers, "Content-Type", 12, value, vlen);
}

int resp_write(struct cyserve_response *r, const void *data, size_t len)
{
    if (UNLIKELY(len && !data))
        return -EINVAL;
    if (UNLIKELY(r->body_static))
        return -EEXIST;
    return wbuf_append(&r->body, data, len);
}

int resp_set_body_static(struct cyserve_response *r, const void *data, size_t len)
{
    if (UNLIKELY(len && !data))
        return -EINVAL;
    if (UNLIKELY(r->body_static || r->body.len))
        return -EEXIST;
    /* An empty static body is an empty body: nothing to remember. A non-NULL pointer marks the
     * body as set, so that a later resp_write is refused either way. */
    r->body_static = len ? data : "";
    r->body_static_len = len;
    return 0;
}

int resp_set_head_length(struct cyserve_response *r, int64_t n)
{
    if (UNLIKELY(n < 0 && n != RESP_LENGTH_UNKNOWN))
        return -EINVAL;
    r->head_length = n;
    return 0;
}

int resp_set_stream(struct cyserve_response *r, void *stream, int64_t length)
{
    if (UNLIKELY(!stream || r->body_static || length < -1))
        return -EINVAL;
    r->stream = stream;
    r->stream_length = length;
    return 0;
}

void *resp_alloc(struct cyserve_response *r, size_t size)
{
    return resp_arena_alloc(&r->arena, size);
}

/* ---- dates ---- */

static _Thread_local time_t date_cache_sec = -1;
static _Thread_local char date_cache[HTTP_DATE_SIZE];

const char *http_date_cached(time_t now_s)
{
    if (UNLIKELY(now_s != date_cache_sec)) {
        http_date_format(now_s, date_cache);
        date_cache_sec = now_s;
    }
    return date_cache;
}

/* ---- status lines ---- */

const char *http_reason(int status, size_t *len)
{
    const char *s;
    switch (status) {
    case 100: s = "Continue"; break;
    case 101: s = "Switching Protocols"; break;
    case 200: s = "OK"; break;
    case 201: s = "Created"; break;
    case 202: s = "Accepted"; break;
    case 203: s = "Non-Authoritative Information"; break;
    case 204: s = "No Content"; break;
    case 205: s = "Reset Content"; break;
    case 206: s = "Partial Content"; break;
    case 207: s = "Multi-Status"; break;
    case 208: s = "Already Reported"; break;
    case 226: s = "IM Used"; break;
    case 300: s = "Multiple Choices"; break;
    case 301: s = "Moved Permanently"; break;
    case 302: s = "Found"; break;
    case 303: s = "See Other"; break;
    case 304: s = "Not Modified"; break;
    case 305: s = "Use Proxy"; break;
    case 307: s = "Temporary Redirect"; break;
    case 308: s = "Permanent Redirect"; break;
    case 400: s = "Bad Request"; break;
    case 401: s = "Unauthorized"; break;
    case 402: s = "Payment Required"; break;
    case 403: s = "Forbidden"; break;
    case 404: s = "Not Found"; break;
    case 405: s = "Method Not Allowed"; break;
    case 406: s = "Not Acceptable"; break;
    case 407: s = "Proxy Authentication Required"; break;
    case 408: s = "Request Timeout"; break;
    case 409: s = "Conflict"; break;
    case 410: s = "Gone"; break;
    case 411: s = "Length Required"; break;
    case 412: s = "Precondition Failed"; break;
    case 413: s = "Content Too Large"; break;
    case 414: s = "URI Too Long"; break;
    case 415: s = "Unsupported Media Type"; break;
    case 416: s = "Range Not Satisfiable"; break;
    case 417: s = "Expectation Failed"; break;
    case 418: s = "I'm a teapot"; break; /* RFC 9110 15.5.19: reserved, but apps send it */
    case 421: s = "Misdirected Request"; break;
    case 422: s = "Unprocessable Content"; break;
    case 423: s = "Locked"; break;
    case 424: s = "Failed Dependency"; break;
    case 425: s = "Too Early"; break;
    case 426: s = "Upgrade Required"; break;
    case 428: s = "Precondition Required"; break;
    case 429: s = "Too Many Requests"; break;
    case 431: s = "Request Header Fields Too Large"; break;
    case 451: s = "Unavailable For Legal Reasons"; break;
    case 500: s = "Internal Server Error"; break;
    case 501: s = "Not Implemented"; break;
    case 502: s = "Bad Gateway"; break;
    case 503: s = "Service Unavailable"; break;
    case 504: s = "Gateway Timeout"; break;
    case 505: s = "HTTP Version Not Supported"; break;
    case 506: s = "Variant Also Negotiates"; break;
    case 507: s = "Insufficient Storage"; break;
    case 508: s = "Loop Detected"; break;
    case 511: s = "Network Authentication Required"; break;
    /* RFC 9112 4: the reason phrase is optional and clients ignore it; an empty one is valid
     * where "Unknown" would be a claim. */
    default: s = ""; break;
    }
    *len = strlen(s);
    return s;
}

static char *put_u64(char *p, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

static char *put_lit(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

#define LIT(s) (s), (sizeof(s) - 1)

int http_write_head(struct wbuf *out, int status, int minor_version, int keep_alive,
                    uint64_t content_length, const char *extra, size_t extra_len,
                    const char *date)
{
    size_t rlen;
    const char *reason = http_reason(status, &rlen);
    /* Fixed parts: status line (<= 13 + reason), Server, Date, Content-Length (<= 38),
     * Connection (<= 24), CRLF. 160 covers them with room to spare. */
    int rc = wbuf_reserve(out, 160 + rlen + extra_len);
    if (UNLIKELY(rc))
        return rc;
    char *p = out->ptr + out->len;
    p = put_lit(p, LIT("HTTP/1.1 "));
    *p++ = (char)('0' + status / 100 % 10);
    *p++ = (char)('0' + status / 10 % 10);
    *p++ = (char)('0' + status % 10);
    *p++ = ' ';
    p = put_lit(p, reason, rlen);
    p = put_lit(p, LIT("\r\nServer: cyserve\r\nDate: "));
    p = put_lit(p, date, HTTP_DATE_LEN);
    p = put_lit(p, LIT("\r\n"));
    /* RFC 9110 8.6: no Content-Length in 1xx and 204; in 304 it would have to be the length
     * of the 200 response, which we do not know here, so it is left out. */
    if (status >= 200 && status != 204 && status != 304) {
        if (content_length == HTTP_LENGTH_CHUNKED) {
            p = put_lit(p, LIT("Transfer-Encoding: chunked\r\n"));
        } else if (content_length != HTTP_LENGTH_UNTIL_CLOSE) {
            p = put_lit(p, LIT("Content-Length: "));
            p = put_u64(p, content_length);
            p = put_lit(p, LIT("\r\n"));
        }
    }
    if (!keep_alive)
        p = put_lit(p, LIT("Connection: close\r\n"));
    else if (minor_version == 0)
        p = put_lit(p, LIT("Connection: keep-alive\r\n"));
    if (extra_len)
        p = put_lit(p, extra, extra_len);
    p = put_lit(p, LIT("\r\n"));
    out->len = (size_t)(p - out->ptr);
    return 0;
}

int http_write_error(struct wbuf *out, int status, const char *detail, int head_only,
                     const char *date)
{
    size_t rlen;
    const char *reason = http_reason(status, &rlen);
    char body[256];
    int n = snprintf(body, sizeof(body), "%d %s: %s\n", status, reason,
                     detail ? detail : "request rejected");
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof(body))
        n = sizeof(body) - 1;
    static const char ct[] = "Content-Type: text/plain; charset=utf-8\r\n";
    int rc = http_write_head(out, status, 1, 0, (uint64_t)n, ct, sizeof(ct) - 1, date);
    if (UNLIKELY(rc) || head_only)
        return rc;
    rc = wbuf_append(out, body, (size_t)n);
    return rc ? rc : n;
}
