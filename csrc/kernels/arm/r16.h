/* The legacy formats repacked by 16 rows (PD_*_R16, formats.h: built at load by pd_repack) on
 * ARM64, for the dotprod and i8mm tables (kernels/arm/arm.h includes this where the includer
 * defines ARM_R16). The layout was made for x86's vpdpbusd, and it suits SDOT by element just
 * as well: a 16-byte load of a record's group holds 4 bytes (4 consecutive values) of each of 4
 * rows, and SDOT Vd.4S, Vn.16B, Vm.4B[l] dots each row's 4 bytes with the same 4 activation
 * bytes: the 4 rows' integer dots accumulate in the 4 lanes of one register, with no sum across
 * lanes and one vector float step per 4 rows, where the file's layout needs per row a sum
 * across lanes and a scalar float step per block (bench/README.md: llvm-mca).
 *
 * Arithmetic: pd_scalar_matmul_r16's (kernels/scalar.c), lane by lane, so the bits are its:
 * per block the exact integer sum(u * a) (Q8_0's unsigned u = w + 128 as SDOT of the signed w
 * plus 128 * sum(a)), then acc = fma(float(dot), d * dx, acc), acc = fma(mw, s, acc) with
 * mw = m or d * -offset (vfmaq rounds once, as fmaf does).
 *
 * A record's 16 rows go in 4 quarters of 4 rows, each over all blocks, with up to 4 columns:
 * 8 unpacked weight registers, 2 activation registers and 2 accumulators per column. The same
 * tile serves decode and batches: SDOT by element reuses each activation register for every
 * row, so llvm-mca predicts it above both SMMLA tiles (on the file's layout, kernels/arm/mmla.h,
 * and on this one, where each 2 x 8 operand costs a ZIP) for the nibble formats (Q4_*, Q5_*); Q8_0 it leaves
 * to the i8mm table's file-layout SMMLA tile (bench/README.md). */
#ifndef PD_ARM_R16_H
#define PD_ARM_R16_H

/* Quarter qr (rows 4qr..4qr+3) of the record blk: u[h] (h < 8) holds values 4h..4h+3 of each
 * of the 4 rows, as SDOT's signed bytes (Q8_0: w = u - 128; the others: u itself, <= 31). */
AI void r16_unpack(int RT, const char *blk, int qr, int8x16_t u[8]) {
    const uint8_t *qs = (const uint8_t *)blk + pd_r16_qs_off(RT) + 16 * qr;
    if (RT == PD_Q8_0_R16) {
        for (int h = 0; h < 8; h++) u[h] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(qs + 64 * h), vdupq_n_u8(0x80)));
        return;
    }
    uint64_t hm[8];
    if (pd_r16_has_hmask(RT)) memcpy(hm, blk + pd_r16_hmask_off(RT), sizeof hm);
    for (int g = 0; g < 4; g++) {   /* low nibbles: values 4g..4g+3; high: 16 + 4g.. */
        const uint8x16_t v = vld1q_u8(qs + 64 * g);
        uint8x16_t lo = vandq_u8(v, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(v, 4);
        if (pd_r16_has_hmask(RT)) {   /* lane 4j + t of the quarter is bit 16qr + 4j + t of hm[g], hm[g + 4] */
            lo = vorrq_u8(lo, fifth_bits((uint8_t)(hm[g] >> 16 * qr), (uint8_t)(hm[g] >> (16 * qr + 8))));
            hi = vorrq_u8(hi, fifth_bits((uint8_t)(hm[g + 4] >> 16 * qr), (uint8_t)(hm[g + 4] >> (16 * qr + 8))));
        }
        u[g] = vreinterpretq_s8_u8(lo);
        u[g + 4] = vreinterpretq_s8_u8(hi);
    }
}

/* The quarter's d (and mw) as floats, rows 4qr..4qr+3 */
AI float32x4_t r16_d(const char *blk, int qr) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)blk + 4 * qr)));
}
AI float32x4_t r16_mw(int RT, const char *blk, int qr, float32x4_t dw) {
    if (pd_r16_has_min(RT))
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(blk + pd_r16_m_off(RT)) + 4 * qr)));
    return vmulq_n_f32(dw, (float)-pd_r16_offset(RT));
}
/* Q8_0: 128 * sum(a), the integer u = w + 128 adds over the block */
AI int32_t r16_q8_seed(int RT, const pd_q8 *xb) {
    return RT == PD_Q8_0_R16 ? 128 * ((int32_t)vaddlvq_s8(vld1q_s8(xb->qs)) + (int32_t)vaddlvq_s8(vld1q_s8(xb->qs + 16))) : 0;
}

