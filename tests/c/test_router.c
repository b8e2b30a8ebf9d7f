/* test_router.c: router.c's route kinds, precedence, 404/405 and pattern errors.
 *
 * Targets are the addresses of distinct static chars, so each assertion says which route won.
 * Paths are given to router_match as (ptr, len) views copied into a buffer with no NUL after them
 * (a byte that is not '/' follows), so a matcher that relied on a terminator would misbehave. */
#include "csrc/router.c"

#include <errno.h>
#include <stdlib.h>

#include "tap.h"

static char T_EXACT, T_EXACT2, T_USERS_INT, T_USERS_STR, T_USERS_ME, T_FILES_PATH, T_REGEX1,
    T_REGEX2, T_PREFIX_API, T_PREFIX_ROOT, T_POST_ONLY, T_ANY, T_DEEP1, T_DEEP2, T_GET_ONLY;

#define GET ROUTER_METHOD_BIT(HTTP_GET)
#define HEAD ROUTER_METHOD_BIT(HTTP_HEAD)
#define POST ROUTER_METHOD_BIT(HTTP_POST)
#define PUT ROUTER_METHOD_BIT(HTTP_PUT)
#define DELETE ROUTER_METHOD_BIT(HTTP_DELETE)

static char errbuf[256];

static int add(struct router *r, enum router_match_kind kind, const char *pattern, unsigned methods,
               void *target)
{
    return router_add(r, kind, pattern, strlen(pattern), methods, target, errbuf, sizeof(errbuf));
}

/* Matches a path placed in a heap buffer followed by a non-NUL, non-'/' byte. */
static int match(const struct router *r, unsigned method, const char *path, struct router_match *m)
{
    size_t len = strlen(path);
    char *copy = malloc(len + 1);
    memcpy(copy, path, len);
    copy[len] = 'Z';
    int rc = router_match(r, method, copy, len, m);
    /* Params point into copy: rebase them onto the caller's literal before freeing. */
    for (size_t i = 0; i < m->num_params && rc == 0; i++)
        m->params[i].value.ptr = path + (m->params[i].value.ptr - copy);
    free(copy);
    return rc;
}

