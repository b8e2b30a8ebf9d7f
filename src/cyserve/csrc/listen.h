/* listen.h: the listening sockets and each worker's control descriptor (listen.c). Internal
 * to the engine; error convention 0 or -errno. */
#ifndef CYSERVE_LISTEN_H
#define CYSERVE_LISTEN_H

#include "sched.h"

struct addrinfo;

/* The scheduler's worker start hook (ud: the struct server): registers worker id's listener
 * and control eventfd in its epoll. On the worker's thread, before its loop runs. */
void listen_worker_start(struct sched *sched, unsigned id, void *ud);

/* A listening socket for ai's address on port (0: an ephemeral one), SO_REUSEPORT when
 * reuseport; backlog 0: bound only, not listening (a probe that must take no connection).
 * 0 and *out set, or -errno (nothing left open). Control thread. */
int listen_open(const struct addrinfo *ai, int port, int reuseport, int backlog, int *out);

/* Turn Nagle's algorithm off on listener fd, for every connection it will accept (Linux copies
 * a listener's socket options into each one). 0 (done, or fd is not TCP: a Unix socket has no
 * Nagle), or -errno: then set it on each connection. Control thread, before the workers. */
int listen_set_nodelay(int fd);

/* The port socket fd is bound to, or -errno. */
int listen_bound_port(int fd);

#endif
