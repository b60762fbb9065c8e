/* AVX2 + AVX-VNNI kernels for CPUs with the 256-bit VEX VNNI instructions but no AVX-512
 * (Intel Alder Lake and later client cores; this file alone is compiled with -mavxvnni -mavx2
 * -mfma -mf16c).
 *
 * The block formats are kernels_avx2.c's with VNNI for the integer dots:
 *  - legacy formats x pd_q8: the weight quants of a block are unpacked to 32 UNSIGNED bytes u
 *    (q4: nibbles, q5: 0..31, q8_0: w ^ 0x80 = w + 128) and one vpdpbusd against the activation
 *    bytes gives 8 int32 sums (it replaces vpmaddubsw + vpmaddwd, and q8_0's sign trick). The
 *    offsets (q4_0 8, q5_0 16, q8_0 128) are removed exactly: each row's vpdpbusd starts from
 *    -off * (sums of 4 activations), computed once per column and block.
 *  - K-quants x pd_q8k: vpmaddubsw pair sums, then vpdpwssd multiplies them by the int16
 *    sub-block scales and accumulates (it replaces vpmaddwd + vpaddd).
 * Activation quantization, float formats and the attention helpers gain nothing from VNNI:
 * this table points at the AVX2 functions (exported by kernels_avx2.c as pd_avx2_*), and so
 * does Q8_0 for one column (decode; see matmul_q8_0).
 * Tiling, prefetch and reductions as in kernels_avx2.c; each row's result is computed the same
 * way whatever tile it falls in.
 */
#if defined(__AVXVNNI__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels.h"
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#pragma GCC optimize("fp-contract=off")

#define AI static inline __attribute__((always_inline))
#ifndef QCMAX
#define QCMAX 4
#endif
#ifndef KCMAX
#define KCMAX 4
#endif
#ifndef PF_DIST
#define PF_DIST 4096
#endif

/* kernels_avx2.c */
void pd_avx2_quantize_q8(const float *x, pd_q8 *y, int k);
void pd_avx2_quantize_q8k(const float *x, pd_q8k *y, int k);
void pd_avx2_matmul_q8_0(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                         int ncols, float *y, size_t ys);
void pd_avx2_matmul_f32(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                        int ncols, float *y, size_t ys);
void pd_avx2_matmul_f16(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                        int ncols, float *y, size_t ys);
void pd_avx2_matmul_bf16(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                         int ncols, float *y, size_t ys);
float pd_avx2_dot_f32(const float *a, const float *b, int n);
float pd_avx2_dot_f16(const float *a, const uint16_t *b, int n);
void pd_avx2_axpy_f32(float *y, float a, const float *x, int n);
void pd_avx2_axpy_f16(float *y, float a, const uint16_t *x, int n);
void pd_avx2_f32_to_f16(const float *x, uint16_t *y, int n);

AI float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

AI uint16_t ld16(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }

typedef struct { const char *p; size_t off, rb, jump; } pd_pf;   /* kernels_avx2.c */

AI pd_pf pf_init(const char *w, size_t rb, size_t ws) {
    const size_t tiles = PF_DIST / rb;
    return (pd_pf){w + tiles * 4 * ws + PF_DIST % rb, PF_DIST % rb, rb, 4 * ws - rb};
}
AI void pf_advance(pd_pf *pf, size_t bytes) {
    pf->p += bytes;
    pf->off += bytes;
    if (pf->off >= pf->rb) { pf->off -= pf->rb; pf->p += pf->jump; }
}

/* ---------------------------------------------------------------- block formats x pd_q8 */

enum { T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0 };

AI size_t blk_bytes(int T) {
    return T == T_Q4_0 ? sizeof(pd_block_q4_0) : T == T_Q4_1 ? sizeof(pd_block_q4_1)
         : T == T_Q5_0 ? sizeof(pd_block_q5_0) : T == T_Q5_1 ? sizeof(pd_block_q5_1)
         : sizeof(pd_block_q8_0);
}
AI int has_min(int T) { return T == T_Q4_1 || T == T_Q5_1; }
AI int offset(int T) { return T == T_Q4_0 ? 8 : T == T_Q5_0 ? 16 : T == T_Q8_0 ? 128 : 0; }

AI __m256i nibbles(const char *qs) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)),
                            _mm256_set1_epi8(0x0f));
}

AI __m256i fifth_bits(const char *qh) {   /* 0x10 in byte j where bit j of the word at qh is set */
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                              0x0303030303030303);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* A block's 32 quants as unsigned bytes (the signed quant is u - offset(T)). */
AI __m256i unpack(int T, const char *blk) {
    switch (T) {
    case T_Q4_0: return nibbles(blk + 2);
    case T_Q4_1: return nibbles(blk + 4);
    case T_Q5_0: return _mm256_or_si256(nibbles(blk + 6), fifth_bits(blk + 2));
    case T_Q5_1: return _mm256_or_si256(nibbles(blk + 8), fifth_bits(blk + 4));
    default:     return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)),
                                         _mm256_set1_epi8((char)0x80));
    }
}

