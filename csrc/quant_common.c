/* Type traits, portable f16 conversion and scalar row dequantization (embedding lookup, tests). */
#include "kernels.h"
#include <string.h>

/* d*q + m must round twice, as the reference (gguf / ggml) does, for the dequantization to be
 * bit-exact: never let the compiler fuse it into an fma (GNU C contracts by default). */
#pragma GCC optimize("fp-contract=off")

typedef struct { int block; size_t bytes; int act; const char *name; } type_traits;

static type_traits traits(int type) {
    switch (type) {
    case PD_F32:  return (type_traits){1, 4, PD_ACT_F32, "F32"};
    case PD_F16:  return (type_traits){1, 2, PD_ACT_F32, "F16"};
    case PD_BF16: return (type_traits){1, 2, PD_ACT_F32, "BF16"};
    case PD_Q4_0: return (type_traits){32, sizeof(pd_block_q4_0), PD_ACT_Q8, "Q4_0"};
    case PD_Q4_1: return (type_traits){32, sizeof(pd_block_q4_1), PD_ACT_Q8, "Q4_1"};
    case PD_Q5_0: return (type_traits){32, sizeof(pd_block_q5_0), PD_ACT_Q8, "Q5_0"};
    case PD_Q5_1: return (type_traits){32, sizeof(pd_block_q5_1), PD_ACT_Q8, "Q5_1"};
    case PD_Q8_0: return (type_traits){32, sizeof(pd_block_q8_0), PD_ACT_Q8, "Q8_0"};
    default:      return (type_traits){0, 0, PD_ACT_NONE, "unknown"};
    }
}

int pd_type_block_size(int type) { return traits(type).block; }
size_t pd_type_block_bytes(int type) { return traits(type).bytes; }
int pd_type_act_format(int type) { return traits(type).act; }
const char *pd_type_name(int type) { return traits(type).name; }

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float pd_f16_to_f32(uint16_t h) { return pd_f16_to_f32_inline(h); }

uint16_t pd_f32_to_f16(float f) {
    uint32_t u = f2u(f), sign = (u >> 16) & 0x8000;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)                /* nan: quiet, keep the top payload bits */
        return (uint16_t)(sign | 0x7e00 | ((u >> 13) & 0x3ff));
    if (u >= 0x47800000u)               /* >= 65536 (and inf): inf */
        return (uint16_t)(sign | 0x7c00);
    if (u < 0x38800000u) {              /* < 2^-14: f16 subnormal or zero.
        Adding 0.5f aligns the value so the f16 mantissa lands in the low bits of the f32
        mantissa; the FPU's own round-to-nearest-even does the rounding. */
        uint32_t r = f2u(u2f(u) + 0.5f) - f2u(0.5f);
        return (uint16_t)(sign | r);
    }
    /* normal: rebias, then round-to-nearest-even on the 13 dropped bits (a carry into the
     * exponent is correct, up to inf for values in [65520, 65536)). */
    uint32_t odd = (u >> 13) & 1;
    u += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
    return (uint16_t)(sign | (u >> 13));
}

/* q4/q5 nibble layout: value j (j<16) is qs[j] & 0xF, value j+16 is qs[j] >> 4;
 * q5's fifth bit of value j is bit j of the little-endian qh word. */
int pd_dequantize_row(int type, const void *w, float *y, int k) {
    type_traits t = traits(type);
    if (t.block == 0 || k < 0 || k % t.block) return -1;
    const int nb = k / PD_QK;
    switch (type) {
    case PD_F32: memcpy(y, w, (size_t)k * 4); return 0;
    case PD_F16:
        for (int i = 0; i < k; i++) y[i] = pd_f16_to_f32_inline(((const uint16_t *)w)[i]);
        return 0;
    case PD_BF16:
        for (int i = 0; i < k; i++) y[i] = pd_bf16_to_f32(((const uint16_t *)w)[i]);
        return 0;
    case PD_Q8_0:
        for (int b = 0; b < nb; b++) {
            const pd_block_q8_0 *x = (const pd_block_q8_0 *)w + b;
            float d = pd_f16_to_f32_inline(x->d);
            for (int j = 0; j < 32; j++) y[b * 32 + j] = d * x->qs[j];
        }
        return 0;
    case PD_Q4_0: case PD_Q4_1:
        for (int b = 0; b < nb; b++) {
            const uint8_t *qs; float d, m = 0.0f; int off;
            if (type == PD_Q4_0) {
                const pd_block_q4_0 *x = (const pd_block_q4_0 *)w + b;
                d = pd_f16_to_f32_inline(x->d); qs = x->qs; off = 8;
            } else {
                const pd_block_q4_1 *x = (const pd_block_q4_1 *)w + b;
                d = pd_f16_to_f32_inline(x->d); m = pd_f16_to_f32_inline(x->m); qs = x->qs; off = 0;
            }
            for (int j = 0; j < 16; j++) {
                int q0 = qs[j] & 0xf, q1 = qs[j] >> 4;
                y[b * 32 + j] = off ? d * (q0 - off) : d * q0 + m;
                y[b * 32 + j + 16] = off ? d * (q1 - off) : d * q1 + m;
            }
        }
        return 0;
    case PD_Q5_0: case PD_Q5_1:
        for (int b = 0; b < nb; b++) {
            const uint8_t *qs, *qh8; float d, m = 0.0f; int off;
            if (type == PD_Q5_0) {
                const pd_block_q5_0 *x = (const pd_block_q5_0 *)w + b;
                d = pd_f16_to_f32_inline(x->d); qs = x->qs; qh8 = x->qh; off = 16;
            } else {
                const pd_block_q5_1 *x = (const pd_block_q5_1 *)w + b;
                d = pd_f16_to_f32_inline(x->d); m = pd_f16_to_f32_inline(x->m);
                qs = x->qs; qh8 = x->qh; off = 0;
            }
            uint32_t qh = (uint32_t)qh8[0] | (uint32_t)qh8[1] << 8 | (uint32_t)qh8[2] << 16 |
                          (uint32_t)qh8[3] << 24;
            for (int j = 0; j < 16; j++) {
                int q0 = (qs[j] & 0xf) | ((qh >> j) & 1) << 4;
                int q1 = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
                y[b * 32 + j] = off ? d * (q0 - off) : d * q0 + m;
                y[b * 32 + j + 16] = off ? d * (q1 - off) : d * q1 + m;
            }
        }
        return 0;
    }
    return -1;
}
