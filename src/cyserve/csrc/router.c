/* router.c: the four route kinds of router.h and their precedence.
 *
 * Design. Matching is on the hot path of every request, so the common cases do no per-segment
 * work and no allocation:
 *   - Exact paths live in an open-addressing hash table (power-of-two capacity, load <= 1/2,
 *     linear probing). A lookup hashes the path once and compares lengths and bytes. Most
 *     applications route most requests here.
 *   - Typed patterns live in a segment trie (the idea of lwan's lwan-trie, but keyed on whole
 *     segments rather than bytes, because a parameter always fills a segment). Each node holds
 *     its static children (a short array searched linearly: nodes rarely have more than a handful)
 *     and at most one int child, one str child and one list of {..:path} routes. The search is a
 *     depth-first walk that tries static, then int, then str, then path at every position: the
 *     first complete match in that order is the most specific route. Because every trie level
 *     consumes exactly one path segment, a node is visited at most once per lookup: the walk costs
 *     at most the number of nodes, never an exponential backtrack.
 *   - Regex routes are an array in registration order; regexec() only runs when neither of the
 *     above gave a route that accepts the method.
 *   - Prefix routes are an array sorted by decreasing prefix length, so the first match is the
 *     longest.
 * Each pattern key (an exact path, a trie node, a regex, a prefix) holds a list of registrations
 * (struct rentry), one per router_add call, each with its method mask. A lookup that finds a key
 * whose registrations do not accept the method adds their masks to the Allow set and goes on to
 * the next lower precedence, so a 405 lists the methods of every route that matches the path.
 *
 * Threads: everything is built by one thread before serving and never mutated afterwards, so
 * concurrent router_match calls only read. regexec() on a shared regex_t is thread-safe in glibc
 * (it serialises on a lock inside the regex_t: regex routes do not scale across cores, one more
 * reason they come after the trie). */
#define _GNU_SOURCE
#include "router.h"

#include <errno.h>
#include <regex.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compat.h"

/* Every method bit, for routes registered with ROUTER_ANY_METHOD. */
#define ROUTER__ALL_METHODS (~0u)
#define ROUTER__GET ROUTER_METHOD_BIT(HTTP_GET)
#define ROUTER__HEAD ROUTER_METHOD_BIT(HTTP_HEAD)

/* The parameter types of a pattern segment. SEG_STATIC is plain text. */
enum rseg_type { SEG_STATIC, SEG_INT, SEG_STR, SEG_PATH };

/* One router_add call. */
struct rentry {
    unsigned methods;
    void *target;
    char *pattern; /* owned copy; names[] point into it */
    cyserve_str names[ROUTER_MAX_PARAMS];
    size_t num_params;
    struct rentry *next; /* the other registrations of the same key, in registration order */
};

struct rexact {
    uint64_t hash;
    const char *key; /* the entries' pattern copy (the first entry's) */
    size_t len;
    struct rentry *entries; /* NULL: empty slot */
};

struct rnode;

struct rstatic {
    char *seg;
    size_t len;
    struct rnode *child;
};

struct rnode {
    struct rstatic *statics;
    size_t num_statics;
    struct rnode *int_child;
    struct rnode *str_child;
    struct rentry *path_entries; /* {..:path} routes whose parameter starts at this position */
    struct rentry *entries;      /* routes that end exactly at this node */
};

struct rregex {
    regex_t re;        /* compiled as written; a match must span the path */
    size_t num_groups; /* the user's capture groups (re.re_nsub, at most ROUTER_MAX_PARAMS) */
    size_t lit_len;    /* a literal every match starts with: entries->pattern + lit_off */
    size_t lit_off;
    struct rentry *entries;
};

struct rprefix {
    size_t len;             /* without the trailing '/' */
    struct rentry *entries; /* pattern holds the prefix */
};

struct router {
    struct rexact *exact;
    size_t exact_cap; /* 0 or a power of two */
    size_t exact_count;
    struct rnode root;
    struct rregex *regexes;
    size_t num_regexes;
    struct rprefix *prefixes;
    size_t num_prefixes;
};

/* Regex capture groups are reported under these names. */
static const char *const router__group_names[ROUTER_MAX_PARAMS] = {
    "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
};

