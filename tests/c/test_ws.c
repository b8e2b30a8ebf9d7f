/* test_ws.c: the WebSocket codec (csrc/ws.c): frames built here, masked as a client masks them,
 * read whole and at every split; the rules that close a connection and their codes; UTF-8
 * validation across fragments; server frame heads; close payloads; the handshake's checks and the
 * RFC's Sec-WebSocket-Accept example. The conformance cases as data are in tests/ws/ (run through
 * the test hooks); this file checks what is easier to build in C (long lengths, every split), and
 * the thread's zlib streams lent for one message (csrc/ws_zlend.c). */
#define _GNU_SOURCE
#include "csrc/ws.c"
#include "csrc/ws_zlend.c"

#include <pthread.h>
#include <stdlib.h>

#include "tap.h"

static const unsigned char KEY[4] = {0x37, 0xfa, 0x21, 0x3d};

/* A client frame of opcode op with payload p[0..n) into out; returns its length. */
static size_t client_frame(unsigned char *out, int fin, int op, const void *p, size_t n)
{
    size_t hl = ws_frame_head(out, op, fin, n);
    out[1] |= 0x80;
    memcpy(out + hl, KEY, 4);
    hl += 4;
    for (size_t i = 0; i < n; i++)
        out[hl + i] = ((const unsigned char *)p)[i] ^ KEY[i & 3];
    return hl + n;
}

static void test_simple_text(void)
{
    unsigned char buf[64];
    size_t n = client_frame(buf, 1, WS_OP_TEXT, "Hello", 5);
    struct ws_reader r;
    ws_reader_init(&r, 0);
    struct ws_frame f;
    is_int(ws_read_frame(&r, (char *)buf, n, &f), n, "a masked text frame is read whole");
    is_int(f.opcode, WS_OP_TEXT, "its opcode");
    ok(f.fin && f.first, "fin and first");
    is_mem(f.payload, f.len, "Hello", "unmasked in place");
    ok(f.payload == (char *)buf + 6, "the payload lies in the buffer (zero-copy)");
    /* Every prefix says "more". The frame is made again: the read above unmasked it in place,
     * and a prefix of those bytes masked again would not be the valid text it was. */
    client_frame(buf, 1, WS_OP_TEXT, "Hello", 5);
    for (size_t k = 0; k < n; k++) {
        unsigned char copy[64];
        memcpy(copy, buf, n);
        ws_reader_init(&r, 0);
        if (ws_read_frame(&r, (char *)copy, k, &f) != -2) {
            ok(0, "prefix %zu is incomplete", k);
            return;
        }
    }
    ok(1, "every prefix is incomplete");
}

static void test_lengths(void)
{
    size_t sizes[] = {0, 125, 126, 127, 65535, 65536, 100000};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t len = sizes[i];
        unsigned char *p = malloc(len + 1), *buf = malloc(len + WS_HEAD_MAX);
        for (size_t k = 0; k < len; k++)
            p[k] = (unsigned char)('a' + k % 26);
        size_t n = client_frame(buf, 1, WS_OP_BINARY, p, len);
        struct ws_reader r;
        ws_reader_init(&r, 0);
        struct ws_frame f;
        /* The head alone says how large the frame is. */
        ssize_t rc = ws_read_frame(&r, (char *)buf, n - (len ? 1 : 0) - (len ? 0 : 0), &f);
        if (len) {
            is_int(rc, -2, "a frame short of one byte is incomplete");
            is_int(r.need, n, "need is the frame's size");
        }
        rc = ws_read_frame(&r, (char *)buf, n, &f);
        is_int(rc, n, "a binary frame of each length is read");
        ok(f.len == len && memcmp(f.payload, p, len) == 0, "payload of %zu bytes intact", len);
        free(p);
        free(buf);
    }
}

