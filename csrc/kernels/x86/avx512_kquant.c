/* The AVX-512 table's K-quant kernels (compiled with x86/avx512.c's flags; see that file's
 * header for the design, and the section comment below for the layout). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#include "kernels/x86/avx512.h"

/* ---------------------------------------------------------------- K-quants x pd_q8k
 *
 * A super-block row is unpacked to 4 registers u[j] of 64 unsigned quants (stored values,
 * offsets not removed); which 32-value chunks t (values 32t..32t+31) share a register follows
 * the storage of each format:
 *   Q2_K, Q3_K: u[g] = chunks g | 4+g    (2-bit field g of the 64 qs bytes)
 *   Q4_K, Q5_K: u[0..3] = 0|2, 1|3, 4|6, 5|7   (low / high nibbles of qs[0..63], qs[64..127])
 *   Q6_K:       u[0..3] = 0|1, 2|3, 4|5, 6|7   (low / high nibbles of ql[0..63], ql[64..127])
 * The activations of a column are rearranged the same way once per super-block (act_k). Each
 * 128-bit lane of a register is 16 values of one sub-block, so the int16 scale vector of u[j]
 * has one scale per lane (vpermw from the 16 scales). Sums as in kernels/x86/avx2.c: isum (int32,
 * 16 lanes) of sc*u*a, offsets off * sum sc*bsums (Q3_K 4, Q6_K 32) and minima sum m*bsums
 * through vpmaddwd; per super-block the rows' sums are reduced together and converted once.
 */

/* Word indices: scale vector j of the format, 8 copies of one of the 16 int16 scales per lane. */
AI __m512i kscale_idx(int T, int j) {
    int s[4];
    if (T == T_Q2_K || T == T_Q3_K) { s[0] = 2 * j; s[1] = 2 * j + 1; s[2] = 8 + 2 * j; s[3] = 9 + 2 * j; }
    else if (T == T_Q6_K) { s[0] = 4 * j; s[1] = 4 * j + 1; s[2] = 4 * j + 2; s[3] = 4 * j + 3; }
    else if (T == T_IQ4_XS) { const int b0 = j < 2 ? 0 : 4; s[0] = b0; s[1] = b0 + 1; s[2] = b0 + 2; s[3] = b0 + 3; }
    else { const int t0 = j < 2 ? j : j + 2; s[0] = s[1] = t0; s[2] = s[3] = t0 + 2; }   /* Q4/5_K */
    return _mm512_set_epi16(s[3], s[3], s[3], s[3], s[3], s[3], s[3], s[3],
                            s[2], s[2], s[2], s[2], s[2], s[2], s[2], s[2],
                            s[1], s[1], s[1], s[1], s[1], s[1], s[1], s[1],
                            s[0], s[0], s[0], s[0], s[0], s[0], s[0], s[0]);
}

/* A column's super-block activations, arranged as the format's u[j] (see above). */
AI void act_k(int T, const pd_q8k *xb, __m512i a[4]) {
    const __m512i x0 = _mm512_loadu_si512(xb->qs), x1 = _mm512_loadu_si512(xb->qs + 64),
                  x2 = _mm512_loadu_si512(xb->qs + 128), x3 = _mm512_loadu_si512(xb->qs + 192);
    if (T == T_Q6_K) { a[0] = x0; a[1] = x1; a[2] = x2; a[3] = x3; return; }
    if (T == T_IQ4_XS) {                   /* first / second halves of sub-blocks 0..3, then 4..7 */
        a[0] = _mm512_shuffle_i64x2(x0, x1, 0x88); a[1] = _mm512_shuffle_i64x2(x0, x1, 0xdd);
        a[2] = _mm512_shuffle_i64x2(x2, x3, 0x88); a[3] = _mm512_shuffle_i64x2(x2, x3, 0xdd);
        return;
    }
    if (T == T_Q4_K || T == T_Q5_K) {      /* 0|2, 1|3, 4|6, 5|7 */
        a[0] = _mm512_shuffle_i64x2(x0, x1, 0x44); a[1] = _mm512_shuffle_i64x2(x0, x1, 0xee);
        a[2] = _mm512_shuffle_i64x2(x2, x3, 0x44); a[3] = _mm512_shuffle_i64x2(x2, x3, 0xee);
        return;
    }
    /* Q2_K, Q3_K: g | 4+g */
    a[0] = _mm512_shuffle_i64x2(x0, x2, 0x44); a[1] = _mm512_shuffle_i64x2(x0, x2, 0xee);
    a[2] = _mm512_shuffle_i64x2(x1, x3, 0x44); a[3] = _mm512_shuffle_i64x2(x1, x3, 0xee);
}

