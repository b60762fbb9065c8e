/* Loading: the tensors validated against the config, the weights repacked where this CPU has a
 * faster layout for them, the KV cache and scratch allocated once; and the model's facts
 * (errors, sizes, KV capacity, what was repacked). */
#include "core/model.h"
#include "core/hugemem.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int pd_set_err(char *buf, int len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, (size_t)len, fmt, ap);
    va_end(ap);
    return PD_EINVAL;
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
    if (!t->data) return pd_set_err(err, len, "missing tensor %s", name);
    if (t->ne0 != ne0 || t->ne1 != ne1)
        return pd_set_err(err, len, "tensor %s has shape [%lld, %lld], expected [%lld, %lld]", name,
                       (long long)t->ne0, (long long)t->ne1, (long long)ne0, (long long)ne1);
    if (t->type < 0 || t->type >= PD_FIRST_REPACKED || !K->matmul[t->type])
        return pd_set_err(err, len, "tensor %s has unsupported type %s (type id %d)", name,
                       pd_type_name(t->type), t->type);
    int bs = pd_type_block_size(t->type);
    if (bs <= 0 || ne0 % bs || t->row_bytes != (size_t)(ne0 / bs) * pd_type_block_bytes(t->type))
        return pd_set_err(err, len, "tensor %s: row of %lld values is not whole blocks of %s", name,
                       (long long)ne0, pd_type_name(t->type));
    return PD_OK;
}

static int check_vector(const pd_tensor *t, const char *short_name, int l, int64_t n, int optional,
                        char *err, int len) {
    char name[96];
    full_name(name, sizeof name, short_name, l);
    if (!t->data) return optional ? PD_OK : pd_set_err(err, len, "missing tensor %s", name);
    if (t->type != PD_F32 || t->ne0 != n || t->ne1 != 1)
        return pd_set_err(err, len, "tensor %s must be F32 of %lld values (got type %d, shape [%lld, %lld])",
                       name, (long long)n, t->type, (long long)t->ne0, (long long)t->ne1);
    return PD_OK;
}

/* Layer l's mixture of experts (core/moe.c): the router and the three expert tensors, each a
 * matrix of n_expert stacked blocks of rows. */
