/* files.c: static files beneath a root directory, and the HTTP conditional/range rules for them.
 *
 * The path pipeline of files_open, in order, each step for a reason:
 *   1. percent-decode once into a stack buffer (1 KiB). Decoding happens exactly once, so
 *      "%252e" stays the literal name "%2e" and cannot turn into "." at a later stage;
 *   2. normalise lexically (drop "" and ".", resolve ".."); a ".." above the root is a client
 *      error. After this step the path has no "..", so only symlinks could still lead out;
 *   3. open beneath the root's directory fd. With openat2 the kernel enforces the root during
 *      resolution (RESOLVE_BENEATH fails with EXDEV on any escape, through ".." in a symlink's
 *      target or an absolute target; RESOLVE_NO_MAGICLINKS refuses /proc/<pid>/fd-style links).
 *      Without openat2 (kernels before 5.6, or seccomp filters that return ENOSYS) the file is
 *      opened with openat and the descriptor's real path, as the kernel reports it in
 *      /proc/self/fd, must lie under the root's real path. Both check the object actually opened,
 *      so a symlink swapped between a check and the open cannot win a race;
 *   4. fstat the descriptor (not the path) and serve regular files only.
 * Errors are mapped so that a client learns nothing about what lies outside the root: every way
 * out is the same 404 as a missing file. */
#define _GNU_SOURCE
#include "files.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "compat.h"
#include "http_date.h"

struct files_root {
    int fd;           /* O_PATH|O_DIRECTORY */
    bool use_openat2; /* decided once by files_root_new */
    char *real;       /* realpath of the root, for the fallback's check */
    size_t real_len;
    struct files_type *types; /* NULL: the built-in table; else ntypes, sorted by extension */
    size_t ntypes;
    unsigned encodings; /* FILES_ENC_* bits: siblings looked for (files_root_set_encodings) */
};

/* Tests set this to exercise the openat fallback on kernels that have openat2. */
static int files__force_fallback;

/* The longest decoded relative path served (404 beyond). Far below PATH_MAX on purpose:
 * files_open runs on a coroutine stack (64 KiB by default, 16 KiB at least), and URLs to static
 * assets are short. */
#define FILES_PATH_MAX 1024

static const int files__open_flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;

static long files__openat2(int dirfd, const char *path, int flags)
{
    struct open_how how;
    memset(&how, 0, sizeof(how));
    how.flags = (uint64_t)flags;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    return syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
}

int files_root_new(const char *path, struct files_root **out)
{
    struct files_root *root = calloc(1, sizeof(*root));
    if (UNLIKELY(root == NULL))
        return -ENOMEM;
    root->fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (UNLIKELY(root->fd < 0)) {
        int rc = -errno;
        free(root);
        return rc;
    }
    root->real = realpath(path, NULL);
    if (UNLIKELY(root->real == NULL)) {
        int rc = -errno;
        close(root->fd);
        free(root);
        return rc;
    }
    root->real_len = strlen(root->real);
    /* Probe openat2 once: ENOSYS (old kernel) or EPERM (a seccomp filter that does not know the
     * call) mean the fallback. */
    long fd = files__openat2(root->fd, ".", O_PATH | O_CLOEXEC);
    if (fd >= 0) {
        close((int)fd);
        root->use_openat2 = !files__force_fallback;
    }
    *out = root;
    return 0;
}

void files_root_free(struct files_root *root)
{
    if (root == NULL)
        return;
    close(root->fd);
    free(root->real);
    free(root->types);
    free(root);
}

static int files__hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Steps 1 and 2 in one pass: decodes rel into out (size FILES_PATH_MAX) as a relative,
 * normalised path ("." for the root itself). Splitting the raw path on '/' before decoding is
 * the same as splitting the decoded one, because an encoded '/' is refused. Sets *dir_hint when
 * the request path ended with '/'. Returns 0, -EINVAL (bad escape, encoded NUL or '/', climb above
 * the root) or -ENOENT (too long). */
