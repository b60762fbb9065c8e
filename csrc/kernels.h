/* Internal kernel interface: block formats, activation formats and the per-ISA dispatch table.
 *
 * The pattern every weight format follows (as fast CPU runtimes do it): the activation vector is
 * quantized ONCE per mat-vec into 8-bit blocks (pd_q8: 32 int8 + scale + scaled sum), and each
 * weight block is combined with it by an integer dot product, then one float multiply-add per
 * block. A weight row is never dequantized to floats in memory on the hot path.
 * F32/F16/BF16 weights take float activations instead.
 */
#ifndef PD_KERNELS_H
#define PD_KERNELS_H
#include <stddef.h>
#include <stdint.h>

/* Weight types use GGML's type ids so a GGUF tensor's type maps 1:1. */
enum {
    PD_F32 = 0, PD_F16 = 1, PD_Q4_0 = 2, PD_Q4_1 = 3, PD_Q5_0 = 6, PD_Q5_1 = 7,
    PD_Q8_0 = 8, PD_Q8_1 = 9, PD_Q2_K = 10, PD_Q3_K = 11, PD_Q4_K = 12, PD_Q5_K = 13,
    PD_Q6_K = 14, PD_Q8_K = 15, PD_BF16 = 30, PD_NTYPES = 40
};

/* Activation formats a weight type pairs with. */
enum { PD_ACT_NONE = -1, PD_ACT_F32 = 0, PD_ACT_Q8 = 1, PD_ACT_Q8K = 2 };

#define PD_QK 32          /* values per block of the legacy formats and of pd_q8 */

/* Quantized activation block: x[i] ~= d * qs[i]; s = d * sum(qs) feeds the minimum term of
 * formats like Q4_1 (w = dw*q + m  =>  sum(w*x) = dw*dx*sum(q*qs) + m*s). */
typedef struct { float d; float s; int8_t qs[PD_QK]; } pd_q8;

#define PD_QKK 256        /* values per super-block of the K-quants and of pd_q8k */

/* Activation block for the K-quants: 256 values, one scale, and the sum of each 16 values so the
 * minimum term of Q2_K/Q4_K/Q5_K (w = d*sc*q - dmin*m per 16 or 32 values) and the offsets of
 * Q3_K/Q6_K need no extra pass: sum(w*x) = d*dx*sum(sc*sum(q*qs)) - dmin*dx*sum(m*bsums). */
typedef struct { float d; int8_t qs[PD_QKK]; int16_t bsums[PD_QKK / 16]; } pd_q8k;

/* GGML block layouts (byte-exact with the GGUF file). f16 stored as uint16_t bits. */
typedef struct { uint16_t d; uint8_t qs[16]; } pd_block_q4_0;               /* w = d*(q-8) */
typedef struct { uint16_t d, m; uint8_t qs[16]; } pd_block_q4_1;            /* w = d*q + m */
typedef struct { uint16_t d; int8_t qs[32]; } pd_block_q8_0;                /* w = d*q */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } pd_block_q5_0;   /* w = d*(q-16) */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } pd_block_q5_1; /* w = d*q + m */
/* nibble layout of q4_0/q4_1: value j (j<16) is qs[j] & 0xF, value j+16 is qs[j] >> 4;
 * q5_0/q5_1 add a fifth bit: bit j of the little-endian 32-bit word qh is bit 4 of value j. */

/* Y[c*y_stride + r] = dot(row r of W, column c of X) for r < nrows, c < ncols.
 * Row r of W starts at (const char*)w + r*w_stride and holds k values of the weight type.
 * Column c of X starts at (const char*)x + c*x_stride, in the activation format of that type
 * (pd_q8[k/32] for PD_ACT_Q8, pd_q8k[k/256] for PD_ACT_Q8K, float[k] for PD_ACT_F32). ncols == 1 is the decode mat-vec;
 * ncols > 1 is prefill, where a kernel should reuse each loaded weight block for many columns. */
typedef void (*pd_matmul_fn)(int k, const void *w, size_t w_stride, int nrows,
                             const void *x, size_t x_stride, int ncols,
                             float *y, size_t y_stride);

typedef struct {
    const char *name;
    void (*quantize_q8)(const float *x, pd_q8 *y, int k);         /* k % 32 == 0 */
    void (*quantize_q8k)(const float *x, pd_q8k *y, int k);       /* k % 256 == 0 */
    pd_matmul_fn matmul[PD_NTYPES];                                  /* NULL = unsupported */
    float (*dot_f32)(const float *a, const float *b, int n);
    float (*dot_f16)(const float *a, const uint16_t *b, int n);      /* attention: q . K row */
    void (*axpy_f32)(float *y, float a, const float *x, int n);      /* y += a*x */
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int n);   /* attention: acc += p*V row */
    void (*f32_to_f16)(const float *x, uint16_t *y, int n);          /* KV cache append */
} pd_kernels;

extern const pd_kernels pd_kernels_scalar;
#if defined(PD_HAVE_AVX2)
extern const pd_kernels pd_kernels_avx2;
#endif

/* Picks the best table the CPU supports, or the one PYDECODE_ISA names (NULL if unknown/unsupported). */
const pd_kernels *pd_kernels_select(const char *forced);

/* Type traits (quant_common.c). */
int pd_type_block_size(int type);      /* values per block, 0 if unknown */
size_t pd_type_block_bytes(int type);  /* bytes per block */
int pd_type_act_format(int type);      /* PD_ACT_* */
const char *pd_type_name(int type);
/* Dequantize one row (embedding lookup; tests). Returns 0, or -1 for unsupported type. */
int pd_dequantize_row(int type, const void *w, float *y, int k);


/* Portable scalar f16/bf16 conversions. */
float pd_f16_to_f32(uint16_t h);
uint16_t pd_f32_to_f16(float f);
/* pd_f16_to_f32's body, inlinable in portable hot loops (the scalar kernels). */
static inline float pd_f16_to_f32_inline(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0x1f) {                  /* inf / nan: keep the payload bits */
        v.u = sign | 0x7f800000u | (mant << 13);
    } else if (exp == 0) {              /* zero / subnormal: mant * 2^-24 is exact in f32 */
        v.f = (float)mant * (1.0f / 16777216.0f);
        v.u |= sign;
    } else {
        v.u = sign | ((exp + 112) << 23) | (mant << 13);   /* rebias 15 -> 127 */
    }
    return v.f;
}
static inline float pd_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f;
}
#endif
