/* The i8mm table's batch tiles (SMMLA, ARMv8.6 FEAT_I8MM), included by kernels/arm/arm.h when
 * kernels/arm/i8mm.c defines ARM_MMLA: it sees arm.h's helpers (aunpack, dot32, arm_tile, ...) and
 * defines ARM_TILE, the tile every table entry of the file's layouts runs. */
#ifndef PD_ARM_MMLA_H
#define PD_ARM_MMLA_H
/* ---------------------------------------------------------------- i8mm: SMMLA batch tiles
 * The i8mm table (kernels/arm/i8mm.c defines ARM_MMLA) runs every 4-row tile of 2+ columns of a
 * legacy block format (Q4_0 .. Q8_0) in the file's layout as 2 x 2 sub-tiles: SMMLA multiplies 8 values of two rows (a 2 x 8 int8 matrix)
 * by the same 8 values of two columns into the four int32 dots [r0.c0, r0.c1, r1.c0, r1.c1],
 * 32 multiply-adds per instruction (SDOT: 16), and the four dots arrive in the lanes of one
 * register instead of each needing its own sum across lanes. Same exact integers per block;
 * each lane's float step is the scalar expression: bit-identical to scalar.c, so a row's
 * result still does not depend on its tile. An odd last column goes through the dot-product
 * path. Rows and columns are paired 8 bytes at a time (ZIP1/ZIP2 of 64-bit halves): weights
 * once per block and row pair, activations once per block and column pair. */
/* 16 values of two rows (or two columns), a and b, as SMMLA operands: values 0..7 of a then of
 * b, and values 8..15 of a then of b */
typedef struct { int8x16_t lo, hi; } mm_pair;
AI mm_pair mm_pair_of(int8x16_t a, int8x16_t b) {
    const int64x2_t a64 = vreinterpretq_s64_s8(a), b64 = vreinterpretq_s64_s8(b);
    const mm_pair p = { vreinterpretq_s8_s64(vzip1q_s64(a64, b64)), vreinterpretq_s8_s64(vzip2q_s64(a64, b64)) };
    return p;
}
AI mm_pair mm_cols(const int8_t *x0, const int8_t *x1) { return mm_pair_of(vld1q_s8(x0), vld1q_s8(x1)); }
/* acc + the 2 x 2 dots of two rows and two columns over 16 values */
AI int32x4_t mm16(int32x4_t acc, mm_pair w, mm_pair x) { return vmmlaq_s32(vmmlaq_s32(acc, w.lo, x.lo), w.hi, x.hi); }
AI float32x4_t rows2(float a, float b) { return vcombine_f32(vdup_n_f32(a), vdup_n_f32(b)); }   /* [a a b b] */
AI float32x4_t cols2(float a, float b) {                                                         /* [a b a b] */
    const float32x2_t v = vset_lane_f32(b, vdup_n_f32(a), 1);
    return vcombine_f32(v, v);
}
/* a 2 x 2 sub-tile's lanes into y (rows r, r + 1; columns c, c + 1 at y stride ys) */
AI void mm_store(float32x4_t v, float *y, size_t ys) {
    y[0] = vgetq_lane_f32(v, 0);
    y[ys] = vgetq_lane_f32(v, 1);
    y[1] = vgetq_lane_f32(v, 2);
    y[ys + 1] = vgetq_lane_f32(v, 3);
}
/* Legacy formats, 4 rows x C (2..4) columns: atile's arithmetic, lane by lane. */
AI void atile_mm(int T, int C, int nb, const char *w, size_t ws, const char *x, size_t xs, float *y, size_t ys) {
    const size_t bb = qblock_bytes(T);
    float32x4_t sum[2][2];
    float tail[4] = { 0, 0, 0, 0 };   /* an odd last column */
    for (int p = 0; p < 2; p++) sum[p][0] = sum[p][1] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        int8x16_t w0[4], w1[4];
        float dw[4], mw[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            aunpack(T, w + r * ws + b * bb, &w0[r], &w1[r], &dw[r], &mw[r]);
            __builtin_prefetch(w + r * ws + (b + 16) * bb);
        }
        mm_pair wp[2][2];
        for (int p = 0; p < 2; p++) {
            wp[p][0] = mm_pair_of(w0[2 * p], w0[2 * p + 1]);
            wp[p][1] = mm_pair_of(w1[2 * p], w1[2 * p + 1]);
        }
#pragma GCC unroll 2
        for (int q = 0; q < C / 2; q++) {
            const pd_q8 *x0 = (const pd_q8 *)(x + 2 * q * xs) + b, *x1 = (const pd_q8 *)(x + (2 * q + 1) * xs) + b;
            const mm_pair a0 = mm_cols(x0->qs, x1->qs), a1 = mm_cols(x0->qs + 16, x1->qs + 16);
            const float32x4_t dx = cols2(x0->d, x1->d), sx = cols2(x0->s, x1->s);
#pragma GCC unroll 2
            for (int p = 0; p < 2; p++) {
                const float32x4_t dot = vcvtq_f32_s32(mm16(mm16(vdupq_n_s32(0), wp[p][0], a0), wp[p][1], a1));
                /* scalar.c: blk = dw * dx * (float)dot [+ m * s]; sum += blk */
                float32x4_t blk = vmulq_f32(vmulq_f32(rows2(dw[2 * p], dw[2 * p + 1]), dx), dot);
                if (has_min(T)) blk = vaddq_f32(blk, vmulq_f32(rows2(mw[2 * p], mw[2 * p + 1]), sx));
                sum[p][q] = vaddq_f32(sum[p][q], blk);
            }
        }
        if (C & 1) {
            const pd_q8 *xb = (const pd_q8 *)(x + (C - 1) * xs) + b;
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) tail[r] += ablk(T, dw[r], mw[r], xb, (float)dot32(w0[r], w1[r], xb->qs));
        }
    }
    for (int q = 0; q < C / 2; q++)
        for (int p = 0; p < 2; p++) mm_store(sum[p][q], y + 2 * q * ys + 2 * p, ys);
    if (C & 1)
        for (int r = 0; r < 4; r++) y[(C - 1) * ys + r] = tail[r];
}

