/* The forward pass: one implementation for every architecture, parameterized by pd_config.
 *
 * A step (a prefill chunk, a decode, a batch of both) is one run of the thread pool: every
 * thread runs pd_forward_task(), which walks all layers, sharing each phase's work in chunks
 * (core/threadpool.h) and meeting the others only where a phase needs the one before. Matrix
 * work is split by rows; per-token work (norms, RoPE, attention) by tokens and heads.
 * Everything (KV cache, scratch) is allocated once at load (load.c); a step allocates nothing.
 */
#include "core/model.h"

#include <math.h>
#include <string.h>

/* ---------------- small per-row ops (not the hot path: O(d) per token) ---------------- */

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

/* How a RoPE table scales: pos * freq_scale (linear), YaRN's per-pair mix of that and the
 * unscaled angle (ext > 0, pairs [low, high] ramped), and mscale on cos and sin (LongRoPE's /
 * YaRN's attention factor). */
typedef struct { double freq_scale, ext, low, high, mscale; } rope_scaling;

/* cos/sin of pos * base^(-2i/rope_dim) (divided by the pair's factor: Llama 3's rope_freqs,
 * LongRoPE's short or long factors), scaled as sc says, for the rope_dim/2 pairs: computed once
 * per token and base per step and shared by every head of every layer. YaRN as ggml's
 * rope_yarn: ramp(i) = 1 - clamp((i - low) / max(0.001, high - low), 0, 1), and the angle
 * interp * (1 - ramp * ext) + extrap * ramp * ext. */
