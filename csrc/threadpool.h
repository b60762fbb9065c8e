/* A persistent thread pool: started once per model, one pd_pool_run per forward step.
 * Inside a run, all threads execute the same task function and meet at pd_barrier between
 * dependent phases (ggml-style), so a whole forward step costs one wake-up, not one per op. */
#ifndef PD_THREADPOOL_H
#define PD_THREADPOOL_H

typedef struct pd_pool pd_pool;
typedef void (*pd_task_fn)(void *ctx, int ith, int nth);

pd_pool *pd_pool_new(int n_threads);
void pd_pool_free(pd_pool *p);
int pd_pool_size(const pd_pool *p);
/* Runs fn(ctx, ith, nth) on every thread (the caller is thread 0); returns when all are done. */
void pd_pool_run(pd_pool *p, pd_task_fn fn, void *ctx);
/* Inside a task: waits until every thread of the pool has reached it. */
void pd_barrier(pd_pool *p);

/* The [start, end) share of n items for thread ith of nth, in multiples of `align`. */
static inline void pd_split(int n, int ith, int nth, int align, int *start, int *end) {
    int units = (n + align - 1) / align;
    int per = units / nth, extra = units % nth;
    int u0 = ith * per + (ith < extra ? ith : extra);
    int u1 = u0 + per + (ith < extra ? 1 : 0);
    *start = u0 * align < n ? u0 * align : n;
    *end = u1 * align < n ? u1 * align : n;
}
#endif