static void test_exact_and_patterns(void)
{
    struct router *r;
    is_int(router_new(&r), 0, "router_new");
    is_int(add(r, ROUTER_PATH, "/plaintext", GET, &T_EXACT), 0, "add exact");
    is_int(add(r, ROUTER_PATH, "/", ROUTER_ANY_METHOD, &T_EXACT2), 0, "add root");
    is_int(add(r, ROUTER_PATH, "/users/{id:int}", GET, &T_USERS_INT), 0, "add int pattern");
    is_int(add(r, ROUTER_PATH, "/users/{name}", GET, &T_USERS_STR), 0, "add str pattern");
    is_int(add(r, ROUTER_PATH, "/users/me", GET, &T_USERS_ME), 0, "add static beside params");
    is_int(add(r, ROUTER_PATH, "/files/{rest:path}", GET, &T_FILES_PATH), 0, "add path param");
    is_int(add(r, ROUTER_PATH, "/a/{x}/c", GET, &T_DEEP1), 0, "add /a/{x}/c");
    is_int(add(r, ROUTER_PATH, "/{y}/b/{z:str}", GET, &T_DEEP2), 0, "add /{y}/b/{z:str}");

    struct router_match m;
    is_int(match(r, GET, "/plaintext", &m), 0, "exact");
    ok(m.target == &T_EXACT && m.num_params == 0, "exact target, no params");
    is_int(match(r, HEAD, "/plaintext", &m), 0, "HEAD matches a GET route");
    ok(m.target == &T_EXACT, "HEAD target");
    is_int(match(r, GET, "/plaintext/", &m), -ENOENT, "trailing slash is another path");
    is_int(match(r, GET, "/plaintex", &m), -ENOENT, "shorter path");
    is_int(match(r, GET, "/", &m), 0, "root");
    ok(m.target == &T_EXACT2, "root target");
    is_int(match(r, ROUTER_METHOD_BIT(HTTP_OTHER), "/", &m), 0, "any-method route takes OTHER");

    is_int(match(r, GET, "/users/42", &m), 0, "int param");
    ok(m.target == &T_USERS_INT, "int beats str");
    is_int(m.num_params, 1, "one param");
    is_mem(m.params[0].name.ptr, m.params[0].name.len, "id", "param name");
    is_mem(m.params[0].value.ptr, m.params[0].value.len, "42", "param value");
    is_int(m.params[0].ival, 42, "param ival");
    is_int(match(r, GET, "/users/-7", &m), 0, "negative int");
    is_int(m.params[0].ival, -7, "negative ival");
    is_int(match(r, GET, "/users/9223372036854775807", &m), 0, "INT64_MAX");
    ok(m.target == &T_USERS_INT && m.params[0].ival == INT64_MAX, "INT64_MAX is an int");
    is_int(match(r, GET, "/users/-9223372036854775808", &m), 0, "INT64_MIN");
    ok(m.target == &T_USERS_INT && m.params[0].ival == INT64_MIN, "INT64_MIN is an int");
    is_int(match(r, GET, "/users/9223372036854775808", &m), 0, "INT64_MAX+1");
    ok(m.target == &T_USERS_STR, "out of range int falls to str");
    is_int(match(r, GET, "/users/99999999999999999999", &m), 0, "20 digits");
    ok(m.target == &T_USERS_STR, "20 digits is a str");
    is_int(match(r, GET, "/users/12a", &m), 0, "not an int");
    ok(m.target == &T_USERS_STR, "12a is a str");
    is_mem(m.params[0].name.ptr, m.params[0].name.len, "name", "str param name");
    is_int(m.params[0].ival, 0, "str ival is 0");
    is_int(match(r, GET, "/users/-", &m), 0, "lone minus");
    ok(m.target == &T_USERS_STR, "lone minus is a str");
    is_int(match(r, GET, "/users/me", &m), 0, "static segment");
    ok(m.target == &T_USERS_ME && m.num_params == 0, "static beats params");
    is_int(match(r, GET, "/users/", &m), -ENOENT, "empty segment matches no str param");
    is_int(match(r, GET, "/users/1/x", &m), -ENOENT, "too many segments");
    is_int(match(r, GET, "/users", &m), -ENOENT, "too few segments");

    is_int(match(r, GET, "/files/a/b/c.txt", &m), 0, "path param");
    ok(m.target == &T_FILES_PATH, "path target");
    is_mem(m.params[0].value.ptr, m.params[0].value.len, "a/b/c.txt", "path param takes slashes");
    is_int(match(r, GET, "/files/", &m), 0, "empty path param");
    is_int(m.params[0].value.len, 0, "empty rest");
    is_int(match(r, GET, "/files", &m), -ENOENT, "no slash, no path param");

    is_int(match(r, GET, "/a/b/c", &m), 0, "deep: static first");
    ok(m.target == &T_DEEP1, "static at position 1 beats a param there");
    is_mem(m.params[0].value.ptr, m.params[0].value.len, "b", "x=b");
    is_int(match(r, GET, "/a/b/d", &m), 0, "deep: backtrack");
    ok(m.target == &T_DEEP2, "backtracks to the param branch");
    is_int(m.num_params, 2, "two params");
    is_mem(m.params[0].name.ptr, m.params[0].name.len, "y", "first name");
    is_mem(m.params[0].value.ptr, m.params[0].value.len, "a", "y=a");
    is_mem(m.params[1].name.ptr, m.params[1].name.len, "z", "second name");
    is_mem(m.params[1].value.ptr, m.params[1].value.len, "d", "z=d");

    is_int(match(r, GET, "", &m), -ENOENT, "empty path");
    is_int(match(r, GET, "*", &m), -ENOENT, "asterisk form");
    router_free(r);
}

