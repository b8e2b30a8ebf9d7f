/* http_parse.c: the strict HTTP/1.1 request-head parser and the chunked-body decoder.
 *
 * Design. The head parser is a single forward scan over buf[0..end) with no state kept between
 * calls (picohttpparser's model: on -2 the caller calls again with more bytes, from the start).
 * Re-scanning is cheap because heads are small, and it is what lets the parser hand out views
 * without owning any memory. Each byte class (token, request-target, field value) has a 256-entry
 * table; the loops over targets and field values first skip runs of ordinary bytes 16 at a time
 * (SSE2) or eight at a time (SWAR) and fall back to the table for the bytes that end the run.
 * The wide loads only happen when 16 (8) bytes remain, so nothing is read past `end`
 * (tests/c/test_http_parse.c places every input against a PROT_NONE page to prove it).
 *
 * Limits are enforced by shrinking the scan window: the head is parsed inside
 * buf[0..min(len, max_header_bytes)), and a scan that runs out of bytes while len is larger than
 * the window is a 431. The request-target scan is bounded the same way for 414. Because every
 * error is decided at the byte that proves it, a prefix of the input gives -2 or the same error
 * as the whole input (tests/http/test_parser.py checks this for every case split at every byte).
 *
 * The chunked decoder is the one stateful piece: a byte-level state machine (struct
 * http_chunked) whose data state moves whole runs of body bytes with memmove. Decoded bytes are
 * written over the raw bytes they came from; the write position never passes the read position,
 * so decoding in place is safe. */
#include "http_parse.h"

#include <limits.h>
#include <string.h>

#include "compat.h"

/* Byte classes, one bit each, in one table so a single load answers every question. */
enum {
    C_TCHAR = 1,  /* token character, RFC 9110 5.6.2 */
    C_TARGET = 2, /* allowed in a request-target: VCHAR (0x21-0x7e) but '#' */
    C_VALUE = 4,  /* field-value octet: VCHAR, obs-text (0x80-0xff), SP, HTAB */
    C_HEX = 8,
    C_HOST = 16, /* Host field: unreserved, sub-delims, pct-encoded, ':' and IP-literal brackets */
    C_REGNAME = 32, /* a reg-name's own bytes: unreserved and sub-delims (not '%', ':', '[', ']') */
};

static uint8_t http__class[256];

static void http__init_classes(void)
{
    for (int c = 0; c < 256; c++) {
        uint8_t k = 0;
        int alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (alnum || (c && strchr("!#$%&'*+-.^_`|~", c)))
            k |= C_TCHAR;
        /* No form of request-target has a fragment (RFC 9112 3.2): '#' ends the scan. */
        if (c >= 0x21 && c <= 0x7e && c != '#')
            k |= C_TARGET;
        if ((c >= 0x20 && c != 0x7f) || c == '\t')
            k |= C_VALUE;
        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))
            k |= C_HEX;
        if (alnum || (c && strchr("-._~!$&'()*+,;=%:[]", c)))
            k |= C_HOST;
        if (alnum || (c && strchr("-._~!$&'()*+,;=", c)))
            k |= C_REGNAME;
        http__class[c] = k;
    }
}

/* The table is filled by a constructor so that the source stays readable (a 256-entry literal
 * would hide the rules above); it runs before any thread can call the parser. */
__attribute__((constructor)) static void http__ctor(void)
{
    http__init_classes();
}

static ALWAYS_INLINE int is_class(unsigned char c, uint8_t k)
{
    return (http__class[c] & k) != 0;
}

static ALWAYS_INLINE unsigned char lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c | 0x20) : c;
}

/* Case-insensitive comparison of a view with a lower-case literal of the same length. */
static int eq_lower(const char *s, size_t n, const char *lit, size_t lit_len)
{
    if (n != lit_len)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (lower((unsigned char)s[i]) != (unsigned char)lit[i])
            return 0;
    }
    return 1;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* SWAR: non-zero when some byte of x is < n (n <= 128). The classic haszero-style test; it may
 * flag a byte above a real hit (borrows), never miss one, and never flags bytes >= 0x80 alone. */
static ALWAYS_INLINE uint64_t swar_has_less(uint64_t x, unsigned n)
{
    return (x - ONES * n) & ~x & HIGHS;
}

static ALWAYS_INLINE uint64_t swar_has_byte(uint64_t x, unsigned char b)
{
    uint64_t y = x ^ (ONES * b);
    return (y - ONES) & ~y & HIGHS;
}

/* The run-skipping loops have two implementations. On x86-64, SSE2 is part of the baseline ABI,
 * so no runtime check is needed: 16 bytes are classified at once with unsigned min/max compares
 * (SSE2 has no unsigned "less than", but min(x, hi) == x is x <= hi). Elsewhere, or when built
 * with -DHTTP_PARSE_NO_SIMD (the fuzz replay test builds both, so the scalar path stays tested),
 * eight bytes at a time with SWAR. Both stop at the first byte that ends the run and leave it to
 * the exact byte loop, so they differ only in speed. */
