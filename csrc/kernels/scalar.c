/* Portable reference kernels: plain C, one output at a time, written for clarity.
 * They define the exact arithmetic the SIMD tables must agree with: per 32-value block an
 * exact integer dot product, then one float multiply-add into a float row sum. */
#include "kernels/kernels.h"
#include <math.h>
#include <string.h>

/* x[i] ~= d*q[i] with d = amax/127 and q = round-half-away(x*(1/d)): the rule of gguf's numpy
 * Q8_0 quantizer (and ggml's reference), so tests can reproduce it bit for bit. d stays f32. */
static void quantize_q8(const float *x, pd_q8 *y, int k) {
    for (int b = 0; b < k / PD_QK; b++, x += PD_QK) {
        uint32_t ab = 0;   /* formats.h: the max of |x| as integers */
        for (int j = 0; j < PD_QK; j++) ab = pd_abs_bits(x[j]) > ab ? pd_abs_bits(x[j]) : ab;
        const float amax = pd_bits_float(ab);
        if (!pd_amax_finite(amax)) { pd_q8_nonfinite(&y[b]); continue; }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < PD_QK; j++) {
            int q = (int)roundf(x[j] * id);
            y[b].qs[j] = (int8_t)q;
            sum += q;
        }
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

/* The same rule per 256 values (pd_q8k), plus the sum of each 16 consecutive q (bsums). */
static void quantize_q8k(const float *x, pd_q8k *y, int k) {
    for (int b = 0; b < k / PD_QKK; b++, x += PD_QKK) {
        uint32_t ab = 0;
        for (int j = 0; j < PD_QKK; j++) ab = pd_abs_bits(x[j]) > ab ? pd_abs_bits(x[j]) : ab;
        const float amax = pd_bits_float(ab);
        if (!pd_amax_finite(amax)) { pd_q8k_nonfinite(&y[b]); continue; }
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        /* |x*id| <= 127 * (1 + a few ulp): rounds to at most 127, no clamp needed */
        for (int j = 0; j < PD_QKK; j++) y[b].qs[j] = (int8_t)(int)roundf(x[j] * id);
        for (int s = 0; s < PD_QKK / 16; s++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += y[b].qs[16 * s + j];
            y[b].bsums[s] = (int16_t)sum;
        }
        y[b].d = d;
    }
}

/* One weight block . one activation block, as a float. Each is: exact integer dot of the
 * quants, times dw*dx, plus (for the formats with a minimum m) m*s, s = dx*sum(qx).
 * The quants are unpacked to 32 int8 first: simple loops the compiler vectorizes. */
static inline int dot32(const int8_t *a, const int8_t *b) {
    int isum = 0;
    for (int j = 0; j < 32; j++) isum += a[j] * b[j];
    return isum;
}

/* 32 q4 values (layout in kernels.h) minus off. */
static inline void unpack_q4(const uint8_t *qs, int off, int8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((qs[j] & 0xf) - off);
        q[j + 16] = (int8_t)((qs[j] >> 4) - off);
    }
}

/* 32 q5 values minus off: the q4 nibbles plus bit j of the little-endian word qh as bit 4. */
static inline void unpack_q5(const uint8_t *qs, const uint8_t *qh8, int off, int8_t *q) {
    const uint32_t qh = (uint32_t)qh8[0] | (uint32_t)qh8[1] << 8 | (uint32_t)qh8[2] << 16 |
                        (uint32_t)qh8[3] << 24;
    unpack_q4(qs, 0, q);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)((q[j] | ((qh >> j) & 1) << 4) - off);
}

static inline float blk_q8_0(const void *wb, const pd_q8 *x) {
    const pd_block_q8_0 *w = wb;
    return pd_f16_to_f32_inline(w->d) * x->d * (float)dot32(w->qs, x->qs);
}
static inline float blk_q4_0(const void *wb, const pd_q8 *x) {
    const pd_block_q4_0 *w = wb;
    int8_t q[32];
    unpack_q4(w->qs, 8, q);
    return pd_f16_to_f32_inline(w->d) * x->d * (float)dot32(q, x->qs);
}
static inline float blk_q4_1(const void *wb, const pd_q8 *x) {
    const pd_block_q4_1 *w = wb;
    int8_t q[32];
    unpack_q4(w->qs, 0, q);
    return pd_f16_to_f32_inline(w->d) * x->d * (float)dot32(q, x->qs) +
           pd_f16_to_f32_inline(w->m) * x->s;
}
static inline float blk_q5_0(const void *wb, const pd_q8 *x) {
    const pd_block_q5_0 *w = wb;
    int8_t q[32];
    unpack_q5(w->qs, w->qh, 16, q);
    return pd_f16_to_f32_inline(w->d) * x->d * (float)dot32(q, x->qs);
}
static inline float blk_q5_1(const void *wb, const pd_q8 *x) {
    const pd_block_q5_1 *w = wb;
    int8_t q[32];
    unpack_q5(w->qs, w->qh, 0, q);
    return pd_f16_to_f32_inline(w->d) * x->d * (float)dot32(q, x->qs) +
           pd_f16_to_f32_inline(w->m) * x->s;
}