AI __m128 load_h4(const char *p, size_t stride, int R) {
    return _mm_cvtph_ps(_mm_setr_epi16((short)ld16(p), R > 1 ? (short)ld16(p + stride) : 0,
                                       R > 2 ? (short)ld16(p + 2 * stride) : 0,
                                       R > 3 ? (short)ld16(p + 3 * stride) : 0, 0, 0, 0, 0));
}

AI __m256 bcast_lane(__m256 v2, int r) {   /* v2 holds the same 4 floats in both halves */
    switch (r) {
    case 0: return _mm256_shuffle_ps(v2, v2, 0x00);
    case 1: return _mm256_shuffle_ps(v2, v2, 0x55);
    case 2: return _mm256_shuffle_ps(v2, v2, 0xaa);
    default: return _mm256_shuffle_ps(v2, v2, 0xff);
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
        const __m128 dw = load_h4(wb, ws, R);
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

/* Tiles over the whole output: 4-row tiles (then single rows), each across all columns in
 * groups of up to CM. TILE(R, C, row0, col0) must be a macro of constant R, C. */
#define RUN_TILES(CM, TILE)                                                                   \
    _Static_assert(CM >= 1 && CM <= 4, "RUN_TILES has cases for up to 4 columns");            \
    for (int r = 0; r < nrows;) {                                                             \
        const int R = nrows - r >= 4 ? 4 : 1;                                                 \
        for (int c = 0; c < ncols;) {                                                         \
            const int C = ncols - c >= CM ? CM : ncols - c;                                   \
            switch (R * 8 + C) {                                                              \
            case 4 * 8 + 1: TILE(4, 1, r, c); break;                                          \
            case 4 * 8 + 2: TILE(4, CM > 1 ? 2 : 1, r, c); break;                             \
            case 4 * 8 + 3: TILE(4, CM > 2 ? 3 : 1, r, c); break;                             \
            case 4 * 8 + 4: TILE(4, CM > 3 ? 4 : 1, r, c); break;                             \
            case 1 * 8 + 1: TILE(1, 1, r, c); break;                                          \
            case 1 * 8 + 2: TILE(1, CM > 1 ? 2 : 1, r, c); break;                             \
            case 1 * 8 + 3: TILE(1, CM > 2 ? 3 : 1, r, c); break;                             \
            default:        TILE(1, CM > 3 ? 4 : 1, r, c); break;                             \
            }                                                                                 \
            c += C;                                                                           \
        }                                                                                     \
        r += R;                                                                               \
    }

#define Q_MATMUL(name, T)                                                                     \
    static void name(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,  \
                     int ncols, float *y, size_t ys) {                                       \
        const int nb = k / PD_QK;                                                             \
        RUN_TILES(QCMAX, Q_TILE_##T)                                                          \
    }
#define Q_TILE(T, R_, C_, r, c)                                                               \
    tile_q(T, R_, C_, nb, (const char *)w + (r) * ws, ws, (const char *)x + (c) * xs, xs,    \
           y + (c) * ys + (r), ys)
#define Q_TILE_T_Q4_0(R_, C_, r, c) Q_TILE(T_Q4_0, R_, C_, r, c)
#define Q_TILE_T_Q4_1(R_, C_, r, c) Q_TILE(T_Q4_1, R_, C_, r, c)
#define Q_TILE_T_Q5_0(R_, C_, r, c) Q_TILE(T_Q5_0, R_, C_, r, c)
#define Q_TILE_T_Q5_1(R_, C_, r, c) Q_TILE(T_Q5_1, R_, C_, r, c)
#define Q_TILE_T_Q8_0(R_, C_, r, c) Q_TILE(T_Q8_0, R_, C_, r, c)
Q_MATMUL(matmul_q4_0, T_Q4_0)
Q_MATMUL(matmul_q4_1, T_Q4_1)
Q_MATMUL(matmul_q5_0, T_Q5_0)
Q_MATMUL(matmul_q5_1, T_Q5_1)
Q_MATMUL(matmul_q8_0_tiles, T_Q8_0)

/* Q8_0 decode (one column) is memory-bound with the AVX2 loop already; this one (+15% from L3)
 * streamed ~10% slower from DRAM where it was measured (a Zen 5: faster loops on the byte-heavy
 * formats lost DRAM throughput there, see kernels_avx512.c), so one column goes to AVX2's.
 * The tiles above compute exactly its arithmetic (the same 8 int32 sums of 4 products per
 * block, scales, fmadds and reduction), so decode and prefill give the same bits. */
static void matmul_q8_0(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                        int ncols, float *y, size_t ys) {
    if (ncols == 1) pd_avx2_matmul_q8_0(k, w, ws, nrows, x, xs, ncols, y, ys);
    else matmul_q8_0_tiles(k, w, ws, nrows, x, xs, ncols, y, ys);
}

/* ---------------------------------------------------------------- K-quants x pd_q8k
 * As kernels_avx2.c (see its section comment), with vpdpwssd for vpmaddwd + vpaddd. */

enum { T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K };

AI size_t kblk_bytes(int T) {
    return T == T_Q2_K ? sizeof(pd_block_q2_k) : T == T_Q3_K ? sizeof(pd_block_q3_k)
         : T == T_Q4_K ? sizeof(pd_block_q4_k) : T == T_Q5_K ? sizeof(pd_block_q5_k)
         : sizeof(pd_block_q6_k);
}
AI int k_has_min(int T) { return T == T_Q2_K || T == T_Q4_K || T == T_Q5_K; }
AI size_t k_d_off(int T) {
    return T == T_Q2_K ? offsetof(pd_block_q2_k, d) : T == T_Q3_K ? offsetof(pd_block_q3_k, d)
         : T == T_Q6_K ? offsetof(pd_block_q6_k, d) : 0;
}

AI __m256i bcast16(__m256i v, int ia, int ib) {
    const short a = (short)(2 * ia | (2 * ia + 1) << 8), b = (short)(2 * ib | (2 * ib + 1) << 8);
    return _mm256_shuffle_epi8(v, _mm256_setr_epi16(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b));
}
AI __m256i lo_both(__m256i v) { return _mm256_permute2x128_si256(v, v, 0x00); }
AI __m256i hi_both(__m256i v) { return _mm256_permute2x128_si256(v, v, 0x11); }

AI __m128i scales_k4(const char *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));
    const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(b, 6), _mm_setr_epi32(0, 0x03030303, 0, 0x03030303));
    return _mm_or_si128(lo, _mm_slli_epi32(hi, 4));
}
AI __m128i scales_q3k(const char *s) {
    int32_t a2;
    memcpy(&a2, s + 8, 4);
    const __m128i v = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)s), a2, 2);
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 1, 0));
    const __m128i h = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(0x0f));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(h, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(0x03));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi32(hi, 4)), _mm_set1_epi8(32));
}

