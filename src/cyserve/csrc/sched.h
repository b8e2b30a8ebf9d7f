/* sched.h: the multi-threaded, work-stealing coroutine scheduler and its per-worker event loops.
 *
 * Error convention: 0 or -errno. The design essay is at the top of sched.c; the short version:
 *
 * - N workers, one pthread each. A worker owns a bounded run queue (runq.h), a stack pool
 *   (coro.h), an epoll instance, a timer heap and an eventfd used to wake it. Its epoll
 *   registrations, timers, parked coroutines and io states ("home state") are protected by its
 *   loop lock: the worker holds it while in its loop and releases it while it runs coroutine
 *   code, so that an idle worker can run the loop step of a worker stuck in one long coroutine
 *   (a "rescue": its connections and timers are served meanwhile).
 * - Runnable coroutines may be stolen by idle workers. Touching a home's state from a coroutine
 *   is a "home section": the coroutine takes the home's loop lock where it runs, or, when the
 *   home is in its loop, hops there. The home of a sched_io is the worker it was added on.
 * - Idle workers park in epoll_wait on their own epoll, with the next timer as timeout, and are
 *   woken by their eventfd when work is injected for them: no fixed sleeps.
 *
 * Threads: functions marked "coroutine only" must be called from inside a coroutine run by this
 * scheduler (elsewhere they return -EPERM and do nothing); "worker only" from a worker thread (a
 * coroutine, or a hook/callback run by a worker); "any thread" from anywhere, including threads
 * the scheduler does not know.
 *
 * Thread-locals in coroutine bodies: any call below that may suspend (yield, sleep, wait, offload,
 * sched_io_*) may return on another thread. Do not keep the address of a __thread variable across
 * such a call, and beware that a compiler may do it for you when the body and the variable are
 * in one translation unit (it assumes the thread never changes inside a function): read
 * thread-locals through an out-of-line function, as sched.c does (sched_self()). */
#ifndef CYSERVE_SCHED_H
#define CYSERVE_SCHED_H

#include <sched.h> /* before the sched_yield() macro below, so its prototype is not renamed */
#include <stddef.h>
#include <stdint.h>
#include <sys/epoll.h>

#include "coro.h"

struct sched;

struct sched_config {
    unsigned workers;        /* 0: the CPUs this process may use (sched_getaffinity) */
    size_t stack_size;       /* 0: CORO_STACK_DEFAULT */
    unsigned runq_capacity;  /* power of two >= 2; 0: 256. Tests shrink it to force overflow */
    int randomize;           /* debug: randomise victim choice and push order (Go's trick) */
    uint64_t seed;           /* seed for randomize and for victim selection; 0: from the clock */
    int keep_alive;          /* 0: batch mode, sched_run() returns when no coroutine is left;
                              * 1: server mode, workers run until sched_stop() */
    unsigned relief;         /* relief threads: how many threads may take over the loops of
                              * workers whose offloaded call runs long (sched.c, "Relief"), so
                              * that this many calls may block at once while every worker's
                              * events are still served; 0: none. Started on first need. */
    int relief_waiting_only; /* 1: relieve a stuck thread only while it sleeps in the kernel,
                              * never one that computes or waits for a CPU. For callers whose
                              * calls hold no lock the others wait on (Python without a GIL):
                              * there a relief thread beside a computing one only competes for
                              * the same CPUs, and each one that ran calls keeps the memory
                              * they left behind (docs/architecture.md, "Relief"). */
};

/* Limits checked by sched_new(). */
#define SCHED_MAX_WORKERS 1024u
#define SCHED_MAX_RELIEF 1024u

/* Create a scheduler. Returns 0, -EINVAL for workers > SCHED_MAX_WORKERS, relief >
 * SCHED_MAX_RELIEF, a stack size outside
 * [CORO_STACK_MIN, CORO_STACK_MAX] or a runq_capacity that is not a power of two >= 2; -ENOMEM.
 * Workers are not started yet. Any thread. */