#if defined(__SSE2__) && !defined(HTTP_PARSE_NO_SIMD)
#include <emmintrin.h>
#define HTTP_PARSE_SIMD "sse2"

/* Bit i set when byte i of v lies in [lo, hi] (unsigned). */
static ALWAYS_INLINE unsigned sse_in_range(__m128i v, unsigned char lo, unsigned char hi)
{
    __m128i le = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8((char)hi)), v);
    __m128i ge = _mm_cmpeq_epi8(_mm_max_epu8(v, _mm_set1_epi8((char)lo)), v);
    return (unsigned)_mm_movemask_epi8(_mm_and_si128(le, ge));
}

static ALWAYS_INLINE const char *skip_value_fast(const char *p, const char *end)
{
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        /* valid: 0x20-0x7e or 0x80-0xff, i.e. >= 0x20 and != 0x7f */
        unsigned ok = sse_in_range(v, 0x20, 0xff) &
                      ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x7f)));
        if (ok != 0xffff)
            return p + __builtin_ctz(~ok);
        p += 16;
    }
    /* A head's last value is often shorter than 16 bytes with its CRLFs (a Host such as
     * "127.0.0.1"): eight of it at once where it has them, as the SWAR loop below does. */
    if (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        if (!(swar_has_less(w, 0x20) | swar_has_byte(w, 0x7f)))
            p += 8;
    }
    while (p < end && (unsigned char)*p >= 0x20 && (unsigned char)*p != 0x7f)
        p++;
    return p;
}

static ALWAYS_INLINE const char *skip_target_fast(const char *p, const char *end)
{
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        unsigned ok = sse_in_range(v, 0x21, 0x7e) &
                      ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('#')));
        if (ok != 0xffff)
            return p + __builtin_ctz(~ok);
        p += 16;
    }
    while (p < end && is_class((unsigned char)*p, C_TARGET))
        p++;
    return p;
}
#else
#define HTTP_PARSE_SIMD "swar"

/* Skips field-value bytes other than HTAB: returns the first position in [p, end) that is not
 * in 0x20-0x7e or 0x80-0xff, or end. HTAB and invalid bytes are left for the caller's table. */
static ALWAYS_INLINE const char *skip_value_fast(const char *p, const char *end)
{
    while (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        if (swar_has_less(w, 0x20) | swar_has_byte(w, 0x7f))
            break;
        p += 8;
    }
    while (p < end && (unsigned char)*p >= 0x20 && (unsigned char)*p != 0x7f)
        p++;
    return p;
}

/* Skips request-target bytes (0x21-0x7e but '#') in [p, end). */
static ALWAYS_INLINE const char *skip_target_fast(const char *p, const char *end)
{
    while (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        if (swar_has_less(w, 0x21) | swar_has_byte(w, 0x7f) | swar_has_byte(w, '#') | (w & HIGHS))
            break;
        p += 8;
    }
    while (p < end && is_class((unsigned char)*p, C_TARGET))
        p++;
    return p;
}
#endif

void http_limits_default(struct http_limits *lim)
{
    lim->max_header_bytes = 8192;
    lim->max_target_bytes = 8192;
    lim->max_headers = 100;
}

/* The result of a parse step: -1 with status/error set, or -2. */
static int fail(struct http_request *req, int status, const char *error)
{
    req->status = status;
    req->error = error;
    return -1;
}

static enum http_method method_id(const char *m, size_t n)
{
    switch (n) {
    case 3:
        if (memcmp(m, "GET", 3) == 0)
            return HTTP_GET;
        if (memcmp(m, "PUT", 3) == 0)
            return HTTP_PUT;
        break;
    case 4:
        if (memcmp(m, "POST", 4) == 0)
            return HTTP_POST;
        if (memcmp(m, "HEAD", 4) == 0)
            return HTTP_HEAD;
        break;
    case 5:
        if (memcmp(m, "PATCH", 5) == 0)
            return HTTP_PATCH;
        if (memcmp(m, "TRACE", 5) == 0)
            return HTTP_TRACE;
        break;
    case 6:
        if (memcmp(m, "DELETE", 6) == 0)
            return HTTP_DELETE;
        break;
    case 7:
        if (memcmp(m, "OPTIONS", 7) == 0)
            return HTTP_OPTIONS;
        if (memcmp(m, "CONNECT", 7) == 0)
            return HTTP_CONNECT;
        break;
    }
    return HTTP_OTHER;
}

/* Whether v[0..n) is uri-host [ ":" port ] (RFC 9112 3.2, RFC 3986 3.2.2): an IP-literal in
 * brackets, or a reg-name / IPv4 address (unreserved, sub-delims, pct-encoded), then at most one
 * ':' and digits. Empty is allowed (a Host for a target without an authority is sent empty). */
