/* The hybrids' gated delta net (Qwen3.5 / Qwen3.6 linear attention; deltanet.h says what it
 * keeps). One layer of a step, for its n tokens in order:
 *
 *   qkv, z, beta, alpha = the input's projections (one phase over the four matrices)
 *   qkv = silu(causal depthwise convolution over time, with the slot's last d_conv - 1 inputs)
 *   per value head j (key head j % n_k), per token:  q, k = l2-normalized, q / sqrt(d)
 *       S = exp(g) S,  g = softplus(alpha + dt) * a         (a = -exp(A_log): a decay in (0, 1))
 *       S += k (beta (v - S^T k))^T                         (beta = sigmoid(beta): the delta rule)
 *       o = rmsnorm(S^T q) * ssm_norm * silu(z)
 *   x += ssm_out @ o
 *
 * The recurrence is sequential over a sequence's tokens, so the work is split across channels
 * (the convolution) and value heads (the delta rule); each thread walks the step's tokens in
 * order, every token on its own slot's state. A token at position 0 starts its slot afresh.
 * The delta rule runs a slot's consecutive tokens as one chunk in matrix form (deltanet_chunk.c:
 * the state read twice per chunk, not per token, by kernel-table products; pd_delta_sequential
 * there is its token-by-token twin). S is kept value-major (row r: value dim r over the d key
 * dims), so S^T k and S^T q are a matmul with S as the weights.
 */
#include "core/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- config, memory ---------------- */

static int n_recurrent(const pd_config *c) {
    int n = 0;
    for (int l = 0; c->recurrent_layers && l < c->n_layer; l++) n += c->recurrent_layers[l] != 0;
    return n;
}

int pd_ssm_check_config(const pd_config *c, char *err, int len) {
    if (!n_recurrent(c)) return PD_OK;
    if (c->ssm_d_conv < 2 || c->ssm_d_conv > 8)
        return pd_set_err(err, len, "ssm.conv_kernel %d outside 2..8", c->ssm_d_conv);
    if (c->ssm_n_k < 1 || c->ssm_n_v < 1 || c->ssm_n_v > 4096 || c->ssm_n_v % c->ssm_n_k)
        return pd_set_err(err, len, "ssm value heads %d must be a multiple of the key heads %d (1..4096)",
                          c->ssm_n_v, c->ssm_n_k);
    if (c->ssm_d_state < PD_QK || c->ssm_d_state > PD_SSM_MAX_STATE || c->ssm_d_state % PD_QK)
        return pd_set_err(err, len, "ssm.state_size %d must be a multiple of %d in %d..%d", c->ssm_d_state, PD_QK,
                          PD_QK, PD_SSM_MAX_STATE);
    return PD_OK;
}

static size_t conv_floats(const pd_config *c) { return (size_t)(c->ssm_d_conv - 1) * pd_ssm_channels(c); }
static size_t state_floats(const pd_config *c) { return (size_t)c->ssm_n_v * c->ssm_d_state * c->ssm_d_state; }

/* The chunked delta rule's scratch, one per thread (deltanet_chunk.c). */
static size_t chunk_floats(const pd_config *c) {
    return (size_t)(c->n_threads > 0 ? c->n_threads : 1) * pd_delta_scratch_floats(c->ssm_d_state);
}

/* Per slot, every recurrent layer: its convolution inputs and its heads' matrices. */
static size_t slot_bytes(const pd_config *c) {
    return (size_t)n_recurrent(c) * (conv_floats(c) + state_floats(c)) * sizeof(float);
}

static size_t scratch_floats(const pd_config *c) {
    const size_t nb = (size_t)c->n_batch, qd = (size_t)c->n_head * c->head_dim;
    size_t f = c->attn_gated ? nb * 3 * qd : 0;
    if (n_recurrent(c))
        f += nb * ((size_t)pd_ssm_channels(c) + 2 * (size_t)pd_ssm_inner(c) + 2 * (size_t)c->ssm_n_v) +
             chunk_floats(c);
    return f;
}

