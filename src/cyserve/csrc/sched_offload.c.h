/* sched_offload.c.h: offload batches: how the calls handed to sched_offload() are queued per
 * worker and run in bounded batches, and when a batch is due.
 *
 * Part of sched.c's translation unit, not compiled alone: sched.c includes it after its loop
 * locks and queues, and it uses them. The rest of the scheduler's design is the essay at the top
 * of sched.c.
 *
 * ---- Offload batches (the problem: Python handlers holding back each other's responses) ----
 * sched_offload() queues a call on the worker running the coroutine; the worker runs queued
 * calls as a batch between the begin/end hooks (the engine takes the GIL once per batch), on its
 * own stack with its loop lock released. A coroutine is resumed, and writes its response, only
 * after its batch ended. Unbounded, a batch ran every queued call: with one worker, a burst of 32
 * requests to ~45 ms Python handlers got its first response after 0.09 s and the other 31 all at
 * 1.47 s (docs/benchmarks.md). The rule now:
 * - A batch takes at most SCHED_OFFLOAD_BATCH (64) calls, and takes no new call once
 *   SCHED_OFFLOAD_SLICE_NS (1 ms, by this thread's clock from the start of its first call) has
 *   passed, so a batch ends after the first call that ran longer than that. Then the end hook
 *   runs (the GIL is released) and every queued coroutine is pushed on the run queue, in order:
 *   those whose call ran (resume value 0), then the others with SCHED_OFFLOAD_AGAIN, on which
 *   sched_offload() queues the same call again on whatever worker resumed it. So the leftover
 *   calls wait behind the coroutines that write responses, in the FIFO run queue, and can be
 *   stolen by idle workers (useful when handlers release the GIL); the cost is one coroutine
 *   switch per leftover call per batch, next to calls that ran a millisecond. A call queued
 *   again keeps its age (sched_offload_rec.since) and goes back in front of the calls queued
 *   since (w_offload_queue): the batch always takes the oldest calls, whatever order the
 *   coroutines came back in.
 * - A batch is due when the run queue is empty (step 3 of the worker loop, in sched.c), or when
 *   64 calls are queued, or once the coroutines that were in the run queue when the first queued
 *   call arrived have run (off_ahead counts them down, one per coroutine run): the batch takes its
 *   turn as if it were one entry of the FIFO queue, so a busy run queue (fast nogil handlers under
 *   load, a yielding coroutine) delays Python calls by one pass over the queue, not until it
 *   empties. Stolen coroutines only make the turn come sooner.
 * - Rescue and relief (sched_relief.c.h) run the stalled worker's loop step (events, timers,
 *   hopped coroutines) but never its queue of calls not yet batched; coroutines they wake run,
 *   and offload, on the rescuer. What they do take is the running batch's calls that have not
 *   started once it has run SCHED_RELIEF_NS (its queue of calls, below) when no other batch
 *   is about to take them: those coroutines are resumed with SCHED_OFFLOAD_AGAIN on the taker
 *   and offload there, so that a fast call never waits behind a slow one that blocks.
 * The numbers: 1 ms is the rescue threshold already (SCHED_RESCUE_NS), i.e. the latency we accept
 * for a stalled worker's clients; fast handlers (a few microseconds of Python each) fill the 64
 * calls long before it, so they still share one GIL acquisition per 64 calls (test_sched.c:
 * 256 queued trivial calls run in 4 batches). The slice only splits batches of slow calls, where
 * one uncontended GIL acquisition and release per call costs well under 1% of a call of 1 ms or
 * more. Measured (one worker, 32 connections sending one request each at once to a handler doing
 * time.sleep(0.045), arrival times at a selector client on 127.0.0.1): unbounded, all 32
 * responses arrived at 1.45 s; bounded, one every ~45 ms, the first at 0.05 s, median 0.77 s,
 * last 1.45 s (the total is the same: one worker runs the handlers one at a time). *
 * ---- One queue of calls (the problem: threads whose batches wait for one lock starve) ----
 * A batch hands its calls to a queue of calls (struct sched_callq) before the begin hook, and
 * takes calls from it one at a time after, oldest first. Where that queue lives is the
 * engine's choice (sched_share_offloads):
 * - When the hooks exclude each other (they take the GIL: a CPython built with it), the whole
 *   scheduler shares one queue. The calls run one at a time anyway, and the thread whose batch
 *   holds the GIL takes the oldest call of any thread. Each thread kept its own queue before:
 *   once relief engaged beside a busy worker (a crowded machine preempts a batch of calls that
 *   compute past the monitor's threshold), the worker and the relief threads each ran their own
 *   calls in batches that waited for the GIL side by side, and the interpreter gives the GIL to
 *   whichever waiter it wakes, so the connections of a thread that rarely got it starved
 *   (test_slow_handlers_serve_every_connection_in_turn: min/max answers per connection
 *   0.01-0.12 where relief engaged).
 * - When they do not (a free-threaded interpreter, whose batches run Python at the same time),
 *   each thread keeps its own queue: sharing one would only move calls between CPUs.
 * A shared queue's calls stay in it until a batch takes them. A batch that ends by its bound
 * leaves the calls it did not take there: to a thread that has handed its calls over and not
 * yet taken its first (callq.waiting), which will take from the queue, or else to itself: it
 * counts itself among the waiting and owes the queue a batch (off_owed), which its loop runs
 * after the coroutines just resumed, as it would have run calls sent back to their coroutines.
 * Sending them back (as a queue of its own does, SCHED_OFFLOAD_AGAIN above) took them out of
 * sight while they went round the thread's run queue, and another thread's batch meanwhile
 * took newer calls ahead of them (min/max 0.32 in the same test). Their order is by tickets
 * (offload_since), not by the threads' cached clocks. A call runs on the thread whose batch
 * took it (with that thread's Python thread state) and its coroutine is resumed there, which
 * is what a relief thread's steal did already. The cost is what a batch's own list of calls
 * cost when relief could take from it: per call, one take under the queue's lock word (and a
 * ticket); per batch, the hand-over's lock and no other (a batch that runs out of calls finds
 * the queue empty on its last take; only one that ends by its bound locks once more).
 */

