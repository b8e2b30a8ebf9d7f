/* fuzz_http2.c: libFuzzer target for the HTTP/2 module's use of libnghttp2 (csrc/http2.c): the
 * input is what a client sends after the connection preface, fed to a server session in two
 * pieces (split where its first byte says), as the connection's reads would feed it. Every
 * stream whose request the callbacks completed is answered as the request core would answer it
 * (a short body with header lines, through h2_submit and the data source), everything the
 * session wants to write is drained, closed streams are freed; a session left with no stream
 * open is set aside as an idle connection's is and written back (after the first piece) or
 * closed while set aside (after the second); then the session is freed. The sanitizers and the
 * invariants below are the checks.
 *
 * Built with clang by fuzz/Makefile (`make run-http2`), and with gcc as a replay binary
 * (-DFUZZ_REPLAY) that tests/unit/test_fuzz_replay.py runs over corpus-http2/:
 *   ./build/replay-http2 FILE_OR_DIR... */
#define _GNU_SOURCE
#include "csrc/coro.c"
#include "csrc/sched.c"
#include "csrc/http_parse.c"
#include "csrc/wbuf.c"
#include "csrc/resp.c"
#include "csrc/http1_write.c"
#include "csrc/router.c"
#include "csrc/files.c"
#include "csrc/http_date.c"
#include "csrc/conn.c"
#include "csrc/listen.c"
#include "csrc/server.c"
#include "csrc/request.c"
#include "csrc/handler_static.c"
#include "csrc/handler_files.c"
#include "csrc/stream.c"
#include "csrc/body.c"
#include "csrc/handoff.c"
#include "csrc/access_log.c"
#include "csrc/http1.c"
#include "csrc/http1_inline.c"
#include "csrc/http2.c"
#include "csrc/proxy.c"
#include "csrc/ws.c"
#include "csrc/ws_conn.c"
#include "csrc/ws_nogil.c"
#include "csrc/ws_zlend.c"
#include "csrc/proxyproto.c"
#include "csrc/metrics.c"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "invariant broken: %s\n", what);
        abort();
    }
}

static void drain(struct h2_session *h)
{
    const uint8_t *d;
    for (int i = 0; i < 10000 && nghttp2_session_mem_send(h->ng, &d) > 0; i++)
        ;
}

/* The session is idle (no stream open, everything written): set aside as the connection's idle
 * timer sets it aside (h2_park), and, when wake, written back as its next readiness does (h2_of):
 * every byte of its pack but the frame buffer's must come back. */
static void park(struct h2_session *h, int wake)
{
    static char before[H2_PACK_LEN];
    struct conn *c = h->c;
    char *pack = h->pack;
    size_t fb = h->pack_scratch;
    memcpy(before, pack, H2_PACK_LEN);
    h2_mem_idle(h);
    h2_park(h);
    check((uintptr_t)c->proto_data & 1, "set aside");
    if (!wake)
        return;
    check(h2_of(c) == h, "written back where it was");
    for (size_t i = 0; i < H2_PACK_LEN; i++)
        check((i >= fb && i < fb + H2_FRAMEBUF_LEN) || before[i] == pack[i],
              "written back exactly");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct server srv;
    static struct server_worker worker;
    static struct conn conn;
    memset(&srv, 0, sizeof(srv));
    server_config_default(&srv.cfg);
    srv.cfg.max_body_bytes = 4096;
    srv.cfg.limits.max_header_bytes = 1024;
    srv.cfg.limits.max_headers = 16;
    srv.cfg.http2_max_streams = 8;
    memset(&worker, 0, sizeof(worker));
    worker.srv = &srv;
    memset(&conn, 0, sizeof(conn));
    conn.home = &worker;
    struct h2_session *h = h2_session_new(&conn);
    if (!h)
        return 0;
    conn.proto_data = h;
    nghttp2_session_mem_recv(h->ng, (const uint8_t *)HTTP2_PREFACE, HTTP2_PREFACE_LEN);
    size_t cut = size ? data[0] % (size + 1) : 0;
    const uint8_t *pieces[2] = {data, data + cut};
    size_t lens[2] = {cut, size - cut};
    for (int p = 0; p < 2; p++) {
        if (nghttp2_session_mem_recv(h->ng, pieces[p], lens[p]) < 0)
            break;
        for (struct h2_stream *st = h->streams; st; st = st->next) {
            check(st->h == h, "stream of its session");
            if (!st->ready || st->answered || st->closed || h->fatal)
                continue;
            struct http_request *r = &st->rq.head;
            check(r->path_len <= r->target_len, "path within target");
            check(st->body.len <= srv.cfg.max_body_bytes, "body within its limit");
            check(st->fail_status || st->nhdrs <= srv.cfg.limits.max_headers + 2,
                  "fields within their limit (cookie and host added)");
            for (unsigned i = 0; i < st->nhdrs; i++)
                check(st->hdrs[i].name >= st->hstore.ptr &&
                          st->hdrs[i].value + st->hdrs[i].value_len <=
                              st->hstore.ptr + st->hstore.len,
                      "field views inside the stream's storage");
            request_answer_simple(&st->rq.answer, st->rq.answer_lines, sizeof(st->rq.answer_lines),
                                  st->fail_status ? 431 : 200, "fuzzed\n",
                                  "X-Extra: 1\r\nConnection: close\r\n");
            h2_submit(h, st);
        }
        drain(h);
        h2_sweep(h);
        if (!h->nstreams && h->pack && !nghttp2_session_want_write(h->ng))
            park(h, p == 0);
    }
    /* Set aside after the last piece, the session is closed so (written back, then freed). */
    if ((uintptr_t)conn.proto_data & 1)
        http2_close(&conn);
    else
        h2_session_free(h, 0);
    return 0;
}

#ifdef FUZZ_REPLAY
#include <dirent.h>
#include <sys/stat.h>

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    /* An exact-size copy, so that ASan sees reads past the input. */
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, buf, n);
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
    return 0;
}

int main(int argc, char **argv)
{
    int count = 0, errors = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            errors++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            errors += replay_file(argv[i]);
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
            errors += replay_file(path);
            count++;
        }
        if (d)
            closedir(d);
    }
    printf("replayed %d inputs, %d errors\n", count, errors);
    return errors ? 1 : 0;
}
#endif
