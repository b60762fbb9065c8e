/* x86 helpers shared by the 256/512-bit kernel files (kernels/x86/avx2.c, kernels/x86/avxvnni.c,
 * kernels/x86/avx512.c). Included, not linked: each file compiles them with its own ISA flags.
 * The includer defines PF_DIST first. */
#ifndef PD_X86_COMMON_H
#define PD_X86_COMMON_H
#include "kernels/kernels.h"
#include "kernels/run_tiles.h"
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

AI uint16_t ld16(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
AI int32_t ld32(const void *p) { int32_t v; memcpy(&v, p, 4); return v; }

/* Software prefetch for a 4-row tile walking its rows in lock-step: the byte PF_DIST ahead in
 * the same row, or, past the row's end, in the rows 4 (8, ...) below, which the next tiles read
 * first; the hardware prefetcher cannot guess those jumps. pf points at row 0's target. */
typedef struct { const char *p; size_t off, rb, jump; } pd_pf;

AI pd_pf pf_init(const char *w, size_t rb, size_t ws) {
    const size_t tiles = PF_DIST / rb;
    return (pd_pf){w + tiles * 4 * ws + PF_DIST % rb, PF_DIST % rb, rb, 4 * ws - rb};
}
AI void pf_advance(pd_pf *pf, size_t bytes) {
    pf->p += bytes;
    pf->off += bytes;
    if (pf->off >= pf->rb) { pf->off -= pf->rb; pf->p += pf->jump; }
}

/* [sum of the 8 lanes of v[j]] for j < 8: a transposing reduction (per 128-bit half, hadd
 * pairs up lanes of two vectors; the final add joins the halves). */
AI __m256i reduce8(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}
/* The same for 4 vectors: [sum v[0], .., sum v[3]]. */
AI __m128i reduce4(const __m256i v[4]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
}

/* ---- legacy block formats (x pd_q8): sizes, nibble / fifth-bit unpacking, f16 scales ---- */

/* (T_IQ4_NL, T_MXFP4: the codebook formats of formats.h, also 32 values x pd_q8) */
enum { T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0, T_IQ4_NL, T_MXFP4 };

AI size_t blk_bytes(int T) {
    return T == T_Q4_0 ? sizeof(pd_block_q4_0) : T == T_Q4_1 ? sizeof(pd_block_q4_1)
         : T == T_Q5_0 ? sizeof(pd_block_q5_0) : T == T_Q5_1 ? sizeof(pd_block_q5_1)
         : T == T_IQ4_NL ? sizeof(pd_block_iq4_nl) : T == T_MXFP4 ? sizeof(pd_block_mxfp4)
         : sizeof(pd_block_q8_0);
}
/* Formats whose unpacked weights are signed bytes (Q8_0 and the codebook ones). */
AI int signed_quants(int T) { return T == T_Q8_0 || T == T_IQ4_NL || T == T_MXFP4; }

AI int has_min(int T) { return T == T_Q4_1 || T == T_Q5_1; }

/* 16 bytes of nibbles -> 32 bytes: the low nibbles are values 0..15, the high ones 16..31.
 * Both lanes get the 16 bytes; the upper lane is shifted right by 4 before the mask. */
AI __m256i nibbles(const char *qs) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)),
                            _mm256_set1_epi8(0x0f));
}

/* The 32 fifth bits (little-endian word at qh) -> 0x10 in byte j where bit j is set. */
AI __m256i fifth_bits(const char *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                              0x0303030303030303);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread); /* byte j: byte j/8 of h */
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* The f16 at p + r*stride for r < R as floats in lanes 0..R-1 (zeros after). */
AI __m128 load_h4(const char *p, size_t stride, int R) {
    return _mm_cvtph_ps(_mm_setr_epi16((short)ld16(p), R > 1 ? (short)ld16(p + stride) : 0,
                                       R > 2 ? (short)ld16(p + 2 * stride) : 0,
                                       R > 3 ? (short)ld16(p + 3 * stride) : 0, 0, 0, 0, 0));
}

/* The E8M0 byte at p + r*stride for r < R as 2^(e - 128) (formats.h: pd_e8m0_half) in lanes
 * 0..R-1 (zeros after): (e - 1) << 23 as float bits, or the subnormals 0x200000 << e for e < 2. */
AI __m128 load_e4(const char *p, size_t stride, int R) {
    const __m128i e = _mm_setr_epi32((uint8_t)p[0], R > 1 ? (uint8_t)p[stride] : 0,
                                     R > 2 ? (uint8_t)p[2 * stride] : 0, R > 3 ? (uint8_t)p[3 * stride] : 0);
    const __m128i big = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
    const __m128i small = _mm_sllv_epi32(_mm_set1_epi32(0x200000), e);
    const __m128i v = _mm_blendv_epi8(big, small, _mm_cmplt_epi32(e, _mm_set1_epi32(2)));
    return _mm_and_ps(_mm_castsi128_ps(v), _mm_castsi128_ps(_mm_setr_epi32(-1, R > 1 ? -1 : 0, R > 2 ? -1 : 0,
                                                                             R > 3 ? -1 : 0)));
}
/* 8 E8M0 bytes at p as 2^(e - 128) (load_e4's arithmetic): the rows' scales of a PD_MXFP4_R16 record. */
AI __m256 load_e8(const char *p) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(big, small, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}
/* A block's scale for rows 0..R-1 of a tile: f16 at the block's start, MXFP4's E8M0 byte. */
AI __m128 load_scale4(int T, const char *p, size_t stride, int R) {
    return T == T_MXFP4 ? load_e4(p, stride, R) : load_h4(p, stride, R);
}

