/* Kernel entry points for tests and benchmarks: validate everything, then call one table entry.
 * Bad input returns PD_EINVAL (never a crash): these are reachable from Python with any args. */
#include "kernels/kernels.h"
#include "core/deltanet.h"
#include "pydecode.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int pd_kernel_quantize_q8(const char *isa, const float *x, void *out, int k) {
    const pd_kernels *kt = pd_kernels_select(isa);
    if (!kt || !x || !out || k <= 0 || k % PD_QK) return PD_EINVAL;
    kt->quantize_q8(x, (pd_q8 *)out, k);
    return PD_OK;
}

int pd_kernel_quantize_q8k(const char *isa, const float *x, void *out, int k) {
    const pd_kernels *kt = pd_kernels_select(isa);
    if (!kt || !kt->quantize_q8k || !x || !out || k <= 0 || k % PD_QKK) return PD_EINVAL;
    kt->quantize_q8k(x, (pd_q8k *)out, k);
    return PD_OK;
}

int pd_kernel_matmul(const char *isa, int type, const void *w, size_t w_stride, int nrows, int k,
                     const float *x, int ncols, float *y) {
    const pd_kernels *kt = pd_kernels_select(isa);
    if (!kt || type < 0 || type >= PD_NTYPES || !kt->matmul[type]) return PD_EINVAL;
    const int bs = pd_type_block_size(type), act = pd_type_act_format(type);
    if (bs <= 0 || k <= 0 || k % bs || nrows <= 0 || ncols <= 0 || !w || !x || !y) return PD_EINVAL;
    if (type >= PD_FIRST_REPACKED && nrows % PD_REPACK_ROWS) return PD_EINVAL;   /* whole row groups */
    if (w_stride < (size_t)(k / bs) * pd_type_block_bytes(type)) return PD_EINVAL;
    if (act == PD_ACT_F32) {
        kt->matmul[type](k, w, w_stride, nrows, x, (size_t)k * sizeof(float), ncols, y, nrows);
        return PD_OK;
    }
    /* 8-bit activations: quantize each column once, in the format the weight type pairs with */
    size_t xs;
    if (act == PD_ACT_Q8 && k % PD_QK == 0) xs = (size_t)(k / PD_QK) * sizeof(pd_q8);
    else if (act == PD_ACT_Q8K && k % PD_QKK == 0 && kt->quantize_q8k)
        xs = (size_t)(k / PD_QKK) * sizeof(pd_q8k);
    else return PD_EINVAL;
    char *xq = malloc(xs * ncols);
    if (!xq) return PD_ENOMEM;
    for (int c = 0; c < ncols; c++) {
        if (act == PD_ACT_Q8) kt->quantize_q8(x + (size_t)c * k, (pd_q8 *)(xq + c * xs), k);
        else kt->quantize_q8k(x + (size_t)c * k, (pd_q8k *)(xq + c * xs), k);
    }
    kt->matmul[type](k, w, w_stride, nrows, xq, xs, ncols, y, nrows);
    free(xq);
    return PD_OK;
}

int pd_kernel_matmul_repacked(const char *isa, int type, const void *w, size_t w_stride, int nrows, int k,
                              const float *x, int ncols, float *y) {
    const pd_kernels *kt = pd_kernels_select(isa);
    const int rt = pd_repacked_type(type), bs = pd_type_block_size(type);
    if (!kt || rt < 0 || !w || !x || !y || nrows <= 0 || nrows % PD_REPACK_ROWS || ncols <= 0 || k <= 0 || k % bs)
        return PD_EINVAL;
    const int twin = strcmp(kt->name, "scalar") == 0, q8k = pd_type_act_format(type) == PD_ACT_Q8K;
    const pd_matmul_fn fn = kt->matmul[rt];
    const size_t row_bytes = (size_t)(k / bs) * pd_type_block_bytes(type);
    if ((!twin && !fn) || w_stride < row_bytes) return PD_EINVAL;
    const size_t xs = q8k ? (size_t)(k / PD_QKK) * sizeof(pd_q8k) : (size_t)(k / PD_QK) * sizeof(pd_q8);
    char *packed = malloc(row_bytes * nrows), *xq = malloc(xs * ncols);
    int rc = PD_ENOMEM;
    if (packed && xq && pd_repack(type, w, w_stride, nrows, k, packed) == 0) {
        for (int c = 0; c < ncols; c++) {
            if (q8k) kt->quantize_q8k(x + (size_t)c * k, (pd_q8k *)(xq + c * xs), k);
            else kt->quantize_q8(x + (size_t)c * k, (pd_q8 *)(xq + c * xs), k);
        }
        if (twin && q8k) pd_scalar_matmul_kr16(rt, k, packed, row_bytes, nrows, xq, xs, ncols, y, nrows);
        else if (twin) pd_scalar_matmul_r16(rt, k, packed, row_bytes, nrows, xq, xs, ncols, y, nrows);
        else fn(k, packed, row_bytes, nrows, xq, xs, ncols, y, nrows);
        rc = PD_OK;
    }
    free(packed);
    free(xq);
    return rc;
}