/* The codebook formats (formats.h): 32 nibbles through the 16-entry table, then Q8_0's block. */
static inline void unpack_codebook(const uint8_t *qs, const int8_t *kv, int8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = kv[qs[j] & 0xf];
        q[j + 16] = kv[qs[j] >> 4];
    }
}
static inline float blk_iq4_nl(const void *wb, const pd_q8 *x) {
    const pd_block_iq4_nl *w = wb;
    int8_t q[32];
    unpack_codebook(w->qs, pd_kvalues_iq4nl, q);
    return pd_f16_to_f32_inline(w->d) * x->d * (float)dot32(q, x->qs);
}
static inline float blk_mxfp4(const void *wb, const pd_q8 *x) {
    const pd_block_mxfp4 *w = wb;
    int8_t q[32];
    unpack_codebook(w->qs, pd_kvalues_mxfp4, q);
    return pd_e8m0_half(w->e) * x->d * (float)dot32(q, x->qs);
}

/* The mat-mat loop shared by all pd_q8-activation formats (blk inlines: one copy per format). */
static inline void matmul_q8act(float (*blk)(const void *, const pd_q8 *), size_t bbytes, int k,
                                const void *w, size_t ws, int nrows, const void *x, size_t xs,
                                int ncols, float *y, size_t ys) {
    const int nb = k / PD_QK;
    for (int c = 0; c < ncols; c++) {
        const pd_q8 *xc = (const pd_q8 *)((const char *)x + c * xs);
        for (int r = 0; r < nrows; r++) {
            const char *wr = (const char *)w + r * ws;
            float sum = 0.0f;
            for (int b = 0; b < nb; b++) sum += blk(wr + b * bbytes, xc + b);
            y[c * ys + r] = sum;
        }
    }
}

/* A table entry over one of the two loops: legacy formats (matmul_q8act, a block's dot per
 * format) and K-quants (matmul_q8kact, per type id). */
#define SCALAR_MATMUL(name, loop, format, block_t)                                              \
    static void name(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,   \
                     int ncols, float *y, size_t ys) {                                        \
        loop(format, sizeof(block_t), k, w, ws, nrows, x, xs, ncols, y, ys);                 \
    }
SCALAR_MATMUL(matmul_q8_0, matmul_q8act, blk_q8_0, pd_block_q8_0)
SCALAR_MATMUL(matmul_q4_0, matmul_q8act, blk_q4_0, pd_block_q4_0)
SCALAR_MATMUL(matmul_q4_1, matmul_q8act, blk_q4_1, pd_block_q4_1)
SCALAR_MATMUL(matmul_q5_0, matmul_q8act, blk_q5_0, pd_block_q5_0)
SCALAR_MATMUL(matmul_q5_1, matmul_q8act, blk_q5_1, pd_block_q5_1)
SCALAR_MATMUL(matmul_iq4_nl, matmul_q8act, blk_iq4_nl, pd_block_iq4_nl)
SCALAR_MATMUL(matmul_mxfp4, matmul_q8act, blk_mxfp4, pd_block_mxfp4)

/* The legacy formats repacked by 16 rows (kernels.h: PD_*_R16): the SIMD kernels' arithmetic
 * (x86: avx512.c, r16_256.h; ARM64: arm/r16.h), lane by lane, so they agree bit for bit: per block, the integer dot sum(u * a), then
 * acc = fma(float(dot), d*dx, acc) and acc = fma(mw, s, acc) (fmaf rounds once, as the
 * instruction does), mw = m or d * -offset. */
