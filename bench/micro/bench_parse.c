/* bench_parse.c: ns per request of http_parse_request on fixed heads (picohttpparser's bench.c
 * idea). Two heads: a typical browser navigation (~500 bytes, 12 fields) and what wrk sends
 * (~40 bytes, one field). Each is parsed in a tight loop; the median of 7 runs is printed.
 *
 * Build and run (from the repository root):
 *   gcc -O2 -std=gnu11 -Isrc/cyserve -o /tmp/bench_parse bench/micro/bench_parse.c && /tmp/bench_parse
 * Same flags as the extension's release build (setup.py: -O2). Pin it for steadier numbers:
 *   taskset -c 1 /tmp/bench_parse
 * On a loaded or virtual machine wall-clock numbers swing by 2x; instructions per request from
 * `valgrind --tool=callgrind` are a load-independent cross-check (numbers in the commit log). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "csrc/http_parse.c"

static const char browser[] =
    "GET /wp-content/uploads/2010/03/hello-kitty-darth-vader-pink.jpg HTTP/1.1\r\n"
    "Host: www.kittyhell.com\r\n"
    "User-Agent: Mozilla/5.0 (Macintosh; U; Intel Mac OS X 10_6_3; ja-JP-mac; rv:1.9.2.3) "
    "Gecko/20100401 Firefox/3.6.3 Pathtraq/0.9\r\n"
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
    "Accept-Language: ja,en-us;q=0.7,en;q=0.3\r\n"
    "Accept-Encoding: gzip,deflate\r\n"
    "Accept-Charset: Shift_JIS,utf-8;q=0.7,*;q=0.7\r\n"
    "Keep-Alive: 115\r\n"
    "Connection: keep-alive\r\n"
    "Cookie: wp_ozh_wsa_visits=2; wp_ozh_wsa_visit_lasttime=xxxxxxxxxx; "
    "__utma=xxxxxxxxx.xxxxxxxxxx.xxxxxxxxxx.xxxxxxxxxx.xxxxxxxxxx.x; "
    "__utmz=xxxxxxxxx.xxxxxxxxxx.x.x.utmccn=(referral)|utmcsr=reader.livedoor.com|utmcct=/reader/|utmcmd=referral\r\n"
    "Sec-Fetch-Dest: image\r\n"
    "Sec-Fetch-Mode: no-cors\r\n"
    "\r\n";

static const char wrk[] = "GET /plaintext HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n";

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double bench(const char *name, const char *buf, size_t len, long iters)
{
    struct http_limits lim;
    struct http_header hdrs[100];
    struct http_request req;
    double runs[7];
    http_limits_default(&lim);
    for (int r = 0; r < 7; r++) {
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) {
            req.headers = hdrs;
            req.num_headers = 100;
            int rc = http_parse_request(buf, len, &req, &lim);
            if (rc != (int)len) {
                fprintf(stderr, "%s: parse failed (%d)\n", name, rc);
                exit(1);
            }
            /* Keep the compiler from hoisting the parse out of the loop. */
            __asm__ volatile("" : : "r"(&req) : "memory");
        }
        runs[r] = (now_ns() - t0) / (double)iters;
    }
    qsort(runs, 7, sizeof(runs[0]), cmp_double);
    printf("%-8s %4zu bytes %2zu fields: %7.1f ns/request (median of 7, min %.1f), %.2f GB/s\n",
           name, len, req.num_headers, runs[3], runs[0], (double)len / runs[3]);
    return runs[3];
}

int main(int argc, char **argv)
{
    long iters = argc > 1 ? atol(argv[1]) : 2000000;
    printf("scan loops: %s (build with -DHTTP_PARSE_NO_SIMD for the scalar ones)\n",
           HTTP_PARSE_SIMD);
    bench("browser", browser, sizeof(browser) - 1, iters);
    bench("wrk", wrk, sizeof(wrk) - 1, iters * 4);
    return 0;
}