static int check_experts(const pd_config *c, const pd_kernels *K, const pd_tensor *L, int l, char *err, int len) {
    const int64_t d = c->n_embd, ne = c->n_expert, nf = c->n_ff_exp;
    static const char *shexp[] = { "ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                                   "ffn_down_shexp.weight" };
    char name[96];
    if (ne < 1)
        return pd_set_err(err, len, "tensor %s is present but the config has no experts (expert count 0)",
                          full_name(name, sizeof name, "ffn_gate_inp.weight", l));
    if (!c->n_ff_shexp) {
        for (int i = 0; i < 4; i++)
            if (L[PD_GATE_INP_SHEXP + i].data)
                return pd_set_err(err, len, "tensor %s is present but the config has no shared expert (width 0)",
                                  full_name(name, sizeof name, shexp[i], l));
    }
    if (L[PD_POST_FFN_NORM].data)
        return pd_set_err(err, len, "tensor %s: a post-FFN norm after a mixture of experts is not supported",
                          full_name(name, sizeof name, "post_ffw_norm.weight", l));
    int rc;
    static const char *bias[] = { "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias" };
    const int64_t per[] = { ne, nf, nf, d };   /* values per expert (the router's: one per expert, once) */
    for (int i = 0; i < 4; i++) {
        const pd_tensor *b = &L[PD_GATE_INP_B + i];
        if (b->data && (b->type != PD_F32 || b->ne0 != per[i] || b->ne1 != (i ? ne : 1)))
            return pd_set_err(err, len, "tensor %s must be F32 of shape [%lld, %lld] (got type %d, [%lld, %lld])",
                              full_name(name, sizeof name, bias[i], l), (long long)per[i], (long long)(i ? ne : 1),
                              b->type, (long long)b->ne0, (long long)b->ne1);
    }
    if ((rc = check_matrix(K, &L[PD_GATE_INP], "ffn_gate_inp.weight", l, d, ne, err, len)) ||
        (rc = check_matrix(K, &L[PD_GATE_EXPS], "ffn_gate_exps.weight", l, d, nf * ne, err, len)) ||
        (rc = check_matrix(K, &L[PD_UP_EXPS], "ffn_up_exps.weight", l, d, nf * ne, err, len)) ||
        (rc = check_matrix(K, &L[PD_DOWN_EXPS], "ffn_down_exps.weight", l, nf, d * ne, err, len)))
        return rc;
    const int64_t ns = c->n_ff_shexp;
    if (ns && ((rc = check_vector(&L[PD_GATE_INP_SHEXP], shexp[0], l, d, 1, err, len)) ||
               (rc = check_matrix(K, &L[PD_GATE_SHEXP], shexp[1], l, d, ns, err, len)) ||
               (rc = check_matrix(K, &L[PD_UP_SHEXP], shexp[2], l, d, ns, err, len)) ||
               (rc = check_matrix(K, &L[PD_DOWN_SHEXP], shexp[3], l, ns, d, err, len))))
        return rc;
    return PD_OK;
}

static int validate(const pd_config *c, const pd_kernels *K, const pd_tensor *T, int nt, char *err, int len) {
    if (c->n_layer < 1 || c->n_embd < 1 || c->n_head < 1 || c->n_head_kv < 1 || c->head_dim < 2 ||
        c->n_ff < 1 || c->n_vocab < 1 || c->n_ctx < 1 || c->n_batch < 1 || c->n_seq < 0)
        return pd_set_err(err, len, "invalid config: every size must be positive");
    if (c->n_head % c->n_head_kv) return pd_set_err(err, len, "n_head %d is not a multiple of n_head_kv %d", c->n_head, c->n_head_kv);
    if (c->head_dim % 2 || c->rope_dim > c->head_dim || c->rope_dim < 0 || c->rope_dim % 2)
        return pd_set_err(err, len, "invalid rope_dim %d for head_dim %d", c->rope_dim, c->head_dim);
    if (c->n_embd % PD_QK || c->n_ff % PD_QK || (c->n_head * c->head_dim) % PD_QK)
        return pd_set_err(err, len, "model dims must be multiples of %d", PD_QK);
    int rc0 = pd_moe_check_config(c, err, len);
    if (rc0 || (rc0 = pd_ssm_check_config(c, err, len))) return rc0;
    if (c->kv_type < PD_KV_F32 || c->kv_type > PD_KV_Q8_0)
        return pd_set_err(err, len, "unknown KV cache type %d", c->kv_type);
    if (c->kv_type == PD_KV_Q8_0 && c->head_dim % PD_QK)
        return pd_set_err(err, len, "a q8_0 KV cache needs head_dim a multiple of %d (this model's is %d)", PD_QK, c->head_dim);
    if (nt != PD_GLOBAL_SLOTS + c->n_layer * PD_LAYER_SLOTS)
        return pd_set_err(err, len, "expected %d tensor slots, got %d", PD_GLOBAL_SLOTS + c->n_layer * PD_LAYER_SLOTS, nt);
    int d = c->n_embd, qd = c->n_head * c->head_dim, kvd = c->n_head_kv * c->head_dim, rc;
    const pd_tensor *e = &T[PD_TOK_EMBD];
    if (!e->data || e->ne0 != d || e->ne1 != c->n_vocab)
        return pd_set_err(err, len, "token_embd.weight must have shape [%d, %d]", d, c->n_vocab);
    if (pd_type_block_size(e->type) <= 0 || d % pd_type_block_size(e->type) ||
        e->row_bytes != (size_t)(d / pd_type_block_size(e->type)) * pd_type_block_bytes(e->type))
        return pd_set_err(err, len, "token_embd.weight has unsupported type %s (type id %d) or rows that are not "
                       "whole blocks of it", pd_type_name(e->type), e->type);
    if ((rc = check_vector(&T[PD_OUTPUT_NORM], "output_norm.weight", -1, d, 0, err, len))) return rc;
    if ((rc = check_vector(&T[PD_ROPE_FREQS], "rope_freqs.weight", -1, c->rope_dim ? c->rope_dim / 2 : c->head_dim / 2, 1, err, len)))
        return rc;
    const pd_tensor *out = T[PD_OUTPUT].data ? &T[PD_OUTPUT] : e;
    if ((rc = check_matrix(K, out, T[PD_OUTPUT].data ? "output.weight" : "token_embd.weight", -1, d, c->n_vocab, err, len))) return rc;
    for (int l = 0; l < c->n_layer; l++) {
        const pd_tensor *L = &T[PD_GLOBAL_SLOTS + (size_t)l * PD_LAYER_SLOTS];
        if (pd_layer_is_recurrent(c, l)) {   /* a gated delta net in place of the attention */
            const int C = pd_ssm_channels(c), inner = pd_ssm_inner(c), nv = c->ssm_n_v;
            const pd_tensor *cv = &L[PD_SSM_CONV];
            char name[96];
            if ((rc = check_vector(&L[PD_ATTN_NORM], "attn_norm.weight", l, d, 0, err, len)) ||
                (rc = check_matrix(K, &L[PD_SSM_QKV], "attn_qkv.weight", l, d, C, err, len)) ||
                (rc = check_matrix(K, &L[PD_SSM_Z], "attn_gate.weight", l, d, inner, err, len)) ||
                (rc = check_matrix(K, &L[PD_SSM_BETA], "ssm_beta.weight", l, d, nv, err, len)) ||
                (rc = check_matrix(K, &L[PD_SSM_ALPHA], "ssm_alpha.weight", l, d, nv, err, len)) ||
                (rc = check_matrix(K, &L[PD_SSM_OUT], "ssm_out.weight", l, inner, d, err, len)) ||
                (rc = check_vector(&L[PD_SSM_DT], "ssm_dt.bias", l, nv, 0, err, len)) ||
                (rc = check_vector(&L[PD_SSM_A], "ssm_a", l, nv, 0, err, len)) ||
                (rc = check_vector(&L[PD_SSM_NORM], "ssm_norm.weight", l, c->ssm_d_state, 0, err, len)))
                return rc;
            if (!cv->data || cv->type != PD_F32 || cv->ne0 != c->ssm_d_conv || cv->ne1 != C)
                return pd_set_err(err, len, "tensor %s must be F32 of shape [%d, %d]",
                                  full_name(name, sizeof name, "ssm_conv1d.weight", l), c->ssm_d_conv, C);
        } else if (L[PD_SSM_QKV].data || L[PD_SSM_OUT].data) {
            return pd_set_err(err, len, "layer %d holds a gated delta net's tensors but is not a recurrent layer", l);
        }
        const int qrows = c->attn_gated ? 2 * qd : qd;
        if (pd_layer_is_recurrent(c, l)) {
            /* (its FFN: below) */
        } else if ((rc = check_vector(&L[PD_ATTN_NORM], "attn_norm.weight", l, d, 0, err, len)) ||
            (rc = check_matrix(K, &L[PD_WQ], "attn_q.weight", l, d, qrows, err, len)) ||
            (rc = check_matrix(K, &L[PD_WK], "attn_k.weight", l, d, kvd, err, len)) ||
            (rc = check_matrix(K, &L[PD_WV], "attn_v.weight", l, d, kvd, err, len)) ||
            (rc = check_matrix(K, &L[PD_WO], "attn_output.weight", l, qd, d, err, len)) ||
            (rc = check_vector(&L[PD_BQ], "attn_q.bias", l, qd, 1, err, len)) ||
            (rc = check_vector(&L[PD_BK], "attn_k.bias", l, kvd, 1, err, len)) ||
            (rc = check_vector(&L[PD_BV], "attn_v.bias", l, kvd, 1, err, len)) ||
            (rc = check_vector(&L[PD_Q_NORM], "attn_q_norm.weight", l, c->head_dim, 1, err, len)) ||
            (rc = check_vector(&L[PD_K_NORM], "attn_k_norm.weight", l, c->head_dim, 1, err, len)) ||
            (rc = check_vector(&L[PD_POST_ATTN_NORM], "post_attention_norm.weight", l, d, 1, err, len)))
            return rc;
        if ((rc = check_vector(&L[PD_FFN_NORM], "ffn_norm.weight", l, d, 0, err, len)) ||
            (rc = check_vector(&L[PD_POST_FFN_NORM], "post_ffw_norm.weight", l, d, 1, err, len)) ||
            (rc = check_vector(&L[PD_BO], "attn_output.bias", l, d, 1, err, len)) ||
            (rc = check_vector(&L[PD_ATTN_SINKS], "attn_sinks.weight", l, c->n_head, 1, err, len)) ||
            (rc = L[PD_GATE_INP].data ? check_experts(c, K, L, l, err, len)
                                      : (check_matrix(K, &L[PD_GATE], "ffn_gate.weight", l, d, c->n_ff, err, len) ||
                                         check_matrix(K, &L[PD_UP], "ffn_up.weight", l, d, c->n_ff, err, len) ||
                                         check_matrix(K, &L[PD_DOWN], "ffn_down.weight", l, c->n_ff, d, err, len))
                                        ? PD_EINVAL : PD_OK))
            return rc;
    }
    return PD_OK;
}

void pd_model_free(pd_model *m) {
    if (!m) return;
    if (m->pool) { pd_pool_quiesce(m->pool); pd_pool_free(m->pool); }   /* then nothing reads m */
    if (m->kc) for (int l = 0; l < m->c.n_layer; l++) free(m->kc[l]);
    if (m->vc) for (int l = 0; l < m->c.n_layer; l++) free(m->vc[l]);
    free(m->kc); free(m->vc); free(m->kv_cap); free(m->lt);
    free(m->x); free(m->xn); free(m->xq); free(m->xqk); free(m->q); free(m->kk); free(m->vv); free(m->att);
    free(m->gate); free(m->up); free(m->tmp); free(m->scores); free(m->rope_cs);
    free(m->qq); free(m->attn_part);
    free(m->phases); free(m->step); free(m->pos); free(m->seq); free(m->out_idx); free(m->seq_next);
    free(m->summ); free(m->summ_cmax); free(m->summ_csum);
    for (int i = 0; i < m->n_repacked; i++) pd_huge_free(m->repacked[i], m->repacked_size[i]);
    if (m->small_copy) pd_huge_free(m->small_copy, m->small_copy_size);
    free(m->repacked); free(m->repacked_size); free(m->repacked_slot); free(m->local_layers);
    pd_moe_free(m);
    pd_ssm_free(m);
    free(m);
}

/* Repacks, at load, the matmul weights whose format has a faster interleaved layout on this
 * ISA (kernels.h: PD_*_R16): a copy the kernels read instead of the mapped file. Only
 * tensors split between threads at multiples of PD_R16_ROWS qualify: whole row groups, and
 * for Q, K and V (one phase over their concatenated rows) sizes that keep the groups aligned.
 * The embedding table is read a row at a time and keeps the file's layout; a head tied to it
 * gets its own repacked copy in the output slot (the file's pages of the table are released
 * too: the lookups then fault back in only the rows of the tokens seen). */
static size_t repack_size(const pd_config *c, const pd_kernels *K, const pd_tensor *t);

/* The file's pages wholly inside [p, p + n) leave this process's resident memory (the kernels
 * read the copy now; a later read would fault them back in from the file): resident memory does
 * not hold a repacked tensor twice. */
static void release_file_pages(const void *p, size_t n) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + pg - 1) / pg * pg,
                    e = ((uintptr_t)p + n) / pg * pg;
    if (e > a) (void)madvise((void *)a, e - a, MADV_DONTNEED);
}