static int host_ok(const char *v, size_t n)
{
    const char *p = v, *end = v + n;
    if (p < end && *p == '[') {
        const char *close = memchr(p, ']', n);
        if (!close || close == p + 1)
            return 0;
        for (p++; p < close; p++)
            if (!is_class((unsigned char)*p, C_HOST) || *p == '[' || *p == '%')
                return 0;
        p = close + 1;
    } else {
        /* One class test a byte (C_REGNAME); what stops the run is then '%' (pct-encoded), the
         * port's ':', the end, or a byte no reg-name has ('[', ']' and the rest: refused below). */
        for (;;) {
            while (p < end && is_class((unsigned char)*p, C_REGNAME))
                p++;
            if (p == end || *p != '%')
                break;
            if (end - p < 3 || !is_class((unsigned char)p[1], C_HEX) ||
                !is_class((unsigned char)p[2], C_HEX))
                return 0;
            p += 3;
        }
    }
    if (p == end)
        return 1;
    if (*p != ':')
        return 0;
    for (p++; p < end; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

int http_host_ok(const char *v, size_t n)
{
    return host_ok(v, n);
}

/* Checks the request-target's form against the method (RFC 9112 3.2) and sets path and query.
 * Returns 0 or -1 (with status set). */
static int split_target(struct http_request *req)
{
    const char *t = req->target, *end = t + req->target_len;

    if (req->method_id == HTTP_CONNECT) {
        /* authority-form: host ":" port, nothing else. */
        const char *colon = NULL;
        for (const char *p = t; p < end; p++) {
            if (*p == ':')
                colon = p;
            else if (UNLIKELY(!is_class((unsigned char)*p, C_HOST) || *p == '%'))
                return fail(req, 400, "invalid authority-form target");
        }
        if (UNLIKELY(colon == NULL || colon == t || colon + 1 == end))
            return fail(req, 400, "authority-form target needs host:port");
        for (const char *p = colon + 1; p < end; p++) {
            if (UNLIKELY(*p < '0' || *p > '9'))
                return fail(req, 400, "authority-form target needs host:port");
        }
        req->path = t;
        req->path_len = req->target_len;
        return 0;
    }
    if (req->target_len == 1 && *t == '*') {
        if (UNLIKELY(req->method_id != HTTP_OPTIONS))
            return fail(req, 400, "asterisk-form target outside OPTIONS");
        req->path = t;
        req->path_len = 1;
        return 0;
    }

    const char *path = t;
    if (*t != '/') {
        /* absolute-form: scheme ":" hier-part; scheme = ALPHA *( ALPHA / DIGIT / + - . ) */
        const char *p = t;
        if (UNLIKELY(!((*p | 0x20) >= 'a' && (*p | 0x20) <= 'z')))
            return fail(req, 400, "invalid request-target");
        while (p < end && *p != ':') {
            unsigned char c = (unsigned char)*p;
            int ok = ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c >= '0' && c <= '9') ||
                     c == '+' || c == '-' || c == '.';
            if (UNLIKELY(!ok))
                return fail(req, 400, "invalid request-target");
            p++;
        }
        if (UNLIKELY(p == end))
            return fail(req, 400, "invalid request-target");
        /* An origin server is no proxy: only http and https URIs, which always have an
         * authority with a host (RFC 9110 4.2.1: an empty host MUST be rejected) and no
         * userinfo (4.2.4: SHOULD be treated as an error). */
        size_t slen = (size_t)(p - t);
        if (UNLIKELY(!eq_lower(t, slen, "http", 4) && !eq_lower(t, slen, "https", 5)))
            return fail(req, 400, "request-target scheme is not http or https");
        p++;
        if (UNLIKELY(end - p < 2 || p[0] != '/' || p[1] != '/'))
            return fail(req, 400, "absolute-form target without an authority");
        p += 2;
        const char *auth = p;
        while (p < end && *p != '/' && *p != '?')
            p++;
        if (UNLIKELY(memchr(auth, '@', (size_t)(p - auth)) != NULL))
            return fail(req, 400, "userinfo in the request-target");
        if (UNLIKELY(p == auth || *auth == ':' || !host_ok(auth, (size_t)(p - auth))))
            return fail(req, 400, "invalid host in the request-target");
        /* RFC 9112 3.2.2: the target's authority, not the Host field, names the host. */
        req->host = auth;
        req->host_len = (size_t)(p - auth);
        /* The path may be empty ("http://a" or "http://a?q"): RFC 9110 4.2.3 makes it "/",
         * which the engine does, so that every view here stays inside the buffer. */
        path = p;
    }
    const char *q = memchr(path, '?', (size_t)(end - path));
    if (q != NULL) {
        req->path = path;
        req->path_len = (size_t)(q - path);
        req->query = q + 1;
        req->query_len = (size_t)(end - q - 1);
    } else {
        req->path = path;
        req->path_len = (size_t)(end - path);
    }
    return 0;
}

/* Parses "1#DIGIT" lists such as "5" or "5, 5" (RFC 9110 8.6 allows a recipient to accept a
 * list of identical values). Identical means the same digits: "5, 05" is refused like "5, 6",
 * because an intermediary comparing the text would see two framings. *digits, *digits_len get
 * the spelling of the (first) element, a view into v. Returns the value, or -1 if malformed,
 * differing or over 2^62. */
static int64_t parse_content_length(const char *v, size_t n, const char **digits,
                                    size_t *digits_len)
{
    const char *p = v, *end = v + n;
    int64_t result = -1;
    for (;;) {
        if (UNLIKELY(p == end || *p < '0' || *p > '9'))
            return -1;
        const char *d = p;
        int64_t x = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            /* 2^62 is far above any body a server accepts and keeps every sum below INT64_MAX. */
            if (UNLIKELY(x > ((INT64_C(1) << 62) - (*p - '0')) / 10))
                return -1;
            x = x * 10 + (*p - '0');
            p++;
        }
        if (result < 0) {
            *digits = d;
            *digits_len = (size_t)(p - d);
        } else if (UNLIKELY((size_t)(p - d) != *digits_len ||
                            memcmp(d, *digits, *digits_len) != 0)) {
            return -1;
        }
        result = x;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        if (p == end)
            return result;
        if (UNLIKELY(*p != ','))
            return -1;
        p++;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
    }
}

