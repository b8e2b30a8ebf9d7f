/* ws_zlend.c: a worker thread's zlib streams, lent for one message; ws_zlend.h has the design. */
#include "ws_zlend.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "compat.h"

/* The deflater's memLevel for a message shorter than WSZ_SMALL. Each message starts from a reset
 * deflater, and zlib's reset clears the hash table, 2^(memLevel + 8) bytes: 64 KiB at its
 * default 8, most of the cost of compressing a message of a few hundred bytes, which a table of
 * 2 KiB (memLevel 3) serves as well (the same output on such messages). Longer ones get the
 * default table, whose fewer collisions they need. */
#define WSZ_SMALL 2048
#define WSZ_SMALL_MEM_LEVEL 3

struct wsz_cache {
    struct ws_pmd z;       /* z.in: the inflater not lent; z.out: the deflater for long messages */
    struct ws_pmd zs;      /* zs.out: the deflater for messages under WSZ_SMALL */
    struct ws_buf in_buf;  /* an inflated message's buffer */
    struct ws_buf out_buf; /* a compressed message's, used and emptied within one send */
};

static pthread_key_t wsz_key;
static pthread_once_t wsz_once = PTHREAD_ONCE_INIT;
static int wsz_key_ok;

static void wsz_cache_free(void *arg)
{
    struct wsz_cache *zc = arg;
    ws_pmd_free(&zc->z);
    ws_pmd_free(&zc->zs);
    free(zc->in_buf.ptr);
    free(zc->out_buf.ptr);
    free(zc);
}

static void wsz_key_make(void)
{
    wsz_key_ok = pthread_key_create(&wsz_key, wsz_cache_free) == 0;
}

/* This thread's cache, made on first use; NULL when out of memory (the caller then makes and
 * frees its streams itself). */
static struct wsz_cache *wsz_cache(void)
{
    pthread_once(&wsz_once, wsz_key_make);
    if (UNLIKELY(!wsz_key_ok))
        return NULL;
    struct wsz_cache *zc = pthread_getspecific(wsz_key);
    if (!zc) {
        zc = calloc(1, sizeof(*zc));
        if (zc && pthread_setspecific(wsz_key, zc) != 0) {
            free(zc);
            zc = NULL;
        }
    }
    return zc;
}

void wsz_borrow_in(struct ws_pmd *z, struct ws_buf *msg)
{
    struct wsz_cache *zc = wsz_cache();
    if (!zc)
        return;
    if (!z->in && zc->z.in) {
        z->in = zc->z.in;
        zc->z.in = NULL;
    }
    if (!msg->ptr && zc->in_buf.ptr) {
        *msg = zc->in_buf;
        memset(&zc->in_buf, 0, sizeof(zc->in_buf));
    }
}

void wsz_return_buf(struct ws_buf *msg)
{
    struct wsz_cache *zc = msg->ptr ? wsz_cache() : NULL;
    if (msg->ptr && zc && !zc->in_buf.ptr && msg->cap <= WSZ_BUF_KEEP)
        zc->in_buf = *msg;
    else
        free(msg->ptr);
    memset(msg, 0, sizeof(*msg));
}

void wsz_return_in(struct ws_pmd *z, struct ws_buf *msg, int dirty)
{
    struct wsz_cache *zc = dirty ? NULL : wsz_cache();
    struct ws_pmd spare;
    ws_pmd_init(&spare, &z->p);
    if (z->in && zc && !zc->z.in)
        zc->z.in = z->in;
    else
        spare.in = z->in;
    z->in = NULL;
    z->ended = 0;
    ws_pmd_free(&spare);
    if (msg)
        wsz_return_buf(msg);
}

int wsz_deflate(const struct ws_pmd_params *p, const char *src, size_t n, const struct ws_buf **out)
{
    struct wsz_cache *zc = wsz_cache();
    if (UNLIKELY(!zc))
        return -ENOMEM;
    if (zc->out_buf.cap > WSZ_BUF_KEEP) {
        free(zc->out_buf.ptr); /* a large message's room is not kept for the thread's life */
        memset(&zc->out_buf, 0, sizeof(zc->out_buf));
    }
    /* The thread's deflater for the message's size, unless it was made for another window (a
     * client asked for a smaller one): that one is freed, and the one made for this message kept
     * instead. z.p.server_max_window_bits says the window of the deflater kept in z.out. */
    struct ws_pmd *kept = n < WSZ_SMALL ? &zc->zs : &zc->z;
    if (kept->out && kept->p.server_max_window_bits != p->server_max_window_bits) {
        struct ws_pmd old = *kept;
        old.in = NULL;
        ws_pmd_free(&old);
        kept->out = NULL;
    }
    struct ws_pmd z;
    ws_pmd_init(&z, p);
    z.p.server_no_context_takeover = 1; /* reset after the message: it goes back clean */
    z.mem_level = n < WSZ_SMALL ? WSZ_SMALL_MEM_LEVEL : 0;
    z.out = kept->out; /* ws_pmd_deflate makes one when none is lent */
    kept->out = NULL;
    int rc = ws_pmd_deflate(&z, src, n, &zc->out_buf);
    if (rc == 0) {
        kept->out = z.out; /* back to the thread, reset by ws_pmd_deflate */
        kept->p.server_max_window_bits = p->server_max_window_bits;
        z.out = NULL;
    }
    ws_pmd_free(&z); /* one that failed midway: not reset, so not lent again */
    *out = &zc->out_buf;
    return rc;
}