size_t pd_ssm_bytes(const pd_config *c) {
    return (size_t)(c->n_seq > 0 ? c->n_seq : 1) * slot_bytes(c) + scratch_floats(c) * sizeof(float);
}

int pd_ssm_alloc(pd_model *m) {
    pd_ssm *e = &m->ssm;
    const pd_config *c = &m->c;
    const int L = c->n_layer, n_seq = c->n_seq;
    e->n_rec = n_recurrent(c);
    if (c->attn_gated) {
        const size_t nb = (size_t)c->n_batch, qd = (size_t)c->n_head * c->head_dim;
        e->qfull = malloc(nb * 2 * qd * sizeof(float));
        e->qgate = malloc(nb * qd * sizeof(float));
        if (!e->qfull || !e->qgate) return -1;
    }
    if (!e->n_rec) return 0;
    e->layers = malloc((size_t)L);
    e->conv = calloc((size_t)L, sizeof(float *));
    e->state = calloc((size_t)L, sizeof(float *));
    e->pos = calloc((size_t)n_seq, sizeof(int32_t));
    if (!e->layers || !e->conv || !e->state || !e->pos) return -1;
    memcpy(e->layers, c->recurrent_layers, (size_t)L);
    m->c.recurrent_layers = e->layers;
    for (int l = 0; l < L; l++) {
        if (!e->layers[l]) continue;
        e->conv[l] = calloc((size_t)n_seq * conv_floats(c), sizeof(float));
        e->state[l] = calloc((size_t)n_seq * state_floats(c), sizeof(float));   /* calloc: untouched slots cost no RAM */
        if (!e->conv[l] || !e->state[l]) return -1;
    }
    e->state_bytes = (size_t)n_seq * slot_bytes(c);
    const size_t nb = (size_t)c->n_batch;
    e->qkv = malloc(nb * pd_ssm_channels(c) * sizeof(float));
    e->z = malloc(nb * pd_ssm_inner(c) * sizeof(float));
    e->o = malloc(nb * pd_ssm_inner(c) * sizeof(float));
    e->ba = malloc(nb * 2 * c->ssm_n_v * sizeof(float));
    e->chunk = malloc(chunk_floats(c) * sizeof(float));
    return e->qkv && e->z && e->o && e->ba && e->chunk ? 0 : -1;
}

void pd_ssm_free(pd_model *m) {
    pd_ssm *e = &m->ssm;
    for (int l = 0; e->layers && l < m->c.n_layer; l++) {
        if (e->conv) free(e->conv[l]);
        if (e->state) free(e->state[l]);
    }
    free(e->conv); free(e->state); free(e->pos); free(e->layers);
    free(e->qkv); free(e->z); free(e->o); free(e->ba); free(e->chunk); free(e->qfull); free(e->qgate);
    memset(e, 0, sizeof *e);
    m->c.recurrent_layers = NULL;
}

int pd_ssm_grow(pd_model *m, int n_seq) {
    pd_ssm *e = &m->ssm;
    const pd_config *c = &m->c;
    if (!e->n_rec || n_seq <= c->n_seq) return 0;
    int32_t *pos = realloc(e->pos, (size_t)n_seq * sizeof(int32_t));
    if (!pos) return -1;
    e->pos = pos;
    memset(pos + c->n_seq, 0, (size_t)(n_seq - c->n_seq) * sizeof(int32_t));
    for (int l = 0; l < c->n_layer; l++) {
        if (!e->layers[l]) continue;
        const size_t cf = conv_floats(c), sf = state_floats(c);
        float *cv = realloc(e->conv[l], (size_t)n_seq * cf * sizeof(float));
        if (!cv) return -1;
        e->conv[l] = cv;
        float *st = realloc(e->state[l], (size_t)n_seq * sf * sizeof(float));
        if (!st) return -1;
        e->state[l] = st;
        memset(cv + (size_t)c->n_seq * cf, 0, (size_t)(n_seq - c->n_seq) * cf * sizeof(float));
        memset(st + (size_t)c->n_seq * sf, 0, (size_t)(n_seq - c->n_seq) * sf * sizeof(float));
    }
    e->state_bytes = (size_t)n_seq * slot_bytes(c);
    return 0;
}

