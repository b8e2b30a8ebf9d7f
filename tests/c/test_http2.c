/* test_http2.c: the HTTP/2 module's request side without sockets or workers: a client session
 * of libnghttp2 makes the frames, the server session of http2.c takes them (its callbacks
 * gather each stream's head and body), and what it answers is read back as frames. The
 * preface match, the header lines' conversion, the heads (method, path, query, :authority as
 * Host, cookies joined), the limits (431, 413), the floods (rapid reset, PING), a stream id
 * lower than the last one (PROTOCOL_ERROR) and an idle session set aside and written back.
 * Built under ASan+UBSan by the Makefile. */
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
#include "tap.h"

static struct server srv;
static struct server_worker worker;
static struct conn conn;

static struct h2_session *session(void)
{
    memset(&srv, 0, sizeof(srv));
    server_config_default(&srv.cfg);
    srv.cfg.max_body_bytes = 64;
    srv.cfg.limits.max_header_bytes = 400;
    memset(&worker, 0, sizeof(worker));
    worker.srv = &srv;
    memset(&conn, 0, sizeof(conn));
    conn.home = &worker;
    struct h2_session *h = h2_session_new(&conn);
    if (h)
        conn.proto_data = h;
    return h;
}

static nghttp2_session *client(void)
{
    nghttp2_session_callbacks *cbs;
    nghttp2_session *cl = NULL;
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_client_new(&cl, cbs, NULL);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_submit_settings(cl, NGHTTP2_FLAG_NONE, NULL, 0);
    return cl;
}

/* Everything the client queued, fed to the server. The server's return of the last feed. */
static ssize_t to_server(nghttp2_session *cl, struct h2_session *h)
{
    const uint8_t *d;
    ssize_t n, r = 0;
    while ((n = nghttp2_session_mem_send(cl, &d)) > 0) {
        r = nghttp2_session_mem_recv(h->ng, d, (size_t)n);
        if (r < 0)
            return r;
    }
    return r;
}

static void to_server_raw(struct h2_session *h, const void *p, size_t n)
{
    nghttp2_session_mem_recv(h->ng, p, n);
}

/* The error code of the first GOAWAY among the frames the server queued, or -1. */
static long server_goaway(struct h2_session *h)
{
    struct wbuf out;
    wbuf_init(&out, NULL, 0);
    const uint8_t *d;
    ssize_t n;
    while ((n = nghttp2_session_mem_send(h->ng, &d)) > 0)
        wbuf_append(&out, d, (size_t)n);
    long code = -1;
    const uint8_t *p = (const uint8_t *)out.ptr;
    for (size_t i = 0; i + 9 <= out.len;) {
        size_t len = ((size_t)p[i] << 16) | ((size_t)p[i + 1] << 8) | p[i + 2];
        if (p[i + 3] == NGHTTP2_GOAWAY && len >= 8 && i + 9 + len <= out.len) {
            const uint8_t *e = p + i + 9 + 4;
            code = (long)(((uint32_t)e[0] << 24) | ((uint32_t)e[1] << 16) | ((uint32_t)e[2] << 8) |
                          e[3]);
            break;
        }
        i += 9 + len;
    }
    wbuf_free(&out);
    return code;
}

#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, 0}

static void test_preface(void)
{
    is_int(http2_preface_match(HTTP2_PREFACE, HTTP2_PREFACE_LEN), 1, "the whole preface");
    is_int(http2_preface_match(HTTP2_PREFACE "\0\0", HTTP2_PREFACE_LEN + 2), 1,
           "the preface and frames after it");
    is_int(http2_preface_match("PRI * HTTP/2", 12), 2, "a prefix: too short to tell");
    is_int(http2_preface_match("PRI * HTTP/1.1\r\n", 16), 0, "not the preface");
    is_int(http2_preface_match("POST / HTTP/1.1", 15), 0, "an HTTP/1 request");
}