void pd_scalar_matmul_r16(int rt, int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                          int ncols, float *y, size_t ys) {
    const int nb = k / PD_QK, q8 = rt == PD_Q8_0_R16;
    const size_t rb = pd_r16_bytes(rt);
    for (int r = 0; r < nrows; r += PD_R16_ROWS) {
        const char *g = (const char *)w + (size_t)r * ws;
        for (int c = 0; c < ncols; c++) {
            const pd_q8 *xc = (const pd_q8 *)((const char *)x + (size_t)c * xs);
            for (int j = 0; j < PD_R16_ROWS; j++) {
                float acc = 0.0f;
                for (int b = 0; b < nb; b++) {
                    const char *blk = g + (size_t)b * rb;
                    const uint8_t *qs = (const uint8_t *)blk + pd_r16_qs_off(rt);
                    uint16_t d, m = 0;
                    uint64_t hm[8] = { 0 };
                    memcpy(&d, blk + 2 * j, 2);
                    if (pd_r16_has_min(rt)) memcpy(&m, blk + pd_r16_m_off(rt) + 2 * j, 2);
                    if (pd_r16_has_hmask(rt)) memcpy(hm, blk + pd_r16_hmask_off(rt), sizeof hm);
                    int dot = 0;
                    for (int h = 0; h < 8; h++)
                        for (int t = 0; t < 4; t++) {
                            int u = q8 ? qs[64 * h + 4 * j + t]
                                       : (h < 4 ? qs[64 * h + 4 * j + t] & 0xF : qs[64 * (h - 4) + 4 * j + t] >> 4);
                            if (pd_r16_codebook(rt)) u = pd_r16_codebook(rt)[u] + 128;   /* formats.h */
                            u += (int)((hm[h] >> (4 * j + t)) & 1) * 16;
                            dot += u * xc[b].qs[4 * h + t];
                        }
                    const float dw = rt == PD_MXFP4_R16 ? pd_e8m0_half((uint8_t)blk[j]) : pd_f16_to_f32(d);
                    const float mw = pd_r16_has_min(rt) ? pd_f16_to_f32(m) : dw * (float)-pd_r16_offset(rt);
                    acc = fmaf((float)dot, dw * xc[b].d, acc);
                    acc = fmaf(mw, xc[b].s, acc);
                }
                y[(size_t)c * ys + r + j] = acc;
            }
        }
    }
}

/* K-quants x pd_q8k: each weight super-block is unpacked once to the common form of kernels.h
 * (pd_kblock: int8 q, per-16 sc and m) and then serves every column. Per super-block:
 *   isum = sum_s sc[s] * (q . a over sub-block s), msum = sum_s m[s] * bsums[s]   (exact int;
 *   |isum| < 2^27 for every format), then one float expression dx * (d*isum - dmin*msum). */
static inline float kdot(const pd_kblock *w, const pd_q8k *x) {
    int isum = 0, msum = 0;
    for (int s = 0; s < 16; s++) {
        int dot = 0;
        for (int j = 16 * s; j < 16 * s + 16; j++) dot += w->q[j] * x->qs[j];
        isum += w->sc[s] * dot;
        msum += w->m[s] * x->bsums[s];
    }
    return x->d * (w->d * (float)isum - w->dmin * (float)msum);
}

static inline void matmul_q8kact(int type, size_t bbytes, int k, const void *w, size_t ws,
                                 int nrows, const void *x, size_t xs, int ncols, float *y,
                                 size_t ys) {
    const int nb = k / PD_QKK;
    pd_kblock kb;
    for (int r = 0; r < nrows; r++) {
        const char *wr = (const char *)w + r * ws;
        for (int c = 0; c < ncols; c++) y[c * ys + r] = 0.0f;
        for (int b = 0; b < nb; b++) {
            pd_unpack_kblock(type, wr + b * bbytes, &kb);
            for (int c = 0; c < ncols; c++)
                y[c * ys + r] += kdot(&kb, (const pd_q8k *)((const char *)x + c * xs) + b);
        }
    }
}

SCALAR_MATMUL(matmul_q2_k, matmul_q8kact, PD_Q2_K, pd_block_q2_k)
SCALAR_MATMUL(matmul_q3_k, matmul_q8kact, PD_Q3_K, pd_block_q3_k)
SCALAR_MATMUL(matmul_q4_k, matmul_q8kact, PD_Q4_K, pd_block_q4_k)
SCALAR_MATMUL(matmul_q5_k, matmul_q8kact, PD_Q5_K, pd_block_q5_k)
SCALAR_MATMUL(matmul_q6_k, matmul_q8kact, PD_Q6_K, pd_block_q6_k)
SCALAR_MATMUL(matmul_iq4_xs, matmul_q8kact, PD_IQ4_XS, pd_block_iq4_xs)   /* a K-quant without minima */

