/* request.h: the request core: one request from its parsed head to its answer, the view of it
 * that handlers get (cyserve_request), and the dispatch from its route to the handler kind.
 * Internal to the engine; error convention 0 or -errno. */
#ifndef CYSERVE_REQUEST_H
#define CYSERVE_REQUEST_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include "compat.h"
#include "cyserve/handler.h"
#include "http_parse.h"
#include "proxy.h"
#include "resp.h"
#include "router.h"

/* body_left of a chunked body streamed to its handler, whose length is not known. */
#define REQUEST_BODY_OPEN UINT64_MAX

struct conn;
struct handoff;
struct server;

/* Header slots that live in the request; a larger configured max_headers uses the arena. */
#define INLINE_HEADERS 100

/* What a request is answered with, whatever the protocol: the request core fills it
 * (request_dispatch), the protocol frames it (HTTP/1: http1_send_answer) and sends it through
 * the connection's transport. */
enum request_body {
    /* body[0..body_len) from memory, or from fd (a sealed memfd holding the same bytes, from
     * offset) when fd >= 0. */
    REQUEST_BODY_BYTES = 0,
    /* body_len bytes of the file fd from offset (sendfile); fd is closed once sent. */
    REQUEST_BODY_FILE,
    /* Static target t: its body (t->static_body, or its memfd t->static_fd), and a head the
     * protocol may keep serialised (HTTP/1: t->static_head). */
    REQUEST_BODY_STATIC,
    /* The handler's stream (resp.stream of the request, target t): the body so far is in resp,
     * the rest comes piece by piece (stream_next). */
    REQUEST_BODY_STREAM,
};

struct request_answer {
    enum request_body kind;
    int status;
    int close; /* the connection closes after this answer */
    /* Header lines "Name: value\r\n", without Content-Length, Date or Connection, which the
     * protocol frames. */
    const char *lines;
    size_t lines_len;
    /* The handler's RESP_OWN_* (resp.h): its own Server line is among lines, its own reason
     * phrase is reason[0..reason_len). 0 for every answer the engine makes. */
    unsigned own_head;
    const char *reason;
    size_t reason_len;
    uint64_t length; /* the Content-Length to announce (for HEAD, what GET would carry), or
                      * REQUEST_LENGTH_NONE */
    const char *body;
    size_t body_len; /* the body's bytes (0: none); a HEAD is framed without them */
    int fd;          /* -1: none */
    uint64_t offset;
    const struct server_target *t;
};

/* One request, from its parsed head to its answer: what a handler's cyserve_request.engine
 * points at. Its views point into the connection's read buffer. */
struct request {
    struct conn *c;
    struct server *srv;
    struct http_request head;
    struct http_header *hdrs;
    unsigned max_headers;
    /* For the access log: the status and body bytes of the response being written (bytes -1:
     * unknown), whether head holds a parsed request, and when it was complete. */
    int log_status;
    int64_t log_bytes;
    int log_have_req;
    uint64_t log_t0;
    /* Proxy headers: the client and scheme this request's trusted headers name (request_client),
     * worked out on the first ask: client_done is REQUEST_CLIENT_TODO once a head is parsed, then
     * DONE; NO_HEAD between requests (an error answer then has no headers to believe). */
    int client_done;
    /* What answered: the route's kind for the metrics (enum metrics_kind), set by
     * request_dispatch (METRICS_NONE: no route). */
    unsigned mkind;
    const char *scheme;
    char client[PROXY_CLIENT_MAX];
    struct cyserve_response resp;
    /* The handoff the answer comes through when a handler deferred it (handoff.h), held until
     * the answer is sent or given up; NULL otherwise. */
    struct handoff *defer;
    /* A GIL-free WebSocket accepted by its route (ws_nogil.h): the 101 is the answer, and the
     * connection is handed to it once the answer is sent (wsn_take_over); NULL otherwise. */
    struct wsn *wsn;
    /* A body the handler reads as it arrives (a target with stream_body: an ASGI app's
     * receive()) instead of whole before the call: the bytes still to deliver (REQUEST_BODY_OPEN
     * for a chunked one until its last chunk is decoded), where the ones already in the
     * connection's buffer are (buf[body_at..body_end), raw: chunked framing included), and
     * whether 100 Continue is owed before the first read from the socket. body_left is 0
     * otherwise. A chunked one is decoded as it goes (body_ch); the reads may bring bytes past
     * its end (a pipelined request), which are left in the buffer from body_rest on, or, when
     * the buffer has no room for them without moving, dropped (body_overread: the connection
     * then closes after the answer). */
    uint64_t body_left;
    size_t body_at, body_end;
    int body_continue;
    int body_chunked, body_overread;
    size_t body_rest;
    struct http_chunked body_ch;
    /* The body, when it is streamed to the handler (body.h) rather than whole in the view;
     * NULL otherwise. */
    struct body_reader *body_rd;
    struct request_answer answer;
    int http2;              /* a stream of an HTTP/2 connection (http2.c); 0 for HTTP/1 */
    char answer_lines[512]; /* storage of answer.lines when the core makes them */
    struct http_header hdr_inline[INLINE_HEADERS];
};

