/* test_http_write.c: response serialisation, the Date cache and the response builder. */
#define _GNU_SOURCE
#include "csrc/http_date.c"
#include "csrc/http_write.c"

#include "tap.h"

static void test_date_cache(void)
{
    const char *a = http_date_cached(784111777);
    const char *b = http_date_cached(784111777);
    ok(a == b, "cache returns the same storage");
    is_mem(a, HTTP_DATE_LEN, "Sun, 06 Nov 1994 08:49:37 GMT", "cache formats the second");
    is_mem(http_date_cached(784111778), HTTP_DATE_LEN, "Sun, 06 Nov 1994 08:49:38 GMT",
           "cache refreshes when the second changes");
}

static void test_head(void)
{
    char st[64];
    struct wbuf out;
    wbuf_init(&out, st, sizeof(st)); /* small: forces growth to the heap */
    const char *date = "Sun, 06 Nov 1994 08:49:37 GMT";
    is_int(http_write_head(&out, 200, 1, 1, 13, "Content-Type: text/plain\r\n", 26, date), 0,
           "head 200");
    is_mem(out.ptr, out.len,
           "HTTP/1.1 200 OK\r\nServer: cyserve\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
           "Content-Length: 13\r\nContent-Type: text/plain\r\n\r\n",
           "200 keep-alive head");
    out.len = 0;
    http_write_head(&out, 204, 0, 1, 0, NULL, 0, date);
    is_mem(out.ptr, out.len,
           "HTTP/1.1 204 No Content\r\nServer: cyserve\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
           "Connection: keep-alive\r\n\r\n",
           "204 has no Content-Length; 1.0 keep-alive is echoed");
    out.len = 0;
    http_write_head(&out, 200, 1, 1, HTTP_LENGTH_CHUNKED, NULL, 0, date);
    is_mem(out.ptr, out.len,
           "HTTP/1.1 200 OK\r\nServer: cyserve\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
           "Transfer-Encoding: chunked\r\n\r\n",
           "a streamed body: chunked, no Content-Length");
    out.len = 0;
    http_write_head(&out, 299, 0, 0, HTTP_LENGTH_UNTIL_CLOSE, NULL, 0, date);
    is_mem(out.ptr, out.len,
           "HTTP/1.1 299 \r\nServer: cyserve\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
           "Connection: close\r\n\r\n",
           "until the close: no length; an unregistered code gets an empty reason (RFC 9112 4)");
    size_t rlen;
    const char *teapot = http_reason(418, &rlen);
    is_mem(teapot, rlen, "I'm a teapot", "418's reason");
    out.len = 0;
    is_int(http_write_error(&out, 413, "body over 1048576 bytes", 0, date), 47,
           "returns the body's length");
    ok(out.len > 32 && memcmp(out.ptr, "HTTP/1.1 413 Content Too Large\r\n", 32) == 0, "error status line");
    ok(memmem(out.ptr, out.len, "Connection: close\r\n", 19) != NULL, "error closes");
    ok(memmem(out.ptr, out.len, "\r\n\r\n413 Content Too Large: body over 1048576 bytes\n", 51) != NULL,
       "error body names the problem");
    size_t full = out.len;
    out.len = 0;
    is_int(http_write_error(&out, 413, "body over 1048576 bytes", 1, date), 0, "HEAD: no body");
    ok(out.len > 4 && memcmp(out.ptr + out.len - 4, "\r\n\r\n", 4) == 0 &&
           out.len == full - 51 + 4,
       "error to a HEAD: the same head, no body");
    wbuf_free(&out);
}

static void test_resp(void)
{
    struct cyserve_response r;
    resp_init(&r);
    is_int(r.status, 200, "default status");
    is_int(resp_set_status(&r, 99), -EINVAL, "status below 100 rejected");
    /* The handler's status is the final one: a 1xx would leave the client waiting. */
    is_int(resp_set_status(&r, 100), -EINVAL, "1xx is not a final status");
    is_int(resp_set_status(&r, 101), -EINVAL, "101 refused");
    is_int(resp_set_status(&r, 600), -EINVAL, "600 refused");
    is_int(resp_set_status(&r, 599), 0, "599");
    is_int(resp_set_status(&r, 201), 0, "status 201");
    is_int(resp_add_header(&r, "X-A", 3, "1", 1), 0, "header added");
    is_int(resp_add_header(&r, "X A", 3, "1", 1), -EINVAL, "space in name rejected");
    is_int(resp_add_header(&r, "X-B", 3, "a\r\nb", 4), -EINVAL, "CRLF in value rejected");
    is_int(resp_add_header(&r, "X-B", 3, "a\x01b", 3), -EINVAL, "control byte in value rejected");
    is_int(resp_add_header(&r, "X-B", 3, "a\x7f", 2), -EINVAL, "DEL in value rejected");
    is_int(resp_add_header(&r, "content-length", 14, "5", 1), -EPERM, "Content-Length is ours");
    is_int(resp_add_header(&r, "Server", 6, "mine", 4), -EPERM, "Server is ours: not two of them");
    is_int(resp_add_header(&r, "Connection", 10, "close", 5), 0, "Connection: close accepted");
    is_int(r.close, 1, "close recorded");
    is_int(resp_set_content_type(&r, "text/html", 9), 0, "content type");
    is_int(resp_set_content_type(&r, "text/html", 9), -EEXIST, "second content type refused");
    is_mem(r.headers.ptr, r.headers.len, "X-A: 1\r\nContent-Type: text/html\r\n", "header lines");
    char big[3000];
    memset(big, 'x', sizeof(big));
    is_int(resp_write(&r, big, sizeof(big)), 0, "body grows past inline storage");
    is_int(resp_write(&r, "yz", 2), 0, "append");
    is_int(r.body.len, 3002, "body length");
    ok(r.body.heap != NULL && r.body.ptr[3001] == 'z', "body on heap, content kept");
    void *m = resp_arena_alloc(&r.arena, 100);
    ok(m != NULL && ((uintptr_t)m & 15) == 0, "arena memory is 16-byte aligned");
    is_int(resp_set_head_length(&r, -1), -EINVAL, "head length: -1 is not a length");
    is_int(resp_set_head_length(&r, RESP_LENGTH_UNKNOWN), 0, "head length unknown");
    is_int(resp_set_head_length(&r, 1234), 0, "head length");
    is_int(resp_set_stream(&r, NULL, -1), -EINVAL, "a stream needs its state");
    is_int(resp_set_stream(&r, &r, -2), -EINVAL, "a stream's length is -1 or a length");
    is_int(resp_set_stream(&r, &r, 99), 0, "stream with a length");
    ok(r.stream == &r && r.stream_length == 99, "stream recorded");
    resp_reset(&r);
    is_int(r.body.len, 0, "reset empties the body");
    is_int(r.status, 200, "reset restores 200");
    ok(r.stream == NULL && r.stream_length == -1 && r.head_length == -1,
       "reset forgets the stream and the head length");
    resp_free(&r);
}

int main(void)
{
    test_date_cache();
    test_head();
    test_resp();
    return done_testing();
}
