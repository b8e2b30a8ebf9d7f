/* http2.c: HTTP/2 (RFC 9113) served by a connection's coroutine, on libnghttp2.
 *
 * What the library does and what this file does. libnghttp2 is the frame layer: it parses and
 * writes frames, keeps the HPACK tables (RFC 7541), the stream states and both directions of
 * flow control, validates the request's header fields (pseudo-headers, connection-specific
 * fields, content-length against DATA), answers PING and SETTINGS, and queues GOAWAY and
 * RST_STREAM for the errors it finds. It does no I/O: this file feeds it the bytes the
 * connection's transport read (nghttp2_session_mem_recv) and writes what it produces
 * (nghttp2_session_mem_send) with conn_sendv, so HTTP/2 runs over plain TCP and over TLS alike.
 * What this file adds is the request side: each stream's header fields and body are gathered
 * into a struct request of its own, dispatched by the request core like an HTTP/1.1 request
 * (request_dispatch: the same router and handlers), and its struct request_answer framed as a
 * HEADERS frame (the answer's header lines, lower-cased, connection-specific ones dropped) and
 * DATA frames pulled by the library as the flow-control windows allow.
 *
 * One coroutine owns the session; tasks run the handlers. The connection's coroutine (the
 * "serving coroutine") is the only code that touches the library's session and the socket: it
 * reads, feeds, frames and writes. A stream whose request is complete and whose answer needs a
 * handler's call (a Python handler, WSGI, ASGI, or a GIL-free handler that has not earned the
 * inline path, http1_inline.h) gets a task: a coroutine of its own (h2_task), spawned on the
 * worker, which any idle worker may steal, that runs request_dispatch() on the stream's own
 * struct request, and the next pieces of a streamed answer the same way (stream_next). A
 * Python call in a task goes through the worker's offload batch and its relief threads exactly
 * as an HTTP/1.1 call does; a GIL-free call runs in the task, so that the GIL-free streams of
 * one connection run on several workers at once. A finished task puts its stream on h->done
 * (under h->lock) and sets a signal that the serving coroutine waits on beside the socket
 * (sched_io_wait_signal), which then frames the answer as HEADERS and DATA. So a slow handler
 * holds back neither the other streams of its connection nor its reads, writes, PINGs and
 * window updates. Static and file routes, 404s and 405s, and quick GIL-free handlers are
 * answered by the serving coroutine at once: they cannot be slow, and a task would only add a
 * coroutine's cost to them.
 *
 * Why tasks hand answers back rather than write them: nghttp2's session is not thread-safe, a
 * TLS session may not be used from two threads at once, and HPACK's tables need the frames in
 * the order they were encoded; one user of the session and the socket keeps all three true
 * without a lock on the request path. The rule a task keeps: it touches its own stream's
 * request and answer and nothing of the connection but what the serving coroutine made before
 * it started it (the peer's address and request_client's answer, h2_task_start) or what is
 * safe from any thread (the socket peek of a Python call whose client may have left). While a
 * stream is busy the serving coroutine reads none of its request and answer and does not free
 * it, even when the client resets it (the answer is then dropped when it comes). The serving
 * coroutine never leaves while tasks run: a connection that ends (the client left, an error)
 * waits for its tasks first (h2_tasks_finish); only when a stop has cancelled that wait (its
 * grace period is over, handoff_cancel_all ends it, since the signal is a handoff's, tracked
 * while tasks run) does the last task close the connection instead.
 *
 * Memory stays bounded: a task exists only for a stream the library accepted, so
 * SETTINGS_MAX_CONCURRENT_STREAMS (100 by default) bounds a connection's tasks, their stacks
 * and their requests; each streamed answer holds one piece at a time as before. A stop waits
 * for the handlers at work before it sends GOAWAY (after their answers, so that clients that
 * take GOAWAY as the end read them), and refuses streams opened meanwhile (REFUSED_STREAM).
 * The session (struct h2_session) lives in c->proto_data, so that a connection with no stream
 * open goes idle as an HTTP/1 one does: no coroutine, no stack, no read buffer, only the
 * session's tables; the next readiness spawns the coroutine again (http2_on_readable). After
 * 100 ms idle even those are set aside (h2_park): the session's pack, the mapping that holds
 * it and the library's session-long blocks, is given back, and a copy of the words that differ
 * from the first session's is kept until the connection is woken (h2_of).
 *
 * Bounded memory. A stream's header fields are held to max_header_bytes (counted as RFC 9113
 * counts SETTINGS_MAX_HEADER_LIST_SIZE: name, value and 32 bytes each) and max_headers (past
 * either: 431, without its body); decoding a header block past four times that ends the
 * connection (the CONTINUATION flood). A body is held to max_body_bytes (413) and to the
 * server's body budget (503). SETTINGS_MAX_CONCURRENT_STREAMS bounds the streams (the library
 * refuses more). The output buffer is flushed at 64 KiB, and a client that stops reading is
 * dropped after body_timeout without progress (conn_sendv). A stream's answer is pulled by the
 * library frame by frame: a streamed Python answer holds one piece at a time.
 *
 * Bodies that stream. A stream whose handler reads bodies as streams (a Python handler or a WSGI
 * app with a large or unannounced body, an ASGI app always) is dispatched at its HEADERS; its
 * DATA waits in a buffer of one window for the handler's reads, and the session opens the
 * windows itself (NGHTTP2_OPT_NO_AUTO_WINDOW_UPDATE): only for the bytes the handler took, so
 * flow control is the backpressure and a stream holds at most H2_BODY_CAP of its body. Bodies
 * read whole are consumed as they arrive, as the library did by itself.
 *
 * Timeouts. A connection with no stream open is idle under keepalive_timeout. With streams open
 * (a body still arriving, answers held back by a zero window) and no handler at work, the client
 * has body_timeout from its last progress (a byte of a body in or of an answer out, a stream
 * closed): then GOAWAY and close, so that a stalled window cannot hold a connection open, not
 * even with PINGs or other frames that carry nothing sent meanwhile.
 *
 * Floods. More than HTTP2_RESETS_PER_S RST_STREAM frames (the rapid reset attack, CVE-2023-
 * 44487: streams opened and cancelled at once cost the server their headers and dispatch), or
 * more than HTTP2_CONTROL_PER_S SETTINGS and PING frames, within one second end the connection
 * with GOAWAY ENHANCE_YOUR_CALM. The library also bounds the control frames it must acknowledge
 * while the client does not read (nghttp2's max_outbound_ack).
 *
 * A stop. While the server drains, the coroutine sends GOAWAY with the last stream it took,
 * answers the streams already open and closes; an idle HTTP/2 connection is closed by the
 * worker like an idle HTTP/1 one. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "http2.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "access_log.h"
#include "body.h"
#include "clock.h"
#include "handoff.h"
#include "http1.h"
#include "http1_inline.h"
#include "request.h"
#include "server_int.h"
#include "stream.h"

/* What a stream whose body streams to its handler may hold of it: the library's default
 * SETTINGS_INITIAL_WINDOW_SIZE, which the server does not change, so the client may not send
 * more before the handler's reads open the window again. */
#define H2_BODY_CAP NGHTTP2_INITIAL_WINDOW_SIZE
/* A handler's wait for DATA is cut in slices this long, to see a stop's deadline. */
#define H2_BODY_WAIT_SLICE_NS 100000000ull

/* The library's allocations from this size on are mapped apart (h2_mem): its outbound frame
 * buffer (one chunk of 16,394 bytes, NGHTTP2_FRAMEBUF_CHUNKLEN, made with the session and kept
 * for its life) is the largest thing an idle connection would otherwise hold. */
#define H2_BIG_MIN 8192
/* Blocks whose size is a power of two from this size on are the library's tables, made with the
 * session, so mapped apart too: the stream map's buckets (4 KiB in nghttp2 1.52), all zero again
 * once no stream is left, so that an idle connection gives that page back. (The HPACK entry
 * arrays, 1 KiB each, stay in malloc: the server's own is written with every answer, and a
 * page of their own would cost more than they do.) */
#define H2_TABLE_MIN 4096
/* The size of that frame buffer chunk: 9 bytes of frame header, 1 of padding length, 16,384 of
 * payload (nghttp2's NGHTTP2_FRAMEBUF_CHUNKLEN, not in its public header). */
#define H2_FRAMEBUF_LEN (9 + 1 + 16384)
/* The blocks the library makes with a session and keeps for its life (in nghttp2 1.52: the
 * session's structure, 2,928 bytes, the two HPACK entry arrays, 1 KiB each, a 48-byte buffer
 * chain, the stream map's 4 KiB buckets and the 16,394-byte frame buffer) are laid out in one
 * mapping of this size (h2_pack_alloc), so that an idle connection can set them aside
 * (h2_park). A block that does not fit (another version of the library) is made as any other. */
#define H2_PACK_LEN (8 * 4096)
/* An idle connection's session is set aside (h2_park) once it has been idle this long: a
 * connection that is woken again at once (a client's next requests) pays nothing for it. */
#define H2_PARK_AFTER_NS 100000000ull
/* The blocks handed out from the pack, at most. */
#define H2_PACK_BLOCKS 8
/* The pack is set aside in chunks of this many 8-byte words (h2_pack_save). */
#define H2_CHUNK_WORDS 64

/* Output bytes gathered before a write. */
#define H2_OUT_FLUSH_AT 65536
/* A read buffer of this size is kept while a coroutine serves the connection. */
#define H2_READ_BUF 16384
/* How many of the client's latest stream ids are remembered as opened or not. */
#define H2_SEEN_IDS 256

struct h2_session;

struct h2_stream {
    struct h2_session *h;
    int32_t id;
    struct h2_stream *prev, *next; /* h->streams, in the order they were opened */
    int ready;                     /* the request is complete (or refused): answer it */
    int answered;                  /* its answer is submitted */
    int req_done;                  /* END_STREAM received */
    int closed;                    /* the library closed it: free it */
    int fail_status;               /* 431, 413, 503, 400: answered without dispatch */
    const char *fail_why;
    size_t hbytes; /* header list size so far (RFC 9113 6.5.2) */
    size_t tbytes; /* the same for its trailers, and their number (h2_on_trailer) */
    unsigned tcount;
    /* Header fields: names and values in hstore; while they arrive hdrs[] holds offsets into
     * it, made pointers once the block is complete (hstore may move as it grows). */
    struct wbuf hstore;
    struct http_header *hdrs;
    unsigned nhdrs, hcap;
    size_t method_off, method_len, path_off, path_len, auth_off, auth_len;
    int have_method, have_path, have_auth, have_host;
    struct wbuf cookie; /* cookie fields joined with "; " (RFC 9113 8.2.3) */
    struct wbuf body;
    uint64_t body_held; /* bytes of the server's body budget this stream holds */
    /* The answer being sent: memory src[src_off..src_len), or fleft bytes of file fd from foff,
     * and for a streamed answer its stream (pieces pulled with stream_next). */
    int status;
    const char *src;
    size_t src_len, src_off;
    int fd;
    uint64_t foff, fleft;
    void *pystream;
    int more;      /* a streamed answer has more pieces */
    int need_next; /* the library waits for the next piece (deferred) */
    /* A streamed answer of a status without content (1xx, 204, 304): its HEADERS frame ended
     * the stream, and its pieces are pulled and dropped until the producer ends, as HTTP/1's
     * send_stream does, so that the producer runs to its end as it would for a body sent
     * rather than being told the client left. The stream is kept until then (h2_sweep). */
    int drain;
    int64_t limit; /* a streamed answer's announced length left, or -1 */
    uint64_t sent; /* body bytes handed to the library */
    uint64_t t0;   /* clock_mono_ns() when its head was complete, with metrics on */
    /* A task (a coroutine of its own, h2_task) works on the stream: its handler's call
     * (H2_TASK_DISPATCH) or the next piece of its streamed answer (H2_TASK_NEXT). While busy
     * only the task touches rq and the answer's fields; the serving coroutine neither frees
     * the stream nor reads them until it took the stream from h->done. */
    int busy;
    int task_op;
    int task_rc;                 /* what the task's call returned */
    int task_more;               /* H2_TASK_NEXT: stream_next's *more */
    struct h2_stream *done_next; /* h->done */
    /* A body streamed to its handler (bstream, h2_body_begin): the DATA the serving coroutine
     * received (h2_body_put) that the handler's reads (h2_body_pull, on the call's thread) have
     * not taken, bbuf[bpos..blen), under blk. The handler's reads open the window
     * (bunacked: taken and not yet given back with nghttp2_session_consume, which the serving
     * coroutine does on the signal bsig asked for), so the client sends no more than
     * H2_BODY_CAP ahead of the handler. */
    int bstream;
    pthread_mutex_t blk;
    pthread_cond_t bcv;
    char *bbuf;
    size_t bpos, blen;
    uint64_t bgot;     /* DATA bytes received */
    uint64_t bunacked; /* taken by the handler, not yet consumed in the library's windows */
    int beof;          /* END_STREAM received */
    int bgone;         /* the stream closed before its end (a reset) or the connection ended */
    int bdead;         /* the handler is done with the body: DATA is dropped on arrival */
    int bsig;          /* the serving coroutine was signalled for bunacked */
    int bfail;         /* -EFBIG past max_body_bytes, -EMSGSIZE trailers past theirs, else 0 */
    struct sched_signal *bwatch; /* set on news for a task watching (http2_stream_watch) */
    struct body_reader br;       /* rq.body_rd while bstream */
    struct request rq;           /* last: large */
};

enum { H2_TASK_DISPATCH = 1, H2_TASK_NEXT };