/* A 4-row tile of C >= 2 columns: SMMLA for the legacy block formats; the K-quants and the float
 * formats as the dotprod table runs them. (SMMLA K-quant tiles, two and four rows at a time, were
 * written and were bit-identical, but llvm-mca predicted them slower than the SDOT tile on every
 * i8mm core it models: per-row sub-block scales need a vector multiply-add per sub-block and
 * column pair, and four rows' unpacked nibbles, scales and paired activations spill; bench/README.md.) */
AI void arm_tile_mm(int T, int C, int k, const char *w, size_t ws, const char *x, size_t xs, float *y, size_t ys) {
    if (T == PD_Q4_0 || T == PD_Q4_1 || T == PD_Q5_0 || T == PD_Q5_1 || T == PD_Q8_0 || T == PD_IQ4_NL || T == PD_MXFP4)
        atile_mm(T, C, k / PD_QK, w, ws, x, xs, y, ys);   /* (the codebook formats: aunpack's lookup) */
    else arm_tile(T, 4, C, k, w, ws, x, xs, y, ys);
}
#define ARM_TILE(R_, C_, r_, c_)                                                                         \
    ((R_) == 4 && (C_) >= 2                                                                              \
         ? arm_tile_mm(T, C_, k, (const char *)w + (size_t)(r_) * ws, ws, (const char *)x + (size_t)(c_) * xs, xs, \
                       y + (size_t)(c_) * ys + (r_), ys)                                                 \
         : arm_tile(T, R_, C_, k, (const char *)w + (size_t)(r_) * ws, ws, (const char *)x + (size_t)(c_) * xs, xs, \
                    y + (size_t)(c_) * ys + (r_), ys))
#endif
