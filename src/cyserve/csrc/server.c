/* server.c: the engine's lifecycle: configuration, new, start, shutdown, free, and counters.
 *
 * Design
 * ------
 * The engine serves HTTP/1.1 on the scheduler's workers (sched.h) and knows nothing of Python.
 * Its files, in the order of a request's path:
 *
 *   listen.c         per-worker SO_REUSEPORT listeners, accepting, the worker's shutdown part
 *   conn.c           connections: protocol and transport pointers, buffer and struct caches,
 *                    idle and its lazy timer, reads and writes with deadlines
 *   http1_inline.c   HTTP/1's on_readable: the inline path, a lone request answered in the
 *                    readiness callback without a coroutine
 *   http1.c          HTTP/1's coroutine: heads, 100-continue, bodies, pipelining, framing
 *   request.c        the request core: the handler's view of a request, route to handler kind
 *   handler_static.c static targets (a response made once at startup); handler_files.c files
 *                    under a root; stream.c streamed Python answers; access_log.c the log line
 *
 * Each file's top tells its part of the design. This one's is the shutdown:
 *
 * Shutdown (server_shutdown). 1. Set the draining flag: every coroutine answers its current
 * request with Connection: close and closes. 2. Wake every worker through its control eventfd;
 * on the worker, listen_ctl_on_ready() (listen.c) arms a zero-delay timer that closes every
 * idle connection unless its next request has already arrived: that one is answered with
 * Connection: close, as is one a coroutine finds in its socket when it would otherwise close
 * (one non-blocking read, nothing waited for). And it drains the listener: the connections
 * still in the kernel's accept queue are accepted and served like those (shutting a listener
 * down resets what its queue holds), then the listener is shut. 3. Wait up to grace for every
 * listener to be drained and the live connection count to reach zero. 4. sched_stop() cancels
 * what is left and the workers are joined. 5. With no worker running, close the listeners and
 * free every connection.
 *
 * Metrics (cfg.metrics, metrics.h). Each scheduler thread counts into its own shard of the
 * process's slot; a publisher thread (publish_main) copies what the threads do not count
 * themselves into the slot every METRICS_PUBLISH_MS: open connections, the inline answers and
 * the scheduler's counters, and the scheduler's heartbeat (sched_watch_stuck), which a process
 * supervisor reads to replace a worker stuck in a call (--worker-timeout). It is a thread of
 * its own, not a timer on a worker, because a heartbeat that a stuck worker would have to fire
 * could not tell a stuck worker from a dead one.
 *
 * Not done on purpose: no per-request heap allocation on the static and nogil paths (the
 * response builder starts in inline storage, the serving state lives on the coroutine's stack);
 * no Python anywhere in the engine.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "server.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "conn.h"
#include "coro.h"
#include "handoff.h"
#include "listen.h"
#include "sched.h"
#include "server_int.h"

/* ---- configuration and lifetime ---- */

void server_config_default(struct server_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->host = "127.0.0.1";
    cfg->port = 8000;
    cfg->threads = 0;
    cfg->blocking_threads = 16;
    cfg->body_budget = 64ull << 20;
    cfg->min_body_rate = 500;
    cfg->backlog = 1024;
    cfg->access_log_fd = -1;
    http_limits_default(&cfg->limits);
    cfg->max_body_bytes = 1u << 20;
    cfg->keepalive_ns = 5000000000ull;
    cfg->header_timeout_ns = 10000000000ull;
    cfg->body_timeout_ns = 10000000000ull;
    cfg->http2 = 1;
    cfg->http2_max_streams = 100;
    cfg->inline_routes = 1;
    cfg->head = http_head_default;
}

/* Free the listeners' copies (server_new, server_free). */
static void server_free_listens(struct server *s)
{
    for (unsigned i = 0; s->listens && i < s->nlistens; i++)
        free((char *)s->listens[i].host);
    free(s->listens);
    free(s->ports);
    s->listens = NULL;
    s->ports = NULL;
    s->nlistens = 0;
}