/* isum[c] += sc * (u . a) for chunk t of column c. */
AI void kchunk(int C, __m256i u, __m256i sc, const pd_q8k *const *xb, int t, __m256i *isum) {
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(xb[c]->qs + 32 * t));
        isum[c] = _mm256_dpwssd_avx_epi32(isum[c], _mm256_maddubs_epi16(u, a), sc);
    }
}

AI void krow(int T, int C, const char *blk, const pd_q8k *const *xb, __m256i *isum,
             __m256i *msum) {
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) isum[c] = msum[c] = _mm256_setzero_si256();
    if (T == T_Q4_K || T == T_Q5_K) {
        const __m128i scm = scales_k4(blk + 4);
        const __m256i sc = lo_both(_mm256_cvtepu8_epi16(scm));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            msum[c] = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)xb[c]->bsums));
        const char *qs = blk + (T == T_Q4_K ? offsetof(pd_block_q4_k, qs) : offsetof(pd_block_q5_k, qs));
        __m256i qh = T == T_Q5_K ? _mm256_loadu_si256((const __m256i *)(blk + offsetof(pd_block_q5_k, qh)))
                                 : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
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
        const int shift = T == T_Q3_K ? 2 : 5;
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            isum[c] = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(_mm256_madd_epi16(
                          sc16, _mm256_loadu_si256((const __m256i *)xb[c]->bsums)), shift));
    }
    const __m256i sc_lo = lo_both(sc16), sc_hi = hi_both(sc16);
    if (T == T_Q2_K || T == T_Q3_K) {
        const char *qs = blk + (T == T_Q2_K ? offsetof(pd_block_q2_k, qs) : offsetof(pd_block_q3_k, qs));
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

AI __m256i reduce8(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}
AI __m128i reduce4(const __m256i v[4]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
}

AI void tile_k(int T, int R, int C, int nb, const char *w, size_t ws, const char *x, size_t xs,
               float *y, size_t ys) {
    const size_t bb = kblk_bytes(T);
    __m256 acc[KCMAX];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    pd_pf pf = pf_init(w, nb * bb, ws);
    for (int b = 0; b < nb; b++, pf_advance(&pf, bb)) {
        const char *wb = w + b * bb;
        const pd_q8k *xb[KCMAX];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) xb[c] = (const pd_q8k *)(x + c * xs) + b;
        __m256i isum[KCMAX][8];
#pragma GCC unroll 1
        for (int r = 0; r < R; r++) {
            for (size_t o = 0; o < bb; o += 64) _mm_prefetch(pf.p + r * ws + o, _MM_HINT_T0);
            __m256i is[KCMAX], ms[KCMAX];
            krow(T, C, wb + r * ws, xb, is, ms);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) { isum[c][r] = is[c]; isum[c][4 + r] = ms[c]; }
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
#pragma GCC unroll 4
            for (int r = R; r < 4; r++) isum[c][r] = isum[c][4 + r] = _mm256_setzero_si256();
        const __m128 d = load_h4(wb + k_d_off(T), ws, R);
        if (k_has_min(T)) {
            const __m128 dmin = load_h4(wb + k_d_off(T) + 2, ws, R);
            const __m256 dd = _mm256_set_m128(_mm_xor_ps(dmin, _mm_set1_ps(-0.0f)), d);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(isum[c])),
                                         _mm256_mul_ps(dd, _mm256_set1_ps(xb[c]->d)), acc[c]);
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m128 s = _mm_cvtepi32_ps(reduce4(isum[c]));
                const __m128 a = _mm_fmadd_ps(s, _mm_mul_ps(d, _mm_set1_ps(xb[c]->d)),
                                              _mm256_castps256_ps128(acc[c]));
                acc[c] = _mm256_castps128_ps256(a);
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        float v[8];
        _mm256_storeu_ps(v, acc[c]);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) y[c * ys + r] = k_has_min(T) ? v[r] + v[4 + r] : v[r];
    }
}

