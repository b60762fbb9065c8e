/* AVX-512 (F, BW, VL, DQ) + AVX512-VNNI kernels (this file and x86/avx512_kquant.c are compiled with -mavx512f
 * -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c -mavx2; never AMX flags).
 *
 * Legacy block formats x pd_q8: two 32-value blocks per 512-bit register (Q8_0: two rows, see
 * below). The weight quants of blocks b and b+1 are unpacked to 64 UNSIGNED bytes u (q4:
 * nibbles 0..15, q5: 0..31, q8_0: w ^ 0x80 = w + 128), and one vpdpbusd (u8 x s8, sums of 4
 * into int32) against the two activation blocks gives 16 int32 lanes, 8 per block. The
 * formats' offsets (q4_0: 8, q5_0: 16, q8_0: 128; sum((u - off) * a) = sum(u * a) - off *
 * sum(a)) are removed exactly in integers: the vpdpbusd of each row starts from -off * (sums
 * of 4 activations), computed once per column and block pair (pd_q8.s is that sum already
 * scaled to float; the integer form keeps each block's dot exactly the scalar table's). Then
 * one convert and one fmadd per row, column and block pair with dw*dx (the two blocks' scales
 * in the two halves, one vpermps per row). Measured on a Zen 5, one thread, 4096 x 4096: this
 * takes Q4_0..Q5_1 decode from 19-25 GB/s (AVX2) to 32-38, and prefill (16 columns) to
 * 1.7-2.3x AVX2; the 256-bit form (one block per vpdpbusd, as kernels/x86/avxvnni.c) gains only
 * 5-15% over AVX2.
 *
 * K-quants x pd_q8k: a super-block row is 4 registers of 64 unpacked unsigned quants; vpmaddubsw
 * with the activation bytes (rearranged once per column so each register's two 32-value halves
 * meet the activations they pair with) gives int16 pair sums, and vpdpwssd multiplies them by
 * the sub-block scales (int16, one per 128-bit lane of 16 values) and accumulates into int32.
 * Offsets (Q3_K, Q6_K) and minima go through bsums as in the AVX2 table, reductions too.
 * (vpdpbusd would give 4-value sums that then need a 32-bit multiply by the scales: measured
 * on Q4_K, vpdpbusd + vpmulld + vpaddd is 5% slower for decode and 11% for prefill.)
 *
 * Decode (one column) of the byte-heavy formats, Q8_0 and F16/BF16/F32, is memory-bound with
 * the AVX2 loops already, and there the faster loops of this file streamed LESS from DRAM on
 * the Zen 5 measured (Q8_0, 171 MB: 25-27 GB/s vs 37-44 for AVX2, though 70 vs 50 from L3;
 * the 256-bit VNNI loop: ~10% less; prefetch distance, hints, density and row pairing did not
 * help, a loop doing the same work at half the rate did). So one column of those formats goes
 * to the AVX2 kernels (exported by kernels/x86/avx2.c), and their prefill kernels here put two
 * ROWS in a register, each half doing exactly the AVX2 kernel's arithmetic: same bits for a
 * column whether it is decoded alone or prefilled with others.
 *
 * Tiling and prefetch as in kernels/x86/avx2.c: R = 4 rows (or 1) x up to C = 4 columns per tile
 * (measured best of 2..4), rows in lock-step, each row prefetched PF_DIST bytes ahead. Every
 * row's result is computed by the same instructions in the same order whatever tile it falls
 * in (R, C, its neighbours), so a forward pass is bit-identical for any split of the rows
 * across threads, and a column's result does not depend on the columns computed with it
 * (tests/test_kernels.py checks all three).
 */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#include "kernels/x86/avx512.h"
#include "kernels/exp_poly.h"
/* avx2.c (always compiled with this file): the one-column kernels of the formats whose decode
 * this file does not speed up, and the entries it reuses (see the table at the end). */
#include "kernels/x86/avx2_exports.h"

/* ---------------------------------------------------------------- activation quantization */

/* roundf(t) (half away from zero) as int32: truncate, then step one away from zero where the
 * (exact) fraction is >= 0.5. */
AI __m512i round_away(__m512 t) {
    const __m512 tr = _mm512_roundscale_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(t, tr)),
                                            _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 step = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(t, _mm512_set1_ps(-0.0f)));
    return _mm512_cvttps_epi32(_mm512_mask_add_ps(tr, up, tr, step));
}

