/* test_http1_write.c: HTTP/1.1 response serialisation and the per-thread Date cache. */
#define _GNU_SOURCE
#include "csrc/http_date.c"
#include "csrc/wbuf.c"
#include "csrc/http1_write.c"

#include "tap.h"

#define D (&http_head_default)

static void test_date_cache(void)
{
    const char *a = http_date_cached(784111777);
    const char *b = http_date_cached(784111777);
    ok(a == b, "cache returns the same storage");
    is_mem(a, HTTP_DATE_LEN, "Sun, 06 Nov 1994 08:49:37 GMT", "cache formats the second");
    is_mem(http_date_cached(784111778), HTTP_DATE_LEN, "Sun, 06 Nov 1994 08:49:38 GMT",
           "cache refreshes when the second changes");
    /* Within a minute only the seconds are rewritten; every other change formats it all. Each
     * text is compared with http_date_format's, which the seconds' shortcut must equal. */
    static const time_t seq[] = {784111779, 784111799, 784111780, 784111800, 784115999, 784116000,
                                 784166399, 784166400, 784166401, 946684799, 946684800, 784111777};
    char want[HTTP_DATE_SIZE];
    int same = 1;
    for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
        http_date_format(seq[i], want);
        if (memcmp(http_date_cached(seq[i]), want, HTTP_DATE_SIZE) != 0) {
            note("second %lld: %.29s, want %.29s", (long long)seq[i], http_date_cached(seq[i]),
                 want);
            same = 0;
        }
    }
    ok(same, "cache equals a fresh format across seconds, minutes, hours, days and years");
    is_mem(http_date_cached(784166400), HTTP_DATE_LEN, "Mon, 07 Nov 1994 00:00:00 GMT",
           "cache crosses midnight");
    is_mem(http_date_cached(784166459), HTTP_DATE_LEN, "Mon, 07 Nov 1994 00:00:59 GMT",
           "cache rewrites the seconds within the minute");
}

static void test_head(void)
{
    char st[64];
    struct wbuf out;
    wbuf_init(&out, st, sizeof(st)); /* small: forces growth to the heap */
    const char *date = "Sun, 06 Nov 1994 08:49:37 GMT";
    is_int(http_write_head(&out, D, 200, 1, 1, 13, "Content-Type: text/plain\r\n", 26, date), 0,
           "head 200");
    is_mem(out.ptr, out.len,
           "HTTP/1.1 200 OK\r\nServer: cyserve\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
           "Content-Length: 13\r\nContent-Type: text/plain\r\n\r\n",
           "200 keep-alive head");
    out.len = 0;
    http_write_head(&out, D, 204, 0, 1, 0, NULL, 0, date);
    is_mem(out.ptr, out.len,
           "HTTP/1.1 204 No Content\r\nServer: cyserve\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
           "Connection: keep-alive\r\n\r\n",
           "204 has no Content-Length; 1.0 keep-alive is echoed");
    out.len = 0;
    http_write_head(&out, D, 200, 1, 1, HTTP_LENGTH_CHUNKED, NULL, 0, date);
    is_mem(out.ptr, out.len,
           "HTTP/1.1 200 OK\r\nServer: cyserve\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
           "Transfer-Encoding: chunked\r\n\r\n",
           "a streamed body: chunked, no Content-Length");
    out.len = 0;
    http_write_head(&out, D, 299, 0, 0, HTTP_LENGTH_UNTIL_CLOSE, NULL, 0, date);
    is_mem(out.ptr, out.len,
           "HTTP/1.1 299 \r\nServer: cyserve\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
           "Connection: close\r\n\r\n",
           "until the close: no length; an unregistered code gets an empty reason (RFC 9112 4)");
    out.len = 0;
    is_int(http_write_head_own(&out, D, 200, "Everything Fine", 15, 1, 1, 1, 2, "Server: app\r\n",
                               13, date),
           0, "a head the handler shaped");
    is_mem(out.ptr, out.len,
           "HTTP/1.1 200 Everything Fine\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
           "Content-Length: 2\r\nServer: app\r\n\r\n",
           "the handler's reason and Server, no Server of the engine's");
    out.len = 0;
    http_write_head_own(&out, D, 404, NULL, 0, 1, 1, 1, 0, "Server: app\r\n", 13, date);
    is_mem(out.ptr, out.len,
           "HTTP/1.1 404 Not Found\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
           "Content-Length: 0\r\nServer: app\r\n\r\n",
           "own Server alone: the table's reason");
    out.len = 0;
    http_write_head_own(&out, D, 200, "", 0, 0, 1, 1, 0, NULL, 0, date);
    is_mem(out.ptr, out.len,
           "HTTP/1.1 200 \r\nServer: cyserve\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
           "Content-Length: 0\r\n\r\n",
           "own empty reason alone: the engine's Server");
    size_t rlen;
    const char *teapot = http_reason(418, &rlen);
    is_mem(teapot, rlen, "I'm a teapot", "418's reason");
    out.len = 0;
    is_int(http_write_error(&out, D, 413, "body over 1048576 bytes", 0, date), 47,
           "returns the body's length");
    ok(out.len > 32 && memcmp(out.ptr, "HTTP/1.1 413 Content Too Large\r\n", 32) == 0,
       "error status line");
    ok(memmem(out.ptr, out.len, "Connection: close\r\n", 19) != NULL, "error closes");
    ok(memmem(out.ptr, out.len, "\r\n\r\n413 Content Too Large: body over 1048576 bytes\n", 51) !=
           NULL,
       "error body names the problem");
    size_t full = out.len;
    out.len = 0;
    is_int(http_write_error(&out, D, 413, "body over 1048576 bytes", 1, date), 0, "HEAD: no body");
    ok(out.len > 4 && memcmp(out.ptr + out.len - 4, "\r\n\r\n", 4) == 0 && out.len == full - 51 + 4,
       "error to a HEAD: the same head, no body");
    wbuf_free(&out);
}

