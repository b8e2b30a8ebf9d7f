/* proxy.c: the client and scheme behind a trusted proxy (see proxy.h).
 *
 * Design. A proxy in front of the server connects from its own address, so the socket's peer
 * is the proxy, not the client; the proxy says who the client was in a header. Anyone can send
 * such a header, so it is believed only from the peers the operator lists (uvicorn's and
 * gunicorn's --forwarded-allow-ips, default 127.0.0.1). Each proxy on the way appends the
 * address it received the request from, so the list reads client, proxy1, proxy2...; its right
 * end was written by the proxy nearest to us. The client is therefore the rightmost hop that is
 * not itself a trusted proxy: anything to its left was written by the client or its side and
 * cannot be believed. When every hop is trusted, the leftmost is the best there is; with "*"
 * (trust every peer, for a server reachable only through proxies) the leftmost is taken, as
 * uvicorn does. Only an IP address is taken as a client: the value ends up in the access log
 * and in the application's REMOTE_ADDR, and what it may contain there is kept to an address
 * that inet_ntop formats. RFC 7239 Forwarded carries for= and proto= per hop; the element of
 * the chosen hop gives both (and its host=, below). Which family of headers is read is the operator's choice
 * (proxy_trust.forwarded), never decided by which fields are present: a proxy passes through
 * whatever its configuration does not write, so a header of the other family can only have
 * come from the client. The forwarded port is not used (X-Forwarded-For has none): the
 * client is "host:0", as uvicorn's ("host", 0).
 *
 * The host the client asked for (X-Forwarded-Host, Forwarded's host=) is read only when the
 * operator says so (--forwarded-host, proxy_trust.host), as werkzeug's ProxyFix reads it only
 * with x_host: a proxy that does not set the field passes the client's own through, and a
 * trusted peer would then vouch for a Host the client chose. Its element is chosen as the
 * scheme's is, and it must be what a Host field may be (http_host_ok), since it replaces the
 * request's Host for the application.
 *
 * Only the request's own header views are read: no allocation, no copy beyond the formatted
 * address. The engine calls proxy_resolve lazily, once per request, and only with proxy headers
 * on (request.c). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "http_parse.h"

/* Hops looked at, from the right: a longer list is someone's padding, and what decides is at
 * its right end. */
#define PROXY_MAX_HOPS 32

struct proxy_hop {
    int family; /* 0: not an IP address */
    uint8_t addr[16];
    const char *proto; /* Forwarded's proto= of this hop, or NULL */
    size_t proto_len;
    const char *host; /* Forwarded's host= of this hop, or NULL */
    size_t host_len;
};

static int parse_ip(const char *s, size_t len, int *family, uint8_t addr[16])
{
    char buf[INET6_ADDRSTRLEN + 1];
    if (len == 0 || len >= sizeof(buf))
        return -EINVAL;
    memcpy(buf, s, len);
    buf[len] = 0;
    if (inet_pton(AF_INET, buf, addr) == 1) {
        *family = AF_INET;
        return 0;
    }
    if (inet_pton(AF_INET6, buf, addr) == 1) {
        *family = AF_INET6;
        return 0;
    }
    return -EINVAL;
}

static void trim(const char **s, size_t *len)
{
    while (*len && (**s == ' ' || **s == '\t')) {
        (*s)++;
        (*len)--;
    }
    while (*len && ((*s)[*len - 1] == ' ' || (*s)[*len - 1] == '\t'))
        (*len)--;
}

