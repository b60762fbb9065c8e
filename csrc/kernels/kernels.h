/* The kernel table: one per ISA (scalar; x86: avx2, avxvnni, avx512; ARM: neon, dotprod, i8mm), picked at run time by
 * dispatch.c; every entry of every table has a plain-C twin in scalar.c that the tests compare
 * it with. The block formats the entries read are formats.h's. */
#ifndef PD_KERNELS_H
#define PD_KERNELS_H
#include "kernels/formats.h"
#include "pydecode.h"   /* PD_KV_F32, PD_KV_F16, PD_KV_Q8_0 */

/* Y[c*y_stride + r] = dot(row r of W, column c of X) for r < nrows, c < ncols.
 * Row r of W starts at (const char*)w + r*w_stride and holds k values of the weight type.
 * Column c of X starts at (const char*)x + c*x_stride, in the activation format of that type
 * (pd_q8[k/32] for PD_ACT_Q8, pd_q8k[k/256] for PD_ACT_Q8K, float[k] for PD_ACT_F32). ncols == 1 is the decode mat-vec;
 * ncols > 1 is prefill, where a kernel should reuse each loaded weight block for many columns. */
typedef void pd_matmul_fn_t(int k, const void *w, size_t w_stride, int nrows,
                            const void *x, size_t x_stride, int ncols,
                            float *y, size_t y_stride);
typedef pd_matmul_fn_t *pd_matmul_fn;

typedef struct {
    const char *name;
    void (*quantize_q8)(const float *x, pd_q8 *y, int k);         /* k % 32 == 0 */
    void (*quantize_q8k)(const float *x, pd_q8k *y, int k);       /* k % 256 == 0 */
    pd_matmul_fn matmul[PD_NTYPES];                                  /* NULL = unsupported */
    void (*f32_to_f16)(const float *x, uint16_t *y, int n);          /* KV cache append */
    /* Attention over n cached rows (core/attention.c; the scores are the matmul of the cache's
     * format against the group's queries): exp_sub: x[i] = exp(x[i] - shift), returns the sum;
     * attn_accum: out += sum_i w[i] * V_i, row i at v + i*stride elements, F16 if f16 else F32.
     * One call per head and contiguous run of positions. */
    float (*exp_sub)(float *x, int n, float shift);
    void (*attn_accum)(float *out, const float *w, const void *v, size_t stride, int n, int hd, int f16);
    /* attn_accum over a Q8_0 cache (hd % 32 == 0): row i is hd/32 pd_block_q8_0 at
     * (const char *)v + i*row_bytes; out += sum_i w[i] * d_ib * q_ib, block by block. */
    void (*attn_accum_q8)(float *out, const float *w, const void *v, size_t row_bytes, int n, int hd);
    /* A query-head group's attention over one contiguous run of n <= 256 cache rows (one call per
     * run for all nh heads, so a SIMD table converts each K/V row once for the group and reduces
     * many scores at once; every table has them: PD_ATTN_MH_BY_HEAD builds them from the
     * per-head kernels).
     * kv_type: PD_KV_F16 (row = hd uint16 f16), PD_KV_F32, PD_KV_Q8_0 (hd/32 pd_block_q8_0);
     * row i starts at (const char *)k + i*row_bytes.
     * attn_scores_mh: s[h*s_stride + i] = q_h . K_i (unscaled) for h < nh, i < n; q is nh x hd
     * floats (F16/F32) or nh x hd/32 pd_q8 blocks (Q8_0: the query quantized by quantize_q8).
     * attn_accum_mh: out[h*hd + j] += sum_i w[h*w_stride + i] * V_i[j] for h < nh, j < hd. */
    void (*attn_scores_mh)(int kv_type, int nh, int hd, const void *q, const void *k, size_t row_bytes, int n,
                           float *s, size_t s_stride);
    void (*attn_accum_mh)(int kv_type, int nh, int hd, float *out, const float *w, size_t w_stride, const void *v,
                          size_t row_bytes, int n);
    /* The gated FFN activation, in place: g[i] = act(g[i]) * u[i], act = SiLU, or GELU (tanh
     * form) when gelu; both are z * sigmoid(.), computed from exp(-|.|) so nothing overflows. */
    void (*act_mul)(float *g, const float *u, int n, int gelu);
    /* The sampler's vocabulary passes (sampling/): sum_exp = sum of exp(scale * (x[i] - shift));
     * collect_above writes the ids i (ascending) with x[i] > t to out (room for n + 16: SIMD
     * twins store whole vectors) and returns how many. */
    double (*sum_exp)(const float *x, int n, float scale, float shift);
    int (*collect_above)(const float *x, int n, float t, int32_t *out);
} pd_kernels;

/* A table over an ISA file's functions of the standard names: quantize_q8, quantize_q8k,
 * matmul_<format> (f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k .. q6_k iq4_nl iq4_xs mxfp4), f32_to_f16,
 * exp_sub, attn_accum, attn_accum_q8, attn_scores_mh, attn_accum_mh, act_mul, sum_exp, collect_above,
 * then the designators given
 * after the name (the repacked layouts' entries). (A table that reuses
 * another's entries: x86/avx2_exports.h.) */
