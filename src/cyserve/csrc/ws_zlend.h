/* ws_zlend.h: a worker thread's zlib streams for permessage-deflate, lent for one message
 * (prefix wsz_).
 *
 * A deflater with a 32 KiB window costs about 260 KiB allocated (zlib's figure at memLevel 8;
 * its 64 KiB hash table is cleared, so touched, on every reset) and an inflater about 40 KiB.
 * Kept per connection for context takeover, the two make an idle WebSocket that used them about
 * a hundred KiB. A connection that negotiated no context takeover either way (RFC 7692 7.1.1.1
 * and 7.1.1.2: a server may add both to its answer, whatever the offer said) needs a stream only
 * while one message is compressed or inflated, so each thread keeps one deflater, one inflater
 * and the inflated message's buffer (up to WSZ_BUF_KEEP) and lends them. The deflater is never
 * lent across a yield (wsz_deflate compresses into the thread's buffer, the caller copies it out
 * before it yields); an inflater stays with a connection whose compressed message is still
 * arriving in pieces, and the thread makes another meanwhile if it must. A stream that failed is
 * freed, not lent again. A thread's streams are freed when it exits (a pthread key's
 * destructor). Every function here runs on the thread that reads or writes the connection. */
#ifndef CYSERVE_WS_ZLEND_H
#define CYSERVE_WS_ZLEND_H

#include <stddef.h>

#include "ws.h"

/* A buffer kept for the thread's next message up to this size; larger ones are freed. */
#define WSZ_BUF_KEEP (64u << 10)

/* Before inflating a compressed message's first frame: lend z (negotiated with
 * client_no_context_takeover) this thread's inflater and msg its buffer, those they lack
 * (ws_pmd_inflate makes an inflater when none is lent; msg grows as it needs). */
void wsz_borrow_in(struct ws_pmd *z, struct ws_buf *msg);

/* Once the message is whole (its last frame inflated: ws_pmd_inflate reset the inflater) or
 * failed (dirty = 1: the inflater is freed, not lent again): take z's inflater back, or free it
 * when the thread already holds one; z->in is NULL after. msg, when not NULL, is taken back or
 * freed the same way (NULL: the caller still reads it and gives it back with wsz_return_buf). */
void wsz_return_in(struct ws_pmd *z, struct ws_buf *msg, int dirty);

/* Give back (or free) a message buffer lent by wsz_borrow_in; msg is empty after. */
void wsz_return_buf(struct ws_buf *msg);

/* Compress p[0..n) as permessage-deflate sends a message (ws_pmd_deflate) with this thread's
 * deflater for messages of that size (a short message's has a smaller hash table, cheaper to
 * reset), made for window p->server_max_window_bits, reset after. *out is the thread's buffer
 * holding the payload: valid until the thread's next wsz_deflate, so the caller copies it before
 * it yields. 0, -ENOMEM or -EIO (the caller then sends the message uncompressed, which is always
 * allowed). */
int wsz_deflate(const struct ws_pmd_params *p, const char *src, size_t n,
                const struct ws_buf **out);

#endif