static void router__errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void router__errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* FNV-1a over the bytes, eight at a time where possible. A path is short (tens of bytes), so a
 * simple multiplicative hash is cheaper than anything with a setup cost; the table is built from
 * the application's own routes, not from client input, so hash flooding cannot grow a chain at
 * run time (a client can only make one lookup probe as far as the longest existing chain). */
static uint64_t router__hash(const char *p, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < len; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
    return h ^ (h >> 32);
}

static bool router__accepts(unsigned methods, unsigned method_bit)
{
    if (methods & method_bit)
        return true;
    /* HEAD is GET without the body (RFC 9110 9.3.2): every GET route answers it. */
    return method_bit == ROUTER__HEAD && (methods & ROUTER__GET) != 0;
}

/* Returns the first registration in the list that accepts the method; otherwise adds every
 * registration's methods to *allow and returns NULL. A route that names HEAD itself wins a HEAD
 * over a GET route that answers it implicitly, whichever was registered first. */
static const struct rentry *router__pick(const struct rentry *e, unsigned method_bit,
                                         unsigned *allow)
{
    if (method_bit == ROUTER__HEAD) {
        for (const struct rentry *x = e; x != NULL; x = x->next)
            if (x->methods & ROUTER__HEAD)
                return x;
    }
    unsigned seen = 0;
    for (; e != NULL; e = e->next) {
        if (router__accepts(e->methods, method_bit))
            return e;
        seen |= e->methods;
    }
    *allow |= seen;
    return NULL;
}

int router_new(struct router **out)
{
    struct router *r = calloc(1, sizeof(*r));
    if (UNLIKELY(r == NULL))
        return -ENOMEM;
    *out = r;
    return 0;
}

static void router__free_entries(struct rentry *e)
{
    while (e != NULL) {
        struct rentry *next = e->next;
        free(e->pattern);
        free(e);
        e = next;
    }
}

static void router__free_node(struct rnode *n)
{
    for (size_t i = 0; i < n->num_statics; i++) {
        router__free_node(n->statics[i].child);
        free(n->statics[i].child);
        free(n->statics[i].seg);
    }
    free(n->statics);
    if (n->int_child != NULL) {
        router__free_node(n->int_child);
        free(n->int_child);
    }
    if (n->str_child != NULL) {
        router__free_node(n->str_child);
        free(n->str_child);
    }
    router__free_entries(n->path_entries);
    router__free_entries(n->entries);
}

void router_free(struct router *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->exact_cap; i++)
        router__free_entries(r->exact[i].entries);
    free(r->exact);
    router__free_node(&r->root);
    for (size_t i = 0; i < r->num_regexes; i++) {
        regfree(&r->regexes[i].re);
        router__free_entries(r->regexes[i].entries);
    }
    free(r->regexes);
    for (size_t i = 0; i < r->num_prefixes; i++)
        router__free_entries(r->prefixes[i].entries);
    free(r->prefixes);
    free(r);
}

/* ------------------------------------------------------------------------------------------ */
/* Building */

static struct rentry *router__entry_new(const char *pattern, size_t len, unsigned methods,
                                        void *target)
{
    struct rentry *e = calloc(1, sizeof(*e));
    if (UNLIKELY(e == NULL))
        return NULL;
    e->pattern = malloc(len + 1);
    if (UNLIKELY(e->pattern == NULL)) {
        free(e);
        return NULL;
    }
    memcpy(e->pattern, pattern, len);
    e->pattern[len] = '\0';
    e->methods = methods;
    e->target = target;
    return e;
}

/* Appends e to *list unless a registration there already accepts one of e's methods. */
static int router__append(struct rentry **list, struct rentry *e, char *err, size_t errlen)
{
    struct rentry **tail = list;
    for (; *tail != NULL; tail = &(*tail)->next) {
        if (UNLIKELY(((*tail)->methods & e->methods) != 0)) {
            router__errf(err, errlen, "route '%s' is already registered for one of these methods",
                         e->pattern);
            return -EEXIST;
        }
    }
    *tail = e;
    return 0;
}