AI __m512i abs_bits(__m512 v) { return _mm512_castps_si512(_mm512_abs_ps(v)); }

static void quantize_q8(const float *x, pd_q8 *y, int k) {
    for (int b = 0; b < k / PD_QK; b++, x += PD_QK) {
        const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        /* formats.h: amax compared as integers (the bits of |x|) */
        const float amax = pd_bits_float((uint32_t)_mm512_reduce_max_epi32(_mm512_max_epi32(abs_bits(v0), abs_bits(v1))));
        if (!pd_amax_finite(amax)) { pd_q8_nonfinite(&y[b]); continue; }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q0 = round_away(_mm512_mul_ps(v0, vid)), q1 = round_away(_mm512_mul_ps(v1, vid));
        _mm_storeu_si128((__m128i *)y[b].qs, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[b].qs + 16), _mm512_cvtepi32_epi8(q1));
        y[b].d = d;
        y[b].s = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

/* The same rule per 256 values; each register of 16 quants is one bsums group. */
static void quantize_q8k(const float *x, pd_q8k *y, int k) {
    for (int b = 0; b < k / PD_QKK; b++, x += PD_QKK) {
        __m512i m4[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                         _mm512_setzero_si512()};
        for (int i = 0; i < PD_QKK / 16; i++) m4[i % 4] = _mm512_max_epi32(m4[i % 4], abs_bits(_mm512_loadu_ps(x + 16 * i)));
        const float amax = pd_bits_float((uint32_t)_mm512_reduce_max_epi32(
            _mm512_max_epi32(_mm512_max_epi32(m4[0], m4[1]), _mm512_max_epi32(m4[2], m4[3]))));
        if (!pd_amax_finite(amax)) { pd_q8k_nonfinite(&y[b]); continue; }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        for (int i = 0; i < PD_QKK / 16; i++) {
            const __m512i q = round_away(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * i), vid));
            _mm_storeu_si128((__m128i *)(y[b].qs + 16 * i), _mm512_cvtepi32_epi8(q));
            y[b].bsums[i] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        y[b].d = d;
    }
}

/* ---------------------------------------------------------------- block formats x pd_q8 */

/* u - off is the signed quant: q4_0 8, q5_0 16, q8_0 128 (its bytes are flipped to w + 128), the
 * codebook formats IQ4_NL / MXFP4 128 (their table looked up + 128: codebook256) */
AI int offset(int T) { return T == T_Q4_0 ? 8 : T == T_Q5_0 ? 16 : signed_quants(T) ? 128 : 0; }
AI size_t qs_off(int T) {
    return T == T_Q4_0 ? offsetof(pd_block_q4_0, qs) : T == T_Q4_1 ? offsetof(pd_block_q4_1, qs)
         : T == T_Q5_0 ? offsetof(pd_block_q5_0, qs) : T == T_Q5_1 ? offsetof(pd_block_q5_1, qs)
         : offsetof(pd_block_q8_0, qs);
}
AI size_t qh_off(int T) { return T == T_Q5_0 ? offsetof(pd_block_q5_0, qh) : offsetof(pd_block_q5_1, qh); }

/* Blocks at a and b as 64 unsigned quant bytes, a's 32 values in the low half (in order). The
 * codebook formats' are their nibbles' table entries + 128 (one vpshufb, the table in every lane). */
AI __m512i unpack2(int T, const char *a, const char *b) {
    if (T == T_IQ4_NL || T == T_MXFP4) {
        __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a + cb_qs_off(T))));
        v = _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128((const __m128i *)(b + cb_qs_off(T))));
        v = _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0f));
        return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm256_castsi256_si128(codebook256(T, 1))), v);
    }
    if (T == T_Q8_0) {
        const __m512i v = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + qs_off(T)))),
            _mm256_loadu_si256((const __m256i *)(b + qs_off(T))), 1);
        return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    }
    /* nibbles: 16 bytes to both 128-bit lanes of a half; the upper lane takes the high ones */
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a + qs_off(T))));
    v = _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128((const __m128i *)(b + qs_off(T))));
    v = _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                         _mm512_set1_epi8(0x0f));
    if (T == T_Q5_0 || T == T_Q5_1) {   /* bit j of the 64-bit word (qh_a | qh_b << 32): +16 */
        uint32_t ha, hb;
        memcpy(&ha, a + qh_off(T), 4);
        memcpy(&hb, b + qh_off(T), 4);
        v = _mm512_mask_add_epi8(v, (__mmask64)((uint64_t)hb << 32 | ha), v, _mm512_set1_epi8(0x10));
    }
    return v;
}

