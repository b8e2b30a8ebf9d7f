/* resp.c: the cyserve_response builder (resp_) and its request-scoped arena.
 *
 * Single-threaded by construction: a response and its buffers belong to one coroutine, so no
 * atomics are needed. */
#include "resp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compat.h"

/* ---- arena ---- */

struct resp_arena_block {
    struct resp_arena_block *next;
    size_t size;
    /* 16-byte aligned payload follows */
    _Alignas(16) unsigned char data[];
};

void *resp_arena_alloc(struct resp_arena *a, size_t size)
{
    /* One block per allocation keeps this trivially correct; handlers that need many small
     * pieces are rare, and the block is freed when the request ends. */
    if (UNLIKELY(size > SIZE_MAX - sizeof(struct resp_arena_block)))
        return NULL;
    struct resp_arena_block *blk = malloc(sizeof(*blk) + (size ? size : 1));
    if (UNLIKELY(!blk))
        return NULL;
    blk->size = size;
    blk->next = a->head;
    a->head = blk;
    return blk->data;
}

void resp_arena_reset(struct resp_arena *a)
{
    struct resp_arena_block *blk = a->head;
    while (blk) {
        struct resp_arena_block *next = blk->next;
        free(blk);
        blk = next;
    }
    a->head = NULL;
}

/* ---- lent bodies ---- */

struct resp_lease *resp_lease_new(void *owner, struct resp_lease_list *back)
{
    struct resp_lease *l = malloc(sizeof(*l));
    if (UNLIKELY(!l))
        return NULL;
    l->next = NULL;
    l->owner = owner;
    l->back = back;
    return l;
}

void resp_lease_give_back(struct resp_lease *lease)
{
    struct resp_lease_list *l = lease->back;
    struct resp_lease *head = atomic_load_explicit(&l->head, memory_order_relaxed);
    do {
        lease->next = head;
        /* release: the taker sees the node's fields; the lender's bytes were only read. */
    } while (!atomic_compare_exchange_weak_explicit(&l->head, &head, lease, memory_order_release,
                                                    memory_order_relaxed));
}

struct resp_lease *resp_lease_take_all(struct resp_lease_list *l)
{
    if (!resp_lease_pending(l))
        return NULL;
    /* acquire: pairs with give_back's release, so the nodes' fields are seen whole. */
    return atomic_exchange_explicit(&l->head, NULL, memory_order_acquire);
}

void resp_lease_free(struct resp_lease *lease)
{
    free(lease);
}

/* ---- response builder ---- */

void resp_init(struct cyserve_response *r)
{
    r->status = 200;
    r->close = 0;
    r->has_content_type = 0;
    r->own_head = 0;
    r->reason = NULL;
    r->reason_len = 0;
    wbuf_init(&r->headers, r->inline_headers, sizeof(r->inline_headers));
    wbuf_init(&r->body, r->inline_body, sizeof(r->inline_body));
    wbuf_init(&r->trailers, NULL, 0);
    r->body_static = NULL;
    r->body_static_len = 0;
    r->lease = NULL;
    r->body_fd = -1;
    r->body_file_offset = 0;
    r->body_file_len = 0;
    r->head_length = -1;
    r->stream = NULL;
    r->stream_length = -1;
    r->defer = NULL;
    r->arena.head = NULL;
}

/* Let go of a lent body and of a file body the request core did not take. */
static inline void body_let_go(struct cyserve_response *r)
{
    if (UNLIKELY(r->lease != NULL)) {
        resp_lease_give_back(r->lease);
        r->lease = NULL;
    }
    if (UNLIKELY(r->body_fd >= 0)) {
        close(r->body_fd);
        r->body_fd = -1;
    }
}

void resp_reset(struct cyserve_response *r)
{
    r->status = 200;
    r->close = 0;
    r->has_content_type = 0;
    r->own_head = 0;
    r->reason = NULL;
    r->reason_len = 0;
    r->headers.len = 0;
    r->body.len = 0;
    r->trailers.len = 0;
    body_let_go(r);
    r->body_static = NULL;
    r->body_static_len = 0;
    r->head_length = -1;
    r->stream = NULL;
    r->stream_length = -1;
    r->defer = NULL;
    resp_arena_reset(&r->arena);
}

