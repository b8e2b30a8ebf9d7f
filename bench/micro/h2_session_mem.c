/* h2_session_mem.c: what libnghttp2 keeps for one idle server session, byte by byte.
 *
 * An idle HTTP/2 connection in cyserve holds its nghttp2 session for its life (csrc/http2.c,
 * "Idle"). This program makes a server session with the options csrc/http2.c gives it, drives
 * it with a client session in memory through what bench/http/idle_memory.py --h2-tls does on
 * the wire (preface, SETTINGS both ways, one GET answered with cyserve's answer fields and a
 * 13-byte body), and then counts what the server session's nghttp2_mem still holds: live
 * blocks, their bytes, and what glibc's malloc gives them (malloc_usable_size plus its 8-byte
 * header), by size. Each variant is a set of options to compare:
 *
 *   gcc -O2 bench/micro/h2_session_mem.c -lnghttp2 -o /tmp/h2mem && /tmp/h2mem
 *
 * The client's GET is sent twice over: once as idle_memory.py sends it (literals without
 * indexing, so the server's decoder table stays empty), once as a browser or curl does
 * (fields indexed, a user agent and an accept line), which fills the decoder's table. */
#include <malloc.h>
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a counting nghttp2_mem ---- */

/* The live blocks of 1,024 bytes or more, to see which are all zeros while idle. */
#define BIGS 16

struct count {
    void *big[BIGS];
    long blocks;
    long bytes;    /* what the library asked for */
    long heap;     /* what glibc gives those blocks: usable size + its 8-byte chunk header */
    long hist[16]; /* live blocks by size class: < 32, < 64, ..., < 2^20 */
};

static size_t *cnt_head(void *p)
{
    return (size_t *)((char *)p - 16);
}

static void cnt_add(struct count *k, size_t *hdr, int sign)
{
    size_t size = hdr[0];
    k->blocks += sign;
    k->bytes += sign * (long)size;
    k->heap += sign * (long)(malloc_usable_size(hdr) - 16 + 8 + 16);
    int c = 0;
    while (c < 15 && (size_t)32 << c <= size)
        c++;
    k->hist[c] += sign;
}

static void *cnt_malloc(size_t size, void *ud)
{
    size_t *p = malloc(size + 16);
    if (!p)
        return NULL;
    p[0] = size;
    cnt_add(ud, p, 1);
    struct count *k = ud;
    for (int i = 0; size >= 1024 && i < BIGS; i++)
        if (!k->big[i]) {
            k->big[i] = p + 2;
            break;
        }
    return p + 2;
}

static void cnt_free(void *ptr, void *ud)
{
    if (!ptr)
        return;
    cnt_add(ud, cnt_head(ptr), -1);
    struct count *k = ud;
    for (int i = 0; i < BIGS; i++)
        if (k->big[i] == ptr)
            k->big[i] = NULL;
    free(cnt_head(ptr));
}

static void *cnt_calloc(size_t n, size_t size, void *ud)
{
    void *p = cnt_malloc(n * size, ud);
    if (p)
        memset(p, 0, n * size);
    return p;
}

static void *cnt_realloc(void *ptr, size_t size, void *ud)
{
    void *n = cnt_malloc(size, ud);
    if (n && ptr) {
        size_t old = cnt_head(ptr)[0];
        memcpy(n, ptr, old < size ? old : size);
    }
    if (n)
        cnt_free(ptr, ud);
    return n;
}

/* ---- the server side: answers every request as cyserve's static route does ---- */

static const char body[] = "Hello, World!";

