/* The forward pass: one implementation for every architecture, parameterized by pd_config.
 *
 * A step (prefill of n tokens, or decode_step of one) is ONE pd_pool_run: every thread runs
 * forward_task(), which walks all layers and meets the others at a barrier between dependent
 * phases. Matrix work is split by rows; per-token work (norms, RoPE, attention) by tokens/heads.
 * Everything (KV cache, scratch) is allocated once in pd_model_new; a step allocates nothing.
 */
#include "pydecode.h"
#include "kernels.h"
#include "threadpool.h"
#include "summary.h"

#include <math.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROW_ALIGN 16  /* rows per thread share: a multiple of the kernels' rows-per-pass and of
                         * PD_REPACK_ROWS (a repacked tensor is split only between row groups) */

struct pd_model {
    pd_config c;
    const pd_kernels *k;
    pd_pool *pool;
    pd_tensor g[PD_GLOBAL_SLOTS];
    pd_tensor *lt;               /* n_layer * PD_LAYER_SLOTS */
    /* KV cache: per layer [n_seq][kv_cap[l]][n_head_kv * head_dim], F16 or F32: one slot per
     * sequence. Position p of sequence s lives in row p % kv_cap[l] of slot s: global layers hold
     * n_ctx positions, sliding-window layers a ring of window + n_batch (a step's earliest query
     * of a sequence still sees its whole window). */
    void **kc, **vc;
    int *kv_cap;
    size_t kv_elem, kv_bytes;
    /* Scratch for up to n_batch tokens (row strides in elements / bytes below). */
    float *x;        /* residual stream [nb][d] */
    float *xn;       /* normed input of the next matmul [nb][max_in] */
    pd_q8 *xq;       /* xn quantized [nb][max_in/32] (legacy formats) */
    pd_q8k *xqk;     /* xn quantized [nb][max_in/256] (K-quants) */
    int need_q8, need_q8k;
    float *q;        /* [nb][n_head*hd] */
    float *kk, *vv;  /* this step's K/V before append [nb][n_kv*hd] */
    float *att;      /* attention output [nb][n_head*hd] */
    float *gate, *up;/* [nb][n_ff] */
    float *tmp;      /* matmul outputs before the residual add [nb][d] */
    float *scores;   /* per thread [n_ctx] */
    float *rope_cs;  /* [nb][2][rope_dim]: cos/sin per token for the global and the local base */
    int32_t *pos, *seq, *out_idx;  /* [nb]: the current step's positions, slots, logit rows */
    int32_t *seq_next;             /* [n_seq]: validation scratch (next position per slot) */
    size_t max_in, xq_stride, xqk_stride;
    pd_phase *phases;   /* one step's phases (threadpool.h), reset per step */
    int n_phases;
    uint32_t epoch;
    void *step;         /* the current step_ctx: lives here, not on a stack, so a lagging worker
                           never reads freed memory */
    _Atomic uint32_t step_seq;  /* seqlock over *step: odd while the main thread rewrites it */
    /* Weights repacked at load (repack_weights): their buffers and tensor slots. */
    void **repacked;
    int *repacked_slot, n_repacked;
    size_t repacked_bytes;
    /* The sampling summary (summary.h): one candidate list per thread, stats per head chunk. */
    float summ_inv_t;          /* > 0: summarize steps that return one row of logits */
    pd_summ_list *summ;        /* [n_threads], allocated on first use */
    float *summ_cmax;          /* [summ_chunks] */
    double *summ_csum;
    int summ_chunks, summ_ready;
    char err[256];
};

/* ---- the work of one step, shared by all threads ---- */
typedef struct {
    pd_model *m;
    const int32_t *tokens;
    const int32_t *pos, *seq;   /* per token: position and sequence slot */
    int n;
    const int32_t *out_idx;     /* the tokens whose logits are wanted, in order */
    int n_out;
    float *logits;              /* [n_out][n_vocab] */
    uint32_t epoch;
    int summ;                   /* fold the logits into the sampling summary (summary.h) */
} step_ctx;

static int set_err(char *buf, int len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, (size_t)len, fmt, ap);
    va_end(ap);
    return PD_EINVAL;
}

static const pd_tensor *LT(const pd_model *m, int l, int slot) {
    return &m->lt[(size_t)l * PD_LAYER_SLOTS + slot];
}

/* ---------------- small per-row ops (not the hot path: O(d) per token) ---------------- */

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

/* cos/sin of pos * base^(-2i/rope_dim) for the rope_dim/2 pairs, computed once per token and
 * base per step and shared by every head of every layer. */
static void rope_table(float *cs, int rope_dim, double pos, float base, const float *freq_div) {
    for (int i = 0; i < rope_dim / 2; i++) {
        double theta = pos * pow(base, -2.0 * i / rope_dim) / (freq_div ? freq_div[i] : 1.0f);
        cs[2 * i] = (float)cos(theta);
        cs[2 * i + 1] = (float)sin(theta);
    }
}

/* Rotates the pairs of one head. Interleaved ("normal", llama GGUF, whose converter permutes
 * Q/K for it): pairs (2i, 2i+1); NeoX: pairs (i, i + rope_dim/2). Dims past rope_dim stay. */
