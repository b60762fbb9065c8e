/* A read-bandwidth probe: the ceiling decode speed is measured against (pydecode bench
 * --bandwidth). Each thread streams its share of one buffer; bytes / wall time of the slowest.
 * The buffer is huge-page memory, as the repacked weights are (core/hugemem.c): the ceiling is
 * the best stream this machine gives, not the 4 KiB-page one. */
#include "pydecode.h"
#include "core/threadpool.h"
#include "core/hugemem.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { const uint64_t *buf; size_t n; uint64_t sink[64]; } probe_ctx;

static void probe_task(void *ctx_, int ith, int nth) {
    probe_ctx *c = ctx_;
    size_t per = c->n / (size_t)nth, i0 = per * (size_t)ith, i1 = ith == nth - 1 ? c->n : i0 + per;
    /* 8 independent accumulators: the loop is bound by loads, not by an add chain */
    uint64_t a[8] = {0};
    for (size_t i = i0; i + 8 <= i1; i += 8)
        for (int j = 0; j < 8; j++) a[j] += c->buf[i + j];
    uint64_t s = 0;
    for (int j = 0; j < 8; j++) s += a[j];
    c->sink[(ith % 8) * 8] = s;   /* keep the loads alive; padded against false sharing */
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double pd_probe_read_bandwidth(size_t bytes, int n_threads, int reps) {
    if (bytes < 4096 || n_threads < 1 || reps < 1) return -1.0;
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *buf = pd_huge_alloc(n * sizeof(uint64_t));
    if (!buf) return -1.0;
    for (size_t i = 0; i < n; i++) buf[i] = i;   /* touch every page */
    pd_pool *pool = pd_pool_new(n_threads);
    if (!pool) { pd_huge_free(buf, n * sizeof(uint64_t)); return -1.0; }
    probe_ctx c = { buf, n, {0} };
    pd_pool_run(pool, probe_task, &c);          /* warm-up */
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        pd_pool_run(pool, probe_task, &c);
        double gbs = (double)(n * sizeof(uint64_t)) / (now_s() - t) / 1e9;
        if (gbs > best) best = gbs;
    }
    pd_pool_free(pool);
    pd_huge_free(buf, n * sizeof(uint64_t));
    return best;
}