enum { REQUEST_CLIENT_TODO = 0, REQUEST_CLIENT_DONE, REQUEST_CLIENT_NO_HEAD };

/* The client's address ("host:port", "-" when unknown) and, into *scheme, the scheme ("http",
 * "https") of rq: the connection's peer, or with proxy headers on and a trusted peer what its
 * headers say. The connection's coroutine only (the strings live as long as the request, or
 * the connection for the peer). */
const char *request_client(struct request *rq, const char **scheme);

/* Fill *v, the view of the request with head h (routed by m, body[0..body_len)) that a
 * handler sees; engine: the struct request behind it, or NULL (the inline path has none). The
 * header views of the parser and of the public ABI have the same layout (checked in request.c),
 * so the headers are handed over without a copy. The one place a cyserve_request is made. */
static inline void request_view(cyserve_request *v, const struct http_request *h,
                                const struct router_match *m, const char *body, size_t body_len,
                                struct request *engine)
{
    *v = (cyserve_request){
        .method = {h->method, h->method_len},
        .target = {h->target, h->target_len},
        .path = {h->path, h->path_len},
        .query = {h->query ? h->query : "", h->query ? h->query_len : 0},
        .minor_version = h->minor_version,
        .headers = (const cyserve_header *)(const void *)h->headers,
        .num_headers = h->num_headers,
        .body = {body_len ? body : "", body_len},
        .params = m->params,
        .num_params = m->num_params,
        .engine = engine,
    };
}

/* request_answer.length when no length can be announced: a HEAD whose GET would stream. The
 * HTTP/1 framer hands it on as HTTP_LENGTH_UNTIL_CLOSE, the same value (asserted in http1.c). */
#define REQUEST_LENGTH_NONE (UINT64_MAX - 1)

/* The answer a handler's response r makes (status, its header lines with a default
 * Content-Type, its body, the length a HEAD announces) into *a; no memfd (a->fd = -1). 0, or
 * -ENOMEM when the Content-Type line could not be added. Any thread; static inline for the
 * inline path. */
static inline int request_answer_resp(struct request_answer *a, struct cyserve_response *r,
                                      int head_only)
{
    int status = r->status;
    /* 1xx, 204 and 304 end with their head (RFC 9112 6.3); a 205 has no content either (RFC
     * 9110 15.3.6: "a server MUST NOT generate content in a 205 response"), but is framed, with
     * Content-Length: 0. A body a handler gave them is dropped. */
    int bodyless = status < 200 || status == 204 || status == 304 || status == 205;
    size_t body_len;
    const char *body = resp_body(r, &body_len);
    if (!r->has_content_type && body_len && !bodyless) {
        static const char ct[] = "Content-Type: text/plain; charset=utf-8\r\n";
        if (UNLIKELY(wbuf_append(&r->headers, ct, sizeof(ct) - 1)))
            return -ENOMEM;
    }
    size_t blen = bodyless ? 0 : body_len;
    /* An answer to HEAD announces the length GET would have: the handler's own when it gave
     * one and no body (resp_set_head_length). */
    uint64_t announce = blen;
    if (UNLIKELY(head_only && !body_len && !bodyless && r->head_length != -1))
        announce = r->head_length >= 0 ? (uint64_t)r->head_length : REQUEST_LENGTH_NONE;
    *a = (struct request_answer){
        .kind = REQUEST_BODY_BYTES,
        .status = status,
        .close = r->close,
        .lines = r->headers.ptr,
        .lines_len = r->headers.len,
        .own_head = r->own_head,
        .reason = r->reason,
        .reason_len = r->reason_len,
        .length = announce,
        .body = body,
        .body_len = blen,
        .fd = -1,
    };
    return 0;
}

/* A short text answer naming the problem (404, 405, 500 ...) into *a: status, the text body,
 * extra header lines (may be NULL), made in buf[0..cap). Any thread. */
void request_answer_simple(struct request_answer *a, char *buf, size_t cap, int status,
                           const char *body, const char *extra);