#define K_MATMUL(name, T)                                                                     \
    static void name(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,  \
                     int ncols, float *y, size_t ys) {                                       \
        const int nb = k / PD_QKK;                                                            \
        RUN_TILES(KCMAX, K_TILE_##T)                                                          \
    }
#define K_TILE(T, R_, C_, r, c)                                                               \
    tile_k(T, R_, C_, nb, (const char *)w + (r) * ws, ws, (const char *)x + (c) * xs, xs,    \
           y + (c) * ys + (r), ys)
#define K_TILE_T_Q2_K(R_, C_, r, c) K_TILE(T_Q2_K, R_, C_, r, c)
#define K_TILE_T_Q3_K(R_, C_, r, c) K_TILE(T_Q3_K, R_, C_, r, c)
#define K_TILE_T_Q4_K(R_, C_, r, c) K_TILE(T_Q4_K, R_, C_, r, c)
#define K_TILE_T_Q5_K(R_, C_, r, c) K_TILE(T_Q5_K, R_, C_, r, c)
#define K_TILE_T_Q6_K(R_, C_, r, c) K_TILE(T_Q6_K, R_, C_, r, c)
K_MATMUL(matmul_q2_k, T_Q2_K)
K_MATMUL(matmul_q3_k, T_Q3_K)
K_MATMUL(matmul_q4_k, T_Q4_K)
K_MATMUL(matmul_q5_k, T_Q5_K)
K_MATMUL(matmul_q6_k, T_Q6_K)

/* Attention (kernels_avx2.c): bound by the cache rows' reads, not by the vector width. */
void pd_avx2_attn_scores(const float *q, const void *k, size_t stride, int n, int hd, float scale, int f16, float *s);
float pd_avx2_exp_sub(float *x, int n, float shift);
void pd_avx2_attn_accum(float *out, const float *w, const void *v, size_t stride, int n, int hd, int f16);

const pd_kernels pd_kernels_avxvnni = {
    .name = "avxvnni",
    .quantize_q8 = pd_avx2_quantize_q8,
    .quantize_q8k = pd_avx2_quantize_q8k,
    .matmul = {
        [PD_F32] = pd_avx2_matmul_f32, [PD_F16] = pd_avx2_matmul_f16, [PD_BF16] = pd_avx2_matmul_bf16,
        [PD_Q4_0] = matmul_q4_0, [PD_Q4_1] = matmul_q4_1, [PD_Q5_0] = matmul_q5_0,
        [PD_Q5_1] = matmul_q5_1, [PD_Q8_0] = matmul_q8_0,
        [PD_Q2_K] = matmul_q2_k, [PD_Q3_K] = matmul_q3_k, [PD_Q4_K] = matmul_q4_k,
        [PD_Q5_K] = matmul_q5_k, [PD_Q6_K] = matmul_q6_k,
    },
    .dot_f32 = pd_avx2_dot_f32, .dot_f16 = pd_avx2_dot_f16,
    .axpy_f32 = pd_avx2_axpy_f32, .axpy_f16 = pd_avx2_axpy_f16,
    .f32_to_f16 = pd_avx2_f32_to_f16,
    .attn_scores = pd_avx2_attn_scores, .exp_sub = pd_avx2_exp_sub, .attn_accum = pd_avx2_attn_accum,
};
#endif
