/* Type traits, portable f16 conversion and scalar row dequantization (embedding lookup, tests). */
#include "kernels/kernels.h"
#include <stddef.h>
#include <string.h>

/* d*q + m must round twice, as the reference (gguf / ggml) does, for the dequantization to be
 * bit-exact: never let the compiler fuse it into an fma (GNU C contracts by default). */
#pragma GCC optimize("fp-contract=off")

typedef struct { int block; size_t bytes; int act; } type_traits;

static type_traits traits(int type) {
    switch (type) {
    case PD_F32:  return (type_traits){1, 4, PD_ACT_F32};
    case PD_F16:  return (type_traits){1, 2, PD_ACT_F32};
    case PD_BF16: return (type_traits){1, 2, PD_ACT_F32};
    case PD_Q4_0: return (type_traits){32, sizeof(pd_block_q4_0), PD_ACT_Q8};
    case PD_Q4_1: return (type_traits){32, sizeof(pd_block_q4_1), PD_ACT_Q8};
    /* repacked by 16 rows: the same bytes per row, on average */
    case PD_Q4_0_R16: return (type_traits){32, sizeof(pd_block_q4_0), PD_ACT_Q8};
    case PD_Q4_1_R16: return (type_traits){32, sizeof(pd_block_q4_1), PD_ACT_Q8};
    case PD_Q5_0_R16: return (type_traits){32, sizeof(pd_block_q5_0), PD_ACT_Q8};
    case PD_Q5_1_R16: return (type_traits){32, sizeof(pd_block_q5_1), PD_ACT_Q8};
    case PD_Q8_0_R16: return (type_traits){32, sizeof(pd_block_q8_0), PD_ACT_Q8};
    case PD_IQ4_NL_R16: return (type_traits){32, sizeof(pd_block_iq4_nl), PD_ACT_Q8};
    case PD_MXFP4_R16: return (type_traits){32, sizeof(pd_block_mxfp4), PD_ACT_Q8};
    case PD_Q4_K_R16: return (type_traits){256, sizeof(pd_block_q4_k), PD_ACT_Q8K};
    case PD_Q6_K_R16: return (type_traits){256, sizeof(pd_block_q6_k), PD_ACT_Q8K};
    case PD_Q5_0: return (type_traits){32, sizeof(pd_block_q5_0), PD_ACT_Q8};
    case PD_Q5_1: return (type_traits){32, sizeof(pd_block_q5_1), PD_ACT_Q8};
    case PD_Q8_0: return (type_traits){32, sizeof(pd_block_q8_0), PD_ACT_Q8};
    case PD_Q2_K: return (type_traits){256, sizeof(pd_block_q2_k), PD_ACT_Q8K};
    case PD_Q3_K: return (type_traits){256, sizeof(pd_block_q3_k), PD_ACT_Q8K};
    case PD_Q4_K: return (type_traits){256, sizeof(pd_block_q4_k), PD_ACT_Q8K};
    case PD_Q5_K: return (type_traits){256, sizeof(pd_block_q5_k), PD_ACT_Q8K};
    case PD_Q6_K: return (type_traits){256, sizeof(pd_block_q6_k), PD_ACT_Q8K};
    case PD_IQ4_NL: return (type_traits){32, sizeof(pd_block_iq4_nl), PD_ACT_Q8};
    case PD_MXFP4:  return (type_traits){32, sizeof(pd_block_mxfp4), PD_ACT_Q8};
    case PD_IQ4_XS: return (type_traits){256, sizeof(pd_block_iq4_xs), PD_ACT_Q8K};
    default:      return (type_traits){0, 0, PD_ACT_NONE};
    }
}

/* GGML's names (as the gguf package spells them) of every type id, for messages such as
 * "tensor X has unsupported type IQ4_XS"; ids GGML has retired keep their old names. */
static const char *const type_names[] = {
    "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
    "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M",
    "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8",
    "IQ4_NL_8_8", "MXFP4", "NVFP4", "Q1_0", "Q2_0",
};