/* Byte pattern selecting the bit of qh / hmask (both halves: the same 32 bytes) that is bit 4
 * (Q5_K) or bit 2 (Q3_K) of register j's values: chunk t's bit is bit t. */
AI __m512i kbit_sel(int T, int j) {
    int t0, t1;
    if (T == T_Q5_K) { t0 = j < 2 ? j : j + 2; t1 = t0 + 2; }
    else { t0 = j; t1 = j + 4; }
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi8((char)(1 << t0))),
                              _mm256_set1_epi8((char)(1 << t1)), 1);
}

/* One row's super-block: the 4 unsigned quant registers and the 16 int16 scales. IQ4_XS (signed
 * codebook values w): u = |w| and neg the bytes where w < 0, whose activations the tile negates
 * (AVX-512 has no vpsignb): |w| * (a * sign(w)) = w * a, pair sums <= 2 * 127 * 127. Its 8
 * sub-block scales are sc16's words 0..7; u[0], u[1] hold the low / high nibbles of sub-blocks
 * 0..3 (one per 128-bit lane), u[2], u[3] those of 4..7. */
AI void kunpack(int T, const char *blk, __m512i u[4], __m256i *sc16, __m256i *mins16, __mmask64 neg[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (T == T_IQ4_XS) {   /* |w| by a table of |codebook|; w < 0 exactly for the indices 0..7 */
        *sc16 = iq4xs_scales16(blk);
        const __m512i kabs = _mm512_abs_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)pd_kvalues_iq4nl)));
        const __m512i b3 = _mm512_set1_epi8(8);
        const char *qs = blk + offsetof(pd_block_iq4_xs, qs);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i v = _mm512_loadu_si512(qs + 64 * h);
            const __m512i n0 = _mm512_and_si512(v, m4), n1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            neg[2 * h] = _mm512_testn_epi8_mask(n0, b3);
            neg[2 * h + 1] = _mm512_testn_epi8_mask(n1, b3);
            u[2 * h] = _mm512_shuffle_epi8(kabs, n0);
            u[2 * h + 1] = _mm512_shuffle_epi8(kabs, n1);
        }
        return;
    }
    if (T == T_Q4_K || T == T_Q5_K) {
        const __m128i scm = scales_k4(blk + 4);
        *sc16 = _mm256_cvtepu8_epi16(scm);   /* sc0..7, m0..7 */
        *mins16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));   /* m0 m0 m1 m1 .. */
        const char *qs = blk + (T == T_Q4_K ? offsetof(pd_block_q4_k, qs) : offsetof(pd_block_q5_k, qs));
        const __m512i v0 = _mm512_loadu_si512(qs), v1 = _mm512_loadu_si512(qs + 64);
        u[0] = _mm512_and_si512(v0, m4);
        u[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
        u[2] = _mm512_and_si512(v1, m4);
        u[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
        if (T == T_Q5_K) {
            const __m512i qh = _mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)(blk + offsetof(pd_block_q5_k, qh))));
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                u[j] = _mm512_mask_add_epi8(u[j], _mm512_test_epi8_mask(qh, kbit_sel(T, j)), u[j],
                                            _mm512_set1_epi8(0x10));
        }
        return;
    }
    if (T == T_Q2_K || T == T_Q3_K) {
        if (T == T_Q2_K) {
            const __m128i sm = _mm_loadu_si128((const __m128i *)blk);
            *sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(0x0f)));
            *mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0f)));
        } else {
            *sc16 = _mm256_cvtepi8_epi16(scales_q3k(blk + offsetof(pd_block_q3_k, scales)));
        }
        const char *qs = blk + (T == T_Q2_K ? offsetof(pd_block_q2_k, qs) : offsetof(pd_block_q3_k, qs));
        const __m512i v = _mm512_loadu_si512(qs), m3 = _mm512_set1_epi8(3);
        u[0] = _mm512_and_si512(v, m3);
        u[1] = _mm512_and_si512(_mm512_srli_epi16(v, 2), m3);
        u[2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m3);
        u[3] = _mm512_and_si512(_mm512_srli_epi16(v, 6), m3);
        if (T == T_Q3_K) {
            const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)blk));
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                u[j] = _mm512_mask_add_epi8(u[j], _mm512_test_epi8_mask(hm, kbit_sel(T, j)), u[j],
                                            _mm512_set1_epi8(4));
        }
        return;
    }
    /* Q6_K: per half h, 64 bytes of low nibbles (chunks 4h, 4h+1 low; 4h+2, 4h+3 high) and
     * 32 bytes of 2-bit pairs (chunk 4h+g at bits 2g), moved to bits 4..5 by 64-bit shifts */
    *sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + offsetof(pd_block_q6_k, scales))));
    const __m512i m30 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512(blk + 64 * h);
        const __m512i qh = _mm512_broadcast_i64x4(
            _mm256_loadu_si256((const __m256i *)(blk + offsetof(pd_block_q6_k, qh) + 32 * h)));
        const __m512i hlo = _mm512_sllv_epi64(qh, _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2));
        const __m512i hhi = _mm512_srlv_epi64(qh, _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2));
        /* (a & 0x0f) | (b & 0x30) as one bit select c ? a : b with c = 0x0f, b masked first */
        u[2 * h] = _mm512_ternarylogic_epi32(l, _mm512_and_si512(hlo, m30), m4, 0xe4);
        u[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l, 4), _mm512_and_si512(hhi, m30), m4, 0xe4);
    }
}