/* Route the parsed request rq whose body is body[0..body_len) to its handler kind, run the
 * handler if it has one, and fill rq->answer. Returns 0, or -errno when there is nothing to
 * answer (the server stopped while a Python handler waited): the connection must close. The
 * coroutine serving the connection, or an HTTP/2 stream's task (a coroutine beside it, on any
 * worker: http2.c), which touches no connection state but what the connection's coroutine made
 * before it started (the peer, request_client's answer). */
int request_dispatch(struct request *rq, const char *body, size_t body_len);

/* Would the answer to the parsed request rq need its body? No for a 404, a 405, and a static or
 * files route: a client that asked `Expect: 100-continue` then gets that answer instead of
 * 100 Continue, and never sends the body for nothing. The coroutine serving the connection. */
int request_reads_body(struct request *rq);

/* Whether the parsed request rq goes to a target that reads its body as it arrives
 * (server_target.stream_body). The coroutine serving the connection. */
int request_streams_body(struct request *rq);

/* Wait until the producer of rq's deferred answer h (target t) gives its turn: the answer, or
 * the next piece of a streamed one. Meanwhile the client is watched (one that leaves is told to
 * the producer through t's py_stream, SERVER_STREAM_ABANDON) and a body that streams is read a
 * piece per ask (handoff_ask_body). 0, -ECONNRESET (the client left) or -ECANCELED (the server
 * stops). The coroutine serving the connection; for an HTTP/2 stream (rq->http2), the stream's
 * task, which only waits for the answer (the connection's coroutine is the socket's reader). */
int request_await_answer(struct request *rq, struct handoff *h, const struct server_target *t);
/* Would rq's handler read its body as a stream (body.h)? A Python target that takes one
 * (server_target.body_stream), over plain TCP or TLS. The coroutine serving the connection. */
int request_body_streams(struct request *rq);

/* Leave rq's handoff, if it has one. The serving coroutine. */
void request_leave_defer(struct request *rq);

/* After the protocol sent rq->answer (or gave up): close its file, if it has one; leave its
 * handoff, if it has one. */
static inline void request_answer_done(struct request *rq)
{
    if (rq->answer.kind == REQUEST_BODY_FILE && rq->answer.fd >= 0) {
        close(rq->answer.fd);
        rq->answer.fd = -1;
    }
    if (UNLIKELY(rq->defer != NULL))
        request_leave_defer(rq);
}

/* The value of rq's first header name[0..nlen) (case-insensitive): 1 and *v, *vlen set, or 0
 * and NULL, 0. */
int request_header_value(const struct request *rq, const char *name, size_t nlen, const char **v,
                         size_t *vlen);

/* Whether rq's client accepts trailer fields in the answer: one of its TE fields lists
 * "trailers" (RFC 9110 10.1.4; the ASGI trailers extension sends them only then). Read only
 * when an answer has trailers, so that other answers never scan for it. Pure on rq's head. */
int request_accepts_trailers(const struct request *rq);

/* request_accepts_trailers for a parsed head alone (the inline path has no struct request):
 * whether one of head's TE fields lists "trailers". Pure. */
int request_head_accepts_trailers(const struct http_request *head);

/* Whether the TE field value v[0..len), a list of t-codings with their parameters, has the
 * member "trailers" (case-insensitive, spaces around members ignored). Pure. */
int request_te_lists_trailers(const char *v, size_t len);

/* A GIL-free handler for req returned hrc != 0 (it is answered 500): a line on standard error,
 * at most one a second for the process. Any thread. */
void request_note_failure(const struct http_request *req, int hrc);

/* What request_nogil_content says of an answer whose status has no content but whose body has
 * bytes or trailers; request_note_failure names that mistake for it. No handler returns it (they
 * return 0 or -errno, and this is no errno). */
#define REQUEST_NO_CONTENT_BODY (-0x40000)

/* A GIL-free handler's answer r, once it returned 0: REQUEST_NO_CONTENT_BODY when its status
 * has no content (204, 205, 304: RFC 9110 6.4.1, 15.3.6; a status below 200 is refused when it
 * is set) and its body has bytes, or it has trailers (fields sent after a body it cannot have:
 * the engine would drop them), the handler's mistake, which the caller answers 500 as any
 * failure (the Python handlers, WSGI and ASGI refuse it too); otherwise 0. Pure. */
static inline int request_nogil_content(const struct cyserve_response *r)
{
    size_t len;
    if (LIKELY(r->status != 204 && r->status != 205 && r->status != 304))
        return 0;
    resp_body(r, &len);
    return len || (r->own_head & RESP_OWN_TRAILERS) ? REQUEST_NO_CONTENT_BODY : 0;
}

#endif
