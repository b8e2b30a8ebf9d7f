/* bench_router.c: nanoseconds per router_match for each route kind, and files_parse_range.
 *
 * Build and run (from the repository root; pin it to one CPU for stable numbers):
 *   gcc -std=gnu11 -O2 -g -Isrc/cyserve -Isrc/cyserve/include bench/micro/bench_router.c \
 *       -o /tmp/bench_router && taskset -c 1 /tmp/bench_router
 *
 * The router holds an application-sized table: 40 exact paths, 6 typed patterns, 2 regexes and
 * 3 prefixes, so that hash probes, trie fan-out and the regex/prefix fall-through all cost what
 * they would in a real app. Each case matches the same path ITERS times (best of 5 rounds,
 * CLOCK_MONOTONIC); the result is stored to a volatile so the loop is not optimised away. */
#include "csrc/http_date.c"
#include "csrc/files.c"
#include "csrc/router.c"

#include <stdio.h>
#include <time.h>

#define ITERS 2000000
#define ROUNDS 5

static char targets[64];
static volatile uintptr_t sink;

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void bench(const struct router *r, const char *name, unsigned method, const char *path,
                  int expect)
{
    size_t len = strlen(path);
    struct router_match m;
    int rc = router_match(r, method, path, len, &m);
    if (rc != expect) {
        printf("%-34s unexpected result %d (want %d)\n", name, rc, expect);
        return;
    }
    double best = 1e300;
    for (int round = 0; round < ROUNDS; round++) {
        double t0 = now_ns();
        for (int i = 0; i < ITERS; i++) {
            router_match(r, method, path, len, &m);
            sink += (uintptr_t)m.target + m.num_params;
        }
        double dt = (now_ns() - t0) / ITERS;
        if (dt < best)
            best = dt;
    }
    printf("%-34s %-28s %7.1f ns\n", name, path, best);
}

int main(void)
{
    struct router *r;
    router_new(&r);
    unsigned get = ROUTER_METHOD_BIT(HTTP_GET), post = ROUTER_METHOD_BIT(HTTP_POST);
    char path[64];
    int t = 0;
    for (int i = 0; i < 40; i++) {
        int n = snprintf(path, sizeof(path), "/api/resource%d", i);
        router_add(r, ROUTER_PATH, path, (size_t)n, get, &targets[t++ % 64], NULL, 0);
    }
    static const char *const exact[] = {"/", "/plaintext", "/json", "/py", "/echo"};
    for (size_t i = 0; i < N_ELEMENTS(exact); i++)
        router_add(r, ROUTER_PATH, exact[i], strlen(exact[i]), 0, &targets[t++ % 64], NULL, 0);
    static const char *const patterns[] = {
        "/users/{id:int}",          "/users/{name}",       "/users/{id:int}/posts/{post:int}",
        "/orgs/{org}/repos/{repo}", "/static/{rest:path}", "/v1/{a}/{b}/{c}/{d}",
    };
    for (size_t i = 0; i < N_ELEMENTS(patterns); i++)
        router_add(r, ROUTER_PATH, patterns[i], strlen(patterns[i]), get, &targets[t++ % 64], NULL,
                   0);
    router_add(r, ROUTER_REGEX, "/item/([a-z]+)/([0-9]+)", 23, get, &targets[t++ % 64], NULL, 0);
    router_add(r, ROUTER_REGEX, "/blog/[0-9]{4}/.*", 17, get, &targets[t++ % 64], NULL, 0);
    router_add(r, ROUTER_PREFIX, "/files", 6, get, &targets[t++ % 64], NULL, 0);
    router_add(r, ROUTER_PREFIX, "/assets/img", 11, get, &targets[t++ % 64], NULL, 0);
    router_add(r, ROUTER_PREFIX, "/legacy", 7, 0, &targets[t++ % 64], NULL, 0);

    printf("router_match, best of %d rounds of %d calls\n", ROUNDS, ITERS);
    bench(r, "exact (hash)", get, "/plaintext", 0);
    bench(r, "exact, longer path", get, "/api/resource37", 0);
    bench(r, "HEAD on a GET exact route", ROUTER_METHOD_BIT(HTTP_HEAD), "/plaintext", 0);
    bench(r, "typed int param", get, "/users/12345", 0);
    bench(r, "typed str param (int tried first)", get, "/users/alice", 0);
    bench(r, "two int params", get, "/users/7/posts/99", 0);
    bench(r, "four str params", get, "/v1/a/b/c/d", 0);
    bench(r, "path param", get, "/static/css/site/main.css", 0);
    bench(r, "prefix (after trie, no regex hit)", get, "/files/docs/readme.txt", 0);
    bench(r, "regex, 2 groups", get, "/item/widget/42", 0);
    bench(r, "404 (every kind tried)", get, "/nothing/here", -ENOENT);
    bench(r, "405 (exact path, wrong method)", post, "/api/resource3", -ENOTSUP);
    router_free(r);

    /* The same table without regex routes: what a 404 or prefix hit costs when no regex is
     * registered (the common case). */
    router_new(&r);
    router_add(r, ROUTER_PATH, "/plaintext", 10, get, &targets[0], NULL, 0);
    router_add(r, ROUTER_PATH, "/users/{id:int}", 15, get, &targets[1], NULL, 0);
    router_add(r, ROUTER_PREFIX, "/files", 6, get, &targets[2], NULL, 0);
    bench(r, "prefix, no regex registered", get, "/files/docs/readme.txt", 0);
    bench(r, "404, no regex registered", get, "/nothing/here", -ENOENT);
    router_free(r);

    uint64_t s, e;
    double best = 1e300;
    for (int round = 0; round < ROUNDS; round++) {
        double t0 = now_ns();
        for (int i = 0; i < ITERS; i++) {
            files_parse_range("bytes=100-1999", 14, 133622, &s, &e);
            sink += s + e;
        }
        double dt = (now_ns() - t0) / ITERS;
        best = dt < best ? dt : best;
    }
    printf("%-34s %-28s %7.1f ns\n", "files_parse_range", "bytes=100-1999", best);
    return 0;
}