static void rope(float *v, int rope_dim, int neox, const float *cs) {
    int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

/* GELU, tanh approximation, written as x * sigmoid(2z) (== 0.5x(1 + tanh z)): one expf instead
 * of a tanhf, which is ~2x dearer in glibc and was 4% of a Gemma decode step. */
static int layer_is_local(const pd_config *c, int l) {
    return c->sliding_window > 0 && (c->swa_period <= 0 || (l + 1) % c->swa_period != 0);
}

/* ---------------- matrix work ---------------- */

/* Out[t][r] for rows [r0, r1) of W and the n tokens of the current input (xn/xq). */
static void matmul_rows(pd_model *m, const pd_tensor *w, int r0, int r1, int n,
                        float *out, size_t out_stride) {
    if (r1 <= r0) return;
    int k = (int)w->ne0;
    const void *x;
    size_t xs;
    switch (pd_type_act_format(w->type)) {
    case PD_ACT_Q8: x = m->xq; xs = m->xq_stride * sizeof(pd_q8); break;
    case PD_ACT_Q8K: x = m->xqk; xs = m->xqk_stride * sizeof(pd_q8k); break;
    default: x = m->xn; xs = m->max_in * sizeof(float); break;
    }
    m->k->matmul[w->type](k, (const char *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes,
                          r1 - r0, x, xs, n, out + r0, out_stride);
}

/* The input of the next matmuls: xn[t] (already written) quantized once into each 8-bit block
 * format the model's weights pair with. */
static void quantize_row(pd_model *m, int t, int n_in) {
    const float *src = m->xn + (size_t)t * m->max_in;
    if (m->need_q8) m->k->quantize_q8(src, m->xq + (size_t)t * m->xq_stride, n_in);
    if (m->need_q8k && n_in % PD_QKK == 0) m->k->quantize_q8k(src, m->xqk + (size_t)t * m->xqk_stride, n_in);
}

/* xn[t] = rmsnorm(src[t]) (or a copy), quantized: the input of the next matmuls, one token. */
static void norm_input(pd_model *m, const float *src, size_t src_stride, const pd_tensor *w, int n_in, int t) {
    float *dst = m->xn + (size_t)t * m->max_in;
    if (w) rmsnorm(dst, src + (size_t)t * src_stride, (const float *)w->data, n_in, m->c.norm_eps);
    else memcpy(dst, src + (size_t)t * src_stride, (size_t)n_in * sizeof(float));
    quantize_row(m, t, n_in);
}

/* ---------------- phases: work shared in chunks (threadpool.h) ---------------- */

/* Rows per chunk depend on the matrix only (never on the thread count), so every row is computed
 * the same way whatever the threads: results are identical across thread counts. */
static int chunk_rows(int rows) {
    int c = (rows / 64 + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
    return c < 16 ? 16 : (c > 1024 ? 1024 : c);
}

#define N_CHUNKS(rows, ch) (((rows) + (ch) - 1) / (ch))
/* for each chunk c of this phase that this thread takes: ... ; then wait for the phase */
#define FOR_CHUNKS(w, n, c) for (int c; ((c) = pd_chunk((w), (n))) >= 0; pd_chunk_done(w))
#define END_PHASE(w, n) do { if (pd_phase_end((w), (n))) return -1; } while (0)

/* Per-token phase: norm (or copy) + quantize every token's input row. */
static int phase_norm(pd_worker *w, pd_model *m, const float *src, size_t stride, const pd_tensor *nw,
                      int n_in, int n) {
    FOR_CHUNKS(w, n, t) norm_input(m, src, stride, nw, n_in, t);
    END_PHASE(w, n);
    return 0;
}

/* ---------------- attention ---------------- */

/* Row of position p of sequence slot s in layer l's cache (in elements). */
static size_t kv_row(const pd_model *m, int l, int s, int p) {
    return ((size_t)s * m->kv_cap[l] + (size_t)(p % m->kv_cap[l])) * m->c.n_head_kv * m->c.head_dim;
}

/* append_kv: the K and V rows of a token (sequence slot s, position p) go into layer l's cache. */
static void append_kv(pd_model *m, int l, int s, int p, const float *k, const float *v) {
    int kvd = m->c.n_head_kv * m->c.head_dim;
    p = (int)(kv_row(m, l, s, p) / kvd);
    if (m->c.kv_f16) {
        m->k->f32_to_f16(k, (uint16_t *)m->kc[l] + (size_t)p * kvd, kvd);
        m->k->f32_to_f16(v, (uint16_t *)m->vc[l] + (size_t)p * kvd, kvd);
    } else {
        memcpy((float *)m->kc[l] + (size_t)p * kvd, k, (size_t)kvd * sizeof(float));
        memcpy((float *)m->vc[l] + (size_t)p * kvd, v, (size_t)kvd * sizeof(float));
    }
}

/* One query head over positions [lo, hi] of sequence slot sq: scaled dot products, stable
 * softmax, weighted sum of V. The positions sit in the slot's ring as at most two contiguous
 * runs of rows (before and after the wrap); the kernels stream each run once. */
static void attend(pd_model *m, int l, int sq, int kvh, const float *q, int lo, int hi, float scale,
                   float *scores, float *out) {
    const pd_kernels *K = m->k;
    int hd = m->c.head_dim, cap = m->kv_cap[l], f16 = m->c.kv_f16;
    size_t kvd = (size_t)m->c.n_head_kv * hd, esz = m->kv_elem, off = (size_t)kvh * hd;
    int run[2], n_runs = 0, from[2];
    for (int p = lo; p <= hi;) {          /* split [lo, hi] where the ring wraps */
        int row = p % cap, len = hi - p + 1 < cap - row ? hi - p + 1 : cap - row;
        from[n_runs] = p; run[n_runs++] = len;
        p += len;
    }
    for (int r = 0; r < n_runs; r++)
        K->attn_scores(q, (const char *)m->kc[l] + (kv_row(m, l, sq, from[r]) + off) * esz, kvd, run[r], hd,
                       scale, f16, scores + (from[r] - lo));
    int n = hi - lo + 1;
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = scores[i] > mx ? scores[i] : mx;
    float inv = 1.0f / K->exp_sub(scores, n, mx);
    for (int i = 0; i < n; i++) scores[i] *= inv;
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int r = 0; r < n_runs; r++)
        K->attn_accum(out, scores + (from[r] - lo), (const char *)m->vc[l] + (kv_row(m, l, sq, from[r]) + off) * esz,
                      kvd, run[r], hd, f16);
}

/* Rows [r0, r1) of a block's output (tmp) into the residual stream, for every token. */
static void residual_rows(pd_model *m, int n, int r0, int r1) {
    int d = m->c.n_embd;
    for (int t = 0; t < n; t++)
        for (int i = r0; i < r1; i++) m->x[(size_t)t * d + i] += m->tmp[(size_t)t * d + i];
}

/* A matmul whose output goes into the residual stream: x += W @ xn, or, with a post-norm (gemma),
 * x += rmsnorm(W @ xn), which needs whole rows and so one more (per-token) phase. */
static int phase_residual_matmul(pd_worker *w, pd_model *m, const pd_tensor *wt, const pd_tensor *post_norm, int n) {
    int d = m->c.n_embd, ch = chunk_rows(d), nc = N_CHUNKS(d, ch);
    FOR_CHUNKS(w, nc, c) {
        int r0 = c * ch, r1 = r0 + ch < d ? r0 + ch : d;
        matmul_rows(m, wt, r0, r1, n, m->tmp, d);
        if (!post_norm->data) residual_rows(m, n, r0, r1);
    }
    END_PHASE(w, nc);
    if (!post_norm->data) return 0;
    FOR_CHUNKS(w, n, t) {
        float *y = m->tmp + (size_t)t * d, *x = m->x + (size_t)t * d;
        rmsnorm(y, y, (const float *)post_norm->data, d, m->c.norm_eps);
        for (int i = 0; i < d; i++) x[i] += y[i];
    }
    END_PHASE(w, n);
    return 0;
}

/* ---------------- one layer, all threads ---------------- */

static int layer_forward(pd_worker *w, step_ctx *s, int l) {
    pd_model *m = s->m;
    const pd_config *c = &m->c;
    int n = s->n, d = c->n_embd, hd = c->head_dim;
    int qd = c->n_head * hd, kvd = c->n_head_kv * hd, nff = c->n_ff;

    /* 1. attention norm -> quantized input */
    if (phase_norm(w, m, m->x, d, LT(m, l, PD_ATTN_NORM), d, n)) return -1;

    /* 2. Q, K, V in one phase over the concatenated rows (they share the input) */
    int rows = qd + 2 * kvd, ch = chunk_rows(rows), nc = N_CHUNKS(rows, ch);
    FOR_CHUNKS(w, nc, ci) {
        int r0 = ci * ch, r1 = r0 + ch < rows ? r0 + ch : rows;
        const pd_tensor *t[3] = { LT(m, l, PD_WQ), LT(m, l, PD_WK), LT(m, l, PD_WV) };
        float *out[3] = { m->q, m->kk, m->vv };
        int base[3] = { 0, qd, qd + kvd }, len[3] = { qd, kvd, kvd };
        for (int j = 0; j < 3; j++) {
            int a = r0 - base[j], b = r1 - base[j];
            a = a < 0 ? 0 : (a > len[j] ? len[j] : a);
            b = b < 0 ? 0 : (b > len[j] ? len[j] : b);
            matmul_rows(m, t[j], a, b, n, out[j], len[j]);
        }
    }
    END_PHASE(w, nc);

    /* 3. biases, per-head Q/K norms, RoPE, then append_kv (per token) */
    int local = layer_is_local(c, l);
    FOR_CHUNKS(w, n, t) {
        const float *cs = m->rope_cs + ((size_t)t * 2 + (local ? 1 : 0)) * c->rope_dim;
        float *q = m->q + (size_t)t * qd, *kk = m->kk + (size_t)t * kvd, *vv = m->vv + (size_t)t * kvd;
        const pd_tensor *bq = LT(m, l, PD_BQ), *bk = LT(m, l, PD_BK), *bv = LT(m, l, PD_BV);
        if (bq->data) for (int i = 0; i < qd; i++) q[i] += ((const float *)bq->data)[i];
        if (bk->data) for (int i = 0; i < kvd; i++) kk[i] += ((const float *)bk->data)[i];
        if (bv->data) for (int i = 0; i < kvd; i++) vv[i] += ((const float *)bv->data)[i];
        const pd_tensor *qn = LT(m, l, PD_Q_NORM), *kn = LT(m, l, PD_K_NORM);
        for (int h = 0; h < c->n_head; h++) {
            if (qn->data) rmsnorm(q + h * hd, q + h * hd, (const float *)qn->data, hd, c->norm_eps);
            rope(q + h * hd, c->rope_dim, c->rope_neox, cs);
        }
        for (int h = 0; h < c->n_head_kv; h++) {
            if (kn->data) rmsnorm(kk + h * hd, kk + h * hd, (const float *)kn->data, hd, c->norm_eps);
            rope(kk + h * hd, c->rope_dim, c->rope_neox, cs);
        }
        append_kv(m, l, s->seq[t], s->pos[t], kk, vv);
    }
    END_PHASE(w, n);

    /* 4. attention: one (token, head) pair per chunk; causal, optional sliding window */
    float scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)hd);
    int group = c->n_head / c->n_head_kv;
    FOR_CHUNKS(w, n * c->n_head, i) {
        int t = i / c->n_head, h = i % c->n_head, p = s->pos[t];
        int lo = local && p - c->sliding_window + 1 > 0 ? p - c->sliding_window + 1 : 0;
        attend(m, l, s->seq[t], h / group, m->q + (size_t)t * qd + h * hd, lo, p, scale,
               m->scores + (size_t)w->ith * c->n_ctx, m->att + (size_t)t * qd + h * hd);
    }
    END_PHASE(w, n * c->n_head);

    /* 5. output projection (+ post-attention norm) into the residual stream */
    if (phase_norm(w, m, m->att, qd, NULL, qd, n)) return -1;
    if (phase_residual_matmul(w, m, LT(m, l, PD_WO), LT(m, l, PD_POST_ATTN_NORM), n)) return -1;

    /* 6. FFN: norm; gate and up in one phase (same rows -> the activation is fused); down */
    if (phase_norm(w, m, m->x, d, LT(m, l, PD_FFN_NORM), d, n)) return -1;
    ch = chunk_rows(nff);
    nc = N_CHUNKS(nff, ch);
    FOR_CHUNKS(w, nc, ci) {
        int r0 = ci * ch, r1 = r0 + ch < nff ? r0 + ch : nff;
        matmul_rows(m, LT(m, l, PD_GATE), r0, r1, n, m->gate, nff);
        matmul_rows(m, LT(m, l, PD_UP), r0, r1, n, m->up, nff);
        for (int t = 0; t < n; t++) {
            float *g = m->gate + (size_t)t * nff, *u = m->up + (size_t)t * nff;
            m->k->act_mul(g + r0, u + r0, r1 - r0, c->act_gelu);
        }
    }
    END_PHASE(w, nc);
    if (phase_norm(w, m, m->gate, nff, NULL, nff, n)) return -1;
    return phase_residual_matmul(w, m, LT(m, l, PD_DOWN), LT(m, l, PD_POST_FFN_NORM), n);
}

