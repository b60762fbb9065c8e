/* The mixture-of-experts FFN: one implementation for every MoE architecture, parameterized by
 * pd_config (n_expert, n_expert_used, n_ff_exp, expert_gating, expert_norm, expert_scale).
 *
 * What it computes, per token x (the FFN-normed residual), as llama.cpp's build_moe_ffn and
 * Hugging Face's modeling_qwen3_moe (Qwen3MoeSparseMoeBlock) define it:
 *     logits = W_router x                          [n_expert]   (ffn_gate_inp, usually F32)
 *     S      = the k largest logits (k = n_expert_used; a tie keeps the lower expert id)
 *     w_j    = gating(logits)_j for j in S          (PD_GATING_*, pydecode.h)
 *     w_j   /= sum_S w                              (expert_norm; qwen3moe: always, as llama.cpp's
 *                                                    llm_build_qwen3moe passes norm_w = true and
 *                                                    HF normalizes when norm_topk_prob, true in
 *                                                    every Qwen3-MoE config)
 *     w_j   *= expert_scale                         (where the architecture has one)
 *     out    = sum_j w_j Wdown_j (silu(Wgate_j x) * (Wup_j x))
 *            + sigmoid(g_sh . x) Wdown_sh (silu(Wgate_sh x) * (Wup_sh x))   (a shared expert, where
 *                                                    n_ff_shexp > 0: qwen2moe, llm_build_qwen2moe /
 *                                                    HF Qwen2MoeSparseMoeBlock; no g_sh: weight 1)
 * gpt-oss adds biases (the router's to its logits, each expert's to its gate, up and down
 * outputs: PD_*_B) and its own activation, a clamped SwiGLU (PD_EXPERT_ACT_SWIGLU_OAI:
 * swiglu_oai below); its gating is the softmax over the k chosen logits, not renormalized.
 * Qwen3-MoE is softmax over all 128 logits, top 8, renormalized: llama.cpp ranks the softmax
 * probabilities and HF torch.topk of them, the same order as the logits' (softmax is monotonic).
 *
 * How (core/moe.h): per step the tokens are routed in one chunk (cheap: n x n_expert), the
 * (token, expert) pairs numbered expert by expert, and each chosen expert then runs as one
 * matmul whose columns are its tokens, so its weights are streamed once per step (a decode
 * reads only its k experts). A batch gathers each pair's quantized input row into a contiguous
 * run per expert first; a one-token step reads the token's own row. Work is split in chunks of
 * (expert, rows) for gate/up and for down (the shared expert's chunks join each phase), then a
 * last phase adds each token's weighted pairs into the residual stream, in the token's order of
 * j, then the shared expert's: each value is computed the same way whatever the chunks, the
 * thread count or the other tokens of the step (the kernels compute every row and column alike
 * in any tile), so decode, batch and prefill of a token give the same bits.
 */
#include "core/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- config and scratch (load.c calls these) ---------------- */

int pd_moe_check_config(const pd_config *c, char *err, int len) {
    if (!c->n_expert && !c->n_expert_used && !c->n_ff_exp) return PD_OK;
    if (c->n_expert < 1 || c->n_expert > PD_MAX_EXPERTS)
        return pd_set_err(err, len, "expert count %d outside 1..%d", c->n_expert, PD_MAX_EXPERTS);
    if (c->n_expert_used < 1 || c->n_expert_used > c->n_expert)
        return pd_set_err(err, len, "experts used per token %d outside 1..%d (the expert count)",
                          c->n_expert_used, c->n_expert);
    if (c->n_ff_exp < 1 || c->n_ff_exp % PD_QK)
        return pd_set_err(err, len, "expert FFN width %d must be a positive multiple of %d", c->n_ff_exp, PD_QK);
    if (c->expert_gating < PD_GATING_SOFTMAX || c->expert_gating > PD_GATING_SOFTMAX_WEIGHT)
        return pd_set_err(err, len, "unknown expert gating function %d", c->expert_gating);
    if (c->expert_act != PD_EXPERT_ACT_MODEL && c->expert_act != PD_EXPERT_ACT_SWIGLU_OAI)
        return pd_set_err(err, len, "unknown expert activation %d", c->expert_act);
    if (!(c->expert_scale >= 0) || !isfinite(c->expert_scale))
        return pd_set_err(err, len, "expert weights scale %g must be finite and >= 0", c->expert_scale);
    if (c->n_ff_shexp < 0 || c->n_ff_shexp % PD_QK)
        return pd_set_err(err, len, "shared expert FFN width %d must be a multiple of %d", c->n_ff_shexp, PD_QK);
    return PD_OK;
}