static int router__exact_grow(struct router *r)
{
    size_t cap = r->exact_cap ? r->exact_cap * 2 : 16;
    struct rexact *t = calloc(cap, sizeof(*t));
    if (UNLIKELY(t == NULL))
        return -ENOMEM;
    for (size_t i = 0; i < r->exact_cap; i++) {
        const struct rexact *s = &r->exact[i];
        if (s->entries == NULL)
            continue;
        size_t j = s->hash & (cap - 1);
        while (t[j].entries != NULL)
            j = (j + 1) & (cap - 1);
        t[j] = *s;
    }
    free(r->exact);
    r->exact = t;
    r->exact_cap = cap;
    return 0;
}

static const struct rexact *router__exact_find(const struct router *r, const char *path, size_t len)
{
    if (r->exact_cap == 0)
        return NULL;
    uint64_t h = router__hash(path, len);
    size_t mask = r->exact_cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const struct rexact *s = &r->exact[i];
        if (s->entries == NULL)
            return NULL;
        if (s->hash == h && s->len == len && memcmp(s->key, path, len) == 0)
            return s;
    }
}

static int router__add_exact(struct router *r, struct rentry *e, size_t len, char *err,
                             size_t errlen)
{
    struct rexact *found = (struct rexact *)router__exact_find(r, e->pattern, len);
    if (found != NULL)
        return router__append(&found->entries, e, err, errlen);
    if ((r->exact_count + 1) * 2 > r->exact_cap) {
        int rc = router__exact_grow(r);
        if (UNLIKELY(rc < 0))
            return rc;
    }
    uint64_t h = router__hash(e->pattern, len);
    size_t mask = r->exact_cap - 1;
    size_t i = h & mask;
    while (r->exact[i].entries != NULL)
        i = (i + 1) & mask;
    r->exact[i].hash = h;
    r->exact[i].key = e->pattern;
    r->exact[i].len = len;
    r->exact[i].entries = e;
    r->exact_count++;
    return 0;
}

/* One parsed segment of a pattern. */
struct rseg {
    enum rseg_type type;
    const char *text; /* static text, or the parameter's name */
    size_t len;
};

static bool router__is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Parses one segment s[0..len) of a ROUTER_PATH pattern. */
static int router__parse_seg(const char *s, size_t len, struct rseg *out, const char *pattern,
                             char *err, size_t errlen)
{
    const char *open = memchr(s, '{', len);
    const char *close = memchr(s, '}', len);
    if (open == NULL && close == NULL) {
        out->type = SEG_STATIC;
        out->text = s;
        out->len = len;
        return 0;
    }
    size_t opens = 0, closes = 0;
    for (size_t i = 0; i < len; i++) {
        opens += s[i] == '{';
        closes += s[i] == '}';
    }
    if (UNLIKELY(opens != 1 || closes != 1 || close < open)) {
        router__errf(err, errlen, "unbalanced brace in route '%s'", pattern);
        return -EINVAL;
    }
    if (UNLIKELY(open != s || close != s + len - 1)) {
        router__errf(err, errlen,
                     "a parameter must fill a whole segment (between two '/') in route '%s'",
                     pattern);
        return -EINVAL;
    }
    const char *name = s + 1;
    size_t inner = len - 2;
    const char *colon = memchr(name, ':', inner);
    size_t name_len = colon ? (size_t)(colon - name) : inner;
    if (UNLIKELY(name_len == 0)) {
        router__errf(err, errlen, "a parameter has no name in route '%s'", pattern);
        return -EINVAL;
    }
    for (size_t i = 0; i < name_len; i++) {
        if (UNLIKELY(!router__is_name_char(name[i]))) {
            router__errf(err, errlen,
                         "parameter names are letters, digits and '_' only, in route '%s'",
                         pattern);
            return -EINVAL;
        }
    }
    out->text = name;
    out->len = name_len;
    if (colon == NULL) {
        out->type = SEG_STR;
        return 0;
    }
    const char *type = colon + 1;
    size_t type_len = inner - name_len - 1;
    if (type_len == 3 && memcmp(type, "int", 3) == 0)
        out->type = SEG_INT;
    else if (type_len == 3 && memcmp(type, "str", 3) == 0)
        out->type = SEG_STR;
    else if (type_len == 4 && memcmp(type, "path", 4) == 0)
        out->type = SEG_PATH;
    else {
        router__errf(err, errlen, "unknown parameter type '%.*s' in route '%s' (int, str, path)",
                     (int)type_len, type, pattern);
        return -EINVAL;
    }
    return 0;
}

