/* ws.c: the WebSocket codec (ws.h has the contract).
 *
 * ---- Decisions the RFC leaves open ----
 * - The one extension is permessage-deflate (RFC 7692): once negotiated (r->deflate), RSV1 on a
 *   message's first frame marks it compressed. Any other RSV bit, and RSV1 without the
 *   extension or on a control or continuation frame, is a protocol error (1002), as RFC 6455
 *   5.2 and RFC 7692 6 require.
 * - The maximum message size is checked twice for a compressed message: on its compressed bytes
 *   from each frame's head (as for any message), and on its inflated bytes as they come out of
 *   zlib, whose output buffer never grows past it (a deflate bomb of a few bytes stops there).
 * - A frame is returned only whole: its payload must lie in the buffer, so the caller grows its
 *   buffer to the frame's size (ws_reader.need). That is what makes the reader zero-copy (the
 *   payload is unmasked where it lies) and keeps it simple; the maximum message size bounds the
 *   buffer, and a frame that would pass that maximum fails from its head alone (1009), before a
 *   byte of its payload is read, so a client cannot make the server buffer it.
 * - A length encoded in more bytes than needed (126 for 100 bytes) is accepted: the "minimal
 *   number of bytes" is the sender's duty and refusing it protects nothing. A 64-bit length with
 *   its top bit set is refused (5.2 says it must be 0).
 * - Text is validated as it arrives, fragment by fragment, and fails on the first byte that
 *   cannot be part of valid UTF-8 (an overlong form, a surrogate, past U+10FFFF, a stray
 *   continuation), not at the message's end: a client streaming an invalid message is stopped at
 *   once (Autobahn's "fail fast" cases). A character split between fragments is fine.
 * - Close codes a peer may send: 1000-1003, 1007-1014 (1012-1014 were registered after the RFC)
 *   and 3000-4999. 1004-1006 and 1015 are reserved for reporting, never sent: a frame carrying one
 *   is a protocol error, as is a close payload of one byte. */
#define _GNU_SOURCE
#include "ws.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <zlib.h>

void ws_reader_init(struct ws_reader *r, uint64_t max_message)
{
    memset(r, 0, sizeof(*r));
    r->max_message = max_message;
}

/* ---- UTF-8 ----
 * The state packs what the next byte must be: the continuation bytes still owed (bits 0-1) and the
 * range the next one must fall in (bits 8-15 low, 16-23 high); the range of the second byte of a
 * sequence is what excludes overlong forms, surrogates and values past U+10FFFF (RFC 3629 4). */
#define UTF8_STATE(need, lo, hi) ((uint32_t)(need) | ((uint32_t)(lo) << 8) | ((uint32_t)(hi) << 16))

int ws_utf8_feed(uint32_t *state, const unsigned char *p, size_t n)
{
    uint32_t st = *state;
    size_t i = 0;
    for (;;) {
        /* ASCII runs, the common case, eight bytes at a time. */
        if (st == 0) {
            while (i + 8 <= n) {
                uint64_t v;
                memcpy(&v, p + i, 8);
                if (v & 0x8080808080808080ULL)
                    break;
                i += 8;
            }
        }
        if (i == n)
            break;
        unsigned b = p[i++];
        if (st == 0) {
            if (b < 0x80)
                continue;
            if (b >= 0xC2 && b <= 0xDF)
                st = UTF8_STATE(1, 0x80, 0xBF);
            else if (b == 0xE0)
                st = UTF8_STATE(2, 0xA0, 0xBF);
            else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF)
                st = UTF8_STATE(2, 0x80, 0xBF);
            else if (b == 0xED)
                st = UTF8_STATE(2, 0x80, 0x9F); /* not the surrogates D800-DFFF */
            else if (b == 0xF0)
                st = UTF8_STATE(3, 0x90, 0xBF);
            else if (b >= 0xF1 && b <= 0xF3)
                st = UTF8_STATE(3, 0x80, 0xBF);
            else if (b == 0xF4)
                st = UTF8_STATE(3, 0x80, 0x8F); /* not past U+10FFFF */
            else {
                *state = st;
                return -1;
            }
            continue;
        }
        unsigned lo = (st >> 8) & 0xFF, hi = (st >> 16) & 0xFF, need = st & 3;
        if (b < lo || b > hi) {
            *state = st;
            return -1;
        }
        need--;
        st = need ? UTF8_STATE(need, 0x80, 0xBF) : 0;
    }
    *state = st;
    return 0;
}