/* The codebook formats: where a block's nibbles start, and the 16-entry table in both 128-bit
 * lanes, + 128 where `biased` (the unsigned bytes the VNNI kernels dot, with the offset 128 removed
 * as Q8_0's); vpshufb of the nibbles (nibbles()) into it is the table lookup. */
AI size_t cb_qs_off(int T) { return T == T_MXFP4 ? offsetof(pd_block_mxfp4, qs) : offsetof(pd_block_iq4_nl, qs); }
AI __m256i codebook256(int T, int biased) {
    const __m128i t = _mm_loadu_si128((const __m128i *)(T == T_MXFP4 ? pd_kvalues_mxfp4 : pd_kvalues_iq4nl));
    return _mm256_broadcastsi128_si256(biased ? _mm_xor_si128(t, _mm_set1_epi8((char)0x80)) : t);
}
AI __m256i codebook_lookup(int T, const char *blk, int biased) {
    return _mm256_shuffle_epi8(codebook256(T, biased), nibbles(blk + cb_qs_off(T)));
}
/* The codebook table (+ 128) of a repacked codebook format, in both 128-bit lanes. */
AI __m256i r16_codebook256(int RT) { return codebook256(RT == PD_MXFP4_R16 ? T_MXFP4 : T_IQ4_NL, 1); }

AI __m256 bcast_lane(__m256 v2, int r) {   /* v2 holds the same 4 floats in both halves */
    switch (r) {
    case 0: return _mm256_shuffle_ps(v2, v2, 0x00);
    case 1: return _mm256_shuffle_ps(v2, v2, 0x55);
    case 2: return _mm256_shuffle_ps(v2, v2, 0xaa);
    default: return _mm256_shuffle_ps(v2, v2, 0xff);
    }
}

/* ---- K-quant block layouts: sizes, scale offsets and the packed 6-bit / Q3_K scales ---- */

/* (T_IQ4_XS: the codebook K-format of formats.h, d at 0, no minimum) */
enum { T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K, T_IQ4_XS };

AI size_t kblk_bytes(int T) {
    return T == T_Q2_K ? sizeof(pd_block_q2_k) : T == T_Q3_K ? sizeof(pd_block_q3_k)
         : T == T_Q4_K ? sizeof(pd_block_q4_k) : T == T_Q5_K ? sizeof(pd_block_q5_k)
         : T == T_IQ4_XS ? sizeof(pd_block_iq4_xs) : sizeof(pd_block_q6_k);
}
/* IQ4_XS's 8 sub-block scales (ls - 32) as int16, the same in both 128-bit halves. */
AI __m256i iq4xs_scales16(const char *blk) {
    const __m128i ls = _mm_cvtsi64_si128((long long)pd_iq4xs_scales_u8((const pd_block_iq4_xs *)blk));
    return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_sub_epi8(ls, _mm_set1_epi8(32))));
}
AI int k_has_min(int T) { return T == T_Q2_K || T == T_Q4_K || T == T_Q5_K; }
AI size_t k_d_off(int T) {   /* byte offset of d; dmin follows it (formats with a minimum) */
    return T == T_Q2_K ? offsetof(pd_block_q2_k, d) : T == T_Q3_K ? offsetof(pd_block_q3_k, d)
         : T == T_Q6_K ? offsetof(pd_block_q6_k, d) : 0;
}

/* The end of a K-quant tile's super-block, the same for every x86 table: the R rows' exact
 * integer sums isum[c][r] (and min sums isum[c][4 + r]; rows past R zeroed here), then per row
 * the scalar table's float expression acc += dx * (d * isum - dmin * msum), rounded as written
 * (no fma), so every x86 K-quant kernel is bit-identical to the scalar one, and to the repacked
 * layouts' kernels (formats.h: PD_Q4_K_R16): which layout a load picks never changes a logit. */
