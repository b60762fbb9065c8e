/* The ARM64 kernel table's body, written once for every level: kernels/arm/neon.c (baseline
 * ARMv8 Advanced SIMD), kernels/arm/dotprod.c (ARMv8.2 SDOT) and kernels/arm/i8mm.c (+ SMMLA)
 * include it, each compiled with its own -march, after defining
 *     ARM_DOT(acc, a, b)   acc (int32x4) + the dot products of a and b (int8x16) in groups of 4
 * (the lanes a group lands in do not matter: every caller sums all four lanes), and optionally
 *     ARM_R16              the 16-row repacked layouts' entries (kernels/arm/r16.h: SDOT by element)
 *     ARM_MMLA             SMMLA batch tiles for the file's layout (kernels/arm/mmla.h)
 *
 * Arithmetic (why these kernels equal the scalar table's bit for bit, not within a tolerance):
 * every block format's dot is an exact integer per block (per 32 values for the legacy formats,
 * per super-block for the K-quants), and the float expression around it is the scalar table's,
 * term for term, in the same order. The ARM build turns off floating-point contraction
 * (pydecode/_build.py: -ffp-contract=off), so neither this file nor scalar.c fuses a multiply
 * and an add the other does not. The float formats (F32/F16/BF16 weights), attention, the
 * activation and the sampler's passes sum in vector lanes: those agree with scalar.c within
 * float tolerance, as the x86 tables do. */
#ifndef PD_ARM_H
#define PD_ARM_H
#include "kernels/kernels.h"
#include "kernels/exp_poly.h"
#include "kernels/run_tiles.h"
#include <arm_neon.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

/* An f16 field as float by the hardware (FCVT), exact: the same value as scalar.c's
 * pd_f16_to_f32_inline for every finite or infinite input without its branches (a NaN stays a
 * NaN, quieted). */
AI float f16f(const void *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

AI int32_t dot32(int8x16_t w0, int8x16_t w1, const int8_t *x) {
    return vaddvq_s32(ARM_DOT(ARM_DOT(vdupq_n_s32(0), w0, vld1q_s8(x)), w1, vld1q_s8(x + 16)));
}

/* ---------------------------------------------------------------- activations to pd_q8 / pd_q8k
 * The scalar rule (kernels/scalar.c): amax as the max of |x|'s bits, d = amax / 127,
 * q = round-half-away(x * (1/d)): FCVTAS (vcvtaq_s32_f32) rounds exactly so. */
AI uint32_t amax_bits(const float *x, int n) {
    uint32x4_t m = vdupq_n_u32(0);
    const uint32x4_t abs = vdupq_n_u32(0x7fffffffu);
    for (int j = 0; j < n; j += 4) m = vmaxq_u32(m, vandq_u32(vreinterpretq_u32_f32(vld1q_f32(x + j)), abs));
    return vmaxvq_u32(m);
}
/* 16 values of x * id rounded half away from zero, as int8 (|q| <= 127: no saturation). */
AI int8x16_t round16(const float *x, float id) {
    const int32x4_t a = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x), id));
    const int32x4_t b = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4), id));
    const int32x4_t c = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + 8), id));
    const int32x4_t d = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + 12), id));
    const int16x8_t ab = vcombine_s16(vmovn_s32(a), vmovn_s32(b)), cd = vcombine_s16(vmovn_s32(c), vmovn_s32(d));
    return vcombine_s8(vmovn_s16(ab), vmovn_s16(cd));
}
AI int32_t sum16(int8x16_t q) { return vaddlvq_s8(q); }

static void quantize_q8(const float *x, pd_q8 *y, int k) {
    for (int b = 0; b < k / PD_QK; b++, x += PD_QK) {
        const float amax = pd_bits_float(amax_bits(x, PD_QK));
        if (!pd_amax_finite(amax)) { pd_q8_nonfinite(&y[b]); continue; }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const int8x16_t q0 = round16(x, id), q1 = round16(x + 16, id);
        vst1q_s8(y[b].qs, q0);
        vst1q_s8(y[b].qs + 16, q1);
        y[b].d = d;
        y[b].s = d * (float)(sum16(q0) + sum16(q1));
    }
}