/* The scratch's pieces in one place, for the size (before a load) and the carving (at load). */
#define MOE_ALIGN 64
static size_t moe_layout(const pd_config *c, pd_moe *e, char *base) {
    const size_t nb = (size_t)c->n_batch, k = (size_t)c->n_expert_used, P = nb * k, ne = (size_t)c->n_expert;
    const size_t d = (size_t)c->n_embd, nf = (size_t)c->n_ff_exp, in = d > nf ? d : nf;
    size_t off = 0;
#define PIECE(field, bytes) do { if (base) e->field = (void *)(base + off); \
                                 off += ((bytes) + MOE_ALIGN - 1) / MOE_ALIGN * MOE_ALIGN; } while (0)
    PIECE(logits, nb * ne * sizeof(float));
    PIECE(sel, P * sizeof(int32_t));
    PIECE(wt, P * sizeof(float));
    PIECE(pair, P * sizeof(int32_t));
    PIECE(tok, P * sizeof(int32_t));
    PIECE(start, (ne + 1) * sizeof(int32_t));
    PIECE(cursor, ne * sizeof(int32_t));
    PIECE(active, ne * sizeof(int32_t));
    PIECE(n_active, (size_t)c->n_layer * sizeof(int32_t));
    PIECE(xf, P * in * sizeof(float));
    PIECE(xq, P * (in / PD_QK) * sizeof(pd_q8));
    PIECE(xqk, P * (in / PD_QKK + 1) * sizeof(pd_q8k));
    PIECE(g, P * nf * sizeof(float));
    PIECE(u, P * nf * sizeof(float));
    PIECE(y, P * d * sizeof(float));
    const size_t ns = (size_t)(c->n_ff_shexp > 0 ? c->n_ff_shexp : 0);
    PIECE(sg, nb * ns * sizeof(float));
    PIECE(su, nb * ns * sizeof(float));
    PIECE(sxq, nb * (ns / PD_QK) * sizeof(pd_q8));
    PIECE(sxqk, nb * (ns / PD_QKK + 1) * sizeof(pd_q8k));
    PIECE(sy, nb * d * sizeof(float));
    PIECE(sgate, nb * sizeof(float));
#undef PIECE
    if (base) e->in_stride = in;
    return off;
}

size_t pd_moe_scratch_bytes(const pd_config *c) {
    char err[8];   /* a hostile count must not wrap the size around (the load refuses it anyway) */
    if (!c || c->n_expert < 1 || c->n_batch < 1 || c->n_layer < 1 || pd_moe_check_config(c, err, sizeof err)) return 0;
    return moe_layout(c, NULL, NULL);
}

int pd_moe_alloc(pd_model *m) {
    const size_t bytes = pd_moe_scratch_bytes(&m->c);
    if (!bytes) return 0;
    m->moe.block = aligned_alloc(MOE_ALIGN, bytes);
    if (!m->moe.block) return -1;
    m->moe.bytes = bytes;
    moe_layout(&m->c, &m->moe, m->moe.block);
    return 0;
}

void pd_moe_free(pd_model *m) { free(m->moe.block); m->moe.block = NULL; }

/* ---------------- routing ---------------- */