int ws_close_code_valid(int code)
{
    return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
           (code >= 3000 && code <= 4999);
}

static ssize_t ws_fail(struct ws_reader *r, int code, const char *why)
{
    r->error = code;
    r->error_text = why;
    return -1;
}

/* XOR p[0..n) with the 4-byte key, a word at a time: the key repeats every 4 bytes, so an 8-byte
 * word of it is the key twice. */
static void ws_unmask(unsigned char *p, uint64_t n, const unsigned char key[4])
{
    uint64_t i = 0;
    uint32_t k32;
    memcpy(&k32, key, 4);
    uint64_t k64 = ((uint64_t)k32 << 32) | k32;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        v ^= k64;
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++)
        p[i] ^= key[i & 3];
}

/* Validate the part of an incomplete text frame's payload p[0..avail) not yet validated,
 * unmasking a copy (buf is left as it is until the frame is whole). first: the frame starts its
 * message, whose text starts at a character edge; else it continues r's. 0, or -1 at a byte
 * that cannot be valid. */
static int ws_text_peek(struct ws_reader *r, const unsigned char *p, size_t avail,
                        const unsigned char *key, int first)
{
    if (r->partial_len == 0)
        r->partial_utf8 = first ? 0 : r->utf8;
    unsigned char chunk[256];
    size_t i = (size_t)r->partial_len;
    while (i < avail) {
        size_t n = avail - i < sizeof(chunk) ? avail - i : sizeof(chunk);
        for (size_t j = 0; j < n; j++)
            chunk[j] = p[i + j] ^ key[(i + j) & 3];
        if (ws_utf8_feed(&r->partial_utf8, chunk, n))
            return -1;
        i += n;
    }
    r->partial_len = avail;
    return 0;
}

