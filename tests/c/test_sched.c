/* test_sched.c: the scheduler end to end (also built under ThreadSanitizer): exact step counts
 * under many workers, coroutines and yields (also with a tiny run queue and randomised choices),
 * sleeps, fd waits, the sched_io flow (on_ready, wait, release, EPOLLOUT on demand, hop home),
 * sched_worker_queued, offload, stop, signals (set from other threads, a stress run, a stop
 * racing the setters). */
#include "csrc/coro.c"
#include "csrc/sched.c"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include "tap.h"

static int add(int *p, int v)
{
    /* safety: test counters shared by coroutines on several workers. */
    return __atomic_add_fetch(p, v, __ATOMIC_SEQ_CST);
}

static int get(int *p)
{
    /* safety: as above. */
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

static struct sched *new_sched(unsigned workers, unsigned cap, int randomize, int keep_alive)
{
    struct sched_config cfg = {
        .workers = workers, .runq_capacity = cap, .randomize = randomize, .keep_alive = keep_alive};
    struct sched *s = NULL;
    int err = sched_new(&s, &cfg);
    if (err)
        note("sched_new: %d", err);
    return s;
}

static void test_config(void)
{
    struct sched *s = NULL;
    struct sched_config cfg = {.workers = SCHED_MAX_WORKERS + 1};
    is_int(sched_new(&s, &cfg), -EINVAL, "too many workers");
    cfg = (struct sched_config){.stack_size = 1000};
    is_int(sched_new(&s, &cfg), -EINVAL, "stack too small");
    cfg = (struct sched_config){.runq_capacity = 6};
    is_int(sched_new(&s, &cfg), -EINVAL, "runq capacity not a power of two");
    cfg = (struct sched_config){0};
    is_int(sched_new(&s, &cfg), 0, "defaults");
    ok(sched_workers(s) >= 1, "default worker count from the affinity mask");
    is_int(sched_run(s), 0, "running with nothing spawned returns at once");
    is_int(sched_yield(), -EPERM, "coroutine-only calls refuse off a coroutine: yield");
    is_int(sched_sleep_ns(1), -EPERM, "sleep");
    is_int(sched_wait_fd(0, EPOLLIN, 0), -EPERM, "wait_fd");
    ok(sched_current() == NULL && sched_worker_id() == -1, "no current coroutine or worker");
    sched_free(s);
}

/* ---- many workers x many coroutines x many yields ---- */

enum { STEPS = 20 };
static int *steps;
static int yielders_done;

static int yielder(struct coro *co, void *arg)
{
    int *slot = arg;
    for (int i = 0; i < STEPS; i++) {
        (*slot)++; /* only this coroutine touches its slot, wherever it runs */
        if (sched_yield() != 0)
            return -1;
    }
    add(&yielders_done, 1);
    return 0;
}

struct tree_arg {
    struct sched *s;
    int depth;
};

static int tree_count;
static struct tree_arg tree_args[8];

static int tree(struct coro *co, void *arg)
{
    struct tree_arg *t = arg;
    add(&tree_count, 1);
    if (t->depth < 7) {
        /* Spawn from inside a coroutine: goes on this worker's queue and may be stolen. */
        sched_spawn(t->s, tree, &tree_args[t->depth + 1]);
        sched_spawn(t->s, tree, &tree_args[t->depth + 1]);
    }
    return 0;
}

static void run_yielders(unsigned workers, unsigned cap, int randomize, int n)
{
    struct sched *s = new_sched(workers, cap, randomize, 0);
    steps = calloc((size_t)n, sizeof(*steps));
    yielders_done = 0;
    tree_count = 0;
    for (int i = 0; i < 8; i++)
        tree_args[i] = (struct tree_arg){.s = s, .depth = i};
    for (int i = 0; i < n; i++)
        sched_spawn(s, yielder, &steps[i]);
    sched_spawn(s, tree, &tree_args[0]);
    is_int(sched_run(s), 0, "sched_run");
    int exact = 1;
    for (int i = 0; i < n; i++)
        exact &= steps[i] == STEPS;
    ok(exact, "%u workers, runq %u, randomize %d: each of %d coroutines made exactly %d steps",
       workers, cap, randomize, n, STEPS);
    is_int(yielders_done, n, "all yielders finished");
    is_int(tree_count, 255, "a spawn tree of depth 8 ran every node once");
    struct sched_stats st;
    sched_get_stats(s, &st);
    is_int(st.spawned, n + 255, "stats: spawned");
    is_int(st.finished, n + 255, "stats: finished");
    note("steals %llu, parks %llu", (unsigned long long)st.steals, (unsigned long long)st.parks);

    /* The same scheduler runs a second batch. */
    memset(steps, 0, sizeof(*steps) * (size_t)n);
    for (int i = 0; i < 10; i++)
        sched_spawn(s, yielder, &steps[i]);
    is_int(sched_run(s), 0, "second sched_run");
    is_int(steps[9], STEPS, "second batch ran");
    sched_free(s);
    free(steps);
}

/* ---- sleep ---- */

static int sleepers_ok;

static int sleeper(struct coro *co, void *arg)
{
    uint64_t ns = (uint64_t)(uintptr_t)arg * 1000000u;
    uint64_t t0 = sched_clock_ns();
    int r = sched_sleep_ns(ns);
    if (r == 0 && sched_clock_ns() - t0 >= ns)
        add(&sleepers_ok, 1);
    return 0;
}

static void test_sleep(void)
{
    struct sched *s = new_sched(2, 0, 0, 0);
    sleepers_ok = 0;
    for (uintptr_t i = 0; i < 30; i++)
        sched_spawn(s, sleeper, (void *)(1 + i % 5));
    sched_run(s);
    is_int(sleepers_ok, 30, "30 sleepers woke, each after at least its duration");
    sched_free(s);
}

/* ---- idle trim: a quiet scheduler gives back a burst's stacks (sched.c) ---- */

static int it_started, it_go;

static int it_burst(struct coro *co, void *arg)
{
    add(&it_started, 1);
    while (!get(&it_go))
        sched_sleep_ns(1000000); /* holds its stack until the main thread says go */
    return 0;
}

static long it_stacks_alive(uint64_t m0, uint64_t u0)
{
    uint64_t m, u;
    coro_stack_counts(&m, &u);
    return (long)(m - m0) - (long)(u - u0);
}

static void test_idle_trim(void)
{
    enum { N = 600, WORKERS = 2 };
    struct sched *s = new_sched(WORKERS, 0, 0, 1);
    uint64_t m0, u0;
    coro_stack_counts(&m0, &u0);
    is_int(sched_start(s), 0, "start");
    for (int i = 0; i < N; i++)
        sched_spawn(s, it_burst, NULL);
    for (int i = 0; i < 20000 && get(&it_started) < N; i++)
        usleep(1000);
    is_int(get(&it_started), N, "a burst of 600 coroutines, each holding a stack");
    ok(it_stacks_alive(m0, u0) >= N, "600 stacks mapped (%ld)", it_stacks_alive(m0, u0));
    add(&it_go, 1);
    /* Every worker parks for want of work, CORO_IDLE_TRIM_MS at most while its pool has
     * something to give back, then trims. */
    struct sched_stats st;
    struct coro_slab *slab = s->ext_pool->slab;
    for (int i = 0; i < 1000; i++) {
        sched_get_stats(s, &st);
        /* safety: a hint read, as coro_pool_trim_due reads it. */
        unsigned mags = __atomic_load_n(&slab->depot_mags, __ATOMIC_RELAXED);
        if (st.finished == N && st.trims >= 1 && mags == 0 &&
            it_stacks_alive(m0, u0) <= WORKERS * CORO_STACK_MAG)
            break;
        usleep(10000);
    }
    is_int((long)st.finished, N, "the burst finished");
    ok(st.trims >= 1 && st.stacks_trimmed > 0, "idle workers trimmed (%llu times, %llu stacks)",
       (unsigned long long)st.trims, (unsigned long long)st.stacks_trimmed);
    long alive = it_stacks_alive(m0, u0);
    ok(alive > 0 && alive <= WORKERS * CORO_STACK_MAG,
       "an idle scheduler keeps at most a magazine of stacks per worker (%ld)", alive);
    /* safety: as above. */
    is_int((long)__atomic_load_n(&slab->depot_mags, __ATOMIC_RELAXED), 0, "the depot is empty");
    /* Trimmed, a worker sleeps without a timeout again: no wake-up while nothing comes. First
     * every worker's last trim and park: counters that stay still for longer than a trim's wait
     * (bounded, 10 tries). A fixed 300 ms was not enough where the workers' stacks last moved
     * apart (a loaded machine): the first trim could not empty the depot yet, and its worker
     * trimmed once more a trim's wait later, inside the window below. */
    struct sched_stats later;
    sched_get_stats(s, &st);
    for (int i = 0; i < 10; i++) {
        usleep((CORO_IDLE_TRIM_MS + 100) * 1000);
        sched_get_stats(s, &later);
        if (later.trims == st.trims && later.parks == st.parks)
            break;
        st = later;
    }
    sched_get_stats(s, &st);
    usleep(1500000);
    sched_get_stats(s, &later);
    ok(later.trims == st.trims && later.parks == st.parks,
       "then no trim and no wake-up in 1.5 s idle (trims %llu -> %llu, parks %llu -> %llu)",
       (unsigned long long)st.trims, (unsigned long long)later.trims, (unsigned long long)st.parks,
       (unsigned long long)later.parks);
    sched_stop(s);
    is_int(sched_join(s), 0, "join");
    sched_free(s);
    is_int(it_stacks_alive(m0, u0), 0, "freeing the scheduler unmaps the rest");
}

/* ---- wait_fd ---- */

static int pipefd[2];
static int fd_result, fd_read, fd_timeout_result;

static int fd_reader(struct coro *co, void *arg)
{
    fd_result = sched_wait_fd(pipefd[0], EPOLLIN, -1);
    char c = 0;
    if (read(pipefd[0], &c, 1) == 1)
        fd_read = c;
    return 0;
}

static int fd_writer(struct coro *co, void *arg)
{
    sched_sleep_ns(2000000);
    if (write(pipefd[1], "x", 1) != 1)
        return -1;
    return 0;
}

static int fd_timeouter(struct coro *co, void *arg)
{
    int *p = arg;
    fd_timeout_result = sched_wait_fd(p[0], EPOLLIN, 3000000);
    return 0;
}

static void test_wait_fd(void)
{
    struct sched *s = new_sched(2, 0, 0, 0);
    int other[2];
    if (pipe2(pipefd, O_NONBLOCK) != 0 || pipe2(other, O_NONBLOCK) != 0)
        return;
    sched_spawn(s, fd_reader, NULL);
    sched_spawn(s, fd_writer, NULL);
    sched_spawn(s, fd_timeouter, other);
    sched_run(s);
    ok(fd_result > 0 && (fd_result & EPOLLIN), "wait_fd returns the ready events");
    is_int(fd_read, 'x', "and the data is there");
    is_int(fd_timeout_result, -ETIMEDOUT, "wait_fd on a silent pipe times out");
    sched_free(s);
    close(pipefd[0]);
    close(pipefd[1]);
    close(other[0]);
    close(other[1]);
}

/* ---- sched_io: on_ready, serve, release, wait with hop ---- */

static struct sched *io_sched;
static struct sched_io io_conn;
static int io_sv[2];
static int io_served, io_bytes, io_server_running, io_on_ready_calls;

static int io_server(struct coro *co, void *arg)
{
    struct sched_io *io = arg;
    add(&io_server_running, 1);
    for (;;) {
        char buf[64];
        ssize_t n;
        while ((n = read(io->fd, buf, sizeof(buf))) > 0)
            add(&io_bytes, (int)n);
        int r = sched_io_release(io);
        if (r == -EAGAIN)
            continue; /* more arrived: keep serving */
        break;
    }
    add(&io_server_running, -1);
    add(&io_served, 1);
    return 0;
}

static void io_on_ready(struct sched_io *io, uint32_t events)
{
    add(&io_on_ready_calls, 1);
    ok(sched_current() == NULL, "on_ready runs on the worker's own stack");
    ok(sched_home_held() == io->home, "on_ready runs with the home's loop lock");
    sched_spawn(io_sched, io_server, io);
}

static int io_driver(struct coro *co, void *arg)
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, io_sv) != 0)
        return -1;
    if (sched_io_add(&io_conn, io_sv[0], io_on_ready) != 0)
        return -1;
    for (int round = 1; round <= 3; round++) {
        if (write(io_sv[1], "hello", 5) != 5)
            return -1;
        for (int i = 0; i < 5000 && get(&io_served) < round; i++)
            sched_sleep_ns(200000);
    }
    ok(get(&io_server_running) == 0, "an idle connection holds no coroutine");
    sched_io_del(&io_conn);
    close(io_sv[0]);
    close(io_sv[1]);
    return 0;
}