/* Token t's k experts (largest logit first; a NaN logit never outranks a number) and weights. */
static void route_token(const pd_config *c, const float *logit, int32_t *sel, float *wt) {
    const int n = c->n_expert, k = c->n_expert_used;
    int have = 0;
    for (int e = 0; e < n; e++) {
        const float v = logit[e];
        if (have == k && !(v > logit[sel[k - 1]])) continue;
        int j = have < k ? have++ : k - 1;
        for (; j > 0 && v > logit[sel[j - 1]]; j--) sel[j] = sel[j - 1];
        sel[j] = e;
    }
    double p[PD_MAX_EXPERTS], sum = 0.0;
    if (c->expert_gating == PD_GATING_SOFTMAX) {   /* softmax over all n, then the chosen ones */
        double mx = -INFINITY, z = 0.0;
        for (int e = 0; e < n; e++) if (logit[e] > mx) mx = logit[e];
        for (int e = 0; e < n; e++) z += isnan(logit[e]) ? 0.0 : exp((double)logit[e] - mx);
        for (int j = 0; j < k; j++) p[j] = exp((double)logit[sel[j]] - mx) / z;
    } else if (c->expert_gating == PD_GATING_SIGMOID) {
        for (int j = 0; j < k; j++) p[j] = 1.0 / (1.0 + exp(-(double)logit[sel[j]]));
    } else {                                       /* softmax over the k chosen (gpt-oss) */
        double z = 0.0;
        for (int j = 0; j < k; j++) z += p[j] = exp((double)logit[sel[j]] - logit[sel[0]]);
        for (int j = 0; j < k; j++) p[j] /= z;
    }
    for (int j = 0; j < k; j++) sum += p[j];
    /* llama.cpp clamps the sum below at 2^-14 before dividing (a tiny sigmoid sum): the same here */
    const double norm = c->expert_norm ? 1.0 / (sum > 6.103515625e-5 ? sum : 6.103515625e-5) : 1.0;
    const double scale = c->expert_scale > 0 ? c->expert_scale : 1.0;
    for (int j = 0; j < k; j++) wt[j] = (float)(p[j] * norm * scale);
}

/* Every token's route (the router's bias added to its logits first, where it has one), then the
 * pairs numbered expert by expert (tokens in order within one). */
static void route_step(pd_model *m, int n, int l) {
    const pd_config *c = &m->c;
    pd_moe *e = &m->moe;
    const int ne = c->n_expert, k = c->n_expert_used;
    const float *bias = (const float *)pd_layer_tensor(m, l, PD_GATE_INP_B)->data;
    for (int t = 0; t < n; t++) {
        float *logit = e->logits + (size_t)t * ne;
        if (bias) for (int x = 0; x < ne; x++) logit[x] += bias[x];
        route_token(c, logit, e->sel + (size_t)t * k, e->wt + (size_t)t * k);
    }
    memset(e->start, 0, (size_t)(ne + 1) * sizeof(int32_t));
    for (int i = 0; i < n * k; i++) e->start[e->sel[i] + 1]++;
    int na = 0;
    for (int x = 0; x < ne; x++) {
        if (e->start[x + 1]) e->active[na++] = x;
        e->start[x + 1] += e->start[x];
        e->cursor[x] = e->start[x];
    }
    e->n_active[l] = na;
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            const int p = e->cursor[e->sel[t * k + j]]++;
            e->tok[p] = t;
            e->pair[t * k + j] = p;
        }
}

/* ---------------- matrix work ---------------- */

/* The activation rows a matmul over type `type` reads: the step's token rows (xn / xq / xqk, from
 * token t0), or the gathered pair rows (from pair p0). */
static const void *token_rows(const pd_model *m, int type, int t0, size_t *stride) {
    switch (pd_type_act_format(type)) {
    case PD_ACT_Q8: *stride = m->xq_stride * sizeof(pd_q8); return m->xq + (size_t)t0 * m->xq_stride;
    case PD_ACT_Q8K: *stride = m->xqk_stride * sizeof(pd_q8k); return m->xqk + (size_t)t0 * m->xqk_stride;
    default: *stride = m->max_in * sizeof(float); return m->xn + (size_t)t0 * m->max_in;
    }
}
static const void *pair_rows(const pd_moe *e, int type, int p0, size_t *stride) {
    const size_t in = e->in_stride;
    switch (pd_type_act_format(type)) {
    case PD_ACT_Q8: *stride = in / PD_QK * sizeof(pd_q8); return e->xq + (size_t)p0 * (in / PD_QK);
    case PD_ACT_Q8K: *stride = (in / PD_QKK + 1) * sizeof(pd_q8k); return e->xqk + (size_t)p0 * (in / PD_QKK + 1);
    default: *stride = in * sizeof(float); return e->xf + (size_t)p0 * in;
    }
}

/* out[col][r0..r1) = rows row0 + r0 .. row0 + r1 of w times ncols input columns x. */
static void matmul_block(const pd_model *m, const pd_tensor *w, int64_t row0, int r0, int r1,
                         const void *x, size_t xs, int ncols, float *out, size_t out_stride) {
    if (r1 <= r0 || ncols < 1) return;
    m->kt->matmul[w->type]((int)w->ne0, (const char *)w->data + (size_t)(row0 + r0) * w->row_bytes, w->row_bytes,
                           r1 - r0, x, xs, ncols, out + r0, out_stride);
}