int server_new(struct server **out, const struct server_config *cfg, const struct router *router)
{
    if (UNLIKELY(!cfg || !router || cfg->port < 0 || cfg->port > 65535 || cfg->backlog < 1 ||
                 cfg->limits.max_header_bytes < 64 || cfg->limits.max_headers < 1))
        return -EINVAL;
    struct server *s = calloc(1, sizeof(*s));
    if (UNLIKELY(!s))
        return -ENOMEM;
    s->cfg = *cfg;
    s->host = strdup(cfg->host ? cfg->host : "127.0.0.1");
    if (UNLIKELY(!s->host)) {
        free(s);
        return -ENOMEM;
    }
    s->cfg.host = s->host;
    /* The listeners: cfg's list, or one of host and port. */
    unsigned nl = cfg->nlisten ? cfg->nlisten : 1;
    s->listens = calloc(nl, sizeof(*s->listens));
    s->ports = calloc(nl, sizeof(*s->ports));
    if (UNLIKELY(!s->listens || !s->ports)) {
        server_free_listens(s);
        free(s->host);
        free(s);
        return -ENOMEM;
    }
    s->nlistens = nl;
    for (unsigned i = 0; i < nl; i++) {
        struct server_listen l = {.host = s->host, .port = cfg->port, .fd = -1};
        if (cfg->nlisten)
            l = cfg->listen[i];
        int bad = l.fd < 0 ? (!l.host || l.port < 0 || l.port > 65535) : 0;
        s->listens[i].fd = l.fd;
        s->listens[i].port = l.port;
        s->listens[i].host = l.fd < 0 && l.host ? strdup(l.host) : NULL;
        if (UNLIKELY(bad || (l.fd < 0 && !s->listens[i].host))) {
            server_free_listens(s);
            free(s->host);
            free(s);
            return bad ? -EINVAL : -ENOMEM;
        }
    }
    s->cfg.listen = NULL; /* the copies above are the server's */
    s->cfg.nlisten = 0;
    if (cfg->forwarded_allow_ips) {
        int rc = proxy_trust_parse(&s->trust, cfg->forwarded_allow_ips);
        if (rc < 0) {
            server_free_listens(s);
            free(s->host);
            free(s);
            return rc;
        }
        s->trust.forwarded = cfg->forwarded_header ? 1 : 0;
        s->trust.host = cfg->forwarded_host ? 1 : 0;
        s->proxy_headers = 1;
    }
    s->cfg.forwarded_allow_ips = NULL; /* parsed into s->trust */
    if (cfg->proxy_protocol_from) {
        int rc = proxy_trust_parse(&s->pp_trust, cfg->proxy_protocol_from);
        if (rc < 0) {
            proxy_trust_free(&s->trust);
            server_free_listens(s);
            free(s->host);
            free(s);
            return rc;
        }
        s->proxy_protocol = 1;
    }
    s->cfg.proxy_protocol_from = NULL; /* parsed into s->pp_trust */
    s->router = router;
    s->metrics_on = cfg->metrics != NULL && cfg->metrics_shards > 0;
    s->pub_stop = -1;
    s->parent_stop = -1;
    s->stopped_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (UNLIKELY(s->stopped_fd < 0)) {
        int rc = -errno;
        proxy_trust_free(&s->pp_trust);
        proxy_trust_free(&s->trust);
        server_free_listens(s);
        free(s->host);
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->ext_lock, NULL);
    pthread_mutex_init(&s->stats_lock, NULL);
    pthread_mutex_init(&s->orphan_lock, NULL);
    pthread_mutex_init(&s->handoff_lock, NULL);
    *out = s;
    return 0;
}

void server_set_offload_hooks(struct server *s, void (*begin)(void *), void (*end)(void *),
                              void (*exit_hook)(void *), void *ud)
{
    s->off_begin = begin;
    s->off_end = end;
    s->off_exit = exit_hook;
    s->off_ud = ud;
}

void server_share_offloads(struct server *s, int shared)
{
    s->off_shared = shared;
}

int server_port(const struct server *s)
{
    return s->port;
}

int server_listen_port(const struct server *s, unsigned i)
{
    if (i >= s->nlistens)
        return -EINVAL;
    return s->ports[i];
}