void resp_free(struct cyserve_response *r)
{
    body_let_go(r);
    wbuf_free(&r->headers);
    wbuf_free(&r->body);
    wbuf_free(&r->trailers);
    resp_arena_reset(&r->arena);
}

int resp_set_status(struct cyserve_response *r, int status)
{
    /* A handler's status is the final one: a 1xx would leave the client waiting for another
     * response (or switching protocols), and RFC 9110 15 defines nothing past 599. */
    if (UNLIKELY(status < 200 || status > 599))
        return -EINVAL;
    r->status = status;
    return 0;
}

void resp_set_switching(struct cyserve_response *r)
{
    r->status = 101;
}

/* RFC 9110 tchar. */
static int is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return 1;
    /* The fifteen punctuation characters of tchar as one list, not one case a line. */
    /* clang-format off */
    switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+':
    case '-': case '.': case '^': case '_': case '`': case '|': case '~':
        return 1;
    default:
        return 0;
    }
    /* clang-format on */
}

static int name_is(const char *name, size_t nlen, const char *lit)
{
    size_t n = strlen(lit);
    if (nlen != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c >= 'A' && c <= 'Z')
            c = (unsigned char)(c + 32);
        if (c != (unsigned char)lit[i])
            return 0;
    }
    return 1;
}

static int append_line(struct wbuf *b, const char *name, size_t nlen, const char *value,
                       size_t vlen)
{
    int rc = wbuf_reserve(b, nlen + vlen + 4);
    if (UNLIKELY(rc))
        return rc;
    char *p = b->ptr + b->len;
    memcpy(p, name, nlen);
    p += nlen;
    *p++ = ':';
    *p++ = ' ';
    if (vlen)
        memcpy(p, value, vlen);
    p += vlen;
    *p++ = '\r';
    *p++ = '\n';
    b->len = (size_t)(p - b->ptr);
    return 0;
}

/* A field value is visible characters, obs-text, SP and HTAB (RFC 9110 5.5). A CR or LF would
 * let a handler inject headers or a second response; the other controls are refused too, as
 * app.static() refuses them, so that no peer sees a value it must reject. */
static int value_ok(const char *value, size_t vlen)
{
    if (UNLIKELY(vlen && !value))
        return 0;
    /* Eight bytes at a time while a word holds no byte below 0x20 and no 0x7f (the two word
     * tests are exact for "any byte": a borrow can only mark bytes above one that is marked
     * truly); from a word that may hold one (an HTAB among them), byte by byte. */
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    size_t i = 0;
    for (; i + 8 <= vlen; i += 8) {
        uint64_t x, y;
        memcpy(&x, value + i, 8);
        y = x ^ (ones * 0x7f);
        if (((x - ones * 0x20) & ~x & highs) | ((y - ones) & ~y & highs))
            break;
    }
    for (; i < vlen; i++) {
        unsigned char c = (unsigned char)value[i];
        if (UNLIKELY((c < 0x20 && c != '\t') || c == 0x7f))
            return 0;
    }
    return 1;
}

/* A field line a handler may send, header or trailer: the name a token, the value without
 * control bytes but HTAB, so that no line can end the head early or smuggle a field. */
static int field_ok(const char *name, size_t nlen, const char *value, size_t vlen)
{
    if (UNLIKELY(nlen == 0 || !name || !value_ok(value, vlen)))
        return 0;
    for (size_t i = 0; i < nlen; i++)
        if (UNLIKELY(!is_tchar((unsigned char)name[i])))
            return 0;
    return 1;
}

