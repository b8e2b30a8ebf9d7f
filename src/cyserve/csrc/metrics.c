/* metrics.c: the counters' shared region, their text exposition, and the scrape listener.
 *
 * Design
 * ------
 * Prometheus users of gunicorn and uvicorn expect one endpoint per server that tells the whole
 * server, however many worker processes it runs (prometheus_client's multiprocess mode sums the
 * workers' files for the same reason), and counters that never go down while the server runs,
 * even when workers are recycled. So:
 *
 * - Where the counts live. A process cannot read another's memory, so the counters are in one
 *   region of shared memory (an anonymous MAP_SHARED mapping), made by the process that answers
 *   scrapes before it forks any worker: the supervisor under --processes, or the serving process
 *   itself. Each serving process gets a slot (struct metrics_proc, claimed by pid), and each of
 *   its scheduler threads a shard in it (struct metrics_shard, 64-byte aligned, indexed by
 *   sched_worker_id()). A thread adds to its own shard with a relaxed load and a relaxed store:
 *   on x86-64 a plain add to a line no other thread writes, no locked instruction, nothing
 *   shared on the hot path. Readers (the scrape) load the same words relaxed: a scrape sees
 *   each counter at some recent value, which is all Prometheus asks.
 * - What threads do not count. Open connections are already counted by the engine (one shared
 *   counter, touched once per connection, not per request); the scheduler has its own per-worker
 *   counters (steals, parks, hops) and queues. Rather than add stores to the scheduler's paths,
 *   a publisher thread in each serving process copies them into its slot every
 *   METRICS_PUBLISH_MS (server.c), and with them the scheduler's heartbeat (for --worker-timeout:
 *   the supervisor reads it from the same slot). A scrape is then at most that much behind for
 *   those gauges.
 * - Workers that end. When the supervisor reaps a worker, metrics_retire() adds the slot's
 *   counters into a totals slot (the last one) and frees the slot for the next worker, under the
 *   same lock as the scrape, so a scrape never sees a worker's counts twice or not at all. Its
 *   gauges are dropped with it.
 * - The scrape is answered by a plain thread of that process (metrics_listen_start): accept,
 *   read the request head, sum, one write, close, all within 2 s. No GIL, no scheduler: a
 *   scrape is answered even while every worker is stuck, which is when it is wanted.
 *
 * - What a request costs. The busiest answer, a static route's on HTTP/1's inline path, takes
 *   about 1,600 instructions; a clock read, the histogram's walk and four adds there were 7 %
 *   more (bench/micro/cg_request.sh with --metrics-bind, docs/benchmarks.md "Session 16"). So
 *   that path adds one to its shard's quick[class] and the bytes it read and wrote, nothing
 *   else: its answers are made within the poll that read them, in microseconds, and the sums
 *   count each one in the first duration bucket (0.5 ms) with no time added to the durations'
 *   sum. Every other answer reads the clock when its head is complete and when it is answered.
 *
 * Why not one metrics port per worker process (as some Prometheus set-ups do): the scraper
 * would have to know the workers, which come and go with recycling and reloads. Why not
 * atomic adds on shared counters: every request would bounce one cache line between cores.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"

/* Serialises metrics_retire against metrics_format: both run in the process that made the
 * region, which is the only one that folds or scrapes. */
static pthread_mutex_t metrics_lock = PTHREAD_MUTEX_INITIALIZER;

/* The histogram's upper bounds, in nanoseconds and as Prometheus writes them. */
static const uint64_t bucket_ns[METRICS_BUCKETS] = {
    500000ull,     1000000ull,    2500000ull,    5000000ull,     10000000ull,
    25000000ull,   50000000ull,   100000000ull,  250000000ull,   500000000ull,
    1000000000ull, 2500000000ull, 5000000000ull, 10000000000ull,
};
static const char *const bucket_le[METRICS_BUCKETS] = {
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
    "0.1",    "0.25",  "0.5",    "1",     "2.5",  "5",     "10",
};
static const char *const kind_names[METRICS_KINDS] = {"none",   "static", "files", "nogil",
                                                      "python", "wsgi",   "asgi"};
static const char *const reject_status[METRICS_REJECTS] = {"400", "408", "413", "414",
                                                           "431", "503", "503", "other"};
