/* server_int.h: what the engine's files share: struct server and its per-worker state, and the
 * sizes that shape them. Internal to csrc/ (server.h is the engine's API). The engine's design
 * is told at the top of server.c, and of each file for its part. */
#ifndef CYSERVE_SERVER_INT_H
#define CYSERVE_SERVER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "compat.h"
#include "metrics.h"
#include "proxy.h"
#include "sched.h"
#include "server.h"

struct conn;

/* Read buffer of a connection; grown (up to the limits) only for large heads and bodies. 4 KiB
 * holds any benchmark request and most browser requests. */
#define CONN_BUF_INITIAL 4096
/* Per-worker caches of free read buffers and connection structs (conn.h). */
#define CONN_BUF_CACHE_MAX 64
#define CONN_CACHE_MAX 1024
/* Bodies up to this size are copied behind the head (one write); larger ones go out by writev
 * without a copy. */
#define BODY_COPY_MAX 16384
/* Static bodies larger than this are kept in a sealed memfd and sent with sendfile(): the kernel
 * then hands the page-cache pages to the socket instead of copying the body from user memory on
 * every response (on /transfer, 133 KiB, that copy, _copy_from_iter, was 18% of the server's
 * CPU in perf). Smaller ones stay on the copy path above: one write per batch of pipelined
 * responses, where sendfile would cost a second syscall per response. Same value as
 * BODY_COPY_MAX, so every static body is either copied into the output buffer or never copied at
 * all. Measured just above it (server on one CPU, wrk -c64 on another, requests per server
 * CPU-second, medians of 3): 17,000 bytes 175k by writev, 184k by sendfile; 64 KiB 103k vs
 * 119k; 133,622 bytes 24k vs 80k. So sendfile already wins at the threshold; whether it would
 * below it was not measured. */
#define STATIC_MEMFD_MIN BODY_COPY_MAX
/* Distinct large handler bodies (resp_set_body_static) that get a memfd of their own; any more
 * are sent by writev from the handler's memory. */
#define EXT_MEMFD_MAX 64

/* One listener as one worker accepts from it (listen.c): the worker's own SO_REUSEPORT socket of
 * a TCP address, or the one descriptor of a shared listener (a Unix socket, an inherited one),
 * which every worker registers in its own epoll. Home state of its worker. */
struct server_lslot {
    struct server_worker *w;
    int fd;     /* opened by the control thread; a shared one is the caller's (never closed here) */
    int shared; /* fd is shared by every worker (and maybe other processes): never shut down */
    int added;
    int level;        /* registered level-triggered: one accept4 per readiness (listen.c) */
    int nodelay_each; /* TCP_NODELAY could not be set on fd: set it on each connection */
    /* level and nodelay_each: set by the control thread before the workers start, then read
     * only. */
    struct sched_io io;
    _Atomic int shut; /* a stop has drained this slot (listen_shut) */
};

/* Per worker: the listeners, the control eventfd and the list of connections homed here are home
 * state (under the worker's loop lock); the caches are per thread (touched only by the worker's
 * own thread, see server_worker_self()). */
struct server_worker {
    struct server *srv;
    unsigned id;
    struct server_lslot *ls; /* one per listener of the server (s->nlistens), in its order */
    int ctl_fd;              /* eventfd written by server_shutdown */
    struct sched_io ctl_io;
    int ctl_added;
    struct sched_timer ctl_timer; /* closes the idle connections once shutdown begins */
    struct conn *conns;           /* every live connection homed here */
    struct conn *free_conns;      /* cache, linked through next */
    unsigned nfree_conns;
    char *free_bufs[CONN_BUF_CACHE_MAX];
    unsigned nfree_bufs;
    _Atomic uint64_t inline_ok; /* requests answered inline by this thread */
    _Atomic uint64_t answered;  /* requests answered by coroutines on this thread */
    /* Connections homed here that are not idle (conn.busy set), counted only with metrics on:
     * written under this home's loop lock (conn_set_busy), read by the publisher. */
    _Atomic uint64_t busy;
    struct metrics_shard *m; /* this thread's counters (metrics.h), NULL: none */
    /* The target whose Python call this thread is in (NULL: none) and since when
     * (clock_mono_ns): written by this thread around each call (request.c), read by the
     * publisher, which names the route of the longest one (struct metrics_proc's route). */
    _Atomic(const struct server_target *) calling;
    _Atomic uint64_t calling_since;
} CACHE_ALIGNED;