/* Per-head facts gathered from the fields, turned into the request's semantics at the end. */
struct head_facts {
    int te_seen;         /* a Transfer-Encoding field was present */
    int te_last_chunked; /* the last coding seen so far is chunked */
    int te_chunked_count;
    int te_other; /* a coding other than chunked was seen */
    int conn_close, conn_keep_alive, conn_upgrade;
    int has_upgrade_field;
    int host_count;
    const char *cl_digits; /* the first Content-Length's spelling: later ones must match it */
    size_t cl_digits_len;
};

/* Walks a comma-separated list (RFC 9110 5.6.1), calling back with each element trimmed of OWS.
 * Empty elements are skipped, as 5.6.1 requires of recipients. */
struct list_iter {
    const char *p, *end;
};

static int list_next(struct list_iter *it, const char **elem, size_t *elem_len)
{
    for (;;) {
        while (it->p < it->end && (*it->p == ' ' || *it->p == '\t' || *it->p == ','))
            it->p++;
        if (it->p == it->end)
            return 0;
        const char *s = it->p;
        while (it->p < it->end && *it->p != ',')
            it->p++;
        const char *e = it->p;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        *elem = s;
        *elem_len = (size_t)(e - s);
        return 1;
    }
}

static int on_transfer_encoding(struct http_request *req, struct head_facts *f,
                                const struct http_header *h)
{
    struct list_iter it = {h->value, h->value + h->value_len};
    const char *e;
    size_t n;
    int any = 0;
    f->te_seen = 1;
    while (list_next(&it, &e, &n)) {
        any = 1;
        /* transfer-coding = token *( OWS ";" OWS transfer-parameter ): the name ends at OWS or ';'.
         * Parameters are only checked for being there: any coding with them is not chunked. */
        size_t name_len = 0;
        while (name_len < n && is_class((unsigned char)e[name_len], C_TCHAR))
            name_len++;
        if (UNLIKELY(name_len == 0))
            return fail(req, 400, "invalid transfer-coding");
        if (name_len < n) {
            size_t i = name_len;
            while (i < n && (e[i] == ' ' || e[i] == '\t'))
                i++;
            if (UNLIKELY(i == n || e[i] != ';'))
                return fail(req, 400, "invalid transfer-coding");
        }
        if (eq_lower(e, n, "chunked", 7)) {
            if (UNLIKELY(f->te_chunked_count++ > 0))
                return fail(req, 400, "chunked applied more than once");
            f->te_last_chunked = 1;
        } else {
            if (UNLIKELY(eq_lower(e, name_len, "chunked", 7)))
                return fail(req, 400, "chunked with parameters");
            f->te_other = 1;
            f->te_last_chunked = 0;
        }
    }
    if (UNLIKELY(!any))
        return fail(req, 400, "empty transfer-encoding");
    return 0;
}

static void on_connection(struct head_facts *f, const struct http_header *h)
{
    struct list_iter it = {h->value, h->value + h->value_len};
    const char *e;
    size_t n;
    while (list_next(&it, &e, &n)) {
        if (eq_lower(e, n, "close", 5))
            f->conn_close = 1;
        else if (eq_lower(e, n, "keep-alive", 10))
            f->conn_keep_alive = 1;
        else if (eq_lower(e, n, "upgrade", 7))
            f->conn_upgrade = 1;
    }
}

/* Applies the meaning of one field line (RFC 9110/9112 framing and connection fields). Only the
 * field names that carry framing are looked at; the rest are views for the application. */
