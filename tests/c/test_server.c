/* test_server.c: the engine driven from C, with no Python: two workers, a static route and a
 * GIL-free handler, client threads doing keep-alive and pipelined requests at the same time, a
 * silent connection, a graceful shutdown, and a stop that finds requests waiting in the accept
 * queue behind a busy worker (answered, not reset). Built under ASan+UBSan by the Makefile; also
 * meant to run under TSan (the engine's cross-thread state: draining flag, live counter, hops). */
#define _GNU_SOURCE
#include "csrc/coro.c"
#include "csrc/sched.c"
#include "csrc/http_parse.c"
#include "csrc/wbuf.c"
#include "csrc/resp.c"
#include "csrc/http1_write.c"
#include "csrc/router.c"
#include "csrc/files.c"
#include "csrc/http_date.c"
#include "csrc/conn.c"
#include "csrc/listen.c"
#include "csrc/server.c"
#include "csrc/request.c"
#include "csrc/handler_static.c"
#include "csrc/handler_files.c"
#include "csrc/stream.c"
#include "csrc/body.c"
#include "csrc/handoff.c"
#include "csrc/access_log.c"
#include "csrc/http1.c"
#include "csrc/http1_inline.c"
#include "csrc/http2.c"
#include "csrc/proxy.c"
#include "csrc/ws.c"
#include "csrc/ws_conn.c"
#include "csrc/ws_nogil.c"
#include "csrc/ws_zlend.c"
#include "csrc/proxyproto.c"
#include "csrc/metrics.c"

#include <arpa/inet.h>
#include <pthread.h>

#include "tap.h"

#define CLIENTS 4
#define REQUESTS 200

static int hello(cyserve_request *req, cyserve_response *resp, void *ctx)
{
    cyserve_str v;
    if (server_req_header(req, "x-name", 6, &v) == 0)
        resp_write(resp, v.ptr, v.len);
    else
        resp_write(resp, "anon", 4);
    return resp_write(resp, ctx, strlen(ctx));
}

/* A GIL-free handler that holds its worker for a while, as a slow handler does. */
static _Atomic int sleepy_started;
/* When set, sleepy also waits (at most 10 s) until that server's stop has begun: the drain test
 * needs its queued requests still queued when the stop comes, and a fixed sleep lost that race
 * on a loaded machine (the Python twin of the test, tests/e2e/test_shutdown_drain.py, did). */
static struct server *_Atomic sleepy_until_drain;

static int sleepy(cyserve_request *req, cyserve_response *resp, void *ctx)
{
    atomic_store(&sleepy_started, 1);
    usleep(300 * 1000);
    struct server *s = atomic_load(&sleepy_until_drain);
    for (int i = 0; s && i < 10000 && !server_draining(s); i++)
        usleep(1000);
    return resp_write(resp, "slept", 5);
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* Read until `count` responses whose bodies end with `suffix` have arrived; returns how many. */
static int read_responses(int fd, int count, const char *suffix)
{
    char buf[65536];
    size_t len = 0;
    int got = 0;
    size_t sl = strlen(suffix);
    while (got < count) {
        ssize_t n = read(fd, buf + len, sizeof(buf) - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        /* count complete bodies: each response ends with the suffix */
        char *p = buf;
        char *end = buf + len;
        char *hit;
        while ((hit = memmem(p, (size_t)(end - p), suffix, sl)) != NULL) {
            got++;
            p = hit + sl;
        }
        memmove(buf, p, (size_t)(end - p));
        len = (size_t)(end - p);
    }
    return got;
}

/* Read until the end of the stream into buf (NUL-terminated): its length, or -errno (a reset:
 * -ECONNRESET). */
static ssize_t read_to_end(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0) {
            buf[len] = 0;
            return -errno;
        }
        len += (size_t)n;
        buf[len] = 0;
        if (n == 0 || len == cap - 1)
            return (ssize_t)len;
    }
}

/* The two accept-queue tests share their set-up: one worker serving /static and /sleepy, busy in
 * the slow handler while QUEUED connections, each with one request sent, wait behind it in the
 * kernel's accept queue. keepalive_ns 0 keeps the default. */
#define QUEUED 5

struct queue_fixture {
    struct router *r;
    struct server_target zt; /* the router points at it: it lives as long as the fixture */
    struct server *s;
    int busy;
    int q[QUEUED];
};

