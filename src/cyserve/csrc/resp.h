/* resp.h: the cyserve_response builder (prefix resp_), the room where a handler's answer is
 * built: status, header lines, a body written or set once, a streamed body's state, and
 * request-scoped memory. GIL-free and Python handlers fill it through the public ABI
 * (cyserve/handler.h); the engine then frames it as HTTP/1 (http1_write.h).
 *
 * Error convention: 0 or -errno (-ENOMEM, -EINVAL, -EPERM, -EEXIST). No I/O: the engine (http1.c)
 * owns the sockets and decides when bytes go out. Nothing here is shared between threads: a
 * response, its buffers and its arena belong to the coroutine serving the request. */
#ifndef CYSERVE_RESP_H
#define CYSERVE_RESP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "compat.h"
#include "wbuf.h"

#include "cyserve/handler.h"

/* ---- request-scoped arena ---- */

/* Blocks freed together when the request ends: cyserve_resp_alloc() memory. */
struct resp_arena {
    struct resp_arena_block *head;
};

/* 16-byte aligned memory that lives until resp_arena_reset(). Returns NULL on ENOMEM. */
void *resp_arena_alloc(struct resp_arena *a, size_t size);
void resp_arena_reset(struct resp_arena *a);

/* ---- lent bodies ---- */

/* A body lent to a response by its owner (a Python bytes object), sent from the owner's memory
 * instead of being copied. The owner must outlive the sending, and only the lender can drop its
 * reference (the engine's threads hold no GIL): so the engine hands the lease back through a
 * list, and the lender takes the whole list at a time when it can drop references (the next
 * batch of Python calls, or after the server stopped). Lock-free: pushed from any thread, taken
 * all at once; no ABA, since nodes are only ever pushed singly and taken together. */
struct resp_lease {
    struct resp_lease *next;
    void *owner;                  /* the lender's token, opaque here */
    struct resp_lease_list *back; /* where the lease goes when the engine is done with it */
};

struct resp_lease_list {
    _Atomic(struct resp_lease *) head;
};

/* A lease of owner, to go back to *back: malloc'd, NULL on ENOMEM. The lender's thread. */
struct resp_lease *resp_lease_new(void *owner, struct resp_lease_list *back);

/* Hand lease back to its list. Any thread. */
void resp_lease_give_back(struct resp_lease *lease);

/* Whether the list holds leases (a relaxed load: a lease pushed meanwhile is taken next time). */
static inline int resp_lease_pending(struct resp_lease_list *l)
{
    return atomic_load_explicit(&l->head, memory_order_relaxed) != NULL;
}

/* Take every lease handed back so far (NULL when none), newest first; the taker releases each
 * owner and frees each node with resp_lease_free. Any thread. */
struct resp_lease *resp_lease_take_all(struct resp_lease_list *l);

void resp_lease_free(struct resp_lease *lease);

/* ---- the response builder ---- */

#define RESP_INLINE_HEADERS 256
#define RESP_INLINE_BODY 1024

/* What a handler fills. Lives in the serving coroutine's frame; handlers see it as the opaque
 * cyserve_response. Header lines are kept serialised ("Name: value\r\n"), so emitting the
 * response head is one copy. */
