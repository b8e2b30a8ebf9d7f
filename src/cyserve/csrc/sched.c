/* sched.c: the work-stealing coroutine scheduler and its per-worker event loops.
 *
 * One translation unit. Its self-contained parts are fragments that this file #includes, each
 * opening with what it holds: sched_inject.c.h (the inject queue and spawn records),
 * sched_timer.c.h (the per-worker timer heaps), sched_io.c.h (waits, epoll polling, sched_io),
 * sched_offload.c.h (offload batches, with their own essay) and sched_relief.c.h (relief threads
 * and their monitor: a worker stuck in a long offloaded call has its loop taken over, with its
 * own essay). The rest stays here although it
 * is over 1,200 lines: about 200 of them are this essay, and the others (loop locks and rescue,
 * the wake-up recipe, the worker loop, parking, the lifecycle and stop) are the one algorithm the
 * essay describes, which is checked by reading them together.
 *
 * ---- Concepts ----
 * A scheduler has N workers, one pthread each. A worker owns:
 * - a run queue (runq.h): a bounded ring its owner pushes to and pops from, and from which idle
 *   workers steal half;
 * - a local list: coroutines that must run on this worker (they hopped home, see below); never
 *   stolen;
 * - a remote queue: an MPSC stack where other threads push coroutines hopping home; the owner
 *   takes the whole stack with one exchange and moves it to the local list;
 * - a stack pool and coroutine-struct cache (coro.h), an epoll instance, an eventfd registered
 *   in it (to wake the worker), a binary heap of timers, the list of its parked coroutines
 *   (waiting on an fd, a timer or a sched_io) and a batch of offloaded calls.
 * Shared by all: the inject queue (mutex + intrusive FIFO) for run-queue overflow, and beside it
 * the spawn records of threads that are not workers ({fn, arg} pairs in blocks; the worker that
 * takes one creates the coroutine); counters `alive`, `nspinning`, `nparked`;
 * flags `stopping` and `done`.
 *
 * ---- What can be stolen, what follows a coroutine, who owns what ----
 * A coroutine in a run queue or the inject queue is runnable and may run on any worker: its
 * stack goes with it (stacks are plain memory; the queues' release/acquire hand-over orders
 * every access). Thread-owned (only the worker's own thread touches them): its run queue (the
 * push side), offload batch, pool, cached clock `now`, counters. Home state of worker W: its
 * epoll (the events it returns), timer heap, parked list, remote queue (the consumer side) and
 * local list, and every sched_io / wait record registered on it. Home state is protected by W's
 * loop lock L(W), not by W's thread; the engine puts its per-home data (connection lists, busy
 * flags, idle timers) under the same lock.
 *
 * ---- Loop locks and rescue ----
 * Why: with home state owned by W's thread, a worker running one long coroutine (a CPU-bound
 * nogil handler) or a long offload batch (a slow Python handler, a wait for the GIL) polled
 * nobody's events: every connection homed on it stalled until the handler returned.
 * The lock: W's thread holds L(W) while in its loop (including parked in epoll_wait) and
 * releases it while it runs coroutine code or offloaded calls (w_run, w_loop_offloads; run_seq
 * is odd meanwhile). Whoever holds L(W) may run W's loop step: epoll_wait(W.epfd, 0), W's due
 * timers, the on_ready / timer callbacks, W's local list. Woken and spawned coroutines go to the
 * run queue of the thread doing it (wait_finish(self, home)), never to W's ring (single
 * producer).
 * Rescue: an idle worker T about to park (no local work, nothing to steal) looks at every W
 * whose run_seq is odd and has not changed for SCHED_RESCUE_NS (a shared sample, watch_seq /
 * watch_at), try-locks L(W), gives up L(T), runs W's loop step, then takes L(T) back.
 * Watching: while any other worker is out of its park (it runs coroutine code, or may start to
 * at any moment), T parks with a timeout of one threshold, to look again (W's events are on W's
 * epoll and do not wake T); so a stalled worker's connections wait at most about one threshold,
 * and an idle worker beside busy ones wakes at most once per threshold. T parks without that
 * timeout only when every other worker is parked, read after T's parker fence; a worker that
 * then leaves its park with coroutines to run (its own I/O or timer woke a waiter; nobody else
 * was told) fences and calls wakep(), so T is woken to spin and parks again watching. The two
 * sides are the wake-up recipe below again (either T's read sees the other unparked, or the
 * other's wakep sees T parked; a spinner that took the token parks later and re-reads). An
 * earlier version decided from run_seq alone, sampled before T's fence: a T that looked while W
 * was between its wake-up and a long handler parked for good, and W's clients waited for the
 * whole handler (the intermittent Python rescue test; test_sched.c "rescue after an idle spell"
 * makes that order certain). All idle, every worker parks without a timeout after at most one
 * extra threshold.
 * Home sections: a coroutine touching W's state (sched_io_wait/release/del, sleep and fd waits
 * on its own worker, sched_home_enter) holds L(W) on whatever thread it runs: try-lock; if that
 * fails and W is its own worker (held only by a rescuer or another short section) or the
 * scheduler is stopping, block; otherwise hop: push itself on W's remote queue, and whoever
 * holds L(W) next (W's loop, or a rescuer) runs it from W's local list with the lock handed
 * over. A section ends at sched_home_exit(), or when the coroutine suspends or ends: the
 * scheduler releases the lock after the switch (Go's gopark unlockf), so a wait registered under
 * the lock cannot be ended, and the coroutine resumed elsewhere, while it is still on this stack.
 * Sections are short: sched_io_wait finding readiness already there and sched_io_release
 * returning -EAGAIN drop the lock before returning to user code; sched_io_release returning 0
 * keeps it for the caller's idle bookkeeping only (contract in sched.h).
 * Lock rules (no deadlock): a thread blocks on a loop lock only while it holds none (a worker
 * re-taking its own after a coroutine or a rescue; a coroutine entering its own worker's, or any
 * while stopping); with one lock held it only try-locks another (the rescuer), and a coroutine
 * entering a second home drops the first. Every holder keeps a lock for a bounded time, except
 * W parked in its own epoll_wait, and nobody blocks on L(W) then (W's own thread is the one
 * parked; while stopping, W is woken and leaves its loop). So the wait-for graph has no cycle.
 * The lock is a word (CAS acquire, store release), not a pthread mutex: it is taken inside a
 * coroutine and released by the scheduler after the switch (under TSan, a different fiber).
 * Costs on the hot path: one uncontended CAS and one release store per coroutine run, two
 * relaxed stores of run_seq; no syscall.
 * Not done: nested epoll (W.epfd in T's epoll, armed while W stalls) would wake T at once
 * instead of within a threshold; rescuers do not run W's runnable coroutines (those are stolen
 * already). A coroutine that spins while *holding* a loop lock cannot be rescued (by contract
 * home sections are short). Memory: coroutine structs come from a slab shared by all pools of
 * this scheduler (coro.c); a struct freed on another worker than the one that created it joins
 * that worker's cache. The wait records (struct sched_wait) live on the waiting coroutine's own
 * stack.
 *
 * ---- The worker loop ----
 *   1. every 61st tick, look at the inject queue and poll epoll without blocking first (so
 *      neither starves under a busy local queue; 61 is Go's number: prime, so it does not
 *      resonate with periodic workloads);
 *   2. run the local list, then the run queue (pop);
 *      After each coroutine, run a batch of offloaded calls if one is due (see below);
 *   3. when empty: account finished coroutines (batch mode ends when none is alive), run a
 *      batch of offloaded calls, poll epoll and timers without blocking when events are
 *      arriving fast or steps 4 and 5 could find something (w_poll_first); otherwise the park
 *      of step 6 is next, and its epoll_wait does that poll (a light load then makes one
 *      epoll_wait per wake-up, not two);
 *   4. spin: take a batch from the inject queue, then steal from a random victim, then from
 *      the others in turn;
 *   5. rescue a worker stuck in one coroutine, if any (see above);
 *   6. park in epoll_wait with the next timer as timeout (at most one rescue threshold while
 *      another worker runs coroutine code).
 *
 * ---- Offload batches and relief ----
 * How sched_offload() calls are batched, and why a batch is bounded: the essay at the top of
 * sched_offload.c.h. What happens when every worker is stuck in a long call (rescue needs an idle
 * worker): relief threads beyond the N workers (slots w[n, n_all)), sent by a monitor thread,
 * the essay at the top of sched_relief.c.h.
 *
 * ---- Spinning and parking (Go's protocol) ----
 * A worker looking for work is "spinning" (nspinning counts them; at most half the busy workers
 * spin, so that idle workers do not burn the CPU fighting over one coroutine). Whoever makes
 * work available that another worker could take calls wakep(): if nobody spins and somebody is
 * parked, it takes the spinning token (CAS nspinning 0 -> 1) and wakes one parked worker, which
 * starts spinning. A spinner that finds work stops spinning and, if it was the last spinner,
 * calls wakep() itself: this ramps workers up one at a time instead of waking all of them on
 * every spawn (no wake-up storm), and never leaves runnable work while a worker sleeps.
 *
 * The memory-ordering recipe, which must hold so that no wake-up is lost:
 *   Submitter: 1. publish the work (runq release store / inject mutex / remote exchange);
 *              2. seq_cst fence (StoreLoad);
 *              3. read nspinning and the parked flags; wake if needed.
 *   Parker:    1. stop spinning (nspinning-- , seq_cst);
 *              2. set its parked flag and nparked++ (seq_cst), then a seq_cst fence;
 *              3. re-check every source of work (inject length, every run queue, its remote
 *                 queue, stopping/done); if any, un-park itself and loop.
 * With both fences in one total order, either the submitter's read sees the parker as parked
 * (and wakes it via its eventfd: an eventfd write is never lost, epoll_wait returns at once if
 * one came since its last report), or the parker's re-check sees the work. A parked flag is claimed by
 * exactly one waker with a CAS (PARKED -> WOKEN or WOKEN_SPIN), so each wake is delivered once,
 * and a worker woken by its own I/O or timer swaps its flag back and keeps its accounting.
 *
 * ---- Termination and stop ----
 * Batch mode (sched_run): `alive` counts coroutines spawned and not yet finished (queued,
 * running or suspended). Spawns add to it at once (before the coroutine is published); finishes
 * are accounted in batches when a worker runs out of local work, so the counter is never below
 * the true number and reaching 0 means no coroutine is left anywhere: that worker sets `done` and
 * wakes everyone. Server mode ignores `alive`.
 * Stop, numbered as tokio does it:
 *   1. sched_stop() sets `stopping` (spawn now fails with -ESHUTDOWN) and writes every eventfd;
 *   2. each worker leaves its loop and drains: it wakes each of its parked coroutines with
 *      -ECANCELED (removing their epoll and timer registrations), cancels offloaded calls with
 *      -ECANCELED, and resumes everything in its local list, remote queue, run queue and the
 *      inject queue; while stopping, every scheduler call a coroutine makes returns -ECANCELED
 *      without suspending, so each resumed coroutine runs to its end (running its defers);
 *   3. the worker runs its stop hook and exits;
 *   4. sched_join()/sched_run() join the threads and free, with their defers, coroutines that
 *      raced into a queue after its owner drained (a hop started just before stopping).
 *
 * ---- Rejected alternatives ----
 * - A fixed sleep when idle (an earlier Cython work-stealing scheduler's): latency and a lost CPU
 *   either way.
 * - A condition variable per worker: the worker must also wait on its epoll; an eventfd in the
 *   same epoll gives one blocking point for both.
 * - Waking a worker per spawn: 500,000 spawns would mean 500,000 syscalls.
 * - Moving epoll registrations with a stolen coroutine: epoll_ctl from two threads on one
 *   registration races with event delivery; the loop lock keeps each home's event processing
 *   single-threaded at any moment.
 * - Processing a home's events without its lock (a rescuer epoll_waits, then locks): an event
 *   taken from the kernel may name a connection that the lock holder frees meanwhile. Events are
 *   taken and processed under the same lock hold.
 * - A pthread mutex as the loop lock, or a dedicated monitor thread (Go's sysmon): see above;
 *   idle workers are already there and already look for work before they park.
 * - Per-coroutine timers in a global structure: a shared heap would need a lock per sleep. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include "sched.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "compat.h"
#include "runq.h"

/* What a coroutine tells its worker when it yields. */
enum sched_yield_kind {
    SCHED_Y_REQUEUE = 1, /* sched_yield: run again later */
    SCHED_Y_PARK = 2,    /* waiting: an event, a timer or stop will wake it */
    SCHED_Y_HOP = 3,     /* move to worker node.home */
    SCHED_Y_OFFLOAD = 4, /* run node.wait's offload record on the worker stack */
};