static int files__normalise(const char *rel, size_t len, char *out, bool *dir_hint)
{
    size_t o = 0; /* out[0..o) holds the kept segments joined by '/' */
    size_t i = 0;
    *dir_hint = len > 0 && rel[len - 1] == '/';
    while (i < len) {
        size_t seg_start = o == 0 ? 0 : o + 1; /* where this segment's bytes go */
        size_t k = seg_start;
        for (; i < len && rel[i] != '/'; i++) {
            char c = rel[i];
            if (c == '%') {
                if (UNLIKELY(i + 2 >= len))
                    return -EINVAL;
                int hi = files__hex(rel[i + 1]), lo = files__hex(rel[i + 2]);
                if (UNLIKELY(hi < 0 || lo < 0))
                    return -EINVAL;
                c = (char)(hi * 16 + lo);
                if (UNLIKELY(c == '\0' || c == '/'))
                    return -EINVAL;
                i += 2;
            } else if (UNLIKELY(c == '\0')) {
                return -EINVAL;
            }
            if (UNLIKELY(k + 2 > FILES_PATH_MAX))
                return -ENOENT;
            out[k++] = c;
        }
        i++; /* the '/' (or one past the end) */
        size_t seg_len = k - seg_start;
        const char *seg = out + seg_start;
        if (seg_len == 0 || (seg_len == 1 && seg[0] == '.')) {
            /* "//" and "/./" name the same directory: drop the segment. */
        } else if (seg_len == 2 && seg[0] == '.' && seg[1] == '.') {
            if (UNLIKELY(o == 0))
                return -EINVAL;
            while (o > 0 && out[o - 1] != '/')
                o--;
            if (o > 0)
                o--; /* the separator before the dropped segment */
        } else {
            if (o != 0)
                out[o] = '/';
            o = k;
        }
    }
    if (o == 0)
        out[o++] = '.';
    out[o] = '\0';
    return 0;
}

/* Maps an open error to the contract's codes. */
static int files__open_error(int err)
{
    switch (err) {
    case EACCES:
    case EPERM:
        return -EACCES;
    case EXDEV: /* openat2: resolution would leave the root */
    case ELOOP: /* too many links, or a magic link refused */
    case ENOENT:
    case ENOTDIR:
    case ENAMETOOLONG:
    case ENXIO: /* a socket or a FIFO without a writer */
    case ENODEV:
        return -ENOENT;
    default:
        return -err; /* EMFILE, ENFILE, ENOMEM, EIO: the server's problem (500) */
    }
}