static void test_methods_and_405(void)
{
    struct router *r;
    router_new(&r);
    is_int(add(r, ROUTER_PATH, "/x", GET, &T_GET_ONLY), 0, "GET /x");
    is_int(add(r, ROUTER_PATH, "/x", POST, &T_POST_ONLY), 0, "POST /x (same path, other method)");
    is_int(add(r, ROUTER_PATH, "/x", GET | PUT, &T_ANY), -EEXIST, "GET|PUT /x overlaps");
    ok(strstr(errbuf, "/x") != NULL, "EEXIST message names the route: %s", errbuf);
    is_int(add(r, ROUTER_PATH, "/x", ROUTER_ANY_METHOD, &T_ANY), -EEXIST, "any overlaps");
    is_int(add(r, ROUTER_PATH, "/u/{id:int}", DELETE, &T_USERS_INT), 0, "DELETE /u/{id:int}");
    is_int(add(r, ROUTER_PATH, "/u/{other:int}", DELETE, &T_ANY), -EEXIST,
           "same pattern with other names overlaps");
    is_int(add(r, ROUTER_PATH, "/u/{name}", PUT, &T_USERS_STR), 0, "PUT /u/{name}");
    is_int(add(r, ROUTER_REGEX, "/u/[0-9]+", POST, &T_REGEX1), 0, "POST regex /u/[0-9]+");
    is_int(add(r, ROUTER_PREFIX, "/u", GET, &T_PREFIX_API), 0, "GET prefix /u");

    struct router_match m;
    is_int(match(r, POST, "/x", &m), 0, "POST /x");
    ok(m.target == &T_POST_ONLY, "POST target");
    is_int(match(r, PUT, "/x", &m), -ENOTSUP, "PUT /x is 405");
    is_int(m.allow, GET | POST, "allow GET|POST");
    char buf[96];
    size_t n = router_format_allow(m.allow, buf, sizeof(buf));
    is_mem(buf, n, "GET, HEAD, POST", "Allow lists HEAD with GET");

    /* /u/7: int DELETE, str PUT, regex POST, prefix GET: each method finds its own route. */
    is_int(match(r, DELETE, "/u/7", &m), 0, "DELETE /u/7");
    ok(m.target == &T_USERS_INT, "int route");
    is_int(match(r, PUT, "/u/7", &m), 0, "PUT /u/7: int route skipped, str route");
    ok(m.target == &T_USERS_STR, "str route takes PUT");
    is_int(match(r, POST, "/u/7", &m), 0, "POST /u/7 falls to the regex");
    ok(m.target == &T_REGEX1 && m.kind == ROUTER_REGEX, "regex route takes POST");
    is_int(match(r, GET, "/u/7", &m), 0, "GET /u/7 falls to the prefix");
    ok(m.target == &T_PREFIX_API && m.kind == ROUTER_PREFIX, "prefix takes GET");
    is_int(m.prefix_len, 2, "prefix_len");
    is_int(match(r, ROUTER_METHOD_BIT(HTTP_PATCH), "/u/7", &m), -ENOTSUP, "PATCH /u/7 is 405");
    is_int(m.allow, GET | POST | PUT | DELETE, "Allow across all four kinds");
    n = router_format_allow(m.allow, buf, sizeof(buf));
    is_mem(buf, n, "GET, HEAD, POST, PUT, DELETE", "Allow text");
    is_int(match(r, ROUTER_METHOD_BIT(HTTP_PATCH), "/u/abc", &m), -ENOTSUP, "PATCH /u/abc");
    is_int(m.allow, GET | PUT, "regex does not match /u/abc");
    is_int(match(r, GET, "/nothing", &m), -ENOENT, "404");
    is_int(m.allow, 0, "no allow on 404");
    router_free(r);
}