struct server {
    struct server_config cfg;
    char *host;
    /* The listeners (owned copies of cfg.listen, or one made of host and port) and the port each
     * TCP one is bound to once started (0 for a shared descriptor). */
    struct server_listen *listens;
    int *ports;
    unsigned nlistens;
    /* Proxy headers (cfg.forwarded_allow_ips): on, and the peers trusted. */
    int proxy_headers;
    struct proxy_trust trust;
    /* The PROXY protocol (cfg.proxy_protocol_from): on, and the peers that must send its header. */
    int proxy_protocol;
    struct proxy_trust pp_trust;
    const struct router *router;
    struct sched *sched;
    struct server_worker *workers;
    unsigned nworkers; /* the homes: one listener each, [0, nworkers) of workers */
    unsigned nthreads; /* every scheduler thread slot (relief threads after the homes): per-thread
                        * caches, indexed by sched_worker_id() */
    int port;
    /* Metrics (cfg.metrics): counted at all, and the publisher thread (server.c) while the
     * workers run: its stop eventfd, -1 when it does not run. */
    int metrics_on;
    pthread_t pub_thread;
    int pub_stop;
    /* The supervisor's watcher (cfg.parent_pid, server.c): its thread and stop eventfd, -1 when
     * it does not run. Started by the first server_start, stopped by server_free. */
    pthread_t parent_thread;
    int parent_stop;
    /* server_stopped_fd: an eventfd written once by the server_shutdown that stopped the
     * workers, never read (it stays readable); closed by server_free. */
    int stopped_fd;
    void (*off_begin)(void *);
    void (*off_end)(void *);
    void (*off_exit)(void *);
    void *off_ud;
    int off_shared;                      /* server_share_offloads */
    int (*on_bound)(void *ud, int port); /* server_set_on_bound */
    void *on_bound_ud;
    _Atomic int running;
    _Atomic int draining;
    _Atomic int health_failing; /* server_fail_health */
    _Atomic uint64_t live;
    _Atomic uint64_t body_held;     /* request body bytes held against cfg.body_budget (http1.c) */
    _Atomic unsigned body_streams;  /* bodies being streamed to handlers (body.c's slots) */
    _Atomic unsigned in_handlers;   /* requests in a handler, under cfg.limit_concurrency */
    _Atomic int stopping;           /* a server_shutdown is in progress or done */
    _Atomic uint64_t stop_deadline; /* when the grace period of the shutdown ends */
    _Atomic unsigned undrained;     /* listener slots a stop has not yet drained and shut */
    /* memfds of large process-lifetime handler bodies, see static_ext_memfd(). Entries
     * [0, ext_count) are immutable once published; ext_lock serialises the writers. */
    pthread_mutex_t ext_lock;
    /* stats_lock: server_get_stats (any thread, e.g. Python's while stop() runs on another)
     * against start and teardown, which publish and free sched and workers under it. The
     * counters of runs that ended are kept, so that stats() after stop() still tells. */
    pthread_mutex_t stats_lock;
    uint64_t ended_inline, ended_spawned, ended_answered;
    /* Streams (stream.c) a stop cancelled before their handler could be
     * told: no call can be offloaded any more. server_take_orphan() hands them to the caller of
     * the stop, which releases them with their target's py_stream. Under orphan_lock (any
     * worker, while stopping). */
    pthread_mutex_t orphan_lock;
    struct orphan {
        const struct server_target *t;
        void *stream;
    } *orphans;
    size_t n_orphans, cap_orphans;
    /* Handoffs (handoff.h) whose coroutines wait for an answer made off the workers, so that a
     * stop can end those waits: under handoff_lock; cancelled: the stop did, new waits end at
     * once. */
    pthread_mutex_t handoff_lock;
    struct handoff *handoffs;
    int handoffs_cancelled;
    _Atomic unsigned ext_count;
    struct ext_memfd {
        const char *ptr;
        size_t len;
        int fd; /* -1: no memfd could be made, send from ptr */
    } ext[EXT_MEMFD_MAX];
};

/* Whether a shutdown has begun. Any thread. */
static inline int server_draining(const struct server *s)
{
    /* safety: the flag only makes coroutines finish sooner; a late observation just serves one
     * more request, so relaxed ordering is enough. */
    return atomic_load_explicit(&s->draining, memory_order_relaxed);
}

/* Whether the health path answers 503 (server_fail_health, or a stop has begun). Any thread. */
static inline int server_health_failing(const struct server *s)
{
    /* safety: relaxed, as draining: a late observation answers one more check 200. */
    return atomic_load_explicit(&s->health_failing, memory_order_relaxed) || server_draining(s);
}

/* The worker running the calling thread: its caches are this thread's alone. Not the home of
 * anything: use c->home for home state. */
static inline struct server_worker *server_worker_self(struct server *s)
{
    int id = sched_worker_id();
    return &s->workers[id < 0 ? 0 : id];
}

/* The calling thread's metrics shard, or NULL (metrics off, a thread without one, or not a
 * scheduler thread: a shard has one writer). */
static inline struct metrics_shard *server_metrics_self(struct server *s)
{
    if (LIKELY(!s->metrics_on))
        return NULL;
    int id = sched_worker_id();
    return id < 0 ? NULL : s->workers[id].m;
}

/* What the metrics call target t's kind (enum metrics_kind). */
static inline unsigned server_target_mkind(const struct server_target *t)
{
    switch (t->kind) {
    case SERVER_STATIC:
        return METRICS_STATIC;
    case SERVER_FILES:
        return METRICS_FILES;
    case SERVER_NOGIL:
    case SERVER_NOGIL_WS:
        return METRICS_NOGIL;
    default:
        return t->metrics_kind ? t->metrics_kind : METRICS_PYTHON;
    }
}

#endif
