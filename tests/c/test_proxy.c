/* test_proxy.c: trusted peers and the client, scheme and host behind them (csrc/proxy.c): the
 * list's syntax, CIDR matching (IPv4-mapped peers included), X-Forwarded-For's rightmost
 * untrusted hop, X-Forwarded-Proto, X-Forwarded-Host, RFC 7239 Forwarded, and values that must
 * not be believed. */
#define _GNU_SOURCE
#include "csrc/http_parse.c"
#include "csrc/proxy.c"

#include <arpa/inet.h>
#include <sys/un.h>

#include "tap.h"

static struct http_header hdrs[8];

/* A request head with up to four header fields (name, value pairs; NULL ends). */
static struct http_request head(const char *n1, const char *v1, const char *n2, const char *v2)
{
    struct http_request r;
    memset(&r, 0, sizeof(r));
    const char *f[] = {n1, v1, n2, v2};
    size_t n = 0;
    for (int i = 0; i < 4 && f[i]; i += 2, n++)
        hdrs[n] = (struct http_header){f[i], strlen(f[i]), f[i + 1], strlen(f[i + 1])};
    r.headers = hdrs;
    r.num_headers = n;
    return r;
}

static void resolve_as(int forwarded, const char *trust, struct http_request r,
                       const char *want_client, const char *want_scheme, const char *what)
{
    struct proxy_trust t;
    char client[PROXY_CLIENT_MAX];
    const char *scheme = "http";
    if (proxy_trust_parse(&t, trust) != 0) {
        ok(0, "%s: trust list %s parses", what, trust);
        return;
    }
    t.forwarded = forwarded;
    proxy_resolve(&t, &r, client, &scheme, NULL, NULL);
    is_mem(client, strlen(client), want_client, what);
    is_mem(scheme, strlen(scheme), want_scheme, what);
    proxy_trust_free(&t);
}

/* Reading X-Forwarded-For/-Proto (the default), and reading RFC 7239 Forwarded. */
static void resolve(const char *trust, struct http_request r, const char *want_client,
                    const char *want_scheme, const char *what)
{
    resolve_as(0, trust, r, want_client, want_scheme, what);
}

static void resolve_fw(const char *trust, struct http_request r, const char *want_client,
                       const char *want_scheme, const char *what)
{
    resolve_as(1, trust, r, want_client, want_scheme, what);
}

static int peer4(const struct proxy_trust *t, const char *ip)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, ip, &sa.sin_addr);
    return proxy_trusted_peer(t, (struct sockaddr *)&sa);
}

static int peer6(const struct proxy_trust *t, const char *ip)
{
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, ip, &sa.sin6_addr);
    return proxy_trusted_peer(t, (struct sockaddr *)&sa);
}

