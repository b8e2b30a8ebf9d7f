/* handler_static.c: SERVER_STATIC targets, answers made once at startup, and the memfds that
 * let large bodies (static ones, and handler bodies promised to outlive the server) go out by
 * sendfile without a copy per response. The HTTP/1 head of a static target is serialised once,
 * by the HTTP/1 module (http1_static_head), and written per request with its Date
 * (http1_send_answer, and the inline path). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "handler_static.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http1.h"
#include "server_int.h"

/* A sealed memfd holding body[0..len), or -1 when the kernel cannot give one (no memfd_create,
 * no memory): the caller then serves from the copy in memory, which is only slower. The seals
 * make the contents immutable for the life of the fd, so concurrent sendfile() calls with their
 * own offsets need no coordination. */
int static_body_memfd(const char *body, size_t len)
{
    int fd = memfd_create("cyserve-static", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (UNLIKELY(fd < 0))
        return -1;
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, body + done, len - done);
        if (UNLIKELY(n < 0 && errno == EINTR))
            continue;
        if (UNLIKELY(n <= 0))
            goto fail;
        done += (size_t)n;
    }
    if (UNLIKELY(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)))
        goto fail;
    return fd;
fail:
    close(fd);
    return -1;
}

int server_target_static(struct server_target *t, const struct http_head *fields, int status,
                         const char *headers, size_t headers_len, const char *body, size_t body_len)
{
    if (UNLIKELY(status < 200 || status > 599))
        return -EINVAL;
    memset(t, 0, sizeof(*t));
    t->kind = SERVER_STATIC;
    t->static_status = status;
    t->static_fd = -1;
    if (status < 200 || status == 204 || status == 304 || status == 205)
        body_len = 0; /* these statuses never carry a body (a 205 says Content-Length: 0) */
    char *head;
    size_t head_len;
    if (!fields)
        fields = &http_head_default;
    t->static_no_date = fields->no_date;
    int rc = http1_static_head(fields, status, headers, headers_len, body_len, &head, &head_len);
    char *b = malloc(body_len ? body_len : 1);
    if (UNLIKELY(rc || !b)) {
        free(rc ? NULL : head);
        free(b);
        return -ENOMEM;
    }
    if (body_len)
        memcpy(b, body, body_len);
    t->static_head = head;
    t->static_head_len = head_len;
    t->static_body = b;
    t->static_body_len = body_len;
    if (body_len > STATIC_MEMFD_MIN)
        t->static_fd = static_body_memfd(b, body_len);
    return 0;
}

void server_target_clear(struct server_target *t)
{
    if (t->kind == SERVER_STATIC) {
        free(t->static_head);
        free(t->static_body);
        if (t->static_fd >= 0)
            close(t->static_fd);
    }
    memset(t, 0, sizeof(*t));
}

/* Large handler bodies set with resp_set_body_static.
 *
 * Their memory is promised to live, unchanged, as long as the server, so a body is the same
 * bytes every time the same (pointer, length) pair comes back. The first response that sends a
 * pair copies it once into a sealed memfd; every later one, on any worker, sendfile()s from that
 * memfd, which spares the kernel its copy from user memory per response exactly as for
 * SERVER_STATIC targets. (A handler that breaks the promise and changes its buffer keeps getting
 * the first snapshot: stale, never torn.)
 *
 * Concurrency: the table is append-only while the server lives. A reader loads ext_count with
 * acquire and scans the entries below it, which were completely written before the release
 * store that published them; it takes no lock. A miss takes ext_lock, scans again (another
 * worker may have added the pair meanwhile), makes the memfd and publishes the entry with a
 * release store of the new count. The lock is held across memfd_create and the write of the
 * body: that blocks another worker that misses at the same moment, but only until the first
 * response of each distinct body, at most EXT_MEMFD_MAX times in the life of the server.
 * Entries are closed only by server_free(), after the workers are joined, so an fd found here
 * stays open for as long as a coroutine may use it, even across a wait on another worker.
 * Returns the memfd, or -1 (table full, no memfd): send from memory. */
int static_ext_memfd(struct server *s, const char *ptr, size_t len)
{
    /* safety: acquire pairs with the release store below: entries [0, n) are fully written. */
    unsigned n = atomic_load_explicit(&s->ext_count, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (s->ext[i].ptr == ptr && s->ext[i].len == len)
            return s->ext[i].fd;
    if (n == EXT_MEMFD_MAX)
        return -1;
    pthread_mutex_lock(&s->ext_lock);
    /* safety: writers are serialised by ext_lock, so relaxed reads the latest count here. */
    n = atomic_load_explicit(&s->ext_count, memory_order_relaxed);
    int fd = -1;
    unsigned i;
    for (i = 0; i < n; i++) {
        if (s->ext[i].ptr == ptr && s->ext[i].len == len) {
            fd = s->ext[i].fd;
            break;
        }
    }
    if (i == n && n < EXT_MEMFD_MAX) {
        fd = static_body_memfd(ptr, len);
        s->ext[n].ptr = ptr;
        s->ext[n].len = len;
        s->ext[n].fd = fd;
        /* safety: release publishes the entry written above to lock-free readers. */
        atomic_store_explicit(&s->ext_count, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&s->ext_lock);
    return fd;
}