static int repack_one(pd_model *m, pd_tensor *t, int slot_index, int release) {
    const int rt = pd_repacked_type(t->type);
    const size_t bytes = repack_size(&m->c, m->kt, t);
    if (!bytes) return 0;
    void *buf = pd_huge_alloc(bytes);
    if (!buf) return -1;
    if (pd_repack(t->type, t->data, t->row_bytes, (int)t->ne1, (int)t->ne0, buf)) { pd_huge_free(buf, bytes); return 0; }
    if (release && m->c.weights_mapped) release_file_pages(t->data, bytes);
    m->repacked[m->n_repacked] = buf;
    m->repacked_size[m->n_repacked] = bytes;
    m->repacked_slot[m->n_repacked++] = slot_index;
    m->repacked_bytes += bytes;
    t->type = rt;
    t->data = buf;
    return 1;
}

/* Whether tensor slot i (of all PD_GLOBAL_SLOTS + n_layer * PD_LAYER_SLOTS) may be repacked:
 * the output head and the layers' matmuls (a delta net's too), Q/K/V only when their sizes keep row
 * groups aligned. */
static int repack_slot_eligible(const pd_config *c, int i) {
    if (i < PD_GLOBAL_SLOTS) return i == PD_OUTPUT;
    const int slot = (i - PD_GLOBAL_SLOTS) % PD_LAYER_SLOTS;
    const int qkv_ok = (c->n_head * c->head_dim) % PD_R16_ROWS == 0 &&
                       (c->n_head_kv * c->head_dim) % PD_R16_ROWS == 0;
    /* an expert's rows start at a row group only when n_ff_exp is whole groups (down's blocks are
     * n_embd rows, a multiple of 32); the router's chunks are whole groups of its n_expert rows */
    const int exps_ok = c->n_ff_exp % PD_R16_ROWS == 0;
    return slot == PD_WO || slot == PD_GATE || slot == PD_UP || slot == PD_DOWN || slot == PD_DOWN_EXPS ||
           slot == PD_GATE_SHEXP || slot == PD_UP_SHEXP || slot == PD_DOWN_SHEXP ||
           slot == PD_GATE_INP || (exps_ok && (slot == PD_GATE_EXPS || slot == PD_UP_EXPS)) ||
           /* a delta-net layer's projections: each its own chunks of whole row groups */
           slot == PD_SSM_QKV || slot == PD_SSM_Z || slot == PD_SSM_BETA || slot == PD_SSM_ALPHA || slot == PD_SSM_OUT ||
           (qkv_ok && (slot == PD_WQ || slot == PD_WK || slot == PD_WV));
}