static void quantize_q8k(const float *x, pd_q8k *y, int k) {
    for (int b = 0; b < k / PD_QKK; b++, x += PD_QKK) {
        const float amax = pd_bits_float(amax_bits(x, PD_QKK));
        if (!pd_amax_finite(amax)) { pd_q8k_nonfinite(&y[b]); continue; }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int s = 0; s < PD_QKK / 16; s++) {
            const int8x16_t q = round16(x + 16 * s, id);
            vst1q_s8(y[b].qs + 16 * s, q);
            y[b].bsums[s] = (int16_t)sum16(q);
        }
        y[b].d = d;
    }
}

/* ---------------------------------------------------------------- legacy formats x pd_q8
 * A tile is R rows (4 or 1) x C columns (up to 4): each weight block is unpacked once to two
 * int8x16 (values 0..15 and 16..31, offsets removed, as scalar.c's unpack_q4/q5 make them)
 * and dotted with the C column blocks; then, per row and column, the scalar table's
 *     sum += dw * dx * (float)dot  [+ m * s]
 * in its order. A row's result does not depend on its tile (same ops for every row), so the
 * forward pass is bit-identical for any split of rows across threads. */
AI int has_min(int T) { return T == PD_Q4_1 || T == PD_Q5_1; }
/* (pd_type_block_bytes as a constant the compiler folds into the tile's addressing) */
AI size_t qblock_bytes(int T) {
    return T == PD_Q4_0 ? sizeof(pd_block_q4_0) : T == PD_Q4_1 ? sizeof(pd_block_q4_1)
         : T == PD_Q5_0 ? sizeof(pd_block_q5_0) : T == PD_Q5_1 ? sizeof(pd_block_q5_1)
         : T == PD_IQ4_NL ? sizeof(pd_block_iq4_nl) : T == PD_MXFP4 ? sizeof(pd_block_mxfp4) : sizeof(pd_block_q8_0);
}

/* byte j of the result is 0x10 where bit j of the two bytes b0 (j < 8), b1 (j >= 8) is set */
AI uint8x16_t fifth_bits(uint8_t b0, uint8_t b1) {
    static const uint8_t bit[16] = { 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128 };
    const uint8x16_t v = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

/* Row block blk as two int8x16 of signed values, its scale dw and minimum mw (0 if none). */
AI void aunpack(int T, const char *blk, int8x16_t *w0, int8x16_t *w1, float *dw, float *mw) {
    if (T == PD_IQ4_NL || T == PD_MXFP4) {   /* the codebook formats: TBL of the nibbles into the table */
        const int mx = T == PD_MXFP4;
        const int8x16_t kv = vld1q_s8(mx ? pd_kvalues_mxfp4 : pd_kvalues_iq4nl);
        const uint8x16_t q = vld1q_u8((const uint8_t *)blk + (mx ? offsetof(pd_block_mxfp4, qs) : offsetof(pd_block_iq4_nl, qs)));
        *w0 = vqtbl1q_s8(kv, vandq_u8(q, vdupq_n_u8(0x0f)));
        *w1 = vqtbl1q_s8(kv, vshrq_n_u8(q, 4));
        *dw = mx ? pd_e8m0_half(*(const uint8_t *)blk) : f16f(blk);
        *mw = 0.0f;
        return;
    }
    *dw = f16f(blk);
    if (T == PD_Q8_0) {
        const pd_block_q8_0 *b = (const pd_block_q8_0 *)blk;
        *w0 = vld1q_s8(b->qs);
        *w1 = vld1q_s8(b->qs + 16);
        *mw = 0.0f;
        return;
    }
    *mw = has_min(T) ? f16f(blk + 2) : 0.0f;
    const uint8_t *qs = (const uint8_t *)blk + (T == PD_Q4_0 ? offsetof(pd_block_q4_0, qs) : T == PD_Q4_1 ? offsetof(pd_block_q4_1, qs)
                                                : T == PD_Q5_0 ? offsetof(pd_block_q5_0, qs) : offsetof(pd_block_q5_1, qs));
    const uint8x16_t q = vld1q_u8(qs);
    uint8x16_t lo = vandq_u8(q, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(q, 4);
    if (T == PD_Q5_0 || T == PD_Q5_1) {
        const uint8_t *qh = (const uint8_t *)blk + (T == PD_Q5_0 ? offsetof(pd_block_q5_0, qh) : offsetof(pd_block_q5_1, qh));
        lo = vorrq_u8(lo, fifth_bits(qh[0], qh[1]));
        hi = vorrq_u8(hi, fifth_bits(qh[2], qh[3]));
    }
    const int off = T == PD_Q4_0 ? 8 : T == PD_Q5_0 ? 16 : 0;
    *w0 = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8((int8_t)off));
    *w1 = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8((int8_t)off));
}