static struct rnode *router__static_child(struct rnode *n, const char *seg, size_t len)
{
    for (size_t i = 0; i < n->num_statics; i++) {
        if (n->statics[i].len == len && memcmp(n->statics[i].seg, seg, len) == 0)
            return n->statics[i].child;
    }
    struct rstatic *grown = realloc(n->statics, (n->num_statics + 1) * sizeof(*grown));
    if (UNLIKELY(grown == NULL))
        return NULL;
    n->statics = grown;
    struct rnode *child = calloc(1, sizeof(*child));
    char *copy = malloc(len + 1);
    if (UNLIKELY(child == NULL || copy == NULL)) {
        free(child);
        free(copy);
        return NULL;
    }
    memcpy(copy, seg, len);
    copy[len] = '\0';
    n->statics[n->num_statics].seg = copy;
    n->statics[n->num_statics].len = len;
    n->statics[n->num_statics].child = child;
    n->num_statics++;
    return child;
}

static struct rnode *router__param_child(struct rnode **slot)
{
    if (*slot == NULL)
        *slot = calloc(1, sizeof(**slot));
    return *slot;
}

/* Adds a ROUTER_PATH pattern: to the exact table when it has no parameter, else to the trie.
 * Takes ownership of e on success. */
static int router__add_path(struct router *r, struct rentry *e, size_t len, char *err,
                            size_t errlen)
{
    const char *p = e->pattern;
    if (UNLIKELY(len == 0 || p[0] != '/')) {
        router__errf(err, errlen, "route '%s' does not start with '/'", p);
        return -EINVAL;
    }
    if (UNLIKELY(memchr(p, '\0', len) != NULL)) {
        router__errf(err, errlen, "route contains a NUL byte");
        return -EINVAL;
    }
    /* First pass: validate every segment and collect the parameter names. */
    struct rseg segs_small[32];
    size_t num_segs = 1;
    for (size_t i = 1; i < len; i++)
        num_segs += p[i] == '/';
    struct rseg *segs = num_segs <= N_ELEMENTS(segs_small) ? segs_small
                                                           : malloc(num_segs * sizeof(*segs));
    if (UNLIKELY(segs == NULL))
        return -ENOMEM;
    int rc = 0;
    size_t k = 0, start = 1;
    while (k < num_segs) {
        const char *slash = memchr(p + start, '/', len - start);
        size_t end = slash ? (size_t)(slash - p) : len;
        rc = router__parse_seg(p + start, end - start, &segs[k], p, err, errlen);
        if (UNLIKELY(rc < 0))
            goto out;
        if (segs[k].type != SEG_STATIC) {
            if (UNLIKELY(e->num_params == ROUTER_MAX_PARAMS)) {
                router__errf(err, errlen, "route '%s' has more than %d parameters", p,
                             ROUTER_MAX_PARAMS);
                rc = -EINVAL;
                goto out;
            }
            for (size_t j = 0; j < e->num_params; j++) {
                if (UNLIKELY(e->names[j].len == segs[k].len &&
                             memcmp(e->names[j].ptr, segs[k].text, segs[k].len) == 0)) {
                    router__errf(err, errlen, "duplicate parameter name '%.*s' in route '%s'",
                                 (int)segs[k].len, segs[k].text, p);
                    rc = -EINVAL;
                    goto out;
                }
            }
            e->names[e->num_params].ptr = segs[k].text;
            e->names[e->num_params].len = segs[k].len;
            e->num_params++;
        }
        if (UNLIKELY(segs[k].type == SEG_PATH && k + 1 != num_segs)) {
            router__errf(err, errlen, "a {..:path} parameter must be the last segment of '%s'", p);
            rc = -EINVAL;
            goto out;
        }
        k++;
        start = end + 1;
    }
    if (e->num_params == 0) {
        rc = router__add_exact(r, e, len, err, errlen);
        goto out;
    }
    /* Second pass: walk or build the trie. */
    struct rnode *n = &r->root;
    for (k = 0; k < num_segs; k++) {
        switch (segs[k].type) {
        case SEG_STATIC:
            n = router__static_child(n, segs[k].text, segs[k].len);
            break;
        case SEG_INT:
            n = router__param_child(&n->int_child);
            break;
        case SEG_STR:
            n = router__param_child(&n->str_child);
            break;
        case SEG_PATH:
            rc = router__append(&n->path_entries, e, err, errlen);
            goto out;
        }
        if (UNLIKELY(n == NULL)) {
            rc = -ENOMEM;
            goto out;
        }
    }
    rc = router__append(&n->entries, e, err, errlen);
out:
    if (segs != segs_small)
        free(segs);
    return rc;
}

