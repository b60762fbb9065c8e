/* AVX2 + FMA + F16C kernels (this file alone is compiled with -mavx2 -mfma -mf16c).
 *
 * Block formats x pd_q8 activations: per 32-value block, the weight quants are unpacked to 32
 * bytes, multiplied with the activation bytes by vpmaddubsw (unsigned x signed -> 16 int16 pair
 * sums; q8_0 weights are signed, so their sign moves onto the activation: |w| * sign(x, w)),
 * widened by vpmaddwd with ones to 8 int32, converted, and fmadd'ed with the block scale
 * dw*dx into a float accumulator; one horizontal sum per output at the end. Each integer block
 * dot is exact, so results differ from the scalar table only in float summation order.
 *
 * Tiling: a tile is R weight rows x C activation columns. Each activation block is loaded once
 * for R rows and each unpacked weight block serves C columns. Rows are the outer loop, so a
 * tile's weight rows stay in L1 while all columns pass (prefill reads the weights once). With
 * ncols == 1 (decode) the kernel streams weights from DRAM: each row is software-prefetched
 * PF_DIST bytes ahead (see pd_pf), which took 4096x4096 mat-vec from ~12 to ~25 (Q4_1) and
 * ~43 (Q8_0) GB/s single-threaded on a Zen 4 (hot-cache Q4_1 is compute-bound at ~25).
 */
#if defined(__AVX2__)
#include "kernels/kernels.h"
#include <immintrin.h>
#include <math.h>
#include "kernels/x86/exp.h"
#include <stddef.h>
#include <string.h>

/* Only the FMAs written below: an automatically fused x*id - t in quantize_q8 would round
 * differently from the reference (GNU C contracts vector expressions by default). */
#pragma GCC optimize("fp-contract=off")

#ifndef QCMAX
#define QCMAX 4 /* max columns per quant tile: 4x4 accumulators (measured best of 2..4) */
#endif
#ifndef FCMAX
#define FCMAX 3 /* float formats: 4x3 (at 4x4 the weight and x registers spill) */
#endif
#ifndef PF_DIST
#define PF_DIST 4096 /* bytes ahead per weight row (measured: 1024 -> 4096 = +15..70% cold GB/s) */
#endif
#include "kernels/x86/common.h"
#include "kernels/x86/tiles.h"

/* ---------------------------------------------------------------- activation quantization */

/* roundf(t) (half away from zero, not the FPU's half-to-even) as int32: truncate, then step one
 * away from zero when the (exact) fraction is >= 0.5. */
AI __m256i round_away(__m256 t) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(t, tr));
    const __m256 step = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                                      _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(t, sign)));
    return _mm256_cvtps_epi32(_mm256_add_ps(tr, step));
}

/* The largest of 8 |x| bit patterns (formats.h: amax compared as integers), as a float. */
AI float amax_of_bits(__m256i m8) {
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(m8), _mm256_extracti128_si256(m8, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0xb1));
    return _mm_cvtss_f32(_mm_castsi128_ps(m));
}
AI __m256i abs_bits(__m256 v) { return _mm256_castps_si256(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v)); }

static void quantize_q8(const float *x, pd_q8 *y, int k) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < k / PD_QK; b++, x += PD_QK) {
        __m256 v[4];
        __m256i ab = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            ab = _mm256_max_epi32(ab, abs_bits(v[i]));
        }
        const float amax = amax_of_bits(ab);
        if (!pd_amax_finite(amax)) { pd_q8_nonfinite(&y[b]); continue; }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4], sum = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            q[i] = round_away(_mm256_mul_ps(v[i], vid));
            sum = _mm256_add_epi32(sum, q[i]);
        }
        /* int32 -> int8: the packs interleave 4-value groups per 128-bit lane; permute back */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)y[b].qs, _mm256_permutevar8x32_epi32(p, order));
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
        y[b].d = d;
        y[b].s = d * (float)_mm_cvtsi128_si32(s);
    }
}