/* Everything one thread does for a step; returns -1 if it fell behind an already finished step. */
static int forward(pd_worker *w, step_ctx *s) {
    pd_model *m = s->m;
    const pd_config *c = &m->c;
    int n = s->n, d = c->n_embd;

    /* embeddings: one row of the (quantized) table per token, scaled for gemma; RoPE tables */
    FOR_CHUNKS(w, n, t) {
        const pd_tensor *e = &m->g[PD_TOK_EMBD];
        float *x = m->x + (size_t)t * d;
        pd_dequantize_row(e->type, (const char *)e->data + (size_t)s->tokens[t] * e->row_bytes, x, d);
        if (c->embd_scale > 0) for (int i = 0; i < d; i++) x[i] *= c->embd_scale;
        float *cs = m->rope_cs + (size_t)t * 2 * c->rope_dim;
        rope_table(cs, c->rope_dim, (double)s->pos[t] * (c->rope_freq_scale > 0 ? c->rope_freq_scale : 1.0),
                   c->rope_base, (const float *)m->g[PD_ROPE_FREQS].data);
        rope_table(cs + c->rope_dim, c->rope_dim, s->pos[t],
                   c->rope_base_local > 0 ? c->rope_base_local : c->rope_base, NULL);
    }
    END_PHASE(w, n);

    for (int l = 0; l < c->n_layer; l++)
        if (layer_forward(w, s, l)) return -1;

    /* final norm and output head: only the positions whose logits are wanted */
    int n_out = s->n_out;
    if (!s->logits || n_out < 1) return 0;
    FOR_CHUNKS(w, n_out, t) {
        rmsnorm(m->xn + (size_t)t * m->max_in, m->x + (size_t)s->out_idx[t] * d,
                (const float *)m->g[PD_OUTPUT_NORM].data, d, c->norm_eps);
        quantize_row(m, t, d);
    }
    END_PHASE(w, n_out);
    const pd_tensor *out = m->g[PD_OUTPUT].data ? &m->g[PD_OUTPUT] : &m->g[PD_TOK_EMBD];
    int ch = chunk_rows(c->n_vocab), nc = N_CHUNKS(c->n_vocab, ch);
    FOR_CHUNKS(w, nc, ci) {
        int r0 = ci * ch, r1 = r0 + ch < c->n_vocab ? r0 + ch : c->n_vocab;
        matmul_rows(m, out, r0, r1, n_out, s->logits, c->n_vocab);
        if (s->summ)   /* while this chunk of logits is hot (summary.h) */
            pd_summ_fold(&m->summ[w->ith], s->logits + r0, r0, r1 - r0, m->summ_inv_t, &m->summ_cmax[ci],
                         &m->summ_csum[ci]);
    }
    END_PHASE(w, nc);
    return 0;
}

