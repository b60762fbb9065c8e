/* AVX2 twin of the exp-sum in sampling.c (compiled with -mavx2 -mfma). */
#if defined(__AVX2__) && defined(__FMA__)
#include "exp_avx2.h"

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
#endif
