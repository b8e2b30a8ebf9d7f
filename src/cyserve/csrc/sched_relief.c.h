/* sched_relief.c.h: relief threads, which take over the loop of a worker whose offloaded call
 * runs long, and the monitor thread that sends them.
 *
 * Part of sched.c's translation unit, not compiled alone: sched.c includes it after the worker
 * loop, whose pieces (w_rescue_step, w_run, w_poll, w_loop_offloads, w_drain) it uses.
 *
 * ---- Relief (the problem: a Python call that blocks stalls everything homed on its worker) ----
 * An offloaded call runs on its worker's own thread (sched_offload.c.h), which is the cheapest
 * place to run it: no hand-off, no wake-up. But a call that blocks (time.sleep, a slow database,
 * a wait for the GIL that another blocking call holds) keeps that thread, and with it the
 * worker's loop: every connection homed there waits, static and C-only routes included. Rescue
 * (sched.c) helps only while another worker is idle; with every worker in a blocking call,
 * nobody is. Handing every call to a pool of Python threads instead would cost each call a
 * cross-thread wake-up, which this VM prices at 40-60 us each way (bench/micro/handoff.c) where
 * a whole /py request costs about 10 us of CPU.
 * So the call stays inline, and the loop moves when a call runs long, as Go's sysmon hands a P
 * whose M blocks in a syscall to another M:
 * - The monitor, one thread in the batch scheduling class (mon_main says why), looks every
 *   1-5 ms while offload batches are being run somewhere (each batch stamps off_start as it
 *   begins, before it takes the GIL), and sleeps without a timeout after SCHED_MON_LINGER_NS
 *   without any batch; the first batch after that wakes it (one eventfd write per idle spell,
 *   none under load). So it runs only while Python calls do: never on a C-only server.
 * - A worker whose batch started over SCHED_RELIEF_NS (2 ms) ago is stuck. The monitor gives its home
 *   to an idle relief thread (started on first need, at most cfg.relief of them): it sets the
 *   home's relieved_by and the thread's relief_of, and kicks the thread's eventfd.
 * - The relief thread adds the home's epoll fd to its own epoll (level-triggered), so that the
 *   home's events wake it at once, and runs the home's loop step (w_rescue_step: the same
 *   try-lock protocol as rescue, so the home's own thread, back from its call, simply takes its
 *   lock back). The coroutines this wakes run on the relief thread, and their offloaded calls
 *   run in its own batches: that is how up to cfg.relief calls may block at once while every
 *   home's events are still served. It also takes the calls a stuck batch has not started
 *   (relief_take_batch: its queue of calls, unless another batch is about to take them) and
 *   steals from stuck threads' run queues, so a fast call never waits behind a slow one.
 * - When the home's thread is back (off_start no longer old), or the monitor gave the home to
 *   another relief thread because this one got stuck in its own long call, the relief thread
 *   lets go of the home; once its own work is done it waits for the next assignment.
 * Costs: per batch, one seq_cst store and a load of mon_deep (two while relief is configured, none
 * without); the monitor's 1 ms wake-ups while batches run (measured in docs/benchmarks.md), and,
 * for a batch found stuck in its first 8 ms, one pread of its thread's /proc stat file
 * (relief_waiting: whether the call sleeps or computes); a stuck worker's clients wait at most
 * about 7 ms (the threshold plus one monitor tick) for the relief thread, and then at its pace.
 * Relief threads are nobody's home: the engine opens connections on the home whose listener
 * accepted them, and what a coroutine running on a relief thread waits for by itself (a sleep, an
 * fd wait, a signal such as an ASGI answer, a timer) parks on the worker it relieves (own_home in
 * sched.c), so a relief thread can stop relieving, or block in a call of its own, and strand
 * nothing: whoever serves that worker's home serves those waits. (They once parked on the relief
 * thread, and its blocking call held them until it returned: test_sched.c's "relief home".)
 *
 * Ownership of the fields (declared in sched.c): off_start is written by its thread; relieved_by
 * by the monitor (assign) and the relief thread (CAS back to -1 when it lets go); relief_of:
 * RELIEF_IDLE -> home by the monitor only, anything else by the relief thread only. */