ssize_t ws_read_frame(struct ws_reader *r, char *buf, size_t len, struct ws_frame *f)
{
    const unsigned char *u = (const unsigned char *)buf;
    r->need = 0;
    if (len < 2)
        return -2;
    int fin = u[0] >> 7;
    int op = u[0] & 0x0F;
    int masked = u[1] >> 7;
    uint64_t plen = u[1] & 0x7F;
    size_t hl = 2;
    int control = op >= 0x8;
    int rsv1 = 0;
    if (u[0] & 0x70) {
        if ((u[0] & 0x70) != 0x40 || !r->deflate)
            return ws_fail(r, WS_CLOSE_PROTOCOL, "reserved bits set without an extension");
        if (control || op == WS_OP_CONT)
            return ws_fail(r, WS_CLOSE_PROTOCOL, "RSV1 on a control or continuation frame");
        rsv1 = 1;
    }
    /* Everything the first two bytes decide is checked before waiting for the rest: a bad
     * frame fails at once, whatever the split. */
    if (control) {
        if (op > WS_OP_PONG)
            return ws_fail(r, WS_CLOSE_PROTOCOL, "unknown control opcode");
        if (!fin)
            return ws_fail(r, WS_CLOSE_PROTOCOL, "fragmented control frame");
        if (plen > WS_CONTROL_MAX)
            return ws_fail(r, WS_CLOSE_PROTOCOL, "control frame longer than 125 bytes");
    } else {
        if (op > WS_OP_BINARY)
            return ws_fail(r, WS_CLOSE_PROTOCOL, "unknown data opcode");
        if (op == WS_OP_CONT && !r->message_op)
            return ws_fail(r, WS_CLOSE_PROTOCOL, "continuation frame without a message");
        if (op != WS_OP_CONT && r->message_op)
            return ws_fail(r, WS_CLOSE_PROTOCOL, "new message inside a fragmented one");
    }
    if (!masked)
        return ws_fail(r, WS_CLOSE_PROTOCOL, "client frame not masked");
    if (plen == 126) {
        if (len < 4)
            return -2;
        plen = ((uint64_t)u[2] << 8) | u[3];
        hl = 4;
    } else if (plen == 127) {
        if (len < 10)
            return -2;
        if (u[2] & 0x80)
            return ws_fail(r, WS_CLOSE_PROTOCOL, "64-bit length with its top bit set");
        plen = 0;
        for (int i = 2; i < 10; i++)
            plen = (plen << 8) | u[i];
        hl = 10;
    }
    if (!control && r->max_message) {
        uint64_t so_far = op == WS_OP_CONT ? r->message_len : 0;
        if (plen > r->max_message || so_far + plen > r->max_message)
            return ws_fail(r, WS_CLOSE_TOO_BIG, "message larger than the maximum");
    }
    const unsigned char *key = u + hl;
    hl += 4;
    int text = !control && !rsv1 &&
               (op == WS_OP_TEXT ||
                (op == WS_OP_CONT && r->message_op == WS_OP_TEXT && !r->compressed));
    if (len < hl || len - hl < plen) {
        r->need = (uint64_t)hl + plen;
        if (text && len > hl && ws_text_peek(r, u + hl, len - hl, key, op == WS_OP_TEXT))
            return ws_fail(r, WS_CLOSE_INVALID_DATA, "text message is not UTF-8");
        return -2;
    }
    uint64_t checked = r->partial_len; /* the payload's first bytes, validated while it came */
    r->partial_len = 0;
    unsigned char k[4];
    memcpy(k, key, 4);
    unsigned char *payload = (unsigned char *)buf + hl;
    ws_unmask(payload, plen, k);
    memset(f, 0, sizeof(*f));
    f->fin = fin;
    f->payload = (char *)payload;
    f->len = plen;
    if (control) {
        f->opcode = op;
        if (op == WS_OP_CLOSE) {
            f->code = WS_CLOSE_NO_STATUS;
            if (plen == 1)
                return ws_fail(r, WS_CLOSE_PROTOCOL, "close payload of one byte");
            if (plen >= 2) {
                f->code = (payload[0] << 8) | payload[1];
                if (!ws_close_code_valid(f->code))
                    return ws_fail(r, WS_CLOSE_PROTOCOL, "invalid close code");
                uint32_t st = 0;
                if (ws_utf8_feed(&st, payload + 2, plen - 2) || st)
                    return ws_fail(r, WS_CLOSE_INVALID_DATA, "close reason is not UTF-8");
                f->reason = (const char *)payload + 2;
                f->reason_len = plen - 2;
            }
        }
        return (ssize_t)(hl + plen);
    }
    if (op != WS_OP_CONT) {
        r->message_op = op;
        r->message_len = 0;
        r->utf8 = 0;
        r->compressed = rsv1;
        f->first = 1;
    }
    f->opcode = r->message_op;
    f->compressed = r->compressed;
    r->message_len += plen;
    if (r->message_op == WS_OP_TEXT && !r->compressed) {
        if (checked)
            r->utf8 = r->partial_utf8;
        if (ws_utf8_feed(&r->utf8, payload + checked, plen - checked))
            return ws_fail(r, WS_CLOSE_INVALID_DATA, "text message is not UTF-8");
        if (fin && r->utf8)
            return ws_fail(r, WS_CLOSE_INVALID_DATA, "text message ends inside a character");
    }
    if (fin)
        r->message_op = 0;
    return (ssize_t)(hl + plen);
}