/* quantize_q8's rule per 256 values, plus bsums (sums of 16 q) taken from the int32 quants
 * before packing: 2 vectors per 16 values, 8 such sums per 128 values through reduce8. */
static void quantize_q8k(const float *x, pd_q8k *y, int k) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < k / PD_QKK; b++, x += PD_QKK) {
        __m256i m4[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                         _mm256_setzero_si256()};   /* 4 chains of independent maxes */
        for (int i = 0; i < PD_QKK / 8; i++) m4[i % 4] = _mm256_max_epi32(m4[i % 4], abs_bits(_mm256_loadu_ps(x + 8 * i)));
        const float amax = amax_of_bits(_mm256_max_epi32(_mm256_max_epi32(m4[0], m4[1]), _mm256_max_epi32(m4[2], m4[3])));
        if (!pd_amax_finite(amax)) { pd_q8k_nonfinite(&y[b]); continue; }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i sums[2];
        for (int h = 0; h < 2; h++) {           /* halves of 128 values: 8 bsums each */
            __m256i part[8];
            for (int t = 0; t < 4; t++) {       /* chunks of 32 values */
                const float *xc = x + 128 * h + 32 * t;
                __m256i q[4];
                for (int i = 0; i < 4; i++) q[i] = round_away(_mm256_mul_ps(_mm256_loadu_ps(xc + 8 * i), vid));
                part[2 * t] = _mm256_add_epi32(q[0], q[1]);
                part[2 * t + 1] = _mm256_add_epi32(q[2], q[3]);
                /* int32 -> int8: the packs interleave 4-value groups per 128-bit lane */
                const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                                     _mm256_packs_epi32(q[2], q[3]));
                _mm256_storeu_si256((__m256i *)(y[b].qs + 128 * h + 32 * t),
                                    _mm256_permutevar8x32_epi32(p, order));
            }
            sums[h] = reduce8(part);
        }
        /* packs_epi32 interleaves 128-bit halves: [s0 lo, s1 lo, s0 hi, s1 hi] -> fix order */
        const __m256i bs = _mm256_permute4x64_epi64(_mm256_packs_epi32(sums[0], sums[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)y[b].bsums, bs);
        y[b].d = d;
    }
}

/* ---------------------------------------------------------------- block formats x pd_q8 */

/* q4_0/q5_0 are unpacked unsigned; their offset (8/16) is subtracted as off*sum(x) in int16. */
AI int offset(int T) { return T == T_Q4_0 ? 8 : T == T_Q5_0 ? 16 : 0; }

/* Block b of a row as 32 quant bytes (unsigned, except q8_0 and the codebook formats: signed). */
AI __m256i unpack(int T, const char *blk) {
    switch (T) {
    case T_IQ4_NL: case T_MXFP4: return codebook_lookup(T, blk, 0);
    case T_Q4_0: return nibbles(blk + 2);
    case T_Q4_1: return nibbles(blk + 4);
    case T_Q5_0: return _mm256_or_si256(nibbles(blk + 6), fifth_bits(blk + 2));
    case T_Q5_1: return _mm256_or_si256(nibbles(blk + 8), fifth_bits(blk + 4));
    default:     return _mm256_loadu_si256((const __m256i *)(blk + 2));
    }
}

/* Y[c][r] for an R x C tile, over nb blocks. w: first row; x: first column. */
AI void tile_q(int T, int R, int C, int nb, const char *w, size_t ws, const char *x, size_t xs,
               float *y, size_t ys) {
    const size_t bb = blk_bytes(T);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][QCMAX];
    __m128 macc[QCMAX];   /* min term m*s of formats with a minimum; lane r = row r */
