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
 *   started once it has run SCHED_RELIEF_NS (w->batch_rest, under a small lock): those coroutines
 *   are resumed with SCHED_OFFLOAD_AGAIN on the taker and offload there, so that a fast call
 *   never waits behind a slow one that blocks.
 * The numbers: 1 ms is the rescue threshold already (SCHED_RESCUE_NS), i.e. the latency we accept
 * for a stalled worker's clients; fast handlers (a few microseconds of Python each) fill the 64
 * calls long before it, so they still share one GIL acquisition per 64 calls (test_sched.c:
 * 256 queued trivial calls run in 4 batches). The slice only splits batches of slow calls, where
 * one uncontended GIL acquisition and release per call costs well under 1% of a call of 1 ms or
 * more. Measured (one worker, 32 connections sending one request each at once to a handler doing
 * time.sleep(0.045), arrival times at a selector client on 127.0.0.1): unbounded, all 32
 * responses arrived at 1.45 s; bounded, one every ~45 ms, the first at 0.05 s, median 0.77 s,
 * last 1.45 s (the total is the same: one worker runs the handlers one at a time). */

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
    /* When the call was first queued (the worker's cached clock): a call sent back with
     * SCHED_OFFLOAD_AGAIN keeps its place by this, ahead of calls queued after it. */
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

/* The batch's calls not started yet (w->batch_rest) are shared: a thread relieving a batch
 * that runs long takes them (batch_steal, sched_relief.c.h), so that a second slow call does not
 * wait behind the first. The lock is held for a few instructions. */
static void batch_lock(struct sched_worker *w)
{
    int zero = 0;
    /* safety: acquire/release pair the holders' accesses to batch_rest. */
    while (!__atomic_compare_exchange_n(&w->batch_lock, &zero, 1, 1, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
        zero = 0;
        cpu_relax();
    }
}

static void batch_unlock(struct sched_worker *w)
{
    /* safety: publishes batch_rest to the next holder. */
    __atomic_store_n(&w->batch_lock, 0, __ATOMIC_RELEASE);
}

/* The next call of w's running batch, or NULL once none is left (all run, or taken). Owner. */
static struct coro *batch_take(struct sched_worker *w)
{
    batch_lock(w);
    struct coro *c = w->batch_rest;
    if (c)
        w->batch_rest = coro_sched_node(c)->next;
    batch_unlock(w);
    return c;
}

/* Take every call of w's running batch that has not started (a list linked through node next,
 * in order), or NULL. Any thread. */
static struct coro *batch_steal(struct sched_worker *w)
{
    batch_lock(w);
    struct coro *c = w->batch_rest;
    w->batch_rest = NULL;
    batch_unlock(w);
    return c;
}

static void mon_notice_batch(struct sched *s);

/* Run one batch of w's queued offloaded calls between the begin/end hooks, bounded by
 * SCHED_OFFLOAD_BATCH calls and SCHED_OFFLOAD_SLICE_NS (by this thread's clock, counted from
 * the first call, not from the begin hook: a long wait for the GIL is no reason to take it
 * again sooner), then make the coroutines runnable: those whose call ran with 0, then those
 * left (not taken by a relief thread meanwhile) with SCHED_OFFLOAD_AGAIN. cancel: run no call,
 * resume all with -ECANCELED (stop). Owner only, with no loop lock held unless cancel. */
static void w_run_offloads(struct sched_worker *w, int cancel)
{
    struct sched *s = w->s;
    struct coro *list = w->off_head;
    w->off_head = w->off_tail = NULL;
    w->n_off = 0;
    if (UNLIKELY(!list))
        return;
    if (cancel) {
        w_resume_offloaded(w, list, -ECANCELED);
        return;
    }
    batch_lock(w);
    w->batch_rest = coro_sched_node(list)->next;
    batch_unlock(w);
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
    uint64_t start = sched_clock_ns(), now;
    stat_add(&w->st_offload_wait_ns, start - stamp); /* the begin hook's wait: the GIL's */
    unsigned ran = 0;
    struct coro *c = list, *last_ran = list;
    for (;;) {
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
        c = batch_take(w);
        if (!c)
            break;
    }
    struct coro *rest = batch_steal(w);
    /* safety: readers only ever act late on a stale stamp (relief_loop re-checks). */
    __atomic_store_n(&w->off_start, 0, __ATOMIC_RELEASE);
    if (s->off_end)
        s->off_end(s->off_ud);
    w->now = now; /* the batch may have run long: keep sched_now_ns() fresh for the resumed */
    coro_sched_node(last_ran)->next = NULL;
    w_resume_offloaded(w, list, 0);
    w_resume_offloaded(w, rest, SCHED_OFFLOAD_AGAIN);
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
    if (w->n_off == 0)
        return 0;
    if (w->n_off >= SCHED_OFFLOAD_BATCH || w->off_ahead == 0)
        return 1;
    w->off_ahead--;
    return 0;
}

int sched_offload(void (*fn)(void *), void *arg)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w || !w->current))
        return -EPERM; /* not called from a coroutine: refuse rather than crash */
    if (UNLIKELY(sched_is_stopping(w->s)))
        return -ECANCELED;
    struct sched_offload_rec rec = {.fn = fn, .arg = arg, .since = w->now};
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
