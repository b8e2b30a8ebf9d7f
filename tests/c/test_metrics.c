/* test_metrics.c: the metrics' shared region (csrc/metrics.c): shards written by their threads
 * while a scraper sums them (also under ThreadSanitizer), a region shared with a forked
 * process, the totals kept when a process is retired, the text exposition, and the scrape
 * listener answering GET /metrics and 404 over a real socket. */
#define _GNU_SOURCE
#include "csrc/metrics.c"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/wait.h>

#include "tap.h"

/* The value of the sample line that begins with prefix (up to its value), or -1. */
static double sample(const char *text, const char *prefix)
{
    const char *p = text;
    size_t n = strlen(prefix);
    while ((p = strstr(p, prefix)) != NULL) {
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p += n;
    }
    return -1;
}

struct writer {
    struct metrics_shard *m;
    int rounds;
};

static void *write_main(void *arg)
{
    struct writer *w = arg;
    for (int i = 0; i < w->rounds; i++) {
        metrics_note_request(w->m, METRICS_STATIC, 200, 300000);
        metrics_add(&w->m->bytes_out, 10);
    }
    return NULL;
}

static char text[METRICS_TEXT_MAX];

static void test_threads_and_sums(void)
{
    struct metrics_region *r;
    is_int(metrics_region_new(&r, 2, 4), 0, "a region for 2 processes of 4 threads");
    is_int(metrics_claim(r, 100), 0, "the first slot");
    is_int(metrics_claim(r, 101), 1, "the second");
    is_int(metrics_claim(r, 102), -ENOSPC, "no third");
    struct writer w[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct writer){&metrics_proc_at(r, (unsigned)(i & 1))->shards[i], 20000};
        pthread_create(&t[i], NULL, write_main, &w[i]);
    }
    for (int k = 0; k < 20; k++) /* scrapes while they count */
        ok(metrics_format(r, text, sizeof(text)) > 0, "a scrape while the threads count");
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    ssize_t n = metrics_format(r, text, sizeof(text));
    ok(n > 0 && (size_t)n < sizeof(text), "the exposition fits");
    is_int(sample(text, "cyserve_requests_total{route=\"static\",status=\"2xx\"}"), 80000,
           "every thread's answers, summed over both processes");
    is_int(sample(text, "cyserve_request_duration_seconds_bucket{le=\"0.0005\"}"), 80000,
           "300 us falls in the first bucket");
    is_int(sample(text, "cyserve_request_duration_seconds_count"), 80000, "the count");
    is_int(sample(text, "cyserve_sent_bytes_total"), 800000, "bytes");
    is_int(sample(text, "cyserve_worker_processes"), 2, "two processes");
    /* Process 0 ends: its counts stay, its slot is free again. */
    metrics_add(&metrics_proc_at(r, 0)->open, 3);
    metrics_add(&metrics_proc_at(r, 0)->busy, 2);
    metrics_add(&metrics_proc_at(r, 0)->python, 1);
    metrics_add(&metrics_proc_at(r, 1)->open, 4);
    metrics_add(&metrics_proc_at(r, 1)->busy, 1);
    metrics_format(r, text, sizeof(text));
    is_int(sample(text, "cyserve_open_connections"), 7, "open connections, summed");
    is_int(sample(text, "cyserve_connections{state=\"idle\"}"), 4, "idle: open less busy");
    is_int(sample(text, "cyserve_connections{state=\"active\"}"), 2, "active: busy less python");
    is_int(sample(text, "cyserve_connections{state=\"python\"}"), 1, "in a Python call");
    /* Gauges copied at different moments may disagree for a moment: the parts never go below
     * 0 and still add up to the open connections. */
    metrics_add(&metrics_proc_at(r, 1)->python, 5);
    metrics_add(&metrics_proc_at(r, 1)->busy, 10);
    metrics_format(r, text, sizeof(text));
    is_int(sample(text, "cyserve_connections{state=\"idle\"}"), 0, "busy past open: no idle");
    is_int(sample(text, "cyserve_connections{state=\"active\"}"), 1, "python past busy");
    is_int(sample(text, "cyserve_connections{state=\"python\"}"), 6, "in Python calls");
    /* The stacks the publishers copied: a gauge and a counter, summed over the processes. */
    metrics_add(&metrics_proc_at(r, 0)->stacks, 300);
    metrics_add(&metrics_proc_at(r, 1)->stacks, 40);
    metrics_add(&metrics_proc_at(r, 0)->trims, 2);
    metrics_add(&metrics_proc_at(r, 1)->trims, 1);
    metrics_format(r, text, sizeof(text));
    ok(strstr(text, "# TYPE cyserve_coroutine_stacks gauge\n") != NULL, "stacks: a gauge");
    is_int(sample(text, "cyserve_coroutine_stacks"), 340, "stacks mapped, summed");
    is_int(sample(text, "cyserve_coroutine_stack_trims_total"), 3, "trims, summed");
    metrics_retire(r, 0);
    metrics_format(r, text, sizeof(text));
    is_int(sample(text, "cyserve_requests_total{route=\"static\",status=\"2xx\"}"), 80000,
           "a retired process's counts are kept");
    is_int(sample(text, "cyserve_open_connections"), 4, "its gauges are not");
    is_int(sample(text, "cyserve_coroutine_stacks"), 40, "nor its stacks (unmapped with it)");
    is_int(sample(text, "cyserve_coroutine_stack_trims_total"), 3, "its trims are kept");
    is_int(sample(text, "cyserve_connections{state=\"python\"}"), 4,
           "nor its Python calls (clamped to the other's open connections)");
    is_int(sample(text, "cyserve_worker_processes"), 1, "one process left");
    is_int(metrics_claim(r, 103), 0, "its slot is claimed again");
    metrics_note_reject(&metrics_proc_at(r, 0)->shards[0], 431);
    metrics_note_reject(&metrics_proc_at(r, 0)->shards[0], 418);
    metrics_note_reject(&metrics_proc_at(r, 0)->shards[0], 503);
    metrics_note_limit(&metrics_proc_at(r, 0)->shards[1]);
    metrics_note_limit(&metrics_proc_at(r, 0)->shards[2]);
    metrics_note_limit(NULL); /* a thread without a shard counts nothing */
    metrics_format(r, text, sizeof(text));
    is_int(sample(text, "cyserve_rejections_total{status=\"431\",reason=\"head_too_large\"}"), 1,
           "a 431");
    is_int(sample(text, "cyserve_rejections_total{status=\"other\",reason=\"other\"}"), 1,
           "another status");
    is_int(sample(text, "cyserve_rejections_total{status=\"503\",reason=\"body_capacity\"}"), 1,
           "the body budget's 503");
    is_int(sample(text, "cyserve_rejections_total{status=\"503\",reason=\"limit_concurrency\"}"), 2,
           "--limit-concurrency's 503s, told apart");
    is_int(sample(text, "cyserve_requests_total{route=\"none\",status=\"4xx\"}"), 2,
           "refusals are answers of no route");
    is_int(sample(text, "cyserve_requests_total{route=\"none\",status=\"5xx\"}"), 1,
           "a limit's refusal is not counted as an answer twice (the engine counts its answer)");
    is_int(metrics_format(r, text, 100), -ENOSPC, "a buffer too small is said");
    metrics_region_free(r);
}