/* Parked-flag states of a worker. */
enum { W_RUNNING = 0, W_PARKED = 1, W_WOKEN = 2, W_WOKEN_SPIN = 3 };

/* Offloaded calls handed to batches and not started yet, oldest first (sched_offload.c.h,
 * "One queue of calls"): a list linked through node next, ordered by sched_offload_rec.since. */
struct sched_callq {
    /* safety (field): every field below is read and written only under lock (a word held for
     * a few instructions, or for one merge of two batches' lists). */
    int lock;
    /* Threads that handed their calls to this queue and have not yet taken their first call
     * (most wait for the begin hook: the GIL). Each will take from the queue, so a batch
     * that ends with calls left may leave them to it. */
    unsigned waiting;
    struct coro *head, *tail;
    /* Not under lock. shared: every thread uses this queue (written before the threads start).
     * tickets: the next call's place when shared (sched_offload.c.h, offload_since), taken
     * with an atomic add. */
    int shared;
    uint64_t tickets;
};

struct sched_worker {
    struct runq rq;
    /* safety (field): remote is an MPSC stack head, pushed by any thread with CAS, taken by
     * the owner with an exchange. */
    struct coro *remote CACHE_ALIGNED;
    int parked CACHE_ALIGNED; /* W_* state; see the recipe above */
    /* safety (field): the loop lock L(W), 0 free / 1 held; protects W's home state (see "Loop
     * locks" in the essay). A word, not a pthread mutex: it is taken inside a coroutine and
     * released by the scheduler after the switch, which a mutex (owned by a thread, and under
     * TSan by a fiber) does not allow. */
    int loop_lock CACHE_ALIGNED;
    /* safety (field): run_seq is written by the owner only (relaxed stores), read by rescuers:
     * odd while the owner runs coroutine code (or offloaded calls) with L(W) released. */
    uint64_t run_seq;
    /* safety (field): a rescuer's sample of run_seq and when it took it; written and read by
     * any rescuer with relaxed atomics; a torn pair only moves one rescue earlier or later. */
    uint64_t watch_seq, watch_at;
    /* safety (field): relief (sched_relief.c.h). off_start: when this thread's offload batch
     * started its first call (sched_clock_ns), 0 between batches; written by the owner (seq_cst:
     * the monitor's deep park pairs with it), read by the monitor and relief threads.
     * relieved_by (homes): the relief slot running this home's loop steps, or -1; set by the
     * monitor, cleared by that relief thread (CAS). relief_of (relief threads): the home it
     * relieves, RELIEF_BUSY while it finishes its own work, RELIEF_IDLE while it waits,
     * RELIEF_DEAD when it could not start; only the monitor moves it out of RELIEF_IDLE, only
     * the thread itself moves it elsewhere. */
    uint64_t off_start CACHE_ALIGNED;
    int relieved_by, relief_of;
    /* relief threads: the last home relief_of named (owner only; see own_home). */
    int last_home;
    int tid; /* the thread's id (gettid), for the monitor's look at its state; set at start */
    /* Monitor only: /proc/self/task/<stat_tid>/stat kept open for relief_waiting's looks (-1:
     * not open yet), so that a look costs one pread and not an open, a read and a close. */
    int stat_fd, stat_tid;
    /* safety (field): q_own is a queue of calls handed to batches and not started yet, with
     * a lock word of its own (struct sched_callq, sched_offload.c.h); any thread takes from it
     * under that word. q points to the queue this thread's batches use: its own q_own, or,
     * when the scheduler shares one queue (sched_share_offloads), worker 0's q_own for every
     * thread; set before the threads start, read-only afterwards. */
    struct sched_callq q_own CACHE_ALIGNED;
    struct sched_callq *q;
    /* Owner-only (this thread) from here on, except the home state marked "Under L(W)". */
    struct sched *s CACHE_ALIGNED;
    unsigned id;
    pthread_t thread;
    int started; /* relief slots: a thread runs it (written by the monitor, read after joins) */
    int epfd, evfd;
    struct coro_pool *pool;
    struct coro *current;
    int held; /* the worker whose loop lock this thread holds, or -1 */
    /* Under L(W): hopped coroutines waiting to run a home section here (whoever holds L(W)
     * runs them), W's parked coroutines, timer heap and epoll events. */
    struct coro *local_head, *local_tail;
    struct coro *parked_head; /* waiting coroutines, doubly linked through node next/prev */
    struct sched_timer **heap;
    size_t heap_len, heap_cap;
    /* This thread's again. */
    struct coro *off_head, *off_tail;
    unsigned n_off;
    /* This thread owes its shared queue of calls a batch: its last batch ended by its bound
     * with calls left there and nobody about to take them, so it counted itself among the
     * queue's waiting and will run a batch even with no call of its own (sched_offload.c.h). */
    int off_owed;
    /* Coroutine runs left before the queued offloaded calls are due even if local work remains:
     * the run queue's length when the first of them was queued (FIFO order, sched_offload.c.h). */
    unsigned off_ahead;
    uint64_t now;
    uint64_t rng;
    uint64_t tick;
    int spinning;
    /* 1 while w_park dispatches the events its wait returned: what they spawn here needs no
     * wake-up (w_park's own end wakes another worker if one should spin). */
    int in_park;
    /* 1 when the last look at our epoll found it ready at once (a non-blocking poll that found
     * events, or a park whose wait returned within SCHED_BUSY_PARK_NS with more than one event
     * or timer handled): events are arriving faster than we serve them, and the loop's step 3
     * polls before it parks (w_poll_first). Owner only. */
    int poll_ready;
    unsigned finished_pending;
    /* Counters: written by the owner only, read approximately by sched_get_stats (relaxed). */
    uint64_t st_spawned, st_finished, st_steals, st_parks, st_hops, st_offloads;
    uint64_t st_offload_wait_ns; /* sched_stats.offload_wait_ns; owner only */
    /* sched_offload() calls begun and returned on this thread (a coroutine may return on
     * another thread than it began: only the sum over the threads means something). Owner. */
    uint64_t st_off_in, st_off_out;
    uint64_t st_trims, st_stacks_trimmed; /* sched_stats.trims, .stacks_trimmed; owner only */
    /* run_seq when the thread's last idle trim left nothing to give back (w_trim_arm). Owner. */
    uint64_t trimmed_seq;
};