struct h2_session {
    nghttp2_session *ng;
    struct conn *c;
    struct server *srv;
    struct h2_stream *streams, *last;
    unsigned nstreams;
    int goaway;       /* GOAWAY for a stop is submitted */
    int fatal;        /* end the connection once what is queued is written */
    struct wbuf out;  /* frames not yet written; only while a coroutine serves */
    uint64_t flood_t; /* the second the flood counters count in (ns, monotonic) */
    unsigned resets, controls;
    /* While streams are open and no handler works: since when (sched_now_ns) the client has
     * made no progress, the start of body_timeout (h2_serve_loop); 0 when the clock is to start
     * again at the next wait (progress: DATA in or out, a stream closed, a handler's turn). */
    uint64_t stall_t;
    /* The client's stream ids: the highest that began a HEADERS frame, and which of the
     * H2_SEEN_IDS ids up to it did (bit (id / 2) % H2_SEEN_IDS), see h2_on_begin_frame. */
    int32_t max_id;
    uint64_t seen[H2_SEEN_IDS / 64];
    /* Of those, the ones the server reset (a RST_STREAM sent): see h2_on_begin_frame. */
    uint64_t reset[H2_SEEN_IDS / 64];
    /* Where the input is, frame by frame (h2_feed): bytes of the client preface or of a
     * frame's payload still to come, and a frame's head read in part. */
    uint32_t in_left;
    unsigned in_hlen;
    uint8_t in_head[9];
    /* The tasks (h2_task): how many run, the streams whose task has finished (h->done), and
     * whether the serving coroutine has left while some still ran (a stop cancelled its wait:
     * the last task then closes the connection). Under lock; a task that finishes sets
     * chan->ready, the signal the serving coroutine waits on beside the socket (tracked by the
     * server while tasks run, so that a stop's handoff_cancel_all ends that wait). */
    pthread_mutex_t lock;
    unsigned tasks;
    struct h2_stream *done;
    int orphan;
    /* While a stop waits for handlers at work before its GOAWAY: INT32_MIN | the last stream
     * the GOAWAY names (streams above it are refused); 0 otherwise. */
    int32_t drain_last;
    struct handoff *chan;
    int chan_tracked;
    unsigned bstreams; /* streams whose body streams to their handler (h2_body_begin) */
    /* The library's large blocks made after the session (a large frame's inbound buffer, a
     * grown stream map), mapped apart so that an idle connection gives their pages back
     * (h2_mem_idle). */
    struct h2_big *bigs;
    /* The pack (h2_pack_alloc): one mapping that holds this structure, first, and the blocks
     * the library makes with the session (packing); [pack_used, pack_top) is free, pack_chunks
     * says which of its 512-byte chunks hold a block other than the frame buffer, pack_scratch
     * is the offset of the frame buffer (its pages hold nothing between frames), or
     * H2_PACK_LEN. NULL when the mapping could not be made: then this structure is malloc'd
     * and never set aside. While the connection is idle all of it is set aside (h2_park), this
     * structure with it: c->proto_data is then the copy, tagged (h2_of). */
    char *pack;
    size_t pack_used, pack_top, pack_scratch;
    uint64_t pack_chunks;
    unsigned npack;
    int packing;
};

/* One of the library's blocks mapped apart (h2_mem_mapped): the block is the mapping, from its
 * start; this record of it is malloc'd, so that every page of the block can be given back. */
struct h2_big {
    struct h2_big *next, *prev;
    void *map;
    size_t size; /* what the library asked for */
    size_t map_len;
};

static const char h2_preface[] = HTTP2_PREFACE;

int http2_preface_match(const char *buf, size_t len)
{
    size_t n = len < HTTP2_PREFACE_LEN ? len : HTTP2_PREFACE_LEN;
    if (memcmp(buf, h2_preface, n) != 0)
        return 0;
    return len >= HTTP2_PREFACE_LEN ? 1 : 2;
}

/* ---- streams ---- */

static void h2_body_close(struct h2_session *h, struct h2_stream *st);

static struct h2_stream *h2_stream_new(struct h2_session *h, int32_t id)
{
    struct h2_stream *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    st->h = h;
    st->id = id;
    st->fd = -1;
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC); /* the clock clock_mono_ns reads */
    pthread_cond_init(&st->bcv, &a);
    pthread_condattr_destroy(&a);
    pthread_mutex_init(&st->blk, NULL);
    st->limit = -1;
    wbuf_init(&st->hstore, NULL, 0);
    wbuf_init(&st->cookie, NULL, 0);
    wbuf_init(&st->body, NULL, 0);
    resp_init(&st->rq.resp);
    st->rq.c = h->c;
    st->rq.srv = h->srv;
    st->rq.client_done = REQUEST_CLIENT_NO_HEAD;
    st->rq.http2 = 1;
    st->prev = h->last;
    if (h->last)
        h->last->next = st;
    else
        h->streams = st;
    h->last = st;
    h->nstreams++;
    return st;
}

static void h2_budget_release(struct h2_stream *st)
{
    if (st->body_held) {
        /* safety: a counter that only bounds memory (as http1.c's). */
        atomic_fetch_sub_explicit(&st->h->srv->body_held, st->body_held, memory_order_relaxed);
        st->body_held = 0;
    }
}

/* Free st, giving back what its answer holds. in_coro: called from the serving coroutine (a
 * streamed answer's stream can then go back to its handler; otherwise it cannot be here). */
static void h2_stream_free(struct h2_stream *st, int in_coro)
{
    struct h2_session *h = st->h;
    if (st->pystream && in_coro)
        stream_abandon(&st->rq, st->rq.answer.t, st->pystream);
    st->pystream = NULL;
    if (st->answered) {
        if (UNLIKELY(h->srv->cfg.access_log_fd >= 0) && in_coro) {
            access_log_note(&st->rq, st->status, (int64_t)st->sent);
            access_log_write(&st->rq);
        }
        request_answer_done(&st->rq);
    } else if (st->rq.defer) {
        request_leave_defer(&st->rq);
    }
    resp_free(&st->rq.resp);
    h2_budget_release(st);
    if (st->bstream) {
        h2_body_close(h, st);
        body_end(&st->br); /* its stream slot, when a handler's reader held one */
        free(st->bbuf);
        h->bstreams--;
    }
    pthread_cond_destroy(&st->bcv);
    pthread_mutex_destroy(&st->blk);
    wbuf_free(&st->hstore);
    wbuf_free(&st->cookie);
    wbuf_free(&st->body);
    free(st->hdrs);
    if (st->prev)
        st->prev->next = st->next;
    else
        h->streams = st->next;
    if (st->next)
        st->next->prev = st->prev;
    else
        h->last = st->prev;
    h->nstreams--;
    if (h->ng && !st->closed)
        nghttp2_session_set_stream_user_data(h->ng, st->id, NULL);
    free(st);
}

static struct h2_stream *h2_stream_of(nghttp2_session *ng, int32_t id)
{
    return nghttp2_session_get_stream_user_data(ng, id);
}

/* Refuse st's request with status (431, 413, 503): answered as soon as possible, without its
 * body, whose further bytes are dropped. */
static void h2_stream_fail(struct h2_stream *st, int status, const char *why)
{
    if (st->fail_status)
        return;
    st->fail_status = status;
    st->fail_why = why;
    wbuf_free(&st->body);
    wbuf_init(&st->body, NULL, 0);
    h2_budget_release(st);
}

/* ---- bodies streamed to their handler ---- */

/* The handler is done with st's streamed body: what it holds or did not give back is consumed
 * in the library's windows (the connection's window must not shrink for good), and DATA still
 * to come is dropped on arrival. Idempotent. The serving coroutine. */
static void h2_body_close(struct h2_session *h, struct h2_stream *st)
{
    if (!st->bstream)
        return;
    pthread_mutex_lock(&st->blk);
    size_t drop = st->blen - st->bpos + st->bunacked;
    st->bdead = 1;
    st->bpos = st->blen = 0;
    st->bunacked = 0;
    pthread_mutex_unlock(&st->blk);
    if (drop && h->ng)
        nghttp2_session_consume(h->ng, st->id, drop);
}

/* Give the library back the window the handlers' reads freed, so that it sends WINDOW_UPDATE:
 * the flow control that paces a streamed upload by its handler. The serving coroutine. */
static void h2_bodies_ack(struct h2_session *h)
{
    if (!h->bstreams)
        return;
    for (struct h2_stream *st = h->streams; st; st = st->next) {
        if (!st->bstream)
            continue;
        pthread_mutex_lock(&st->blk);
        uint64_t k = st->bunacked;
        st->bunacked = 0;
        st->bsig = 0;
        pthread_mutex_unlock(&st->blk);
        if (k)
            nghttp2_session_consume(h->ng, st->id, (size_t)k);
    }
}

/* The client will send no more of st's body (a reset, or the connection ends): a handler
 * waiting for it is woken and reads -ECONNRESET after what was buffered. Any time in the
 * serving coroutine. */
static void h2_body_gone(struct h2_stream *st)
{
    pthread_mutex_lock(&st->blk);
    st->bgone = 1;
    pthread_cond_broadcast(&st->bcv);
    if (st->bwatch)
        sched_signal_set(st->bwatch);
    pthread_mutex_unlock(&st->blk);
}

/* DATA for st's streamed body: kept for the handler (the window bounds it to H2_BODY_CAP), or
 * dropped and consumed at once when the handler is done with the body or it broke
 * max_body_bytes. The serving coroutine (a library callback). */
static void h2_body_put(struct h2_session *h, struct h2_stream *st, const uint8_t *data, size_t len)
{
    size_t drop = 0;
    pthread_mutex_lock(&st->blk);
    if (st->bdead || st->bfail) {
        drop = len;
    } else if ((st->bgot += len) > h->srv->cfg.max_body_bytes) {
        st->bfail = -EFBIG; /* the handler reads it after what it holds is dropped */
        drop = len + st->blen - st->bpos;
        st->bpos = st->blen = 0;
    } else {
        if (st->blen + len > H2_BODY_CAP) {
            memmove(st->bbuf, st->bbuf + st->bpos, st->blen - st->bpos);
            st->blen -= st->bpos;
            st->bpos = 0;
        }
        /* The library refuses DATA past the window (FLOW_CONTROL_ERROR) before this callback,
         * and the window counts what is held here: it always fits. */
        memcpy(st->bbuf + st->blen, data, len);
        st->blen += len;
    }
    pthread_cond_signal(&st->bcv);
    if (st->bwatch)
        sched_signal_set(st->bwatch);
    pthread_mutex_unlock(&st->blk);
    if (drop)
        nghttp2_session_consume(h->ng, st->id, drop);
}

/* body_read for an HTTP/2 stream's body (struct body_reader's pull): what the serving
 * coroutine received, waiting for it on st's condition variable (the caller is a handler's call
 * on a thread, its GIL released) within body_timeout per wait and a stop's grace period. What it
 * takes is given back to the window by the serving coroutine, woken through the tasks' signal
 * once per turn. The call's thread, while st's task runs (st is not freed meanwhile). */
static ssize_t h2_body_pull(struct body_reader *br, void *dst, size_t n, int line)
{
    struct h2_stream *st = br->pull_data;
    struct server *s = br->s;
    if (br->err)
        return br->err;
    uint64_t deadline = clock_mono_ns() + s->cfg.body_timeout_ns;
    int err = 0, status = 0;
    const char *why = NULL;
    pthread_mutex_lock(&st->blk);
    for (;;) {
        size_t k = st->blen - st->bpos;
        if (k) {
            if (k > n)
                k = n;
            if (line) {
                const char *nl = memchr(st->bbuf + st->bpos, '\n', k);
                if (nl)
                    k = (size_t)(nl - (st->bbuf + st->bpos)) + 1;
            }
            memcpy(dst, st->bbuf + st->bpos, k);
            st->bpos += k;
            st->bunacked += k;
            int wake = !st->bsig;
            st->bsig = 1;
            pthread_mutex_unlock(&st->blk);
            br->taken += k;
            if (wake)
                sched_signal_set(&st->h->chan->ready);
            return (ssize_t)k;
        }
        if (st->bfail == -EMSGSIZE) { /* after the body: its trailers broke a limit */
            err = st->bfail, status = 431, why = "request trailer section too large";
            break;
        }
        if (st->bfail) {
            err = st->bfail, status = 413, why = "request body too large";
            break;
        }
        if (st->beof) {
            pthread_mutex_unlock(&st->blk);
            return 0;
        }
        if (st->bgone) {
            err = -ECONNRESET, why = "the client reset the stream before the request body ended";
            break;
        }
        uint64_t now = clock_mono_ns();
        if (body_stop_due(s, now)) {
            err = -ECANCELED, why = "the server stopped during the request body";
            break;
        }
        if (now >= deadline) {
            err = -ETIMEDOUT, status = 408, why = "request body timed out";
            break;
        }
        uint64_t until = deadline - now > H2_BODY_WAIT_SLICE_NS ? now + H2_BODY_WAIT_SLICE_NS
                                                                : deadline;
        struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
        pthread_cond_timedwait(&st->bcv, &st->blk, &ts);
    }
    pthread_mutex_unlock(&st->blk);
    return body_fail(br, err, status, why);
}

/* Stream st's body to its handler rather than gather it: its request is dispatched now, and
 * its DATA kept for the handler's reads (h2_body_put, h2_body_pull). The caller took one of the
 * server's stream slots (body_slot_take), which st's reader now holds. 0 or -ENOMEM. The
 * serving coroutine. */
static int h2_body_begin(struct h2_session *h, struct h2_stream *st, int reader)
{
    st->bbuf = malloc(H2_BODY_CAP);
    if (!st->bbuf)
        return -ENOMEM;
    st->bstream = 1;
    h->bstreams++;
    if (!reader) {
        /* An ASGI app: its task takes the pieces as receive() asks (http2_body_take). */
        st->rq.body_left = 1;
        return 0;
    }
    struct body_reader *br = &st->br;
    memset(br, 0, sizeof(*br));
    br->c = h->c;
    br->s = h->srv;
    br->fd = -1;
    br->length = st->rq.head.content_length;
    br->slot = 1;
    br->pull = h2_body_pull;
    br->pull_data = st;
    st->rq.body_rd = br;
    return 0;
}

static struct h2_stream *h2_stream_of_rq(struct request *rq)
{
    return (struct h2_stream *)(void *)((char *)rq - offsetof(struct h2_stream, rq));
}