int sched_new(struct sched **out, const struct sched_config *cfg);

/* Number of workers (after resolving 0 to the CPU count): the homes, indexes [0, workers). Any
 * thread. */
unsigned sched_workers(const struct sched *s);

/* Number of thread slots: the workers, then the relief threads. sched_worker_id() on a relief
 * thread is in [sched_workers(), sched_threads()); per-thread caches are indexed by it. A relief
 * thread is never the home of a connection the engine opens (it names the home it means), but
 * may be its own home for sleeps and fd waits of coroutines it runs. Any thread. */
unsigned sched_threads(const struct sched *s);

/* Free a scheduler whose workers are not running (never started, or sched_run()/sched_join()
 * returned). Coroutines still queued or suspended are cancelled (their deferred calls run) and
 * freed. Any thread, except a worker of s. */
void sched_free(struct sched *s);

/* Spawn fn(co, arg) as a new coroutine. From a worker thread it goes on that worker's run queue;
 * from any other thread on the global inject queue, waking a parked worker. Returns 0,
 * -ESHUTDOWN once sched_stop() was called, -ENOMEM. Any thread. */
int sched_spawn(struct sched *s, coro_fn fn, void *arg);

/* Batch mode: start the workers and block until no coroutine is left alive (that is:
 * every worker idle and no coroutine queued, running or suspended) or sched_stop(); then join the
 * workers. May be called again after spawning more. Returns 0, -EINVAL in server mode, or -errno
 * from pthread_create. Any thread except a worker of s. */
int sched_run(struct sched *s);

/* Server mode: start the workers and return at once. Returns 0 or -errno. */
int sched_start(struct sched *s);

/* Ask every worker to stop: spawning fails from now on, parked workers wake, each worker cancels
 * the coroutines it still holds and exits its loop. Returns at once; async-signal-safe (it only
 * stores a flag and writes eventfds). Any thread. */
void sched_stop(struct sched *s);

/* Wait for the workers started by sched_start() to exit (after sched_stop()). Any thread except
 * a worker of s. */
int sched_join(struct sched *s);

/* ---- from inside coroutines ---- */

/* The coroutine running on this thread, or NULL. Any thread. */
struct coro *sched_current(void);

/* Index of the worker this thread runs (a relief thread's slot: >= sched_workers()), or -1 on a
 * thread that is not the scheduler's. Any thread. */
int sched_worker_id(void);

/* Whether worker `home`'s loop has work queued that it runs before it next looks at its epoll:
 * coroutines in its run queue or pushed to it, offloaded calls waiting for a batch, or injected
 * coroutines (any worker may take those first). A hint, read with relaxed loads: a coroutine
 * that leaves a level-triggered readiness to that next look (listen.c's acceptor) asks it
 * whether the look is near. Exact only on home's own thread; elsewhere (another worker, a
 * relief thread, a thread that is not the scheduler's) it answers 1: "not known to be near".
 * Any thread. */
int sched_worker_queued(int home);

/* Put the running coroutine at the back of its worker's run queue and run others first. Returns
 * 0, or -ECANCELED if the scheduler is stopping (the caller should finish). Coroutine only.
 *
 * The symbol is sched_yield_coro: a function named sched_yield would interpose POSIX
 * sched_yield(2) (declared in <sched.h>) for every caller resolved against our object, e.g.
 * the sanitizers' runtime, which calls it from threads that are not coroutines. The
 * function-like macro keeps the documented name `sched_yield()` working in C code that includes
 * this header (it is a pure rename, no control flow); a file that needs the POSIX call as well
 * must #undef it. */
int sched_yield_coro(void);
#define sched_yield() sched_yield_coro()

/* Suspend the running coroutine for at least ns nanoseconds (on the timer heap of the worker
 * running it). Returns 0, or -ECANCELED if the scheduler is stopping. Coroutine only. */
