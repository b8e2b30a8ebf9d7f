/* fuzz_http_parse.c: libFuzzer target for csrc/http_parse.c, also built as a plain replay binary.
 *
 * Each input is used three ways: as a request head under the default limits, as a head under
 * tiny limits (so that the early 431/414 paths are reached by short inputs), and as a chunked
 * body. Crashes and sanitizer reports are not the only failures: the target checks the parser's
 * contract and aborts when it is broken:
 *   - the result is -1, -2 or 0 < consumed <= len; -1 carries a known status and a rule name;
 *   - every view (method, target, path, query, host, field names and values) lies inside the
 *     consumed bytes;
 *   - feeding a prefix gives -2 or the same decision as the whole input (the head parser keeps no
 *     state, so this is what "any split gives the same result" means for it);
 *   - the chunked decoder gives the same result, body and rest whether the input arrives whole,
 *     split in two, or byte by byte, and never produces more bytes than it was given.
 *
 * Build: `make -C fuzz run` (clang, -fsanitize=fuzzer,address,undefined) runs the fuzzer for a
 * bounded time; `make -C fuzz replay` (gcc, ASan+UBSan) builds a main() that runs every file
 * given on the command line (or in given directories) through the same checks, which is how
 * tests/unit/test_fuzz_replay.py replays fuzz/corpus and fuzz/regression in `make test`. */
#include <stdio.h>
#include <stdlib.h>

#include "csrc/http_parse.c"

/* Aborts (so libFuzzer saves the input) when an invariant is broken. */
static void check(int cond, const char *what, const uint8_t *data, size_t size)
{
    if (!cond) {
        fprintf(stderr, "invariant broken: %s (input of %zu bytes)\n", what, size);
        abort();
    }
}

static int view_ok(const char *base, size_t len, const char *p, size_t n)
{
    if (p == NULL)
        return n == 0;
    return p >= base && n <= len && (size_t)(p - base) <= len - n;
}

static int known_status(int s)
{
    return s == 400 || s == 414 || s == 431 || s == 501 || s == 505;
}

/* One parse of buf[0..len), with the contract checks. */
static int parse_checked(const uint8_t *data, size_t size, const char *buf, size_t len,
                         const struct http_limits *lim, struct http_request *req,
                         struct http_header *hdrs, size_t cap)
{
    req->headers = hdrs;
    req->num_headers = cap;
    int r = http_parse_request(buf, len, req, lim);
    check(r == -1 || r == -2 || (r > 0 && (size_t)r <= len), "result out of range", data, size);
    if (r == -1) {
        check(known_status(req->status), "unknown status", data, size);
        check(req->error != NULL, "no rule name", data, size);
    }
    if (r > 0) {
        size_t n = (size_t)r;
        check(view_ok(buf, n, req->method, req->method_len), "method view", data, size);
        check(view_ok(buf, n, req->target, req->target_len), "target view", data, size);
        check(view_ok(req->target, req->target_len, req->path, req->path_len), "path view", data,
              size);
        check(view_ok(buf, n, req->query, req->query_len), "query view", data, size);
        check(view_ok(buf, n, req->host, req->host_len), "host view", data, size);
        check(req->num_headers <= cap && req->num_headers <= lim->max_headers, "header count", data,
              size);
        for (size_t i = 0; i < req->num_headers; i++) {
            check(view_ok(buf, n, req->headers[i].name, req->headers[i].name_len), "name view",
                  data, size);
            check(view_ok(buf, n, req->headers[i].value, req->headers[i].value_len), "value view",
                  data, size);
        }
        check(req->minor_version == 0 || req->minor_version == 1, "version", data, size);
        check(!(req->chunked && req->content_length >= 0), "both framings", data, size);
        check(req->target_len <= lim->max_target_bytes, "target limit", data, size);
        check(n <= lim->max_header_bytes, "head limit", data, size);
    }
    return r;
}

/* Parses the input whole and at every prefix (or a sample of prefixes for long inputs), each
 * copied into an exact-size heap block so that ASan sees any read past the end. */