void http2_stream_watch(struct request *rq, struct sched_signal *wake)
{
    struct h2_stream *st = h2_stream_of_rq(rq);
    pthread_mutex_lock(&st->blk);
    st->bwatch = wake;
    if (st->bgone || st->blen > st->bpos || st->beof)
        sched_signal_set(wake); /* news from before the watch */
    pthread_mutex_unlock(&st->blk);
}

void http2_stream_unwatch(struct request *rq)
{
    struct h2_stream *st = h2_stream_of_rq(rq);
    pthread_mutex_lock(&st->blk);
    st->bwatch = NULL;
    pthread_mutex_unlock(&st->blk);
}

int http2_stream_gone(struct request *rq)
{
    struct h2_stream *st = h2_stream_of_rq(rq);
    pthread_mutex_lock(&st->blk);
    /* While its task runs, a stream closes only by a reset (the answer is not sent yet). */
    int gone = st->bgone || st->bfail;
    pthread_mutex_unlock(&st->blk);
    return gone;
}

int http2_body_take(struct request *rq, char *dst, size_t max, size_t *n, int *more)
{
    struct h2_stream *st = h2_stream_of_rq(rq);
    int rc = 0, wake = 0;
    pthread_mutex_lock(&st->blk);
    size_t k = st->blen - st->bpos;
    if (st->bfail) {
        /* The body broke a limit: what it held was dropped, so an END_STREAM that came after
         * must not read as the body's end (the app would take a cut body for the whole). */
        rc = -ECONNRESET;
    } else if (k || st->beof) {
        if (k > max)
            k = max;
        memcpy(dst, st->bbuf + st->bpos, k);
        st->bpos += k;
        st->bunacked += k;
        wake = k && !st->bsig;
        st->bsig |= wake;
        *n = k;
        *more = !st->beof || st->bpos < st->blen;
        rc = 1;
    } else if (st->bgone) {
        rc = -ECONNRESET;
    }
    pthread_mutex_unlock(&st->blk);
    if (wake)
        sched_signal_set(&st->h->chan->ready);
    return rc;
}

/* ---- floods ---- */

/* Count one frame of a kind that floods cost; 1 when the connection passed its bound. */
static int h2_flood(struct h2_session *h, unsigned *count, unsigned max)
{
    uint64_t now = clock_mono_ns();
    if (now - h->flood_t >= 1000000000ull) {
        h->flood_t = now;
        h->resets = h->controls = 0;
    }
    return ++*count > max;
}

/* A header or trailer block decoded past four times max_header_bytes (CONTINUATION frames
 * without end, or an HPACK bomb: a large field indexed once and referenced many times): the
 * connection ends with GOAWAY ENHANCE_YOUR_CALM, as the other floods. The stream is reset at
 * once (the library calls for none of the block's other fields), so that no more of it is
 * counted. Returns what the header callback returns for that. */
static int h2_block_flood(struct h2_session *h)
{
    h->fatal = 1;
    nghttp2_session_terminate_session(h->ng, NGHTTP2_ENHANCE_YOUR_CALM);
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
}

/* ---- the library's callbacks (all run inside nghttp2_session_mem_recv/mem_send, so in the
 * serving coroutine) ---- */

/* A new id: opened (on) or skipped, and not reset by the server (yet). */
static void h2_seen_set(struct h2_session *h, int32_t id, int on)
{
    unsigned bit = ((uint32_t)id >> 1) % H2_SEEN_IDS;
    if (on)
        h->seen[bit / 64] |= 1ull << (bit % 64);
    else
        h->seen[bit / 64] &= ~(1ull << (bit % 64));
    h->reset[bit / 64] &= ~(1ull << (bit % 64));
}

/* Whether id is one of the client's latest H2_SEEN_IDS ids, and then its bit in seen and reset. */
static int h2_seen_bit(const struct h2_session *h, int32_t id, unsigned *bit)
{
    if (!(id & 1) || id > h->max_id || (h->max_id - id) / 2 >= H2_SEEN_IDS)
        return 0;
    *bit = ((uint32_t)id >> 1) % H2_SEEN_IDS;
    return 1;
}

/* A HEADERS or DATA frame's head for id, a stream the client opened, arrives (the frames before
 * it fed): if the library no longer knows the stream and the server did not reset it, the
 * stream is closed, and the frame the connection error STREAM_CLOSED (h2_on_begin_frame). */
static void h2_closed_check(struct h2_session *h, int32_t id)
{
    unsigned bit;
    if (!h2_seen_bit(h, id, &bit))
        return;
    uint64_t mask = 1ull << (bit % 64);
    if ((h->seen[bit / 64] & mask) && !(h->reset[bit / 64] & mask) &&
        !nghttp2_session_find_stream(h->ng, id))
        nghttp2_session_terminate_session(h->ng, NGHTTP2_STREAM_CLOSED);
}

/* A new stream's id must be greater than every id the client used before (RFC 9113 5.1.1).
 * The library ignores a HEADERS frame for a lower id that it no longer knows (it cannot tell
 * a new stream from trailers for a stream it forgot), so the ids the client opened are
 * remembered here, the latest H2_SEEN_IDS of them: a HEADERS frame for a lower id that was
 * never opened is the PROTOCOL_ERROR the RFC asks for. The library forgets a stream as soon as
 * it is closed (nghttp2_option_set_no_closed_streams, so that an idle session holds none), and
 * then ignores its frames; but a HEADERS or DATA frame on a stream the client opened, which is
 * closed now, and not by a RST_STREAM of the server's (whose frames in flight are to be
 * ignored), is the connection error STREAM_CLOSED (RFC 9113 5.1, "closed"). The library calls
 * this for a DATA frame only on a stream it knows, so DATA heads are found by h2_feed. */
static int h2_on_begin_frame(nghttp2_session *ng, const nghttp2_frame_hd *hd, void *ud)
{
    struct h2_session *h = ud;
    int32_t id = hd->stream_id;
    if (hd->type != NGHTTP2_HEADERS || !(id & 1))
        return 0;
    if (id > h->max_id) {
        int32_t from = h->max_id + 2;
        if ((id - from) / 2 >= H2_SEEN_IDS) {
            memset(h->seen, 0, sizeof(h->seen));
            memset(h->reset, 0, sizeof(h->reset));
        } else {
            for (int32_t k = from; k < id; k += 2)
                h2_seen_set(h, k, 0); /* skipped: idle, closed by this one unopened */
        }
        h2_seen_set(h, id, 1);
        h->max_id = id;
        return 0;
    }
    unsigned bit;
    if (!h2_seen_bit(h, id, &bit))
        return 0;
    if (!(h->seen[bit / 64] & (1ull << (bit % 64))))
        nghttp2_session_terminate_session(ng, NGHTTP2_PROTOCOL_ERROR);
    else
        h2_closed_check(h, id);
    return 0;
}

static int h2_on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
    struct h2_session *h = ud;
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct h2_stream *st = h2_stream_new(h, f->hd.stream_id);
    if (!st)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* refused with RST_STREAM */
    nghttp2_session_set_stream_user_data(ng, f->hd.stream_id, st);
    return 0;
}

static int h2_add_field(struct h2_stream *st, const uint8_t *name, size_t nlen,
                        const uint8_t *value, size_t vlen)
{
    const struct server *s = st->h->srv;
    if (st->nhdrs == st->hcap) {
        unsigned cap = st->hcap ? st->hcap * 2 : 16;
        struct http_header *n = realloc(st->hdrs, cap * sizeof(*n));
        if (!n)
            return -ENOMEM;
        st->hdrs = n;
        st->hcap = cap;
    }
    if (st->nhdrs >= s->cfg.limits.max_headers) {
        h2_stream_fail(st, 431, "too many header fields");
        return 0;
    }
    size_t off = st->hstore.len;
    if (wbuf_append(&st->hstore, name, nlen) || wbuf_append(&st->hstore, value, vlen))
        return -ENOMEM;
    struct http_header *hd = &st->hdrs[st->nhdrs++];
    hd->name = (const char *)(uintptr_t)off;
    hd->name_len = nlen;
    hd->value = (const char *)(uintptr_t)(off + nlen);
    hd->value_len = vlen;
    return 0;
}

/* One field of st's request trailers: validated by the library and not handed to handlers, but
 * held to the bounds of a chunked body's trailer section over HTTP/1.1 (max_header_bytes, counted
 * as SETTINGS_MAX_HEADER_LIST_SIZE counts, and max_headers): past them the request is refused
 * with 431 before its dispatch, or its streamed body's next read fails with 431 (an ASGI app is
 * told http.disconnect). A trailer block past four times the bound ends the connection, as a
 * header block does: without it, CONTINUATION frames of trailers could go on without end. 0 or
 * NGHTTP2_ERR_CALLBACK_FAILURE. The serving coroutine. */
static int h2_on_trailer(struct h2_session *h, struct h2_stream *st, size_t nlen, size_t vlen)
{
    const struct server *s = h->srv;
    st->tbytes += nlen + vlen + 32;
    if (st->tbytes > 4 * s->cfg.limits.max_header_bytes + 65536)
        return h2_block_flood(h);
    if (++st->tcount <= s->cfg.limits.max_headers && st->tbytes <= s->cfg.limits.max_header_bytes)
        return 0;
    if (!st->bstream) {
        h2_stream_fail(st, 431, "request trailer section too large");
        return 0;
    }
    pthread_mutex_lock(&st->blk);
    if (!st->bfail)
        st->bfail = -EMSGSIZE;
    pthread_cond_signal(&st->bcv);
    if (st->bwatch)
        sched_signal_set(st->bwatch);
    pthread_mutex_unlock(&st->blk);
    return 0;
}