static const char *const ws_reason_names[METRICS_WS_REASONS] = {
    "normal",  "protocol_error", "invalid_payload", "policy",
    "too_big", "internal_error", "abnormal",        "other"};
static const char *const ws_by_names[METRICS_WS_BYS] = {"server", "client"};
static const char *const reject_reason[METRICS_REJECTS] = {
    "malformed",      "timeout",       "body_too_large",    "target_too_long",
    "head_too_large", "body_capacity", "limit_concurrency", "other"};

int metrics_region_new(struct metrics_region **out, unsigned nprocs, unsigned nshards)
{
    if (nprocs == 0 || nshards == 0 || nprocs > 4096 || nshards > 4096)
        return -EINVAL;
    size_t proc = sizeof(struct metrics_proc) + (size_t)nshards * sizeof(struct metrics_shard);
    proc = (proc + CACHE_LINE - 1) & ~(size_t)(CACHE_LINE - 1);
    size_t size = sizeof(struct metrics_region) + (size_t)(nprocs + 1) * proc;
    /* Anonymous and shared: the processes forked later see the same pages; untouched shards
     * cost no memory. */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return -ENOMEM;
    struct metrics_region *r = p;
    r->nprocs = nprocs;
    r->nshards = nshards;
    r->proc_size = proc;
    r->size = size;
    *out = r;
    return 0;
}

void metrics_region_free(struct metrics_region *r)
{
    if (r)
        munmap(r, r->size);
}

int metrics_claim(struct metrics_region *r, pid_t pid)
{
    for (unsigned i = 0; i < r->nprocs; i++) {
        int64_t free_pid = 0;
        /* safety: slots are claimed by one process (the supervisor), but a CAS keeps two
         * claimers from taking the same slot all the same. */
        if (atomic_compare_exchange_strong_explicit(&metrics_proc_at(r, i)->pid, &free_pid,
                                                    (int64_t)pid, memory_order_acq_rel,
                                                    memory_order_relaxed))
            return (int)i;
    }
    return -ENOSPC;
}

/* What a counter of slot i is: loaded relaxed. */
static inline uint64_t counter_ld(const _Atomic uint64_t *c)
{
    /* safety: relaxed reads of counters other threads (and processes) write; see the top. */
    return atomic_load_explicit(c, memory_order_relaxed);
}

static void counter_fold(_Atomic uint64_t *into, _Atomic uint64_t *from)
{
    /* safety: the totals slot is written under metrics_lock only; from's process has ended. */
    atomic_store_explicit(into, counter_ld(into) + counter_ld(from), memory_order_relaxed);
    atomic_store_explicit(from, 0, memory_order_relaxed);
}

void metrics_retire(struct metrics_region *r, unsigned i)
{
    if (i >= r->nprocs)
        return;
    struct metrics_proc *p = metrics_proc_at(r, i), *t = metrics_proc_at(r, r->nprocs);
    pthread_mutex_lock(&metrics_lock);
    for (unsigned k = 0; k < r->nshards; k++) {
        struct metrics_shard *a = &t->shards[k], *b = &p->shards[k];
        for (unsigned x = 0; x < METRICS_KINDS; x++)
            for (unsigned y = 0; y < 5; y++)
                counter_fold(&a->req[x][y], &b->req[x][y]);
        for (unsigned x = 0; x <= METRICS_BUCKETS; x++)
            counter_fold(&a->dur[x], &b->dur[x]);
        counter_fold(&a->dur_ns, &b->dur_ns);
        counter_fold(&a->bytes_in, &b->bytes_in);
        counter_fold(&a->bytes_out, &b->bytes_out);
        counter_fold(&a->accepted, &b->accepted);
        for (unsigned x = 0; x < METRICS_REJECTS; x++)
            counter_fold(&a->reject[x], &b->reject[x]);
        for (unsigned x = 0; x < 5; x++)
            counter_fold(&a->quick[x], &b->quick[x]);
        for (unsigned x = 0; x < METRICS_WS_BYS; x++)
            for (unsigned y = 0; y < METRICS_WS_REASONS; y++)
                counter_fold(&a->ws_close[x][y], &b->ws_close[x][y]);
    }
    counter_fold(&t->inline_ok, &p->inline_ok);
    counter_fold(&t->spawned, &p->spawned);
    counter_fold(&t->steals, &p->steals);
    counter_fold(&t->parks, &p->parks);
    counter_fold(&t->hops, &p->hops);
    counter_fold(&t->offloads, &p->offloads);
    counter_fold(&t->reliefs, &p->reliefs);
    counter_fold(&t->relief_threads, &p->relief_threads);
    counter_fold(&t->offload_wait_ns, &p->offload_wait_ns);
    counter_fold(&t->trims, &p->trims);
    /* safety: the gauges and the heartbeat of an ended process mean nothing any more. */
    atomic_store_explicit(&p->open, 0, memory_order_relaxed);
    atomic_store_explicit(&p->busy, 0, memory_order_relaxed);
    atomic_store_explicit(&p->python, 0, memory_order_relaxed);
    atomic_store_explicit(&p->runq, 0, memory_order_relaxed);
    atomic_store_explicit(&p->coroutines, 0, memory_order_relaxed);
    atomic_store_explicit(&p->stacks, 0, memory_order_relaxed);
    atomic_store_explicit(&p->beat_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&p->stuck_ns, 0, memory_order_relaxed);
    metrics_set_route(p, NULL);
    atomic_store_explicit(&p->pid, 0, memory_order_release);
    pthread_mutex_unlock(&metrics_lock);
}