/* Rows per chunk over `rows` rows of `bytes` weight bytes each when chunks must not cross a block
 * of `limit` rows: about PD_CHUNKS_PER_THREAD per thread of `total` rows in all, whole row groups
 * (ROW_ALIGN), at least PD_CHUNK_MIN_BYTES of weights, at most the block. */
static int chunk_rows(int64_t total, size_t bytes, int nth, int limit) {
    const int64_t want = (int64_t)(nth > 0 ? nth : 1) * PD_CHUNKS_PER_THREAD;
    int64_t c = (total / want + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
    const int64_t min_rows = bytes ? ((int64_t)PD_CHUNK_MIN_BYTES + (int64_t)bytes - 1) / (int64_t)bytes : 0;
    if (c < min_rows) c = (min_rows + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
    if (c < ROW_ALIGN) c = ROW_ALIGN;
    return c > limit ? limit : (int)c;
}

/* gpt-oss's activation, in place (llama.cpp's swiglu_oai: alpha 1.702, limit 7): with x = min(g, 7)
 * and y = clamp(u, -7, 7), g = x * sigmoid(1.702 x) * (y + 1). Plain C: n_ff_exp values per pair,
 * small beside the pair's matmuls. */
static void swiglu_oai(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) {
        const float x = g[i] < 7.0f ? g[i] : 7.0f, y = u[i] < -7.0f ? -7.0f : (u[i] > 7.0f ? 7.0f : u[i]);
        g[i] = x / (1.0f + expf(-1.702f * x)) * (y + 1.0f);
    }
}

/* ---------------- the FFN, all threads ---------------- */

int pd_moe_ffn(pd_worker *w, step_ctx *s, int l) {
    pd_model *m = s->m;
    const pd_config *c = &m->c;
    pd_moe *e = &m->moe;
    const int n = s->n, d = c->n_embd, ne = c->n_expert, k = c->n_expert_used, nf = c->n_ff_exp;
    const pd_tensor *router = pd_layer_tensor(m, l, PD_GATE_INP), *gate = pd_layer_tensor(m, l, PD_GATE_EXPS),
                    *up = pd_layer_tensor(m, l, PD_UP_EXPS), *down = pd_layer_tensor(m, l, PD_DOWN_EXPS);
    const float *gb = (const float *)pd_layer_tensor(m, l, PD_GATE_EXPS_B)->data,   /* NULL: no biases */
                *ub = (const float *)pd_layer_tensor(m, l, PD_UP_EXPS_B)->data,
                *db = (const float *)pd_layer_tensor(m, l, PD_DOWN_EXPS_B)->data;
    size_t xs;
    const void *x;

    /* 1. router logits of every token (rows: experts) */
    int ch = pd_matmul_chunk_rows(ne, router->row_bytes, w->nth), nc = N_CHUNKS(ne, ch);
    x = token_rows(m, router->type, 0, &xs);
    FOR_CHUNKS(w, nc, ci) {
        const int r0 = ci * ch, r1 = r0 + ch < ne ? r0 + ch : ne;
        matmul_block(m, router, 0, r0, r1, x, xs, n, e->logits, ne);
    }
    END_PHASE(w, nc);

    /* 2. routes and pairs, in one chunk (n x n_expert work: small beside any matmul) */
    FOR_CHUNKS(w, 1, ci) route_step(m, n, l);
    END_PHASE(w, 1);
    const int P = n * k, na = e->n_active[l];

    /* 3. a batch's pair inputs gathered, expert by expert (a one-token step reads its own row) */
    const int fmt_g = pd_type_act_format(gate->type), fmt_u = pd_type_act_format(up->type);
    if (n > 1) {
        const size_t in = e->in_stride;
        FOR_CHUNKS(w, P, p) {
            const int t = e->tok[p];
            if (fmt_g == PD_ACT_Q8 || fmt_u == PD_ACT_Q8)
                memcpy(e->xq + (size_t)p * (in / PD_QK), m->xq + (size_t)t * m->xq_stride, (size_t)d / PD_QK * sizeof(pd_q8));
            if (fmt_g == PD_ACT_Q8K || fmt_u == PD_ACT_Q8K)
                memcpy(e->xqk + (size_t)p * (in / PD_QKK + 1), m->xqk + (size_t)t * m->xqk_stride,
                       (size_t)d / PD_QKK * sizeof(pd_q8k));
            if (fmt_g == PD_ACT_F32 || fmt_u == PD_ACT_F32)
                memcpy(e->xf + (size_t)p * in, m->xn + (size_t)t * m->max_in, (size_t)d * sizeof(float));
        }
        END_PHASE(w, P);
    }

    /* 4. gate and up of each chosen expert over its tokens, in chunks of (expert, rows); the
     *    activation fused (same rows) */
    const pd_tensor *sgw = pd_layer_tensor(m, l, PD_GATE_SHEXP), *suw = pd_layer_tensor(m, l, PD_UP_SHEXP),
                    *sdw = pd_layer_tensor(m, l, PD_DOWN_SHEXP), *sgi = pd_layer_tensor(m, l, PD_GATE_INP_SHEXP);
    const int ns = sgw->data ? c->n_ff_shexp : 0;
    ch = chunk_rows((int64_t)na * nf, gate->row_bytes + up->row_bytes, w->nth, nf);
    const int per_expert = N_CHUNKS(nf, ch);
    const int sch = ns ? pd_matmul_chunk_rows(ns, sgw->row_bytes + suw->row_bytes, w->nth) : 1;
    nc = na * per_expert + (ns ? N_CHUNKS(ns, sch) : 0);
    FOR_CHUNKS(w, nc, ci) {
        if (ci >= na * per_expert) {   /* the shared expert: every token, rows of its width */
            const int r0 = (ci - na * per_expert) * sch, r1 = r0 + sch < ns ? r0 + sch : ns;
            size_t gs, us;
            const void *gx = token_rows(m, sgw->type, 0, &gs), *ux = token_rows(m, suw->type, 0, &us);
            matmul_block(m, sgw, 0, r0, r1, gx, gs, n, e->sg, ns);
            matmul_block(m, suw, 0, r0, r1, ux, us, n, e->su, ns);
            for (int t = 0; t < n; t++)
                m->kt->act_mul(e->sg + (size_t)t * ns + r0, e->su + (size_t)t * ns + r0, r1 - r0, c->act_gelu);
            continue;
        }
        const int ex = e->active[ci / per_expert], r0 = ci % per_expert * ch, r1 = r0 + ch < nf ? r0 + ch : nf;
        const int p0 = e->start[ex], cnt = e->start[ex + 1] - p0;
        size_t gs, us;
        const void *gx = n > 1 ? pair_rows(e, gate->type, p0, &gs) : token_rows(m, gate->type, 0, &gs);
        const void *ux = n > 1 ? pair_rows(e, up->type, p0, &us) : token_rows(m, up->type, 0, &us);
        matmul_block(m, gate, (int64_t)ex * nf, r0, r1, gx, gs, cnt, e->g + (size_t)p0 * nf, nf);
        matmul_block(m, up, (int64_t)ex * nf, r0, r1, ux, us, cnt, e->u + (size_t)p0 * nf, nf);
        for (int p = p0; p < p0 + cnt; p++) {
            float *gp = e->g + (size_t)p * nf + r0, *up_ = e->u + (size_t)p * nf + r0;
            if (gb) for (int r = 0; r < r1 - r0; r++) gp[r] += gb[(size_t)ex * nf + r0 + r];
            if (ub) for (int r = 0; r < r1 - r0; r++) up_[r] += ub[(size_t)ex * nf + r0 + r];
            if (c->expert_act == PD_EXPERT_ACT_SWIGLU_OAI) swiglu_oai(gp, up_, r1 - r0);
            else m->kt->act_mul(gp, up_, r1 - r0, c->act_gelu);
        }
    }
    END_PHASE(w, nc);

    /* 5. each pair's activation quantized for down (a float down reads it as it is); the shared
     *    expert's rows too, and its per-token weight */
    const int fmt_d = pd_type_act_format(down->type), fmt_s = ns ? pd_type_act_format(sdw->type) : PD_ACT_F32;
    if (fmt_d == PD_ACT_Q8 || fmt_d == PD_ACT_Q8K || ns) {
        const size_t in = e->in_stride;
        FOR_CHUNKS(w, P + (ns ? n : 0), p) {
            if (p >= P) {
                const int t = p - P;
                const float *h = e->sg + (size_t)t * ns;
                if (fmt_s == PD_ACT_Q8) m->kt->quantize_q8(h, e->sxq + (size_t)t * (ns / PD_QK), ns);
                else if (fmt_s == PD_ACT_Q8K) m->kt->quantize_q8k(h, e->sxqk + (size_t)t * (ns / PD_QKK + 1), ns);
                double z = 0.0;   /* qwen2moe: sigmoid(shared_expert_gate(x)) scales the shared output */
                const float *xr = m->xn + (size_t)t * m->max_in;
                if (sgi->data) for (int i = 0; i < d; i++) z += (double)((const float *)sgi->data)[i] * xr[i];
                e->sgate[t] = sgi->data ? (float)(1.0 / (1.0 + exp(-z))) : 1.0f;
                continue;
            }
            const float *h = e->g + (size_t)p * nf;
            if (fmt_d == PD_ACT_Q8) m->kt->quantize_q8(h, e->xq + (size_t)p * (in / PD_QK), nf);
            else if (fmt_d == PD_ACT_Q8K) m->kt->quantize_q8k(h, e->xqk + (size_t)p * (in / PD_QKK + 1), nf);
        }
        END_PHASE(w, P + (ns ? n : 0));
    }

    /* 6. down of each chosen expert over its tokens, in chunks of (expert, rows) as gate and up:
     *    each chunk one contiguous run of one expert's rows, so a decode streams k long runs (in
     *    chunks of rows over every expert it read k short pieces per chunk, each a new stream for
     *    the prefetcher); the shared expert's down over every token, in chunks of rows */
    const int dch = chunk_rows((int64_t)na * d, down->row_bytes, w->nth, d), dper = N_CHUNKS(d, dch);
    const int sdch = ns ? pd_matmul_chunk_rows(d, sdw->row_bytes, w->nth) : 1;
    nc = na * dper + (ns ? N_CHUNKS(d, sdch) : 0);
    FOR_CHUNKS(w, nc, ci) {
        if (ci >= na * dper) {
            const int r0 = (ci - na * dper) * sdch, r1 = r0 + sdch < d ? r0 + sdch : d;
            if (fmt_s == PD_ACT_Q8) { x = e->sxq; xs = ns / PD_QK * sizeof(pd_q8); }
            else if (fmt_s == PD_ACT_Q8K) { x = e->sxqk; xs = (ns / PD_QKK + 1) * sizeof(pd_q8k); }
            else { x = e->sg; xs = (size_t)ns * sizeof(float); }
            matmul_block(m, sdw, 0, r0, r1, x, xs, n, e->sy, d);
            continue;
        }
        const int ex = e->active[ci / dper], r0 = ci % dper * dch, r1 = r0 + dch < d ? r0 + dch : d;
        const int p0 = e->start[ex], cnt = e->start[ex + 1] - p0;
        if (fmt_d == PD_ACT_F32) { xs = (size_t)nf * sizeof(float); x = e->g + (size_t)p0 * nf; }
        else x = pair_rows(e, down->type, p0, &xs);
        matmul_block(m, down, (int64_t)ex * d, r0, r1, x, xs, cnt, e->y + (size_t)p0 * d, d);
    }
    END_PHASE(w, nc);

    /* 7. each token's k pairs weighted and summed in the order of j (then the shared expert's),
     *    into the residual stream, in chunks of rows (n x k x d adds: one chunk per thread) */
    const int per = (d + (w->nth > 0 ? w->nth : 1) - 1) / (w->nth > 0 ? w->nth : 1);   /* >= 1: d > 0 */
    ch = (per + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
    nc = N_CHUNKS(d, ch);
    FOR_CHUNKS(w, nc, ci) {
        const int r0 = ci * ch, r1 = r0 + ch < d ? r0 + ch : d;
        for (int t = 0; t < n; t++) {
            float *dst = m->x + (size_t)t * d;
            const int32_t *pr = e->pair + (size_t)t * k;
            const float *wt = e->wt + (size_t)t * k;
            const int32_t *sel = e->sel + (size_t)t * k;
            for (int i = r0; i < r1; i++) {
                float acc = 0.0f;
                for (int j = 0; j < k; j++)
                    acc += wt[j] * (e->y[(size_t)pr[j] * d + i] + (db ? db[(size_t)sel[j] * d + i] : 0.0f));
                if (ns) acc += e->sgate[t] * e->sy[(size_t)t * d + i];
                dst[i] += acc;
            }
        }
    }
    END_PHASE(w, nc);
    return 0;
}
