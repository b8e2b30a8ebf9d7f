/* faults.c: an LD_PRELOAD shim that makes system calls fail now and then, to show that the server
 * keeps serving, frees what it held and says so (tests/e2e/test_faults.py).
 *
 * CYSERVE_FAULTS lists what to inject, "call=ERRNO:PERMILLE" separated by commas, e.g.
 *   accept4=EMFILE:200,sendmsg=EPIPE:20,sendfile=ECONNRESET:50,epoll_ctl=ENOMEM:20
 * Calls: accept4, sendmsg, sendto, writev, sendfile, recvfrom, read, epoll_ctl (EPOLL_CTL_ADD
 * only: a failed removal would only be a kernel-side leak), and, in a shim built with
 * -DFAULTS_MALLOC, malloc (calloc and realloc too, made by the engine only: see the end). ERRNO: EMFILE, ENFILE, EPIPE,
 * ECONNRESET, ENOMEM, ENOSPC, EIO. The send and receive calls fail only on sockets (an fstat on
 * the injecting path), so that the access log on a pipe and the eventfds are left alone.
 * CYSERVE_FAULTS_FROM_MS / CYSERVE_FAULTS_UNTIL_MS (from the shim's load; default 0 / forever)
 * bound the window; CYSERVE_FAULTS_SEED seeds the choice; CYSERVE_FAULTS_REPORT names a file
 * that gets "call count" lines at exit. CYSERVE_FAULTS_GATE names a file: with it, nothing is
 * injected before that file exists, and the window's bounds count from when the shim first
 * finds it (looked for at most every 10 ms, from the intercepted calls). A test opens the window
 * when its server is up, however long a slow machine took to start it, instead of guessing a
 * time from the shim's load.
 * A release build makes recv and send directly (csrc/conn.h), so recvfrom and sendto are only
 * reached under the sanitizer build, where the libc calls stay. Put this shim first in
 * LD_PRELOAD, before the sanitizer runtimes (ASAN_OPTIONS=verify_asan_link_order=0). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum {
    F_ACCEPT4,
    F_SENDMSG,
    F_SENDTO,
    F_WRITEV,
    F_SENDFILE,
    F_RECVFROM,
    F_READ,
    F_EPOLL_CTL,
    F_MALLOC,
    F_N
};
static const char *const names[F_N] = {"accept4",  "sendmsg", "sendto",    "writev", "sendfile",
                                       "recvfrom", "read",    "epoll_ctl", "malloc"};
static int err_of[F_N];
static unsigned permille[F_N];
static atomic_ulong injected[F_N];
/* The window. Written once more when a gate opens (gate_check): until_ns first, then from_ns,
 * both sequentially consistent, so that a thread that reads the new from_ns (window_open reads
 * it first) reads the new until_ns too. */
static _Atomic uint64_t from_ns, until_ns = UINT64_MAX;
static uint64_t t0, from_off, until_off = UINT64_MAX;
static const char *gate;
static _Atomic uint64_t gate_looked_ns;
static atomic_ullong rng_state;
static const char *report;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int errno_named(const char *s)
{
    static const struct {
        const char *n;
        int e;
    } t[] = {{"EMFILE", EMFILE}, {"ENFILE", ENFILE}, {"EPIPE", EPIPE}, {"ECONNRESET", ECONNRESET},
             {"ENOMEM", ENOMEM}, {"ENOSPC", ENOSPC}, {"EIO", EIO}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strcmp(s, t[i].n) == 0)
            return t[i].e;
    return 0;
}