static void test_errors(void)
{
    struct ws_reader r;
    struct ws_frame f;
    unsigned char buf[300];
    /* Unmasked. */
    unsigned char unmasked[] = {0x81, 0x02, 'h', 'i'};
    ws_reader_init(&r, 0);
    is_int(ws_read_frame(&r, (char *)unmasked, 4, &f), -1, "an unmasked frame is an error");
    is_int(r.error, 1002, "... closing 1002");
    ws_reader_init(&r, 0);
    is_int(ws_read_frame(&r, (char *)unmasked, 2, &f), -1, "... known from its head alone");
    /* Reserved bits. */
    size_t n = client_frame(buf, 1, WS_OP_TEXT, "x", 1);
    buf[0] |= 0x40;
    ws_reader_init(&r, 0);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), -1, "RSV1 without an extension");
    is_int(r.error, 1002, "... 1002");
    /* Unknown opcodes. */
    int ops[] = {3, 7, 0xB, 0xF};
    for (int i = 0; i < 4; i++) {
        n = client_frame(buf, 1, ops[i], "", 0);
        ws_reader_init(&r, 0);
        is_int(ws_read_frame(&r, (char *)buf, n, &f), -1, "a reserved opcode");
    }
    /* Control frame too long or fragmented. */
    char big[126];
    memset(big, 'a', sizeof(big));
    n = client_frame(buf, 1, WS_OP_PING, big, 126);
    ws_reader_init(&r, 0);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), -1, "a ping of 126 bytes");
    n = client_frame(buf, 0, WS_OP_PING, "a", 1);
    ws_reader_init(&r, 0);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), -1, "a fragmented ping");
    /* Continuation without a message, and a new message inside one. */
    n = client_frame(buf, 1, WS_OP_CONT, "a", 1);
    ws_reader_init(&r, 0);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), -1, "a continuation without a message");
    ws_reader_init(&r, 0);
    n = client_frame(buf, 0, WS_OP_TEXT, "a", 1);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), n, "a first fragment");
    n = client_frame(buf, 1, WS_OP_BINARY, "a", 1);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), -1, "a new message before its end");
    /* 64-bit length with its top bit. */
    unsigned char top[14] = {0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4};
    ws_reader_init(&r, 0);
    is_int(ws_read_frame(&r, (char *)top, 14, &f), -1, "a length with its top bit set");
}

static void test_too_big(void)
{
    struct ws_reader r;
    struct ws_frame f;
    unsigned char buf[64];
    ws_reader_init(&r, 10);
    size_t n = client_frame(buf, 1, WS_OP_TEXT, "0123456789", 10);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), n, "a message at the maximum");
    n = client_frame(buf, 1, WS_OP_TEXT, "0123456789a", 11);
    is_int(ws_read_frame(&r, (char *)buf, 2, &f), -1, "one byte over fails from the head");
    is_int(r.error, 1009, "... 1009");
    /* Across fragments. */
    ws_reader_init(&r, 10);
    n = client_frame(buf, 0, WS_OP_BINARY, "012345", 6);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), n, "six bytes");
    n = client_frame(buf, 1, WS_OP_CONT, "01234", 5);
    is_int(ws_read_frame(&r, (char *)buf, 2, &f), -1, "eleven across fragments");
    is_int(r.error, 1009, "... 1009");
}

static void test_fragments_and_control(void)
{
    struct ws_reader r;
    struct ws_frame f;
    unsigned char buf[64];
    ws_reader_init(&r, 0);
    /* "é" (C3 A9) split between fragments, a ping in between. */
    size_t n = client_frame(buf, 0, WS_OP_TEXT, "a\xC3", 2);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), n, "first fragment ends inside a character");
    ok(f.first && !f.fin && f.opcode == WS_OP_TEXT, "first, not fin, text");
    n = client_frame(buf, 1, WS_OP_PING, "p", 1);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), n, "a ping between fragments");
    is_int(f.opcode, WS_OP_PING, "... is a ping");
    n = client_frame(buf, 1, WS_OP_CONT, "\xA9z", 2);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), n, "the last fragment");
    ok(!f.first && f.fin && f.opcode == WS_OP_TEXT, "reported as the text message's end");
    /* Invalid UTF-8 fails fast, in the first fragment. */
    ws_reader_init(&r, 0);
    n = client_frame(buf, 0, WS_OP_TEXT, "ab\xC0\xAF", 4);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), -1, "an overlong form fails in its fragment");
    is_int(r.error, 1007, "... 1007");
    ws_reader_init(&r, 0);
    n = client_frame(buf, 1, WS_OP_TEXT, "a\xE2\x82", 3);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), -1, "a message ending inside a character");
    is_int(r.error, 1007, "... 1007");
    /* Binary is not validated. */
    ws_reader_init(&r, 0);
    n = client_frame(buf, 1, WS_OP_BINARY, "\xff\xfe", 2);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), n, "binary may hold anything");
}