static void test_io_flow(void)
{
    io_sched = new_sched(2, 0, 0, 0);
    sched_spawn(io_sched, io_driver, NULL);
    sched_run(io_sched);
    is_int(io_served, 3, "three events on an idle connection served by three coroutines");
    is_int(io_on_ready_calls, 3, "on_ready called once per idle->active transition");
    is_int(io_bytes, 15, "all bytes read");
    sched_free(io_sched);
}

/* A parked worker woken by an event on an idle connection spawns its coroutine without waking
 * itself: its park ends and it runs the coroutine. Kicking its own eventfd from there cost a
 * write, a second wake-up of its epoll and a read per event (a request on an idle keep-alive
 * connection), visible as a second park per event that returns at once. One worker, events
 * written by this thread while the worker is parked. */
enum { PW_EVENTS = 20 };
static struct sched *pw_sched;
static struct sched_io pw_io;
static int pw_sv[2];
static int pw_registered, pw_served, pw_deleted;

static int pw_server(struct coro *co, void *arg)
{
    struct sched_io *io = arg;
    for (;;) {
        char buf[16];
        while (read(io->fd, buf, sizeof(buf)) > 0)
            ;
        if (sched_io_release(io) != -EAGAIN)
            break;
    }
    add(&pw_served, 1);
    return 0;
}

static void pw_on_ready(struct sched_io *io, uint32_t events)
{
    sched_spawn(pw_sched, pw_server, io);
}

static int pw_register(struct coro *co, void *arg)
{
    int rc = sched_io_add(&pw_io, pw_sv[0], pw_on_ready);
    add(&pw_registered, rc == 0 ? 1 : -1);
    return 0;
}

static int pw_delete(struct coro *co, void *arg)
{
    sched_io_del(&pw_io);
    add(&pw_deleted, 1);
    return 0;
}

static void test_io_park_no_self_wake(void)
{
    struct sched_stats before, after;
    pw_sched = new_sched(1, 0, 0, 1);
    ok(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, pw_sv) == 0, "socketpair");
    is_int(sched_start(pw_sched), 0, "start");
    sched_spawn(pw_sched, pw_register, NULL);
    for (int i = 0; i < 20000 && get(&pw_registered) == 0; i++)
        usleep(100);
    is_int(get(&pw_registered), 1, "registered");
    usleep(20000); /* let the worker park */
    sched_get_stats(pw_sched, &before);
    for (int k = 1; k <= PW_EVENTS; k++) {
        if (write(pw_sv[1], "x", 1) != 1)
            break;
        for (int i = 0; i < 20000 && get(&pw_served) < k; i++)
            usleep(100);
        usleep(3000); /* parked again before the next event */
    }
    sched_get_stats(pw_sched, &after);
    is_int(get(&pw_served), PW_EVENTS, "every event on the idle connection served");
    unsigned long long parks = after.parks - before.parks;
    note("parks over %d events: %llu", PW_EVENTS, parks);
    /* One park per event (the one the event ends), plus a few for this machine's scheduling
     * (a preempted test thread may let a park time out on the watch). Waking itself made it
     * two per event. */
    ok(parks <= PW_EVENTS + PW_EVENTS / 2, "a park woken by an event spawns without waking "
                                           "itself (one park per event, not two)");
    sched_spawn(pw_sched, pw_delete, NULL);
    for (int i = 0; i < 20000 && get(&pw_deleted) == 0; i++)
        usleep(100);
    sched_stop(pw_sched);
    sched_join(pw_sched);
    sched_free(pw_sched);
    close(pw_sv[0]);
    close(pw_sv[1]);
}

/* EPOLLOUT on demand (sched_io.c.h): a new registration does not watch EPOLLOUT, so a socket
 * that is writable from the start (every new connection) wakes nobody; the first wait for
 * EPOLLOUT adds it to the registration, and a writer that filled its socket is woken when the
 * peer reads. One worker; this thread plays the peer. */
static struct sched *wo_sched;
static struct sched_io wo_io;
static int wo_sv[2];
static int wo_registered, wo_filled, wo_done, wo_result, wo_wrote_again;

/* The events mask of fd's registration in epfd, from /proc/self/fdinfo (-1 if not found). */
static long epoll_mask(int epfd, int fd)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", epfd);
    FILE *f = fopen(path, "r");
    long mask = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        int tfd;
        unsigned long ev;
        if (sscanf(line, "tfd: %d events: %lx", &tfd, &ev) == 2 && tfd == fd)
            mask = (long)ev;
    }
    fclose(f);
    return mask;
}

static void wo_noop(struct sched_io *io, uint32_t events)
{
}

/* Wait (bounded, 10 s) until worker id is parked with at least `parks` parks counted in all:
 * the fixed pauses this replaces lost that race on a loaded machine, where the worker may not
 * have reached its park by then (a park counted after the baseline, or none yet). */
static void wait_parked(struct sched *s, unsigned id, unsigned long long parks)
{
    struct sched_stats st;
    for (int i = 0; i < 100000; i++) {
        sched_get_stats(s, &st);
        /* safety: parked is only ever accessed atomically once the worker runs. */
        if (__atomic_load_n(&s->w[id].parked, __ATOMIC_SEQ_CST) == W_PARKED && st.parks >= parks)
            return;
        usleep(100);
    }
}

static int wo_register(struct coro *co, void *arg)
{
    add(&wo_registered, sched_io_add(&wo_io, wo_sv[0], wo_noop) == 0 ? 1 : -1);
    return 0;
}

static int wo_writer(struct coro *co, void *arg)
{
    char chunk[4096];
    memset(chunk, 'x', sizeof(chunk));
    ssize_t n;
    while ((n = write(wo_io.fd, chunk, sizeof(chunk))) > 0)
        ;
    add(&wo_filled, n < 0 && errno == EAGAIN ? 1 : -1);
    int rc = sched_io_wait(&wo_io, EPOLLOUT, (int64_t)(sched_now_ns() + 10000000000ull));
    add(&wo_result, rc);
    add(&wo_wrote_again, write(wo_io.fd, chunk, 1) == 1);
    add(&wo_done, 1);
    return 0;
}

static int wo_delete(struct coro *co, void *arg)
{
    sched_io_del(&wo_io);
    add(&wo_done, 1);
    return 0;
}