struct sched {
    struct sched_config cfg;
    unsigned n;     /* workers: the homes, w[0, n) */
    unsigned n_all; /* thread slots: the workers, then the relief threads, w[n, n_all) */
    /* atomic: the slots whose run queues may hold coroutines, w[0, n_live): the workers and the
     * relief threads started so far (the monitor starts them in slot order, on first need, and
     * raises this before it starts one). Only a slot's own thread pushes on its run queue, so a
     * slot never started holds nothing: the loops that look at every run queue (steal, the
     * park's re-check, w_poll_first) stop here instead of reading cfg.relief empty queues each
     * time a worker runs out of work (16 by default, about 430 instructions per look). Read with
     * sched_live(). */
    unsigned n_live;
    struct sched_worker *w;
    pthread_mutex_t inject_lock;
    struct coro *inj_head, *inj_tail;                       /* under inject_lock */
    struct sched_spawn_block *sp_head, *sp_tail, *sp_spare; /* under inject_lock */
    long inj_len; /* coroutines + spawn records; written under inject_lock, read lock-free */
    struct coro_pool *ext_pool; /* for spawns from non-workers; under inject_lock */
    uint64_t ext_spawned;       /* under inject_lock */
    long alive;                 /* atomic */
    int nspinning, nparked;     /* atomic */
    int stopping, done;         /* atomic */
    int running;                /* atomic: workers started and not joined */
    unsigned wake_rr;           /* atomic: where wakep starts looking */
    void (*off_begin)(void *), (*off_end)(void *), (*off_exit)(void *);
    void *off_ud;
    void (*w_start)(struct sched *, unsigned, void *), (*w_stop)(struct sched *, unsigned, void *);
    void *w_ud;
    /* The relief monitor (sched_relief.c.h): its thread and eventfd (-1 without relief), and
     * whether it sleeps without a timeout (atomic; a batch that starts then wakes it). */
    pthread_t mon;
    int mon_started; /* written by the starting thread before the monitor exists, read at join */
    int mon_evfd;
    int mon_deep;
    int relief_quit; /* atomic: set at join to end the monitor and relief threads */
    /* The scheduling class and parameters the relief threads take: the workers' (the class the
     * monitor was started in), recorded by the monitor before it leaves that class and before
     * it starts any relief thread (pthread_create orders the write before their reads); -1
     * until then, or if it could not be read (the threads then keep the monitor's). */
    int relief_policy;
    struct sched_param relief_param;
    uint64_t st_reliefs, st_relief_threads; /* written by the monitor only (relaxed) */
};

static __thread struct sched_worker *sched_tls_worker;

/* The end of the run queues worth a look, n_live. safety: acquire pairs with the monitor's
 * release store, made before pthread_create of the thread whose queue it adds; a reader that
 * misses a store of a moment ago misses only a thread that has pushed nothing yet, or whose
 * push is seen by its submitter's recipe (the store happens before that thread's fence). */
static inline unsigned sched_live(struct sched *s)
{
    return __atomic_load_n(&s->n_live, __ATOMIC_ACQUIRE);
}

/* The worker running the calling thread. Every read of sched_tls_worker goes through here.
 * Why: a coroutine may suspend on one thread and resume on another, but a compiler assumes the
 * thread never changes within a function, so it may compute a thread-local address once (the
 * aarch64 thread pointer, or the result of __tls_get_addr in a shared object) and reuse it after
 * a switch, reading the old thread's variable. An out-of-line function containing a volatile asm
 * cannot be inlined, merged or treated as pure, so each call reads this thread's value. */
static NOINLINE struct sched_worker *sched_self(void)
{
    struct sched_worker *w = sched_tls_worker;
    __asm__ volatile("" : "+r"(w));
    return w;
}

/* ---- loop locks ---- */

/* Rescue threshold: a worker that has run one coroutine (or one batch of offloaded calls) for
 * this long gets its loop step run by an idle worker. 1 ms is well above a normal request (a few
 * microseconds) so rescues never compete with a healthy worker, and small enough that a client
 * of a stalled worker sees at most about a millisecond more latency. */
#define SCHED_RESCUE_NS 1000000ull
/* A park whose epoll_wait returned within this found its events (nearly) ready: see
 * sched_worker.poll_ready. */
#define SCHED_BUSY_PARK_NS 100000ull

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static int lock_try(struct sched_worker *home)
{
    int zero = 0;
    /* safety: acquire pairs with lock_release: everything the previous holder did to home's
     * state happens before what we do. The relaxed pre-check keeps a contended word shared. */
    return __atomic_load_n(&home->loop_lock, __ATOMIC_RELAXED) == 0 &&
           __atomic_compare_exchange_n(&home->loop_lock, &zero, 1, 0, __ATOMIC_ACQUIRE,
                                       __ATOMIC_RELAXED);
}

static void lock_release(struct sched_worker *home)
{
    /* safety: release publishes our changes to home's state to the next holder. */
    __atomic_store_n(&home->loop_lock, 0, __ATOMIC_RELEASE);
}

/* Blocking acquisition, only ever by a thread that holds no loop lock (see the essay), of a lock
 * whose holders keep it for a bounded, short time: spin briefly, then give the CPU away (the
 * holder may be preempted on a crowded machine). */
static void loop_lock(struct sched_worker *self, struct sched_worker *home)
{
    for (unsigned spins = 0; !lock_try(home); spins++) {
        if (spins < 64)
            cpu_relax();
        else
            (sched_yield)(); /* POSIX sched_yield(2): the parentheses skip our macro */
    }
    self->held = (int)home->id;
}

static int loop_trylock(struct sched_worker *self, struct sched_worker *home)
{
    if (!lock_try(home))
        return 0;
    self->held = (int)home->id;
    return 1;
}

/* Release whatever loop lock self holds (none: no-op). */
static void loop_unlock(struct sched_worker *self)
{
    if (self->held < 0)
        return;
    lock_release(&self->s->w[self->held]);
    self->held = -1;
}