static void queue_fixture_start(struct queue_fixture *f, struct server_target *st,
                                uint64_t keepalive_ns)
{
    memset(f, 0, sizeof(*f));
    is_int(router_new(&f->r), 0, "router for the queue test");
    f->zt.kind = SERVER_NOGIL;
    f->zt.fn = sleepy;
    router_add(f->r, ROUTER_PATH, "/static", 7, 0, st, NULL, 0);
    router_add(f->r, ROUTER_PATH, "/sleepy", 7, 0, &f->zt, NULL, 0);
    struct server_config cfg;
    server_config_default(&cfg);
    cfg.port = 0;
    cfg.threads = 1;
    if (keepalive_ns)
        cfg.keepalive_ns = keepalive_ns;
    is_int(server_new(&f->s, &cfg, f->r), 0, "server_new (one worker)");
    char err[128];
    is_int(server_start(f->s, err, sizeof(err)), 0, "server_start (one worker)");
}

/* Sends the slow request, waits until its handler runs, then queues the QUEUED requests; `conn_hdr`
 * goes into every request ("" or "Connection: close\r\n"). */
static void queue_fixture_fill(struct queue_fixture *f, const char *conn_hdr)
{
    int port = server_port(f->s);
    char req[128];
    atomic_store(&sleepy_started, 0);
    f->busy = connect_to(port);
    int len = snprintf(req, sizeof(req), "GET /sleepy HTTP/1.1\r\nHost: t\r\n%s\r\n", conn_hdr);
    ok(write(f->busy, req, (size_t)len) > 0, "sent the slow request");
    while (!atomic_load(&sleepy_started))
        usleep(1000);
    len = snprintf(req, sizeof(req), "GET /static HTTP/1.1\r\nHost: t\r\n%s\r\n", conn_hdr);
    for (int i = 0; i < QUEUED; i++) {
        f->q[i] = connect_to(port);
        if (write(f->q[i], req, (size_t)len) < 0)
            ok(0, "queued request %d sent", i);
    }
}

/* A stop answers what waits in the accept queue. One worker, busy in a slow handler; QUEUED
 * requests wait behind it in the kernel's accept queue when the shutdown begins. Shutting the
 * listener down without taking them reset every one. */
static void test_stop_drains_the_accept_queue(struct server_target *st)
{
    struct queue_fixture f;
    /* a long keep-alive: only the stop may close the silent connection */
    queue_fixture_start(&f, st, 30ull * 1000 * 1000 * 1000);
    atomic_store(&sleepy_until_drain, f.s);
    queue_fixture_fill(&f, "");
    struct server *s = f.s;
    int silent = connect_to(server_port(s)); /* queued too, but sends nothing */
    uint64_t t0 = clock_mono_ns();
    is_int(server_shutdown(s, 20ull * 1000 * 1000 * 1000), 0, "shutdown with a queue");
    uint64_t took = clock_mono_ns() - t0;
    ok(took < 5ull * 1000 * 1000 * 1000, "the stop waited for no timeout: %.2f s",
       (double)took / 1e9);
    char buf[4096];
    int answered = 0;
    for (int i = 0; i < QUEUED; i++) {
        ssize_t n = read_to_end(f.q[i], buf, sizeof(buf));
        if (n > 0 && strstr(buf, "HTTP/1.1 200 ") == buf && strstr(buf, "Connection: close") &&
            strstr(buf, "static!"))
            answered++;
        else
            note("queued connection %d: %zd %s", i, n, n < 0 ? strerror((int)-n) : buf);
        close(f.q[i]);
    }
    is_int(answered, QUEUED, "every queued request answered with Connection: close, no reset");
    ssize_t n = read_to_end(f.busy, buf, sizeof(buf));
    ok(n > 0 && strstr(buf, "slept"), "the slow request was answered");
    close(f.busy);
    ok(read_to_end(silent, buf, sizeof(buf)) <= 0, "the silent connection was closed");
    close(silent);
    is_int(server_live_connections(s), 0, "no live connection left");
    atomic_store(&sleepy_until_drain, NULL);
    server_free(s);
    router_free(f.r);
}