/* A worker may start (or wake) late, while the main thread is already rewriting *step for the
 * next step. It works from a consistent copy (a seqlock read): a torn mix of two steps' fields
 * (say the new epoch with the old token count) would claim chunks the other threads do not
 * count, and the phase whose done counter overshoots would never end. With a consistent copy,
 * a stale step is harmless: its epoch no longer matches the phases, so every claim fails. */
static void forward_task(void *ctx, int ith, int nth) {
    pd_model *m = ((step_ctx *)ctx)->m;
    (void)nth;
    step_ctx s;
    for (;;) {
        uint32_t v = atomic_load_explicit(&m->step_seq, memory_order_acquire);
        if (v & 1) continue;
        memcpy(&s, (const void *)m->step, sizeof s);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&m->step_seq, memory_order_relaxed) == v) break;
    }
    pd_worker w = { m->phases, s.epoch, 0, ith };
    forward(&w, &s);
}

/* ---------------- public API ---------------- */

/* Checks a step's arguments before any thread touches them: every id, position and slot in
 * range, and each sequence's tokens at consecutive positions (the attention of a token reads
 * its sequence's earlier positions: the cache, or tokens earlier in this step). */
static int check_step(pd_model *m, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int n,
                      const int32_t *out_idx, int n_out) {
    const pd_config *c = &m->c;
    if (n < 1) return set_err(m->err, sizeof m->err, "no tokens given (n=%d)", n);
    if (n > c->n_batch) return set_err(m->err, sizeof m->err, "%d tokens in one step exceed n_batch %d", n, c->n_batch);
    if (n_out < 0 || n_out > n) return set_err(m->err, sizeof m->err, "n_out %d outside 0..%d", n_out, n);
    for (int s = 0; s < c->n_seq; s++) m->seq_next[s] = -1;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
            return set_err(m->err, sizeof m->err, "token id %d at index %d is outside the vocabulary (0..%d)",
                           tokens[i], i, c->n_vocab - 1);
        if (seq[i] < 0 || seq[i] >= c->n_seq)
            return set_err(m->err, sizeof m->err, "sequence slot %d at index %d is outside 0..%d", seq[i], i, c->n_seq - 1);
        if (pos[i] < 0 || pos[i] >= c->n_ctx) {
            set_err(m->err, sizeof m->err, "position %d at index %d exceeds the context size %d", pos[i], i, c->n_ctx);
            return PD_ERANGE;
        }
        int *next = &m->seq_next[seq[i]];
        if (*next >= 0 && pos[i] != *next)
            return set_err(m->err, sizeof m->err, "sequence %d: position %d at index %d does not follow %d",
                           seq[i], pos[i], i, *next - 1);
        *next = pos[i] + 1;
    }
    for (int i = 0; i < n_out; i++)
        if (out_idx[i] < 0 || out_idx[i] >= n)
            return set_err(m->err, sizeof m->err, "logits row %d outside the step's tokens 0..%d", out_idx[i], n - 1);
    return PD_OK;
}

