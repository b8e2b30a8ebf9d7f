/* listen.c: the listeners and the per-worker control descriptor: accepting connections, and
 * the worker's part of a shutdown (stop accepting, close the idle connections).
 *
 * Workers. The scheduler (sched.h) runs N worker threads. The control thread binds N listening
 * sockets with SO_REUSEPORT before the workers start (so a port in use is reported at once, and
 * port 0 resolves to one port for all of them); each worker's start hook registers its own
 * listener in its own epoll (sched_io_add). The kernel spreads new connections over the
 * listeners by hash, so accepting needs no lock and no cross-thread hand-off. This is lwan's and
 * nginx's reuseport layout.
 *
 * Shared listeners. A Unix socket and a descriptor inherited from a parent (systemd's socket
 * activation, --fd) cannot be cloned per worker: SO_REUSEPORT makes a group of sockets bound to one
 * address, and a Unix path names one socket (a second bind fails), while an inherited socket is one
 * that somebody else made. So such a listener is one descriptor, registered in every worker's epoll
 * (edge-triggered, unlike a worker's own: see Accepting), and each worker has a slot for it (struct
 * server_lslot) with the same acceptor. A new connection wakes the workers parked on it and the
 * first accept4 wins; the others meet EAGAIN and release their slot. That is one wasted wake-up per
 * parked worker and connection, not per request (keep-alive connections stay on the worker that
 * accepted them). EPOLLEXCLUSIVE would wake one worker only, but it can only be set when the
 * descriptor is added to an epoll (the scheduler's sched_io_add and sched_io_add_level set the
 * flags of every registration), and putting the listener in an epoll of its own nested in the
 * worker's does not help: the kernel counts a wake-up against the flag only for a thread waiting in
 * that epoll itself, so every nested one is woken. A shared descriptor is never shut down by a stop
 * (listen_shut): other workers, sibling processes under a supervisor, or systemd hold it too, and
 * what arrives after this process's last accept stays queued for them. The engine borrows it: the
 * caller closes it (and unlinks a Unix socket's path).
 *
 * Accepting. A listener's readiness calls listen_on_ready() on its worker, which spawns a short
 * accept coroutine: it registers each connection it takes edge-triggered on the worker that
 * runs the accept (it becomes the connection's home), then sched_io_release()s the listener so
 * that its next readiness calls on_ready again. A worker's own listener is level-triggered
 * (sched_io_add_level): the next poll reports it again while its queue holds more, so no accept4
 * has to meet EAGAIN to be sure it is empty (that EAGAIN costs about 4.7 us of CPU on a VM:
 * accept4 makes the new socket before it looks at the queue; docs/architecture.md,
 * "Accepting"); a poll() of the listener alone, a tenth of that, says whether to go on, and
 * only when the worker has other work queued (sched_worker_queued): otherwise its next look at
 * its epoll, right after the acceptor, answers the same question for free. While the acceptor
 * cannot take what is queued (a pause out of descriptors) or never will (the listener is shut),
 * it stops watching it (sched_io_watch): level-triggered, it would end every poll at once. A
 * shared listener is edge-triggered, in every worker's epoll, and must be read until EAGAIN (in
 * batches of LISTEN_ACCEPT_BATCH, yielding between batches so one flood of connections cannot
 * starve the requests of this worker); level-triggered it would wake every worker at every poll
 * until one took the connection. A stop drains any listener to EAGAIN (below). Connections
 * inherit TCP_NODELAY from the listener (listen_set_nodelay). The epoll_ctl DEL before a
 * connection's close stays (conn_destroy): a child process may share the socket's open file, and
 * close() alone would then leave the registration pointing at freed memory.
 *
 * Each connection is opened with the protocol and transport of its listener: HTTP/1.1
 * (http1_proto) over plain sockets (conn_plain), or over the server's transport when one is
 * configured (cfg.transport: TLS, tls.c).
 *
 * Shutdown, on the worker. server_shutdown (server.c) writes every worker's control eventfd;
 * listen_ctl_on_ready() then arms a zero-delay timer that closes every idle connection in the
 * same loop turn (from the timer pass, never from inside the event batch) unless its next
 * request has already arrived: that one is answered with Connection: close. And it drains the
 * listener before shutting it: shutdown(SHUT_RD) on a listening socket resets every connection
 * still in its accept queue (each listener of a SO_REUSEPORT group has a queue of its own, which
 * no other listener takes over), so a client whose connection the kernel had taken, request
 * sent, would lose it. An acceptor runs until the queue is empty, opening what it takes like any
 * connection (its request is answered with Connection: close), then shuts the listener (no new
 * connections, accept fails) and closes what it opened that has sent nothing. The stop waits for
 * every listener to be drained so (server.c). A connection that completes its handshake between
 * the acceptor's last accept and the shutdown is still reset: a window of microseconds. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "listen.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "conn.h"
#include "coro.h"
#include "http1.h"
#include "sched.h"
#include "server_int.h"

/* Connections accepted before the accept coroutine yields to the requests of its worker. */
#define LISTEN_ACCEPT_BATCH 64
/* How long a stop leaves a connection that was accepted but has sent nothing yet: its client
 * has just connected, and its request is on its way (a stop drains the accept queues, so it
 * accepts such connections itself). Closing it at once would reset a client that did nothing
 * wrong; one that sends nothing within this is closed like any idle connection. */
