/* Persistent pthread pool. Workers spin briefly on a generation counter (a decode step is
 * ~1-20 ms, and the next one follows within microseconds), then sleep on a condition variable
 * so an idle or oversubscribed machine is not burned. Waits inside a step (the phases' ends)
 * spin, then yield, then nap (see backoff). */
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define pd_cpu_relax() _mm_pause()
#elif defined(__aarch64__)
/* ISB, not YIELD: YIELD is a no-op hint on most cores (a 2000-spin wait would last a couple of
 * microseconds), while an ISB drains the pipeline, some tens of cycles like x86's PAUSE, so
 * the spin budget below means about the same time on both (Rust's spin_loop does the same). */
#define pd_cpu_relax() __asm__ __volatile__("isb" ::: "memory")
#else
#define pd_cpu_relax() ((void)0)
#endif

#define IDLE_SPIN_NS 300000       /* a worker spins this long for the next step, then sleeps */
#define SPIN_BEFORE_YIELD 2000
#define YIELDS_BEFORE_NAP 32

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One round of a short wait inside a step. The awaited thread normally runs on another core and
 * is done within microseconds: spin. If it is not (more runnable threads than cores: other
 * processes, or more threads than cores), yielding alone turns into a storm of sched_yield
 * calls that starves it (seen: minutes-long stalls of the test suite on 2 cores), so after a
 * few yields the waiter naps, 10 us doubling to 0.64 ms, and gives the core away. */
static void backoff(int *spins) {
    int s = *spins < 1 << 30 ? ++*spins : *spins;
    if (s < SPIN_BEFORE_YIELD) { pd_cpu_relax(); return; }
    if (s < SPIN_BEFORE_YIELD + YIELDS_BEFORE_NAP) { sched_yield(); return; }
    int shift = s - SPIN_BEFORE_YIELD - YIELDS_BEFORE_NAP;
    struct timespec ts = { 0, 10000L << (shift < 6 ? shift : 6) };
    nanosleep(&ts, NULL);
}

struct pd_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int generation;     /* bumped once per run */
    atomic_int sleeping;       /* workers waiting on cv */
    atomic_int stop;
    atomic_int done;           /* workers finished with the current run */
    atomic_int refs;           /* models running their steps on it (a draft shares its target's) */
    atomic_int *finished;      /* per worker: the last generation it is through with (pd_pool_quiesce) */
    int n_active;              /* threads that run fn this run (the others only count as done) */
    pd_task_fn fn;
    void *ctx;
};

typedef struct { pd_pool *p; int ith; } worker_arg;

static void *worker_main(void *arg_) {
    worker_arg *arg = arg_;
    pd_pool *p = arg->p;
    int ith = arg->ith;
    free(arg);
    int seen = 0, idle = 0;   /* idle: left out of the last run (n_active), so sleep at once */
    for (;;) {
        int spins = 0, gen;
        uint64_t t0 = 0;
        while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (!idle) {
                pd_cpu_relax();
                if (++spins & 255) continue;          /* the clock every 256 pauses */
                if (!t0) { t0 = now_ns(); continue; }
                if (now_ns() - t0 < IDLE_SPIN_NS) continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleeping, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
            t0 = 0;
        }
        if (atomic_load(&p->stop)) break;
        seen = gen;
        idle = ith >= p->n_active;
        if (!idle) p->fn(p->ctx, ith, p->n_active);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel);
        atomic_store_explicit(&p->finished[ith], gen, memory_order_release);
    }
    return NULL;
}

pd_pool *pd_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    pd_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    atomic_init(&p->refs, 1);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    p->finished = calloc((size_t)n_threads, sizeof(atomic_int));
    if (!p->threads || !p->finished) { free(p->threads); free(p->finished); free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) { p->n = i; break; }
        a->p = p; a->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, a) != 0) { free(a); p->n = i; break; }
    }
    return p;
}