static void run_checked(pd_model *m, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int n,
                        const int32_t *out_idx, int n_out, float *logits) {
    step_ctx *s = m->step;
    const int summ = m->summ_inv_t > 0 && n_out == 1 && logits;
    if (summ)
        for (int t = 0; t < m->c.n_threads; t++) pd_summ_reset(&m->summ[t]);
    m->summ_ready = summ;
    atomic_fetch_add_explicit(&m->step_seq, 1, memory_order_relaxed);   /* odd: being written */
    atomic_thread_fence(memory_order_release);
    *s = (step_ctx){ m, tokens, pos, seq, n, out_idx, n_out, logits, ++m->epoch, summ };
    atomic_fetch_add_explicit(&m->step_seq, 1, memory_order_release);   /* even: consistent */
    pd_phases_reset(m->phases, m->n_phases, s->epoch);
    pd_pool_run_async(m->pool, forward_task, s);
}

/* One sequence: tokens at positions pos.. in chunks of n_batch (causal attention makes chunked ==
 * whole-block, exactly). Logits of the last token, or of every token if all. */
static int run_seq(pd_model *m, const int32_t *tokens, int n, int pos, int sq, float *logits, int all) {
    if (!m) return PD_EINVAL;
    if (n < 1) return set_err(m->err, sizeof m->err, "no tokens given (n=%d)", n);
    if (sq < 0 || sq >= m->c.n_seq) return set_err(m->err, sizeof m->err, "sequence slot %d is outside 0..%d", sq, m->c.n_seq - 1);
    if (pos < 0 || pos > m->c.n_ctx - n) {
        set_err(m->err, sizeof m->err, "positions %d..%lld exceed the context size %d",
                pos, (long long)pos + n - 1, m->c.n_ctx);
        return PD_ERANGE;
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->c.n_vocab)
            return set_err(m->err, sizeof m->err, "token id %d at index %d is outside the vocabulary (0..%d)",
                           tokens[i], i, m->c.n_vocab - 1);
    for (int done = 0; done < n;) {
        int chunk = n - done < m->c.n_batch ? n - done : m->c.n_batch;
        int last = done + chunk == n;
        for (int i = 0; i < chunk; i++) { m->pos[i] = pos + done + i; m->seq[i] = sq; m->out_idx[i] = i; }
        int n_out = all ? chunk : (last ? 1 : 0);
        if (!all) m->out_idx[0] = chunk - 1;
        run_checked(m, tokens + done, m->pos, m->seq, chunk, m->out_idx, n_out,
                    all ? logits + (size_t)done * m->c.n_vocab : (last ? logits : NULL));
        done += chunk;
    }
    return PD_OK;
}

int pd_prefill(pd_model *m, const int32_t *tokens, int n, int pos, float *logits, int all_logits) {
    return run_seq(m, tokens, n, pos, 0, logits, all_logits);
}

int pd_prefill_seq(pd_model *m, int seq, const int32_t *tokens, int n, int pos, float *logits, int all_logits) {
    return run_seq(m, tokens, n, pos, seq, logits, all_logits);
}

int pd_decode_step(pd_model *m, int32_t token, int pos, float *logits) {
    return run_seq(m, &token, 1, pos, 0, logits, 0);
}

int pd_batch_step(pd_model *m, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int n,
                  const int32_t *out_idx, int n_out, float *logits) {
    if (!m) return PD_EINVAL;
    int rc = check_step(m, tokens, pos, seq, n, out_idx, n_out);
    if (rc) return rc;
    /* The arguments are copied: the workers may still read them after this call returns (async). */
    memcpy(m->pos, pos, (size_t)n * sizeof *pos);
    memcpy(m->seq, seq, (size_t)n * sizeof *seq);
    memcpy(m->out_idx, out_idx, (size_t)n_out * sizeof *out_idx);
    run_checked(m, tokens, m->pos, m->seq, n, m->out_idx, n_out, n_out ? logits : NULL);
    return PD_OK;
}

/* The GGUF name of a tensor slot, for messages: "blk.3.ffn_up.weight" or "output.weight". */
static const char *full_name(char *buf, size_t n, const char *name, int l) {
    if (l < 0) snprintf(buf, n, "%s", name);
    else snprintf(buf, n, "blk.%d.%s", l, name);
    return buf;
}

static int check_matrix(const pd_kernels *K, const pd_tensor *t, const char *short_name, int l,
                        int64_t ne0, int64_t ne1, char *err, int len) {
    char name[96];
    full_name(name, sizeof name, short_name, l);
    if (!t->data) return set_err(err, len, "missing tensor %s", name);
    if (t->ne0 != ne0 || t->ne1 != ne1)
        return set_err(err, len, "tensor %s has shape [%lld, %lld], expected [%lld, %lld]", name,
                       (long long)t->ne0, (long long)t->ne1, (long long)ne0, (long long)ne1);
    if (t->type < 0 || t->type >= PD_FIRST_REPACKED || !K->matmul[t->type])
        return set_err(err, len, "tensor %s has unsupported type %s (type id %d)", name,
                       pd_type_name(t->type), t->type);
    int bs = pd_type_block_size(t->type);
    if (bs <= 0 || ne0 % bs || t->row_bytes != (size_t)(ne0 / bs) * pd_type_block_bytes(t->type))
        return set_err(err, len, "tensor %s: row of %lld values is not whole blocks of %s", name,
                       (long long)ne0, pd_type_name(t->type));
    return PD_OK;
}

static int check_vector(const pd_tensor *t, const char *short_name, int l, int64_t n, int optional,
                        char *err, int len) {
    char name[96];
    full_name(name, sizeof name, short_name, l);
    if (!t->data) return optional ? PD_OK : set_err(err, len, "missing tensor %s", name);
    if (t->type != PD_F32 || t->ne0 != n || t->ne1 != 1)
        return set_err(err, len, "tensor %s must be F32 of %lld values (got type %d, shape [%lld, %lld])",
                       name, (long long)n, t->type, (long long)t->ne0, (long long)t->ne1);
    return PD_OK;
}