/* f16 scale (at byte off) of blocks a and b of rows 0..R-1: lanes 0..3 block a, 4..7 block b
 * (zeros for missing rows, and for block b when !two). */
AI __m256 load_h8(const char *a, const char *b, size_t ws, int R, int two) {
    const short z = 0;
    return _mm256_cvtph_ps(_mm_setr_epi16(
        (short)ld16(a), R > 1 ? (short)ld16(a + ws) : z, R > 2 ? (short)ld16(a + 2 * ws) : z,
        R > 3 ? (short)ld16(a + 3 * ws) : z, two ? (short)ld16(b) : z,
        two && R > 1 ? (short)ld16(b + ws) : z, two && R > 2 ? (short)ld16(b + 2 * ws) : z,
        two && R > 3 ? (short)ld16(b + 3 * ws) : z));
}

/* One step of tile_q: blocks b and b+1 (two) or block b alone (!two: block b+1's lanes get
 * zero activations and scales). */
AI void step_q(int T, int R, int C, int two, const char *wa, size_t ws, const char *x, size_t xs,
               int b, __m512 acc[4][QCMAX], __m256 macc[QCMAX], const char *pf) {
    const size_t bb = blk_bytes(T);
    const char *wb = two ? wa + bb : wa;
    const __m256 dw = T == T_MXFP4   /* its scale: an E8M0 byte; the others' an f16 at the block's start */
        ? _mm256_set_m128(two ? load_scale4(T, wb, ws, R) : _mm_setzero_ps(), load_scale4(T, wa, ws, R))
        : load_h8(wa, wb, ws, R, two);
    const __m256 mw = has_min(T) ? load_h8(wa + 2, wb + 2, ws, R, two) : _mm256_setzero_ps();
    __m512i xq[QCMAX], seed[QCMAX];
    __m256 dd[QCMAX];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        const pd_q8 *xa = (const pd_q8 *)(x + c * xs) + b, *xb = xa + 1;
        const __m256i qa = _mm256_loadu_si256((const __m256i *)xa->qs);
        xq[c] = two ? _mm512_inserti64x4(_mm512_castsi256_si512(qa),
                                         _mm256_loadu_si256((const __m256i *)xb->qs), 1)
                    : _mm512_zextsi256_si512(qa);
        if (offset(T))
            seed[c] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                                           _mm512_set1_epi8((char)offset(T)), xq[c]));
        const __m256 dx = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(xa->d)),
                                               _mm_set1_ps(two ? xb->d : 0.0f), 1);
        dd[c] = _mm256_mul_ps(dw, dx);
        if (has_min(T)) {
            const __m256 s = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(xa->s)),
                                                  _mm_set1_ps(two ? xb->s : 0.0f), 1);
            macc[c] = _mm256_fmadd_ps(mw, s, macc[c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        _mm_prefetch(pf + r * ws, _MM_HINT_T0);
        const __m512i u = unpack2(T, wa + r * ws, wb + r * ws);
        const __m512i idx = _mm512_setr_epi32(r, r, r, r, r, r, r, r, r + 4, r + 4, r + 4, r + 4,
                                              r + 4, r + 4, r + 4, r + 4);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const __m512i is = _mm512_dpbusd_epi32(offset(T) ? seed[c] : _mm512_setzero_si512(), u, xq[c]);
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
    __m256 macc[QCMAX];   /* min terms: lanes r and 4 + r belong to row r */
#pragma GCC unroll 16
    for (int i = 0; i < R * C; i++) acc[i / C][i % C] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) macc[c] = _mm256_setzero_ps();
    pd_pf pf = pf_init(w, nb * bb, ws);
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        step_q(T, R, C, 1, w + b * bb, ws, x, xs, b, acc, macc, pf.p);
        pf_advance(&pf, 2 * bb);
    }
    if (b < nb) step_q(T, R, C, 0, w + b * bb, ws, x, xs, b, acc, macc, pf.p);
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        float m[8];
        _mm256_storeu_ps(m, macc[c]);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            y[c * ys + r] = has_min(T) ? hsum512(acc[r][c]) + (m[r] + m[4 + r]) : hsum512(acc[r][c]);
    }
}

