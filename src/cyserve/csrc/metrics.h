/* metrics.h: the engine's counters for Prometheus, and the listener that serves them.
 *
 * Error convention: 0 or -errno. The design is told at the top of metrics.c; in short:
 *
 * - The counters live in a region of shared memory (mmap MAP_SHARED, made before any fork), one
 *   slot per serving process (struct metrics_proc) and, in it, one shard per scheduler thread
 *   (struct metrics_shard, cache-line aligned). A thread only ever writes its own shard, with
 *   relaxed loads and stores (no locked instruction, no cache line shared with another writer);
 *   whoever answers a scrape sums every shard of every slot.
 * - What the threads do not count themselves (open connections, the scheduler's counters, its
 *   heartbeat) is copied into the process's slot by a publisher thread of the engine, every
 *   METRICS_PUBLISH_MS (server.c).
 * - The scrape is answered by a thread of the process that made the region (the supervisor under
 *   --processes, else the serving process), in C, without Python's GIL.
 *
 * Threads: the region's functions are "any thread" unless said; the shards' writers are the
 * scheduler threads, each its own shard. */
#ifndef CYSERVE_METRICS_H
#define CYSERVE_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "compat.h"

/* What answered a request: the route's kind (the "route" label). NONE: no route did (404, 405,
 * and the engine's own error answers: 400, 408, 413 ...). */
enum metrics_kind {
    METRICS_NONE = 0,
    METRICS_STATIC,
    METRICS_FILES,
    METRICS_NOGIL,
    METRICS_PYTHON,
    METRICS_WSGI,
    METRICS_ASGI,
    METRICS_KINDS
};

/* The engine's own refusals (the "status" and "reason" labels of cyserve_rejections_total): a
 * malformed request, a timeout, a limit. METRICS_RLIMIT is --limit-concurrency's 503, told
 * apart from the 503 of the request bodies' budget. */
enum metrics_reject {
    METRICS_R400 = 0,
    METRICS_R408,
    METRICS_R413,
    METRICS_R414,
    METRICS_R431,
    METRICS_R503,
    METRICS_RLIMIT,
    METRICS_ROTHER,
    METRICS_REJECTS
};

/* How a WebSocket connection ended (the "reason" label of cyserve_websocket_closes_total), by
 * the code of the close that was decided first (metrics_ws_close_reason). */
enum metrics_ws_reason {
    METRICS_WS_NORMAL = 0, /* 1000, 1001, or a close frame without a code (1005) */
    METRICS_WS_PROTOCOL,   /* 1002 */
    METRICS_WS_INVALID,    /* 1007: invalid UTF-8, or deflate data that does not inflate */
    METRICS_WS_POLICY,     /* 1008 */
    METRICS_WS_TOO_BIG,    /* 1009 */
    METRICS_WS_INTERNAL,   /* 1011: a failed handler, no pong in time, no memory */
    METRICS_WS_ABNORMAL,   /* 1006: the connection ended without a close frame */
    METRICS_WS_OTHER,      /* any other code: 1003, 1010, an application's 3000-4999 ... */
    METRICS_WS_REASONS
};

/* Who began the closing handshake (the "by" label): the server (its application's close, a rule
 * the client broke, a stop, a ping unanswered), or the client (its close frame; also a
 * connection that ended without one, METRICS_WS_ABNORMAL, counted only there). */
enum metrics_ws_by { METRICS_WS_BY_SERVER = 0, METRICS_WS_BY_CLIENT = 1, METRICS_WS_BYS };

/* The request duration histogram's upper bounds (seconds: 0.5 ms to 10 s); one more bucket
 * counts what is above the last. */
#define METRICS_BUCKETS 14

/* How often the publisher thread copies a process's gauges and the scheduler's counters into
 * its slot, and takes the scheduler's heartbeat. */
#define METRICS_PUBLISH_MS 100

/* One scheduler thread's counters. Written by that thread only. */
struct metrics_shard {
    _Atomic uint64_t req[METRICS_KINDS][5]; /* answers by route kind and status class 1xx..5xx */
    _Atomic uint64_t dur[METRICS_BUCKETS + 1];
    _Atomic uint64_t dur_ns; /* the durations' sum */
    _Atomic uint64_t bytes_in, bytes_out;
    _Atomic uint64_t accepted; /* connections opened */
    _Atomic uint64_t reject[METRICS_REJECTS];
    /* Static answers of HTTP/1's inline path (http1_inline.c) by status class, counted with one
     * add and no clock read: such an answer is made within the poll that read its request, in
     * a few microseconds, so the sums put each in req[METRICS_STATIC] and in the first duration
     * bucket, adding nothing to dur_ns (metrics.c, "What a request costs"). */
    _Atomic uint64_t quick[5];
    /* WebSocket connections ended, by who began the close and its reason (one add per
     * connection, when the engine is done with it: metrics_note_ws_close). */
    _Atomic uint64_t ws_close[METRICS_WS_BYS][METRICS_WS_REASONS];
} CACHE_ALIGNED;

/* The bytes of a route's pattern a slot keeps (longer ones are cut), its NUL included. */
#define METRICS_ROUTE_MAX 96