static int on_field(struct http_request *req, struct head_facts *f, const struct http_header *h)
{
    switch (h->name_len) {
    case 4:
        if (eq_lower(h->name, 4, "host", 4)) {
            if (UNLIKELY(++f->host_count > 1))
                return fail(req, 400, "more than one host");
            if (UNLIKELY(!host_ok(h->value, h->value_len)))
                return fail(req, 400, "invalid host");
            /* An absolute-form target's authority, already in req->host, wins (RFC 9112
             * 3.2.2); the field is still checked and counted. */
            if (!req->host) {
                req->host = h->value;
                req->host_len = h->value_len;
            }
        }
        break;
    case 6:
        if (eq_lower(h->name, 6, "expect", 6)) {
            if (eq_lower(h->value, h->value_len, "100-continue", 12) && req->minor_version == 1)
                req->expect_continue = 1;
        }
        break;
    case 7:
        if (eq_lower(h->name, 7, "upgrade", 7))
            f->has_upgrade_field = 1;
        break;
    case 10:
        if (eq_lower(h->name, 10, "connection", 10))
            on_connection(f, h);
        break;
    case 14:
        if (eq_lower(h->name, 14, "content-length", 14)) {
            const char *d;
            size_t dlen;
            int64_t v = parse_content_length(h->value, h->value_len, &d, &dlen);
            if (UNLIKELY(v < 0))
                return fail(req, 400, "invalid content-length");
            /* A repeated field must repeat the first one's digits exactly (see above). */
            if (f->cl_digits == NULL) {
                f->cl_digits = d;
                f->cl_digits_len = dlen;
            } else if (UNLIKELY(dlen != f->cl_digits_len || memcmp(d, f->cl_digits, dlen) != 0)) {
                return fail(req, 400, "differing content-length");
            }
            req->content_length = v;
        }
        break;
    case 17:
        if (eq_lower(h->name, 17, "transfer-encoding", 17))
            return on_transfer_encoding(req, f, h);
        break;
    }
    return 0;
}

/* The rules that need the whole head. */
static int on_head_end(struct http_request *req, struct head_facts *f)
{
    if (f->te_seen) {
        /* Smuggling defence (RFC 9112 6.1 and 6.3): a request with both framings is rejected
         * instead of picking one, because a proxy in front of us may have picked the other. */
        if (UNLIKELY(req->content_length >= 0))
            return fail(req, 400, "content-length with transfer-encoding");
        if (UNLIKELY(req->minor_version == 0))
            return fail(req, 400, "transfer-encoding in HTTP/1.0");
        if (UNLIKELY(!f->te_last_chunked))
            return fail(req, 400, "chunked is not the last transfer-coding");
        if (UNLIKELY(f->te_other))
            return fail(req, 501, "unknown transfer-coding");
        req->chunked = 1;
    }
    if (UNLIKELY(req->minor_version == 1 && f->host_count == 0))
        return fail(req, 400, "missing host");
    if (req->minor_version == 1)
        req->keep_alive = !f->conn_close;
    else
        req->keep_alive = f->conn_keep_alive && !f->conn_close;
    req->upgrade = f->conn_upgrade && f->has_upgrade_field;
    return 0;
}

/* Expects CRLF at p (p < end). Returns 0 if found, -2 if the LF has not arrived yet, or -1
 * (status set) if the line does not end in CRLF. */
static int expect_crlf(struct http_request *req, const char *p, const char *end)
{
    if (UNLIKELY(*p == '\n'))
        return fail(req, 400, "bare LF");
    if (UNLIKELY(*p != '\r'))
        return fail(req, 400, "expected CRLF");
    if (p + 1 == end)
        return -2;
    if (UNLIKELY(p[1] != '\n'))
        return fail(req, 400, "bare CR");
    return 0;
}

static int parse_request_line(const char *buf, const char *end, struct http_request *req,
                              const struct http_limits *lim, const char **out)
{
    const char *p = buf;

    /* method = token, then exactly one SP */
    const char *m = p;
    while (p < end && is_class((unsigned char)*p, C_TCHAR))
        p++;
    if (p == end)
        return -2;
    if (UNLIKELY(p == m || *p != ' '))
        return fail(req, 400, p == m ? "invalid method" : "invalid character in method");
    req->method = m;
    req->method_len = (size_t)(p - m);
    req->method_id = method_id(m, req->method_len);
    p++;

    /* request-target: visible ASCII but '#', at most max_target_bytes of it (414 decided once
     * max_target_bytes + 1 target bytes are here, however much more is still to come). */
    const char *t = p;
    const char *scan_end = end;
    if ((size_t)(end - t) > lim->max_target_bytes)
        scan_end = t + lim->max_target_bytes + 1;
    p = skip_target_fast(p, scan_end);
    if (UNLIKELY((size_t)(p - t) > lim->max_target_bytes))
        return fail(req, 414, "request-target too long");
    if (p == end)
        return -2;
    if (UNLIKELY(*p != ' ')) {
        if (*p == '\r' || *p == '\n')
            return fail(req, 400, p == t ? "missing request-target" : "missing HTTP version");
        if (*p == '#')
            return fail(req, 400, "fragment in request-target");
        return fail(req, 400, "invalid character in request-target");
    }
    if (UNLIKELY(p == t))
        return fail(req, 400, "missing request-target");
    req->target = t;
    req->target_len = (size_t)(p - t);
    p++;

    /* HTTP-version = "HTTP/" DIGIT "." DIGIT, then CRLF. Well-formed but other than 1.0/1.1 is
     * 505; anything else 400. All ten bytes are needed before deciding, so that "HTTP/1.10"
     * is a malformed version (400), not an unsupported one. */
    if (end - p < 10) {
        /* Reject early what can never become a version, so garbage does not wait for 431. */
        static const char prefix[] = "HTTP/";
        size_t n = (size_t)(end - p) < 5 ? (size_t)(end - p) : 5;
        if (UNLIKELY(memcmp(p, prefix, n) != 0))
            return fail(req, 400, "invalid HTTP version");
        return -2;
    }
    if (UNLIKELY(memcmp(p, "HTTP/", 5) != 0 || p[5] < '0' || p[5] > '9' || p[6] != '.' ||
                 p[7] < '0' || p[7] > '9'))
        return fail(req, 400, "invalid HTTP version");
    int r = expect_crlf(req, p + 8, end);
    if (UNLIKELY(r < 0))
        return r;
    if (UNLIKELY(p[5] != '1' || (p[7] != '0' && p[7] != '1')))
        return fail(req, 505, "HTTP version not supported");
    req->minor_version = p[7] - '0';
    *out = p + 10;
    return 0;
}