__attribute__((constructor)) static void faults_init(void)
{
    t0 = now_ns();
    const char *v = getenv("CYSERVE_FAULTS_FROM_MS");
    if (v)
        from_off = strtoull(v, NULL, 10) * 1000000ull;
    v = getenv("CYSERVE_FAULTS_UNTIL_MS");
    if (v)
        until_off = strtoull(v, NULL, 10) * 1000000ull;
    gate = getenv("CYSERVE_FAULTS_GATE");
    if (gate) {
        from_ns = UINT64_MAX; /* closed until the gate's file appears */
    } else {
        from_ns = t0 + from_off;
        until_ns = until_off == UINT64_MAX ? UINT64_MAX : t0 + until_off;
    }
    v = getenv("CYSERVE_FAULTS_SEED");
    atomic_store(&rng_state, v ? strtoull(v, NULL, 10) | 1 : 0x9E3779B97F4A7C15ull);
    report = getenv("CYSERVE_FAULTS_REPORT");
    const char *spec = getenv("CYSERVE_FAULTS");
    if (!spec)
        return;
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '='), *colon = eq ? strchr(eq, ':') : NULL;
        if (!eq || !colon)
            continue;
        *eq = *colon = 0;
        for (int i = 0; i < F_N; i++) {
            if (strcmp(item, names[i]) == 0) {
                err_of[i] = errno_named(eq + 1);
                permille[i] = (unsigned)strtoul(colon + 1, NULL, 10);
            }
        }
    }
}

__attribute__((destructor)) static void faults_report(void)
{
    if (!report)
        return;
    FILE *f = fopen(report, "w");
    if (!f)
        return;
    for (int i = 0; i < F_N; i++)
        fprintf(f, "%s %lu\n", names[i], atomic_load(&injected[i]));
    fclose(f);
}

/* Opens the window when the gate's file has appeared (CYSERVE_FAULTS_GATE). access() neither
 * allocates nor is intercepted here, so the malloc shim may call it. Two threads that find the
 * file at once both open the window, a few microseconds apart: either bound will do. */
static void gate_check(uint64_t t)
{
    uint64_t last = atomic_load_explicit(&gate_looked_ns, memory_order_relaxed);
    if (t - last < 10000000ull)
        return;
    atomic_store_explicit(&gate_looked_ns, t, memory_order_relaxed);
    if (access(gate, F_OK) != 0)
        return;
    atomic_store(&until_ns, until_off == UINT64_MAX ? UINT64_MAX : t + until_off);
    atomic_store(&from_ns, t + from_off);
}

/* Is t inside the window? */
static int window_open(uint64_t t)
{
    uint64_t from = atomic_load(&from_ns);
    if (from == UINT64_MAX) {
        if (gate)
            gate_check(t);
        return 0;
    }
    return t >= from && t < atomic_load(&until_ns);
}

/* Inject call k now? Sets errno and counts when it does. */
static int fault(int k, int fd)
{
    if (!permille[k] || !err_of[k])
        return 0;
    uint64_t t = now_ns();
    if (!window_open(t))
        return 0;
    /* xorshift64*, shared: a lost update only repeats a number. */
    unsigned long long x = atomic_load_explicit(&rng_state, memory_order_relaxed);
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    atomic_store_explicit(&rng_state, x, memory_order_relaxed);
    if ((unsigned)(((x * 0x2545F4914F6CDD1Dull) >> 33) % 1000) >= permille[k])
        return 0;
    if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
            return 0;
    }
    atomic_fetch_add(&injected[k], 1);
    errno = err_of[k];
    return 1;
}

/* The next definition of name (libc's, or a sanitizer's interceptor), looked up once. */
#define REAL(name)                                                                                 \
    ({                                                                                             \
        static __typeof__(&name) real_;                                                            \
        if (!real_)                                                                                \
            real_ = (__typeof__(&name))dlsym(RTLD_NEXT, #name);                                    \
        real_;                                                                                     \
    })

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    if (fault(F_ACCEPT4, -1))
        return -1;
    return REAL(accept4)(fd, addr, len, flags);
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    if (fault(F_SENDMSG, fd))
        return -1;
    return REAL(sendmsg)(fd, msg, flags);
}

ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *a,
               socklen_t alen)
{
    if (fault(F_SENDTO, fd))
        return -1;
    return REAL(sendto)(fd, buf, len, flags, a, alen);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
    if (fault(F_WRITEV, fd))
        return -1;
    return REAL(writev)(fd, iov, cnt);
}

ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
    if (fault(F_SENDFILE, out))
        return -1;
    return REAL(sendfile)(out, in, off, count);
}

ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *a, socklen_t *alen)
{
    if (fault(F_RECVFROM, fd))
        return -1;
    return REAL(recvfrom)(fd, buf, len, flags, a, alen);
}

