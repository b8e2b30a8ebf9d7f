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

struct http_request;

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

/* The most bytes of settings an HTTP2-Settings field may carry (decoded): 128 settings, past
 * which a request is not upgraded. */
#define HTTP2_UPGRADE_SETTINGS_MAX 768

/* Whether the HTTP2-Settings field b64[0..len) of an `Upgrade: h2c` request is valid (base64url
 * of whole 6-byte settings, at most HTTP2_UPGRADE_SETTINGS_MAX of them): 0 or -EINVAL. Pure. */
int http2_upgrade_settings(const char *b64, size_t len);

/* Take connection c over with HTTP/2 after HTTP/1's coroutine answered 101 to `Upgrade: h2c`
 * (RFC 7540 3.2): the client's settings from HTTP2-Settings (b64[0..len), checked by
 * http2_upgrade_settings), its request r (views into c->buf, no body) answered as stream 1,
 * and c->buf[rest..c->len) what the client sent after it (its preface). Serves c as
 * http2_take_over does and returns as it. The connection's coroutine. */
int http2_take_over_upgrade(struct conn *c, const char *b64, size_t len,
                            const struct http_request *r, size_t rest);

struct request;
struct sched_signal;

/* A stream's task waiting for its producer's answer (an ASGI app: request_await_answer) watches
 * its stream through these. The stream's task, on an HTTP/2 stream's request (rq->http2), while
 * the task runs (the stream is not freed meanwhile).
 *
 * http2_stream_watch: from now on, until http2_stream_unwatch, wake is set whenever the stream
 * has news for the task (DATA of a streamed body, its end, a reset, the connection's end). */
void http2_stream_watch(struct request *rq, struct sched_signal *wake);
void http2_stream_unwatch(struct request *rq);

/* Whether the client will send nothing more on rq's stream before its end: it reset the stream,
 * the connection ended, or a streamed body broke max_body_bytes. */
int http2_stream_gone(struct request *rq);

/* The next piece of rq's streamed body (rq->body_left set by http2.c) into dst[0..max): 1 with
 * *n bytes (0 at the end) and *more whether more follow, 0 when none has arrived yet (the watch
 * signal is set when one does), -ECONNRESET when the client will send no more
 * (http2_stream_gone). The window opens as pieces are taken. */
int http2_body_take(struct request *rq, char *dst, size_t max, size_t *n, int *more);

#endif