int server_running(const struct server *s)
{
    /* safety: a plain flag read by any thread; the control thread is its only writer. */
    return atomic_load_explicit(&s->running, memory_order_acquire);
}

uint64_t server_live_connections(const struct server *s)
{
    /* safety: a counter read for tests; no other memory is published through it. */
    return atomic_load_explicit(&s->live, memory_order_relaxed);
}

/* ---- start and stop ---- */

static int start_fail(char *errmsg, size_t errlen, int rc, const char *fmt, const char *host,
                      int port)
{
    if (errmsg && errlen)
        snprintf(errmsg, errlen, fmt, host, port, strerror(-rc));
    return rc;
}

/* errmsg for listener l that failed with rc: "cannot listen on HOST:PORT: reason" (IPv6 in
 * brackets), or one naming the shared descriptor. */
static int listen_fail(char *errmsg, size_t errlen, int rc, const struct server_listen *l, int port)
{
    if (!errmsg || !errlen)
        return rc;
    if (l->fd >= 0)
        snprintf(errmsg, errlen, "cannot accept on descriptor %d: %s", l->fd,
                 rc == -ENOTSOCK ? "it is not a socket"
                 : rc == -EINVAL ? "it is not a listening stream socket"
                                 : strerror(-rc));
    else
        snprintf(errmsg, errlen,
                 strchr(l->host, ':') ? "cannot listen on [%s]:%d: %s"
                                      : "cannot listen on %s:%d: %s",
                 l->host, port, strerror(-rc));
    return rc;
}

/* Check that fd is a listening stream socket and make it non-blocking (the acceptors read it
 * until EAGAIN). 0 or -errno (-ENOTSOCK, -EINVAL: not listening or not a stream). */
static int shared_listener_check(int fd)
{
    int v = 0;
    socklen_t len = sizeof(v);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) < 0)
        return -errno;
    if (v != SOCK_STREAM)
        return -EINVAL;
    len = sizeof(v);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) < 0)
        return -errno;
    if (!v)
        return -EINVAL;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -errno;
    return 0;
}

static void close_workers(struct server *s)
{
    for (unsigned i = 0; s->workers && i < s->nthreads; i++) {
        struct server_worker *w = &s->workers[i];
        for (unsigned j = 0; w->ls && j < s->nlistens; j++)
            if (w->ls[j].fd >= 0 && !w->ls[j].shared)
                close(w->ls[j].fd);
        free(w->ls);
        w->ls = NULL;
        if (w->ctl_fd >= 0)
            close(w->ctl_fd);
        w->ctl_fd = -1;
        /* No worker runs any more: the connections are plain memory now. */
        while (w->conns) {
            struct conn *c = w->conns;
            w->conns = c->next;
            if (c->proto->close)
                c->proto->close(c);
            /* The transport's state too (a TLS connection's SSL object), as conn_destroy
             * would have freed it. */
            if (c->tp_data != NULL && c->tp->close)
                c->tp->close(c);
            close(c->io.fd);
            free(c->buf);
            free(c->peer);
            free(c);
        }
        while (w->free_conns) {
            struct conn *c = w->free_conns;
            w->free_conns = c->next;
            free(c);
        }
        while (w->nfree_bufs)
            free(w->free_bufs[--w->nfree_bufs]);
    }
    free(s->workers);
    s->workers = NULL;
    atomic_store_explicit(&s->live, 0, memory_order_relaxed); /* safety: no worker runs */
}

