/* fuzz_router.c: libFuzzer target for router.c and the parsing parts of files.c.
 *
 * Self-contained like the C unit tests: it #includes the .c files it tests, so it builds with
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I../src/cyserve -I../src/cyserve/include \
 *         fuzz_router.c -o fuzz_router
 * and, for replaying a corpus without libFuzzer,
 *   gcc -g -O1 -DFUZZ_REPLAY -fsanitize=address,undefined -I../src/cyserve \
 *       -I../src/cyserve/include fuzz_router.c -o fuzz_router_replay
 *   ./fuzz_router_replay FILE_OR_DIR...
 *
 * The first input byte picks what is fuzzed, the second the method; the rest is the subject:
 *   0: a request path matched against a fixed router of every route kind;
 *   1: "pattern\npath": the pattern added as a ROUTER_PATH route to a fresh router, then the path
 *      and (for exact patterns) the pattern itself matched;
 *   2: "regex\npath": the same for a ROUTER_REGEX route. Patterns over 48 bytes or with a bound
 *      ("{n,m}") are skipped: glibc's regcomp expands bounds by copying the tree, so nested bounds
 *      such as "((a{999}){999})" exhaust memory at registration. That is a property of regcomp
 *      on a developer's pattern at start-up, not a request-time risk, and would drown the
 *      fuzzer's findings (stacked operators such as "a+++", equally explosive, are refused by
 *      router_add and so stay in scope);
 *   3: files.c's parsers: the percent-decoder/normaliser, Range, and IMF-fixdate.
 * Each mode checks invariants and abort()s when one breaks, so the fuzzer reports it. */
#include "csrc/http_date.c"
#include "csrc/files.c"
#include "csrc/router.c"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct router *fixed;
static char targets[16];

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_router: invariant broken: %s\n", what);
        abort();
    }
}

static void build_fixed(void)
{
    static const struct {
        enum router_match_kind kind;
        const char *pattern;
        unsigned methods;
    } routes[] = {
        {ROUTER_PATH, "/", 0},
        {ROUTER_PATH, "/plaintext", 1u << HTTP_GET},
        {ROUTER_PATH, "/echo", 1u << HTTP_POST},
        {ROUTER_PATH, "/users/{id:int}", 1u << HTTP_GET},
        {ROUTER_PATH, "/users/{name}", 1u << HTTP_PUT},
        {ROUTER_PATH, "/users/me", 1u << HTTP_GET},
        {ROUTER_PATH, "/a/{x}/c/{y:int}", 0},
        {ROUTER_PATH, "/{p}/b/{q}", 1u << HTTP_DELETE},
        {ROUTER_PATH, "/static/{rest:path}", 1u << HTTP_GET},
        {ROUTER_REGEX, "/item/([a-z]+)/([0-9]*)", 1u << HTTP_GET},
        {ROUTER_REGEX, "/r(/x)?(/y)?", 1u << HTTP_PATCH},
        {ROUTER_PREFIX, "/api", 1u << HTTP_GET},
        {ROUTER_PREFIX, "/api/v2/", 1u << HTTP_POST},
        {ROUTER_PREFIX, "/files", 0},
    };
    if (router_new(&fixed) != 0)
        abort();
    for (size_t i = 0; i < N_ELEMENTS(routes); i++) {
        if (router_add(fixed, routes[i].kind, routes[i].pattern, strlen(routes[i].pattern),
                       routes[i].methods, &targets[i], NULL, 0) != 0)
            abort();
    }
}

static void check_match(int rc, const struct router_match *m, const char *path, size_t len)
{
    check(rc == 0 || rc == -ENOENT || rc == -ENOTSUP, "return value");
    if (rc == -ENOTSUP) {
        check(m->allow != 0, "405 without an Allow set");
        char buf[96];
        check(router_format_allow(m->allow, buf, sizeof(buf)) < sizeof(buf), "Allow fits 96");
    }
    if (rc != 0)
        return;
    check(m->target != NULL, "match without a target");
    check(m->num_params <= ROUTER_MAX_PARAMS, "too many params");
    check(m->prefix_len <= len, "prefix_len past the path");
    for (size_t i = 0; i < m->num_params; i++) {
        const cyserve_param *p = &m->params[i];
        check(p->value.ptr >= path && p->value.ptr + p->value.len <= path + len,
              "param value outside the path");
        check(p->name.ptr != NULL && p->name.len > 0, "param without a name");
        if (p->ival != 0) {
            int64_t v;
            check(router__parse_int(p->value.ptr, p->value.len, &v) && v == p->ival,
                  "ival disagrees with the text");
        }
    }
}

static void fuzz_fixed(unsigned method_bit, const uint8_t *d, size_t n)
{
    /* The subject is copied into an exact-size heap block: ASan catches any read past len. */
    char *path = malloc(n ? n : 1);
    memcpy(path, d, n);
    struct router_match m;
    int rc = router_match(fixed, method_bit, path, n, &m);
    check_match(rc, &m, path, n);
    free(path);
}