#pragma GCC unroll 16
    for (int i = 0; i < R * C; i++) acc[i / C][i % C] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) macc[c] = _mm_setzero_ps();

    pd_pf pf = pf_init(w, nb * bb, ws);
    for (int b = 0; b < nb; b++, pf_advance(&pf, bb)) {
        const char *wb = w + b * bb;
        const __m128 dw = load_scale4(T, wb, ws, R);
        const __m128 mw = has_min(T) ? load_h4(wb + 2, ws, R) : _mm_setzero_ps();
        const pd_q8 *xb[QCMAX];
        __m256i xq[QCMAX], xoff[QCMAX];
        __m256 dd[QCMAX];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            xb[c] = (const pd_q8 *)(x + c * xs) + b;
            xq[c] = _mm256_loadu_si256((const __m256i *)xb[c]->qs);
            if (offset(T)) xoff[c] = _mm256_maddubs_epi16(_mm256_set1_epi8((char)offset(T)), xq[c]);
            const __m128 d = _mm_mul_ps(dw, _mm_set1_ps(xb[c]->d));
            dd[c] = _mm256_set_m128(d, d);
            if (has_min(T)) macc[c] = _mm_fmadd_ps(mw, _mm_set1_ps(xb[c]->s), macc[c]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm_prefetch(pf.p + r * ws, _MM_HINT_T0);
            const __m256i q = unpack(T, wb + r * ws);
            const __m256i aq = signed_quants(T) ? _mm256_sign_epi8(q, q) : q;
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m256i p = signed_quants(T) ? _mm256_maddubs_epi16(aq, _mm256_sign_epi8(xq[c], q))
                                        : _mm256_maddubs_epi16(q, xq[c]);
                if (offset(T)) p = _mm256_sub_epi16(p, xoff[c]);
                const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                acc[r][c] = _mm256_fmadd_ps(f, bcast_lane(dd[c], r), acc[r][c]);
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

PD_Q_MATMULS   /* matmul_q4_0 .. matmul_q8_0 over tile_q (tiles.h) */
PD_Q_MATMUL(matmul_iq4_nl, T_IQ4_NL)   /* the codebook formats: Q8_0's arithmetic on looked-up bytes */
PD_Q_MATMUL(matmul_mxfp4, T_MXFP4)

/* ---------------------------------------------------------------- K-quants x pd_q8k
 * (kernels/x86/kquant.h, see there) with vpmaddwd + vpaddd. */
#define PD_KDOT(acc, pairs, sc) _mm256_add_epi32((acc), _mm256_madd_epi16((sc), (pairs)))
#include "kernels/x86/kquant.h"
PD_K_MATMUL(matmul_iq4_xs, T_IQ4_XS)
/* Q4_K and Q6_K repacked by 16 rows (formats.h: PD_Q4_K_R16, PD_Q6_K_R16). */
#define KR_KDOT PD_KDOT
#include "kernels/x86/kr16_256.h"
/* The legacy formats repacked by 16 rows (kernels/x86/r16_256.h): the 4-byte dots by vpmaddubsw +
 * vpmaddwd (exact: nibble quants <= 31), Q8_0's by the sign trick on w = u ^ 0x80 plus 128 * sum(a). */
AI __m256i r16_dot_avx2(__m256i acc, __m256i u, const int8_t *p) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_set1_epi32(ld32(p))),
                                                   _mm256_set1_epi16(1)));
}
AI __m256i r16_dot_q8_avx2(__m256i acc, __m256i u, const int8_t *p) {
    const __m256i w = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80)), a = _mm256_set1_epi32(ld32(p));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w)),
                                                   _mm256_set1_epi16(1)));
}
AI __m256i r16_q8_seed_avx2(const pd_q8 *xb) {   /* 128 * the block's sum of activations */
    const __m256i a = _mm256_loadu_si256((const __m256i *)xb->qs);
    const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), a), _mm256_set1_epi16(1));
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    const __m128i q = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m128i t = _mm_add_epi32(q, _mm_shuffle_epi32(q, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm256_slli_epi32(_mm256_broadcastd_epi32(t), 7);
}
AI __m256i r16_pairs_avx2(__m256i u, const int8_t *p) {
    return _mm256_maddubs_epi16(u, _mm256_set1_epi32(ld32(p)));
}
#define R16_PAIRS r16_pairs_avx2
#define R16_WIDEN(p) _mm256_madd_epi16((p), _mm256_set1_epi16(1))
#define R16_DOT r16_dot_avx2
#define R16_DOT_Q8 r16_dot_q8_avx2
#define R16_Q8_SEED r16_q8_seed_avx2
#include "kernels/x86/r16_256.h"

/* ---------------------------------------------------------------- float formats x float */

enum { T_F32, T_F16, T_BF16 };

AI __m256 load8(int T, const char *row, int i) {   /* weights i..i+7 of a row as floats */
    if (T == T_F32) return _mm256_loadu_ps((const float *)row + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (T == T_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));   /* bf16 */
}
AI float load1(int T, const char *row, int i) {
    return T == T_F32 ? ((const float *)row)[i]
         : T == T_F16 ? _cvtsh_ss(((const uint16_t *)row)[i])
                      : pd_bf16_to_f32(((const uint16_t *)row)[i]);
}

AI void tile_f(int T, int R, int C, int k, const char *w, size_t ws, const char *x, size_t xs,
               float *y, size_t ys) {
    __m256 acc[4][FCMAX];
#pragma GCC unroll 16
    for (int i = 0; i < R * C; i++) acc[i / C][i % C] = _mm256_setzero_ps();
    int i = 0;
    const size_t es = T == T_F32 ? 4 : 2;
    pd_pf pf = pf_init(w, k * es, ws);
    for (; i + 8 <= k; i += 8, pf_advance(&pf, 8 * es)) {
        __m256 xv[FCMAX];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) xv[c] = _mm256_loadu_ps((const float *)(x + c * xs) + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm_prefetch(pf.p + r * ws, _MM_HINT_T0);
            const __m256 wv = load8(T, w + r * ws, i);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const float *xc = (const float *)(x + c * xs);
            float s = hsum(acc[r][c]);
            for (int j = i; j < k; j++) s += load1(T, w + r * ws, j) * xc[j];
            y[c * ys + r] = s;
        }
}

#define F_MATMUL(name, T)                                                                     \
    static void name(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,  \
                     int ncols, float *y, size_t ys) {                                       \
        RUN_TILES(FCMAX, F_TILE_##T)                                                          \
    }
#define F_TILE(T, R_, C_, r, c)                                                               \
    tile_f(T, R_, C_, k, (const char *)w + (r) * ws, ws, (const char *)x + (c) * xs, xs,     \
           y + (c) * ys + (r), ys)
#define F_TILE_T_F32(R_, C_, r, c) F_TILE(T_F32, R_, C_, r, c)
#define F_TILE_T_F16(R_, C_, r, c) F_TILE(T_F16, R_, C_, r, c)
#define F_TILE_T_BF16(R_, C_, r, c) F_TILE(T_BF16, R_, C_, r, c)
F_MATMUL(matmul_f32, T_F32)
F_MATMUL(matmul_f16, T_F16)
F_MATMUL(matmul_bf16, T_BF16)

/* ---------------------------------------------------------------- attention / KV helpers */

AI __m256 ld_h8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static void f32_to_f16(const float *x, uint16_t *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {   /* vcvtps2ph rounds to nearest even, like pd_f32_to_f16 */
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(y + i), h);
    }
    for (; i < n; i++) y[i] = pd_f32_to_f16(x[i]);
}

/* ---- attention over the KV cache (the scores are the float matmuls above: core/attention.c) ----
 * The weighted sum: 64 output dims in 8 accumulators while the rows stream past. F16 rows are
 * widened with vcvtph2ps on the fly, never copied. hd need not be a multiple of 8. */
AI __m256 ld_kv8(const void *p, size_t i, int f16) {
    return f16 ? ld_h8((const uint16_t *)p + i) : _mm256_loadu_ps((const float *)p + i);
}
AI float ld_kv1(const void *p, size_t i, int f16) {
    return f16 ? _cvtsh_ss(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* g = act(g) * u with act(x) = x * sigmoid(z), z = x (SiLU) or the tanh-GELU's 1.5957691216 *
 * (x + 0.044715 x^3): sigmoid from e = exp(-|z|) (exp256's domain), 1/(1+e) or e/(1+e). */
static void act_mul(float *g, const float *u, int n, int gelu) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 z = gelu ? _mm256_mul_ps(_mm256_set1_ps(1.5957691216f),
                                              _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x),
                                                              _mm256_mul_ps(x, x), x))
                              : x;
        const __m256 e = exp256(_mm256_or_ps(z, sign));                      /* exp(-|z|) */
        const __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, e));
        const __m256 sg = _mm256_blendv_ps(r, _mm256_mul_ps(e, r), z);       /* z < 0: e/(1+e) */
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(x, sg), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        const float x = g[i], z = gelu ? 1.5957691216f * (x + 0.044715f * x * x * x) : x;
        g[i] = x / (1.0f + expf(-z)) * u[i];
    }
}