int http_parse_request(const char *buf, size_t len, struct http_request *req,
                       const struct http_limits *lim)
{
    /* The return value is an int: a head can never be longer than INT_MAX bytes. */
    size_t max_head = lim->max_header_bytes < INT_MAX ? lim->max_header_bytes : INT_MAX;
    size_t window = len < max_head ? len : max_head;
    const char *p = buf, *end = buf + window;
    size_t cap = req->num_headers < lim->max_headers ? req->num_headers : lim->max_headers;
    struct head_facts facts = {0};
    int r;

    req->method = NULL;
    req->method_len = 0;
    req->method_id = HTTP_OTHER;
    req->target = req->path = req->query = NULL;
    req->target_len = req->path_len = req->query_len = 0;
    req->minor_version = -1;
    req->num_headers = 0;
    req->content_length = -1;
    req->chunked = req->keep_alive = req->expect_continue = req->upgrade = 0;
    req->host = NULL;
    req->host_len = 0;
    req->status = 0;
    req->error = NULL;

    /* RFC 9112 2.2: skip empty lines before the request line. */
    while (p < end && (*p == '\r' || *p == '\n')) {
        r = expect_crlf(req, p, end);
        if (r < 0)
            goto out;
        p += 2;
    }
    if (p == end) {
        r = -2;
        goto out;
    }

    r = parse_request_line(p, end, req, lim, &p);
    if (r != 0)
        goto out;
    r = split_target(req);
    if (UNLIKELY(r < 0))
        goto out;

    for (;;) {
        if (p == end) {
            r = -2;
            goto out;
        }
        /* End of the head, or a field line. */
        if (*p == '\r' || *p == '\n') {
            r = expect_crlf(req, p, end);
            if (r < 0)
                goto out;
            p += 2;
            break;
        }
        if (UNLIKELY(*p == ' ' || *p == '\t')) {
            r = fail(req, 400, req->num_headers ? "obs-fold" : "whitespace before first field");
            goto out;
        }
        if (UNLIKELY(req->num_headers >= cap)) {
            r = fail(req, 431, "too many header fields");
            goto out;
        }

        /* field-name = token, then ':' with no whitespace before it (RFC 9112 5.1). */
        struct http_header *h = &req->headers[req->num_headers];
        const char *n = p;
        while (p < end && is_class((unsigned char)*p, C_TCHAR))
            p++;
        if (p == end) {
            r = -2;
            goto out;
        }
        if (UNLIKELY(*p != ':')) {
            if (p == n)
                r = fail(req, 400, "invalid character in field name");
            else if (*p == ' ' || *p == '\t')
                r = fail(req, 400, "whitespace before colon");
            else
                r = fail(req, 400, "invalid character in field name");
            goto out;
        }
        if (UNLIKELY(p == n)) {
            r = fail(req, 400, "empty field name");
            goto out;
        }
        h->name = n;
        h->name_len = (size_t)(p - n);
        p++;

        /* field-value with OWS around it. */
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        const char *v = p;
        for (;;) {
            p = skip_value_fast(p, end);
            if (p < end && *p == '\t') {
                p++;
                continue;
            }
            break;
        }
        if (p == end) {
            r = -2;
            goto out;
        }
        if (UNLIKELY(*p != '\r' && *p != '\n')) {
            r = fail(req, 400, "invalid character in field value");
            goto out;
        }
        const char *ve = p;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        r = expect_crlf(req, p, end);
        if (r < 0)
            goto out;
        p += 2;
        h->value = v;
        h->value_len = (size_t)(ve - v);
        req->num_headers++;
        r = on_field(req, &facts, h);
        if (UNLIKELY(r < 0))
            goto out;
    }

    r = on_head_end(req, &facts);
    if (UNLIKELY(r < 0))
        goto out;
    return (int)(p - buf);

out:
    /* Out of bytes inside the window while more bytes arrived than the window holds: the head
     * is over max_header_bytes whatever follows. Unless the window ended inside the target and
     * the bytes past it show the target itself over max_target_bytes: that is a 414 (RFC 9112
     * 3: MUST), which default limits (target and head both 8192) could otherwise never give. */
    if (r == -2 && len > window) {
        if (req->method && !req->target) {
            const char *t = req->method + req->method_len + 1;
            size_t avail = (size_t)(buf + len - t);
            const char *scan_end = t + (avail > lim->max_target_bytes ? lim->max_target_bytes + 1
                                                                      : avail);
            const char *q = skip_target_fast(t, scan_end);
            if ((size_t)(q - t) > lim->max_target_bytes)
                return fail(req, 414, "request-target too long");
            if (q == buf + len)
                return -2; /* the target goes on: only more bytes tell 414 from 431 */
        }
        r = fail(req, 431, "header section too large");
    }
    return r;
}