static void test_shared_with_a_fork(void)
{
    struct metrics_region *r;
    metrics_region_new(&r, 1, 1);
    int slot = metrics_claim(r, 1);
    pid_t pid = fork();
    if (pid == 0) {
        metrics_note_request(&metrics_proc_at(r, (unsigned)slot)->shards[0], METRICS_ASGI, 503,
                             20000000000ull);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    metrics_format(r, text, sizeof(text));
    is_int(sample(text, "cyserve_requests_total{route=\"asgi\",status=\"5xx\"}"), 1,
           "a forked process's count is seen by its parent");
    is_int(sample(text, "cyserve_request_duration_seconds_bucket{le=\"10\"}"), 0,
           "20 s is over the last bound");
    is_int(sample(text, "cyserve_request_duration_seconds_bucket{le=\"+Inf\"}"), 1, "+Inf");
    metrics_region_free(r);
}

/* One request to port: the answer's first line's status and whether the body has needle. */
static int scrape(int port, const char *req, const char *needle, int *found)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c, (struct sockaddr *)&a, sizeof(a)) != 0)
        return -1;
    ssize_t w = write(c, req, strlen(req));
    (void)w;
    size_t len = 0;
    ssize_t n;
    while ((n = read(c, text + len, sizeof(text) - 1 - len)) > 0)
        len += (size_t)n;
    close(c);
    text[len] = 0;
    *found = strstr(text, needle) != NULL;
    return len > 12 ? atoi(text + 9) : -1;
}

