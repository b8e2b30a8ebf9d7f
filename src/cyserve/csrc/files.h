/* files.h: the logic of serving static files from a directory (app.files(prefix, directory)).
 *
 * Pure logic and syscalls: this module never writes HTTP. The engine asks files_open for the file
 * behind a request path, then uses the conditional and range helpers to choose between 200, 206,
 * 304 and 416, and sends the body with sendfile from hit.fd.
 *
 * Security rules of files_open (each one tested in tests/c/test_files.c):
 *   - the relative path is percent-decoded once; an invalid escape ("%zz", "%4") is -EINVAL (400);
 *     an encoded NUL ("%00") is -EINVAL; an encoded '/' ("%2F", "%2f") is -EINVAL, because a
 *     slash that is not a segment separator has no meaning on a file system and "..%2f" is a
 *     classic traversal vector (Apache's AllowEncodedSlashes Off does the same);
 *   - the decoded path is normalised lexically: empty segments ("//") and "." are dropped, ".."
 *     removes the previous segment; a ".." that would climb above the root is -EINVAL (400), as
 *     nginx does;
 *   - the file is opened beneath the root with openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
 *     when the kernel has it (Linux >= 5.6). Symlinks that stay inside the root are followed; one
 *     that leads outside is -ENOENT (404: the answer does not reveal that the link exists).
 *     Without openat2 the fallback opens the normalised path relative to the root's fd and then
 *     checks where the descriptor really is (readlink of /proc/self/fd/N, which the kernel
 *     resolves) against the root's real path: no check-then-use race, same answers but one: an
 *     ABSOLUTE symlink is refused by RESOLVE_BENEATH (404) even when it points back inside the
 *     root, while the fallback follows it there. Links meant to be served should be relative;
 *   - only regular files are served (opened O_NONBLOCK, so a FIFO cannot block the worker);
 *     a directory is served by its index.html if that is a regular file, else -ENOENT;
 *   - a file the server may not read (EACCES/EPERM from open) is -EACCES (403, like nginx).
 *
 * Threads: files_open and the helpers are thread-safe (the root is immutable after
 * files_root_new); every call is a few blocking syscalls on a local file system. */
#ifndef CYSERVE_FILES_H
#define CYSERVE_FILES_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "http_date.h"

struct files_root;

/* IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT" is 29 bytes; FILES_DATE_SIZE counts the NUL. */
#define FILES_DATE_SIZE HTTP_DATE_SIZE
/* A quoted ETag "\"<size hex>-<mtime_ns hex>[-<encoding>]\"" is at most 1 + 16 + 1 + 16 + 5 + 1
 * bytes. */
#define FILES_ETAG_SIZE 48

struct files_hit {
    int fd;                     /* open, O_RDONLY|O_CLOEXEC; the caller closes it */
    uint64_t size;              /* bytes */
    time_t mtime;               /* seconds since the epoch */
    int64_t mtime_ns;           /* nanoseconds since the epoch */
    char etag[FILES_ETAG_SIZE]; /* strong ETag, quoted, NUL-terminated */
    size_t etag_len;
    char last_modified[FILES_DATE_SIZE]; /* IMF-fixdate of mtime, NUL-terminated */
    const char *content_type;            /* static string, e.g. "text/html; charset=utf-8" */
    size_t content_type_len;
    unsigned encoding; /* files_open_negotiated: the FILES_ENC_* bit of the sibling opened, or 0
                        * (files_open: always 0) */
    int vary;          /* files_open_negotiated: 1 when the file has a precompressed sibling,
                        * whether or not it was chosen (the answer then says Vary) */
};

/* The precompressed siblings a root may serve in place of a file x: x.br, x.zst, x.gz. */
enum { FILES_ENC_BR = 1, FILES_ENC_ZSTD = 2, FILES_ENC_GZIP = 4, FILES_ENC_ALL = 7 };

/* What a request's Accept-Encoding lines say of each sibling's encoding, as q-values in
 * thousandths (RFC 9110 12.5.3). Zero it, then give it every line with files_accept_add. */
struct files_accept {
    int q[3]; /* br, zstd, gzip: the q-value named for each, -1 when not named */
    int star; /* the q-value of "*", -1 when not named */
};

/* Opens the directory path (NUL-terminated) as a root. Returns 0 and *out, -ENOTDIR, -ENOENT,
 * -EACCES, -ENOMEM or another -errno from open. Build time. */
int files_root_new(const char *path, struct files_root **out);

/* An extension (without its dot, any case) and the Content-Type of the files that end with it. */
struct files_type {
    const char *ext;
    const char *type;
};

/* The longest extension a table may hold; a longer one is served as application/octet-stream. */
#define FILES_EXT_MAX 31

/* Gives root its own table of content types (n entries, copied: the caller's strings may go once
 * this returns), replacing the built-in one of about twenty types. The Python layer passes the
 * table it builds once from the standard library's mimetypes when the routes are built. Returns
 * 0, -EINVAL (an empty extension, one with a '.', or one over FILES_EXT_MAX bytes) or -ENOMEM,
 * with the root's table unchanged on error. Build time, before the root serves. */
int files_root_set_types(struct files_root *root, const struct files_type *types, size_t n);

