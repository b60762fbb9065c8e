/* AVX-512 attention over one run of cache rows for a whole grouped-query head group (kernels.h:
 * attn_scores_mh, attn_accum_mh; compiled with the flags of x86/avx512.c).
 *
 * Why not the matmul and per-head accum the other tables use: a decode token's scores are a
 * matmul with only nh (1..8) columns and a 64..256-value dot per (row, head), so the generic
 * matmul spends a full horizontal sum per score and converts each F16 row once per head; the
 * per-head weighted sum converts every V row again for each head of the group. Here
 *   - each K/V row is converted once (F16: vcvtph2ps; Q8_0: xor 0x80 / widen to float) for the
 *     whole group;
 *   - a score is first a 16-lane partial vector (one FMA per 16 values), and 16 rows' partials
 *     of a head are reduced together by a transposing add tree (4 levels of blend + vpermt2ps +
 *     add: 15 of each per 16 scores, ~1 shuffle a score instead of a 4-shuffle horizontal sum);
 *   - the weighted sum keeps every head's accumulators for a tile of output dims in registers
 *     while the rows stream past.
 * Q8_0 scores: vpdpbusd of the K bytes as unsigned (k ^ 0x80 = k + 128) with the signed query
 * bytes, seeded with -128 * (sums of 4 query bytes): the exact integer dot per 4-value group;
 * then per 32-value block (a 256-bit half) times d_k * d_q in float. Q8_0 V: d * q (exact in
 * float: 11 x 8 significant bits) once per row, then the F32 arithmetic.
 * The rows are software-prefetched into L2 ahead of use (pf_rows: measured 1.6x at depth).
 * Results are deterministic (they depend on the run's rows only) and within float rounding of
 * the scalar twins (tests/test_attn_kernels.py). The fast paths need hd % 16 == 0 (scores also
 * hd <= 256, the block buffers' size); anything else goes to the AVX2 table's per-head loops. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#include "kernels/x86/avx512.h"
#include "kernels/x86/avx2_exports.h"

enum { MAX_HD = 256, MAX_P = MAX_HD / 64 };

/* ---------------------------------------------------------------- the transposing add tree */

/* One level: lanes where mask m is clear keep a's partial sums, the others b's, each folded with
 * its partner lane (l ^ sh): x takes a's lanes outside m and b's inside, y the partners. */
AI __m512 fold(__m512 a, __m512 b, __mmask16 m, __m512i idx) {
    return _mm512_add_ps(_mm512_mask_blend_ps(m, a, b), _mm512_permutex2var_ps(a, idx, b));
}
/* y[l] = l in m ? b[l ^ sh] : a[l ^ sh] (index bit 4 picks b in vpermt2ps). */
#define FOLD_IDX(sh) _mm512_xor_si512(_mm512_set_epi32(15 | 16 * !!(15 & sh), 14 | 16 * !!(14 & sh), 13 | 16 * !!(13 & sh), \
    12 | 16 * !!(12 & sh), 11 | 16 * !!(11 & sh), 10 | 16 * !!(10 & sh), 9 | 16 * !!(9 & sh), 8 | 16 * !!(8 & sh),           \
    7 | 16 * !!(7 & sh), 6 | 16 * !!(6 & sh), 5 | 16 * !!(5 & sh), 4 | 16 * !!(4 & sh), 3 | 16 * !!(3 & sh),                 \
    2 | 16 * !!(2 & sh), 1 | 16 * !!(1 & sh), 0 | 16 * !!(0 & sh)), _mm512_set1_epi32(sh))
typedef struct { __m512i i8, i4, i2, i1; } tree_idx;
AI tree_idx tree_init(void) { return (tree_idx){ FOLD_IDX(8), FOLD_IDX(4), FOLD_IDX(2), FOLD_IDX(1) }; }

/* [sum of the lanes of row(r)] for r < 16, as one vector, lane r = row r: row r is folded with
 * row r + 8 (halves), then r + 4, r + 2, r + 1. Evaluated depth first so that only a few
 * partial vectors are live at a time. */