static void run_seq_bump(struct sched_worker *w)
{
    /* safety: only the owner writes run_seq; rescuers read it relaxed as a hint, and the loop
     * lock, not this counter, orders every access to home state. */
    __atomic_store_n(&w->run_seq, __atomic_load_n(&w->run_seq, __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELAXED);
}

/* ---- small helpers ---- */

static uint64_t sched_clock_ns(void)
{
    return clock_mono_ns();
}

static uint32_t sched_rand(struct sched_worker *w)
{
    /* xorshift64*: cheap and good enough for victim choice. */
    uint64_t x = w->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    w->rng = x;
    return (uint32_t)((x * 0x2545F4914F6CDD1Dull) >> 32);
}

/* The StoreLoad fence of the recipe. ThreadSanitizer does not model fences (gcc warns and
 * ignores them); it checks data races, not this ordering, so under TSan a seq_cst read-modify-
 * write on a private word stands in for it (on x86 a locked instruction is a full barrier too). */
static void sched_fence(void)
{
#if defined(CYSERVE_TSAN)
    static int word;
    /* safety: only its barrier effect matters. */
    __atomic_fetch_add(&word, 0, __ATOMIC_SEQ_CST);
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

static void stat_inc(uint64_t *c)
{
    /* safety: only the owner writes; a relaxed load+store is a plain increment that readers
     * may see late, never torn. */
    __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}

static void stat_add(uint64_t *c, uint64_t n)
{
    /* safety: as stat_inc. */
    __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
}

static int sched_is_stopping(struct sched *s)
{
    /* safety: a flag; acquire pairs with sched_stop's release so that a worker that sees it
     * also sees the eventfd writes' purpose. */
    return __atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE);
}

/* A worker's eventfd is in its epoll edge-triggered and never read: every write is a new edge
 * (the kernel wakes the eventfd's waiters on each write, whatever its counter), which the next
 * epoll_wait reports once, so a wake-up costs the write and the epoll_wait it ends, and not
 * also a read. The counter only grows; at one write per wake-up it cannot reach the
 * 0xfffffffffffffffe where a write would fail. The relief monitor's eventfd is read (it is
 * level-triggered). */
static void sched_eventfd_kick(int fd)
{
    uint64_t one = 1;
    /* EAGAIN (a full counter) would mean a wake-up is pending anyway. */
    ssize_t r = write(fd, &one, sizeof(one));
    (void)r;
}

#include "sched_inject.c.h"

/* ---- waking workers ---- */

/* Wake one parked worker to spin, unless somebody already spins. Any thread. */
static void sched_wakep(struct sched *s)
{
    /* safety: seq_cst, step 3 of the submitter's recipe (the caller fenced after publishing). */
    if (__atomic_load_n(&s->nparked, __ATOMIC_SEQ_CST) == 0)
        return;
    int zero = 0;
    /* safety: the spinning token: only one waker at a time wakes a spinner. */
    if (!__atomic_compare_exchange_n(&s->nspinning, &zero, 1, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST))
        return;
    /* safety: a rotating start; any value is correct. */
    unsigned start = __atomic_fetch_add(&s->wake_rr, 1, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < s->n; i++) {
        struct sched_worker *w = &s->w[(start + i) % s->n];
        int expect = W_PARKED;
        /* safety: claims this parked worker for exactly one waker; hands it the token. */
        if (__atomic_compare_exchange_n(&w->parked, &expect, W_WOKEN_SPIN, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST)) {
            /* safety: the claimed worker no longer counts as parked. */
            __atomic_fetch_sub(&s->nparked, 1, __ATOMIC_SEQ_CST);
            sched_eventfd_kick(w->evfd);
            return;
        }
    }
    /* Nobody to wake: give the token back. */
    /* safety: returns the token taken by the CAS above. */
    __atomic_fetch_sub(&s->nspinning, 1, __ATOMIC_SEQ_CST);
}

/* Wake w if it is parked (a coroutine was pushed on its remote queue). Any thread. */
static void sched_wake_worker(struct sched *s, struct sched_worker *w)
{
    int expect = W_PARKED;
    /* safety: seq_cst CAS after the seq_cst exchange that published the work (recipe step 3). */
    if (__atomic_compare_exchange_n(&w->parked, &expect, W_WOKEN, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST)) {
        /* safety: nparked counts workers only; a relief thread parks without counting. */
        if (w->id < s->n)
            __atomic_fetch_sub(&s->nparked, 1, __ATOMIC_SEQ_CST);
        sched_eventfd_kick(w->evfd);
    }
}

static void sched_wake_all(struct sched *s)
{
    for (unsigned i = 0; i < s->n_all; i++)
        sched_eventfd_kick(s->w[i].evfd);
    if (s->mon_evfd >= 0)
        sched_eventfd_kick(s->mon_evfd);
}

/* ---- per-worker queues ---- */

/* Put co on w's run queue (overflowing half of it to the inject queue). Owner only. */
static void w_push(struct sched_worker *w, struct coro *co)
{
    struct coro *first = NULL, *last = NULL;
    unsigned n;
    if (UNLIKELY(w->s->cfg.randomize && (sched_rand(w) & 3) == 0)) {
        /* Debug: send some coroutines the long way round, as Go's randomizeScheduler does. */
        coro_sched_node(co)->next = NULL;
        inject_push_batch(w->s, co, co, 1);
        sched_fence(); /* safety: submitter's recipe step 2 */
        sched_wakep(w->s);
        return;
    }
    if (!runq_push(&w->rq, co, &first, &last, &n)) {
        inject_push_batch(w->s, first, last, n);
        /* Half a ring just became takeable by anyone: make sure somebody looks. Rare (once per
         * capacity/2 pushes), so the fence costs nothing measurable. */
        sched_fence(); /* safety: submitter's recipe step 2 */
        sched_wakep(w->s);
    }
}

static void w_local_append(struct sched_worker *w, struct coro *co)
{
    coro_sched_node(co)->next = NULL;
    if (w->local_tail)
        coro_sched_node(w->local_tail)->next = co;
    else
        w->local_head = co;
    w->local_tail = co;
}

static void remote_push(struct sched *s, struct sched_worker *w, struct coro *co)
{
    /* safety: relaxed load of the head for the first CAS attempt; the CAS below is seq_cst and
     * publishes the node (release) and orders it before the parked-flag CAS (recipe step 2). */
    struct coro *head = __atomic_load_n(&w->remote, __ATOMIC_RELAXED);
    do {
        coro_sched_node(co)->next = head;
    } while (!__atomic_compare_exchange_n(&w->remote, &head, co, 1, __ATOMIC_SEQ_CST,
                                          __ATOMIC_RELAXED));
    sched_wake_worker(s, w);
}

/* Move the remote stack to the local list, oldest first. Holding w's loop lock. */
static void remote_drain(struct sched_worker *w)
{
    /* safety: cheap check first; acquire pairs with the pushers' CAS. */
    if (!__atomic_load_n(&w->remote, __ATOMIC_ACQUIRE))
        return;
    /* safety: takes the whole stack; acquire makes the pushed nodes' contents visible. */
    struct coro *list = __atomic_exchange_n(&w->remote, NULL, __ATOMIC_ACQUIRE);
    struct coro *rev = NULL;
    while (list) {
        struct coro *next = coro_sched_node(list)->next;
        coro_sched_node(list)->next = rev;
        rev = list;
        list = next;
    }
    while (rev) {
        struct coro *next = coro_sched_node(rev)->next;
        w_local_append(w, rev);
        rev = next;
    }
}

static void parked_add(struct sched_worker *w, struct coro *co)
{
    struct coro_sched_node *n = coro_sched_node(co);
    n->prev = NULL;
    n->next = w->parked_head;
    if (w->parked_head)
        coro_sched_node(w->parked_head)->prev = co;
    w->parked_head = co;
}

static void parked_remove(struct sched_worker *w, struct coro *co)
{
    struct coro_sched_node *n = coro_sched_node(co);
    if (n->prev)
        coro_sched_node(n->prev)->next = n->next;
    else
        w->parked_head = n->next;
    if (n->next)
        coro_sched_node(n->next)->prev = n->prev;
    n->next = n->prev = NULL;
}

/* In the home-section code below; timers, waits and sched_io enter home sections. */
static int home_enter(struct sched_worker **wp, int home);

/* The home where a coroutine running on w parks what it waits for by itself (a sleep, an fd
 * wait, a signal, a timer, a new sched_io): w for a worker. A relief thread is nobody's home: it
 * parks them on the worker it relieves (or last relieved). Parked on the relief thread itself,
 * they were served only by that thread, so a call of its own that then blocked stranded them
 * (rescue and the monitor watch the workers' homes, and a relief thread that lets go of a home
 * stops polling it); on the worker, whoever serves that home serves them. Owner only. */
static inline int own_home(const struct sched_worker *w)
{
    if (LIKELY(w->id < w->s->n))
        return (int)w->id;
    /* safety: acquire pairs with the monitor's release store of an assignment. */
    int h = __atomic_load_n(&w->relief_of, __ATOMIC_ACQUIRE);
    return h >= 0 ? h : w->last_home;
}

/* epoll data of a relieved home's epoll fd in a relief thread's epoll (sched_relief.c.h): never
 * a pointer (wait records are aligned, sched_io tags are odd, the eventfd's is 0). */
#define RELIEF_EV_HOME ((uintptr_t)2)

#include "sched_timer.c.h"

#include "sched_io.c.h"

#include "sched_offload.c.h"

#include "sched_signal.c.h"

/* ---- running a coroutine ---- */

static void w_finished(struct sched_worker *w, struct coro *co)
{
    coro_free(co, w->pool);
    w->finished_pending++;
    stat_inc(&w->st_finished);
}

/* Run co on w's thread. base: the loop lock the caller holds and wants back afterwards (w's
 * own for its loop, another's during a rescue). An ordinary coroutine runs with no loop lock
 * held (base is released first); a hopped one (from base's local list, handed=1) runs its home
 * section with base's lock, handed over. After it switched out, whatever lock it still holds
 * is released unless it is base (gopark's unlockf: a wait it registered can only be ended by
 * someone holding that lock, so it cannot be resumed while still on this stack). Returns 1 if
 * base is held again, 0 if it was lost (rescue only: the own lock is always re-taken). */
static int w_run(struct sched_worker *w, struct coro *co, struct sched_worker *base, int handed)
{
    if (!handed)
        loop_unlock(w);
    w->current = co;
    w->tick++;
    run_seq_bump(w); /* odd: running coroutine code */
    int r = coro_resume(co, w->pool);
    run_seq_bump(w);
    w->current = NULL;
    int kept = 1;
    if (w->held != (int)base->id) {
        loop_unlock(w);
        if (base == w)
            loop_lock(w, w); /* holding nothing: blocking is deadlock-free (see the essay) */
        else
            kept = 0;
    }
    switch (r) {
    case CORO_FINISHED:
        w_finished(w, co);
        break;
    case SCHED_Y_REQUEUE:
        w_push(w, co);
        break;
    case SCHED_Y_PARK:
        break; /* the wait record made it reachable from an event, a timer and the parked list */
    case SCHED_Y_HOP: {
        struct sched *s = w->s;
        stat_inc(&w->st_hops);
        remote_push(s, &s->w[coro_sched_node(co)->home], co);
        break;
    }
    case SCHED_Y_OFFLOAD:
        /* Queued only: the loop runs the batch (with its lock released), see w_loop. */
        w_offload_queue(w, co);
        break;
    default:
        /* -ENOMEM: no stack could be mapped for its first run. It cannot run, so it is
         * cancelled (its deferred calls run) rather than retried in a loop that would spin. */
        w_finished(w, co);
        break;
    }
    return kept;
}

/* Account finished coroutines; in batch mode the last one ends the run. Owner only. */
static void w_flush_finished(struct sched_worker *w)
{
    struct sched *s = w->s;
    if (w->finished_pending == 0)
        return;
    /* safety: acq_rel: every finish is ordered before the `done` it may cause. */
    long left = __atomic_sub_fetch(&s->alive, (long)w->finished_pending, __ATOMIC_ACQ_REL);
    w->finished_pending = 0;
    if (left == 0 && !s->cfg.keep_alive) {
        /* safety: release pairs with the loop's acquire of done. */
        __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
        sched_wake_all(s);
    }
}

/* Take the first hopped coroutine of home's local list. Holding home's loop lock. */
static struct coro *w_local_pop(struct sched_worker *home)
{
    struct coro *co = home->local_head;
    if (co) {
        home->local_head = coro_sched_node(co)->next;
        if (!home->local_head)
            home->local_tail = NULL;
    }
    return co;
}

static struct coro *w_next_local(struct sched_worker *w)
{
    struct coro *co = w_local_pop(w);
    return co ? co : runq_pop(&w->rq);
}

static struct coro *w_steal(struct sched_worker *w)
{
    struct sched *s = w->s;
    unsigned live = sched_live(s);
    if (live < 2)
        return NULL;
    /* Relief threads are victims too: one stuck in a long call may hold runnable coroutines. */
    unsigned start = sched_rand(w) % live;
    for (unsigned i = 0; i < live; i++) {
        unsigned v = (start + i) % live;
        if (v == w->id)
            continue;
        struct coro *co = runq_steal(&w->rq, &s->w[v].rq);
        if (co) {
            stat_inc(&w->st_steals);
            return co;
        }
    }
    return NULL;
}

static void w_spin_stop(struct sched_worker *w, int found)
{
    struct sched *s = w->s;
    if (!w->spinning)
        return;
    w->spinning = 0;
    /* safety: seq_cst: parker's recipe step 1 / the last-spinner rule below. */
    int left = __atomic_sub_fetch(&s->nspinning, 1, __ATOMIC_SEQ_CST);
    if (found && left == 0) {
        /* We were the last spinner and found work: there may be more; let another spin. */
        sched_fence();
        sched_wakep(s);
    }
}

static struct coro *w_find_work(struct sched_worker *w)
{
    struct sched *s = w->s;
    if (!w->spinning) {
        /* safety: approximate reads are fine: this only limits how many spin. */
        int spinning = __atomic_load_n(&s->nspinning, __ATOMIC_RELAXED);
        int parked = __atomic_load_n(&s->nparked, __ATOMIC_RELAXED);
        if (2 * spinning >= (int)s->n - parked)
            return NULL;
        w->spinning = 1;
        /* safety: seq_cst: submitters read it after their fence. */
        __atomic_fetch_add(&s->nspinning, 1, __ATOMIC_SEQ_CST);
    }
    struct coro *co = inject_take(w, 0);
    if (!co)
        co = w_steal(w);
    if (co)
        w_spin_stop(w, 1);
    return co;
}

/* Is there anything this worker could run or should react to? Parker's recipe step 3. */
static int w_work_visible(struct sched_worker *w)
{
    struct sched *s = w->s;
    /* safety: all seq_cst/acquire reads after the parker's fence. */
    if (__atomic_load_n(&s->stopping, __ATOMIC_SEQ_CST) ||
        (!s->cfg.keep_alive && __atomic_load_n(&s->done, __ATOMIC_SEQ_CST)))
        return 1;
    if (__atomic_load_n(&s->inj_len, __ATOMIC_SEQ_CST) > 0)
        return 1;
    /* safety: seq_cst, after the parker's fence: pairs with remote_push's seq_cst CAS. */
    if (__atomic_load_n(&w->remote, __ATOMIC_SEQ_CST))
        return 1;
    if (w->local_head || w->n_off || w->off_owed)
        return 1;
    unsigned live = sched_live(s);
    for (unsigned i = 0; i < live; i++)
        if (runq_len(&s->w[i].rq) > 0)
            return 1;
    return 0;
}

static int relief_take_batch(struct sched_worker *w, struct sched_worker *v, uint64_t now);

/* Run v's loop step here: its events, due timers and hopped coroutines (those run on this
 * thread). Called holding w's own lock and no other; try-locks v's (the rule: never block on a
 * second loop lock) and gives up w's own meanwhile: a hopped coroutine we resume may leave its
 * home section and run long, and we must hold at most one loop lock when we do. Returns the
 * events, timers and coroutines handled, or -1 if v's lock was taken (v is back in its loop, or
 * another thread is in v's home state right now). Holds w's own lock again on return. */
static int w_rescue_step(struct sched_worker *w, struct sched_worker *v)
{
    if (!lock_try(v))
        return -1;
    lock_release(w);
    w->held = (int)v->id;
    int did = w_poll(w, v, 0);
    remote_drain(v);
    int kept = 1;
    struct coro *co;
    while (kept && (co = w_local_pop(v)) != NULL) {
        kept = w_run(w, co, v, 1);
        did++;
    }
    if (kept)
        loop_unlock(w);
    loop_lock(w, w); /* holding nothing: blocking is deadlock-free */
    return did;
}

/* Rescue (see the essay): look for workers that have run one coroutine for SCHED_RESCUE_NS
 * with their loop lock released, and run their loop step here. Called by w's loop, holding its
 * own lock, before it parks. *watch is set when some worker runs coroutine code now, so that the
 * park comes back to look again. Returns the events, timers and hopped coroutines handled. */
static int w_rescue(struct sched_worker *w, int *watch)
{
    struct sched *s = w->s;
    if (s->n < 2 || sched_is_stopping(s))
        return 0;
    uint64_t now = sched_clock_ns();
    w->now = now;
    int did = 0;
    for (unsigned i = 0; i < s->n; i++) {
        struct sched_worker *v = &s->w[i];
        if (v == w)
            continue;
        /* safety: hints; the trylock in w_rescue_step decides. */
        uint64_t seq = __atomic_load_n(&v->run_seq, __ATOMIC_RELAXED);
        if (!(seq & 1))
            continue;
        *watch = 1;
        /* safety: a sample shared by all rescuers; see the field comment. */
        if (__atomic_load_n(&v->watch_seq, __ATOMIC_RELAXED) != seq) {
            __atomic_store_n(&v->watch_seq, seq, __ATOMIC_RELAXED);
            __atomic_store_n(&v->watch_at, now, __ATOMIC_RELAXED);
            continue;
        }
        /* safety: as above. */
        if (now - __atomic_load_n(&v->watch_at, __ATOMIC_RELAXED) < SCHED_RESCUE_NS)
            continue;
        int r = w_rescue_step(w, v);
        if (r < 0)
            continue;
        /* safety: one rescue per threshold per stalled worker, by whoever comes first. */
        __atomic_store_n(&v->watch_at, now, __ATOMIC_RELAXED);
        did += r;
        /* A stalled batch's calls that have not started would wait behind the long one: take
         * them here (they run in our next batch). */
        did += relief_take_batch(w, v, now);
    }
    return did;
}

/* Is any other worker out of its park (running its loop or coroutine code)? Parker's recipe
 * step 3, for the watch (see "Watching" in the essay). */
static int w_others_unparked(struct sched_worker *w)
{
    struct sched *s = w->s;
    for (unsigned i = 0; i < s->n; i++) {
        /* safety: seq_cst, after the parker's fence: pairs with the exchange that ends another
         * worker's park (w_park), which is followed by a fence and a read of nparked. */
        if (i != w->id && __atomic_load_n(&s->w[i].parked, __ATOMIC_SEQ_CST) != W_PARKED)
            return 1;
    }
    return 0;
}

/* Whether the loop's step 3 polls this worker's epoll without blocking before it looks for work
 * elsewhere. Both ways lose nothing: when steps 4 and 5 find nothing the park is next, and its
 * epoll_wait reports the same events (epoll keeps a readiness until it is reported, whatever
 * the wait's timeout) and fires due timers (w_park's timeout is 0 when one is due). What differs
 * is the cost. Polling first costs a system call that finds nothing under a light load (then
 * the park makes a second epoll_wait for the same wake-up); not polling costs a spin (steal
 * attempts over every run queue) and the park's protocol (its atomics and fence) each time
 * events are already waiting, as under a heavy load. So the worker polls first when the last look found its epoll
 * ready at once (poll_ready), and always when something elsewhere could otherwise come before
 * our own events (an injected coroutine, another run queue to steal from, another worker in
 * coroutine code that a rescue may step in for). The reads of others' state are hints
 * (relaxed): a coroutine pushed after them is seen by w_park's re-check after its fence (the
 * recipe), and a worker entering coroutine code after them is watched by the park's timeout. */
static int w_poll_first(struct sched_worker *w)
{
    struct sched *s = w->s;
    if (!w->parked_head && !w->heap_len)
        return 0; /* nobody of ours waits on an event or a timer */
    if (w->poll_ready)
        return 1;
    if (__atomic_load_n(&s->inj_len, __ATOMIC_RELAXED) > 0)
        return 1;
    unsigned live = sched_live(s);
    for (unsigned i = 0; i < live; i++) {
        if (i == w->id)
            continue;
        if (runq_len(&s->w[i].rq) > 0)
            return 1;
        /* safety: relaxed, a hint: odd while that worker runs coroutine code (w_rescue). */
        if (i < s->n && (__atomic_load_n(&s->w[i].run_seq, __ATOMIC_RELAXED) & 1))
            return 1;
    }
    return 0;
}

/* ---- Giving back an idle thread's stacks ----
 * A burst leaves free coroutine stacks behind: up to 128 in each worker's cache, 32 in each
 * relief thread's and 512 in the depot they share (coro.c), each holding the pages its
 * coroutines touched. The depot decays only as magazines move, and a server that goes quiet
 * parks every thread without a timeout, so they stayed until the next burst. Now a thread about
 * to sleep long (no timeout, or one past CORO_IDLE_TRIM_MS: every worker parked, or a relief
 * thread between assignments) that may have something to give back (w_trim_arm: it ran a
 * coroutine since its last trim) sleeps CORO_IDLE_TRIM_MS at most, and if nothing came in that
 * time it trims (coro_pool_trim: a worker keeps one magazine with its pages given back, a relief
 * thread nothing, the rest is unmapped, and a depot still for a second emptied). After a trim
 * nothing is due, so the next sleep has no timeout again: one wake-up per thread and idle
 * spell, none while it serves (a busy worker's parks are short, or watch others with a 1 ms
 * timeout, and a wake-up that brings work ends the sleep before its timeout). Why here, and not
 * a timer or the relief monitor: a timer costs a system call to arm and an idle server a
 * periodic wake-up; the monitor runs only while Python calls do (a C-only server never starts
 * it), and a pool's cache belongs to its thread, so only that thread may trim it. A thread
 * whose sleeps never last CORO_IDLE_TRIM_MS (a timer of its own that fires more often, clients
 * that come back sooner) does not trim: its stacks are in use at that rate. */
#define SCHED_TRIM_NS ((uint64_t)CORO_IDLE_TRIM_MS * 1000000ull)

/* Before a sleep of *timeout_ms (-1: none): shorten it to CORO_IDLE_TRIM_MS if it is longer and
 * the thread may have something to give back: it ran a coroutine since its last trim left
 * nothing (a coroutine takes its stack from, and gives it back to, the pool of the thread that
 * runs it, and only w_run runs them), or that trim found the depot still in use. Two loads of
 * the thread's own words, no call: with one connection every request's park asks (a call to
 * coro_pool_trim_due here cost about 20 instructions a request, its spills included). Returns 1
 * when it shortened the sleep (which may then end in w_trim). Owner. */
static int w_trim_arm(struct sched_worker *w, int *timeout_ms)
{
    /* safety: run_seq is ours: only this thread writes it. */
    if ((*timeout_ms >= 0 && *timeout_ms <= CORO_IDLE_TRIM_MS) ||
        __atomic_load_n(&w->run_seq, __ATOMIC_RELAXED) == w->trimmed_seq)
        return 0;
    *timeout_ms = CORO_IDLE_TRIM_MS;
    return 1;
}

/* The thread slept CORO_IDLE_TRIM_MS and nothing came: give back its free stacks. A worker keeps
 * a magazine of them, clean, for the first coroutines after the idle spell; a relief thread
 * none (it starts few coroutines: what it finishes is wanted by the workers, and with every
 * thread idle by nobody). Owner. */
static NOINLINE void w_trim(struct sched_worker *w)
{
    unsigned keep = w->id < w->s->n ? CORO_STACK_MAG : 0;
    stat_add(&w->st_stacks_trimmed, coro_pool_trim(w->pool, keep));
    stat_inc(&w->st_trims);
    /* A depot moved within the last second stays until a later trim: keep asking until then. */
    if (!coro_pool_trim_due(w->pool))
        w->trimmed_seq = __atomic_load_n(&w->run_seq, __ATOMIC_RELAXED); /* safety: ours */
}

static void w_park(struct sched_worker *w, int watch)
{
    struct sched *s = w->s;
    w_spin_stop(w, 0);
    /* safety: recipe step 2: publish "parked" before re-checking. */
    __atomic_store_n(&w->parked, W_PARKED, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&s->nparked, 1, __ATOMIC_SEQ_CST);
    sched_fence();
    int trim = 0;
    if (!w_work_visible(w)) {
        stat_inc(&w->st_parks);
        w->now = sched_clock_ns(); /* the timeout must count from now, not the last poll */
        int timeout = w_next_timeout_ms(w);
        /* Another worker runs a coroutine, or may start one at any moment (it is not parked):
         * come back within the threshold to see whether it runs one long (its events would not
         * wake us: they are on its epoll). The second test is read after our fence; w_rescue's
         * run_seq sample, taken before it, cannot tell "between two coroutines" from "idle". */
        int watch_ms = (int)((SCHED_RESCUE_NS + 999999) / 1000000);
        if ((watch || w_others_unparked(w)) && (timeout < 0 || timeout > watch_ms))
            timeout = watch_ms;
        trim = w_trim_arm(w, &timeout);
        uint64_t parked_at = w->now;
        w->in_park = 1;
        int got = w_poll(w, w, timeout);
        w->in_park = 0;
        trim = trim && got == 0 && w->now - parked_at >= SCHED_TRIM_NS;
        /* A short park that handled one event is a partner answering in turn, not a queue: one
         * connection whose client sends its next request as soon as it has the answer, or a
         * coroutine whose answer another thread gave (the ASGI loop's: the eventfd kick counts
         * for nothing, its coroutine comes by the remote queue). Either way nothing more comes
         * until we have served it, so a non-blocking poll before the next park would find
         * nothing: a system call per wake-up (about 0.6 per ASGI request with one connection).
         * Two or more at once mean several sources are ready together, as under load. */
        w->poll_ready = got > 1 && w->now - parked_at < SCHED_BUSY_PARK_NS; /* w_poll set now */
    }
    /* safety: take our state back; whatever a waker stored tells us how we were woken. */
    int st = __atomic_exchange_n(&w->parked, W_RUNNING, __ATOMIC_SEQ_CST);
    if (st == W_PARKED)
        __atomic_fetch_sub(&s->nparked, 1, __ATOMIC_SEQ_CST); /* safety: we undo our own ++ */
    else if (st == W_WOKEN_SPIN)
        w->spinning = 1; /* the waker counted us in nspinning and out of nparked */
    /* Slept the whole timeout, nothing came and nobody woke us: a coroutine queued in the
     * moment since waits for the trim (a few system calls per stack given back). */
    if (UNLIKELY(trim) && st == W_PARKED)
        w_trim(w);
    /* Leaving the park with coroutines to run (our own I/O or timer woke one, or a hop came
     * home): another worker may have parked without a timeout because it saw us parked, and
     * would then never look at us if one of those coroutines runs long. Wake one to spin; it
     * parks again with the watch, since we are not parked now. A spinner (ours included) does
     * this itself when it finds work (w_spin_stop). */
    /* safety: relaxed: a hint. A push after this load finds us W_RUNNING, and comes from a
     * worker that is not parked, which every parker watches. */
    if (st != W_WOKEN_SPIN &&
        (runq_len(&w->rq) > 0 || w->local_head || __atomic_load_n(&w->remote, __ATOMIC_RELAXED))) {
        sched_fence(); /* safety: the recipe's StoreLoad, between our exchange and wakep's reads */
        sched_wakep(s);
    }
}

/* The worker's loop. It holds its own loop lock throughout, except while a coroutine or a batch
 * of offloaded calls runs (w_run, w_loop_offloads). */
static void w_loop(struct sched_worker *w)
{
    struct sched *s = w->s;
    for (;;) {
        if (UNLIKELY(sched_is_stopping(s)))
            return;
        /* safety: acquire pairs with w_flush_finished's release. */
        if (!s->cfg.keep_alive && __atomic_load_n(&s->done, __ATOMIC_ACQUIRE))
            return;
        struct coro *co = NULL;
        int handed = 0;
        unsigned interval = s->cfg.randomize ? 1 + sched_rand(w) % 61 : 61;
        if (UNLIKELY(w->tick % interval == 0)) {
            w->tick++;
            co = inject_take(w, 0);
            if (w->parked_head || w->heap_len)
                w_poll(w, w, 0);
            else
                w->now = sched_clock_ns(); /* keep sched_now_ns() fresh on a busy worker */
        }
        if (!co) {
            remote_drain(w);
            co = w_local_pop(w);
            if (co)
                handed = 1;
            else
                co = runq_pop(&w->rq);
        }
        if (LIKELY(co != NULL)) {
            /* Woken to spin but found work of our own (an event arrived as we parked): stop
             * spinning, or submitters would count on us to look for theirs. */
            if (UNLIKELY(w->spinning))
                w_spin_stop(w, 1);
            w_run(w, co, w, handed);
            if (w_offloads_due(w))
                w_loop_offloads(w);
            continue;
        }
        w_flush_finished(w);
        if (w->n_off || w->off_owed) {
            w_loop_offloads(w);
            continue;
        }
        if (w_poll_first(w)) {
            w->poll_ready = w_poll(w, w, 0) > 0;
            if (w->poll_ready)
                continue;
        }
        co = w_find_work(w);
        if (co) {
            w_run(w, co, w, 0);
            continue;
        }
        int watch = 0;
        if (w_rescue(w, &watch) > 0)
            continue;
        w_park(w, watch);
    }
}

/* Step 2 of the stop protocol: finish everything this worker holds. Holding its own lock. */
static void w_drain(struct sched_worker *w)
{
    w_spin_stop(w, 0);
    for (;;) {
        while (w->parked_head) {
            struct coro *co = w->parked_head;
            wait_finish(w, w, coro_sched_node(co)->wait, -ECANCELED);
        }
        if (w->n_off || w->off_owed)
            w_run_offloads(w, 1);
        remote_drain(w);
        int handed = 0;
        struct coro *co = w_local_pop(w);
        if (co)
            handed = 1;
        else
            co = runq_pop(&w->rq);
        if (!co)
            co = inject_take(w, 1);
        if (!co)
            break;
        w_run(w, co, w, handed);
    }
    w_flush_finished(w);
}

static void *w_main(void *arg)
{
    struct sched_worker *w = arg;
    struct sched *s = w->s;
    sched_tls_worker = w;
    /* safety: read by the monitor only (relief_waiting); relaxed: a stale 0 means "unknown". */
    __atomic_store_n(&w->tid, (int)syscall(SYS_gettid), __ATOMIC_RELAXED);
    w->now = sched_clock_ns();
    /* The worker's pool is created on the worker (it owns the pool, and the pool gives this
     * thread its alternate signal stack) and shares the scheduler's slab of structs. */
    if (UNLIKELY(coro_pool_new_shared(&w->pool, s->cfg.stack_size, s->ext_pool) != 0)) {
        static const char msg[] = "cyserve: a worker could not allocate its stack pool; stopping\n";
        ssize_t r = write(2, msg, sizeof(msg) - 1);
        (void)r;
        sched_stop(s);
        sched_tls_worker = NULL;
        return NULL;
    }
    /* The start and stop hooks run like loop callbacks: with the worker's own loop lock. */
    loop_lock(w, w);
    if (s->w_start)
        s->w_start(s, w->id, s->w_ud);
    w_loop(w);
    if (sched_is_stopping(s))
        w_drain(w);
    w_spin_stop(w, 0); /* a worker woken to spin may leave at once: give the token back */
    w_flush_finished(w);
    if (s->w_stop)
        s->w_stop(s, w->id, s->w_ud);
    loop_unlock(w);
    if (s->off_exit)
        s->off_exit(s->off_ud);
    coro_pool_free(w->pool);
    w->pool = NULL;
    sched_tls_worker = NULL;
    return NULL;
}

#include "sched_relief.c.h"

/* ---- public API: lifecycle ---- */

static unsigned sched_default_workers(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return (unsigned)n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

int sched_new(struct sched **out, const struct sched_config *cfg)
{
    struct sched_config c = *cfg;
    if (c.workers > SCHED_MAX_WORKERS || c.relief > SCHED_MAX_RELIEF)
        return -EINVAL;
    if (c.stack_size == 0)
        c.stack_size = CORO_STACK_DEFAULT;
    if (c.stack_size < CORO_STACK_MIN || c.stack_size > CORO_STACK_MAX)
        return -EINVAL;
    if (c.runq_capacity == 0)
        c.runq_capacity = 256;
    if (c.runq_capacity < 2 || (c.runq_capacity & (c.runq_capacity - 1)) != 0)
        return -EINVAL;
    if (c.workers == 0)
        c.workers = sched_default_workers();
    if (c.workers > SCHED_MAX_WORKERS)
        c.workers = SCHED_MAX_WORKERS;
    if (c.seed == 0)
        c.seed = sched_clock_ns() | 1;

    struct sched *s = calloc(1, sizeof(*s));
    if (UNLIKELY(!s))
        return -ENOMEM;
    s->cfg = c;
    s->n = c.workers;
    s->n_all = c.workers + c.relief;
    s->n_live = c.workers; /* no thread exists yet: a plain store */
    s->mon_evfd = -1;
    s->relief_policy = -1;
    pthread_mutex_init(&s->inject_lock, NULL);
    int err = coro_pool_new(&s->ext_pool, c.stack_size);
    if (UNLIKELY(err)) {
        free(s);
        return err;
    }
    s->w = aligned_alloc(CACHE_LINE, sizeof(*s->w) * s->n_all);
    if (UNLIKELY(!s->w)) {
        coro_pool_free(s->ext_pool);
        free(s);
        return -ENOMEM;
    }
    memset(s->w, 0, sizeof(*s->w) * s->n_all);
    for (unsigned i = 0; i < s->n_all; i++) {
        struct sched_worker *w = &s->w[i];
        w->s = s;
        w->id = i;
        w->epfd = w->evfd = -1;
        w->stat_fd = -1;
        w->held = -1;
        w->relieved_by = -1;
        w->relief_of = i < s->n ? RELIEF_BUSY : RELIEF_IDLE;
        w->q = &w->q_own;
        w->rng = c.seed + 0x9E3779B97F4A7C15ull * (i + 1);
        err = runq_init(&w->rq, c.runq_capacity);
        if (!err) {
            w->epfd = epoll_create1(EPOLL_CLOEXEC);
            w->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
            if (w->epfd < 0 || w->evfd < 0)
                err = -errno;
        }
        if (!err) {
            /* Edge-triggered: see sched_eventfd_kick. */
            struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.ptr = NULL};
            if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->evfd, &ev) != 0)
                err = -errno;
        }
        if (UNLIKELY(err)) {
            s->n_all = i + 1;
            sched_free(s);
            return err;
        }
    }
    if (c.relief > 0) {
        s->mon_evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (s->mon_evfd < 0) {
            err = -errno;
            sched_free(s);
            return err;
        }
    }
    *out = s;
    return 0;
}