PD_Q_MATMUL(matmul_q4_0, T_Q4_0)   /* over tile_q (tiles.h); Q8_0 below */
PD_Q_MATMUL(matmul_q4_1, T_Q4_1)
PD_Q_MATMUL(matmul_q5_0, T_Q5_0)
PD_Q_MATMUL(matmul_iq4_nl, T_IQ4_NL)
PD_Q_MATMUL(matmul_mxfp4, T_MXFP4)
PD_Q_MATMUL(matmul_q5_1, T_Q5_1)

/* The legacy formats repacked by 16 rows (PD_*_R16, built at load: see kernels.h). A register
 * holds 4 quant bytes of each of 16 rows; the 4 activation bytes they pair with are broadcast,
 * so 8 vpdpbusd give the block's integer dot for 16 rows and one column, and its scales apply
 * to all 16 lanes at once: d*dx with one vmulps, the minimum or offset term with one fmadd.
 * The unpacked weights (8 registers a block) serve up to 8 columns. A lane's arithmetic does
 * not depend on the columns beside it or on the tile; pd_scalar_matmul_r16 is its plain-C twin. */
/* acc += dpbusd(u, the 4 bytes at p broadcast to every lane), the broadcast folded into the
 * instruction's memory operand ({1to16}): GCC otherwise issues a separate vpbroadcastd. */
#define DPBUSD_BCAST(acc, u, p) __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)(p)))

AI void tile_r16(int RT, int C, int nb, const char *w, const char *x, size_t xs, float *y, size_t ys) {
    const size_t rb = pd_r16_bytes(RT);
    const __m512i lo4 = _mm512_set1_epi8(0x0f), five = _mm512_set1_epi8(0x10);
    __m512 acc[8];
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const char *blk = w + (size_t)b * rb;
#pragma GCC unroll 9
        for (size_t off = 0; off < rb; off += 64) _mm_prefetch(blk + 8 * rb + off, _MM_HINT_T0);
        const __m512 dw = RT == PD_MXFP4_R16 ? _mm512_insertf32x8(_mm512_castps256_ps512(load_e8(blk)), load_e8(blk + 8), 1)
                                             : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const __m512 mw = pd_r16_has_min(RT)
            ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + pd_r16_m_off(RT))))
            : _mm512_mul_ps(dw, _mm512_set1_ps((float)-pd_r16_offset(RT)));
        const char *qs = blk + pd_r16_qs_off(RT);
        __m512i u[8];
        if (RT == PD_Q8_0_R16) {
#pragma GCC unroll 8
            for (int h = 0; h < 8; h++) u[h] = _mm512_loadu_si512((const void *)(qs + 64 * h));
        } else {
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * g));
                u[g] = _mm512_and_si512(v, lo4);
                u[g + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
            }
            if (pd_r16_codebook(RT)) {   /* the nibbles are codebook indices: u = codebook + 128 */
                const __m512i kv = _mm512_broadcast_i32x4(_mm256_castsi256_si128(r16_codebook256(RT)));
#pragma GCC unroll 8
                for (int h = 0; h < 8; h++) u[h] = _mm512_shuffle_epi8(kv, u[h]);
            }
            if (pd_r16_has_hmask(RT)) {
                const char *hm = blk + pd_r16_hmask_off(RT);
#pragma GCC unroll 8
                for (int h = 0; h < 8; h++) {
                    uint64_t bits;
                    memcpy(&bits, hm + 8 * h, 8);
                    u[h] = _mm512_mask_add_epi8(u[h], (__mmask64)bits, u[h], five);
                }
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const pd_q8 *xb = (const pd_q8 *)(x + c * xs) + b;
            __m512i s0 = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int h = 0; h < 8; h++) DPBUSD_BCAST(s0, u[h], xb->qs + 4 * h);
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(xb->d));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), sc, acc[c]);
            acc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xb->s), acc[c]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) _mm512_storeu_ps(y + c * ys, acc[c]);
}

