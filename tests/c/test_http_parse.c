/* test_http_parse.c: unit tests of csrc/http_parse.c under ASan+UBSan.
 *
 * Every head is copied so that it ends exactly at a PROT_NONE page (picohttpparser's harness):
 * a read one byte past the input faults at once, which ASan alone would miss for reads inside a
 * larger heap block. Each input is also parsed at every prefix length, all placed the same way,
 * to prove that the parser never looks past `len` while waiting for more bytes. The chunked
 * decoder is fed at every split point and byte by byte. The broad conformance matrix lives in
 * the Markdown cases of tests/http (tests/test_parser.py); these tests cover memory safety and
 * the C contract. */
#include <ctype.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "csrc/http_parse.c"
#include "tap.h"

static char *guard_base;
static size_t guard_size;
static size_t page;

/* Maps [writable pages][PROT_NONE page] once; place() copies data to end at the guard. */
static void guard_init(void)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    guard_size = 4 * page; /* 3 writable pages: room for 8 KiB heads */
    guard_base = mmap(NULL, guard_size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (guard_base == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    if (mprotect(guard_base + guard_size, page, PROT_NONE) != 0) {
        perror("mprotect");
        exit(2);
    }
}

static char *place(const char *data, size_t len)
{
    if (len > guard_size) {
        fprintf(stderr, "input too large for the guard area\n");
        exit(2);
    }
    char *p = guard_base + guard_size - len;
    memcpy(p, data, len);
    return p;
}

static struct http_header hdrs[128];

static int parse_at_guard(const char *data, size_t len, struct http_request *req,
                          const struct http_limits *lim)
{
    memset(req, 0xa5, sizeof(*req)); /* garbage in: the parser must set every field itself */
    req->headers = hdrs;
    req->num_headers = N_ELEMENTS(hdrs);
    return http_parse_request(place(data, len), len, req, lim);
}

/* Parses the whole input and every prefix at the guard page; prefixes must give -2 or the same
 * decision. Returns the whole input's result, leaving req filled for it. */
static int parse_all_splits(const char *data, size_t len, struct http_request *req,
                            const struct http_limits *lim, const char *desc)
{
    struct http_request pre;
    int bad = 0;
    int whole = parse_at_guard(data, len, req, lim);
    int status = req->status;
    for (size_t k = 0; k < len; k++) {
        int r = parse_at_guard(data, k, &pre, lim);
        if (whole > 0 && (int)k >= whole) {
            if (r != whole)
                bad++;
        } else if (r != -2 && !(r == -1 && whole == -1 && pre.status == status)) {
            bad++;
        }
    }
    ok(bad == 0, "%s: every prefix gives -2 or the same result (%d bad)", desc, bad);
    /* Leave req describing the whole input again, placed at the guard. */
    return parse_at_guard(data, len, req, lim);
}

#define S(lit) lit, sizeof(lit) - 1

static void test_simple(const struct http_limits *lim)
{
    struct http_request req;
    const char in[] = "GET /hello?x=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: t\r\n\r\n";
    int r = parse_all_splits(S(in), &req, lim, "simple GET");
    is_int(r, sizeof(in) - 1, "consumes the whole head");
    is_mem(req.method, req.method_len, "GET", "method");
    is_int(req.method_id, HTTP_GET, "method id");
    is_mem(req.path, req.path_len, "/hello", "path");
    is_mem(req.query, req.query_len, "x=1", "query");
    is_int(req.minor_version, 1, "minor version");
    is_int(req.num_headers, 2, "two fields");
    is_mem(req.headers[1].name, req.headers[1].name_len, "User-Agent", "field name");
    is_mem(req.headers[1].value, req.headers[1].value_len, "t", "field value");
    is_mem(req.host, req.host_len, "example.com", "host");
    is_int(req.keep_alive, 1, "keep-alive");
    is_int(req.content_length, -1, "no content-length");
}

static void test_views_in_buffer(const struct http_limits *lim)
{
    struct http_request req;
    const char in[] = "POST http://a.example/p?q HTTP/1.1\r\nHost: a.example\r\n"
                      "Content-Length: 3\r\nX:\r\n\r\nabc";
    int r = parse_at_guard(S(in), &req, lim);
    const char *base = guard_base + guard_size - (sizeof(in) - 1);
    const char *end = guard_base + guard_size;
    ok(r > 0, "absolute-form POST parses (%d)", r);
    int inside = req.method >= base && req.method + req.method_len <= end && req.path >= base &&
                 req.path + req.path_len <= end && req.query >= base &&
                 req.query + req.query_len <= end;
    for (size_t i = 0; i < req.num_headers; i++) {
        inside &= req.headers[i].name >= base && req.headers[i].value >= base &&
                  req.headers[i].value + req.headers[i].value_len <= end;
    }
    ok(inside, "every view lies inside the buffer");
    is_mem(req.path, req.path_len, "/p", "absolute-form path");
    is_int(req.headers[2].value_len, 0, "empty value");
    is_int(req.content_length, 3, "content-length");
}

static void test_rejections(const struct http_limits *lim)
{
    static const struct {
        const char *in;
        int status;
    } cases[] = {
        {"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n", 400},
        {"GET / HTTP/1.1\nHost: a\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
         400},
        {"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
        {"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505},
        {"GET / HTTP/1.1\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 03\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 03\r\n\r\n", 400},
    };
    for (size_t i = 0; i < N_ELEMENTS(cases); i++) {
        struct http_request req;
        char desc[64];
        snprintf(desc, sizeof(desc), "rejection %zu", i);
        int r = parse_all_splits(cases[i].in, strlen(cases[i].in), &req, lim, desc);
        is_int(r, -1, desc);
        is_int(req.status, cases[i].status, req.error ? req.error : "(no error)");
    }
}

/* A long head exercising the word-at-a-time loops at every alignment relative to the guard. */
static void test_long_values(const struct http_limits *lim)
{
    char in[2048];
    int bad = 0;
    for (int pad = 0; pad < 16; pad++) {
        int n = snprintf(in, sizeof(in), "GET /%.*s HTTP/1.1\r\nHost: a\r\nX-V: %.*s\r\n\r\n",
                         pad + 40, "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefgh",
                         pad + 30, "0123456789012345678901234567890123456789012345678901234");
        struct http_request req;
        char desc[64];
        snprintf(desc, sizeof(desc), "long head, padding %d", pad);
        int r = parse_all_splits(in, (size_t)n, &req, lim, desc);
        if (r != n || req.headers[1].value_len != (size_t)pad + 30)
            bad++;
    }
    ok(bad == 0, "long heads parse at every padding");
}

/* A '#' anywhere in a target, at every alignment of the wide loops: refused at that byte. */
static void test_fragment(const struct http_limits *lim)
{
    char in[256];
    int bad = 0;
    for (int at = 0; at < 40; at++) {
        int n = snprintf(in, sizeof(in), "GET /%.*s#%s HTTP/1.1\r\nHost: a\r\n\r\n", at,
                         "abcdefghijabcdefghijabcdefghijabcdefghij", "frag");
        struct http_request req;
        char desc[64];
        snprintf(desc, sizeof(desc), "'#' after %d target bytes", at + 1);
        int r = parse_all_splits(in, (size_t)n, &req, lim, desc);
        if (r != -1 || req.status != 400 || strcmp(req.error, "fragment in request-target") != 0)
            bad++;
    }
    ok(bad == 0, "a fragment is refused wherever it sits (%d bad)", bad);
}

static void test_limits(void)
{
    struct http_limits lim;
    struct http_request req;
    http_limits_default(&lim);
    is_int(lim.max_header_bytes, 8192, "default max_header_bytes");
    is_int(lim.max_headers, 100, "default max_headers");

    char big[9000];
    memset(big, 'a', sizeof(big));
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    int r = parse_at_guard(big, sizeof(big), &req, &lim);
    is_int(r, -1, "an unterminated 9000-byte head is rejected");
    is_int(req.status, 431, "with 431");

    lim.max_target_bytes = 16;
    const char t[] = "GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    r = parse_at_guard(S(t), &req, &lim);
    is_int(r, -1, "a target over the limit is rejected before its end");
    is_int(req.status, 414, "with 414");

    http_limits_default(&lim);
    lim.max_headers = 1;
    const char h[] = "GET / HTTP/1.1\r\nHost: a\r\nB";
    r = parse_at_guard(S(h), &req, &lim);
    is_int(r, -1, "a second field over max_headers=1 is rejected when it starts");
    is_int(req.status, 431, "with 431");
}

/* ---- chunked -------------------------------------------------------------------------------- */

/* Decodes `in` fed as the given pieces (cut positions), each piece placed at the guard page and
 * the decoded output collected. Returns the final result; body/rest written out. */
static int64_t decode_pieces(const char *in, size_t len, const size_t *cuts, size_t ncuts,
                             size_t max_trailer, char *body, size_t *body_len, char *rest,
                             size_t *rest_len)
{
    struct http_chunked st;
    memset(&st, 0, sizeof(st));
    size_t start = 0;
    int64_t r = -2;
    *body_len = *rest_len = 0;
    for (size_t i = 0; i <= ncuts; i++) {
        size_t stop = i < ncuts ? cuts[i] : len;
        size_t n = stop - start;
        char *p = place(in + start, n);
        r = http_chunked_decode(&st, p, &n, max_trailer);
        memcpy(body + *body_len, p, n);
        *body_len += n;
        if (r == -1)
            return r;
        if (r >= 0) {
            memcpy(rest, p + n, (size_t)r);
            memcpy(rest + r, in + stop, len - stop);
            *rest_len = (size_t)r + len - stop;
            return (int64_t)*rest_len;
        }
        start = stop;
    }
    return r;
}

static void check_chunked(const char *in, int64_t want, const char *want_body,
                          const char *want_rest, const char *desc)
{
    size_t len = strlen(in);
    char body[4096], rest[4096];
    size_t bl, rl;
    int64_t r = decode_pieces(in, len, NULL, 0, 4096, body, &bl, rest, &rl);
    is_int(r, want, desc);
    if (want >= 0 || want == -2) {
        is_mem(body, bl, want_body, "decoded body");
        if (want >= 0)
            is_mem(rest, rl, want_rest, "bytes after the body");
    }
    int bad = 0;
    for (size_t k = 1; k < len; k++) {
        size_t cut = k;
        int64_t r2 = decode_pieces(in, len, &cut, 1, 4096, body, &bl, rest, &rl);
        if (r2 != want)
            bad++;
        else if (want != -1 && (bl != strlen(want_body) || memcmp(body, want_body, bl) != 0))
            bad++;
    }
    size_t cuts[512];
    for (size_t k = 1; k < len && k <= N_ELEMENTS(cuts); k++)
        cuts[k - 1] = k;
    int64_t r3 = decode_pieces(in, len, cuts, len > 1 ? len - 1 : 0, 4096, body, &bl, rest, &rl);
    if (r3 != want)
        bad++;
    ok(bad == 0, "%s: same result at every split and byte by byte (%d bad)", desc, bad);
}

static void test_chunked(void)
{
    check_chunked("5\r\nhello\r\n0\r\n\r\n", 0, "hello", "", "one chunk");
    check_chunked("3\r\nabc\r\n2;x=\"y\"\r\nde\r\n0\r\nT: v\r\n\r\nNEXT", 4, "abcde", "NEXT",
                  "extensions, trailers and a pipelined follower");
    check_chunked("5\r\nhel", -2, "hel", "", "incomplete");
    check_chunked("5\r\nhelloX\r\n", -1, "", "", "missing CRLF after data");
    check_chunked("10000000000000000\r\n", -1, "", "", "17 hex digits");
    check_chunked("ffffffffffffffff\r\nab", -2, "ab", "", "largest size");
    check_chunked("5 \r\nhello\r\n0\r\n\r\n", -1, "", "", "whitespace after the size");

    /* Total overflow: two maximal chunks cannot both be announced. */
    struct http_chunked st;
    memset(&st, 0, sizeof(st));
    st.total = UINT64_MAX - 1;
    char b[] = "2\r\n";
    size_t n = 3;
    is_int(http_chunked_decode(&st, b, &n, 0), -1, "a chunk that would overflow the total");

    /* Calling again after the end returns the bytes untouched. */
    memset(&st, 0, sizeof(st));
    char e[] = "0\r\n\r\n";
    n = 5;
    is_int(http_chunked_decode(&st, e, &n, 0), 0, "end of body");
    char more[] = "GET";
    n = 3;
    is_int(http_chunked_decode(&st, more, &n, 0), 3, "after the end everything is rest");
    is_int(n, 0, "and no body");
}

/* Feeds `in` whole, then byte by byte, and checks that both end in -1 with the given status and
 * rule name: the engine answers with them, so they must not depend on how the bytes arrived. */
static void check_chunked_error(const char *in, size_t max_trailer, int want_status,
                                const char *want_error, const char *desc)
{
    size_t len = strlen(in);
    struct http_chunked st;
    memset(&st, 0, sizeof(st));
    size_t n = len;
    int64_t r = http_chunked_decode(&st, place(in, len), &n, max_trailer);
    is_int(r, -1, desc);
    is_int(st.status, want_status, "status");
    ok(st.error && strcmp(st.error, want_error) == 0, "rule \"%s\" (got \"%s\")", want_error,
       st.error ? st.error : "(null)");
    memset(&st, 0, sizeof(st));
    int bad = 0;
    for (size_t i = 0; i < len; i++) {
        n = 1;
        r = http_chunked_decode(&st, place(in + i, 1), &n, max_trailer);
        if (r == -1)
            break;
    }
    if (r != -1 || st.status != want_status || !st.error || strcmp(st.error, want_error) != 0)
        bad++;
    ok(bad == 0, "%s: the same status and rule byte by byte", desc);
}

static void test_chunked_errors(void)
{
    /* A trailer section over its limit is a field section too large (431), not a malformed
     * body: the client did nothing wrong but send too much. */
    char big[9000];
    int n = snprintf(big, sizeof(big), "3\r\nabc\r\n0\r\nX-Big: ");
    memset(big + n, 'v', sizeof(big) - (size_t)n - 1);
    big[sizeof(big) - 1] = '\0';
    check_chunked_error(big, 8192, 431, "trailer section too large", "trailers over 8 KiB");
    check_chunked_error("0\r\nA: 1\r\nB: 2\r\n\r\n", 8, 431, "trailer section too large",
                        "a second trailer line over the limit");
    check_chunked_error("0\r\nX: 1\r\n\r\n", 0, 431, "trailer section too large",
                        "any trailer with a zero limit");
    check_chunked_error("g\r\n", 4096, 400, "invalid chunk size", "a non-hex size");
    check_chunked_error("00000000000000005\r\n", 4096, 400, "invalid chunk size", "17 hex digits");
    check_chunked_error("5;a=b@\r\n", 4096, 400, "invalid chunk extension", "a bad extension");
    check_chunked_error("5\r\nhelloX", 4096, 400, "missing CRLF after chunk data",
                        "data longer than the size");
    check_chunked_error("5\nhello", 4096, 400, "invalid chunk size", "a bare LF after the size");
    check_chunked_error("0\r\n: x\r\n\r\n", 4096, 400, "invalid trailer field",
                        "a trailer line without a name");
    check_chunked_error("0\r\nX: a\x01\r\n\r\n", 4096, 400, "invalid trailer field",
                        "a control byte in a trailer");
    check_chunked_error("0\r\n\rX", 4096, 400, "invalid end of chunked body",
                        "a bare CR at the end");
    check_chunked_error("5\rX", 4096, 400, "invalid chunk size line", "a bare CR after the size");
}

static void test_field_once(const struct http_limits *lim)
{
    struct http_request req;
    const char *v;
    size_t vl;
    const char one[] = "GET / HTTP/1.1\r\nHost: a\r\nRange: bytes=0-1\r\n\r\n";
    parse_at_guard(S(one), &req, lim);
    is_int(http_field_once(req.headers, req.num_headers, "range", 5, &v, &vl), 1, "one Range");
    is_mem(v, vl, "bytes=0-1", "its value");
    is_int(http_field_once(req.headers, req.num_headers, "if-range", 8, &v, &vl), 0, "no If-Range");
    ok(v == NULL && vl == 0, "absent: no value");
    const char two[] = "GET / HTTP/1.1\r\nHost: a\r\nrange: bytes=0-1\r\nX: y\r\n"
                       "RANGE: bytes=5-9\r\nRange: bytes=0-1\r\n\r\n";
    parse_at_guard(S(two), &req, lim);
    is_int(http_field_once(req.headers, req.num_headers, "Range", 5, &v, &vl), 2,
           "two or more Range lines, any case, count as 2");
    ok(v == NULL && vl == 0, "repeated: no value, neither the first nor the last");
    is_int(http_field_once(req.headers, req.num_headers, "rang", 4, &v, &vl), 0,
           "a prefix of a name is another name");
}

/* host_ok's reg-name scan, one class test a byte, against the rule it implements written out
 * byte by byte (RFC 3986 3.2.2: unreserved, sub-delims and pct-encoded, then ":" and digits):
 * every string of up to four bytes over the bytes that matter gets the same answer. */
static int host_rule(const char *v, size_t n)
{
    const char *p = v, *end = v + n;
    if (p < end && *p == '[')
        return host_ok(v, n); /* IP-literals: the scan is not the reg-name's */
    for (; p < end && *p != ':'; p++) {
        if (!(isalnum((unsigned char)*p) || strchr("-._~!$&'()*+,;=%", *p)) || *p == '\0')
            return 0;
        if (*p == '%') {
            if (end - p < 3 || !isxdigit((unsigned char)p[1]) || !isxdigit((unsigned char)p[2]))
                return 0;
            p += 2;
        }
    }
    if (p == end)
        return 1;
    for (p++; p < end; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

static void test_host_regname(void)
{
    static const char alpha[] = "a9F-.~!;=%:[]@/ \x7f\x80";
    const size_t k = sizeof(alpha) - 1;
    char s[4];
    int same = 1;
    for (size_t n = 0; n <= 4; n++) {
        size_t total = 1;
        for (size_t i = 0; i < n; i++)
            total *= k;
        for (size_t x = 0; x < total; x++) {
            size_t y = x;
            for (size_t i = 0; i < n; i++, y /= k)
                s[i] = alpha[y % k];
            if (host_ok(s, n) != host_rule(s, n)) {
                note("host %.*s: %d", (int)n, s, host_ok(s, n));
                same = 0;
            }
        }
    }
    ok(same, "host_ok's reg-name scan agrees with the rule on every short string");
    ok(host_ok("127.0.0.1:8080", 14) && host_ok("a%2Fb", 5) && !host_ok("a%2", 3) &&
           !host_ok("a]b", 3) && !host_ok("a:8x", 4),
       "host_ok: a peer's address and port, pct-encoded bytes, refusals");
}

int main(void)
{
    struct http_limits lim;
    guard_init();
    http_limits_default(&lim);
    test_simple(&lim);
    test_views_in_buffer(&lim);
    test_rejections(&lim);
    test_long_values(&lim);
    test_fragment(&lim);
    test_field_once(&lim);
    test_limits();
    test_chunked();
    test_chunked_errors();
    test_host_regname();
    return done_testing();
}