size_t ws_frame_head(unsigned char out[WS_HEAD_MAX], int opcode, int fin, uint64_t len)
{
    out[0] = (unsigned char)((fin ? 0x80 : 0) | (opcode & 0x0F));
    if (len < 126) {
        out[1] = (unsigned char)len;
        return 2;
    }
    if (len <= 0xFFFF) {
        out[1] = 126;
        out[2] = (unsigned char)(len >> 8);
        out[3] = (unsigned char)len;
        return 4;
    }
    out[1] = 127;
    for (int i = 0; i < 8; i++)
        out[2 + i] = (unsigned char)(len >> (56 - 8 * i));
    return 10;
}

size_t ws_close_payload(char out[WS_CONTROL_MAX], int code, const char *reason, size_t reason_len)
{
    if (code == WS_CLOSE_NO_STATUS)
        return 0;
    out[0] = (char)(code >> 8);
    out[1] = (char)code;
    size_t n = reason_len > WS_CONTROL_MAX - 2 ? WS_CONTROL_MAX - 2 : reason_len;
    /* Cut at a character edge: back over continuation bytes (10xxxxxx) past the cut. */
    if (n < reason_len)
        while (n > 0 && ((unsigned char)reason[n] & 0xC0) == 0x80)
            n--;
    if (n)
        memcpy(out + 2, reason, n);
    return 2 + n;
}

static int ws_lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

int ws_token_list_has(const char *v, size_t n, const char *tok)
{
    size_t tl = strlen(tok);
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t s = i;
        while (i < n && v[i] != ',')
            i++;
        size_t e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        if (e - s == tl) {
            size_t k = 0;
            while (k < tl && ws_lower((unsigned char)v[s + k]) == ws_lower((unsigned char)tok[k]))
                k++;
            if (k == tl)
                return 1;
        }
    }
    return 0;
}