/* One serving process: what its publisher copies, then its threads' shards. */
struct metrics_proc {
    _Atomic int64_t pid;       /* 0: the slot is free */
    _Atomic uint64_t beat_ns;  /* the publisher's last look (clock_mono_ns), 0 before it */
    _Atomic uint64_t stuck_ns; /* then: the longest any thread had been in one coroutine run or
                                * one batch of Python calls (sched_watch_stuck) */
    _Atomic uint64_t open;     /* connections open */
    _Atomic uint64_t busy;     /* of them, not idle: a request (or a protocol) in progress */
    _Atomic uint64_t python;   /* Python calls queued for a batch, waiting for the GIL or
                                * running (an HTTP/2 connection may have several) */
    _Atomic uint64_t inline_ok, spawned, steals, parks, hops, offloads, reliefs, relief_threads;
    _Atomic uint64_t runq;            /* coroutines queued to run */
    _Atomic uint64_t coroutines;      /* alive now, each holding a stack: a gauge */
    _Atomic uint64_t offload_wait_ns; /* sched_stats.offload_wait_ns, a counter */
    /* Coroutine stacks mapped now in the process (coro_stack_counts: mapped less unmapped),
     * held by coroutines or cached free in its threads' pools and their depot: a gauge. */
    _Atomic uint64_t stacks;
    _Atomic uint64_t trims; /* sched_stats.trims (idle trims of a thread's stacks), a counter */
    /* The pattern of the route whose Python call had run longest when the publisher looked
     * ("" when none ran): metrics_set_route / metrics_get_route, a sequence lock (odd while
     * written) over words, so that a reader in another process never sees a torn name. */
    _Atomic uint64_t route_seq;
    _Atomic uint64_t route[METRICS_ROUTE_MAX / 8];
    struct metrics_shard shards[];
};

/* The shared region: nprocs slots, then one more that keeps the counters of the processes that
 * ended (metrics_retire), so that a counter never goes down when a worker is replaced. */
struct metrics_region {
    unsigned nprocs, nshards;
    size_t proc_size, size;
} CACHE_ALIGNED;

/* Make a region for nprocs processes of nshards threads each, zeroed, shared with the
 * processes forked afterwards. 0, -EINVAL (0 of either, or too large), -ENOMEM. */
int metrics_region_new(struct metrics_region **out, unsigned nprocs, unsigned nshards);

/* Unmap r (this process's mapping only). */
void metrics_region_free(struct metrics_region *r);

/* Slot i of r (i == r->nprocs: the ended processes' totals). */
static inline struct metrics_proc *metrics_proc_at(struct metrics_region *r, unsigned i)
{
    return (struct metrics_proc *)((char *)r + sizeof(*r) + (size_t)i * r->proc_size);
}

/* Claim a free slot for process pid (the supervisor, before it forks the process, or a single
 * server for itself): its index, or -ENOSPC. */
int metrics_claim(struct metrics_region *r, pid_t pid);

/* Process i has ended: add its counters to the totals slot and free the slot. Its gauges (open
 * connections, queued coroutines) are dropped. The process of r's scrapes. */
void metrics_retire(struct metrics_region *r, unsigned i);

/* Write the text exposition (Prometheus format 0.0.4) of r's sums into buf[0..cap): the length
 * written, or -ENOSPC when cap is too small (METRICS_TEXT_MAX is enough). */
#define METRICS_TEXT_MAX 65536
ssize_t metrics_format(struct metrics_region *r, char *buf, size_t cap);

/* Counting, on the thread that owns shard m (m may be NULL: not counted). */
static inline void metrics_add(_Atomic uint64_t *c, uint64_t n)
{
    /* safety: one writer per shard (its thread); relaxed load and store, no locked add; the
     * scrape's relaxed reads see some recent value. */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

/* Publish route (NUL-terminated, NULL: none) as p's longest running call's. The slot's
 * publisher thread only. */
void metrics_set_route(struct metrics_proc *p, const char *route);

/* The route metrics_set_route last published in p, into out (cap bytes, NUL-terminated, cut
 * to fit). Returns its length; 0 (an empty out) when none or while it is being rewritten.
 * Any thread of any process sharing the region. */
size_t metrics_get_route(const struct metrics_proc *p, char *out, size_t cap);

/* A request answered with status by a route of kind, which took dur_ns. */
void metrics_note_request(struct metrics_shard *m, unsigned kind, int status, uint64_t dur_ns);

/* The engine refused a request with status (400, 408, 413 ...): counted as a rejection and as
 * an answer of route kind METRICS_NONE (not in the duration histogram). */
void metrics_note_reject(struct metrics_shard *m, int status);

/* A request refused by --limit-concurrency (its answer, a 503, is counted as any answer). */
void metrics_note_limit(struct metrics_shard *m);

/* The reason class (enum metrics_ws_reason) of a WebSocket close code. */
unsigned metrics_ws_close_reason(int code);

/* A WebSocket connection ended: code, the close decided first (WS_CLOSE_ABNORMAL, 1006, when
 * none was), begun by (enum metrics_ws_by). Once per connection, by the thread that ends it. */
void metrics_note_ws_close(struct metrics_shard *m, int code, unsigned by);

/* The scrape listener: a thread that accepts on fd (a listening stream socket, borrowed, made
 * non-blocking here) and answers GET /metrics with r's text, anything else with 404, one
 * connection at a time, each closed after its answer. */
struct metrics_listener;

/* Start it. 0, or -errno (nothing started). */
int metrics_listen_start(struct metrics_listener **out, struct metrics_region *r, int fd);

/* Stop it and join its thread. A scrape it accepted is answered first, within that scrape's
 * 2 s (a supervisor stops the thread around each fork: a scrape that came just then must not be
 * closed unanswered); the listening socket's queue waits for the next start. */
void metrics_listen_stop(struct metrics_listener *l);

#endif
