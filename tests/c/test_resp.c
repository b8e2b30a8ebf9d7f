/* test_resp.c: the cyserve_response builder and its request-scoped arena. */
#define _GNU_SOURCE
#include "csrc/wbuf.c"
#include "csrc/resp.c"

#include <fcntl.h>
#include <unistd.h>

#include "tap.h"

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
    is_int(r.own_head, 0, "the engine's head unless the handler shapes it");
    is_int(resp_add_header(&r, "Server", 6, "mine", 4), 0, "the handler's Server is kept");
    is_int(r.own_head, RESP_OWN_SERVER, "and the engine writes none");
    is_int(resp_add_header(&r, "server", 6, "again", 5), -EEXIST, "Server is not a list");
    is_int(resp_set_reason(&r, "Fine\r\nX-A: 1", 13), -EINVAL, "CRLF in a reason refused");
    is_int(resp_set_reason(&r, "Fine\x01", 5), -EINVAL, "control byte in a reason refused");
    is_int(r.own_head, RESP_OWN_SERVER, "a refused reason leaves the engine's");
    is_int(resp_set_reason(&r, "All\tFine \xe9", 10), 0, "HTAB, SP, VCHAR, obs-text");
    is_mem(r.reason, r.reason_len, "All\tFine \xe9", "reason kept");
    is_int(r.own_head, RESP_OWN_SERVER | RESP_OWN_REASON, "reason recorded");
    is_int(resp_add_header(&r, "Connection", 10, "close", 5), 0, "Connection: close accepted");
    is_int(r.close, 1, "close recorded");
    is_int(resp_set_content_type(&r, "text/html", 9), 0, "content type");
    is_int(resp_set_content_type(&r, "text/html", 9), -EEXIST, "second content type refused");
    is_mem(r.headers.ptr, r.headers.len, "X-A: 1\r\nServer: mine\r\nContent-Type: text/html\r\n",
           "header lines");
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
    ok(r.own_head == 0 && r.reason == NULL, "reset restores the engine's head");
    ok(r.stream == NULL && r.stream_length == -1 && r.head_length == -1,
       "reset forgets the stream and the head length");
    resp_free(&r);
}

/* Lent bodies: sent from the lender's memory, and every lease handed back exactly once, whether
 * the body was sent (resp_body_return), or the response was reset or freed first. */
static void test_lent_body(void)
{
    static const char big[] = "lent body bytes";
    struct resp_lease_list back = {NULL};
    struct cyserve_response r;
    resp_init(&r);
    int owner1, owner2, owner3;
    struct resp_lease *l1 = resp_lease_new(&owner1, &back);
    ok(l1 != NULL, "a lease");
    is_int(resp_set_body_lent(&r, big, sizeof(big) - 1, NULL), -EINVAL,
           "a lent body needs a lease");
    is_int(resp_set_body_lent(&r, big, sizeof(big) - 1, l1), 0, "lent");
    size_t n;
    ok(resp_body(&r, &n) == big && n == sizeof(big) - 1, "sent from the lender's memory");
    is_int(resp_write(&r, "x", 1), -EEXIST, "no bytes after a lent body");
    ok(!resp_lease_pending(&back), "kept while the response needs it");
    is_int(resp_set_stream(&r, &owner3, -1), 0, "a lent first piece may start a stream");
    resp_body_return(&r);
    ok(resp_lease_pending(&back), "handed back once sent");
    resp_body(&r, &n);
    is_int((int)n, 0, "and the body is forgotten");
    resp_body_return(&r); /* no-op */
    struct resp_lease *got = resp_lease_take_all(&back);
    ok(got == l1 && got->owner == &owner1 && got->next == NULL, "taken back, once");
    ok(resp_lease_take_all(&back) == NULL, "nothing more");
    resp_lease_free(got);

    /* Reset before sending (a failed request), and free (the coroutine's end) hand it back. */
    resp_reset(&r);
    struct resp_lease *l2 = resp_lease_new(&owner2, &back);
    is_int(resp_set_body_lent(&r, big, 4, l2), 0, "lent again");
    resp_reset(&r);
    struct resp_lease *l3 = resp_lease_new(&owner3, &back);
    is_int(resp_write(&r, "y", 1), 0, "written");
    is_int(resp_set_body_lent(&r, big, 4, l3), -EEXIST, "not over written bytes");
    resp_reset(&r);
    is_int(resp_set_body_lent(&r, big, 4, l3), 0, "lent a third time");
    resp_free(&r);
    got = resp_lease_take_all(&back);
    ok(got == l3 && got->next == l2 && got->next->next == NULL, "reset and free hand back");
    resp_lease_free(got->next);
    resp_lease_free(got);

    /* A file body: the response owns the descriptor until the request core takes it. */
    resp_init(&r);
    int fds[2];
    ok(pipe(fds) == 0, "pipe");
    is_int(resp_set_body_file(&r, -1, 0, 1), -EINVAL, "a file body needs a descriptor");
    is_int(resp_set_body_file(&r, fds[0], 3, 9), 0, "file body");
    is_int(resp_set_body_file(&r, fds[1], 0, 1), -EEXIST, "set once");
    is_int(resp_write(&r, "z", 1), -EEXIST, "no bytes after a file body");
    resp_reset(&r);
    errno = 0;
    ok(fcntl(fds[0], F_GETFD) == -1 && errno == EBADF, "reset closes a file not taken");
    close(fds[1]);

    /* A deferred answer's file body (ASGI pathsend) moves to the request's response with its
     * descriptor: the source no longer closes it, the destination does. */
    struct cyserve_response dst;
    resp_init(&dst);
    ok(pipe(fds) == 0, "pipe");
    is_int(resp_set_status(&r, 203), 0, "status");
    is_int(resp_set_body_file(&r, fds[0], 5, 70), 0, "file body to take");
    is_int(resp_take(&dst, &r), 0, "taken");
    ok(dst.body_fd == fds[0] && dst.body_file_offset == 5 && dst.body_file_len == 70,
       "the file body moved");
    ok(r.body_fd == -1 && dst.status == 203, "the source holds none of it");
    ok(fcntl(fds[0], F_GETFD) != -1, "and did not close it");
    resp_reset(&dst);
    errno = 0;
    ok(fcntl(fds[0], F_GETFD) == -1 && errno == EBADF, "the destination's reset closes it");
    close(fds[1]);
    resp_free(&dst);
    resp_free(&r);
}