static int validate(const pd_config *c, const pd_kernels *K, const pd_tensor *T, int nt, char *err, int len) {
    if (c->n_layer < 1 || c->n_embd < 1 || c->n_head < 1 || c->n_head_kv < 1 || c->head_dim < 2 ||
        c->n_ff < 1 || c->n_vocab < 1 || c->n_ctx < 1 || c->n_batch < 1 || c->n_seq < 0)
        return set_err(err, len, "invalid config: every size must be positive");
    if (c->n_head % c->n_head_kv) return set_err(err, len, "n_head %d is not a multiple of n_head_kv %d", c->n_head, c->n_head_kv);
    if (c->head_dim % 2 || c->rope_dim > c->head_dim || c->rope_dim < 0 || c->rope_dim % 2)
        return set_err(err, len, "invalid rope_dim %d for head_dim %d", c->rope_dim, c->head_dim);
    if (c->n_embd % PD_QK || c->n_ff % PD_QK || (c->n_head * c->head_dim) % PD_QK)
        return set_err(err, len, "model dims must be multiples of %d", PD_QK);
    if (nt != PD_GLOBAL_SLOTS + c->n_layer * PD_LAYER_SLOTS)
        return set_err(err, len, "expected %d tensor slots, got %d", PD_GLOBAL_SLOTS + c->n_layer * PD_LAYER_SLOTS, nt);
    int d = c->n_embd, qd = c->n_head * c->head_dim, kvd = c->n_head_kv * c->head_dim, rc;
    const pd_tensor *e = &T[PD_TOK_EMBD];
    if (!e->data || e->ne0 != d || e->ne1 != c->n_vocab)
        return set_err(err, len, "token_embd.weight must have shape [%d, %d]", d, c->n_vocab);
    if (pd_type_block_size(e->type) <= 0 || d % pd_type_block_size(e->type) ||
        e->row_bytes != (size_t)(d / pd_type_block_size(e->type)) * pd_type_block_bytes(e->type))
        return set_err(err, len, "token_embd.weight has unsupported type %s (type id %d) or rows that are not "
                       "whole blocks of it", pd_type_name(e->type), e->type);
    if ((rc = check_vector(&T[PD_OUTPUT_NORM], "output_norm.weight", -1, d, 0, err, len))) return rc;
    if ((rc = check_vector(&T[PD_ROPE_FREQS], "rope_freqs.weight", -1, c->rope_dim ? c->rope_dim / 2 : c->head_dim / 2, 1, err, len)))
        return rc;
    const pd_tensor *out = T[PD_OUTPUT].data ? &T[PD_OUTPUT] : e;
    if ((rc = check_matrix(K, out, T[PD_OUTPUT].data ? "output.weight" : "token_embd.weight", -1, d, c->n_vocab, err, len))) return rc;
    for (int l = 0; l < c->n_layer; l++) {
        const pd_tensor *L = &T[PD_GLOBAL_SLOTS + (size_t)l * PD_LAYER_SLOTS];
        if ((rc = check_vector(&L[PD_ATTN_NORM], "attn_norm.weight", l, d, 0, err, len)) ||
            (rc = check_matrix(K, &L[PD_WQ], "attn_q.weight", l, d, qd, err, len)) ||
            (rc = check_matrix(K, &L[PD_WK], "attn_k.weight", l, d, kvd, err, len)) ||
            (rc = check_matrix(K, &L[PD_WV], "attn_v.weight", l, d, kvd, err, len)) ||
            (rc = check_matrix(K, &L[PD_WO], "attn_output.weight", l, qd, d, err, len)) ||
            (rc = check_vector(&L[PD_BQ], "attn_q.bias", l, qd, 1, err, len)) ||
            (rc = check_vector(&L[PD_BK], "attn_k.bias", l, kvd, 1, err, len)) ||
            (rc = check_vector(&L[PD_BV], "attn_v.bias", l, kvd, 1, err, len)) ||
            (rc = check_vector(&L[PD_Q_NORM], "attn_q_norm.weight", l, c->head_dim, 1, err, len)) ||
            (rc = check_vector(&L[PD_K_NORM], "attn_k_norm.weight", l, c->head_dim, 1, err, len)) ||
            (rc = check_vector(&L[PD_POST_ATTN_NORM], "post_attention_norm.weight", l, d, 1, err, len)) ||
            (rc = check_vector(&L[PD_FFN_NORM], "ffn_norm.weight", l, d, 0, err, len)) ||
            (rc = check_matrix(K, &L[PD_GATE], "ffn_gate.weight", l, d, c->n_ff, err, len)) ||
            (rc = check_matrix(K, &L[PD_UP], "ffn_up.weight", l, d, c->n_ff, err, len)) ||
            (rc = check_matrix(K, &L[PD_DOWN], "ffn_down.weight", l, c->n_ff, d, err, len)) ||
            (rc = check_vector(&L[PD_POST_FFN_NORM], "post_ffw_norm.weight", l, d, 1, err, len)))
            return rc;
    }
    return PD_OK;
}

void pd_model_free(pd_model *m) {
    if (!m) return;
    if (m->pool) pd_pool_free(m->pool);
    if (m->kc) for (int l = 0; l < m->c.n_layer; l++) free(m->kc[l]);
    if (m->vc) for (int l = 0; l < m->c.n_layer; l++) free(m->vc[l]);
    free(m->kc); free(m->vc); free(m->kv_cap); free(m->lt);
    free(m->x); free(m->xn); free(m->xq); free(m->xqk); free(m->q); free(m->kk); free(m->vv); free(m->att);
    free(m->gate); free(m->up); free(m->tmp); free(m->scores); free(m->rope_cs);
    free(m->phases); free(m->step); free(m->pos); free(m->seq); free(m->out_idx); free(m->seq_next);
    free(m->summ); free(m->summ_cmax); free(m->summ_csum);
    for (int i = 0; i < m->n_repacked; i++) free(m->repacked[i]);
    free(m->repacked); free(m->repacked_slot);
    free(m);
}

/* Repacks, at load, the matmul weights whose format has a faster interleaved layout on this
 * ISA (kernels.h: PD_*_R16): a copy the kernels read instead of the mapped file. Only
 * tensors split between threads at multiples of PD_R16_ROWS qualify: whole row groups, and
 * for Q, K and V (one phase over their concatenated rows) sizes that keep the groups aligned.
 * The embedding table is read a row at a time and keeps the file's layout; a head tied to it
 * gets its own repacked copy in the output slot (the file's pages of the table are then only
 * touched row by row). */