static void test_close_frames(void)
{
    struct ws_reader r;
    struct ws_frame f;
    unsigned char buf[200];
    ws_reader_init(&r, 0);
    size_t n = client_frame(buf, 1, WS_OP_CLOSE, "", 0);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), n, "an empty close");
    is_int(f.code, 1005, "... has no status");
    n = client_frame(buf, 1, WS_OP_CLOSE,
                     "\x03\xe8"
                     "bye",
                     5);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), n, "close 1000 bye");
    is_int(f.code, 1000, "its code");
    is_mem(f.reason, f.reason_len, "bye", "its reason");
    n = client_frame(buf, 1, WS_OP_CLOSE, "\x03", 1);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), -1, "a one-byte close payload");
    is_int(r.error, 1002, "... 1002");
    int bad[] = {0, 999, 1004, 1005, 1006, 1015, 1016, 2000, 2999, 5000, 65535};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char p[2] = {(char)(bad[i] >> 8), (char)bad[i]};
        ws_reader_init(&r, 0);
        n = client_frame(buf, 1, WS_OP_CLOSE, p, 2);
        if (ws_read_frame(&r, (char *)buf, n, &f) != -1 || r.error != 1002)
            ok(0, "close code %d refused", bad[i]);
    }
    ok(1, "reserved and out-of-range close codes are refused with 1002");
    int good[] = {1000, 1001, 1002, 1003, 1007, 1011, 1014, 3000, 4999};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        ok(ws_close_code_valid(good[i]), "close code %d is valid", good[i]);
    ws_reader_init(&r, 0);
    n = client_frame(buf, 1, WS_OP_CLOSE, "\x03\xe8\xff", 3);
    is_int(ws_read_frame(&r, (char *)buf, n, &f), -1, "a reason that is not UTF-8");
    is_int(r.error, 1007, "... 1007");
    /* The payload the server sends: cut at a character edge. */
    char out[WS_CONTROL_MAX], reason[200];
    for (int i = 0; i < 100; i++) {
        reason[2 * i] = (char)0xC3;
        reason[2 * i + 1] = (char)0xA9;
    }
    size_t pl = ws_close_payload(out, 1000, reason, 200);
    is_int(pl, 124, "a long reason is cut to 122 bytes of whole characters");
    uint32_t st = 0;
    ok(ws_utf8_feed(&st, (unsigned char *)out + 2, pl - 2) == 0 && st == 0, "... still UTF-8");
    is_int(ws_close_payload(out, 1005, NULL, 0), 0, "no status: an empty payload");
}

