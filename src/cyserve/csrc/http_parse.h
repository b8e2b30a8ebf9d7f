/* http_parse.h: a strict, zero-copy HTTP/1.1 request parser (RFC 9112) and chunked decoder.
 *
 * Contract of the parsers (picohttpparser's): return the number of bytes consumed (> 0), -1 for
 * invalid input, -2 for incomplete input (feed more and call again from the start). They never
 * allocate, copy or NUL-terminate: every string is a view into the caller's buffer, valid as long
 * as the buffer is. They keep no hidden state between calls on the head, so a head split at any
 * byte gives the same result once complete. On -1, req->status says which HTTP status to answer
 * (400, 414, 431, 501, 505) and req->error names the rule that was broken, for logs and tests.
 * Thread-safe: no global state.
 *
 * Decisions where RFC 9112 leaves a choice (each has a conformance case in tests/http/):
 *  - A bare LF as a line terminator is rejected with 400 (RFC 9112 2.2 allows a recipient to
 *    accept it; rejecting it removes a class of request-smuggling disagreements with proxies
 *    that do not). A bare CR anywhere is 400, as 2.2 requires.
 *  - Empty lines (CRLF) before the request line are skipped, as 2.2 recommends, so a client that
 *    sends a stray CRLF after a body keeps its connection. They count toward max_header_bytes
 *    and are part of the bytes consumed.
 *  - Decisions are made in the order the bytes arrive: the first rule broken, scanning from the
 *    start, gives the status. Field-level framing errors (a bad or differing Content-Length, a
 *    second Host, a repeated "chunked") are decided at the end of their field line; rules that
 *    need the whole head (Content-Length with Transfer-Encoding, chunked not last, a missing
 *    Host) at its end. A prefix of a request therefore returns -2 or the same -1 as the whole.
 *  - 431 and 414 are decided as soon as the bytes seen prove them, before the head is complete:
 *    431 when more than max_header_bytes have arrived without a complete head, or when a field
 *    line begins after max_headers fields; 414 when max_target_bytes + 1 target bytes arrived,
 *    also past max_header_bytes: while the target is still arriving beyond the head's window
 *    the answer is -2, so the caller may buffer up to max_target_bytes + the method + 1 bytes.
 *  - A '#' in the request-target is 400 ("fragment in request-target"): no form of target has
 *    a fragment (RFC 9112 3.2), and passing it on would hand the router a path no client meant.
 *  - Host and an absolute-form target's authority must be uri-host [":" port] (RFC 9112 3.2
 *    MUST); an absolute-form target must be http or https with a non-empty host and no userinfo
 *    (RFC 9110 4.2.1 MUST, 4.2.4 SHOULD; an origin server is no proxy), and its authority, not
 *    the Host field, is req->host (RFC 9112 3.2.2). Its path may be empty; the engine makes it "/".
 *  - Content-Length: repeated fields and lists ("5, 5") are accepted as one value when every
 *    element is spelled with the same digits as the first (RFC 9110 8.6 allows identical
 *    values); "3" with "03" is 400 like "3" with "4", since an intermediary comparing the text
 *    would see two framings. OWS around the elements does not count.
 *  - Transfer-Encoding: only "chunked" is implemented. Codings other than chunked, when chunked
 *    is last, give 501; chunked not last (or absent from a Transfer-Encoding field) gives 400.
 *  - Expect: only "100-continue" (HTTP/1.1) sets expect_continue; other expectations are
 *    ignored (RFC 9110 10.1.1 allows 417; ignoring them is what most servers do). */
#ifndef CYSERVE_HTTP_PARSE_H
#define CYSERVE_HTTP_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "http_method.h"

struct http_header {
    const char *name;
    size_t name_len;
    const char *value; /* leading and trailing whitespace (SP, HTAB) stripped */
    size_t value_len;
};

struct http_limits {
    size_t max_header_bytes; /* whole head incl. request line; over it: 431 (default 8192) */
    size_t max_target_bytes; /* request-target; over it: 414 (default 8192) */
    unsigned max_headers;    /* header field count; over it: 431 (default 100) */
};