/* Whether a repetition operator (*, +, ? or {) directly follows another one, outside bracket
 * expressions. POSIX leaves "a**" and "a+{2}" undefined; glibc accepts them and, for stacks of
 * them, builds trees that grow exponentially (the fuzzer found "/a+++...+" exhausting memory in
 * regcomp). No useful pattern needs them, so router_add refuses them. */
static bool router__stacked_repetition(const char *p, size_t len)
{
    bool after_rep = false;
    for (size_t i = 0; i < len; i++) {
        char c = p[i];
        if (c == '\\') {
            i++; /* an escaped character is an atom */
            after_rep = false;
        } else if (c == '[') {
            /* Skip the bracket expression: a ']' right after '[' or "[^" is literal, and
             * "[:alpha:]"-style classes contain no ']' before their ":]". */
            size_t j = i + 1;
            if (j < len && p[j] == '^')
                j++;
            if (j < len && p[j] == ']')
                j++;
            while (j < len && p[j] != ']') {
                if (p[j] == '[' && j + 1 < len &&
                    (p[j + 1] == ':' || p[j + 1] == '.' || p[j + 1] == '=')) {
                    /* The class ends at its own ":]" (".]", "=]"), not at the first ':': in
                     * "[[:alpha:](]" the '(' is still inside the bracket. */
                    size_t k = j + 2;
                    while (k + 1 < len && !(p[k] == p[j + 1] && p[k + 1] == ']'))
                        k++;
                    j = k + 1 < len ? k + 2 : len;
                } else {
                    j++;
                }
            }
            i = j;
            after_rep = false;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (after_rep)
                return true;
            if (c == '{') {
                const char *close = memchr(p + i, '}', len - i);
                i = close ? (size_t)(close - p) : len;
            }
            after_rep = true;
        } else {
            after_rep = false;
        }
    }
    return false;
}

/* The literal that every match of the ERE p[0..len) starts with, as (offset, length) in p: the
 * characters after an optional '^' up to the first special one. A literal made optional by a
 * following '*', '?' or '{' is not part of it, and any '|' means no literal at all (the other
 * branch may start elsewhere). glibc's regexec costs about a microsecond even when it fails on
 * the first byte, so this prefilter is what keeps a 404 cheap when regex routes exist. */
static void router__regex_literal(const char *p, size_t len, size_t *off, size_t *lit_len)
{
    *off = 0;
    *lit_len = 0;
    if (memchr(p, '|', len) != NULL)
        return;
    size_t i = len > 0 && p[0] == '^' ? 1 : 0;
    size_t start = i;
    while (i < len && strchr(".[]()*+?{}|^$\\", p[i]) == NULL)
        i++;
    if (i < len && i > start && (p[i] == '*' || p[i] == '?' || p[i] == '{'))
        i--;
    *off = start;
    *lit_len = i - start;
}

static int router__add_regex(struct router *r, struct rentry *e, size_t len, char *err,
                             size_t errlen)
{
    if (UNLIKELY(memchr(e->pattern, '\0', len) != NULL)) {
        router__errf(err, errlen, "regex contains a NUL byte");
        return -EINVAL;
    }
    if (UNLIKELY(router__stacked_repetition(e->pattern, len))) {
        router__errf(err, errlen,
                     "bad regex '%s': a repetition operator follows another (undefined in POSIX)",
                     e->pattern);
        return -EINVAL;
    }
    for (size_t i = 0; i < r->num_regexes; i++) {
        if (strcmp(r->regexes[i].entries->pattern, e->pattern) == 0)
            return router__append(&r->regexes[i].entries, e, err, errlen);
    }
    /* Compiled as written, not wrapped in "^(" ")$": glibc takes a stray ')' as a literal, so
     * the wrapper's '(' could pair with the user's ')' ("/a)|/b" became "starts with /a or
     * ends with /b)"), and the user's group numbers, backreferences included, would shift by
     * one. The whole path must match instead: see router__match_regex. */
    struct rregex *grown = realloc(r->regexes, (r->num_regexes + 1) * sizeof(*grown));
    if (UNLIKELY(grown == NULL))
        return -ENOMEM;
    r->regexes = grown;
    struct rregex *x = &r->regexes[r->num_regexes];
    int rc = regcomp(&x->re, e->pattern, REG_EXTENDED);
    if (UNLIKELY(rc != 0)) {
        char msg[128];
        regerror(rc, &x->re, msg, sizeof(msg));
        router__errf(err, errlen, "bad regex '%s': %s", e->pattern, msg);
        return -EINVAL;
    }
    if (UNLIKELY(x->re.re_nsub > ROUTER_MAX_PARAMS)) {
        regfree(&x->re);
        router__errf(err, errlen, "bad regex '%s': %zu groups, at most %d", e->pattern,
                     (size_t)x->re.re_nsub, ROUTER_MAX_PARAMS);
        return -EINVAL;
    }
    x->num_groups = x->re.re_nsub;
    router__regex_literal(e->pattern, len, &x->lit_off, &x->lit_len);
    x->entries = e;
    r->num_regexes++;
    return 0;
}

