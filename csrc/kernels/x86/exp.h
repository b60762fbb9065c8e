/* A vector exp for softmax-like sums, shared by kernels/x86/avx2.c and kernels/x86/avx2.c (both
 * compiled with -mavx2 -mfma). */
#ifndef PD_EXP_AVX2_H
#define PD_EXP_AVX2_H
#include <immintrin.h>
#include "kernels/exp_poly.h"

/* exp(x) for x <= 0 to ~2 ulp (see exp_poly.h). */
static inline __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(PD_EXP_MIN);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(PD_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(PD_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(PD_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(PD_EXP_P5);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PD_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PD_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PD_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PD_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PD_EXP_P0));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}
#endif