int http_field_once(const struct http_header *h, size_t n, const char *name, size_t name_len,
                    const char **value, size_t *value_len)
{
    int count = 0;
    *value = NULL;
    *value_len = 0;
    for (size_t i = 0; i < n && count < 2; i++) {
        if (h[i].name_len != name_len)
            continue;
        size_t k = 0;
        while (k < name_len && lower((unsigned char)h[i].name[k]) == lower((unsigned char)name[k]))
            k++;
        if (k < name_len)
            continue;
        if (++count == 1) {
            *value = h[i].value;
            *value_len = h[i].value_len;
        }
    }
    if (count != 1) {
        *value = NULL;
        *value_len = 0;
    }
    return count;
}

/* ---- chunked decoder ---------------------------------------------------------------------- */

enum {
    CH_SIZE_START = 0, /* zeroed state: the first hex digit of a chunk-size */
    CH_SIZE,           /* more hex digits, BWS, ';' or CR */
    CH_EXT_BWS,        /* after the size or an extension, in BWS: ';' next */
    CH_EXT_NAME_START, /* after ';', BWS then ext-name */
    CH_EXT_NAME,
    CH_EXT_AFTER_NAME, /* BWS then '=', ';' or CR */
    CH_EXT_VAL_START,  /* after '=', BWS then token or quoted-string */
    CH_EXT_VAL_TOKEN,
    CH_EXT_QUOTED,
    CH_EXT_QUOTED_ESC,
    CH_EXT_AFTER_VAL, /* after a value: BWS, ';' or CR */
    CH_SIZE_LF,       /* CR seen at the end of the size line */
    CH_DATA,
    CH_DATA_CR,
    CH_DATA_LF,
    CH_TRAILER_START, /* a trailer field line, or the final CRLF */
    CH_TRAILER_NAME,
    CH_TRAILER_VALUE,
    CH_TRAILER_LF,
    CH_END_LF,
    CH_DONE,
};

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    return (c | 0x20) - 'a' + 10;
}

/* One byte of a size line's extension part: returns the next state or -1. */
static int ext_step(int state, unsigned char c)
{
    int ws = c == ' ' || c == '\t';
    switch (state) {
    case CH_EXT_BWS:
    case CH_EXT_AFTER_VAL:
        if (ws)
            return state;
        if (c == ';')
            return CH_EXT_NAME_START;
        if (c == '\r' && state == CH_EXT_AFTER_VAL)
            return CH_SIZE_LF;
        return -1;
    case CH_EXT_NAME_START:
        if (ws)
            return state;
        return is_class(c, C_TCHAR) ? CH_EXT_NAME : -1;
    case CH_EXT_NAME:
        if (is_class(c, C_TCHAR))
            return state;
        /* The name has ended: the byte is read as if after it. */
        __attribute__((fallthrough));
    case CH_EXT_AFTER_NAME:
        if (ws)
            return CH_EXT_AFTER_NAME;
        if (c == '=')
            return CH_EXT_VAL_START;
        if (c == ';')
            return CH_EXT_NAME_START;
        if (c == '\r')
            return CH_SIZE_LF;
        return -1;
    case CH_EXT_VAL_START:
        if (ws)
            return state;
        if (c == '"')
            return CH_EXT_QUOTED;
        return is_class(c, C_TCHAR) ? CH_EXT_VAL_TOKEN : -1;
    case CH_EXT_VAL_TOKEN:
        if (is_class(c, C_TCHAR))
            return state;
        if (ws)
            return CH_EXT_AFTER_VAL;
        if (c == ';')
            return CH_EXT_NAME_START;
        if (c == '\r')
            return CH_SIZE_LF;
        return -1;
    case CH_EXT_QUOTED:
        /* qdtext = HTAB / SP / %x21 / %x23-5B / %x5D-7E / obs-text */
        if (c == '"')
            return CH_EXT_AFTER_VAL;
        if (c == '\\')
            return CH_EXT_QUOTED_ESC;
        if (c == '\t' || (c >= 0x20 && c != 0x7f))
            return state;
        return -1;
    case CH_EXT_QUOTED_ESC:
        if (c == '\t' || (c >= 0x20 && c != 0x7f))
            return CH_EXT_QUOTED;
        return -1;
    }
    return -1;
}

