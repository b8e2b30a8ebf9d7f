/* fuzz_ws.c: libFuzzer target for the WebSocket frame reader (csrc/ws.c).
 *
 * Self-contained like fuzz_router.c: it #includes ws.c, so it builds with
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I../src/cyserve fuzz_ws.c -lcrypto
 * and, for replaying a corpus without libFuzzer, with gcc and -DFUZZ_REPLAY (fuzz/Makefile).
 *
 * The first input byte picks the maximum message size (0: none, else 4 times its value); the
 * rest is what a client sends. A first byte of 0xFF (0xFE: with client_no_context_takeover)
 * turns permessage-deflate on, and the next byte picks the maximum: compressed messages are then
 * inflated by ws_pmd_inflate as the engine does, and their inflated bytes are what is compared;
 * the inflated message must never have been given room past the maximum and one byte. It is read as the engine reads it (frames taken from the front
 * of a buffer that grows as bytes arrive): whole, split at two places the input chooses, and a
 * byte at a time when short. Checked: consumed never passes the buffer, a payload lies inside
 * its frame, need (once known) is at least what is buffered of the frame, and every way of
 * feeding gives the same frames and the same error (the reader's rules must not depend on how
 * bytes arrive). Any broken invariant abort()s, which the fuzzer reports. */
#include "csrc/ws.c"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "invariant broken: %s\n", what);
        abort();
    }
}

/* What one way of feeding saw: a running hash of the frames, their count, and the error. */
struct outcome {
    uint64_t hash;
    int frames;
    int error;
};

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const unsigned char *u = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ u[i]) * 1099511628211ULL;
    return h;
}

/* Feed data[0..n) in pieces ending at cuts[0..ncuts) (then n); deflate: 0 off, 1 on, 2 on with
 * client_no_context_takeover. */
static struct outcome feed(const uint8_t *data, size_t n, uint64_t max, int deflate,
                           const size_t *cuts, int ncuts)
{
    struct outcome o = {14695981039346656037ULL, 0, 0};
    struct ws_reader r;
    ws_reader_init(&r, max);
    r.deflate = deflate != 0;
    struct ws_pmd_params pp = {0, deflate == 2, 15};
    struct ws_pmd z;
    ws_pmd_init(&z, &pp);
    struct ws_buf msg = {0};
    char *buf = malloc(n ? n : 1);
    size_t len = 0, fed = 0;
    for (int c = 0; c <= ncuts; c++) {
        size_t end = c < ncuts ? cuts[c] : n;
        if (end < fed)
            continue;
        memcpy(buf + len, data + fed, end - fed);
        len += end - fed;
        fed = end;
        size_t pos = 0;
        while (pos < len) {
            struct ws_frame f;
            ssize_t rc = ws_read_frame(&r, buf + pos, len - pos, &f);
            if (rc == -2) {
                check(r.need == 0 || r.need > len - pos, "need below what is buffered");
                break;
            }
            if (rc == -1) {
                check(r.error == 1002 || r.error == 1007 || r.error == 1009, "error code");
                o.error = r.error;
                goto out;
            }
            check(rc > 0 && (size_t)rc <= len - pos, "consumed within the buffer");
            check(f.payload >= buf + pos && f.payload + f.len <= buf + pos + rc,
                  "payload inside its frame");
            check(!f.compressed || deflate, "compressed only with the extension");
            int meta[4] = {f.opcode, f.fin, f.first, f.code};
            o.hash = mix(o.hash, meta, sizeof(meta));
            if (f.compressed) {
                size_t before = f.first ? 0 : msg.len;
                int zr = ws_pmd_inflate(&z, &r, &f, &msg);
                check(max == 0 || msg.cap <= max + 1, "inflated room within the maximum");
                if (zr != 0) {
                    check(r.error == 1007 || r.error == 1009, "inflate error code");
                    o.error = r.error;
                    goto out;
                }
                if (msg.len > before)
                    o.hash = mix(o.hash, msg.ptr + before, msg.len - before);
            } else {
                o.hash = mix(o.hash, f.payload, (size_t)f.len);
            }
            o.frames++;
            pos += (size_t)rc;
        }
        memmove(buf, buf + pos, len - pos);
        len -= pos;
    }
out:
    free(buf);
    free(msg.ptr);
    ws_pmd_free(&z);
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int deflate = 0;
    if (data[0] >= 0xFE) {
        deflate = data[0] == 0xFF ? 1 : 2;
        data++;
        size--;
        if (size < 1)
            return 0;
    }
    uint64_t max = (uint64_t)data[0] * 4;
    data++;
    size--;
    struct outcome whole = feed(data, size, max, deflate, NULL, 0);
    if (size >= 2) {
        size_t cuts[2] = {data[0] % size, data[size - 1] % size};
        if (cuts[0] > cuts[1]) {
            size_t t = cuts[0];
            cuts[0] = cuts[1];
            cuts[1] = t;
        }
        struct outcome split = feed(data, size, max, deflate, cuts, 2);
        check(split.hash == whole.hash && split.frames == whole.frames &&
                  split.error == whole.error,
              "split feeding agrees with the whole");
    }
    if (size <= 512) {
        size_t cuts[512];
        for (size_t i = 0; i < size; i++)
            cuts[i] = i;
        struct outcome bytes = feed(data, size, max, deflate, cuts, (int)size);
        check(bytes.hash == whole.hash && bytes.frames == whole.frames &&
                  bytes.error == whole.error,
              "byte-at-a-time feeding agrees with the whole");
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
    uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan sees reads past the input */
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
                failed |= replay_file(p);
                count++;
            }
            if (dir)
                closedir(dir);
        } else {
            failed |= replay_file(argv[i]);
            count++;
        }
    }
    printf("replayed %d inputs, %d errors\n", count, failed);
    return failed;
}
#endif
