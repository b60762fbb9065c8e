/* The AVX-512 table's kernels of the codebook formats IQ4_NL and MXFP4 x pd_q8 (formats.h;
 * compiled with x86/avx512.c's flags). x86/avx512.c's legacy-format tile, for signed quants: two
 * 32-value blocks per 512-bit register, the codebook + 128 looked up from the nibbles by one
 * vpshufb (the table in every 128-bit lane), one vpdpbusd of those unsigned bytes against both
 * activation blocks, the offset 128 removed exactly by starting from -128 * (sums of 4
 * activations), as Q8_0's; then per row, column and block pair one convert and one fmadd with
 * dw*dx (f16 d, or MXFP4's 2^(e - 128)). Each block's integer dot is exact: the results differ
 * from the scalar table's only in float summation order (the legacy formats' tolerance). A row's
 * arithmetic does not depend on its tile. IQ4_XS (pd_q8k) is in x86/avx512_kquant.c. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#include "kernels/x86/avx512.h"

/* Blocks at a and b as 64 unsigned bytes (codebook + 128 of their nibbles), a's 32 values low:
 * 16 nibble bytes to both 128-bit lanes of a half; the upper lane takes the high nibbles. */
AI __m512i cb_unpack2(int T, const char *a, const char *b) {
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a + cb_qs_off(T))));
    v = _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128((const __m128i *)(b + cb_qs_off(T))));
    v = _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0f));
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm256_castsi256_si128(codebook256(T, 1))), v);
}

/* One step of the tile: blocks b and b+1 (two) or block b alone (!two: block b+1's lanes get
 * zero activations and scales). */
AI void step_cb(int T, int R, int C, int two, const char *wa, size_t ws, const char *x, size_t xs, int b,
                __m512 acc[4][QCMAX], const char *pf) {
    const char *wb = two ? wa + blk_bytes(T) : wa;
    const __m256 dw = _mm256_set_m128(two ? load_scale4(T, wb, ws, R) : _mm_setzero_ps(), load_scale4(T, wa, ws, R));
    __m512i xq[QCMAX], seed[QCMAX];
    __m256 dd[QCMAX];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        const pd_q8 *xa = (const pd_q8 *)(x + c * xs) + b, *xb = xa + 1;
        const __m256i qa = _mm256_loadu_si256((const __m256i *)xa->qs);
        xq[c] = two ? _mm512_inserti64x4(_mm512_castsi256_si512(qa), _mm256_loadu_si256((const __m256i *)xb->qs), 1)
                    : _mm512_zextsi256_si512(qa);
        seed[c] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                   _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), xq[c]));
        const __m256 dx = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(xa->d)),
                                               _mm_set1_ps(two ? xb->d : 0.0f), 1);
        dd[c] = _mm256_mul_ps(dw, dx);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        _mm_prefetch(pf + r * ws, _MM_HINT_T0);
        const __m512i u = cb_unpack2(T, wa + r * ws, wb + r * ws);
        const __m512i idx = _mm512_setr_epi32(r, r, r, r, r, r, r, r, r + 4, r + 4, r + 4, r + 4,
                                              r + 4, r + 4, r + 4, r + 4);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const __m512i is = _mm512_dpbusd_epi32(seed[c], u, xq[c]);
            const __m512 sc = _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(dd[c]));
            acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), sc, acc[r][c]);
        }
    }
}

/* Y[c][r] for an R x C tile, over nb blocks. w: first row; x: first column. */
AI void tile_q(int T, int R, int C, int nb, const char *w, size_t ws, const char *x, size_t xs,
               float *y, size_t ys) {
    const size_t bb = blk_bytes(T);
    __m512 acc[4][QCMAX];
#pragma GCC unroll 16
    for (int i = 0; i < R * C; i++) acc[i / C][i % C] = _mm512_setzero_ps();
    pd_pf pf = pf_init(w, nb * bb, ws);
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        step_cb(T, R, C, 1, w + b * bb, ws, x, xs, b, acc, pf.p);
        pf_advance(&pf, 2 * bb);
    }
    if (b < nb) step_cb(T, R, C, 0, w + b * bb, ws, x, xs, b, acc, pf.p);
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) y[c * ys + r] = hsum512(acc[r][c]);
}

PD_Q_MATMUL(matmul_iq4_nl, T_IQ4_NL)   /* over tile_q (tiles.h) */
PD_Q_MATMUL(matmul_mxfp4, T_MXFP4)

/* For the table in x86/avx512.c. */
extern __typeof__(matmul_iq4_nl) pd_avx512_matmul_iq4_nl __attribute__((alias("matmul_iq4_nl")));
extern __typeof__(matmul_mxfp4) pd_avx512_matmul_mxfp4 __attribute__((alias("matmul_mxfp4")));
#endif