int resp_add_header(struct cyserve_response *r, const char *name, size_t nlen, const char *value,
                    size_t vlen)
{
    if (UNLIKELY(!field_ok(name, nlen, value, vlen)))
        return -EINVAL;
    if (UNLIKELY(name_is(name, nlen, "content-length") ||
                 name_is(name, nlen, "transfer-encoding") || name_is(name, nlen, "date")))
        return -EPERM; /* the engine writes these */
    if (name_is(name, nlen, "server")) {
        /* The handler's Server replaces the engine's; Server is not a list, so two would be
         * an invalid response. */
        if (UNLIKELY(r->own_head & RESP_OWN_SERVER))
            return -EEXIST;
        int rc = append_line(&r->headers, name, nlen, value, vlen);
        if (!rc)
            r->own_head |= RESP_OWN_SERVER;
        return rc;
    }
    if (name_is(name, nlen, "connection")) {
        /* The engine writes the Connection header itself; a handler may only ask to close. */
        if (vlen == 5 && name_is(value, vlen, "close")) {
            r->close = 1;
            return 0;
        }
        /* A 101 to a WebSocket handshake says what it switches to (RFC 6455 4.2.2). */
        if (vlen == 7 && name_is(value, vlen, "upgrade"))
            return append_line(&r->headers, name, nlen, value, vlen);
        return -EPERM;
    }
    if (name_is(name, nlen, "content-type")) {
        if (UNLIKELY(r->has_content_type))
            return -EEXIST;
        r->has_content_type = 1;
    }
    return append_line(&r->headers, name, nlen, value, vlen);
}

/* Fields that cannot be trailers (resp_add_trailer): framing, routing, the connection's own, and
 * those that say how to read the content, which a recipient needs before it (RFC 9110 6.5.1). */
