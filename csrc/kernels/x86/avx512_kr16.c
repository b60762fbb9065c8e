/* The AVX-512 table's kernels of Q4_K and Q6_K repacked by 16 rows (formats.h: PD_Q4_K_R16,
 * PD_Q6_K_R16; compiled with x86/avx512.c's flags). One 32-bit lane per row: every register
 * holds 4 quant bytes of each of the 16 rows, the 4 activation bytes they pair with are
 * broadcast from memory into the vpdpbusd ({1to16}), and every per-row quantity (sub-block
 * scales, minima, d, dmin) is a 16-lane vector whose lanes are the rows, so no instruction in
 * the loops moves data across lanes. Per super-block and column, for 16 rows at once:
 *   dot_s  = sum of vpdpbusd over sub-block s (int32, exact)
 *   isum   = sum_s sc_s * dot_s  (vpmulld)          msum = sum_s m_s * B_s (vpdpwssd, Q4_K)
 *   Q6_K's stored offset 32: isum -= 32 * sum_s sc_s * bsums_s (vpdpwssd on the sc pairs)
 *   acc   += x.d * (d * isum - dmin * msum)          (the scalar table's float expression)
 * so a result is bit-identical to the scalar kernels on the file's layout, whatever the tile
 * or the thread split. Against the file-layout kernels (x86/avx512_kquant.c: a vpermw per
 * register to spread 16 scales over its lanes, and a cross-row reduction per super-block) this
 * is about twice the weight bytes per cycle (bench/mca_kernels.py predicts both per CPU).
 * Q4_K's high nibbles are used in place (v & 0xf0 = 16 * nibble: vpdpbusd takes unsigned
 * bytes up to 255) and the sub-block's dot shifted right by 4, exact as it is a multiple of 16. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#include "kernels/x86/avx512.h"

#define KR_CMAX 4   /* columns per tile */
#define KR_C1_MAXB 256   /* super-blocks (k <= 65536) of the one-column path's minimum pairs on the stack */
#ifndef KR_PF
#define KR_PF 0     /* records ahead to prefetch into L2 (0: none; build with -DKR_PF=16 to try it).
                       Once (a Zen 4 VM, 2026-12-01) 16 records ahead measured faster on dense
                       decode; on the Zen 4 VM of 2026-12-03, with the weights in huge pages, the
                       hardware prefetcher alone was as fast on dense files (synthetic Llama-3.2-3B
                       1 thread 11.6-12.5 t/s either way) and faster on MoE ones, where 53
                       prefetches per Q6_K record only take load slots: Qwen3-30B-A3B 8 layers
                       37.8 -> 41.0 t/s (1 thread), 53.0 -> 57.2 (2 threads), its Q6_K head alone
                       (1 layer) 67 -> 80. */
#endif

/* acc += dpbusd(u, the 4 activation bytes at p in every lane) (as x86/avx512.c). */
#define KR_DPBUSD(acc, u, p) __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)(p)))
/* acc += dpwssd(pairs, the int16 pair at p in every lane). */
#define KR_DPWSSD(acc, v, p) __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(v), "m"(*(const int32_t *)(p)))

AI void kr_prefetch(const char *rec, size_t rb) {
    for (size_t off = 0; off < rb; off += 64) _mm_prefetch(rec + KR_PF * rb + off, _MM_HINT_T1);
}

/* The float step of a super-block for 16 rows: acc + xd * (d * isum - dmin * msum). */
AI __m512 kr_step(__m512 acc, float xd, __m512 d, __m512i isum, __m512 dmin, __m512i msum, int has_min) {
    __m512 t = _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum));
    if (has_min) t = _mm512_sub_ps(t, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum)));
    return _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(xd), t));
}

/* ---------------------------------------------------------------- Q4_K */

/* Chains per column and nibble half: enough independent vpdpbusd for the latency at C = 1. */
#define Q4_CHAINS(C) ((C) == 1 ? 4 : (C) == 2 ? 2 : 1)