int sched_sleep_ns(uint64_t ns);

/* Suspend the running coroutine until fd is ready for events (EPOLLIN and/or EPOLLOUT), or until
 * timeout_ns has passed (timeout_ns < 0: no timeout). The fd is registered one-shot in the epoll
 * of the worker running the coroutine (which becomes its home) for the duration of the wait;
 * two coroutines waiting on the same fd at once on one worker get -EEXIST. Returns the ready
 * events (> 0), -ETIMEDOUT, -ECANCELED if the scheduler is stopping, or -errno from epoll_ctl.
 * Coroutine only. */
int sched_wait_fd(int fd, uint32_t events, int64_t timeout_ns);

/* Run fn(arg) on the worker thread's own stack (not the coroutine's), batched with the other
 * offloaded calls of that worker between the begin/end hooks of sched_set_offload_hooks(), then
 * resume the coroutine. The HTTP engine runs Python handlers this way: the worker takes the GIL
 * once per batch, and Python never runs on a coroutine stack. Returns 0 or -ECANCELED.
 * Coroutine only. */
int sched_offload(void (*fn)(void *), void *arg);

/* Hooks run by every worker (and relief thread) around a batch of offloaded calls. Set before
 * the workers start. */
void sched_set_offload_hooks(struct sched *s, void (*begin)(void *ud), void (*end)(void *ud),
                             void *ud);

/* A hook run by every worker and relief thread as it exits, after its last batch, with no lock
 * held and the offload hooks' ud: where the begin hook's per-thread state is undone (the engine
 * deletes the Python thread state it made there). Run here, from the thread's start routine,
 * rather than from a pthread key destructor, because by then glibc has emptied every key of
 * the thread, the interpreter's own among them. NULL: none. Set before the workers start. */
void sched_set_offload_exit(struct sched *s, void (*exit_hook)(void *ud));

/* Whether the begin/end hooks exclude each other (they take one lock, such as CPython's GIL),
 * so that the offloaded calls of all threads run one at a time anyway. shared != 0: one queue
 * of calls for the whole scheduler, taken oldest first by whichever thread's batch holds the
 * hooks, so that threads winning that lock unevenly do not starve each other's coroutines;
 * 0 (the default): each thread's batches take only its own calls (and those it relieves).
 * Before the workers start. */
void sched_share_offloads(struct sched *s, int shared);

/* Hooks run by each worker thread when it starts (before its loop) and when it exits (after it
 * cancelled its coroutines), with the worker index. The HTTP engine opens and closes its
 * per-worker listening socket there. Relief threads run neither: they are nobody's home. Set
 * before the workers start. */
void sched_set_worker_hooks(struct sched *s, void (*start)(struct sched *s, unsigned id, void *ud),
                            void (*stop)(struct sched *s, unsigned id, void *ud), void *ud);

/* ---- persistent fd registrations, for the HTTP engine ---- */

/* A long-lived edge-triggered registration of an fd in its home worker's epoll. All fields are
 * private to sched.c except fd and data; the struct is embedded in the caller's connection. */
struct sched_io {
    int fd;
    void *data; /* the caller's */
    /* private */
    void (*on_ready)(struct sched_io *io, uint32_t events);
    struct coro *waiter;
    uint32_t ready;       /* readiness seen and not yet consumed (home worker only) */
    uint32_t wait_events; /* what the waiter waits for */
    int home;             /* worker index owning the registration */
    int active; /* 1 while a coroutine serves io; 0: idle, the next event calls on_ready */
    /* The registration's epoll mask; the first wait for EPOLLOUT adds it (home worker only). */
    uint32_t events;
};

/* ---- home sections ---- */