static void test_io_out_on_demand(void)
{
    struct sched_stats before, after;
    wo_sched = new_sched(1, 0, 0, 1);
    ok(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, wo_sv) == 0, "socketpair");
    is_int(sched_start(wo_sched), 0, "start");
    wait_parked(wo_sched, 0, 1); /* nothing to run yet */
    sched_get_stats(wo_sched, &before);
    sched_spawn(wo_sched, wo_register, NULL);
    for (int i = 0; i < 20000 && get(&wo_registered) == 0; i++)
        usleep(100);
    is_int(get(&wo_registered), 1, "registered");
    wait_parked(wo_sched, 0, before.parks + 1);
    usleep(20000); /* parked for good, or woken once more by the new socket */
    sched_get_stats(wo_sched, &after);
    int epfd = wo_sched->w[0].epfd;
    long mask = epoll_mask(epfd, wo_sv[0]);
    ok(mask >= 0 && !(mask & EPOLLOUT) && (mask & EPOLLIN) && (mask & EPOLLET),
       "a new registration watches reads, not writes (mask %lx)", mask);
    unsigned long long parks = after.parks - before.parks;
    /* The spawn ends the park the worker was in; it runs the registration and parks again
     * (one). Watching EPOLLOUT from the start, the new socket's write edge ended that park at
     * once, and the worker parked a second time. */
    ok(parks == 1,
       "registering a writable socket wakes nobody (parks: %llu; 2 if its edge ends one)", parks);
    sched_spawn(wo_sched, wo_writer, NULL);
    for (int i = 0; i < 20000 && get(&wo_filled) == 0; i++)
        usleep(100);
    is_int(get(&wo_filled), 1, "the writer filled the socket (EAGAIN)");
    /* It waits for EPOLLOUT now: once its wait has added it (bounded, 10 s), not after a fixed
     * 20 ms, which a loaded machine may spend before the writer gets to its wait. */
    for (int i = 0; i < 100000; i++) {
        mask = epoll_mask(epfd, wo_sv[0]);
        if (mask >= 0 && (mask & EPOLLOUT))
            break;
        usleep(100);
    }
    ok(mask >= 0 && (mask & EPOLLOUT) && (mask & EPOLLIN) && (mask & EPOLLET),
       "the first wait for EPOLLOUT added it, edge-triggered (mask %lx)", mask);
    is_int(get(&wo_done), 0, "the writer waits while the peer does not read");
    char sink[65536];
    while (read(wo_sv[1], sink, sizeof(sink)) > 0)
        ;
    for (int i = 0; i < 20000 && get(&wo_done) == 0; i++)
        usleep(100);
    is_int(get(&wo_done), 1, "the peer's read woke the writer");
    ok(get(&wo_result) > 0 && (get(&wo_result) & EPOLLOUT), "its wait returned EPOLLOUT (%x)",
       (unsigned)get(&wo_result));
    is_int(get(&wo_wrote_again), 1, "and it could write again");
    sched_spawn(wo_sched, wo_delete, NULL);
    for (int i = 0; i < 20000 && get(&wo_done) < 2; i++)
        usleep(100);
    sched_stop(wo_sched);
    sched_join(wo_sched);
    sched_free(wo_sched);
    close(wo_sv[0]);
    close(wo_sv[1]);
}

/* Hop: io registered by worker 1's start hook; a coroutine on worker 0 waits on it. */
static struct sched_io hop_io;
static int hop_sv[2];
static int hop_registered, hop_waiting, hop_result, hop_from_other;

static int hop_waiter(struct coro *co, void *arg)
{
    while (!get(&hop_registered))
        sched_yield();
    /* Where it waits from. Where it runs after the wait is not asked: the event that ends the
     * wait makes it runnable on the home's queue, from which worker 0 may steal it at once. */
    hop_from_other = sched_worker_id() != hop_io.home;
    add(&hop_waiting, 1);
    hop_result = sched_io_wait(&hop_io, EPOLLIN, -1);
    sched_io_del(&hop_io);
    return 0;
}

static int hop_writer(struct coro *co, void *arg)
{
    while (!get(&hop_registered))
        sched_yield();
    sched_sleep_ns(2000000);
    return write(hop_sv[1], "z", 1) == 1 ? 0 : -1;
}

static void hop_noop(struct sched_io *io, uint32_t ev)
{
}

static void hop_start_hook(struct sched *s, unsigned id, void *ud)
{
    if (id == 1) {
        sched_io_add(&hop_io, hop_sv[0], hop_noop);
        add(&hop_registered, 1);
        /* Keep worker 1 busy in its hook until the waiter, on worker 0, is about to wait, so
         * that worker 1 cannot steal it first: the waiter must hop. A fixed sleep here was not
         * enough on a loaded machine, where worker 0's thread may not run for that long. */
        for (int i = 0; i < 10000 && !get(&hop_waiting); i++)
            usleep(1000);
        /* Then until it has hopped (bounded, 10 s), not a fixed 5 ms more: a loaded machine
         * may hold worker 0's thread between those two steps longer than that. */
        struct sched_stats st = {0};
        for (int i = 0; i < 10000 && st.hops == 0; i++) {
            sched_get_stats(s, &st);
            if (st.hops == 0)
                usleep(1000);
        }
    } else if (id == 0) {
        sched_spawn(s, hop_waiter, NULL);
        sched_spawn(s, hop_writer, NULL);
    }
}

static void test_io_hop(void)
{
    struct sched *s = new_sched(2, 0, 0, 0);
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, hop_sv);
    sched_set_worker_hooks(s, hop_start_hook, NULL, NULL);
    /* Batch mode needs something alive before the hooks spawn: a placeholder that waits for the
     * hooks' coroutines to be registered. */
    sched_spawn(s, hop_writer, NULL);
    sched_run(s);
    ok(hop_result > 0 && (hop_result & EPOLLIN), "sched_io_wait after a hop sees the data");
    ok(hop_from_other, "the waiter waited from worker 0, not the io's home (worker 1)");
    struct sched_stats st;
    sched_get_stats(s, &st);
    ok(st.hops >= 1, "so it hopped to the io's home (worker 1 held its loop lock): %llu hops",
       (unsigned long long)st.hops);
    sched_free(s);
    close(hop_sv[0]);
    close(hop_sv[1]);
}

/* ---- offload ---- */

static int off_calls, off_begin, off_end, off_on_worker_stack;

static void off_fn(void *arg)
{
    add(&off_calls, 1);
    if (sched_current() == NULL && sched_worker_id() >= 0)
        add(&off_on_worker_stack, 1);
}

static void off_b(void *ud)
{
    add(&off_begin, 1);
}

static void off_e(void *ud)
{
    add(&off_end, 1);
}

/* The exit hook: once per worker thread, on it (its worker id still readable), after its
 * last batch (so no end hook after it). */
static int off_exits, off_exits_on_worker, off_end_at_exit;

static void off_x(void *ud)
{
    add(&off_exits, 1);
    if (sched_worker_id() >= 0)
        add(&off_exits_on_worker, 1);
    __atomic_store_n(&off_end_at_exit, __atomic_load_n(&off_end, __ATOMIC_SEQ_CST),
                     __ATOMIC_SEQ_CST);
}

static int offloader(struct coro *co, void *arg)
{
    return sched_offload(off_fn, NULL) == 0 ? 0 : -1;
}

static void test_offload(void)
{
    struct sched *s = new_sched(2, 0, 0, 0);
    sched_set_offload_hooks(s, off_b, off_e, NULL);
    sched_set_offload_exit(s, off_x);
    for (int i = 0; i < 200; i++)
        sched_spawn(s, offloader, NULL);
    sched_run(s);
    is_int(off_calls, 200, "200 offloaded calls ran");
    is_int(off_exits, 2, "the exit hook ran once per worker thread");
    is_int(off_exits_on_worker, 2, "on the worker itself, as it ended");
    is_int(off_end_at_exit, off_end, "after the last batch");
    is_int(off_on_worker_stack, 200, "each on a worker's own stack");
    ok(off_begin >= 1 && off_begin == off_end, "begin/end hooks pair up");
    ok(off_begin < 200, "and calls were batched between them");
    note("offload batches: %d", off_begin);
    sched_free(s);
}

/* ---- sched_worker_queued: whether the loop's next look at its epoll is near ---- */

static int wq_alone = -1, wq_spawned = -1, wq_other = -1, wq_after = -1, wq_b_ran;

static int wq_b(struct coro *co, void *arg)
{
    wq_b_ran = 1;
    return 0;
}

static int wq_a(struct coro *co, void *arg)
{
    struct sched *s = arg;
    wq_alone = sched_worker_queued(0); /* nothing else to run: the next poll is near */
    if (sched_spawn(s, wq_b, NULL) != 0)
        return -1;
    wq_spawned = sched_worker_queued(0); /* b runs before that poll */
    wq_other = sched_worker_queued(1);   /* not this thread's worker: not known */
    if (sched_yield() != 0)
        return -1;
    wq_after = sched_worker_queued(0); /* b has run and ended */
    return 0;
}

static void test_worker_queued(void)
{
    struct sched *s = new_sched(1, 0, 0, 0);
    is_int(sched_worker_queued(0), 1, "worker_queued off a worker: not known (1)");
    sched_spawn(s, wq_a, s);
    sched_run(s);
    is_int(wq_alone, 0, "worker_queued: 0 with nothing queued on the worker");
    is_int(wq_spawned, 1, "worker_queued: 1 with a spawned coroutine in its run queue");
    is_int(wq_other, 1, "worker_queued: 1 for a worker that is not the caller's");
    ok(wq_b_ran && wq_after == 0, "worker_queued: 0 again once the queue has run");
    sched_free(s);
}

/* ---- bounded offload batches ---- */

/* One worker, SLOW_N coroutines each offloading a call that sleeps 20 ms (far above the 1 ms
 * batch slice). A shared sequence number orders the events: each call's start, and each
 * coroutine's resumption after its call. Unbounded, every call ran in one batch and every
 * resumption came after the last call started; bounded, a batch ends after each slow call. */
enum { SLOW_N = 4 };
static int bo_seq, bo_call_start[SLOW_N], bo_resumed[SLOW_N], bo_calls, bo_begin, bo_end;

static void bo_b(void *ud)
{
    add(&bo_begin, 1);
}

static void bo_e(void *ud)
{
    add(&bo_end, 1);
}