static void test_lines(void)
{
    static const char lines[] = "Content-Type: text/plain\r\nX-Pad:  two words \r\n"
                                "Connection: close\r\nTransfer-Encoding: chunked\r\n"
                                "Content-Length: 5\r\nSet-Cookie: a=1\r\nbad line\r\n";
    nghttp2_nv nva[8];
    char low[sizeof(lines)];
    size_t n = h2_lines_to_nv(lines, sizeof(lines) - 1, nva, 8, low);
    is_int(n, 3, "connection-specific fields and Content-Length dropped");
    is_mem(nva[0].name, nva[0].namelen, "content-type", "names lower-cased");
    is_mem(nva[0].value, nva[0].valuelen, "text/plain", "value");
    is_mem(nva[1].value, nva[1].valuelen, "two words", "value trimmed");
    is_mem(nva[2].name, nva[2].namelen, "set-cookie", "a later field");
    is_int(h2_count_lines(lines, sizeof(lines) - 1), 8, "lines counted for the array");
}

static void test_heads(void)
{
    struct h2_session *h = session();
    ok(h != NULL, "a session");
    nghttp2_session *cl = client();
    nghttp2_nv get[] = {NV(":method", "GET"),   NV(":path", "/a/b?x=1&y"),
                        NV(":scheme", "https"), NV(":authority", "example.com"),
                        NV("cookie", "a=1"),    NV("accept", "*/*"),
                        NV("cookie", "b=2")};
    int32_t s1 = nghttp2_submit_request(cl, NULL, get, 7, NULL, NULL);
    ok(to_server(cl, h) >= 0, "fed");
    struct h2_stream *st = h->streams;
    ok(st && st->id == s1 && st->ready && !st->fail_status, "a complete request is ready");
    if (st) {
        struct http_request *r = &st->rq.head;
        is_int(r->method_id, HTTP_GET, "method");
        is_mem(r->target, r->target_len, "/a/b?x=1&y", "target");
        is_mem(r->path, r->path_len, "/a/b", "path");
        is_mem(r->query, r->query_len, "x=1&y", "query");
        is_mem(r->host, r->host_len, "example.com", "host from :authority");
        const char *v;
        size_t vlen;
        ok(request_header_value(&st->rq, "cookie", 6, &v, &vlen), "one cookie field");
        is_mem(v, vlen, "a=1; b=2", "cookies joined with '; '");
        ok(request_header_value(&st->rq, "Host", 4, &v, &vlen), "a Host field");
        is_mem(v, vlen, "example.com", "Host is :authority");
        ok(request_header_value(&st->rq, "accept", 6, &v, &vlen), "other fields kept");
        is_int(r->num_headers, 3, "accept, cookie, host");
        ok(st->rq.http2, "marked HTTP/2");
    }
    h2_session_free(h, 0);
    nghttp2_session_del(cl);
}

