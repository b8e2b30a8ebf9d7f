/* http1_write.c: HTTP/1.1 response serialisation (http_) and the per-thread Date cache.
 *
 * Single-threaded by construction: output buffers belong to one coroutine, and the Date cache is
 * a thread-local, so no atomics are needed. */
#include "http1_write.h"

#include <stdio.h>
#include <string.h>

#include "compat.h"

/* ---- dates ---- */

/* One thread-local for the pair, reached through one pointer: in the extension (a shared object
 * loaded with dlopen) each access to a thread-local is a call to __tls_get_addr, and the compiler
 * recomputes the address (calls again) for a second access rather than keep it in a register,
 * unless an empty asm makes the pointer opaque. So a head costs one call instead of two. */
struct date_cache {
    time_t sec;
    char text[HTTP_DATE_SIZE];
};
static _Thread_local struct date_cache date_cache = {.sec = -1};

const char *http_date_cached(time_t now_s)
{
    struct date_cache *dc = &date_cache;
    __asm__("" : "+r"(dc));
    if (UNLIKELY(now_s != dc->sec)) {
        /* Within the minute of the text kept, only the seconds' two digits change (text[23],
         * text[24]: "Sun, 06 Nov 1994 08:49:37 GMT"): a busy thread's next second costs two
         * stores, not gmtime_r (its time zone lock included) and the whole text again. */
        if (LIKELY(dc->sec >= 0 && now_s >= 0 && now_s / 60 == dc->sec / 60 && dc->text[0])) {
            int s = (int)(now_s % 60);
            dc->text[23] = (char)('0' + s / 10);
            dc->text[24] = (char)('0' + s % 10);
        } else {
            http_date_format(now_s, dc->text);
        }
        dc->sec = now_s;
    }
    return dc->text;
}

/* ---- status lines ---- */

const char *http_reason(int status, size_t *len)
{
    const char *s;
    /* One code a line: a table read down the codes. */
    /* clang-format off */
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
    /* clang-format on */
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

const struct http_head http_head_default = {LIT("Server: cyserve\r\n"), 17, 0,
                                            "Server: cyserve\r\n"};

void http_head_init(struct http_head *h, const char *lines, size_t len, size_t server_len,
                    int no_date)
{
    memset(h, 0, sizeof(*h));
    h->lines = len ? lines : "";
    h->len = len;
    h->server_len = server_len;
    h->no_date = no_date;
    if (len <= HTTP_HEAD_SHORT && len)
        memcpy(h->short_lines, lines, len);
}

/* The one head writer; both entry points inline it, http_write_head with constants, so the
 * common head compiles to what it was before a handler could shape it. */
static ALWAYS_INLINE int write_head(struct wbuf *out, int status, const char *reason, size_t rlen,
                                    const struct http_head *head, int own_server, int minor_version,
                                    int keep_alive, uint64_t content_length, const char *extra,
                                    size_t extra_len, const char *date)
{
    /* Fixed parts: status line (<= 13 + reason), Date, Content-Length (<= 38), Connection
     * (<= 24), CRLF. 160 covers them with room to spare; head's lines come on top. */
    size_t skip = own_server ? head->server_len : 0;
    int rc = wbuf_reserve(out, 160 + rlen + extra_len + head->len - skip);
    if (UNLIKELY(rc))
        return rc;
    char *p = out->ptr + out->len;
    p = put_lit(p, LIT("HTTP/1.1 "));
    *p++ = (char)('0' + status / 100 % 10);
    *p++ = (char)('0' + status / 10 % 10);
    *p++ = (char)('0' + status % 10);
    *p++ = ' ';
    p = put_lit(p, reason, rlen);
    p = put_lit(p, LIT("\r\n"));
    /* The room reserved above holds the HTTP_HEAD_SHORT bytes: what passes the lines' end is
     * written over by what follows. */
    if (LIKELY(!skip && head->len <= HTTP_HEAD_SHORT)) {
        memcpy(p, head->short_lines, HTTP_HEAD_SHORT);
        p += head->len;
    } else if (head->len > skip) {
        p = put_lit(p, head->lines + skip, head->len - skip);
    }
    if (LIKELY(!head->no_date)) {
        p = put_lit(p, LIT("Date: "));
        p = put_lit(p, date, HTTP_DATE_LEN);
        p = put_lit(p, LIT("\r\n"));
    }
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

int http_write_head(struct wbuf *out, const struct http_head *head, int status, int minor_version,
                    int keep_alive, uint64_t content_length, const char *extra, size_t extra_len,
                    const char *date)
{
    size_t rlen;
    const char *reason = http_reason(status, &rlen);
    return write_head(out, status, reason, rlen, head, 0, minor_version, keep_alive, content_length,
                      extra, extra_len, date);
}

int http_write_head_own(struct wbuf *out, const struct http_head *head, int status,
                        const char *reason, size_t reason_len, int own_server, int minor_version,
                        int keep_alive, uint64_t content_length, const char *extra,
                        size_t extra_len, const char *date)
{
    if (!reason)
        reason = http_reason(status, &reason_len);
    return write_head(out, status, reason, reason_len, head, own_server, minor_version, keep_alive,
                      content_length, extra, extra_len, date);
}

int http_write_chunked_end(struct wbuf *out, const char *trailers, size_t len)
{
    int rc = wbuf_reserve(out, 5 + len);
    if (UNLIKELY(rc))
        return rc;
    char *p = out->ptr + out->len;
    p = put_lit(p, LIT("0\r\n"));
    if (len)
        p = put_lit(p, trailers, len);
    p = put_lit(p, LIT("\r\n"));
    out->len = (size_t)(p - out->ptr);
    return 0;
}

int http_write_error(struct wbuf *out, const struct http_head *head, int status, const char *detail,
                     int head_only, const char *date)
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
    int rc = http_write_head(out, head, status, 1, 0, (uint64_t)n, ct, sizeof(ct) - 1, date);
    if (UNLIKELY(rc) || head_only)
        return rc;
    rc = wbuf_append(out, body, (size_t)n);
    return rc ? rc : n;
}