static void bo_slow_fn(void *arg)
{
    int i = (int)(intptr_t)arg;
    bo_call_start[i] = add(&bo_seq, 1);
    add(&bo_calls, 1);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

static int bo_slow(struct coro *co, void *arg)
{
    int i = (int)(intptr_t)arg;
    if (sched_offload(bo_slow_fn, arg) != 0)
        return -1;
    bo_resumed[i] = add(&bo_seq, 1);
    return 0;
}

static void bo_fast_fn(void *arg)
{
    add(&bo_calls, 1);
}

static int bo_fast(struct coro *co, void *arg)
{
    return sched_offload(bo_fast_fn, NULL) == 0 ? 0 : -1;
}

/* A busy run queue must not hold queued calls back until it empties: a coroutine yields 1000
 * times on one worker (so the run queue is never empty) while another offloads one call. */
enum { BUSY_YIELDS = 1000 };
static int bo_busy_progress, bo_busy_seen;

static void bo_busy_fn(void *arg)
{
    bo_busy_seen = get(&bo_busy_progress);
}

static int bo_busy(struct coro *co, void *arg)
{
    for (int i = 0; i < BUSY_YIELDS; i++) {
        add(&bo_busy_progress, 1);
        if (sched_yield() != 0)
            return -1;
    }
    return 0;
}

static int bo_busy_off(struct coro *co, void *arg)
{
    return sched_offload(bo_busy_fn, NULL) == 0 ? 0 : -1;
}

static void test_offload_bounded(void)
{
    struct sched *s;
    bo_busy_seen = -1;
    s = new_sched(1, 0, 0, 0);
    sched_spawn(s, bo_busy, NULL);
    sched_spawn(s, bo_busy_off, NULL);
    sched_run(s);
    ok(bo_busy_seen >= 0 && bo_busy_seen < 10,
       "a queued call ran after the coroutines queued ahead of it, not when the queue emptied");
    note("the yielder had yielded %d of %d times when the call ran", bo_busy_seen, BUSY_YIELDS);
    sched_free(s);

    s = new_sched(1, 0, 0, 0);
    sched_set_offload_hooks(s, bo_b, bo_e, NULL);
    for (int i = 0; i < SLOW_N; i++)
        sched_spawn(s, bo_slow, (void *)(intptr_t)i);
    sched_run(s);
    is_int(bo_calls, SLOW_N, "every slow offloaded call ran");
    int first_resumed = bo_resumed[0], last_start = 0, in_order = 1;
    for (int i = 0; i < SLOW_N; i++) {
        if (bo_resumed[i] < first_resumed)
            first_resumed = bo_resumed[i];
        if (bo_call_start[i] > last_start)
            last_start = bo_call_start[i];
        in_order &= i == 0 || bo_call_start[i] > bo_call_start[i - 1];
    }
    ok(first_resumed > 0 && first_resumed < last_start,
       "the first coroutine was resumed before the last slow call started");
    ok(in_order, "queued calls ran in the order they were offloaded");
    for (int i = 0; i < SLOW_N; i++)
        ok(bo_resumed[i] == bo_call_start[i] + 1,
           "slow call %d: its coroutine resumed right after it, before the next call", i);
    is_int(bo_begin, SLOW_N, "a batch ends after a call longer than the slice: one per slow call");
    is_int(bo_end, bo_begin, "begin/end hooks pair up");
    sched_free(s);

    /* Fast calls still share batches: 256 coroutines queue their calls on one worker; batches
     * of at most 64 calls need 4 acquisitions. A preemption longer than the slice may end a
     * batch early, so the check is loose: on average more than 4 calls per batch. */
    enum { FAST_N = 256 };
    bo_calls = bo_begin = bo_end = 0;
    s = new_sched(1, 0, 0, 0);
    sched_set_offload_hooks(s, bo_b, bo_e, NULL);
    for (int i = 0; i < FAST_N; i++)
        sched_spawn(s, bo_fast, NULL);
    sched_run(s);
    is_int(bo_calls, FAST_N, "every fast offloaded call ran");
    ok(bo_begin >= FAST_N / SCHED_OFFLOAD_BATCH, "no batch took more than %d calls",
       SCHED_OFFLOAD_BATCH);
    ok(bo_begin < FAST_N / 4, "fast calls shared batches");
    is_int(bo_end, bo_begin, "begin/end hooks pair up");
    note("fast offload batches: %d for %d calls", bo_begin, FAST_N);
    sched_free(s);
}

/* ---- one queue of calls ----
 * The queue itself, without threads: a hand-over merges by age whoever queued the calls, the
 * first take stops counting a waiter, and a batch ending by its bound (or a relief thread)
 * leaves the calls to a thread that handed its own over and has not taken yet. */
enum { CQ_N = 6 };
static struct coro *cq_co[CQ_N];
static struct sched_offload_rec cq_rec[CQ_N];

static struct coro *cq_list(const int *idx, int n)
{
    for (int i = 0; i < n; i++) {
        coro_sched_node(cq_co[idx[i]])->wait = &cq_rec[idx[i]];
        coro_sched_node(cq_co[idx[i]])->next = i + 1 < n ? cq_co[idx[i + 1]] : NULL;
    }
    return cq_co[idx[0]];
}

static void test_callq(void)
{
    struct coro_pool *pool = NULL;
    ok(coro_pool_new(&pool, CORO_STACK_DEFAULT) == 0, "callq: a pool");
    for (int i = 0; i < CQ_N; i++) {
        cq_co[i] = coro_new(pool, NULL, NULL);
        cq_rec[i].since = 100 + 10 * (uint64_t)i; /* cq_co[i] is the i-th oldest */
    }
    struct sched_callq q = {0};
    static const int a[] = {0, 2, 5}, b[] = {1, 3, 4};
    callq_hand(&q, cq_list(a, 3), cq_co[5], 1);
    callq_hand(&q, cq_list(b, 3), cq_co[4], 1);
    is_int((int)q.waiting, 2, "callq: two threads handed calls over");
    int order_ok = 1;
    for (int i = 0; i < CQ_N; i++) {
        struct coro *c = callq_take(&q, i < 2);
        order_ok &= c == cq_co[i];
    }
    ok(order_ok, "callq: the merged calls come out oldest first, whoever queued them");
    ok(callq_take(&q, 0) == NULL && q.tail == NULL, "callq: then the queue is empty");
    is_int((int)q.waiting, 0, "callq: each first take stopped counting its thread");

    /* A hand-over of calls all younger than the queue's appends them. */
    static const int c1[] = {0, 1}, c2[] = {2, 3};
    callq_hand(&q, cq_list(c1, 2), cq_co[1], 1);
    (void)callq_take(&q, 1);
    callq_hand(&q, cq_list(c2, 2), cq_co[3], 1);
    ok(q.head == cq_co[1] && q.tail == cq_co[3] && coro_sched_node(cq_co[1])->next == cq_co[2],
       "callq: younger calls are appended");
    ok(callq_take_all(&q, 1) == NULL && q.head == cq_co[1],
       "callq: a thread about to take keeps the calls from being taken back");
    ok(callq_leave(&q) == 0 && q.waiting == 1,
       "callq: a batch ending by its bound leaves the calls to that thread");
    ok(callq_take(&q, 1) == cq_co[1] && q.waiting == 0, "callq: that thread's first take");
    ok(callq_leave(&q) == 1 && q.waiting == 1,
       "callq: with no thread about to take, the batch ending by its bound owes one");
    ok(callq_take(&q, 1) == cq_co[2] && q.waiting == 0, "callq: the owed batch takes the oldest");
    struct coro *all = callq_take_all(&q, 1);
    ok(all == cq_co[3] && coro_sched_node(all)->next == NULL && !q.head && !q.tail,
       "callq: with no thread about to take, the calls left can be taken back");
    ok(callq_leave(&q) == 0 && q.waiting == 0, "callq: an empty queue is owed nothing");
    for (int i = 0; i < CQ_N; i++)
        coro_free(cq_co[i], pool);
    coro_pool_free(pool);
}

/* ---- one queue of calls: a thread that cannot get the hooks' lock does not starve ----
 * Two workers. Worker 1 spawns SQ_N coroutines on itself, each offloading a call; its batch
 * hands them over and then waits in the begin hook, which keeps worker 1 out until every one
 * of those calls ran, or a deadline passed (as a thread the interpreter never gives the GIL to).
 * Worker 0 meanwhile offloads calls of its own one at a time. With one shared queue, worker
 * 0's batches take worker 1's calls (older than its own) and run them, so all run before the
 * deadline, on worker 0; with a queue per thread, none can run until worker 1 is let in. */
enum { SQ_N = 8 };
static int sq_shared, sq_done, sq_ran_on_0, sq_from_1, sq_w1_waiting, sq_timeout_ms;
static int sq_done_at_release;
static pthread_mutex_t sq_gil = PTHREAD_MUTEX_INITIALIZER;

static void sq_begin(void *ud)
{
    if (sched_worker_id() == 1) {
        add(&sq_w1_waiting, 1);
        for (int i = 0; i < sq_timeout_ms && get(&sq_done) < SQ_N; i++)
            usleep(1000);
        /* The first release only: a later batch of worker 1 (some of its calls queued after
         * its first batch began, which a loaded machine can make happen) would record a count
         * that includes the calls worker 1 itself ran, after the moment this test is about. */
        int unset = -1;
        __atomic_compare_exchange_n(&sq_done_at_release, &unset, get(&sq_done), 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST);
        add(&sq_w1_waiting, -1);
    }
    pthread_mutex_lock(&sq_gil);
}

static void sq_end(void *ud)
{
    pthread_mutex_unlock(&sq_gil);
}

static void sq_call(void *arg)
{
    if (sched_worker_id() == 0)
        add(&sq_ran_on_0, 1);
    add(&sq_done, 1);
}

static void sq_tick(void *arg)
{
}

static int sq_queued_on_1(struct coro *co, void *arg)
{
    if (sched_worker_id() == 1)
        add(&sq_from_1, 1);
    return sched_offload(sq_call, NULL) == 0 ? 0 : -1;
}

static int sq_ticker(struct coro *co, void *arg)
{
    /* Bounded: a broken scheduler fails the checks instead of hanging. */
    for (int i = 0; i < 5000 && get(&sq_done) < SQ_N; i++) {
        if (sched_offload(sq_tick, NULL) != 0)
            return -1;
        if (get(&sq_w1_waiting) == 0)
            sched_sleep_ns(1000000);
    }
    return 0;
}

static void sq_start_hook(struct sched *s, unsigned id, void *ud)
{
    if (id == 1) {
        for (int i = 0; i < SQ_N; i++)
            sched_spawn(s, sq_queued_on_1, NULL);
    } else {
        /* Let worker 1 run its coroutines first, so that none is stolen before it offloads. */
        usleep(30000);
        sched_spawn(s, sq_ticker, NULL);
    }
}

static void test_shared_queue(int shared)
{
    sq_shared = shared;
    sq_done = sq_ran_on_0 = sq_from_1 = sq_w1_waiting = 0;
    sq_done_at_release = -1;
    sq_timeout_ms = shared ? 5000 : 200;
    const char *how = shared ? "shared queue" : "queue per thread";
    struct sched *s = new_sched(2, 0, 0, 0);
    sched_set_offload_hooks(s, sq_begin, sq_end, NULL);
    sched_share_offloads(s, shared);
    sched_set_worker_hooks(s, sq_start_hook, NULL, NULL);
    sched_spawn(s, sq_ticker, NULL); /* batch mode: alive before the hooks spawn */
    sched_run(s);
    ok(get(&sq_done) == SQ_N, "%s: every call ran", how);
    ok(get(&sq_from_1) >= SQ_N / 2, "%s: %d of %d calls were queued on worker 1", how,
       get(&sq_from_1), SQ_N);
    if (shared) {
        ok(get(&sq_done_at_release) == SQ_N, "%s: all ran while worker 1 waited for the lock", how);
        ok(get(&sq_ran_on_0) >= get(&sq_from_1),
           "%s: worker 0's batches ran worker 1's calls (%d on worker 0)", how, get(&sq_ran_on_0));
    } else {
        /* The control: what the shared queue changes. Worker 1's calls waited for it. */
        ok(get(&sq_done_at_release) <= SQ_N - get(&sq_from_1),
           "%s: worker 1's calls waited for worker 1 (%d ran before it got the lock)", how,
           get(&sq_done_at_release));
    }
    sched_free(s);
}

/* ---- stop with coroutines suspended ---- */

static int stop_started, stop_defers, stop_cancelled;
static int stop_pipe[2];

static void stop_defer(void *arg)
{
    add(&stop_defers, 1);
}

static int stop_sleeper(struct coro *co, void *arg)
{
    coro_defer(co, stop_defer, NULL);
    add(&stop_started, 1);
    if (sched_sleep_ns(60ull * 1000000000u) == -ECANCELED)
        add(&stop_cancelled, 1);
    return 0;
}

static int stop_fd_waiter(struct coro *co, void *arg)
{
    coro_defer(co, stop_defer, NULL);
    add(&stop_started, 1);
    if (sched_wait_fd(stop_pipe[0], EPOLLIN, -1) == -ECANCELED)
        add(&stop_cancelled, 1);
    return 0;
}

static int stop_spinner(struct coro *co, void *arg)
{
    coro_defer(co, stop_defer, NULL);
    add(&stop_started, 1);
    while (sched_yield() == 0)
        ;
    add(&stop_cancelled, 1);
    return 0;
}

static void test_stop(void)
{
    struct sched *s = new_sched(3, 4, 1, 1);
    pipe2(stop_pipe, O_NONBLOCK);
    is_int(sched_start(s), 0, "server mode starts");
    for (int i = 0; i < 50; i++)
        sched_spawn(s, stop_sleeper, NULL);
    sched_spawn(s, stop_fd_waiter, NULL);
    for (int i = 0; i < 5; i++)
        sched_spawn(s, stop_spinner, NULL);
    for (int i = 0; i < 20000 && get(&stop_started) < 56; i++)
        usleep(500);
    is_int(get(&stop_started), 56, "all started");
    sched_stop(s);
    is_int(sched_spawn(s, stop_sleeper, NULL), -ESHUTDOWN, "spawn after stop fails cleanly");
    is_int(sched_join(s), 0, "join");
    is_int(stop_defers, 56, "every suspended coroutine ran its defers");
    is_int(stop_cancelled, 56, "and saw -ECANCELED");
    sched_free(s);
    close(stop_pipe[0]);
    close(stop_pipe[1]);

    /* Never-run coroutines are cancelled by sched_free, defers included. */
    s = new_sched(1, 0, 0, 0);
    stop_defers = 0;
    for (int i = 0; i < 3; i++)
        sched_spawn(s, stop_sleeper, NULL);
    sched_free(s);
    is_int(stop_defers, 0, "defers registered inside a body do not exist before it runs");
}

/* ---- signals: a coroutine parks, any thread sets (sched_signal.c.h) ---- */

static struct sched_signal sg_sig;
static int sg_value, sg_seen, sg_early, sg_done;

static int sg_waiter(struct coro *co, void *arg)
{
    /* Set before the first wait: returns at once and consumes it. */
    sg_early = sched_signal_wait(&sg_sig) == 0;
    add(&sg_done, 1); /* the main thread sets again once it sees this */
    int rc = sched_signal_wait(&sg_sig);
    /* safety: written by the setter before sched_signal_set: the signal orders it. */
    sg_seen = rc == 0 ? __atomic_load_n(&sg_value, __ATOMIC_RELAXED) : -1;
    add(&sg_done, 1);
    return 0;
}

static void test_signal(void)
{
    is_int(sched_signal_wait(&sg_sig), -EPERM, "signal wait refuses off a coroutine");
    struct sched *s = new_sched(2, 0, 0, 1);
    sched_signal_init(&sg_sig);
    is_int(sched_signal_set(&sg_sig), 0, "a set with nobody waiting wakes nobody");
    is_int(sched_start(s), 0, "start");
    sched_spawn(s, sg_waiter, NULL);
    for (int i = 0; i < 20000 && get(&sg_done) < 1; i++)
        usleep(100);
    ok(sg_early, "a set before the wait is remembered");
    /* Until it parks (bounded, 10 s), not a fixed 20 ms: on a loaded machine the worker may not
     * have reached its second wait by then, and the set below found nobody to wake. */
    /* safety: the signal's state is only ever accessed atomically. */
    for (int i = 0; i < 100000 && __atomic_load_n(&sg_sig.state, __ATOMIC_ACQUIRE) != SIG_WAITING;
         i++)
        usleep(100);
    is_int(get(&sg_done), 1, "the second wait parks");
    __atomic_store_n(&sg_value, 42, __ATOMIC_RELAXED); /* safety: ordered by the set below */
    is_int(sched_signal_set(&sg_sig), 1, "a set from a thread that is not a worker wakes it");
    for (int i = 0; i < 20000 && get(&sg_done) < 2; i++)
        usleep(100);
    is_int(sg_seen, 42, "and the waiter sees what was written before the set");
    sched_stop(s);
    sched_join(s);
    sched_free(s);
}

/* Stress: coroutines on 4 workers (randomised, a tiny run queue) ask, each through its own
 * signal, for SG_ROUNDS answers from two setter threads that also set at random (spurious sets
 * must be re-checked, not trusted); some coroutines yield or sleep between rounds so that they
 * wait from different workers. Every answer must arrive exactly once, in order. */
enum { SG_N = 64, SG_ROUNDS = 300 };
static struct sched_signal sg_sigs[SG_N];
static int sg_asked[SG_N], sg_answered[SG_N], sg_finished, sg_stop_setters;

static int sg_asker(struct coro *co, void *arg)
{
    int i = (int)(intptr_t)arg;
    for (int k = 1; k <= SG_ROUNDS; k++) {
        /* safety: the setters read it; the signal orders the answer. */
        __atomic_store_n(&sg_asked[i], k, __ATOMIC_RELEASE);
        while (__atomic_load_n(&sg_answered[i], __ATOMIC_ACQUIRE) < k)
            if (sched_signal_wait(&sg_sigs[i]) != 0)
                return -1;
        if (__atomic_load_n(&sg_answered[i], __ATOMIC_ACQUIRE) != k)
            return -1;
        if (k % 7 == i % 7)
            sched_yield();
        else if (k % 50 == i % 50)
            sched_sleep_ns(10000);
    }
    add(&sg_finished, 1);
    return 0;
}

static void *sg_setter(void *arg)
{
    unsigned r = (unsigned)(uintptr_t)arg;
    while (!get(&sg_stop_setters)) {
        for (int i = 0; i < SG_N; i++) {
            r = r * 1103515245u + 12345u;
            int asked = __atomic_load_n(&sg_asked[i], __ATOMIC_ACQUIRE);
            int answered = __atomic_load_n(&sg_answered[i], __ATOMIC_ACQUIRE);
            if (asked > answered &&
                __atomic_compare_exchange_n(&sg_answered[i], &answered, asked, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                sched_signal_set(&sg_sigs[i]);
            else if ((r >> 16) % 8 == 0)
                sched_signal_set(&sg_sigs[i]); /* spurious */
        }
    }
    return NULL;
}

static void test_signal_stress(void)
{
    struct sched *s = new_sched(4, 4, 1, 1);
    for (int i = 0; i < SG_N; i++)
        sched_signal_init(&sg_sigs[i]);
    is_int(sched_start(s), 0, "start");
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, sg_setter, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < SG_N; i++)
        sched_spawn(s, sg_asker, (void *)(intptr_t)i);
    for (int i = 0; i < 600000 && get(&sg_finished) < SG_N; i++)
        usleep(100);
    is_int(get(&sg_finished), SG_N, "every answer of every coroutine arrived, once and in order");
    __atomic_store_n(&sg_stop_setters, 1, __ATOMIC_SEQ_CST); /* safety: a flag */
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    sched_stop(s);
    sched_join(s);
    sched_free(s);
}

/* A stop: the owner cancels the signals first (their waiters end with -ECANCELED, defers run),
 * while a setter races it; a set that comes as the workers drain is not lost either. */
enum { SGS_N = 40 };
static struct sched_signal sgs_sigs[SGS_N];
static int sgs_started, sgs_cancelled, sgs_woken, sgs_quit;

static int sgs_waiter(struct coro *co, void *arg)
{
    struct sched_signal *sig = arg;
    coro_defer(co, stop_defer, NULL);
    add(&sgs_started, 1);
    for (;;) {
        int rc = sched_signal_wait(sig);
        if (rc == -ECANCELED) {
            add(&sgs_cancelled, 1);
            return 0;
        }
        add(&sgs_woken, 1);
    }
}

static void *sgs_setter(void *arg)
{
    while (!get(&sgs_quit))
        for (int i = 0; i < SGS_N; i += 2)
            sched_signal_set(&sgs_sigs[i]); /* the odd ones are never set */
    return NULL;
}

static void test_signal_stop(void)
{
    struct sched *s = new_sched(3, 0, 1, 1);
    for (int i = 0; i < SGS_N; i++)
        sched_signal_init(&sgs_sigs[i]);
    stop_defers = 0;
    is_int(sched_start(s), 0, "start");
    for (int i = 0; i < SGS_N; i++)
        sched_spawn(s, sgs_waiter, &sgs_sigs[i]);
    for (int i = 0; i < 20000 && get(&sgs_started) < SGS_N; i++)
        usleep(100);
    pthread_t th;
    pthread_create(&th, NULL, sgs_setter, NULL);
    /* Cancel once the setter's sets have been waking waiters (bounded, 10 s), not after a fixed
     * 20 ms: a loaded machine may not run the new thread that soon, and then nothing raced the
     * cancels and "woken meanwhile" failed. The setter goes on setting through the cancels. */
    for (int i = 0; i < 100000 && get(&sgs_woken) == 0; i++)
        usleep(100);
    for (int i = 0; i < SGS_N; i++)
        sched_signal_cancel(&sgs_sigs[i]);
    for (int i = 0; i < 20000 && get(&sgs_cancelled) < SGS_N; i++)
        usleep(100);
    sched_stop(s);
    sched_join(s);
    __atomic_store_n(&sgs_quit, 1, __ATOMIC_SEQ_CST); /* safety: a flag */
    pthread_join(th, NULL);
    sched_free(s);
    is_int(get(&sgs_cancelled), SGS_N, "every cancelled waiter saw -ECANCELED");
    is_int(get(&stop_defers), SGS_N, "and ran its defers");
    ok(get(&sgs_woken) > 0, "the set ones were woken meanwhile");
}

/* sched_io_wait_signal: each coroutine waits on its socket OR its signal, while a writer thread
 * sends it bytes and two setter threads answer it through the signal (and set at random), and
 * short deadlines let the timer race both. Every byte and every answer must arrive, nothing may
 * be resumed twice (ASan/TSan would see a stack run on two threads). */
enum { SW_N = 16, SW_ROUNDS = 200, SW_BYTES = 300 };
static struct sched_signal sw_sigs[SW_N];
static struct sched_io sw_io[SW_N];
static int sw_sv[SW_N][2];
static int sw_asked[SW_N], sw_answered[SW_N], sw_finished, sw_quit, sw_timeouts, sw_ready,
    sw_write_failed;

static void sw_noop(struct sched_io *io, uint32_t events)
{
}

static int sw_waiter(struct coro *co, void *arg)
{
    int i = (int)(intptr_t)arg;
    /* Registered and marked active in one home section, so that no event can call on_ready in
     * between: this coroutine serves the socket from the start. */
    if (sched_home_enter(-1) < 0)
        return -1;
    int added = sched_io_add(&sw_io[i], sw_sv[i][0], sw_noop);
    sw_io[i].active = 1;
    sched_home_exit();
    if (added != 0)
        return -1;
    add(&sw_ready, 1);
    int got_bytes = 0, k = 1;
    /* safety: the setters read it; the signal orders the answer. */
    __atomic_store_n(&sw_asked[i], k, __ATOMIC_RELEASE);
    while (got_bytes < SW_BYTES || k <= SW_ROUNDS) {
        int64_t deadline = (k + got_bytes) % 5 == 0 ? (int64_t)(sched_now_ns() + 20000) : -1;
        int rc = sched_io_wait_signal(&sw_io[i], EPOLLIN, deadline, &sw_sigs[i]);
        if (rc == -ETIMEDOUT) {
            add(&sw_timeouts, 1);
            continue;
        }
        if (rc < 0)
            return -1;
        if (rc & EPOLLIN) {
            char b[64];
            ssize_t n;
            while ((n = read(sw_sv[i][0], b, sizeof(b))) > 0)
                got_bytes += (int)n;
        }
        if (k <= SW_ROUNDS && __atomic_load_n(&sw_answered[i], __ATOMIC_ACQUIRE) >= k) {
            k++;
            __atomic_store_n(&sw_asked[i], k <= SW_ROUNDS ? k : 0, __ATOMIC_RELEASE);
        }
    }
    /* The 20 us deadlines above race bytes and answers, but where both come faster than that
     * (an -O2 build: once in 1,600 rounds) none fires. Then keep waiting with such deadlines,
     * the setters still setting at random, until one does: a deadline racing signals still
     * fires, in a bounded number of tries (a broken timer fails "deadlines raced them too"). */
    for (int t = 0; t < 20000 && !get(&sw_timeouts); t++) {
        int rc = sched_io_wait_signal(&sw_io[i], EPOLLIN, (int64_t)(sched_now_ns() + 20000),
                                      &sw_sigs[i]);
        if (rc == -ETIMEDOUT)
            add(&sw_timeouts, 1);
        else if (rc < 0)
            return -1;
    }
    sched_io_del(&sw_io[i]);
    add(&sw_finished, 1);
    return 0;
}

static void *sw_setter(void *arg)
{
    unsigned r = (unsigned)(uintptr_t)arg;
    while (!get(&sw_quit)) {
        for (int i = 0; i < SW_N; i++) {
            r = r * 1103515245u + 12345u;
            int asked = __atomic_load_n(&sw_asked[i], __ATOMIC_ACQUIRE);
            int answered = __atomic_load_n(&sw_answered[i], __ATOMIC_ACQUIRE);
            if (asked > answered &&
                __atomic_compare_exchange_n(&sw_answered[i], &answered, asked, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                sched_signal_set(&sw_sigs[i]);
            else if ((r >> 16) % 8 == 0)
                sched_signal_set(&sw_sigs[i]); /* spurious */
        }
    }
    return NULL;
}

/* One byte per write: each is its own buffer in a Unix socket, charged ~700 bytes of the send
 * buffer, so ~300 unread ones fill it and write() says EAGAIN when the waiters fall behind (a
 * loaded machine). Then wait and write again; giving up left the waiters short of SW_BYTES and
 * the test waiting for them until its minute ran out. */
static void *sw_writer(void *arg)
{
    for (int b = 0; b < SW_BYTES; b++) {
        for (int i = 0; i < SW_N; i++) {
            ssize_t n;
            while ((n = write(sw_sv[i][1], "x", 1)) < 0 && (errno == EAGAIN || errno == EINTR))
                usleep(200);
            if (n != 1) {
                add(&sw_write_failed, 1);
                return NULL;
            }
        }
        if (b % 16 == 0)
            usleep(200);
    }
    return NULL;
}

static void test_io_wait_signal(void)
{
    struct sched *s = new_sched(4, 4, 1, 1);
    for (int i = 0; i < SW_N; i++) {
        sched_signal_init(&sw_sigs[i]);
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sw_sv[i]) != 0)
            return;
    }
    is_int(sched_start(s), 0, "start");
    for (int i = 0; i < SW_N; i++)
        sched_spawn(s, sw_waiter, (void *)(intptr_t)i);
    for (int i = 0; i < 20000 && get(&sw_ready) < SW_N; i++)
        usleep(100);
    pthread_t th[3];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, sw_setter, (void *)(uintptr_t)(i + 1));
    pthread_create(&th[2], NULL, sw_writer, NULL);
    for (int i = 0; i < 600000 && get(&sw_finished) < SW_N && !get(&sw_write_failed); i++)
        usleep(100);
    is_int(get(&sw_write_failed), 0, "the writer wrote every byte");
    is_int(get(&sw_finished), SW_N, "every byte and every signalled answer arrived");
    ok(get(&sw_timeouts) > 0, "deadlines raced them too");
    __atomic_store_n(&sw_quit, 1, __ATOMIC_SEQ_CST); /* safety: a flag */
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    sched_stop(s);
    sched_join(s);
    sched_free(s);
    for (int i = 0; i < SW_N; i++) {
        close(sw_sv[i][0]);
        close(sw_sv[i][1]);
    }
}

/* ---- rescue: a worker stuck in one coroutine has its loop step run by the idle one ---- */

/* The hog registers a sched_io and arms a timer on its own worker (H), then spins without ever
 * yielding until both were served, by the other worker, while it spun: on_ready, a coroutine
 * that reads, parks on the io (home H) and is woken again, and the timer callback. The spin is
 * bounded (10 s) only so that a broken scheduler fails the checks below instead of hanging. */
static struct sched *rs_sched;
static struct sched_io rs_io;
static int rs_sv[2];
static struct sched_timer rs_timer;
static int rs_home = -1, rs_spinning, rs_stage, rs_done, rs_timer_fired, rs_hog_over;
static int rs_ready_ok, rs_timer_ok, rs_ping_ok, rs_pong_ok, rs_served_elsewhere;

static int rs_read4(char *buf)
{
    size_t got = 0;
    while (got < 4) {
        ssize_t n = read(rs_io.fd, buf + got, 4 - got);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EAGAIN && sched_io_wait(&rs_io, EPOLLIN, -1) > 0)
            continue;
        return -1;
    }
    return 0;
}