static void test_regex(void)
{
    struct router *r;
    router_new(&r);
    is_int(add(r, ROUTER_REGEX, "/item/([a-z]+)/([0-9]+)", GET, &T_REGEX1), 0, "two groups");
    is_int(add(r, ROUTER_REGEX, "^.*", ROUTER_ANY_METHOD, &T_REGEX2), 0, "a catch-all ^.*");
    is_int(add(r, ROUTER_REGEX, "/item/([a-z]+)/([0-9]+)", POST, &T_ANY), 0,
           "same regex, other method");
    is_int(add(r, ROUTER_REGEX, "/item/([a-z]+)/([0-9]+)", GET, &T_ANY), -EEXIST,
           "same regex, same method");
    is_int(add(r, ROUTER_REGEX, "/bad(", GET, &T_ANY), -EINVAL, "unbalanced paren");
    ok(strstr(errbuf, "bad regex") != NULL && strlen(errbuf) > 20, "regerror text: %s", errbuf);
    is_int(add(r, ROUTER_REGEX, "a)(b", GET, &T_ANY), -EINVAL, "stray ')' is not paired with ours");
    is_int(add(r, ROUTER_PATH, "/exact", GET, &T_EXACT), 0, "an exact path too");
    static const char *const stacked[] = {"/a++",   "/a*+",   "/a+{2}",
                                          "/a{2}*", "/(b)?*", "/a++++++++++++++++++++++++++++++,"};
    for (size_t i = 0; i < N_ELEMENTS(stacked); i++) {
        is_int(add(r, ROUTER_REGEX, stacked[i], GET, &T_ANY), -EINVAL, stacked[i]);
        ok(strstr(errbuf, "repetition") != NULL, "message: %s", errbuf);
    }
    static const char *const fine[] = {"/a\\++",         "/[+*]+",         "/[]+]*",
                                       "/[^]*]?",        "/[[:alpha:]+]*", "/[[:alpha:]*+]",
                                       "/[[:alpha:](]*", "/(a+)+",         "/a{1,3}b*"};
    for (size_t i = 0; i < N_ELEMENTS(fine); i++)
        is_int(add(r, ROUTER_REGEX, fine[i], GET, &T_ANY), 0, fine[i]);

    /* The literal prefilter must never reject a path the regex would match. Four cases a line,
     * in columns. */
    /* clang-format off */
    static const struct {
        const char *re, *lit;
    } lits[] = {
        {"/item/([a-z]+)", "/item/"}, {"^/abc", "/abc"},   {"/abc*", "/ab"},  {"/ab?c", "/a"},
        {"/ab{2}", "/a"},             {"/ab+", "/ab"},     {"/a|/b", ""},      {"^.*", ""},
        {"(/x)", ""},                 {"/a\\.b", "/a"},   {"/a[bc]", "/a"},   {"/x$", "/x"},
    };
    /* clang-format on */
    for (size_t i = 0; i < N_ELEMENTS(lits); i++) {
        size_t off, n;
        router__regex_literal(lits[i].re, strlen(lits[i].re), &off, &n);
        is_mem(lits[i].re + off, n, lits[i].lit, lits[i].re);
    }
    struct router_match m;
    is_int(match(r, GET, "/item/abc/12", &m), 0, "regex match");
    ok(m.target == &T_REGEX1, "first regex wins (registration order)");
    is_int(m.num_params, 2, "two params");
    is_mem(m.params[0].name.ptr, m.params[0].name.len, "1", "name 1");
    is_mem(m.params[0].value.ptr, m.params[0].value.len, "abc", "group 1");
    is_mem(m.params[1].name.ptr, m.params[1].name.len, "2", "name 2");
    is_mem(m.params[1].value.ptr, m.params[1].value.len, "12", "group 2");
    is_int(match(r, GET, "/item/abc/12/more", &m), 0, "anchored: falls to ^.*");
    ok(m.target == &T_REGEX2, "anchored on the whole path");
    is_int(match(r, GET, "/x/item/abc/12", &m), 0, "anchored at the start");
    ok(m.target == &T_REGEX2, "anchored start");
    is_int(match(r, POST, "/item/abc/12", &m), 0, "POST registration");
    ok(m.target == &T_ANY, "POST target");
    is_int(match(r, GET, "/exact", &m), 0, "exact beats regex");
    ok(m.target == &T_EXACT, "exact target");
    is_int(match(r, ROUTER_METHOD_BIT(HTTP_OTHER), "/anything", &m), 0, "any method regex");
    router_free(r);

    /* The pattern is compiled as written. Wrapped in "^(" ")$", glibc's literal ')' paired
     * with the wrapper: "/a)|/b" meant "starts with /a or ends with /b)", and group numbers
     * (backreferences too) were off by one. */
    router_new(&r);
    is_int(add(r, ROUTER_REGEX, "/a)|/b", GET, &T_REGEX1), 0, "a literal ')' (glibc)");
    is_int(add(r, ROUTER_REGEX, "/x/(a)(b)\\2", GET, &T_REGEX2), 0, "a backreference");
    is_int(add(r, ROUTER_REGEX, "/y/(a)\\1", GET, &T_ANY), 0, "\\1 is the first group");
    is_int(match(r, GET, "/b", &m), 0, "second branch, whole path");
    is_int(match(r, GET, "/a)", &m), 0, "first branch as written");
    is_int(match(r, GET, "/admin/secret", &m), -ENOENT, "no longer 'starts with /a'");
    is_int(match(r, GET, "/a", &m), -ENOENT, "'/a' alone is not the pattern");
    is_int(match(r, GET, "/x/abb", &m), 0, "\\2 is the user's second group");
    ok(m.target == &T_REGEX2 && m.num_params == 2, "two groups, as written");
    is_int(match(r, GET, "/x/aba", &m), -ENOENT, "not the shifted group");
    is_int(match(r, GET, "/y/aa", &m), 0, "\\1 matches");
    router_free(r);

    /* More groups than ROUTER_MAX_PARAMS are refused (they used to be dropped silently);
     * exactly 16 are all reported. */
    router_new(&r);
    char pat[256] = "";
    for (int i = 0; i < 17; i++)
        strcat(pat, "/([a-z])");
    is_int(add(r, ROUTER_REGEX, pat, GET, &T_REGEX1), -EINVAL, "17 groups refused");
    ok(strstr(errbuf, "17 groups, at most 16") != NULL, "message: %s", errbuf);
    pat[strlen(pat) - 8] = '\0';
    is_int(add(r, ROUTER_REGEX, pat, GET, &T_REGEX1), 0, "16 groups");
    is_int(match(r, GET, "/a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p", &m), 0, "16 group match");
    is_int(m.num_params, ROUTER_MAX_PARAMS, "all 16");
    is_mem(m.params[15].name.ptr, m.params[15].name.len, "16", "name 16");
    is_mem(m.params[15].value.ptr, m.params[15].value.len, "p", "group 16");
    /* An optional group that did not take part is an empty value. */
    is_int(add(r, ROUTER_REGEX, "/opt(/x)?", GET, &T_REGEX2), 0, "optional group");
    is_int(match(r, GET, "/opt", &m), 0, "optional group unmatched");
    ok(m.num_params == 1 && m.params[0].value.len == 0, "unmatched group is empty");
    router_free(r);
}