static ssize_t body_source(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
                           uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    const char *text = src->ptr;
    size_t n = strlen(text);
    memcpy(buf, text, n);
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static void test_limits(void)
{
    struct h2_session *h = session();
    nghttp2_session *cl = client();
    /* A body within max_body_bytes (64 here). */
    nghttp2_nv post[] = {NV(":method", "POST"), NV(":path", "/p"), NV(":scheme", "http"),
                         NV(":authority", "a")};
    nghttp2_data_provider small = {.source.ptr = "hello", .read_callback = body_source};
    int32_t s1 = nghttp2_submit_request(cl, NULL, post, 4, &small, NULL);
    /* An announced body past it: refused at its head. */
    nghttp2_nv big[] = {NV(":method", "POST"), NV(":path", "/p"), NV(":scheme", "http"),
                        NV(":authority", "a"), NV("content-length", "100")};
    int32_t s2 = nghttp2_submit_headers(cl, NGHTTP2_FLAG_NONE, -1, NULL, big, 5, NULL);
    /* Fields past max_header_bytes (400 here). */
    static char longv[500];
    memset(longv, 'v', sizeof(longv) - 1);
    nghttp2_nv fat[] = {NV(":method", "GET"),
                        NV(":path", "/"),
                        NV(":scheme", "http"),
                        NV(":authority", "a"),
                        {(uint8_t *)"x-long", (uint8_t *)longv, 6, sizeof(longv) - 1, 0}};
    int32_t s3 = nghttp2_submit_request(cl, NULL, fat, 5, NULL, NULL);
    /* An unannounced body past it. */
    nghttp2_data_provider large = {
        .source.ptr = "0123456789012345678901234567890123456789012345678901234567890123456789",
        .read_callback = body_source};
    int32_t s4 = nghttp2_submit_request(cl, NULL, post, 4, &large, NULL);
    ok(to_server(cl, h) >= 0, "fed");
    int seen = 0;
    for (struct h2_stream *st = h->streams; st; st = st->next) {
        if (st->id == s1) {
            ok(st->ready && !st->fail_status, "a small body: ready");
            is_mem(st->body.ptr, st->body.len, "hello", "its bytes");
            seen++;
        } else if (st->id == s2) {
            ok(st->ready && st->fail_status == 413, "an announced large body: 413 at once");
            seen++;
        } else if (st->id == s3) {
            ok(st->ready && st->fail_status == 431, "fields too large: 431");
            seen++;
        } else if (st->id == s4) {
            ok(st->ready && st->fail_status == 413 && st->body.len == 0,
               "a large body: 413, nothing kept");
            seen++;
        }
    }
    is_int(seen, 4, "four streams");
    h2_session_free(h, 0);
    nghttp2_session_del(cl);
}

static void test_rapid_reset(void)
{
    struct h2_session *h = session();
    nghttp2_session *cl = client();
    nghttp2_nv get[] = {NV(":method", "GET"), NV(":path", "/"), NV(":scheme", "http"),
                        NV(":authority", "a")};
    for (int i = 0; i < HTTP2_RESETS_PER_S + 20; i++) {
        /* The HEADERS leave first: the client library drops a request reset before it. */
        int32_t id = nghttp2_submit_headers(cl, NGHTTP2_FLAG_NONE, -1, NULL, get, 4, NULL);
        to_server(cl, h);
        nghttp2_submit_rst_stream(cl, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
        to_server(cl, h);
    }
    to_server(cl, h);
    ok(h->fatal, "resets past the bound end the connection");
    is_int(server_goaway(h), NGHTTP2_ENHANCE_YOUR_CALM, "GOAWAY ENHANCE_YOUR_CALM");
    h2_session_free(h, 0);
    nghttp2_session_del(cl);

    h = session();
    cl = client();
    for (int i = 0; i < HTTP2_RESETS_PER_S - 10; i++) {
        /* The HEADERS leave first: the client library drops a request reset before it. */
        int32_t id = nghttp2_submit_headers(cl, NGHTTP2_FLAG_NONE, -1, NULL, get, 4, NULL);
        to_server(cl, h);
        nghttp2_submit_rst_stream(cl, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
        to_server(cl, h);
    }
    to_server(cl, h);
    ok(!h->fatal, "resets within the bound are served");
    h2_sweep(h);
    is_int(h->nstreams, 0, "the reset streams are freed");
    h2_session_free(h, 0);
    nghttp2_session_del(cl);
}

static void test_ping_flood(void)
{
    struct h2_session *h = session();
    nghttp2_session *cl = client();
    for (int i = 0; i < HTTP2_CONTROL_PER_S + 20; i++)
        nghttp2_submit_ping(cl, NGHTTP2_FLAG_NONE, NULL);
    to_server(cl, h);
    ok(h->fatal, "PINGs past the bound end the connection");
    is_int(server_goaway(h), NGHTTP2_ENHANCE_YOUR_CALM, "GOAWAY ENHANCE_YOUR_CALM");
    h2_session_free(h, 0);
    nghttp2_session_del(cl);
}

static void test_lower_stream_id(void)
{
    struct h2_session *h = session();
    nghttp2_session *cl = client();
    to_server(cl, h); /* the preface and SETTINGS */
    /* HEADERS (END_STREAM | END_HEADERS) with :method GET, :path /, :scheme http from HPACK's
     * static table, on stream 5, then on stream 3. */
    static const uint8_t frames[] = {0, 0, 3, 1, 5, 0, 0, 0, 5, 0x82, 0x84, 0x86,
                                     0, 0, 3, 1, 5, 0, 0, 0, 3, 0x82, 0x84, 0x86};
    to_server_raw(h, frames, 12);
    ok(h->streams && h->streams->id == 5, "stream 5 opened");
    is_int(server_goaway(h), -1, "no GOAWAY yet");
    to_server_raw(h, frames + 12, 12);
    is_int(server_goaway(h), NGHTTP2_PROTOCOL_ERROR, "a lower new stream id: PROTOCOL_ERROR");
    h2_session_free(h, 0);
    nghttp2_session_del(cl);

    /* Skipped ids are closed unopened; an id opened before is left to the library. */
    h = session();
    cl = client();
    to_server(cl, h);
    static const uint8_t seq[] = {0, 0, 3, 1, 5, 0, 0, 0, 1, 0x82, 0x84, 0x86,
                                  0, 0, 3, 1, 5, 0, 0, 0, 9, 0x82, 0x84, 0x86};
    to_server_raw(h, seq, sizeof(seq));
    is_int(h->max_id, 9, "the highest id");
    is_int(server_goaway(h), -1, "increasing ids with a gap are fine");
    h2_session_free(h, 0);
    nghttp2_session_del(cl);
}

/* Which of the pack's pages are resident (mincore), as a bit mask. */
static unsigned resident(const char *pack)
{
    unsigned char vec[H2_PACK_LEN / 4096];
    if (mincore((void *)pack, H2_PACK_LEN, vec))
        return ~0u;
    unsigned m = 0;
    for (size_t i = 0; i < sizeof(vec); i++)
        m |= (unsigned)(vec[i] & 1) << i;
    return m;
}

/* An idle session is set aside (h2_park: its pack's pages given back, c->proto_data the tagged
 * copy) and written back exactly (h2_of), twice: once against the template its own first
 * setting aside made, once after more traffic, when it differs from the template; and it
 * serves on after each. */
static void test_park(void)
{
    struct h2_session *h = session();
    ok(h && h->pack == (char *)h, "the session heads its pack");
    if (!h || h->pack != (char *)h)
        return;
    nghttp2_session *cl = client();
    nghttp2_nv get[] = {NV(":method", "GET"), NV(":path", "/p"), NV(":scheme", "http"),
                        NV(":authority", "a")};
    char *pack = h->pack;
    ok(h->pack_scratch < H2_PACK_LEN && h->npack > 2, "the library's blocks are in the pack");
    char *before = malloc(H2_PACK_LEN);
    for (int round = 0; round < 2; round++) {
        /* A stream opened and reset by the client: the session is idle again after it. */
        int32_t id = nghttp2_submit_request(cl, NULL, get, 4, NULL, NULL);
        ok(to_server(cl, h) >= 0 && h->streams && h->streams->id == id && h->streams->ready,
           "a request taken");
        nghttp2_submit_rst_stream(cl, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
        ok(to_server(cl, h) >= 0, "its reset taken");
        h2_sweep(h);
        is_int(h->nstreams, 0, "no stream left");
        server_goaway(h); /* what the server queued, written */
        memcpy(before, pack, H2_PACK_LEN);
        h2_mem_idle(h);
        h2_park(h);
        ok((uintptr_t)conn.proto_data & 1, "set aside: the connection holds the copy");
        printf("# the copy: %zu bytes\n",
               malloc_usable_size((void *)((uintptr_t)conn.proto_data & ~(uintptr_t)1)));
        is_int(resident(pack), 0, "every page of the pack given back");
        struct h2_session *back = h2_of(&conn);
        ok(back == h && conn.proto_data == h, "written back where it was");
        /* Every byte but the frame buffer's, which holds nothing between frames. */
        size_t fb = h->pack_scratch, same = 1;
        for (size_t i = 0; i < H2_PACK_LEN; i++)
            if ((i < fb || i >= fb + H2_FRAMEBUF_LEN) && before[i] != pack[i])
                same = 0;
        ok(same, "written back exactly");
        ok(nghttp2_session_want_read(h->ng), "the session is alive");
    }
    /* It serves on: a request after being set aside is taken. */
    int32_t id = nghttp2_submit_request(cl, NULL, get, 4, NULL, NULL);
    ok(to_server(cl, h) >= 0 && h->streams && h->streams->id == id && h->streams->ready,
       "a request after it taken");
    free(before);
    h2_session_free(h, 0);
    nghttp2_session_del(cl);
}

int main(void)
{
    test_preface();
    test_lines();
    test_heads();
    test_limits();
    test_rapid_reset();
    test_ping_flood();
    test_lower_stream_id();
    test_park();
    return done_testing();
}