int pd_model_ssm_pos(const pd_model *m, int seq) {
    if (!m || seq < 0 || seq >= m->c.n_seq) return -1;
    return m->ssm.n_rec ? m->ssm.pos[seq] : 0;
}

size_t pd_model_ssm_bytes(const pd_model *m) { return m ? m->ssm.state_bytes : 0; }

void pd_model_set_delta_sequential(pd_model *m, int on) {
    if (m) m->ssm.sequential = on != 0;
}

size_t pd_ssm_slot_bytes(const pd_model *m) { return m->ssm.n_rec ? slot_bytes(&m->c) : 0; }

void pd_ssm_copy_slot(pd_model *m, int seq, char *buf, int to_state) {
    const pd_config *c = &m->c;
    for (int l = 0; m->ssm.n_rec && l < c->n_layer; l++) {
        if (!m->ssm.layers[l]) continue;
        float *part[2] = { m->ssm.conv[l] + (size_t)seq * conv_floats(c), m->ssm.state[l] + (size_t)seq * state_floats(c) };
        const size_t bytes[2] = { conv_floats(c) * sizeof(float), state_floats(c) * sizeof(float) };
        for (int i = 0; i < 2; i++) {
            if (to_state) memcpy(part[i], buf, bytes[i]);
            else memcpy(buf, part[i], bytes[i]);
            buf += bytes[i];
        }
    }
}

size_t pd_model_ssm_slot_bytes(const pd_model *m) { return m ? pd_ssm_slot_bytes(m) : 0; }

int pd_model_ssm_snapshot(pd_model *m, int seq, void *buf, size_t len, int restore, int pos) {
    if (!m || !buf) return PD_EINVAL;
    if (seq < 0 || seq >= m->c.n_seq)
        return pd_set_err(m->err, sizeof m->err, "sequence slot %d is outside 0..%d", seq, m->c.n_seq - 1);
    if (len != pd_ssm_slot_bytes(m))
        return pd_set_err(m->err, sizeof m->err, "%zu bytes given for a recurrent state of %zu", len, pd_ssm_slot_bytes(m));
    if (restore && (pos < 0 || pos > m->c.n_ctx))
        return pd_set_err(m->err, sizeof m->err, "position %d outside 0..%d", pos, m->c.n_ctx);
    pd_ssm_copy_slot(m, seq, buf, restore);
    if (restore && m->ssm.n_rec) m->ssm.pos[seq] = pos;
    return PD_OK;
}

/* ---------------- a step's positions ---------------- */

int pd_ssm_check_step(pd_model *m, const int32_t *pos, const int32_t *seq, int n) {
    if (!m->ssm.n_rec) return PD_OK;
    for (int s = 0; s < m->c.n_seq; s++) m->seq_next[s] = -1;
    for (int i = 0; i < n; i++) {
        if (m->seq_next[seq[i]] >= 0) continue;   /* not the slot's first token of the step */
        m->seq_next[seq[i]] = pos[i];
        if (pos[i] != 0 && pos[i] != m->ssm.pos[seq[i]])
            return pd_set_err(m->err, sizeof m->err, "sequence %d: the recurrent state holds positions 0..%d, so a "
                              "step must start at %d (or at 0, afresh), not %d", seq[i], m->ssm.pos[seq[i]] - 1,
                              m->ssm.pos[seq[i]], pos[i]);
    }
    return PD_OK;
}

void pd_ssm_advance(pd_model *m, const int32_t *pos, const int32_t *seq, int n) {
    if (!m->ssm.n_rec) return;
    for (int i = 0; i < n; i++) m->ssm.pos[seq[i]] = pos[i] + 1;
}