AI void k_accumulate(int T, int R, int C, const char *wb, size_t ws, __m256i isum[][8],
                     const pd_q8k *const *xb, __m256 *acc) {
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int r = R; r < 4; r++) isum[c][r] = isum[c][4 + r] = _mm256_setzero_si256();
    const __m128 d = load_h4(wb + k_d_off(T), ws, R);
    if (k_has_min(T)) {
        const __m128 dmin = load_h4(wb + k_d_off(T) + 2, ws, R);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const __m256 s = _mm256_cvtepi32_ps(reduce8(isum[c]));   /* lanes 0..3 isum, 4..7 msum */
            const __m128 t = _mm_sub_ps(_mm_mul_ps(d, _mm256_castps256_ps128(s)),
                                        _mm_mul_ps(dmin, _mm256_extractf128_ps(s, 1)));
            acc[c] = _mm256_castps128_ps256(_mm_add_ps(_mm256_castps256_ps128(acc[c]),
                                                       _mm_mul_ps(_mm_set1_ps(xb[c]->d), t)));
        }
    } else {
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const __m128 t = _mm_mul_ps(d, _mm_cvtepi32_ps(reduce4(isum[c])));
            acc[c] = _mm256_castps128_ps256(_mm_add_ps(_mm256_castps256_ps128(acc[c]),
                                                       _mm_mul_ps(_mm_set1_ps(xb[c]->d), t)));
        }
    }
}

/* ... and after the last super-block, each row's value into y. */
AI void k_store(int T, int R, int C, const __m256 *acc, float *y, size_t ys) {
    (void)T;
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        float v[8];
        _mm256_storeu_ps(v, acc[c]);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) y[c * ys + r] = v[r];
    }
}

/* The int16 pairs of a column's 32-value activation sums B_s = bsums[2s] + bsums[2s+1] that the
 * Q4_K 16-row kernels (x86/avx512_kr16.c, x86/kr16_256.h) multiply with the minima pairs
 * (m0, m2), (m1, m3), (m4, m6), (m5, m7) of each lane: bp[i] = B_a | B_b << 16. */
AI void kr16_min_pairs(const int16_t *bs, int32_t bp[4]) {
    for (int i = 0; i < 4; i++) {
        const int s = (i & 1) + 4 * (i >> 1);        /* pairs (0,2) (1,3) (4,6) (5,7) */
        const int lo = bs[2 * s] + bs[2 * s + 1], hi = bs[2 * s + 4] + bs[2 * s + 5];
        bp[i] = (int32_t)(((uint32_t)(uint16_t)lo) | ((uint32_t)(uint16_t)hi << 16));
    }
}

/* v holds 8 int16 scales, the same in both 128-bit halves: lanes 0..7 <- v[ia], 8..15 <- v[ib]
 * (the scales of the two 16-value halves of a chunk; ia == ib for Q4_K/Q5_K's 32-value ones). */
AI __m256i bcast16(__m256i v, int ia, int ib) {
    const short a = (short)(2 * ia | (2 * ia + 1) << 8), b = (short)(2 * ib | (2 * ib + 1) << 8);
    return _mm256_shuffle_epi8(v, _mm256_setr_epi16(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b));
}
AI __m256i lo_both(__m256i v) { return _mm256_permute2x128_si256(v, v, 0x00); }
AI __m256i hi_both(__m256i v) { return _mm256_permute2x128_si256(v, v, 0x11); }

/* Q4_K/Q5_K scale bytes -> [sc0..7, m0..7] (pd_unpack_scales_k4's word trick, in one register).
 * Reads 16 bytes from s: the 12 scale bytes are followed by >= 4 more of the block. */
AI __m128i scales_k4(const char *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));   /* a0 a2 a1 a2 */
    const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));   /* a0 a0 a1 a1 */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(b, 6), _mm_setr_epi32(0, 0x03030303, 0, 0x03030303));
    return _mm_or_si128(lo, _mm_slli_epi32(hi, 4));
}
/* Q3_K scale bytes -> 16 signed scales (pd_unpack_scales_q3k's trick). Reads exactly 12 bytes:
 * they are the last but 2 of the block, which may be the last of the tensor. */
AI __m128i scales_q3k(const char *s) {
    int32_t a2;
    memcpy(&a2, s + 8, 4);
    const __m128i v = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)s), a2, 2);
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 1, 0));   /* a0 a1 a0 a1 */
    const __m128i h = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));   /* a2 x 4 */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(0x0f));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(h, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(0x03));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi32(hi, 4)), _mm_set1_epi8(32));
}
/* The table entries of the 16-row repacked formats (kernels.h: PD_*_R16), one per format, over
 * the matmul_r16(RT, ...) that each ISA file defines before using this. */
#define PD_R16_MATMUL(name, RT)                                                                  \
    static void name(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,     \
                     int ncols, float *y, size_t ys) {                                          \
        matmul_r16(RT, k, w, ws, nrows, x, xs, ncols, y, ys);                                   \
    }
#define PD_R16_MATMULS                                                                           \
    PD_R16_MATMUL(matmul_q4_0_r16, PD_Q4_0_R16)                                                 \
    PD_R16_MATMUL(matmul_q4_1_r16, PD_Q4_1_R16)                                                 \
    PD_R16_MATMUL(matmul_q5_0_r16, PD_Q5_0_R16)                                                 \
    PD_R16_MATMUL(matmul_q5_1_r16, PD_Q5_1_R16)                                                 \
    PD_R16_MATMUL(matmul_q8_0_r16, PD_Q8_0_R16)

#endif
