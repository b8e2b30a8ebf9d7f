/* sched_signal.c.h: signals, a flag a coroutine parks on and any thread sets (sched.h has the
 * contract). The engine parks a request's coroutine on one while a thread of its own (an event
 * loop that runs an application) produces the answer, without blocking the worker.
 *
 * Part of sched.c's translation unit, not compiled alone: sched.c includes it after the loop
 * locks, the remote queues and home_enter's declaration, which it uses.
 *
 * ---- The race, and why it cannot happen ----
 * A setter may run on any thread at any moment, also while the waiting coroutine is still on its
 * stack, between publishing "waiting" and switching out. Resuming it then would run one stack on
 * two threads. The rule of home sections answers it without a new yield reason: the waiter
 * publishes WAITING while it holds its worker's loop lock L(W), and keeps that lock until the
 * scheduler releases it after the switch (w_run; Go's gopark unlockf). A setter that finds
 * WAITING does not resume the coroutine: it pushes it on W's remote queue, and only a holder of
 * L(W) ever takes coroutines from there (W's loop, a rescuer, the drain of a stop). So the push
 * may come before the switch: nobody can take the coroutine from the queue until it is off its
 * stack. It then runs with L(W) handed over, and drops it at once.
 *
 * ---- States (sig->state) ----
 *   EMPTY   nothing to report;
 *   SET     a set came with nobody waiting: the next wait returns at once (one is remembered,
 *           not a count: a waiter re-checks what it waits for, as with a condition variable);
 *   WAITING a coroutine waits; sig->waiter, sig->home and sig->s name it (written before the
 *           state, read after it);
 *   WOKEN   a setter took the waiter and pushed it home; the waiter makes it EMPTY when it runs.
 * Transitions: wait: SET -> EMPTY (returns at once) or EMPTY -> WAITING (parks); set: EMPTY or
 * WOKEN -> SET, WAITING -> WOKEN (and push). Every one is a CAS, so a set and a wait that meet
 * agree on who resumes whom.
 *
 * ---- A stop ----
 * A waiter is on no parked list (the list's links are the ones the remote queue uses), so the
 * drain of a stop does not find it: its owner ends every wait first, with sched_signal_cancel(),
 * before sched_stop() (the HTTP engine cancels its handoffs when the grace period ends). A
 * cancelled wait returns -ECANCELED, and so does every later one. A set that races sched_stop()
 * pushes its waiter on a queue that sched_join() or sched_free() empties (its defers run). */

enum { SIG_EMPTY = 0, SIG_SET = 1, SIG_WAITING = 2, SIG_WOKEN = 3 };

void sched_signal_init(struct sched_signal *sig)
{
    memset(sig, 0, sizeof(*sig));
}

static int signal_cancelled(const struct sched_signal *sig)
{
    /* safety: acquire pairs with sched_signal_cancel's release. */
    return __atomic_load_n(&sig->cancelled, __ATOMIC_ACQUIRE);
}

int sched_signal_wait(struct sched_signal *sig)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w || !w->current))
        return -EPERM; /* not called from a coroutine: refuse rather than crash */
    if (UNLIKELY(signal_cancelled(sig)))
        return -ECANCELED;
    int set = SIG_SET;
    /* safety: acquire pairs with the setter's release: what it wrote before setting is seen. */
    if (__atomic_compare_exchange_n(&sig->state, &set, SIG_EMPTY, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED))
        return 0;
    if (UNLIKELY(sched_is_stopping(w->s)))
        return -ECANCELED;
    int home = own_home(w);
    home_enter(&w, home); /* a worker's own: never hops; a relief thread's may hop */
    struct coro *co = w->current;
    sig->waiter = co;
    sig->home = home;
    sig->s = w->s;
    int empty = SIG_EMPTY;
    /* safety: release publishes waiter/home/s to the setter that will see WAITING; acquire (on
     * failure: the state is SET) pairs with that setter's release. */
    if (!__atomic_compare_exchange_n(&sig->state, &empty, SIG_WAITING, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        /* A set came between the fast path and here: consume it. Only SET is possible, since
         * one coroutine waits at a time (the contract). */
        __atomic_store_n(&sig->state, SIG_EMPTY, __ATOMIC_RELAXED); /* safety: ours alone */
        loop_unlock(w);
        return signal_cancelled(sig) ? -ECANCELED : 0;
    }
    /* Switch out holding L(home): the scheduler releases it afterwards (see above). */
    coro_yield(co, SCHED_Y_PARK);
    w = sched_self(); /* another thread, perhaps: a fresh read, see sched_self() */
    if (UNLIKELY(w->held != home))
        abort(); /* a coroutine from a remote queue is only ever resumed with its home's lock */
    int woken = SIG_WOKEN;
    /* safety: a set that came since the wake-up made it SET: leave that for the next wait. */
    __atomic_compare_exchange_n(&sig->state, &woken, SIG_EMPTY, 0, __ATOMIC_ACQUIRE,
                                __ATOMIC_RELAXED);
    loop_unlock(w);
    return signal_cancelled(sig) ? -ECANCELED : 0;
}

/* ---- Waiting on a socket or a signal (sched_io_wait_signal) ----
 * The wait is two at once: io's waiter (an event or the timer ends it, under L(home)) and the
 * signal's (a setter ends it, from any thread). Exactly one of them may resume the coroutine, and
 * the signal's state decides which: the waiter publishes WAITING under L(home), like
 * sched_signal_wait; a setter's WAITING -> WOKEN takes the wake-up and pushes the coroutine on
 * home's remote queue (it is on no parked list, so those links are free); an event or a timer
 * takes it with the same CAS (wait_sig_claim) and resumes it as any io wait. Whoever loses
 * leaves the coroutine alone: an event's readiness stays in io->ready, a fired timer is simply
 * gone. The waiter, resumed, tells the two paths apart by the loop lock: only the remote queue
 * hands a coroutine over with L(home) held; it then removes what the setter could not (io's
 * waiter, the timer) itself, under that lock. */
