/* The K-quant tiles of the 256-bit kernel files, shared by kernels/x86/avx2.c and
 * kernels/x86/avxvnni.c (included by each, compiled with its flags). The includer defines
 * PD_KDOT(acc, pairs, sc): acc + the int16 pair sums times the int16 scales, in int32 lanes
 * (vpmaddwd + vpaddd on AVX2, one vpdpwssd with AVX-VNNI). */
#ifndef PD_KQUANT_X86_H
#define PD_KQUANT_X86_H
#include "kernels/x86/common.h"
#include "kernels/x86/tiles.h"

/* ---------------------------------------------------------------- K-quants x pd_q8k
 *
 * Per row and super-block (see kernels.h for the formats and the dot identity): the quants of
 * each 32-value chunk are unpacked to 32 unsigned bytes u (the stored value, offsets not yet
 * removed), vpmaddubsw'ed with the activation bytes (pair sums fit int16: u <= 63, |a| <= 127)
 * and vpmaddwd'ed with the chunk's sub-block scales as int16 (8 lanes per 16-value sub-block),
 * which gives int32 sums of sc*u*a. The offsets of Q3_K (4) and Q6_K (32) are removed once per
 * super-block as off * sum_s sc[s]*bsums[s], and the minima of Q2_K/Q4_K/Q5_K are
 * sum_s m[s]*bsums[s]: one vpmaddwd each. Everything up to here is exact integer math.
 *
 * A tile is 4 rows (or 1) x up to KCMAX columns, walked like tile_q (each unpacked chunk
 * serves all columns; rows in lock-step, prefetched). Per super-block, the 8-lane int32 sums
 * of the 4 rows (and their min sums) are reduced together into one vector [I0..I3 | M0..M3],
 * converted once and multiply-added with [d_r*dx | -dmin_r*dx]: the accumulator of a column
 * is one register whatever R is.
 */
#ifndef KCMAX
#define KCMAX 4
#endif


/* isum[c] += sc * (u . a) for chunk t of column c, sc: int16 scales as bcast16 makes them. */
AI void kchunk(int C, __m256i u, __m256i sc, const pd_q8k *const *xb, int t, __m256i *isum) {
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(xb[c]->qs + 32 * t));
        isum[c] = PD_KDOT(isum[c], _mm256_maddubs_epi16(u, a), sc);
    }
}

/* kchunk for signed weights w (IQ4_XS's codebook values): vpmaddubsw takes |w| and the activations
 * with w's sign (pair sums <= 2 * 127 * 127 fit int16), as the Q8_0 kernels do. */
AI void kchunk_signed(int C, __m256i w, __m256i sc, const pd_q8k *const *xb, int t, __m256i *isum) {
    const __m256i aw = _mm256_sign_epi8(w, w);
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(xb[c]->qs + 32 * t));
        isum[c] = PD_KDOT(isum[c], _mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w)), sc);
    }
}

/* One row's super-block at blk against the C column blocks xb[c]: 8-lane int32 partial sums of
 * sum_s sc[s]*(q.a)_s (offsets removed) into isum[c], of sum_s m[s]*bsums[s] into msum[c]. */
