/* sched_timer.c.h: per-worker timers: each worker's binary min-heap of struct sched_timer,
 * ordered by deadline, under that worker's loop lock; sched_timer_arm/cancel, the firing of due
 * timers by the loop step (w_run_timers), and the cached clock sched_now_ns().
 *
 * Part of sched.c's translation unit, not compiled alone: sched.c includes it after its types,
 * loop locks and queues, and it uses them. */

/* ---- timers ---- */

static void heap_set(struct sched_worker *w, size_t i, struct sched_timer *t)
{
    w->heap[i] = t;
    t->heap_index = (int64_t)i + 1;
}

static void heap_up(struct sched_worker *w, size_t i)
{
    struct sched_timer *t = w->heap[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (w->heap[parent]->deadline <= t->deadline)
            break;
        heap_set(w, i, w->heap[parent]);
        i = parent;
    }
    heap_set(w, i, t);
}

static void heap_down(struct sched_worker *w, size_t i)
{
    struct sched_timer *t = w->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        uint64_t best = t->deadline;
        if (l < w->heap_len && w->heap[l]->deadline < best) {
            m = l;
            best = w->heap[l]->deadline;
        }
        if (r < w->heap_len && w->heap[r]->deadline < best)
            m = r;
        if (m == i)
            break;
        heap_set(w, i, w->heap[m]);
        i = m;
    }
    heap_set(w, i, t);
}

static void heap_remove(struct sched_worker *w, struct sched_timer *t)
{
    size_t i = (size_t)(t->heap_index - 1);
    t->heap_index = 0;
    w->heap_len--;
    if (i == w->heap_len)
        return;
    heap_set(w, i, w->heap[w->heap_len]);
    /* The moved timer may belong further down or further up; one of these is a no-op. */
    heap_down(w, i);
    heap_up(w, i);
}

static void timer_arm_on(struct sched_worker *w, struct sched_timer *t, uint64_t deadline)
{
    if (t->heap_index)
        heap_remove(w, t);
    if (UNLIKELY(w->heap_len == w->heap_cap)) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        struct sched_timer **h = realloc(w->heap, cap * sizeof(*h));
        if (UNLIKELY(!h))
            abort(); /* a timer that silently never fires would be worse */
        w->heap = h;
        w->heap_cap = cap;
    }
    t->deadline = deadline;
    t->owner = (int)w->id;
    w->heap[w->heap_len] = t;
    t->heap_index = (int64_t)w->heap_len + 1;
    w->heap_len++;
    heap_up(w, w->heap_len - 1);
}

void sched_timer_arm(struct sched_timer *t, uint64_t deadline_ns)
{
    struct sched_worker *w = sched_self();
    if (UNLIKELY(!w))
        abort(); /* contract: worker only */
    if (w->held >= 0) {
        timer_arm_on(&w->s->w[w->held], t, deadline_ns);
        return;
    }
    /* A coroutine outside any home section: arm on the home of the thread running it (its
     * worker; for a relief thread, the worker it relieves), under that home's lock. */
    if (UNLIKELY(!w->current || home_enter(&w, own_home(w)) < 0))
        abort(); /* contract: worker only; -ECANCELED cannot happen for the own worker */
    timer_arm_on(&w->s->w[w->held], t, deadline_ns);
    loop_unlock(w);
}

void sched_timer_cancel(struct sched_timer *t)
{
    struct sched_worker *w = sched_self();
    if (!t->heap_index || !w)
        return;
    /* Contract: the caller holds the owner's loop lock (callbacks, home sections). */
    heap_remove(&w->s->w[t->owner], t);
}

/* Fire home's due timers (by self's clock), with home's loop lock held. Returns how many fired. */
static unsigned w_run_timers(struct sched_worker *self, struct sched_worker *home)
{
    unsigned fired = 0;
    while (home->heap_len > 0 && home->heap[0]->deadline <= self->now) {
        struct sched_timer *t = home->heap[0];
        heap_remove(home, t);
        t->cb(t);
        fired++;
    }
    return fired;
}

uint64_t sched_now_ns(void)
{
    struct sched_worker *w = sched_self();
    return w ? w->now : sched_clock_ns();
}

int sched_worker_now(uint64_t *now_ns)
{
    struct sched_worker *w = sched_self();
    *now_ns = w ? w->now : sched_clock_ns();
    return w ? (int)w->id : -1;
}
