/* The KV cache in a step: append_kv (a token's K/V into its slot's row) and attention over the
 * cached positions (layer_forward's phase 4, core/forward.c), in every cache format (F16, F32,
 * Q8_0). pd_kernel_attn runs the same functions on rows a test gives.
 *
 * Work sharing. A query's positions [lo, p] are cut at multiples of PD_ATTN_CHUNK (absolute
 * positions), and one work item is (token, KV head, chunk): every query head of the KV head's
 * group over that chunk's rows. So
 *   - a long context spreads over the threads even when heads alone cannot keep them busy (one
 *     decode token of SmolLM2 has 3 KV heads: at depth 2048, 24 items instead of 9 heads);
 *   - a chunk's K and V rows are read once for the whole group (grouped-query attention), and
 *     while they sit in L1: the scores of the group are one matmul with a column per head, by
 *     the kernel table's matmul of the cache format (Q8_0: integer block dots against the
 *     query quantized to pd_q8 once per token, as the weights' matmuls do);
 *   - each item leaves its heads' (max, sum of exp, unnormalized weighted V), and a query with
 *     more than one chunk combines them in a second phase (flash-decoding's rescaling).
 * Chunks depend on positions only, never on the thread count or on how many tokens a step
 * holds: a token's attention has the same bits in a decode, a batch, a prefill or a speculative
 * verify pass. The partial results of a step's tokens are kept for a wave of tokens at a time
 * (pd_attn_wave: bounded memory at any context), two phases per wave. */
#include "core/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t pd_kv_row_bytes(const pd_config *c) {
    return pd_kv_bytes(c->kv_type, (size_t)c->n_head_kv * c->head_dim);
}

/* Chunks a query's positions can span: its window (n_ctx, or a local layer's) cut at multiples of
 * the chunk, plus one where it does not start on a boundary. */
int pd_attn_max_chunks(const pd_config *c) {
    return (c->n_ctx > 0 ? (int)(((int64_t)c->n_ctx + PD_ATTN_CHUNK - 1) / PD_ATTN_CHUNK) : 0) + 1;
}

/* Tokens per wave: as many as PD_ATTN_PART_BYTES of partial results hold (at least one). */
#define PD_ATTN_PART_BYTES (8u << 20)
static size_t part_floats(const pd_config *c) { return (size_t)c->head_dim + 2; }
int pd_attn_wave(const pd_config *c) {
    /* (sizes of a config not yet validated are clamped: pd_config_memory_bytes asks before a load) */
    const size_t nh = c->n_head > 0 ? (size_t)c->n_head : 1, hd = c->head_dim > 0 ? (size_t)c->head_dim : 1;
    const size_t per_token = nh * pd_attn_max_chunks(c) * (hd + 2) * sizeof(float);
    size_t w = PD_ATTN_PART_BYTES / per_token;
    const size_t cap = c->n_batch < 1 ? 1 : c->n_batch < PD_ATTN_MAX_WAVE ? (size_t)c->n_batch : PD_ATTN_MAX_WAVE;
    return w < 1 ? 1 : (int)(w > cap ? cap : w);
}
size_t pd_attn_scratch_floats(const pd_config *c) {   /* per thread: a group's scores and results */
    const size_t g = c->n_head_kv > 0 && c->n_head > c->n_head_kv ? (size_t)(c->n_head / c->n_head_kv) : 1;
    return g * (PD_ATTN_CHUNK + (c->head_dim > 0 ? part_floats(c) : 2));
}

/* Byte offset of position p of sequence slot s in layer l's cache (a row of every KV head). */
size_t pd_kv_layer_off(const pd_model *m, int l, int s, int p) {
    return ((size_t)s * m->kv_cap[l] + (size_t)(p % m->kv_cap[l])) * m->kv_row_bytes;
}

/* One row of K or V values (n_head_kv x head_dim) in the cache's format. */
static void store_row(const pd_model *m, const float *x, char *dst) {
    const int kvd = m->c.n_head_kv * m->c.head_dim;
    switch (m->c.kv_type) {
    case PD_KV_F16: m->kt->f32_to_f16(x, (uint16_t *)dst, kvd); break;
    case PD_KV_Q8_0: pd_quantize_blocks_q8_0(m->kt, x, (pd_block_q8_0 *)dst, kvd); break;
    default: memcpy(dst, x, (size_t)kvd * sizeof(float));
    }
}

/* x[0..32) <- H x / sqrt(32), H the 32-point Walsh-Hadamard matrix: orthonormal and its own
 * inverse, so q.k = Hq.Hk. A Q8_0 cache stores K rotated, and the query is rotated alike before it
 * is quantized: an outlier dimension (Qwen2's K biases reach ~100 where the rest are ~1) is
 * spread over its block instead of setting the block's scale for the 31 small values beside it.
 * Qwen2.5-Coder-0.5B, first logits of a short prompt against an f32 cache: max |delta| 14.9
 * without, 0.68 with (f16's: 0.50). V is stored as it is (its weighted sum is linear: an outlier
 * costs it no more than it is worth). */
