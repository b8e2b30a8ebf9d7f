/* wbuf.h: growable byte buffers (prefix wbuf_), the room where response bytes are gathered
 * before the engine writes them: a buffer starts in storage its owner provides (often on the
 * coroutine stack) and moves to the heap only when it outgrows it.
 *
 * Error convention: 0 or -ENOMEM. No I/O, and no sharing between threads: a buffer belongs to
 * whoever initialised it (the coroutine serving a request, a response, a test). */
#ifndef CYSERVE_WBUF_H
#define CYSERVE_WBUF_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* A byte buffer that starts in caller-provided storage (often on the coroutine stack) and moves
 * to the heap when it outgrows it. */
struct wbuf {
    char *ptr;
    size_t len;
    size_t cap;
    char *heap; /* == ptr once on the heap, else NULL */
};

/* Start b empty over storage[0..cap) (storage may be NULL with cap 0). Any thread. Inline, as
 * wbuf_free: resp_init and resp_free use them on every request of the inline path, and a call
 * into another file each would cost more than the stores. */
static inline void wbuf_init(struct wbuf *b, char *storage, size_t cap)
{
    b->ptr = storage;
    b->len = 0;
    b->cap = storage ? cap : 0;
    b->heap = NULL;
}

/* The slow half of wbuf_reserve: move to a larger heap buffer. Returns 0 or -ENOMEM. */
int wbuf_grow(struct wbuf *b, size_t extra);

/* Make room for extra more bytes. Returns 0 or -ENOMEM (b unchanged). Inline: on every
 * response's path, and nearly always a comparison. */
static inline int wbuf_reserve(struct wbuf *b, size_t extra)
{
    if (__builtin_expect(b->cap - b->len >= extra, 1))
        return 0;
    return wbuf_grow(b, extra);
}

/* Append n bytes. Returns 0 or -ENOMEM. */
static inline int wbuf_append(struct wbuf *b, const void *data, size_t n)
{
    int rc = wbuf_reserve(b, n);
    if (__builtin_expect(rc != 0, 0))
        return rc;
    if (n)
        memcpy(b->ptr + b->len, data, n);
    b->len += n;
    return 0;
}

/* Free heap storage, if any; b must be wbuf_init()ed again before reuse. */
static inline void wbuf_free(struct wbuf *b)
{
    free(b->heap);
    b->heap = b->ptr = NULL;
    b->len = b->cap = 0;
}

#endif