void metrics_set_route(struct metrics_proc *p, const char *route)
{
    char buf[METRICS_ROUTE_MAX] = {0};
    if (route) {
        size_t n = strnlen(route, sizeof(buf) - 1);
        memcpy(buf, route, n);
    }
    uint64_t seq = atomic_load_explicit(&p->route_seq, memory_order_relaxed);
    atomic_store_explicit(&p->route_seq, seq + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    for (size_t i = 0; i < METRICS_ROUTE_MAX / 8; i++) {
        uint64_t w;
        memcpy(&w, buf + 8 * i, 8);
        atomic_store_explicit(&p->route[i], w, memory_order_relaxed);
    }
    atomic_store_explicit(&p->route_seq, seq + 2, memory_order_release);
}

size_t metrics_get_route(const struct metrics_proc *p, char *out, size_t cap)
{
    char buf[METRICS_ROUTE_MAX];
    if (!cap)
        return 0;
    out[0] = 0;
    for (int tries = 0; tries < 4; tries++) {
        uint64_t seq = atomic_load_explicit(&p->route_seq, memory_order_acquire);
        if (seq & 1)
            continue;
        for (size_t i = 0; i < METRICS_ROUTE_MAX / 8; i++) {
            uint64_t w = atomic_load_explicit(&p->route[i], memory_order_relaxed);
            memcpy(buf + 8 * i, &w, 8);
        }
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&p->route_seq, memory_order_relaxed) != seq)
            continue;
        buf[sizeof(buf) - 1] = 0;
        size_t n = strnlen(buf, cap - 1);
        memcpy(out, buf, n);
        out[n] = 0;
        return n;
    }
    return 0;
}

void metrics_note_request(struct metrics_shard *m, unsigned kind, int status, uint64_t dur_ns)
{
    if (!m)
        return;
    unsigned cls = status >= 100 && status < 600 ? (unsigned)(status / 100 - 1) : 4;
    metrics_add(&m->req[kind < METRICS_KINDS ? kind : 0][cls], 1);
    unsigned b = 0;
    while (b < METRICS_BUCKETS && dur_ns > bucket_ns[b])
        b++;
    metrics_add(&m->dur[b], 1);
    metrics_add(&m->dur_ns, dur_ns);
}

void metrics_note_reject(struct metrics_shard *m, int status)
{
    if (!m)
        return;
    unsigned r = status == 400   ? METRICS_R400
                 : status == 408 ? METRICS_R408
                 : status == 413 ? METRICS_R413
                 : status == 414 ? METRICS_R414
                 : status == 431 ? METRICS_R431
                 : status == 503 ? METRICS_R503
                                 : METRICS_ROTHER;
    metrics_add(&m->reject[r], 1);
    unsigned cls = status >= 100 && status < 600 ? (unsigned)(status / 100 - 1) : 4;
    metrics_add(&m->req[METRICS_NONE][cls], 1);
}

void metrics_note_limit(struct metrics_shard *m)
{
    if (m)
        metrics_add(&m->reject[METRICS_RLIMIT], 1);
}

