/* proxyproto.h: the PROXY protocol (HAProxy's, versions 1 and 2), by which a load balancer that
 * forwards TCP (HAProxy, AWS NLB, many ingress controllers) tells the server who the client is,
 * in a header before the connection's first byte. A strict parser (proxyproto.c): pure function
 * of its arguments, any thread. Parser convention: bytes consumed, -1 (not a valid header), -2
 * (a valid beginning: more bytes are needed). */
#ifndef CYSERVE_PROXYPROTO_H
#define CYSERVE_PROXYPROTO_H

#include <stddef.h>
#include <stdint.h>

/* The longest header accepted: a version 1 line is at most 107 bytes (the specification's
 * bound); a version 2 header is 16 bytes and its address block (216 bytes for Unix sockets)
 * plus TLVs, which are accepted up to this size in all (AWS NLB's are tens of bytes). */
#define PROXYPROTO_MAX 1024
#define PROXYPROTO_V1_MAX 107

/* What a header says. family: AF_INET or AF_INET6 with the client's (src) and the proxy's
 * listening (dst) addresses and ports in network order; AF_UNSPEC when the header names no
 * client to believe (version 1 UNKNOWN, version 2 LOCAL, or an unspecified or Unix address):
 * the connection's own peer stands. version: 1 or 2. */
struct proxyproto_hdr {
    int version;
    int family;
    uint8_t src[16], dst[16];
    uint16_t src_port, dst_port;
};

/* Parse the header at the start of buf[0..len) into *out: its length (> 0), -1 when buf does not
 * begin with a valid header (any other first bytes, a bad address, port or length, a TCP4 line
 * with IPv6 addresses, a datagram family, a header over PROXYPROTO_MAX), -2 when buf is a prefix
 * of one (feed more bytes and parse again from the start). */
int proxyproto_parse(const char *buf, size_t len, struct proxyproto_hdr *out);

/* Write the client of h as "host:port" ("[v6]:port") into out[0..cap): 0, or -EINVAL when h
 * names none (AF_UNSPEC) or cap is too small (64 bytes are enough). */
int proxyproto_client(const struct proxyproto_hdr *h, char *out, size_t cap);

#endif