static void test_utf8(void)
{
    struct {
        const char *s;
        int valid;
    } cases[] = {
        {"", 1},
        {"plain ascii, longer than eight bytes", 1},
        {"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5", 1}, /* κόσμε */
        {"\xf4\x8f\xbf\xbf", 1},                             /* U+10FFFF */
        {"\xf4\x90\x80\x80", 0},                             /* past U+10FFFF */
        {"\xed\x9f\xbf", 1},                                 /* U+D7FF */
        {"\xed\xa0\x80", 0},                                 /* a surrogate */
        {"\xc0\x80", 0},                                     /* overlong NUL */
        {"\xe0\x80\xaf", 0},                                 /* overlong / */
        {"\xf0\x80\x80\xaf", 0},                             /* overlong / */
        {"\x80", 0},                                         /* stray continuation */
        {"\xfe", 0},
        {"\xff", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t st = 0;
        int rc = ws_utf8_feed(&st, (const unsigned char *)cases[i].s, strlen(cases[i].s));
        int valid = rc == 0 && st == 0;
        is_int(valid, cases[i].valid, "utf-8 case");
        /* Byte by byte gives the same verdict. */
        st = 0;
        rc = 0;
        for (size_t k = 0; k < strlen(cases[i].s) && rc == 0; k++)
            rc = ws_utf8_feed(&st, (const unsigned char *)cases[i].s + k, 1);
        is_int(rc == 0 && st == 0, cases[i].valid, "... fed a byte at a time");
    }
}

static void test_server_heads(void)
{
    unsigned char h[WS_HEAD_MAX];
    is_int(ws_frame_head(h, WS_OP_TEXT, 1, 5), 2, "a short head");
    ok(h[0] == 0x81 && h[1] == 5, "FIN|TEXT, 5, unmasked");
    is_int(ws_frame_head(h, WS_OP_BINARY, 1, 300), 4, "a 16-bit length");
    ok(h[1] == 126 && h[2] == 1 && h[3] == 44, "126, 0x012C");
    is_int(ws_frame_head(h, WS_OP_BINARY, 0, 70000), 10, "a 64-bit length");
    ok(h[0] == 0x02 && h[1] == 127 && h[7] == 0x01 && h[8] == 0x11 && h[9] == 0x70,
       "not fin, 127, 0x11170");
}

static void test_handshake(void)
{
    char acc[WS_ACCEPT_LEN];
    is_int(ws_accept("dGhlIHNhbXBsZSBub25jZQ==", 24, acc), 0, "the RFC's example key");
    is_mem(acc, WS_ACCEPT_LEN, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", "the RFC's example accept");
    is_int(ws_accept("dGhlIHNhbXBsZSBub25jZQ=", 23, acc), -EINVAL, "a short key");
    is_int(ws_accept("dGhlIHNhbXBsZSBub25jZR==", 24, acc), -EINVAL, "a key of 16.5 bytes");
    is_int(ws_accept("dGhlIHNhbXBsZSBub25j*Q==", 24, acc), -EINVAL, "not base64");
    struct ws_handshake h = {
        .is_get = 1,
        .minor_version = 1,
        .connection_upgrade = 1,
        .upgrade_websocket = 1,
        .key = "dGhlIHNhbXBsZSBub25jZQ==",
        .key_len = 24,
        .version = "13",
        .version_len = 2,
    };
    const char *why;
    is_int(ws_handshake_check(&h, &why), 0, "a valid handshake");
    h.version = "8";
    h.version_len = 1;
    is_int(ws_handshake_check(&h, &why), 426, "version 8: 426");
    h.version = NULL;
    is_int(ws_handshake_check(&h, &why), 426, "no version: 426");
    h.version = "13";
    h.version_len = 2;
    h.is_get = 0;
    is_int(ws_handshake_check(&h, &why), 400, "POST: 400");
    h.is_get = 1;
    h.connection_upgrade = 0;
    is_int(ws_handshake_check(&h, &why), 400, "Connection without upgrade: 400");
    h.connection_upgrade = 1;
    h.key = NULL;
    is_int(ws_handshake_check(&h, &why), 400, "no key: 400");
    h.key = "abc";
    h.key_len = 3;
    is_int(ws_handshake_check(&h, &why), 400, "a bad key: 400");
    h.key = "dGhlIHNhbXBsZSBub25jZQ==";
    h.key_len = 24;
    h.minor_version = 0;
    is_int(ws_handshake_check(&h, &why), 400, "HTTP/1.0: 400");
    ok(ws_token_list_has("keep-alive, Upgrade", 19, "upgrade"), "token lists, any case");
    ok(!ws_token_list_has("keep-alive, upgrades", 20, "upgrade"), "a whole token only");
    ok(ws_token_list_has(" upgrade ", 9, "upgrade"), "OWS around");
}

/* ---- permessage-deflate ---- */

static void test_pmd_negotiate(void)
{
    struct ws_pmd_params p;
    char out[WS_PMD_RESPONSE_MAX];
    const char *v = "permessage-deflate; client_max_window_bits";
    is_int(ws_pmd_negotiate(v, strlen(v), &p, out), strlen("permessage-deflate"),
           "a browser's offer is taken");
    is_mem(out, strlen(out), "permessage-deflate", "and answered without parameters");
    is_int(p.server_max_window_bits, 15, "the server's window is 32 KiB");
    v = "permessage-deflate; server_max_window_bits=8, permessage-deflate; "
        "server_max_window_bits=\"12\"; server_no_context_takeover; CLIENT_NO_CONTEXT_TAKEOVER";
    ok(ws_pmd_negotiate(v, strlen(v), &p, out) > 0, "a second offer is taken");
    is_mem(out, strlen(out),
           "permessage-deflate; server_no_context_takeover; client_no_context_takeover; "
           "server_max_window_bits=12",
           "the first (a window of 8, which zlib cannot keep to) declined, the second answered");
    ok(p.server_no_context_takeover && p.client_no_context_takeover &&
           p.server_max_window_bits == 12,
       "its parameters, a quoted value included");
    const char *declined[] = {
        "",
        "x-webkit-deflate-frame",
        "permessage-deflate; foo",
        "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
        "permessage-deflate; server_no_context_takeover=1",
        "permessage-deflate; server_max_window_bits",
        "permessage-deflate; server_max_window_bits=16",
        "permessage-deflate; server_max_window_bits=010",
        "permessage-deflate; client_max_window_bits=7",
        "permessage-deflate; client_max_window_bits=15; client_max_window_bits",
    };
    for (size_t i = 0; i < sizeof(declined) / sizeof(declined[0]); i++)
        ok(ws_pmd_negotiate(declined[i], strlen(declined[i]), &p, out) == 0, "declined: '%s'",
           declined[i]);
}

/* A compressed client message of p[0..n) as one frame into out (zlib's own deflate). */
static size_t client_compressed(unsigned char *out, int op, const void *p, size_t n)
{
    z_stream z;
    memset(&z, 0, sizeof(z));
    deflateInit2(&z, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY);
    unsigned char *tmp = malloc(n + 1024);
    z.next_in = (Bytef *)p;
    z.avail_in = (uInt)n;
    z.next_out = tmp;
    z.avail_out = (uInt)(n + 1024);
    deflate(&z, Z_SYNC_FLUSH);
    size_t cn = (n + 1024) - z.avail_out - 4; /* without the 00 00 FF FF tail */
    deflateEnd(&z);
    size_t len = client_frame(out, 1, op, tmp, cn);
    out[0] |= 0x40;
    free(tmp);
    return len;
}

static void test_pmd_bomb_is_bounded(void)
{
    size_t big = 8u << 20;
    char *zeros = calloc(1, big);
    unsigned char *buf = malloc(big / 100 + 4096);
    size_t n = client_compressed(buf, WS_OP_BINARY, zeros, big);
    ok(n < big / 100, "8 MiB of zeros compress to %zu bytes", n);
    struct ws_reader r;
    ws_reader_init(&r, 100000);
    r.deflate = 1;
    struct ws_pmd_params pp = {0, 0, 15};
    struct ws_pmd z;
    ws_pmd_init(&z, &pp);
    struct ws_buf out = {0};
    struct ws_frame f;
    is_int(ws_read_frame(&r, (char *)buf, n, &f), n, "the frame is read (small compressed)");
    ok(f.compressed, "marked compressed");
    is_int(ws_pmd_inflate(&z, &r, &f, &out), -1, "inflating it fails");
    is_int(r.error, WS_CLOSE_TOO_BIG, "with 1009");
    ok(out.cap <= 100001, "having allocated %zu bytes, no more than the maximum and one", out.cap);
    free(out.ptr);
    ws_pmd_free(&z);
    free(zeros);
    free(buf);
}

static void test_pmd_round_trip(void)
{
    /* The server's compressor against zlib's inflater, with each window and context mode. */
    char msg[3000];
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = "abcdefgh"[(i * 7 + i / 13) % 8];
    int bits[] = {9, 12, 15};
    for (int nc = 0; nc < 2; nc++)
        for (size_t b = 0; b < sizeof(bits) / sizeof(bits[0]); b++) {
            struct ws_pmd_params pp = {nc, 0, bits[b]};
            struct ws_pmd z;
            ws_pmd_init(&z, &pp);
            struct ws_buf out = {0};
            z_stream in;
            memset(&in, 0, sizeof(in));
            inflateInit2(&in, -bits[b]);
            int good = 1;
            for (int m = 0; m < 3; m++) {
                if (ws_pmd_deflate(&z, msg, sizeof(msg), &out) != 0) {
                    good = 0;
                    break;
                }
                if (nc)
                    inflateReset(&in); /* no context: each message inflates alone */
                char tail[4] = {0, 0, (char)0xFF, (char)0xFF};
                char back[4000];
                in.next_out = (Bytef *)back;
                in.avail_out = sizeof(back);
                in.next_in = (Bytef *)out.ptr;
                in.avail_in = (uInt)out.len;
                int zr = inflate(&in, Z_SYNC_FLUSH);
                in.next_in = (Bytef *)tail;
                in.avail_in = 4;
                zr = inflate(&in, Z_SYNC_FLUSH);
                size_t got = sizeof(back) - in.avail_out;
                if ((zr != Z_OK && zr != Z_BUF_ERROR) || got != sizeof(msg) ||
                    memcmp(back, msg, sizeof(msg)) != 0)
                    good = 0;
            }
            ok(good, "window %d, %s: three messages round trip", bits[b],
               nc ? "no context takeover" : "context kept");
            inflateEnd(&in);
            free(out.ptr);
            ws_pmd_free(&z);
        }
    /* An empty message. */
    struct ws_pmd_params pp = {0, 0, 15};
    struct ws_pmd z;
    ws_pmd_init(&z, &pp);
    struct ws_buf out = {0};
    is_int(ws_pmd_deflate(&z, "", 0, &out), 0, "an empty message compresses");
    ok(out.len >= 1, "to a block of its own (%zu bytes)", out.len);
    free(out.ptr);
    ws_pmd_free(&z);
}

/* Inflate a server's compressed message alone (no context), as a client does after the server
 * answered server_no_context_takeover; 1 when it gives back msg[0..n). */
static int inflates_alone(const struct ws_buf *c, int bits, const char *msg, size_t n)
{
    z_stream in;
    memset(&in, 0, sizeof(in));
    if (inflateInit2(&in, -bits) != Z_OK)
        return 0;
    char *back = malloc(n + 64);
    unsigned char all[1 << 16];
    if (c->len + 4 > sizeof(all)) {
        free(back);
        inflateEnd(&in);
        return 0;
    }
    memcpy(all, c->ptr, c->len);
    memcpy(all + c->len, "\x00\x00\xff\xff", 4);
    in.next_in = all;
    in.avail_in = (uInt)(c->len + 4);
    in.next_out = (Bytef *)back;
    in.avail_out = (uInt)(n + 64);
    int zr = inflate(&in, Z_SYNC_FLUSH);
    int good = (zr == Z_OK || zr == Z_BUF_ERROR) && n + 64 - in.avail_out == n &&
               memcmp(back, msg, n) == 0;
    free(back);
    inflateEnd(&in);
    return good;
}

/* Inflate one client message (one frame, compressed by zlib with its context from the start)
 * on z with the thread's lent inflater, as ws_conn.c and ws_nogil.c do. 0 or -1. */
static int lent_inflate(struct ws_pmd *z, struct ws_buf *msg, const char *p, size_t n)
{
    unsigned char *frame = malloc(n + 2048);
    size_t fl = client_compressed(frame, WS_OP_BINARY, p, n);
    struct ws_reader r;
    ws_reader_init(&r, 1 << 20);
    r.deflate = 1;
    struct ws_frame f;
    int rc = -1;
    if (ws_read_frame(&r, (char *)frame, fl, &f) == (ssize_t)fl && f.compressed) {
        wsz_borrow_in(z, msg);
        rc = ws_pmd_inflate(z, &r, &f, msg);
        wsz_return_in(z, NULL, rc != 0);
        if (rc == 0 && (msg->len != n || memcmp(msg->ptr, p, n) != 0))
            rc = -1;
    }
    free(frame);
    return rc;
}

static void *zlend_thread(void *arg)
{
    (void)arg;
    char msg[3000];
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = "abcdefgh"[(i * 7 + i / 13) % 8];
    struct ws_pmd_params p15 = {1, 1, 15}, p10 = {1, 1, 10};

    /* The deflater: each message compresses alone (the lent stream is reset), with the
     * window the connection negotiated, and the thread keeps one stream for all. */
    const struct ws_buf *c;
    int good = 1;
    for (int m = 0; m < 3; m++)
        good &= wsz_deflate(&p15, msg, sizeof(msg), &c) == 0 &&
                inflates_alone(c, 15, msg, sizeof(msg));
    ok(good, "three messages from the thread's deflater each inflate alone");
    struct wsz_cache *zc = wsz_cache();
    ok(zc->z.out != NULL, "the thread keeps its deflater between messages");
    ok(zc->zs.out == NULL, "the one for short messages is not made for a long one");
    good = 1;
    for (int m = 0; m < 3; m++)
        good &= wsz_deflate(&p15, msg + m, 300, &c) == 0 && inflates_alone(c, 15, msg + m, 300);
    ok(good, "short messages each inflate alone too");
    ok(zc->zs.out != NULL, "from the thread's deflater for short messages, kept");
    good = wsz_deflate(&p10, msg, sizeof(msg), &c) == 0 && inflates_alone(c, 10, msg, sizeof(msg));
    ok(good, "a connection with a 1 KiB window gets a deflater of that window");
    is_int(zc->z.p.server_max_window_bits, 10, "which the thread keeps instead");
    good = wsz_deflate(&p15, msg, sizeof(msg), &c) == 0 && inflates_alone(c, 15, msg, sizeof(msg));
    ok(good, "and replaces for the next 32 KiB connection");
    char *big = malloc(200000);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < 200000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* incompressible: output past 64 KiB */
        big[i] = (char)(x >> 32);
    }
    is_int(wsz_deflate(&p15, big, 200000, &c), 0, "a 200 KB message compresses");
    ok(c->len > WSZ_BUF_KEEP, "into the thread's buffer (%zu bytes)", c->len);
    is_int(wsz_deflate(&p15, msg, 100, &c), 0, "the next message too");
    ok(c->cap <= WSZ_BUF_KEEP, "in a buffer not kept at the large one's size (%zu)", c->cap);

    /* The inflater: two connections on one thread. a's message is inflated with the thread's
     * inflater; while b holds it (a message in pieces), a gets a new one; once both return,
     * the thread keeps one and frees the other. */
    struct ws_pmd a, b;
    ws_pmd_init(&a, &p15);
    ws_pmd_init(&b, &p15);
    struct ws_buf am = {0}, bm = {0};
    is_int(lent_inflate(&a, &am, msg, sizeof(msg)), 0, "a's message inflates");
    ok(a.in == NULL && zc->z.in != NULL, "its inflater went back to the thread");
    wsz_return_buf(&am);
    ok(am.ptr == NULL && zc->in_buf.ptr != NULL, "and its buffer");
    struct z_stream_s *thread_in = zc->z.in;
    wsz_borrow_in(&b, &bm);
    ok(b.in == thread_in && zc->z.in == NULL && bm.ptr != NULL, "b borrows both");
    is_int(lent_inflate(&a, &am, msg, 1000), 0, "meanwhile a's next message inflates");
    ok(zc->z.in != NULL && zc->z.in != thread_in, "with an inflater made for it, kept");
    wsz_return_in(&b, &bm, 0);
    ok(b.in == NULL && bm.ptr == NULL, "b gives its back: freed, the thread had one");
    wsz_return_buf(&am);
    /* Context from the previous message would break the next one: a clean inflater each time. */
    good = 1;
    for (int m = 0; m < 4; m++) {
        good &= lent_inflate(&a, &am, msg + m * 100, 2000) == 0;
        wsz_return_buf(&am);
    }
    ok(good, "messages after messages inflate alone on the lent inflater");
    /* A failed message's inflater is freed, not lent again. */
    struct ws_reader r;
    ws_reader_init(&r, 1 << 20);
    r.deflate = 1;
    unsigned char bad[64];
    size_t bl = client_frame(bad, 1, WS_OP_BINARY, "\xff\xff\xff\xff\xff\xff", 6);
    bad[0] |= 0x40;
    struct ws_frame f;
    ws_read_frame(&r, (char *)bad, bl, &f);
    struct z_stream_s *before = zc->z.in;
    wsz_borrow_in(&a, &am);
    is_int(ws_pmd_inflate(&a, &r, &f, &am), -1, "bad deflate data fails");
    wsz_return_in(&a, &am, 1);
    ok(a.in == NULL && zc->z.in == NULL && before != NULL,
       "and its inflater is not the thread's any more");
    is_int(lent_inflate(&a, &am, msg, sizeof(msg)), 0, "the next message gets a new one");
    wsz_return_buf(&am);
    ws_pmd_free(&a);
    ws_pmd_free(&b);
    free(big);
    return NULL; /* the thread's streams are freed by the key's destructor (ASan sees a leak
                  * otherwise) */
}

static void test_zlend(void)
{
    pthread_t t;
    ok(pthread_create(&t, NULL, zlend_thread, NULL) == 0, "a thread lends its streams");
    pthread_join(t, NULL);
}

int main(void)
{
    test_simple_text();
    test_lengths();
    test_errors();
    test_too_big();
    test_fragments_and_control();
    test_close_frames();
    test_utf8();
    test_server_heads();
    test_handshake();
    test_pmd_negotiate();
    test_pmd_bomb_is_bounded();
    test_pmd_round_trip();
    test_zlend();
    return done_testing();
}
