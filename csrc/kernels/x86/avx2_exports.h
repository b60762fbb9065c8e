/* The AVX2 table's entries that the AVX-VNNI and AVX-512 tables reuse where VNNI or 512-bit
 * registers do not help (avx2.c exports them as pd_avx2_<name>, see its end), and a table that
 * starts from them: the including file overrides what it has of its own (a later designator
 * replaces an earlier one: C99 6.7.8). */
#ifndef PD_X86_AVX2_EXPORTS_H
#define PD_X86_AVX2_EXPORTS_H
#include "kernels/kernels.h"

void pd_avx2_quantize_q8(const float *x, pd_q8 *y, int k);
void pd_avx2_quantize_q8k(const float *x, pd_q8k *y, int k);
pd_matmul_fn_t pd_avx2_matmul_q8_0, pd_avx2_matmul_f32, pd_avx2_matmul_f16, pd_avx2_matmul_bf16;
pd_matmul_fn_t pd_avx2_matmul_iq4_nl, pd_avx2_matmul_iq4_xs, pd_avx2_matmul_mxfp4;
void pd_avx2_f32_to_f16(const float *x, uint16_t *y, int n);
float pd_avx2_exp_sub(float *x, int n, float shift);
void pd_avx2_attn_accum(float *out, const float *w, const void *v, size_t stride, int n, int hd, int f16);
void pd_avx2_attn_accum_q8(float *out, const float *w, const void *v, size_t row_bytes, int n, int hd);
void pd_avx2_attn_scores_mh(int kv_type, int nh, int hd, const void *q, const void *k, size_t row_bytes, int n,
                            float *s, size_t s_stride);
void pd_avx2_attn_accum_mh(int kv_type, int nh, int hd, float *out, const float *w, size_t w_stride, const void *v,
                           size_t row_bytes, int n);
void pd_avx2_act_mul(float *g, const float *u, int n, int gelu);
double pd_avx2_sum_exp(const float *x, int n, float scale, float shift);
int pd_avx2_collect_above(const float *x, int n, float t, int32_t *out);

#define PD_TABLE_OVER_AVX2(isa_name, ...) {                                                     \
    .name = isa_name, .quantize_q8 = pd_avx2_quantize_q8, .quantize_q8k = pd_avx2_quantize_q8k, \
    .matmul = { [PD_F32] = pd_avx2_matmul_f32, [PD_F16] = pd_avx2_matmul_f16,                  \
                [PD_BF16] = pd_avx2_matmul_bf16, [PD_Q8_0] = pd_avx2_matmul_q8_0,              \
                [PD_IQ4_NL] = pd_avx2_matmul_iq4_nl, [PD_IQ4_XS] = pd_avx2_matmul_iq4_xs,      \
                [PD_MXFP4] = pd_avx2_matmul_mxfp4 },                                           \
    .f32_to_f16 = pd_avx2_f32_to_f16,                       \
    .exp_sub = pd_avx2_exp_sub, .attn_accum = pd_avx2_attn_accum,    \
    .attn_accum_q8 = pd_avx2_attn_accum_q8, .attn_scores_mh = pd_avx2_attn_scores_mh,           \
    .attn_accum_mh = pd_avx2_attn_accum_mh, .act_mul = pd_avx2_act_mul,                          \
    .sum_exp = pd_avx2_sum_exp, .collect_above = pd_avx2_collect_above, __VA_ARGS__ }
/* The codebook formats' matmuls by the file's own (the table has the AVX2 ones otherwise). */
#define PD_IQ4_MATMULS_OWN                                                                      \
    .matmul[PD_IQ4_NL] = matmul_iq4_nl, .matmul[PD_IQ4_XS] = matmul_iq4_xs, .matmul[PD_MXFP4] = matmul_mxfp4
/* Overrides of the block formats' matmuls by the file's own of the standard names. */
#define PD_BLOCK_MATMULS_OWN                                                                    \
    .matmul[PD_Q4_0] = matmul_q4_0, .matmul[PD_Q4_1] = matmul_q4_1, .matmul[PD_Q5_0] = matmul_q5_0, \
    .matmul[PD_Q5_1] = matmul_q5_1, .matmul[PD_Q8_0] = matmul_q8_0, .matmul[PD_Q2_K] = matmul_q2_k, \
    .matmul[PD_Q3_K] = matmul_q3_k, .matmul[PD_Q4_K] = matmul_q4_k, .matmul[PD_Q5_K] = matmul_q5_k, \
    .matmul[PD_Q6_K] = matmul_q6_k, .matmul[PD_Q4_0_R16] = matmul_q4_0_r16,                     \
    .matmul[PD_Q4_1_R16] = matmul_q4_1_r16, .matmul[PD_Q5_0_R16] = matmul_q5_0_r16,              \
    .matmul[PD_Q5_1_R16] = matmul_q5_1_r16, .matmul[PD_Q8_0_R16] = matmul_q8_0_r16
#endif