unsigned sched_workers(const struct sched *s)
{
    return s->n;
}

unsigned sched_threads(const struct sched *s)
{
    return s->n_all;
}

/* Free every coroutine still held anywhere (workers not running). Calling thread. */
static void sched_free_leftovers(struct sched *s)
{
    long freed = 0;
    /* Collect first, free after: deferred calls run outside the inject lock (one may call
     * sched_spawn, which takes it). The worker threads are gone: this thread borrows their
     * owner-only queues. */
    struct coro *list = NULL;
    for (unsigned i = 0; i < s->n_all; i++) {
        struct sched_worker *w = &s->w[i];
        struct coro *co;
        remote_drain(w);
        while ((co = w_next_local(w))) {
            coro_sched_node(co)->next = list;
            list = co;
        }
        while (w->off_head) {
            co = w->off_head;
            w->off_head = coro_sched_node(co)->next;
            coro_sched_node(co)->next = list;
            list = co;
        }
        w->off_tail = NULL;
        w->n_off = 0;
        /* A queue of calls is empty once every batch has ended; this only keeps a broken
         * invariant from leaking. */
        while (w->q_own.head) {
            co = w->q_own.head;
            w->q_own.head = coro_sched_node(co)->next;
            coro_sched_node(co)->next = list;
            list = co;
        }
        w->q_own.tail = NULL;
        /* Parked coroutines exist only if the workers never drained (sched_free without stop
         * in server mode); their registrations die with the epoll fd, their timers with the
         * heap (the heap only points into their stacks). */
        while (w->parked_head) {
            co = w->parked_head;
            parked_remove(w, co);
            coro_sched_node(co)->next = list;
            list = co;
        }
        w->heap_len = 0;
    }
    pthread_mutex_lock(&s->inject_lock);
    while (s->inj_head) {
        struct coro *co = s->inj_head;
        s->inj_head = coro_sched_node(co)->next;
        coro_sched_node(co)->next = list;
        list = co;
    }
    s->inj_tail = NULL;
    /* Spawn records never became coroutines: nothing to cancel, only to count. */
    while (s->sp_head) {
        struct sched_spawn_block *b = s->sp_head;
        s->sp_head = b->next;
        freed += (long)(b->tail - b->head);
        free(b);
    }
    s->sp_tail = NULL;
    /* safety: under the lock, workers gone. */
    __atomic_store_n(&s->inj_len, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s->inject_lock);
    while (list) {
        struct coro *next = coro_sched_node(list)->next;
        /* ext_pool without the lock: no spawn can run concurrently (stopping makes spawns
         * return before touching it; sched_free's contract excludes concurrent calls), and a
         * deferred call that spawns from this thread must not deadlock. */
        coro_free(list, s->ext_pool);
        freed++;
        list = next;
    }
    /* safety: workers are joined; plain bookkeeping. */
    __atomic_sub_fetch(&s->alive, freed, __ATOMIC_ACQ_REL);
}