/* The server's own fields (--header, --no-server-header, --no-date-header). */
static void test_head_options(void)
{
    struct wbuf out;
    wbuf_init(&out, NULL, 0);
    const char *date = "Sun, 06 Nov 1994 08:49:37 GMT";
    static const char lines[] = "Server: edge\r\nX-Frame-Options: DENY\r\n";
    struct http_head h;
    http_head_init(&h, lines, sizeof(lines) - 1, 14, 0);
    is_int(http_write_head(&out, &h, 200, 1, 1, 2, "A: b\r\n", 6, date), 0, "head with fields");
    is_mem(out.ptr, out.len,
           "HTTP/1.1 200 OK\r\nServer: edge\r\nX-Frame-Options: DENY\r\n"
           "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\nContent-Length: 2\r\nA: b\r\n\r\n",
           "the server's fields after the status line, before Date");
    out.len = 0;
    http_write_head_own(&out, &h, 200, NULL, 0, 1, 1, 1, 0, "Server: app\r\n", 13, date);
    is_mem(out.ptr, out.len,
           "HTTP/1.1 200 OK\r\nX-Frame-Options: DENY\r\n"
           "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\nContent-Length: 0\r\nServer: app\r\n\r\n",
           "the handler's Server replaces the server's, the other fields stay");
    http_head_init(&h, lines + 14, sizeof(lines) - 1 - 14, 0, 1);
    out.len = 0;
    http_write_head(&out, &h, 204, 1, 1, 0, NULL, 0, date);
    is_mem(out.ptr, out.len, "HTTP/1.1 204 No Content\r\nX-Frame-Options: DENY\r\n\r\n",
           "no Server, no Date");
    out.len = 0;
    http_write_head_own(&out, &h, 200, "Fine", 4, 1, 1, 1, 0, "Server: app\r\n", 13, date);
    is_mem(out.ptr, out.len,
           "HTTP/1.1 200 Fine\r\nX-Frame-Options: DENY\r\nContent-Length: 0\r\n"
           "Server: app\r\n\r\n",
           "own Server without a server's: nothing of the fields is cut");
    out.len = 0;
    struct http_head none;
    http_head_init(&none, NULL, 0, 0, 1);
    is_int(http_write_error(&out, &none, 503, "busy", 0, date), 30, "error with no fields");
    is_mem(out.ptr, out.len,
           "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 30\r\nConnection: close\r\n"
           "Content-Type: text/plain; charset=utf-8\r\n\r\n503 Service Unavailable: busy\n",
           "the engine's own errors honour the fields too");
    wbuf_free(&out);
}

static void test_chunked_end(void)
{
    struct wbuf out;
    wbuf_init(&out, NULL, 0);
    is_int(http_write_chunked_end(&out, NULL, 0), 0, "the end without trailers");
    is_mem(out.ptr, out.len, "0\r\n\r\n", "the last chunk and the empty line");
    out.len = 0;
    wbuf_append(&out, "5\r\nhello\r\n", 10);
    static const char t[] = "grpc-status: 0\r\nx-checksum: abc\r\n";
    is_int(http_write_chunked_end(&out, t, sizeof(t) - 1), 0, "the end with trailers");
    is_mem(out.ptr, out.len, "5\r\nhello\r\n0\r\ngrpc-status: 0\r\nx-checksum: abc\r\n\r\n",
           "after what the buffer held: the last chunk, the trailer section, the empty line");
    wbuf_free(&out);
}

int main(void)
{
    test_date_cache();
    test_head();
    test_head_options();
    test_chunked_end();
    return done_testing();
}