static int trailer_forbidden(const char *name, size_t nlen)
{
    static const char *const names[] = {
        "content-length", "transfer-encoding", "trailer",          "host",
        "connection",     "keep-alive",        "proxy-connection", "te",
        "upgrade",        "content-type",      "content-encoding", "content-range",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (name_is(name, nlen, names[i]))
            return 1;
    return 0;
}

int resp_add_trailer(struct cyserve_response *r, const char *name, size_t nlen, const char *value,
                     size_t vlen)
{
    if (UNLIKELY(!field_ok(name, nlen, value, vlen)))
        return -EINVAL;
    if (UNLIKELY(trailer_forbidden(name, nlen)))
        return -EPERM;
    int rc = append_line(&r->trailers, name, nlen, value, vlen);
    if (LIKELY(!rc))
        r->own_head |= RESP_OWN_TRAILERS;
    return rc;
}

int resp_set_reason(struct cyserve_response *r, const char *reason, size_t len)
{
    /* RFC 9112 4: reason-phrase = 1*( HTAB / SP / VCHAR / obs-text ), the bytes a header value
     * may hold; a CR or LF would end the status line early and start headers of the handler's. */
    if (UNLIKELY(!value_ok(reason, len)))
        return -EINVAL;
    char *copy = resp_arena_alloc(&r->arena, len);
    if (UNLIKELY(!copy))
        return -ENOMEM;
    if (len)
        memcpy(copy, reason, len);
    r->reason = copy;
    r->reason_len = len;
    r->own_head |= RESP_OWN_REASON;
    return 0;
}

int resp_set_content_type(struct cyserve_response *r, const char *value, size_t vlen)
{
    /* resp_add_header's checks, less those of a name known to be valid and not reserved. */
    if (UNLIKELY(!value_ok(value, vlen)))
        return -EINVAL;
    if (UNLIKELY(r->has_content_type))
        return -EEXIST;
    r->has_content_type = 1;
    return append_line(&r->headers, "Content-Type", 12, value, vlen);
}

int resp_write(struct cyserve_response *r, const void *data, size_t len)
{
    if (UNLIKELY(len && !data))
        return -EINVAL;
    if (UNLIKELY(r->body_static || r->body_fd >= 0))
        return -EEXIST;
    return wbuf_append(&r->body, data, len);
}

int resp_set_body_static(struct cyserve_response *r, const void *data, size_t len)
{
    if (UNLIKELY(len && !data))
        return -EINVAL;
    if (UNLIKELY(r->body_static || r->body.len))
        return -EEXIST;
    /* An empty static body is an empty body: nothing to remember. A non-NULL pointer marks the
     * body as set, so that a later resp_write is refused either way. */
    r->body_static = len ? data : "";
    r->body_static_len = len;
    return 0;
}

int resp_set_body_lent(struct cyserve_response *r, const void *data, size_t len,
                       struct resp_lease *lease)
{
    if (UNLIKELY(!data || !lease))
        return -EINVAL;
    if (UNLIKELY(r->body_static || r->body.len || r->body_fd >= 0))
        return -EEXIST;
    r->body_static = len ? data : "";
    r->body_static_len = len;
    r->lease = lease;
    return 0;
}

void resp_body_return_lent(struct cyserve_response *r)
{
    resp_lease_give_back(r->lease);
    r->lease = NULL;
    r->body_static = NULL;
    r->body_static_len = 0;
}

int resp_set_body_file(struct cyserve_response *r, int fd, uint64_t offset, uint64_t len)
{
    if (UNLIKELY(fd < 0))
        return -EINVAL;
    if (UNLIKELY(r->body_static || r->body.len || r->body_fd >= 0))
        return -EEXIST;
    r->body_fd = fd;
    r->body_file_offset = offset;
    r->body_file_len = len;
    return 0;
}

int resp_set_head_length(struct cyserve_response *r, int64_t n)
{
    if (UNLIKELY(n < 0 && n != RESP_LENGTH_UNKNOWN))
        return -EINVAL;
    r->head_length = n;
    return 0;
}

int resp_set_stream(struct cyserve_response *r, void *stream, int64_t length)
{
    /* A lent first piece is fine (it goes back before the next piece is asked for); a static
     * body or a file cannot be followed by pieces. */
    if (UNLIKELY(!stream || (r->body_static && !r->lease) || r->body_fd >= 0 || length < -1))
        return -EINVAL;
    r->stream = stream;
    r->stream_length = length;
    return 0;
}

int resp_set_defer(struct cyserve_response *r, void *h)
{
    if (UNLIKELY(!h))
        return -EINVAL;
    r->defer = h;
    return 0;
}

int resp_take(struct cyserve_response *dst, struct cyserve_response *src)
{
    int rc = 0;
    dst->status = src->status;
    dst->close = src->close;
    dst->has_content_type = src->has_content_type;
    dst->own_head = src->own_head;
    dst->head_length = src->head_length;
    dst->stream = src->stream;
    dst->stream_length = src->stream_length;
    if (src->reason_len) {
        char *reason = resp_arena_alloc(&dst->arena, src->reason_len);
        if (reason) {
            memcpy(reason, src->reason, src->reason_len);
            dst->reason = reason;
            dst->reason_len = src->reason_len;
        } else {
            rc = -ENOMEM;
        }
    }
    if (!rc && src->headers.len)
        rc = wbuf_append(&dst->headers, src->headers.ptr, src->headers.len);
    if (!rc && UNLIKELY(src->trailers.len))
        rc = wbuf_append(&dst->trailers, src->trailers.ptr, src->trailers.len);
    size_t blen;
    const char *body = resp_body(src, &blen);
    if (!rc && blen)
        rc = wbuf_append(&dst->body, body, blen);
    if (src->body_fd >= 0) {
        /* A file body (an ASGI pathsend) moves with its descriptor, not its bytes; dst is
         * empty, so it has no body to clash with. On -ENOMEM it moves all the same: dst's reset
         * closes it with the rest of the answer. */
        dst->body_fd = src->body_fd;
        dst->body_file_offset = src->body_file_offset;
        dst->body_file_len = src->body_file_len;
        src->body_fd = -1;
    }
    resp_reset(src);
    return rc;
}

void *resp_alloc(struct cyserve_response *r, size_t size)
{
    return resp_arena_alloc(&r->arena, size);
}
