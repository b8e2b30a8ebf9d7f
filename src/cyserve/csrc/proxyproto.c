/* proxyproto.c: the PROXY protocol header parser (see proxyproto.h).
 *
 * Design
 * ------
 * Strict, because the header decides who the server believes the client is: whatever is not
 * exactly what the specification (haproxy's doc/proxy-protocol.txt) allows is refused, and the
 * connection is closed without an answer (the peer is a load balancer that got its own protocol
 * wrong, not a client to explain things to).
 *
 * Version 1: "PROXY" SP family SP src SP dst SP sport SP dport CRLF, family TCP4 or TCP6, one
 * space between fields, addresses as inet_pton reads them for that family (so no IPv6 address
 * on a TCP4 line, no leading zeros in an IPv4 octet), ports decimal 0..65535 without leading
 * zeros, the whole line at most 107 bytes. "PROXY UNKNOWN" followed by anything up to CRLF is
 * allowed and names no client (the proxy could not tell).
 *
 * Version 2: the 12-byte signature, then the version (2) and command (LOCAL 0, PROXY 1) in one
 * byte, the family and transport in one byte, and the length of what follows (big-endian). The
 * address block must fit that length (TCP over IPv4 12 bytes, over IPv6 36, Unix 216); the rest
 * are TLVs, each type, length, value, which must tile it exactly (their meaning is not used:
 * ALPN, the authority, AWS's VPC endpoint id). Datagram transports are refused: this is a stream
 * server. LOCAL (the proxy's own health check) and the unspecified family name no client.
 *
 * Partial input: the parser reads from the start each time (a header is at most PROXYPROTO_MAX
 * bytes, so there is nothing to keep between calls) and answers -2 only while what it has is a
 * prefix of a header it would accept, so that a stream that can never become one is refused as
 * soon as it shows, not after a timeout. tests/c/test_proxyproto.c feeds every conformance case
 * (tests/http/proxyproto/) whole and split at every byte, and checks that.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "proxyproto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static const char pp_v2_sig[12] = {0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D,
                                   0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A};

/* A decimal port without leading zeros, s[0..n): its value, or -1. */
static int pp_port(const char *s, size_t n)
{
    if (n == 0 || n > 5 || (n > 1 && s[0] == '0'))
        return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v <= 65535 ? v : -1;
}

/* An address of family af, s[0..n), into out. 0 or -1. */
static int pp_addr(int af, const char *s, size_t n, uint8_t *out)
{
    char tmp[64];
    if (n == 0 || n >= sizeof(tmp))
        return -1;
    /* inet_pton would stop at a NUL and take what comes before it. */
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') ||
              (s[i] >= 'A' && s[i] <= 'F') || s[i] == '.' || s[i] == ':'))
            return -1;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    return inet_pton(af, tmp, out) == 1 ? 0 : -1;
}

/* Could s[0..n) begin a version 1 line after "PROXY " (n counts from there)? Only the
 * characters a valid line may hold, in at most 107 bytes: a cheap prefix test, the full one is
 * made on the whole line. */
static int pp_v1_prefix_ok(const char *s, size_t n)
{
    static const char *const fams[] = {"TCP4 ", "TCP6 ", "UNKNOWN"};
    int fam_ok = 0;
    for (unsigned i = 0; i < 3; i++) {
        size_t fl = strlen(fams[i]);
        size_t k = n < fl ? n : fl;
        if (memcmp(s, fams[i], k) == 0)
            fam_ok = 1;
    }
    if (!fam_ok)
        return 0;
    if (n >= 7 && memcmp(s, "UNKNOWN", 7) == 0)
        return 1; /* anything may follow UNKNOWN up to the CRLF */
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'Z') ||
              ch == '.' || ch == ':' || ch == ' ' || ch == '\r'))
            return 0;
        if (ch == '\r' && i + 1 < n) /* the CR is the end, and a LF must follow it */
            return 0;
    }
    return 1;
}