static void hadamard32(float *x) {
    for (int h = 1; h < 32; h <<= 1)
        for (int i = 0; i < 32; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    for (int i = 0; i < 32; i++) x[i] *= 0.17677669529663687f;   /* 1 / sqrt(32) */
}

void pd_attn_query(pd_model *m, int t, int h, float *q) {
    const int hd = m->c.head_dim, qd = m->c.n_head * hd;
    if (m->c.kv_type != PD_KV_Q8_0) return;
    for (int b = 0; b < hd; b += PD_QK) hadamard32(q + b);
    m->kt->quantize_q8(q, m->qq + (size_t)t * (qd / PD_QK) + (size_t)h * (hd / PD_QK), hd);
}

/* append_kv: the K and V rows of a token (sequence slot s, position p) go into layer l's cache
 * (k is scratch: a Q8_0 cache rotates it in place first). */
void pd_append_kv(pd_model *m, int l, int s, int p, float *k, const float *v) {
    const size_t off = pd_kv_layer_off(m, l, s, p);
    if (m->c.kv_type == PD_KV_Q8_0)
        for (int b = 0; b < m->c.n_head_kv * m->c.head_dim; b += PD_QK) hadamard32(k + b);
    store_row(m, k, (char *)m->kc[l] + off);
    store_row(m, v, (char *)m->vc[l] + off);
}

/* A chunk's rows of one KV head: one or two runs of consecutive rows (the ring wraps once at most). */
typedef struct { const char *k[2], *v[2]; int len[2], nrun; } kv_runs;

/* The partial attention of nh query heads over a chunk's n rows: res[h] = { max score, sum of
 * exp(score - max), sum of exp(score - max) V (head_dim) }. q: nh float vectors (F16/F32 cache)
 * or nh x hd/32 pd_q8 blocks (Q8_0). scores: nh x PD_ATTN_CHUNK floats. The group's scores and
 * weighted sums are one kernel call per run (attn_scores_mh / attn_accum_mh: each row converted
 * once for all heads); only a head past PD_ATTN_ACC_FLOATS values sums per head. */
#define PD_ATTN_ACC_FLOATS 4096
static void chunk_partial(const pd_kernels *K, int kv_type, int nh, int hd, const void *q, const kv_runs *r,
                          size_t row_bytes, float scale, float *scores, float *res) {
    const int q8 = kv_type == PD_KV_Q8_0, f16 = kv_type == PD_KV_F16;
    const size_t esz = f16 ? 2 : 4;
    const int mh = hd <= PD_ATTN_ACC_FLOATS;
    int n = 0;
    for (int j = 0; j < r->nrun; n += r->len[j++])
        K->attn_scores_mh(kv_type, nh, hd, q, r->k[j], row_bytes, r->len[j], scores + n, PD_ATTN_CHUNK);
    const size_t pf = (size_t)hd + 2;
    for (int h = 0; h < nh; h++) {
        float *s = scores + (size_t)h * PD_ATTN_CHUNK, *out = res + h * pf, mx = -INFINITY;
        for (int i = 0; i < n; i++) { s[i] *= scale; mx = s[i] > mx ? s[i] : mx; }
        out[0] = mx;
        out[1] = K->exp_sub(s, n, mx);
        memset(out + 2, 0, (size_t)hd * sizeof(float));
        if (mh) continue;
        for (int j = 0, o = 0; j < r->nrun; o += r->len[j++]) {
            if (q8) K->attn_accum_q8(out + 2, s + o, r->v[j], row_bytes, r->len[j], hd);
            else K->attn_accum(out + 2, s + o, r->v[j], row_bytes / esz, r->len[j], hd, f16);
        }
    }
    if (!mh) return;
    /* The kernel's output is nh x hd contiguous, res has 2 floats before each head's: the sums go
     * to a stack buffer, up to PD_ATTN_ACC_FLOATS / hd heads per call (a head's sums do not
     * depend on the heads computed with it). */
    float acc[PD_ATTN_ACC_FLOATS];
    const int hg = PD_ATTN_ACC_FLOATS / hd;
    for (int h0 = 0; h0 < nh; h0 += hg) {
        const int g = nh - h0 < hg ? nh - h0 : hg;
        memset(acc, 0, (size_t)g * hd * sizeof(float));
        for (int j = 0, o = 0; j < r->nrun; o += r->len[j++])
            K->attn_accum_mh(kv_type, g, hd, acc, scores + (size_t)h0 * PD_ATTN_CHUNK + o, PD_ATTN_CHUNK, r->v[j],
                             row_bytes, r->len[j]);
        for (int h = 0; h < g; h++) memcpy(res + (h0 + h) * pf + 2, acc + (size_t)h * hd, (size_t)hd * sizeof(float));
    }
}

/* One head's output from its chunks' partial results (stride floats apart): rescaled to the
 * largest max. One chunk gives o / sum exactly (its weight is exp(0) = 1), so a query of one
 * chunk has the same bits whether it is combined here or at once. sink: the head's attention
 * sink logit (-INFINITY: none), one more term of the denominator with no value, so the
 * weights may sum to less than 1 (gpt-oss); every step combines through here, so a decode, a
 * batch and a prefill give the same bits with it too. */
static void combine(int nch, int hd, const float *res, size_t stride, float *out, float sink) {
    float mx = sink, den = 0.0f;
    for (int c = 0; c < nch; c++) mx = res[c * stride] > mx ? res[c * stride] : mx;
    if (sink > -INFINITY) den = expf(sink - mx);
    for (int j = 0; j < hd; j++) out[j] = 0.0f;
    for (int c = 0; c < nch; c++) {
        const float *r = res + c * stride, wc = expf(r[0] - mx);
        den += wc * r[1];
        for (int j = 0; j < hd; j++) out[j] += wc * r[2 + j];
    }
    const float inv = 1.0f / den;
    for (int j = 0; j < hd; j++) out[j] *= inv;
}

/* The first position a query at p sees in layer l, and its chunks. */
static int first_pos(const pd_config *c, int local, int p) {
    return local && p - c->sliding_window + 1 > 0 ? p - c->sliding_window + 1 : 0;
}
static int n_chunks(int lo, int p) { return p / PD_ATTN_CHUNK - lo / PD_ATTN_CHUNK + 1; }

/* Positions [a, b] of slot sq, KV head g of layer l, as runs of rows. */
static void chunk_runs(const pd_model *m, int l, int sq, int g, int a, int b, kv_runs *r) {
    const int cap = m->kv_cap[l];
    const size_t head = (size_t)g * (m->kv_row_bytes / m->c.n_head_kv);
    r->nrun = 0;
    for (int p = a; p <= b;) {
        const int row = p % cap, len = b - p + 1 < cap - row ? b - p + 1 : cap - row;
        r->k[r->nrun] = (const char *)m->kc[l] + pd_kv_layer_off(m, l, sq, p) + head;
        r->v[r->nrun] = (const char *)m->vc[l] + pd_kv_layer_off(m, l, sq, p) + head;
        r->len[r->nrun++] = len;
        p += len;
    }
}

int pd_step_phases(const pd_model *m, int n) {
    const int waves = (n + m->attn_wave - 1) / m->attn_wave;
    return 4 + m->c.n_layer * (11 + 2 * waves + (m->c.n_expert > 0 ? PD_MOE_EXTRA_PHASES : 0));
}

int pd_attention(pd_worker *w, step_ctx *s, int l) {
    pd_model *m = s->m;
    const pd_config *c = &m->c;
    const int hd = c->head_dim, qd = c->n_head * hd, group = c->n_head / c->n_head_kv;
    const int local = pd_layer_is_local(c, l), q8 = c->kv_type == PD_KV_Q8_0, mc = m->attn_max_chunks;
    const float scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)hd);
    const size_t pf = (size_t)hd + 2;
    float *scores = m->scores + (size_t)w->ith * pd_attn_scratch_floats(c);
    float *res = scores + (size_t)group * PD_ATTN_CHUNK;
    const float *sinks = (const float *)pd_layer_tensor(m, l, PD_ATTN_SINKS)->data;