void sched_free(struct sched *s)
{
    if (!s)
        return;
    if (s->w) {
        sched_free_leftovers(s);
        for (unsigned i = 0; i < s->n_all; i++) {
            struct sched_worker *w = &s->w[i];
            if (w->rq.buf)
                runq_destroy(&w->rq);
            if (w->epfd >= 0)
                close(w->epfd);
            if (w->evfd >= 0)
                close(w->evfd);
            if (w->stat_fd >= 0)
                close(w->stat_fd);
            free(w->heap);
        }
        free(s->w);
    }
    if (s->mon_evfd >= 0)
        close(s->mon_evfd);
    free(s->sp_spare);
    coro_pool_free(s->ext_pool);
    pthread_mutex_destroy(&s->inject_lock);
    free(s);
}

int sched_spawn(struct sched *s, coro_fn fn, void *arg)
{
    if (UNLIKELY(sched_is_stopping(s)))
        return -ESHUTDOWN;
    struct sched_worker *w = sched_self();
    if (w && w->s == s) {
        struct coro *co = coro_new(w->pool, fn, arg);
        if (UNLIKELY(!co))
            return -ENOMEM;
        /* safety: counted before it is published, so `alive` never undercounts. */
        __atomic_fetch_add(&s->alive, 1, __ATOMIC_RELAXED);
        stat_inc(&w->st_spawned);
        w_push(w, co);
        /* Spawned by an event w's park dispatches (a request on an idle connection): w itself
         * leaves the park and runs it next, and w_park's end wakes another worker to spin when
         * it should. Waking here would claim w itself (it still counts as parked) and cost it
         * an eventfd write, an epoll wake-up and a read for nothing. */
        if (w->in_park)
            return 0;
        sched_fence(); /* safety: submitter's recipe step 2 */
        sched_wakep(s);
        return 0;
    }
    pthread_mutex_lock(&s->inject_lock);
    if (UNLIKELY(sched_is_stopping(s))) {
        pthread_mutex_unlock(&s->inject_lock);
        return -ESHUTDOWN;
    }
    struct sched_spawn_block *b = s->sp_tail;
    if (UNLIKELY(!b || b->tail == SCHED_SPAWN_BLOCK)) {
        struct sched_spawn_block *nb = s->sp_spare;
        if (nb)
            s->sp_spare = NULL;
        else
            nb = malloc(sizeof(*nb));
        if (UNLIKELY(!nb)) {
            pthread_mutex_unlock(&s->inject_lock);
            return -ENOMEM;
        }
        nb->next = NULL;
        nb->head = nb->tail = 0;
        if (b)
            b->next = nb;
        else
            s->sp_head = nb;
        s->sp_tail = nb;
        b = nb;
    }
    b->rec[b->tail].fn = fn;
    b->rec[b->tail].arg = arg;
    b->tail++;
    /* safety: under the lock and before the record is visible to any worker. */
    __atomic_fetch_add(&s->alive, 1, __ATOMIC_RELAXED);
    s->ext_spawned++;
    /* safety: see inject_push_batch. */
    __atomic_store_n(&s->inj_len, s->inj_len + 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s->inject_lock);
    /* No wake-up while the workers are not running: spawning a batch before sched_run() costs
     * no syscall and no fence (the 500,000-coroutine benchmark). */
    /* safety: acquire pairs with the release in sched_start_workers. */
    if (__atomic_load_n(&s->running, __ATOMIC_ACQUIRE)) {
        sched_fence(); /* safety: submitter's recipe step 2 */
        sched_wakep(s);
    }
    return 0;
}

