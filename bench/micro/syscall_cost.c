/* syscall_cost.c: an experiment, not a server. What the system calls a server may make around a
 * new connection cost on this machine, in nanoseconds of CPU each, so that a difference in
 * their count per connection (bench/micro/cg_tls_handshake.sh with STRACE=1) can be set beside
 * the connection's whole cost. callgrind counts user-space instructions only: a system call is
 * one instruction to it, whatever the kernel does for it.
 *
 *   accept4-EAGAIN   accept4() on a listening socket with an empty queue (non-blocking)
 *   setsockopt       TCP_NODELAY on a connected TCP socket
 *   epoll_ctl-pair   EPOLL_CTL_ADD then EPOLL_CTL_DEL of a connected socket (a DEL alone
 *                    cannot be repeated; it costs part of the pair)
 *   poll-listener    poll() of the listener alone, not waiting (is a connection queued?)
 *   getpid           the cheapest call there is: the entry and exit alone
 *
 * Each is timed over ROUNDS calls with the thread's CPU clock (CLOCK_THREAD_CPUTIME_ID), so
 * that time the machine gives to others is not counted; the median of RUNS runs is printed.
 *
 * Build and run (from the repository root):
 *   gcc -O2 -o /tmp/syscall_cost bench/micro/syscall_cost.c && /tmp/syscall_cost
 * Results and method: docs/benchmarks.md, "New connections: the system calls around OpenSSL". */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 200000
#define RUNS 7

static double cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A listener on the loopback (empty queue) and one connected pair from it. */
static int lfd, cfd, sfd, epfd;

static void setup(void)
{
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 16) < 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &len) < 0) {
        perror("listener");
        exit(1);
    }
    cfd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(cfd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        perror("connect");
        exit(1);
    }
    while ((sfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) < 0)
        usleep(1000);
    epfd = epoll_create1(0);
}

/* ns per call of one kind: the whole loop timed at once (reading a thread's CPU clock is a
 * system call too, so timing each call would count it). */
static double once(int kind)
{
    int one = 1;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET};
    double t0 = cpu_ns();
    for (int i = 0; i < ROUNDS; i++) {
        switch (kind) {
        case 0:
            if (accept4(lfd, NULL, NULL, SOCK_NONBLOCK) >= 0)
                abort(); /* nobody connects: the queue stays empty */
            break;
        case 1:
            setsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            break;
        case 2:
            epoll_ctl(epfd, EPOLL_CTL_ADD, sfd, &ev);
            epoll_ctl(epfd, EPOLL_CTL_DEL, sfd, NULL);
            break;
        case 3: {
            struct pollfd p = {.fd = lfd, .events = POLLIN};
            if (poll(&p, 1, 0) != 0)
                abort(); /* nobody connects: nothing is queued */
            break;
        }
        default:
            getpid();
        }
    }
    return (cpu_ns() - t0) / ROUNDS;
}

int main(void)
{
    static const char *names[] = {"accept4-EAGAIN", "setsockopt", "epoll_ctl-pair", "poll-listener",
                                  "getpid"};
    setup();
    for (int k = 0; k < 5; k++) {
        double runs[RUNS];
        for (int r = 0; r < RUNS; r++)
            runs[r] = once(k);
        qsort(runs, RUNS, sizeof(runs[0]), cmp);
        printf("%-15s %7.1f ns (runs %.1f-%.1f)\n", names[k], runs[RUNS / 2], runs[0],
               runs[RUNS - 1]);
    }
    return 0;
}