#define SINK(head) (sinks ? sinks[head] : -INFINITY)
    for (int t0 = 0; t0 < s->n; t0 += m->attn_wave) {
        const int nt = s->n - t0 < m->attn_wave ? s->n - t0 : m->attn_wave;
        /* items of token t0 + i: [base[i], base[i + 1]), chunk-major then KV head */
        int base[PD_ATTN_MAX_WAVE + 1], multi = 0;
        base[0] = 0;
        for (int i = 0; i < nt; i++) {
            const int p = s->pos[t0 + i], nc = n_chunks(first_pos(c, local, p), p);
            base[i + 1] = base[i] + nc * c->n_head_kv;
            multi |= nc > 1;
        }
        FOR_CHUNKS(w, base[nt], item) {
            int i = 0, hi = nt - 1;   /* the token whose items hold this one: base[i] <= item < base[i + 1] */
            while (i < hi) {
                const int mid = (i + hi + 1) / 2;
                if (base[mid] <= item) i = mid; else hi = mid - 1;
            }
            const int t = t0 + i, p = s->pos[t], lo = first_pos(c, local, p);
            const int ci = (item - base[i]) / c->n_head_kv, g = (item - base[i]) % c->n_head_kv;
            const int c0 = lo / PD_ATTN_CHUNK + ci, a = c0 * PD_ATTN_CHUNK > lo ? c0 * PD_ATTN_CHUNK : lo;
            const int b = (c0 + 1) * PD_ATTN_CHUNK - 1 < p ? (c0 + 1) * PD_ATTN_CHUNK - 1 : p;
            kv_runs r;
            chunk_runs(m, l, s->seq[t], g, a, b, &r);
            const void *q = q8 ? (const void *)(m->qq + (size_t)t * (qd / PD_QK) + (size_t)g * group * (hd / PD_QK))
                               : (const void *)(m->q + (size_t)t * qd + (size_t)g * group * hd);
            chunk_partial(m->kt, c->kv_type, group, hd, q, &r, m->kv_row_bytes, scale, scores, res);
            const int nc = (base[i + 1] - base[i]) / c->n_head_kv;
            for (int h = 0; h < group; h++) {
                const int head = g * group + h;
                if (nc == 1) combine(1, hd, res + h * pf, pf, m->att + (size_t)t * qd + (size_t)head * hd, SINK(head));
                else memcpy(m->attn_part + (((size_t)i * c->n_head + head) * mc + ci) * pf, res + h * pf, pf * sizeof(float));
            }
        }
        END_PHASE(w, base[nt]);
        if (!multi) continue;   /* every thread decides alike: the combine phase is skipped by all */
        FOR_CHUNKS(w, nt * c->n_head, j) {
            const int i = j / c->n_head, head = j % c->n_head, nc = (base[i + 1] - base[i]) / c->n_head_kv;
            if (nc > 1)
                combine(nc, hd, m->attn_part + ((size_t)i * c->n_head + head) * mc * pf, pf,
                        m->att + (size_t)(t0 + i) * qd + (size_t)head * hd, SINK(head));
        }
        END_PHASE(w, nt * c->n_head);
    }