/* scalar.c's block step: blk = dw * dx * (float)dot [+ m * s] (sum += blk is the caller's) */
AI float ablk(int T, float dw, float mw, const pd_q8 *xb, float dot) {
    return has_min(T) ? dw * xb->d * dot + mw * xb->s : dw * xb->d * dot;
}

AI void atile(int T, int R, int C, int nb, const char *w, size_t ws, const char *x, size_t xs, float *y, size_t ys) {
    const size_t bb = qblock_bytes(T);
    float sum[4][4] = { { 0 } };
    for (int b = 0; b < nb; b++) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            int8x16_t w0, w1;
            float dw, mw;
            aunpack(T, w + r * ws + b * bb, &w0, &w1, &dw, &mw);
            __builtin_prefetch(w + r * ws + (b + 16) * bb);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const pd_q8 *xb = (const pd_q8 *)(x + c * xs) + b;
                sum[r][c] += ablk(T, dw, mw, xb, (float)dot32(w0, w1, xb->qs));
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[c * ys + r] = sum[r][c];
}


/* ---------------------------------------------------------------- K-quants x pd_q8k
 * Per row and super-block, for each column, exact int32 sums of scalar.c's kdot:
 *     isum = sum_s sc[s] * (q . a)_s,  msum = sum_s m[s] * bsums[s]
 * then its float expression  y += dx * (d * isum - dmin * msum). Q4_K and Q6_K (the formats of
 * the usual Q4_K_M / Q6_K files) are unpacked here, a chunk of 32 or 16 values at a time, each
 * chunk serving every column of the tile; Q2_K, Q3_K and Q5_K go through pd_unpack_kblock (the
 * scalar table's own unpacking to int8 quants and per-16 scales), once per row and super-block. */
AI int32x4_t dot16x(int32x4_t acc, int8x16_t q, const int8_t *a, int sc) {
    return vmlaq_n_s32(acc, ARM_DOT(vdupq_n_s32(0), q, vld1q_s8(a)), sc);
}

/* sum_j m[j] * (bsums[2j] + bsums[2j + 1]) for the 8 minima of a Q4_K super-block */
AI int32_t q4k_msum(const uint8_t *m8, const pd_q8k *xb) {
    const int16x8_t pairs = vpaddq_s16(vld1q_s16(xb->bsums), vld1q_s16(xb->bsums + 8));   /* |.| <= 4064 */
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(m8)));
    return vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(pairs)), m, pairs));
}

AI void q4k_row(int C, const char *blk, const pd_q8k *const *xb, int32_t *isum, int32_t *msum) {
    const pd_block_q4_k *b = (const pd_block_q4_k *)blk;
    uint8_t scm[16];   /* sc of the 8 sub-blocks of 32, then their m */
    pd_unpack_scales_k4(b->scales, scm);
    int32x4_t acc[4];
    for (int c = 0; c < C; c++) acc[c] = vdupq_n_s32(0);
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {      /* chunk pair p: sub-block 2p (low nibbles), 2p + 1 (high) */
        const uint8x16_t v0 = vld1q_u8(b->qs + 32 * p), v1 = vld1q_u8(b->qs + 32 * p + 16);
        const int8x16_t l0 = vreinterpretq_s8_u8(vandq_u8(v0, vdupq_n_u8(0x0f)));
        const int8x16_t l1 = vreinterpretq_s8_u8(vandq_u8(v1, vdupq_n_u8(0x0f)));
        const int8x16_t h0 = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4)), h1 = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const int8_t *a = xb[c]->qs + 64 * p;
            acc[c] = vmlaq_n_s32(acc[c], ARM_DOT(ARM_DOT(vdupq_n_s32(0), l0, vld1q_s8(a)), l1, vld1q_s8(a + 16)), scm[2 * p]);
            acc[c] = vmlaq_n_s32(acc[c], ARM_DOT(ARM_DOT(vdupq_n_s32(0), h0, vld1q_s8(a + 32)), h1, vld1q_s8(a + 48)),
                                 scm[2 * p + 1]);
        }
    }
    for (int c = 0; c < C; c++) {
        isum[c] = vaddvq_s32(acc[c]);
        msum[c] = q4k_msum(scm + 8, xb[c]);
    }
}