/* Connections queued together are all served, with no new one arriving to report the listener
 * again. One worker, busy in a slow handler while QUEUED connections complete their TCP
 * handshakes and send a request: when it is free, a single poll finds them all in the accept
 * queue. The acceptor no longer reads the queue until EAGAIN (listen.c, "Accepting"): it asks
 * poll() whether more wait, and the level-triggered listener is reported again by the next poll
 * otherwise. An acceptor that took one connection and stopped, on an edge-triggered listener,
 * failed here: all but the first waited forever. Each accepted connection has TCP_NODELAY, set
 * once on the listener. */
static void test_queued_connections_are_all_served(struct server_target *st)
{
    struct queue_fixture f;
    queue_fixture_start(&f, st, 0);
    struct server *s = f.s;
    int nodelay = 0;
    socklen_t len = sizeof(nodelay);
    is_int(getsockopt(s->workers[0].ls[0].fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0,
           "the listener's TCP_NODELAY read");
    ok(nodelay == 1 && !s->workers[0].ls[0].nodelay_each, "TCP_NODELAY set on the listener");
    queue_fixture_fill(&f, "Connection: close\r\n");
    char buf[4096];
    ssize_t n = read_to_end(f.busy, buf, sizeof(buf));
    ok(n > 0 && strstr(buf, "slept"), "the slow request was answered");
    close(f.busy);
    int answered = 0;
    for (int i = 0; i < QUEUED; i++) {
        n = read_to_end(f.q[i], buf, sizeof(buf)); /* a connection never accepted times out */
        if (n > 0 && strstr(buf, "HTTP/1.1 200 ") == buf && strstr(buf, "static!"))
            answered++;
        else
            note("queued connection %d: %zd %s", i, n, n < 0 ? strerror((int)-n) : buf);
        close(f.q[i]);
    }
    is_int(answered, QUEUED, "every queued connection accepted and answered");
    is_int(server_shutdown(s, 20ull * 1000 * 1000 * 1000), 0, "shutdown (queue test)");
    server_free(s);
    router_free(f.r);
}

struct client {
    int port;
    int ok;
};

static void *client_main(void *arg)
{
    struct client *cl = arg;
    int fd = connect_to(cl->port);
    if (fd < 0)
        return NULL;
    static const char one[] = "GET /hello HTTP/1.1\r\nHost: t\r\nX-Name: c\r\n\r\n";
    int ok = 0;
    for (int i = 0; i < REQUESTS / 2; i++) { /* one at a time */
        if (write(fd, one, sizeof(one) - 1) < 0)
            break;
        ok += read_responses(fd, 1, "c!!");
    }
    char pipe[10 * 64];
    size_t pl = 0;
    for (int i = 0; i < 10; i++) {
        memcpy(pipe + pl, one, sizeof(one) - 1);
        pl += sizeof(one) - 1;
    }
    for (int i = 0; i < REQUESTS / 20; i++) { /* ten pipelined at a time */
        if (write(fd, pipe, pl) < 0)
            break;
        ok += read_responses(fd, 10, "c!!");
    }
    /* Static answers on the same connection: lone requests take the inline path. */
    static const char st[] = "GET /static HTTP/1.1\r\nHost: t\r\n\r\n";
    for (int i = 0; i < REQUESTS / 2; i++) {
        if (write(fd, st, sizeof(st) - 1) < 0)
            break;
        ok += read_responses(fd, 1, "static!");
    }
    close(fd);
    cl->ok = ok;
    return NULL;
}

/* ---- deferred answers (handoff.c): made by a thread of their own, as an event loop does ---- */

/* The producer: a thread that answers the handoffs py_call queued (all but those whose target
 * says "never"), each with "deferred:" and the request's X-Name. */
static pthread_mutex_t df_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t df_cond = PTHREAD_COND_INITIALIZER;
static struct handoff *df_queue[256];
static char df_names[256][16];
static int df_head, df_tail, df_quit, df_held;

static void df_call(void *opaque, cyserve_request *req, struct cyserve_response *resp)
{
    struct handoff *h;
    if (handoff_new(&h) != 0) {
        resp_set_status(resp, 500);
        return;
    }
    cyserve_str v = {"anon", 4};
    server_req_header(req, "x-name", 6, &v);
    resp_set_defer(resp, h);
    if (opaque) { /* "never": the producer keeps it and never gives */
        pthread_mutex_lock(&df_lock);
        df_held++;
        pthread_mutex_unlock(&df_lock);
        handoff_release(h); /* the producer's reference: the engine's stays */
        return;
    }
    pthread_mutex_lock(&df_lock);
    int slot = df_tail++ % 256;
    df_queue[slot] = h;
    snprintf(df_names[slot], sizeof(df_names[slot]), "%.*s", (int)v.len, v.ptr);
    pthread_cond_signal(&df_cond);
    pthread_mutex_unlock(&df_lock);
}

static void *df_producer(void *arg)
{
    pthread_mutex_lock(&df_lock);
    for (;;) {
        while (df_head == df_tail && !df_quit)
            pthread_cond_wait(&df_cond, &df_lock);
        if (df_head == df_tail)
            break;
        int slot = df_head++ % 256;
        struct handoff *h = df_queue[slot];
        char name[16];
        memcpy(name, df_names[slot], sizeof(name));
        pthread_mutex_unlock(&df_lock);
        resp_set_status(&h->resp, 200);
        resp_write(&h->resp, "deferred:", 9);
        resp_write(&h->resp, name, strlen(name));
        handoff_give(h, 0);
        handoff_release(h);
        pthread_mutex_lock(&df_lock);
    }
    pthread_mutex_unlock(&df_lock);
    return NULL;
}

static void *df_client(void *arg)
{
    struct client *cl = arg;
    int fd = connect_to(cl->port);
    if (fd < 0)
        return NULL;
    static const char one[] = "GET /deferred HTTP/1.1\r\nHost: t\r\nX-Name: d\r\n\r\n";
    for (int i = 0; i < REQUESTS / 4; i++) {
        if (write(fd, one, sizeof(one) - 1) < 0)
            break;
        cl->ok += read_responses(fd, 1, "deferred:d");
    }
    close(fd);
    return NULL;
}

/* Many clients at once get answers made by the producer thread while their coroutines park on
 * the handoffs' signals (under TSan too); a stop ends the wait of an answer that never comes
 * (its connection is closed) instead of hanging. */
static void test_deferred_answers(void)
{
    struct router *r;
    router_new(&r);
    struct server_target dt, nt;
    memset(&dt, 0, sizeof(dt));
    dt.kind = SERVER_PYTHON;
    dt.py_call = df_call;
    nt = dt;
    nt.opaque = "never";
    router_add(r, ROUTER_PATH, "/deferred", 9, 0, &dt, NULL, 0);
    router_add(r, ROUTER_PATH, "/never", 6, 0, &nt, NULL, 0);
    struct server_config cfg;
    server_config_default(&cfg);
    cfg.port = 0;
    cfg.threads = 2;
    struct server *s;
    server_new(&s, &cfg, r);
    char err[128];
    is_int(server_start(s, err, sizeof(err)), 0, "deferred: server_start");
    pthread_t prod;
    pthread_create(&prod, NULL, df_producer, NULL);
    pthread_t th[CLIENTS];
    struct client cl[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        cl[i].port = server_port(s);
        cl[i].ok = 0;
        pthread_create(&th[i], NULL, df_client, &cl[i]);
    }
    int all = 0;
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(th[i], NULL);
        all += cl[i].ok;
    }
    is_int(all, CLIENTS * (REQUESTS / 4), "every deferred answer arrived");
    int fd = connect_to(server_port(s));
    static const char nreq[] = "GET /never HTTP/1.1\r\nHost: t\r\n\r\n";
    ok(write(fd, nreq, sizeof(nreq) - 1) > 0, "sent a request whose answer never comes");
    for (int i = 0; i < 2000; i++) {
        pthread_mutex_lock(&df_lock);
        int held = df_held;
        pthread_mutex_unlock(&df_lock);
        if (held)
            break;
        usleep(1000);
    }
    is_int(server_shutdown(s, 200ull * 1000 * 1000), 0, "the stop returns after its grace");
    char tail[16];
    is_int(read(fd, tail, sizeof(tail)), 0, "the connection of the given-up answer is closed");
    close(fd);
    pthread_mutex_lock(&df_lock);
    df_quit = 1;
    pthread_cond_signal(&df_cond);
    pthread_mutex_unlock(&df_lock);
    pthread_join(prod, NULL);
    server_free(s);
    router_free(r);
}