unsigned metrics_ws_close_reason(int code)
{
    switch (code) {
    case 1000: /* normal */
    case 1001: /* going away */
    case 1005: /* the close frame carried no code: a closing handshake all the same */
        return METRICS_WS_NORMAL;
    case 1002:
        return METRICS_WS_PROTOCOL;
    case 1006:
        return METRICS_WS_ABNORMAL;
    case 1007:
        return METRICS_WS_INVALID;
    case 1008:
        return METRICS_WS_POLICY;
    case 1009:
        return METRICS_WS_TOO_BIG;
    case 1011:
        return METRICS_WS_INTERNAL;
    default:
        return METRICS_WS_OTHER;
    }
}

void metrics_note_ws_close(struct metrics_shard *m, int code, unsigned by)
{
    if (!m)
        return;
    unsigned reason = metrics_ws_close_reason(code);
    if (reason == METRICS_WS_ABNORMAL || by >= METRICS_WS_BYS)
        by = METRICS_WS_BY_CLIENT; /* no close frame: nobody began a handshake (metrics.h) */
    metrics_add(&m->ws_close[by][reason], 1);
}

/* The sums a scrape tells. */
struct metrics_sum {
    uint64_t req[METRICS_KINDS][5], dur[METRICS_BUCKETS + 1], dur_ns, bytes_in, bytes_out;
    uint64_t accepted, reject[METRICS_REJECTS], ws_close[METRICS_WS_BYS][METRICS_WS_REASONS];
    uint64_t open, busy, python, inline_ok, spawned, steals, parks, hops, offloads, reliefs,
        relief_threads;
    uint64_t runq, procs, coroutines, offload_wait_ns, stacks, trims;
};

static void sum_region(struct metrics_region *r, struct metrics_sum *s)
{
    memset(s, 0, sizeof(*s));
    for (unsigned i = 0; i <= r->nprocs; i++) {
        struct metrics_proc *p = metrics_proc_at(r, i);
        /* safety: acquire pairs with metrics_retire's release of a freed slot (a free slot
         * still adds its zeros, harmlessly). */
        if (i < r->nprocs && atomic_load_explicit(&p->pid, memory_order_acquire) != 0)
            s->procs++;
        for (unsigned k = 0; k < r->nshards; k++) {
            struct metrics_shard *m = &p->shards[k];
            for (unsigned x = 0; x < METRICS_KINDS; x++)
                for (unsigned y = 0; y < 5; y++)
                    s->req[x][y] += counter_ld(&m->req[x][y]);
            for (unsigned x = 0; x <= METRICS_BUCKETS; x++)
                s->dur[x] += counter_ld(&m->dur[x]);
            s->dur_ns += counter_ld(&m->dur_ns);
            s->bytes_in += counter_ld(&m->bytes_in);
            s->bytes_out += counter_ld(&m->bytes_out);
            s->accepted += counter_ld(&m->accepted);
            for (unsigned x = 0; x < METRICS_REJECTS; x++)
                s->reject[x] += counter_ld(&m->reject[x]);
            for (unsigned x = 0; x < METRICS_WS_BYS; x++)
                for (unsigned y = 0; y < METRICS_WS_REASONS; y++)
                    s->ws_close[x][y] += counter_ld(&m->ws_close[x][y]);
            for (unsigned y = 0; y < 5; y++) {
                uint64_t q = counter_ld(&m->quick[y]);
                s->req[METRICS_STATIC][y] += q;
                s->dur[0] += q;
            }
        }
        s->open += counter_ld(&p->open);
        s->busy += counter_ld(&p->busy);
        s->python += counter_ld(&p->python);
        s->inline_ok += counter_ld(&p->inline_ok);
        s->spawned += counter_ld(&p->spawned);
        s->steals += counter_ld(&p->steals);
        s->parks += counter_ld(&p->parks);
        s->hops += counter_ld(&p->hops);
        s->offloads += counter_ld(&p->offloads);
        s->reliefs += counter_ld(&p->reliefs);
        s->relief_threads += counter_ld(&p->relief_threads);
        s->runq += counter_ld(&p->runq);
        s->coroutines += counter_ld(&p->coroutines);
        s->offload_wait_ns += counter_ld(&p->offload_wait_ns);
        s->stacks += counter_ld(&p->stacks);
        s->trims += counter_ld(&p->trims);
    }
}