/* Step 3: opens path (relative, normalised) beneath the root. Returns an fd or -errno. */
static int files__open_beneath(const struct files_root *root, const char *path)
{
    if (root->use_openat2) {
        long fd;
        do {
            fd = files__openat2(root->fd, path, files__open_flags);
        } while (fd < 0 && errno == EINTR);
        return fd >= 0 ? (int)fd : files__open_error(errno);
    }
    int fd;
    do {
        fd = openat(root->fd, path, files__open_flags);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return files__open_error(errno);
    char link[32], real[PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, real, sizeof(real));
    /* Under the root means: the root itself, or the root's path followed by '/'. A root of "/"
     * contains everything. */
    bool inside = n > 0 && (size_t)n < sizeof(real) && (size_t)n >= root->real_len &&
                  memcmp(real, root->real, root->real_len) == 0 &&
                  ((size_t)n == root->real_len || real[root->real_len] == '/' ||
                   root->real_len == 1);
    if (UNLIKELY(!inside)) {
        close(fd);
        return -ENOENT;
    }
    return fd;
}

static const struct {
    const char *ext;
    const char *type;
} files__types[] = {
    {"html", "text/html; charset=utf-8"},
    {"htm", "text/html; charset=utf-8"},
    {"css", "text/css; charset=utf-8"},
    {"js", "text/javascript; charset=utf-8"},
    {"mjs", "text/javascript; charset=utf-8"},
    {"json", "application/json"},
    {"txt", "text/plain; charset=utf-8"},
    {"png", "image/png"},
    {"jpg", "image/jpeg"},
    {"jpeg", "image/jpeg"},
    {"gif", "image/gif"},
    {"svg", "image/svg+xml"},
    {"ico", "image/x-icon"},
    {"webp", "image/webp"},
    {"wasm", "application/wasm"},
    {"pdf", "application/pdf"},
    {"woff2", "font/woff2"},
    {"woff", "font/woff"},
    {"xml", "application/xml"},
};

static const char files__default_type[] = "application/octet-stream";

/* The extension of a file name (after its last '.', not a leading one), or NULL. */
static const char *files__ext(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    const char *dot = strrchr(name, '.');
    if (dot == NULL || dot == name)
        return NULL;
    return dot + 1;
}

/* The Content-Type for a file name from the built-in table (case-insensitive): a root that was
 * given no table of its own (the C API alone, the unit tests) still serves sensible types. */
static const char *files__content_type(const char *path)
{
    const char *ext = files__ext(path);
    if (ext == NULL)
        return files__default_type;
    for (size_t i = 0; i < N_ELEMENTS(files__types); i++) {
        if (strcasecmp(ext, files__types[i].ext) == 0)
            return files__types[i].type;
    }
    return files__default_type;
}

static int files__type_cmp(const void *a, const void *b)
{
    return strcmp(((const struct files_type *)a)->ext, ((const struct files_type *)b)->ext);
}

int files_root_set_types(struct files_root *root, const struct files_type *types, size_t n)
{
    /* One allocation: the entries, then every string they point to. */
    size_t bytes = n * sizeof(struct files_type);
    for (size_t i = 0; i < n; i++) {
        size_t el = strlen(types[i].ext);
        if (el == 0 || el > FILES_EXT_MAX || strchr(types[i].ext, '.') != NULL)
            return -EINVAL;
        bytes += el + 1 + strlen(types[i].type) + 1;
    }
    struct files_type *t = malloc(bytes ? bytes : 1);
    if (UNLIKELY(t == NULL))
        return -ENOMEM;
    char *p = (char *)(t + n);
    for (size_t i = 0; i < n; i++) {
        size_t el = strlen(types[i].ext), tl = strlen(types[i].type);
        for (size_t k = 0; k <= el; k++)
            p[k] = (char)tolower((unsigned char)types[i].ext[k]);
        t[i].ext = p;
        p += el + 1;
        memcpy(p, types[i].type, tl + 1);
        t[i].type = p;
        p += tl + 1;
    }
    qsort(t, n, sizeof(*t), files__type_cmp);
    free(root->types);
    root->types = t;
    root->ntypes = n;
    return 0;
}

const char *files_root_content_type(const struct files_root *root, const char *path)
{
    if (root->types == NULL)
        return files__content_type(path);
    const char *ext = files__ext(path);
    if (ext == NULL)
        return files__default_type;
    /* Lower-cased into a small buffer, then a binary search: a few comparisons per file
     * answer, whatever the table's size. */
    char low[FILES_EXT_MAX + 1];
    size_t i = 0;
    for (; ext[i] != '\0'; i++) {
        if (i == FILES_EXT_MAX)
            return files__default_type;
        low[i] = (char)tolower((unsigned char)ext[i]);
    }
    low[i] = '\0';
    struct files_type key = {.ext = low, .type = NULL};
    const struct files_type *hit = bsearch(&key, root->types, root->ntypes, sizeof(key),
                                           files__type_cmp);
    return hit ? hit->type : files__default_type;
}

/* Fills hit from an open regular file's stat. */
static void files__fill(struct files_hit *hit, int fd, const struct stat *st)
{
    hit->fd = fd;
    hit->size = (uint64_t)st->st_size;
    hit->mtime = st->st_mtim.tv_sec;
    hit->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    /* Strong validator from size and mtime in nanoseconds: changes whenever the file is
     * rewritten, costs no read of the content (nginx uses size-mtime in seconds). */
    int n = snprintf(hit->etag, sizeof(hit->etag), "\"%llx-%llx\"", (unsigned long long)hit->size,
                     (unsigned long long)hit->mtime_ns);
    hit->etag_len = (size_t)n;
    http_date_format(hit->mtime, hit->last_modified);
    hit->encoding = 0;
    hit->vary = 0;
}

/* files_open, leaving in path (FILES_PATH_MAX bytes) the normalised path of the file opened
 * (".../index.html" for a directory), from which its siblings' names are made. */
static int files__open_path(const struct files_root *root, const char *rel, size_t len,
                            struct files_hit *hit, char *path)
{
    bool dir_hint;
    int rc = files__normalise(rel, len, path, &dir_hint);
    if (UNLIKELY(rc < 0))
        return rc;
    int fd = files__open_beneath(root, path);
    if (fd < 0)
        return fd;
    struct stat st;
    if (UNLIKELY(fstat(fd, &st) < 0)) {
        rc = -errno;
        close(fd);
        return rc;
    }
    if (S_ISDIR(st.st_mode)) {
        /* A directory is served by its index.html, opened by the same rules (it may itself be a
         * symlink). Without one: 404, never a listing. */
        close(fd);
        size_t plen = strlen(path);
        static const char index[] = "/index.html";
        if (UNLIKELY(plen + sizeof(index) > FILES_PATH_MAX))
            return -ENOENT;
        memcpy(path + plen, index, sizeof(index));
        fd = files__open_beneath(root, path);
        if (fd < 0)
            return fd; /* -ENOENT, -EACCES, or the server's own trouble (EMFILE...) */
        if (UNLIKELY(fstat(fd, &st) < 0)) {
            rc = -errno;
            close(fd);
            return rc;
        }
    } else if (dir_hint) {
        /* "file.txt/" names a directory that does not exist, as open(2) would say. */
        close(fd);
        return -ENOENT;
    }
    if (UNLIKELY(!S_ISREG(st.st_mode))) {
        close(fd);
        return -ENOENT;
    }
    /* Regular files ignore O_NONBLOCK for reads; clear it anyway so that a caller using read(2)
     * on a network file system gets ordinary blocking semantics. */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);

    files__fill(hit, fd, &st);
    hit->content_type = files_root_content_type(root, path);
    hit->content_type_len = strlen(hit->content_type);
    return 0;
}