AI void tile_q4k(int C, int nb, const char *w, const char *x, size_t xs, float *y, size_t ys) {
    const size_t rb = PD_KR16_Q4K_BYTES;
    const int NCH = Q4_CHAINS(C);
    const __m512i lo4 = _mm512_set1_epi8(0x0f), hi4 = _mm512_set1_epi8((char)0xf0);
    const __m512i m6 = _mm512_set1_epi8(0x3f), m2 = _mm512_set1_epi8(0x03), w16 = _mm512_set1_epi32(0x00ff00ff);
    __m512 acc[KR_CMAX];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const char *rec = w + (size_t)b * rb;
        if (KR_PF) kr_prefetch(rec, rb);
        /* the 12 scale bytes of each row, as pd_unpack_scales_k4 does them on 32-bit words */
        const __m512i s0 = _mm512_loadu_si512(rec + 2112), s1 = _mm512_loadu_si512(rec + 2176),
                      s2 = _mm512_loadu_si512(rec + 2240);
        const __m512i o0 = _mm512_and_si512(s0, m6);                                     /* sc 0..3 */
        const __m512i o1 = _mm512_or_si512(_mm512_and_si512(s2, lo4),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(s0, 6), m2), 4));
        const __m512i o2 = _mm512_and_si512(s1, m6);                                     /* m 0..3 */
        const __m512i o3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(s2, 4), lo4),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(s1, 6), m2), 4));
        const pd_q8k *xb[KR_CMAX];
        __m512i isum[KR_CMAX];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) { xb[c] = (const pd_q8k *)(x + c * xs) + b; isum[c] = _mm512_setzero_si512(); }
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            __m512i dl[KR_CMAX][4], dh[KR_CMAX][4];
#pragma GCC unroll 16
            for (int i = 0; i < C * NCH; i++) {
                dl[i / NCH][i % NCH] = _mm512_setzero_si512();
                dh[i / NCH][i % NCH] = _mm512_setzero_si512();
            }
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                const __m512i v = _mm512_loadu_si512(rec + 64 * (8 * p + t));
                const __m512i lo = _mm512_and_si512(v, lo4), hi = _mm512_and_si512(v, hi4);
#pragma GCC unroll 4
                for (int c = 0; c < C; c++) {
                    KR_DPBUSD(dl[c][t % NCH], lo, xb[c]->qs + 64 * p + 4 * t);
                    KR_DPBUSD(dh[c][t % NCH], hi, xb[c]->qs + 64 * p + 32 + 4 * t);
                }
            }
            /* sub-blocks 2p and 2p+1: byte p of the lane of o0 (p < 2 -> o0, else o1 at p - 2) */
            const __m512i ow = p < 2 ? o0 : o1;
            const int sh = 16 * (p & 1);
            const __m512i sca = _mm512_and_si512(_mm512_srli_epi32(ow, sh), _mm512_set1_epi32(0xff));
            const __m512i scb = _mm512_and_si512(_mm512_srli_epi32(ow, sh + 8), _mm512_set1_epi32(0xff));
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m512i a = dl[c][0], h = dh[c][0];
#pragma GCC unroll 3
                for (int i = 1; i < NCH; i++) { a = _mm512_add_epi32(a, dl[c][i]); h = _mm512_add_epi32(h, dh[c][i]); }
                isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(a, sca));
                isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(_mm512_srai_epi32(h, 4), scb));
            }
        }
        /* minima: int16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7) per lane against the
         * column's (B0, B2) .. with B_s = bsums[2s] + bsums[2s+1] */
        const __m512i mp[4] = { _mm512_and_si512(o2, w16), _mm512_and_si512(_mm512_srli_epi32(o2, 8), w16),
                                _mm512_and_si512(o3, w16), _mm512_and_si512(_mm512_srli_epi32(o3, 8), w16) };
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 2048)));
        const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 2080)));
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            int32_t bp[4];
            kr16_min_pairs(xb[c]->bsums, bp);
            __m512i msum = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) KR_DPWSSD(msum, mp[i], bp + i);
            acc[c] = kr_step(acc[c], xb[c]->d, dv, isum[c], dmv, msum, 1);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) _mm512_storeu_ps(y + c * ys, acc[c]);
}

/* One column (a decode's mat-vec), the hot case: two chains per nibble half instead of four
 * (four independent vpdpbusd chains still cover its latency), the column's minimum pairs made
 * once per call (bp, not once per 16 rows) and the scale bytes taken with one shift where the
 * byte is the lane's top one. Same integer sums in the same order of the float step as
 * tile_q4k, so the same bits. The point is fewer instructions per weight byte: the core keeps
 * more of the weight stream in flight in its window. Zen 4, 1 thread, 768 x 2048 runs (one
 * expert) from DRAM: 22.9 -> 28.7 GB/s (a plain 512-bit read loop: 28-30); in L2: 59 -> 70. */