#define PD_KERNEL_TABLE(isa_name, ...) {                                                             \
    .name = isa_name, .quantize_q8 = quantize_q8, .quantize_q8k = quantize_q8k,               \
    .matmul = { [PD_F32] = matmul_f32, [PD_F16] = matmul_f16, [PD_BF16] = matmul_bf16,         \
                [PD_Q4_0] = matmul_q4_0, [PD_Q4_1] = matmul_q4_1, [PD_Q5_0] = matmul_q5_0,     \
                [PD_Q5_1] = matmul_q5_1, [PD_Q8_0] = matmul_q8_0, [PD_Q2_K] = matmul_q2_k,     \
                [PD_Q3_K] = matmul_q3_k, [PD_Q4_K] = matmul_q4_k, [PD_Q5_K] = matmul_q5_k,     \
                [PD_Q6_K] = matmul_q6_k, [PD_IQ4_NL] = matmul_iq4_nl, [PD_IQ4_XS] = matmul_iq4_xs, \
                [PD_MXFP4] = matmul_mxfp4 },                                                   \
    .f32_to_f16 = f32_to_f16, .exp_sub = exp_sub,                  \
    .attn_accum = attn_accum, .attn_accum_q8 = attn_accum_q8, .attn_scores_mh = attn_scores_mh,   \
    .attn_accum_mh = attn_accum_mh, .act_mul = act_mul, .sum_exp = sum_exp, .collect_above = collect_above, \
    __VA_ARGS__ }

/* attn_scores_mh and attn_accum_mh by a file's per-head entries (its matmul_q8_0 / matmul_f16 /
 * matmul_f32 with a column per head, and attn_accum / attn_accum_q8 once per head): what the
 * scalar table (as the tests' plain-C twin), AVX2 and ARM tables use, where one convert per
 * row for the group would gain little against the per-head loops they already have. */
#define PD_ATTN_MH_BY_HEAD                                                                          \
    static void attn_scores_mh(int kv_type, int nh, int hd, const void *q, const void *k, size_t row_bytes, \
                               int n, float *s, size_t s_stride) {                                  \
        const int q8 = kv_type == PD_KV_Q8_0;                                                       \
        pd_matmul_fn mm = q8 ? matmul_q8_0 : kv_type == PD_KV_F16 ? matmul_f16 : matmul_f32;       \
        mm(hd, k, row_bytes, n, q, q8 ? (size_t)hd / PD_QK * sizeof(pd_q8) : (size_t)hd * sizeof(float), nh, \
           s, s_stride);                                                                            \
    }                                                                                               \
    static void attn_accum_mh(int kv_type, int nh, int hd, float *out, const float *w, size_t w_stride, \
                              const void *v, size_t row_bytes, int n) {                             \
        for (int h = 0; h < nh; h++) {                                                              \
            if (kv_type == PD_KV_Q8_0) attn_accum_q8(out + (size_t)h * hd, w + h * w_stride, v, row_bytes, n, hd); \
            else attn_accum(out + (size_t)h * hd, w + h * w_stride, v,                              \
                            row_bytes / (kv_type == PD_KV_F16 ? 2 : 4), n, hd, kv_type == PD_KV_F16); \
        }                                                                                           \
    }

extern const pd_kernels pd_kernels_scalar;
#if defined(PD_HAVE_AVX2)
extern const pd_kernels pd_kernels_avx2;
#endif
#if defined(PD_HAVE_AVX512)
extern const pd_kernels pd_kernels_avx512;    /* AVX-512 F/BW/VL/DQ + AVX512-VNNI */
#endif
#if defined(PD_HAVE_AVXVNNI)
extern const pd_kernels pd_kernels_avxvnni;   /* AVX2 + AVX-VNNI (256-bit VEX), no AVX-512 */
#endif
#if defined(PD_HAVE_AVXVNNI_EVEX)
extern const pd_kernels pd_kernels_avxvnni_evex;   /* the same, EVEX-encoded: tests only */
#endif
#if defined(PD_HAVE_NEON)
extern const pd_kernels pd_kernels_neon;      /* ARMv8-A Advanced SIMD (every aarch64 CPU) */
#endif
#if defined(PD_HAVE_DOTPROD)
extern const pd_kernels pd_kernels_dotprod;   /* ARMv8.2 dot product (SDOT) */
#endif
#if defined(PD_HAVE_I8MM)
extern const pd_kernels pd_kernels_i8mm;      /* + ARMv8.6 int8 matrix multiply (SMMLA) batch tiles */
#endif

/* Bytes of n values (n % 32 == 0 for Q8_0) in a KV cache format: the one formula of a cache row. */
static inline size_t pd_kv_bytes(int kv_type, size_t n) {
    return kv_type == PD_KV_Q8_0 ? n / PD_QK * sizeof(pd_block_q8_0) : n * (kv_type == PD_KV_F16 ? 2 : 4);
}

/* x[k] (k % 32 == 0) as k/32 GGML Q8_0 blocks by K's quantize_q8 (gguf's rule, its scale then
 * rounded to f16): the KV cache's Q8_0 rows (kernels/quant.c). */
void pd_quantize_blocks_q8_0(const pd_kernels *K, const float *x, pd_block_q8_0 *y, int k);

/* The table `forced` names, else the one $PYDECODE_ISA names, else the best this CPU supports;
 * NULL if the named one is unknown or unsupported here. */
const pd_kernels *pd_kernels_select(const char *forced);
/* As pd_kernels_select, but never NULL: a table that cannot run here gives way to the best. */
const pd_kernels *pd_kernels_or_best(const char *isa);
#endif