AI void matmul_r16(int RT, int k, const void *w, size_t ws, int nrows, const void *x, size_t xs, int ncols,
                   float *y, size_t ys) {
    const int nb = k / PD_QK;
    for (int r = 0; r < nrows; r += PD_R16_ROWS) {
        const char *g = (const char *)w + (size_t)r * ws;
        for (int c = 0; c < ncols; c += 8) {
            const char *xc = (const char *)x + (size_t)c * xs;
            float *yc = y + (size_t)c * ys + r;
            switch (ncols - c >= 8 ? 8 : ncols - c) {
            case 1: tile_r16(RT, 1, nb, g, xc, xs, yc, ys); break;
            case 2: tile_r16(RT, 2, nb, g, xc, xs, yc, ys); break;
            case 3: tile_r16(RT, 3, nb, g, xc, xs, yc, ys); break;
            case 4: tile_r16(RT, 4, nb, g, xc, xs, yc, ys); break;
            case 5: tile_r16(RT, 5, nb, g, xc, xs, yc, ys); break;
            case 6: tile_r16(RT, 6, nb, g, xc, xs, yc, ys); break;
            case 7: tile_r16(RT, 7, nb, g, xc, xs, yc, ys); break;
            default: tile_r16(RT, 8, nb, g, xc, xs, yc, ys); break;
            }
        }
    }
}

PD_R16_MATMULS   /* the table's entry points over this file's matmul_r16 (kernels/x86/common.h) */
PD_R16_MATMUL(matmul_iq4_nl_r16, PD_IQ4_NL_R16)
PD_R16_MATMUL(matmul_mxfp4_r16, PD_MXFP4_R16)

/* Q8_0 prefill: a register holds block b of two ROWS (row 2p in the low half, 2p + 1 in the
 * high half) against the column's block b in both halves. Each half then accumulates its row
 * exactly as kernels/x86/avx2.c's tile_q does (the same 8 int32 sums of 4 products per block,
 * the same dw*dx, fmadds in block order, the same final reduction), so every output is
 * bit-identical to the AVX2 kernel's, which does Q8_0 decode (one column; see the header). */
AI void tile_q8_rows(int R, int C, int nb, const char *w, size_t ws, const char *x, size_t xs,
                     float *y, size_t ys) {
    const int T = T_Q8_0, P = (R + 1) / 2;
    const size_t bb = blk_bytes(T);
    __m512 acc[2][QCMAX];
#pragma GCC unroll 8
    for (int i = 0; i < P * C; i++) acc[i / C][i % C] = _mm512_setzero_ps();
    pd_pf pf = pf_init(w, nb * bb, ws);
    for (int b = 0; b < nb; b++, pf_advance(&pf, bb)) {
        const char *wb = w + b * bb;
        const __m128 dw = load_h4(wb, ws, R);
        __m512i xq[QCMAX], seed[QCMAX];
        __m512 dd[QCMAX];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const pd_q8 *xb = (const pd_q8 *)(x + c * xs) + b;
            xq[c] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xb->qs));
            seed[c] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                                           _mm512_set1_epi8((char)offset(T)), xq[c]));
            dd[c] = _mm512_castps128_ps512(_mm_mul_ps(dw, _mm_set1_ps(xb->d)));   /* lane r: row r */
        }