static void rope_table(float *cs, int rope_dim, double pos, float base, const float *freq_div, const rope_scaling *sc) {
    for (int i = 0; i < rope_dim / 2; i++) {
        const double extrap = pos * pow(base, -2.0 * i / rope_dim) / (freq_div ? freq_div[i] : 1.0f);
        double theta = extrap * sc->freq_scale;
        if (sc->ext > 0) {
            double y = (i - sc->low) / (sc->high - sc->low > 0.001 ? sc->high - sc->low : 0.001);
            const double mix = (1.0 - (y < 0 ? 0 : y > 1 ? 1 : y)) * sc->ext;
            theta = theta * (1.0 - mix) + extrap * mix;
        }
        cs[2 * i] = (float)(cos(theta) * sc->mscale);
        cs[2 * i + 1] = (float)(sin(theta) * sc->mscale);
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

/* ---------------- matrix work ---------------- */

/* Out[t][r] for rows [r0, r1) of W and the n tokens of the current input (xn/xq). */
void pd_matmul_rows(pd_model *m, const pd_tensor *w, int r0, int r1, int n,
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
    m->kt->matmul[w->type](k, (const char *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes,
                          r1 - r0, x, xs, n, out + r0, out_stride);
}

/* The input of the next matmuls: xn[t] (already written) quantized once into each 8-bit block
 * format the model's weights pair with. */
static void quantize_row(pd_model *m, int t, int n_in) {
    const float *src = m->xn + (size_t)t * m->max_in;
    if (m->need_q8) m->kt->quantize_q8(src, m->xq + (size_t)t * m->xq_stride, n_in);
    if (m->need_q8k && n_in % PD_QKK == 0) m->kt->quantize_q8k(src, m->xqk + (size_t)t * m->xqk_stride, n_in);
}

/* xn[t] = rmsnorm(src[t]) (or a copy), quantized: the input of the next matmuls, one token. */
static void norm_input(pd_model *m, const float *src, size_t src_stride, const pd_tensor *w, int n_in, int t) {
    float *dst = m->xn + (size_t)t * m->max_in;
    if (w) rmsnorm(dst, src + (size_t)t * src_stride, (const float *)w->data, n_in, m->c.norm_eps);
    else memcpy(dst, src + (size_t)t * src_stride, (size_t)n_in * sizeof(float));
    quantize_row(m, t, n_in);
}

/* ---------------- phases: work shared in chunks (threadpool.h) ---------------- */


/* Per-token phase: norm (or copy) + quantize every token's input row. */
int pd_phase_norm(pd_worker *w, pd_model *m, const float *src, size_t stride, const pd_tensor *nw,
                      int n_in, int n) {
    FOR_CHUNKS(w, n, t) norm_input(m, src, stride, nw, n_in, t);
    END_PHASE(w, n);
    return 0;
}

/* Rows [r0, r1) of a block's output (tmp, plus its bias if any) into the residual stream, for
 * every token. */
static void residual_rows(pd_model *m, int n, int r0, int r1, const float *bias) {
    int d = m->c.n_embd;
    for (int t = 0; t < n; t++)
        for (int i = r0; i < r1; i++) m->x[(size_t)t * d + i] += m->tmp[(size_t)t * d + i] + (bias ? bias[i] : 0.0f);
}

/* A matmul whose output goes into the residual stream: x += W @ xn (+ bias), or, with a post-norm
 * (gemma), x += rmsnorm(W @ xn + bias), which needs whole rows and so one more (per-token) phase. */
int pd_phase_residual_matmul(pd_worker *w, pd_model *m, const pd_tensor *wt, const pd_tensor *bias,
                                 const pd_tensor *post_norm, int n) {
    int d = m->c.n_embd, ch = pd_matmul_chunk_rows(d, wt->row_bytes, w->nth), nc = N_CHUNKS(d, ch);
    const float *b = bias ? (const float *)bias->data : NULL;
    FOR_CHUNKS(w, nc, c) {
        int r0 = c * ch, r1 = r0 + ch < d ? r0 + ch : d;
        pd_matmul_rows(m, wt, r0, r1, n, m->tmp, d);
        if (!post_norm->data) residual_rows(m, n, r0, r1, b);
    }
    END_PHASE(w, nc);
    if (!post_norm->data) return 0;
    FOR_CHUNKS(w, n, t) {
        float *y = m->tmp + (size_t)t * d, *x = m->x + (size_t)t * d;
        if (b) for (int i = 0; i < d; i++) y[i] += b[i];
        rmsnorm(y, y, (const float *)post_norm->data, d, m->c.norm_eps);
        for (int i = 0; i < d; i++) x[i] += y[i];
    }
    END_PHASE(w, n);
    return 0;
}

/* ---------------- one layer, all threads ---------------- */

static int ffn_forward(pd_worker *w, step_ctx *s, int l);

static int layer_forward(pd_worker *w, step_ctx *s, int l) {
    pd_model *m = s->m;
    const pd_config *c = &m->c;
    int n = s->n, d = c->n_embd, hd = c->head_dim;
    int qd = c->n_head * hd, kvd = c->n_head_kv * hd;

    /* 1. attention norm -> quantized input; a hybrid's recurrent layer is a gated delta net */
    if (pd_phase_norm(w, m, m->x, d, pd_layer_tensor(m, l, PD_ATTN_NORM), d, n)) return -1;
    if (pd_layer_is_recurrent(c, l)) return pd_deltanet(w, s, l) ? -1 : ffn_forward(w, s, l);

    /* 2. Q, K, V in one phase over the concatenated rows (they share the input); a gated
     *    attention's Q rows hold each head's query then its gate */
    const int gated = c->attn_gated, qrows = gated ? 2 * qd : qd;
    int rows = qrows + 2 * kvd, ch = pd_matmul_chunk_rows(rows, pd_layer_tensor(m, l, PD_WQ)->row_bytes, w->nth), nc = N_CHUNKS(rows, ch);
    FOR_CHUNKS(w, nc, ci) {
        int r0 = ci * ch, r1 = r0 + ch < rows ? r0 + ch : rows;
        const pd_tensor *t[3] = { pd_layer_tensor(m, l, PD_WQ), pd_layer_tensor(m, l, PD_WK), pd_layer_tensor(m, l, PD_WV) };
        float *out[3] = { gated ? m->ssm.qfull : m->q, m->kk, m->vv };
        int base[3] = { 0, qrows, qrows + kvd }, len[3] = { qrows, kvd, kvd };
        for (int j = 0; j < 3; j++) {
            int a = r0 - base[j], b = r1 - base[j];
            a = a < 0 ? 0 : (a > len[j] ? len[j] : a);
            b = b < 0 ? 0 : (b > len[j] ? len[j] : b);
            pd_matmul_rows(m, t[j], a, b, n, out[j], len[j]);
        }
    }
    END_PHASE(w, nc);

    /* 3. biases, per-head Q/K norms, RoPE, then append_kv (per token) */
    int local = pd_layer_is_local(c, l);
    FOR_CHUNKS(w, n, t) {
        const float *cs = m->rope_cs + ((size_t)t * 2 + (local ? 1 : 0)) * c->rope_dim;
        float *q = m->q + (size_t)t * qd, *kk = m->kk + (size_t)t * kvd, *vv = m->vv + (size_t)t * kvd;
        if (gated)   /* per head [query | gate] -> the queries, and the gates for step 5 */
            for (int h = 0; h < c->n_head; h++) {
                const float *src = m->ssm.qfull + (size_t)t * 2 * qd + (size_t)h * 2 * hd;
                memcpy(q + h * hd, src, (size_t)hd * sizeof(float));
                memcpy(m->ssm.qgate + (size_t)t * qd + h * hd, src + hd, (size_t)hd * sizeof(float));
            }
        const pd_tensor *bq = pd_layer_tensor(m, l, PD_BQ), *bk = pd_layer_tensor(m, l, PD_BK), *bv = pd_layer_tensor(m, l, PD_BV);
        if (bq->data) for (int i = 0; i < qd; i++) q[i] += ((const float *)bq->data)[i];
        if (bk->data) for (int i = 0; i < kvd; i++) kk[i] += ((const float *)bk->data)[i];
        if (bv->data) for (int i = 0; i < kvd; i++) vv[i] += ((const float *)bv->data)[i];
        const pd_tensor *qn = pd_layer_tensor(m, l, PD_Q_NORM), *kn = pd_layer_tensor(m, l, PD_K_NORM);
        for (int h = 0; h < c->n_head; h++) {
            if (qn->data) rmsnorm(q + h * hd, q + h * hd, (const float *)qn->data, hd, c->norm_eps);
            rope(q + h * hd, c->rope_dim, c->rope_neox, cs);
            pd_attn_query(m, t, h, q + h * hd);   /* a Q8_0 cache's integer scores need it quantized */
        }
        for (int h = 0; h < c->n_head_kv; h++) {
            if (kn->data) rmsnorm(kk + h * hd, kk + h * hd, (const float *)kn->data, hd, c->norm_eps);
            rope(kk + h * hd, c->rope_dim, c->rope_neox, cs);
        }
        pd_append_kv(m, l, s->seq[t], s->pos[t], kk, vv);
    }
    END_PHASE(w, n);

    /* 4. attention over the cached positions (core/attention.c) */
    if (pd_attention(w, s, l)) return -1;

    /* 5. (the output gate, sigmoid) then the output projection (+ post-attention norm) into the
     *    residual stream */
    if (gated) {
        FOR_CHUNKS(w, n, t) {
            float *a = m->att + (size_t)t * qd;
            const float *g = m->ssm.qgate + (size_t)t * qd;
            for (int i = 0; i < qd; i++) a[i] /= 1.0f + expf(-g[i]);
            norm_input(m, m->att, qd, NULL, qd, t);
        }
        END_PHASE(w, n);
    } else if (pd_phase_norm(w, m, m->att, qd, NULL, qd, n)) {
        return -1;
    }
    if (pd_phase_residual_matmul(w, m, pd_layer_tensor(m, l, PD_WO), pd_layer_tensor(m, l, PD_BO),
                              pd_layer_tensor(m, l, PD_POST_ATTN_NORM), n)) return -1;
    return ffn_forward(w, s, l);
}

/* A layer's FFN: norm; a mixture of experts (core/moe.c), or gate and up in one phase (same rows
 * -> the activation is fused), then down. */
static int ffn_forward(pd_worker *w, step_ctx *s, int l) {
    pd_model *m = s->m;
    const pd_config *c = &m->c;
    int n = s->n, d = c->n_embd, nff = c->n_ff, ch, nc;
    if (pd_phase_norm(w, m, m->x, d, pd_layer_tensor(m, l, PD_FFN_NORM), d, n)) return -1;
    if (pd_layer_is_moe(m, l)) return pd_moe_ffn(w, s, l);
    ch = pd_matmul_chunk_rows(nff, pd_layer_tensor(m, l, PD_GATE)->row_bytes + pd_layer_tensor(m, l, PD_UP)->row_bytes, w->nth);
    nc = N_CHUNKS(nff, ch);
    FOR_CHUNKS(w, nc, ci) {
        int r0 = ci * ch, r1 = r0 + ch < nff ? r0 + ch : nff;
        pd_matmul_rows(m, pd_layer_tensor(m, l, PD_GATE), r0, r1, n, m->gate, nff);
        pd_matmul_rows(m, pd_layer_tensor(m, l, PD_UP), r0, r1, n, m->up, nff);
        for (int t = 0; t < n; t++) {
            float *g = m->gate + (size_t)t * nff, *u = m->up + (size_t)t * nff;
            m->kt->act_mul(g + r0, u + r0, r1 - r0, c->act_gelu);
        }
    }
    END_PHASE(w, nc);
    if (pd_phase_norm(w, m, m->gate, nff, NULL, nff, n)) return -1;
    return pd_phase_residual_matmul(w, m, pd_layer_tensor(m, l, PD_DOWN), NULL, pd_layer_tensor(m, l, PD_POST_FFN_NORM), n);
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
        const rope_scaling global = { c->rope_freq_scale > 0 ? c->rope_freq_scale : 1.0, c->rope_yarn_ext,
                                      c->rope_yarn_low, c->rope_yarn_high,
                                      c->rope_attn_factor > 0 ? c->rope_attn_factor : 1.0 }, none = { 1, 0, 0, 0, 1 };
        rope_table(cs, c->rope_dim, s->pos[t], c->rope_base, (const float *)m->g[PD_ROPE_FREQS].data, &global);
        if (c->rope_base_local > 0)   /* gemma3's local layers: their own base, unscaled */
            rope_table(cs + c->rope_dim, c->rope_dim, s->pos[t], c->rope_base_local, NULL, &none);
        else                          /* the others' (gpt-oss): the global layers' RoPE */
            memcpy(cs + c->rope_dim, cs, (size_t)c->rope_dim * sizeof(float));
    }
    END_PHASE(w, n);

    for (int l = 0; l < c->n_layer; l++)
        if (layer_forward(w, s, l)) return -1;

    /* embeddings: what the head would read (the output norm's result), for every token, and no
     * head: its n_vocab rows are most of a small model's bytes */
    if (s->hidden) {
        FOR_CHUNKS(w, n, t)
            rmsnorm(s->hidden + (size_t)t * d, m->x + (size_t)t * d, (const float *)m->g[PD_OUTPUT_NORM].data,
                    d, c->norm_eps);
        END_PHASE(w, n);
        return 0;
    }

    /* final norm and output head: only the positions whose logits are wanted */
    int n_out = s->n_out;
    if (!s->logits || n_out < 1) return 0;
    FOR_CHUNKS(w, n_out, t) {
        rmsnorm(m->xn + (size_t)t * m->max_in, m->x + (size_t)s->out_idx[t] * d,
                (const float *)m->g[PD_OUTPUT_NORM].data, d, c->norm_eps);
        quantize_row(m, t, d);
    }
    END_PHASE(w, n_out);
    const pd_tensor *out = pd_head(m);
    int ch = pd_chunk_rows(c->n_vocab, out->row_bytes), nc = N_CHUNKS(c->n_vocab, ch);
    FOR_CHUNKS(w, nc, ci) {
        int r0 = ci * ch, r1 = r0 + ch < c->n_vocab ? r0 + ch : c->n_vocab;
        pd_matmul_rows(m, out, r0, r1, n_out, s->logits, c->n_vocab);
        if (s->summ)   /* while this chunk of logits is hot (sampling/summary.h) */
            pd_summ_fold(m->kt, &m->summ[w->ith], s->logits + r0, r0, r1 - r0, m->summ_inv_t, &m->summ_cmax[ci],
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
void pd_forward_task(void *ctx, int ith, int nth) {
    pd_model *m = ((step_ctx *)ctx)->m;
    step_ctx s;
    for (;;) {
        uint32_t v = atomic_load_explicit(&m->step_seq, memory_order_acquire);
        if (v & 1) continue;
        memcpy(&s, (const void *)m->step, sizeof s);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&m->step_seq, memory_order_relaxed) == v) break;
    }
    /* s.nth, not nth: a worker that wakes late may see the pool's thread count of another step
     * than the one its seqlock read gives (the chunk counts would disagree and a phase never end). */
    (void)nth;
    pd_worker w = { m->phases, s.epoch, 0, ith, 0, s.nth };
    forward(&w, &s);
}