static int rs_server(struct coro *co, void *arg)
{
    char buf[4];
    int home = get(&rs_home);
    add(&rs_served_elsewhere, sched_worker_id() != home);
    rs_ping_ok = rs_read4(buf) == 0 && memcmp(buf, "ping", 4) == 0;
    add(&rs_stage, 1); /* the writer sends "pong" now: we wait for it, parked on home's io */
    rs_pong_ok = rs_read4(buf) == 0 && memcmp(buf, "pong", 4) == 0 && get(&rs_spinning);
    while (sched_io_release(&rs_io) == -EAGAIN)
        while (read(rs_io.fd, buf, sizeof(buf)) > 0)
            ;
    ok(sched_home_held() == home, "sched_io_release returned 0 inside the home section");
    add(&rs_done, 1);
    return 0;
}

static void rs_on_ready(struct sched_io *io, uint32_t events)
{
    int home = get(&rs_home);
    rs_ready_ok = get(&rs_spinning) && sched_worker_id() != home && sched_home_held() == home &&
                  sched_current() == NULL;
    sched_spawn(rs_sched, rs_server, NULL);
}

static void rs_timer_cb(struct sched_timer *t)
{
    int home = get(&rs_home);
    rs_timer_ok = get(&rs_spinning) && sched_worker_id() != home && sched_home_held() == home;
    add(&rs_timer_fired, 1);
}