/* Whether tensor t would be repacked on table K (and its bytes then). */
static size_t repack_size(const pd_config *c, const pd_kernels *K, const pd_tensor *t) {
    const int rt = pd_repacked_type(t->type);
    if (!t->data || rt < 0 || !K->matmul[rt] || t->ne1 % PD_R16_ROWS || t->ne1 > INT32_MAX) return 0;
    if (t->type < 64 && (c->repack_skip >> t->type & 1)) return 0;
    return (size_t)t->ne1 * t->row_bytes;
}

/* The small tensors a step still reads from the file where others were repacked (norms, biases,
 * attention sinks, a float router: bytes to a MB each) move to one anonymous buffer too, their
 * file pages released. Why: Linux maps a whole large page-cache folio (up to 2 MB) at a fault,
 * so each read of a norm lying between two released matrices brought back up to 2 MB of their
 * pages (Gemma 3 270M on Linux 6.18: 63 of its 246 released MB resident again after a prefill).
 * The embedding table stays in the file: its rows are read a token at a time. */
#define PD_SMALL_TENSOR (1u << 20)
static size_t moved_small(const pd_config *c, const pd_kernels *K, const pd_tensor *t, int slot_index) {
    const size_t n = t->data ? (size_t)t->ne1 * t->row_bytes : 0;
    if (slot_index == PD_TOK_EMBD || !n || n > PD_SMALL_TENSOR) return 0;
    if (repack_slot_eligible(c, slot_index) && repack_size(c, K, t)) return 0;   /* repacked instead */
    return (n + 63) / 64 * 64;
}