/* The publisher thread (see the top): every METRICS_PUBLISH_MS, and once more when it stops. */
static void publish_once(struct server *s, uint64_t *seq, uint64_t *since)
{
    struct metrics_proc *p = s->cfg.metrics;
    struct server_stats st;
    struct sched_stats ss;
    server_get_stats(s, &st);
    sched_get_stats(s->sched, &ss);
    uint64_t now = clock_mono_ns();
    uint64_t stuck = sched_watch_stuck(s->sched, seq, since, now);
    /* safety: this thread is the slot's only writer of these words; readers (a scrape, the
     * supervisor) take each one relaxed, any recent value will do. */
    atomic_store_explicit(&p->open, st.live, memory_order_relaxed);
    uint64_t busy = 0;
    for (unsigned i = 0; i < s->nworkers; i++)
        busy += atomic_load_explicit(&s->workers[i].busy, memory_order_relaxed);
    atomic_store_explicit(&p->busy, busy, memory_order_relaxed);
    atomic_store_explicit(&p->python, ss.offloading, memory_order_relaxed);
    atomic_store_explicit(&p->inline_ok, st.inline_ok, memory_order_relaxed);
    atomic_store_explicit(&p->spawned, st.spawned, memory_order_relaxed);
    atomic_store_explicit(&p->steals, ss.steals, memory_order_relaxed);
    atomic_store_explicit(&p->parks, ss.parks, memory_order_relaxed);
    atomic_store_explicit(&p->hops, ss.hops, memory_order_relaxed);
    atomic_store_explicit(&p->offloads, ss.offloads, memory_order_relaxed);
    atomic_store_explicit(&p->reliefs, ss.reliefs, memory_order_relaxed);
    atomic_store_explicit(&p->relief_threads, ss.relief_threads, memory_order_relaxed);
    atomic_store_explicit(&p->runq, ss.runq, memory_order_relaxed);
    /* Read worker by worker, finished may pass spawned for a moment: never below 0. */
    atomic_store_explicit(&p->coroutines, ss.spawned > ss.finished ? ss.spawned - ss.finished : 0,
                          memory_order_relaxed);
    atomic_store_explicit(&p->offload_wait_ns, ss.offload_wait_ns, memory_order_relaxed);
    /* The process's stacks, not this server's: one server per serving process. The two
     * counters are read so that their difference is never below the true count, nor below 0
     * (coro_stack_counts): the test of 0 only guards against a change to that order. */
    uint64_t mapped, unmapped;
    coro_stack_counts(&mapped, &unmapped);
    atomic_store_explicit(&p->stacks, mapped > unmapped ? mapped - unmapped : 0,
                          memory_order_relaxed);
    atomic_store_explicit(&p->trims, ss.trims, memory_order_relaxed);
    atomic_store_explicit(&p->stuck_ns, stuck, memory_order_relaxed);
    /* The route of the longest call in Python now, for the supervisor's --worker-timeout log. */
    const struct server_target *longest = NULL;
    uint64_t oldest = UINT64_MAX;
    for (unsigned i = 0; s->workers && i < s->nthreads; i++) {
        /* safety: each slot is its thread's; a stale pair only names a call just ended. */
        const struct server_target *t = atomic_load_explicit(&s->workers[i].calling,
                                                             memory_order_relaxed);
        uint64_t at = atomic_load_explicit(&s->workers[i].calling_since, memory_order_relaxed);
        if (t && at < oldest)
            longest = t, oldest = at;
    }
    metrics_set_route(p, longest ? longest->route : NULL);
    atomic_store_explicit(&p->beat_ns, now, memory_order_relaxed);
}

static void *publish_main(void *arg)
{
    struct server *s = arg;
    unsigned n = sched_threads(s->sched);
    uint64_t *seq = calloc(2 * (size_t)n, sizeof(uint64_t));
    if (!seq)
        return NULL;
    for (;;) {
        publish_once(s, seq, seq + n);
        struct pollfd pf = {s->pub_stop, POLLIN, 0};
        if (poll(&pf, 1, METRICS_PUBLISH_MS) > 0)
            break;
    }
    publish_once(s, seq, seq + n); /* the counters as the workers leave them */
    free(seq);
    return NULL;
}

/* Start the publisher once the workers run; without it the server still serves (the slot's
 * gauges and heartbeat stay at 0, which a supervisor takes as "no heartbeat yet"). */
static void publish_start(struct server *s)
{
    if (!s->metrics_on)
        return;
    s->pub_stop = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->pub_stop < 0)
        return;
    if (pthread_create(&s->pub_thread, NULL, publish_main, s) != 0) {
        close(s->pub_stop);
        s->pub_stop = -1;
        return;
    }
    pthread_setname_np(s->pub_thread, "cyserve-publish");
}