int pd_kernel_has_repacked(const char *isa, int type) {
    const pd_kernels *kt = pd_kernels_select(isa);
    const int rt = pd_repacked_type(type);
    return kt && rt >= 0 && kt->matmul[rt] != NULL;
}

int pd_kernel_f32_to_f16(const char *isa, const float *x, uint16_t *y, int n) {
    const pd_kernels *kt = pd_kernels_select(isa);
    if (!kt || !x || !y || n < 0) return PD_EINVAL;
    kt->f32_to_f16(x, y, n);
    return PD_OK;
}

int pd_kernel_dequantize_row(int type, const void *w, float *y, int k) {
    if (!w || !y || k <= 0) return PD_EINVAL;
    return pd_dequantize_row(type, w, y, k) == 0 ? PD_OK : PD_EINVAL;
}

int pd_kernel_act_mul(const char *isa, float *g, const float *u, int n, int gelu) {
    const pd_kernels *kt = pd_kernels_select(isa);
    if (!kt || !g || !u || n < 0) return PD_EINVAL;
    kt->act_mul(g, u, n, gelu);
    return PD_OK;
}

/* attn_scores_mh then attn_accum_mh with the scores as the weights (tests/test_attn_kernels.py). */
int pd_kernel_attn_mh(const char *isa, int kv_type, int nh, int hd, const float *q, const void *k, const void *v,
                      int n, float *scores, float *out) {
    const pd_kernels *kt = pd_kernels_select(isa);
    if (!kt || !kt->attn_scores_mh || !kt->attn_accum_mh || !q || !k || !v || !scores || !out || nh < 1 || hd < 1 ||
        n < 1 || n > 256 || kv_type < PD_KV_F32 || kv_type > PD_KV_Q8_0 || (kv_type == PD_KV_Q8_0 && hd % PD_QK))
        return PD_EINVAL;
    const int q8 = kv_type == PD_KV_Q8_0;
    const size_t row = pd_kv_bytes(kv_type, (size_t)hd);
    pd_q8 *qq = NULL;
    if (q8) {
        if (!(qq = malloc((size_t)nh * (hd / PD_QK) * sizeof(pd_q8)))) return PD_ENOMEM;
        for (int h = 0; h < nh; h++) kt->quantize_q8(q + (size_t)h * hd, qq + (size_t)h * (hd / PD_QK), hd);
    }
    kt->attn_scores_mh(kv_type, nh, hd, q8 ? (const void *)qq : (const void *)q, k, row, n, scores, (size_t)n);
    kt->attn_accum_mh(kv_type, nh, hd, out, scores, (size_t)n, v, row, n);
    free(qq);
    return PD_OK;
}

/* The delta rule over n tokens of one head from state S (d x d, value major), chunked (isa's
 * table, chunks of PD_DELTA_CHUNK) or token by token (tests/test_qwen35.py compares them).
 * kq: [n][d] keys then [n][d] queries; v: [n][d]; o: [n][d]. */
int pd_kernel_delta_rule(const char *isa, int sequential, float *S, int d, int n, const float *kq, const float *v,
                         const float *beta, const float *g, float *o) {
    const pd_kernels *kt = pd_kernels_select(isa);
    if (!kt || !S || !kq || !v || !beta || !g || !o || d < 1 || d > PD_SSM_MAX_STATE || n < 1) return PD_EINVAL;
    const size_t dd = (size_t)d;
    float *sc = malloc(pd_delta_scratch_floats(d) * sizeof(float));
    if (!sc) return PD_ENOMEM;
    for (int t0 = 0; t0 < n; t0 += PD_DELTA_CHUNK) {
        const int c = n - t0 < PD_DELTA_CHUNK ? n - t0 : PD_DELTA_CHUNK;
        memcpy(sc, kq + t0 * dd, c * dd * sizeof(float));                       /* keys */
        memcpy(sc + c * dd, kq + (n + t0) * dd, c * dd * sizeof(float));        /* queries */
        if (sequential) pd_delta_sequential(S, d, c, sc, v + t0 * dd, dd, beta + t0, g + t0, o + t0 * dd, dd);
        else pd_delta_chunk(kt, S, d, c, v + t0 * dd, dd, beta + t0, g + t0, o + t0 * dd, dd, sc);
    }
    free(sc);
    return PD_OK;
}
