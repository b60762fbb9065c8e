/* AVX-512 twins of sampling.c's vocabulary-wide passes (compiled with -mavx512f -mavx512dq
 * -mfma): the exp-sum (the same exp as exp_avx2.h, exp_poly.h's constants, 16 lanes at a time)
 * and top-k's candidate collection. */
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
#include <stdint.h>
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

/* The ids i (ascending) with x[i] > t, written to out (room for n + 16: whole vectors are
 * stored); returns how many. The compress goes to a register, then a plain store: a compress
 * straight to memory is microcoded and slow on AMD's Zen 4. */
int pd_collect_above_avx512(const float *x, int n, float t, int32_t *out) {
    const __m512 vt = _mm512_set1_ps(t);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int nc = 0, i = 0;
    for (; i + 64 <= n; i += 64) {
        const __mmask16 m0 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), vt, _CMP_GT_OQ);
        const __mmask16 m1 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i + 16), vt, _CMP_GT_OQ);
        const __mmask16 m2 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i + 32), vt, _CMP_GT_OQ);
        const __mmask16 m3 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i + 48), vt, _CMP_GT_OQ);
        if (!(m0 | m1 | m2 | m3)) continue;      /* the common case */
        const __mmask16 ms[4] = { m0, m1, m2, m3 };
        for (int j = 0; j < 4; j++) {
            if (!ms[j]) continue;
            const __m512i id = _mm512_add_epi32(iota, _mm512_set1_epi32(i + 16 * j));
            _mm512_storeu_si512((void *)(out + nc), _mm512_maskz_compress_epi32(ms[j], id));
            nc += __builtin_popcount(ms[j]);
        }
    }
    for (; i < n; i++) if (x[i] > t) out[nc++] = i;
    return nc;
}
#endif
