/* uring_vs_epoll.c: an experiment, not a server. How many requests per server CPU-second can
 * anything get on keep-alive /plaintext on this machine, and how much does io_uring add over the
 * epoll + read + send pattern that cyserve (and Lwan) use?
 *
 * Both variants do the least an HTTP/1.1 server must: read what arrived, count complete request
 * heads (CRLFCRLF), answer each with the same fixed 'Hello, World!' response, one send per read.
 * No parsing, no routing, no timers, no Date: what is left is the cost of driving the kernel, a
 * floor under any real server's cost.
 *
 *   epoll  one epoll_wait per batch of ready connections (edge-triggered); per request one read
 *          and one send, as cyserve does
 *   uring  one io_uring_enter per loop turn (SINGLE_ISSUER + DEFER_TASKRUN): multishot accept,
 *          multishot recv into a provided-buffer ring, the sends queued as SQEs and submitted
 *          together with the wait
 *
 * Build and run (from the repository root; needs liburing-dev, which nothing else here needs):
 *   gcc -O2 -o /tmp/uring_vs_epoll bench/micro/uring_vs_epoll.c -luring
 *   python3 bench/micro/plaintext_floor.py 3 5 floor-epoll floor-uring cyserve-static
 * Results and method: docs/benchmarks.md, "The kernel's floor". Pipelined input is answered
 * (k responses for k heads) but the uring variant may reuse its buffer before such a send is
 * done: good enough for wrk without pipelining, which is all this measures. */
#define _GNU_SOURCE
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

static const char RESP[] = "HTTP/1.1 200 OK\r\nServer: p\r\nDate: Sun, 22 Nov 2026 02:00:00 GMT\r\n"
                           "Content-Type: text/plain\r\nContent-Length: 13\r\n\r\nHello, World!";
#define RESP_LEN (sizeof(RESP) - 1)
#define BUF_SZ 4096
#define MAX_FD 65536

static volatile sig_atomic_t stop;
static void on_sig(int s)
{
    (void)s;
    stop = 1;
}

static int listen_on(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 4096) < 0) {
        perror("listen");
        exit(1);
    }
    return fd;
}

/* Complete request heads in buf[0..n), carrying a partial CRLFCRLF match across reads in *st. */
static int count_heads(const char *buf, int n, int *st)
{
    static const char pat[] = "\r\n\r\n";
    int k = 0, s = *st;
    for (int i = 0; i < n; i++) {
        if (buf[i] == pat[s]) {
            if (++s == 4) {
                k++;
                s = 0;
            }
        } else {
            s = buf[i] == '\r' ? 1 : 0;
        }
    }
    *st = s;
    return k;
}

static char outbuf[64 * RESP_LEN];
static int state[MAX_FD];

static const char *responses(int k, size_t *len)
{
    /* k responses back to back (pipelined input only; wrk without pipelining sends k == 1). */
    if (k > 64)
        k = 64;
    for (int i = 1; i < k; i++)
        memcpy(outbuf + i * RESP_LEN, RESP, RESP_LEN);
    memcpy(outbuf, RESP, RESP_LEN);
    *len = (size_t)k * RESP_LEN;
    return outbuf;
}

static int run_epoll(int lfd)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    static char buf[BUF_SZ];
    struct epoll_event evs[512];
    while (!stop) {
        int n = epoll_wait(ep, evs, 512, 200);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd) {
                int c;
                while ((c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    int one = 1;
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                    state[c] = 0;
                    struct epoll_event ce = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET,
                                             .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            for (;;) {
                ssize_t r = read(fd, buf, sizeof(buf));
                if (r <= 0) {
                    if (r == 0 || errno != EAGAIN)
                        close(fd);
                    break;
                }
                int k = count_heads(buf, (int)r, &state[fd]);
                if (k) {
                    size_t len;
                    const char *p = responses(k, &len);
                    send(fd, p, len, MSG_NOSIGNAL);
                }
                if (r < (ssize_t)sizeof(buf))
                    break; /* drained: the next request comes with the next edge */
            }
        }
    }
    return 0;
}

enum { T_ACCEPT = 1, T_RECV = 2, T_SEND = 3 };
#define UD(t, fd) (((uint64_t)(t) << 32) | (uint32_t)(fd))
#define NBUFS 1024

static struct io_uring ring;
static struct io_uring_buf_ring *br;
static char *bufs;

static struct io_uring_sqe *sqe_get(void)
{
    struct io_uring_sqe *s = io_uring_get_sqe(&ring);
    if (!s) {
        io_uring_submit(&ring);
        s = io_uring_get_sqe(&ring);
    }
    return s;
}