int files_open(const struct files_root *root, const char *rel, size_t len, struct files_hit *hit)
{
    char path[FILES_PATH_MAX];
    return files__open_path(root, rel, len, hit, path);
}

/* ------------------------------------------------------------------------------------------ */
/* Precompressed siblings */

/* In the order that breaks ties between equal q-values: the smallest files first. */
static const struct {
    unsigned bit;
    const char *suffix; /* appended to the file's name */
    const char *name;   /* the Content-Encoding token */
} files__encs[3] = {
    {FILES_ENC_BR, ".br", "br"},
    {FILES_ENC_ZSTD, ".zst", "zstd"},
    {FILES_ENC_GZIP, ".gz", "gzip"},
};

void files_root_set_encodings(struct files_root *root, unsigned encodings)
{
    root->encodings = encodings & FILES_ENC_ALL;
}

unsigned files_root_encodings(const struct files_root *root)
{
    return root->encodings;
}

const char *files_encoding_name(unsigned encoding)
{
    for (size_t i = 0; i < N_ELEMENTS(files__encs); i++)
        if (files__encs[i].bit == encoding)
            return files__encs[i].name;
    return NULL;
}

void files_accept_init(struct files_accept *acc)
{
    acc->q[0] = acc->q[1] = acc->q[2] = -1;
    acc->star = -1;
}

/* A qvalue (RFC 9110 12.4.2: "0" ["." 0*3DIGIT] or "1" ["." 0*3("0")]) in thousandths, or -1. */
static int files__qvalue(const char *v, size_t len)
{
    if (len == 0 || (v[0] != '0' && v[0] != '1'))
        return -1;
    int q = (v[0] - '0') * 1000;
    if (len == 1)
        return q;
    if (v[1] != '.' || len > 5)
        return -1;
    int scale = 100;
    for (size_t i = 2; i < len; i++, scale /= 10) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        q += (v[i] - '0') * scale;
    }
    return q > 1000 ? -1 : q;
}