pd_pool *pd_pool_ref(pd_pool *p) {
    if (p) atomic_fetch_add(&p->refs, 1);
    return p;
}

void pd_pool_free(pd_pool *p) {
    if (!p || atomic_fetch_sub(&p->refs, 1) > 1) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free((void *)p->finished);
    free(p);
}

/* An async run's caller returns when its step's last phase has ended, while a worker may still
 * be on its way out of that step: in pd_phase_end or pd_chunk reading the phases, or copying the
 * step through its seqlock. The model's memory may be freed only once every worker is through
 * with the last run (or a later one): a draft shares its target's pool, so freeing either model
 * does not join the threads (seen under ASan: a worker in pd_phase_end on the freed phases). */
void pd_pool_quiesce(pd_pool *p) {
    if (!p) return;
    const int gen = atomic_load_explicit(&p->generation, memory_order_acquire);
    for (int i = 1; i < p->n; i++) {
        int spins = 0;   /* the difference, not <: the generation wraps after 2^31 runs */
        while ((int)((unsigned)atomic_load_explicit(&p->finished[i], memory_order_acquire) - (unsigned)gen) < 0)
            backoff(&spins);
    }
}

int pd_pool_size(const pd_pool *p) { return p->n; }

/* Hands fn to the workers (waking the ones asleep) and runs thread 0's share here. */
static void run_here_and_there(pd_pool *p, pd_task_fn fn, void *ctx, int n_active) {
    p->fn = fn;
    p->ctx = ctx;
    p->n_active = n_active > 0 && n_active < p->n ? n_active : p->n;
    atomic_fetch_add(&p->generation, 1);  /* seq_cst: pairs with the sleeping check */
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n_active);
}

void pd_pool_run(pd_pool *p, pd_task_fn fn, void *ctx) {
    if (p->n == 1) { fn(ctx, 0, 1); return; }
    atomic_store(&p->done, 0);
    run_here_and_there(p, fn, ctx, p->n);
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < p->n - 1) backoff(&spins);
}

void pd_pool_run_async(pd_pool *p, pd_task_fn fn, void *ctx, int n_active) {
    if (p->n == 1 || n_active == 1) { fn(ctx, 0, 1); return; }
    run_here_and_there(p, fn, ctx, n_active);
}

void pd_phases_reset(pd_phase *ph, int n, uint32_t epoch) {
    uint64_t e = (uint64_t)epoch << 32;
    for (int i = 0; i < n; i++) {
        atomic_store_explicit(&ph[i].next, e, memory_order_relaxed);
        atomic_store_explicit(&ph[i].done, e, memory_order_relaxed);
    }
    atomic_thread_fence(memory_order_seq_cst);
}

int pd_chunk(pd_worker *w, int n_chunks) {
    pd_phase *ph = &w->phases[w->idx];
    uint64_t cur = atomic_load_explicit(&ph->next, memory_order_relaxed);
    for (;;) {
        if ((uint32_t)(cur >> 32) != w->epoch || (int)(uint32_t)cur >= n_chunks) {
            if (w->pending) atomic_fetch_add_explicit(&ph->done, (uint64_t)w->pending, memory_order_release);
            w->pending = 0;
            return -1;
        }
        if (atomic_compare_exchange_weak_explicit(&ph->next, &cur, cur + 1, memory_order_acq_rel,
                                                  memory_order_relaxed))
            return (int)(uint32_t)cur;
    }
}

void pd_chunk_done(pd_worker *w) { w->pending++; }

int pd_phase_end(pd_worker *w, int n_chunks) {
    pd_phase *ph = &w->phases[w->idx++];
    uint64_t want = ((uint64_t)w->epoch << 32) | (uint32_t)n_chunks;
    int spins = 0;
    for (;;) {
        uint64_t d = atomic_load_explicit(&ph->done, memory_order_acquire);
        if (d == want) return 0;
        if ((uint32_t)(d >> 32) != w->epoch) return -1;
        backoff(&spins);
    }
}