/* A route that names HEAD answers HEAD, even when a GET route on the same pattern (which would
 * answer HEAD implicitly) was registered first. */
static void test_explicit_head_wins(void)
{
    struct router *r;
    router_new(&r);
    struct router_match m;
    is_int(add(r, ROUTER_PATH, "/a", GET, &T_EXACT), 0, "GET /a");
    is_int(add(r, ROUTER_PATH, "/a", HEAD, &T_ANY), 0, "HEAD /a, registered after");
    is_int(match(r, HEAD, "/a", &m), 0, "HEAD /a");
    ok(m.target == &T_ANY, "the HEAD route, not the GET one");
    is_int(match(r, GET, "/a", &m), 0, "GET /a");
    ok(m.target == &T_EXACT, "GET still the GET route");
    is_int(add(r, ROUTER_PREFIX, "/f/", GET, &T_PREFIX_API), 0, "GET prefix");
    is_int(add(r, ROUTER_PREFIX, "/f/", HEAD, &T_PREFIX_ROOT), 0, "HEAD prefix");
    is_int(match(r, HEAD, "/f/x", &m), 0, "HEAD /f/x");
    ok(m.target == &T_PREFIX_ROOT, "prefixes too");
    router_free(r);
}

static void test_prefix(void)
{
    struct router *r;
    router_new(&r);
    is_int(add(r, ROUTER_PREFIX, "/", ROUTER_ANY_METHOD, &T_PREFIX_ROOT), 0, "prefix /");
    is_int(add(r, ROUTER_PREFIX, "/api/", GET, &T_PREFIX_API), 0, "prefix /api/");
    is_int(add(r, ROUTER_PREFIX, "/api", GET, &T_ANY), -EEXIST, "/api is the same as /api/");
    is_int(add(r, ROUTER_PREFIX, "/api/v2", GET, &T_DEEP1), 0, "prefix /api/v2");
    is_int(add(r, ROUTER_PREFIX, "/fibonacci", GET, &T_DEEP2), 0, "prefix /fibonacci");
    is_int(add(r, ROUTER_PREFIX, "nope", GET, &T_ANY), -EINVAL, "prefix without '/'");

    struct router_match m;
    is_int(match(r, GET, "/api", &m), 0, "/api");
    ok(m.target == &T_PREFIX_API && m.prefix_len == 4, "/api itself matches the prefix");
    is_int(match(r, GET, "/api/users", &m), 0, "/api/users");
    ok(m.target == &T_PREFIX_API, "/api/users");
    is_int(match(r, GET, "/apix", &m), 0, "/apix");
    ok(m.target == &T_PREFIX_ROOT && m.prefix_len == 0, "/apix does NOT match /api (boundary)");
    is_int(match(r, GET, "/api/v2/x", &m), 0, "/api/v2/x");
    ok(m.target == &T_DEEP1 && m.prefix_len == 7, "longest prefix wins");
    is_int(match(r, GET, "/api/v20", &m), 0, "/api/v20");
    ok(m.target == &T_PREFIX_API, "/api/v20 is under /api, not /api/v2");
    is_int(match(r, POST, "/api/v2/x", &m), 0, "POST /api/v2/x");
    ok(m.target == &T_PREFIX_ROOT, "method miss falls to a shorter prefix");
    is_int(match(r, GET, "/fibonacci", &m), 0, "a Lwan-style url map");
    ok(m.target == &T_DEEP2, "/fibonacci");
    is_int(match(r, GET, "*", &m), 0, "root prefix matches anything");
    router_free(r);

    router_new(&r);
    is_int(add(r, ROUTER_PREFIX, "/static", GET, &T_PREFIX_API), 0, "only /static");
    is_int(match(r, GET, "/", &m), -ENOENT, "/ is not under /static");
    is_int(match(r, POST, "/static/a", &m), -ENOTSUP, "405 from a prefix");
    is_int(m.allow, GET, "allow GET");
    router_free(r);
}