static int h2_on_header(nghttp2_session *ng, const nghttp2_frame *f, const uint8_t *name,
                        size_t nlen, const uint8_t *value, size_t vlen, uint8_t flags, void *ud)
{
    struct h2_session *h = ud;
    struct h2_stream *st = h2_stream_of(ng, f->hd.stream_id);
    if (!st || f->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (f->headers.cat != NGHTTP2_HCAT_REQUEST)
        return h2_on_trailer(h, st, nlen, vlen);
    const struct server *s = h->srv;
    st->hbytes += nlen + vlen + 32;
    if (st->hbytes > 4 * s->cfg.limits.max_header_bytes + 65536)
        return h2_block_flood(h); /* a header block without end: the connection */
    if (st->hbytes > s->cfg.limits.max_header_bytes)
        h2_stream_fail(st, 431, "request header fields too large");
    if (st->fail_status)
        return 0;
    if (nlen && name[0] == ':') {
        size_t off = st->hstore.len;
        if (wbuf_append(&st->hstore, value, vlen))
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        if (nlen == 7 && memcmp(name, ":method", 7) == 0) {
            st->method_off = off, st->method_len = vlen, st->have_method = 1;
        } else if (nlen == 5 && memcmp(name, ":path", 5) == 0) {
            st->path_off = off, st->path_len = vlen, st->have_path = 1;
        } else if (nlen == 10 && memcmp(name, ":authority", 10) == 0) {
            st->auth_off = off, st->auth_len = vlen, st->have_auth = 1;
        }
        return 0;
    }
    if (nlen == 6 && memcmp(name, "cookie", 6) == 0) {
        if ((st->cookie.len && wbuf_append(&st->cookie, "; ", 2)) ||
            wbuf_append(&st->cookie, value, vlen))
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        return 0;
    }
    if (nlen == 4 && memcmp(name, "host", 4) == 0)
        st->have_host = 1;
    return h2_add_field(st, name, nlen, value, vlen) ? NGHTTP2_ERR_CALLBACK_FAILURE : 0;
}

/* The header block of st is complete: the request's head, as the request core reads it. */
static int h2_make_head(struct h2_stream *st)
{
    if (!st->fail_status) {
        if (st->cookie.len && h2_add_field(st, (const uint8_t *)"cookie", 6,
                                           (const uint8_t *)st->cookie.ptr, st->cookie.len))
            return -ENOMEM;
        /* :authority stands for Host (RFC 9113 8.3.1): handlers and WSGI read Host. */
        if (st->have_auth && !st->have_host &&
            h2_add_field(st, (const uint8_t *)"host", 4,
                         (const uint8_t *)st->hstore.ptr + st->auth_off, st->auth_len))
            return -ENOMEM;
    }
    char *base = st->hstore.ptr;
    for (unsigned i = 0; i < st->nhdrs; i++) {
        struct http_header *hd = &st->hdrs[i];
        hd->name = base + (uintptr_t)hd->name;
        hd->value = base + (uintptr_t)hd->value;
    }
    struct http_request *r = &st->rq.head;
    memset(r, 0, sizeof(*r));
    static const char empty[] = "";
    r->method = st->have_method ? base + st->method_off : "GET";
    r->method_len = st->have_method ? st->method_len : 3;
    r->method_id = HTTP_OTHER;
    for (int m = HTTP_GET; m < HTTP_METHOD_COUNT; m++) {
        const char *n = http_method_name((enum http_method)m);
        if (strlen(n) == r->method_len && memcmp(n, r->method, r->method_len) == 0) {
            r->method_id = (enum http_method)m;
            break;
        }
    }
    /* CONNECT has no :path: its authority is its target. */
    if (st->have_path) {
        r->target = base + st->path_off;
        r->target_len = st->path_len;
    } else if (st->have_auth) {
        r->target = base + st->auth_off;
        r->target_len = st->auth_len;
    } else {
        r->target = empty;
        r->target_len = 0;
    }
    r->path = r->target;
    r->path_len = r->target_len;
    const char *q = memchr(r->target, '?', r->target_len);
    if (q) {
        r->path_len = (size_t)(q - r->target);
        r->query = q + 1;
        r->query_len = r->target_len - r->path_len - 1;
    }
    r->minor_version = 1;
    r->headers = st->hdrs;
    r->num_headers = st->nhdrs;
    r->content_length = -1;
    r->keep_alive = 1;
    if (st->have_auth) {
        r->host = base + st->auth_off;
        r->host_len = st->auth_len;
    }
    for (unsigned i = 0; i < st->nhdrs; i++) {
        const struct http_header *hd = &st->hdrs[i];
        if (hd->name_len == 14 && memcmp(hd->name, "content-length", 14) == 0) {
            uint64_t v = 0;
            for (size_t k = 0; k < hd->value_len && v < (1ull << 60); k++)
                v = v * 10 + (uint64_t)(hd->value[k] - '0'); /* digits: the library checked */
            r->content_length = (int64_t)v;
        } else if (!st->have_auth && hd->name_len == 4 && memcmp(hd->name, "host", 4) == 0) {
            r->host = hd->value;
            r->host_len = hd->value_len;
        }
    }
    st->rq.hdrs = st->hdrs;
    st->rq.max_headers = st->nhdrs;
    st->rq.client_done = REQUEST_CLIENT_TODO;
    if (r->content_length >= 0 && (uint64_t)r->content_length > st->h->srv->cfg.max_body_bytes)
        h2_stream_fail(st, 413, "request body too large");
    return 0;
}

/* Whether st's request asks for 100 Continue (RFC 9110 10.1.1; over HTTP/2 as over HTTP/1.1). */
static int h2_expects_continue(const struct h2_stream *st)
{
    const char *v;
    size_t vlen;
    return request_header_value(&st->rq, "expect", 6, &v, &vlen) && vlen == 12 &&
           strncasecmp(v, "100-continue", 12) == 0;
}

/* A request with a body to come asked for 100 Continue: routing first, as HTTP/1 does. A route
 * that reads the body gets the client's body after an interim 100; any other answer (404,
 * 405, a static or file route) is the answer at once, and the client never sends the body
 * for nothing (its stream is reset with NO_ERROR once answered: h2_on_frame_send). 0 or -1. */
static int h2_continue(struct h2_session *h, struct h2_stream *st)
{
    if (!request_reads_body(&st->rq)) {
        st->ready = 1;
        return 0;
    }
    nghttp2_nv nv = {(uint8_t *)":status", (uint8_t *)"100", 7, 3, NGHTTP2_NV_FLAG_NONE};
    return nghttp2_submit_headers(h->ng, NGHTTP2_FLAG_NONE, st->id, NULL, &nv, 1, NULL) ? -1 : 0;
}

/* Whether st's body should stream to its handler: 2 for an ASGI app (request_streams_body:
 * receive() asks for each piece, whatever the body's size, as over HTTP/1.1); 1 for a handler
 * that reads bodies as streams (request_body_streams: a Python handler or a WSGI app) when
 * the body is not known to be small (no content-length, or one over BODY_STREAM_MIN), as over
 * HTTP/1.1 (it then needs a stream slot); else 0. */
static int h2_body_streams(struct h2_session *h, struct h2_stream *st)
{
    if (!h->srv->router) /* a session without routes: the request side's unit tests */
        return 0;
    if (request_streams_body(&st->rq))
        return 2;
    int64_t cl = st->rq.head.content_length;
    return (cl < 0 || cl > BODY_STREAM_MIN) && request_body_streams(&st->rq);
}

static int h2_on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
    struct h2_session *h = ud;
    switch (f->hd.type) {
    case NGHTTP2_RST_STREAM:
        if (h2_flood(h, &h->resets, HTTP2_RESETS_PER_S))
            goto calm;
        return 0;
    case NGHTTP2_SETTINGS:
    case NGHTTP2_PING:
        if (!(f->hd.flags & NGHTTP2_FLAG_ACK) && h2_flood(h, &h->controls, HTTP2_CONTROL_PER_S))
            goto calm;
        return 0;
    case NGHTTP2_HEADERS:
    case NGHTTP2_DATA:
        break;
    default:
        return 0;
    }
    struct h2_stream *st = h2_stream_of(ng, f->hd.stream_id);
    if (!st)
        return 0;
    if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST) {
        if (h2_make_head(st))
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        if (UNLIKELY(h->srv->cfg.access_log_fd >= 0)) {
            st->rq.log_have_req = 1;
            st->rq.log_t0 = clock_mono_ns();
        }
        if (UNLIKELY(h->srv->metrics_on))
            st->t0 = clock_mono_ns();
        if (st->fail_status)
            st->ready = 1; /* refused before its body: answered at once */
        else if (!(f->hd.flags & NGHTTP2_FLAG_END_STREAM) && h2_expects_continue(st) &&
                 h2_continue(h, st))
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        int streams = !st->fail_status && !st->ready && !(f->hd.flags & NGHTTP2_FLAG_END_STREAM)
                          ? h2_body_streams(h, st)
                          : 0;
        if (streams == 2 || (streams == 1 && body_slot_take(h->srv))) {
            if (h2_body_begin(h, st, streams == 1) < 0) {
                if (streams == 1)
                    body_slot_give(h->srv);
                h2_stream_fail(st, 503, "no memory for the request body");
            }
            st->ready = 1; /* its handler is called now and reads the body as it comes */
        }
    }
    if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) {
        st->req_done = 1;
        st->ready = 1;
        if (st->bstream) {
            pthread_mutex_lock(&st->blk);
            st->beof = 1;
            pthread_cond_signal(&st->bcv);
            if (st->bwatch)
                sched_signal_set(st->bwatch);
            pthread_mutex_unlock(&st->blk);
        }
    }
    return 0;
calm:
    h->fatal = 1;
    nghttp2_session_terminate_session(ng, NGHTTP2_ENHANCE_YOUR_CALM);
    return 0;
}

static int h2_on_data(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                      size_t len, void *ud)
{
    struct h2_session *h = ud;
    struct h2_stream *st = h2_stream_of(ng, id);
    h->stall_t = 0; /* a body's bytes: progress */
    if (st && st->bstream) {
        h2_body_put(h, st, data, len);
        return 0;
    }
    /* The session opens the windows itself (NGHTTP2_OPT_NO_AUTO_WINDOW_UPDATE, for the bodies
     * that stream): a body read whole is taken as it arrives, within its own limits. */
    nghttp2_session_consume(ng, id, len);
    if (!st || st->fail_status || st->ready)
        return 0;
    struct server *s = h->srv;
    if (st->body.len + len > s->cfg.max_body_bytes) {
        h2_stream_fail(st, 413, "request body too large");
        st->ready = 1;
        return 0;
    }
    uint64_t cap = s->cfg.body_budget;
    if (cap) {
        /* safety: relaxed, a counter that only bounds memory. A stream may always hold a body
         * when nothing else is held, so that one body as large as the budget passes. */
        uint64_t cur = atomic_fetch_add_explicit(&s->body_held, len, memory_order_relaxed);
        st->body_held += len;
        if (cur + len > cap && cur != st->body_held - len) {
            h2_stream_fail(st, 503, "too many request bodies in progress");
            st->ready = 1;
            return 0;
        }
    }
    if (wbuf_append(&st->body, data, len))
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    return 0;
}

static int h2_on_stream_close(nghttp2_session *ng, int32_t id, uint32_t code, void *ud)
{
    struct h2_stream *st = h2_stream_of(ng, id);
    ((struct h2_session *)ud)->stall_t = 0; /* a stream done: progress */
    if (st) {
        st->closed = 1; /* freed by the loop, outside the library's calls */
        h2_body_gone(st);
    }
    return 0;
}

static int h2_on_frame_send(nghttp2_session *ng, const nghttp2_frame *f, void *ud)
{
    struct h2_session *h = ud;
    unsigned bit;
    if (f->hd.type == NGHTTP2_DATA)
        h->stall_t = 0; /* an answer's bytes went out: the client's window let them, progress */
    if (f->hd.type == NGHTTP2_RST_STREAM && h2_seen_bit(h, f->hd.stream_id, &bit)) {
        h->reset[bit / 64] |= 1ull << (bit % 64); /* what the client still sends is ignored */
        return 0;
    }
    if ((f->hd.type != NGHTTP2_DATA && f->hd.type != NGHTTP2_HEADERS) ||
        !(f->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    struct h2_stream *st = h2_stream_of(ng, f->hd.stream_id);
    /* The answer is complete while the request is not (refused, or answered before its body
     * ended): the client stops sending it (RFC 9113 8.1). */
    if (st && !st->req_done)
        nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
    return 0;
}

static int h2_submit_trailers(nghttp2_session *ng, struct h2_stream *st);

/* The body of st ends with this DATA frame: *flags gets EOF, and NO_END_STREAM when trailers
 * follow (h2_submit_trailers queued their HEADERS frame, which carries END_STREAM instead). */
static void h2_body_eof(nghttp2_session *ng, struct h2_stream *st, uint32_t *flags)
{
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    if (UNLIKELY(st->rq.resp.trailers.len) && h2_submit_trailers(ng, st) == 0)
        *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
}

/* DATA for st, as much as length: from memory, the file, or the streamed answer's piece. */
static ssize_t h2_read_body(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                            uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    struct h2_stream *st = src->ptr;
    if (st->fd >= 0) {
        size_t want = st->fleft < length ? (size_t)st->fleft : length;
        ssize_t n;
        do
            n = pread(st->fd, buf, want, (off_t)st->foff);
        while (n < 0 && errno == EINTR);
        if (n <= 0 && want)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* the file shrank: reset */
        st->foff += (uint64_t)n;
        st->fleft -= (uint64_t)n;
        st->sent += (uint64_t)n;
        if (!st->fleft)
            h2_body_eof(ng, st, flags);
        return n;
    }
    size_t n = st->src_len - st->src_off;
    if (n > length)
        n = length;
    if (st->limit >= 0 && (uint64_t)n > (uint64_t)st->limit)
        n = (size_t)st->limit; /* never more than announced */
    /* An empty body may have no memory at all (src NULL): memcpy from NULL is undefined even
     * for no bytes, so none is copied then. */
    if (n)
        memcpy(buf, st->src + st->src_off, n);
    st->src_off += n;
    st->sent += n;
    if (st->limit >= 0)
        st->limit -= (int64_t)n;
    int rest = st->src_off < st->src_len && st->limit != 0;
    if (!rest && st->pystream && st->more && st->limit != 0) {
        if (!n) {
            st->need_next = 1;
            return NGHTTP2_ERR_DEFERRED;
        }
        return (ssize_t)n; /* the next call asks for the next piece */
    }
    /* A streamed body that ended short of the content-length its HEADERS announced: ending
     * the stream would make a malformed answer (RFC 9113 8.1.1), which the client could take
     * for a whole one. The reset says it is incomplete, as the close does on HTTP/1.1. */
    if (UNLIKELY(!rest && st->limit > 0))
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (!rest)
        h2_body_eof(ng, st, flags);
    return (ssize_t)n;
}

/* ---- answers ---- */

static int h2_is_hop_field(const char *n, size_t len)
{
    /* Connection-specific fields have no place in HTTP/2 (RFC 9113 8.2.2); the length is the
     * engine's to announce. */
    static const char *const drop[] = {"connection",        "keep-alive", "proxy-connection",
                                       "transfer-encoding", "upgrade",    "content-length"};
    for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++)
        if (strlen(drop[i]) == len && strncasecmp(drop[i], n, len) == 0)
            return 1;
    return 0;
}

/* Header lines "Name: value\r\n" into nva (at most max), names lower-cased into low (as long
 * as lines). Returns the count. */
static size_t h2_lines_to_nv(const char *lines, size_t len, nghttp2_nv *nva, size_t max, char *low)
{
    size_t n = 0, i = 0;
    while (i < len && n < max) {
        const char *nl = memchr(lines + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - lines) : len;
        const char *line = lines + i;
        size_t llen = end - i;
        if (llen && line[llen - 1] == '\r')
            llen--;
        const char *colon = memchr(line, ':', llen);
        if (colon && colon > line) {
            size_t nlen = (size_t)(colon - line);
            const char *v = colon + 1;
            size_t vlen = llen - nlen - 1;
            while (vlen && (*v == ' ' || *v == '\t'))
                v++, vlen--;
            while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
                vlen--;
            if (!h2_is_hop_field(line, nlen)) {
                char *ln = low + i;
                for (size_t k = 0; k < nlen; k++) {
                    char ch = line[k];
                    ln[k] = ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch;
                }
                nva[n++] = (nghttp2_nv){(uint8_t *)ln, (uint8_t *)v, nlen, vlen,
                                        NGHTTP2_NV_FLAG_NONE};
            }
        }
        i = end + 1;
    }
    return n;
}

static int h2_count_lines(const char *lines, size_t len)
{
    int n = 0;
    for (size_t i = 0; i < len; i++)
        n += lines[i] == '\n';
    return n + 1;
}

/* Queue st's trailers (st->rq.resp.trailers, lines checked by resp_add_trailer) as the HEADERS
 * frame that ends its stream (RFC 9113 8.1), when the client accepts them (TE: trailers, the
 * only TE an HTTP/2 request may carry). Called from the data provider at the body's end, as
 * nghttp2_submit_trailer allows; the library copies the fields. 0 when queued, -1 when there is
 * nothing to send (the DATA frame then ends the stream) or no memory. The serving coroutine. */
static int h2_submit_trailers(nghttp2_session *ng, struct h2_stream *st)
{
    const struct wbuf *t = &st->rq.resp.trailers;
    if (!request_accepts_trailers(&st->rq))
        return -1;
    size_t max = (size_t)h2_count_lines(t->ptr, t->len);
    nghttp2_nv *nva = malloc(max * sizeof(*nva) + t->len);
    if (!nva)
        return -1;
    size_t n = h2_lines_to_nv(t->ptr, t->len, nva, max, (char *)(nva + max));
    int rc = n ? nghttp2_submit_trailer(ng, st->id, nva, n) : -1;
    free(nva);
    return rc ? -1 : 0;
}

/* Submit st's answer (st->rq.answer): its HEADERS and, unless there is no body, a data
 * provider. 0 or -ENOMEM. */
static int h2_submit(struct h2_session *h, struct h2_stream *st)
{
    struct request_answer *a = &st->rq.answer;
    struct cyserve_response *r = &st->rq.resp;
    int head_only = st->rq.head.method_id == HTTP_HEAD;
    int status = a->status;
    int bodyless = status < 200 || status == 204 || status == 304;
    /* A 205 has no content either (RFC 9110 15.3.6), but says so: content-length: 0. */
    int reset_content = status == 205;
    const char *lines = a->lines;
    size_t lines_len = a->lines_len;
    int own_server = a->own_head & RESP_OWN_SERVER;
    uint64_t length = a->length;
    int have_length = 1;
    st->status = status;
    st->answered = 1;
    switch (a->kind) {
    case REQUEST_BODY_STATIC: {
        /* The serialised HTTP/1 head: its lines after the status line (Server among them). */
        const struct server_target *t = a->t;
        const char *nl = memchr(t->static_head, '\n', t->static_head_len);
        lines = nl ? nl + 1 : t->static_head;
        lines_len = t->static_head_len - (size_t)(lines - t->static_head);
        own_server = 1;
        st->src = t->static_body;
        st->src_len = t->static_body_len;
        break;
    }
    case REQUEST_BODY_STREAM:
        if (!r->has_content_type && !bodyless && !reset_content &&
            wbuf_append(&r->headers, "Content-Type: text/plain; charset=utf-8\r\n", 41))
            return -ENOMEM;
        lines = r->headers.ptr;
        lines_len = r->headers.len;
        own_server = r->own_head & RESP_OWN_SERVER;
        st->pystream = r->stream;
        r->stream = NULL;
        st->more = 1;
        st->limit = r->stream_length;
        have_length = r->stream_length >= 0;
        length = have_length ? (uint64_t)r->stream_length : 0;
        st->src = resp_body(r, &st->src_len);
        break;
    case REQUEST_BODY_FILE:
        st->fd = a->fd;
        st->foff = a->offset;
        st->fleft = a->body_len;
        break;
    default:
        st->src = a->body;
        st->src_len = a->body_len;
        break;
    }
    if (length == REQUEST_LENGTH_NONE)
        have_length = 0;
    if (UNLIKELY(reset_content)) {
        have_length = 1;
        length = 0;
        bodyless = 1; /* no DATA: the HEADERS frame ends the stream */
    }
    /* The server's own fields (--header, Server unless the answer has its own; a static head
     * holds them already). */
    const struct http_head *head = &h->srv->cfg.head;
    size_t skip = own_server ? head->server_len : 0;
    size_t dl_len = a->kind == REQUEST_BODY_STATIC ? 0 : head->len - skip;
    const char *dl = dl_len ? head->lines + skip : "";
    size_t max = (size_t)h2_count_lines(lines, lines_len) + (size_t)h2_count_lines(dl, dl_len) + 4;
    nghttp2_nv *nva = malloc(max * sizeof(*nva) + lines_len + dl_len + 1);
    if (!nva)
        return -ENOMEM;
    char *low = (char *)(nva + max);
    char st3[4], clen[24];
    snprintf(st3, sizeof(st3), "%03d", status);
    size_t n = 0;
    nva[n++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)st3, 7, 3, NGHTTP2_NV_FLAG_NONE};
    n += h2_lines_to_nv(dl, dl_len, nva + n, max - n, low + lines_len);
    if (!head->no_date)
        nva[n++] = (nghttp2_nv){(uint8_t *)"date", (uint8_t *)http1_date(), 4, HTTP_DATE_LEN,
                                NGHTTP2_NV_FLAG_NONE};
    if ((!bodyless || reset_content) && have_length) {
        int cl = snprintf(clen, sizeof(clen), "%llu", (unsigned long long)length);
        nva[n++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)clen, 14, (size_t)cl,
                                NGHTTP2_NV_FLAG_NONE};
    }
    n += h2_lines_to_nv(lines, lines_len, nva + n, max - n, low);
    int nobody = head_only || bodyless || (st->fd < 0 && !st->src_len && !st->pystream) ||
                 (st->fd >= 0 && !st->fleft) || st->limit == 0;
    /* An empty whole body with trailers the client takes (a gRPC error with no message): a DATA
     * frame of none, and the trailers' HEADERS end the stream, as after a streamed body. */
    if (UNLIKELY(nobody) && UNLIKELY(r->trailers.len) && !head_only && !bodyless && !st->pystream &&
        request_accepts_trailers(&st->rq))
        nobody = 0;
    nghttp2_data_provider prd = {.source.ptr = st, .read_callback = h2_read_body};
    int rc = nghttp2_submit_response(h->ng, st->id, nva, n, nobody ? NULL : &prd);
    free(nva);
    if (nobody && st->pystream) {
        if (bodyless && !head_only && !rc) {
            st->drain = 1; /* the piece in hand is dropped; the next is asked for */
            st->need_next = 1;
        } else if (head_only || rc) {
            /* An answer to HEAD is complete with its head, as on HTTP/1 (send_stream). */
            stream_abandon(&st->rq, a->t, st->pystream);
            st->pystream = NULL;
        }
        /* Otherwise an announced length of 0, which the HEADERS frame ends: the stream is let
         * go once that is sent (h2_stream_free), as one whose DATA filled its length is, and
         * not here, where the frame has not left yet: letting go reads the rest of a WSGI
         * generator (native/wsgi.pyx, _stream_step), which may take as long as the app likes
         * (an endless one: for ever), and the answer must not wait for it (HTTP/1 sends the
         * head first too). */
    }
    return rc ? -ENOMEM : 0;
}

