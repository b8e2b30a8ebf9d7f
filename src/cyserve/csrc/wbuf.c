/* wbuf.c: growable byte buffers (wbuf_), the out-of-line half of wbuf.h: growth.
 *
 * Single-threaded by construction: a buffer belongs to one owner, so no atomics are needed. */
#include "wbuf.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compat.h"

int wbuf_grow(struct wbuf *b, size_t extra)
{
    if (UNLIKELY(extra > SIZE_MAX / 2 - b->len))
        return -ENOMEM;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra)
        cap *= 2;
    char *p;
    if (b->heap) {
        p = realloc(b->heap, cap);
        if (UNLIKELY(!p))
            return -ENOMEM;
    } else {
        p = malloc(cap);
        if (UNLIKELY(!p))
            return -ENOMEM;
        if (b->len)
            memcpy(p, b->ptr, b->len);
    }
    b->heap = b->ptr = p;
    b->cap = cap;
    return 0;
}