int pd_type_block_size(int type) { return traits(type).block; }
size_t pd_type_block_bytes(int type) { return traits(type).bytes; }
int pd_type_act_format(int type) { return traits(type).act; }
const char *pd_type_name(int type) {
    const int n = (int)(sizeof type_names / sizeof type_names[0]);
    if (type >= PD_FIRST_REPACKED && type < PD_NTYPES) {
        static const char *const r16[] = { "Q4_0 (16-row repack)", "Q4_1 (16-row repack)", "Q5_0 (16-row repack)",
                                           "Q5_1 (16-row repack)", "Q8_0 (16-row repack)",
                                           "Q4_K (16-row repack)", "Q6_K (16-row repack)",
                                           "IQ4_NL (16-row repack)", "MXFP4 (16-row repack)" };
        return r16[type - PD_FIRST_REPACKED];
    }
    return type >= 0 && type < n ? type_names[type] : "unknown";
}

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

/* Layouts: see the block structs in kernels.h. Value i = 128h + 32g + l (h < 2, g < 4, l < 32)
 * where a format splits the super-block in halves of 128 and chunks of 32. The loops follow
 * that nesting (no division in the inner loop) so the compiler vectorizes them: this is the
 * hot loop of the scalar kernels. */
void pd_unpack_kblock(int type, const void *blk, pd_kblock *o) {
    o->dmin = 0.0f;
    memset(o->m, 0, sizeof o->m);
    switch (type) {
    case PD_Q2_K: {
        const pd_block_q2_k *b = blk;
        o->d = pd_f16_to_f32_inline(b->d);
        o->dmin = pd_f16_to_f32_inline(b->dmin);
        for (int s = 0; s < 16; s++) { o->sc[s] = b->scales[s] & 0xf; o->m[s] = b->scales[s] >> 4; }
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++)
                for (int l = 0; l < 32; l++)
                    o->q[128 * h + 32 * g + l] = (int8_t)((b->qs[32 * h + l] >> 2 * g) & 3);
        break;
    }
    case PD_Q3_K: {
        const pd_block_q3_k *b = blk;
        int8_t sc[16];
        o->d = pd_f16_to_f32_inline(b->d);
        pd_unpack_scales_q3k(b->scales, sc);
        for (int s = 0; s < 16; s++) o->sc[s] = sc[s];
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++)
                for (int l = 0; l < 32; l++) {
                    const int low = (b->qs[32 * h + l] >> 2 * g) & 3;
                    const int hbit = (b->hmask[l] >> (4 * h + g)) & 1;
                    o->q[128 * h + 32 * g + l] = (int8_t)(low + 4 * hbit - 4);
                }
        break;
    }
    case PD_Q4_K: case PD_Q5_K: {
        /* Same header and nibble layout; Q5_K adds qh between the scales and the nibbles. */
        const pd_block_q4_k *b4 = blk;
        const pd_block_q5_k *b5 = blk;
        const uint8_t *qs = type == PD_Q4_K ? b4->qs : b5->qs;
        static const uint8_t no_qh[32];
        const uint8_t *qh = type == PD_Q5_K ? b5->qh : no_qh;
        uint8_t scm[16];
        o->d = pd_f16_to_f32_inline(b4->d);
        o->dmin = pd_f16_to_f32_inline(b4->dmin);
        pd_unpack_scales_k4(b4->scales, scm);
        for (int s = 0; s < 16; s++) { o->sc[s] = scm[s / 2]; o->m[s] = scm[8 + s / 2]; }
        for (int p = 0; p < 4; p++)        /* chunk pair p: low nibbles, then high nibbles */
            for (int l = 0; l < 32; l++) {
                o->q[64 * p + l] = (int8_t)((qs[32 * p + l] & 0xf) | ((qh[l] >> 2 * p) & 1) << 4);
                o->q[64 * p + 32 + l] = (int8_t)((qs[32 * p + l] >> 4) |
                                                 ((qh[l] >> (2 * p + 1)) & 1) << 4);
            }
        break;
    }
    case PD_Q6_K: {
        const pd_block_q6_k *b = blk;
        o->d = pd_f16_to_f32_inline(b->d);
        for (int s = 0; s < 16; s++) o->sc[s] = b->scales[s];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
            int8_t *q = o->q + 128 * h;
            for (int l = 0; l < 32; l++) {
                q[l] = (int8_t)(((ql[l] & 0xf) | (qh[l] & 3) << 4) - 32);
                q[l + 32] = (int8_t)(((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4) - 32);
                q[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
                q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
            }
        }
        break;
    }
    case PD_IQ4_XS: {   /* formats.h: the codebook's int8 values, each sub-block's scale in both halves */
        const pd_block_iq4_xs *b = blk;
        o->d = pd_f16_to_f32_inline(b->d);
        for (int ib = 0; ib < 8; ib++) {
            o->sc[2 * ib] = o->sc[2 * ib + 1] = (int16_t)pd_iq4xs_scale(b, ib);
            for (int j = 0; j < 16; j++) {
                o->q[32 * ib + j] = pd_kvalues_iq4nl[b->qs[16 * ib + j] & 0xf];
                o->q[32 * ib + 16 + j] = pd_kvalues_iq4nl[b->qs[16 * ib + j] >> 4];
            }
        }
        break;
    }
    default:
        memset(o, 0, sizeof *o);
    }
}