/* A batch running this long (its wait for the GIL included) makes its worker stuck: relief
 * begins. Twice the batch's time slice: a batch of fast calls ends by its slice (1 ms) or its
 * 64 calls well before, so only a call that itself runs past a millisecond or so (or a GIL held
 * that long elsewhere) sends relief; and the latency we accept for a stalled worker's clients. */
#define SCHED_RELIEF_NS (2 * SCHED_OFFLOAD_SLICE_NS)
/* The monitor's longest look-again interval while batches run (see mon_main). */
#define SCHED_MON_TICK_MS 5
/* The monitor keeps looking this long after it last saw a batch, then sleeps until one starts. */
#define SCHED_MON_LINGER_NS 100000000ull
/* relief_of values that are not a home. */
#define RELIEF_BUSY (-1) /* relieves nobody, but finishes its own coroutines first */
#define RELIEF_IDLE (-2) /* waits for the monitor */
#define RELIEF_DEAD (-3) /* could not start: never given a home again */

/* Has a batch stamped st (0: none) run at least SCHED_RELIEF_NS by now? now and the stamp come
 * from the same monotonic clock, but from different threads: a batch stamped after our clock
 * read is not old. */
static int relief_old(uint64_t st, uint64_t now)
{
    return st != 0 && now > st && now - st >= SCHED_RELIEF_NS;
}

/* Is x's thread in an offload batch that started at least SCHED_RELIEF_NS before now? Any
 * thread. */
static int relief_stuck(struct sched_worker *x, uint64_t now)
{
    /* safety: seq_cst pairs with the owner's stores (see w_run_offloads). */
    return relief_old(__atomic_load_n(&x->off_start, __ATOMIC_SEQ_CST), now);
}

/* Take the calls not started in v's queue of calls, if v is stuck and no batch is about to take
 * them (one waiting for the GIL takes them as soon as a thread of ours could), and make their
 * coroutines runnable on w with SCHED_OFFLOAD_AGAIN (they offload again on w). Returns how
 * many. Owner of w. */
static int relief_take_batch(struct sched_worker *w, struct sched_worker *v, uint64_t now)
{
    if (!relief_stuck(v, now))
        return 0;
    struct coro *rest = callq_take_all(v->q, 1);
    int n = 0;
    for (struct coro *c = rest; c; c = coro_sched_node(c)->next)
        n++;
    w_resume_offloaded(w, rest, SCHED_OFFLOAD_AGAIN);
    return n;
}

/* Should the monitor and relief threads end? (A stop, or the end of a batch-mode run.) */
static int relief_ending(struct sched *s)
{
    /* safety: acquire pairs with the release stores of the flags. */
    return sched_is_stopping(s) || __atomic_load_n(&s->relief_quit, __ATOMIC_ACQUIRE);
}

