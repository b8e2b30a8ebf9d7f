/* test_body.c: request bodies streamed to a handler (csrc/body.c), read over a socket pair:
 * Content-Length and chunked bodies in small and large reads, lines, a body never read past its
 * end, the next request's bytes kept, the size limit, malformed framing, a client that leaves,
 * one that sends nothing, a stop, and draining what a handler left. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <unistd.h>

#include "csrc/body.c"
#include "csrc/http_parse.c"

#include "tap.h"

struct fixture {
    struct server s;
    struct conn c;
    int peer; /* the client's end */
};

static void setup(struct fixture *f)
{
    memset(f, 0, sizeof(*f));
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("socketpair");
        exit(1);
    }
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    f->c.io.fd = sv[0];
    f->peer = sv[1];
    f->s.cfg.max_body_bytes = 1 << 20;
    f->s.cfg.body_timeout_ns = 200ull * 1000 * 1000;
    f->s.cfg.limits.max_header_bytes = 8192;
}

static void teardown(struct fixture *f, struct body_reader *br)
{
    body_end(br);
    body_end(br); /* idempotent */
    close(f->c.io.fd);
    if (f->peer >= 0)
        close(f->peer);
}

static void say(struct fixture *f, const void *p, size_t n)
{
    if (write(f->peer, p, n) != (ssize_t)n) {
        perror("write");
        exit(1);
    }
}

/* The rest of the body, read in reads of step bytes (line: by lines), into out. */
static ssize_t read_all(struct body_reader *br, char *out, size_t cap, size_t step, int line)
{
    size_t got = 0;
    for (;;) {
        size_t n = step < cap - got ? step : cap - got;
        ssize_t r = body_read(br, out + got, n, line);
        if (r <= 0)
            return r < 0 ? r : (ssize_t)got;
        got += (size_t)r;
    }
}

static void test_length(size_t step)
{
    struct fixture f;
    setup(&f);
    /* Not a test of the timeout (test_timeout_and_stop is): a forked sender on a loaded machine
     * may not run for longer than the fixture's 200 ms, which failed this test with -ETIMEDOUT. */
    f.s.cfg.body_timeout_ns = 10ull * 1000 * 1000 * 1000;
    static char body[200000], out[200000];
    for (size_t i = 0; i < sizeof(body); i++)
        body[i] = (char)(i * 7 + i / 251);
    struct body_reader br;
    is_int(body_start(&br, &f.c, &f.s, body, 1000, sizeof(body), NULL), 0, "start");
    /* The client sends the rest and the next request; a body is never read past its end. */
    char *all = malloc(sizeof(body) + 5);
    memcpy(all, body, sizeof(body));
    memcpy(all + sizeof(body), "GET /", 5);
    int pid = fork();
    if (pid == 0) {
        say(&f, all + 1000, sizeof(body) + 5 - 1000);
        _exit(0);
    }
    ssize_t n = read_all(&br, out, sizeof(out), step, 0);
    ok(n == (ssize_t)sizeof(body), "Content-Length body read whole, step %zu (got %zd)", step, n);
    ok(memcmp(out, body, sizeof(body)) == 0, "same bytes");
    is_int(body_read(&br, out, 10, 0), 0, "end stays the end");
    char next[8];
    is_int(recv(f.c.io.fd, next, sizeof(next), 0), 5, "the next request left in the socket");
    const char *tail;
    is_int((int)body_tail(&br, &tail), 0, "no tail for a Content-Length body");
    waitpid(pid, NULL, 0);
    free(all);
    teardown(&f, &br);
}

static void test_chunked_tail_and_lines(void)
{
    struct fixture f;
    setup(&f);
    struct body_reader br;
    struct http_chunked st;
    memset(&st, 0, sizeof(st));
    is_int(body_start(&br, &f.c, &f.s, "one\n", 4, -1, &st), 0, "start chunked with a prefix");
    const char wire[] = "6\r\ntwo\nth\r\n5\r\nree\nf\r\n4\r\nour\n\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
    say(&f, wire, sizeof(wire) - 1);
    char line[64];
    const char *want[] = {"one\n", "two\n", "three\n", "four\n"};
    for (int i = 0; i < 4; i++) {
        ssize_t got = 0, r;
        while ((r = body_read(&br, line + got, sizeof(line) - (size_t)got, 1)) > 0) {
            got += r;
            if (line[got - 1] == '\n')
                break;
        }
        ok((size_t)got == strlen(want[i]) && memcmp(line, want[i], (size_t)got) == 0, "line %d", i);
    }
    is_int(body_read(&br, line, sizeof(line), 1), 0, "chunked end");
    const char *tail;
    size_t n = body_tail(&br, &tail);
    is_mem(tail, n, "GET / HTTP/1.1\r\n", "the next request's bytes are kept");
    teardown(&f, &br);
}