void files_accept_add(struct files_accept *acc, const char *v, size_t len)
{
    size_t i = 0;
    while (i < len) {
        /* One element: the coding up to ';' or ','; then parameters up to ','. */
        while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t cs = i;
        while (i < len && v[i] != ';' && v[i] != ',' && v[i] != ' ' && v[i] != '\t')
            i++;
        size_t cl = i - cs;
        int q = 1000;
        while (i < len && v[i] != ',') {
            /* A parameter: skip OWS and ';', read a name and its value. */
            while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ';'))
                i++;
            size_t ps = i;
            while (i < len && v[i] != '=' && v[i] != ',' && v[i] != ';')
                i++;
            size_t pl = i - ps;
            while (pl > 0 && (v[ps + pl - 1] == ' ' || v[ps + pl - 1] == '\t'))
                pl--;
            if (i < len && v[i] == '=') {
                i++;
                while (i < len && (v[i] == ' ' || v[i] == '\t'))
                    i++;
                size_t vs = i;
                while (i < len && v[i] != ',' && v[i] != ';' && v[i] != ' ' && v[i] != '\t')
                    i++;
                if (pl == 1 && (v[ps] == 'q' || v[ps] == 'Q'))
                    q = files__qvalue(v + vs, i - vs);
            }
        }
        if (cl == 0 || q < 0)
            continue; /* an empty element, or a weight that does not parse: ignored */
        const char *c = v + cs;
        if (cl == 1 && c[0] == '*')
            acc->star = q;
        else if (cl == 2 && strncasecmp(c, "br", 2) == 0)
            acc->q[0] = q;
        else if (cl == 4 && strncasecmp(c, "zstd", 4) == 0)
            acc->q[1] = q;
        else if ((cl == 4 && strncasecmp(c, "gzip", 4) == 0) ||
                 (cl == 6 && strncasecmp(c, "x-gzip", 6) == 0))
            acc->q[2] = q;
    }
}

/* Opens path + suffix beneath the root as a regular file: the fd (its stat in *st) or -1. */
static int files__open_sibling(const struct files_root *root, const char *path, const char *suffix,
                               struct stat *st)
{
    char name[FILES_PATH_MAX + 8];
    size_t pl = strlen(path), sl = strlen(suffix);
    if (pl + sl + 1 > sizeof(name))
        return -1;
    memcpy(name, path, pl);
    memcpy(name + pl, suffix, sl + 1);
    int fd = files__open_beneath(root, name);
    if (fd < 0)
        return -1;
    if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        return -1;
    }
    return fd;
}