static int router__add_prefix(struct router *r, struct rentry *e, size_t len, char *err,
                              size_t errlen)
{
    if (UNLIKELY(len > 0 && e->pattern[0] != '/')) {
        router__errf(err, errlen, "prefix '%s' does not start with '/'", e->pattern);
        return -EINVAL;
    }
    if (UNLIKELY(memchr(e->pattern, '\0', len) != NULL)) {
        router__errf(err, errlen, "prefix contains a NUL byte");
        return -EINVAL;
    }
    /* "/api/" and "/api" are one prefix; "/" becomes "" and matches everything. */
    while (len > 0 && e->pattern[len - 1] == '/')
        len--;
    e->pattern[len] = '\0';
    for (size_t i = 0; i < r->num_prefixes; i++) {
        if (r->prefixes[i].len == len &&
            memcmp(r->prefixes[i].entries->pattern, e->pattern, len) == 0)
            return router__append(&r->prefixes[i].entries, e, err, errlen);
    }
    struct rprefix *grown = realloc(r->prefixes, (r->num_prefixes + 1) * sizeof(*grown));
    if (UNLIKELY(grown == NULL))
        return -ENOMEM;
    r->prefixes = grown;
    /* Keep the array sorted by decreasing length (stable for equal lengths, which cannot both
     * match one path anyway), so the first prefix that matches is the longest. */
    size_t at = r->num_prefixes;
    while (at > 0 && r->prefixes[at - 1].len < len) {
        r->prefixes[at] = r->prefixes[at - 1];
        at--;
    }
    r->prefixes[at].len = len;
    r->prefixes[at].entries = e;
    r->num_prefixes++;
    return 0;
}

int router_add(struct router *r, enum router_match_kind kind, const char *pattern, size_t len,
               unsigned methods, void *target, char *err, size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (methods == ROUTER_ANY_METHOD)
        methods = ROUTER__ALL_METHODS;
    struct rentry *e = router__entry_new(pattern, len, methods, target);
    if (UNLIKELY(e == NULL))
        return -ENOMEM;
    int rc;
    switch (kind) {
    case ROUTER_PATH:
        rc = router__add_path(r, e, len, err, errlen);
        break;
    case ROUTER_PREFIX:
        rc = router__add_prefix(r, e, len, err, errlen);
        break;
    case ROUTER_REGEX:
        rc = router__add_regex(r, e, len, err, errlen);
        break;
    default:
        router__errf(err, errlen, "unknown route kind %d", (int)kind);
        rc = -EINVAL;
        break;
    }
    if (UNLIKELY(rc < 0))
        router__free_entries(e);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Matching */

/* The walk's state, shared by every level of the recursion. */
struct rwalk {
    const char *path;
    size_t len;
    unsigned method_bit;
    unsigned allow;
    struct router_match *m;
};

/* A segment that fills an {..:int} parameter: an optional '-' and 1 to 19 digits, in range. */
static bool router__parse_int(const char *s, size_t len, int64_t *out)
{
    bool neg = len > 0 && s[0] == '-';
    size_t i = neg;
    if (len == i || len - i > 19)
        return false;
    uint64_t v = 0;
    for (; i < len; i++) {
        unsigned d = (unsigned char)s[i] - '0';
        if (d > 9)
            return false;
        v = v * 10 + d;
    }
    /* 19 digits fit in uint64_t; the int64_t range is asymmetric. */
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1)
            return false;
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    } else {
        if (v > (uint64_t)INT64_MAX)
            return false;
        *out = (int64_t)v;
    }
    return true;
}