static int pp_v1(const char *buf, size_t len, struct proxyproto_hdr *out)
{
    const char *end = memchr(buf, '\n', len < PROXYPROTO_V1_MAX ? len : PROXYPROTO_V1_MAX);
    if (!end) {
        if (len >= PROXYPROTO_V1_MAX)
            return -1;
        return pp_v1_prefix_ok(buf + 6, len > 6 ? len - 6 : 0) ? -2 : -1;
    }
    size_t line = (size_t)(end - buf) + 1; /* with the CRLF */
    if (line < 8 || end[-1] != '\r')
        return -1;
    const char *p = buf + 6, *stop = end - 1; /* the fields, up to the CR */
    memset(out, 0, sizeof(*out));
    out->version = 1;
    if ((size_t)(stop - p) >= 7 && memcmp(p, "UNKNOWN", 7) == 0 && (stop - p == 7 || p[7] == ' ')) {
        /* The proxy could not tell: what follows is not read. */
        for (const char *q = p; q < stop; q++)
            if (*q == '\r' || *q == '\n' || *q == 0)
                return -1;
        out->family = AF_UNSPEC;
        return (int)line;
    }
    int af;
    if ((size_t)(stop - p) > 5 && memcmp(p, "TCP4 ", 5) == 0)
        af = AF_INET;
    else if ((size_t)(stop - p) > 5 && memcmp(p, "TCP6 ", 5) == 0)
        af = AF_INET6;
    else
        return -1;
    p += 5;
    /* Four fields, separated by single spaces. */
    const char *f[4];
    size_t fl[4];
    for (int i = 0; i < 4; i++) {
        const char *sp = i < 3 ? memchr(p, ' ', (size_t)(stop - p)) : stop;
        if (!sp)
            return -1;
        f[i] = p;
        fl[i] = (size_t)(sp - p);
        p = sp + 1;
    }
    if (p != stop + 1)
        return -1;
    int sport = pp_port(f[2], fl[2]), dport = pp_port(f[3], fl[3]);
    if (pp_addr(af, f[0], fl[0], out->src) || pp_addr(af, f[1], fl[1], out->dst) || sport < 0 ||
        dport < 0)
        return -1;
    out->family = af;
    out->src_port = htons((uint16_t)sport);
    out->dst_port = htons((uint16_t)dport);
    return (int)line;
}

static int pp_v2(const unsigned char *b, size_t len, struct proxyproto_hdr *out)
{
    if (len < 16) {
        /* The fixed part so far: the version nibble, and (with its byte) a known family. */
        if (len > 12 && (b[12] >> 4) != 2)
            return -1;
        if (len > 12 && (b[12] & 0x0F) > 1)
            return -1;
        return -2;
    }
    if ((b[12] >> 4) != 2 || (b[12] & 0x0F) > 1)
        return -1;
    size_t rest = ((size_t)b[14] << 8) | b[15];
    if (16 + rest > PROXYPROTO_MAX)
        return -1;
    unsigned fam = b[13];
    size_t need;
    switch (fam) {
    case 0x00: /* unspecified */
        need = 0;
        break;
    case 0x11: /* TCP over IPv4 */
        need = 12;
        break;
    case 0x21: /* TCP over IPv6 */
        need = 36;
        break;
    case 0x31: /* Unix stream */
        need = 216;
        break;
    default: /* datagrams, and families the specification does not define */
        return -1;
    }
    if (rest < need)
        return -1;
    if (len < 16 + rest)
        return -2;
    /* The TLVs must tile what follows the addresses. */
    size_t at = 16 + need, endp = 16 + rest;
    while (at < endp) {
        if (endp - at < 3)
            return -1;
        size_t tl = ((size_t)b[at + 1] << 8) | b[at + 2];
        if (tl > endp - at - 3)
            return -1;
        at += 3 + tl;
    }
    memset(out, 0, sizeof(*out));
    out->version = 2;
    out->family = AF_UNSPEC;
    if ((b[12] & 0x0F) == 1 && fam == 0x11) {
        out->family = AF_INET;
        memcpy(out->src, b + 16, 4);
        memcpy(out->dst, b + 20, 4);
        memcpy(&out->src_port, b + 24, 2);
        memcpy(&out->dst_port, b + 26, 2);
    } else if ((b[12] & 0x0F) == 1 && fam == 0x21) {
        out->family = AF_INET6;
        memcpy(out->src, b + 16, 16);
        memcpy(out->dst, b + 32, 16);
        memcpy(&out->src_port, b + 48, 2);
        memcpy(&out->dst_port, b + 50, 2);
    }
    return (int)(16 + rest);
}

int proxyproto_parse(const char *buf, size_t len, struct proxyproto_hdr *out)
{
    if (len == 0)
        return -2;
    if ((unsigned char)buf[0] == 0x0D) {
        size_t k = len < sizeof(pp_v2_sig) ? len : sizeof(pp_v2_sig);
        if (memcmp(buf, pp_v2_sig, k) != 0)
            return -1;
        if (len < sizeof(pp_v2_sig))
            return -2;
        return pp_v2((const unsigned char *)buf, len, out);
    }
    size_t k = len < 6 ? len : 6;
    if (memcmp(buf, "PROXY ", k) != 0)
        return -1;
    if (len < 6)
        return -2;
    return pp_v1(buf, len, out);
}

int proxyproto_client(const struct proxyproto_hdr *h, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN];
    if (h->family != AF_INET && h->family != AF_INET6)
        return -EINVAL;
    if (!inet_ntop(h->family, h->src, host, sizeof(host)))
        return -EINVAL;
    int n = snprintf(out, cap, h->family == AF_INET6 ? "[%s]:%u" : "%s:%u", host,
                     (unsigned)ntohs(h->src_port));
    return n < 0 || (size_t)n >= cap ? -EINVAL : 0;
}