/* Enter a home section of worker `home` (< 0: the worker running the coroutine; on a relief
 * thread, the worker it relieves or last relieved, as for every wait it starts): on return the
 * calling thread holds home's loop lock, so that home's state (its sched_io's, timers, and the
 * caller's own per-home data) may be touched. The coroutine may hop to get it (it then runs on
 * another thread afterwards). The section ends at sched_home_exit() or at the coroutine's next
 * suspension or end, whichever comes first; keep it short (no handler, no blocking call) and do
 * not suspend on purpose inside it. Returns the home's index, -EPERM off a coroutine (a callback
 * already holds its loop's lock: sched_home_held() says which), -EINVAL for a bad index.
 * Coroutine only. */
int sched_home_enter(int home);

/* End the running coroutine's home section, if any. Coroutine only (no-op elsewhere). */
void sched_home_exit(void);

/* Index of the worker whose loop lock the calling thread holds (in a home section, or in an
 * on_ready / timer callback or a worker hook), or -1. Any thread. */
int sched_home_held(void);

/* Register fd edge-triggered for EPOLLIN | EPOLLRDHUP on the worker whose home section the caller
 * is in (a coroutine outside any: the worker running it), which becomes io's home. EPOLLOUT is
 * not watched until the first sched_io_wait for it adds it, for good (a new socket is writable
 * at once: watched from the start, that edge alone would wake the worker for every new
 * connection; sched_io.c.h, "EPOLLOUT on demand").
 * Initialise io->data before: events may be delivered (on another thread) at once.
 * While io is idle, the first event that says readable or closed (EPOLLIN,
 * EPOLLRDHUP, EPOLLHUP, EPOLLERR; a bare EPOLLOUT edge does not) calls on_ready(io, events) with
 * the home's loop lock held, on the home worker's stack or on the stack of an idle worker that
 * rescues it (never in a coroutine), and marks io active; the readable/writable
 * readiness of that event is handed to on_ready and not kept, so the coroutine it spawns starts
 * by reading until EAGAIN. While io is active, events only record readiness for sched_io_wait().
 * Returns 0, -EPERM off a worker, or -errno from epoll_ctl. Worker only. */
int sched_io_add(struct sched_io *io, int fd,
                 void (*on_ready)(struct sched_io *io, uint32_t events));

/* As sched_io_add, but level-triggered and for EPOLLIN only: for a listener that its server
 * serves one connection per readiness. Every poll reports the fd while it is readable, so
 * whoever serves it needs no final read that meets EAGAIN to be sure nothing is left (an
 * edge-triggered registration reports nothing for what was already there); on_ready is still
 * called only while io is idle, and readiness reported while it is active is recorded as for
 * sched_io_add. A coroutine that stops taking what is readable while io is active (it waits for
 * descriptors, or the fd is shut down and reports a hang-up forever) must stop watching it
 * first (sched_io_watch), or every poll of its home returns at once. Same results. Worker
 * only. */
int sched_io_add_level(struct sched_io *io, int fd,
                       void (*on_ready)(struct sched_io *io, uint32_t events));

/* Stop (on = 0: EPOLL_CTL_DEL) or start again (on = 1) watching io, registered by
 * sched_io_add_level, without changing whether it is active: what its coroutine calls before a
 * pause in which it will not take what is readable, and after it. In a home section of io's
 * home, as sched_io_del (from a coroutine it enters one and stays in it). Returns 0 or -errno
 * from epoll_ctl. Worker only. */
int sched_io_watch(struct sched_io *io, int on);

/* Wait until io is ready for any of events, consuming that readiness (Go's netpoll rule: read
 * or write until EAGAIN, then wait). An error or hang-up (EPOLLERR, EPOLLHUP) ends any wait; the
 * peer's half-close (EPOLLRDHUP) ends a wait that includes EPOLLIN only. deadline_ns is absolute on sched_now_ns()'s clock, or < 0
 * for none. Runs as a home section of io's home (see sched_home_enter), ended when it returns.
 * The first wait that includes EPOLLOUT adds it to io's registration (one epoll_ctl; an
 * edge-triggered registration only: on a level-triggered one such a wait fails with -EINVAL).
 * Returns the ready events (> 0), -ETIMEDOUT, -ECANCELED, or -errno from that epoll_ctl.
 * Coroutine only. */