static bool router__found(struct rwalk *w, const struct rentry *e, size_t num_params)
{
    struct router_match *m = w->m;
    m->target = e->target;
    m->num_params = num_params;
    for (size_t i = 0; i < num_params; i++)
        m->params[i].name = e->names[i];
    m->kind = ROUTER_PATH;
    return true;
}

static bool router__walk_child(struct rwalk *w, const struct rnode *child, size_t end, bool last,
                               size_t depth);

/* Matches the segment that starts at pos (just after a '/') against node n; depth is the number
 * of parameters captured so far. Returns true once a route accepting the method is found. */
static bool router__walk(struct rwalk *w, const struct rnode *n, size_t pos, size_t depth)
{
    const char *p = w->path;
    const char *slash = memchr(p + pos, '/', w->len - pos);
    size_t end = slash ? (size_t)(slash - p) : w->len;
    const char *seg = p + pos;
    size_t seg_len = end - pos;
    bool last = slash == NULL;

    for (size_t i = 0; i < n->num_statics; i++) {
        const struct rstatic *s = &n->statics[i];
        if (s->len != seg_len || memcmp(s->seg, seg, seg_len) != 0)
            continue;
        if (router__walk_child(w, s->child, end, last, depth))
            return true;
        break; /* static segments are unique per node */
    }
    cyserve_param *param = &w->m->params[depth];
    int64_t ival;
    if (n->int_child != NULL && router__parse_int(seg, seg_len, &ival)) {
        param->value.ptr = seg;
        param->value.len = seg_len;
        param->ival = ival;
        if (router__walk_child(w, n->int_child, end, last, depth + 1))
            return true;
    }
    if (n->str_child != NULL && seg_len > 0) {
        param->value.ptr = seg;
        param->value.len = seg_len;
        param->ival = 0;
        if (router__walk_child(w, n->str_child, end, last, depth + 1))
            return true;
    }
    if (n->path_entries != NULL) {
        const struct rentry *e = router__pick(n->path_entries, w->method_bit, &w->allow);
        if (e != NULL) {
            param->value.ptr = seg;
            param->value.len = w->len - pos;
            param->ival = 0;
            return router__found(w, e, depth + 1);
        }
    }
    return false;
}

/* Goes on with child after a segment that ended at end (the path's end when last). */
static bool router__walk_child(struct rwalk *w, const struct rnode *child, size_t end, bool last,
                               size_t depth)
{
    if (!last)
        return router__walk(w, child, end + 1, depth);
    if (child->entries == NULL)
        return false;
    const struct rentry *e = router__pick(child->entries, w->method_bit, &w->allow);
    return e != NULL && router__found(w, e, depth);
}

