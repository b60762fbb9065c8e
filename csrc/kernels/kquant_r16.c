/* Q4_K and Q6_K repacked by 16 rows (formats.h: PD_Q4_K_R16, PD_Q6_K_R16): the repacking done
 * at load, and the plain-C twin of the SIMD kernels that read it. The twin computes every
 * super-block's integers isum and msum exactly and then the scalar table's float expression, so
 * its results are bit-identical both to the SIMD kernels of the layout and to the scalar
 * kernels of the file's layout (scalar.c: kdot); tests check both. */
#include "kernels/kernels.h"
#include <string.h>

/* x.d * (d * isum - dmin * msum) rounds as written, as in scalar.c: no fused multiply-add. */
#pragma GCC optimize("fp-contract=off")

/* A Q6_K file block's 256 6-bit stored values (0..63) in value order (formats.h: pd_block_q6_k). */
static void q6_raw(const pd_block_q6_k *b, uint8_t q[256]) {
    for (int h = 0; h < 2; h++)
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                const uint8_t ql = b->ql[64 * h + l + 32 * (g & 1)];
                q[128 * h + 32 * g + l] = (uint8_t)((g < 2 ? ql & 0xf : ql >> 4) | ((b->qh[32 * h + l] >> (2 * g)) & 3) << 4);
            }
}

static void repack_q4k(const pd_block_q4_k *const rows[16], uint8_t *out) {
    for (int j = 0; j < PD_R16_ROWS; j++) {
        const pd_block_q4_k *b = rows[j];
        for (int p = 0; p < 4; p++)
            for (int t = 0; t < 8; t++) memcpy(out + 64 * (8 * p + t) + 4 * j, b->qs + 32 * p + 4 * t, 4);
        memcpy(out + 2048 + 2 * j, &b->d, 2);
        memcpy(out + 2048 + 32 + 2 * j, &b->dmin, 2);
        for (int w = 0; w < 3; w++) memcpy(out + 2112 + 64 * w + 4 * j, b->scales + 4 * w, 4);
    }
}

static void repack_q6k(const pd_block_q6_k *const rows[16], uint8_t *out) {
    for (int j = 0; j < PD_R16_ROWS; j++) {
        const pd_block_q6_k *b = rows[j];
        uint8_t raw[256];
        q6_raw(b, raw);
        for (int v = 0; v < 16; v++)
            for (int i = 0; i < 4; i++) {
                int q[4];
                for (int Q = 0; Q < 4; Q++) q[Q] = raw[64 * Q + 4 * v + i];
                uint8_t *r = out + 64 * 3 * v + 4 * j + i;
                r[0] = (uint8_t)((q[0] & 15) | (q[0] >> 4) << 4 | (q[2] >> 4) << 6);
                r[64] = (uint8_t)((q[1] & 15) | (q[1] >> 4) << 4 | (q[3] >> 4) << 6);
                r[128] = (uint8_t)((q[2] & 15) | (q[3] & 15) << 4);
            }
        memcpy(out + 3072 + 2 * j, &b->d, 2);
        for (int t = 0; t < 8; t++) memcpy(out + 3104 + 32 * t + 2 * j, b->scales + 2 * t, 2);
    }
}

void pd_repack_kr16(int type, const void *src, size_t src_stride, int nrows, int k, void *dst) {
    const int nb = k / PD_QKK;
    const size_t fb = pd_type_block_bytes(type);
    uint8_t *out = dst;
    for (int r = 0; r < nrows; r += PD_R16_ROWS)
        for (int b = 0; b < nb; b++) {
            const void *rows[PD_R16_ROWS];
            for (int j = 0; j < PD_R16_ROWS; j++)
                rows[j] = (const char *)src + (size_t)(r + j) * src_stride + (size_t)b * fb;
            if (type == PD_Q4_K) { repack_q4k((const pd_block_q4_k *const *)rows, out); out += PD_KR16_Q4K_BYTES; }
            else { repack_q6k((const pd_block_q6_k *const *)rows, out); out += PD_KR16_Q6K_BYTES; }
        }
}

/* Row j's isum and msum of one record against one column's super-block (the SIMD kernels'
 * integers, in any order: they are exact). */
static void q4k_sums(const uint8_t *rec, int j, const pd_q8k *x, int *isum, int *msum) {
    uint8_t sc12[12], scm[16];
    for (int w = 0; w < 3; w++) memcpy(sc12 + 4 * w, rec + 2112 + 64 * w + 4 * j, 4);
    pd_unpack_scales_k4(sc12, scm);
    *isum = *msum = 0;
    for (int s = 0; s < 8; s++) {
        const int p = s / 2, hi = s & 1;
        int dot = 0;
        for (int t = 0; t < 8; t++)
            for (int i = 0; i < 4; i++) {
                const uint8_t v = rec[64 * (8 * p + t) + 4 * j + i];
                dot += (hi ? v >> 4 : v & 15) * x->qs[64 * p + 32 * hi + 4 * t + i];
            }
        *isum += scm[s] * dot;
        *msum += scm[8 + s] * (x->bsums[2 * s] + x->bsums[2 * s + 1]);
    }
}

static int q6k_isum(const uint8_t *rec, int j, const pd_q8k *x) {
    int dot[16] = { 0 }, isum = 0;
    for (int v = 0; v < 16; v++)
        for (int i = 0; i < 4; i++) {
            const uint8_t *r = rec + 64 * 3 * v + 4 * j + i;
            const int u[4] = { r[0] & 63, r[64] & 63, (r[128] & 15) | (r[0] >> 2 & 48),
                               (r[128] >> 4) | (r[64] >> 2 & 48) };
            for (int Q = 0; Q < 4; Q++) {
                const int n = 64 * Q + 4 * v + i;
                dot[n / 16] += (u[Q] - 32) * x->qs[n];
            }
        }
    for (int s = 0; s < 16; s++) isum += (int8_t)rec[3104 + 32 * (s / 2) + 2 * j + (s & 1)] * dot[s];
    return isum;
}

void pd_scalar_matmul_kr16(int rt, int k, const void *w, size_t ws, int nrows, const void *x, size_t xs,
                           int ncols, float *y, size_t ys) {
    const int nb = k / PD_QKK, q4 = rt == PD_Q4_K_R16;
    const size_t rb = q4 ? PD_KR16_Q4K_BYTES : PD_KR16_Q6K_BYTES;
    for (int r = 0; r < nrows; r += PD_R16_ROWS) {
        const uint8_t *g = (const uint8_t *)w + (size_t)r * ws;
        for (int c = 0; c < ncols; c++) {
            const pd_q8k *xc = (const pd_q8k *)((const char *)x + (size_t)c * xs);
            for (int j = 0; j < PD_R16_ROWS; j++) {
                float acc = 0.0f;
                for (int b = 0; b < nb; b++) {
                    const uint8_t *rec = g + (size_t)b * rb;
                    uint16_t d16, dm16 = 0;
                    int isum, msum = 0;
                    if (q4) {
                        memcpy(&d16, rec + 2048 + 2 * j, 2);
                        memcpy(&dm16, rec + 2080 + 2 * j, 2);
                        q4k_sums(rec, j, xc + b, &isum, &msum);
                    } else {
                        memcpy(&d16, rec + 3072 + 2 * j, 2);
                        isum = q6k_isum(rec, j, xc + b);
                    }
                    const float d = pd_f16_to_f32(d16), dmin = pd_f16_to_f32(dm16);
                    acc += xc[b].d * (d * (float)isum - dmin * (float)msum);
                }
                y[(size_t)c * ys + r + j] = acc;
            }
        }
    }
}