ssize_t read(int fd, void *buf, size_t len)
{
    if (fault(F_READ, fd))
        return -1;
    return REAL(read)(fd, buf, len);
}

int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
    if (op == EPOLL_CTL_ADD && fault(F_EPOLL_CTL, -1))
        return -1;
    return REAL(epoll_ctl)(epfd, op, fd, ev);
}

#ifdef FAULTS_MALLOC
/* malloc, calloc and realloc (CYSERVE_FAULTS "malloc=ENOMEM:PERMILLE", one rate for the three)
 * fail only when the engine calls them: the caller's return address lies in cyserve's native
 * extension (cyserve/_core*.so: the C runtime and the Cython layer), never in Python's allocator
 * or libc, so that each failure lands on a path the engine itself must handle. Built only with
 * -DFAULTS_MALLOC (tests/e2e/test_faults.py builds a second shim): interposing malloc costs every
 * allocation of the process a call and a check. */
#include <link.h>

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t k, size_t n);
extern void *__libc_realloc(void *p, size_t n);

/* Set while this thread resolves or inspects: its own allocations go straight to libc. */
static _Thread_local int busy;
/* The extension's loaded range, once known (0, 0 before). */
static _Atomic uintptr_t core_lo, core_hi;

static int core_segments(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    if (info->dlpi_addr != (uintptr_t)arg)
        return 0;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (a < lo)
            lo = a;
        if (a + ph->p_memsz > hi)
            hi = a + ph->p_memsz;
    }
    atomic_store(&core_lo, lo);
    atomic_store(&core_hi, hi);
    return 1;
}

static int from_engine(const void *ret)
{
    uintptr_t hi = atomic_load_explicit(&core_hi, memory_order_relaxed);
    if (hi)
        return (uintptr_t)ret >= atomic_load_explicit(&core_lo, memory_order_relaxed) &&
               (uintptr_t)ret < hi;
    Dl_info info;
    if (!dladdr(ret, &info) || !info.dli_fname || !strstr(info.dli_fname, "cyserve/_core"))
        return 0;
    dl_iterate_phdr(core_segments, info.dli_fbase);
    return 1;
}

/* Fail this allocation, called from ret? Cheap outside the window. */
static int alloc_fault(const void *ret)
{
    if (!permille[F_MALLOC] || busy)
        return 0;
    if (!window_open(now_ns()))
        return 0;
    busy = 1;
    int mine = from_engine(ret);
    busy = 0;
    return mine && fault(F_MALLOC, -1);
}

#define REAL_ALLOC(name, libc_name)                                                                \
    ({                                                                                             \
        static __typeof__(&name) real_;                                                            \
        __typeof__(&name) r_ = real_;                                                              \
        if (!r_) {                                                                                 \
            if (busy) {                                                                            \
                r_ = libc_name;                                                                    \
            } else {                                                                               \
                busy = 1;                                                                          \
                r_ = real_ = (__typeof__(&name))dlsym(RTLD_NEXT, #name);                           \
                busy = 0;                                                                          \
            }                                                                                      \
        }                                                                                          \
        r_;                                                                                        \
    })

void *malloc(size_t n)
{
    if (alloc_fault(__builtin_return_address(0)))
        return NULL;
    return REAL_ALLOC(malloc, __libc_malloc)(n);
}

void *calloc(size_t k, size_t n)
{
    if (alloc_fault(__builtin_return_address(0)))
        return NULL;
    return REAL_ALLOC(calloc, __libc_calloc)(k, n);
}

void *realloc(void *p, size_t n)
{
    if (alloc_fault(__builtin_return_address(0)))
        return NULL;
    return REAL_ALLOC(realloc, __libc_realloc)(p, n);
}
#endif