#define TREE16(row, t)                                                                                      \
    fold(fold(fold(fold(row(0), row(8), 0xFF00, t.i8), fold(row(4), row(12), 0xFF00, t.i8), 0xF0F0, t.i4),   \
              fold(fold(row(2), row(10), 0xFF00, t.i8), fold(row(6), row(14), 0xFF00, t.i8), 0xF0F0, t.i4),   \
              0xCCCC, t.i2),                                                                                  \
         fold(fold(fold(row(1), row(9), 0xFF00, t.i8), fold(row(5), row(13), 0xFF00, t.i8), 0xF0F0, t.i4),    \
              fold(fold(row(3), row(11), 0xFF00, t.i8), fold(row(7), row(15), 0xFF00, t.i8), 0xF0F0, t.i4),   \
              0xCCCC, t.i2),                                                                                  \
         0xAAAA, t.i1)

AI __mmask16 first_lanes(int m) { return (__mmask16)(m >= 16 ? 0xFFFF : (1u << m) - 1); }

/* Software prefetch of rows [a, b) of a run (the head's slice of each: bytes from the row's start).
 * A deep context streams the cache from DRAM (SmolLM2 at 8192 positions: 190 MB per token at F16)
 * and a run's rows are small slices at a stride, which the hardware prefetchers follow poorly.
 * Measured on a Zen 4, one thread, F16 rows of 128 bytes at a 384-byte stride from DRAM, cycles
 * per row (3 heads, scores + sums): none 126, into L1 (T0) 32 rows ahead 160, into L2 (T1) 16
 * ahead 117, 32 ahead 83, 64 ahead 78, 96 ahead 85; L2-resident rows take 44. */
#ifndef PF_AHEAD
#define PF_AHEAD 64   /* rows ahead */
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T1
#endif
AI void pf_rows(const char *k, size_t rb, int a, int b, size_t bytes) {
    for (int r = a; r < b; r++) {
        const char *p = k + (size_t)r * rb;
        for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, PF_HINT);
        _mm_prefetch(p + bytes - 1, PF_HINT);   /* a slice not aligned to a line ends in one more */
    }
}
AI int imin(int a, int b) { return a < b ? a : b; }

/* ---------------------------------------------------------------- scores, F16 / F32 */

/* The 16-lane partial of q . K_r over H16 vectors (one chain: 16 rows are independent work).
 * The query's loads repeat for every row of the block: with H16 constant the compiler keeps them
 * in registers (nothing is stored in between). */
AI __m512 dot_f(const float *q, const float *kr, int H16) {
    __m512 a = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(kr));
#pragma GCC unroll 16
    for (int c = 1; c < H16; c++) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), _mm512_loadu_ps(kr + 16 * c), a);
    return a;
}

/* One head's scores of a block of 16 rows (kr: f32 rows; rows past m repeat row m - 1 and are
 * not stored). */
AI void scores16_f(const float *q, int H16, const float *const *kr, int m, float *s, tree_idx t) {
#define ROW_F(r) dot_f(q, kr[r], H16)
    const __m512 v = TREE16(ROW_F, t);
    if (m == 16) _mm512_storeu_ps(s, v);
    else _mm512_mask_storeu_ps(s, first_lanes(m), v);
#undef ROW_F
}

/* A block's F16 rows converted to f32 once for all heads. Blocks are double-buffered: block
 * i + 1 is converted before the heads' pass over block i, so that no FMA reads a row it has just
 * stored (a 64-byte load right after its 64-byte store waits on the store: measured 2x slower). */
AI void f16_block(const char *k, size_t rb, int m, int H16, float *buf) {
    for (int r = 0; r < m; r++)
#pragma GCC unroll 16
        for (int c = 0; c < H16; c++)
            _mm512_store_ps(buf + r * 16 * H16 + 16 * c,
                            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + (size_t)r * rb) + c)));
}

AI void scores_f(int f16, int H16, int nh, const float *q, const char *k, size_t rb, int n, float *s, size_t ss) {
    const int hd = 16 * H16;
    const tree_idx t = tree_init();
    float kbuf[2][16 * MAX_HD] __attribute__((aligned(64)));
    const float *kr[16];
    const size_t bytes = (size_t)hd * (f16 ? 2 : 4);
    pf_rows(k, rb, 0, imin(n, PF_AHEAD), bytes);
    if (f16) f16_block(k, rb, n < 16 ? n : 16, H16, kbuf[0]);
    for (int i0 = 0, b = 0; i0 < n; i0 += 16, b ^= 1) {
        const int m = n - i0 < 16 ? n - i0 : 16;
        pf_rows(k, rb, imin(n, i0 + PF_AHEAD), imin(n, i0 + PF_AHEAD + 16), bytes);
        if (f16 && i0 + 16 < n) f16_block(k + (size_t)(i0 + 16) * rb, rb, n - i0 - 16 < 16 ? n - i0 - 16 : 16, H16, kbuf[b ^ 1]);
        for (int r = 0; r < 16; r++) {   /* rows past m repeat row m - 1 (their lanes are not stored) */
            const int rr = r < m ? r : m - 1;
            kr[r] = f16 ? kbuf[b] + rr * hd : (const float *)(k + (size_t)(i0 + rr) * rb);
        }
        for (int h = 0; h < nh; h++) scores16_f(q + (size_t)h * hd, H16, kr, m, s + h * ss + i0, t);
    }
}