#pragma GCC unroll 2
        for (int p = 0; p < P; p++) {
            const int r0 = 2 * p, r1 = 2 * p + 1 < R ? 2 * p + 1 : 2 * p;   /* R = 1: row 0 twice */
            _mm_prefetch(pf.p + r0 * ws, _MM_HINT_T0);
            if (r1 != r0) _mm_prefetch(pf.p + r1 * ws, _MM_HINT_T0);
            const __m512i u = unpack2(T, wb + r0 * ws, wb + r1 * ws);
            const __m512i idx = _mm512_setr_epi32(r0, r0, r0, r0, r0, r0, r0, r0,
                                                  r0 + 1, r0 + 1, r0 + 1, r0 + 1, r0 + 1, r0 + 1, r0 + 1, r0 + 1);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m512i is = _mm512_dpbusd_epi32(seed[c], u, xq[c]);
                const __m512 sc = _mm512_permutexvar_ps(idx, dd[c]);
                acc[p][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), sc, acc[p][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {   /* + 0.0f: kernels/x86/avx2.c adds its (zero) min term */
            const __m512 a = acc[r / 2][c];
            y[c * ys + r] = hsum(r & 1 ? _mm512_extractf32x8_ps(a, 1) : _mm512_castps512_ps256(a)) + 0.0f;
        }
}

#define Q8_TILE(R_, C_, r, c)                                                                 \
    tile_q8_rows(R_, C_, nb, (const char *)w + (r) * ws, ws, (const char *)x + (c) * xs, xs,   \
                 y + (c) * ys + (r), ys)

/* Q8_0 decode (one column) streams 8.5 bits per weight: kernels/x86/avx2.c's loop is memory-bound
 * already, and the faster loops of this file streamed less from DRAM (see the header). */
static void matmul_q8_0(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                        int ncols, float *y, size_t ys) {
    if (ncols == 1) {
        pd_avx2_matmul_q8_0(k, w, ws, nrows, x, xs, ncols, y, ys);
        return;
    }
    const int nb = k / PD_QK;
    RUN_TILES(QCMAX, Q8_TILE)
}

/* ---------------------------------------------------------------- K-quants x pd_q8k
 * In x86/avx512_kquant.c (the same flags; this file would pass 600 lines): its matmuls are
 * exported as pd_avx512_matmul_q2_k .. q6_k. */
pd_matmul_fn_t pd_avx512_matmul_q2_k, pd_avx512_matmul_q3_k, pd_avx512_matmul_q4_k, pd_avx512_matmul_q5_k,
    pd_avx512_matmul_q6_k;
/* x86/avx512_kquant.c: the codebook format IQ4_XS. */
pd_matmul_fn_t pd_avx512_matmul_iq4_xs;
/* x86/avx512_kr16.c: Q4_K and Q6_K repacked by 16 rows. */
pd_matmul_fn_t pd_avx512_matmul_q4_k_r16, pd_avx512_matmul_q6_k_r16;

/* ---------------------------------------------------------------- float formats x float
 * Decode (one column) is pure streaming: the AVX2 kernels (exported by kernels/x86/avx2.c; this
 * file's 16-wide loop streamed less from DRAM, see the header). Prefill: kernels/x86/avx2.c's
 * tile_f with two ROWS per register (8 values of row 2p low, of row 2p + 1 high, against the
 * column's 8 values in both halves): each half does its row's fmadds, reduction and scalar
 * tail exactly as the AVX2 kernel, so one column or many give the same bits. */

enum { T_F32, T_F16, T_BF16 };

/* Values i..i+7 of rows a (low half) and b (high half) as floats. */
AI __m512 load8x2(int T, const char *a, const char *b, int i) {
    if (T == T_F32)
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)a + i)),
                                  _mm256_loadu_ps((const float *)b + i), 1);
    const __m256i h = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)a + i))),
        _mm_loadu_si128((const __m128i *)((const uint16_t *)b + i)), 1);
    if (T == T_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));   /* bf16 */
}
AI float load1(int T, const char *row, int i) {   /* kernels/x86/avx2.c's */
    return T == T_F32 ? ((const float *)row)[i]
         : T == T_F16 ? _cvtsh_ss(((const uint16_t *)row)[i])
                      : pd_bf16_to_f32(((const uint16_t *)row)[i]);
}