int proxy_trust_parse(struct proxy_trust *t, const char *spec)
{
    memset(t, 0, sizeof(*t));
    size_t cap = 1;
    for (const char *p = spec; *p; p++)
        cap += *p == ',';
    struct proxy_net *nets = calloc(cap, sizeof(*nets));
    if (!nets)
        return -ENOMEM;
    unsigned n = 0;
    int all = 0;
    const char *p = spec;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *item = p;
        trim(&item, &len);
        if (len == 1 && item[0] == '*') {
            all = 1;
        } else if (len) {
            const char *slash = memchr(item, '/', len);
            size_t alen = slash ? (size_t)(slash - item) : len;
            struct proxy_net *net = &nets[n];
            if (parse_ip(item, alen, &net->family, net->addr) < 0)
                goto bad;
            unsigned max = net->family == AF_INET ? 32 : 128;
            net->bits = max;
            if (slash) {
                const char *d = slash + 1;
                size_t dlen = len - alen - 1;
                if (dlen == 0 || dlen > 3)
                    goto bad;
                unsigned bits = 0;
                for (size_t i = 0; i < dlen; i++) {
                    if (d[i] < '0' || d[i] > '9')
                        goto bad;
                    bits = bits * 10 + (unsigned)(d[i] - '0');
                }
                if (bits > max)
                    goto bad;
                net->bits = bits;
            }
            n++;
        } else if (end || p != spec) {
            goto bad; /* an empty item between commas */
        }
        if (!end)
            break;
        p = end + 1;
    }
    if (!n && !all)
        goto bad; /* nothing listed */
    t->all = all;
    t->n = n;
    t->nets = nets;
    return 0;
bad:
    free(nets);
    return -EINVAL;
}

void proxy_trust_free(struct proxy_trust *t)
{
    free(t->nets);
    memset(t, 0, sizeof(*t));
}

static int prefix_match(const uint8_t *a, const uint8_t *b, unsigned bits)
{
    unsigned whole = bits / 8, rest = bits % 8;
    if (memcmp(a, b, whole) != 0)
        return 0;
    if (!rest)
        return 1;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

/* Whether address addr of family is in the list; an IPv4-mapped IPv6 address (a dual-stack
 * socket's view of an IPv4 peer) is matched as the IPv4 address it is. */
static int trusted_addr(const struct proxy_trust *t, int family, const uint8_t *addr)
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (t->all)
        return 1;
    if (family == AF_INET6 && memcmp(addr, mapped, 12) == 0) {
        family = AF_INET;
        addr += 12;
    }
    for (unsigned i = 0; i < t->n; i++)
        if (t->nets[i].family == family && prefix_match(t->nets[i].addr, addr, t->nets[i].bits))
            return 1;
    return 0;
}