/* ---------------------------------------------------------------- scores, Q8_0 */

/* A head's query, per pair p of 32-value blocks (one register: block 2p in the low half): the
 * bytes, -128 * their sums of 4 (the vpdpbusd seed that removes the K offset exactly), and
 * d_q of each block in its half. A missing odd block (hd % 64 == 32) is all zero. */
typedef struct { __m512i qs[MAX_P], seed[MAX_P]; __m512 d[MAX_P]; } q8_head;

AI __m512 halves(float lo, float hi) { return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1); }

static void q8_head_prep(const pd_q8 *q, int nb, q8_head *o) {
    for (int p = 0; 2 * p < nb; p++) {
        const int two = 2 * p + 1 < nb;
        const __m256i lo = _mm256_loadu_si256((const __m256i *)q[2 * p].qs);
        const __m256i hi = two ? _mm256_loadu_si256((const __m256i *)q[2 * p + 1].qs) : _mm256_setzero_si256();
        o->qs[p] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        const __m512i sum4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), o->qs[p]);
        o->seed[p] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum4, 7));
        o->d[p] = halves(q[2 * p].d, two ? q[2 * p + 1].d : 0.0f);
    }
}

AI __m512 dot_q8(const q8_head *qh, const uint8_t *u, const __m512 *dk, int P) {
    __m512 a = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) {
        const __m512i dot = _mm512_dpbusd_epi32(qh->seed[p], _mm512_load_si512(u + 64 * p), qh->qs[p]);
        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(_mm512_load_ps(dk + p), qh->d[p]), a);
    }
    return a;
}

/* Heads in groups of up to 16 (q8_head records on the stack); each 16-row block of K is
 * rearranged once per group: the bytes + 128 and the scales per half, 64-byte aligned. */
/* The Q8_0 rows of a block rearranged once for all heads: the bytes + 128 (64 per register) and
 * the scales per half, 64-byte aligned; double-buffered as f16_block. */
AI void q8_block(const char *k, size_t rb, int m, int P, int nb, uint8_t *ub, __m512 *dk) {
    for (int r = 0; r < m; r++) {
        const pd_block_q8_0 *b = (const pd_block_q8_0 *)(k + (size_t)r * rb);
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            const int two = 2 * p + 1 < nb;
            const __m256i lo = _mm256_loadu_si256((const __m256i *)b[2 * p].qs);
            const __m256i hi = two ? _mm256_loadu_si256((const __m256i *)b[2 * p + 1].qs) : _mm256_setzero_si256();
            const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            _mm512_store_si512(ub + r * 64 * P + 64 * p, _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)));
            dk[r * P + p] = halves(_cvtsh_ss(b[2 * p].d), two ? _cvtsh_ss(b[2 * p + 1].d) : 0.0f);
        }
    }
}