/* Count st's answer, status, in Server.stats() (--max-requests counts streams as requests) and
 * in the metrics, like an HTTP/1.1 answer: a refusal of the engine's (fail_status) as a
 * rejection, a routed answer by its route's kind and with its duration. */
static void h2_count(struct h2_session *h, struct h2_stream *st, int status)
{
    struct server *s = h->srv;
    /* safety: this thread's own counter, as in http1.c. */
    struct server_worker *mine = server_worker_self(s);
    atomic_store_explicit(&mine->answered,
                          atomic_load_explicit(&mine->answered, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    if (LIKELY(!s->metrics_on))
        return;
    if (st->fail_status)
        metrics_note_reject(server_metrics_self(s), status);
    else
        metrics_note_request(server_metrics_self(s), st->rq.mkind, status,
                             clock_mono_ns() - st->t0);
}

/* Frame the answer of st's dispatch, which returned rc. 0, or -errno when the connection must
 * close (the server stops). The serving coroutine. */
static int h2_answer_done(struct h2_session *h, struct h2_stream *st, int rc)
{
    if (st->bstream && (rc < 0 || st->rq.answer.kind != REQUEST_BODY_STREAM))
        h2_body_close(h, st); /* the call is over and no streamed answer reads on */
    if (rc == -ECONNRESET) {
        /* The client had gone before its Python call ran (logged 499 by the core). */
        st->ready = 0;
        if (!st->closed)
            nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
        return 0;
    }
    if (rc < 0)
        return rc;
    if (UNLIKELY(st->closed)) {
        /* The client reset the stream while its handler ran: nothing is sent, but the answer
         * is taken, so that freeing the stream gives back what it holds (a file, a stream). */
        st->answered = 1;
        st->status = st->rq.answer.status;
        if (st->rq.answer.kind == REQUEST_BODY_STREAM) {
            st->pystream = st->rq.resp.stream;
            st->rq.resp.stream = NULL;
        }
        return 0;
    }
    h2_count(h, st, st->fail_status ? st->fail_status : st->rq.answer.status);
    rc = h2_submit(h, st);
    if (rc)
        nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
    return 0;
}

/* Answer st in the serving coroutine: a refusal, or the request core's answer. 0, or -errno
 * when the connection must close (the server stops). */
static int h2_answer(struct h2_session *h, struct h2_stream *st)
{
    struct request *rq = &st->rq;
    int rc = 0;
    if (st->fail_status) {
        const char *body = st->fail_status == 431   ? "431 Request Header Fields Too Large\n"
                           : st->fail_status == 413 ? "413 Content Too Large\n"
                           : st->fail_status == 503 ? "503 Service Unavailable\n"
                                                    : "400 Bad Request\n";
        request_answer_simple(&rq->answer, rq->answer_lines, sizeof(rq->answer_lines),
                              st->fail_status, body, NULL);
    } else {
        rc = request_dispatch(rq, st->body.ptr, st->body.len);
    }
    return h2_answer_done(h, st, rc);
}

/* Ask for the next piece of st's streamed answer (what a task does: an offloaded call). Sets
 * st->task_more; returns stream_next's result. */
static int h2_piece_fetch(struct h2_stream *st)
{
    struct cyserve_response *r = &st->rq.resp;
    r->body.len = 0;
    resp_body_return(r); /* the last piece is copied into frames: a lent one goes back */
    return stream_next(&st->rq, st->rq.answer.t, st->pystream, &st->task_more);
}

/* The next piece of st's streamed answer came (stream_next returned rc, *more task_more): hand
 * it to the library. 0 or -errno (the server stops). The serving coroutine. */
static int h2_piece_done(struct h2_session *h, struct h2_stream *st, int rc)
{
    struct cyserve_response *r = &st->rq.resp;
    int more = st->task_more;
    if (rc < 0) {
        st->pystream = NULL; /* an orphan of the stop now */
        return rc;
    }
    if (more <= 0) {
        st->pystream = NULL; /* released: the last piece, or the handler failed */
        h2_body_close(h, st);
    }
    if (UNLIKELY(st->drain)) {
        r->body.len = 0; /* a status without content: the piece goes nowhere */
        resp_body_return(r);
        st->need_next = more > 0;
        return 0;
    }
    if (st->closed)
        return 0; /* reset meanwhile: a stream still open goes back when st is freed */
    if (more < 0) {
        nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
        return 0;
    }
    st->more = more;
    st->src = resp_body(r, &st->src_len);
    st->src_off = 0;
    nghttp2_session_resume_data(h->ng, st->id);
    return 0;
}

/* ---- tasks: streams served beside each other ---- */

/* A stream's task: its handler's call, or the next piece of its streamed answer, in a coroutine
 * of its own (which any worker may run, or steal), so that a slow handler holds back neither the
 * connection's other streams nor its reads and writes. What the task produced goes back to the
 * serving coroutine, the session's one user, through h->done. */
static int h2_task(struct coro *co, void *arg)
{
    struct h2_stream *st = arg;
    struct h2_session *h = st->h;
    (void)co;
    if (st->task_op == H2_TASK_DISPATCH)
        st->task_rc = request_dispatch(&st->rq, st->body.ptr, st->body.len);
    else
        st->task_rc = h2_piece_fetch(st);
    pthread_mutex_lock(&h->lock);
    h->tasks--;
    int last = h->orphan && !h->tasks;
    if (!h->orphan) {
        st->done_next = h->done;
        h->done = st;
        /* Set under the lock: once the serving coroutine sees no task left (under the lock),
         * no task touches the session any more, so it may free it. */
        sched_signal_set(&h->chan->ready);
    }
    pthread_mutex_unlock(&h->lock);
    if (last)
        conn_destroy(h->c); /* the serving coroutine left it to the last task (h2_serve) */
    return 0;
}

/* Whether st's answer is worth a task: a handler's call that may take long. A static or file
 * route, a 404 or a 405 is answered at once by the serving coroutine (a task would only add a
 * coroutine's cost), and so is a GIL-free handler that earned the inline path of HTTP/1 (quick,
 * small answers: http1_inline.h), as HTTP/1 runs it inline. */
static int h2_wants_task(struct h2_session *h, struct h2_stream *st)
{
    struct router_match m;
    const struct http_request *r = &st->rq.head;
    if (router_match(h->srv->router, ROUTER_METHOD_BIT(r->method_id), r->path, r->path_len, &m) < 0)
        return 0;
    const struct server_target *t = m.target;
    if (t->kind == SERVER_PYTHON)
        return 1;
    /* safety: a relaxed hint, as for the inline path. */
    return t->kind == SERVER_NOGIL &&
           atomic_load_explicit(&t->inline_state, memory_order_relaxed) != INLINE_LEARN;
}

/* Start a task of kind op on st. 0, or -errno when none could start (the caller then does the
 * work itself). The serving coroutine. */
static int h2_task_start(struct h2_session *h, struct h2_stream *st, int op)
{
    if (!h->chan && handoff_new(&h->chan) < 0) {
        h->chan = NULL;
        return -ENOMEM;
    }
    if (op == H2_TASK_DISPATCH) {
        /* What the request core caches on the connection is made here, by its one user, before
         * tasks on other threads read it: the peer's address, and with proxy headers whether
         * the peer is trusted and the client its headers name. */
        const char *scheme;
        request_client(&st->rq, &scheme);
    }
    st->task_op = op;
    st->busy = 1;
    pthread_mutex_lock(&h->lock);
    h->tasks++;
    pthread_mutex_unlock(&h->lock);
    int rc = sched_spawn(h->srv->sched, h2_task, st);
    if (UNLIKELY(rc < 0)) {
        st->busy = 0;
        pthread_mutex_lock(&h->lock);
        h->tasks--;
        pthread_mutex_unlock(&h->lock);
        return rc;
    }
    if (!h->chan_tracked) {
        /* A stop's handoff_cancel_all ends the wait on chan (h2_read_or_task). */
        handoff_track(h->srv, h->chan, 1);
        h->chan_tracked = 1;
    }
    return 0;
}

/* Take the streams whose task finished and frame what the tasks made. 1 when there were any, 0
 * when not, -errno when the connection must close (every one is taken all the same). The
 * serving coroutine. */
static int h2_tasks_collect(struct h2_session *h)
{
    if (!h->chan)
        return 0;
    pthread_mutex_lock(&h->lock);
    struct h2_stream *list = h->done;
    h->done = NULL;
    unsigned running = h->tasks;
    pthread_mutex_unlock(&h->lock);
    if (!running && h->chan_tracked) {
        handoff_track(h->srv, h->chan, 0);
        h->chan_tracked = 0;
    }
    int rc = list != NULL;
    while (list) {
        struct h2_stream *st = list;
        list = st->done_next;
        st->done_next = NULL;
        st->busy = 0;
        int r = st->task_op == H2_TASK_DISPATCH ? h2_answer_done(h, st, st->task_rc)
                                                : h2_piece_done(h, st, st->task_rc);
        if (r < 0)
            rc = r;
    }
    return rc;
}

/* Whether tasks run, or finished ones wait in h->done: either way the serving coroutine must
 * wait on the tasks' signal too (a task that finished after the last h2_tasks_collect has set
 * it), not on the socket alone. The serving coroutine. */
static unsigned h2_tasks_running(struct h2_session *h)
{
    if (!h->chan)
        return 0;
    pthread_mutex_lock(&h->lock);
    unsigned n = h->tasks + (h->done != NULL);
    pthread_mutex_unlock(&h->lock);
    return n;
}

/* ---- the session ---- */

static int h2_send_out(struct h2_session *h, const void *extra, size_t extra_len)
{
    struct iovec iov[2];
    int cnt = 0;
    if (h->out.len)
        iov[cnt++] = (struct iovec){h->out.ptr, h->out.len};
    if (extra_len)
        iov[cnt++] = (struct iovec){(void *)extra, extra_len};
    int rc = cnt ? conn_sendv(h->c, iov, cnt, 0) : 0;
    h->out.len = 0;
    return rc;
}

/* Write everything the library has queued. 0 or -errno. */
static int h2_flush(struct h2_session *h)
{
    for (;;) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(h->ng, &data);
        if (n < 0)
            return -EPROTO;
        if (n == 0)
            break;
        if (h->out.len + (size_t)n > H2_OUT_FLUSH_AT) {
            /* data is valid until the next mem_send: written now, with what is gathered. */
            int rc = h2_send_out(h, data, (size_t)n);
            if (rc)
                return rc;
            continue;
        }
        if (wbuf_append(&h->out, data, (size_t)n))
            return -ENOMEM;
    }
    return h2_send_out(h, NULL, 0);
}

static struct h2_session *h2_of(struct conn *c);

/* Free the session's memory: its pack (which holds h), or h. */
static void h2_session_release(struct h2_session *h)
{
    if (h->pack)
        munmap(h->pack, H2_PACK_LEN);
    else
        free(h);
}

static void h2_session_free(struct h2_session *h, int in_coro)
{
    while (h->streams)
        h2_stream_free(h->streams, in_coro);
    if (h->ng)
        nghttp2_session_del(h->ng);
    wbuf_free(&h->out);
    if (h->chan) {
        if (h->chan_tracked)
            handoff_track(h->srv, h->chan, 0);
        handoff_release(h->chan); /* both references are the session's */
        handoff_release(h->chan);
    }
    pthread_mutex_destroy(&h->lock);
    h2_session_release(h);
}

static void http2_close(struct conn *c)
{
    /* A session set aside is written back first: the library frees what it holds (the HPACK
     * tables' entries). */
    struct h2_session *h = h2_of(c);
    c->proto_data = NULL;
    if (h)
        h2_session_free(h, 0);
}

/* ---- the library's memory ---- */

/* nghttp2_mem for one session (ud, the struct h2_session). While the library makes the session
 * (h->packing), its blocks are laid out in the session's pack (h2_pack_alloc). After that,
 * blocks that h2_mem_mapped picks (large frames, a grown stream map) go to anonymous mappings
 * of their own, page-aligned and listed in h->bigs, so that pages never written cost nothing
 * and h2_mem_idle can give pages back while the connection is idle; every other block from
 * malloc as it is, with no header. A pointer inside the pack is the pack's, a page-aligned one
 * is looked up in h->bigs (a handful of entries); any other is malloc's. The serving coroutine
 * (the library is called only there), h2_session_new or h2_session_free. */
static int h2_mem_mapped(size_t size)
{
    return size >= H2_BIG_MIN || (size >= H2_TABLE_MIN && (size & (size - 1)) == 0);
}

static int h2_in_pack(const struct h2_session *h, const void *ptr)
{
    return h->pack && (const char *)ptr >= h->pack && (const char *)ptr < h->pack + H2_PACK_LEN;
}

/* A block of the pack, or NULL when it does not fit (the caller makes it as any other). Blocks
 * are taken in order and never reused: one smaller than a page from the bottom, 16-byte
 * aligned, one of a page or more from the top, on pages of its own (so that the small ones
 * share their pages, and the frame buffer's pages hold nothing else); the frame buffer's
 * offset is kept (pack_scratch). The mapping is zero where nothing was handed out, so a calloc
 * needs no clearing here. */
static void *h2_pack_alloc(struct h2_session *h, size_t size)
{
    if (!h->pack || h->npack == H2_PACK_BLOCKS || size == 0 || size > H2_PACK_LEN)
        return NULL;
    size_t off;
    if (size < 4096) {
        off = (h->pack_used + 15) & ~(size_t)15;
        if (off > h->pack_top || size > h->pack_top - off)
            return NULL;
        h->pack_used = off + size;
    } else {
        if (size > h->pack_top)
            return NULL;
        off = (h->pack_top - size) & ~(size_t)4095;
        if (off < h->pack_used)
            return NULL;
        h->pack_top = off;
    }
    h->npack++;
    if (size == H2_FRAMEBUF_LEN && h->pack_scratch == H2_PACK_LEN) {
        h->pack_scratch = off;
    } else {
        for (size_t c = off / (8 * H2_CHUNK_WORDS); c * 8 * H2_CHUNK_WORDS < off + size; c++)
            h->pack_chunks |= (uint64_t)1 << c;
    }
    return h->pack + off;
}

static struct h2_big *h2_mem_find(struct h2_session *h, void *ptr)
{
    if ((uintptr_t)ptr & 4095)
        return NULL;
    for (struct h2_big *b = h->bigs; b; b = b->next)
        if (b->map == ptr)
            return b;
    return NULL;
}

static void *h2_mem_malloc(size_t size, void *ud)
{
    struct h2_session *h = ud;
    if (h->packing) {
        void *p = h2_pack_alloc(h, size);
        if (p)
            return p;
    }
    if (!h2_mem_mapped(size))
        return malloc(size);
    struct h2_big *b = malloc(sizeof(*b));
    if (!b)
        return NULL;
    b->map_len = (size + 4095) & ~(size_t)4095;
    b->map = mmap(NULL, b->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b->map == MAP_FAILED) {
        free(b);
        return NULL;
    }
    b->size = size;
    b->prev = NULL;
    b->next = h->bigs;
    if (h->bigs)
        h->bigs->prev = b;
    h->bigs = b;
    return b->map;
}

static void h2_mem_free(void *ptr, void *ud)
{
    struct h2_session *h = ud;
    if (h2_in_pack(h, ptr))
        return; /* the pack goes with the session (h2_session_free) */
    struct h2_big *b = h2_mem_find(h, ptr);
    if (!b) {
        free(ptr);
        return;
    }
    if (b->prev)
        b->prev->next = b->next;
    else
        h->bigs = b->next;
    if (b->next)
        b->next->prev = b->prev;
    munmap(b->map, b->map_len);
    free(b);
}

static void *h2_mem_calloc(size_t n, size_t size, void *ud)
{
    struct h2_session *h = ud;
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = h2_mem_malloc(n * size, ud);
    /* A fresh mapping (or the pack) is zero already. malloc then memset rather than calloc:
     * glibc's calloc does not take blocks from the thread's cache, and the library callocs a
     * block or two for every stream. */
    if (p && !h2_mem_mapped(n * size) && !h2_in_pack(h, p))
        memset(p, 0, n * size);
    return p;
}

static void *h2_mem_realloc(void *ptr, size_t size, void *ud)
{
    struct h2_session *h = ud;
    if (!ptr)
        return h2_mem_malloc(size, ud);
    int packed = h2_in_pack(h, ptr);
    struct h2_big *b = packed ? NULL : h2_mem_find(h, ptr);
    if (!packed && !b && !h2_mem_mapped(size))
        return realloc(ptr, size);
    void *n = h2_mem_malloc(size, ud);
    if (!n)
        return NULL;
    /* A malloc'd block's size is not kept: copy what the new one can take, which is all of the
     * old one whenever the library grows a block (it never shrinks one through realloc). */
    size_t have = packed ? H2_PACK_LEN - (size_t)((char *)ptr - h->pack) /* and what follows */
                  : b    ? b->size
                         : malloc_usable_size(ptr);
    memcpy(n, ptr, have < size ? have : size);
    h2_mem_free(ptr, ud);
    return n;
}

static const char h2_zero_page[4096];

/* The connection goes idle, with everything the library queued written: the pages of its
 * mapped frame buffers are given back (read as zeros when next touched; the library writes a
 * frame into one before it sends it), and so are the pages of its other blocks of a page or
 * more that hold only zeros (a stream map with no stream left), which read back the same.
 * Nothing else: another large block may hold state (a frame read in part). The session's own
 * blocks, in its pack, are h2_park's. */
static void h2_mem_idle(struct h2_session *h)
{
    for (struct h2_big *b = h->bigs; b; b = b->next) {
        if (b->size == H2_FRAMEBUF_LEN) {
            madvise(b->map, b->map_len, MADV_DONTNEED);
            continue;
        }
        for (size_t off = 0; off < b->map_len; off += 4096)
            if (!memcmp((char *)b->map + off, h2_zero_page, 4096))
                madvise((char *)b->map + off, 4096, MADV_DONTNEED);
    }
}

/* What one session's pack holds while idle is mostly what every other's holds: the library's
 * callbacks, settings and windows, and pointers into the pack itself. So the first pack set
 * aside in the process is kept as a template, and a pack is written as its difference from the
 * template, with the template's pointers into its own pack moved to this one (h2_tmpl_word).
 * Made once (the first h2_pack_save; a compare-and-swap picks one when two threads race), read
 * only after that, never freed. */
struct h2_tmpl {
    uintptr_t base;              /* its pack's address */
    size_t nnz;                  /* how many of its words are not zero, */
    uint32_t *nz;                /* at these indexes, */
    uint64_t chunks;             /* in these 512-byte chunks (its pack_chunks) */
    uint64_t w[H2_PACK_LEN / 8]; /* its pack's words in those chunks, zero elsewhere */
};
static struct h2_tmpl *h2_tmpl_cur;

/* The template's word i for a pack at base: a pointer into the template's own pack is moved
 * to the same offset in this one. Any other value is itself (one that only looks like such a
 * pointer is moved too, the same way when the pack is written and read back, so the copy stays
 * exact). */
static inline uint64_t h2_tmpl_word(const struct h2_tmpl *t, size_t i, uintptr_t base)
{
    uint64_t v = t->w[i];
    return v - t->base < H2_PACK_LEN ? v - t->base + base : v;
}

static struct h2_tmpl *h2_tmpl_get(const struct h2_session *h)
{
    struct h2_tmpl *t = __atomic_load_n(&h2_tmpl_cur, __ATOMIC_ACQUIRE);
    if (t)
        return t;
    const uint64_t *w = (const uint64_t *)(const void *)h->pack;
    size_t nnz = 0;
    for (uint64_t todo = h->pack_chunks; todo; todo &= todo - 1)
        for (size_t i = 0, i0 = (size_t)__builtin_ctzll(todo) * H2_CHUNK_WORDS; i < H2_CHUNK_WORDS;
             i++)
            nnz += w[i0 + i] != 0;
    t = calloc(1, sizeof(*t) + nnz * 4);
    if (!t)
        return NULL;
    t->base = (uintptr_t)h->pack;
    t->nnz = nnz;
    t->nz = (uint32_t *)(void *)(t + 1);
    t->chunks = h->pack_chunks;
    size_t k = 0;
    for (uint64_t todo = h->pack_chunks; todo; todo &= todo - 1)
        for (size_t i = 0, i0 = (size_t)__builtin_ctzll(todo) * H2_CHUNK_WORDS; i < H2_CHUNK_WORDS;
             i++)
            if (w[i0 + i]) {
                t->w[i0 + i] = w[i0 + i];
                t->nz[k++] = (uint32_t)(i0 + i);
            }
    struct h2_tmpl *none = NULL;
    if (__atomic_compare_exchange_n(&h2_tmpl_cur, &none, t, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return t;
    free(t);
    return none; /* another thread's, made first */
}

/* The pack's words (but the frame buffer's) as the words that differ from the template's
 * (h2_tmpl_word, or zero without one): the template used, the pack's address, a mask of the
 * 512-byte chunks that hold such a word, then for each such chunk a mask of its differing
 * words and those words. Only the chunks that hold a block or a template's word are looked at
 * (the rest are zero both ways: nothing was written there). A malloc'd copy (NULL when out of
 * memory): a few words where the pages were 12 KiB (an idle session's pack is mostly zeros,
 * and its non-zero words mostly the template's). */
static uint64_t *h2_pack_save(const struct h2_session *h)
{
    const uint64_t *w = (const uint64_t *)(const void *)h->pack;
    const struct h2_tmpl *t = h2_tmpl_get(h);
    uintptr_t base = (uintptr_t)h->pack;
    uint64_t wmask[H2_PACK_LEN / (8 * H2_CHUNK_WORDS)];
    uint64_t cmask = 0;
    size_t n = 3;
    for (uint64_t todo = h->pack_chunks | (t ? t->chunks : 0); todo; todo &= todo - 1) {
        size_t c = (size_t)__builtin_ctzll(todo), i0 = c * H2_CHUNK_WORDS;
        uint64_t m = 0;
        for (size_t i = 0; i < H2_CHUNK_WORDS; i++) {
            uint64_t was = t ? h2_tmpl_word(t, i0 + i, base) : 0;
            m |= (uint64_t)(w[i0 + i] != was) << i;
        }
        wmask[c] = m;
        if (m) {
            cmask |= (uint64_t)1 << c;
            n += 1 + (size_t)__builtin_popcountll(m);
        }
    }
    uint64_t *out = malloc(n * 8);
    if (!out)
        return NULL;
    size_t k = 0;
    out[k++] = (uint64_t)(uintptr_t)t;
    out[k++] = (uint64_t)base;
    out[k++] = cmask;
    for (uint64_t todo = cmask; todo; todo &= todo - 1) {
        size_t c = (size_t)__builtin_ctzll(todo);
        uint64_t m = wmask[c];
        out[k++] = m;
        for (; m; m &= m - 1)
            out[k++] = w[c * H2_CHUNK_WORDS + (size_t)__builtin_ctzll(m)];
    }
    return out;
}

/* The connection is idle (h2_mem_idle done), with nothing left to do on it: its session's
 * pack, this structure with it, is saved (h2_pack_save) and all its pages are given back, the
 * frame buffer's with them; c->proto_data is then the copy, tagged with its lowest bit, until
 * h2_of writes it back. When the copy cannot be made, only the frame buffer's pages go. The
 * connection's idle timer (http2_on_timeout, the home's loop lock held, the connection idle);
 * nothing touches h after this until h2_of. */
static void h2_park(struct h2_session *h)
{
    if (!h->pack)
        return;
    struct conn *c = h->c;
    char *pack = h->pack;
    uint64_t *saved = h2_pack_save(h);
    if (!saved) {
        /* The frame buffer's pages only: it begins on a page of its own and the rest of its
         * last page holds nothing (h2_pack_alloc), but blocks above it do (the stream map,
         * which is not all zeros while the library keeps idle streams). */
        if (h->pack_scratch < H2_PACK_LEN)
            madvise(pack + h->pack_scratch, (H2_FRAMEBUF_LEN + 4095) & ~(size_t)4095,
                    MADV_DONTNEED);
        return;
    }
    c->proto_data = (void *)((uintptr_t)saved | 1);
    madvise(pack, H2_PACK_LEN, MADV_DONTNEED);
}

/* The connection's session, written back first when it was set aside (h2_park): the saved
 * words go back into the pack (its pages read as zeros elsewhere, as they were) and the copy is
 * freed. NULL when there is none. The coroutine that serves the connection again, or its close
 * (the home's loop, the connection idle). */
static struct h2_session *h2_of(struct conn *c)
{
    uintptr_t p = (uintptr_t)c->proto_data;
    if (!(p & 1))
        return (struct h2_session *)p;
    uint64_t *saved = (uint64_t *)(p & ~(uintptr_t)1);
    const uint64_t *in = saved;
    const struct h2_tmpl *t = (const struct h2_tmpl *)(uintptr_t)*in++;
    uint64_t *w = (uint64_t *)(uintptr_t)*in++;
    if (t) {
        /* The pages read as zeros: only the template's non-zero words need writing. */
        for (size_t k = 0; k < t->nnz; k++)
            w[t->nz[k]] = h2_tmpl_word(t, t->nz[k], (uintptr_t)w);
    }
    uint64_t cmask = *in++;
    for (; cmask; cmask &= cmask - 1) {
        size_t ch = (size_t)__builtin_ctzll(cmask);
        uint64_t m = *in++;
        for (; m; m &= m - 1)
            w[ch * H2_CHUNK_WORDS + (size_t)__builtin_ctzll(m)] = *in++;
    }
    free(saved);
    c->proto_data = w;
    return (struct h2_session *)(void *)w;
}

/* The callbacks, made once for the process (the library only reads them). */
static nghttp2_session_callbacks *h2_cbs;
static pthread_once_t h2_cbs_once = PTHREAD_ONCE_INIT;

static void h2_callbacks_init(void)
{
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs))
        return;
    nghttp2_session_callbacks_set_on_begin_frame_callback(cbs, h2_on_begin_frame);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, h2_on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, h2_on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, h2_on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, h2_on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, h2_on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, h2_on_frame_send);
    h2_cbs = cbs;
}

