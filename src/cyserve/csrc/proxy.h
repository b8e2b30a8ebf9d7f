/* proxy.h: who the client is behind a trusted proxy: the addresses trusted to say so
 * (--forwarded-allow-ips) and the reading of X-Forwarded-For, X-Forwarded-Proto,
 * X-Forwarded-Host and RFC 7239 Forwarded (proxy.c). Error convention 0 or -errno. Pure
 * functions of their arguments: any thread. */
#ifndef CYSERVE_PROXY_H
#define CYSERVE_PROXY_H

#include <stddef.h>
#include <stdint.h>

#include "http_parse.h"

struct sockaddr;

/* One trusted network: family (AF_INET, AF_INET6), prefix length, address in network order. */
struct proxy_net {
    int family;
    unsigned bits;
    uint8_t addr[16];
};

/* The peers whose forwarding headers are believed. */
struct proxy_trust {
    int all;       /* "*": every peer */
    int forwarded; /* 0: read X-Forwarded-For/-Proto; 1: read RFC 7239 Forwarded (set after
                    * proxy_trust_parse, which makes it 0) */
    int host;      /* 1: also read the host the proxy names (X-Forwarded-Host, or Forwarded's
                    * host=); 0: never (set after proxy_trust_parse, which makes it 0) */
    unsigned n;
    struct proxy_net *nets; /* owned (proxy_trust_free) */
};

/* Room for "[v6-address]:0" and its NUL. */
#define PROXY_CLIENT_MAX 56

/* Parse spec, a comma-separated list of IPv4 and IPv6 addresses and networks (CIDR) or "*",
 * spaces allowed around the items, into *t. 0, -EINVAL (an item that is not one: *t is left
 * empty), -ENOMEM. Free with proxy_trust_free. */
int proxy_trust_parse(struct proxy_trust *t, const char *spec);

void proxy_trust_free(struct proxy_trust *t);

/* Whether peer sa is trusted. A Unix socket's peer always is (as gunicorn has it): who may
 * connect to it is already decided by the socket file's mode. */
int proxy_trusted_peer(const struct proxy_trust *t, const struct sockaddr *sa);

/* From the head h of a request that a trusted peer sent: the client address its forwarding
 * headers name, written to client as "host:0" ("[v6]:0"; the port is not forwarded), or ""
 * when they name none that is an IP address; and *scheme, "http" or "https" when they name one
 * (else left alone). t->forwarded picks the headers read: X-Forwarded-For with the element of
 * X-Forwarded-Proto that lines up with the chosen hop (else its last), or Forwarded's for= and
 * proto=; the other family is ignored. Of a list of hops, the client is the rightmost one that
 * is not trusted (the leftmost when all are, or with "*"), as uvicorn reads X-Forwarded-For.
 * client has PROXY_CLIENT_MAX bytes. With t->host, *host and *host_len are set to the host the
 * headers name (a view into h's header values, uri-host [":" port] as a Host field must be,
 * quotes and spaces removed), chosen as the scheme is: X-Forwarded-Host's element that lines up
 * with the chosen hop (else its last), or Forwarded's host= of the chosen hop's element; left
 * alone when they name none that is valid, and without t->host. */
void proxy_resolve(const struct proxy_trust *t, const struct http_request *h, char *client,
                   const char **scheme, const char **host, size_t *host_len);

#endif