AI void tile_q4k_c1(int nb, const char *w, const pd_q8k *xb, const int32_t (*bp)[4], float *y) {
    const size_t rb = PD_KR16_Q4K_BYTES;
    const __m512i lo4 = _mm512_set1_epi8(0x0f), hi4 = _mm512_set1_epi8((char)0xf0);
    const __m512i m6 = _mm512_set1_epi8(0x3f), m2 = _mm512_set1_epi8(0x03), w16 = _mm512_set1_epi32(0x00ff00ff);
    const __m512i ff = _mm512_set1_epi32(0xff);
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++, xb++) {
        const char *rec = w + (size_t)b * rb;
        if (KR_PF) kr_prefetch(rec, rb);
        const __m512i s0 = _mm512_loadu_si512(rec + 2112), s1 = _mm512_loadu_si512(rec + 2176),
                      s2 = _mm512_loadu_si512(rec + 2240);
        const __m512i o0 = _mm512_and_si512(s0, m6);
        const __m512i o1 = _mm512_or_si512(_mm512_and_si512(s2, lo4),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(s0, 6), m2), 4));
        __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            __m512i l0 = _mm512_setzero_si512(), l1 = l0, h0 = l0, h1 = l0;
#pragma GCC unroll 8
            for (int t = 0; t < 8; t += 2) {
                const __m512i v0 = _mm512_loadu_si512(rec + 64 * (8 * p + t)), v1 = _mm512_loadu_si512(rec + 64 * (8 * p + t + 1));
                KR_DPBUSD(l0, _mm512_and_si512(v0, lo4), xb->qs + 64 * p + 4 * t);
                KR_DPBUSD(h0, _mm512_and_si512(v0, hi4), xb->qs + 64 * p + 32 + 4 * t);
                KR_DPBUSD(l1, _mm512_and_si512(v1, lo4), xb->qs + 64 * p + 4 * t + 4);
                KR_DPBUSD(h1, _mm512_and_si512(v1, hi4), xb->qs + 64 * p + 32 + 4 * t + 4);
            }
            const __m512i ow = p < 2 ? o0 : o1;
            const int sh = 16 * (p & 1);
            const __m512i sca = sh ? _mm512_and_si512(_mm512_srli_epi32(ow, sh), ff) : _mm512_and_si512(ow, ff);
            const __m512i scb = sh ? _mm512_srli_epi32(ow, 24) : _mm512_and_si512(_mm512_srli_epi32(ow, 8), ff);
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_add_epi32(l0, l1), sca));
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_srai_epi32(_mm512_add_epi32(h0, h1), 4), scb));
        }
        const __m512i o2 = _mm512_and_si512(s1, m6);
        const __m512i o3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(s2, 4), lo4),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(s1, 6), m2), 4));
        __m512i msum = _mm512_setzero_si512();
        KR_DPWSSD(msum, _mm512_and_si512(o2, w16), bp[b] + 0);
        KR_DPWSSD(msum, _mm512_and_si512(_mm512_srli_epi32(o2, 8), w16), bp[b] + 1);
        KR_DPWSSD(msum, _mm512_and_si512(o3, w16), bp[b] + 2);
        KR_DPWSSD(msum, _mm512_and_si512(_mm512_srli_epi32(o3, 8), w16), bp[b] + 3);
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 2048)));
        const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 2080)));
        acc = kr_step(acc, xb->d, dv, isum, dmv, msum, 1);
    }
    _mm512_storeu_ps(y, acc);
}
/* ---------------------------------------------------------------- Q6_K */