#undef SINK
    return 0;
}

/* ---- the test entry: one group of query heads over rows the caller gives ---- */

int pd_kernel_attn(const char *isa, int kv_type, int n_q, const float *q, const void *k, const void *v,
                   int n_pos, int head_dim, float scale, float *out) {
    const pd_kernels *K = pd_kernels_select(isa);
    if (!K || !q || !k || !v || !out || n_q < 1 || n_pos <= 0 || head_dim <= 0 || kv_type < PD_KV_F32 ||
        kv_type > PD_KV_Q8_0 || (kv_type == PD_KV_Q8_0 && head_dim % PD_QK))
        return PD_EINVAL;
    const size_t pf = (size_t)head_dim + 2, nch = (size_t)(n_pos + PD_ATTN_CHUNK - 1) / PD_ATTN_CHUNK;
    const size_t row = pd_kv_bytes(kv_type, (size_t)head_dim);
    float *scores = malloc((size_t)n_q * PD_ATTN_CHUNK * sizeof(float));
    float *part = malloc(nch * n_q * pf * sizeof(float)), *res = malloc(n_q * pf * sizeof(float));
    pd_q8 *qq = malloc((size_t)n_q * (head_dim / PD_QK + 1) * sizeof(pd_q8));
    int rc = scores && part && res && qq ? PD_OK : PD_ENOMEM;
    if (rc == PD_OK && kv_type == PD_KV_Q8_0)
        for (int h = 0; h < n_q; h++) K->quantize_q8(q + (size_t)h * head_dim, qq + (size_t)h * (head_dim / PD_QK), head_dim);
    for (size_t ci = 0; rc == PD_OK && ci < nch; ci++) {
        const int a = (int)ci * PD_ATTN_CHUNK, len = n_pos - a < PD_ATTN_CHUNK ? n_pos - a : PD_ATTN_CHUNK;
        kv_runs r = { { (const char *)k + a * row }, { (const char *)v + a * row }, { len }, 1 };
        chunk_partial(K, kv_type, n_q, head_dim, kv_type == PD_KV_Q8_0 ? (const void *)qq : (const void *)q, &r,
                      row, scale, scores, res);
        for (int h = 0; h < n_q; h++) memcpy(part + ((size_t)h * nch + ci) * pf, res + h * pf, pf * sizeof(float));
    }
    for (int h = 0; rc == PD_OK && h < n_q; h++)
        combine((int)nch, head_dim, part + (size_t)h * nch * pf, pf, out + (size_t)h * head_dim, -INFINITY);
    free(scores); free(part); free(res); free(qq);
    return rc;
}

int pd_kernel_quantize_q8_0(const char *isa, const float *x, void *out, int k) {
    const pd_kernels *K = pd_kernels_select(isa);
    if (!K || !x || !out || k <= 0 || k % PD_QK) return PD_EINVAL;
    pd_quantize_blocks_q8_0(K, x, out, k);
    return PD_OK;
}