/* Whether repacking would move anything (then the small tensors move too). */
static size_t repacked_at_load(const pd_config *c, const pd_kernels *K, const pd_tensor *g, const pd_tensor *lt) {
    size_t total = 0;
    for (int i = 0; i < PD_GLOBAL_SLOTS + c->n_layer * PD_LAYER_SLOTS; i++) {
        if (!repack_slot_eligible(c, i)) continue;
        const pd_tensor *t = i < PD_GLOBAL_SLOTS ? &g[i] : &lt[i - PD_GLOBAL_SLOTS];
        total += repack_size(c, K, i == PD_OUTPUT && !t->data ? &g[PD_TOK_EMBD] : t);
    }
    return total;
}

/* Before the repacking: read after it, a norm would fault its neighbours' folios back in. */
static int copy_small_tensors(pd_model *m) {
    const int n_slots = PD_GLOBAL_SLOTS + m->c.n_layer * PD_LAYER_SLOTS;
    size_t total = 0;
    for (int i = 0; i < n_slots; i++)
        total += moved_small(&m->c, m->kt, i < PD_GLOBAL_SLOTS ? &m->g[i] : &m->lt[i - PD_GLOBAL_SLOTS], i);
    if (!total) return PD_OK;
    char *buf = pd_huge_alloc(total);
    if (!buf) return PD_ENOMEM;
    size_t at = 0;
    for (int i = 0; i < n_slots; i++) {
        pd_tensor *t = i < PD_GLOBAL_SLOTS ? &m->g[i] : &m->lt[i - PD_GLOBAL_SLOTS];
        const size_t n = moved_small(&m->c, m->kt, t, i), bytes = (size_t)t->ne1 * t->row_bytes;
        if (!n) continue;
        memcpy(buf + at, t->data, bytes);
        release_file_pages(t->data, bytes);
        t->data = buf + at;
        at += n;
    }
    m->small_copy = buf;
    m->small_copy_size = total;
    m->repacked_bytes += total;
    return PD_OK;
}

static int repack_weights(pd_model *m) {
    const pd_config *c = &m->c;
    const int n_slots = PD_GLOBAL_SLOTS + c->n_layer * PD_LAYER_SLOTS;
    m->repacked = calloc((size_t)n_slots, sizeof(void *));
    m->repacked_size = calloc((size_t)n_slots, sizeof(size_t));
    m->repacked_slot = calloc((size_t)n_slots, sizeof(int));
    if (!m->repacked || !m->repacked_size || !m->repacked_slot) return PD_ENOMEM;
    if (c->no_repack) return PD_OK;
    if (c->weights_mapped && repacked_at_load(c, m->kt, m->g, m->lt) &&
        copy_small_tensors(m))
        return PD_ENOMEM;
    for (int i = 0; i < n_slots; i++) {
        pd_tensor *t = i < PD_GLOBAL_SLOTS ? &m->g[i] : &m->lt[i - PD_GLOBAL_SLOTS];
        if (!repack_slot_eligible(c, i)) continue;
        if (i == PD_OUTPUT && !t->data) {             /* tied head: a repacked copy of its own */
            pd_tensor head = m->g[PD_TOK_EMBD];
            const int rc = repack_one(m, &head, i, 1);   /* the table's rows fault back in as looked up */
            if (rc < 0) return PD_ENOMEM;
            if (rc) *t = head;
        } else if (t->data && repack_one(m, t, i, 1) < 0) {
            return PD_ENOMEM;
        }
    }
    return PD_OK;
}

/* Positions layer l's cache holds per sequence: n_ctx, or for a local layer a ring of window +
 * n_batch (a step's earliest query of a sequence still sees its whole window). */