/* ---------------- the layer ---------------- */

static float silu(float x) { return x / (1.0f + expf(-x)); }
static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* The four projections in one phase: each matrix's rows in chunks of their own (a chunk never
 * spans two tensors, so a repacked tensor is split only between its row groups). */
static int phase_projections(pd_worker *w, step_ctx *s, int l) {
    pd_model *m = s->m;
    const pd_config *c = &m->c;
    const int C = pd_ssm_channels(c), inner = pd_ssm_inner(c), nv = c->ssm_n_v;
    const pd_tensor *t[4] = { pd_layer_tensor(m, l, PD_SSM_QKV), pd_layer_tensor(m, l, PD_SSM_Z),
                              pd_layer_tensor(m, l, PD_SSM_BETA), pd_layer_tensor(m, l, PD_SSM_ALPHA) };
    float *out[4] = { m->ssm.qkv, m->ssm.z, m->ssm.ba, m->ssm.ba + nv };
    const int rows[4] = { C, inner, nv, nv };
    const size_t stride[4] = { (size_t)C, (size_t)inner, 2 * (size_t)nv, 2 * (size_t)nv };
    int ch[4], first[5] = { 0 };
    for (int j = 0; j < 4; j++) {
        ch[j] = pd_matmul_chunk_rows(rows[j], t[j]->row_bytes, w->nth);
        first[j + 1] = first[j] + N_CHUNKS(rows[j], ch[j]);
    }
    FOR_CHUNKS(w, first[4], ci) {
        int j = 0;
        while (ci >= first[j + 1]) j++;
        const int r0 = (ci - first[j]) * ch[j], r1 = r0 + ch[j] < rows[j] ? r0 + ch[j] : rows[j];
        pd_matmul_rows(m, t[j], r0, r1, s->n, out[j], stride[j]);
    }
    END_PHASE(w, first[4]);
    return 0;
}

/* The causal convolution and its silu, in place in qkv, channels in chunks; each slot's last
 * d_conv - 1 inputs shift along ([d_conv - 1][C], oldest first). */
static int phase_conv(pd_worker *w, step_ctx *s, int l) {
    pd_model *m = s->m;
    const pd_config *c = &m->c;
    const int C = pd_ssm_channels(c), K = c->ssm_d_conv, ch = 64, nc = N_CHUNKS(C, ch);
    const float *W = (const float *)pd_layer_tensor(m, l, PD_SSM_CONV)->data;   /* [C][K] */
    float *states = m->ssm.conv[l];
    FOR_CHUNKS(w, nc, ci) {
        const int c0 = ci * ch, c1 = c0 + ch < C ? c0 + ch : C;
        for (int t = 0; t < s->n; t++) {
            float *st = states + (size_t)s->seq[t] * conv_floats(c);
            if (s->pos[t] == 0)
                for (int k = 0; k < K - 1; k++) memset(st + (size_t)k * C + c0, 0, (size_t)(c1 - c0) * sizeof(float));
            float *x = m->ssm.qkv + (size_t)t * C;
            for (int i = c0; i < c1; i++) {
                const float *wi = W + (size_t)i * K;
                float y = x[i] * wi[K - 1];
                for (int k = 0; k < K - 1; k++) y += st[(size_t)k * C + i] * wi[k];
                for (int k = 0; k < K - 2; k++) st[(size_t)k * C + i] = st[(size_t)(k + 1) * C + i];
                st[(size_t)(K - 2) * C + i] = x[i];
                x[i] = silu(y);
            }
        }
    }
    END_PHASE(w, nc);
    return 0;
}

/* x / max(|x|, eps), times scale, into out (ggml_l2_norm). */
static void l2norm(float *out, const float *x, int n, float eps, float scale) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float nrm = (float)sqrt(ss);
    const float r = scale / (nrm > eps ? nrm : eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r;
}