static nghttp2_session_callbacks *h2_callbacks(void)
{
    pthread_once(&h2_cbs_once, h2_callbacks_init);
    return h2_cbs;
}

static struct h2_session *h2_session_new(struct conn *c)
{
    struct server *s = c->home->srv;
    nghttp2_session_callbacks *cbs = h2_callbacks();
    if (!cbs)
        return NULL;
    /* The structure heads its pack, a fresh mapping (zeros), so that it is set aside with the
     * library's blocks (h2_park); without the mapping it is malloc'd, and the session works as
     * well, only never set aside. */
    struct h2_session *h;
    char *pack = mmap(NULL, H2_PACK_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                      0);
    if (pack != MAP_FAILED) {
        h = (struct h2_session *)(void *)pack;
        h->pack = pack;
        h->pack_top = H2_PACK_LEN;
        h->pack_scratch = H2_PACK_LEN;
        h2_pack_alloc(h, sizeof(*h)); /* the first block: pack itself */
    } else {
        h = calloc(1, sizeof(*h));
        if (!h)
            return NULL;
        h->pack_scratch = H2_PACK_LEN;
    }
    h->c = c;
    h->srv = s;
    h->flood_t = clock_mono_ns();
    h->in_left = HTTP2_PREFACE_LEN; /* the library reads the client preface first */
    wbuf_init(&h->out, NULL, 0);
    pthread_mutex_init(&h->lock, NULL);
    /* The windows are opened by the application's reads (nghttp2_session_consume): bodies
     * read whole as they arrive, bodies streamed to a handler as it reads them. */
    nghttp2_option *opt;
    if (nghttp2_option_new(&opt)) {
        pthread_mutex_destroy(&h->lock);
        h2_session_release(h);
        return NULL;
    }
    nghttp2_option_set_no_auto_window_update(opt, 1);
    /* What an idle session keeps (see "Idle" in docs/architecture.md): a closed stream is
     * forgotten at once rather than kept for RFC 7540 priorities (deprecated by RFC 9113, and
     * ignored by the server), so that the stream map is empty again once no stream is open.
     * (Frames on closed streams are still told apart: h2_closed_check.) */
    nghttp2_option_set_no_closed_streams(opt, 1);
    nghttp2_mem mem = {h, h2_mem_malloc, h2_mem_free, h2_mem_calloc, h2_mem_realloc};
    h->packing = 1;
    int rc = nghttp2_session_server_new3(&h->ng, cbs, h, opt, &mem);
    h->packing = 0;
    nghttp2_option_del(opt);
    if (rc) {
        pthread_mutex_destroy(&h->lock);
        h2_session_release(h);
        return NULL;
    }
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, s->cfg.http2_max_streams},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)s->cfg.limits.max_header_bytes},
    };
    if (nghttp2_submit_settings(h->ng, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0]))) {
        h2_session_free(h, 0);
        return NULL;
    }
    return h;
}