static void test_limit(void)
{
    struct fixture f;
    setup(&f);
    f.s.cfg.max_body_bytes = 100;
    struct body_reader br;
    struct http_chunked st;
    memset(&st, 0, sizeof(st));
    body_start(&br, &f.c, &f.s, "", 0, -1, &st);
    char big[200];
    memset(big, 'x', sizeof(big));
    say(&f, "32\r\n", 4);
    say(&f, big, 50);
    say(&f, "\r\n32\r\n", 6);
    say(&f, big, 50);
    say(&f, "\r\n1\r\nx\r\n", 8);
    char out[300];
    ssize_t r = read_all(&br, out, sizeof(out), 300, 0);
    is_int(r, -EFBIG, "over max_body_bytes");
    const char *reason;
    is_int(body_error_status(&br, &reason), 413, "413");
    is_int(body_read(&br, out, 10, 0), -EFBIG, "sticky");
    teardown(&f, &br);

    setup(&f);
    f.s.cfg.max_body_bytes = 100;
    memset(&st, 0, sizeof(st));
    body_start(&br, &f.c, &f.s, "", 0, -1, &st);
    say(&f, "1000\r\n", 6);
    is_int(body_read(&br, out, 10, 0), -EFBIG, "a chunk announced over the limit");
    teardown(&f, &br);
}

static void test_malformed_and_gone(void)
{
    struct fixture f;
    setup(&f);
    struct body_reader br;
    struct http_chunked st;
    memset(&st, 0, sizeof(st));
    body_start(&br, &f.c, &f.s, "", 0, -1, &st);
    say(&f, "zz\r\n", 4);
    char out[64];
    is_int(body_read(&br, out, sizeof(out), 0), -EBADMSG, "bad chunk size");
    const char *reason;
    is_int(body_error_status(&br, &reason), 400, "400");
    teardown(&f, &br);

    setup(&f);
    body_start(&br, &f.c, &f.s, "ab", 2, 10, NULL);
    say(&f, "cd", 2);
    close(f.peer);
    f.peer = -1;
    is_int(body_read(&br, out, sizeof(out), 0), 2, "what came first");
    is_int(body_read(&br, out, sizeof(out), 0), 2, "what came next");
    is_int(body_read(&br, out, sizeof(out), 0), -ECONNRESET, "the client left");
    is_int(body_error_status(&br, &reason), 0, "nobody to answer");
    teardown(&f, &br);
}

static void test_timeout_and_stop(void)
{
    struct fixture f;
    setup(&f);
    struct body_reader br;
    body_start(&br, &f.c, &f.s, "", 0, 10, NULL);
    char out[16];
    uint64_t t0 = clock_mono_ns();
    is_int(body_read(&br, out, sizeof(out), 0), -ETIMEDOUT, "nothing sent: body_timeout");
    ok(clock_mono_ns() - t0 >= 190ull * 1000 * 1000, "after body_timeout");
    const char *reason;
    is_int(body_error_status(&br, &reason), 408, "408");
    teardown(&f, &br);

    setup(&f);
    f.s.cfg.body_timeout_ns = 10ull * 1000 * 1000 * 1000;
    atomic_store(&f.s.stopping, 1);
    atomic_store(&f.s.stop_deadline, clock_mono_ns());
    body_start(&br, &f.c, &f.s, "", 0, 10, NULL);
    is_int(body_read(&br, out, sizeof(out), 0), -ECANCELED, "a stop past its grace ends it");
    teardown(&f, &br);
}

static void test_drain(void)
{
    struct fixture f;
    setup(&f);
    struct body_reader br;
    body_start(&br, &f.c, &f.s, "0123456789", 10, 30, NULL);
    char out[4];
    is_int(body_read(&br, out, 4, 0), 4, "the handler reads a little");
    uint64_t budget = 100;
    is_int(body_drain(&br, &budget), -EAGAIN, "the rest must be waited for");
    is_int((int)budget, 94, "what was dropped counts");
    say(&f, "abcdefghijklmnopqrst", 20);
    is_int(body_drain(&br, &budget), 0, "drained to the end");
    is_int((int)budget, 74, "all of it counted");
    teardown(&f, &br);

    setup(&f);
    body_start(&br, &f.c, &f.s, "0123456789", 10, 3000, NULL);
    budget = 5;
    is_int(body_drain(&br, &budget), -E2BIG, "over the drain bound");
    teardown(&f, &br);
}

static void test_slots(void)
{
    struct server s;
    memset(&s, 0, sizeof(s));
    is_int(body_slot_take(&s), 0, "relief off: no body streams");
    s.cfg.blocking_threads = 16;
    int n = 0;
    while (body_slot_take(&s))
        n++;
    is_int(n, 8, "half of blocking_threads stream at once");
    body_slot_give(&s);
    is_int(body_slot_take(&s), 1, "a slot given back is taken again");
    /* A reader holds its slot until body_end. */
    struct fixture f;
    setup(&f);
    f.s.cfg.blocking_threads = 1;
    struct body_reader br;
    is_int(body_slot_take(&f.s), 1, "one slot for one blocking thread");
    body_start(&br, &f.c, &f.s, "", 0, 5, NULL);
    br.slot = 1;
    is_int(body_slot_take(&f.s), 0, "held by the reader");
    teardown(&f, &br);
    is_int(body_slot_take(&f.s), 1, "given back by body_end");
}

int main(void)
{
    test_slots();
    test_length(1);
    test_length(100);
    test_length(65536);
    test_length(1 << 20);
    test_chunked_tail_and_lines();
    test_limit();
    test_malformed_and_gone();
    test_timeout_and_stop();
    test_drain();
    return done_testing();
}