static int wait_sig_claim(struct sched_wait *rec)
{
    int waiting = SIG_WAITING;
    /* safety: acq_rel, as a setter's transition from WAITING: the loser sees WOKEN. */
    return __atomic_compare_exchange_n(&rec->sig->state, &waiting, SIG_WOKEN, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}

static uint32_t io_take_ready(struct sched_io *io, uint32_t events)
{
    uint32_t got = io->ready & io_wait_mask(events);
    io->ready &= ~(got & (EPOLLIN | EPOLLOUT));
    return got;
}

int sched_io_wait_signal(struct sched_io *io, uint32_t events, int64_t deadline_ns,
                         struct sched_signal *sig)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w || !w->current))
        return -EPERM; /* not called from a coroutine: refuse rather than crash */
    if (UNLIKELY(sched_is_stopping(w->s) || signal_cancelled(sig)))
        return -ECANCELED;
    home_enter(&w, io->home);
    int err = io_arm_out(&w->s->w[io->home], io, events);
    if (UNLIKELY(err < 0)) {
        loop_unlock(w);
        return err;
    }
    uint32_t flags = 0;
    int set = SIG_SET;
    /* safety: acquire pairs with the setter's release: what it wrote before setting is seen. */
    if (__atomic_compare_exchange_n(&sig->state, &set, SIG_EMPTY, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED))
        flags = SCHED_SIGNALED;
    uint32_t got = io_take_ready(io, events);
    if (got || flags) {
        loop_unlock(w); /* back to user code: never across its work */
        return signal_cancelled(sig) ? -ECANCELED : (int)(got | flags);
    }
    int home_id = io->home;
    struct sched_worker *home = &w->s->w[home_id];
    struct coro *co = w->current;
    struct sched_wait rec = {.kind = WAIT_IO, .fd = io->fd, .io = io, .co = co, .sig = sig};
    coro_sched_node(co)->wait = &rec;
    io->waiter = co;
    io->wait_events = events;
    if (deadline_ns >= 0) {
        rec.timer.cb = wait_timer_fired;
        rec.timer.data = &rec;
        timer_arm_on(home, &rec.timer, (uint64_t)deadline_ns);
    }
    sig->waiter = co;
    sig->home = home_id;
    sig->s = w->s;
    int empty = SIG_EMPTY;
    /* safety: release publishes waiter/home/s to the setter that will see WAITING; acquire (on
     * failure: the state is SET) pairs with that setter's release. */
    if (!__atomic_compare_exchange_n(&sig->state, &empty, SIG_WAITING, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        /* A set came since the look above: undo the io wait, consume the set. */
        if (rec.timer.heap_index)
            heap_remove(home, &rec.timer);
        io->waiter = NULL;
        coro_sched_node(co)->wait = NULL;
        __atomic_store_n(&sig->state, SIG_EMPTY, __ATOMIC_RELAXED); /* safety: ours alone */
        loop_unlock(w);
        return signal_cancelled(sig) ? -ECANCELED : (int)SCHED_SIGNALED;
    }
    /* Switch out holding L(home): the scheduler releases it afterwards (the gopark rule). */
    int v = coro_yield(co, SCHED_Y_PARK);
    w = sched_self(); /* another thread, perhaps: a fresh read, see sched_self() */
    int woken = SIG_WOKEN;
    if (w->held == home_id) {
        /* Resumed by a setter, through home's remote queue, holding L(home). */
        if (rec.timer.heap_index)
            heap_remove(home, &rec.timer);
        io->waiter = NULL;
        coro_sched_node(co)->wait = NULL;
        /* safety: a set that came since the wake-up made it SET: leave that for the next wait. */
        __atomic_compare_exchange_n(&sig->state, &woken, SIG_EMPTY, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED);
        got = io_take_ready(io, events);
        loop_unlock(w);
        return signal_cancelled(sig) ? -ECANCELED : (int)(got | SCHED_SIGNALED);
    }
    /* Resumed by an event or the timer (wait_finish), which made the state WOKEN. */
    /* safety: as above. */
    __atomic_compare_exchange_n(&sig->state, &woken, SIG_EMPTY, 0, __ATOMIC_ACQUIRE,
                                __ATOMIC_RELAXED);
    return v;
}

int sched_signal_set(struct sched_signal *sig)
{
    /* safety: relaxed first read; every transition below is a CAS with acquire/release. */
    int old = __atomic_load_n(&sig->state, __ATOMIC_RELAXED);
    for (;;) {
        if (old == SIG_SET)
            return 0;
        int next = old == SIG_WAITING ? SIG_WOKEN : SIG_SET;
        /* safety: release publishes what the caller wrote before setting to the waiter; acquire
         * (from WAITING) makes the waiter's waiter/home/s visible here. */
        if (__atomic_compare_exchange_n(&sig->state, &old, next, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            break;
    }
    if (old != SIG_WAITING)
        return 0;
    /* We own the wake-up: the coroutine cannot run (nor free sig) before this push. */
    struct sched *s = sig->s;
    remote_push(s, &s->w[sig->home], sig->waiter);
    return 1;
}

int sched_signal_cancel(struct sched_signal *sig)
{
    /* safety: release: the waiter that sees the set below sees the flag. */
    __atomic_store_n(&sig->cancelled, 1, __ATOMIC_RELEASE);
    return sched_signal_set(sig);
}