/* The delta rule and the gated norm, one value head per chunk. The step's tokens go in runs
 * (one slot's consecutive positions, PD_DELTA_CHUNK at most) in the step's order, so each
 * state absorbs its tokens in order whatever the batch's interleaving. */
static int phase_delta(pd_worker *w, step_ctx *s, int l) {
    pd_model *m = s->m;
    const pd_config *c = &m->c;
    const int d = c->ssm_d_state, nk = c->ssm_n_k, nv = c->ssm_n_v, C = pd_ssm_channels(c), inner = pd_ssm_inner(c);
    const float *dt = (const float *)pd_layer_tensor(m, l, PD_SSM_DT)->data;
    const float *A = (const float *)pd_layer_tensor(m, l, PD_SSM_A)->data;
    const float *nw = (const float *)pd_layer_tensor(m, l, PD_SSM_NORM)->data;
    const float scale = 1.0f / sqrtf((float)d);
    float *sc = m->ssm.chunk + (size_t)w->ith * pd_delta_scratch_floats(d);
    float beta[PD_DELTA_CHUNK], g[PD_DELTA_CHUNK];
    FOR_CHUNKS(w, nv, j) {
        const int kh = j % nk;
        for (int t0 = 0, t1; t0 < s->n; t0 = t1) {
            const int sq = s->seq[t0];
            for (t1 = t0 + 1; t1 < s->n && t1 - t0 < PD_DELTA_CHUNK && s->seq[t1] == sq && s->pos[t1] == s->pos[t1 - 1] + 1;)
                t1++;
            const int n = t1 - t0;
            float *S = m->ssm.state[l] + (size_t)sq * state_floats(c) + (size_t)j * d * d;
            if (s->pos[t0] == 0) memset(S, 0, (size_t)d * d * sizeof(float));
            for (int t = 0; t < n; t++) {
                const float *x = m->ssm.qkv + (size_t)(t0 + t) * C, *ba = m->ssm.ba + (size_t)(t0 + t) * 2 * nv;
                l2norm(sc + (size_t)t * d, x + (size_t)(nk + kh) * d, d, c->norm_eps, 1.0f);
                l2norm(sc + (size_t)(n + t) * d, x + (size_t)kh * d, d, c->norm_eps, scale);
                beta[t] = sigmoidf(ba[j]);
                g[t] = softplus(ba[nv + j] + dt[j]) * A[j];
            }
            const float *v = m->ssm.qkv + (size_t)t0 * C + (size_t)(2 * nk + j) * d;
            float *o = m->ssm.o + (size_t)t0 * inner + (size_t)j * d;
            if (m->ssm.sequential) pd_delta_sequential(S, d, n, sc, v, C, beta, g, o, inner);
            else pd_delta_chunk(m->kt, S, d, n, v, C, beta, g, o, inner, sc);
            for (int t = 0; t < n; t++) {   /* the gated norm */
                float *ot = o + (size_t)t * inner;
                const float *z = m->ssm.z + (size_t)(t0 + t) * inner + (size_t)j * d;
                double ss = 0.0;
                for (int r = 0; r < d; r++) ss += (double)ot[r] * ot[r];
                const float rn = (float)(1.0 / sqrt(ss / d + c->norm_eps));
                for (int r = 0; r < d; r++) ot[r] = ot[r] * rn * nw[r] * silu(z[r]);
            }
        }
    }
    END_PHASE(w, nv);
    return 0;
}

int pd_deltanet(pd_worker *w, step_ctx *s, int l) {
    pd_model *m = s->m;
    if (phase_projections(w, s, l) || phase_conv(w, s, l) || phase_delta(w, s, l)) return -1;
    const int inner = pd_ssm_inner(&m->c);
    if (pd_phase_norm(w, m, m->ssm.o, inner, NULL, inner, s->n)) return -1;
    return pd_phase_residual_matmul(w, m, pd_layer_tensor(m, l, PD_SSM_OUT), NULL,
                                    pd_layer_tensor(m, l, PD_POST_ATTN_NORM), s->n);
}