static ssize_t body_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                         nghttp2_data_source *src, void *ud)
{
    (void)s, (void)id, (void)src, (void)ud;
    size_t n = sizeof(body) - 1 < len ? sizeof(body) - 1 : len;
    memcpy(buf, body, n);
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static int srv_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
    (void)ud;
    if (f->hd.type != NGHTTP2_HEADERS || !(f->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    nghttp2_nv nva[] = {
        {(uint8_t *)":status", (uint8_t *)"200", 7, 3, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"server", (uint8_t *)"cyserve", 6, 7, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"date", (uint8_t *)"Thu, 26 Nov 2026 09:40:00 GMT", 4, 29,
         NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"content-type", (uint8_t *)"text/plain", 12, 10, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"content-length", (uint8_t *)"13", 14, 2, NGHTTP2_NV_FLAG_NONE},
    };
    nghttp2_data_provider prd = {{0}, body_read};
    return nghttp2_submit_response(s, f->hd.stream_id, nva, 5, &prd);
}

/* ---- the exchange ---- */

struct variant {
    const char *name;
    int deflate_table; /* nghttp2_option_set_max_deflate_dynamic_table_size, -1: default */
    int header_table;  /* SETTINGS_HEADER_TABLE_SIZE advertised, -1: not sent (4096) */
    int no_closed;     /* nghttp2_option_set_no_closed_streams */
    int no_prio;       /* SETTINGS_NO_RFC7540_PRIORITIES = 1 */
};

/* Move what one side produced to the other until both are quiet. */
static void pump(nghttp2_session *a, nghttp2_session *b)
{
    for (int moved = 1; moved;) {
        moved = 0;
        nghttp2_session *from[2] = {a, b}, *to[2] = {b, a};
        for (int i = 0; i < 2; i++) {
            const uint8_t *data;
            ssize_t n;
            while ((n = nghttp2_session_mem_send(from[i], &data)) > 0) {
                if (nghttp2_session_mem_recv(to[i], data, (size_t)n) != n) {
                    fprintf(stderr, "mem_recv failed\n");
                    exit(1);
                }
                moved = 1;
            }
        }
    }
}

static void run(const struct variant *v, int browser)
{
    struct count srv = {0};
    nghttp2_session_callbacks *cbs;
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, srv_frame_recv);
    nghttp2_option *opt;
    nghttp2_option_new(&opt);
    nghttp2_option_set_no_auto_window_update(opt, 1);
    if (v->deflate_table >= 0)
        nghttp2_option_set_max_deflate_dynamic_table_size(opt, (size_t)v->deflate_table);
    if (v->no_closed)
        nghttp2_option_set_no_closed_streams(opt, 1);
    nghttp2_mem mem = {&srv, cnt_malloc, cnt_free, cnt_calloc, cnt_realloc};
    nghttp2_session *s;
    nghttp2_session_server_new3(&s, cbs, NULL, opt, &mem);
    nghttp2_option_del(opt);
    nghttp2_settings_entry iv[4] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 100},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, 16384},
    };
    size_t niv = 2;
    if (v->header_table >= 0)
        iv[niv++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_HEADER_TABLE_SIZE,
                                             (uint32_t)v->header_table};
    if (v->no_prio)
        iv[niv++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1};
    nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, iv, niv);
    long at_new = srv.heap;

    nghttp2_session_callbacks *ccbs;
    nghttp2_session_callbacks_new(&ccbs);
    nghttp2_session *cl;
    nghttp2_session_client_new(&cl, ccbs, NULL);
    nghttp2_submit_settings(cl, NGHTTP2_FLAG_NONE, NULL, 0);
    uint8_t no_index = browser ? NGHTTP2_NV_FLAG_NONE : NGHTTP2_NV_FLAG_NO_INDEX;
    nghttp2_nv req[] = {
        {(uint8_t *)":method", (uint8_t *)"GET", 7, 3, no_index},
        {(uint8_t *)":scheme", (uint8_t *)"https", 7, 5, no_index},
        {(uint8_t *)":path", (uint8_t *)"/plaintext", 5, 10, no_index},
        {(uint8_t *)":authority", (uint8_t *)"127.0.0.1", 10, 9, no_index},
        {(uint8_t *)"user-agent",
         (uint8_t *)"Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0", 10,
         70, no_index},
        {(uint8_t *)"accept",
         (uint8_t *)"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", 6, 63,
         no_index},
        {(uint8_t *)"accept-language", (uint8_t *)"en-US,en;q=0.5", 15, 14, no_index},
    };
    nghttp2_submit_request(cl, NULL, req, browser ? 7 : 4, NULL, NULL);
    pump(cl, s);
    /* Idle: the server's frame buffer is kept (csrc/http2.c gives back its pages, h2_mem_idle). */
    printf("%-34s %-8s new %6ld B   idle: %3ld blocks, %6ld B asked, %6ld B heap;", v->name,
           browser ? "browser" : "bench", at_new, srv.blocks, srv.bytes, srv.heap);
    printf("  by size (<32,<64,..):");
    for (int c = 0; c < 16; c++)
        if (srv.hist[c])
            printf(" <%d:%ld", 32 << c, srv.hist[c]);
    printf("\n%44s blocks >= 1 KiB:", "");
    for (int i = 0; i < BIGS; i++)
        if (srv.big[i]) {
            size_t n = cnt_head(srv.big[i])[0], nz = 0;
            for (size_t j = 0; j < n; j++)
                nz += ((unsigned char *)srv.big[i])[j] != 0;
            printf(" %zu (%zu B not zero)", n, nz);
        }
    printf("\n");
    /* What csrc/http2.c keeps of those blocks while the connection is idle (h2_park): they are
     * laid out as its pack lays them out (in order, 16-byte aligned, a block of a page or more
     * on a page of its own; the frame buffer, scratch, left out) and written as its copy is,
     * a mask per 512-byte chunk that holds a non-zero word, then those words. (The 48-byte
     * buffer chain, not counted here, adds a chunk's words at most.) */
    static uint64_t pack[8 * 4096 / 8];
    memset(pack, 0, sizeof(pack));
    size_t used = 0, scratch = sizeof(pack);
    for (int i = 0; i < BIGS; i++) {
        if (!srv.big[i])
            continue;
        size_t n = cnt_head(srv.big[i])[0];
        size_t off = (used + 15) & ~(size_t)15;
        if (n >= 4096)
            off = (off + 4095) & ~(size_t)4095;
        if (off + n > sizeof(pack))
            break;
        if (n == 9 + 1 + 16384) {
            scratch = off;
            break;
        }
        memcpy((char *)pack + off, srv.big[i], n);
        used = off + n;
    }
    size_t chunks = 0, words = 0;
    for (size_t c = 0; c < scratch / 512; c++) {
        size_t nz = 0;
        for (size_t w = 0; w < 64; w++)
            nz += pack[c * 64 + w] != 0;
        chunks += nz != 0;
        words += nz;
    }
    printf("%44s set aside while idle: %zu B of blocks -> a copy of %zu B (%zu non-zero words "
           "in %zu chunks)\n",
           "", used, 8 * (1 + chunks + words), words, chunks);
    nghttp2_session_del(cl);
    nghttp2_session_del(s);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_session_callbacks_del(ccbs);
    if (srv.blocks) {
        fprintf(stderr, "leak: %ld blocks\n", srv.blocks);
        exit(1);
    }
}

int main(void)
{
    static const struct variant vs[] = {
        {"defaults (csrc/http2.c today)", -1, -1, 0, 0},
        {"deflate table 0", 0, -1, 0, 0},
        {"no closed streams", -1, -1, 1, 0},
        {"SETTINGS_NO_RFC7540_PRIORITIES", -1, -1, 0, 1},
        {"decoder table 1024", -1, 1024, 0, 0},
        {"deflate 0, no closed, no prio", 0, -1, 1, 1},
        {"all, decoder table 1024", 0, 1024, 1, 1},
        {"all, decoder table 0", 0, 0, 1, 1},
    };
    printf("nghttp2 %s\n", nghttp2_version(0)->version_str);
    for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++)
        for (int browser = 0; browser < 2; browser++)
            run(&vs[i], browser);
    return 0;
}