static void arm_recv(int fd)
{
    struct io_uring_sqe *s = sqe_get();
    io_uring_prep_recv_multishot(s, fd, NULL, 0, 0);
    s->flags |= IOSQE_BUFFER_SELECT;
    s->buf_group = 0;
    io_uring_sqe_set_data64(s, UD(T_RECV, fd));
}

static int run_uring(int lfd)
{
    struct io_uring_params p = {.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                                         IORING_SETUP_CQSIZE,
                                .cq_entries = 16384};
    int rc = io_uring_queue_init_params(4096, &ring, &p);
    if (rc < 0) {
        fprintf(stderr, "io_uring_queue_init_params: %s\n", strerror(-rc));
        return 1;
    }
    size_t brsz = NBUFS * sizeof(struct io_uring_buf);
    br = mmap(NULL, brsz, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    bufs = malloc((size_t)NBUFS * BUF_SZ);
    struct io_uring_buf_reg reg = {
        .ring_addr = (unsigned long)br, .ring_entries = NBUFS, .bgid = 0};
    if ((rc = io_uring_register_buf_ring(&ring, &reg, 0)) < 0) {
        fprintf(stderr, "io_uring_register_buf_ring: %s\n", strerror(-rc));
        return 1;
    }
    io_uring_buf_ring_init(br);
    for (int i = 0; i < NBUFS; i++)
        io_uring_buf_ring_add(br, bufs + (size_t)i * BUF_SZ, BUF_SZ, (unsigned short)i,
                              io_uring_buf_ring_mask(NBUFS), i);
    io_uring_buf_ring_advance(br, NBUFS);

    struct io_uring_sqe *s = sqe_get();
    io_uring_prep_multishot_accept(s, lfd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(s, UD(T_ACCEPT, lfd));

    struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = 200 * 1000000};
    while (!stop) {
        struct io_uring_cqe *cqe;
        rc = io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &ts, NULL);
        if (rc < 0 && rc != -ETIME && rc != -EINTR) {
            fprintf(stderr, "submit_and_wait: %s\n", strerror(-rc));
            return 1;
        }
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe)
        {
            seen++;
            uint64_t ud = io_uring_cqe_get_data64(cqe);
            int t = (int)(ud >> 32), fd = (int)(uint32_t)ud, res = cqe->res;
            if (t == T_ACCEPT) {
                if (res >= 0) {
                    int one = 1;
                    setsockopt(res, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                    state[res] = 0;
                    arm_recv(res);
                }
                if (!(cqe->flags & IORING_CQE_F_MORE)) {
                    s = sqe_get();
                    io_uring_prep_multishot_accept(s, lfd, NULL, NULL, SOCK_CLOEXEC);
                    io_uring_sqe_set_data64(s, UD(T_ACCEPT, lfd));
                }
            } else if (t == T_RECV) {
                if (res > 0) {
                    int bid = (int)(cqe->flags >> IORING_CQE_BUFFER_SHIFT);
                    char *b = bufs + (size_t)bid * BUF_SZ;
                    int k = count_heads(b, res, &state[fd]);
                    io_uring_buf_ring_add(br, b, BUF_SZ, (unsigned short)bid,
                                          io_uring_buf_ring_mask(NBUFS), 0);
                    io_uring_buf_ring_advance(br, 1);
                    if (k) {
                        size_t len;
                        const char *out = k == 1 ? RESP : responses(k, &len);
                        if (k == 1)
                            len = RESP_LEN;
                        s = sqe_get();
                        io_uring_prep_send(s, fd, out, len, MSG_NOSIGNAL);
                        io_uring_sqe_set_data64(s, UD(T_SEND, fd));
                    }
                    if (!(cqe->flags & IORING_CQE_F_MORE))
                        arm_recv(fd);
                } else if (res == -ENOBUFS) {
                    arm_recv(fd);
                } else {
                    close(fd);
                }
            }
            /* T_SEND: the 200-byte response always fits the socket buffer here. */
        }
        io_uring_cq_advance(&ring, seen);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s epoll|uring PORT\n", argv[0]);
        return 2;
    }
    signal(SIGINT, on_sig);
    signal(SIGTERM, on_sig);
    signal(SIGPIPE, SIG_IGN);
    int lfd = listen_on(atoi(argv[2]));
    return strcmp(argv[1], "uring") == 0 ? run_uring(lfd) : run_epoll(lfd);
}