static int rs_writer(struct coro *co, void *arg)
{
    while (!get(&rs_spinning))
        sched_sleep_ns(1000000);
    if (write(rs_sv[1], "ping", 4) != 4)
        return -1;
    while (get(&rs_stage) < 1) {
        if (get(&rs_hog_over))
            return -1; /* nobody served the io while the hog spun: the checks report it */
        sched_sleep_ns(1000000);
    }
    return write(rs_sv[1], "pong", 4) == 4 ? 0 : -1;
}

static int rs_hog(struct coro *co, void *arg)
{
    int home = sched_home_enter(-1);
    add(&rs_home, home + 1); /* from -1 */
    rs_io.data = NULL;
    int rc = sched_io_add(&rs_io, rs_sv[0], rs_on_ready);
    rs_timer.cb = rs_timer_cb;
    sched_timer_arm(&rs_timer, sched_now_ns() + 20000000);
    sched_home_exit();
    ok(rc == 0 && sched_home_held() == -1, "hog registered its io and timer, then left its home");
    sched_spawn(rs_sched, rs_writer, NULL);
    add(&rs_spinning, 1);
    uint64_t t0 = sched_clock_ns();
    while (!(get(&rs_timer_fired) && get(&rs_done)) && sched_clock_ns() - t0 < 10000000000ull)
        cpu_relax();
    ok(sched_worker_id() == home, "the hog never left its worker (it never yielded)");
    add(&rs_spinning, -1);
    sched_io_del(&rs_io);
    add(&rs_hog_over, 1);
    return 0;
}