static void publish_stop(struct server *s)
{
    if (s->pub_stop < 0)
        return;
    uint64_t one = 1;
    ssize_t n = write(s->pub_stop, &one, sizeof(one));
    (void)n; /* an eventfd write of 1 only fails on overflow */
    pthread_join(s->pub_thread, NULL);
    close(s->pub_stop);
    s->pub_stop = -1;
}

/* ---- the supervisor's watcher (server_config.parent_pid) ----
 *
 * A worker process is told of its supervisor's death by the kernel (PR_SET_PDEATHSIG, SIGTERM),
 * but a signal only sets a flag that Python's handler reads when the main thread next runs
 * Python code: a worker whose GIL is held for good by a C call (an extension spinning, a
 * regular expression backtracking) never stops, and keeps its share of the listeners. This
 * thread needs neither the GIL nor a worker: it notices the death by polling getppid() (10 times
 * a second: a pipe's end would tell at once, but every worker forked later would inherit the
 * other workers' write ends), then stops the engine as SIGTERM's graceful path would (no new
 * connection, idle ones closed, requests in flight given the grace period) and, should the
 * process still run a second after the grace period (its Python thread stuck, or the stop
 * itself stuck joining a worker that never returns from its call), ends it with _exit. */

static void *parent_exit_main(void *arg)
{
    uint64_t ns = (uint64_t)(uintptr_t)arg;
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
    static const char msg[] = "cyserve: the supervisor is gone and this worker did not stop "
                              "within its grace period: exiting\n";
    ssize_t n = write(2, msg, sizeof(msg) - 1);
    (void)n; /* nothing to do if standard error is gone too */
    _exit(1);
}

static void *parent_main(void *arg)
{
    struct server *s = arg;
    struct pollfd pf = {s->parent_stop, POLLIN, 0};
    for (;;) {
        if (poll(&pf, 1, SERVER_PARENT_POLL_MS) > 0)
            return NULL; /* server_free */
        if (getppid() != (pid_t)s->cfg.parent_pid)
            break;
    }
    static const char msg[] = "cyserve: the supervisor is gone: stopping this worker\n";
    ssize_t n = write(2, msg, sizeof(msg) - 1);
    (void)n;
    /* The deadline first, from a thread of its own: the stop below may never return. */
    uint64_t after = s->cfg.parent_grace_ns + 1000000000ull;
    pthread_t t;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0 ||
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) != 0 ||
        pthread_create(&t, &attr, parent_exit_main, (void *)(uintptr_t)after) != 0)
        _exit(1); /* cannot keep the promise of a bounded stop: stop now */
    pthread_attr_destroy(&attr);
    /* A second caller of server_shutdown (the control thread, when its SIGTERM handler runs)
     * waits for this one; this one is not a worker, so it may call it. */
    server_shutdown(s, s->cfg.parent_grace_ns);
    poll(&pf, 1, -1); /* until server_free */
    return NULL;
}

static void parent_watch_start(struct server *s)
{
    if (s->cfg.parent_pid <= 0 || s->parent_stop >= 0)
        return;
    s->parent_stop = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->parent_stop < 0)
        return;
    if (pthread_create(&s->parent_thread, NULL, parent_main, s) != 0) {
        close(s->parent_stop);
        s->parent_stop = -1;
        return;
    }
    pthread_setname_np(s->parent_thread, "cyserve-parent");
}

/* After the last stop: the watcher must not touch s once it is freed. */
static void parent_watch_stop(struct server *s)
{
    if (s->parent_stop < 0)
        return;
    uint64_t one = 1;
    ssize_t n = write(s->parent_stop, &one, sizeof(one));
    (void)n; /* an eventfd write of 1 only fails on overflow */
    pthread_join(s->parent_thread, NULL);
    close(s->parent_stop);
    s->parent_stop = -1;
}

/* Free the scheduler, then the workers and their connections (the scheduler goes first: freeing
 * it cancels coroutines that may still wait on a connection's sched_io, which lives inside the
 * connection), keeping their counters. No worker may run. */