static int sched_start_workers(struct sched *s)
{
    /* safety: plain flags reset before any worker exists. */
    __atomic_store_n(&s->done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->running, 1, __ATOMIC_RELEASE);
    for (unsigned i = s->n; i < s->n_all; i++) {
        struct sched_worker *r = &s->w[i];
        r->started = 0;
        /* safety: no relief thread or monitor exists yet. */
        __atomic_store_n(&r->relief_of, RELIEF_IDLE, __ATOMIC_RELAXED);
    }
    for (unsigned i = 0; i < s->n; i++)
        /* safety: as above. */
        __atomic_store_n(&s->w[i].relieved_by, -1, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < s->n; i++) {
        int err = pthread_create(&s->w[i].thread, NULL, w_main, &s->w[i]);
        if (UNLIKELY(err)) {
            sched_stop(s);
            for (unsigned j = 0; j < i; j++)
                pthread_join(s->w[j].thread, NULL);
            /* safety: as in sched_join: the started workers are joined. */
            __atomic_store_n(&s->running, 0, __ATOMIC_RELEASE);
            sched_free_leftovers(s);
            return -err;
        }
    }
    /* The monitor is optional: without it, relief never starts, and rescue by idle workers is
     * all there is (as with relief = 0). */
    s->mon_started = 0;
    /* safety: before the monitor exists. */
    __atomic_store_n(&s->relief_quit, 0, __ATOMIC_RELAXED);
    if (s->mon_evfd >= 0 && pthread_create(&s->mon, NULL, mon_main, s) == 0)
        s->mon_started = 1;
    return 0;
}

