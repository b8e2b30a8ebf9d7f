/* test_files.c: files.c's traversal rules, hits, conditionals and ranges.
 *
 * A temporary tree is built for the run:
 *   TMP/secret.txt                 outside the root: must never be served
 *   TMP/root/index.html, a.txt, "with space.txt", UPPER.PNG, noext, data.unknown
 *   TMP/root/sub/index.html, sub/b.css, sub/nested/c.js, noindex/x.txt
 *   TMP/root/link_in -> a.txt      symlink inside the root (served)
 *   TMP/root/link_out -> ../secret.txt, link_abs -> TMP/secret.txt, dir_out -> ..  (refused)
 *   TMP/root/sub/link_up -> ../a.txt  (inside, through "..": served)
 *   TMP/root/fifo                  a FIFO (refused without blocking)
 * Every traversal case runs twice: with openat2 and with the /proc/self/fd fallback. */
#include "csrc/http_date.c"
#include "csrc/files.c"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "tap.h"

static char tmp[256], rootdir[300];

static void put(const char *rel, const char *content)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", tmp, rel);
    FILE *f = fopen(p, "w");
    if (f == NULL) {
        perror(p);
        exit(1);
    }
    fputs(content, f);
    fclose(f);
}

static void mk(const char *rel)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", tmp, rel);
    if (mkdir(p, 0755) != 0) {
        perror(p);
        exit(1);
    }
}

static void ln(const char *target, const char *rel)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", tmp, rel);
    if (symlink(target, p) != 0) {
        perror(p);
        exit(1);
    }
}

static void build_tree(void)
{
    snprintf(tmp, sizeof(tmp), "/tmp/cyserve_files_XXXXXX");
    if (mkdtemp(tmp) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(rootdir, sizeof(rootdir), "%s/root", tmp);
    put("secret.txt", "SECRET\n");
    mk("root");
    put("root/index.html", "<h1>root</h1>\n");
    put("root/a.txt", "hello world\n");
    put("root/with space.txt", "spaced\n");
    put("root/UPPER.PNG", "png");
    put("root/noext", "noext");
    put("root/data.unknown", "?");
    put("root/%2e%2e", "literal percent name");
    mk("root/sub");
    put("root/sub/index.html", "<h1>sub</h1>\n");
    put("root/sub/b.css", "body{}");
    mk("root/sub/nested");
    put("root/sub/nested/c.js", "1;");
    mk("root/noindex");
    put("root/noindex/x.txt", "x");
    ln("a.txt", "root/link_in");
    ln("../a.txt", "root/sub/link_up");
    ln("../secret.txt", "root/link_out");
    char abs[512];
    snprintf(abs, sizeof(abs), "%s/secret.txt", tmp);
    ln(abs, "root/link_abs");
    ln("..", "root/dir_out");
    ln("/proc/self/root/etc", "root/proc_link");
    char fifo[512];
    snprintf(fifo, sizeof(fifo), "%s/root/fifo", tmp);
    if (mkfifo(fifo, 0644) != 0) {
        perror("mkfifo");
        exit(1);
    }
}

static void rm_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d != NULL) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            char p[1024];
            snprintf(p, sizeof(p), "%s/%s", path, de->d_name);
            struct stat st;
            if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
                rm_tree(p);
            else
                unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

static int count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

/* Opens rel (given as (ptr, len) with a non-NUL byte after it), reads the file into content. */
static int try_open(const struct files_root *root, const char *rel, struct files_hit *hit,
                    char *content, size_t cap)
{
    size_t len = strlen(rel);
    char *copy = malloc(len + 1);
    memcpy(copy, rel, len);
    copy[len] = 'Q';
    int rc = files_open(root, copy, len, hit);
    free(copy);
    content[0] = '\0';
    if (rc == 0) {
        ssize_t n = pread(hit->fd, content, cap - 1, 0);
        content[n > 0 ? n : 0] = '\0';
        close(hit->fd);
    }
    return rc;
}

