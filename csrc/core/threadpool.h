/* A persistent thread pool: started once per model, one run per forward step. Inside a run,
 * all threads execute the same task function and share each phase's work in chunks (below),
 * so a whole forward step costs one wake-up, not one per op. */
#ifndef PD_THREADPOOL_H
#define PD_THREADPOOL_H

typedef struct pd_pool pd_pool;
typedef void (*pd_task_fn)(void *ctx, int ith, int nth);

pd_pool *pd_pool_new(int n_threads);
/* Drops one reference; the last one stops the threads and frees the pool. */
void pd_pool_free(pd_pool *p);
/* One more reference (a second model running its steps on this pool); returns p. */
pd_pool *pd_pool_ref(pd_pool *p);
int pd_pool_size(const pd_pool *p);
/* Waits until every worker is through with the latest run (an async one may outlive its
 * caller's return by a few instructions): before freeing anything a run reads. */
void pd_pool_quiesce(pd_pool *p);
/* Runs fn(ctx, ith, nth) on every thread (the caller is thread 0); returns when all are done
 * (the bandwidth probe; a forward step uses pd_pool_run_async). */
void pd_pool_run(pd_pool *p, pd_task_fn fn, void *ctx);

/* Dynamic work sharing inside a step. A phase is n chunks taken by whichever threads come; a
 * thread that runs out of chunks waits only for the chunks still in flight, never for a thread
 * that has not arrived, so a descheduled thread (oversubscription) costs at most its own chunk.
 * Counters carry the step's epoch: a thread that lags behind a finished step sees a newer epoch
 * and drops out instead of touching the new step's work. */
#include <stdint.h>
#include <stdatomic.h>

typedef struct {
    _Atomic uint64_t next;   /* epoch << 32 | next chunk to hand out */
    _Atomic uint64_t done;   /* epoch << 32 | chunks finished */
    char pad[48];            /* one cache line per phase */
} pd_phase;

/* pending: chunks this thread finished in the current phase and not yet counted in done; they
 * are added at once when it finds no chunk left (one atomic per thread and phase, not one per
 * chunk). The phase cannot end before that add, so the epoch cannot change in between. */
typedef struct { pd_phase *phases; uint32_t epoch; int idx; int ith; int pending; int nth; } pd_worker;
/* nth: the threads running the step (forward.c takes it from the step, step_ctx.nth). */

/* Resets phases [0, n) for a new step with this epoch (before the run). */
void pd_phases_reset(pd_phase *phases, int n, uint32_t epoch);
/* The next chunk of the current phase, or -1 when none are left (or the step is over). */
int pd_chunk(pd_worker *w, int n_chunks);
void pd_chunk_done(pd_worker *w);
/* Waits until all n_chunks of the current phase are done and moves to the next phase.
 * Returns 0, or -1 if this thread lags behind a step that already ended (it must return). */
int pd_phase_end(pd_worker *w, int n_chunks);
/* Runs fn on threads 0..n_active-1 (n_active <= 0 or past the pool: all) like pd_pool_run but
 * returns as soon as the caller's own fn returns: the step's phases tell when the work is done,
 * late workers drop out by epoch. The phases share work dynamically, so any number of
 * participants computes the same result. */
void pd_pool_run_async(pd_pool *p, pd_task_fn fn, void *ctx, int n_active);

#endif
