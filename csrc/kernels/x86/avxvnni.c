/* AVX2 + AVX-VNNI kernels for CPUs with the 256-bit VEX VNNI instructions but no AVX-512
 * (Intel Alder Lake and later client cores; this file alone is compiled with -mavxvnni -mavx2
 * -mfma -mf16c).
 *
 * The block formats are kernels/x86/avx2.c's with VNNI for the integer dots:
 *  - legacy formats x pd_q8: the weight quants of a block are unpacked to 32 UNSIGNED bytes u
 *    (q4: nibbles, q5: 0..31, q8_0: w ^ 0x80 = w + 128) and one vpdpbusd against the activation
 *    bytes gives 8 int32 sums (it replaces vpmaddubsw + vpmaddwd, and q8_0's sign trick). The
 *    offsets (q4_0 8, q5_0 16, q8_0 128) are removed exactly: each row's vpdpbusd starts from
 *    -off * (sums of 4 activations), computed once per column and block.
 *  - K-quants x pd_q8k: vpmaddubsw pair sums, then vpdpwssd multiplies them by the int16
 *    sub-block scales and accumulates (it replaces vpmaddwd + vpaddd).
 * Activation quantization, float formats and the attention helpers gain nothing from VNNI:
 * this table points at the AVX2 functions (exported by kernels/x86/avx2.c as pd_avx2_*), and so
 * does Q8_0 for one column (decode; see matmul_q8_0).
 * Tiling, prefetch and reductions as in kernels/x86/avx2.c; each row's result is computed the same
 * way whatever tile it falls in.
 */
#if (defined(__AVXVNNI__) || (defined(PD_AVXVNNI_EVEX) && defined(__AVX512VNNI__) && defined(__AVX512VL__))) && \
    defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/kernels.h"
#if defined(PD_AVXVNNI_EVEX)   /* x86/avxvnni_evex.c: the same logic, EVEX encodings */
#define _mm256_dpbusd_avx_epi32 _mm256_dpbusd_epi32
#define _mm256_dpwssd_avx_epi32 _mm256_dpwssd_epi32
#define PD_AVXVNNI_TABLE pd_kernels_avxvnni_evex
#define PD_AVXVNNI_NAME "avxvnni_evex"
#else
#define PD_AVXVNNI_TABLE pd_kernels_avxvnni
#define PD_AVXVNNI_NAME "avxvnni"
#endif
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#pragma GCC optimize("fp-contract=off")

#ifndef QCMAX
#define QCMAX 4
#endif
#ifndef KCMAX
#define KCMAX 4
#endif
#ifndef PF_DIST
#define PF_DIST 4096
#endif
#include "kernels/x86/common.h"

#include "kernels/x86/avx2_exports.h"
#include "kernels/x86/tiles.h"

/* ---------------------------------------------------------------- block formats x pd_q8 */

AI int offset(int T) { return T == T_Q4_0 ? 8 : T == T_Q5_0 ? 16 : signed_quants(T) ? 128 : 0; }

/* A block's 32 quants as unsigned bytes (the signed quant is u - offset(T)); the codebook
 * formats look their nibbles up in the table + 128. */
AI __m256i unpack(int T, const char *blk) {
    switch (T) {
    case T_IQ4_NL: case T_MXFP4: return codebook_lookup(T, blk, 1);
    case T_Q4_0: return nibbles(blk + 2);
    case T_Q4_1: return nibbles(blk + 4);
    case T_Q5_0: return _mm256_or_si256(nibbles(blk + 6), fifth_bits(blk + 2));
    case T_Q5_1: return _mm256_or_si256(nibbles(blk + 8), fifth_bits(blk + 4));
    default:     return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)),
                                         _mm256_set1_epi8((char)0x80));
    }
}