static float exp_sub(float *x, int n, float shift) {
    const __m256 sh = _mm256_set1_ps(shift);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum(acc);
    for (; i < n; i++) {
        x[i] = _mm256_cvtss_f32(exp256(_mm256_set1_ps(x[i] - shift)));
        sum += x[i];
    }
    return sum;
}

static void attn_accum(float *out, const float *w, const void *v, size_t stride, int n, int hd, int f16) {
    int j0 = 0;
    for (; j0 + 64 <= hd; j0 += 64) {
        __m256 a[8];
        for (int c = 0; c < 8; c++) a[c] = _mm256_loadu_ps(out + j0 + 8 * c);
        for (int i = 0; i < n; i++) {
            const __m256 wi = _mm256_set1_ps(w[i]);
            const size_t r = (size_t)i * stride + j0;
            for (int c = 0; c < 8; c++) a[c] = _mm256_fmadd_ps(wi, ld_kv8(v, r + 8 * c, f16), a[c]);
        }
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(out + j0 + 8 * c, a[c]);
    }
    for (; j0 + 8 <= hd; j0 += 8) {
        __m256 a = _mm256_loadu_ps(out + j0);
        for (int i = 0; i < n; i++) a = _mm256_fmadd_ps(_mm256_set1_ps(w[i]), ld_kv8(v, (size_t)i * stride + j0, f16), a);
        _mm256_storeu_ps(out + j0, a);
    }
    for (; j0 < hd; j0++)
        for (int i = 0; i < n; i++) out[j0] += w[i] * ld_kv1(v, (size_t)i * stride + j0, f16);
}