static int kv_capacity(const pd_config *c, int l) {
    if (pd_layer_is_recurrent(c, l)) return 0;   /* a recurrent layer keeps a state instead (deltanet.h) */
    const int ring = c->sliding_window + c->n_batch;
    return pd_layer_is_local(c, l) && ring < c->n_ctx ? ring : c->n_ctx;
}

/* The scratch buffers of a step, for up to n_batch tokens: their sizes in bytes, in one place
 * for the allocation (pd_model_new) and the estimate before it (pd_config_memory_bytes). */
enum { S_X, S_XN, S_XQ, S_XQK, S_Q, S_KK, S_VV, S_ATT, S_GATE, S_UP, S_TMP, S_SCORES, S_ROPE, S_QQ, S_PART, S_IDX, S_N };
static size_t max_input(const pd_config *c) {
    size_t d = (size_t)c->n_embd, qd = (size_t)c->n_head * c->head_dim, mx = d > qd ? d : qd;
    for (int l = 0; c->recurrent_layers && l < c->n_layer; l++)   /* ssm_out's input */
        if (c->recurrent_layers[l] && (size_t)pd_ssm_inner(c) > mx) mx = (size_t)pd_ssm_inner(c);
    return (size_t)c->n_ff > mx ? (size_t)c->n_ff : mx;
}
static void scratch_sizes(const pd_config *c, size_t sz[S_N]) {
    const size_t nb = (size_t)c->n_batch, d = (size_t)c->n_embd, qd = (size_t)c->n_head * c->head_dim;
    const size_t kvd = (size_t)c->n_head_kv * c->head_dim, mi = max_input(c);
    const int rope_dim = c->rope_dim > 0 ? c->rope_dim : c->head_dim;
    sz[S_X] = sz[S_TMP] = nb * d * sizeof(float);
    sz[S_XN] = nb * mi * sizeof(float);
    sz[S_XQ] = nb * (mi / PD_QK) * sizeof(pd_q8);
    sz[S_XQK] = nb * (mi / PD_QKK + 1) * sizeof(pd_q8k);
    sz[S_Q] = sz[S_ATT] = nb * qd * sizeof(float);
    sz[S_KK] = sz[S_VV] = nb * kvd * sizeof(float);
    sz[S_GATE] = sz[S_UP] = nb * (size_t)c->n_ff * sizeof(float);
    sz[S_SCORES] = (size_t)(c->n_threads > 0 ? c->n_threads : 1) * pd_attn_scratch_floats(c) * sizeof(float);
    sz[S_QQ] = c->kv_type == PD_KV_Q8_0 ? nb * (qd / PD_QK) * sizeof(pd_q8) : sizeof(pd_q8);
    sz[S_PART] = (size_t)pd_attn_wave(c) * (size_t)(c->n_head > 0 ? c->n_head : 1) * (size_t)pd_attn_max_chunks(c) *
                 (size_t)(c->head_dim > 0 ? c->head_dim + 2 : 2) * sizeof(float);
    sz[S_ROPE] = nb * 2 * (size_t)(rope_dim > 0 ? rope_dim : 2) * sizeof(float);
    sz[S_IDX] = nb * sizeof(int32_t);
}

/* The KV cache's bytes, all layers and slots. */
static size_t kv_cache_bytes(const pd_config *c) {
    const size_t row = pd_kv_row_bytes(c);
    size_t total = 0;
    for (int l = 0; l < c->n_layer; l++)
        total += 2 * (size_t)(c->n_seq > 0 ? c->n_seq : 1) * kv_capacity(c, l) * row;
    return total;
}

size_t pd_config_kv_bytes(const pd_config *cfg) { return cfg && cfg->n_layer >= 1 ? kv_cache_bytes(cfg) : 0; }

size_t pd_config_memory_bytes(const pd_config *cfg) {
    if (!cfg || cfg->n_layer < 1) return 0;
    size_t sz[S_N], total = kv_cache_bytes(cfg);
    scratch_sizes(cfg, sz);
    for (int i = 0; i < S_N; i++) total += sz[i];
    return total + 2 * sz[S_IDX] + pd_moe_scratch_bytes(cfg) + pd_ssm_bytes(cfg);   /* positions, slots and logit rows: three index buffers */
}

size_t pd_config_repack_bytes(const pd_config *cfg, const pd_tensor *tensors, int n_tensors, const char *isa) {
    const pd_kernels *K = pd_kernels_select(isa);
    if (!cfg || !tensors || !K || cfg->no_repack || n_tensors != PD_GLOBAL_SLOTS + cfg->n_layer * PD_LAYER_SLOTS)
        return 0;
    size_t total = repacked_at_load(cfg, K, tensors, tensors + PD_GLOBAL_SLOTS);
    if (total && cfg->weights_mapped)            /* and what copy_small_tensors moves beside them */
        for (int i = 0; i < n_tensors; i++) total += moved_small(cfg, K, &tensors[i], i);
    return total;
}

