/* router.h: maps a request's method and path to a target (a handler slot owned by the engine).
 *
 * Four kinds of routes, tried in this order of precedence (the first route whose path AND method
 * match wins):
 *   1. exact paths ("/plaintext"): one hash-table probe, no per-segment work;
 *   2. typed patterns ("/users/{id:int}", "/files/{rest:path}"): a segment trie searched
 *      depth-first; at each position a static segment is tried before an int parameter, an int
 *      before a str parameter, and a str before a path parameter, so the most specific route wins;
 *   3. regex routes (POSIX ERE), in registration order;
 *   4. prefix routes (a Lwan-style url map), longest prefix first.
 * A route whose path matches but whose method does not is skipped, and its methods are added to
 * the Allow set; when no route matches both, the answer is 405 with that Allow set if any route
 * matched the path, else 404. HEAD matches every route that accepts GET.
 *
 * Path syntax of ROUTER_PATH patterns: a path starts with '/'; segments are split on '/'. A segment
 * is either static text or exactly one parameter filling the whole segment:
 *   {name} or {name:str}  one non-empty segment (no '/');
 *   {name:int}            an optional '-' and 1..19 decimal digits that fit in int64_t
 *                         (the value is also parsed into cyserve_param.ival);
 *   {name:path}           the rest of the path, slashes included, possibly empty; last only.
 * A pattern with no parameter is an exact path. Percent-decoding is not applied to the path:
 * patterns are matched against the bytes as received.
 *
 * Prefix rule: a prefix matches on segment boundaries only. The prefix is stored without a
 * trailing '/' ("/api/" and "/api" are the same prefix); it matches the path "/api" and every path
 * that starts with "/api/", but not "/apix". The prefix "/" (or "") matches every path.
 * router_match.prefix_len is the length of the matched prefix without the trailing '/', so
 * path + prefix_len is the remainder: "" or a string starting with '/'.
 *
 * Memory and threads: the router copies every pattern; targets are the caller's and are never
 * dereferenced. router_new/router_add/router_free run on one thread before serving; afterwards
 * the router is immutable and router_match may run on any number of threads at once. */
#ifndef CYSERVE_ROUTER_H
#define CYSERVE_ROUTER_H

#include <stddef.h>

#include "cyserve/handler.h" /* cyserve_param */
#include "http_method.h"     /* method bits are (1u << HTTP_GET) etc. */

struct router;

enum router_match_kind { ROUTER_PATH, ROUTER_PREFIX, ROUTER_REGEX };

#define ROUTER_MAX_PARAMS 16

/* Bit of a method in a methods mask; ROUTER_ANY_METHOD (0) accepts every method, including
 * methods the parser reports as HTTP_OTHER. */
#define ROUTER_METHOD_BIT(m) (1u << (m))
#define ROUTER_ANY_METHOD 0u

/* Creates an empty router. Returns 0 and *out, or -ENOMEM. */
int router_new(struct router **out);

/* Frees the router, its copies of the patterns and its compiled regexes (not the targets).
 * NULL is accepted. No router_match may be running. */
void router_free(struct router *r);

/* Adds a route. pattern[0..len) need not be NUL-terminated. methods: a mask of
 * ROUTER_METHOD_BIT(enum http_method), or 0 for any method.
 * ROUTER_REGEX: POSIX ERE compiled as written with regcomp(REG_EXTENDED); it matches when
 *   regexec's match spans the whole path (the pattern need not start with '^' or end with '$',
 *   though it may); capture groups become params named "1", "2", ... (at most
 *   ROUTER_MAX_PARAMS, more is -EINVAL; an unmatched group gives an empty value). This relies on
 *   POSIX's leftmost-longest rule, which glibc keeps for ordinary patterns (a review compared it
 *   with an explicitly anchored form on 120,000 pattern/path pairs: no difference) but not in
 *   contrived corners: a '^' inside a repeated group under an alternation, or a backreference
 *   after a nullable repeat, can make glibc report a shorter match, and the route then does not
 *   match (a 404, never a wrong route).
 * Returns 0; -EINVAL with a sentence in err (unknown parameter type, unbalanced brace, a parameter
 * that does not fill its segment, duplicate parameter name, {..:path} not last, more than
 * ROUTER_MAX_PARAMS parameters, a pattern not starting with '/', a bad regex with regerror's
 * text); -EEXIST when a route of the same kind and the same pattern (parameter names ignored)
 * already accepts one of these methods; -ENOMEM. err may be NULL or errlen 0.
 * Build time only: one thread, before serving. */
int router_add(struct router *r, enum router_match_kind kind, const char *pattern, size_t len,
               unsigned methods, void *target, char *err, size_t errlen);

struct router_match {
    void *target;
    /* Values are views into the path given to router_match; names point into the router (valid
     * as long as it lives) or, for regex routes, to static strings. */
    cyserve_param params[ROUTER_MAX_PARAMS];
    size_t num_params;
    unsigned allow;    /* on -ENOTSUP: the mask of methods that some route accepts for this path */
    size_t prefix_len; /* for ROUTER_PREFIX: the length of the matched prefix, else 0 */
    enum router_match_kind kind; /* kind of the route that matched */
};

/* Matches path[0..len) (no NUL needed, no strlen) for a method bit ROUTER_METHOD_BIT(method_id).
 * Returns 0 with m->target and the params set; -ENOENT (answer 404); -ENOTSUP (answer 405, with
 * m->allow set; format it with router_format_allow). Thread-safe for concurrent readers. Does not
 * allocate, except inside regexec() when a regex route has to be tried. */
int router_match(const struct router *r, unsigned method_bit, const char *path, size_t len,
                 struct router_match *m);

/* Writes the Allow value for a mask, e.g. "GET, HEAD, POST", into buf (NUL-terminated when size
 * > 0, truncated to fit). HEAD is listed wherever GET is. Returns the full length the value needs
 * (not counting the NUL), snprintf-style. 96 bytes always suffice. Thread-safe. */
size_t router_format_allow(unsigned allow, char *buf, size_t size);

#endif