struct cyserve_response {
    int status;           /* 200 unless set */
    int close;            /* the handler asked for Connection: close */
    int has_content_type; /* a Content-Type line is in headers */
    /* RESP_OWN_* bits: the handler sent its own Server line (in headers) or reason phrase, so
     * the head is not the engine's usual one. 0 in the common case, which the framer tests
     * once and otherwise never looks further (http1_write.h). */
    unsigned own_head;
    const char *reason; /* the handler's reason phrase (arena memory) when RESP_OWN_REASON */
    size_t reason_len;
    struct wbuf headers; /* "Name: value\r\n" lines added by the handler */
    struct wbuf body;
    /* Trailer fields (resp_add_trailer), "Name: value\r\n" lines sent after the body: on
     * HTTP/1.1 in the trailer section of a chunked body, on HTTP/2 in a last HEADERS frame; only
     * to a client that sent TE: trailers (request_accepts_trailers), dropped otherwise. Heap
     * storage only, taken when the first is added: a response without trailers keeps an empty
     * buffer that costs one store per reset. */
    struct wbuf trailers;
    /* A body the handler promised outlives the server (resp_set_body_static): sent straight from
     * there, never copied into body. NULL when unset; then body is the body. */
    const char *body_static;
    size_t body_static_len;
    /* Set with body_static by resp_set_body_lent: the body is lent, not static, and goes back
     * (resp_lease_give_back) once sent, or when the response is reset or freed. NULL otherwise. */
    struct resp_lease *lease;
    /* A body in a file (resp_set_body_file): body_file_len bytes of body_fd from
     * body_file_offset, sent with sendfile. The response owns the descriptor until the request
     * core takes it for the answer; -1 when none. */
    int body_fd;
    uint64_t body_file_offset;
    uint64_t body_file_len;
    /* The Content-Length an answer to HEAD announces when the body is empty: what the same
     * request with GET would carry (a WSGI app answers HEAD with no body but its length). -1
     * when unset: then the body's own length. Never used for other methods. */
    int64_t head_length;
    /* Set by a Python handler whose body is still being produced (resp_set_stream): the engine
     * sends the head and the body so far, then asks the target's py_stream for the rest, piece
     * by piece (stream.c, http1.c). NULL for a whole answer. Not owned here. */
    void *stream;
    /* The Content-Length a streamed body announced, or -1: then it goes out chunked. */
    int64_t stream_length;
    /* Set by a Python handler whose answer another thread produces later (resp_set_defer): a
     * struct handoff (handoff.h) the engine waits on, without blocking its worker. NULL for an
     * answer made by the call itself. Not owned here. */
    void *defer;
    struct resp_arena arena; /* cyserve_resp_alloc() */
    char inline_headers[RESP_INLINE_HEADERS];
    char inline_body[RESP_INLINE_BODY];
};

#define RESP_OWN_SERVER 1u
#define RESP_OWN_REASON 2u
/* Trailers were added (resp_add_trailer): an HTTP/1.1 answer whose body is whole is then
 * framed chunked, so that they can follow it (http1_trailed). A bit of own_head, which the
 * framer tests anyway, so that an answer without trailers is framed with no test of its own. */
#define RESP_OWN_TRAILERS 4u

/* Prepare r for a request (status 200, no headers, empty body). */
void resp_init(struct cyserve_response *r);

/* Forget the previous response's content but keep heap buffers for the next one. */
void resp_reset(struct cyserve_response *r);

/* Free everything r holds. */
void resp_free(struct cyserve_response *r);

/* Set the (final) status: 0, or -EINVAL outside 200..599. */
int resp_set_status(struct cyserve_response *r, int status);

/* Make r a 101 Switching Protocols: the answer to a WebSocket handshake its application accepted,
 * after which the connection changes protocol (ws_conn.h). Not for handlers' answers. */
void resp_set_switching(struct cyserve_response *r);

/* Add a header line. Names are tokens, values have no control characters but HTAB: -EINVAL
 * otherwise, which is
 * what stops a handler from splitting the response. Content-Length, Transfer-Encoding, Date and
 * Connection are managed by the engine: -EPERM. Server is the handler's when it sets one (the
 * engine then writes none); a second is -EEXIST, as Server is not a list (RFC 9110 10.2.4).
 * Returns 0, -EINVAL, -EPERM, -EEXIST or -ENOMEM. */
int resp_add_header(struct cyserve_response *r, const char *name, size_t nlen, const char *value,
                    size_t vlen);

/* Add a trailer field, sent after the body (see trailers above). The name must be a token
 * and the value hold no control character but HTAB (no CR, LF or NUL): -EINVAL otherwise, so
 * that no trailer can end the message early or smuggle a field. Fields a recipient must have
 * before the content, or that belong to the connection, cannot be trailers (RFC 9110 6.5.1,
 * 7.6.1): Content-Length, Transfer-Encoding, Trailer, Host, Connection, Keep-Alive,
 * Proxy-Connection, TE, Upgrade, Content-Type, Content-Encoding and Content-Range are -EPERM.
 * Sets RESP_OWN_TRAILERS. Returns 0, -EINVAL, -EPERM or -ENOMEM. Whoever fills r: the serving
 * coroutine, or the producer of a deferred answer while it holds the handoff's turn
 * (handoff.h). */
int resp_add_trailer(struct cyserve_response *r, const char *name, size_t nlen, const char *value,
                     size_t vlen);

/* Send reason[0..len) as the reason phrase instead of the engine's for the status. It must be
 * an RFC 9112 reason-phrase: HTAB, SP, VCHAR and obs-text only (no CR, LF or other control
 * byte): -EINVAL otherwise. Copied into r's arena. Returns 0, -EINVAL or -ENOMEM. */