pd_model *pd_model_new(const pd_config *cfg, const pd_tensor *tensors, int n_tensors,
                       const char *isa, char *err, int err_len) {
    const pd_kernels *K = pd_kernels_select(isa);
    if (!K) { pd_set_err(err, err_len, "instruction set '%s' is unknown or not supported by this CPU/build", isa ? isa : "(env PYDECODE_ISA)"); return NULL; }
    if (validate(cfg, K, tensors, n_tensors, err, err_len)) return NULL;
    pd_model *m = calloc(1, sizeof *m);
    if (!m) { pd_set_err(err, err_len, "out of memory"); return NULL; }
    m->c = *cfg;
    m->kt = K;
    if (m->c.rope_dim == 0) m->c.rope_dim = m->c.head_dim;
    if (m->c.n_threads < 1) m->c.n_threads = 1;
    if (m->c.n_seq < 1) m->c.n_seq = 1;
    m->local_layers = calloc((size_t)cfg->n_layer, 1);
    if (m->local_layers && cfg->local_layers) memcpy(m->local_layers, cfg->local_layers, (size_t)cfg->n_layer);
    m->c.local_layers = m->local_layers;
    memcpy(m->g, tensors, sizeof m->g);
    size_t nl = (size_t)cfg->n_layer * PD_LAYER_SLOTS;
    m->lt = malloc(nl * sizeof(pd_tensor));
    m->max_in = max_input(cfg);
    m->xq_stride = m->max_in / PD_QK;
    m->xqk_stride = m->max_in / PD_QKK + 1;
    for (int i = 0; i < n_tensors; i++) {
        if (!tensors[i].data) continue;
        int f = pd_type_act_format(tensors[i].type);
        m->need_q8 |= f == PD_ACT_Q8;
        m->need_q8k |= f == PD_ACT_Q8K;
    }
    m->kv_row_bytes = pd_kv_row_bytes(cfg);
    m->attn_wave = pd_attn_wave(&m->c);
    m->attn_max_chunks = pd_attn_max_chunks(&m->c);
    m->kc = calloc((size_t)cfg->n_layer, sizeof(void *));
    m->vc = calloc((size_t)cfg->n_layer, sizeof(void *));
    m->kv_cap = calloc((size_t)cfg->n_layer, sizeof(int));
    int ok = m->lt && m->kc && m->vc && m->kv_cap && m->local_layers;
    for (int l = 0; ok && l < cfg->n_layer; l++) {
        const int cap = kv_capacity(&m->c, l);
        m->kv_cap[l] = cap;
        size_t bytes = (size_t)m->c.n_seq * cap * m->kv_row_bytes;
        if (!bytes) continue;         /* a recurrent layer: no cache */
        m->kc[l] = calloc(1, bytes);  /* calloc: untouched positions cost no RAM */
        m->vc[l] = calloc(1, bytes);
        ok = m->kc[l] && m->vc[l];
        m->kv_bytes += 2 * bytes;
    }
    if (ok) {
        memcpy(m->lt, tensors + PD_GLOBAL_SLOTS, nl * sizeof(pd_tensor));
        size_t sz[S_N];
        scratch_sizes(&m->c, sz);
        /* Each scratch buffer where scratch_sizes says (the order of its enum). */
        void **buf[S_N] = { (void **)&m->x, (void **)&m->xn, (void **)&m->xq, (void **)&m->xqk,
                            (void **)&m->q, (void **)&m->kk, (void **)&m->vv, (void **)&m->att,
                            (void **)&m->gate, (void **)&m->up, (void **)&m->tmp, (void **)&m->scores,
                            (void **)&m->rope_cs, (void **)&m->qq, (void **)&m->attn_part, (void **)&m->pos };
        for (int i = 0; i < S_N; i++) *buf[i] = malloc(sz[i]);
        m->seq = malloc(sz[S_IDX]);
        m->out_idx = malloc(sz[S_IDX]);
        m->n_phases = pd_step_phases(m, m->c.n_batch);
        m->phases = aligned_alloc(64, (size_t)m->n_phases * sizeof(pd_phase));
        m->step = calloc(1, sizeof(step_ctx));
        m->seq_next = malloc((size_t)m->c.n_seq * sizeof(int32_t));
        m->pool = pd_pool_new(m->c.n_threads);
        ok = m->x && m->xn && m->xq && m->xqk && m->q && m->kk && m->vv && m->att && m->gate && m->up &&
             m->tmp && m->scores && m->rope_cs && m->qq && m->attn_part && m->phases && m->step && m->pool &&
             m->pos && m->seq && m->out_idx && m->seq_next && pd_moe_alloc(m) == 0 && pd_ssm_alloc(m) == 0;
    }
    if (ok && repack_weights(m)) {
        pd_set_err(err, err_len, "out of memory repacking the weights (%zu bytes so far; no_repack avoids it)",
                m->repacked_bytes);
        pd_model_free(m);
        return NULL;
    }
    if (!ok) {
        pd_set_err(err, err_len, "out of memory allocating the KV cache (%zu bytes) and scratch", m->kv_bytes);
        pd_model_free(m);
        return NULL;
    }
    m->c.n_threads = pd_pool_size(m->pool);
    return m;
}