/* Heads in groups of up to 16 (q8_head records on the stack). */
AI void scores_q8(int P, int nh, int hd, const pd_q8 *q, const char *k, size_t rb, int n, float *s, size_t ss) {
    enum { HG = 16 };
    const int nb = hd / PD_QK;
    const tree_idx t = tree_init();
    q8_head qh[HG];
    uint8_t ub[2][16 * MAX_HD] __attribute__((aligned(64)));
    __m512 dk[2][16 * MAX_P];
    for (int h0 = 0; h0 < nh; h0 += HG) {
        const int gh = nh - h0 < HG ? nh - h0 : HG;
        const size_t bytes = (size_t)nb * sizeof(pd_block_q8_0);
        if (h0 == 0) pf_rows(k, rb, 0, imin(n, PF_AHEAD), bytes);
        for (int h = 0; h < gh; h++) q8_head_prep(q + (size_t)(h0 + h) * nb, nb, &qh[h]);
        q8_block(k, rb, n < 16 ? n : 16, P, nb, ub[0], dk[0]);
        for (int i0 = 0, b = 0; i0 < n; i0 += 16, b ^= 1) {
            const int m = n - i0 < 16 ? n - i0 : 16;
            if (h0 == 0) pf_rows(k, rb, imin(n, i0 + PF_AHEAD), imin(n, i0 + PF_AHEAD + 16), bytes);
            if (i0 + 16 < n) q8_block(k + (size_t)(i0 + 16) * rb, rb, n - i0 - 16 < 16 ? n - i0 - 16 : 16, P, nb, ub[b ^ 1], dk[b ^ 1]);
            for (int h = 0; h < gh; h++) {
#define ROW_Q8(r) dot_q8(&qh[h], ub[b] + ((r) < m ? (r) : m - 1) * 64 * P, dk[b] + ((r) < m ? (r) : m - 1) * P, P)
                _mm512_mask_storeu_ps(s + (h0 + h) * ss + i0, first_lanes(m), TREE16(ROW_Q8, t));
#undef ROW_Q8
            }
        }
    }
}

static void attn_scores_mh(int kv_type, int nh, int hd, const void *q, const void *k, size_t rb, int n, float *s,
                           size_t ss) {
    if (hd % 16 || hd > MAX_HD || nh < 1 || n < 1 || (kv_type == PD_KV_Q8_0 && hd % PD_QK)) {
        pd_avx2_attn_scores_mh(kv_type, nh, hd, q, k, rb, n, s, ss);
        return;
    }
    const char *kc = k;
    if (kv_type == PD_KV_Q8_0) {
        switch ((hd + 63) / 64) {   /* constant trip counts: the query records stay in registers */
        case 1: scores_q8(1, nh, hd, q, kc, rb, n, s, ss); break;
        case 2: scores_q8(2, nh, hd, q, kc, rb, n, s, ss); break;
        case 3: scores_q8(3, nh, hd, q, kc, rb, n, s, ss); break;
        default: scores_q8(4, nh, hd, q, kc, rb, n, s, ss); break;
        }
        return;
    }
    const int f16 = kv_type == PD_KV_F16;
    switch (hd / 16) {
    case 2: scores_f(f16, 2, nh, q, kc, rb, n, s, ss); break;
    case 4: scores_f(f16, 4, nh, q, kc, rb, n, s, ss); break;
    case 8: scores_f(f16, 8, nh, q, kc, rb, n, s, ss); break;
    case 16: scores_f(f16, 16, nh, q, kc, rb, n, s, ss); break;
    default: scores_f(f16, hd / 16, nh, q, kc, rb, n, s, ss); break;
    }
}

/* ---------------------------------------------------------------- the weighted sum of V */

enum { K_F32, K_F16, K_Q8 };

/* out[h][j0 .. j0 + 16 JT) += sum_i w[h][i] V_i[..] for NH heads: NH x JT accumulators in
 * registers, each row's JT vectors converted once for all heads. */
AI void accum_tile(int KIND, int NH, int JT, float *out, int hd, const float *w, size_t ws, const char *v, size_t rb,
                   int n, int j0) {
    const size_t pf_bytes = KIND == K_Q8 ? (size_t)hd / PD_QK * sizeof(pd_block_q8_0) : (size_t)hd * (KIND == K_F16 ? 2 : 4);
    if (j0 == 0) pf_rows(v, rb, 0, imin(n, PF_AHEAD), pf_bytes);   /* the first pass over the rows fetches them */
    __m512 acc[8][8];   /* fixed sizes, constant indices once unrolled: registers, not a VLA */
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++)
#pragma GCC unroll 8
        for (int t = 0; t < JT; t++) acc[h][t] = _mm512_loadu_ps(out + (size_t)h * hd + j0 + 16 * t);
    for (int i = 0; i < n; i++) {
        const char *row = v + (size_t)i * rb;
        if (j0 == 0 && i + PF_AHEAD < n) pf_rows(v, rb, i + PF_AHEAD, i + PF_AHEAD + 1, pf_bytes);
        __m512 x[8];
        if (KIND == K_F32)
#pragma GCC unroll 8
            for (int t = 0; t < JT; t++) x[t] = _mm512_loadu_ps((const float *)row + j0 + 16 * t);
        else if (KIND == K_F16)
#pragma GCC unroll 8
            for (int t = 0; t < JT; t++) x[t] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + j0 + 16 * t)));
        else