static void test_traversal(const char *mode)
{
    struct files_root *root;
    is_int(files_root_new(rootdir, &root), 0, "files_root_new");
    note("mode: %s (openat2 in use: %d)", mode, root->use_openat2);
    struct files_hit hit;
    char buf[256];
    static const struct {
        const char *rel;
        int rc;
        const char *content; /* for rc == 0 */
    } cases[] = {
        {"/a.txt", 0, "hello world\n"},
        {"a.txt", 0, "hello world\n"},
        {"/", 0, "<h1>root</h1>\n"},
        {"", 0, "<h1>root</h1>\n"},
        {"/sub/", 0, "<h1>sub</h1>\n"},
        {"/sub", 0, "<h1>sub</h1>\n"},
        {"/noindex/", -ENOENT, NULL},
        {"/noindex/x.txt", 0, "x"},
        {"/missing.txt", -ENOENT, NULL},
        {"/a.txt/", -ENOENT, NULL},
        {"/with%20space.txt", 0, "spaced\n"},
        {"/with space.txt", 0, "spaced\n"},
        {"//a.txt", 0, "hello world\n"},
        {"/./a.txt", 0, "hello world\n"},
        {"/sub/../a.txt", 0, "hello world\n"},
        {"/sub/nested/../../a.txt", 0, "hello world\n"},
        {"/sub/%2e%2e/a.txt", 0, "hello world\n"},
        {"/%61.txt", 0, "hello world\n"},
        /* climbing above the root, in every spelling */
        {"/../secret.txt", -EINVAL, NULL},
        {"..", -EINVAL, NULL},
        {"/sub/../../secret.txt", -EINVAL, NULL},
        {"/%2e%2e/secret.txt", -EINVAL, NULL},
        {"/%2E%2e/secret.txt", -EINVAL, NULL},
        {"/%2E%2e/", -EINVAL, NULL},
        {"/.%2e/secret.txt", -EINVAL, NULL},
        {"/sub/nested/../../../secret.txt", -EINVAL, NULL},
        /* encoded separators and NULs */
        {"/..%2fsecret.txt", -EINVAL, NULL},
        {"/..%2Fsecret.txt", -EINVAL, NULL},
        {"/sub%2fb.css", -EINVAL, NULL},
        {"%2Fetc%2Fpasswd", -EINVAL, NULL},
        {"/a.txt%00.html", -EINVAL, NULL},
        {"/%00", -EINVAL, NULL},
        /* invalid escapes */
        {"/%zz", -EINVAL, NULL},
        {"/%4", -EINVAL, NULL},
        {"/a.txt%", -EINVAL, NULL},
        {"/%g1", -EINVAL, NULL},
        /* decoded once only: "%252e%252e" is the literal name "%2e%2e" */
        {"/%252e%252e", 0, "literal percent name"},
        {"/%252e%252e/secret.txt", -ENOENT, NULL},
        /* absolute-looking paths stay under the root */
        {"//etc/passwd", -ENOENT, NULL},
        {"/etc/passwd", -ENOENT, NULL},
        {"\\..\\secret.txt", -ENOENT, NULL},
        {"/...", -ENOENT, NULL},
        /* symlinks */
        {"/link_in", 0, "hello world\n"},
        {"/sub/link_up", 0, "hello world\n"},
        {"/link_out", -ENOENT, NULL},
        {"/link_abs", -ENOENT, NULL},
        {"/dir_out/secret.txt", -ENOENT, NULL},
        {"/proc_link/passwd", -ENOENT, NULL},
        /* not a regular file: refused without blocking on the FIFO */
        {"/fifo", -ENOENT, NULL},
    };
    int fds = count_fds();
    for (size_t i = 0; i < N_ELEMENTS(cases); i++) {
        int rc = try_open(root, cases[i].rel, &hit, buf, sizeof(buf));
        char desc[300];
        snprintf(desc, sizeof(desc), "[%s] '%s' -> %d", mode, cases[i].rel, cases[i].rc);
        is_int(rc, cases[i].rc, desc);
        if (cases[i].rc == 0 && rc == 0)
            is_mem(buf, strlen(buf), cases[i].content, desc);
        if (rc == 0)
            ok(strstr(buf, "SECRET") == NULL, "[%s] '%s' did not serve the secret", mode,
               cases[i].rel);
    }
    /* Out through a symlink and back in: openat2 refuses the route (resolution left the root),
     * the fallback checks where the file is (inside) and serves it. Neither leaks. */
    is_int(try_open(root, "/dir_out/root/a.txt", &hit, buf, sizeof(buf)),
           root->use_openat2 ? -ENOENT : 0, "out and back in through a symlink");
    /* A decoded path over the limit is a 404, not an overflow. */
    char *lng = malloc(3000);
    memset(lng, 'a', 2999);
    lng[0] = '/';
    lng[2999] = '\0';
    is_int(try_open(root, lng, &hit, buf, sizeof(buf)), -ENOENT, "very long path");
    /* ...and so is a long path full of "./" that normalises to nothing. */
    for (int i = 0; i + 2 < 2999; i += 2)
        memcpy(lng + i, "/.", 2);
    lng[2998] = '/';
    is_int(try_open(root, lng, &hit, buf, sizeof(buf)), 0, "many /. segments are the root");
    free(lng);
    is_int(count_fds(), fds, "no descriptor leaked");
    files_root_free(root);
}