static void test_listener(void)
{
    struct metrics_region *r;
    metrics_region_new(&r, 1, 1);
    metrics_claim(r, 1);
    metrics_add(&metrics_proc_at(r, 0)->shards[0].accepted, 7);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof(a);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    listen(fd, 8);
    getsockname(fd, (struct sockaddr *)&a, &alen);
    int port = ntohs(a.sin_port);
    struct metrics_listener *l;
    is_int(metrics_listen_start(&l, r, fd), 0, "the listener starts");
    int found;
    is_int(scrape(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "cyserve_connections_total 7",
                  &found),
           200, "GET /metrics");
    ok(found, "... with the counts");
    is_int(scrape(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n", "# TYPE", &found), 200,
           "a query is allowed");
    is_int(scrape(port, "HEAD /metrics HTTP/1.1\r\n\r\n", "# TYPE", &found), 200, "HEAD");
    ok(!found, "... without a body");
    is_int(scrape(port, "GET /metricsx HTTP/1.1\r\n\r\n", "/metrics", &found), 404,
           "any other path: 404");
    is_int(scrape(port, "POST /metrics HTTP/1.1\r\n\r\n", "/metrics", &found), 404, "POST: 404");
    metrics_listen_stop(l);
    close(fd);
    metrics_region_free(r);
}

/* The route of the longest running call: published and read whole while being rewritten. */
struct route_writer {
    struct metrics_proc *p;
    int rounds;
};

static void *route_main(void *arg)
{
    struct route_writer *w = arg;
    for (int i = 0; i < w->rounds; i++)
        metrics_set_route(w->p, i % 2 ? "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" : "/b");
    return NULL;
}

static void test_route(void)
{
    struct metrics_region *r;
    is_int(metrics_region_new(&r, 1, 1), 0, "region for the route");
    int slot = metrics_claim(r, getpid());
    is_int(slot, 0, "a slot");
    struct metrics_proc *p = metrics_proc_at(r, (unsigned)slot);
    char out[128];
    is_int((int)metrics_get_route(p, out, sizeof(out)), 0, "no route at first");
    is_mem(out, strlen(out), "", "an empty name");
    metrics_set_route(p, "/users/{id:int}");
    is_int((int)metrics_get_route(p, out, sizeof(out)), 15, "the route's length");
    is_mem(out, strlen(out), "/users/{id:int}", "the route's pattern");
    is_int((int)metrics_get_route(p, out, 5), 4, "cut to the caller's room");
    is_mem(out, strlen(out), "/use", "the start of it");
    char longer[200];
    memset(longer, 'x', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = 0;
    metrics_set_route(p, longer);
    is_int((int)metrics_get_route(p, out, sizeof(out)), METRICS_ROUTE_MAX - 1,
           "a long pattern is cut to what the slot keeps");
    metrics_set_route(p, NULL);
    is_int((int)metrics_get_route(p, out, sizeof(out)), 0, "NULL: none running");
    /* A reader while the publisher rewrites: one of the two names or nothing, never a mix. */
    struct route_writer w = {p, 20000};
    pthread_t th;
    pthread_create(&th, NULL, route_main, &w);
    int torn = 0;
    for (int i = 0; i < 20000; i++) {
        size_t n = metrics_get_route(p, out, sizeof(out));
        if (n && strcmp(out, "/b") != 0 && strcmp(out, "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"))
            torn++;
    }
    pthread_join(th, NULL);
    is_int(torn, 0, "no torn name read while it was rewritten");
    metrics_retire(r, 0);
    is_int((int)metrics_get_route(p, out, sizeof(out)), 0, "a retired slot names no route");
    metrics_region_free(r);
}

/* The inline path's static answers (quick[]): one add each, told as answers of the static
 * route in the first duration bucket, with nothing added to the durations' sum, and kept when
 * their process is retired. */
static void test_quick_answers(void)
{
    struct metrics_region *r;
    is_int(metrics_region_new(&r, 2, 2), 0, "a region");
    is_int(metrics_claim(r, 100), 0, "a slot");
    struct metrics_shard *a = &metrics_proc_at(r, 0)->shards[0];
    struct metrics_shard *b = &metrics_proc_at(r, 0)->shards[1];
    for (int i = 0; i < 5; i++)
        metrics_add(&a->quick[200 / 100 - 1], 1);
    metrics_add(&b->quick[404 / 100 - 1], 2);
    metrics_note_request(b, METRICS_STATIC, 200, 2000000); /* one on the coroutine, 2 ms */
    metrics_format(r, text, sizeof(text));
    is_int(sample(text, "cyserve_requests_total{route=\"static\",status=\"2xx\"}"), 6,
           "quick 2xx answers join the counted ones");
    is_int(sample(text, "cyserve_requests_total{route=\"static\",status=\"4xx\"}"), 2,
           "by status class");
    is_int(sample(text, "cyserve_request_duration_seconds_bucket{le=\"0.0005\"}"), 7,
           "quick answers are in the first bucket");
    is_int(sample(text, "cyserve_request_duration_seconds_bucket{le=\"0.0025\"}"), 8,
           "the counted one where its time puts it");
    is_int(sample(text, "cyserve_request_duration_seconds_count"), 8, "every answer");
    ok(sample(text, "cyserve_request_duration_seconds_sum") == 0.002,
       "the sum holds the counted answer's time alone");
    metrics_retire(r, 0);
    metrics_format(r, text, sizeof(text));
    is_int(sample(text, "cyserve_requests_total{route=\"static\",status=\"2xx\"}"), 6,
           "kept when the process is retired");
    is_int(sample(text, "cyserve_request_duration_seconds_count"), 8, "and in the histogram");
    metrics_region_free(r);
}

#define WS_CLOSES "cyserve_websocket_closes_total"

/* WebSocket ends (metrics_note_ws_close): each code in its class, by who began the close, with
 * one series per class and side (but for "abnormal", which only the client side has), summed
 * over the shards and kept when their process is retired. */
static void test_websocket_closes(void)
{
    struct metrics_region *r;
    is_int(metrics_region_new(&r, 1, 2), 0, "a region");
    is_int(metrics_claim(r, 100), 0, "a slot");
    struct metrics_shard *a = &metrics_proc_at(r, 0)->shards[0];
    struct metrics_shard *b = &metrics_proc_at(r, 0)->shards[1];
    static const struct {
        int code;
        const char *reason;
    } classes[] = {{1000, "normal"},         {1001, "normal"},          {1005, "normal"},
                   {1002, "protocol_error"}, {1007, "invalid_payload"}, {1008, "policy"},
                   {1009, "too_big"},        {1011, "internal_error"},  {1003, "other"},
                   {4001, "other"},          {1006, "abnormal"}};
    for (size_t i = 0; i < sizeof(classes) / sizeof(classes[0]); i++) {
        const char *got = ws_reason_names[metrics_ws_close_reason(classes[i].code)];
        ok(strcmp(got, classes[i].reason) == 0, "%d is %s (got %s)", classes[i].code,
           classes[i].reason, got);
    }
    metrics_format(r, text, sizeof(text));
    ok(strstr(text, "# TYPE " WS_CLOSES " counter\n") != NULL, "typed a counter");
    is_int(sample(text, WS_CLOSES "{by=\"server\",reason=\"normal\"}"), 0, "zero at first");
    is_int(sample(text, WS_CLOSES "{by=\"server\",reason=\"abnormal\"}"), -1,
           "no abnormal series on the server's side");
    metrics_note_ws_close(a, 1000, METRICS_WS_BY_CLIENT);
    metrics_note_ws_close(b, 1001, METRICS_WS_BY_CLIENT);
    metrics_note_ws_close(a, 1005, METRICS_WS_BY_CLIENT);
    metrics_note_ws_close(a, 1001, METRICS_WS_BY_SERVER);
    metrics_note_ws_close(a, 1002, METRICS_WS_BY_SERVER);
    metrics_note_ws_close(b, 1002, METRICS_WS_BY_CLIENT);
    metrics_note_ws_close(b, 1007, METRICS_WS_BY_SERVER);
    metrics_note_ws_close(b, 1009, METRICS_WS_BY_SERVER);
    metrics_note_ws_close(a, 1008, METRICS_WS_BY_SERVER);
    metrics_note_ws_close(a, 1011, METRICS_WS_BY_SERVER);
    metrics_note_ws_close(b, 4001, METRICS_WS_BY_SERVER);
    metrics_note_ws_close(b, 1006, METRICS_WS_BY_SERVER);    /* said of the client's side */
    metrics_note_ws_close(NULL, 1000, METRICS_WS_BY_CLIENT); /* no shard: not counted */
    metrics_format(r, text, sizeof(text));
    is_int(sample(text, WS_CLOSES "{by=\"client\",reason=\"normal\"}"), 3,
           "1000, 1001 and a close without a code, summed over the shards");
    is_int(sample(text, WS_CLOSES "{by=\"server\",reason=\"normal\"}"), 1, "the server's");
    is_int(sample(text, WS_CLOSES "{by=\"server\",reason=\"protocol_error\"}"), 1, "1002");
    is_int(sample(text, WS_CLOSES "{by=\"client\",reason=\"protocol_error\"}"), 1,
           "a 1002 the client sent, told apart");
    is_int(sample(text, WS_CLOSES "{by=\"server\",reason=\"invalid_payload\"}"), 1, "1007");
    is_int(sample(text, WS_CLOSES "{by=\"server\",reason=\"too_big\"}"), 1, "1009");
    is_int(sample(text, WS_CLOSES "{by=\"server\",reason=\"policy\"}"), 1, "1008");
    is_int(sample(text, WS_CLOSES "{by=\"server\",reason=\"internal_error\"}"), 1, "1011");
    is_int(sample(text, WS_CLOSES "{by=\"server\",reason=\"other\"}"), 1, "4001");
    is_int(sample(text, WS_CLOSES "{by=\"client\",reason=\"abnormal\"}"), 1, "1006");
    metrics_retire(r, 0);
    metrics_format(r, text, sizeof(text));
    is_int(sample(text, WS_CLOSES "{by=\"client\",reason=\"normal\"}"), 3,
           "kept when the process is retired");
    is_int(sample(text, WS_CLOSES "{by=\"server\",reason=\"other\"}"), 1, "every one");
    metrics_region_free(r);
}

int main(void)
{
    test_websocket_closes();
    test_route();
    test_quick_answers();
    test_threads_and_sums();
    test_shared_with_a_fork();
    test_listener();
    return done_testing();
}