static void test_trust_list(void)
{
    struct proxy_trust t;
    is_int(proxy_trust_parse(&t, "127.0.0.1, 10.0.0.0/8 ,::1,2001:db8::/32"), 0, "a list");
    is_int(t.n, 4, "four items");
    ok(peer4(&t, "127.0.0.1"), "an address");
    ok(!peer4(&t, "127.0.0.2"), "only that address");
    ok(peer4(&t, "10.200.3.4"), "inside a /8");
    ok(!peer4(&t, "11.0.0.1"), "outside it");
    ok(peer6(&t, "::1"), "IPv6 address");
    ok(peer6(&t, "2001:db8:ffff::5"), "inside an IPv6 /32");
    ok(!peer6(&t, "2001:db9::5"), "outside it");
    ok(peer6(&t, "::ffff:10.1.2.3"), "an IPv4-mapped peer matches as IPv4");
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    ok(proxy_trusted_peer(&t, (struct sockaddr *)&un), "a Unix socket's peer is trusted");
    proxy_trust_free(&t);

    is_int(proxy_trust_parse(&t, "192.168.1.0/23"), 0, "a prefix that is not on a byte");
    ok(peer4(&t, "192.168.0.9") && !peer4(&t, "192.168.2.1"), "/23 matched on its bits");
    proxy_trust_free(&t);
    is_int(proxy_trust_parse(&t, "*"), 0, "*");
    ok(t.all && peer4(&t, "8.8.8.8"), "* trusts every peer");
    proxy_trust_free(&t);

    const char *bad[] = {"",          "localhost",        "10.0.0.0/33", "::1/129",  "1.2.3.4/",
                         "1.2.3.4/x", "1.2.3.4,,5.6.7.8", "1.2.3.4,",    "300.1.1.1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        is_int(proxy_trust_parse(&t, bad[i]), -EINVAL, bad[i]);
}

static void test_x_forwarded(void)
{
    resolve("127.0.0.1", head("X-Forwarded-For", "203.0.113.7", NULL, NULL), "203.0.113.7:0",
            "http", "one hop");
    resolve("127.0.0.1, 10.0.0.0/8",
            head("x-forwarded-for", "1.1.1.1, 203.0.113.7, 10.0.0.5", NULL, NULL), "203.0.113.7:0",
            "http", "the rightmost untrusted hop; what the client wrote is not it");
    resolve("127.0.0.1", head("X-Forwarded-For", "10.0.0.1, 127.0.0.1", NULL, NULL), "10.0.0.1:0",
            "http", "a trusted proxy's own entry is skipped");
    resolve("127.0.0.1", head("X-Forwarded-For", "127.0.0.1, 127.0.0.1", NULL, NULL), "127.0.0.1:0",
            "http", "all trusted: the leftmost");
    resolve("*", head("X-Forwarded-For", "198.51.100.1, 203.0.113.7", NULL, NULL), "198.51.100.1:0",
            "http", "*: the leftmost");
    resolve("127.0.0.1", head("X-Forwarded-For", "2001:db8::7", NULL, NULL), "[2001:db8::7]:0",
            "http", "IPv6, formatted in brackets");
    resolve("127.0.0.1", head("X-Forwarded-For", "203.0.113.7:5555", NULL, NULL), "203.0.113.7:0",
            "http", "an IPv4 hop with a port");
    resolve("127.0.0.1", head("X-Forwarded-For", "evil\" - - [x", NULL, NULL), "", "http",
            "not an address: no client (the peer stays)");
    resolve("127.0.0.1", head("X-Forwarded-For", "203.0.113.7, garbage", NULL, NULL), "", "http",
            "the rightmost untrusted hop is garbage: no client, not the hop left of it");
    resolve("127.0.0.1", head("X-Forwarded-For", "", NULL, NULL), "", "http", "empty");
    resolve("127.0.0.1", head("X-Forwarded-For", "198.51.100.1", "X-Forwarded-For", "203.0.113.7"),
            "203.0.113.7:0", "http", "two fields read as one list");
    resolve("127.0.0.1", head("X-Forwarded-Proto", "https", NULL, NULL), "", "https",
            "X-Forwarded-Proto alone");
    resolve("127.0.0.1", head("X-Forwarded-Proto", " HTTPS ", NULL, NULL), "", "https",
            "any case, spaces around");
    resolve("127.0.0.1", head("X-Forwarded-Proto", "https, http", NULL, NULL), "", "http",
            "a list: the last, the nearest proxy's (the first is the client's to write)");
    resolve("127.0.0.1", head("X-Forwarded-Proto", "https", "X-Forwarded-Proto", "http"), "",
            "http", "the client's field, then the proxy's: the proxy's");
    resolve("127.0.0.1, 10.0.0.0/8",
            head("X-Forwarded-For", "203.0.113.7, 10.0.0.5", "X-Forwarded-Proto", "https, http"),
            "203.0.113.7:0", "https",
            "one element per hop: the chosen hop's, not the last (proxies that append to both)");
    resolve("127.0.0.1",
            head("X-Forwarded-For", "6.6.6.6, 203.0.113.7", "X-Forwarded-Proto", "https"),
            "203.0.113.7:0", "https", "lists that do not line up: the last element");
    resolve("127.0.0.1",
            head("Forwarded", "for=6.6.6.6;proto=https", "X-Forwarded-For", "203.0.113.7"),
            "203.0.113.7:0", "http",
            "a Forwarded field is the client's when the proxy writes X-Forwarded-*: ignored");
    resolve("127.0.0.1", head("X-Forwarded-Proto", "gopher", NULL, NULL), "", "http",
            "another scheme is not taken");
}

static void test_forwarded(void)
{
    resolve_fw("127.0.0.1",
               head("Forwarded", "for=192.0.2.60;proto=https;by=203.0.113.43", NULL, NULL),
               "192.0.2.60:0", "https", "RFC 7239's example");
    resolve_fw("127.0.0.1",
               head("Forwarded", "for=\"[2001:db8:cafe::17]:4711\";proto=https, for=127.0.0.1",
                    NULL, NULL),
               "[2001:db8:cafe::17]:0", "https", "quoted IPv6 with a port, behind a trusted hop");
    resolve_fw("127.0.0.1", head("Forwarded", "For=\"192.0.2.43:47011\"", NULL, NULL),
               "192.0.2.43:0", "http", "parameter names in any case, a quoted IPv4 with a port");
    resolve_fw("127.0.0.1", head("Forwarded", "for=unknown;proto=https", NULL, NULL), "", "https",
               "an unknown node: no client, the scheme all the same");
    resolve_fw("127.0.0.1", head("Forwarded", "for=192.0.2.1", "X-Forwarded-For", "198.51.100.9"),
               "192.0.2.1:0", "http",
               "X-Forwarded-For is the client's when the proxy writes Forwarded");
    resolve_fw("127.0.0.1", head("X-Forwarded-For", "198.51.100.9", "X-Forwarded-Proto", "https"),
               "", "http", "and X-Forwarded-* alone names nobody");
}

/* The host the headers name (t.host on, as --forwarded-host sets it), or "" for none; and that
 * without t.host none is ever read. */
static void resolve_host(int forwarded, const char *trust, struct http_request r,
                         const char *want_host, const char *what)
{
    struct proxy_trust t;
    char client[PROXY_CLIENT_MAX];
    const char *scheme = "http", *host = NULL;
    size_t host_len = 0;
    if (proxy_trust_parse(&t, trust) != 0) {
        ok(0, "%s: trust list %s parses", what, trust);
        return;
    }
    t.forwarded = forwarded;
    t.host = 1;
    proxy_resolve(&t, &r, client, &scheme, &host, &host_len);
    if (host)
        is_mem(host, host_len, want_host, what);
    else
        is_mem("", (size_t)0, want_host, what);
    host = NULL;
    t.host = 0;
    proxy_resolve(&t, &r, client, &scheme, &host, &host_len);
    ok(host == NULL, "%s: not read without --forwarded-host", what);
    proxy_trust_free(&t);
}

static void test_forwarded_host(void)
{
    resolve_host(0, "127.0.0.1", head("X-Forwarded-Host", "example.com", NULL, NULL), "example.com",
                 "X-Forwarded-Host alone");
    resolve_host(0, "127.0.0.1", head("X-Forwarded-Host", " example.com:8443 ", NULL, NULL),
                 "example.com:8443", "a port, spaces around");
    resolve_host(0, "127.0.0.1", head("X-Forwarded-Host", "[2001:db8::1]:8080", NULL, NULL),
                 "[2001:db8::1]:8080", "an IPv6 literal");
    resolve_host(0, "127.0.0.1", head("X-Forwarded-Host", "evil.example, example.com", NULL, NULL),
                 "example.com", "a list: the last, the nearest proxy's");
    resolve_host(0, "127.0.0.1, 10.0.0.0/8",
                 head("X-Forwarded-For", "203.0.113.7, 10.0.0.5", "X-Forwarded-Host",
                      "example.com, inner.local"),
                 "example.com", "one element per hop: the chosen hop's");
    resolve_host(0, "127.0.0.1", head("X-Forwarded-Host", "a b", NULL, NULL), "",
                 "a space inside: not a host");
    resolve_host(0, "127.0.0.1", head("X-Forwarded-Host", "example.com/path", NULL, NULL), "",
                 "a path: not a host");
    resolve_host(0, "127.0.0.1", head("X-Forwarded-Host", "user@example.com", NULL, NULL), "",
                 "userinfo: not a host");
    resolve_host(0, "127.0.0.1", head("X-Forwarded-Host", "example.com:80x", NULL, NULL), "",
                 "a port that is not digits");
    resolve_host(0, "127.0.0.1", head("X-Forwarded-Host", "", NULL, NULL), "", "empty");
    resolve_host(0, "127.0.0.1", head("Forwarded", "for=192.0.2.1;host=evil.example", NULL, NULL),
                 "", "Forwarded's host= is the client's when the proxy writes X-Forwarded-*");
    resolve_host(1, "127.0.0.1",
                 head("Forwarded", "for=192.0.2.60;proto=https;host=example.com", NULL, NULL),
                 "example.com", "Forwarded's host=");
    resolve_host(1, "127.0.0.1",
                 head("Forwarded", "for=192.0.2.60;Host=\"example.com:8080\"", NULL, NULL),
                 "example.com:8080", "quoted, the name in any case");
    resolve_host(1, "127.0.0.1",
                 head("Forwarded", "for=198.51.100.1;host=evil.example, for=192.0.2.60", NULL,
                      NULL),
                 "", "the chosen hop's element has no host=: another element's is not taken");
    resolve_host(1, "127.0.0.1", head("X-Forwarded-Host", "evil.example", NULL, NULL), "",
                 "X-Forwarded-Host is the client's when the proxy writes Forwarded");
}

static void test_long_lists(void)
{
    static char many[PROXY_MAX_HOPS * 16 + 64];
    size_t n = 0;
    n += (size_t)sprintf(many + n, "203.0.113.9");
    for (int i = 0; i < PROXY_MAX_HOPS + 3; i++)
        n += (size_t)sprintf(many + n, ", 10.0.0.%d", i % 250);
    resolve("10.0.0.0/8", head("X-Forwarded-For", many, NULL, NULL), "", "http",
            "every kept hop trusted, the leftmost cut off: no client");
    resolve("127.0.0.1", head("X-Forwarded-For", many, NULL, NULL), "10.0.0.34:0", "http",
            "a long list: its right end decides");
}

int main(void)
{
    test_trust_list();
    test_x_forwarded();
    test_forwarded();
    test_forwarded_host();
    test_long_lists();
    return done_testing();
}