static int repack_one(pd_model *m, pd_tensor *t, int slot_index) {
    const int rt = pd_repacked_type(t->type);
    if (rt < 0 || !m->k->matmul[rt] || t->ne1 % PD_R16_ROWS || t->ne1 > INT32_MAX) return 0;
    const size_t bytes = (size_t)t->ne1 * t->row_bytes;
    void *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!buf) return -1;
    if (pd_repack(t->type, t->data, t->row_bytes, (int)t->ne1, (int)t->ne0, buf)) { free(buf); return 0; }
    m->repacked[m->n_repacked] = buf;
    m->repacked_slot[m->n_repacked++] = slot_index;
    m->repacked_bytes += bytes;
    t->type = rt;
    t->data = buf;
    return 1;
}

static int repack_weights(pd_model *m) {
    const pd_config *c = &m->c;
    const int n_slots = PD_GLOBAL_SLOTS + c->n_layer * PD_LAYER_SLOTS;
    const int qkv_ok = (c->n_head * c->head_dim) % PD_R16_ROWS == 0 &&
                       (c->n_head_kv * c->head_dim) % PD_R16_ROWS == 0;
    m->repacked = calloc((size_t)n_slots, sizeof(void *));
    m->repacked_slot = calloc((size_t)n_slots, sizeof(int));
    if (!m->repacked || !m->repacked_slot) return PD_ENOMEM;
    if (c->no_repack) return PD_OK;
    for (int i = 0; i < n_slots; i++) {
        const int slot = i < PD_GLOBAL_SLOTS ? i : (i - PD_GLOBAL_SLOTS) % PD_LAYER_SLOTS;
        const int eligible = i < PD_GLOBAL_SLOTS ? slot == PD_OUTPUT
            : slot == PD_WO || slot == PD_GATE || slot == PD_UP || slot == PD_DOWN ||
              (qkv_ok && (slot == PD_WQ || slot == PD_WK || slot == PD_WV));
        pd_tensor *t = i < PD_GLOBAL_SLOTS ? &m->g[i] : &m->lt[i - PD_GLOBAL_SLOTS];
        if (!eligible) continue;
        if (i == PD_OUTPUT && !t->data) {             /* tied head: a repacked copy of its own */
            pd_tensor head = m->g[PD_TOK_EMBD];
            const int rc = repack_one(m, &head, i);
            if (rc < 0) return PD_ENOMEM;
            if (rc) *t = head;
        } else if (t->data && repack_one(m, t, i) < 0) {
            return PD_ENOMEM;
        }
    }
    return PD_OK;
}

pd_model *pd_model_new(const pd_config *cfg, const pd_tensor *tensors, int n_tensors,
                       const char *isa, char *err, int err_len) {
    const pd_kernels *K = pd_kernels_select(isa);
    if (!K) { set_err(err, err_len, "instruction set '%s' is unknown or not supported by this CPU/build", isa ? isa : "(env PYDECODE_ISA)"); return NULL; }
    if (validate(cfg, K, tensors, n_tensors, err, err_len)) return NULL;
    pd_model *m = calloc(1, sizeof *m);
    if (!m) { set_err(err, err_len, "out of memory"); return NULL; }
    m->c = *cfg;
    m->k = K;
    if (m->c.rope_dim == 0) m->c.rope_dim = m->c.head_dim;
    if (m->c.n_threads < 1) m->c.n_threads = 1;
    if (m->c.n_seq < 1) m->c.n_seq = 1;
    memcpy(m->g, tensors, sizeof m->g);
    size_t nl = (size_t)cfg->n_layer * PD_LAYER_SLOTS;
    m->lt = malloc(nl * sizeof(pd_tensor));
    int nb = cfg->n_batch, d = cfg->n_embd, qd = cfg->n_head * cfg->head_dim;
    int kvd = cfg->n_head_kv * cfg->head_dim;
    m->max_in = (size_t)(d > qd ? d : qd);
    if ((size_t)cfg->n_ff > m->max_in) m->max_in = cfg->n_ff;
    m->xq_stride = m->max_in / PD_QK;
    m->xqk_stride = m->max_in / PD_QKK + 1;
    for (int i = 0; i < n_tensors; i++) {
        if (!tensors[i].data) continue;
        int f = pd_type_act_format(tensors[i].type);
        m->need_q8 |= f == PD_ACT_Q8;
        m->need_q8k |= f == PD_ACT_Q8K;
    }
    m->kv_elem = cfg->kv_f16 ? 2 : 4;
    m->kc = calloc((size_t)cfg->n_layer, sizeof(void *));
    m->vc = calloc((size_t)cfg->n_layer, sizeof(void *));
    m->kv_cap = calloc((size_t)cfg->n_layer, sizeof(int));
    int ok = m->lt && m->kc && m->vc && m->kv_cap;
    for (int l = 0; ok && l < cfg->n_layer; l++) {
        int cap = cfg->n_ctx;
        if (layer_is_local(cfg, l) && cfg->sliding_window + nb < cap) cap = cfg->sliding_window + nb;
        m->kv_cap[l] = cap;
        size_t bytes = (size_t)m->c.n_seq * cap * kvd * m->kv_elem;
        m->kc[l] = calloc(1, bytes);  /* calloc: untouched positions cost no RAM */
        m->vc[l] = calloc(1, bytes);
        ok = m->kc[l] && m->vc[l];
        m->kv_bytes += 2 * bytes;
    }
    if (ok) {
        memcpy(m->lt, tensors + PD_GLOBAL_SLOTS, nl * sizeof(pd_tensor));
        m->x = malloc((size_t)nb * d * sizeof(float));
        m->xn = malloc((size_t)nb * m->max_in * sizeof(float));
        m->xq = malloc((size_t)nb * m->xq_stride * sizeof(pd_q8));
        m->xqk = malloc((size_t)nb * m->xqk_stride * sizeof(pd_q8k));
        m->q = malloc((size_t)nb * qd * sizeof(float));
        m->kk = malloc((size_t)nb * kvd * sizeof(float));
        m->vv = malloc((size_t)nb * kvd * sizeof(float));
        m->att = malloc((size_t)nb * qd * sizeof(float));
        m->gate = malloc((size_t)nb * cfg->n_ff * sizeof(float));
        m->up = malloc((size_t)nb * cfg->n_ff * sizeof(float));
        m->tmp = malloc((size_t)nb * d * sizeof(float));
        m->scores = malloc((size_t)m->c.n_threads * cfg->n_ctx * sizeof(float));
        m->rope_cs = malloc((size_t)nb * 2 * (m->c.rope_dim > 0 ? m->c.rope_dim : 2) * sizeof(float));
        m->n_phases = 4 + 12 * cfg->n_layer;
        m->phases = aligned_alloc(64, (size_t)m->n_phases * sizeof(pd_phase));
        m->step = calloc(1, sizeof(step_ctx));
        m->pos = malloc((size_t)nb * sizeof(int32_t));
        m->seq = malloc((size_t)nb * sizeof(int32_t));
        m->out_idx = malloc((size_t)nb * sizeof(int32_t));
        m->seq_next = malloc((size_t)m->c.n_seq * sizeof(int32_t));
        m->pool = pd_pool_new(m->c.n_threads);
        ok = m->x && m->xn && m->xq && m->xqk && m->q && m->kk && m->vv && m->att && m->gate && m->up &&
             m->tmp && m->scores && m->rope_cs && m->phases && m->step && m->pool &&
             m->pos && m->seq && m->out_idx && m->seq_next;
    }
    if (ok && repack_weights(m)) {
        set_err(err, err_len, "out of memory repacking the weights (%zu bytes so far; no_repack avoids it)",
                m->repacked_bytes);
        pd_model_free(m);
        return NULL;
    }
    if (!ok) {
        set_err(err, err_len, "out of memory allocating the KV cache (%zu bytes) and scratch", m->kv_bytes);
        pd_model_free(m);
        return NULL;
    }
    m->c.n_threads = pd_pool_size(m->pool);
    return m;
}

