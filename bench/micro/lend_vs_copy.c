/* lend_vs_copy.c: for which body size lending a Python body to the engine (csrc/resp.h's
 * resp_lease: a malloc'd node, a CAS to hand it back, an exchange to take the list, a free) costs
 * less than the copy it saves (memcpy into the response's reused heap buffer, resp_write).
 *
 *   gcc -O2 -pthread -Isrc/cyserve -Isrc/cyserve/include bench/micro/lend_vs_copy.c \
 *       -o /tmp/lend_vs_copy && /tmp/lend_vs_copy [N]
 *
 * Both sides on one thread, the source in cache (a body the handler has just made): the lease's
 * figure is its floor; across two workers the list's cache line moves between cores too (about
 * 100 ns more per batch of handed-back bodies, not per body). Prints ns per body, median of 5
 * runs of N. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "csrc/resp.c"
#include "csrc/wbuf.c"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 200000;
    static const size_t sizes[] = {256, 1024, 4096, 8192, 16384, 65536, 133622};
    char *src = malloc(1 << 18);
    memset(src, 'x', 1 << 18);
    struct resp_lease_list back = {NULL};
    printf("%10s %12s %12s\n", "bytes", "copy ns", "lease ns");
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t sz = sizes[k];
        double copy[5], lease[5];
        for (int run = 0; run < 5; run++) {
            struct cyserve_response r;
            resp_init(&r);
            double t0 = now_ns();
            for (long i = 0; i < n; i++) {
                r.body.len = 0; /* resp_reset keeps the heap buffer */
                if (resp_write(&r, src, sz))
                    return 1;
                __asm__ volatile("" ::"r"(r.body.ptr) : "memory");
            }
            copy[run] = (now_ns() - t0) / (double)n;
            resp_free(&r);
            resp_init(&r);
            t0 = now_ns();
            for (long i = 0; i < n; i++) {
                struct resp_lease *l = resp_lease_new(src, &back);
                if (!l || resp_set_body_lent(&r, src, sz, l))
                    return 1;
                resp_body_return(&r);
                struct resp_lease *got = resp_lease_take_all(&back);
                while (got) {
                    struct resp_lease *next = got->next;
                    resp_lease_free(got);
                    got = next;
                }
            }
            lease[run] = (now_ns() - t0) / (double)n;
            resp_free(&r);
        }
        qsort(copy, 5, sizeof(double), cmp);
        qsort(lease, 5, sizeof(double), cmp);
        printf("%10zu %12.1f %12.1f\n", sz, copy[2], lease[2]);
    }
    free(src);
    return 0;
}
