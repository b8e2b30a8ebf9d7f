/* fuzz_proxyproto.c: libFuzzer target for the PROXY protocol parser (csrc/proxyproto.c).
 *
 * Self-contained like the other targets: it #includes the .c file it tests, so it builds with
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I../src/cyserve fuzz_proxyproto.c
 * and, for replaying a corpus without libFuzzer (tests/unit/test_fuzz_replay.py),
 *   gcc -g -O1 -DFUZZ_REPLAY -fsanitize=address,undefined -I../src/cyserve fuzz_proxyproto.c
 *
 * Invariants checked on every input (abort() when one breaks): the result is -1, -2 or a length
 * within the input and within PROXYPROTO_MAX; a header that is accepted gives the same result
 * with anything appended to it, and every prefix of it is incomplete; once a prefix is refused,
 * the whole input is refused; a client the header names formats into 64 bytes. */
#include "csrc/proxyproto.c"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_proxyproto: invariant broken: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    struct proxyproto_hdr h;
    int rc = proxyproto_parse(buf, size, &h);
    check(rc == -1 || rc == -2 || (rc > 0 && (size_t)rc <= size && rc <= PROXYPROTO_MAX),
          "result out of range");
    if (rc > 0) {
        check(h.version == 1 || h.version == 2, "version");
        char client[64];
        if (h.family == AF_INET || h.family == AF_INET6)
            check(proxyproto_client(&h, client, sizeof(client)) == 0, "client does not format");
        for (size_t k = 0; k < (size_t)rc; k++) {
            struct proxyproto_hdr p;
            check(proxyproto_parse(buf, k, &p) == -2, "a prefix of a header is not incomplete");
        }
        /* The same header followed by more bytes (an exact-size copy: ASan sees overreads). */
        char *more = malloc(size + 8);
        memcpy(more, buf, size);
        memcpy(more + size, "GET / HT", 8);
        struct proxyproto_hdr p;
        check(proxyproto_parse(more, size + 8, &p) == rc, "appended bytes change the result");
        free(more);
    } else {
        int refused = 0;
        for (size_t k = 0; k <= size; k++) {
            struct proxyproto_hdr p;
            int r = proxyproto_parse(buf, k, &p);
            check(r == -1 || r == -2, "a prefix of a non-header is accepted");
            check(!(refused && r == -2), "incomplete after refused");
            refused |= r == -1;
        }
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
    static uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    uint8_t *copy = malloc(n ? n : 1); /* exact size, so that ASan sees reads past the input */
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
    /* Same line as the other targets' replays, so one test checks them all. */
    printf("replayed %d inputs, %d errors\n", count, failed);
    return failed != 0;
}
#endif