/* Q6_K values 128h + 32i + l0 .. +15 (i < 4: sub-block 8h + 2i + l0/16) as signed int8 */
AI void q6k_unpack(const pd_block_q6_k *b, int h, int l0, int8x16_t q[4]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m2 = vdupq_n_u8(0x03);
    const int8x16_t off = vdupq_n_s8(32);
    const uint8_t *ql = b->ql + 64 * h + l0, *qh = b->qh + 32 * h + l0;
    const uint8x16_t a = vld1q_u8(ql), bq = vld1q_u8(ql + 32), hb = vld1q_u8(qh);
    q[0] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(a, m4), vshlq_n_u8(vandq_u8(hb, m2), 4))), off);
    q[1] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(bq, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m2), 4))), off);
    q[2] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(a, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m2), 4))), off);
    q[3] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(bq, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4))), off);
}

AI void q6k_row(int C, const char *blk, const pd_q8k *const *xb, int32_t *isum) {
    const pd_block_q6_k *b = (const pd_block_q6_k *)blk;
    int32x4_t acc[4];
    for (int c = 0; c < C; c++) acc[c] = vdupq_n_s32(0);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 2
        for (int l0 = 0; l0 < 32; l0 += 16) {
            int8x16_t q[4];
            q6k_unpack(b, h, l0, q);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    const int v0 = 128 * h + 32 * i + l0;
                    acc[c] = dot16x(acc[c], q[i], xb[c]->qs + v0, b->scales[v0 / 16]);
                }
        }
    for (int c = 0; c < C; c++) isum[c] = vaddvq_s32(acc[c]);
}

/* sum_s m[s] * bsums[s] of an unpacked K-quant super-block against one column */
AI int32_t kblock_msum(const pd_kblock *kb, const pd_q8k *x) {
    const int16x8_t m0 = vld1q_s16(kb->m), m1 = vld1q_s16(kb->m + 8);
    const int16x8_t b0 = vld1q_s16(x->bsums), b1 = vld1q_s16(x->bsums + 8);
    int32x4_t ms = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
    ms = vmlal_high_s16(ms, m0, b0);
    ms = vmlal_s16(ms, vget_low_s16(m1), vget_low_s16(b1));
    ms = vmlal_high_s16(ms, m1, b1);
    return vaddvq_s32(ms);
}

/* Any K-quant through the common unpacked form (kernels.h: pd_kblock). */
AI void kgeneric_row(int T, int C, const char *blk, const pd_q8k *const *xb, int32_t *isum, int32_t *msum,
                     float *d, float *dmin) {
    pd_kblock kb;
    pd_unpack_kblock(T, blk, &kb);
    for (int c = 0; c < C; c++) {
        int32x4_t acc = vdupq_n_s32(0);
#pragma GCC unroll 16
        for (int s = 0; s < 16; s++) acc = dot16x(acc, vld1q_s8(kb.q + 16 * s), xb[c]->qs + 16 * s, kb.sc[s]);
        isum[c] = vaddvq_s32(acc);
        msum[c] = kblock_msum(&kb, xb[c]);
    }
    *d = kb.d;
    *dmin = kb.dmin;
}