static void test_hit(void)
{
    struct files_root *root;
    files_root_new(rootdir, &root);
    struct files_hit hit;
    char buf[64];
    is_int(try_open(root, "/a.txt", &hit, buf, sizeof(buf)), 0, "open a.txt");
    is_int(hit.size, 12, "size");
    struct stat st;
    char p[512];
    snprintf(p, sizeof(p), "%s/a.txt", rootdir);
    stat(p, &st);
    is_int(hit.mtime, st.st_mtim.tv_sec, "mtime");
    is_int(hit.mtime_ns, (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec, "mtime_ns");
    char etag[64];
    snprintf(etag, sizeof(etag), "\"c-%llx\"", (unsigned long long)hit.mtime_ns);
    is_mem(hit.etag, hit.etag_len, etag, "etag is \"size-mtime_ns\" in hex");
    char date[FILES_DATE_SIZE];
    http_date_format(st.st_mtim.tv_sec, date);
    is_mem(hit.last_modified, strlen(hit.last_modified), date, "last_modified");
    is_mem(hit.content_type, hit.content_type_len, "text/plain; charset=utf-8", "txt type");

    static const struct {
        const char *rel, *type;
    } types[] = {
        {"/", "text/html; charset=utf-8"},
        {"/sub/b.css", "text/css; charset=utf-8"},
        {"/sub/nested/c.js", "text/javascript; charset=utf-8"},
        {"/UPPER.PNG", "image/png"},
        {"/noext", "application/octet-stream"},
        {"/data.unknown", "application/octet-stream"},
        {"/link_in", "application/octet-stream"},
    };
    for (size_t i = 0; i < N_ELEMENTS(types); i++) {
        is_int(try_open(root, types[i].rel, &hit, buf, sizeof(buf)), 0, types[i].rel);
        is_mem(hit.content_type, hit.content_type_len, types[i].type, types[i].rel);
    }
    static const struct {
        const char *name, *type;
    } names[] = {
        {"x.html", "text/html; charset=utf-8"},
        {"x.json", "application/json"},
        {"x.jpg", "image/jpeg"},
        {"x.gif", "image/gif"},
        {"x.svg", "image/svg+xml"},
        {"x.ico", "image/x-icon"},
        {"x.wasm", "application/wasm"},
        {"x.pdf", "application/pdf"},
        {"x.woff2", "font/woff2"},
        {".html", "application/octet-stream"},
        {"dir.d/x", "application/octet-stream"},
        {"x.", "application/octet-stream"},
    };
    for (size_t i = 0; i < N_ELEMENTS(names); i++)
        is_mem(files__content_type(names[i].name), strlen(files__content_type(names[i].name)),
               names[i].type, names[i].name);

    /* Permissions: root reads anything, so mode 000 only denies when not running as root; the
     * error mapping itself is checked either way. */
    is_int(files__open_error(EACCES), -EACCES, "EACCES maps to 403");
    is_int(files__open_error(EPERM), -EACCES, "EPERM maps to 403");
    is_int(files__open_error(EXDEV), -ENOENT, "EXDEV (escape) maps to 404");
    is_int(files__open_error(EMFILE), -EMFILE, "EMFILE passes through (500)");
    put("root/noperm.txt", "no");
    snprintf(p, sizeof(p), "%s/noperm.txt", rootdir);
    chmod(p, 0);
    if (geteuid() != 0)
        is_int(try_open(root, "/noperm.txt", &hit, buf, sizeof(buf)), -EACCES, "mode 000 is 403");
    else
        note("running as root: mode 000 cannot deny; only the mapping above is checked");
    files_root_free(root);

    struct files_root *bad;
    is_int(files_root_new("/nonexistent/cyserve", &bad), -ENOENT, "missing root");
    snprintf(p, sizeof(p), "%s/a.txt", rootdir);
    is_int(files_root_new(p, &bad), -ENOTDIR, "root that is a file");
    files_root_free(NULL);
}

static void test_conditionals(void)
{
    struct files_hit hit = {.mtime = 784111777};
    strcpy(hit.etag, "\"c-abc\"");
    hit.etag_len = strlen(hit.etag);
    const char *now = "Sun, 06 Nov 1994 08:49:37 GMT";
    const char *before = "Sun, 06 Nov 1994 08:49:36 GMT";
    const char *after = "Mon, 07 Nov 1994 08:49:37 GMT";
#define INM(s) (s), strlen(s)
    is_int(files_not_modified(&hit, NULL, 0, NULL, 0), 0, "no conditionals: 200");
    is_int(files_not_modified(&hit, INM("\"c-abc\""), NULL, 0), 1, "INM exact: 304");
    is_int(files_not_modified(&hit, INM("W/\"c-abc\""), NULL, 0), 1, "INM weak compare: 304");
    is_int(files_not_modified(&hit, INM("\"x\", \"c-abc\""), NULL, 0), 1, "INM list: 304");
    is_int(files_not_modified(&hit, INM("\"x\",W/\"c-abc\""), NULL, 0), 1, "INM list, no OWS");
    is_int(files_not_modified(&hit, INM("*"), NULL, 0), 1, "INM *: 304");
    is_int(files_not_modified(&hit, INM("\"c-abd\""), NULL, 0), 0, "INM other tag: 200");
    is_int(files_not_modified(&hit, INM("\"c-ab\""), NULL, 0), 0, "INM prefix of tag: 200");
    is_int(files_not_modified(&hit, INM("c-abc"), NULL, 0), 0, "INM unquoted: 200");
    is_int(files_not_modified(&hit, INM("\"c-abc"), NULL, 0), 0, "INM unterminated: 200");
    is_int(files_not_modified(&hit, INM(""), NULL, 0), 0, "INM empty: 200");
    is_int(files_not_modified(&hit, INM("\"x\""), INM(after)), 0,
           "INM present and not matching: IMS ignored (RFC 9110 13.2.2)");
    is_int(files_not_modified(&hit, INM("\"c-abc\""), INM(before)), 1,
           "INM matching wins over a stale IMS");
    is_int(files_not_modified(&hit, NULL, 0, INM(now)), 1, "IMS == mtime: 304");
    is_int(files_not_modified(&hit, NULL, 0, INM(after)), 1, "IMS after mtime: 304");
    is_int(files_not_modified(&hit, NULL, 0, INM(before)), 0, "IMS before mtime: 200");
    is_int(files_not_modified(&hit, NULL, 0, INM("yesterday")), 0, "IMS invalid: 200");
    /* If-Range: strong comparison for tags, exact equality for dates. */
    is_int(files_if_range(&hit, NULL, 0), 1, "no If-Range: honour Range");
    is_int(files_if_range(&hit, INM("\"c-abc\"")), 1, "If-Range same tag: honour");
    is_int(files_if_range(&hit, INM("W/\"c-abc\"")), 0, "If-Range weak tag: ignore Range");
    is_int(files_if_range(&hit, INM("\"c-abd\"")), 0, "If-Range other tag: ignore Range");
    is_int(files_if_range(&hit, INM("\"c-abc")), 0, "If-Range unterminated tag");
    is_int(files_if_range(&hit, INM(now)), 1, "If-Range date == mtime: honour");
    is_int(files_if_range(&hit, INM(after)), 0, "If-Range later date: ignore Range");
    is_int(files_if_range(&hit, INM(before)), 0, "If-Range earlier date: ignore Range");
    is_int(files_if_range(&hit, INM("garbage")), 0, "If-Range garbage: ignore Range");
#undef INM
}

static void test_ranges(void)
{
    static const struct {
        const char *v;
        uint64_t size;
        int rc;
        uint64_t start, end;
    } cases[] = {
        {"bytes=0-9", 100, 0, 0, 9},
        {"bytes=0-0", 100, 0, 0, 0},
        {"bytes=90-", 100, 0, 90, 99},
        {"bytes=99-", 100, 0, 99, 99},
        {"bytes=-10", 100, 0, 90, 99},
        {"bytes=-100", 100, 0, 0, 99},
        {"bytes=-200", 100, 0, 0, 99},
        {"bytes=95-200", 100, 0, 95, 99},
        {"BYTES=0-5", 100, 0, 0, 5},
        {"Bytes=0-5", 100, 0, 0, 5},
        {"bytes=0-99999999999999999999999", 100, 0, 0, 99},
        {"bytes=-99999999999999999999999", 100, 0, 0, 99},
        {"bytes=100-", 100, -ERANGE, 0, 0},
        {"bytes=100-200", 100, -ERANGE, 0, 0},
        {"bytes=99999999999999999999999-", 100, -ERANGE, 0, 0},
        {"bytes=-0", 100, -ERANGE, 0, 0},
        {"bytes=0-", 0, -ERANGE, 0, 0},
        {"bytes=-5", 0, -ERANGE, 0, 0},
        {"bytes=5-4", 100, 1, 0, 0},
        {"bytes=0-1,5-6", 100, 1, 0, 0},
        {"bytes=0-1, 5-6", 100, 1, 0, 0},
        {"items=0-5", 100, 1, 0, 0},
        {"bytes", 100, 1, 0, 0},
        {"bytes=", 100, 1, 0, 0},
        {"bytes=-", 100, 1, 0, 0},
        {"bytes=a-b", 100, 1, 0, 0},
        {"bytes= 0-5", 100, 1, 0, 0},
        {"bytes=0 -5", 100, 1, 0, 0},
        {"bytes=0-5 ", 100, 1, 0, 0},
        {"bytes=0-5x", 100, 1, 0, 0},
        {"bytes=--5", 100, 1, 0, 0},
        {"bytes=-5-", 100, 1, 0, 0},
        {"bytes=0--5", 100, 1, 0, 0},
        {"", 100, 1, 0, 0},
    };
    for (size_t i = 0; i < N_ELEMENTS(cases); i++) {
        /* (ptr, len) with a digit after it: the parser must stop at len. */
        size_t len = strlen(cases[i].v);
        char *copy = malloc(len + 1);
        memcpy(copy, cases[i].v, len);
        copy[len] = '7';
        uint64_t s = 12345, e = 12345;
        int rc = files_parse_range(copy, len, cases[i].size, &s, &e);
        free(copy);
        char desc[128];
        snprintf(desc, sizeof(desc), "'%s' size %llu -> %d", cases[i].v,
                 (unsigned long long)cases[i].size, cases[i].rc);
        is_int(rc, cases[i].rc, desc);
        if (cases[i].rc == 0 && rc == 0)
            ok(s == cases[i].start && e == cases[i].end, "%s: [%llu, %llu]", desc,
               (unsigned long long)s, (unsigned long long)e);
    }
}

static void test_types(void)
{
    struct files_root *root;
    is_int(files_root_new(rootdir, &root), 0, "root for the type table");
    static const struct files_type table[] = {
        {"mp4", "video/mp4"},
        {"CSV", "text/csv; charset=utf-8"},
        {"txt", "text/plain; charset=utf-8"},
        {"js", "text/javascript; charset=utf-8"},
    };
    is_int(files_root_set_types(root, table, N_ELEMENTS(table)), 0, "a table of four types");
    static const struct {
        const char *name, *type;
    } names[] = {
        {"movie.mp4", "video/mp4"},
        {"MOVIE.MP4", "video/mp4"},
        {"dir/data.csv", "text/csv; charset=utf-8"},
        {"x.js", "text/javascript; charset=utf-8"},
        {"x.png", "application/octet-stream"}, /* the built-in table is replaced, not merged */
        {"noext", "application/octet-stream"},
        {".csv", "application/octet-stream"},
        {"x.averyveryveryveryverylongextension1", "application/octet-stream"},
    };
    for (size_t i = 0; i < N_ELEMENTS(names); i++) {
        const char *t = files_root_content_type(root, names[i].name);
        is_mem(t, strlen(t), names[i].type, names[i].name);
    }
    struct files_hit hit;
    char buf[64];
    is_int(try_open(root, "/a.txt", &hit, buf, sizeof(buf)), 0, "open through the table");
    is_mem(hit.content_type, hit.content_type_len, "text/plain; charset=utf-8", "table type");
    static const struct files_type bad[] = {{"a.b", "x/y"}};
    is_int(files_root_set_types(root, bad, 1), -EINVAL, "an extension with a dot is refused");
    static const struct files_type empty[] = {{"", "x/y"}};
    is_int(files_root_set_types(root, empty, 1), -EINVAL, "an empty extension is refused");
    const char *t = files_root_content_type(root, "m.mp4");
    is_mem(t, strlen(t), "video/mp4", "a refused table leaves the old one");
    files_root_free(root);
}

static void test_accept(void)
{
    static const struct {
        const char *v;
        int br, zstd, gzip, star;
    } cases[] = {
        {"", -1, -1, -1, -1},
        {"gzip, deflate, br, zstd", 1000, 1000, 1000, -1},
        {"br;q=0.8, gzip;q=1.0", 800, -1, 1000, -1},
        {"gzip;q=0", -1, -1, 0, -1},
        {"x-gzip", -1, -1, 1000, -1},
        {"*;q=0.5, br;q=0", 0, -1, -1, 500},
        {"BR ; Q=0.25 ,GZIP", 250, -1, 1000, -1},
        {"gzip;q=2", -1, -1, -1, -1},      /* not a qvalue: the element is ignored */
        {"gzip;q=0.1234", -1, -1, -1, -1}, /* four decimals: ignored */
        {"gzip;level=1;q=0.5", -1, -1, 500, -1},
        {"identity;q=1, *;q=0", -1, -1, -1, 0},
        {",,, br", 1000, -1, -1, -1},
    };
    for (size_t i = 0; i < N_ELEMENTS(cases); i++) {
        struct files_accept acc;
        files_accept_init(&acc);
        size_t len = strlen(cases[i].v);
        char *copy = malloc(len + 1);
        memcpy(copy, cases[i].v, len);
        copy[len] = ',';
        files_accept_add(&acc, copy, len);
        free(copy);
        ok(acc.q[0] == cases[i].br && acc.q[1] == cases[i].zstd && acc.q[2] == cases[i].gzip &&
               acc.star == cases[i].star,
           "Accept-Encoding '%s': br %d zstd %d gzip %d * %d", cases[i].v, acc.q[0], acc.q[1],
           acc.q[2], acc.star);
    }
    struct files_accept acc;
    files_accept_init(&acc);
    files_accept_add(&acc, "br;q=0.1", 8);
    files_accept_add(&acc, "gzip", 4);
    ok(acc.q[0] == 100 && acc.q[2] == 1000, "two lines add up");
}

/* Opens rel negotiated with the Accept-Encoding value ae; reads the body into content. */
static int try_negotiated(const struct files_root *root, const char *rel, const char *ae,
                          struct files_hit *hit, char *content, size_t cap)
{
    struct files_accept acc;
    files_accept_init(&acc);
    if (ae)
        files_accept_add(&acc, ae, strlen(ae));
    int rc = files_open_negotiated(root, rel, strlen(rel), &acc, hit);
    content[0] = '\0';
    if (rc == 0) {
        ssize_t n = pread(hit->fd, content, cap - 1, 0);
        content[n > 0 ? n : 0] = '\0';
        close(hit->fd);
    }
    return rc;
}

static void test_precompressed(void)
{
    mk("root/pre");
    put("root/pre/app.js", "plain js");
    put("root/pre/app.js.br", "BR");
    put("root/pre/app.js.gz", "GZIP");
    put("root/pre/app.js.zst", "ZSTD!");
    put("root/pre/only.css", "plain css");
    put("root/pre/only.css.gz", "GZ");
    put("root/pre/none.txt", "none");
    put("root/pre/index.html", "plain index");
    put("root/pre/index.html.gz", "GZ index");
    put("root/pre/orphan.txt.gz", "no plain file");
    mk("root/pre/dir.br");
    put("root/pre/d.txt", "plain d");
    mk("root/pre/d.txt.br"); /* a directory is not a sibling */
    struct files_root *root;
    is_int(files_root_new(rootdir, &root), 0, "root for siblings");
    struct files_hit hit;
    char buf[64];
    int fds = count_fds();

    is_int(try_negotiated(root, "/pre/app.js", "gzip, br", &hit, buf, sizeof(buf)), 0, "open");
    ok(strcmp(buf, "plain js") == 0 && hit.encoding == 0 && hit.vary == 0,
       "a root told of no encodings serves the file itself, no Vary");
    files_root_set_encodings(root, FILES_ENC_ALL);
    is_int(files_root_encodings(root), FILES_ENC_ALL, "encodings kept");

    static const struct {
        const char *rel, *ae, *body;
        unsigned enc;
        int vary;
    } cases[] = {
        {"/pre/app.js", "gzip, deflate, br, zstd", "BR", FILES_ENC_BR, 1},
        {"/pre/app.js", "gzip, zstd", "ZSTD!", FILES_ENC_ZSTD, 1},
        {"/pre/app.js", "gzip", "GZIP", FILES_ENC_GZIP, 1},
        {"/pre/app.js", "br;q=0.5, gzip", "GZIP", FILES_ENC_GZIP, 1},
        {"/pre/app.js", "br;q=0, gzip;q=0, zstd;q=0", "plain js", 0, 1},
        {"/pre/app.js", NULL, "plain js", 0, 1},
        {"/pre/app.js", "identity", "plain js", 0, 1},
        {"/pre/app.js", "*", "BR", FILES_ENC_BR, 1},
        {"/pre/app.js", "*;q=0.5, gzip", "GZIP", FILES_ENC_GZIP, 1},
        {"/pre/only.css", "br, gzip", "GZ", FILES_ENC_GZIP, 1},
        {"/pre/only.css", "br", "plain css", 0, 1},
        {"/pre/none.txt", "br, gzip, zstd", "none", 0, 0},
        {"/pre/", "gzip", "GZ index", FILES_ENC_GZIP, 1},
        {"/pre/d.txt", "br", "plain d", 0, 0},
    };
    for (size_t i = 0; i < N_ELEMENTS(cases); i++) {
        char desc[160];
        snprintf(desc, sizeof(desc), "%s with '%s'", cases[i].rel, cases[i].ae ? cases[i].ae : "");
        is_int(try_negotiated(root, cases[i].rel, cases[i].ae, &hit, buf, sizeof(buf)), 0, desc);
        ok(strcmp(buf, cases[i].body) == 0 && hit.encoding == cases[i].enc &&
               hit.vary == cases[i].vary,
           "%s: body '%s' encoding %u vary %d", desc, buf, hit.encoding, hit.vary);
    }
    is_int(try_negotiated(root, "/pre/orphan.txt", "gzip", &hit, buf, sizeof(buf)), -ENOENT,
           "a sibling without its file is not served in its place");
    is_int(try_negotiated(root, "/pre/../../secret.txt", "gzip", &hit, buf, sizeof(buf)), -EINVAL,
           "the traversal rules come first");

    /* The sibling's answer: its own size, the file's type, an ETag of its own. */
    struct files_hit plain;
    is_int(try_negotiated(root, "/pre/app.js", NULL, &plain, buf, sizeof(buf)), 0, "plain");
    is_int(try_negotiated(root, "/pre/app.js", "br", &hit, buf, sizeof(buf)), 0, "br");
    is_int(hit.size, 2, "the sibling's size");
    is_mem(hit.content_type, hit.content_type_len, "text/javascript; charset=utf-8",
           "the file's Content-Type");
    char etag[64];
    snprintf(etag, sizeof(etag), "\"2-%llx-br\"", (unsigned long long)hit.mtime_ns);
    is_mem(hit.etag, hit.etag_len, etag, "the sibling's ETag names its encoding");
    ok(hit.etag_len != plain.etag_len || memcmp(hit.etag, plain.etag, hit.etag_len) != 0,
       "ETags differ per encoding");
    is_int(try_negotiated(root, "/pre/app.js", "zstd", &hit, buf, sizeof(buf)), 0, "zstd");
    ok(hit.etag_len < FILES_ETAG_SIZE && hit.etag[hit.etag_len - 1] == '"' &&
           memcmp(hit.etag + hit.etag_len - 6, "-zstd\"", 6) == 0,
       "the longest encoding fits the ETag: %s", hit.etag);
    const char *names[] = {files_encoding_name(FILES_ENC_BR), files_encoding_name(FILES_ENC_ZSTD),
                           files_encoding_name(FILES_ENC_GZIP)};
    ok(strcmp(names[0], "br") == 0 && strcmp(names[1], "zstd") == 0 &&
           strcmp(names[2], "gzip") == 0 && files_encoding_name(0) == NULL,
       "Content-Encoding tokens");
    is_int(count_fds(), fds, "no descriptor leaked by siblings looked for");

    files_root_set_encodings(root, FILES_ENC_GZIP);
    is_int(try_negotiated(root, "/pre/app.js", "br", &hit, buf, sizeof(buf)), 0, "gzip only");
    ok(strcmp(buf, "plain js") == 0 && hit.vary == 1,
       "a root looking for gzip alone serves no br, and still says Vary");
    files_root_free(root);
}

int main(void)
{
    build_tree();
    test_traversal("openat2");
    files__force_fallback = 1;
    test_traversal("fallback");
    files__force_fallback = 0;
    test_hit();
    test_conditionals();
    test_ranges();
    test_types();
    test_accept();
    test_precompressed();
    rm_tree(tmp);
    return done_testing();
}