/* ---- a streamed answer of a status without content ---- */

/* The handler streams its answer (as an ASGI or WSGI app's is streamed): the status its
 * target's opaque names, a first piece, then a last one with a trailer field. */
static _Atomic int sb_next, sb_abandoned;

static void sb_call(void *opaque, cyserve_request *req, struct cyserve_response *resp)
{
    int status = (int)(intptr_t)opaque;
    resp_set_status(resp, status);
    resp_write(resp, status == 200 ? "first-" : "dropped-", status == 200 ? 6 : 8);
    resp_set_stream(resp, opaque, -1);
}

static int sb_stream(void *opaque, void *stream, struct cyserve_response *resp, int op)
{
    if (op == SERVER_STREAM_ABANDON) {
        atomic_fetch_add(&sb_abandoned, 1);
        return 0;
    }
    atomic_fetch_add(&sb_next, 1);
    resp_write(resp, "last", 4);
    resp_add_trailer(resp, "x-sum", 5, "1", 1);
    return 0;
}

/* A 204 or 304 ends with its head (RFC 9110 6.4.1), streamed or not: no chunk framing and no
 * trailer section may follow it, or the client of a keep-alive connection reads them as the
 * start of the next response. The producer runs to its end (its pieces are taken and dropped,
 * not abandoned as if the client had gone), and the connection serves the next request. */