AI void ktile(int T, int R, int C, int nb, const char *w, size_t ws, const char *x, size_t xs, float *y, size_t ys) {
    const size_t bb = pd_type_block_bytes(T);
    float sum[4][4] = { { 0 } };
    for (int b = 0; b < nb; b++) {
        const pd_q8k *xb[4];
        for (int c = 0; c < C; c++) xb[c] = (const pd_q8k *)(x + c * xs) + b;
        for (int r = 0; r < R; r++) {
            const char *blk = w + r * ws + b * bb;
            __builtin_prefetch(blk + 4 * bb);
            int32_t isum[4], msum[4] = { 0, 0, 0, 0 };
            float d, dmin = 0.0f;
            if (T == PD_Q4_K || T == PD_Q6_K) {
                d = f16f(T == PD_Q4_K ? blk : blk + offsetof(pd_block_q6_k, d));
                if (T == PD_Q4_K) {
                    dmin = f16f(blk + 2);
                    q4k_row(C, blk, xb, isum, msum);
                } else {
                    q6k_row(C, blk, xb, isum);
                }
            } else {
                kgeneric_row(T, C, blk, xb, isum, msum, &d, &dmin);
            }
            for (int c = 0; c < C; c++)   /* scalar.c's kdot, term for term */
                sum[r][c] += xb[c]->d * (d * (float)isum[c] - dmin * (float)msum[c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[c * ys + r] = sum[r][c];
}

/* ---------------------------------------------------------------- float formats x float
 * Four lanes of partial sums per row and column (within float tolerance of scalar.c's
 * 32-value chunks). */
AI float32x4_t ldw4(int T, const void *row, int i) {
    if (T == PD_F32) return vld1q_f32((const float *)row + i);
    const uint16x4_t h = vld1_u16((const uint16_t *)row + i);
    if (T == PD_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));   /* bf16: the top half of an f32 */
}
AI float ldw1(int T, const void *row, int i) {
    return T == PD_F32 ? ((const float *)row)[i] : T == PD_F16 ? pd_f16_to_f32_inline(((const uint16_t *)row)[i])
                                                               : pd_bf16_to_f32(((const uint16_t *)row)[i]);
}
AI void ftile(int T, int R, int C, int k, const char *w, size_t ws, const char *x, size_t xs, float *y, size_t ys) {
    float32x4_t acc[4][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = vdupq_n_f32(0.0f);
    const int k4 = k & ~3;
    for (int i = 0; i < k4; i += 4) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float32x4_t wv = ldw4(T, w + r * ws, i);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) acc[r][c] = vfmaq_f32(acc[r][c], wv, vld1q_f32((const float *)(x + c * xs) + i));
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = vaddvq_f32(acc[r][c]);
            for (int i = k4; i < k; i++) s += ldw1(T, w + r * ws, i) * ((const float *)(x + c * xs))[i];
            y[c * ys + r] = s;
        }
}

/* A tile of any format: T picks its kernel (a constant in each table entry, folded away). */
AI void arm_tile(int T, int R, int C, int k, const char *w, size_t ws, const char *x, size_t xs, float *y, size_t ys) {
    if (T == PD_F32 || T == PD_F16 || T == PD_BF16) ftile(T, R, C, k, w, ws, x, xs, y, ys);
    else if (T == PD_Q2_K || T == PD_Q3_K || T == PD_Q4_K || T == PD_Q5_K || T == PD_Q6_K || T == PD_IQ4_XS)
        ktile(T, R, C, k / PD_QKK, w, ws, x, xs, y, ys);
    else atile(T, R, C, k / PD_QK, w, ws, x, xs, y, ys);
}
#if defined(ARM_MMLA)
#include "kernels/arm/mmla.h"
#else
#define ARM_TILE(R_, C_, r_, c_) arm_tile(T, R_, C_, k, (const char *)w + (size_t)(r_) * ws, ws, \
                                          (const char *)x + (size_t)(c_) * xs, xs, y + (size_t)(c_) * ys + (r_), ys)
#endif
/* A table entry: 4-row tiles, then single rows, each over the columns in groups of up to 4. */
#define ARM_MATMUL(name, type)                                                                \
    static void name(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,   \
                     int ncols, float *y, size_t ys) {                                        \
        const int T = (type);                                                                 \
        RUN_TILES(4, ARM_TILE)                                                                \
    }
ARM_MATMUL(matmul_q4_0, PD_Q4_0)
ARM_MATMUL(matmul_q4_1, PD_Q4_1)
ARM_MATMUL(matmul_q5_0, PD_Q5_0)
ARM_MATMUL(matmul_q5_1, PD_Q5_1)
ARM_MATMUL(matmul_q8_0, PD_Q8_0)
ARM_MATMUL(matmul_q2_k, PD_Q2_K)
ARM_MATMUL(matmul_q3_k, PD_Q3_K)
ARM_MATMUL(matmul_q4_k, PD_Q4_K)
ARM_MATMUL(matmul_q5_k, PD_Q5_K)
ARM_MATMUL(matmul_q6_k, PD_Q6_K)
ARM_MATMUL(matmul_iq4_nl, PD_IQ4_NL)   /* the codebook formats (formats.h) */
ARM_MATMUL(matmul_mxfp4, PD_MXFP4)
ARM_MATMUL(matmul_iq4_xs, PD_IQ4_XS)
ARM_MATMUL(matmul_f32, PD_F32)
ARM_MATMUL(matmul_f16, PD_F16)
ARM_MATMUL(matmul_bf16, PD_BF16)
#if defined(ARM_R16)   /* the dotprod and i8mm tables: the 16-row repacked layouts */
#include "kernels/arm/r16.h"
#endif

/* ---------------------------------------------------------------- KV cache, attention */
static void f32_to_f16(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4)   /* FCVTN rounds to nearest even, like pd_f32_to_f16 */
        vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = pd_f32_to_f16(x[i]);
}