struct http_request {
    /* request line */
    const char *method;
    size_t method_len;
    enum http_method method_id;
    const char *target; /* the whole request-target */
    size_t target_len;
    /* origin-form: the target up to '?' (not decoded). absolute-form: the path after the
     * authority, up to '?' (may be empty). authority-form (CONNECT) and asterisk-form
     * (OPTIONS *): the whole target. Always a view inside the target. */
    const char *path;
    size_t path_len;
    const char *query; /* after '?', without it; NULL if none */
    size_t query_len;
    int minor_version; /* 0 or 1 */
    /* header fields: the caller provides the array and its capacity in num_headers; on success
     * num_headers is the number of fields found */
    struct http_header *headers;
    size_t num_headers;
    /* framing and connection semantics, derived from the fields */
    int64_t content_length; /* -1 if absent */
    int chunked;            /* Transfer-Encoding ends in chunked */
    int keep_alive;         /* 1.1 unless "Connection: close"; 1.0 only with keep-alive */
    int expect_continue;    /* Expect: 100-continue (HTTP/1.1 only, RFC 9110 10.1.1) */
    int upgrade;            /* Connection: upgrade with an Upgrade field */
    const char *host;       /* an absolute-form target's authority, else the Host field value
                             * (uri-host [":" port], checked); NULL if neither */
    size_t host_len;
    /* on -1 */
    int status;        /* 400, 414, 431, 501 or 505 */
    const char *error; /* static string naming the rule, e.g. "content-length with
                        * transfer-encoding" */
};

/* Default limits (the values shown above). */
void http_limits_default(struct http_limits *lim);

/* Parse one request head (request line + fields + empty line) at buf[0..len). req->headers and
 * req->num_headers (capacity) must be set by the caller; the effective field limit is the smaller
 * of that capacity and lim->max_headers. Returns bytes consumed, -1 or -2 (see above). A head
 * that is still incomplete but already over a limit returns -1 with 431/414 at once, so a client
 * cannot make the server buffer without bound. Reads only buf[0..len). Any thread. */
int http_parse_request(const char *buf, size_t len, struct http_request *req,
                       const struct http_limits *lim);

/* Whether v[0..n) is what a Host field may hold: uri-host [":" port] (RFC 9112 3.2, RFC 3986
 * 3.2.2), an IP-literal in brackets or a reg-name / IPv4 address, then at most one ':' and
 * digits; empty is allowed. The parser's own check of Host, for values from elsewhere (a
 * trusted proxy's X-Forwarded-Host). Any thread. */
int http_host_ok(const char *v, size_t n);

/* Looks up a field that may appear only once (RFC 9110 5.3: a field whose value is not a list,
 * such as Range or If-Range) among h[0..n), by name (case-insensitive, name[0..name_len)).
 * Returns how many field lines carry that name, capped at 2: 0 (absent), 1, or 2 (more than
 * one). *value and *value_len are its value when there is exactly one, else NULL and 0, so a
 * caller that treats "not exactly one" as absent (RFC 9110 14.2: a server MAY ignore Range)
 * cannot act on one of two disagreeing copies. Any thread. */
int http_field_once(const struct http_header *h, size_t n, const char *name, size_t name_len,
                    const char **value, size_t *value_len);

/* Incremental chunked-body decoder, state kept in struct http_chunked (zero it to start). */
struct http_chunked {
    uint64_t remaining; /* bytes left in the current chunk; the size being read in size lines */
    int state;          /* private */
    uint64_t total;     /* decoded body bytes so far */
    size_t trailer_bytes;
    unsigned aux; /* private: hex digits or chunk-extension bytes of the current line */
    /* on -1: the status to answer, 431 for a trailer section over max_trailer_bytes, else 400,
     * and a static string naming the rule (e.g. "trailer section too large"), for the answer's
     * detail and for logs. Unset otherwise. */
    int status;
    const char *error;
};

/* Longest chunk-extension part of one chunk-size line, in bytes; longer: -1. Extensions are
 * accepted and skipped, and this bound keeps a client from streaming an endless size line. */
#define HTTP_CHUNK_EXT_MAX 1024

/* Decode chunked data in place: buf[0..*len) holds raw bytes from the wire; on return buf[0..*len)
 * holds the decoded body bytes found in them. Returns the number of raw bytes left after the end
 * of the body (>= 0, the start of the next pipelined request, moved to follow the decoded bytes
 * directly: they start at buf + *len), -2 if the body has not ended yet (all input consumed), or
 * -1 if invalid (bad size, more than 16 hex digits, missing CRLF, bare LF, malformed extension,
 * malformed trailer field, trailer section over max_trailer_bytes), with st->status and
 * st->error set: 431 for the trailer section over its bound (a field section too large, as for
 * the head), 400 for the rest. The input may be split at any byte between calls, with the same
 * result, status and rule. After -1 the state is otherwise undefined. Any thread, one stream per
 * state. */
int64_t http_chunked_decode(struct http_chunked *st, char *buf, size_t *len,
                            size_t max_trailer_bytes);

#endif