/* The bounds of a batch (see the essay above): a batch takes at most 64 calls, and takes
 * no new call once 1 ms has passed since its first call started. 64 queued calls also make a
 * batch due while local work remains. */
#define SCHED_OFFLOAD_BATCH 64
#define SCHED_OFFLOAD_SLICE_NS 1000000ull
/* The resume value of a coroutine whose offloaded call did not fit in its batch: sched_offload
 * queues the call again on the worker that resumed it. Never returned to a caller. */
#define SCHED_OFFLOAD_AGAIN (-EAGAIN)

struct sched_offload_rec {
    void (*fn)(void *);
    void *arg;
    /* When the call was first queued (offload_since: the worker's cached clock, or a ticket of
     * a shared queue): a call sent back with SCHED_OFFLOAD_AGAIN keeps its place by this, ahead
     * of calls queued after it. */
    uint64_t since;
};

/* ---- offload ---- */

/* Resume the coroutines of list (linked through node next) with value, in order. */
static void w_resume_offloaded(struct sched_worker *w, struct coro *list, int value)
{
    while (list) {
        struct coro *next = coro_sched_node(list)->next;
        coro_sched_node(list)->wait = NULL;
        coro_set_resume_value(list, value);
        w_push(w, list);
        list = next;
    }
}

/* A queue of calls is shared by its owner's batch and the threads that may take from it: a
 * thread relieving a batch that runs long (relief_take_batch, sched_relief.c.h) and, when the
 * scheduler shares one queue, every thread's batch. The lock is held for a few instructions,
 * or for one merge of two sorted lists of at most a few batches; a holder preempted on a
 * crowded machine is waited for by yielding the CPU. */
