/* sched_inject.c.h: the inject queue, shared by all workers: a mutex-protected FIFO of
 * coroutines that overflowed a worker's run queue, and beside it the spawn records of threads
 * that are not workers. Workers take a fair share from it when they look for work (w_find_work,
 * every 61st tick of w_loop, and while draining).
 *
 * Part of sched.c's translation unit, not compiled alone: sched.c includes it after its types
 * and helpers, and it uses them (struct sched, struct sched_worker, stat_inc, the run queue). */

/* Spawns from threads that are not workers are queued as 16-byte records, not coroutines: the
 * worker that takes a record creates the coroutine from its own pool, whose structs are hot
 * (finished coroutines give theirs back there). 500,000 spawns before sched_run() thus touch
 * 8 MB of records instead of ~56 MB of fresh coroutine structs, and fresh memory is what costs:
 * the kernel zeroes every new page. Blocks of 254 records make a 4 KiB allocation. */
struct sched_spawn_rec {
    coro_fn fn;
    void *arg;
};

#define SCHED_SPAWN_BLOCK 254u

struct sched_spawn_block {
    struct sched_spawn_block *next;
    uint32_t head, tail;
    struct sched_spawn_rec rec[SCHED_SPAWN_BLOCK];
};

/* ---- inject queue ---- */

static void inject_push_batch(struct sched *s, struct coro *first, struct coro *last, unsigned n)
{
    pthread_mutex_lock(&s->inject_lock);
    coro_sched_node(last)->next = NULL;
    if (s->inj_tail)
        coro_sched_node(s->inj_tail)->next = first;
    else
        s->inj_head = first;
    s->inj_tail = last;
    /* safety: written under the lock; lock-free readers only use it as a hint, and the parker's
     * re-check reads it after its seq_cst fence. */
    __atomic_store_n(&s->inj_len, s->inj_len + (long)n, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s->inject_lock);
}

/* Take a batch from the inject queue: one to run now, the rest into w's run queue. */
static struct coro *inject_take(struct sched_worker *w, int all)
{
    struct sched *s = w->s;
    /* safety: a hint; a stale zero only delays the batch until the next look. */
    if (__atomic_load_n(&s->inj_len, __ATOMIC_RELAXED) == 0)
        return NULL;
    pthread_mutex_lock(&s->inject_lock);
    long len = s->inj_len;
    if (len == 0) {
        pthread_mutex_unlock(&s->inject_lock);
        return NULL;
    }
    /* Go's globrunqget: a fair share, capped at half the ring so the push never overflows. */
    long want = all ? len : len / (long)s->n + 1;
    long room = (long)runq_free_slots(&w->rq);
    if (want > (long)runq_capacity(&w->rq) / 2)
        want = (long)runq_capacity(&w->rq) / 2;
    if (want > room)
        want = room > 0 ? room : 1;
    if (want > len)
        want = len;
    /* Coroutines first (overflow from run queues: they may be mid-life), then spawn records,
     * copied out so that the coroutines are created after the lock is released. */
    struct coro *ret = NULL;
    struct coro *f, *l;
    unsigned n;
    long got = 0;
    while (got < want && s->inj_head) {
        struct coro *c = s->inj_head;
        s->inj_head = coro_sched_node(c)->next;
        if (!s->inj_head)
            s->inj_tail = NULL;
        if (ret)
            runq_push(&w->rq, c, &f, &l, &n); /* room was checked: never overflows */
        else
            ret = c;
        got++;
    }
    struct sched_spawn_rec recs[128];
    unsigned nrec = 0;
    while (got < want && nrec < N_ELEMENTS(recs)) {
        struct sched_spawn_block *b = s->sp_head;
        if (!b || b->head == b->tail)
            break;
        recs[nrec++] = b->rec[b->head++];
        got++;
        if (b->head == b->tail) {
            if (b == s->sp_tail) {
                b->head = b->tail = 0; /* the only block: reuse it in place */
            } else {
                s->sp_head = b->next;
                if (!s->sp_spare)
                    s->sp_spare = b;
                else
                    free(b);
            }
        }
    }
    /* safety: see inject_push_batch. */
    __atomic_store_n(&s->inj_len, len - got, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s->inject_lock);
    for (unsigned i = 0; i < nrec; i++) {
        struct coro *co = coro_new(w->pool, recs[i].fn, recs[i].arg);
        if (UNLIKELY(!co)) {
            /* Out of memory for a 100-byte struct: the spawn is lost. Count it as finished so
             * that batch mode still ends, and say so once. */
            static int warned;
            /* safety: exchange makes exactly one thread print. */
            if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
                static const char msg[] = "cyserve: out of memory creating a spawned coroutine; "
                                          "spawns are being dropped\n";
                ssize_t r = write(2, msg, sizeof(msg) - 1);
                (void)r;
            }
            w->finished_pending++;
            stat_inc(&w->st_finished);
            continue;
        }
        if (ret)
            runq_push(&w->rq, co, &f, &l, &n); /* room was checked: never overflows */
        else
            ret = co;
    }
    return ret;
}
