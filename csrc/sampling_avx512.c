/* AVX-512 twin of the exp-sum in sampling.c (compiled with -mavx512f -mavx512dq -mfma): the
 * same exp as exp_avx2.h (exp_poly.h's constants), 16 lanes at a time. */
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
#include "exp_poly.h"

static inline __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(PD_EXP_MIN);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(PD_EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(PD_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(PD_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(PD_EXP_P5);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PD_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PD_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PD_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PD_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PD_EXP_P0));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps((__mmask16)~under, p, _mm512_castsi512_ps(e));
}

double pd_sum_exp_avx512(const float *x, int n, float scale, float shift) {
    const __m512 vs = _mm512_set1_ps(scale), vsh = _mm512_set1_ps(shift);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_add_ps(a0, exp512(_mm512_mul_ps(vs, _mm512_sub_ps(_mm512_loadu_ps(x + i), vsh))));
        a1 = _mm512_add_ps(a1, exp512(_mm512_mul_ps(vs, _mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vsh))));
    }
    double s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < n; i += 16) {           /* the tail, masked */
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = exp512(_mm512_mul_ps(vs, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vsh)));
        s += _mm512_reduce_add_ps(_mm512_maskz_mov_ps(m, v));
    }
    return s;
}
#endif
