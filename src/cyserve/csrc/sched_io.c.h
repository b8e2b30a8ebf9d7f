/* sched_io.c.h: parked coroutines and the event loop's polling: the wait records of sleeps, fd
 * waits and sched_io waits (on the waiting coroutine's stack), how an event or a timer ends a wait
 * (wait_finish), the loop step's epoll_wait (w_poll), and the sched_io registrations the engine
 * keeps per connection.
 *
 * Part of sched.c's translation unit, not compiled alone: sched.c includes it after its loop
 * locks, queues and timers, and it uses them; home_enter is declared before it. */

enum sched_wait_kind { WAIT_SLEEP = 1, WAIT_FD = 2, WAIT_IO = 3 };

/* What a parked coroutine waits for; on its own stack, referenced from node.wait. */
struct sched_wait {
    int kind;
    int fd;
    struct coro *co;
    struct sched_io *io;
    struct sched_timer timer;
    /* sched_io_wait_signal: the signal that may end this wait too; such a waiter is on no parked
     * list (a setter pushes it on a remote queue, whose links are the list's). */
    struct sched_signal *sig;
};

/* sched_signal.c.h: whether an event or a timer may end rec's wait, which a signal may end too
 * (1: it took the wake-up; 0: a setter took it, and resumes the waiter itself). */
static int wait_sig_claim(struct sched_wait *rec);

/* Process epoll events in batches of 64: enough to amortise the syscall under load (libuv and
 * redis use similar sizes), small enough to stay on the stack. */
#define SCHED_EVENTS 64

/* ---- waking parked coroutines ---- */

/* End co's wait (parked on home) with value: drop its registrations and make it runnable on
 * self's run queue. Self's thread, holding home's loop lock. */
static void wait_finish(struct sched_worker *self, struct sched_worker *home,
                        struct sched_wait *rec, int value)
{
    if (rec->timer.heap_index)
        heap_remove(home, &rec->timer);
    if (rec->kind == WAIT_FD)
        epoll_ctl(home->epfd, EPOLL_CTL_DEL, rec->fd, NULL);
    else if (rec->kind == WAIT_IO)
        rec->io->waiter = NULL;
    if (!rec->sig)
        parked_remove(home, rec->co);
    coro_sched_node(rec->co)->wait = NULL;
    coro_set_resume_value(rec->co, value);
    w_push(self, rec->co);
}

static void wait_timer_fired(struct sched_timer *t)
{
    struct sched_wait *rec = t->data;
    struct sched_worker *self = sched_self();
    if (rec->sig && !wait_sig_claim(rec))
        return; /* the signal's setter resumes the waiter, which then finds the timer gone */
    wait_finish(self, &self->s->w[t->owner], rec, rec->kind == WAIT_SLEEP ? 0 : -ETIMEDOUT);
}

/* Readiness bits that stay set until the fd is gone: an error or hang-up is not an edge. */
#define SCHED_STICKY (EPOLLERR | EPOLLHUP | EPOLLRDHUP)

/* The ready bits that end a wait for `events`. An error or a full hang-up ends any wait. The
 * peer's half-close (EPOLLRDHUP) ends only a wait to read: it says no more bytes will come, not
 * that bytes can be sent. Letting it end a wait for EPOLLOUT made a writer to a client that
 * had sent FIN and stopped reading return at once from every wait, find EAGAIN again, and spin
 * without ever reaching its timeout. */
static inline uint32_t io_wait_mask(uint32_t events)
{
    return events | EPOLLERR | EPOLLHUP | (events & EPOLLIN ? EPOLLRDHUP : 0);
}