#define LISTEN_FRESH_GRACE_NS (200ull * 1000 * 1000)
/* The pause of an acceptor out of descriptors or memory: the first one, doubled while the
 * failures go on, up to the last. */
#define LISTEN_BACKOFF_MIN_NS (10ull * 1000 * 1000)
#define LISTEN_BACKOFF_MAX_NS (80ull * 1000 * 1000)

/* Say on standard error why accepting pauses (err: EMFILE, ENFILE, ENOBUFS or ENOMEM), at most
 * once a second per process: silent, a server at its descriptor limit leaves clients hanging in
 * the accept queue with nothing to tell the operator why; a line per retry would flood the log.
 * Any thread. */
static void listen_note_accept_failure(int err)
{
    static struct clock_once_a_second gate;
    unsigned long long more;
    if (!clock_once_a_second(&gate, &more))
        return;
    char what[160], tail[64] = "", line[384];
    struct rlimit rl;
    if (err == EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        snprintf(what, sizeof(what),
                 "too many open files (EMFILE): the process is at its "
                 "limit of %llu descriptors; raise it (ulimit -n)",
                 (unsigned long long)rl.rlim_cur);
    else if (err == EMFILE)
        snprintf(what, sizeof(what),
                 "too many open files (EMFILE): the process is at its "
                 "descriptor limit; raise it (ulimit -n)");
    else if (err == ENFILE)
        snprintf(what, sizeof(what),
                 "too many open files in the system (ENFILE): raise "
                 "fs.file-max or close files elsewhere");
    else
        snprintf(what, sizeof(what), "out of memory (%s)", err == ENOBUFS ? "ENOBUFS" : "ENOMEM");
    if (more)
        snprintf(tail, sizeof(tail), " (%llu more failures since the last line)", more);
    int n = snprintf(line, sizeof(line),
                     "cyserve: cannot accept connections: %s; new "
                     "connections wait in the queue, retried every %llu-%llu ms%s\n",
                     what, LISTEN_BACKOFF_MIN_NS / 1000000, LISTEN_BACKOFF_MAX_NS / 1000000, tail);
    if (n > 0) {
        ssize_t wr = write(2, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
        (void)wr; /* nothing to do if standard error is gone */
    }
}

/* Shut l's listener (no new connections; accept fails from now on), once its queue has been
 * drained by a stop, and tell the stop's wait. A shared descriptor is not shut down: other
 * workers and other processes (siblings under a supervisor, systemd's socket) may go on
 * accepting from it, and what arrives after this worker's last accept waits in its queue for
 * them. Any thread; only the first call does it. */
static void listen_shut(struct server_lslot *l)
{
    /* safety: the exchange elects one caller. The release orders the connections this
     * coroutine opened (the live count) before the stop's wait sees this listener done. */
    if (atomic_exchange_explicit(&l->shut, 1, memory_order_relaxed))
        return;
    if (!l->shared)
        shutdown(l->fd, SHUT_RD);
    atomic_fetch_sub_explicit(&l->w->srv->undrained, 1, memory_order_release);
}

/* Responses go out in one write, and Nagle would only delay them. Set on the listener, it holds
 * for every connection accepted from it, so one call at the start replaces one per connection. */
int listen_set_nodelay(int fd)
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof(sa);
    if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
        return -errno;
    if (sa.ss_family != AF_INET && sa.ss_family != AF_INET6)
        return 0;
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
        return -errno;
    return 0;
}

/* Watch l's level-triggered listener again after a pause (listen_acceptor). Until that works
 * nothing would call on_ready again, so a failure (epoll_ctl out of memory) keeps the calling
 * acceptor, which pauses and tries again. A listener that a stop's acceptor shut meanwhile is
 * left unwatched: it would report a hang-up at every poll (accept4 now fails, and the stop's
 * path follows). 0, or -ECANCELED (the scheduler stops). Coroutine only. */
static int listen_rewatch(struct server_lslot *l, uint64_t pause)
{
    for (;;) {
        int rc = sched_home_enter((int)l->w->id);
        if (rc >= 0) {
            /* safety: relaxed: the shutting acceptor stops watching l in a section of this
             * home after its exchange, so either this section follows that one (its lock
             * orders the exchange before this load, which sees it) or that one follows this
             * and removes what this adds. */
            if (!atomic_load_explicit(&l->shut, memory_order_relaxed))
                rc = sched_io_watch(&l->io, 1);
            else
                rc = 0;
            sched_home_exit();
        }
        if (rc == 0 || rc == -EEXIST) /* EEXIST: the pause's DEL had failed */
            return 0;
        if (sched_sleep_ns(pause) < 0)
            return -ECANCELED;
    }
}

/* Whether listener fd has a connection queued (a poll() that does not wait). */
static int listen_more_queued(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

static int listen_acceptor(struct coro *co, void *arg)
{
    struct server_lslot *l = arg;
    struct server *s = l->w->srv;
    uint64_t backoff = LISTEN_BACKOFF_MIN_NS;
    unsigned stopping_taken = 0;
    for (;;) {
        for (int i = 0; i < LISTEN_ACCEPT_BATCH; i++) {
            /* A shared listener of a worker process under a supervisor is not drained by a
             * stop: its siblings, or the worker replacing this one, accept what it queues,
             * and what this one would take now could not be served for long. */
            if (UNLIKELY(l->shared && s->cfg.shared_port && server_draining(s)))
                goto drained;
            int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (LIKELY(fd >= 0)) {
                backoff = LISTEN_BACKOFF_MIN_NS;
                if (UNLIKELY(l->nodelay_each))
                    listen_set_nodelay(fd);
                /* While stopping too: the client's request is answered with Connection: close
                 * (closing it here would reset it). */
                conn_open(s, l->w->id, fd, &http1_proto,
                          s->cfg.transport ? s->cfg.transport : &conn_plain);
                if (UNLIKELY(server_draining(s))) {
                    /* What was queued when the stop began is at most a backlog; more is a
                     * flood arriving since, which the stop does not wait for. */
                    if (++stopping_taken > (unsigned)s->cfg.backlog)
                        goto drained;
                    continue; /* a stop empties the queue before it shuts the listener */
                }
                /* Level-triggered: no accept4 has to meet EAGAIN to be sure the queue is
                 * empty (the next poll reports the listener again if it is not). But a burst
                 * queued behind a busy worker is taken now, not one connection per loop turn
                 * (a turn may be a batch of slow Python calls): a poll() of the listener alone
                 * says whether more wait, for a tenth of what an accept4 that fails costs.
                 * That poll is needed only when the worker's next look at its epoll is far:
                 * with nothing queued on it (no coroutine, no offloaded call; conn_open
                 * spawns none), that look comes right after this coroutine ends, and reports
                 * the listener again if more wait, so the poll would ask what it is about to
                 * answer. That is the common case of connections arriving one at a time, and
                 * it saves them one system call each (docs/benchmarks.md, "Session 17"). */
                if (LIKELY(l->level) &&
                    (!sched_worker_queued((int)l->w->id) || !listen_more_queued(l->fd)))
                    goto drained;
                continue;
            }
            int err = errno;
            switch (err) {
            case EINTR:
            case ECONNABORTED:
            case EPROTO:
                continue; /* that one connection is gone; the next may be fine */
            case EAGAIN:
                goto drained;
            case EMFILE:
            case ENFILE:
            case ENOBUFS:
            case ENOMEM:
                /* Out of descriptors or memory: the pending connection stays queued, and the
                 * edge-triggered registration would not fire again for it, so retry after a
                 * pause (this listener takes nothing meanwhile; its registration stays with
                 * this coroutine), longer while the failures go on, and say why. A
                 * level-triggered listener is not watched during the pause: it stays readable,
                 * and every poll of this worker would return at once for it. */
                listen_note_accept_failure(err);
                if (l->level)
                    sched_io_watch(&l->io, 0);
                if (sched_sleep_ns(backoff) < 0)
                    return 0;
                if (l->level && listen_rewatch(l, backoff) < 0)
                    return 0;
                if (backoff < LISTEN_BACKOFF_MAX_NS)
                    backoff *= 2;
                continue;
            default:
                /* EINVAL/EBADF: the listener was shut down by a stop (listen_shut). Keep the
                 * registration active so that on_ready is never called again (a
                 * level-triggered one is no longer watched: it would report the shut listener
                 * at every poll). */
                if (server_draining(s))
                    goto drained; /* and close what this acceptor opened that is idle */
                if (l->level)
                    sched_io_watch(&l->io, 0);
                return 0;
            }
        }
        if (sched_yield() < 0)
            return 0;
        continue;
    drained:
        if (UNLIKELY(server_draining(s))) {
            /* Stopping, and the queue is empty (or a backlog's worth was taken): the listener
             * can be shut without resetting anyone. The registration stays active, so on_ready
             * is never called again. What this worker just opened is closed by its idle pass
             * unless its request has arrived. */
            listen_shut(l);
            if (l->level)
                sched_io_watch(&l->io, 0); /* shut down, it reports a hang-up forever */
            int home = sched_home_enter((int)l->w->id);
            if (home >= 0) {
                sched_timer_arm(&s->workers[home].ctl_timer, 0);
                sched_home_exit();
            }
            return 0;
        }
        if (sched_io_release(&l->io) == -EAGAIN)
            continue;
        return 0;
    }
}

static void listen_on_ready(struct sched_io *io, uint32_t events)
{
    struct server_lslot *l = io->data;
    if (UNLIKELY(sched_spawn(l->w->srv->sched, listen_acceptor, l) < 0))
        return; /* stopping: nothing more to accept */
}

static int listen_ctl_rearm(struct coro *co, void *arg)
{
    struct server_worker *w = arg;
    sched_io_release(&w->ctl_io);
    return 0;
}

/* Timer callback (home's loop lock held) armed by listen_ctl_on_ready: close every idle connection.
 * Armed again by an acceptor that drained a listener during a stop, for what it opened. This
 * runs from the timer pass, after the poll's batch of events: closing connections from inside
 * the batch could free a connection whose event is still waiting further down it. */
static void listen_ctl_close_idle(struct sched_timer *t)
{
    struct server_worker *w = t->data;
    struct conn *c = w->conns;
    uint64_t now = sched_now_ns(), again = 0;
    while (c) {
        struct conn *next = c->next;
        /* An idle connection whose next request has already arrived (its readiness not yet
         * reported) is left to the poll: its coroutine answers that request with Connection:
         * close. Closing over unread bytes would reset it, and the request would be lost. A
         * connection just accepted gets LISTEN_FRESH_GRACE_NS for its first bytes. */
        char b;
        if (!c->busy && conn_sock_peek(c->io.fd, &b) <= 0) {
            uint64_t until = c->idle_since + LISTEN_FRESH_GRACE_NS;
            if (c->fresh && until > now) {
                if (!again || until < again)
                    again = until;
            } else {
                conn_destroy(c);
            }
        }
        c = next;
    }
    if (again)
        sched_timer_arm(&w->ctl_timer, again);
}

/* Callback (home's loop lock held), not in a coroutine: server_shutdown wrote our eventfd.
 * One-shot: the io stays active afterwards, so this never runs twice. */
static void listen_ctl_on_ready(struct sched_io *io, uint32_t events)
{
    struct server_worker *w = io->data;
    if (!server_draining(w->srv)) {
        /* Not a shutdown (an eventfd is always writable, and a scheduler may report that):
         * make the registration idle again so that the real wake-up calls us. */
        sched_spawn(w->srv->sched, listen_ctl_rearm, w);
        return;
    }
    /* Stop taking connections here, once what is queued has been taken (the acceptor shuts the
     * listener when the queue is empty). The descriptor stays open (and registered) until the
     * workers are joined, so no accept coroutine can ever see a reused fd number. */
    for (unsigned i = 0; i < w->srv->nlistens; i++)
        if (sched_spawn(w->srv->sched, listen_acceptor, &w->ls[i]) < 0)
            listen_shut(&w->ls[i]); /* the workers are stopping: nothing will be served any more */
    sched_timer_arm(&w->ctl_timer, 0);
}

void listen_worker_start(struct sched *sched, unsigned id, void *ud)
{
    struct server *s = ud;
    struct server_worker *w = &s->workers[id];
    /* data before sched_io_add: from then on an event may be handled at once, by this worker or
     * by a rescuer on another thread. */
    for (unsigned i = 0; i < s->nlistens; i++) {
        struct server_lslot *l = &w->ls[i];
        l->io.data = l;
        if ((l->level ? sched_io_add_level : sched_io_add)(&l->io, l->fd, listen_on_ready) == 0)
            l->added = 1;
    }
    w->ctl_timer.cb = listen_ctl_close_idle;
    w->ctl_timer.data = w;
    w->ctl_io.data = w;
    if (sched_io_add(&w->ctl_io, w->ctl_fd, listen_ctl_on_ready) == 0)
        w->ctl_added = 1;
    else
        atomic_fetch_sub_explicit(&s->undrained, s->nlistens, memory_order_relaxed); /* no stop */
}

int listen_open(const struct addrinfo *ai, int port, int reuseport, int backlog, int *out)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    struct sockaddr_storage sa;
    memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
    if (ai->ai_family == AF_INET6)
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr *)&sa, ai->ai_addrlen) < 0 ||
        (backlog > 0 && listen(fd, backlog) < 0)) {
        int e = -errno;
        close(fd);
        return e;
    }
    *out = fd;
    return 0;
}

int listen_bound_port(int fd)
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof(sa);
    if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
        return -errno;
    if (sa.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
    return ntohs(((struct sockaddr_in *)&sa)->sin_port);
}