AI void tile_f_rows(int T, int R, int C, int k, const char *w, size_t ws, const char *x,
                    size_t xs, float *y, size_t ys) {
    const int P = (R + 1) / 2;
    __m512 acc[2][FCMAX];
#pragma GCC unroll 8
    for (int i = 0; i < P * C; i++) acc[i / C][i % C] = _mm512_setzero_ps();
    const size_t es = T == T_F32 ? 4 : 2;
    pd_pf pf = pf_init(w, k * es, ws);
    int i = 0;
    for (; i + 8 <= k; i += 8, pf_advance(&pf, 8 * es)) {
        __m512 xv[FCMAX];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) xv[c] = _mm512_broadcast_f32x8(_mm256_loadu_ps((const float *)(x + c * xs) + i));
#pragma GCC unroll 2
        for (int p = 0; p < P; p++) {
            const int r0 = 2 * p, r1 = 2 * p + 1 < R ? 2 * p + 1 : 2 * p;   /* R = 1: row 0 twice */
            _mm_prefetch(pf.p + r0 * ws, _MM_HINT_T0);
            if (r1 != r0) _mm_prefetch(pf.p + r1 * ws, _MM_HINT_T0);
            const __m512 wv = load8x2(T, w + r0 * ws, w + r1 * ws, i);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) acc[p][c] = _mm512_fmadd_ps(wv, xv[c], acc[p][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const float *xc = (const float *)(x + c * xs);
            const __m512 a = acc[r / 2][c];
            float s = hsum(r & 1 ? _mm512_extractf32x8_ps(a, 1) : _mm512_castps512_ps256(a));
            for (int j = i; j < k; j++) s += load1(T, w + r * ws, j) * xc[j];
            y[c * ys + r] = s;
        }
}

#define F_TILE(T, R_, C_, r, c)                                                               \
    tile_f_rows(T, R_, C_, k, (const char *)w + (r) * ws, ws, (const char *)x + (c) * xs, xs, \
                y + (c) * ys + (r), ys)
#define F_TILE_T_F32(R_, C_, r, c) F_TILE(T_F32, R_, C_, r, c)
#define F_TILE_T_F16(R_, C_, r, c) F_TILE(T_F16, R_, C_, r, c)
#define F_TILE_T_BF16(R_, C_, r, c) F_TILE(T_BF16, R_, C_, r, c)
#define F_MATMUL(name, T)                                                                     \
    static void matmul_##name(int k, const void *w, size_t ws, int nrows, const void *x,     \
                              size_t xs, int ncols, float *y, size_t ys) {                    \
        if (ncols == 1) {                                                                     \
            pd_avx2_matmul_##name(k, w, ws, nrows, x, xs, ncols, y, ys);                      \
            return;                                                                           \
        }                                                                                     \
        RUN_TILES(FCMAX, F_TILE_##T)                                                          \
    }
F_MATMUL(f32, T_F32)
F_MATMUL(f16, T_F16)
F_MATMUL(bf16, T_BF16)

/* ---------------------------------------------------------------- KV cache append
 * (attention itself is kernels/x86/avx2.c's). Tail by a masked load and store: no scalar loop, no
 * reads or writes past n. */

AI __mmask16 tail_mask(int n) { return (__mmask16)((1u << n) - 1); }


static void f32_to_f16(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)   /* vcvtps2ph rounds to nearest even, like pd_f32_to_f16 */
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i),
                                                           _MM_FROUND_TO_NEAREST_INT));
    }
}

/* ---------------------------------------------------------------- the sampler's vocabulary passes
 * The exp-sum (exp.h's exp256 16 lanes at a time, exp_poly.h's constants) and top-k's
 * candidate collection. */

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

static double sum_exp(const float *x, int n, float scale, float shift) {
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
static int collect_above(const float *x, int n, float t, int32_t *out) {
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

/* Attention: exp and the per-head loops are the AVX2 table's; the group's scores and weighted sums
 * over a run of rows are x86/avx512_attn.c's (one convert per row for all heads, scores reduced
 * 16 at a time). */
void pd_avx512_attn_scores_mh(int kv_type, int nh, int hd, const void *q, const void *k, size_t row_bytes, int n,
                              float *s, size_t s_stride);
void pd_avx512_attn_accum_mh(int kv_type, int nh, int hd, float *out, const float *w, size_t w_stride,
                             const void *v, size_t row_bytes, int n);
#define matmul_q2_k pd_avx512_matmul_q2_k
#define matmul_q3_k pd_avx512_matmul_q3_k
#define matmul_q4_k pd_avx512_matmul_q4_k
#define matmul_q5_k pd_avx512_matmul_q5_k
#define matmul_q6_k pd_avx512_matmul_q6_k
const pd_kernels pd_kernels_avx512 = PD_TABLE_OVER_AVX2(
    "avx512", PD_BLOCK_MATMULS_OWN, .quantize_q8 = quantize_q8, .quantize_q8k = quantize_q8k,
    .matmul[PD_F32] = matmul_f32, .matmul[PD_F16] = matmul_f16, .matmul[PD_BF16] = matmul_bf16,
    .matmul[PD_IQ4_NL] = matmul_iq4_nl, .matmul[PD_IQ4_XS] = pd_avx512_matmul_iq4_xs,
    .matmul[PD_MXFP4] = matmul_mxfp4, .matmul[PD_IQ4_NL_R16] = matmul_iq4_nl_r16,
    .matmul[PD_MXFP4_R16] = matmul_mxfp4_r16,
    .matmul[PD_Q4_K_R16] = pd_avx512_matmul_q4_k_r16, .matmul[PD_Q6_K_R16] = pd_avx512_matmul_q6_k_r16,
    .f32_to_f16 = f32_to_f16, .sum_exp = sum_exp, .collect_above = collect_above,
    .attn_scores_mh = pd_avx512_attn_scores_mh, .attn_accum_mh = pd_avx512_attn_accum_mh);
#endif