static void io_event(struct sched_worker *self, struct sched_worker *home, struct sched_io *io,
                     uint32_t ev)
{
    io->ready |= ev;
    if (io->waiter) {
        struct sched_wait *rec = coro_sched_node(io->waiter)->wait;
        uint32_t got = io->ready & io_wait_mask(io->wait_events);
        if (got && rec->sig && !wait_sig_claim(rec))
            return; /* the signal's setter took the wake-up: the readiness stays recorded */
        if (got) {
            io->ready &= ~(got & (EPOLLIN | EPOLLOUT));
            wait_finish(self, home, rec, (int)got);
        }
        return;
    }
    if (!io->active && (ev & (EPOLLIN | SCHED_STICKY))) {
        io->active = 1;
        io->ready &= ~(uint32_t)(EPOLLIN | EPOLLOUT);
        io->on_ready(io, ev);
    }
}

/* Run home's loop step on self's thread: poll home's epoll (timeout_ms: 0 no wait, -1 forever)
 * and fire home's due timers; woken and spawned coroutines go to self's run queue. Holding
 * home's loop lock (self == home for the owner's own loop, or a rescue). Returns the number of
 * events and timers handled (eventfd wake-ups excluded). */
static int w_poll(struct sched_worker *self, struct sched_worker *home, int timeout_ms)
{
    struct epoll_event evs[SCHED_EVENTS];
    int n = epoll_wait(home->epfd, evs, SCHED_EVENTS, timeout_ms);
    int handled = 0;
    self->now = sched_clock_ns();
    for (int i = 0; i < n; i++) {
        uintptr_t p = (uintptr_t)evs[i].data.ptr;
        if (p == 0) {
            /* home's eventfd: a wake-up, nothing to read (edge-triggered, see
             * sched_eventfd_kick). A rescuer may take it too: every wake-up it carries was
             * meant for a park that has ended (home holds its lock while parked) or says
             * stop/done, which home reads from the flags when its coroutine returns. */
        } else if (p & 1) {
            io_event(self, home, (struct sched_io *)(p & ~(uintptr_t)1), evs[i].events);
            handled++;
        } else if (p == RELIEF_EV_HOME) {
            /* A relief thread's park: the home it relieves has events; its loop runs that
             * home's step next (sched_relief.c.h). */
        } else {
            struct sched_wait *rec = (struct sched_wait *)p;
            wait_finish(self, home, rec, (int)evs[i].events);
            handled++;
        }
    }
    handled += (int)w_run_timers(self, home);
    return handled;
}

static int w_next_timeout_ms(struct sched_worker *w)
{
    if (w->heap_len == 0)
        return -1;
    uint64_t d = w->heap[0]->deadline;
    if (d <= w->now)
        return 0;
    uint64_t ms = (d - w->now + 999999) / 1000000;
    return ms > 1000000 ? 1000000 : (int)ms;
}

/* Park the running coroutine on home (whose loop lock the caller holds) until wait_finish().
 * The lock is released by the scheduler once the coroutine is off its stack (w_run). */
static int sched_park(struct sched_worker *w, struct sched_worker *home, struct sched_wait *rec)
{
    struct coro *co = w->current;
    rec->co = co;
    coro_sched_node(co)->wait = rec;
    parked_add(home, co);
    return coro_yield(co, SCHED_Y_PARK);
}

int sched_sleep_ns(uint64_t ns)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w || !w->current))
        return -EPERM; /* not called from a coroutine: refuse rather than crash */
    if (UNLIKELY(sched_is_stopping(w->s)))
        return -ECANCELED;
    int h = own_home(w);
    home_enter(&w, h); /* a worker's own: never hops; a relief thread's may hop */
    struct sched_worker *home = &w->s->w[h];
    struct sched_wait rec = {.kind = WAIT_SLEEP, .fd = -1};
    rec.timer.cb = wait_timer_fired;
    rec.timer.data = &rec;
    timer_arm_on(home, &rec.timer, sched_clock_ns() + ns);
    return sched_park(w, home, &rec);
}

