/* Every ARM64 kernel table against the scalar table, on random blocks of every format.
 *
 * Built by scripts/test-arm64.sh with the cross compiler and the core's kernel files, run
 * under qemu-aarch64 with several -cpu models (no ARM hardware needed). Integer paths (the
 * quantizers, every block format's matmul) must give the scalar table's bits; the float ones
 * (F32/F16/BF16 weights, attention, exp, the activation, the sampler's sum) agree within the
 * stated tolerances. Prints the table run-time selection picks (or $PYDECODE_ISA forces) as
 * "selected: NAME", then one line per table checked; exits 1 on any mismatch.
 *
 *     check_kernels [TABLE...]      (default: every ARM table this CPU supports) */
#include "kernels/kernels.h"
#include "pydecode.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {   /* xorshift64* */
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}
static float frnd(void) { return ((float)rnd() / 4294967296.0f) * 2.0f - 1.0f; }

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("  FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

static const char *TABLES[] = { "neon", "dotprod", "i8mm" };
enum { NTYPES = 16 };
static const int TYPES[NTYPES] = { PD_Q4_0, PD_Q4_1, PD_Q5_0, PD_Q5_1, PD_Q8_0, PD_Q2_K, PD_Q3_K,
                                   PD_Q4_K, PD_Q5_K, PD_Q6_K, PD_F32, PD_F16, PD_BF16,
                                   PD_IQ4_NL, PD_IQ4_XS, PD_MXFP4 };

static int is_float(int t) { return t == PD_F32 || t == PD_F16 || t == PD_BF16; }

/* Random bytes for nrows rows of k values, with finite, modest f16 scales where each format
 * keeps them (every quant and sub-scale byte pattern is valid). */
static uint8_t *random_weights(int t, int nrows, int k, size_t *row_bytes) {
    const int bv = pd_type_block_size(t);
    const size_t bb = pd_type_block_bytes(t), rb = (size_t)(k / bv) * bb;
    uint8_t *w = malloc(rb * nrows);
    for (size_t i = 0; i < rb * nrows; i++) w[i] = (uint8_t)rnd();
    *row_bytes = rb;
    for (size_t b = 0; b < (size_t)nrows * (k / bv); b++) {
        uint8_t *blk = w + b * bb;
        int off = 0, n = 0;
        switch (t) {
        case PD_Q4_0: case PD_Q5_0: case PD_Q8_0: n = 1; break;
        case PD_Q4_1: case PD_Q5_1: n = 2; break;
        case PD_Q2_K: off = 80; n = 2; break;
        case PD_Q3_K: off = 108; n = 1; break;
        case PD_Q4_K: case PD_Q5_K: n = 2; break;
        case PD_Q6_K: off = 208; n = 1; break;
        case PD_IQ4_NL: case PD_IQ4_XS: n = 1; break;
        case PD_MXFP4: blk[0] = (uint8_t)(120 + rnd() % 15); break;   /* E8M0 scales 2^-8 .. 2^6 */
        default: break;
        }
        for (int j = 0; j < n; j++) {
            const uint16_t h = pd_f32_to_f16((0.5f + (float)(rnd() % 1000) / 1000.0f) * 0.01f * (rnd() & 1 ? 1 : -1));
            memcpy(blk + off + 2 * j, &h, 2);
        }
    }
    if (is_float(t)) {   /* finite values only */
        for (size_t i = 0; i < (size_t)nrows * k; i++) {
            const float v = frnd();
            if (t == PD_F32) memcpy(w + 4 * i, &v, 4);
            else {
                uint32_t u; memcpy(&u, &v, 4);
                const uint16_t h = t == PD_F16 ? pd_f32_to_f16(v) : (uint16_t)(u >> 16);
                memcpy(w + 2 * i, &h, 2);
            }
        }
    }
    return w;
}

static float *random_floats(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = frnd() * scale;
    return x;
}

/* Activations of ncols columns in the format of type t (quantized by the scalar table). */
static void *activations(int t, const float *xf, int ncols, int k, size_t *col_bytes) {
    const int fmt = pd_type_act_format(t);
    const size_t cb = fmt == PD_ACT_Q8 ? (size_t)(k / PD_QK) * sizeof(pd_q8)
                    : fmt == PD_ACT_Q8K ? (size_t)(k / PD_QKK) * sizeof(pd_q8k) : (size_t)k * sizeof(float);
    char *x = calloc((size_t)ncols, cb);
    for (int c = 0; c < ncols; c++) {
        if (fmt == PD_ACT_Q8) pd_kernels_scalar.quantize_q8(xf + (size_t)c * k, (pd_q8 *)(x + c * cb), k);
        else if (fmt == PD_ACT_Q8K) pd_kernels_scalar.quantize_q8k(xf + (size_t)c * k, (pd_q8k *)(x + c * cb), k);
        else memcpy(x + c * cb, xf + (size_t)c * k, (size_t)k * sizeof(float));
    }
    *col_bytes = cb;
    return x;
}

static void check_quantizers(const pd_kernels *K) {
    enum { N = 2048 };
    float *x = random_floats(N, 3.0f);
    for (int i = 0; i < 32; i++) x[256 + i] = 0.0f;          /* an all-zero block */
    x[700] = NAN; x[1100] = INFINITY; x[1500] = -INFINITY;    /* non-finite blocks */
    for (int i = 0; i < 64; i++) x[1600 + i] = (float)(i - 32) * 0.5f;   /* halves: ties */
    pd_q8 a[N / PD_QK], b[N / PD_QK];
    memset(a, 0x55, sizeof a); memset(b, 0x55, sizeof b);
    pd_kernels_scalar.quantize_q8(x, a, N);
    K->quantize_q8(x, b, N);
    CHECK(memcmp(a, b, sizeof a) == 0, "%s quantize_q8 differs from scalar", K->name);
    static pd_q8k ak[N / PD_QKK], bk[N / PD_QKK];
    memset(ak, 0x55, sizeof ak); memset(bk, 0x55, sizeof bk);
    pd_kernels_scalar.quantize_q8k(x, ak, N);
    K->quantize_q8k(x, bk, N);
    CHECK(memcmp(ak, bk, sizeof ak) == 0, "%s quantize_q8k differs from scalar", K->name);
    free(x);
}

static void check_matmuls(const pd_kernels *K) {
    static const int SHAPES[][3] = { { 1, 256, 1 }, { 5, 512, 3 }, { 7, 1024, 5 }, { 13, 256, 9 }, { 4, 768, 4 },
                                     { 33, 256, 2 }, { 9, 1536, 17 } };
    for (int ti = 0; ti < NTYPES; ti++) {
        const int t = TYPES[ti];
        int bad = 0;
        for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
            const int nrows = SHAPES[si][0], k = SHAPES[si][1] - (is_float(t) ? 3 : 0), ncols = SHAPES[si][2];
            size_t rb, cb;
            uint8_t *w = random_weights(t, nrows, k, &rb);
            float *xf = random_floats((size_t)ncols * k, 2.0f);
            void *x = activations(t, xf, ncols, k, &cb);
            float *ys = calloc((size_t)nrows * ncols, sizeof(float)), *ya = calloc((size_t)nrows * ncols, sizeof(float));
            pd_kernels_scalar.matmul[t](k, w, rb, nrows, x, cb, ncols, ys, nrows);
            K->matmul[t](k, w, rb, nrows, x, cb, ncols, ya, nrows);
            if (!is_float(t)) {
                bad |= memcmp(ys, ya, (size_t)nrows * ncols * sizeof(float)) != 0;
            } else {
                for (int c = 0; c < ncols; c++)
                    for (int r = 0; r < nrows; r++) {
                        double mag = 0.0;   /* sum |w| |x|: the float error scale */
                        float wr[1536];
                        pd_dequantize_row(t, w + (size_t)r * rb, wr, k);
                        for (int i = 0; i < k; i++) mag += fabs((double)wr[i] * xf[(size_t)c * k + i]);
                        bad |= fabs((double)ys[c * nrows + r] - ya[c * nrows + r]) > 1e-6 * mag + 1e-30;
                    }
            }
            /* A row's result does not depend on its tile: the rows one at a time, one column. */
            for (int r = 0; r < nrows && !is_float(t); r++) {
                float one;
                K->matmul[t](k, w + (size_t)r * rb, rb, 1, x, cb, 1, &one, 1);
                bad |= memcmp(&one, &ya[r], sizeof one) != 0;
            }
            free(w); free(xf); free(x); free(ys); free(ya);
        }
        CHECK(!bad, "%s matmul %s differs from scalar%s", K->name, pd_type_name(t),
              is_float(t) ? " beyond 1e-6 of sum |w x|" : " (bits)");
    }
}