/* Float-activation formats: weight value i of a row, as float. */
static inline float wf_f32(const void *w, int i) { return ((const float *)w)[i]; }
static inline float wf_f16(const void *w, int i) {
    return pd_f16_to_f32_inline(((const uint16_t *)w)[i]);
}
static inline float wf_bf16(const void *w, int i) {
    return pd_bf16_to_f32(((const uint16_t *)w)[i]);
}

/* Sums in 32-value chunks added to the row total, like the block formats (smaller error than
 * one running sum over the whole row). */
static inline void matmul_float(float (*wf)(const void *, int), int k, const void *w, size_t ws,
                                int nrows, const void *x, size_t xs, int ncols, float *y,
                                size_t ys) {
    for (int c = 0; c < ncols; c++) {
        const float *xc = (const float *)((const char *)x + c * xs);
        for (int r = 0; r < nrows; r++) {
            const void *wr = (const char *)w + r * ws;
            float sum = 0.0f;
            for (int i0 = 0; i0 < k; i0 += PD_QK) {
                float part = 0.0f;
                for (int i = i0; i < k && i < i0 + PD_QK; i++) part += wf(wr, i) * xc[i];
                sum += part;
            }
            y[c * ys + r] = sum;
        }
    }
}

#define FLOAT_MATMUL(name, wf)                                                                 \
    static void name(int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,   \
                     int ncols, float *y, size_t ys) {                                        \
        matmul_float(wf, k, w, ws, nrows, x, xs, ncols, y, ys);                               \
    }
FLOAT_MATMUL(matmul_f32, wf_f32)
FLOAT_MATMUL(matmul_f16, wf_f16)
FLOAT_MATMUL(matmul_bf16, wf_bf16)

static void axpy_f32(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}
static void axpy_f16(float *y, float a, const uint16_t *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * pd_f16_to_f32_inline(x[i]);
}
static void f32_to_f16(const float *x, uint16_t *y, int n) {
    for (int i = 0; i < n; i++) y[i] = pd_f32_to_f16(x[i]);
}

static float exp_sub(float *x, int n, float shift) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - shift); sum += x[i]; }
    return sum;
}
static void attn_accum(float *out, const float *w, const void *v, size_t stride, int n, int hd, int f16) {
    for (int i = 0; i < n; i++) {
        if (f16) axpy_f16(out, w[i], (const uint16_t *)v + i * stride, hd);
        else axpy_f32(out, w[i], (const float *)v + i * stride, hd);
    }
}

static void attn_accum_q8(float *out, const float *w, const void *v, size_t row_bytes, int n, int hd) {
    for (int i = 0; i < n; i++) {
        const pd_block_q8_0 *b = (const pd_block_q8_0 *)((const char *)v + (size_t)i * row_bytes);
        for (int j = 0; j < hd / PD_QK; j++) {
            const float s = w[i] * pd_f16_to_f32_inline(b[j].d);
            for (int t = 0; t < PD_QK; t++) out[j * PD_QK + t] += s * (float)b[j].qs[t];
        }
    }
}

/* The gated FFN activation (the plain formulas: x / (1 + exp(-z))). */
static void act_mul(float *g, const float *u, int n, int gelu) {
    for (int i = 0; i < n; i++) {
        const float x = g[i], z = gelu ? 1.5957691216f * (x + 0.044715f * x * x * x) : x;
        g[i] = x / (1.0f + expf(-z)) * u[i];
    }
}

/* The sampler's vocabulary passes (kernels.h). */
static double sum_exp(const float *x, int n, float scale, float shift) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += expf(scale * (x[i] - shift));
    return s;
}

static int collect_above(const float *x, int n, float t, int32_t *out) {
    int nc = 0;
    for (int i = 0; i < n; i += 16) {
        int end = i + 16 < n ? i + 16 : n, any = 0;
        for (int q = i; q < end; q++) any |= x[q] > t;            /* vectorized block test */
        if (!any) continue;
        for (int q = i; q < end; q++) if (x[q] > t) out[nc++] = q;
    }
    return nc;
}

PD_ATTN_MH_BY_HEAD   /* the twins of attn_scores_mh / attn_accum_mh: the matmuls and accums above */

const pd_kernels pd_kernels_scalar = PD_KERNEL_TABLE("scalar");