static void test_pattern_errors(void)
{
    struct router *r;
    router_new(&r);
    static const struct {
        const char *pattern;
        const char *needle; /* expected in the message */
    } bad[] = {
        {"/users/{id:float}", "unknown parameter type"},
        {"/users/{id", "unbalanced brace"},
        {"/users/id}", "unbalanced brace"},
        {"/users/}id{", "unbalanced brace"},
        {"/users/{{id}}", "unbalanced brace"},
        {"/users/x{id}", "whole segment"},
        {"/users/{id}.json", "whole segment"},
        {"/{a}/{a:int}", "duplicate parameter name"},
        {"/{rest:path}/x", "last segment"},
        {"/{}", "no name"},
        {"/{:int}", "no name"},
        {"/{a-b}", "letters, digits"},
        {"users", "does not start with '/'"},
        {"", "does not start with '/'"},
        {"/{a}/{b}/{c}/{d}/{e}/{f}/{g}/{h}/{i}/{j}/{k}/{l}/{m}/{n}/{o}/{p}/{q}", "more than"},
    };
    for (size_t i = 0; i < N_ELEMENTS(bad); i++) {
        errbuf[0] = '\0';
        is_int(add(r, ROUTER_PATH, bad[i].pattern, GET, &T_ANY), -EINVAL, bad[i].pattern);
        ok(strstr(errbuf, bad[i].needle) != NULL, "message for '%s': %s", bad[i].pattern, errbuf);
    }
    is_int(router_add(r, ROUTER_PATH, "/a\0b", 4, GET, &T_ANY, errbuf, sizeof(errbuf)), -EINVAL,
           "NUL in a pattern");
    is_int(router_add(r, ROUTER_PATH, "/ok", 3, GET, &T_ANY, NULL, 0), 0, "err may be NULL");
    is_int(router_add(r, ROUTER_PATH, "/{x:nope}", 9, GET, &T_ANY, NULL, 0), -EINVAL,
           "error with err NULL");
    is_int(router_add(r, (enum router_match_kind)42, "/k", 2, GET, &T_ANY, errbuf, sizeof(errbuf)),
           -EINVAL, "unknown kind");
    /* 16 parameters is the limit, not an error. */
    is_int(add(r, ROUTER_PATH, "/{a}/{b}/{c}/{d}/{e}/{f}/{g}/{h}/{i}/{j}/{k}/{l}/{m}/{n}/{o}/{p}",
               GET, &T_DEEP1),
           0, "16 params");
    struct router_match m;
    is_int(match(r, GET, "/1/2/3/4/5/6/7/8/9/10/11/12/13/14/15/16", &m), 0, "16 params match");
    is_int(m.num_params, 16, "16 params captured");
    is_mem(m.params[15].name.ptr, m.params[15].name.len, "p", "16th name");
    is_mem(m.params[15].value.ptr, m.params[15].value.len, "16", "16th value");
    /* Patterns not NUL-terminated: only len bytes are read. */
    is_int(router_add(r, ROUTER_PATH, "/abcdef", 4, GET, &T_EXACT, errbuf, sizeof(errbuf)), 0,
           "pattern taken as (ptr, len)");
    is_int(match(r, GET, "/abc", &m), 0, "/abc registered");
    ok(m.target == &T_EXACT, "/abc target");
    router_free(r);
}