static void test_stream_without_content(void)
{
    struct router *r;
    router_new(&r);
    struct server_target t204, t304, t200;
    memset(&t204, 0, sizeof(t204));
    t204.kind = SERVER_PYTHON;
    t204.py_call = sb_call;
    t204.py_stream = sb_stream;
    t304 = t200 = t204;
    t204.opaque = (void *)(intptr_t)204;
    t304.opaque = (void *)(intptr_t)304;
    t200.opaque = (void *)(intptr_t)200;
    router_add(r, ROUTER_PATH, "/204", 4, 0, &t204, NULL, 0);
    router_add(r, ROUTER_PATH, "/304", 4, 0, &t304, NULL, 0);
    router_add(r, ROUTER_PATH, "/200", 4, 0, &t200, NULL, 0);
    struct server_config cfg;
    server_config_default(&cfg);
    cfg.port = 0;
    cfg.threads = 1;
    struct server *s;
    server_new(&s, &cfg, r);
    char err[128];
    is_int(server_start(s, err, sizeof(err)), 0, "bodyless stream: server_start");
    int fd = connect_to(server_port(s));
    static const char reqs[] = "GET /204 HTTP/1.1\r\nHost: t\r\nTE: trailers\r\n\r\n"
                               "GET /304 HTTP/1.1\r\nHost: t\r\nTE: trailers\r\n\r\n"
                               "GET /200 HTTP/1.1\r\nHost: t\r\nTE: trailers\r\n\r\n";
    ok(write(fd, reqs, sizeof(reqs) - 1) == (ssize_t)sizeof(reqs) - 1, "sent 204, 304, 200");
    /* Everything up to the 200's trailer section, which ends the last answer. */
    static const char end200[] = "0\r\nx-sum: 1\r\n\r\n";
    char buf[4096];
    size_t len = 0;
    while (len < sizeof(buf) - 1 && !memmem(buf, len, end200, sizeof(end200) - 1)) {
        ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = 0;
    const char *second = strstr(buf, "\r\n\r\n");
    const char *third = second ? strstr(second + 4, "\r\n\r\n") : NULL;
    ok(!strncmp(buf, "HTTP/1.1 204 ", 13), "the 204 first");
    ok(second && !strncmp(second + 4, "HTTP/1.1 304 ", 13), "the 304 right after the 204's head");
    ok(third && !strncmp(third + 4, "HTTP/1.1 200 ", 13), "the 200 right after the 304's head");
    ok(!strstr(buf, "dropped"), "no piece of the 204's or 304's body went out");
    ok(third && strstr(third, "\r\n\r\n6\r\nfirst-\r\n4\r\nlast\r\n0\r\nx-sum: 1\r\n\r\n"),
       "the 200 is chunked, with its trailer");
    is_int(atomic_load(&sb_next), 3, "each producer was asked for its last piece");
    is_int(atomic_load(&sb_abandoned), 0, "none was abandoned as if its client had gone");
    close(fd);
    is_int(server_shutdown(s, 200ull * 1000 * 1000), 0, "bodyless stream: shutdown");
    server_free(s);
    router_free(r);
}

/* HTTP/2: the streams of one connection run at once. Each call of this GIL-free handler waits
 * (up to 3 s) until another call is inside it too: two streams sent together on one connection
 * are answered "together" only if their calls ran at the same time, on the two workers. */
static _Atomic int rendezvous_inside;

static int rendezvous(cyserve_request *req, cyserve_response *resp, void *ctx)
{
    atomic_fetch_add(&rendezvous_inside, 1);
    for (int i = 0; i < 3000 && atomic_load(&rendezvous_inside) < 2; i++)
        usleep(1000);
    if (atomic_load(&rendezvous_inside) >= 2)
        return resp_write(resp, "together", 8);
    return resp_write(resp, "alone", 5);
}

/* Read HTTP/2 frames from fd until streams 1 and 3 have ended; the DATA of each, "together" or
 * "alone", is counted in *together. Returns how many of the two ended. */
static int h2_read_two(int fd, int *together)
{
    static char buf[1 << 16];
    size_t len = 0;
    int ended = 0;
    *together = 0;
    while (ended < 2) {
        ssize_t n = read(fd, buf + len, sizeof(buf) - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        size_t i = 0;
        while (len - i >= 9) {
            const unsigned char *f = (const unsigned char *)buf + i;
            size_t flen = ((size_t)f[0] << 16) | ((size_t)f[1] << 8) | f[2];
            if (len - i < 9 + flen)
                break;
            uint32_t id = ((uint32_t)(f[5] & 0x7f) << 24) | ((uint32_t)f[6] << 16) |
                          ((uint32_t)f[7] << 8) | f[8];
            if (f[3] == 0 && flen == 8 && memcmp(f + 9, "together", 8) == 0)
                (*together)++;
            if ((f[3] == 0 || f[3] == 1) && (f[4] & 1) && (id == 1 || id == 3))
                ended++;
            i += 9 + flen;
        }
        memmove(buf, buf + i, len - i);
        len -= i;
    }
    return ended;
}

static void test_http2_streams_at_once(void)
{
    struct router *r;
    is_int(router_new(&r), 0, "router for HTTP/2");
    struct server_target rt;
    memset(&rt, 0, sizeof(rt));
    rt.kind = SERVER_NOGIL;
    rt.fn = rendezvous;
    router_add(r, ROUTER_PATH, "/", 1, 0, &rt, NULL, 0);
    struct server_config cfg;
    server_config_default(&cfg);
    cfg.port = 0;
    cfg.threads = 2;
    struct server *s;
    is_int(server_new(&s, &cfg, r), 0, "server_new (HTTP/2)");
    char err[128];
    is_int(server_start(s, err, sizeof(err)), 0, "server_start (HTTP/2)");
    int fd = connect_to(server_port(s));
    /* The preface, empty SETTINGS, then HEADERS (END_STREAM | END_HEADERS) for GET / on streams
     * 1 and 3: :method GET, :path /, :scheme http from HPACK's static table, and :authority "a"
     * as a literal with the table's name. */
    static const char frames[] = HTTP2_PREFACE "\0\0\0\4\0\0\0\0\0"
                                               "\0\0\6\1\5\0\0\0\1\x82\x84\x86\1\1a"
                                               "\0\0\6\1\5\0\0\0\3\x82\x84\x86\1\1a";
    ok(write(fd, frames, sizeof(frames) - 1) == (ssize_t)sizeof(frames) - 1, "sent two streams");
    int together = 0;
    is_int(h2_read_two(fd, &together), 2, "both streams answered");
    is_int(together, 2, "their GIL-free calls ran at the same time, on two workers");
    close(fd);
    is_int(server_shutdown(s, 5ull * 1000 * 1000 * 1000), 0, "shutdown (HTTP/2)");
    server_free(s);
    router_free(r);
}

int main(void)
{
    struct router *r;
    is_int(router_new(&r), 0, "router");
    struct server_target st, nt;
    static const char ct[] = "Content-Type: text/plain\r\n";
    is_int(server_target_static(&st, NULL, 200, ct, sizeof(ct) - 1, "static!", 7), 0,
           "static target");
    memset(&nt, 0, sizeof(nt));
    nt.kind = SERVER_NOGIL;
    nt.fn = hello;
    nt.ctx = "!!";
    is_int(router_add(r, ROUTER_PATH, "/static", 7, 0, &st, NULL, 0), 0, "add /static");
    is_int(router_add(r, ROUTER_PATH, "/hello", 6, 0, &nt, NULL, 0), 0, "add /hello");

    struct server_config cfg;
    server_config_default(&cfg);
    cfg.port = 0;
    cfg.threads = 2;
    /* Short, for the silent connection below; not shorter: a client thread left off a CPU
     * between an answer and its next request (four clients and two workers on two cores) for
     * longer than this found its connection closed, and its count short. */
    cfg.keepalive_ns = 1000ull * 1000 * 1000;
    struct server *s;
    is_int(server_new(&s, &cfg, r), 0, "server_new");
    char err[128];
    is_int(server_start(s, err, sizeof(err)), 0, "server_start");
    int port = server_port(s);
    ok(port > 0, "bound port %d", port);
    ok(server_running(s), "running");
    /* What a thread that waits for the stop polls: not readable while the server runs. */
    struct pollfd stopped = {.fd = server_stopped_fd(s), .events = POLLIN};
    is_int(poll(&stopped, 1, 0), 0, "the stopped descriptor is not readable while running");

    /* A second server on the same port must fail, not silently share it. */
    struct server *s2;
    struct server_config cfg2 = cfg;
    cfg2.port = port;
    server_new(&s2, &cfg2, r);
    is_int(server_start(s2, err, sizeof(err)), -EADDRINUSE, "port in use is reported");
    ok(strstr(err, "in use") != NULL, "message: %s", err);
    server_free(s2);

    /* static route, with Connection: close */
    int fd = connect_to(port);
    static const char sreq[] = "GET /static HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    ok(write(fd, sreq, sizeof(sreq) - 1) > 0, "sent static request");
    is_int(read_responses(fd, 1, "static!"), 1, "static response");
    char tail[16];
    is_int(read(fd, tail, sizeof(tail)), 0, "closed after Connection: close");
    close(fd);

    /* a silent connection is closed by the keep-alive timer */
    int silent = connect_to(port);
    is_int(read(silent, tail, sizeof(tail)), 0, "silent connection closed by the timer");
    close(silent);

    pthread_t th[CLIENTS];
    struct client cl[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        cl[i].port = port;
        cl[i].ok = 0;
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(th[i], NULL);
        is_int(cl[i].ok, REQUESTS + REQUESTS / 2, "client answered in full");
    }
    /* The lone requests after the GIL-free route's learning calls, and the static ones, were
     * answered inline, on both workers at once: the path runs under TSan here. */
    struct server_stats stats;
    server_get_stats(s, &stats);
    ok(stats.inline_ok >= CLIENTS * REQUESTS / 2, "inline answers: %llu",
       (unsigned long long)stats.inline_ok);

    /* an idle keep-alive connection does not delay the shutdown */
    int idle = connect_to(port);
    static const char kreq[] = "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n";
    ok(write(idle, kreq, sizeof(kreq) - 1) > 0, "sent keep-alive request");
    is_int(read_responses(idle, 1, "anon!!"), 1, "keep-alive response");
    is_int(server_shutdown(s, 60ull * 1000 * 1000 * 1000), 0, "shutdown with a 60 s grace");
    is_int(read(idle, tail, sizeof(tail)), 0, "idle connection closed by the shutdown");
    close(idle);
    ok(!server_running(s), "stopped");
    is_int(poll(&stopped, 1, 0), 1, "the stopped descriptor is readable once stopped");
    is_int(server_live_connections(s), 0, "no live connection left");
    is_int(server_shutdown(s, 0), 0, "shutdown is idempotent");
    is_int(poll(&stopped, 1, 0), 1, "and stays readable");
    server_free(s);
    test_stop_drains_the_accept_queue(&st);
    test_queued_connections_are_all_served(&st);
    test_deferred_answers();
    test_stream_without_content();
    test_http2_streams_at_once();
    server_target_clear(&st);
    router_free(r);
    return done_testing();
}