/* The 16-row repacked layouts (formats.h: PD_*_R16) where the table has them: pd_repack's copy of
 * random rows against pd_scalar_matmul_r16, the layout's plain-C twin, bit for bit, for decode
 * and batch column counts (1..4 columns per tile, and more). */
static void check_repacked(const pd_kernels *K) {
    static const int LEGACY[] = { PD_Q4_0, PD_Q4_1, PD_Q5_0, PD_Q5_1, PD_Q8_0 };
    static const int SHAPES[][3] = { { 16, 256, 1 }, { 32, 512, 2 }, { 48, 1024, 3 }, { 16, 768, 4 }, { 32, 256, 5 },
                                     { 16, 1536, 9 } };
    for (size_t ti = 0; ti < sizeof LEGACY / sizeof LEGACY[0]; ti++) {
        const int t = LEGACY[ti], rt = pd_repacked_type(t);
        if (!K->matmul[rt]) continue;
        int bad = 0;
        for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
            const int nrows = SHAPES[si][0], k = SHAPES[si][1], ncols = SHAPES[si][2];
            size_t rb, cb;
            uint8_t *w = random_weights(t, nrows, k, &rb), *packed = malloc(rb * nrows);
            if (pd_repack(t, w, rb, nrows, k, packed)) { bad = 1; free(w); free(packed); continue; }
            float *xf = random_floats((size_t)ncols * k, 2.0f);
            void *x = activations(t, xf, ncols, k, &cb);
            float *ys = calloc((size_t)nrows * ncols, sizeof(float)), *ya = calloc((size_t)nrows * ncols, sizeof(float));
            pd_scalar_matmul_r16(rt, k, packed, rb, nrows, x, cb, ncols, ys, nrows);
            K->matmul[rt](k, packed, rb, nrows, x, cb, ncols, ya, nrows);
            bad |= memcmp(ys, ya, (size_t)nrows * ncols * sizeof(float)) != 0;
            free(w); free(packed); free(xf); free(x); free(ys); free(ya);
        }
        CHECK(!bad, "%s matmul %s (16-row repacked) differs from pd_scalar_matmul_r16 (bits)", K->name, pd_type_name(t));
    }
}