static void teardown(struct server *s)
{
    publish_stop(s); /* before stats_lock: the publisher takes it */
    pthread_mutex_lock(&s->stats_lock);
    for (unsigned i = 0; s->workers && i < s->nthreads; i++) {
        s->ended_inline += atomic_load_explicit(&s->workers[i].inline_ok, memory_order_relaxed);
        s->ended_answered += atomic_load_explicit(&s->workers[i].answered, memory_order_relaxed);
    }
    if (s->sched) {
        struct sched_stats st;
        sched_get_stats(s->sched, &st);
        s->ended_spawned += st.spawned;
    }
    sched_free(s->sched);
    s->sched = NULL;
    close_workers(s);
    pthread_mutex_unlock(&s->stats_lock);
}

void server_fail_health(struct server *s)
{
    /* safety: relaxed: see server_health_failing. */
    atomic_store_explicit(&s->health_failing, 1, memory_order_relaxed);
}

void server_set_on_bound(struct server *s, int (*fn)(void *ud, int port), void *ud)
{
    s->on_bound = fn;
    s->on_bound_ud = ud;
}

int server_start(struct server *s, char *errmsg, size_t errlen)
{
    if (errmsg && errlen)
        errmsg[0] = 0;
    /* safety: the control thread is the only writer of running. */
    if (atomic_load_explicit(&s->running, memory_order_relaxed) || s->sched)
        return -EALREADY;
    unsigned nl = s->nlistens;
    struct addrinfo **res = calloc(nl, sizeof(*res));
    if (!res)
        return -ENOMEM;
    int rc = 0, port = 0;
    unsigned li = 0;
    for (li = 0; li < nl; li++) {
        struct server_listen *l = &s->listens[li];
        if (l->fd >= 0) {
            rc = shared_listener_check(l->fd);
            if (rc < 0)
                goto fail_res;
            s->ports[li] = 0;
            continue;
        }
        struct addrinfo hints;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE;
        int gai = getaddrinfo(l->host, NULL, &hints, &res[li]);
        if (gai != 0 || !res[li]) {
            res[li] = NULL;
            if (errmsg && errlen)
                snprintf(errmsg, errlen, "cannot resolve host %s: %s", l->host, gai_strerror(gai));
            rc = -EINVAL;
            goto fail_res_quiet;
        }
        /* Probe without SO_REUSEPORT: a reuseport bind would silently join another server's
         * group on the same port instead of failing, and "address already in use" must be
         * reported. With shared_port the group is ours (sibling processes; their supervisor
         * made that probe), so the probe binds into it without listening: a listening probe
         * would take its share of the group's new connections while the siblings serve (a
         * replacement starts beside them) and reset them when it closes. */
        int probe = -1;
        port = l->port;
        int shared = s->cfg.shared_port ? 1 : 0;
        rc = listen_open(res[li], l->port, shared, shared ? 0 : 1, &probe);
        if (rc < 0)
            goto fail_res;
        s->ports[li] = listen_bound_port(probe);
        close(probe);
    }
    s->port = 0;
    for (li = 0; li < nl; li++)
        if (s->listens[li].fd < 0) {
            s->port = s->ports[li];
            break;
        }
    if (s->on_bound) {
        rc = s->on_bound(s->on_bound_ud, s->port);
        if (rc < 0) {
            if (errmsg && errlen && !errmsg[0])
                snprintf(errmsg, errlen, "the start was cancelled once bound (%s)", strerror(-rc));
            goto fail_res_quiet;
        }
    }
    struct sched_config sc;
    memset(&sc, 0, sizeof(sc));
    sc.workers = s->cfg.threads;
    sc.relief = s->cfg.blocking_threads;
    sc.relief_waiting_only = s->cfg.relief_waiting_only;
    sc.keep_alive = 1;
    struct sched *sched;
    rc = sched_new(&sched, &sc);
    if (rc < 0) {
        for (li = 0; li < nl; li++)
            if (res[li])
                freeaddrinfo(res[li]);
        free(res);
        return start_fail(errmsg, errlen, rc, "cannot start workers for %s:%d: %s", s->host,
                          s->port);
    }
    pthread_mutex_lock(&s->stats_lock);
    s->sched = sched;
    s->nworkers = sched_workers(s->sched);
    s->nthreads = sched_threads(s->sched);
    s->workers = calloc(s->nthreads, sizeof(*s->workers));
    pthread_mutex_unlock(&s->stats_lock);
    li = 0;
    if (!s->workers) {
        rc = -ENOMEM;
        goto fail_sched;
    }
    /* Every thread slot (relief threads after the workers) has its caches and counters; only
     * the workers, the homes, listen. */
    for (unsigned i = 0; i < s->nthreads; i++) {
        struct server_worker *w = &s->workers[i];
        w->srv = s;
        w->id = i;
        w->ctl_fd = -1;
        if (s->metrics_on && i < s->cfg.metrics_shards)
            w->m = &s->cfg.metrics->shards[i];
        if (i >= s->nworkers)
            continue;
        w->ls = calloc(nl, sizeof(*w->ls));
        if (!w->ls) {
            rc = -ENOMEM;
            goto fail_sched;
        }
        for (unsigned j = 0; j < nl; j++) {
            w->ls[j].w = w;
            w->ls[j].fd = -1;
        }
    }
    for (unsigned i = 0; i < s->nworkers; i++) {
        struct server_worker *w = &s->workers[i];
        for (li = 0; li < nl; li++) {
            struct server_lslot *l = &w->ls[li];
            if (s->listens[li].fd >= 0) {
                l->fd = s->listens[li].fd;
                l->shared = 1;
            } else {
                port = s->ports[li];
                rc = listen_open(res[li], port, 1, s->cfg.backlog, &l->fd);
                if (rc < 0)
                    goto fail_sched;
            }
            /* A listener of this worker alone is served one connection per readiness
             * (listen.c, "Accepting"); a shared one wakes every worker for each connection,
             * and level-triggered it would wake them all at every poll until one took it. */
            l->level = !l->shared;
            l->nodelay_each = listen_set_nodelay(l->fd) < 0;
        }
        w->ctl_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (w->ctl_fd < 0) {
            rc = -errno;
            li = 0;
            goto fail_sched;
        }
    }
    for (li = 0; li < nl; li++)
        if (res[li])
            freeaddrinfo(res[li]);
    free(res);
    res = NULL;
    sched_set_worker_hooks(s->sched, listen_worker_start, NULL, s);
    if (s->off_begin || s->off_end)
        sched_set_offload_hooks(s->sched, s->off_begin, s->off_end, s->off_ud);
    sched_set_offload_exit(s->sched, s->off_exit);
    sched_share_offloads(s->sched, s->off_shared);
    /* safety: workers read draining only after sched_start's thread creation, which orders
     * this store before them. */
    atomic_store_explicit(&s->draining, 0, memory_order_relaxed);
    /* safety: as draining; from here on only listen.c's workers lower it. */
    atomic_store_explicit(&s->undrained, s->nworkers * nl, memory_order_relaxed);
    rc = sched_start(s->sched);
    if (rc < 0) {
        li = 0;
        goto fail_sched;
    }
    /* safety: release pairs with server_running's acquire. */
    atomic_store_explicit(&s->running, 1, memory_order_release);
    publish_start(s);
    parent_watch_start(s);
    return 0;

fail_sched:
    if (res) {
        for (unsigned j = 0; j < nl; j++)
            if (res[j])
                freeaddrinfo(res[j]);
        free(res);
    }
    teardown(s);
    return listen_fail(errmsg, errlen, rc, &s->listens[li < nl ? li : 0], port);

fail_res:
    listen_fail(errmsg, errlen, rc, &s->listens[li], port);
fail_res_quiet:
    for (unsigned j = 0; j < nl; j++)
        if (res[j])
            freeaddrinfo(res[j]);
    free(res);
    return rc;
}