AI float32x4_t ldkv4(const void *p, size_t i, int f16) {
    return f16 ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p + i))) : vld1q_f32((const float *)p + i);
}
AI float ldkv1(const void *p, size_t i, int f16) {
    return f16 ? pd_f16_to_f32_inline(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void attn_accum(float *out, const float *w, const void *v, size_t stride, int n, int hd, int f16) {
    int j0 = 0;
    for (; j0 + 16 <= hd; j0 += 16) {   /* 16 output dims in registers while the rows stream past */
        float32x4_t a0 = vld1q_f32(out + j0), a1 = vld1q_f32(out + j0 + 4);
        float32x4_t a2 = vld1q_f32(out + j0 + 8), a3 = vld1q_f32(out + j0 + 12);
        for (int i = 0; i < n; i++) {
            const size_t r = (size_t)i * stride + j0;
            a0 = vfmaq_n_f32(a0, ldkv4(v, r, f16), w[i]);
            a1 = vfmaq_n_f32(a1, ldkv4(v, r + 4, f16), w[i]);
            a2 = vfmaq_n_f32(a2, ldkv4(v, r + 8, f16), w[i]);
            a3 = vfmaq_n_f32(a3, ldkv4(v, r + 12, f16), w[i]);
        }
        vst1q_f32(out + j0, a0);
        vst1q_f32(out + j0 + 4, a1);
        vst1q_f32(out + j0 + 8, a2);
        vst1q_f32(out + j0 + 12, a3);
    }
    for (; j0 < hd; j0++)
        for (int i = 0; i < n; i++) out[j0] += w[i] * ldkv1(v, (size_t)i * stride + j0, f16);
}

/* Over a Q8_0 cache: per 32-value block, 8 accumulators while the rows stream past; each row's
 * int8 widened (SXTL twice) to floats and scaled by w[i] * d in one FMLA by element. */
static void attn_accum_q8(float *out, const float *w, const void *v, size_t row_bytes, int n, int hd) {
    for (int j = 0; j < hd / PD_QK; j++) {
        float32x4_t a[8];
        for (int c = 0; c < 8; c++) a[c] = vld1q_f32(out + j * PD_QK + 4 * c);
        const char *p = (const char *)v + (size_t)j * sizeof(pd_block_q8_0);
        for (int i = 0; i < n; i++, p += row_bytes) {
            const pd_block_q8_0 *b = (const pd_block_q8_0 *)p;
            const float s = w[i] * pd_f16_to_f32_inline(b->d);
            for (int h = 0; h < 2; h++) {
                const int8x16_t q = vld1q_s8(b->qs + 16 * h);
                const int16x8_t q0 = vmovl_s8(vget_low_s8(q)), q1 = vmovl_s8(vget_high_s8(q));
                a[4 * h + 0] = vfmaq_n_f32(a[4 * h + 0], vcvtq_f32_s32(vmovl_s16(vget_low_s16(q0))), s);
                a[4 * h + 1] = vfmaq_n_f32(a[4 * h + 1], vcvtq_f32_s32(vmovl_s16(vget_high_s16(q0))), s);
                a[4 * h + 2] = vfmaq_n_f32(a[4 * h + 2], vcvtq_f32_s32(vmovl_s16(vget_low_s16(q1))), s);
                a[4 * h + 3] = vfmaq_n_f32(a[4 * h + 3], vcvtq_f32_s32(vmovl_s16(vget_high_s16(q1))), s);
            }
        }
        for (int c = 0; c < 8; c++) vst1q_f32(out + j * PD_QK + 4 * c, a[c]);
    }
}

PD_ATTN_MH_BY_HEAD   /* kernels.h: the group's attention by one call per head of the loops above */

/* exp(x) for x <= 0 to ~2 ulp: exp_poly.h's reduction and polynomial, as x86/exp.h has them. */
AI float32x4_t exp4(float32x4_t x) {
    const float32x4_t lo = vdupq_n_f32(PD_EXP_MIN);
    const uint32x4_t under = vcltq_f32(x, lo);
    x = vmaxq_f32(x, lo);
    const float32x4_t k = vrndnq_f32(vmulq_n_f32(x, PD_EXP_LOG2E));
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(PD_EXP_LN2_HI));
    r = vfmsq_f32(r, k, vdupq_n_f32(PD_EXP_LN2_LO));
    float32x4_t p = vdupq_n_f32(PD_EXP_P5);
    p = vfmaq_f32(vdupq_n_f32(PD_EXP_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(PD_EXP_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(PD_EXP_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(PD_EXP_P1), p, r);
    p = vfmaq_f32(vdupq_n_f32(PD_EXP_P0), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
    const float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), under));
}
AI float exp1(float x) { return vgetq_lane_f32(exp4(vdupq_n_f32(x)), 0); }

static float exp_sub(float *x, int n, float shift) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), vdupq_n_f32(shift)));
        vst1q_f32(x + i, e);
        acc = vaddq_f32(acc, e);
    }
    float sum = vaddvq_f32(acc);
    for (; i < n; i++) {
        x[i] = exp1(x[i] - shift);
        sum += x[i];
    }
    return sum;
}