AI void tile_q6k(int C, int nb, const char *w, const char *x, size_t xs, float *y, size_t ys) {
    const size_t rb = PD_KR16_Q6K_BYTES;
    const __m512i m63 = _mm512_set1_epi8(63), m48 = _mm512_set1_epi8(48), m15 = _mm512_set1_epi8(15);
    __m512 acc[KR_CMAX];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const char *rec = w + (size_t)b * rb;
        if (KR_PF) kr_prefetch(rec, rb);
        const pd_q8k *xb[KR_CMAX];
        __m512i isum[KR_CMAX];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) { xb[c] = (const pd_q8k *)(x + c * xs) + b; isum[c] = _mm512_setzero_si512(); }
        __m512i sp[8];   /* lane j: row j's (sc[2t], sc[2t+1]) as int16 */
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) sp[t] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(rec + 3104 + 32 * t)));
#pragma GCC unroll 4
        for (int vq = 0; vq < 4; vq++) {     /* sub-blocks 4Q + vq of the quarters Q */
            __m512i dq[KR_CMAX][4];
#pragma GCC unroll 16
            for (int i = 0; i < 4 * C; i++) dq[i / 4][i % 4] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int v = 4 * vq; v < 4 * vq + 4; v++) {
                const char *r = rec + 64 * 3 * v;
                const __m512i r1 = _mm512_loadu_si512(r), r2 = _mm512_loadu_si512(r + 64), r3 = _mm512_loadu_si512(r + 128);
                __m512i u[4];
                u[0] = _mm512_and_si512(r1, m63);
                u[1] = _mm512_and_si512(r2, m63);
                /* m15 ? b : c, bit by bit (imm 0xca; c's bits 6, 7 are clear) */
                u[2] = _mm512_ternarylogic_epi32(m15, r3, _mm512_and_si512(_mm512_srli_epi16(r1, 2), m48), 0xca);
                u[3] = _mm512_ternarylogic_epi32(m15, _mm512_srli_epi16(r3, 4),
                                                 _mm512_and_si512(_mm512_srli_epi16(r2, 2), m48), 0xca);
#pragma GCC unroll 4
                for (int c = 0; c < C; c++)
#pragma GCC unroll 4
                    for (int Q = 0; Q < 4; Q++) KR_DPBUSD(dq[c][Q], u[Q], xb[c]->qs + 64 * Q + 4 * v);
            }
#pragma GCC unroll 4
            for (int Q = 0; Q < 4; Q++) {
                const int s = 4 * Q + vq;
                const __m512i pr = sp[s / 2];
                const __m512i sc = s & 1 ? _mm512_srai_epi32(pr, 16) : _mm512_srai_epi32(_mm512_slli_epi32(pr, 16), 16);
#pragma GCC unroll 4
                for (int c = 0; c < C; c++) isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(dq[c][Q], sc));
            }
        }
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 3072)));
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            __m512i off = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) KR_DPWSSD(off, sp[t], xb[c]->bsums + 2 * t);
            isum[c] = _mm512_sub_epi32(isum[c], _mm512_slli_epi32(off, 5));
            acc[c] = kr_step(acc[c], xb[c]->d, dv, isum[c], dv, isum[c], 0);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) _mm512_storeu_ps(y + c * ys, acc[c]);
}

/* ---------------------------------------------------------------- entry points */

AI void tile_kr16(int RT, int C, int nb, const char *w, const char *x, size_t xs, float *y, size_t ys) {
    if (RT == PD_Q4_K_R16) tile_q4k(C, nb, w, x, xs, y, ys);
    else tile_q6k(C, nb, w, x, xs, y, ys);
}

AI void matmul_kr16(int RT, int k, const void *w, size_t ws, int nrows, const void *x, size_t xs, int ncols,
                    float *y, size_t ys) {
    const int nb = k / PD_QKK;
    if (RT == PD_Q4_K_R16 && ncols == 1 && nb <= KR_C1_MAXB) {
        int32_t bp[KR_C1_MAXB][4];
        for (int b = 0; b < nb; b++) kr16_min_pairs(((const pd_q8k *)x + b)->bsums, bp[b]);
        for (int r = 0; r < nrows; r += PD_R16_ROWS)
            tile_q4k_c1(nb, (const char *)w + (size_t)r * ws, x, (const int32_t (*)[4])bp, y + r);
        return;
    }
    for (int r = 0; r < nrows; r += PD_R16_ROWS) {
        const char *g = (const char *)w + (size_t)r * ws;
        for (int c = 0; c < ncols; c += KR_CMAX) {
            const char *xc = (const char *)x + (size_t)c * xs;
            float *yc = y + (size_t)c * ys + r;
            switch (ncols - c >= KR_CMAX ? KR_CMAX : ncols - c) {
            case 1: tile_kr16(RT, 1, nb, g, xc, xs, yc, ys); break;
            case 2: tile_kr16(RT, 2, nb, g, xc, xs, yc, ys); break;
            case 3: tile_kr16(RT, 3, nb, g, xc, xs, yc, ys); break;
            default: tile_kr16(RT, 4, nb, g, xc, xs, yc, ys); break;
            }
        }
    }
}

void pd_avx512_matmul_q4_k_r16(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                               int ncols, float *y, size_t ys) {
    matmul_kr16(PD_Q4_K_R16, k, w, ws, nrows, x, xs, ncols, y, ys);
}
void pd_avx512_matmul_q6_k_r16(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                               int ncols, float *y, size_t ys) {
    matmul_kr16(PD_Q6_K_R16, k, w, ws, nrows, x, xs, ncols, y, ys);
}
#endif