/* Over a Q8_0 cache: per 32-value block, 4 accumulators while the rows stream past (a chunk of
 * rows is L1-resident, so a second block's pass over the same rows reads no DRAM); each row's
 * int8 widened to floats (vpmovsxbd + vcvtdq2ps) and scaled by w[i] * d in one fmadd. */
static void attn_accum_q8(float *out, const float *w, const void *v, size_t row_bytes, int n, int hd) {
    for (int j = 0; j < hd / PD_QK; j++) {
        __m256 a[4];
        for (int c = 0; c < 4; c++) a[c] = _mm256_loadu_ps(out + j * PD_QK + 8 * c);
        const char *p = (const char *)v + (size_t)j * sizeof(pd_block_q8_0);
        for (int i = 0; i < n; i++, p += row_bytes) {
            const pd_block_q8_0 *b = (const pd_block_q8_0 *)p;
            const __m256 s = _mm256_set1_ps(w[i] * _cvtsh_ss(b->d));
            const __m128i lo = _mm_loadu_si128((const __m128i *)b->qs), hi = _mm_loadu_si128((const __m128i *)(b->qs + 16));
            a[0] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), a[0]);
            a[1] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), a[1]);
            a[2] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), a[2]);
            a[3] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), a[3]);
        }
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(out + j * PD_QK + 8 * c, a[c]);
    }
}