/* g = act(g) * u, act(x) = x * sigmoid(z), z = x (SiLU) or the tanh-GELU's 1.5957691216 *
 * (x + 0.044715 x^3): sigmoid from e = exp(-|z|), 1/(1+e) or e/(1+e) (x86/avx2.c's act_mul). */
static void act_mul(float *g, const float *u, int n, int gelu) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(g + i);
        const float32x4_t z = gelu ? vmulq_n_f32(vfmaq_f32(x, vmulq_n_f32(x, 0.044715f), vmulq_f32(x, x)), 1.5957691216f) : x;
        const float32x4_t e = exp4(vnegq_f32(vabsq_f32(z)));
        const float32x4_t r = vdivq_f32(one, vaddq_f32(one, e));
        const float32x4_t sg = vbslq_f32(vcltq_f32(z, vdupq_n_f32(0.0f)), vmulq_f32(e, r), r);
        vst1q_f32(g + i, vmulq_f32(vmulq_f32(x, sg), vld1q_f32(u + i)));
    }
    for (; i < n; i++) {
        const float x = g[i], z = gelu ? 1.5957691216f * (x + 0.044715f * x * x * x) : x;
        g[i] = x / (1.0f + expf(-z)) * u[i];
    }
}

/* ---------------------------------------------------------------- the sampler's vocabulary passes */
static double sum_exp(const float *x, int n, float scale, float shift) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 = vaddq_f32(a0, exp4(vmulq_n_f32(vsubq_f32(vld1q_f32(x + i), vdupq_n_f32(shift)), scale)));
        a1 = vaddq_f32(a1, exp4(vmulq_n_f32(vsubq_f32(vld1q_f32(x + i + 4), vdupq_n_f32(shift)), scale)));
    }
    float lanes[4];
    vst1q_f32(lanes, vaddq_f32(a0, a1));
    double s = 0.0;
    for (int j = 0; j < 4; j++) s += lanes[j];
    for (; i < n; i++) s += exp1(scale * (x[i] - shift));
    return s;
}

static int collect_above(const float *x, int n, float t, int32_t *out) {
    const float32x4_t vt = vdupq_n_f32(t);
    int nc = 0, i = 0;
    for (; i + 16 <= n; i += 16) {   /* most blocks hold nothing above t: one test per 16 */
        const uint32x4_t m = vorrq_u32(vorrq_u32(vcgtq_f32(vld1q_f32(x + i), vt), vcgtq_f32(vld1q_f32(x + i + 4), vt)),
                                       vorrq_u32(vcgtq_f32(vld1q_f32(x + i + 8), vt), vcgtq_f32(vld1q_f32(x + i + 12), vt)));
        if (vmaxvq_u32(m) == 0) continue;
        for (int q = i; q < i + 16; q++) if (x[q] > t) out[nc++] = q;
    }
    for (; i < n; i++) if (x[i] > t) out[nc++] = i;
    return nc;
}
#endif