/* Feed the library what the transport read: 0, or the library's error (< 0). The frames' heads
 * are followed here (h->in_left: bytes of the client preface or of a frame's payload still to
 * come; h->in_head: a head read in part), and the input is cut before each DATA frame's head,
 * so that h2_closed_check sees its stream as the frames before it left it. In the coroutine. */
static ssize_t h2_feed(struct h2_session *h, const uint8_t *p, size_t len)
{
    size_t i = 0, fed = 0;
    while (i < len) {
        if (h->in_left) {
            size_t k = h->in_left < len - i ? h->in_left : len - i;
            i += k;
            h->in_left -= (uint32_t)k;
            continue;
        }
        size_t start = i; /* where this head begins, if it begins in this read */
        size_t k = 9 - h->in_hlen < len - i ? 9 - h->in_hlen : len - i;
        int fresh = h->in_hlen == 0;
        memcpy(h->in_head + h->in_hlen, p + i, k);
        h->in_hlen += (unsigned)k;
        i += k;
        if (h->in_hlen < 9)
            break;
        h->in_hlen = 0;
        const uint8_t *hd = h->in_head;
        h->in_left = (uint32_t)hd[0] << 16 | (uint32_t)hd[1] << 8 | hd[2];
        if (hd[3] != NGHTTP2_DATA)
            continue;
        /* Everything before the head goes to the library first (a head begun in an earlier
         * read went with it: the library acts on a head only once it has all of it). */
        size_t upto = fresh ? start : fed;
        if (upto > fed) {
            ssize_t n = nghttp2_session_mem_recv(h->ng, p + fed, upto - fed);
            if (n < 0)
                return n;
            fed = upto;
        }
        h2_closed_check(h, (int32_t)(((uint32_t)hd[5] << 24 | (uint32_t)hd[6] << 16 |
                                      (uint32_t)hd[7] << 8 | hd[8]) &
                                     0x7fffffffu));
    }
    if (len > fed) {
        ssize_t n = nghttp2_session_mem_recv(h->ng, p + fed, len - fed);
        if (n < 0)
            return n;
    }
    return 0;
}

/* Free the streams the library closed. In the coroutine. */
static void h2_sweep(struct h2_session *h)
{
    struct h2_stream *st = h->streams;
    while (st) {
        struct h2_stream *next = st->next;
        if (st->closed && !st->busy && !(st->drain && st->pystream))
            h2_stream_free(st, 1);
        st = next;
    }
}

/* h2_serve_loop's answer when the connection closes after a GOAWAY for an error: what the
 * client still sends is read and dropped for a moment first (conn_linger_close), so that the
 * close does not reset the connection before the client has read the GOAWAY. */
#define H2_CLOSE_LINGER 2

/* Read what the socket holds, or wait until it is readable or a task has finished (then
 * -EINTR), until deadline (< 0: none). As conn_read_wait otherwise. The serving coroutine.
 *
 * A socket the last read drained (c->drained: a short read or EAGAIN) is not read again before
 * the wait: the edge-triggered readiness says when it has more (conn.c, tls.c's "Reads"). A
 * wake-up by a task alone leaves it drained, so the rounds of a connection whose handlers
 * finish one after another cost no recv each that meets EAGAIN; one that came with readiness
 * clears it, and the next call reads. */
static ssize_t h2_read_or_task(struct h2_session *h, int64_t deadline)
{
    struct conn *c = h->c;
    for (;;) {
        if (!c->drained) {
            ssize_t n = conn_read_once(c);
            if (n != -EAGAIN)
                return n;
        }
        int rc = sched_io_wait_signal(&c->io, EPOLLIN | EPOLLRDHUP, deadline, &h->chan->ready);
        if (rc < 0)
            return rc;
        if (rc & ~(int)SCHED_SIGNALED)
            c->drained = 0; /* readiness came: read (now, or after the tasks' round) */
        if (rc & (int)SCHED_SIGNALED)
            return -EINTR;
    }
}

/* Woken by a finished task while others still run: let the coroutines queued ahead on this
 * worker run before the finished ones are taken. A batch of Python calls resumes its tasks in
 * one go, but the first task's signal puts this coroutine on the worker's list of handed-over
 * coroutines, which runs before the run queue: taken at once, the round would collect that one
 * answer and write it alone, with one send (and a wake-up) per answer where the C routes write
 * one per round. Behind the others, the round takes every task that batch finished. A task
 * still in its Python call (a slow handler) is not waited for: the yield comes back as soon as
 * what was queued has run. The serving coroutine. */
static void h2_tasks_gather(struct h2_session *h)
{
    pthread_mutex_lock(&h->lock);
    unsigned running = h->tasks;
    pthread_mutex_unlock(&h->lock);
    if (running)
        (void)sched_yield(); /* -ECANCELED: a stop, which the loop sees itself */
}

/* Start the work the streams wait for: the answers of the requests that are complete, in the
 * order their streams were opened (a handler's call in a task of its own, the rest at once),
 * and the next pieces of streamed answers whose data the library waits for. 1 when something
 * was done, 0 when not, -errno when the connection must close. */
static int h2_start_work(struct h2_session *h)
{
    int work = 0;
    for (struct h2_stream *st = h->streams; st; st = st->next) {
        if (st->busy || (st->closed && !st->drain))
            continue;
        if (st->ready && !st->answered && !h->fatal) {
            work = 1;
            if (UNLIKELY(h->drain_last) && st->id > (h->drain_last & INT32_MAX)) {
                /* Opened after a stop began: refused, the client may retry it (RFC 9113 8.7). */
                st->ready = 0;
                nghttp2_submit_rst_stream(h->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_REFUSED_STREAM);
                continue;
            }
            if (!st->fail_status && h2_wants_task(h, st) &&
                h2_task_start(h, st, H2_TASK_DISPATCH) == 0)
                continue;
            if (st->bstream && !st->fail_status) {
                /* Its handler would wait in this coroutine for DATA only this coroutine
                 * reads. */
                h2_stream_fail(st, 503, "no task for the request body");
                h2_body_close(h, st);
            }
            if (h2_answer(h, st) < 0)
                return -ECANCELED;
        } else if (st->need_next) {
            work = 1;
            st->need_next = 0;
            if (h2_task_start(h, st, H2_TASK_NEXT) == 0)
                continue;
            if (h2_piece_done(h, st, h2_piece_fetch(st)) < 0)
                return -ECANCELED;
        }
    }
    return work;
}

/* Serve the connection: 0 when it went idle, 1 or H2_CLOSE_LINGER when it must close. */
static void h2_park_later(struct h2_session *h);

