/* http_parse.h: a strict, zero-copy HTTP/1.1 request parser (RFC 9112) and chunked decoder.
 *
 * Contract of the parsers (picohttpparser's): return the number of bytes consumed (> 0), -1 for
 * invalid input, -2 for incomplete input (feed more and call again from the start). They never
 * allocate, copy or NUL-terminate: every string is a view into the caller's buffer, valid as long
 * as the buffer is. They keep no hidden state between calls on the head, so a head split at any
 * byte gives the same result once complete. On -1, req->status says which HTTP status to answer
 * (400, 414, 431, 501, 505) and req->error names the rule that was broken, for logs and tests.
 * Thread-safe: no global state. */
#ifndef CYSERVE_HTTP_PARSE_H
#define CYSERVE_HTTP_PARSE_H

#include <stddef.h>
#include <stdint.h>

struct http_header {
    const char *name;
    size_t name_len;
    const char *value; /* leading and trailing whitespace (SP, HTAB) stripped */
    size_t value_len;
};

struct http_limits {
    size_t max_header_bytes;  /* whole head incl. request line; over it: 431 (default 8192) */
    size_t max_target_bytes;  /* request-target; over it: 414 (default 8192) */
    unsigned max_headers;     /* header field count; over it: 431 (default 100) */
};

enum http_method {
    HTTP_OTHER = 0, /* a valid token that is not one of these */
    HTTP_GET, HTTP_HEAD, HTTP_POST, HTTP_PUT, HTTP_DELETE, HTTP_PATCH, HTTP_OPTIONS,
    HTTP_CONNECT, HTTP_TRACE,
};

struct http_request {
    /* request line */
    const char *method;
    size_t method_len;
    enum http_method method_id;
    const char *target;     /* the whole request-target */
    size_t target_len;
    const char *path;       /* target up to '?' (not decoded) */
    size_t path_len;
    const char *query;      /* after '?', without it; NULL if none */
    size_t query_len;
    int minor_version;      /* 0 or 1 */
    /* header fields: the caller provides the array and its capacity in num_headers */
    struct http_header *headers;
    size_t num_headers;
    /* framing and connection semantics, derived from the fields */
    int64_t content_length; /* -1 if absent */
    int chunked;            /* Transfer-Encoding ends in chunked */
    int keep_alive;         /* 1.1 unless "Connection: close"; 1.0 only with keep-alive */
    int expect_continue;    /* Expect: 100-continue */
    int upgrade;            /* Connection: upgrade with an Upgrade field */
    const char *host;       /* Host field value, NULL if absent */
    size_t host_len;
    /* on -1 */
    int status;             /* 400, 413, 414, 431, 501 or 505 */
    const char *error;      /* static string naming the rule, e.g. "content-length with transfer-encoding" */
};

/* Default limits (the values shown above). */
void http_limits_default(struct http_limits *lim);

/* Parse one request head (request line + fields + empty line) at buf[0..len). req->headers and
 * req->num_headers (capacity) must be set by the caller. Returns bytes consumed, -1 or -2 (see
 * above). A head that is still incomplete but already over a limit returns -1 with 431/414 at
 * once, so a client cannot make the server buffer without bound. */
int http_parse_request(const char *buf, size_t len, struct http_request *req,
                       const struct http_limits *lim);

/* Incremental chunked-body decoder, state kept in struct http_chunked (zero it to start). */
struct http_chunked {
    uint64_t remaining; /* bytes left in the current chunk */
    int state;          /* private */
    uint64_t total;     /* decoded body bytes so far */
    size_t trailer_bytes;
};

/* Decode chunked data in place: buf[0..*len) holds raw bytes from the wire; on return buf[0..*len)
 * holds the decoded body bytes found in them. Returns the number of raw bytes left after the end
 * of the body (>= 0, the start of the next pipelined request, moved to follow the decoded bytes
 * directly: they start at buf + *len), -2 if the body has not ended yet (all input consumed), or
 * -1 if invalid (bad size, size overflow, missing CRLF, trailer over max_trailer_bytes). */
int64_t http_chunked_decode(struct http_chunked *st, char *buf, size_t *len,
                            size_t max_trailer_bytes);

#endif