/* One block's integer dots of the quarter's 4 rows with one column: 8 SDOT by element */
AI int32x4_t r16_dot4(const int8x16_t u[8], const int8_t *a, int32x4_t acc) {
    const int8x16_t a0 = vld1q_s8(a), a1 = vld1q_s8(a + 16);
    acc = vdotq_laneq_s32(acc, u[0], a0, 0);
    acc = vdotq_laneq_s32(acc, u[1], a0, 1);
    acc = vdotq_laneq_s32(acc, u[2], a0, 2);
    acc = vdotq_laneq_s32(acc, u[3], a0, 3);
    acc = vdotq_laneq_s32(acc, u[4], a1, 0);
    acc = vdotq_laneq_s32(acc, u[5], a1, 1);
    acc = vdotq_laneq_s32(acc, u[6], a1, 2);
    return vdotq_laneq_s32(acc, u[7], a1, 3);
}

/* Rows 4qr..4qr+3 of the 16 at g, C (1..4) columns: y[c * ys + i] for the quarter's row i. */
AI void r16_quarter(int RT, int C, int nb, const char *g, int qr, const char *x, size_t xs, float *y, size_t ys) {
    const size_t rb = pd_r16_bytes(RT);
    float32x4_t acc[4];
    for (int c = 0; c < C; c++) acc[c] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        const char *blk = g + (size_t)b * rb;
        __builtin_prefetch(blk + 8 * rb + pd_r16_qs_off(RT) + 16 * qr);
        int8x16_t u[8];
        r16_unpack(RT, blk, qr, u);
        const float32x4_t dw = r16_d(blk, qr), mw = r16_mw(RT, blk, qr, dw);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const pd_q8 *xb = (const pd_q8 *)(x + c * xs) + b;
            const int32x4_t dot = r16_dot4(u, xb->qs, vdupq_n_s32(r16_q8_seed(RT, xb)));
            acc[c] = vfmaq_f32(acc[c], vcvtq_f32_s32(dot), vmulq_n_f32(dw, xb->d));
            acc[c] = vfmaq_n_f32(acc[c], mw, xb->s);
        }
    }
    for (int c = 0; c < C; c++) vst1q_f32(y + c * ys, acc[c]);
}

#define R16_QUARTER(C, qr, g, xc, yc) r16_quarter(RT, C, nb, g, qr, xc, xs, (yc) + 4 * (qr), ys)
AI void matmul_r16(int RT, int k, const void *w, size_t ws, int nrows, const void *x, size_t xs, int ncols,
                   float *y, size_t ys) {
    const int nb = k / PD_QK;
    RUN_R16_TILES(4, R16_QUARTER)
}
#define ARM_R16_MATMUL(name, rt)                                                                 \
    static void name(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,      \
                     int ncols, float *y, size_t ys) { matmul_r16(rt, k, w, ws, nrows, x, xs, ncols, y, ys); }
ARM_R16_MATMUL(matmul_q4_0_r16, PD_Q4_0_R16)
ARM_R16_MATMUL(matmul_q4_1_r16, PD_Q4_1_R16)
ARM_R16_MATMUL(matmul_q5_0_r16, PD_Q5_0_R16)
ARM_R16_MATMUL(matmul_q5_1_r16, PD_Q5_1_R16)
#if !defined(ARM_MMLA)   /* (the i8mm table keeps Q8_0 in the file's layout) */
ARM_R16_MATMUL(matmul_q8_0_r16, PD_Q8_0_R16)
#endif
/* The table entries (after PD_KERNEL_TABLE's name). A format without one stays in the file's
 * layout (load.c repacks only where the table has the repacked type's matmul): the i8mm table
 * keeps Q8_0 there, where its SMMLA batch tile beats this one and decode is even. */
#define ARM_R16_NIBBLE_ENTRIES .matmul[PD_Q4_0_R16] = matmul_q4_0_r16, .matmul[PD_Q4_1_R16] = matmul_q4_1_r16, \
    .matmul[PD_Q5_0_R16] = matmul_q5_0_r16, .matmul[PD_Q5_1_R16] = matmul_q5_1_r16
#endif