int resp_set_reason(struct cyserve_response *r, const char *reason, size_t len);

/* Set Content-Type (replacing a previous one set this way is not supported: -EEXIST). */
int resp_set_content_type(struct cyserve_response *r, const char *value, size_t vlen);

/* Append to the body. Returns 0, -ENOMEM, or -EEXIST when a static, lent or file body was
 * set. */
int resp_write(struct cyserve_response *r, const void *data, size_t len);

/* Make data[0..len) the whole body without copying it per response: the engine writes it to the
 * socket from there (or, when large, from a memfd snapshot it takes on first use,
 * handler_static.c). data must stay valid and unchanged as long as the server runs
 * (process-lifetime memory: a static array, or a buffer allocated once and never freed while
 * serving). Exclusive with
 * resp_write: -EEXIST if the body already has bytes or a static body was set; -EINVAL for
 * data == NULL with len > 0. Returns 0. */
int resp_set_body_static(struct cyserve_response *r, const void *data, size_t len);

/* Make data[0..len) the whole body, lent by the owner behind lease (resp_lease_new) until the
 * engine has sent it: no copy. The lease goes back to its list once the answer is written (or
 * the client left, or the request failed, or the server stopped), at the latest when r is reset
 * or freed; data must stay valid and unchanged until then. Exclusive with resp_write and
 * resp_set_body_static: -EEXIST if the body already has bytes or was set; -EINVAL for a NULL
 * data or lease. On error the lease stays the caller's. Returns 0. */
int resp_set_body_lent(struct cyserve_response *r, const void *data, size_t len,
                       struct resp_lease *lease);

/* Hand r's lent body back now (the bytes are written) and forget the body. No-op without one
 * (inline: a test on every response's path). The serving coroutine. */
void resp_body_return_lent(struct cyserve_response *r);
static inline void resp_body_return(struct cyserve_response *r)
{
    if (UNLIKELY(r->lease != NULL))
        resp_body_return_lent(r);
}

/* Make len bytes of the file fd from offset the whole body, sent with sendfile; r takes fd
 * (closed by resp_reset or resp_free unless the request core took it). -EEXIST if the body was
 * set or has bytes, -EINVAL for fd < 0; on error fd stays the caller's. Returns 0. */
int resp_set_body_file(struct cyserve_response *r, int fd, uint64_t offset, uint64_t len);

/* Announce n as the Content-Length of an answer to HEAD whose body is empty (see head_length),
 * or, with RESP_LENGTH_UNKNOWN, announce none (GET's length is not known: its body would be
 * streamed). Returns 0, or -EINVAL for any other negative n. */
#define RESP_LENGTH_UNKNOWN (-2)
int resp_set_head_length(struct cyserve_response *r, int64_t n);

/* Mark r's body as unfinished: stream is the handler's state, handed back to its target's
 * py_stream (server.h) until the body ends; length is the whole body's, when the handler
 * announced it, else -1 (the body then goes out chunked). Returns 0, or -EINVAL for NULL, a
 * static body or a length under -1. */
int resp_set_stream(struct cyserve_response *r, void *stream, int64_t length);

/* Mark r's answer as produced later by another thread, through the handoff h (handoff.h): the
 * handler leaves r otherwise empty. Returns 0, or -EINVAL for NULL. */
int resp_set_defer(struct cyserve_response *r, void *h);

/* Move what src holds (status, reason, header lines, body, trailers, lengths, stream) into dst,
 * which a handler has not filled yet (after resp_reset), copying the bytes; a file body's
 * descriptor moves to dst. src is reset. Returns 0 or -ENOMEM (dst then holds part of it:
 * answer 500). */
int resp_take(struct cyserve_response *dst, struct cyserve_response *src);

/* The body to send: the static one if set, else the written one. Sets *len. */
static inline const char *resp_body(const struct cyserve_response *r, size_t *len)
{
    if (r->body_static) {
        *len = r->body_static_len;
        return r->body_static;
    }
    *len = r->body.len;
    return r->body.ptr;
}

/* Request-scoped memory for a handler (freed when the next request starts or the connection's
 * coroutine ends; never by the handler). 16-byte aligned; NULL on ENOMEM. */
void *resp_alloc(struct cyserve_response *r, size_t size);

#endif