static bool router__match_regex(const struct rregex *x, struct rwalk *w)
{
    /* [0] is the match, [1..] the user's groups. The match must be the whole path: POSIX
     * regexec reports the leftmost match and, at that start, the longest, so if any match spans
     * the whole path, pm[0] is it. */
    if (x->lit_len > 0 &&
        (w->len < x->lit_len || memcmp(w->path, x->entries->pattern + x->lit_off, x->lit_len) != 0))
        return false;
    regmatch_t pm[ROUTER_MAX_PARAMS + 1];
    size_t groups = x->num_groups < ROUTER_MAX_PARAMS ? x->num_groups : ROUTER_MAX_PARAMS;
    /* REG_STARTEND (a BSD extension glibc has) bounds the subject by pm[0], so the path needs
     * no NUL terminator and no copy. */
    pm[0].rm_so = 0;
    pm[0].rm_eo = (regoff_t)w->len;
    const char *subject = w->path;
#if defined(CYSERVE_ASAN) || defined(CYSERVE_TSAN)
    /* The sanitizers' regexec interceptor checks strlen(subject) + 1 bytes, not knowing
     * REG_STARTEND, and reports a read past the end of an unterminated path. Under ASan/TSan
     * only, hand it a terminated copy; the copy carries one extra non-NUL byte before the NUL so
     * that the tests still prove that REG_STARTEND, not the terminator, bounds the match. */
    char *copy = malloc(w->len + 2);
    if (UNLIKELY(copy == NULL))
        return false;
    memcpy(copy, w->path, w->len);
    copy[w->len] = '#';
    copy[w->len + 1] = '\0';
    subject = copy;
#endif
    int rc = regexec(&x->re, subject, groups + 1, pm, REG_STARTEND);
#if defined(CYSERVE_ASAN) || defined(CYSERVE_TSAN)
    free(copy);
#endif
    if (rc != 0 || pm[0].rm_so != 0 || (size_t)pm[0].rm_eo != w->len)
        return false;
    const struct rentry *e = router__pick(x->entries, w->method_bit, &w->allow);
    if (e == NULL)
        return false;
    struct router_match *m = w->m;
    m->target = e->target;
    m->kind = ROUTER_REGEX;
    m->num_params = groups;
    for (size_t i = 0; i < groups; i++) {
        cyserve_param *param = &m->params[i];
        param->name.ptr = router__group_names[i];
        param->name.len = i < 9 ? 1 : 2; /* "1".."9", then "10".."16" */
        param->ival = 0;
        if (pm[i + 1].rm_so < 0) {
            param->value.ptr = w->path;
            param->value.len = 0;
        } else {
            param->value.ptr = w->path + pm[i + 1].rm_so;
            param->value.len = (size_t)(pm[i + 1].rm_eo - pm[i + 1].rm_so);
        }
    }
    return true;
}

int router_match(const struct router *r, unsigned method_bit, const char *path, size_t len,
                 struct router_match *m)
{
    struct rwalk w = {.path = path, .len = len, .method_bit = method_bit, .allow = 0, .m = m};
    m->target = NULL;
    m->num_params = 0;
    m->allow = 0;
    m->prefix_len = 0;

    const struct rexact *x = router__exact_find(r, path, len);
    if (x != NULL) {
        const struct rentry *e = router__pick(x->entries, method_bit, &w.allow);
        if (LIKELY(e != NULL)) {
            m->target = e->target;
            m->kind = ROUTER_PATH;
            return 0;
        }
    }
    if (len > 0 && path[0] == '/' && router__walk(&w, &r->root, 1, 0))
        return 0;
    m->num_params = 0;
    for (size_t i = 0; i < r->num_regexes; i++) {
        if (router__match_regex(&r->regexes[i], &w))
            return 0;
    }
    for (size_t i = 0; i < r->num_prefixes; i++) {
        const struct rprefix *px = &r->prefixes[i];
        bool hit = px->len == 0 ||
                   (len >= px->len && memcmp(path, px->entries->pattern, px->len) == 0 &&
                    (len == px->len || path[px->len] == '/'));
        if (!hit)
            continue;
        const struct rentry *e = router__pick(px->entries, method_bit, &w.allow);
        if (e != NULL) {
            m->target = e->target;
            m->kind = ROUTER_PREFIX;
            m->prefix_len = px->len;
            return 0;
        }
    }
    if (w.allow != 0) {
        m->allow = w.allow;
        return -ENOTSUP;
    }
    return -ENOENT;
}

size_t router_format_allow(unsigned allow, char *buf, size_t size)
{
    if (allow & ROUTER__GET)
        allow |= ROUTER__HEAD;
    size_t n = 0;
    /* Allow lists the methods in the enum's order: the common ones first, as most servers print
     * them. */
    for (int m = HTTP_GET; m < HTTP_METHOD_COUNT; m++) {
        if (!(allow & ROUTER_METHOD_BIT(m)))
            continue;
        const char *name = http_method_name((enum http_method)m);
        size_t name_len = strlen(name);
        const char *sep = n > 0 ? ", " : "";
        size_t sep_len = n > 0 ? 2 : 0;
        /* Copy what fits (leaving room for the NUL) and keep counting the full length. */
        for (size_t j = 0; j < sep_len + name_len; j++, n++) {
            char c = j < sep_len ? sep[j] : name[j - sep_len];
            if (n + 1 < size)
                buf[n] = c;
        }
    }
    if (size > 0)
        buf[n < size ? n : size - 1] = '\0';
    return n;
}