static double rel_err(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-30 ? fabs(b) : 1e-30); }

static void check_float_kernels(const pd_kernels *K) {
    /* f32 -> f16: every finite rounding case the scalar conversion has, bit for bit */
    enum { NF = 4096 };
    float *xf = random_floats(NF, 70000.0f);
    for (int i = 0; i < 64; i++) xf[i] = ldexpf(frnd(), -(i % 30) - 10);   /* subnormal f16 range */
    xf[64] = INFINITY; xf[65] = -INFINITY; xf[66] = 65520.0f; xf[67] = -0.0f; xf[68] = 65504.0f;
    uint16_t ha[NF], hb[NF];
    pd_kernels_scalar.f32_to_f16(xf, ha, NF);
    K->f32_to_f16(xf, hb, NF - 1);
    hb[NF - 1] = ha[NF - 1];
    CHECK(memcmp(ha, hb, sizeof ha) == 0, "%s f32_to_f16 differs from scalar", K->name);
    free(xf);

    /* attention: scores and the weighted sum, F16 and F32 rows, head sizes with tails */
    static const int HD[] = { 64, 80, 128, 7 }, NP[] = { 1, 5, 33, 130 };
    int bad = 0;
    for (int f16 = 0; f16 < 2; f16++)
        for (int h = 0; h < 4; h++)
            for (int p = 0; p < 4; p++) {
                const int hd = HD[h], n = NP[p];
                const size_t stride = (size_t)hd + 3;
                float *q = random_floats(hd, 1.0f), *kvf = random_floats(stride * n, 1.0f);
                void *kv = kvf;
                uint16_t *kvh = NULL;
                if (f16) {
                    kvh = malloc(stride * n * 2);
                    for (size_t i = 0; i < stride * n; i++) kvh[i] = pd_f32_to_f16(kvf[i]);
                    kv = kvh;
                }
                float oa[131], ob[131], wts[130];
                for (int i = 0; i < n; i++) wts[i] = (float)(rnd() % 1000) / 1000.0f;
                for (int j = 0; j < hd; j++) oa[j] = ob[j] = frnd();
                pd_kernels_scalar.attn_accum(oa, wts, kv, stride, n, hd, f16);
                K->attn_accum(ob, wts, kv, stride, n, hd, f16);
                for (int j = 0; j < hd; j++) bad |= fabsf(oa[j] - ob[j]) > 1e-5f * (float)(n + 1);
                if (f16 && hd % 32 == 0) {   /* the Q8_0 cache's weighted sum: rows of hd/32 blocks */
                    const size_t rb = (size_t)hd / 32 * sizeof(pd_block_q8_0);
                    pd_block_q8_0 *kq = malloc(rb * n);
                    for (int i = 0; i < n; i++) pd_quantize_blocks_q8_0(&pd_kernels_scalar, kvf + i * stride, (pd_block_q8_0 *)((char *)kq + i * rb), hd);
                    for (int j = 0; j < hd; j++) oa[j] = ob[j] = frnd();
                    pd_kernels_scalar.attn_accum_q8(oa, wts, kq, rb, n, hd);
                    K->attn_accum_q8(ob, wts, kq, rb, n, hd);
                    for (int j = 0; j < hd; j++) bad |= fabsf(oa[j] - ob[j]) > 1e-5f * (float)(n + 1);
                    free(kq);
                }
                free(q); free(kvf); free(kvh);
            }
    CHECK(!bad, "%s attention differs from scalar beyond 1e-5", K->name);

    /* exp_sub, act_mul (SiLU and GELU), sum_exp: within a few ulp of scalar's expf */
    enum { NE = 1003 };
    float *a = random_floats(NE, 30.0f), *b = malloc(NE * sizeof *b), *u = random_floats(NE, 1.0f);
    float *c = malloc(NE * sizeof *c);
    memcpy(b, a, NE * sizeof *b);
    const float sa = pd_kernels_scalar.exp_sub(a, NE, 30.0f), sb = K->exp_sub(b, NE, 30.0f);
    bad = rel_err(sb, sa) > 1e-5;
    for (int i = 0; i < NE; i++) bad |= fabsf(a[i] - b[i]) > 2e-6f * fabsf(a[i]) + 1e-37f;
    CHECK(!bad, "%s exp_sub differs from scalar beyond 2e-6", K->name);
    for (int gelu = 0; gelu < 2; gelu++) {
        float *g = random_floats(NE, 8.0f);
        memcpy(c, g, NE * sizeof *c);
        pd_kernels_scalar.act_mul(g, u, NE, gelu);
        K->act_mul(c, u, NE, gelu);
        bad = 0;
        for (int i = 0; i < NE; i++) bad |= fabsf(g[i] - c[i]) > 1e-5f * fabsf(g[i]) + 1e-6f;
        CHECK(!bad, "%s act_mul (%s) differs from scalar beyond 1e-5", K->name, gelu ? "gelu" : "silu");
        free(g);
    }
    float *lg = random_floats(50000, 12.0f);
    const double ea = pd_kernels_scalar.sum_exp(lg, 50000, 0.7f, 12.0f), eb = K->sum_exp(lg, 50000, 0.7f, 12.0f);
    CHECK(rel_err(eb, ea) < 1e-5, "%s sum_exp %.9g vs scalar %.9g", K->name, eb, ea);
    int32_t *ia = malloc((50000 + 16) * sizeof *ia), *ib = malloc((50000 + 16) * sizeof *ib);
    for (int n = 49999; n >= 49990; n -= 3) {
        const int na = pd_kernels_scalar.collect_above(lg, n, 11.0f, ia), nb = K->collect_above(lg, n, 11.0f, ib);
        CHECK(na == nb && memcmp(ia, ib, (size_t)na * sizeof *ia) == 0, "%s collect_above differs (%d vs %d ids)",
              K->name, nb, na);
    }
    free(a); free(b); free(u); free(c); free(lg); free(ia); free(ib);
}

int main(int argc, char **argv) {
    const pd_kernels *sel = pd_kernels_select(NULL);
    printf("selected: %s\n", sel ? sel->name : "unsupported");
    printf("best: %s\n", pd_isa_best());
    const char **names = (const char **)argv + 1;
    int n = argc - 1;
    if (n == 0) { names = TABLES; n = (int)(sizeof TABLES / sizeof TABLES[0]); }
    int checked = 0;
    for (int i = 0; i < n; i++) {
        const pd_kernels *K = pd_kernels_select(names[i]);
        if (!K) { printf("%s: not supported by this CPU, skipped\n", names[i]); continue; }
        const int before = failures;
        check_quantizers(K);
        check_matmuls(K);
        check_repacked(K);
        check_float_kernels(K);
        printf("%s: %s\n", K->name, failures == before ? "every kernel agrees with scalar" : "MISMATCH");
        checked++;
    }
    if (!checked) printf("no ARM table checked\n");
    return failures ? 1 : 0;
}