static void test_rescue(void)
{
    rs_sched = new_sched(2, 0, 0, 0);
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, rs_sv);
    sched_spawn(rs_sched, rs_hog, NULL);
    sched_run(rs_sched);
    ok(rs_ready_ok, "on_ready of an io homed on the spinning worker ran on the other one");
    is_int(rs_served_elsewhere, 1, "its serving coroutine ran on the other worker");
    ok(rs_ping_ok, "it read the first message");
    ok(rs_pong_ok, "it parked on the busy home's io and was woken while the hog still spun");
    is_int(rs_done, 1, "it released the io and finished");
    is_int(rs_timer_fired, 1, "the busy worker's timer fired once");
    ok(rs_timer_ok, "on the other worker, with the home's loop lock, while the hog spun");
    sched_free(rs_sched);
    close(rs_sv[0]);
    close(rs_sv[1]);
}

/* ---- rescue after an idle spell: the hog is woken by its own worker's I/O ----
 * Both workers park with nothing to do; then the hog's worker (H) is woken by an event on its
 * own epoll and runs a coroutine that spins. That wake-up calls nobody (a waiter woken by I/O is
 * just pushed on H's queue), so the other worker must not have parked without a timeout merely
 * because H was not running coroutine code when it looked: then nobody would ever look at H
 * again and an event for another io homed on H would wait for the spin to end. This was the
 * intermittent failure of the Python rescue test (the other worker looked while H was between
 * its wake-up and the handler); here the idle spell makes the order certain. The spin is
 * bounded (5 s) only so that a broken scheduler fails the check instead of hanging. */
static struct sched *ri_sched;
static struct sched_io ri_io_a, ri_io_b;
static int ri_a[2], ri_b[2];
static int ri_waiting, ri_spinning, ri_released, ri_served_while_spinning;

static void ri_noop(struct sched_io *io, uint32_t events)
{
}

static int ri_server(struct coro *co, void *arg)
{
    char buf[8];
    while (read(ri_b[0], buf, sizeof(buf)) > 0)
        ;
    add(&ri_served_while_spinning, get(&ri_spinning));
    add(&ri_released, 1);
    while (sched_io_release(&ri_io_b) == -EAGAIN)
        while (read(ri_b[0], buf, sizeof(buf)) > 0)
            ;
    return 0;
}

static void ri_on_ready_b(struct sched_io *io, uint32_t events)
{
    sched_spawn(ri_sched, ri_server, NULL);
}

static int ri_hog(struct coro *co, void *arg)
{
    sched_home_enter(-1);
    int rc = sched_io_add(&ri_io_a, ri_a[0], ri_noop);
    rc |= sched_io_add(&ri_io_b, ri_b[0], ri_on_ready_b);
    sched_home_exit();
    add(&ri_waiting, 1);
    /* Parked on H until the main thread writes, long after both workers went idle. */
    rc |= sched_io_wait(&ri_io_a, EPOLLIN, -1) > 0 ? 0 : -1;
    ok(rc == 0, "the hog registered two ios on its worker and was woken by the first");
    add(&ri_spinning, 1);
    uint64_t t0 = sched_clock_ns();
    while (!get(&ri_released) && sched_clock_ns() - t0 < 5000000000ull)
        cpu_relax();
    add(&ri_spinning, -1);
    sched_io_del(&ri_io_a);
    sched_io_del(&ri_io_b);
    return 0;
}

static void ri_sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_rescue_after_idle(int round)
{
    ri_waiting = ri_spinning = ri_released = ri_served_while_spinning = 0;
    ri_sched = new_sched(2, 0, 0, 0);
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, ri_a);
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, ri_b);
    sched_spawn(ri_sched, ri_hog, NULL);
    sched_start(ri_sched);
    /* Bounded waits on the workers' progress; the 50 ms lets both of them park (it makes the
     * bad order certain, it decides nothing). */
    for (int i = 0; i < 5000 && !get(&ri_waiting); i++)
        ri_sleep_ms(1);
    ri_sleep_ms(50);
    ssize_t w1 = write(ri_a[1], "go", 2);
    for (int i = 0; i < 5000 && !get(&ri_spinning); i++)
        ri_sleep_ms(1);
    ssize_t w2 = write(ri_b[1], "ping", 4);
    sched_join(ri_sched);
    ok(w1 == 2 && w2 == 4, "round %d: wrote both messages", round);
    ok(get(&ri_served_while_spinning) == 1,
       "round %d: an io homed on the hog's worker was served while the hog spun", round);
    sched_free(ri_sched);
    close(ri_a[0]);
    close(ri_a[1]);
    close(ri_b[0]);
    close(ri_b[1]);
}

/* ---- relief: a worker stuck in a long offloaded call has its loop taken over ----
 * One worker, two relief threads. The owner registers an io on its worker, then it (and, in the
 * second round, one more coroutine) offloads a call that blocks until released: the worker's
 * only thread is stuck, and no idle worker exists to rescue it. A relief thread must serve the
 * io while the calls block, the second call must not wait behind the first (it is taken from
 * the stuck batch and runs on a relief thread), and once released the worker serves its io
 * itself again. The waits are bounded so that a broken scheduler fails instead of hanging. */
static struct sched_io rl_io;
static int rl_sv[2];
static int rl_in, rl_max_in, rl_release, rl_served, rl_second_done;
static int rl_served_by[2];

static void rl_sleep_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void rl_block_fn(void *arg)
{
    int in = add(&rl_in, 1);
    int m = get(&rl_max_in);
    /* safety: a max-update of a test counter. */
    while (m < in &&
           !__atomic_compare_exchange_n(&rl_max_in, &m, in, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        ;
    for (int i = 0; i < 10000 && !get(&rl_release); i++)
        rl_sleep_ms(1);
    add(&rl_in, -1);
}

static void rl_on_ready(struct sched_io *io, uint32_t events)
{
    char buf[16];
    while (read(io->fd, buf, sizeof(buf)) > 0)
        ;
    int n = add(&rl_served, 1);
    if (n <= 2)
        rl_served_by[n - 1] = sched_worker_id();
    ssize_t w = write(io->fd, "pong", 4);
    (void)w;
    sched_io_idle(io);
}

static int rl_owner(struct coro *co, void *arg)
{
    sched_home_enter(-1);
    rl_io.data = NULL;
    int rc = sched_io_add(&rl_io, rl_sv[0], rl_on_ready);
    sched_home_exit();
    if (rc != 0 || sched_offload(rl_block_fn, NULL) != 0)
        return -1;
    for (int i = 0; i < 5000 && !get(&rl_second_done); i++)
        sched_sleep_ns(1000000);
    sched_io_del(&rl_io);
    return 0;
}

static int rl_blocker(struct coro *co, void *arg)
{
    return sched_offload(rl_block_fn, NULL) == 0 ? 0 : -1;
}

/* Send "ping" and wait (bounded) for "pong". */
static int rl_ping(void)
{
    if (write(rl_sv[1], "ping", 4) != 4)
        return 0;
    struct pollfd p = {.fd = rl_sv[1], .events = POLLIN};
    if (poll(&p, 1, 5000) != 1)
        return 0;
    char buf[4];
    return read(rl_sv[1], buf, 4) == 4 && memcmp(buf, "pong", 4) == 0;
}

static void test_relief_cfg(int nblock, int waiting_only)
{
    rl_in = rl_max_in = rl_release = rl_served = rl_second_done = 0;
    rl_served_by[0] = rl_served_by[1] = -1;
    struct sched_config cfg = {.workers = 1, .relief = 2, .relief_waiting_only = waiting_only};
    struct sched *s = NULL;
    ok((sched_new(&s, &cfg)) == (0), "relief %d: a scheduler with 1 worker and 2 relief threads",
       nblock);
    ok(((int)sched_threads(s)) == (3), "relief %d: 3 thread slots", nblock);
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, rl_sv);
    sched_spawn(s, rl_owner, NULL);
    for (int i = 1; i < nblock; i++)
        sched_spawn(s, rl_blocker, NULL);
    sched_start(s);
    for (int i = 0; i < 5000 && get(&rl_in) < nblock; i++)
        rl_sleep_ms(1);
    ok((get(&rl_in)) == (nblock), "relief %d: every blocking call runs at once", nblock);
    ok(rl_ping(), "relief %d: the stuck worker's io was served while the calls blocked", nblock);
    ok((get(&rl_in)) == (nblock), "relief %d: (the calls were still blocked then)", nblock);
    ok(rl_served_by[0] >= 1, "relief %d: by a relief thread (slot %d)", nblock, rl_served_by[0]);
    add(&rl_release, 1);
    for (int i = 0; i < 5000 && get(&rl_in) > 0; i++)
        rl_sleep_ms(1);
    /* The relief thread lets go once it sees the worker's batch over: wait for that (bounded,
     * 10 s) rather than a fixed 20 ms, which a loaded machine may spend before the relief thread
     * runs again; pinged before, the relief thread might still be the one to answer. */
    /* safety: relieved_by is only ever accessed atomically once the threads run. */
    for (int i = 0; i < 10000 && __atomic_load_n(&s->w[0].relieved_by, __ATOMIC_ACQUIRE) != -1; i++)
        rl_sleep_ms(1);
    ok(rl_ping(), "relief %d: served again after the calls returned", nblock);
    ok((rl_served_by[1]) == (0), "relief %d: by the worker itself (the relief let go)", nblock);
    add(&rl_second_done, 1);
    sched_join(s);
    struct sched_stats st;
    sched_get_stats(s, &st);
    ok((get(&rl_max_in)) == (nblock), "relief %d: at most %d calls ran at once", nblock, nblock);
    ok(st.reliefs >= (uint64_t)nblock, "relief %d: %llu reliefs", nblock,
       (unsigned long long)st.reliefs);
    ok(((int)st.relief_threads) == (nblock), "relief %d: relief threads started", nblock);
    sched_free(s);
    close(rl_sv[0]);
    close(rl_sv[1]);
}

static void test_relief(int nblock)
{
    test_relief_cfg(nblock, 0);
}

/* ---- relief where only sleep is relieved (relief_waiting_only) ----
 * One worker, two relief threads, relief_waiting_only set, as without a GIL. First the owner
 * offloads a call that computes (spins, never sleeping) for well past the time after which a
 * computing call is relieved otherwise (4 x SCHED_RELIEF_NS): no relief thread may start. Then
 * test_relief's sleeping calls, with the same setting, must still be relieved. */
static int rc_spin_done;

static void rc_spin_fn(void *arg)
{
    add(&rl_in, 1);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (volatile int i = 0; i < 1000; i++)
            ;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < 200);
    add(&rl_in, -1);
}