static int callq_trylock(struct sched_callq *q)
{
    int zero = 0;
    /* safety: acquire/release pair the holders' accesses to the queue's fields. */
    return __atomic_compare_exchange_n(&q->lock, &zero, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static NOINLINE void callq_lock_contended(struct sched_callq *q)
{
    for (unsigned spins = 0; !callq_trylock(q); spins++) {
        if (spins < 64)
            cpu_relax();
        else
            (sched_yield)(); /* POSIX sched_yield(2): the parentheses skip our macro */
    }
}

/* Inlined where it is taken once per call: the uncontended path is one compare-and-swap. */
static ALWAYS_INLINE void callq_lock(struct sched_callq *q)
{
    if (UNLIKELY(!callq_trylock(q)))
        callq_lock_contended(q);
}

static ALWAYS_INLINE void callq_unlock(struct sched_callq *q)
{
    /* safety: publishes the queue's fields to the next holder. */
    __atomic_store_n(&q->lock, 0, __ATOMIC_RELEASE);
}

static uint64_t callq_since(struct coro *c)
{
    return ((struct sched_offload_rec *)coro_sched_node(c)->wait)->since;
}

/* Hand list..tail (linked through node next, oldest first; NULL: none) to q, keeping q oldest
 * first (a call keeps its place before calls queued after it, whoever queued them), and, if
 * count, count the caller among the threads that will take from q (one that owes q a batch
 * is counted already). Any thread, not holding q's lock. */
static void callq_hand(struct sched_callq *q, struct coro *list, struct coro *tail, int count)
{
    callq_lock(q);
    q->waiting += count != 0;
    if (!list) {
        /* nothing to add */
    } else if (LIKELY(!q->head)) {
        q->head = list;
        q->tail = tail;
    } else if (callq_since(q->tail) <= callq_since(list)) {
        coro_sched_node(q->tail)->next = list;
        q->tail = tail;
    } else {
        /* Both lists are oldest first: merge them, the queue's calls first among equals. */
        struct coro *a = q->head, *b = list, *head = NULL, **link = &head;
        while (a && b) {
            struct coro **min = callq_since(b) < callq_since(a) ? &b : &a;
            *link = *min;
            link = &coro_sched_node(*min)->next;
            *min = *link;
        }
        *link = a ? a : b;
        if (!a)
            q->tail = tail;
        q->head = head;
    }
    callq_unlock(q);
}

/* A shared queue's batch ended by its bound: the calls left stay in q, oldest first, for the
 * next batch of any thread. Returns 1 when the caller must run that batch itself (calls are
 * left and no thread is about to take from q: the caller is counted among the waiting now),
 * else 0. Any thread, not holding q's lock. */
static int callq_leave(struct sched_callq *q)
{
    callq_lock(q);
    int owe = q->head != NULL && q->waiting == 0;
    q->waiting += owe;
    callq_unlock(q);
    return owe;
}

/* The oldest call of q, or NULL when none is left. first: the caller's first take after its
 * callq_hand (it stops counting among the waiting). Any thread, not holding q's lock. */
static ALWAYS_INLINE struct coro *callq_take(struct sched_callq *q, int first)
{
    callq_lock(q);
    struct coro *c = q->head;
    if (c) {
        q->head = coro_sched_node(c)->next;
        if (!q->head)
            q->tail = NULL;
    }
    if (first)
        q->waiting--;
    callq_unlock(q);
    return c;
}

/* Take every call of q (a list linked through node next, oldest first), or NULL. unless_waited:
 * take none while a thread that handed calls to q has not yet taken its first (it will take
 * them: a batch ending by its bound, or a relief thread, would only move them). Any thread, not
 * holding q's lock. */
static struct coro *callq_take_all(struct sched_callq *q, int unless_waited)
{
    callq_lock(q);
    struct coro *c = NULL;
    if (!unless_waited || q->waiting == 0) {
        c = q->head;
        q->head = q->tail = NULL;
    }
    callq_unlock(q);
    return c;
}

static void mon_notice_batch(struct sched *s);

/* Run one batch of offloaded calls between the begin/end hooks: hand w's queued calls to its
 * queue of calls (w->q), take the hook, then take the oldest calls of that queue (others'
 * too, when it is shared) one at a time, bounded by SCHED_OFFLOAD_BATCH calls and
 * SCHED_OFFLOAD_SLICE_NS (by this thread's clock, counted from the first call, not from the
 * begin hook: a long wait for the GIL is no reason to take it again sooner). Then make the
 * coroutines whose call ran here runnable here with 0. A batch that ended by its bound with
 * calls left: a shared queue keeps them for the next batch of any thread (w owes one when no
 * other thread is about to take them: w->off_owed); a queue of w's own gives them back to
 * their coroutines with SCHED_OFFLOAD_AGAIN. A batch may run none of its own calls (another
 * thread's batch or a relief thread took them), or only others' (an owed batch).
 * cancel: run no call, resume w's queued ones, and those of the queue it owes a batch, with
 * -ECANCELED (stop). Owner only, with no loop lock held unless cancel. */
static void w_run_offloads(struct sched_worker *w, int cancel)
{
    struct sched *s = w->s;
    struct coro *list = w->off_head, *list_tail = w->off_tail;
    int owed = w->off_owed;
    w->off_head = w->off_tail = NULL;
    w->n_off = 0;
    w->off_owed = 0;
    if (UNLIKELY(!list && !owed))
        return;
    struct sched_callq *q = w->q;
    if (cancel) {
        w_resume_offloaded(w, list, -ECANCELED);
        if (owed) {
            struct coro *left = callq_take_all(q, 0);
            (void)callq_take(q, 1); /* no longer waiting: stop counting us */
            w_resume_offloaded(w, left, -ECANCELED);
        }
        return;
    }
    if (list)
        callq_hand(q, list, list_tail, !owed);
    /* Stamped before the begin hook: a long wait for the GIL (held by a call that computes)
     * stalls this worker's loop as surely as a call that blocks. */
    /* safety: seq_cst store, then mon_notice_batch's seq_cst load: the monitor's deep park
     * (store mon_deep, load off_start) cannot miss this batch (sched_relief.c.h). */
    uint64_t stamp = sched_clock_ns();
    __atomic_store_n(&w->off_start, stamp, __ATOMIC_SEQ_CST);
    if (s->mon_evfd >= 0)
        mon_notice_batch(s);
    if (s->off_begin)
        s->off_begin(s->off_ud);
    uint64_t start = sched_clock_ns(), now = start;
    stat_add(&w->st_offload_wait_ns, start - stamp); /* the begin hook's wait: the GIL's */
    unsigned ran = 0;
    struct coro *c = callq_take(q, 1), *done = c, *last_ran = c;
    while (c) {
        struct sched_offload_rec *rec = coro_sched_node(c)->wait;
        rec->fn(rec->arg);
        stat_inc(&w->st_offloads);
        ran++;
        if (c != last_ran) {
            coro_sched_node(last_ran)->next = c;
            last_ran = c;
        }
        now = sched_clock_ns();
        if (ran >= SCHED_OFFLOAD_BATCH || now - start >= SCHED_OFFLOAD_SLICE_NS)
            break;
        c = callq_take(q, 0);
    }
    /* Ended by its bound (c is the last call run, not NULL), maybe with calls left. */
    struct coro *rest = NULL;
    if (c) {
        if (q->shared)
            w->off_owed = callq_leave(q);
        else
            rest = callq_take_all(q, 1);
    }
    /* safety: readers only ever act late on a stale stamp (relief_loop re-checks). */
    __atomic_store_n(&w->off_start, 0, __ATOMIC_RELEASE);
    if (s->off_end)
        s->off_end(s->off_ud);
    w->now = now; /* the batch may have run long: keep sched_now_ns() fresh for the resumed */
    if (last_ran)
        coro_sched_node(last_ran)->next = NULL;
    w_resume_offloaded(w, done, 0);
    w_resume_offloaded(w, rest, SCHED_OFFLOAD_AGAIN);
    /* The owed batch takes its turn behind the coroutines just resumed, which write the
     * answers (as calls sent back with SCHED_OFFLOAD_AGAIN would). */
    if (w->off_owed && !w->off_tail)
        w->off_ahead = runq_len(&w->rq);
}

/* Queue co's offloaded call on w, in the order the calls were first queued. A new call goes at
 * the tail. A call sent back by a batch that ran out of time (SCHED_OFFLOAD_AGAIN) is older than
 * the calls queued while it waited its turn in the run queue (among them those of the very
 * connections its batch just answered, whose next requests arrive within microseconds and whose
 * coroutines, woken by I/O, run first): it goes back in front of them. Appending it instead let
 * those few connections overtake every other on each batch: with 64 connections and ~0.6 ms
 * Python handlers, one connection got 780 answers while most got 30 in 5 s, and wrk's p99 was
 * 1.1 s against bjoern's 43 ms. Owner only. */
static void w_offload_queue(struct sched_worker *w, struct coro *co)
{
    struct sched_offload_rec *rec = coro_sched_node(co)->wait;
    coro_sched_node(co)->next = NULL;
    w->n_off++;
    if (!w->off_tail) {
        w->off_head = w->off_tail = co;
        if (!w->off_owed) /* an owed batch has its turn already */
            w->off_ahead = runq_len(&w->rq);
        return;
    }
    struct sched_offload_rec *tail = coro_sched_node(w->off_tail)->wait;
    if (LIKELY(tail->since <= rec->since)) {
        coro_sched_node(w->off_tail)->next = co;
        w->off_tail = co;
        return;
    }
    struct coro **link = &w->off_head;
    while (((struct sched_offload_rec *)coro_sched_node(*link)->wait)->since <= rec->since)
        link = &coro_sched_node(*link)->next; /* stops before the tail: it is newer */
    coro_sched_node(co)->next = *link;
    *link = co;
}

/* Run the offload batch on the loop (holding its own lock, given up meanwhile: Python handlers
 * may run long or wait for the GIL, and the worker can then be rescued like a long coroutine). */
static void w_loop_offloads(struct sched_worker *w)
{
    loop_unlock(w);
    run_seq_bump(w);
    w_run_offloads(w, 0);
    run_seq_bump(w);
    loop_lock(w, w);
}

/* Is the offload batch due although local work remains? Yes once SCHED_OFFLOAD_BATCH calls are
 * queued, or once the coroutines that were in the run queue when the first queued call arrived
 * have run (one call per coroutine run counts them down). Owner only, after each coroutine run. */
static int w_offloads_due(struct sched_worker *w)
{
    if (w->n_off == 0 && !w->off_owed)
        return 0;
    if (w->n_off >= SCHED_OFFLOAD_BATCH || w->off_ahead == 0)
        return 1;
    w->off_ahead--;
    return 0;
}

/* A new call's place in its queue (sched_offload_rec.since). A queue per thread orders by this
 * thread's cached clock, which costs nothing. A shared queue orders the calls of all threads,
 * whose cached clocks lag by different amounts (a worker's is refreshed when it polls or ends a
 * batch, which under load may be milliseconds ago): ordered by them, the calls of the thread
 * with the staler clock always came first. So a shared queue hands out tickets instead, one
 * atomic add. Owner of w. */
static inline uint64_t offload_since(struct sched_worker *w)
{
    struct sched_callq *q = w->q;
    if (!q->shared)
        return w->now;
    /* safety: relaxed: a ticket only has to be unique and increasing per taker; calls queued
     * at the same moment on two threads may take either order. */
    return __atomic_fetch_add(&q->tickets, 1, __ATOMIC_RELAXED);
}

int sched_offload(void (*fn)(void *), void *arg)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w || !w->current))
        return -EPERM; /* not called from a coroutine: refuse rather than crash */
    if (UNLIKELY(sched_is_stopping(w->s)))
        return -ECANCELED;
    struct sched_offload_rec rec = {.fn = fn, .arg = arg, .since = offload_since(w)};
    stat_inc(&w->st_off_in);
    int r;
    for (;;) {
        coro_sched_node(w->current)->wait = &rec;
        r = coro_yield(w->current, SCHED_Y_OFFLOAD);
        /* Resumed, maybe on another thread than the one it queued on (stolen, relieved). */
        w = sched_self();
        if (LIKELY(r != SCHED_OFFLOAD_AGAIN))
            break;
        /* The call did not fit in its batch: queue it on the worker running us now. A stop
         * begun meanwhile cancels it like any other call. */
        if (UNLIKELY(sched_is_stopping(w->s))) {
            r = -ECANCELED;
            break;
        }
    }
    stat_inc(&w->st_off_out);
    return r;
}

void sched_set_offload_hooks(struct sched *s, void (*begin)(void *ud), void (*end)(void *ud),
                             void *ud)
{
    s->off_begin = begin;
    s->off_end = end;
    s->off_ud = ud;
}

void sched_set_offload_exit(struct sched *s, void (*exit_hook)(void *ud))
{
    s->off_exit = exit_hook;
}

void sched_share_offloads(struct sched *s, int shared)
{
    for (unsigned i = 0; i < s->n_all; i++)
        s->w[i].q = shared ? &s->w[0].q_own : &s->w[i].q_own;
    s->w[0].q_own.shared = shared != 0;
}