const char *pd_model_error(const pd_model *m) { return m ? m->err : "no model"; }
const char *pd_model_isa(const pd_model *m) { return m ? m->k->name : ""; }
size_t pd_model_kv_bytes(const pd_model *m) { return m ? m->kv_bytes : 0; }
int pd_model_kv_cap(const pd_model *m, int layer) {
    return m && layer >= 0 && layer < m->c.n_layer ? m->kv_cap[layer] : -1;
}
int pd_model_kv_elem_bytes(const pd_model *m) { return m ? (int)m->kv_elem : 0; }
int pd_model_n_seq(const pd_model *m) { return m ? m->c.n_seq : 0; }

/* More sequence slots: each layer's cache [n_seq][cap][kvd] grows at its end, so the slots it
 * had keep their contents in place (realloc; the new slots' rows are written before any read).
 * Not during a step. On failure the model is unchanged for use (some layers may have room to
 * spare) and the error says so. */
int pd_model_grow_seq(pd_model *m, int n_seq) {
    if (!m) return PD_EINVAL;
    if (n_seq <= m->c.n_seq) return PD_OK;
    const size_t kvd = (size_t)m->c.n_head_kv * m->c.head_dim;
    int32_t *next = realloc(m->seq_next, (size_t)n_seq * sizeof(int32_t));
    if (!next) return set_err(m->err, sizeof m->err, "out of memory growing to %d sequence slots", n_seq);
    m->seq_next = next;
    for (int l = 0; l < m->c.n_layer; l++) {
        size_t bytes = (size_t)n_seq * m->kv_cap[l] * kvd * m->kv_elem;
        void *k = realloc(m->kc[l], bytes);
        if (!k) return set_err(m->err, sizeof m->err, "out of memory growing the KV cache to %d slots", n_seq);
        m->kc[l] = k;
        void *v = realloc(m->vc[l], bytes);
        if (!v) return set_err(m->err, sizeof m->err, "out of memory growing the KV cache to %d slots", n_seq);
        m->vc[l] = v;
    }
    size_t total = 0;
    for (int l = 0; l < m->c.n_layer; l++) total += 2 * (size_t)n_seq * m->kv_cap[l] * kvd * m->kv_elem;
    m->kv_bytes = total;
    m->c.n_seq = n_seq;
    return PD_OK;
}
int pd_model_set_summary(pd_model *m, float inv_t) {
    if (!m) return PD_EINVAL;
    if (!(inv_t >= 0.0f) || isinf(inv_t)) return set_err(m->err, sizeof m->err, "summary inv_t must be finite and >= 0");
    if (inv_t > 0 && !m->summ) {
        const int ch = chunk_rows(m->c.n_vocab);
        if (ch > PD_SUMM_CHUNK) return set_err(m->err, sizeof m->err, "head chunks exceed the summary's");
        m->summ_chunks = N_CHUNKS(m->c.n_vocab, ch);
        m->summ = aligned_alloc(64, ((size_t)m->c.n_threads * sizeof(pd_summ_list) + 63) / 64 * 64);
        m->summ_cmax = malloc((size_t)m->summ_chunks * sizeof(float));
        m->summ_csum = malloc((size_t)m->summ_chunks * sizeof(double));
        if (!m->summ || !m->summ_cmax || !m->summ_csum) {
            free(m->summ); free(m->summ_cmax); free(m->summ_csum);
            m->summ = NULL; m->summ_cmax = NULL; m->summ_csum = NULL;
            set_err(m->err, sizeof m->err, "out of memory for the sampling summary");
            return PD_ENOMEM;
        }
    }
    m->summ_inv_t = inv_t;
    m->summ_ready = 0;
    return PD_OK;
}

int pd_model_sample(pd_model *m, int top_k, double top_p, double min_p, double u01) {
    if (!m || !m->summ_ready) return -2;
    return pd_summ_sample(m->summ, m->c.n_threads, m->summ_cmax, m->summ_csum, m->summ_chunks, m->c.n_vocab,
                          top_k, m->summ_inv_t, top_p, min_p, u01);
}

int pd_model_n_repacked(const pd_model *m) { return m ? m->n_repacked : 0; }
size_t pd_model_repacked_bytes(const pd_model *m) { return m ? m->repacked_bytes : 0; }
int pd_model_repacked_slot(const pd_model *m, int i) {
    return m && i >= 0 && i < m->n_repacked ? m->repacked_slot[i] : -1;
}