/* q4/q5 nibble layout: value j (j<16) is qs[j] & 0xF, value j+16 is qs[j] >> 4;
 * q5's fifth bit of value j is bit j of the little-endian qh word. */
int pd_dequantize_row(int type, const void *w, float *y, int k) {
    type_traits t = traits(type);
    if (t.block == 0 || k < 0 || k % t.block) return -1;
    const int nb = k / PD_QK;
    if (t.act == PD_ACT_Q8K) {
        /* (d*sc)*q - dmin*m, each product rounded to float32 in this order, as gguf/ggml do */
        const int has_min = type == PD_Q2_K || type == PD_Q4_K || type == PD_Q5_K;
        pd_kblock kb;
        for (int b = 0; b < k / PD_QKK; b++) {
            pd_unpack_kblock(type, (const char *)w + b * t.bytes, &kb);
            for (int i = 0; i < PD_QKK; i++) {
                const float dl = kb.d * (float)kb.sc[i / 16];
                y[b * PD_QKK + i] = has_min ? dl * (float)kb.q[i] - kb.dmin * (float)kb.m[i / 16]
                                            : dl * (float)kb.q[i];
            }
        }
        return 0;
    }
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
    case PD_IQ4_NL: case PD_MXFP4:   /* d * codebook[nibble], one rounding, as gguf */
        for (int b = 0; b < nb; b++) {
            const uint8_t *qs;
            const int8_t *kv;
            float d;
            if (type == PD_IQ4_NL) {
                const pd_block_iq4_nl *x = (const pd_block_iq4_nl *)w + b;
                d = pd_f16_to_f32_inline(x->d); qs = x->qs; kv = pd_kvalues_iq4nl;
            } else {
                const pd_block_mxfp4 *x = (const pd_block_mxfp4 *)w + b;
                d = pd_e8m0_half(x->e); qs = x->qs; kv = pd_kvalues_mxfp4;
            }
            for (int j = 0; j < 16; j++) {
                y[b * 32 + j] = d * (float)kv[qs[j] & 0xf];
                y[b * 32 + j + 16] = d * (float)kv[qs[j] >> 4];
            }
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

/* ---------------- repacked layouts (kernels.h: PD_*_R16) ---------------- */

int pd_repacked_type(int type) {
    switch (type) {
    case PD_Q4_0: return PD_Q4_0_R16;
    case PD_Q4_1: return PD_Q4_1_R16;
    case PD_Q5_0: return PD_Q5_0_R16;
    case PD_Q5_1: return PD_Q5_1_R16;
    case PD_Q8_0: return PD_Q8_0_R16;
    case PD_Q4_K: return PD_Q4_K_R16;
    case PD_Q6_K: return PD_Q6_K_R16;
    case PD_IQ4_NL: return PD_IQ4_NL_R16;
    case PD_MXFP4: return PD_MXFP4_R16;
    default: return -1;
    }
}

/* The file block's fields: d (and m) f16, qh (fifth bits) and the quant bytes. */
static void file_block(int type, const char *blk, uint16_t *d, uint16_t *m, uint32_t *qh, const uint8_t **qs) {
    memcpy(d, blk, 2);
    *m = 0;
    *qh = 0;
    switch (type) {
    case PD_Q4_0: *qs = (const uint8_t *)blk + offsetof(pd_block_q4_0, qs); break;
    case PD_Q4_1: memcpy(m, blk + 2, 2); *qs = (const uint8_t *)blk + offsetof(pd_block_q4_1, qs); break;
    case PD_Q5_0: memcpy(qh, blk + offsetof(pd_block_q5_0, qh), 4); *qs = (const uint8_t *)blk + offsetof(pd_block_q5_0, qs); break;
    case PD_Q5_1: memcpy(m, blk + 2, 2); memcpy(qh, blk + offsetof(pd_block_q5_1, qh), 4);
                  *qs = (const uint8_t *)blk + offsetof(pd_block_q5_1, qs); break;
    case PD_IQ4_NL: *qs = (const uint8_t *)blk + offsetof(pd_block_iq4_nl, qs); break;
    case PD_MXFP4: *d = (uint8_t)blk[0]; *qs = (const uint8_t *)blk + offsetof(pd_block_mxfp4, qs); break;
    default:      *qs = (const uint8_t *)blk + offsetof(pd_block_q8_0, qs); break;
    }
}

int pd_repack(int type, const void *src, size_t src_stride, int nrows, int k, void *dst) {
    const int rt = pd_repacked_type(type);
    if (rt < 0 || !src || !dst || nrows <= 0 || nrows % PD_R16_ROWS || k <= 0 || k % pd_type_block_size(type))
        return -1;
    if (pd_is_kr16(rt)) { pd_repack_kr16(type, src, src_stride, nrows, k, dst); return 0; }
    const int nb = k / PD_QK;
    const size_t fb = pd_type_block_bytes(type), rb = pd_r16_bytes(rt);
    char *out = dst;
    for (int r = 0; r < nrows; r += PD_R16_ROWS)
        for (int b = 0; b < nb; b++, out += rb) {
            uint16_t *dd = (uint16_t *)out, *mm = (uint16_t *)(out + pd_r16_m_off(rt));
            uint64_t hm[8] = { 0 };
            uint8_t *q = (uint8_t *)out + pd_r16_qs_off(rt);
            for (int j = 0; j < PD_R16_ROWS; j++) {
                uint16_t d, m;
                uint32_t qh;
                const uint8_t *qs;
                file_block(type, (const char *)src + (size_t)(r + j) * src_stride + (size_t)b * fb, &d, &m, &qh, &qs);
                if (rt == PD_MXFP4_R16) ((uint8_t *)out)[j] = (uint8_t)d;   /* e[16] */
                else memcpy(dd + j, &d, 2);
                if (pd_r16_has_min(rt)) memcpy(mm + j, &m, 2);
                for (int h = 0; h < 8; h++)
                    for (int t = 0; t < 4; t++) hm[h] |= (uint64_t)((qh >> (4 * h + t)) & 1) << (4 * j + t);
                if (type == PD_Q8_0)
                    for (int h = 0; h < 8; h++)
                        for (int t = 0; t < 4; t++) q[64 * h + 4 * j + t] = qs[4 * h + t] ^ 0x80;
                else
                    for (int g = 0; g < 4; g++) memcpy(q + 64 * g + 4 * j, qs + 4 * g, 4);
            }
            if (pd_r16_has_hmask(rt)) memcpy(out + pd_r16_hmask_off(rt), hm, sizeof hm);
        }
    return 0;
}

/* The KV cache's Q8_0 rows: K's quantize_q8 (d = amax/127, q = round-half-away(x/d): gguf's rule)
 * in pieces of up to 16 blocks on the stack, each scale then stored as f16 (gguf stores it so). */
void pd_quantize_blocks_q8_0(const pd_kernels *K, const float *x, pd_block_q8_0 *y, int k) {
    pd_q8 tmp[16];
    for (int b0 = 0; b0 < k / PD_QK; b0 += 16) {
        const int nb = k / PD_QK - b0 < 16 ? k / PD_QK - b0 : 16;
        K->quantize_q8(x + (size_t)b0 * PD_QK, tmp, nb * PD_QK);
        for (int b = 0; b < nb; b++) {
            y[b0 + b].d = pd_f32_to_f16(tmp[b].d);
            memcpy(y[b0 + b].qs, tmp[b].qs, PD_QK);
        }
    }
}
