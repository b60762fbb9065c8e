/* The whole forward pass on the ARM64 tables, through the C core's own API (pd_model_new,
 * pd_prefill, pd_decode_step, pd_batch_step), on a tiny random model: the part of the test
 * suite that needs no Python, run under qemu-aarch64 by scripts/test-arm64.sh (a whole aarch64
 * Python under emulation would cost CI minutes for the same C paths; see the script).
 *
 * The model: 2 llama-style layers over the block formats of real files (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0 in layer 0; Q8_0, Q5_0, Q4_0, Q4_1, Q4_K, Q6_K in layer 1; a Q8_0 output head), sizes
 * that the 16-row repacked layouts take, grouped-query attention. Checks, on each ARM table
 * this CPU runs, with the weights repacked at load (as a user gets them) and without:
 *   1. prefill logits of every position against the scalar table's (file layout): within
 *      3e-2 of the largest |logit|. Not tighter: the float parts (attention, the activation, the
 *      repacked layouts' fused float step) differ from scalar.c in the last bits, and where such
 *      a difference moves a value across a rounding boundary of the next 8-bit activation
 *      quantization, that value moves by a whole step, 1/127 of its block's largest; through
 *      two layers of this small random model that reaches ~1e-2 of the largest logit, on x86's
 *      AVX2 table as here. A wrong kernel or a misplaced repacked row is off by far more;
 *   2. cached decode against recomputing the whole prefix, step by step (pydecode verify's rule):
 *      within 2e-3 of the largest |logit|;
 *   3. two sequences in one batch step against the same tokens of each prefilled alone: the
 *      2-column tiles (SMMLA, repacked) against the many-column ones, same tolerance.
 * Prints one line per table and layout; exits 1 on any failure. */
#include "pydecode.h"
#include "kernels/kernels.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NL = 2, D = 256, NH = 4, NKV = 2, HD = 64, FF = 512, NV = 256, CTX = 64, NSEQ = 3 };

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t rnd(void) {
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}

static pd_tensor tensors[PD_GLOBAL_SLOTS + NL * PD_LAYER_SLOTS];

static void put_f16(uint8_t *p, float v) { const uint16_t h = pd_f32_to_f16(v); memcpy(p, &h, 2); }

/* ne1 rows of ne0 random values of type t, with modest scales */
static pd_tensor matrix(int t, int ne0, int ne1) {
    const int bs = pd_type_block_size(t);
    const size_t bb = pd_type_block_bytes(t), rb = (size_t)(ne0 / bs) * bb;
    uint8_t *w = malloc(rb * ne1);
    for (size_t i = 0; i < rb * ne1; i++) w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < (size_t)ne1 * (ne0 / bs); b++) {
        uint8_t *blk = w + b * bb;
        const float s = (rnd() & 1 ? 1.0f : -1.0f) * (0.5f + (float)(rnd() % 100) / 100.0f);
        switch (t) {
        case PD_Q4_0: case PD_Q5_0: case PD_Q8_0: put_f16(blk, 0.02f * s); break;
        case PD_Q4_1: case PD_Q5_1: put_f16(blk, 0.02f * s); put_f16(blk + 2, -0.15f * fabsf(s)); break;
        case PD_Q4_K: put_f16(blk, 0.0008f * fabsf(s)); put_f16(blk + 2, 0.0008f * fabsf(s)); break;
        case PD_Q6_K: put_f16(blk + 208, 0.0004f * s); break;
        case PD_IQ4_NL: put_f16(blk, 0.0006f * s); break;                 /* |codebook| ~62 */
        case PD_IQ4_XS: put_f16(blk, 0.00004f * s); break;                /* x |ls - 32| ~16 */
        case PD_MXFP4: blk[0] = (uint8_t)(120 + rnd() % 3); break;        /* 2^-8 .. 2^-6 */
        default: break;
        }
    }
    const pd_tensor r = { t, w, ne0, ne1, rb };
    return r;
}
static pd_tensor ones(int n) {
    float *v = malloc(n * sizeof *v);
    for (int i = 0; i < n; i++) v[i] = 1.0f;
    const pd_tensor r = { PD_F32, v, n, 1, (size_t)n * sizeof(float) };
    return r;
}