static void check_head(const uint8_t *data, size_t size, const struct http_limits *lim)
{
    static struct http_header hdrs[64], pre_hdrs[64];
    struct http_request req, pre;
    char *whole = malloc(size ? size : 1);
    memcpy(whole, data, size);
    int r = parse_checked(data, size, whole, size, lim, &req, hdrs, N_ELEMENTS(hdrs));

    size_t step = size <= 1024 ? 1 : size / 512;
    for (size_t k = 0; k < size; k += step) {
        char *p = malloc(k ? k : 1);
        memcpy(p, data, k);
        int pr = parse_checked(data, size, p, k, lim, &pre, pre_hdrs, N_ELEMENTS(pre_hdrs));
        if (r > 0 && k >= (size_t)r) {
            check(pr == r, "a prefix holding the whole head parses differently", data, size);
            check(pre.num_headers == req.num_headers, "prefix header count", data, size);
        } else if (pr != -2) {
            check(pr == -1 && r == -1, "a prefix was decided but the whole was not", data, size);
            check(pre.status == req.status && strcmp(pre.error, req.error) == 0,
                  "a prefix was decided differently", data, size);
        }
        free(p);
    }
    free(whole);
}

struct chunk_result {
    int64_t r;
    size_t body_len, rest_len;
    char *body, *rest;
};

/* Feeds data to the chunked decoder in pieces of at most `piece` bytes (0: one piece). */
static void decode_in_pieces(const uint8_t *data, size_t size, size_t piece,
                             struct chunk_result *out)
{
    struct http_chunked st;
    memset(&st, 0, sizeof(st));
    out->body = malloc(size + 1);
    out->rest = malloc(size + 1);
    out->body_len = out->rest_len = 0;
    out->r = -2;
    size_t start = 0;
    do {
        size_t n = piece == 0 || size - start < piece ? size - start : piece;
        size_t stop = start + n;
        char *p = malloc(n ? n : 1);
        memcpy(p, data + start, n);
        size_t len = n;
        int64_t r = http_chunked_decode(&st, p, &len, 256);
        check(len <= n, "decoder grew its input", data, size);
        check(r == -1 || r == -2 || (r >= 0 && (uint64_t)r <= n - len), "decoder result", data,
              size);
        memcpy(out->body + out->body_len, p, len);
        out->body_len += len;
        if (r >= 0) {
            check(memcmp(p + len, data + stop - r, (size_t)r) == 0, "rest not moved intact", data,
                  size);
            memcpy(out->rest, data + stop - r, (size_t)r + (size - stop));
            out->rest_len = (size_t)r + (size - stop);
            out->r = (int64_t)out->rest_len;
            free(p);
            return;
        }
        free(p);
        out->r = r;
        if (r == -1)
            return;
        start = stop;
    } while (start < size);
}

static void check_chunked(const uint8_t *data, size_t size)
{
    struct chunk_result whole, other;
    decode_in_pieces(data, size, 0, &whole);
    size_t pieces[3] = {size / 2 ? size / 2 : 1, 1, 7};
    for (size_t i = 0; i < N_ELEMENTS(pieces); i++) {
        if (pieces[i] == 1 && size > 4096)
            continue;
        decode_in_pieces(data, size, pieces[i], &other);
        check(other.r == whole.r, "split decoding disagrees", data, size);
        if (whole.r != -1) {
            check(other.body_len == whole.body_len &&
                      memcmp(other.body, whole.body, whole.body_len) == 0,
                  "split decoding gives another body", data, size);
            check(other.rest_len == whole.rest_len &&
                      memcmp(other.rest, whole.rest, whole.rest_len) == 0,
                  "split decoding gives another rest", data, size);
        }
        free(other.body);
        free(other.rest);
    }
    free(whole.body);
    free(whole.rest);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct http_limits lim;
    http_limits_default(&lim);
    check_head(data, size, &lim);
    lim.max_header_bytes = 96;
    lim.max_target_bytes = 16;
    lim.max_headers = 3;
    check_head(data, size, &lim);
    check_chunked(data, size);
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
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 0;
}

/* Replays files, and the regular files inside directories, given as arguments. */
int main(int argc, char **argv)
{
    int errors = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            perror(argv[i]);
            errors++;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            errors += replay_file(argv[i]);
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL) {
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
            if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && e->d_name[0] != '.') {
                errors += replay_file(path);
                count++;
            }
        }
        if (d != NULL)
            closedir(d);
    }
    printf("replayed %d inputs, %d errors\n", count, errors);
    return errors ? 1 : 0;
}
#endif