int sched_wait_fd(int fd, uint32_t events, int64_t timeout_ns)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w || !w->current))
        return -EPERM; /* not called from a coroutine: refuse rather than crash */
    if (UNLIKELY(sched_is_stopping(w->s)))
        return -ECANCELED;
    int h = own_home(w);
    home_enter(&w, h); /* a worker's own: never hops; a relief thread's may hop */
    struct sched_worker *home = &w->s->w[h];
    struct sched_wait rec = {.kind = WAIT_FD, .fd = fd};
    struct epoll_event ev = {.events = events | EPOLLONESHOT, .data.ptr = &rec};
    if (UNLIKELY(epoll_ctl(home->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)) {
        int err = -errno;
        loop_unlock(w);
        return err;
    }
    if (timeout_ns >= 0) {
        rec.timer.cb = wait_timer_fired;
        rec.timer.data = &rec;
        timer_arm_on(home, &rec.timer, sched_clock_ns() + (uint64_t)timeout_ns);
    }
    return sched_park(w, home, &rec);
}

/* The registration of an io: edge-triggered for reads and the peer's half-close (sched_io_add),
 * or level-triggered for reads only (sched_io_add_level). Writes are watched on demand.
 *
 * EPOLLOUT on demand. An edge-triggered registration reports the readiness the fd has when it
 * is added, and a new socket is writable at once: registered for EPOLLOUT from the start, every
 * new connection woke its worker for that edge alone, before its first bytes (a TLS client's
 * ClientHello, a plain client's request) arrived, and the loop then polled once more for
 * nothing (w_poll_first: that park had ended at once). Two epoll_wait returns per connection
 * that served no byte; nginx adds EPOLLOUT only when a write blocks, and so does this: the
 * first wait that includes EPOLLOUT adds it to the registration (io_arm_out, EPOLL_CTL_MOD).
 * That loses no edge: the write that met EAGAIN marked the socket as short of space (Linux sets
 * SOCK_NOSPACE there), the MOD polls the fd under the new mask and queues it if it is writable
 * already (space freed between the EAGAIN and the MOD), and otherwise the space that frees later
 * is signalled to a mask that now includes EPOLLOUT. Once added it stays: a socket reports a
 * write edge only after it ran short of space (Linux signals space to a socket marked so, by a
 * write that met EAGAIN or a poll that found it full), so a kept EPOLLOUT costs no wake-up of
 * its own where dropping it would cost a MOD per blocked write. A request that fits the socket,
 * the common case, never pays for the MOD. */
#define SCHED_IO_EDGE (EPOLLIN | EPOLLRDHUP | EPOLLET)
#define SCHED_IO_LEVEL EPOLLIN

/* Before a wait for events on io: add EPOLLOUT to its registration if the wait includes it and
 * the registration does not yet (see "EPOLLOUT on demand" above). Holding L(home) of io's home,
 * which makes io->events home state like io->ready. Returns 0, -EINVAL for a level-triggered
 * registration (EPOLLOUT level-triggered would end every poll while the socket is writable), or
 * -errno from epoll_ctl. */
static int io_arm_out(struct sched_worker *home, struct sched_io *io, uint32_t events)
{
    if (LIKELY(!(events & EPOLLOUT) || (io->events & EPOLLOUT)))
        return 0;
    if (UNLIKELY(!(io->events & EPOLLET)))
        return -EINVAL;
    struct epoll_event ev = {.events = io->events | EPOLLOUT,
                             .data.ptr = (void *)((uintptr_t)io | 1)};
    if (UNLIKELY(epoll_ctl(home->epfd, EPOLL_CTL_MOD, io->fd, &ev) != 0))
        return -errno;
    io->events = ev.events;
    return 0;
}