static int rc_owner(struct coro *co, void *arg)
{
    int rc = sched_offload(rc_spin_fn, NULL);
    add(&rc_spin_done, 1);
    return rc;
}

static void test_relief_computing(void)
{
    rl_in = rc_spin_done = 0;
    struct sched_config cfg = {.workers = 1, .relief = 2, .relief_waiting_only = 1};
    struct sched *s = NULL;
    ok((sched_new(&s, &cfg)) == (0), "relief, sleep only: a scheduler with 1 worker, 2 relief");
    sched_spawn(s, rc_owner, NULL);
    sched_start(s);
    for (int i = 0; i < 5000 && !get(&rc_spin_done); i++)
        rl_sleep_ms(1);
    ok(get(&rc_spin_done) == 1, "relief, sleep only: the computing call ended");
    sched_join(s);
    struct sched_stats st;
    sched_get_stats(s, &st);
    ok(st.reliefs == 0 && st.relief_threads == 0,
       "relief, sleep only: a call that computes for 200 ms is not relieved (%llu reliefs, "
       "%llu threads)",
       (unsigned long long)st.reliefs, (unsigned long long)st.relief_threads);
    sched_free(s);
}

/* ---- the monitor's look at a stuck thread's state (relief_waiting) ----
 * A thread that spins is running (or ready to run) and a thread asleep on a pipe is waiting,
 * look after look through the /proc file kept open at the first (the same descriptor each
 * time), and a thread that has exited counts as waiting (unknown). */
static int rw_tid, rw_stop;

static void *rw_spin(void *arg)
{
    /* safety: test flags shared with the main thread. */
    __atomic_store_n(&rw_tid, (int)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&rw_stop, __ATOMIC_SEQ_CST))
        ;
    return NULL;
}

static void *rw_sleep(void *arg)
{
    int *fds = arg;
    char c;
    /* safety: as above. */
    __atomic_store_n(&rw_tid, (int)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
    ssize_t n = read(fds[0], &c, 1); /* asleep until the main thread writes */
    (void)n;
    return NULL;
}

static void test_relief_waiting(void)
{
    struct sched_worker *x = calloc(1, sizeof(*x));
    x->stat_fd = -1;
    pthread_t t;
    rw_tid = rw_stop = 0;
    pthread_create(&t, NULL, rw_spin, NULL);
    while (!get(&rw_tid))
        rl_sleep_ms(1);
    __atomic_store_n(&x->tid, get(&rw_tid), __ATOMIC_RELAXED);
    int looks = 0;
    for (int i = 0; i < 20; i++)
        looks += relief_waiting(x) == 0;
    int fd = x->stat_fd;
    ok(looks == 20, "relief look: a spinning thread is running, %d looks of 20", looks);
    ok(fd >= 0 && x->stat_tid == get(&rw_tid), "relief look: its /proc file is kept open");
    __atomic_store_n(&rw_stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(t, NULL);
    /* pthread_join returns once the thread has cleared its tid, a step of its exit that comes
     * before the kernel takes it out of /proc: until then its state still reads running, for
     * as long as a loaded machine leaves the exiting thread off a CPU. Ask until it is gone
     * (bounded, 10 s). */
    int gone = 0;
    for (int i = 0; i < 10000 && !(gone = relief_waiting(x) == 1); i++)
        rl_sleep_ms(1);
    ok(gone, "relief look: a thread that has exited counts as waiting");

    int fds[2];
    ok(pipe(fds) == 0, "relief look: a pipe to sleep on");
    rw_tid = 0;
    pthread_create(&t, NULL, rw_sleep, fds);
    while (!get(&rw_tid))
        rl_sleep_ms(1);
    __atomic_store_n(&x->tid, get(&rw_tid), __ATOMIC_RELAXED);
    /* Into its read: the first look that finds it asleep (bounded, 10 s), not a fixed 20 ms,
     * which a loaded machine may spend before the new thread gets there. It stays asleep until
     * the main thread writes, so every look after that one must agree. */
    for (int i = 0; i < 10000 && relief_waiting(x) != 1; i++)
        rl_sleep_ms(1);
    looks = 0;
    for (int i = 0; i < 20; i++)
        looks += relief_waiting(x) == 1;
    ok(looks == 20, "relief look: a thread asleep in read is waiting, %d looks of 20", looks);
    ok(x->stat_fd >= 0 && x->stat_tid == get(&rw_tid),
       "relief look: the new thread's file replaced the old one");
    ssize_t n = write(fds[1], "x", 1);
    (void)n;
    pthread_join(t, NULL);
    close(fds[0]);
    close(fds[1]);
    close(x->stat_fd);
    free(x);
}

/* ---- relief: waits started on a relief thread outlive its own blocking ----
 * One worker, two relief threads. B and C park on fd waits on the worker; A blocks the worker in
 * a call, so a relief thread serves its home. Both fds become readable at once: the relief
 * thread wakes B and C and runs them. B starts a 20 ms sleep; C offloads a call that blocks
 * (until released, at most 10 s) on that same relief thread. B's sleep must end before the
 * release, served by whoever serves the worker's home (the second relief thread): parked on the
 * first relief thread instead, it waited for C's call to return. */
static int rh_a[2], rh_b[2];
static int rh_in, rh_release, rh_b_done, rh_b_ran_on = -1, rh_b_before_release = -1;
static int64_t rh_b_ms = -1;

static void rh_block_fn(void *arg)
{
    add(&rh_in, 1);
    for (int i = 0; i < 10000 && !get(&rh_release); i++)
        rl_sleep_ms(1);
    add(&rh_in, -1);
}

static int rh_sleeper(struct coro *co, void *arg)
{
    if (sched_wait_fd(rh_a[0], EPOLLIN, 5000000000LL) < 0)
        return -1;
    /* safety: a test value read after the join. */
    __atomic_store_n(&rh_b_ran_on, sched_worker_id(), __ATOMIC_SEQ_CST);
    uint64_t t0 = sched_clock_ns();
    sched_sleep_ns(20000000);
    int64_t ms = (int64_t)((sched_clock_ns() - t0) / 1000000);
    /* safety: as above. */
    __atomic_store_n(&rh_b_ms, ms, __ATOMIC_SEQ_CST);
    /* safety: as above. The calls block until released: the sleep did not wait for them. */
    __atomic_store_n(&rh_b_before_release, !get(&rh_release), __ATOMIC_SEQ_CST);
    add(&rh_b_done, 1);
    return 0;
}

static int rh_caller(struct coro *co, void *arg)
{
    if (sched_wait_fd(rh_b[0], EPOLLIN, 5000000000LL) < 0)
        return -1;
    return sched_offload(rh_block_fn, NULL) == 0 ? 0 : -1;
}

static int rh_blocker(struct coro *co, void *arg)
{
    return sched_offload(rh_block_fn, NULL) == 0 ? 0 : -1;
}

static void test_relief_home(void)
{
    struct sched_config cfg = {.workers = 1, .relief = 2};
    struct sched *s = NULL;
    ok((sched_new(&s, &cfg)) == (0), "relief home: a scheduler with 1 worker, 2 relief threads");
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, rh_a);
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, rh_b);
    sched_spawn(s, rh_sleeper, NULL);
    sched_spawn(s, rh_caller, NULL);
    sched_spawn(s, rh_blocker, NULL);
    sched_start(s);
    for (int i = 0; i < 5000 && get(&rh_in) < 1; i++)
        rl_sleep_ms(1);
    ok((get(&rh_in)) == (1), "relief home: the worker is stuck in a call");
    rl_sleep_ms(30); /* the monitor sends a relief thread within a few ms */
    ssize_t wa = write(rh_a[1], "x", 1), wb = write(rh_b[1], "x", 1);
    ok(wa == 1 && wb == 1, "relief home: both waits made ready at once");
    for (int i = 0; i < 8000 && !get(&rh_b_done); i++)
        rl_sleep_ms(1);
    ok((get(&rh_in)) == (2), "relief home: the second call blocks too (on the relief thread)");
    add(&rh_release, 1);
    sched_join(s);
    /* safety: read after the join. */
    int ran_on = __atomic_load_n(&rh_b_ran_on, __ATOMIC_SEQ_CST);
    int64_t ms = __atomic_load_n(&rh_b_ms, __ATOMIC_SEQ_CST);
    ok(ran_on >= 1, "relief home: the sleeper was woken on a relief thread (slot %d)", ran_on);
    /* The order, not the time, is the test: on a loaded machine a 20 ms sleep may end late,
     * but it must end while both calls still block (they block until released, up to 10 s). */
    ok(ms >= 20 && __atomic_load_n(&rh_b_before_release, __ATOMIC_SEQ_CST) == 1,
       "relief home: its 20 ms sleep ended in %lld ms, before the relief thread's call returned",
       (long long)ms);
    sched_free(s);
    close(rh_a[0]);
    close(rh_a[1]);
    close(rh_b[0]);
    close(rh_b[1]);
}

int main(void)
{
    test_config();
    run_yielders(1, 0, 0, 500);
    run_yielders(4, 0, 0, 2000);
    run_yielders(4, 4, 1, 2000);
    run_yielders(3, 2, 1, 500);
    test_sleep();
    test_idle_trim();
    test_wait_fd();
    test_io_flow();
    test_io_park_no_self_wake();
    test_io_out_on_demand();
    test_io_hop();
    test_worker_queued();
    test_offload();
    test_offload_bounded();
    test_callq();
    test_shared_queue(1);
    test_shared_queue(0);
    test_stop();
    test_signal();
    test_signal_stress();
    test_signal_stop();
    test_io_wait_signal();
    test_rescue();
    for (int round = 1; round <= 3; round++)
        test_rescue_after_idle(round);
    test_relief(1);
    test_relief(2);
    test_relief_computing();
    test_relief_waiting();
    test_relief_cfg(2, 1);
    test_relief_home();
    return done_testing();
}