static void test_trailers(void)
{
    struct cyserve_response r, d;
    resp_init(&r);
    resp_init(&d);
    is_int(r.trailers.len, 0, "no trailers unless added");
    is_int(resp_add_trailer(&r, "content-length", 14, "1", 1), -EPERM, "a refused field");
    is_int(r.own_head, 0, "marks nothing");
    ok(r.trailers.heap == NULL, "and no storage taken for them");
    is_int(resp_add_trailer(&r, "grpc-status", 11, "0", 1), 0, "a trailer");
    is_int(resp_add_trailer(&r, "X-Checksum", 10, "a\tb \xe9", 5), 0, "HTAB, SP, obs-text");
    is_int(resp_add_trailer(&r, "x name", 6, "1", 1), -EINVAL, "space in a name");
    is_int(resp_add_trailer(&r, ":status", 7, "200", 3), -EINVAL, "a pseudo-header");
    is_int(resp_add_trailer(&r, "", 0, "1", 1), -EINVAL, "an empty name");
    is_int(resp_add_trailer(&r, "x-a", 3, "1\r\nx-b: 2", 10), -EINVAL, "CRLF in a value");
    is_int(resp_add_trailer(&r, "x-a", 3, "1\n", 2), -EINVAL, "LF in a value");
    is_int(resp_add_trailer(&r, "x-a", 3, "a\0b", 3), -EINVAL, "NUL in a value");
    /* Fields a recipient needs before the content, or the connection's own. */
    static const char *const refused[] = {
        "Content-Length", "transfer-encoding", "Trailer",          "host",
        "connection",     "keep-alive",        "proxy-connection", "TE",
        "upgrade",        "content-type",      "content-encoding", "content-range"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        is_int(resp_add_trailer(&r, refused[i], strlen(refused[i]), "x", 1), -EPERM, refused[i]);
    is_mem(r.trailers.ptr, r.trailers.len, "grpc-status: 0\r\nX-Checksum: a\tb \xe9\r\n",
           "the accepted ones, serialised; nothing of the refused");
    is_int(r.headers.len, 0, "trailers are not header lines");
    is_int(r.own_head, RESP_OWN_TRAILERS, "the framer is told (http1_trailed)");
    is_int(resp_take(&d, &r), 0, "taken");
    is_int(d.own_head, RESP_OWN_TRAILERS, "and so is the taker's");
    is_mem(d.trailers.ptr, d.trailers.len, "grpc-status: 0\r\nX-Checksum: a\tb \xe9\r\n",
           "trailers move with the answer");
    is_int(r.trailers.len, 0, "the source is reset");
    resp_reset(&d);
    is_int(d.trailers.len, 0, "a reset forgets them");
    is_int(d.own_head, 0, "and the mark");
    is_int(resp_add_trailer(&d, "a", 1, "", 0), 0, "an empty value");
    is_mem(d.trailers.ptr, d.trailers.len, "a: \r\n", "the storage is reused");
    resp_free(&r);
    resp_free(&d); /* LeakSanitizer checks the heap storage went */
}

/* value_ok reads eight bytes at a word: every byte value, at every place of values one to
 * nineteen bytes long (so in a word, across words, and in the bytes after the last word), is
 * accepted exactly when RFC 9110 5.5 allows it: VCHAR, obs-text, SP and HTAB. */
static void test_value_bytes(void)
{
    char v[19];
    int same = 1;
    for (size_t n = 1; n <= sizeof(v); n++) {
        for (size_t at = 0; at < n; at++) {
            for (int b = 0; b < 256; b++) {
                memset(v, 'a', sizeof(v));
                v[at] = (char)b;
                int want = (b >= 0x20 && b != 0x7f) || b == '\t';
                if (value_ok(v, n) != want) {
                    note("byte 0x%02x at %zu of %zu: %d", b, at, n, value_ok(v, n));
                    same = 0;
                }
            }
        }
    }
    ok(same, "every byte value at every place: accepted as RFC 9110 allows");
    ok(value_ok("text/html;\tcharset=\xe9\x80 x", 21) && !value_ok("application/json\n", 17) &&
           !value_ok("\x1f", 1) && value_ok("", 0),
       "whole values: HTAB and obs-text in words, a late LF, a lone control byte, empty");
}

int main(void)
{
    test_resp();
    test_lent_body();
    test_trailers();
    test_value_bytes();
    return done_testing();
}