/* A bounded appender: once out of room it only remembers that. */
struct text {
    char *p;
    size_t len, cap;
    int full;
};

static void text_put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_put(struct text *t, const char *fmt, ...)
{
    if (t->full)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= t->cap - t->len)
        t->full = 1;
    else
        t->len += (size_t)n;
}

static void text_put_one(struct text *t, const char *name, const char *type, const char *help,
                         uint64_t v)
{
    text_put(t, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name,
             (unsigned long long)v);
}

ssize_t metrics_format(struct metrics_region *r, char *buf, size_t cap)
{
    struct metrics_sum s;
    pthread_mutex_lock(&metrics_lock);
    sum_region(r, &s);
    pthread_mutex_unlock(&metrics_lock);
    struct text t = {buf, 0, cap, 0};
    text_put(&t,
             "# HELP cyserve_requests_total Requests answered, by the kind of route that answered "
             "(none: no route, or the engine's own error answer) and status class.\n"
             "# TYPE cyserve_requests_total counter\n");
    for (unsigned x = 0; x < METRICS_KINDS; x++)
        for (unsigned y = 0; y < 5; y++)
            text_put(&t, "cyserve_requests_total{route=\"%s\",status=\"%uxx\"} %llu\n",
                     kind_names[x], y + 1, (unsigned long long)s.req[x][y]);
    text_put(&t, "# HELP cyserve_request_duration_seconds Time from a request's complete head (or, "
                 "when answered on the worker's loop, from the readiness that brought it) to its "
                 "answer queued.\n# TYPE cyserve_request_duration_seconds histogram\n");
    uint64_t cum = 0;
    for (unsigned b = 0; b < METRICS_BUCKETS; b++) {
        cum += s.dur[b];
        text_put(&t, "cyserve_request_duration_seconds_bucket{le=\"%s\"} %llu\n", bucket_le[b],
                 (unsigned long long)cum);
    }
    cum += s.dur[METRICS_BUCKETS];
    text_put(&t, "cyserve_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n",
             (unsigned long long)cum);
    text_put(&t, "cyserve_request_duration_seconds_sum %.9f\n", (double)s.dur_ns / 1e9);
    text_put(&t, "cyserve_request_duration_seconds_count %llu\n", (unsigned long long)cum);
    text_put(&t,
             "# HELP cyserve_rejections_total Requests the engine refused itself, by status "
             "and reason: 400 malformed, 408 a head or body too slow, 413 body, 414 target, 431 "
             "head too large, 503 the request bodies' budget (body_capacity) or "
             "--limit-concurrency.\n# TYPE cyserve_rejections_total counter\n");
    for (unsigned x = 0; x < METRICS_REJECTS; x++)
        text_put(&t, "cyserve_rejections_total{status=\"%s\",reason=\"%s\"} %llu\n",
                 reject_status[x], reject_reason[x], (unsigned long long)s.reject[x]);
    text_put(&t,
             "# HELP cyserve_websocket_closes_total WebSocket connections ended, by who began the "
             "closing handshake and the class of its code: normal (1000, 1001, none), "
             "protocol_error (1002), invalid_payload (1007), policy (1008), too_big (1009), "
             "internal_error (1011), other (any other code); abnormal: no close frame (1006).\n"
             "# TYPE cyserve_websocket_closes_total counter\n");
    for (unsigned x = 0; x < METRICS_WS_BYS; x++)
        for (unsigned y = 0; y < METRICS_WS_REASONS; y++)
            if (y != METRICS_WS_ABNORMAL || x == METRICS_WS_BY_CLIENT) /* none by the server */
                text_put(&t, "cyserve_websocket_closes_total{by=\"%s\",reason=\"%s\"} %llu\n",
                         ws_by_names[x], ws_reason_names[y], (unsigned long long)s.ws_close[x][y]);
    text_put_one(&t, "cyserve_received_bytes_total", "counter",
                 "Bytes read from clients (HTTP, before TLS).", s.bytes_in);
    text_put_one(&t, "cyserve_sent_bytes_total", "counter",
                 "Bytes sent to clients (HTTP, before TLS).", s.bytes_out);
    text_put_one(&t, "cyserve_connections_total", "counter", "Connections accepted.", s.accepted);
    text_put_one(&t, "cyserve_open_connections", "gauge", "Connections open now.", s.open);
    /* Each process's gauges are copied at a slightly different moment: the parts are clamped so
     * that none goes below 0 and they add up to the open connections. */
    uint64_t busy = s.busy < s.open ? s.busy : s.open;
    uint64_t python = s.python < busy ? s.python : busy;
    text_put(&t,
             "# HELP cyserve_connections Open connections by state: idle (keep-alive, between "
             "requests), active (a request in progress in the engine), python (in a Python call, "
             "or waiting for its batch or the GIL).\n"
             "# TYPE cyserve_connections gauge\n"
             "cyserve_connections{state=\"idle\"} %llu\n"
             "cyserve_connections{state=\"active\"} %llu\n"
             "cyserve_connections{state=\"python\"} %llu\n",
             (unsigned long long)(s.open - busy), (unsigned long long)(busy - python),
             (unsigned long long)python);
    text_put_one(&t, "cyserve_inline_answers_total", "counter",
                 "Requests answered on a worker's loop, without a coroutine.", s.inline_ok);
    text_put_one(&t, "cyserve_coroutines_spawned_total", "counter",
                 "Coroutines the scheduler started.", s.spawned);
    text_put_one(&t, "cyserve_scheduler_steals_total", "counter",
                 "Times a worker stole coroutines from another's run queue.", s.steals);
    text_put_one(&t, "cyserve_scheduler_parks_total", "counter",
                 "Times a worker went to sleep for want of work.", s.parks);
    text_put_one(&t, "cyserve_scheduler_hops_total", "counter",
                 "Coroutines moved to their connection's home worker.", s.hops);
    text_put_one(&t, "cyserve_scheduler_offloads_total", "counter",
                 "Python calls handed to a worker's batch under the GIL.", s.offloads);
    text_put_one(&t, "cyserve_scheduler_run_queue", "gauge", "Coroutines queued to run.", s.runq);
    text_put_one(&t, "cyserve_coroutines", "gauge",
                 "Coroutines alive now, each holding a stack from its worker's pool.",
                 s.coroutines);
    text_put_one(&t, "cyserve_coroutine_stacks", "gauge",
                 "Coroutine stacks mapped now: held by coroutines, or cached free in the threads' "
                 "pools and the depot they share.",
                 s.stacks);
    text_put_one(&t, "cyserve_coroutine_stack_trims_total", "counter",
                 "Times an idle thread gave back its free coroutine stacks.", s.trims);
    text_put(&t,
             "# HELP cyserve_python_wait_seconds_total Time batches of Python calls waited to "
             "start: for the GIL (on a free-threaded build, to attach).\n"
             "# TYPE cyserve_python_wait_seconds_total counter\n"
             "cyserve_python_wait_seconds_total %.6f\n",
             (double)s.offload_wait_ns / 1e9);
    text_put_one(&t, "cyserve_relief_adoptions_total", "counter",
                 "Times a relief thread took over the loop of a worker stuck in a call.",
                 s.reliefs);
    text_put_one(&t, "cyserve_relief_threads", "gauge", "Relief threads started.",
                 s.relief_threads);
    text_put_one(&t, "cyserve_worker_processes", "gauge", "Serving processes counted here.",
                 s.procs);
    return t.full ? -ENOSPC : (ssize_t)t.len;
}