static void build(void) {
    tensors[PD_TOK_EMBD] = matrix(PD_Q8_0, D, NV);
    tensors[PD_OUTPUT_NORM] = ones(D);
    tensors[PD_OUTPUT] = matrix(PD_Q8_0, D, NV);
    static const int TYPES[NL][7] = { /* wq wk wv wo gate up down */
        { PD_Q4_0, PD_Q4_1, PD_Q5_0, PD_Q5_1, PD_Q4_0, PD_Q4_1, PD_Q8_0 },
        { PD_Q8_0, PD_IQ4_NL, PD_MXFP4, PD_Q4_1, PD_Q4_K, PD_IQ4_XS, PD_Q6_K } };   /* (+ the codebook formats) */
    for (int l = 0; l < NL; l++) {
        pd_tensor *L = &tensors[PD_GLOBAL_SLOTS + l * PD_LAYER_SLOTS];
        L[PD_ATTN_NORM] = ones(D);
        L[PD_FFN_NORM] = ones(D);
        L[PD_WQ] = matrix(TYPES[l][0], D, NH * HD);
        L[PD_WK] = matrix(TYPES[l][1], D, NKV * HD);
        L[PD_WV] = matrix(TYPES[l][2], D, NKV * HD);
        L[PD_WO] = matrix(TYPES[l][3], NH * HD, D);
        L[PD_GATE] = matrix(TYPES[l][4], D, FF);
        L[PD_UP] = matrix(TYPES[l][5], D, FF);
        L[PD_DOWN] = matrix(TYPES[l][6], FF, D);
    }
}

static int g_kv = PD_KV_F16;   /* the cache format of the models load() builds */

static pd_model *load(const char *isa, int repack) {
    pd_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = NL; c.n_embd = D; c.n_head = NH; c.n_head_kv = NKV; c.head_dim = HD; c.n_ff = FF;
    c.n_vocab = NV; c.n_ctx = CTX; c.n_batch = 32; c.norm_eps = 1e-5f; c.rope_base = 10000.0f;
    c.rope_dim = HD; c.kv_type = g_kv; c.n_threads = 2; c.n_seq = NSEQ; c.no_repack = !repack;
    char err[512];
    pd_model *m = pd_model_new(&c, tensors, PD_GLOBAL_SLOTS + NL * PD_LAYER_SLOTS, isa, err, sizeof err);
    if (!m) printf("  load on %s failed: %s\n", isa, err);
    return m;
}

static float max_abs(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}
/* largest |a - b| over n, relative to the largest |b| */
static float rel_diff(const float *a, const float *b, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fabsf(a[i] - b[i]) > m ? fabsf(a[i] - b[i]) : m;
    return m / (max_abs(b, n) + 1e-30f);
}

enum { NP = 24, NDEC = 12 };
static int32_t prompt[NP];
static float ref[NP * NV];   /* the scalar table's prefill logits, every position */