static int h2_serve_loop(struct h2_session *h)
{
    struct conn *c = h->c;
    struct server *s = h->srv;
    for (;;) {
        /* What was read: fed to the library. */
        if (c->len) {
            ssize_t n = h2_feed(h, (const uint8_t *)c->buf, c->len);
            c->len = 0;
            if (n < 0) {
                h2_flush(h); /* a GOAWAY, when the library queued one */
                return H2_CLOSE_LINGER;
            }
        }
        /* What the tasks finished, and what the streams wait for; then what that queued is
         * written (writing may ask for more: a streamed answer whose window opened wants its
         * next piece). */
        int work;
        do {
            int done = h2_tasks_collect(h);
            if (UNLIKELY(server_draining(s)) && !h->drain_last)
                h->drain_last = nghttp2_session_get_last_proc_stream_id(h->ng) | INT32_MIN;
            work = h2_start_work(h);
            if (done < 0 || work < 0)
                return 1;
            h2_bodies_ack(h);
            if (h2_flush(h) < 0)
                return 1;
            if (UNLIKELY(h->drain_last) && !h->goaway && !h2_tasks_running(h)) {
                /* A stop: no new stream is taken, those open are answered (RFC 9113 6.8). The
                 * GOAWAY goes once no handler is at work and their answers are written (the
                 * library sends it before any queued frame), as clients that take GOAWAY as
                 * the end (the h2 library) need; a stream opened meanwhile is refused
                 * (h2_start_work). */
                h->goaway = 1;
                nghttp2_submit_goaway(h->ng, NGHTTP2_FLAG_NONE, h->drain_last & INT32_MAX,
                                      NGHTTP2_NO_ERROR, NULL, 0);
                if (h2_flush(h) < 0)
                    return 1;
            }
            h2_sweep(h);
            for (struct h2_stream *st = h->streams; st && !work; st = st->next)
                work = st->need_next && (!st->closed || st->drain) && !st->busy;
        } while (work);
        if (!nghttp2_session_want_read(h->ng) && !nghttp2_session_want_write(h->ng))
            return H2_CLOSE_LINGER; /* a GOAWAY for an error is written */
        if (h->fatal)
            return H2_CLOSE_LINGER;
        if (h->goaway && !h->nstreams)
            return 1;
        if (!h->nstreams) {
            h->stall_t = 0;
            /* Nothing open: go idle once the socket is drained, as HTTP/1 does. */
            if (c->drained) {
                int rc = sched_io_release(&c->io);
                if (rc == 0) {
                    /* The output buffer is empty: h2_flush wrote it. */
                    wbuf_free(&h->out);
                    wbuf_init(&h->out, NULL, 0);
                    h2_mem_idle(h);
                    h2_park_later(h);
                    conn_go_idle(c);
                    return 0;
                }
                if (rc != -EAGAIN)
                    return 1;
                c->drained = 0;
            }
            if (conn_reserve(c, H2_READ_BUF) < 0)
                return 1;
            ssize_t n = conn_read_once(c);
            if (n == -EAGAIN)
                continue;
            if (n <= 0)
                return 1;
            continue;
        }
        /* Streams are open: a body to come, answers the client's window holds back, or
         * handlers at work. */
        if (conn_reserve(c, H2_READ_BUF) < 0)
            return 1;
        ssize_t n;
        if (h2_tasks_running(h)) {
            /* A handler at work is not the client's stall: no deadline while one runs. */
            h->stall_t = 0;
            n = h2_read_or_task(h, -1);
            if (n == -EINTR) {
                h2_tasks_gather(h);
                continue;
            }
        } else {
            /* The deadline is body_timeout after the client's last progress (a byte of a body
             * in or of an answer out, a stream closed), not after its last read: frames that
             * carry nothing (PING and SETTINGS below the flood bound, WINDOW_UPDATE for
             * another stream, empty CONTINUATION) would otherwise hold streams, and the answers
             * a zero window keeps back, for ever, one frame per body_timeout. */
            if (!h->stall_t)
                h->stall_t = sched_now_ns();
            int64_t deadline = (int64_t)(h->stall_t + s->cfg.body_timeout_ns);
            n = (int64_t)sched_now_ns() >= deadline ? -ETIMEDOUT : conn_read_wait(c, deadline);
        }
        if (n == -ETIMEDOUT) {
            nghttp2_submit_goaway(h->ng, NGHTTP2_FLAG_NONE,
                                  nghttp2_session_get_last_proc_stream_id(h->ng), NGHTTP2_NO_ERROR,
                                  NULL, 0);
            h2_flush(h);
            return 1;
        }
        if (n <= 0)
            return 1;
    }
}

/* The connection closes while tasks may still run: wait for them, since they use the session
 * and the connection. 1 when they all finished (the caller closes the connection), 0 when the
 * wait was cancelled by a stop (the last task closes it, h2_task). The serving coroutine. */
static int h2_tasks_finish(struct h2_session *h)
{
    /* A handler waiting for a body that will not come now is woken. */
    for (struct h2_stream *st = h->streams; st; st = st->next)
        h2_body_gone(st);
    for (;;) {
        h2_tasks_collect(h);
        if (!h2_tasks_running(h))
            return 1;
        if (sched_signal_wait(&h->chan->ready) < 0) {
            /* Cancelled (a stop's grace period is over): the tasks still running close the
             * connection, the last of them. Decided under the lock, so that exactly one side
             * does. */
            pthread_mutex_lock(&h->lock);
            int left = h->tasks != 0;
            h->orphan = left;
            pthread_mutex_unlock(&h->lock);
            if (left)
                return 0;
        }
    }
}

static int h2_serve(struct h2_session *h)
{
    int rc = h2_serve_loop(h);
    if (rc == 0)
        return 0; /* idle: the worker's (h2_park), h is not to be touched */
    if (rc == H2_CLOSE_LINGER)
        conn_linger_close(h->c);
    if (rc) {
        if (!h2_tasks_finish(h)) {
            wbuf_free(&h->out);
            wbuf_init(&h->out, NULL, 0);
            return 0; /* the last task closes the connection */
        }
        /* Closing: the streams go now, in the coroutine (a streamed answer's stream goes back to
         * its handler). */
        while (h->streams)
            h2_stream_free(h->streams, 1);
    }
    wbuf_free(&h->out);
    wbuf_init(&h->out, NULL, 0);
    return rc;
}

int http2_take_over(struct conn *c)
{
    struct h2_session *h = h2_session_new(c);
    if (!h)
        return 1;
    c->proto = &http2_proto;
    c->proto_data = h;
    return h2_serve(h);
}

/* ---- Upgrade: h2c (RFC 7540 3.2) ---- */

/* Decode the base64url text b[0..n) (RFC 4648 5, without padding, as HTTP2-Settings carries
 * it) into out (at most cap bytes). Its length, or -1 when it is not such text. */
static ssize_t h2_base64url(const char *b, size_t n, uint8_t *out, size_t cap)
{
    uint32_t acc = 0;
    unsigned bits = 0;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = b[i];
        int v = ch >= 'A' && ch <= 'Z'   ? ch - 'A'
                : ch >= 'a' && ch <= 'z' ? ch - 'a' + 26
                : ch >= '0' && ch <= '9' ? ch - '0' + 52
                : ch == '-'              ? 62
                : ch == '_'              ? 63
                                         : -1;
        if (v < 0) {
            /* Padding is not base64url's, but a client may send it: only at the end. */
            while (i < n && b[i] == '=')
                i++;
            if (i < n)
                return -1;
            break;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (len == cap)
                return -1;
            out[len++] = (uint8_t)(acc >> bits);
        }
    }
    if (bits >= 6)
        return -1; /* a lone character: not whole bytes */
    return (ssize_t)len;
}

/* Copy the HTTP/1.1 request head r (the request the client upgrades with) into stream st as
 * its header fields: :method, :path, :authority from Host, the other fields lower-cased,
 * without the connection-specific ones (but "te: trailers" when r's TE lists trailers). 0 or
 * -ENOMEM. */
static int h2_head_from_http1(struct h2_session *h, struct h2_stream *st,
                              const struct http_request *r)
{
    nghttp2_frame f;
    memset(&f, 0, sizeof(f));
    f.hd.type = NGHTTP2_HEADERS;
    f.hd.stream_id = st->id;
    f.headers.cat = NGHTTP2_HCAT_REQUEST;
    if (h2_on_header(h->ng, &f, (const uint8_t *)":method", 7, (const uint8_t *)r->method,
                     r->method_len, 0, h) ||
        h2_on_header(h->ng, &f, (const uint8_t *)":path", 5, (const uint8_t *)r->target,
                     r->target_len, 0, h))
        return -ENOMEM;
    if (r->host && h2_on_header(h->ng, &f, (const uint8_t *)":authority", 10,
                                (const uint8_t *)r->host, r->host_len, 0, h))
        return -ENOMEM;
    static const char *const drop[] = {"connection",
                                       "upgrade",
                                       "http2-settings",
                                       "keep-alive",
                                       "proxy-connection",
                                       "transfer-encoding",
                                       "te",
                                       "host"};
    /* TE is connection-specific and dropped with the others, but stream 1 is the upgrading
     * request with its headers (RFC 9113 3.1, RFC 7540 3.2), and HTTP/2 keeps TE with the one
     * value "trailers" (RFC 9113 8.2.2): a request whose TE lists it gets "te: trailers", so
     * that its answer's trailers reach it as on any other stream. */
    int te = 0;
    for (size_t i = 0; i < r->num_headers && !te; i++) {
        const struct http_header *hd = &r->headers[i];
        te = hd->name_len == 2 && strncasecmp(hd->name, "te", 2) == 0 &&
             request_te_lists_trailers(hd->value, hd->value_len);
    }
    if (te &&
        h2_on_header(h->ng, &f, (const uint8_t *)"te", 2, (const uint8_t *)"trailers", 8, 0, h))
        return -ENOMEM;
    for (size_t i = 0; i < r->num_headers; i++) {
        const struct http_header *hd = &r->headers[i];
        char low[64];
        if (hd->name_len > sizeof(low))
            continue; /* not one of those dropped: kept under its own spelling below */
        for (size_t k = 0; k < hd->name_len; k++) {
            char ch = hd->name[k];
            low[k] = ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch;
        }
        int skip = 0;
        for (size_t d = 0; d < sizeof(drop) / sizeof(drop[0]) && !skip; d++)
            skip = strlen(drop[d]) == hd->name_len && memcmp(drop[d], low, hd->name_len) == 0;
        if (!skip && h2_on_header(h->ng, &f, (const uint8_t *)low, hd->name_len,
                                  (const uint8_t *)hd->value, hd->value_len, 0, h))
            return -ENOMEM;
    }
    for (size_t i = 0; i < r->num_headers; i++) {
        /* A field name longer than low[]: rare; lower-cased in a buffer of its own. */
        const struct http_header *hd = &r->headers[i];
        if (hd->name_len <= 64)
            continue;
        char *low = malloc(hd->name_len);
        if (!low)
            return -ENOMEM;
        for (size_t k = 0; k < hd->name_len; k++) {
            char ch = hd->name[k];
            low[k] = ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch;
        }
        int rc = h2_on_header(h->ng, &f, (const uint8_t *)low, hd->name_len,
                              (const uint8_t *)hd->value, hd->value_len, 0, h);
        free(low);
        if (rc)
            return -ENOMEM;
    }
    return h2_make_head(st);
}

int http2_upgrade_settings(const char *b64, size_t len)
{
    uint8_t raw[HTTP2_UPGRADE_SETTINGS_MAX];
    ssize_t n = h2_base64url(b64, len, raw, sizeof(raw));
    return n >= 0 && n % 6 == 0 ? 0 : -EINVAL;
}

int http2_take_over_upgrade(struct conn *c, const char *b64, size_t len,
                            const struct http_request *r, size_t rest)
{
    uint8_t raw[HTTP2_UPGRADE_SETTINGS_MAX];
    ssize_t n = h2_base64url(b64, len, raw, sizeof(raw));
    struct h2_session *h = n >= 0 ? h2_session_new(c) : NULL;
    if (!h)
        return 1;
    c->proto = &http2_proto;
    c->proto_data = h;
    /* Stream 1 is the upgrading request, half-closed from the client's side: its answer is
     * the first thing sent after the server's SETTINGS (RFC 7540 3.2). */
    if (nghttp2_session_upgrade2(h->ng, raw, (size_t)n, r->method_id == HTTP_HEAD, NULL))
        return 1;
    struct h2_stream *st = h2_stream_new(h, 1);
    if (!st)
        return 1;
    nghttp2_session_set_stream_user_data(h->ng, 1, st);
    h->max_id = 1;
    h2_seen_set(h, 1, 1);
    if (h2_head_from_http1(h, st, r))
        return 1;
    if (UNLIKELY(h->srv->cfg.access_log_fd >= 0)) {
        st->rq.log_have_req = 1;
        st->rq.log_t0 = clock_mono_ns();
    }
    if (UNLIKELY(h->srv->metrics_on))
        st->t0 = clock_mono_ns();
    st->req_done = 1;
    st->ready = 1;
    /* What the client sent behind its request (its preface, frames) is HTTP/2's. */
    memmove(c->buf, c->buf + rest, c->len - rest);
    c->len -= rest;
    return h2_serve(h);
}

/* The coroutine of an HTTP/2 connection woken from idle. */
static int http2_serve_co(struct coro *co, void *arg)
{
    struct conn *c = arg;
    if (h2_serve(h2_of(c)))
        conn_destroy(c);
    return 0;
}

static void http2_on_readable(struct conn *c, uint32_t events)
{
    conn_busy_pay(c);
    int rc = sched_spawn(c->home->srv->sched, http2_serve_co, c);
    if (UNLIKELY(rc < 0))
        conn_destroy(c);
}

/* The connection goes idle: its idle timer is due H2_PARK_AFTER_NS from now, when the
 * session will be set aside (http2_on_timeout), unless it is due sooner. The serving
 * coroutine, before conn_go_idle (the home's, as conn_go_idle's arming is). */
static void h2_park_later(struct h2_session *h)
{
    struct conn *c = h->c;
    if (!h->pack)
        return; /* nothing to set aside: the keep-alive timer alone */
    uint64_t due = sched_now_ns() + H2_PARK_AFTER_NS;
    if (!c->timer_armed || c->idle.deadline > due) {
        sched_timer_arm(&c->idle, due);
        c->timer_armed = 1;
    }
}

/* When the idle connection's timer is due: when its session is to be set aside, then its
 * keep-alive deadline. The home's loop lock held. */
static uint64_t http2_idle_deadline(struct conn *c)
{
    uint64_t end = c->idle_since + c->home->srv->cfg.keepalive_ns;
    uintptr_t p = (uintptr_t)c->proto_data;
    if (p && !(p & 1) && ((struct h2_session *)p)->pack) {
        uint64_t park = c->idle_since + H2_PARK_AFTER_NS;
        return park < end ? park : end;
    }
    return end;
}

/* The idle timer is due (http2_idle_deadline): the session is set aside, or the keep-alive
 * timeout is over and the connection closed. The home's loop lock held. */
static void http2_on_timeout(struct conn *c)
{
    uint64_t end = c->idle_since + c->home->srv->cfg.keepalive_ns;
    uintptr_t p = (uintptr_t)c->proto_data;
    if (p && !(p & 1) && sched_now_ns() < end) {
        h2_park((struct h2_session *)p);
        sched_timer_arm(&c->idle, end);
        c->timer_armed = 1;
        return;
    }
    conn_destroy(c);
}

const struct conn_proto http2_proto = {
    .on_readable = http2_on_readable,
    .on_timeout = http2_on_timeout,
    .close = http2_close,
    .idle_deadline = http2_idle_deadline,
};