int sched_run(struct sched *s)
{
    if (s->cfg.keep_alive)
        return -EINVAL;
    /* safety: no worker runs; a plain read. */
    if (__atomic_load_n(&s->alive, __ATOMIC_ACQUIRE) == 0)
        return 0;
    int err = sched_start_workers(s);
    if (err)
        return err;
    return sched_join(s);
}

int sched_start(struct sched *s)
{
    return sched_start_workers(s);
}

void sched_stop(struct sched *s)
{
    /* safety: release so that workers that see the flag see everything before it. */
    __atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
    sched_wake_all(s);
}

int sched_join(struct sched *s)
{
    /* safety: acquire pairs with sched_start_workers. */
    if (!__atomic_load_n(&s->running, __ATOMIC_ACQUIRE))
        return 0;
    for (unsigned i = 0; i < s->n; i++)
        pthread_join(s->w[i].thread, NULL);
    if (s->mon_started) {
        /* Batch mode ends with the last coroutine, not a stop: tell the monitor and the
         * relief threads apart (the workers are gone, so none of them has work left). */
        __atomic_store_n(&s->relief_quit, 1, __ATOMIC_RELEASE);
        sched_eventfd_kick(s->mon_evfd);
        pthread_join(s->mon, NULL);
        s->mon_started = 0;
        /* The monitor is gone, so `started` is ours to read: join what it started. */
        for (unsigned i = s->n; i < s->n_all; i++) {
            if (s->w[i].started) {
                sched_eventfd_kick(s->w[i].evfd);
                pthread_join(s->w[i].thread, NULL);
                s->w[i].started = 0;
            }
        }
    }
    /* safety: release pairs with sched_spawn's acquire: no wake-ups for joined workers. */
    __atomic_store_n(&s->running, 0, __ATOMIC_RELEASE);
    if (sched_is_stopping(s))
        sched_free_leftovers(s);
    return 0;
}

/* ---- public API: inside coroutines ---- */

struct coro *sched_current(void)
{
    struct sched_worker *w = sched_self();
    return w ? w->current : NULL;
}

int sched_worker_id(void)
{
    struct sched_worker *w = sched_self();
    return w ? (int)w->id : -1;
}

int sched_worker_queued(int home)
{
    struct sched_worker *w = sched_self();
    /* Only the owner reads local_head (under its loop lock, which it holds here), n_off and
     * off_owed (owner-only fields); another thread cannot know, and "queued" is the answer that
     * costs its caller at most one poll. Hopped coroutines on local_head run before the next
     * epoll look, so they count as queued work. */
    if (!w || (int)w->id != home || w->id >= w->s->n)
        return 1;
    /* safety: relaxed, a hint: a push after these loads (a hop home, an injected spawn) only
     * delays the caller's readiness by the one loop turn it already accepts. */
    return runq_len(&w->rq) > 0 || w->local_head || w->n_off || w->off_owed ||
           __atomic_load_n(&w->remote, __ATOMIC_RELAXED) != NULL ||
           __atomic_load_n(&w->s->inj_len, __ATOMIC_RELAXED) > 0;
}

int sched_yield_coro(void)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w || !w->current))
        return -EPERM; /* not called from a coroutine: refuse rather than crash */
    if (UNLIKELY(sched_is_stopping(w->s)))
        return -ECANCELED;
    return coro_yield(w->current, SCHED_Y_REQUEUE);
}

void sched_set_worker_hooks(struct sched *s, void (*start)(struct sched *s, unsigned id, void *ud),
                            void (*stop)(struct sched *s, unsigned id, void *ud), void *ud)
{
    s->w_start = start;
    s->w_stop = stop;
    s->w_ud = ud;
}

/* ---- home sections ---- */

/* Enter a home section of worker `home` from the running coroutine: on return this thread holds
 * L(home), and *wp is the worker running the coroutine now (it changes after a hop). Any other
 * loop lock held is released first (one lock at a time). Returns 0; never fails. */
static int home_enter(struct sched_worker **wp, int home)
{
    struct sched_worker *w = *wp;
    if (w->held == home)
        return 0;
    loop_unlock(w);
    struct sched_worker *h = &w->s->w[home];
    if (LIKELY(loop_trylock(w, h)))
        return 0;
    if (home == (int)w->id || sched_is_stopping(w->s)) {
        /* Our own worker's lock is held by a rescuer or another home section (both short: our
         * worker is running us, so it is not parked holding it); while stopping, nobody parks.
         * We hold nothing, so blocking cannot deadlock. */
        loop_lock(w, h);
        return 0;
    }
    /* home is in its loop (perhaps parked in epoll_wait) or busy with its lock: hop. Whoever
     * holds L(home) next (home's loop, or a rescuer) runs us from home's local list and hands
     * the lock over. */
    struct coro *co = w->current;
    coro_sched_node(co)->home = home;
    coro_yield(co, SCHED_Y_HOP);
    *wp = w = sched_self(); /* another thread now: a fresh read, see sched_self() */
    if (UNLIKELY(w->held != home))
        abort(); /* a hopped coroutine is only ever resumed with its home's lock */
    return 0;
}

int sched_home_enter(int home)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w))
        return -EPERM;
    if (home < 0)
        home = own_home(w);
    if (UNLIKELY((unsigned)home >= w->s->n_all))
        return -EINVAL;
    if (w->held == home)
        return home;
    if (UNLIKELY(!w->current))
        return -EPERM; /* a callback holds its loop's lock already, and may not take another */
    home_enter(&w, home);
    return home;
}

void sched_home_exit(void)
{
    struct sched_worker *w = sched_self();
    if (w && w->current)
        loop_unlock(w);
}

int sched_home_held(void)
{
    struct sched_worker *w = sched_self();
    return w ? w->held : -1;
}

/* ---- stats ---- */

void sched_get_stats(const struct sched *s, struct sched_stats *out)
{
    memset(out, 0, sizeof(*out));
    uint64_t off_in = 0, off_out = 0;
    /* safety: relaxed reads of monitor-written counters. */
    out->reliefs = __atomic_load_n(&s->st_reliefs, __ATOMIC_RELAXED);
    out->relief_threads = __atomic_load_n(&s->st_relief_threads, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < s->n_all; i++) {
        const struct sched_worker *w = &s->w[i];
        /* safety: relaxed reads of owner-written counters; totals are approximate while
         * running, exact once the workers are joined. */
        out->spawned += __atomic_load_n(&w->st_spawned, __ATOMIC_RELAXED);
        out->finished += __atomic_load_n(&w->st_finished, __ATOMIC_RELAXED);
        out->steals += __atomic_load_n(&w->st_steals, __ATOMIC_RELAXED);
        out->parks += __atomic_load_n(&w->st_parks, __ATOMIC_RELAXED);
        out->hops += __atomic_load_n(&w->st_hops, __ATOMIC_RELAXED);
        out->offloads += __atomic_load_n(&w->st_offloads, __ATOMIC_RELAXED);
        out->offload_wait_ns += __atomic_load_n(&w->st_offload_wait_ns, __ATOMIC_RELAXED);
        out->trims += __atomic_load_n(&w->st_trims, __ATOMIC_RELAXED);
        out->stacks_trimmed += __atomic_load_n(&w->st_stacks_trimmed, __ATOMIC_RELAXED);
        off_in += __atomic_load_n(&w->st_off_in, __ATOMIC_RELAXED);
        off_out += __atomic_load_n(&w->st_off_out, __ATOMIC_RELAXED);
    }
    /* Read thread by thread, a return may be seen before its call: never below 0. */
    out->offloading = off_in > off_out ? off_in - off_out : 0;
    for (unsigned i = 0; i < s->n; i++)
        out->runq += runq_len((struct runq *)&s->w[i].rq);
    /* safety: a gauge read lock-free, as the parkers read it. */
    long inj = __atomic_load_n(&s->inj_len, __ATOMIC_RELAXED);
    out->runq += inj > 0 ? (uint64_t)inj : 0;
    pthread_mutex_lock((pthread_mutex_t *)&s->inject_lock);
    out->spawned += s->ext_spawned;
    pthread_mutex_unlock((pthread_mutex_t *)&s->inject_lock);
}

uint64_t sched_watch_stuck(const struct sched *s, uint64_t *seq, uint64_t *since, uint64_t now)
{
    uint64_t longest = 0;
    for (unsigned i = 0; i < s->n_all; i++) {
        /* safety: run_seq is the owner's, read relaxed as the rescuers read it: a stale value
         * only delays the watchdog by one look. */
        uint64_t cur = __atomic_load_n(&s->w[i].run_seq, __ATOMIC_RELAXED);
        if (!(cur & 1) || cur != seq[i]) {
            seq[i] = cur;
            since[i] = now;
            continue;
        }
        if (now - since[i] > longest)
            longest = now - since[i];
    }
    return longest;
}