int sched_io_wait(struct sched_io *io, uint32_t events, int64_t deadline_ns);

/* The bit sched_io_wait_signal() adds to its result when the signal ended (or was set before)
 * the wait. Not an epoll bit. */
#define SCHED_SIGNALED (1u << 27)

struct sched_signal;

/* Wait, as sched_io_wait does, until io is ready for events, OR until sig is set (by any thread,
 * as for sched_signal_wait), whichever comes first: what a connection needs that both reads its
 * socket and sends what another thread hands it (a WebSocket whose application runs on an event
 * loop). A set that came before the call is seen at once. Returns the ready events, with
 * SCHED_SIGNALED added when the signal was set (both may be reported at once; the signal is then
 * consumed, the readiness too), -ETIMEDOUT, -ECANCELED (the scheduler stops, or sig was
 * cancelled), or -errno from the epoll_ctl that adds EPOLLOUT, as for sched_io_wait. One waiter
 * per signal, as sched_signal_wait; like it, a stop does not end the wait: cancel sig first.
 * Coroutine only. */
int sched_io_wait_signal(struct sched_io *io, uint32_t events, int64_t deadline_ns,
                         struct sched_signal *sig);

/* The coroutine serving io is done with it for now. In a home section of io's home: returns
 * -EAGAIN if readable readiness arrived meanwhile (keep serving: that readiness is consumed, so
 * read until EAGAIN again before the next release; the section has ended), -ECANCELED if the
 * scheduler is stopping, otherwise marks io idle, so that its next event calls on_ready again,
 * and returns 0 STILL IN the home section: the caller may update its per-home bookkeeping for
 * the idle io, then calls sched_home_exit() or ends. Coroutine only. */
int sched_io_release(struct sched_io *io);

/* From io's on_ready callback, which served the readiness itself and spawned nothing: io is idle
 * again, so that its next readable event calls on_ready again. Edge-triggered: the caller must
 * have read the fd until a short read or EAGAIN, since readiness that came before that read is
 * not reported twice. The home's loop lock is held (it is, in on_ready). Worker only. */
void sched_io_idle(struct sched_io *io);

/* From a callback holding io's home's loop lock (a timer's), io idle: mark it served, as an event
 * does before on_ready, for a coroutine the caller spawns to serve it. Readiness that comes
 * meanwhile is recorded for that coroutine (sched_io_release then says -EAGAIN), not handed to
 * on_ready for a second one. Worker only. */
void sched_io_take(struct sched_io *io);

/* Remove io from its home epoll. Call before closing the fd. From a coroutine this enters a home
 * section of io's home and stays in it (like sched_io_release's 0); from a callback the caller
 * must hold the home's loop lock (sched_home_held() == io->home). Worker only. */
void sched_io_del(struct sched_io *io);

/* ---- signals: a coroutine waits, any thread wakes it (sched_signal.c.h) ---- */

/* A flag one coroutine at a time parks on and any thread sets, for an answer produced off the
 * workers (an application's event loop). A set with nobody waiting is remembered for the next
 * wait (one, not a count). Zero-initialised memory is an EMPTY signal. All fields private.
 * A stop does not end a wait on a signal (its drain cannot see it): cancel every signal a
 * coroutine may wait on before sched_stop(). */
struct sched_signal {
    int state;
    int cancelled;
    int home;
    struct coro *waiter;
    struct sched *s;
};

/* Make sig EMPTY. Any thread, while nobody waits on it or sets it. */
void sched_signal_init(struct sched_signal *sig);

/* Park the running coroutine until sig is set, without blocking the worker (it serves other
 * coroutines meanwhile); returns at once, consuming the set, if sig was set before. What the
 * setter wrote before sched_signal_set() is visible after this returns. One waiter at a time per
 * signal; the coroutine runs again on the worker it waited on. Returns 0; -ECANCELED once sig
 * was cancelled, or (instead of parking) when the scheduler is stopping; -EPERM off a
 * coroutine. Coroutine only. */