/* The Content-Type of the file named path (its last extension, case-insensitive, through the
 * root's table): a static string owned by the root, "application/octet-stream" when the
 * extension is unknown or missing. Thread-safe. */
const char *files_root_content_type(const struct files_root *root, const char *path);

/* Which precompressed siblings root looks for (FILES_ENC_* bits; 0, the default, none). The
 * Python layer sets the encodings whose siblings it found in the directory when the routes were
 * built, so that a tree without any costs nothing per request. Build time. */
void files_root_set_encodings(struct files_root *root, unsigned encodings);

/* The bits files_root_set_encodings set. Thread-safe. */
unsigned files_root_encodings(const struct files_root *root);

/* Starts acc as if no Accept-Encoding line were present (nothing is accepted but identity). */
void files_accept_init(struct files_accept *acc);

/* Adds one Accept-Encoding field line v[0..len): a list of codings with optional ";q=" weights
 * ("br;q=1.0, gzip;q=0.5, *;q=0"). "x-gzip" is gzip. An element whose q-value does not parse is
 * ignored; a coding named twice keeps its last q. Thread-safe (acc is the caller's). */
void files_accept_add(struct files_accept *acc, const char *v, size_t len);

/* Like files_open, then: when the file has a sibling the root looks for (x.br, x.zst, x.gz,
 * opened by the same rules, a regular file) whose encoding acc gives a q-value above 0, the
 * sibling with the highest q (ties: br, then zstd, then gzip, the smallest first) is opened in
 * its place: hit's fd, size, mtime, Last-Modified are the sibling's, its Content-Type is the
 * file's, its ETag is the sibling's with the encoding added ("\"size-mtime-br\""), so that no
 * two encodings share one, and hit->encoding names it. hit->vary is 1 when any sibling the root
 * looks for exists. The same returns as files_open (a sibling that cannot be opened is skipped,
 * never an error). One open per sibling looked for, only when the root looks for any. Uses about
 * 1 KiB of stack more than files_open. Thread-safe. */
int files_open_negotiated(const struct files_root *root, const char *rel, size_t len,
                          const struct files_accept *acc, struct files_hit *hit);

/* The Content-Encoding token of a FILES_ENC_* bit ("br", "zstd", "gzip"), NULL for 0. */
const char *files_encoding_name(unsigned encoding);

/* Closes the root's fd and frees it. NULL is accepted. */
void files_root_free(struct files_root *root);

/* Opens the file named by rel[0..len) (the request path after the route's prefix, not
 * percent-decoded, no query; a leading '/' is optional; need not be NUL-terminated) beneath the
 * root, following the rules above. Returns 0 with *hit filled and hit->fd open; -ENOENT (404);
 * -EACCES (403); -EINVAL (400); rarely another -errno from open/fstat (EMFILE, ENFILE, ENOMEM,
 * EIO: the server's trouble; the engine answers 503 for the first three, 500 else). A path
 * longer than 1023 bytes once decoded is -ENOENT. On error no fd is left open. Uses about 1.5 KiB
 * of stack (5.5 KiB on the fallback path). Thread-safe. */
int files_open(const struct files_root *root, const char *rel, size_t len, struct files_hit *hit);

/* Whether the engine should answer 304 Not Modified to a GET/HEAD, per RFC 9110 13.2.2: if
 * If-None-Match is present (inm != NULL), it alone decides: 1 when one of its entity tags matches
 * hit->etag by weak comparison, or it is "*"; If-Modified-Since (ims != NULL) is then ignored.
 * Otherwise 1 when If-Modified-Since parses as an HTTP date (any of RFC 9110's three forms) and
 * mtime <= that date; an unparseable date is ignored (0). Returns 1 or 0 (a predicate).
 * Thread-safe. */
int files_not_modified(const struct files_hit *hit, const char *inm, size_t inm_len,
                       const char *ims, size_t ims_len);

/* Whether to honour a Range given with If-Range (RFC 9110 13.1.5), so that a client resuming
 * a download of a file that changed meanwhile gets the whole new file (200) instead of a piece of
 * it spliced onto the old one. value == NULL (no If-Range): 1. An entity tag: 1 when it equals
 * hit->etag by STRONG comparison (a W/ tag never matches). A date: 1 when it is an HTTP date
 * exactly equal to hit->mtime. Anything else: 0 (ignore Range, serve 200). A predicate.
 * Thread-safe. */
int files_if_range(const struct files_hit *hit, const char *value, size_t len);

/* Parses a Range header value for a representation of size bytes. Accepts exactly one range:
 * "bytes=a-b", "bytes=a-" or "bytes=-n" (unit case-insensitive, spaces around '=' and '-' not
 * allowed, b past the end clamped to size-1). Returns 0 with [*start, *end] (end INCLUSIVE) for a
 * 206; -ERANGE for a 416 (a syntactically valid single range that is not satisfiable: a >= size,
 * "bytes=-0", or size == 0); 1 to ignore the header and serve 200 (another unit, several ranges,
 * anything unparseable, a > b). Thread-safe. */
int files_parse_range(const char *value, size_t len, uint64_t size, uint64_t *start, uint64_t *end);


#endif