static void fuzz_add(enum router_match_kind kind, unsigned method_bit, const uint8_t *d, size_t n)
{
    const uint8_t *nl = memchr(d, '\n', n);
    size_t plen = nl ? (size_t)(nl - d) : n;
    if (kind == ROUTER_REGEX && (plen > 48 || memchr(d, '{', plen) != NULL))
        return;
    char *pattern = malloc(plen ? plen : 1);
    memcpy(pattern, d, plen);
    size_t len = nl ? n - plen - 1 : 0;
    char *path = malloc(len ? len : 1);
    if (nl)
        memcpy(path, nl + 1, len);

    struct router *r;
    if (router_new(&r) != 0)
        abort();
    char err[128];
    int rc = router_add(r, kind, pattern, plen, method_bit, &targets[0], err, sizeof(err));
    check(rc == 0 || rc == -EINVAL, "router_add return value");
    check(rc == 0 || strlen(err) > 0, "error without a message");
    if (rc == 0) {
        struct router_match m;
        rc = router_match(r, method_bit, path, len, &m);
        check_match(rc, &m, path, len);
        /* The regex literal prefilter must not change the answer. */
        if (kind == ROUTER_REGEX) {
            r->regexes[0].lit_len = 0;
            struct router_match m2;
            int rc2 = router_match(r, method_bit, path, len, &m2);
            check(rc2 == rc, "regex literal prefilter changed the result");
        }
        /* A pattern without parameters is an exact path: it must match its own text. */
        if (kind == ROUTER_PATH && memchr(pattern, '{', plen) == NULL) {
            rc = router_match(r, method_bit, pattern, plen, &m);
            check(rc == 0 && m.target == &targets[0], "exact route does not match itself");
        }
        /* Registering it again for the same method must be refused. */
        rc = router_add(r, kind, pattern, plen, method_bit, &targets[1], NULL, 0);
        check(rc == -EEXIST, "duplicate route accepted");
    }
    router_free(r);
    free(pattern);
    free(path);
}

static void fuzz_files(const uint8_t *d, size_t n)
{
    char *s = malloc(n ? n : 1);
    memcpy(s, d, n);
    char out[FILES_PATH_MAX];
    bool dir_hint;
    if (files__normalise(s, n, out, &dir_hint) == 0) {
        size_t olen = strlen(out);
        check(olen > 0 && olen < FILES_PATH_MAX, "normalised length");
        check(out[0] != '/', "normalised path is absolute");
        check(strstr(out, "//") == NULL, "empty segment left");
        check(strcmp(out, "..") != 0 && strncmp(out, "../", 3) != 0 &&
                  strstr(out, "/../") == NULL && (olen < 3 || strcmp(out + olen - 3, "/..") != 0),
              "'..' segment left");
    }
    uint64_t size = n > 0 ? d[0] : 0, start, end;
    int rc = files_parse_range(s, n, size, &start, &end);
    check(rc == 0 || rc == 1 || rc == -ERANGE, "range return value");
    if (rc == 0)
        check(start <= end && end < size, "range outside the representation");
    time_t t;
    if (http_date_parse(s, n, &t) == 0) {
        char back[FILES_DATE_SIZE];
        time_t t2;
        check(http_date_format(t, back) == 29, "date not formattable");
        check(http_date_parse(back, 29, &t2) == 0 && t2 == t, "date round trip");
    }
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (fixed == NULL)
        build_fixed();
    if (size < 2)
        return 0;
    unsigned method_bit = 1u << (data[1] % (HTTP_TRACE + 1));
    const uint8_t *d = data + 2;
    size_t n = size - 2;
    switch (data[0] % 4) {
    case 0:
        fuzz_fixed(method_bit, d, n);
        break;
    case 1:
        fuzz_add(ROUTER_PATH, method_bit, d, n);
        break;
    case 2:
        fuzz_add(ROUTER_REGEX, method_bit, d, n);
        break;
    default:
        fuzz_files(d, n);
        break;
    }
    return 0;
}

#ifdef FUZZ_REPLAY
#include <dirent.h>
#include <sys/stat.h>

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    /* Exact-size copy so that ASan sees reads past the input. */
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, buf, n);
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
    return 0;
}

int main(int argc, char **argv)
{
    int failed = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            DIR *dir = opendir(argv[i]);
            struct dirent *de;
            while (dir != NULL && (de = readdir(dir)) != NULL) {
                if (de->d_name[0] == '.')
                    continue;
                char p[4096];
                snprintf(p, sizeof(p), "%s/%s", argv[i], de->d_name);
                failed += replay_file(p);
                count++;
            }
            if (dir != NULL)
                closedir(dir);
        } else {
            failed += replay_file(argv[i]);
            count++;
        }
    }
    router_free(fixed);
    /* Same line as fuzz_http_parse's replay, so one test can check both. An invariant that
     * breaks aborts the process instead, so errors counts unreadable inputs only. */
    printf("replayed %d inputs, %d errors\n", count, failed);
    return failed != 0;
}
#endif