int sched_signal_wait(struct sched_signal *sig);

/* Set sig: wake its waiter, or, with none, let the next wait return at once. Never blocks, never
 * suspends. Returns 1 if a waiter was woken, else 0. Any thread. The caller keeps sig's memory
 * valid for the call, and the scheduler is not freed meanwhile (a waiter woken as a stop drains
 * is freed, its defers run, by sched_join or sched_free). */
int sched_signal_set(struct sched_signal *sig);

/* Set sig for good: its wait, and every later one, returns -ECANCELED. Returns as
 * sched_signal_set. Any thread. */
int sched_signal_cancel(struct sched_signal *sig);

/* ---- timers, for the HTTP engine's idle keep-alive deadline ---- */

struct sched_timer {
    void (*cb)(struct sched_timer *t); /* runs on the owning worker's stack */
    void *data;                        /* the caller's */
    /* private */
    uint64_t deadline;
    int64_t heap_index; /* 0 when not armed, else 1 + its index in the owner's heap, so that a
                         * zero-initialised timer is a valid unarmed timer */
    int owner;
};

/* Arm t to fire at deadline_ns (sched_now_ns() clock) on the worker whose loop lock the caller
 * holds (a callback, a home section; a coroutine outside any: the worker running it); re-arming
 * moves it. The callback runs with that worker's loop lock held, on its stack or a rescuer's.
 * Cancel before freeing t, holding the same lock. Worker only, and always the same worker for a
 * given timer. */
void sched_timer_arm(struct sched_timer *t, uint64_t deadline_ns);
void sched_timer_cancel(struct sched_timer *t);

/* Monotonic clock in nanoseconds; on a worker, the value its thread cached at its last poll. */
uint64_t sched_now_ns(void);

/* sched_worker_id() and, in *now_ns, sched_now_ns(), from one read of the thread's worker (a
 * thread-local: a call to __tls_get_addr each in a shared object). Any thread. */
int sched_worker_now(uint64_t *now_ns);

/* Counters for tests and benchmarks; totals over all workers, approximate while running. */
struct sched_stats {
    uint64_t spawned, finished, steals, parks, hops, offloads;
    uint64_t reliefs;        /* times a relief thread took over a stuck worker's loop */
    uint64_t relief_threads; /* relief threads started */
    uint64_t runq;           /* coroutines queued to run now (run queues, inject queue) */
    /* Nanoseconds offload batches spent between their stamp and their first call: the begin
     * hook's wait (the engine's: for the GIL; on a free-threaded build, to attach). */
    uint64_t offload_wait_ns;
    /* Coroutines inside sched_offload() now: their call queued for a batch, waiting for the
     * begin hook (the GIL), or running. A gauge. */
    uint64_t offloading;
    /* Idle trims of the threads' free coroutine stacks (after CORO_IDLE_TRIM_MS asleep with
     * something to give back: sched.c, "Giving back an idle thread's stacks"), and the stacks
     * they unmapped. */
    uint64_t trims, stacks_trimmed;
};
void sched_get_stats(const struct sched *s, struct sched_stats *out);

/* The scheduler's heartbeat, for a watchdog: the longest time any thread has spent in one
 * coroutine run or one batch of offloaded calls (its run counter odd and unchanged), as seen by
 * this call and the previous ones, at time now (clock_mono_ns); 0 when none runs long. A thread
 * waiting for events, or between runs, makes progress. seq and since: the caller's arrays of
 * sched_threads(s) entries, zeroed before the first call and kept between calls. One watching
 * thread, not a worker of s. */
uint64_t sched_watch_stuck(const struct sched *s, uint64_t *seq, uint64_t *since, uint64_t now);

#endif
