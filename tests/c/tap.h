/* tap.h: a tiny Test Anything Protocol emitter for the C unit tests (picotest style).
 *
 * Each test binary #includes the .c file it tests, calls ok()/is_int()/... and returns
 * done_testing() from main. tests/test_c_units.py builds the binaries under the sanitizers, runs
 * each one in its own process with a timeout and fails on any "not ok" line, a non-zero exit or a
 * sanitizer report. Assertions print both operands, so a failure says what was seen. */
#ifndef CYSERVE_TAP_H
#define CYSERVE_TAP_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int tap__count, tap__failed;

static inline void tap__vline(int pass, const char *file, int line, const char *fmt, va_list ap)
{
    ++tap__count;
    printf("%sok %d - ", pass ? "" : "not ", tap__count);
    vprintf(fmt, ap);
    printf("\n");
    if (!pass) {
        ++tap__failed;
        printf("#   failed at %s:%d\n", file, line);
    }
    fflush(stdout);
}

static inline int tap__ok(int pass, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline int tap__ok(int pass, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tap__vline(pass, file, line, fmt, ap);
    va_end(ap);
    return pass;
}

/* ok(cond, "description %d", x) */
#define ok(cond, ...) tap__ok(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* is_int(got, expected, "description"): prints both values on failure. */
#define is_int(got, expected, desc)                                                                \
    do {                                                                                           \
        int64_t tap__g = (int64_t)(got), tap__e = (int64_t)(expected);                             \
        if (!tap__ok(tap__g == tap__e, __FILE__, __LINE__, "%s", (desc)))                          \
            printf("#   got: %" PRId64 "\n#   expected: %" PRId64 "\n", tap__g, tap__e);           \
    } while (0)

/* is_mem(got, got_len, expected_cstr, "description") for (ptr, len) views. */
#define is_mem(got, got_len, expected, desc)                                                       \
    do {                                                                                           \
        const char *tap__g = (const char *)(got), *tap__e = (expected);                            \
        size_t tap__gl = (size_t)(got_len), tap__el = strlen(tap__e);                              \
        int tap__p = tap__gl == tap__el && (tap__gl == 0 || memcmp(tap__g, tap__e, tap__el) == 0); \
        if (!tap__ok(tap__p, __FILE__, __LINE__, "%s", (desc)))                                    \
            printf("#   got: '%.*s'\n#   expected: '%s'\n", (int)tap__gl, tap__g ? tap__g : "",    \
                   tap__e);                                                                        \
    } while (0)

/* note("...") prints a TAP comment. */
static inline void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

/* Prints the plan and returns main's exit status. */
static inline int done_testing(void)
{
    printf("1..%d\n", tap__count);
    if (tap__failed)
        printf("# %d of %d failed\n", tap__failed, tap__count);
    return tap__failed ? 1 : 0;
}

#endif