AI void tile_q(int T, int R, int C, int nb, const char *w, size_t ws, const char *x, size_t xs,
               float *y, size_t ys) {
    const size_t bb = blk_bytes(T);
    __m256 acc[4][QCMAX];
    __m128 macc[QCMAX];   /* min term m*s of formats with a minimum; lane r = row r */
#pragma GCC unroll 16
    for (int i = 0; i < R * C; i++) acc[i / C][i % C] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) macc[c] = _mm_setzero_ps();

    pd_pf pf = pf_init(w, nb * bb, ws);
    for (int b = 0; b < nb; b++, pf_advance(&pf, bb)) {
        const char *wb = w + b * bb;
        const __m128 dw = load_scale4(T, wb, ws, R);
        const __m128 mw = has_min(T) ? load_h4(wb + 2, ws, R) : _mm_setzero_ps();
        __m256i xq[QCMAX], seed[QCMAX];
        __m256 dd[QCMAX];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const pd_q8 *xb = (const pd_q8 *)(x + c * xs) + b;
            xq[c] = _mm256_loadu_si256((const __m256i *)xb->qs);
            if (offset(T))
                seed[c] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                           _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(),
                                                                   _mm256_set1_epi8((char)offset(T)), xq[c]));
            const __m128 d = _mm_mul_ps(dw, _mm_set1_ps(xb->d));
            dd[c] = _mm256_set_m128(d, d);
            if (has_min(T)) macc[c] = _mm_fmadd_ps(mw, _mm_set1_ps(xb->s), macc[c]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm_prefetch(pf.p + r * ws, _MM_HINT_T0);
            const __m256i u = unpack(T, wb + r * ws);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m256i is = _mm256_dpbusd_avx_epi32(offset(T) ? seed[c] : _mm256_setzero_si256(), u, xq[c]);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), bcast_lane(dd[c], r), acc[r][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        float m[4];
        _mm_storeu_ps(m, macc[c]);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) y[c * ys + r] = hsum(acc[r][c]) + m[r];
    }
}

PD_Q_MATMUL(matmul_q4_0, T_Q4_0)   /* over tile_q (tiles.h) */
PD_Q_MATMUL(matmul_q4_1, T_Q4_1)
PD_Q_MATMUL(matmul_q5_0, T_Q5_0)
PD_Q_MATMUL(matmul_q5_1, T_Q5_1)
PD_Q_MATMUL(matmul_q8_0_tiles, T_Q8_0)
PD_Q_MATMUL(matmul_iq4_nl, T_IQ4_NL)   /* the codebook formats: Q8_0's path on looked-up bytes */
PD_Q_MATMUL(matmul_mxfp4, T_MXFP4)

/* Q8_0 decode (one column) is memory-bound with the AVX2 loop already; this one (+15% from L3)
 * streamed ~10% slower from DRAM where it was measured (a Zen 5: faster loops on the byte-heavy
 * formats lost DRAM throughput there, see kernels/x86/avx512.c), so one column goes to AVX2's.
 * The tiles above compute exactly its arithmetic (the same 8 int32 sums of 4 products per
 * block, scales, fmadds and reduction), so decode and prefill give the same bits. */
static void matmul_q8_0(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                        int ncols, float *y, size_t ys) {
    if (ncols == 1) pd_avx2_matmul_q8_0(k, w, ws, nrows, x, xs, ncols, y, ys);
    else matmul_q8_0_tiles(k, w, ws, nrows, x, xs, ncols, y, ys);
}

/* ---------------------------------------------------------------- K-quants x pd_q8k
 * (kernels/x86/kquant.h, see there) with vpdpwssd for vpmaddwd + vpaddd. */
#define PD_KDOT(acc, pairs, sc) _mm256_dpwssd_avx_epi32((acc), (pairs), (sc))
#include "kernels/x86/kquant.h"
PD_K_MATMUL(matmul_iq4_xs, T_IQ4_XS)
#define KR_KDOT PD_KDOT
#define KR_BDOT _mm256_dpbusd_avx_epi32   /* kr16_256.h: the decode tile with 4-byte dots */
#include "kernels/x86/kr16_256.h"

/* The legacy formats repacked by 16 rows (kernels/x86/r16_256.h), with vpdpbusd. */
#define R16_DOT(acc, u, p) _mm256_dpbusd_avx_epi32((acc), (u), _mm256_set1_epi32(ld32(p)))
#include "kernels/x86/r16_256.h"

/* The rest is the AVX2 table's: activation quantization, the float formats and attention gain
 * nothing from VNNI (the header), nor do the sampler's passes. */
const pd_kernels PD_AVXVNNI_TABLE = PD_TABLE_OVER_AVX2(PD_AVXVNNI_NAME, PD_BLOCK_MATMULS_OWN, PD_IQ4_MATMULS_OWN,
    .matmul[PD_Q4_K_R16] = matmul_q4_k_r16, .matmul[PD_Q6_K_R16] = matmul_q6_k_r16,
    .matmul[PD_IQ4_NL_R16] = matmul_iq4_nl_r16, .matmul[PD_MXFP4_R16] = matmul_mxfp4_r16);
#endif