static void test_format_allow(void)
{
    char buf[96];
    size_t n = router_format_allow(0, buf, sizeof(buf));
    is_int(n, 0, "empty mask");
    is_mem(buf, n, "", "empty string");
    n = router_format_allow(HEAD, buf, sizeof(buf));
    is_mem(buf, n, "HEAD", "HEAD alone");
    n = router_format_allow(~0u, buf, sizeof(buf));
    is_mem(buf, n, "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, CONNECT, TRACE", "all");
    ok(n < 96, "96 bytes suffice (%zu)", n);
    char small[8];
    memset(small, 'x', sizeof(small));
    n = router_format_allow(GET | POST, small, sizeof(small));
    is_int(n, strlen("GET, HEAD, POST"), "full length returned when truncated");
    is_mem(small, strlen(small), "GET, HE", "truncated and NUL-terminated");
    n = router_format_allow(GET, NULL, 0);
    is_int(n, strlen("GET, HEAD"), "size 0 only measures");
}

/* Many exact routes force the hash table to grow; every one must still be found. */
static void test_many_routes(void)
{
    struct router *r;
    router_new(&r);
    static char targets[1000];
    char path[64];
    for (int i = 0; i < 1000; i++) {
        int len = snprintf(path, sizeof(path), "/route/%d/x", i);
        if (router_add(r, ROUTER_PATH, path, (size_t)len, GET, &targets[i], NULL, 0) != 0)
            break;
    }
    int found = 0;
    struct router_match m;
    for (int i = 0; i < 1000; i++) {
        snprintf(path, sizeof(path), "/route/%d/x", i);
        found += match(r, GET, path, &m) == 0 && m.target == &targets[i];
    }
    is_int(found, 1000, "1000 exact routes found after growth");
    is_int(match(r, GET, "/route/1000/x", &m), -ENOENT, "unknown one is 404");
    router_free(r);
}

/* Concurrent readers: router_match must not write anything shared (the contract says any number
 * of threads may match at once). Each thread checks every answer; under TSan (build this file
 * with -fsanitize=thread) a hidden write would be reported as a race. */
#include <pthread.h>

static struct router *shared_router;

static void *reader(void *arg)
{
    /* One case a line. */
    /* clang-format off */
    static const struct {
        const char *path;
        unsigned method;
        int rc;
        const void *target;
    } cases[] = {
        {"/plaintext", GET, 0, &T_EXACT},
        {"/users/42", GET, 0, &T_USERS_INT},
        {"/users/bob", GET, 0, &T_USERS_STR},
        {"/item/abc/12", GET, 0, &T_REGEX1},
        {"/api/x", GET, 0, &T_PREFIX_API},
        {"/plaintext", POST, -ENOTSUP, NULL},
        {"/none", GET, -ENOENT, NULL},
    };
    /* clang-format on */
    long bad = 0;
    for (int i = 0; i < 20000; i++) {
        size_t k = (size_t)(i + (intptr_t)arg) % N_ELEMENTS(cases);
        struct router_match m;
        int rc = router_match(shared_router, cases[k].method, cases[k].path, strlen(cases[k].path),
                              &m);
        bad += rc != cases[k].rc || (rc == 0 && m.target != cases[k].target);
    }
    return (void *)bad;
}

static void test_concurrent_readers(void)
{
    router_new(&shared_router);
    add(shared_router, ROUTER_PATH, "/plaintext", GET, &T_EXACT);
    add(shared_router, ROUTER_PATH, "/users/{id:int}", GET, &T_USERS_INT);
    add(shared_router, ROUTER_PATH, "/users/{name}", GET, &T_USERS_STR);
    add(shared_router, ROUTER_REGEX, "/item/([a-z]+)/([0-9]+)", GET, &T_REGEX1);
    add(shared_router, ROUTER_PREFIX, "/api", GET, &T_PREFIX_API);
    pthread_t th[4];
    for (intptr_t i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, reader, (void *)i);
    long bad = 0;
    for (int i = 0; i < 4; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        bad += (long)ret;
    }
    is_int(bad, 0, "4 threads x 20000 concurrent matches all correct");
    router_free(shared_router);
}

int main(void)
{
    test_exact_and_patterns();
    test_methods_and_405();
    test_regex();
    test_explicit_head_wins();
    test_prefix();
    test_pattern_errors();
    test_format_allow();
    test_many_routes();
    test_concurrent_readers();
    return done_testing();
}