int files_open_negotiated(const struct files_root *root, const char *rel, size_t len,
                          const struct files_accept *acc, struct files_hit *hit)
{
    char path[FILES_PATH_MAX];
    int rc = files__open_path(root, rel, len, hit, path);
    if (rc < 0 || root->encodings == 0)
        return rc;
    /* The accepted encodings the root looks for, best first: q, then the table's order. */
    int order[3], n = 0;
    for (int i = 0; i < 3; i++) {
        int q = acc->q[i] >= 0 ? acc->q[i] : acc->star;
        if ((root->encodings & files__encs[i].bit) && q > 0) {
            int k = n++;
            while (k > 0) {
                int j = order[k - 1];
                int qj = acc->q[j] >= 0 ? acc->q[j] : acc->star;
                if (qj >= q)
                    break;
                order[k] = j;
                k--;
            }
            order[k] = i;
        }
    }
    unsigned tried = 0;
    for (int k = 0; k < n; k++) {
        int i = order[k];
        struct stat st;
        tried |= files__encs[i].bit;
        int fd = files__open_sibling(root, path, files__encs[i].suffix, &st);
        if (fd < 0)
            continue;
        const char *type = hit->content_type;
        size_t type_len = hit->content_type_len;
        close(hit->fd);
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0)
            (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        files__fill(hit, fd, &st);
        /* "size-mtime" of the sibling, then the encoding inside the quotes. */
        int m = snprintf(hit->etag + hit->etag_len - 1, sizeof(hit->etag) - hit->etag_len + 1,
                         "-%s\"", files__encs[i].name);
        hit->etag_len += (size_t)m - 1;
        hit->content_type = type;
        hit->content_type_len = type_len;
        hit->encoding = files__encs[i].bit;
        hit->vary = 1;
        return 0;
    }
    /* None chosen: the answer still varies with Accept-Encoding when some sibling exists. */
    for (int i = 0; i < 3; i++) {
        if (!(root->encodings & files__encs[i].bit) || (tried & files__encs[i].bit))
            continue;
        struct stat st;
        int fd = files__open_sibling(root, path, files__encs[i].suffix, &st);
        if (fd >= 0) {
            close(fd);
            hit->vary = 1;
            break;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Conditionals */

/* Whether the entity-tag list value[0..len) names etag (quoted, strong) under weak comparison
 * (RFC 9110 8.8.3.2: the opaque tags match, W/ prefixes ignored). "*" matches any. */
static bool files__etag_listed(const char *etag, size_t etag_len, const char *v, size_t len)
{
    size_t i = 0;
    while (i < len) {
        while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        if (i == len)
            break;
        if (v[i] == '*')
            return true;
        if (i + 2 <= len && v[i] == 'W' && v[i + 1] == '/')
            i += 2;
        if (i >= len || v[i] != '"')
            return false; /* malformed list: no match, serve the full response */
        size_t start = i++;
        while (i < len && v[i] != '"')
            i++;
        if (i == len)
            return false;
        i++;
        if (i - start == etag_len && memcmp(v + start, etag, etag_len) == 0)
            return true;
    }
    return false;
}

int files_not_modified(const struct files_hit *hit, const char *inm, size_t inm_len,
                       const char *ims, size_t ims_len)
{
    if (inm != NULL)
        return files__etag_listed(hit->etag, hit->etag_len, inm, inm_len);
    if (ims != NULL) {
        time_t t;
        if (http_date_parse(ims, ims_len, &t) < 0)
            return 0;
        return hit->mtime <= t;
    }
    return 0;
}

int files_if_range(const struct files_hit *hit, const char *value, size_t len)
{
    if (value == NULL)
        return 1;
    if (len > 0 && value[0] == '"')
        return len == hit->etag_len && memcmp(value, hit->etag, len) == 0;
    time_t t;
    if (http_date_parse(value, len, &t) < 0)
        return 0;
    return t == hit->mtime;
}

/* ------------------------------------------------------------------------------------------ */
/* Ranges */

/* Parses decimal digits s[*i..) into *out, saturating at UINT64_MAX. Returns the digit count. */
static size_t files__u64(const char *s, size_t len, size_t *i, uint64_t *out)
{
    uint64_t v = 0;
    size_t start = *i;
    for (; *i < len && s[*i] >= '0' && s[*i] <= '9'; (*i)++) {
        unsigned d = (unsigned)(s[*i] - '0');
        v = v > (UINT64_MAX - d) / 10 ? UINT64_MAX : v * 10 + d;
    }
    *out = v;
    return *i - start;
}

int files_parse_range(const char *value, size_t len, uint64_t size, uint64_t *start, uint64_t *end)
{
    if (len < 6 || strncasecmp(value, "bytes=", 6) != 0)
        return 1;
    size_t i = 6;
    if (memchr(value + i, ',', len - i) != NULL)
        return 1; /* several ranges: RFC 9110 14.2 lets us ignore Range and send 200 */
    uint64_t a, b;
    if (i < len && value[i] == '-') {
        i++;
        if (files__u64(value, len, &i, &b) == 0 || i != len)
            return 1;
        if (b == 0 || size == 0)
            return -ERANGE;
        *start = b >= size ? 0 : size - b;
        *end = size - 1;
        return 0;
    }
    if (files__u64(value, len, &i, &a) == 0 || i == len || value[i] != '-')
        return 1;
    i++;
    if (i == len) {
        if (a >= size)
            return -ERANGE;
        *start = a;
        *end = size - 1;
        return 0;
    }
    if (files__u64(value, len, &i, &b) == 0 || i != len)
        return 1;
    if (a > b)
        return 1; /* an invalid range-spec: ignore the header (RFC 9110 14.1.1) */
    if (a >= size)
        return -ERANGE;
    *start = a;
    *end = b >= size ? size - 1 : b;
    return 0;
}