/* ---------------------------------------------------------------- the sampler's vocabulary passes */

static double sum_exp(const float *x, int n, float scale, float shift) {
    __m256 vs = _mm256_set1_ps(scale), vsh = _mm256_set1_ps(shift);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_ps(a0, exp256(_mm256_mul_ps(vs, _mm256_sub_ps(_mm256_loadu_ps(x + i), vsh))));
        a1 = _mm256_add_ps(a1, exp256(_mm256_mul_ps(vs, _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vsh))));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(a0, a1));
    double s = 0.0;
    for (int j = 0; j < 8; j++) s += lanes[j];
    for (; i < n; i++) {
        __m256 t = exp256(_mm256_set1_ps(scale * (x[i] - shift)));
        s += _mm256_cvtss_f32(t);
    }
    return s;
}

/* The ids i (ascending) with x[i] > t, written to out; returns how many. */
static int collect_above(const float *x, int n, float t, int32_t *out) {
    const __m256 vt = _mm256_set1_ps(t);
    int nc = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        const int m0 = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vt, _CMP_GT_OQ));
        const int m1 = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), vt, _CMP_GT_OQ));
        const int m2 = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + 16), vt, _CMP_GT_OQ));
        const int m3 = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + 24), vt, _CMP_GT_OQ));
        unsigned m = (unsigned)m0 | (unsigned)m1 << 8 | (unsigned)m2 << 16 | (unsigned)m3 << 24;
        while (m) {                           /* the set bits, lowest first */
            out[nc++] = i + __builtin_ctz(m);
            m &= m - 1;
        }
    }
    for (; i < n; i++) if (x[i] > t) out[nc++] = i;
    return nc;
}

PD_ATTN_MH_BY_HEAD   /* kernels.h: one call per head of the loops above */

const pd_kernels pd_kernels_avx2 = PD_KERNEL_TABLE("avx2", .matmul[PD_Q4_K_R16] = matmul_q4_k_r16,
    .matmul[PD_Q6_K_R16] = matmul_q6_k_r16, .matmul[PD_Q4_0_R16] = matmul_q4_0_r16,
    .matmul[PD_Q4_1_R16] = matmul_q4_1_r16, .matmul[PD_Q5_0_R16] = matmul_q5_0_r16,
    .matmul[PD_Q5_1_R16] = matmul_q5_1_r16, .matmul[PD_Q8_0_R16] = matmul_q8_0_r16,
    .matmul[PD_IQ4_NL_R16] = matmul_iq4_nl_r16, .matmul[PD_MXFP4_R16] = matmul_mxfp4_r16);

/* Entries the AVX-VNNI and AVX-512 tables reuse (kernels/x86/avxvnni.c, kernels/x86/avx512.c): where
 * VNNI or 512-bit registers do not help (see those files). */
#define PD_AVX2_EXPORT(fn) extern __typeof__(fn) pd_avx2_##fn __attribute__((alias(#fn)));
PD_AVX2_EXPORT(quantize_q8)
PD_AVX2_EXPORT(act_mul)
PD_AVX2_EXPORT(quantize_q8k)
PD_AVX2_EXPORT(matmul_q8_0)
PD_AVX2_EXPORT(matmul_iq4_nl)
PD_AVX2_EXPORT(matmul_iq4_xs)
PD_AVX2_EXPORT(matmul_mxfp4)
PD_AVX2_EXPORT(matmul_f32)
PD_AVX2_EXPORT(matmul_f16)
PD_AVX2_EXPORT(matmul_bf16)
PD_AVX2_EXPORT(f32_to_f16)
PD_AVX2_EXPORT(exp_sub)
PD_AVX2_EXPORT(attn_accum)
PD_AVX2_EXPORT(attn_accum_q8)
PD_AVX2_EXPORT(attn_scores_mh)
PD_AVX2_EXPORT(attn_accum_mh)
PD_AVX2_EXPORT(sum_exp)
PD_AVX2_EXPORT(collect_above)
#endif