int server_shutdown(struct server *s, uint64_t grace_ns)
{
    if (UNLIKELY(sched_worker_id() >= 0))
        return -EDEADLK; /* a handler stopping its own server would wait for itself */
    uint64_t deadline = clock_mono_ns() + grace_ns;
    int expected = 0;
    /* safety: the CAS elects one thread to run the shutdown; a second caller (Ctrl-C pressed
     * twice: "stop now") only pulls the deadline in and waits for the first to finish. */
    if (!atomic_compare_exchange_strong_explicit(&s->stopping, &expected, 1, memory_order_acq_rel,
                                                 memory_order_acquire)) {
        uint64_t cur = atomic_load_explicit(&s->stop_deadline, memory_order_relaxed);
        /* safety: min-update of the deadline; the CAS loop only ever lowers it. */
        while (deadline < cur &&
               !atomic_compare_exchange_weak_explicit(&s->stop_deadline, &cur, deadline,
                                                      memory_order_relaxed, memory_order_relaxed))
            ;
        while (server_running(s)) {
            struct timespec ts = {0, 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        return 0;
    }
    if (!s->sched)
        return 0;
    /* safety: read by a concurrent second caller and by the wait loop below only. */
    atomic_store_explicit(&s->stop_deadline, deadline, memory_order_relaxed);
    /* safety: see server_draining. */
    atomic_store_explicit(&s->draining, 1, memory_order_relaxed);
    for (unsigned i = 0; i < s->nworkers; i++) {
        uint64_t one = 1;
        ssize_t n = write(s->workers[i].ctl_fd, &one, sizeof(one));
        (void)n; /* an eventfd write of 1 only fails on counter overflow, impossible here */
    }
    /* safety: acquire pairs with listen_shut's release: once a listener is seen drained, the
     * connections its acceptor opened are in the live count. */
    while ((atomic_load_explicit(&s->undrained, memory_order_acquire) > 0 ||
            server_live_connections(s) > 0) &&
           clock_mono_ns() < atomic_load_explicit(&s->stop_deadline, memory_order_relaxed)) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* Answers still being made off the workers are not waited for any longer; a wait on them is
     * invisible to the scheduler's drain, so it is ended here, before the stop. */
    handoff_cancel_all(s);
    sched_stop(s->sched);
    sched_join(s->sched);
    teardown(s);
    /* safety: the workers are joined; release pairs with server_running's acquire. */
    atomic_store_explicit(&s->running, 0, memory_order_release);
    /* After the store: a waiter that sees the descriptor readable sees the server stopped. */
    uint64_t one = 1;
    ssize_t n = write(s->stopped_fd, &one, sizeof(one));
    (void)n; /* an eventfd write of 1 only fails on counter overflow, impossible here */
    return 0;
}

int server_stopped_fd(const struct server *s)
{
    return s->stopped_fd;
}

void server_free(struct server *s)
{
    if (!s)
        return;
    server_shutdown(s, 0);
    parent_watch_stop(s);
    /* safety: the workers are joined, this thread is the only one left touching s. */
    unsigned n = atomic_load_explicit(&s->ext_count, memory_order_relaxed);
    for (unsigned i = 0; i < n; i++)
        if (s->ext[i].fd >= 0)
            close(s->ext[i].fd);
    pthread_mutex_destroy(&s->ext_lock);
    pthread_mutex_destroy(&s->stats_lock);
    pthread_mutex_destroy(&s->orphan_lock);
    pthread_mutex_destroy(&s->handoff_lock);
    close(s->stopped_fd);
    free(s->orphans); /* what was not taken is leaked: its owner (Python) is not here */
    server_free_listens(s);
    proxy_trust_free(&s->trust);
    proxy_trust_free(&s->pp_trust);
    free(s->host);
    free(s);
}

void server_get_stats(struct server *s, struct server_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->live = server_live_connections(s);
    pthread_mutex_lock(&s->stats_lock);
    out->inline_ok = s->ended_inline;
    out->requests = s->ended_inline + s->ended_answered;
    out->spawned = s->ended_spawned;
    for (unsigned i = 0; s->workers && i < s->nthreads; i++) {
        uint64_t inl = atomic_load_explicit(&s->workers[i].inline_ok, memory_order_relaxed);
        out->inline_ok += inl;
        out->requests += inl + atomic_load_explicit(&s->workers[i].answered, memory_order_relaxed);
    }
    if (s->sched) {
        struct sched_stats st;
        sched_get_stats(s->sched, &st);
        out->spawned += st.spawned;
    }
    pthread_mutex_unlock(&s->stats_lock);
}