const char *pd_model_error(const pd_model *m) { return m ? m->err : "no model"; }
const char *pd_model_isa(const pd_model *m) { return m ? m->kt->name : ""; }
size_t pd_model_kv_bytes(const pd_model *m) { return m ? m->kv_bytes : 0; }
int pd_model_kv_cap(const pd_model *m, int layer) {
    return m && layer >= 0 && layer < m->c.n_layer ? m->kv_cap[layer] : -1;
}
size_t pd_model_kv_row_bytes(const pd_model *m) { return m ? m->kv_row_bytes : 0; }
int pd_model_n_seq(const pd_model *m) { return m ? m->c.n_seq : 0; }

/* m runs its steps on from's threads from now on (a draft model and its target take turns, so
 * two pools would only spin against each other on the same cores). Both must have the same
 * thread count; the caller serializes their steps (one lock for both). */
int pd_model_share_pool(pd_model *m, pd_model *from) {
    if (!m || !from) return PD_EINVAL;
    if (pd_pool_size(from->pool) != pd_pool_size(m->pool))
        return pd_set_err(m->err, sizeof m->err, "cannot share a pool of %d threads with a model of %d",
                          pd_pool_size(from->pool), pd_pool_size(m->pool));
    if (m->pool != from->pool) {
        pd_pool_free(m->pool);
        m->pool = pd_pool_ref(from->pool);
    }
    return PD_OK;
}

int pd_model_set_decode_threads(pd_model *m, int n) {
    if (!m) return PD_EINVAL;
    if (n < 0 || n > m->c.n_threads)
        return pd_set_err(m->err, sizeof m->err, "decode threads %d outside 0..%d", n, m->c.n_threads);
    m->decode_threads = n;
    return PD_OK;
}

/* More sequence slots: each layer's cache [n_seq][cap][kvd] grows at its end, so the slots it
 * had keep their contents in place (realloc; the new slots' rows are written before any read).
 * Not during a step. On failure the model is unchanged for use (some layers may have room to
 * spare) and the error says so. */
int pd_model_grow_seq(pd_model *m, int n_seq) {
    if (!m) return PD_EINVAL;
    if (n_seq <= m->c.n_seq) return PD_OK;
    int32_t *next = realloc(m->seq_next, (size_t)n_seq * sizeof(int32_t));
    if (!next) return pd_set_err(m->err, sizeof m->err, "out of memory growing to %d sequence slots", n_seq);
    m->seq_next = next;
    if (pd_ssm_grow(m, n_seq)) return pd_set_err(m->err, sizeof m->err, "out of memory growing the recurrent states to %d slots", n_seq);
    for (int l = 0; l < m->c.n_layer; l++) {
        size_t bytes = (size_t)n_seq * m->kv_cap[l] * m->kv_row_bytes;
        if (!bytes) continue;
        void *k = realloc(m->kc[l], bytes);
        if (!k) return pd_set_err(m->err, sizeof m->err, "out of memory growing the KV cache to %d slots", n_seq);
        m->kc[l] = k;
        void *v = realloc(m->vc[l], bytes);
        if (!v) return pd_set_err(m->err, sizeof m->err, "out of memory growing the KV cache to %d slots", n_seq);
        m->vc[l] = v;
    }
    size_t total = 0;
    for (int l = 0; l < m->c.n_layer; l++) total += 2 * (size_t)n_seq * m->kv_cap[l] * m->kv_row_bytes;
    m->kv_bytes = total;
    m->c.n_seq = n_seq;
    return PD_OK;
}
int pd_model_n_repacked(const pd_model *m) { return m ? m->n_repacked : 0; }
size_t pd_model_repacked_bytes(const pd_model *m) { return m ? m->repacked_bytes : 0; }
size_t pd_model_small_copy_bytes(const pd_model *m) { return m ? m->small_copy_size : 0; }
int pd_model_repacked_slot(const pd_model *m, int i) {
    return m && i >= 0 && i < m->n_repacked ? m->repacked_slot[i] : -1;
}
