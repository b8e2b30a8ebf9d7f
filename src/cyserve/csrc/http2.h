/* http2.h: HTTP/2 (RFC 9113) as a connection's protocol, beside HTTP/1.1: framing, HPACK and flow
 * control by libnghttp2, each stream a struct request dispatched by the request core
 * (request.c) and its answer framed as HEADERS and DATA. The design is at the top of http2.c.
 *
 * Internal to the engine; error convention 0 or -errno. */
#ifndef CYSERVE_HTTP2_H
#define CYSERVE_HTTP2_H

#include <stddef.h>
#include <stdint.h>

#include "conn.h"

/* The client connection preface (RFC 9113 3.4) that starts h2c by prior knowledge. */
#define HTTP2_PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define HTTP2_PREFACE_LEN 24

/* Past this many RST_STREAM frames, or this many SETTINGS and PING frames together, from the
 * client within one second, the connection is ended with GOAWAY ENHANCE_YOUR_CALM: the bound
 * of the rapid reset attack (CVE-2023-44487) and of SETTINGS/PING floods. */
#define HTTP2_RESETS_PER_S 100
#define HTTP2_CONTROL_PER_S 100

/* HTTP/2 as a connection's protocol (conn_proto): on_readable spawns the coroutine that serves
 * the connection until it is idle again or closed; close frees the session (c->proto_data). */
extern const struct conn_proto http2_proto;

/* Whether buf[0..len) could be the start of the client preface: 1 when it is the whole preface
 * (len >= HTTP2_PREFACE_LEN), 2 when it is a prefix of it still too short to tell, 0 otherwise.
 * Pure. */
int http2_preface_match(const char *buf, size_t len);

/* Take connection c over with HTTP/2, from the coroutine that serves it (HTTP/1's, after ALPN
 * chose h2 or after it read the client preface: the bytes read so far, preface included, are
 * c->buf[0..c->len)). Serves c until it is idle (returns 0) or must be closed (returns 1; the
 * caller destroys it). Sets c->proto and c->proto_data. The connection's coroutine. */
int http2_take_over(struct conn *c);

#endif
