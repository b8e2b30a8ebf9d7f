/* cov_trace.c: the coverage recorder that pick_seeds.py links into the replay binaries.
 *
 * gcc's -fsanitize-coverage=trace-pc calls __sanitizer_cov_trace_pc at the start of every basic
 * block of the instrumented code. This file is compiled without that flag; it keeps the distinct
 * return addresses (one per block reached) in an open-addressing set and, at exit, writes them
 * one per line, in hex, to the file named by $COV_OUT. Built with -no-pie, so that the addresses
 * are the same in every run and the sets of two inputs can be compared. Tooling only: nothing of
 * cyserve links it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define COV_SLOTS (1u << 20) /* far more blocks than the parser and the router have together */

static uintptr_t *cov_slots;

void __sanitizer_cov_trace_pc(void)
{
    uintptr_t pc = (uintptr_t)__builtin_return_address(0);
    if (cov_slots == NULL) {
        cov_slots = calloc(COV_SLOTS, sizeof(*cov_slots));
        if (cov_slots == NULL)
            abort();
    }
    uint32_t h = (uint32_t)(((uint64_t)pc * 0x9E3779B97F4A7C15ull) >> 40) & (COV_SLOTS - 1);
    while (cov_slots[h] != 0 && cov_slots[h] != pc)
        h = (h + 1) & (COV_SLOTS - 1);
    cov_slots[h] = pc;
}

__attribute__((destructor)) static void cov_dump(void)
{
    const char *path = getenv("COV_OUT");
    if (path == NULL || cov_slots == NULL)
        return;
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return;
    for (uint32_t i = 0; i < COV_SLOTS; i++)
        if (cov_slots[i] != 0)
            fprintf(f, "%lx\n", (unsigned long)cov_slots[i]);
    fclose(f);
}