AI __m256i fold(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* Y[c][r] for an R x C tile over nb super-blocks. */
AI void tile_k(int T, int R, int C, int nb, const char *w, size_t ws, const char *x, size_t xs,
               float *y, size_t ys) {
    const size_t bb = kblk_bytes(T);
    __m256 acc[KCMAX];   /* lanes 0..3: rows 0..3 (k_accumulate) */
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    pd_pf pf = pf_init(w, nb * bb, ws);
    for (int b = 0; b < nb; b++, pf_advance(&pf, bb)) {
        const char *wb = w + b * bb;
        const pd_q8k *xb[KCMAX];
        __m512i a[KCMAX][4];
        __m256i bs[KCMAX];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            xb[c] = (const pd_q8k *)(x + c * xs) + b;
            act_k(T, xb[c], a[c]);
            bs[c] = _mm256_loadu_si256((const __m256i *)xb[c]->bsums);
        }
        __m256i isum[KCMAX][8];   /* [c][r]: rows in 0..3, min sums in 4..7, as reduce8 takes */
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            for (size_t o = 0; o < bb; o += 64) _mm_prefetch(pf.p + r * ws + o, _MM_HINT_T0);
            __m512i u[4];
            __m256i sc16, mins16 = _mm256_setzero_si256();
            __mmask64 neg[4];
            kunpack(T, wb + r * ws, u, &sc16, &mins16, neg);
            __m512i scv[4];
            const __m512i s512 = _mm512_castsi256_si512(sc16);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) scv[j] = _mm512_permutexvar_epi16(kscale_idx(T, j), s512);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    const __m512i aj = T == T_IQ4_XS ? _mm512_mask_sub_epi8(a[c][j], neg[j], _mm512_setzero_si512(), a[c][j])
                                                     : a[c][j];
                    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(u[j], aj), scv[j]);
                }
                __m256i f = fold(s);
                if (T == T_Q3_K || T == T_Q6_K)   /* stored offset off = 4 / 32 */
                    f = _mm256_sub_epi32(f, _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs[c]), T == T_Q3_K ? 2 : 5));
                isum[c][r] = f;
                if (k_has_min(T)) isum[c][4 + r] = _mm256_madd_epi16(mins16, bs[c]);
            }
        }
        k_accumulate(T, R, C, wb, ws, isum, xb, acc);
    }
    k_store(T, R, C, acc, y, ys);
}

PD_K_MATMULS   /* matmul_q2_k .. matmul_q6_k over tile_k (tiles.h) */
PD_K_MATMUL(matmul_iq4_xs, T_IQ4_XS)

/* For the table in x86/avx512.c. */
#define PD_AVX512_EXPORT(fn) extern __typeof__(fn) pd_avx512_##fn __attribute__((alias(#fn)));
PD_AVX512_EXPORT(matmul_q2_k)
PD_AVX512_EXPORT(matmul_q3_k)
PD_AVX512_EXPORT(matmul_q4_k)
PD_AVX512_EXPORT(matmul_q5_k)
PD_AVX512_EXPORT(matmul_q6_k)
PD_AVX512_EXPORT(matmul_iq4_xs)
#endif