#pragma GCC unroll 4
            for (int t = 0; t < JT; t += 2) {
                const pd_block_q8_0 *b = (const pd_block_q8_0 *)row + (j0 + 16 * t) / PD_QK;
                const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
                x[t] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->qs))));
                x[t + 1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16)))));
            }
#pragma GCC unroll 8
        for (int h = 0; h < NH; h++) {
            const __m512 wb = _mm512_set1_ps(w[h * ws + i]);
#pragma GCC unroll 8
            for (int t = 0; t < JT; t++) acc[h][t] = _mm512_fmadd_ps(wb, x[t], acc[h][t]);
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < NH; h++)
#pragma GCC unroll 8
        for (int t = 0; t < JT; t++) _mm512_storeu_ps(out + (size_t)h * hd + j0 + 16 * t, acc[h][t]);
}

/* Tiles of JT vectors (NH * JT <= 24 accumulators: with the row's vectors and the weight, no
 * spills), then the rest by tiles of 2 (Q8_0: a block) or 1. */
AI void accum_heads(int KIND, int NH, float *out, int hd, const float *w, size_t ws, const char *v, size_t rb, int n) {
    const int JT = NH <= 2 ? 8 : NH <= 6 ? 4 : 2, JT2 = KIND == K_Q8 ? 2 : 1;
    int j0 = 0;
    for (; j0 + 16 * JT <= hd; j0 += 16 * JT) accum_tile(KIND, NH, JT, out, hd, w, ws, v, rb, n, j0);
    for (; j0 + 16 * JT2 <= hd; j0 += 16 * JT2) accum_tile(KIND, NH, JT2, out, hd, w, ws, v, rb, n, j0);
}

#define ACCUM_KIND(KIND, name)                                                                              \
    static void name(int nh, float *out, int hd, const float *w, size_t ws, const char *v, size_t rb, int n) { \
        switch (nh) {                                                                                       \
        case 1: accum_heads(KIND, 1, out, hd, w, ws, v, rb, n); break;                                      \
        case 2: accum_heads(KIND, 2, out, hd, w, ws, v, rb, n); break;                                      \
        case 3: accum_heads(KIND, 3, out, hd, w, ws, v, rb, n); break;                                      \
        case 4: accum_heads(KIND, 4, out, hd, w, ws, v, rb, n); break;                                      \
        case 5: accum_heads(KIND, 5, out, hd, w, ws, v, rb, n); break;                                      \
        case 6: accum_heads(KIND, 6, out, hd, w, ws, v, rb, n); break;                                      \
        case 7: accum_heads(KIND, 7, out, hd, w, ws, v, rb, n); break;                                      \
        default: accum_heads(KIND, 8, out, hd, w, ws, v, rb, n); break;                                     \
        }                                                                                                   \
    }
ACCUM_KIND(K_F32, accum_f32)
ACCUM_KIND(K_F16, accum_f16)
ACCUM_KIND(K_Q8, accum_q8)

static void attn_accum_mh(int kv_type, int nh, int hd, float *out, const float *w, size_t ws, const void *v,
                          size_t rb, int n) {
    if (hd % 16 || nh < 1 || n < 1 || (kv_type == PD_KV_Q8_0 && hd % PD_QK)) {
        pd_avx2_attn_accum_mh(kv_type, nh, hd, out, w, ws, v, rb, n);
        return;
    }
    /* heads are independent: groups of at most 8 (a head's sums do not depend on its group) */
    for (int h0 = 0; h0 < nh; h0 += 8) {
        const int g = nh - h0 < 8 ? nh - h0 : 8;
        float *o = out + (size_t)h0 * hd;
        const float *wh = w + h0 * ws;
        if (kv_type == PD_KV_Q8_0) accum_q8(g, o, hd, wh, ws, v, rb, n);
        else if (kv_type == PD_KV_F16) accum_f16(g, o, hd, wh, ws, v, rb, n);
        else accum_f32(g, o, hd, wh, ws, v, rb, n);
    }
}

/* For the table in x86/avx512.c. */
#define PD_AVX512_EXPORT(fn) extern __typeof__(fn) pd_avx512_##fn __attribute__((alias(#fn)));
PD_AVX512_EXPORT(attn_scores_mh)
PD_AVX512_EXPORT(attn_accum_mh)
#endif