int proxy_trusted_peer(const struct proxy_trust *t, const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return trusted_addr(t, AF_INET,
                            (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr);
    if (sa->sa_family == AF_INET6)
        return trusted_addr(t, AF_INET6,
                            (const uint8_t *)&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return sa->sa_family == AF_UNIX;
}

/* Add hop s[0..len) of X-Forwarded-For (an address, maybe "[v6]" or "v4:port") as the
 * (*total)th hop: hops is a ring of the PROXY_MAX_HOPS rightmost ones (hops_settle puts them
 * in order), so a list of any length costs one pass. Returns the hop's slot. */
static struct proxy_hop *add_hop(struct proxy_hop *hops, unsigned *total, const char *s, size_t len)
{
    struct proxy_hop *h = &hops[(*total)++ % PROXY_MAX_HOPS];
    memset(h, 0, sizeof(*h));
    trim(&s, &len);
    if (len >= 2 && s[0] == '"' && s[len - 1] == '"') {
        s++;
        len -= 2;
    }
    if (len && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close)
            return h;
        s++;
        len = (size_t)(close - s);
    } else {
        const char *colon = memchr(s, ':', len);
        if (colon && !memchr(colon + 1, ':', len - (size_t)(colon - s) - 1))
            len = (size_t)(colon - s); /* v4:port */
    }
    if (parse_ip(s, len, &h->family, h->addr) < 0)
        h->family = 0;
    return h;
}

/* After total add_hop calls: the kept hops in order, leftmost first; *dropped says how many
 * were cut off on the left. Returns how many are kept. */
static unsigned hops_settle(struct proxy_hop *hops, unsigned total, unsigned *dropped)
{
    if (total <= PROXY_MAX_HOPS) {
        *dropped = 0;
        return total;
    }
    struct proxy_hop tmp[PROXY_MAX_HOPS];
    unsigned first = total % PROXY_MAX_HOPS; /* the oldest kept hop's slot */
    for (unsigned i = 0; i < PROXY_MAX_HOPS; i++)
        tmp[i] = hops[(first + i) % PROXY_MAX_HOPS];
    memcpy(hops, tmp, sizeof(tmp));
    *dropped = total - PROXY_MAX_HOPS;
    return PROXY_MAX_HOPS;
}

/* The hops of every X-Forwarded-For field (several fields read as one list, in order). */
static unsigned xff_hops(const struct http_request *r, struct proxy_hop *hops, unsigned *dropped)
{
    unsigned total = 0;
    for (size_t i = 0; i < r->num_headers; i++) {
        const struct http_header *f = &r->headers[i];
        if (f->name_len != 15 || strncasecmp(f->name, "x-forwarded-for", 15) != 0)
            continue;
        const char *p = f->value, *end = f->value + f->value_len;
        while (p <= end) {
            const char *comma = memchr(p, ',', (size_t)(end - p));
            const char *stop = comma ? comma : end;
            add_hop(hops, &total, p, (size_t)(stop - p));
            p = stop + 1;
        }
    }
    return hops_settle(hops, total, dropped);
}

/* The hops of every Forwarded field: per element, its for= and proto=. */
static unsigned forwarded_hops(const struct http_request *r, struct proxy_hop *hops,
                               unsigned *dropped)
{
    unsigned total = 0;
    for (size_t i = 0; i < r->num_headers; i++) {
        const struct http_header *f = &r->headers[i];
        if (f->name_len != 9 || strncasecmp(f->name, "forwarded", 9) != 0)
            continue;
        const char *p = f->value, *end = f->value + f->value_len;
        while (p <= end) {
            const char *comma = memchr(p, ',', (size_t)(end - p));
            const char *stop = comma ? comma : end;
            const char *proto = NULL, *host = NULL;
            size_t proto_len = 0, host_len = 0;
            const char *forv = NULL;
            size_t for_len = 0;
            const char *q = p;
            while (q < stop) {
                const char *semi = memchr(q, ';', (size_t)(stop - q));
                const char *pend = semi ? semi : stop;
                const char *pair = q;
                size_t plen = (size_t)(pend - q);
                trim(&pair, &plen);
                const char *eq = memchr(pair, '=', plen);
                if (eq) {
                    size_t klen = (size_t)(eq - pair);
                    const char *v = eq + 1;
                    size_t vlen = plen - klen - 1;
                    if (klen == 3 && strncasecmp(pair, "for", 3) == 0) {
                        forv = v;
                        for_len = vlen;
                    } else if (klen == 5 && strncasecmp(pair, "proto", 5) == 0) {
                        if (vlen >= 2 && v[0] == '"' && v[vlen - 1] == '"') {
                            v++;
                            vlen -= 2;
                        }
                        proto = v;
                        proto_len = vlen;
                    } else if (klen == 4 && strncasecmp(pair, "host", 4) == 0) {
                        host = v; /* unquoted by host_of */
                        host_len = vlen;
                    }
                }
                q = pend + 1;
            }
            struct proxy_hop *h = add_hop(hops, &total, forv ? forv : "", forv ? for_len : 0);
            h->proto = proto;
            h->proto_len = proto_len;
            h->host = host;
            h->host_len = host_len;
            p = stop + 1;
        }
    }
    return hops_settle(hops, total, dropped);
}

/* "http" or "https" for value s[0..len) (any case, spaces around), or NULL. */
static const char *scheme_of(const char *s, size_t len)
{
    trim(&s, &len);
    if (len == 4 && strncasecmp(s, "http", 4) == 0)
        return "http";
    if (len == 5 && strncasecmp(s, "https", 5) == 0)
        return "https";
    return NULL;
}

/* Value s[0..len) as a Host (spaces and one pair of quotes around it removed) into *host,
 * *host_len, when it is a non-empty uri-host [":" port]; else they are left alone. */
static void host_of(const char *s, size_t len, const char **host, size_t *host_len)
{
    trim(&s, &len);
    if (len >= 2 && s[0] == '"' && s[len - 1] == '"') {
        s++;
        len -= 2;
    }
    if (len && http_host_ok(s, len)) {
        *host = s;
        *host_len = len;
    }
}

static const struct proxy_hop *choose(const struct proxy_trust *t, const struct proxy_hop *hops,
                                      unsigned n, unsigned dropped)
{
    if (!n)
        return NULL;
    if (t->all)
        return dropped ? NULL : &hops[0]; /* the leftmost was cut off: believe none */
    for (unsigned i = n; i-- > 0;)
        if (!hops[i].family || !trusted_addr(t, hops[i].family, hops[i].addr))
            return &hops[i];
    return dropped ? NULL : &hops[0];
}

static void format_client(const struct proxy_hop *h, char *client)
{
    char text[INET6_ADDRSTRLEN];
    client[0] = 0;
    if (!h || !h->family || !inet_ntop(h->family, h->addr, text, sizeof(text)))
        return;
    snprintf(client, PROXY_CLIENT_MAX, h->family == AF_INET6 ? "[%s]:0" : "%s:0", text);
}

/* The elements of the fields named name (name_len bytes: X-Forwarded-Proto, -Host), every
 * field read as one list: how many there are, and in *at the one at index want (counted from
 * the left; none when out of range). */
static unsigned xf_elements(const struct http_request *r, const char *name, size_t name_len,
                            unsigned want, const char **at, size_t *at_len)
{
    unsigned count = 0;
    for (size_t i = 0; i < r->num_headers; i++) {
        const struct http_header *f = &r->headers[i];
        if (f->name_len != name_len || strncasecmp(f->name, name, name_len) != 0)
            continue;
        const char *p = f->value, *end = f->value + f->value_len;
        while (p <= end) {
            const char *comma = memchr(p, ',', (size_t)(end - p));
            const char *stop = comma ? comma : end;
            if (count++ == want) {
                *at = p;
                *at_len = (size_t)(stop - p);
            }
            p = stop + 1;
        }
    }
    return count;
}

/* The element of X-Forwarded-name (X-Forwarded-Proto, -Host) that goes with the chosen hop h
 * of the n kept hops (dropped cut off on their left): where the field lists one element per
 * X-Forwarded-For hop (proxies that append to both), the hop's own; otherwise the last
 * element, which the nearest proxy wrote (a proxy that sets the field replaces the client's).
 * Never the first: that one the client controls. Returns 0 and sets *at, *at_len, or -ENOENT
 * when the field is absent. */
static int xf_element(const struct http_request *r, const char *name, size_t name_len,
                      const struct proxy_hop *hops, const struct proxy_hop *h, unsigned n,
                      unsigned dropped, const char **at, size_t *at_len)
{
    unsigned count = xf_elements(r, name, name_len, UINT_MAX, at, at_len);
    if (!count)
        return -ENOENT;
    unsigned want = count - 1;
    if (h && count == n + dropped)
        want = dropped + (unsigned)(h - hops);
    xf_elements(r, name, name_len, want, at, at_len);
    return 0;
}

void proxy_resolve(const struct proxy_trust *t, const struct http_request *r, char *client,
                   const char **scheme, const char **host, size_t *host_len)
{
    struct proxy_hop hops[PROXY_MAX_HOPS] = {0}; /* every kept hop is written; GCC cannot tell */
    unsigned dropped = 0;
    client[0] = 0;
    if (t->forwarded) {
        /* RFC 7239 alone: the operator said that is what the proxy writes. An X-Forwarded-*
         * field here came from the client (or a hop nobody vouches for) and is not read. */
        unsigned n = forwarded_hops(r, hops, &dropped);
        const struct proxy_hop *h = choose(t, hops, n, dropped);
        format_client(h, client);
        const char *s = h && h->proto ? scheme_of(h->proto, h->proto_len) : NULL;
        if (s)
            *scheme = s;
        if (t->host && h && h->host)
            host_of(h->host, h->host_len, host, host_len);
        return;
    }
    /* X-Forwarded-For/-Proto alone: a Forwarded field is the client's own, passed through by a
     * proxy that writes only these (nginx's usual configuration), and is not read. */
    unsigned n = xff_hops(r, hops, &dropped);
    const struct proxy_hop *h = choose(t, hops, n, dropped);
    format_client(h, client);
    const char *v = NULL;
    size_t vlen = 0;
    if (xf_element(r, "x-forwarded-proto", 17, hops, h, n, dropped, &v, &vlen) == 0) {
        const char *s = v ? scheme_of(v, vlen) : NULL;
        if (s)
            *scheme = s;
    }
    v = NULL;
    if (t->host && xf_element(r, "x-forwarded-host", 16, hops, h, n, dropped, &v, &vlen) == 0 && v)
        host_of(v, vlen, host, host_len);
}
