/* http1_write.h: HTTP/1.1 response serialisation (prefix http_): status lines and reason
 * phrases, response heads, complete error responses, and the per-thread Date cache they carry.
 * The room where a response becomes HTTP/1 bytes; the response itself is built in resp.h.
 *
 * Error convention: 0 or -ENOMEM. No I/O: the engine (http1.c, conn.c) owns the sockets and
 * decides when bytes go out. Nothing here is shared between threads: the output buffer belongs
 * to the caller and the Date cache is per thread. */
#ifndef CYSERVE_HTTP1_WRITE_H
#define CYSERVE_HTTP1_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "http_date.h"
#include "wbuf.h"

/* http_write_head's content_length for an answer whose length is not known in advance: the
 * body goes out in chunks (HTTP/1.1), or until the connection closes (HTTP/1.0). */
#define HTTP_LENGTH_CHUNKED UINT64_MAX
#define HTTP_LENGTH_UNTIL_CLOSE (UINT64_MAX - 1)

/* This thread's cached Date value for wall-clock second now_s: formatted at most once a second
 * per thread. Returns a pointer to HTTP_DATE_LEN bytes, valid until the next call on this
 * thread. */
const char *http_date_cached(time_t now_s);

/* The reason phrase of status (empty for codes not registered with IANA). Sets *len. */
const char *http_reason(int status, size_t *len);

/* The fields the server writes on every answer besides the framing ones (the --header,
 * --server-header and --date-header options): lines[0..len), each "Name: value\r\n" and
 * validated by whoever built them, the first server_len of them the Server line (0: none),
 * which is left out when the handler sets its own Server; no_date: 1 writes no Date field.
 * The lines are borrowed: their owner keeps them as long as any writer may use them. Fill one
 * with http_head_init(). */
#define HTTP_HEAD_SHORT 32
struct http_head {
    const char *lines;
    size_t len;
    size_t server_len;
    int no_date;
    /* lines again, zero-padded, when len <= HTTP_HEAD_SHORT: the common head copies these
     * HTTP_HEAD_SHORT bytes whole, a fixed-size copy (a few moves) instead of a call to memcpy
     * on every response. */
    char short_lines[HTTP_HEAD_SHORT];
};

/* The engine's defaults: "Server: cyserve" and Date. */
extern const struct http_head http_head_default;

/* Fill h with lines[0..len) (borrowed), server_len and no_date, as struct http_head says. */
void http_head_init(struct http_head *h, const char *lines, size_t len, size_t server_len,
                    int no_date);

/* Append a response head to out: status line, head's lines (Server and the server's own),
 * Date unless head->no_date, Content-Length (omitted for 1xx,
 * 204 and 304), Connection: close when !keep_alive (and keep-alive for HTTP/1.0 clients that
 * asked for it), the extra lines (already "Name: value\r\n" serialised, may be NULL), and the
 * empty line. minor_version is the request's (the status line always says HTTP/1.1).
 * Returns 0 or -ENOMEM. */
int http_write_head(struct wbuf *out, const struct http_head *head, int status, int minor_version,
                    int keep_alive, uint64_t content_length, const char *extra, size_t extra_len,
                    const char *date);

/* http_write_head for a head the handler shaped (resp.h's own_head): reason[0..reason_len)
 * instead of the table's when reason is not NULL, and none of head's Server line when the
 * handler's own is among the extra lines (own_server). Called only when either is so, which keeps the common
 * head's path free of both tests. Returns 0 or -ENOMEM. */
int http_write_head_own(struct wbuf *out, const struct http_head *head, int status,
                        const char *reason, size_t reason_len, int own_server, int minor_version,
                        int keep_alive, uint64_t content_length, const char *extra,
                        size_t extra_len, const char *date);

/* Append the end of a chunked body to out (RFC 9112 7.1): the last chunk "0\r\n", the trailer
 * section trailers[0..len) ("Name: value\r\n" lines, validated by resp_add_trailer; len 0 for
 * none), and the empty line. Returns 0 or -ENOMEM. The caller's thread (out is its). */
int http_write_chunked_end(struct wbuf *out, const char *trailers, size_t len);

/* Append a complete error response (text/plain body "<status> <reason>: <detail>\n") with
 * Connection: close; head_only (the request was HEAD): the same head, no body (RFC 9110 9.3.2).
 * Returns the body bytes appended (0 for head_only; for the access log), or -ENOMEM. */
int http_write_error(struct wbuf *out, const struct http_head *head, int status, const char *detail,
                     int head_only, const char *date);

#endif
