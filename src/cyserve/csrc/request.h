/* request.h: the request core: one request from its parsed head to its answer, the view of it
 * that handlers get (cyserve_request), and the dispatch from its route to the handler kind.
 * Internal to the engine; error convention 0 or -errno. */
#ifndef CYSERVE_REQUEST_H
#define CYSERVE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "cyserve/handler.h"
#include "http_parse.h"
#include "http_write.h"
#include "router.h"

struct conn;
struct server;
struct http1_session;

/* Header slots that live in the request; a larger configured max_headers uses the arena. */
#define INLINE_HEADERS 100

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
    struct cyserve_response resp;
    struct http_header hdr_inline[INLINE_HEADERS];
};

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

/* Route and answer the parsed request sv->rq whose body is body[0..body_len). keep: the
 * connection may stay open. Returns 0 or -errno (the connection must close). The coroutine
 * serving the connection. */
int request_dispatch(struct http1_session *sv, const char *body, size_t body_len, int keep);

/* The value of rq's first header name[0..nlen) (case-insensitive): 1 and *v, *vlen set, or 0
 * and NULL, 0. */
int request_header_value(const struct request *rq, const char *name, size_t nlen,
                         const char **v, size_t *vlen);

/* A GIL-free handler for req returned hrc != 0 (it is answered 500): a line on standard error,
 * at most one a second for the process. Any thread. */
void request_note_failure(const struct http_request *req, int hrc);

#endif