int64_t http_chunked_decode(struct http_chunked *st, char *buf, size_t *len,
                            size_t max_trailer_bytes)
{
    char *in = buf, *end = buf + *len, *out = buf;
    int state = st->state;
    /* What to answer on -1: set just before each jump to invalid. */
    int status = 400;
    const char *why = "invalid chunked body";

    while (in < end) {
        if (state == CH_DATA) {
            size_t avail = (size_t)(end - in);
            size_t n = st->remaining < avail ? (size_t)st->remaining : avail;
            if (out != in)
                memmove(out, in, n);
            out += n;
            in += n;
            st->remaining -= n;
            st->total += n;
            if (st->remaining == 0)
                state = CH_DATA_CR;
            continue;
        }
        unsigned char c = (unsigned char)*in++;
        switch (state) {
        case CH_SIZE_START:
            why = "invalid chunk size";
            if (UNLIKELY(!is_class(c, C_HEX)))
                goto invalid;
            st->remaining = (uint64_t)hexval(c);
            st->aux = 1;
            state = CH_SIZE;
            break;
        case CH_SIZE:
            why = "invalid chunk size";
            if (is_class(c, C_HEX)) {
                /* 16 hex digits hold any uint64_t, so the digit limit is the overflow check. */
                if (UNLIKELY(++st->aux > 16))
                    goto invalid;
                st->remaining = (st->remaining << 4) | (uint64_t)hexval(c);
                break;
            }
            st->aux = 0; /* from here on: extension bytes of this line */
            if (c == '\r') {
                state = CH_SIZE_LF;
            } else if (c == ';' || c == ' ' || c == '\t') {
                state = c == ';' ? CH_EXT_NAME_START : CH_EXT_BWS;
                st->aux = 1;
            } else {
                goto invalid;
            }
            break;
        case CH_SIZE_LF:
            why = "invalid chunk size line";
            if (UNLIKELY(c != '\n'))
                goto invalid;
            if (st->remaining == 0) {
                state = CH_TRAILER_START;
            } else {
                why = "chunked body too large";
                if (UNLIKELY(st->remaining > UINT64_MAX - st->total))
                    goto invalid;
                state = CH_DATA;
            }
            break;
        case CH_DATA_CR:
            why = "missing CRLF after chunk data";
            if (UNLIKELY(c != '\r'))
                goto invalid;
            state = CH_DATA_LF;
            break;
        case CH_DATA_LF:
            why = "missing CRLF after chunk data";
            if (UNLIKELY(c != '\n'))
                goto invalid;
            state = CH_SIZE_START;
            break;
        case CH_TRAILER_START:
            /* Only field lines count toward max_trailer_bytes, so 0 means "no trailer fields". */
            if (c == '\r') {
                state = CH_END_LF;
                break;
            }
            if (UNLIKELY(++st->trailer_bytes > max_trailer_bytes))
                goto too_large;
            why = "invalid trailer field";
            if (UNLIKELY(!is_class(c, C_TCHAR)))
                goto invalid;
            state = CH_TRAILER_NAME;
            break;
        case CH_TRAILER_NAME:
            if (UNLIKELY(++st->trailer_bytes > max_trailer_bytes))
                goto too_large;
            why = "invalid trailer field";
            if (c == ':')
                state = CH_TRAILER_VALUE;
            else if (UNLIKELY(!is_class(c, C_TCHAR)))
                goto invalid;
            break;
        case CH_TRAILER_VALUE:
            if (UNLIKELY(++st->trailer_bytes > max_trailer_bytes))
                goto too_large;
            why = "invalid trailer field";
            if (c == '\r')
                state = CH_TRAILER_LF;
            else if (UNLIKELY(!is_class(c, C_VALUE)))
                goto invalid;
            break;
        case CH_TRAILER_LF:
            if (UNLIKELY(++st->trailer_bytes > max_trailer_bytes))
                goto too_large;
            why = "invalid trailer field";
            if (UNLIKELY(c != '\n'))
                goto invalid;
            state = CH_TRAILER_START;
            break;
        case CH_END_LF:
            why = "invalid end of chunked body";
            if (UNLIKELY(c != '\n'))
                goto invalid;
            state = CH_DONE;
            goto done;
        case CH_DONE:
            /* Called again after the end: nothing more belongs to this body. */
            in--;
            goto done;
        default: {
            /* The extension states: bounded, validated, skipped. */
            why = "invalid chunk extension";
            if (UNLIKELY(++st->aux > HTTP_CHUNK_EXT_MAX))
                goto invalid;
            int next = ext_step(state, c);
            if (UNLIKELY(next < 0))
                goto invalid;
            state = next;
            break;
        }
        }
    }
    st->state = state;
    if (state == CH_DONE)
        goto done;
    *len = (size_t)(out - buf);
    return -2;

done:
    st->state = CH_DONE;
    {
        size_t rest = (size_t)(end - in);
        if (rest && out != in)
            memmove(out, in, rest);
        *len = (size_t)(out - buf);
        return (int64_t)rest;
    }

too_large:
    /* The trailer section is a field section like the head: over its bound is 431 (RFC 6585 5),
     * which tells the client what to change, where a bare 400 would not. */
    status = 431;
    why = "trailer section too large";
invalid:
    st->state = state;
    st->status = status;
    st->error = why;
    *len = (size_t)(out - buf);
    return -1;
}
