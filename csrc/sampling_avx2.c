/* AVX2 twin of the exp-sum in sampling.c (compiled with -mavx2 -mfma). */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* exp(x) for x <= 0 to ~2 ulp: 2^k * p(r) with x = k*ln2 + r, |r| <= ln2/2, a degree-6 polynomial.
 * Inputs below -87 flush to 0 (their share of a softmax sum is below float resolution anyway). */
static inline __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

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