static int io_add(struct sched_io *io, int fd, void (*on_ready)(struct sched_io *io, uint32_t),
                  uint32_t events)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w))
        return -EPERM;
    int entered = 0;
    if (w->held < 0) {
        if (UNLIKELY(!w->current))
            return -EPERM;
        home_enter(&w, own_home(w));
        entered = 1;
    }
    struct sched_worker *home = &w->s->w[w->held];
    io->fd = fd;
    io->on_ready = on_ready;
    io->waiter = NULL;
    io->ready = 0;
    io->wait_events = 0;
    io->home = (int)home->id;
    io->active = 0;
    io->events = events;
    struct epoll_event ev = {.events = events, .data.ptr = (void *)((uintptr_t)io | 1)};
    int err = 0;
    if (UNLIKELY(epoll_ctl(home->epfd, EPOLL_CTL_ADD, fd, &ev) != 0))
        err = -errno;
    if (entered)
        loop_unlock(w);
    return err;
}

int sched_io_add(struct sched_io *io, int fd,
                 void (*on_ready)(struct sched_io *io, uint32_t events))
{
    return io_add(io, fd, on_ready, SCHED_IO_EDGE);
}

int sched_io_add_level(struct sched_io *io, int fd,
                       void (*on_ready)(struct sched_io *io, uint32_t events))
{
    return io_add(io, fd, on_ready, SCHED_IO_LEVEL);
}

int sched_io_wait(struct sched_io *io, uint32_t events, int64_t deadline_ns)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w || !w->current))
        return -EPERM; /* not called from a coroutine: refuse rather than crash */
    if (UNLIKELY(sched_is_stopping(w->s)))
        return -ECANCELED;
    home_enter(&w, io->home);
    struct sched_worker *home = &w->s->w[io->home];
    int err = io_arm_out(home, io, events);
    if (UNLIKELY(err < 0)) {
        loop_unlock(w);
        return err;
    }
    uint32_t got = io->ready & io_wait_mask(events);
    if (got) {
        io->ready &= ~(got & (EPOLLIN | EPOLLOUT));
        loop_unlock(w); /* back to user code: never across its work */
        return (int)got;
    }
    struct sched_wait rec = {.kind = WAIT_IO, .fd = io->fd, .io = io};
    io->waiter = w->current;
    io->wait_events = events;
    if (deadline_ns >= 0) {
        rec.timer.cb = wait_timer_fired;
        rec.timer.data = &rec;
        timer_arm_on(home, &rec.timer, (uint64_t)deadline_ns);
    }
    return sched_park(w, home, &rec);
}

int sched_io_release(struct sched_io *io)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w || !w->current))
        return -EPERM; /* not called from a coroutine: refuse rather than crash */
    if (UNLIKELY(sched_is_stopping(w->s)))
        return -ECANCELED;
    home_enter(&w, io->home);
    if (io->ready & (EPOLLIN | SCHED_STICKY)) {
        io->ready &= ~(uint32_t)EPOLLIN;
        loop_unlock(w); /* back to user code: never across its work */
        return -EAGAIN;
    }
    io->active = 0;
    return 0; /* still in the home section: see the contract */
}

void sched_io_idle(struct sched_io *io)
{
    /* No readiness can be pending here: io_event cleared it before calling on_ready, and no other
     * event for io is handled while its home's loop lock is held by this callback. */
    io->active = 0;
}

void sched_io_take(struct sched_io *io)
{
    io->active = 1;
    io->ready &= ~(uint32_t)(EPOLLIN | EPOLLOUT);
}

int sched_io_watch(struct sched_io *io, int on)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w))
        return -EPERM;
    if (w->current)
        home_enter(&w, io->home);
    struct epoll_event ev = {.events = io->events, .data.ptr = (void *)((uintptr_t)io | 1)};
    int epfd = w->s->w[io->home].epfd;
    if (epoll_ctl(epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, io->fd, &ev) != 0)
        return -errno;
    /* Readiness recorded before the pause is stale by its end; the poll reports what is left. */
    io->ready = 0;
    return 0;
}

void sched_io_del(struct sched_io *io)
{
    struct sched_worker *w = sched_self();
    if (w && w->current)
        home_enter(&w, io->home);
    epoll_ctl(w ? w->s->w[io->home].epfd : -1, EPOLL_CTL_DEL, io->fd, NULL);
    io->active = 0;
    io->ready = 0;
}