/* Wake the monitor if it sleeps without a timeout (a batch has just started). Any worker. */
static void mon_notice_batch(struct sched *s)
{
    int one = 1;
    /* safety: seq_cst load after the caller's seq_cst store of off_start; the CAS elects one
     * waker per deep sleep. */
    if (UNLIKELY(__atomic_load_n(&s->mon_deep, __ATOMIC_SEQ_CST)) &&
        __atomic_compare_exchange_n(&s->mon_deep, &one, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
        sched_eventfd_kick(s->mon_evfd);
}

/* ---- relief threads ---- */

/* Put home h's epoll fd in r's epoll (h >= 0), after taking the previous one (was >= 0) out. */
static void relief_attach(struct sched_worker *r, int was, int h)
{
    struct sched *s = r->s;
    if (was >= 0)
        (void)epoll_ctl(r->epfd, EPOLL_CTL_DEL, s->w[was].epfd, NULL);
    if (h >= 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = (void *)RELIEF_EV_HOME};
        (void)epoll_ctl(r->epfd, EPOLL_CTL_ADD, s->w[h].epfd, &ev);
    }
}

/* Steal from the run queues of stuck threads. Returns a coroutine to run, or NULL. Owner. */
static struct coro *relief_steal(struct sched_worker *r, uint64_t now)
{
    struct sched *s = r->s;
    for (unsigned i = 0; i < s->n_all; i++) {
        struct sched_worker *v = &s->w[i];
        if (v == r || !relief_stuck(v, now))
            continue;
        struct coro *co = runq_steal(&r->rq, &v->rq);
        if (co) {
            stat_inc(&r->st_steals);
            return co;
        }
    }
    return NULL;
}

/* Is there anything for r to do instead of sleeping? Read after its parked flag and fence, as a
 * worker's w_work_visible (remote pushes wake it through sched_wake_worker). */
static int relief_work_visible(struct sched_worker *r, int h)
{
    /* safety: seq_cst reads after the parker's fence. */
    if (__atomic_load_n(&r->s->stopping, __ATOMIC_SEQ_CST) ||
        __atomic_load_n(&r->s->relief_quit, __ATOMIC_SEQ_CST) ||
        __atomic_load_n(&r->remote, __ATOMIC_SEQ_CST) ||
        __atomic_load_n(&r->relief_of, __ATOMIC_SEQ_CST) != h)
        return 1;
    return r->local_head || r->n_off || r->off_owed || runq_len(&r->rq) > 0;
}

static void relief_park(struct sched_worker *r, int h, int timeout_ms)
{
    /* safety: as w_park's recipe, without nparked (relief threads are not workers to wake). */
    __atomic_store_n(&r->parked, W_PARKED, __ATOMIC_SEQ_CST);
    sched_fence();
    int trim = 0;
    if (!relief_work_visible(r, h)) {
        stat_inc(&r->st_parks);
        /* A long sleep may end in a trim of the thread's stacks, as a worker's (w_trim_arm). */
        trim = w_trim_arm(r, &timeout_ms);
        uint64_t parked_at = trim ? sched_clock_ns() : 0;
        int got = w_poll(r, r, timeout_ms);
        trim = trim && got == 0 && r->now - parked_at >= SCHED_TRIM_NS; /* w_poll set now */
    }
    /* safety: take our state back; a waker stored W_WOKEN. */
    int st = __atomic_exchange_n(&r->parked, W_RUNNING, __ATOMIC_SEQ_CST);
    if (UNLIKELY(trim) && st == W_PARKED && !relief_work_visible(r, h))
        w_trim(r); /* slept the whole timeout, and nothing came (the monitor kicks directly) */
}

/* The relief thread's loop: relieve the home the monitor gave it while that home is stuck, run
 * the coroutines this wakes (and their offloaded calls), and wait for the next assignment when
 * nothing is left. Holds its own loop lock, except while it runs coroutines or batches. */
static void relief_loop(struct sched_worker *r)
{
    struct sched *s = r->s;
    int attached = -1;
    while (!relief_ending(s)) {
        uint64_t now = sched_clock_ns();
        r->now = now;
        /* safety: acquire pairs with the monitor's release store of the assignment. */
        int h = __atomic_load_n(&r->relief_of, __ATOMIC_ACQUIRE);
        if (h >= 0)
            r->last_home = h; /* own_home's fallback once we let go */
        if (h >= 0) {
            struct sched_worker *v = &s->w[h];
            int mine = (int)r->id;
            /* safety: acquire, as above. */
            if (__atomic_load_n(&v->relieved_by, __ATOMIC_ACQUIRE) != mine ||
                !relief_stuck(v, now)) {
                /* The home's thread is back, or another relief thread has it now. */
                /* safety: only clears our own claim; a newer assignment is kept. */
                __atomic_compare_exchange_n(&v->relieved_by, &mine, -1, 0, __ATOMIC_RELEASE,
                                            __ATOMIC_RELAXED);
                /* safety: only this thread moves relief_of out of a home. */
                __atomic_store_n(&r->relief_of, RELIEF_BUSY, __ATOMIC_RELEASE);
                h = RELIEF_BUSY;
            }
        }
        if (attached != (h >= 0 ? h : -1)) {
            relief_attach(r, attached, h >= 0 ? h : -1);
            attached = h >= 0 ? h : -1;
        }
        int did = 0;
        if (h >= 0) {
            struct sched_worker *v = &s->w[h];
            int got = w_rescue_step(r, v);
            did += got > 0 ? got : 0;
            for (unsigned i = 0; i < s->n_all; i++)
                if (&s->w[i] != r)
                    did += relief_take_batch(r, &s->w[i], now);
        }
        remote_drain(r);
        int handed = 0;
        struct coro *co = w_local_pop(r);
        if (co)
            handed = 1;
        else
            co = runq_pop(&r->rq);
        if (!co && h >= 0)
            co = relief_steal(r, now);
        if (co) {
            w_run(r, co, r, handed);
            if (w_offloads_due(r))
                w_loop_offloads(r);
            continue;
        }
        w_flush_finished(r);
        if (r->n_off || r->off_owed) {
            w_loop_offloads(r);
            continue;
        }
        if ((r->parked_head || r->heap_len) && w_poll(r, r, 0) > 0)
            continue;
        if (did)
            continue;
        if (h >= 0) {
            /* Woken at once by the home's events (its epoll fd is in ours); the timeout only
             * serves the home's timers, which do not show in its epoll. */
            relief_park(r, h, 1);
            continue;
        }
        if (!r->parked_head && !r->heap_len) {
            /* Nothing left of our own: wait for the next assignment. */
            int busy = RELIEF_BUSY;
            /* safety: only this thread leaves RELIEF_BUSY; the monitor assigns from IDLE. */
            __atomic_compare_exchange_n(&r->relief_of, &busy, RELIEF_IDLE, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED);
            relief_park(r, RELIEF_IDLE, -1);
            continue;
        }
        relief_park(r, h, w_next_timeout_ms(r));
    }
    relief_attach(r, attached, -1);
}

static void *relief_main(void *arg)
{
    struct sched_worker *r = arg;
    struct sched *s = r->s;
    pthread_setname_np(pthread_self(), "cyserve-relief");
    /* The workers' scheduling class, not the monitor's, which a new thread inherits: a relief
     * thread serves a stuck worker's connections and runs its calls. (In the idle class the
     * monitor once had, they inherited it and, on a busy machine, served a relieved worker's
     * connections no sooner than the monitor ran.) From the batch class this is allowed
     * without privileges; a refusal leaves it there. */
    if (s->relief_policy >= 0)
        (void)pthread_setschedparam(pthread_self(), s->relief_policy, &s->relief_param);
    sched_tls_worker = r;
    /* safety: as in w_main. */
    __atomic_store_n(&r->tid, (int)syscall(SYS_gettid), __ATOMIC_RELAXED);
    r->now = sched_clock_ns();
    if (UNLIKELY(coro_pool_new_shared(&r->pool, s->cfg.stack_size, s->ext_pool) != 0)) {
        static const char msg[] = "cyserve: a relief thread could not allocate its stack pool\n";
        ssize_t wr = write(2, msg, sizeof(msg) - 1);
        (void)wr;
        /* The home it was sent to stays with its own thread. Give it back, so that the
         * monitor does not take this thread for its healthy relief forever, and leave the slot
         * out of later choices (only an IDLE slot is chosen). */
        int h = __atomic_load_n(&r->relief_of, __ATOMIC_ACQUIRE);
        /* safety: the thread moves its own relief_of anywhere but out of IDLE (see above). */
        __atomic_store_n(&r->relief_of, RELIEF_DEAD, __ATOMIC_SEQ_CST);
        if (h >= 0) {
            int me = (int)r->id;
            /* safety: release pairs with mon_relieve's acquire of relieved_by; the CAS leaves
             * a home the monitor has meanwhile given to another thread alone. */
            __atomic_compare_exchange_n(&s->w[h].relieved_by, &me, -1, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED);
        }
        sched_tls_worker = NULL;
        return NULL;
    }
    /* A relief thread finishes coroutines that workers started (a Python call's coroutine is
     * resumed where its batch ran) and starts few: its free stacks go to the shared depot, where
     * the workers take them, rather than sit in a cache of its own (stacks of over 256 KiB,
     * whose default cache is smaller than a magazine, keep that default instead). */
    coro_pool_set_cache(r->pool, CORO_STACK_MAG);
    loop_lock(r, r);
    relief_loop(r);
    if (sched_is_stopping(s))
        w_drain(r);
    w_flush_finished(r);
    loop_unlock(r);
    if (s->off_exit)
        s->off_exit(s->off_ud);
    coro_pool_free(r->pool);
    r->pool = NULL;
    sched_tls_worker = NULL;
    return NULL;
}

/* ---- the monitor ---- */

/* Is thread x waiting (asleep in the kernel: a blocking call, a lock, the GIL) rather than
 * running or ready to run? /proc says, in the state letter of /proc/self/task/TID/stat. The
 * file is opened at the first look at a thread and kept (x->stat_fd, reopened if the slot's
 * thread changed): a look is then one pread, where an open, a read and a close cost three
 * system calls and the path's formatting and lookup (on this VM 4-5 us of CPU a look against
 * 10-11 us, bench/micro/proc_look.c; docs/benchmarks.md, "Session 20: the server's clocked
 * threads"). Kept rather than read some other way: the thread's CPU-time clock (one
 * clock_gettime, under 1 us) cannot tell a thread that waits for a CPU, which this counts as
 * running, from one asleep, and the monitor often shares the stuck thread's CPU (a pinned
 * server, a crowded machine), where two reads of it would find every computing thread off its
 * CPU. Unknown (no tid yet, a thread gone) counts as waiting. Monitor only. */
static int relief_waiting(struct sched_worker *x)
{
    /* safety: see w_main's store. */
    int tid = __atomic_load_n(&x->tid, __ATOMIC_RELAXED);
    if (tid <= 0)
        return 1;
    if (x->stat_tid != tid || x->stat_fd < 0) {
        if (x->stat_fd >= 0)
            close(x->stat_fd);
        char path[64];
        snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
        x->stat_fd = open(path, O_RDONLY | O_CLOEXEC);
        x->stat_tid = tid;
        if (x->stat_fd < 0)
            return 1;
    }
    char buf[256];
    /* The state letter follows the name, within the first 40 bytes or so: a part is enough. */
    ssize_t n = pread(x->stat_fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0)
        return 1; /* the thread has exited (ESRCH) */
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    if (!p || p[1] != ' ')
        return 1;
    return p[2] != 'R';
}

/* Is thread x asleep in the kernel inside the batch stamped st, the one the caller saw stuck?
 * The stamp is read again after the look at /proc: the monitor (preempted on a busy machine,
 * for up to seconds while it was in the idle class) may look long after it read the stamp,
 * when that batch has ended and its thread sleeps in its loop's epoll_wait, or has exited (a
 * stop): asleep or unknown then says nothing about the call, and relieving it started a relief
 * thread for a worker that no longer needed one. A thread stores 0 or a newer stamp when its
 * batch ends, before it can sleep anywhere else, and stamps grow: the same stamp after the look
 * means that batch ran throughout it. Monitor only. */
static int relief_waiting_in(struct sched_worker *x, uint64_t st)
{
    if (!relief_waiting(x))
        return 0;
    /* safety: seq_cst load after the /proc read (a system call), pairs with the owner's stores
     * of off_start (w_run_offloads), which come before it sleeps or exits. */
    return __atomic_load_n(&x->off_start, __ATOMIC_SEQ_CST) == st;
}

/* Does the home that stuck thread x stands for already have a healthy relief thread? */
static int mon_relieved(struct sched *s, struct sched_worker *x, uint64_t now)
{
    int h = x->id < s->n ? (int)x->id : __atomic_load_n(&x->relief_of, __ATOMIC_ACQUIRE);
    if (h < 0)
        return 1; /* nothing to relieve */
    int cur = __atomic_load_n(&s->w[h].relieved_by, __ATOMIC_ACQUIRE);
    return cur >= 0 && !relief_stuck(&s->w[cur], now) &&
           __atomic_load_n(&s->w[cur].relief_of, __ATOMIC_ACQUIRE) == h;
}

/* Give home h to a relief thread unless a healthy one has it. Monitor only. */
static void mon_relieve(struct sched *s, unsigned h, uint64_t now)
{
    struct sched_worker *home = &s->w[h];
    /* safety: acquire pairs with the relief thread's release when it lets go. */
    int cur = __atomic_load_n(&home->relieved_by, __ATOMIC_ACQUIRE);
    if (cur >= 0 && !relief_stuck(&s->w[cur], now) &&
        __atomic_load_n(&s->w[cur].relief_of, __ATOMIC_ACQUIRE) == (int)h)
        return;
    for (unsigned i = s->n; i < s->n_all; i++) {
        struct sched_worker *r = &s->w[i];
        if (r->started) {
            /* safety: only the monitor moves relief_of out of RELIEF_IDLE, so what we read
             * stays true until our store below. */
            if (__atomic_load_n(&r->relief_of, __ATOMIC_SEQ_CST) != RELIEF_IDLE)
                continue;
            /* The home first: the thread checks relieved_by once it sees relief_of. */
            __atomic_store_n(&home->relieved_by, (int)i, __ATOMIC_RELEASE);
            __atomic_store_n(&r->relief_of, (int)h, __ATOMIC_RELEASE);
            sched_eventfd_kick(r->evfd);
        } else {
            /* safety: the thread does not exist yet; pthread_create orders these stores. */
            __atomic_store_n(&home->relieved_by, (int)i, __ATOMIC_RELAXED);
            __atomic_store_n(&r->relief_of, (int)h, __ATOMIC_RELAXED);
            /* safety: release, before the thread exists: whoever reads n_live past i may look
             * at its run queue (sched_live). It only grows: slots are taken in order. */
            if (__atomic_load_n(&s->n_live, __ATOMIC_RELAXED) < i + 1)
                __atomic_store_n(&s->n_live, i + 1, __ATOMIC_RELEASE);
            if (pthread_create(&r->thread, NULL, relief_main, r) != 0) {
                __atomic_store_n(&r->relief_of, RELIEF_IDLE, __ATOMIC_RELAXED);
                __atomic_store_n(&home->relieved_by, -1, __ATOMIC_RELAXED);
                return;
            }
            r->started = 1;
            stat_inc(&s->st_relief_threads);
        }
        stat_inc(&s->st_reliefs);
        return;
    }
    /* Every relief thread is busy: more calls block at once than were allowed for. The home
     * waits for its own thread (or an idle worker's rescue). */
}

/* Look at every thread's batch; relieve the homes of stuck ones. Returns the start of the
 * oldest batch running and not yet stuck (UINT64_MAX: none), or 0 when no batch runs at all.
 * Monitor only. */
static uint64_t mon_scan(struct sched *s, uint64_t now)
{
    uint64_t busy = 0;
    for (unsigned i = 0; i < s->n_all; i++) {
        struct sched_worker *x = &s->w[i];
        /* safety: seq_cst, pairs with the owner's stores (see w_run_offloads). Every decision
         * below is about this one batch (relief_waiting_in checks that it still runs). */
        uint64_t st = __atomic_load_n(&x->off_start, __ATOMIC_SEQ_CST);
        if (st == 0)
            continue;
        if (!busy)
            busy = UINT64_MAX;
        if (!relief_old(st, now)) {
            if (st < busy)
                busy = st;
            continue;
        }
        /* A thread that computes (or waits for a CPU: a crowded machine preempted it) is not
         * helped by another thread competing for the same CPUs, and a batch of fast calls can
         * look long when its thread was preempted: relief for such a thread only once it has
         * been stuck four times as long. One that sleeps in the kernel gets it at once. */
        if (now - st < 4 * SCHED_RELIEF_NS && !mon_relieved(s, x, now) && !relief_waiting_in(x, st))
            continue;
        /* Where a computing thread blocks no one (relief_waiting_only), only sleep is relieved,
         * however long the computation. A relieved home needs no /proc read. */
        if (s->cfg.relief_waiting_only && !mon_relieved(s, x, now) && !relief_waiting_in(x, st))
            continue;
        /* A stuck worker's own home; a stuck relief thread's charge. */
        int h = i < s->n ? (int)i : __atomic_load_n(&x->relief_of, __ATOMIC_ACQUIRE);
        if (h >= 0)
            mon_relieve(s, (unsigned)h, now);
    }
    return busy;
}

static void *mon_main(void *arg)
{
    struct sched *s = arg;
    pthread_setname_np(pthread_self(), "cyserve-monitor"); /* for top -H, /proc, debuggers */
    /* The batch scheduling class: the normal class's fair share of the CPUs, without its
     * wake-up preemption. It was the idle class (runs only on a CPU nothing else wants), which
     * starves it on a machine whose CPUs other processes keep busy: a worker asleep in a call
     * leaves its CPU to them, not to the monitor, and relief then waited up to seconds
     * (bench/micro/relief_delay.py, 4 busy loops on 2 CPUs: median 172-364 ms, p90 1.9-3.2 s,
     * max 8.6 s; in this class medians of 5-12 ms, p99 41-112 ms, max 0.2 s). The monitor only
     * runs while batches run (it sleeps without a timeout after SCHED_MON_LINGER_NS without
     * any), and a wake-up of a SCHED_BATCH thread waits for the running thread's slice instead
     * of preempting it, so a busy worker on its CPU is not interrupted by it: on a pinned busy
     * cyserve-py server the worker's involuntary switches stayed at 0-1 per 3 s run, as in the
     * idle class, and requests per CPU-second within the noise
     * (bench/micro/monitor_class_cost.py). Leaving the idle class only while a batch is stuck
     * would not do: the monitor must run to see that, and an unprivileged thread may not leave
     * the idle class at all (RLIMIT_NICE). A refusal here leaves the class it was started in,
     * which it first records for the relief threads (relief_main). */
    int policy;
    struct sched_param sp0;
    if (pthread_getschedparam(pthread_self(), &policy, &sp0) == 0) {
        s->relief_param = sp0;
        s->relief_policy = policy;
    }
    struct sched_param sp = {.sched_priority = 0};
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
    uint64_t last_busy = sched_clock_ns();
    while (!relief_ending(s)) {
        uint64_t now = sched_clock_ns();
        uint64_t oldest = mon_scan(s, now);
        if (oldest)
            last_busy = now;
        /* Look again when the oldest running batch would become stuck (at least 1 ms from
         * now), or in SCHED_MON_TICK_MS when none would sooner: a batch that starts just after
         * this look is seen stuck at most SCHED_RELIEF_NS plus one tick after it began. Most
         * batches of a busy server end within microseconds, so the look after them finds a new
         * young one; a longer tick is what keeps the monitor's wake-ups (and what they cost a
         * busy worker's CPU) down to about 200 a second. */
        int timeout = SCHED_MON_TICK_MS;
        if (oldest && oldest != UINT64_MAX) {
            uint64_t due = oldest + SCHED_RELIEF_NS;
            uint64_t ms = due > now ? (due - now + 999999) / 1000000 : 1;
            if (ms < (uint64_t)timeout)
                timeout = ms < 1 ? 1 : (int)ms;
        }
        if (now - last_busy >= SCHED_MON_LINGER_NS) {
            /* safety: seq_cst store, then seq_cst loads of every off_start (mon_scan): either a
             * batch's mon_notice_batch sees mon_deep set, or we see its off_start. */
            __atomic_store_n(&s->mon_deep, 1, __ATOMIC_SEQ_CST);
            if (mon_scan(s, sched_clock_ns())) {
                __atomic_store_n(&s->mon_deep, 0, __ATOMIC_SEQ_CST);
                last_busy = now;
                continue;
            }
            timeout = -1;
        }
        struct pollfd p = {.fd = s->mon_evfd, .events = POLLIN};
        if (poll(&p, 1, timeout) > 0) {
            uint64_t v;
            ssize_t r = read(s->mon_evfd, &v, sizeof(v));
            (void)r;
            last_busy = sched_clock_ns(); /* a batch woke us: watch it */
        }
        /* safety: back to watching; a batch's CAS may have cleared it already. */
        __atomic_store_n(&s->mon_deep, 0, __ATOMIC_SEQ_CST);
    }
    return NULL;
}