static int check(const char *isa, int repack) {
    pd_model *m = load(isa, repack);
    if (!m) return 1;
    int fail = 0;
    float *lg = malloc(sizeof(float) * NP * NV), *a = malloc(sizeof(float) * NV), *b = malloc(sizeof(float) * 2 * NV);
    /* 1. prefill against scalar */
    if (pd_prefill(m, 0, prompt, NP, 0, lg, 1) != PD_OK) { printf("  %s: prefill failed\n", isa); return 1; }
    const float d1 = rel_diff(lg, ref, (size_t)NP * NV);
    fail |= !(d1 <= 3e-2f);
    /* 2. cached decode against recompute: slot 0 decodes on; slot 1 prefills the whole prefix */
    int32_t toks[NP + NDEC];
    memcpy(toks, prompt, sizeof prompt);
    float d2 = 0.0f;
    for (int i = 0; i < NDEC; i++) {
        const int pos = NP + i;
        toks[pos] = (int32_t)(rnd() % NV);
        if (pd_decode_step(m, 0, toks[pos], pos, a) != PD_OK || pd_prefill(m, 1, toks, pos + 1, 0, b, 0) != PD_OK) {
            printf("  %s: decode/prefill failed\n", isa);
            return 1;
        }
        const float d = rel_diff(a, b, NV);
        d2 = d > d2 ? d : d2;
    }
    fail |= !(d2 <= 2e-3f);
    /* 3. a batch step of slots 0 and 2 (2 prefilled with the prompt) against each alone */
    if (pd_prefill(m, 2, prompt, NP, 0, lg, 0) != PD_OK) return 1;
    const int32_t bt[2] = { 7, 11 }, bp[2] = { NP + NDEC, NP }, bs[2] = { 0, 2 }, out[2] = { 0, 1 };
    if (pd_batch_step(m, bt, bp, bs, 2, out, 2, b) != PD_OK) { printf("  %s: batch step failed\n", isa); return 1; }
    float d3 = 0.0f;
    for (int i = 0; i < 2; i++) {   /* the same tokens again, one sequence at a time, in slot 1 */
        int32_t seq[NP + NDEC + 1];
        const int n = bp[i];
        memcpy(seq, i == 0 ? toks : prompt, sizeof(int32_t) * n);
        seq[n] = bt[i];
        if (pd_prefill(m, 1, seq, n + 1, 0, a, 0) != PD_OK) return 1;
        const float d = rel_diff(b + (size_t)i * NV, a, NV);
        d3 = d > d3 ? d : d3;
    }
    fail |= !(d3 <= 2e-3f);
    printf("%s%s%s: %d tensors repacked; prefill vs scalar %.1e, decode vs recompute %.1e, batch vs alone %.1e%s\n",
           isa, repack ? " (repacked)" : " (file layout)", g_kv == PD_KV_Q8_0 ? ", q8_0 cache" : "", pd_model_n_repacked(m), d1, d2, d3, fail ? "  FAIL" : "");
    if (repack && strcmp(isa, "neon") != 0 && pd_model_n_repacked(m) == 0) {
        printf("  %s: nothing was repacked\n", isa);
        fail = 1;
    }
    free(lg); free(a); free(b);
    pd_model_free(m);
    return fail;
}

int main(void) {
    build();
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(rnd() % NV);
    pd_model *s = load("scalar", 0);
    if (!s || pd_prefill(s, 0, prompt, NP, 0, ref, 1) != PD_OK) { printf("scalar reference failed\n"); return 1; }
    pd_model_free(s);
    static const char *TABLES[] = { "neon", "dotprod", "i8mm" };
    int fail = 0, ran = 0;
    for (int t = 0; t < 3; t++) {
        if (!pd_isa_supported(TABLES[t])) { printf("%s: not supported by this CPU, skipped\n", TABLES[t]); continue; }
        for (int repack = 0; repack < 2; repack++) fail |= check(TABLES[t], repack);
        ran++;
    }
    /* the q8_0 cache: the same checks against the scalar table's own q8_0 prefill */
    g_kv = PD_KV_Q8_0;
    s = load("scalar", 0);
    if (!s || pd_prefill(s, 0, prompt, NP, 0, ref, 1) != PD_OK) { printf("scalar q8_0 reference failed\n"); return 1; }
    pd_model_free(s);
    for (int t = 0; t < 3; t++)
        if (pd_isa_supported(TABLES[t])) fail |= check(TABLES[t], 1);
    printf(fail ? "forward: FAILED\n" : "forward: every table agrees (%d tables)\n", ran);
    return fail || !ran;
}