/* ---- the scrape listener ---- */

struct metrics_listener {
    struct metrics_region *r;
    int fd, stop_fd;
    pthread_t thread;
    char buf[METRICS_TEXT_MAX];
};

/* Wait up to ms for fd to be ready for events, or (stoppable) the stop: 1 ready, 0 timed out
 * or stopped. */
static int scrape_wait(struct metrics_listener *l, int fd, short events, int ms, int stoppable)
{
    struct pollfd pf[2] = {{fd, events, 0}, {l->stop_fd, POLLIN, 0}};
    int n;
    do
        n = poll(pf, stoppable ? 2 : 1, ms);
    while (n < 0 && errno == EINTR);
    return n > 0 && !(pf[1].revents & POLLIN) && pf[0].revents != 0;
}

/* Write all of p[0..len) to c, within the scrape's deadline (CLOCK_MONOTONIC ns). */
static void scrape_write(struct metrics_listener *l, int c, const char *p, size_t len,
                         uint64_t deadline)
{
    while (len > 0) {
        ssize_t n = send(c, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        uint64_t now = clock_mono_ns();
        if (n < 0 && errno == EAGAIN && now < deadline &&
            scrape_wait(l, c, POLLOUT, (int)((deadline - now) / 1000000) + 1, 0))
            continue;
        return;
    }
}

static void scrape_one(struct metrics_listener *l, int c)
{
    char req[2048];
    size_t len = 0;
    uint64_t deadline = clock_mono_ns() + 2000000000ull;
    while (!memmem(req, len, "\r\n\r\n", 4) && !memmem(req, len, "\n\n", 2)) {
        if (len == sizeof(req))
            return; /* a head this large is not a scrape */
        ssize_t n = recv(c, req + len, sizeof(req) - len, 0);
        if (n > 0) {
            len += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR))
            return;
        uint64_t now = clock_mono_ns();
        /* Not stoppable: a supervisor stops this thread around each fork, and a scrape it
         * accepted just before (its request not read yet) would be closed unanswered; it is
         * finished instead, within its own deadline. */
        if (now >= deadline || !scrape_wait(l, c, POLLIN, (int)((deadline - now) / 1000000) + 1, 0))
            return;
    }
    int head = len >= 5 && memcmp(req, "HEAD ", 5) == 0;
    size_t m = head ? 5 : 4;
    int ok = (head || (len >= 4 && memcmp(req, "GET ", 4) == 0)) && len >= m + 8 &&
             memcmp(req + m, "/metrics", 8) == 0 && (req[m + 8] == ' ' || req[m + 8] == '?');
    char hdr[256];
    if (!ok) {
        static const char nf[] = "not found: the metrics are at GET /metrics\n";
        int h = snprintf(hdr, sizeof(hdr),
                         "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                         sizeof(nf) - 1);
        scrape_write(l, c, hdr, (size_t)h, deadline);
        if (!head)
            scrape_write(l, c, nf, sizeof(nf) - 1, deadline);
        return;
    }
    ssize_t body = metrics_format(l->r, l->buf, sizeof(l->buf));
    if (body < 0)
        body = 0;
    int h = snprintf(hdr, sizeof(hdr),
                     "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                     "Content-Length: %zd\r\nConnection: close\r\n\r\n",
                     body);
    scrape_write(l, c, hdr, (size_t)h, deadline);
    if (!head)
        scrape_write(l, c, l->buf, (size_t)body, deadline);
}

static void *scrape_main(void *arg)
{
    struct metrics_listener *l = arg;
    for (;;) {
        if (!scrape_wait(l, l->fd, POLLIN, -1, 1)) {
            /* safety: the stop eventfd is the only other event; a poll error on the listener
             * (it was closed under us) ends the thread too. */
            struct pollfd pf = {l->stop_fd, POLLIN, 0};
            if (poll(&pf, 1, 0) != 0)
                return NULL;
            continue;
        }
        int c = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) {
                struct timespec ts = {0, 100 * 1000 * 1000};
                nanosleep(&ts, NULL); /* out of descriptors: try again later */
            }
            continue;
        }
        scrape_one(l, c);
        close(c);
    }
}

int metrics_listen_start(struct metrics_listener **out, struct metrics_region *r, int fd)
{
    struct metrics_listener *l = calloc(1, sizeof(*l));
    if (!l)
        return -ENOMEM;
    l->r = r;
    l->fd = fd;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        int e = -errno;
        free(l);
        return e;
    }
    l->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->stop_fd < 0) {
        int e = -errno;
        free(l);
        return e;
    }
    int rc = pthread_create(&l->thread, NULL, scrape_main, l);
    if (rc != 0) {
        close(l->stop_fd);
        free(l);
        return -rc;
    }
    pthread_setname_np(l->thread, "cyserve-metrics");
    *out = l;
    return 0;
}

void metrics_listen_stop(struct metrics_listener *l)
{
    if (!l)
        return;
    uint64_t one = 1;
    ssize_t n = write(l->stop_fd, &one, sizeof(one));
    (void)n; /* an eventfd write of 1 only fails on overflow */
    pthread_join(l->thread, NULL);
    close(l->stop_fd);
    free(l);
}
