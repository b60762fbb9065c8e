/* Vocabulary-wide sampling primitives, beside the core: Python keeps the policy (sampling.py),
 * these keep a step's sampling cost far below the forward pass even on a 262k-token vocabulary.
 * Portable C; the exp-sum has an AVX2 twin in sampling_avx2.c (picked at run time). */
#include "pydecode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(PD_HAVE_AVX2)
double pd_sum_exp_avx2(const float *x, int n, float scale, float shift);
#endif

float pd_max_f32(const float *x, int n) {
    /* 8 independent lanes so the compiler vectorizes without -ffast-math */
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float r = -INFINITY;
    for (int j = 0; j < 8; j++) r = m[j] > r ? m[j] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static double sum_exp_scalar(const float *x, int n, float scale, float shift) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += expf(scale * (x[i] - shift));
    return s;
}

double pd_sum_exp(const char *isa, const float *x, int n, float scale, float shift) {
#if defined(PD_HAVE_AVX2)
    if (!(isa && strcmp(isa, "scalar") == 0) && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return pd_sum_exp_avx2(x, n, scale, shift);
#endif
    (void)isa;
    return sum_exp_scalar(x, n, scale, shift);
}

/* min-heap of (value, id) on the k best seen so far; ties keep the lower id (deterministic) */
static int worse(float va, int32_t ia, float vb, int32_t ib) { return va < vb || (va == vb && ia > ib); }

static void sift_down(float *v, int32_t *id, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, s = i;
        if (l < k && worse(v[l], id[l], v[s], id[s])) s = l;
        if (r < k && worse(v[r], id[r], v[s], id[s])) s = r;
        if (s == i) return;
        float tv = v[i]; v[i] = v[s]; v[s] = tv;
        int32_t ti = id[i]; id[i] = id[s]; id[s] = ti;
        i = s;
    }
}

/* The k largest logits, sorted descending (ids and values). Returns how many (min(k, n)).
 * One pass; an element is only looked at twice when it beats the current k-th best. */
int pd_top_k(const float *x, int n, int k, int32_t *ids, float *vals) {
    if (!x || !ids || !vals || n <= 0 || k <= 0) return 0;
    if (k > n) k = n;
    for (int i = 0; i < k; i++) { vals[i] = x[i]; ids[i] = i; }
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(vals, ids, k, i);
    float floor = vals[0];
    for (int i = k; i < n; i++) {
        if (x[i] <= floor) continue;       /* the common case: a single compare */
        vals[0] = x[i]; ids[0] = i;
        sift_down(vals, ids, k, 0);
        floor = vals[0];
    }
    /* heap -> descending order: repeatedly move the minimum to the end */
    for (int end = k - 1; end > 0; end--) {
        float tv = vals[0]; vals[0] = vals[end]; vals[end] = tv;
        int32_t ti = ids[0]; ids[0] = ids[end]; ids[end] = ti;
        sift_down(vals, ids, end, 0);
    }
    return k;
}

/* The first index i (in vocabulary order) where the running sum of exp(scale*(x - shift)) over
 * the ids NOT in `skip` (sorted ascending, n_skip of them) reaches target; -1 if never.
 * Used for the rare draw that lands in the tail outside the candidate list. */
int pd_draw_tail(const float *x, int n, float scale, float shift, const int32_t *skip, int n_skip,
                 double target) {
    double s = 0.0;
    int j = 0;
    for (int i = 0; i < n; i++) {
        if (j < n_skip && skip[j] == i) { j++; continue; }
        s += expf(scale * (x[i] - shift));
        if (s >= target) return i;
    }
    return -1;
}