AI void krow(int T, int C, const char *blk, const pd_q8k *const *xb, __m256i *isum,
             __m256i *msum) {
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) isum[c] = msum[c] = _mm256_setzero_si256();
    if (T == T_IQ4_XS) {   /* 8 sub-blocks of 32: 16 nibble bytes each through the codebook */
        const __m256i sc = iq4xs_scales16(blk);
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++)
            kchunk_signed(C, _mm256_shuffle_epi8(codebook256(T_IQ4_NL, 0),
                                                 nibbles(blk + offsetof(pd_block_iq4_xs, qs) + 16 * ib)),
                          bcast16(sc, ib, ib), xb, ib, isum);
        return;
    }
    if (T == T_Q4_K || T == T_Q5_K) {
        const __m128i scm = scales_k4(blk + 4);
        const __m256i sc = lo_both(_mm256_cvtepu8_epi16(scm));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm)); /* m0 m0 m1 m1 .. */
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            msum[c] = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)xb[c]->bsums));
        const char *qs = blk + (T == T_Q4_K ? offsetof(pd_block_q4_k, qs) : offsetof(pd_block_q5_k, qs));
        /* Q5_K: bit 4 of chunk t is bit t of qh[l]; shifting qh right by 2 per chunk pair keeps
         * the two bits wanted at bits 0 and 1 of each byte (16-bit shifts: the bits crossing
         * from the neighbour byte land in bits 6..7, never read). */
        __m256i qh = T == T_Q5_K ? _mm256_loadu_si256((const __m256i *)(blk + offsetof(pd_block_q5_k, qh)))
                                 : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {          /* chunk pair: the low and high nibbles of 32 bytes */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (T == T_Q5_K) {
                const __m256i b4 = _mm256_set1_epi8(0x10);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(qh, 4), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(qh, 3), b4));
                qh = _mm256_srli_epi16(qh, 2);
            }
            kchunk(C, lo, bcast16(sc, 2 * p, 2 * p), xb, 2 * p, isum);
            kchunk(C, hi, bcast16(sc, 2 * p + 1, 2 * p + 1), xb, 2 * p + 1, isum);
        }
        return;
    }
    /* 16 sub-blocks of 16: the scales as int16, sub-blocks 0..7 / 8..15 in both halves */
    __m256i sc16;
    if (T == T_Q2_K) {
        const __m128i sm = _mm_loadu_si128((const __m128i *)blk);
        sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(0x0f)));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0f)));
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            msum[c] = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)xb[c]->bsums));
    } else {
        sc16 = _mm256_cvtepi8_epi16(T == T_Q3_K ? scales_q3k(blk + offsetof(pd_block_q3_k, scales))
                                                : _mm_loadu_si128((const __m128i *)(blk + offsetof(pd_block_q6_k, scales))));
        /* stored offset off (q = u - off): start from -off * sum_s sc[s]*bsums[s] */
        const int shift = T == T_Q3_K ? 2 : 5;
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            isum[c] = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(_mm256_madd_epi16(
                          sc16, _mm256_loadu_si256((const __m256i *)xb[c]->bsums)), shift));
    }
    const __m256i sc_lo = lo_both(sc16), sc_hi = hi_both(sc16);
    if (T == T_Q2_K || T == T_Q3_K) {
        const char *qs = blk + (T == T_Q2_K ? offsetof(pd_block_q2_k, qs) : offsetof(pd_block_q3_k, qs));
        /* Q3_K's third bit of chunk t is bit t of hmask[l]: shifted right once per chunk, it
         * is always bit 0 (as for Q5_K's qh, neighbour bits only reach the top bits) */
        __m256i hm = T == T_Q3_K ? _mm256_loadu_si256((const __m256i *)blk) : _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m256i u = _mm256_and_si256(g ? _mm256_srli_epi16(v, 2 * g) : v, m3);
                if (T == T_Q3_K) {
                    u = _mm256_or_si256(u, _mm256_and_si256(_mm256_slli_epi16(hm, 2), _mm256_set1_epi8(4)));
                    hm = _mm256_srli_epi16(hm, 1);
                }
                kchunk(C, u, bcast16(h ? sc_hi : sc_lo, 2 * g, 2 * g + 1), xb, 4 * h + g, isum);
            }
        }
        return;
    }
    /* Q6_K: per half, 64 bytes of low nibbles (chunks 0,1 low, 2,3 high) and 32 bytes of
     * 2-bit pairs (chunk g at bits 2g), moved to bits 4..5 with 16-bit shifts then masked */
    const __m256i m30 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + offsetof(pd_block_q6_k, qh) + 32 * h));
        const __m256i u[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
            _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)),
        };
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++)
            kchunk(C, u[g], bcast16(h ? sc_hi : sc_lo, 2 * g, 2 * g + 1), xb, 4 * h + g, isum);
    }
}

/* Y[c][r] for an R x C tile over nb super-blocks (see the section comment). */
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
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) xb[c] = (const pd_q8k *)(x + c * xs) + b;
        __m256i isum[KCMAX][8];   /* [c][r]: rows in 0..3, min sums in 4..7, as reduce8 takes */
        /* rows one at a time, deliberately not unrolled: unrolled, GCC interleaves the 4 rows'
         * chunks and spills ~20 registers (measured: rolled is 5-8% faster for decode) */
#pragma GCC unroll 1
        for (int r = 0; r < R; r++) {
            for (size_t o = 0; o < bb; o += 64) _mm_prefetch(pf.p + r * ws + o, _MM_HINT_T0);
            __m256i is[KCMAX], ms[KCMAX];
            krow(T, C, wb + r * ws, xb, is, ms);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) { isum[c][r] = is[c]; isum[c][4 + r] = ms[c]; }
        }
        k_accumulate(T, R, C, wb, ws, isum, xb, acc);
    }
    k_store(T, R, C, acc, y, ys);
}

PD_K_MATMULS   /* matmul_q2_k .. matmul_q6_k over tile_k (tiles.h) */
#endif