static int ws_b64_value(int c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* A key is the base64 of 16 bytes (4.2.1 item 5): 22 characters whose last carries 2 bits (its
 * low 4 bits zero), then "==". */
static int ws_key_shape_ok(const char *key, size_t n)
{
    if (n != 24 || key[22] != '=' || key[23] != '=')
        return 0;
    for (size_t i = 0; i < 22; i++)
        if (ws_b64_value((unsigned char)key[i]) < 0)
            return 0;
    return (ws_b64_value((unsigned char)key[21]) & 0x0F) == 0;
}

int ws_handshake_check(const struct ws_handshake *h, const char **why)
{
    const char *w = NULL;
    int status = 0;
    if (!h->is_get)
        w = "a WebSocket handshake must be a GET", status = 400;
    else if (h->minor_version < 1)
        w = "a WebSocket handshake needs HTTP/1.1", status = 400;
    else if (!h->upgrade_websocket)
        w = "Upgrade does not name websocket", status = 400;
    else if (!h->connection_upgrade)
        w = "Connection does not list upgrade", status = 400;
    else if (!h->version || h->version_len != 2 || memcmp(h->version, "13", 2) != 0)
        w = "unsupported Sec-WebSocket-Version (13 is)", status = 426;
    else if (!h->key || !ws_key_shape_ok(h->key, h->key_len))
        w = "bad Sec-WebSocket-Key", status = 400;
    if (why)
        *why = w;
    return status;
}

int ws_accept(const char *key, size_t key_len, char out[WS_ACCEPT_LEN])
{
    static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    if (!ws_key_shape_ok(key, key_len))
        return -EINVAL;
    unsigned char in[24 + sizeof(guid) - 1];
    memcpy(in, key, 24);
    memcpy(in + 24, guid, sizeof(guid) - 1);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdlen = 0;
    if (EVP_Digest(in, sizeof(in), md, &mdlen, EVP_sha1(), NULL) != 1 || mdlen != 20)
        return -EIO;
    unsigned char b64[WS_ACCEPT_LEN + 1];
    if (EVP_EncodeBlock(b64, md, 20) != WS_ACCEPT_LEN)
        return -EIO;
    memcpy(out, b64, WS_ACCEPT_LEN);
    return 0;
}

/* ---- permessage-deflate (RFC 7692) ----
 * Negotiation follows 7.1: the server takes the first acceptable offer and answers it alone.
 * Inflating is bounded by the reader's max_message: the output buffer grows by doubling but never
 * past max_message + 1 bytes, and a message that fills it fails with 1009 before zlib is asked
 * for more. Compressing uses a sync flush per message (7.2.1) and the negotiated window; with
 * server_no_context_takeover the compressor is reset after each message, and with
 * client_no_context_takeover the inflater too (a client that promised it and still refers back
 * fails with 1007 rather than being decoded by luck). A sender may end its deflate stream with a
 * BFINAL block (7.2.3.4): what follows in that message, the appended tail included, is ignored
 * as zlib ignores data after a stream's end, and the next message starts a fresh stream. */

static int ws_lower_eq(const char *a, size_t n, const char *lit)
{
    size_t k = strlen(lit);
    if (n != k)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (ws_lower((unsigned char)a[i]) != lit[i])
            return 0;
    return 1;
}

static void ws_trim(const char *v, size_t *s, size_t *e)
{
    while (*s < *e && (v[*s] == ' ' || v[*s] == '\t'))
        (*s)++;
    while (*e > *s && (v[*e - 1] == ' ' || v[*e - 1] == '\t'))
        (*e)--;
}

/* The end of the item starting at i, at the first sep outside a quoted string (or n). */
static size_t ws_item_end(const char *v, size_t i, size_t n, char sep)
{
    int quoted = 0;
    for (; i < n; i++) {
        if (v[i] == '"')
            quoted = !quoted;
        else if (v[i] == sep && !quoted)
            break;
    }
    return i;
}

/* A window-bits value: 8..15 in decimal without a leading zero, or -1. */
static int ws_window_bits(const char *v, size_t n)
{
    if (n == 1 && v[0] >= '8' && v[0] <= '9')
        return v[0] - '0';
    if (n == 2 && v[0] == '1' && v[1] >= '0' && v[1] <= '5')
        return 10 + v[1] - '0';
    return -1;
}

/* One offer, v[s..e) after its name. 1 and *p filled when the server accepts it, else 0. */
static int ws_pmd_offer(const char *v, size_t s, size_t e, struct ws_pmd_params *p)
{
    int seen_snct = 0, seen_cnct = 0, seen_smwb = 0, seen_cmwb = 0;
    memset(p, 0, sizeof(*p));
    p->server_max_window_bits = 15;
    while (s < e) {
        s++; /* the ';' */
        size_t pe = ws_item_end(v, s, e, ';');
        size_t ks = s, ke = pe, vs = 0, ve = 0;
        int has_value = 0;
        for (size_t i = s; i < pe; i++)
            if (v[i] == '=') {
                ke = i, vs = i + 1, ve = pe, has_value = 1;
                break;
            }
        ws_trim(v, &ks, &ke);
        if (has_value) {
            ws_trim(v, &vs, &ve);
            if (ve - vs >= 2 && v[vs] == '"' && v[ve - 1] == '"')
                vs++, ve--;
        }
        s = pe;
        if (ws_lower_eq(v + ks, ke - ks, "server_no_context_takeover")) {
            if (seen_snct++ || has_value)
                return 0;
            p->server_no_context_takeover = 1;
        } else if (ws_lower_eq(v + ks, ke - ks, "client_no_context_takeover")) {
            if (seen_cnct++ || has_value)
                return 0;
            p->client_no_context_takeover = 1;
        } else if (ws_lower_eq(v + ks, ke - ks, "server_max_window_bits")) {
            int bits = has_value ? ws_window_bits(v + vs, ve - vs) : -1;
            if (seen_smwb++ || bits < 0)
                return 0;
            if (bits == 8)
                return 0; /* zlib deflates raw data with a window of 9 at least */
            p->server_max_window_bits = bits;
        } else if (ws_lower_eq(v + ks, ke - ks, "client_max_window_bits")) {
            if (seen_cmwb++ || (has_value && ws_window_bits(v + vs, ve - vs) < 0))
                return 0;
        } else {
            return 0; /* a parameter this server does not know */
        }
    }
    return 1;
}

size_t ws_pmd_negotiate(const char *v, size_t n, struct ws_pmd_params *p,
                        char out[WS_PMD_RESPONSE_MAX])
{
    size_t i = 0;
    while (i < n) {
        size_t e = ws_item_end(v, i, n, ',');
        size_t ne = ws_item_end(v, i, e, ';');
        size_t ns = i, nend = ne;
        ws_trim(v, &ns, &nend);
        i = e < n ? e + 1 : n;
        if (!ws_lower_eq(v + ns, nend - ns, "permessage-deflate"))
            continue;
        if (!ws_pmd_offer(v, ne, e, p))
            continue;
        return ws_pmd_response(p, out);
    }
    return 0;
}

size_t ws_pmd_response(const struct ws_pmd_params *p, char out[WS_PMD_RESPONSE_MAX])
{
    int len = snprintf(out, WS_PMD_RESPONSE_MAX, "permessage-deflate%s%s",
                       p->server_no_context_takeover ? "; server_no_context_takeover" : "",
                       p->client_no_context_takeover ? "; client_no_context_takeover" : "");
    if (p->server_max_window_bits != 15)
        len += snprintf(out + len, WS_PMD_RESPONSE_MAX - (size_t)len, "; server_max_window_bits=%d",
                        p->server_max_window_bits);
    return (size_t)len;
}

void ws_pmd_init(struct ws_pmd *z, const struct ws_pmd_params *p)
{
    memset(z, 0, sizeof(*z));
    z->p = *p;
}

void ws_pmd_free(struct ws_pmd *z)
{
    if (z->in) {
        inflateEnd(z->in);
        free(z->in);
    }
    if (z->out) {
        deflateEnd(z->out);
        free(z->out);
    }
    z->in = z->out = NULL;
}

static int ws_pmd_fail(struct ws_reader *r, int code, const char *why)
{
    r->error = code;
    r->error_text = why;
    return -1;
}

/* Inflate in[0..n) onto out within the reader's bound, validating text as it comes. */
static int ws_pmd_run(struct ws_pmd *z, struct ws_reader *r, const unsigned char *in, size_t n,
                      struct ws_buf *out, int text)
{
    z_stream *s = z->in;
    if (z->ended)
        return 0;
    uint64_t limit = r->max_message ? r->max_message + 1 : (uint64_t)SIZE_MAX;
    for (;;) {
        if (s->avail_in == 0 && n) {
            size_t take = n > (1u << 30) ? (1u << 30) : n;
            s->next_in = (Bytef *)in;
            s->avail_in = (uInt)take;
            in += take;
            n -= take;
        }
        if (out->len == out->cap) {
            if (out->len >= limit)
                return ws_pmd_fail(r, WS_CLOSE_TOO_BIG, "message inflates past the maximum");
            uint64_t want = out->cap ? (uint64_t)out->cap * 2 : 4096;
            if (want > limit)
                want = limit;
            char *np = realloc(out->ptr, (size_t)want);
            if (!np)
                return ws_pmd_fail(r, WS_CLOSE_INTERNAL, "out of memory inflating a message");
            out->ptr = np;
            out->cap = (size_t)want;
        }
        size_t room = out->cap - out->len;
        if (room > (1u << 30))
            room = 1u << 30;
        s->next_out = (Bytef *)out->ptr + out->len;
        s->avail_out = (uInt)room;
        int zr = inflate(s, Z_SYNC_FLUSH);
        size_t got = room - s->avail_out;
        if (got && text && ws_utf8_feed(&r->utf8, (const unsigned char *)out->ptr + out->len, got))
            return ws_pmd_fail(r, WS_CLOSE_INVALID_DATA, "text message is not UTF-8");
        out->len += got;
        if (r->max_message && out->len > r->max_message)
            return ws_pmd_fail(r, WS_CLOSE_TOO_BIG, "message inflates past the maximum");
        if (zr == Z_STREAM_END) {
            /* The sender ended its stream (BFINAL): the next message starts a new one. */
            inflateReset(s);
            s->avail_in = 0;
            z->ended = 1;
            return 0;
        }
        if (zr == Z_MEM_ERROR)
            return ws_pmd_fail(r, WS_CLOSE_INTERNAL, "out of memory inflating a message");
        if (zr != Z_OK && zr != Z_BUF_ERROR)
            return ws_pmd_fail(r, WS_CLOSE_INVALID_DATA, "bad deflate data");
        /* Done once every input byte is in and zlib left output room unused: with a sync
         * flush it has then written all it can. */
        if (s->avail_in == 0 && n == 0 && (s->avail_out > 0 || zr == Z_BUF_ERROR))
            return 0;
    }
}

int ws_pmd_inflate(struct ws_pmd *z, struct ws_reader *r, const struct ws_frame *f,
                   struct ws_buf *out)
{
    static const unsigned char tail[4] = {0x00, 0x00, 0xFF, 0xFF};
    if (!z->in) {
        z_stream *s = calloc(1, sizeof(*s));
        if (!s || inflateInit2(s, -15) != Z_OK) {
            free(s);
            return ws_pmd_fail(r, WS_CLOSE_INTERNAL, "out of memory for an inflater");
        }
        z->in = s;
    }
    if (f->first)
        out->len = 0;
    int text = f->opcode == WS_OP_TEXT;
    if (f->len && ws_pmd_run(z, r, (const unsigned char *)f->payload, (size_t)f->len, out, text))
        return -1;
    if (!f->fin)
        return 0;
    if (ws_pmd_run(z, r, tail, sizeof(tail), out, text))
        return -1;
    z->ended = 0;
    if (text && r->utf8)
        return ws_pmd_fail(r, WS_CLOSE_INVALID_DATA, "text message ends inside a character");
    if (z->p.client_no_context_takeover)
        inflateReset(z->in);
    return 0;
}

int ws_pmd_deflate(struct ws_pmd *z, const char *p, size_t n, struct ws_buf *out)
{
    if (n > (1u << 30))
        return -EINVAL;
    if (!z->out) {
        z_stream *s = calloc(1, sizeof(*s));
        if (!s)
            return -ENOMEM;
        int bits = z->p.server_max_window_bits ? z->p.server_max_window_bits : 15;
        int level = z->mem_level ? z->mem_level : 8;
        if (deflateInit2(s, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -bits, level, Z_DEFAULT_STRATEGY) !=
            Z_OK) {
            free(s);
            return -ENOMEM;
        }
        z->out = s;
    }
    z_stream *s = z->out;
    out->len = 0;
    s->next_in = (Bytef *)p;
    s->avail_in = (uInt)n;
    for (;;) {
        if (out->cap - out->len < 64) {
            size_t want = out->cap * 2 > n / 2 + 128 ? out->cap * 2 : n / 2 + 128;
            char *np = realloc(out->ptr, want);
            if (!np)
                return -ENOMEM;
            out->ptr = np;
            out->cap = want;
        }
        size_t room = out->cap - out->len;
        s->next_out = (Bytef *)out->ptr + out->len;
        s->avail_out = (uInt)room;
        int zr = deflate(s, Z_SYNC_FLUSH);
        out->len += room - s->avail_out;
        if (zr != Z_OK && zr != Z_BUF_ERROR)
            return -EIO;
        if (s->avail_in == 0 && s->avail_out > 0)
            break;
    }
    if (out->len >= 4 && memcmp(out->ptr + out->len - 4, "\x00\x00\xff\xff", 4) == 0)
        out->len -= 4;
    if (z->p.server_no_context_takeover)
        deflateReset(s);
    return 0;
}
