/* AVX2 twins of sampling.c's exp-sum and top-k candidate collection (compiled with -mavx2 -mfma). */
#if defined(__AVX2__) && defined(__FMA__)
#include "exp_avx2.h"
#include <stdint.h>

double pd_sum_exp_avx2(const float *x, int n, float scale, float shift) {
    __m256 vs = _mm256_set1_ps(scale), vsh = _mm256_set1_ps(shift);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_ps(a0, exp256(_mm256_mul_ps(vs, _mm256_sub_ps(_mm256_loadu_ps(x + i), vsh))));
        a1 = _mm256_add_ps(a1, exp256(_mm256_mul_ps(vs, _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vsh))));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(a0, a1));
    double s = 0.0;
    for (int j = 0; j < 8; j++) s += lanes[j];
    for (; i < n; i++) {
        __m256 t = exp256(_mm256_set1_ps(scale * (x[i] - shift)));
        s += _mm256_cvtss_f32(t);
    }
    return s;
}

/* The ids i (ascending) with x[i] > t, written to out; returns how many. */
int pd_collect_above_avx2(const float *x, int n, float t, int32_t *out) {
    const __m256 vt = _mm256_set1_ps(t);
    int nc = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        const int m0 = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vt, _CMP_GT_OQ));
        const int m1 = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), vt, _CMP_GT_OQ));
        const int m2 = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + 16), vt, _CMP_GT_OQ));
        const int m3 = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + 24), vt, _CMP_GT_OQ));
        unsigned m = (unsigned)m0 | (unsigned)m1 << 8 | (unsigned)m2 << 16 | (unsigned)m3 << 24;
        while (m) {                           /* the set bits, lowest first */
            out[nc++] = i + __builtin_ctz(m);
            m &= m - 1;
        }
    }
    for (; i < n; i++) if (x[i] > t) out[nc++] = i;
    return nc;
}
#endif
