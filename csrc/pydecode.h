/* The only header cffi sees: opaque handles, plain C types, error codes.
 * C never aborts the process on bad input: functions return PD_OK or a negative code, and
 * pd_model_error() / pd_last_error() hold a message that Python turns into an exception. */
#ifndef PYDECODE_H
#define PYDECODE_H
#include <stddef.h>
#include <stdint.h>

#define PD_OK 0
#define PD_EINVAL (-1)
#define PD_ENOMEM (-2)
#define PD_ERANGE (-3)

/* A weight tensor: a pointer into the memory-mapped GGUF file (zero-copy). data == NULL: absent. */
typedef struct {
    int type;                /* GGML type id */
    const void *data;
    int64_t ne0;             /* values per row (the reduction dimension) */
    int64_t ne1;             /* rows */
    size_t row_bytes;
} pd_tensor;

/* KV cache formats (pd_config.kv_type). */
enum { PD_KV_F32 = 0, PD_KV_F16 = 1, PD_KV_Q8_0 = 2 };

/* Tensor slots: model-wide, then PD_LAYER_SLOTS per layer. Optional slots may be absent. */
enum { PD_TOK_EMBD = 0, PD_OUTPUT_NORM = 1, PD_OUTPUT = 2, PD_ROPE_FREQS = 3, PD_GLOBAL_SLOTS = 4 };
/* PD_ROPE_FREQS (optional, Llama 3.1+): F32[rope_dim/2] divisors of the global layers' RoPE frequencies. */
/* A layer's FFN is dense (PD_GATE, PD_UP, PD_DOWN) or, where PD_GATE_INP is present, a mixture of
 * experts (core/moe.c): the router PD_GATE_INP [n_embd -> n_expert] and the experts' 3-D tensors
 * as matrices of n_expert stacked blocks of rows, expert e's rows contiguous: PD_GATE_EXPS and
 * PD_UP_EXPS [n_embd -> n_ff_exp * n_expert], PD_DOWN_EXPS [n_ff_exp -> n_embd * n_expert].
 * A shared expert (qwen2moe), where n_ff_shexp > 0: PD_GATE_SHEXP, PD_UP_SHEXP [n_embd ->
 * n_ff_shexp] and PD_DOWN_SHEXP [n_ff_shexp -> n_embd], a SwiGLU FFN every token runs, its output
 * scaled by sigmoid(PD_GATE_INP_SHEXP . x) where that F32 [n_embd] vector is present. */
enum {
    PD_ATTN_NORM = 0, PD_WQ, PD_WK, PD_WV, PD_WO, PD_BQ, PD_BK, PD_BV, PD_Q_NORM, PD_K_NORM,
    PD_POST_ATTN_NORM, PD_FFN_NORM, PD_GATE, PD_UP, PD_DOWN, PD_POST_FFN_NORM,
    PD_GATE_INP, PD_GATE_EXPS, PD_UP_EXPS, PD_DOWN_EXPS,
    PD_GATE_INP_SHEXP, PD_GATE_SHEXP, PD_UP_SHEXP, PD_DOWN_SHEXP,
    PD_BO,          /* attn_output.bias (optional, gpt-oss): added with the output projection */
    PD_ATTN_SINKS,  /* attn_sinks.weight (optional, gpt-oss): F32[n_head], a logit per query head that
                       joins every softmax's denominator and weighs no value (an "attention sink") */
    /* A mixture of experts' biases (optional, gpt-oss): the router's, F32[n_expert], added to its
     * logits; each expert's gate / up / down output bias, F32[n_ff_exp x n_expert] (twice) and
     * F32[n_embd x n_expert], expert e's values contiguous. */
    PD_GATE_INP_B, PD_GATE_EXPS_B, PD_UP_EXPS_B, PD_DOWN_EXPS_B,
    /* A recurrent layer's gated delta net (pd_config.recurrent_layers; core/deltanet.c), in place of
     * the attention slots above: PD_SSM_QKV attn_qkv [n_embd -> C], C = 2 n_k d + n_v d (q, k, v);
     * PD_SSM_Z attn_gate [n_embd -> n_v d]; PD_SSM_BETA ssm_beta and PD_SSM_ALPHA ssm_alpha
     * [n_embd -> n_v]; PD_SSM_CONV ssm_conv1d F32 [d_conv x C] (channel c's taps contiguous, oldest
     * first); PD_SSM_DT ssm_dt.bias and PD_SSM_A ssm_a (-exp(A_log)) F32 [n_v]; PD_SSM_NORM
     * ssm_norm F32 [d]; PD_SSM_OUT ssm_out [n_v d -> n_embd]. d = ssm_d_state. */
    PD_SSM_QKV, PD_SSM_Z, PD_SSM_BETA, PD_SSM_ALPHA, PD_SSM_CONV, PD_SSM_DT, PD_SSM_A, PD_SSM_NORM, PD_SSM_OUT,
    PD_LAYER_SLOTS
};
/* How a mixture-of-experts router turns its logits into the k experts' weights (pd_config.
 * expert_gating; GGUF <arch>.expert_gating_func 1, 2, 3). The k chosen are the k largest logits
 * (the lower expert id first on a tie) in every case:
 *   SOFTMAX        softmax over all n_expert logits, the chosen ones' probabilities (qwen3moe)
 *   SIGMOID        sigmoid of each chosen logit (deepseek v3, glm4moe)
 *   SOFTMAX_WEIGHT softmax over the k chosen logits only (gpt-oss)
 * then, with expert_norm, divided by their sum; then times expert_scale. */
enum { PD_GATING_SOFTMAX = 0, PD_GATING_SIGMOID = 1, PD_GATING_SOFTMAX_WEIGHT = 2 };
/* gpt-oss's experts' activation (llama.cpp's swiglu_oai, alpha 1.702, limit 7): with g clamped
 * above at 7 and u to [-7, 7], out = g * sigmoid(1.702 g) * (u + 1). */
enum { PD_EXPERT_ACT_MODEL = 0, PD_EXPERT_ACT_SWIGLU_OAI = 1 };
/* Experts per layer at most (DeepSeek V3 has 256; a larger count is refused as hostile). */
enum { PD_MAX_EXPERTS = 1024 };

/* Everything the single forward pass needs to know about an architecture: data, not code. */
typedef struct {
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    int n_ctx;               /* KV cache positions allocated */
    int n_batch;             /* max tokens per prefill chunk (scratch size) */
    float norm_eps;
    float rope_base;         /* global rope base */
    float rope_base_local;   /* rope base of sliding-window layers (gemma3) */
    int rope_dim;            /* dims rotated per head (<= head_dim) */
    int rope_neox;           /* 0: interleaved pairs (2i, 2i+1); 1: NeoX halves (i, i + rope_dim/2) */
    float attn_scale;        /* 0 -> 1/sqrt(head_dim) */
    float embd_scale;        /* 0 -> 1 (gemma: sqrt(n_embd)) */
    int act_gelu;            /* 0: SwiGLU (silu(gate)*up); 1: GELU(tanh)(gate)*up */
    int sliding_window;      /* window of the local layers (0: none); their RoPE: rope_base_local with no
                                scaling if > 0 (gemma3), else the global layers' (gpt-oss) */
    const uint8_t *local_layers;  /* [n_layer]: 1 where a layer attends over the window only
                                     (Python's ArchConfig.layer_is_local decides; NULL: none) */
    float rope_freq_scale;   /* linear RoPE scaling of global layers: pos * scale (0 -> 1) */
    float rope_attn_factor;  /* the global layers' rotated dims scaled by it (cos and sin x factor: LongRoPE's
                                and YaRN's attention factor, as ggml's rope applies it); 0 -> 1 */
    float rope_yarn_ext;     /* YaRN (0: off): pair i's angle mixes the scaled (pos * rope_freq_scale) and
                                the unscaled one by ramp(i) * rope_yarn_ext, ramp 1 below pair
                                rope_yarn_low, 0 past rope_yarn_high, linear between (ggml's rope_yarn) */
    float rope_yarn_low, rope_yarn_high;
    int kv_type;             /* the cache's format: PD_KV_F16 (default), PD_KV_F32, or PD_KV_Q8_0 (GGML's
                                block_q8_0: per 32 values an f16 scale and 32 int8; head_dim % 32 == 0) */
    int n_threads;
    int n_seq;               /* sequence slots in the KV cache (0 -> 1): sequences decoded together */
    int no_repack;           /* 1: every weight stays in the file's layout (zero-copy); 0: formats
                                with a faster interleaved layout on this ISA are repacked at load */
    uint64_t repack_skip;    /* bit t set: type t keeps the file's layout even where the table has a
                                repacked kernel (the load-time choice of pydecode/variants.py) */
    int weights_mapped;      /* 1: the tensors are a read-only file mapping, so the pages of a
                                repacked tensor may leave resident memory (madvise DONTNEED) */
    /* Mixture of experts (core/moe.c; all 0 for a dense model): */
    int n_expert;            /* experts per MoE layer (1..PD_MAX_EXPERTS) */
    int n_expert_used;       /* k: experts each token is routed to (1..n_expert) */
    int n_ff_exp;            /* an expert's FFN width (a multiple of 32) */
    int expert_gating;       /* PD_GATING_* */
    int expert_norm;         /* 1: the k weights divided by their sum */
    float expert_scale;      /* the k weights multiplied by it (0 -> 1) */
    int n_ff_shexp;          /* the shared expert's FFN width (0: none; a multiple of 32) */
    int expert_act;          /* the experts' activation: 0 the model's (act_gelu); PD_EXPERT_ACT_SWIGLU_OAI */
    /* Hybrids (Qwen3.5: core/deltanet.c; all 0 otherwise): */
    const uint8_t *recurrent_layers;  /* [n_layer]: 1 where a layer is a gated delta net (NULL: none) */
    int ssm_d_conv;          /* the causal convolution's taps (2..8) */
    int ssm_n_k, ssm_n_v;    /* key heads and value heads (n_v a multiple of n_k: value head j reads key head j % n_k) */
    int ssm_d_state;         /* dims per head, keys and values alike (a multiple of 32) */
    int attn_gated;          /* 1: attn_q gives 2 head_dim per head, the query then a gate; the attention's
                                output is multiplied by sigmoid(gate) before attn_output */
} pd_config;

typedef struct pd_model pd_model;

/* Builds the model: validates the tensors against the config, allocates the KV cache, scratch
 * and thread pool once. tensors has PD_GLOBAL_SLOTS + n_layer*PD_LAYER_SLOTS entries.
 * Returns NULL and writes a message into err on failure. */
pd_model *pd_model_new(const pd_config *cfg, const pd_tensor *tensors, int n_tensors,
                       const char *isa, char *err, int err_len);
void pd_model_free(pd_model *m);
/* Before a load, what it will take: the bytes pd_model_new allocates for cfg (the KV cache and a
 * step's scratch; not the weights), and the bytes it would copy to repack weights for the table
 * isa names (NULL: the best, or $PYDECODE_ISA); 0 when cfg->no_repack. */
size_t pd_config_memory_bytes(const pd_config *cfg);
size_t pd_config_kv_bytes(const pd_config *cfg);   /* of those, the KV cache's (every slot) */
size_t pd_config_repack_bytes(const pd_config *cfg, const pd_tensor *tensors, int n_tensors, const char *isa);
const char *pd_model_error(const pd_model *m);
const char *pd_model_isa(const pd_model *m);
size_t pd_model_kv_bytes(const pd_model *m);
/* The KV cache's pieces, so that a test can check pd_model_kv_bytes() against the formula
 * 2 x sum over layers(kv_cap(l)) x n_seq x kv_row_bytes: positions layer l holds (n_ctx, or
 * window + n_batch for sliding-window layers; -1 for a bad layer) and the bytes of one position's
 * K (or V) in one layer: n_head_kv x head_dim values (x 4, x 2, or / 32 x 34 for Q8_0). */
int pd_model_kv_cap(const pd_model *m, int layer);
size_t pd_model_kv_row_bytes(const pd_model *m);
/* A slot's cache as bytes, for save / restore and hand-off between processes (core/kvstate.c):
 * after n_pos positions (0..n_pos-1) of slot seq, per layer the K rows then the V rows of the
 * positions a later step can still read (all n_pos; a sliding-window layer: the last
 * min(n_pos, window)), in position order, in the cache's format. pd_model_kv_export_bytes says
 * how many bytes that is; import writes them back into slot seq of a model of the same shapes
 * and cache format (then its steps continue from position n_pos as the exporter's would). */
size_t pd_model_kv_export_bytes(const pd_model *m, int n_pos);
int pd_model_kv_export(pd_model *m, int seq, int n_pos, void *buf, size_t len);
int pd_model_kv_import(pd_model *m, int seq, int n_pos, const void *buf, size_t len);
int pd_model_n_seq(const pd_model *m);
/* Threads that run a step of one token (a single-sequence decode): 1..n_threads, 0 for all (the
 * default). Bigger steps always use every thread. A model too small to gain from every core
 * decodes faster on fewer (pydecode/threadcount.py measures it); results do not change. Not
 * during a step. */
/* 1: a hybrid's delta rule token by token (the chunked form's twin, for the tests); 0: chunked (default). */
void pd_model_set_delta_sequential(pd_model *m, int on);
int pd_model_set_decode_threads(pd_model *m, int n);
/* m runs its steps on from's thread pool (same thread count; steps of the two serialized by the
 * caller): a draft model beside its target. */
int pd_model_share_pool(pd_model *m, pd_model *from);
/* Grows the KV cache to n_seq sequence slots, keeping the existing slots' contents (not during
 * a step); PD_OK, or an error with the model unchanged for use. */
int pd_model_grow_seq(pd_model *m, int n_seq);
/* A hybrid's recurrent state (core/deltanet.c) cannot be cut back: slot seq's holds the positions
 * 0..pd_model_ssm_pos(m, seq)-1 it has absorbed (-1: a bad slot; 0 for a model without recurrent
 * layers), and a step of that slot must start at that position or at 0 (which starts it afresh). */
int pd_model_ssm_pos(const pd_model *m, int seq);
size_t pd_model_ssm_bytes(const pd_model *m);   /* the recurrent state's bytes, every slot */
/* One slot's recurrent state copied out (restore 0) or back (restore 1, the slot then holding
 * positions 0..pos-1): len must be pd_model_ssm_slot_bytes. For speculative decoding, which
 * rolls a rejected draft back by restoring and re-running the accepted tokens. */
size_t pd_model_ssm_slot_bytes(const pd_model *m);
int pd_model_ssm_snapshot(pd_model *m, int seq, void *buf, size_t len, int restore, int pos);
/* Weights repacked at load into a faster layout (pd_model_new): how many tensors, their bytes
 * (memory the model holds beyond the mapped file), and tensor i's GGML name of slot / type. */
int pd_model_n_repacked(const pd_model *m);
size_t pd_model_repacked_bytes(const pd_model *m);     /* every copy made at load, the small tensors' too */
size_t pd_model_small_copy_bytes(const pd_model *m);   /* of those, the small tensors moved off the file */
int pd_model_repacked_slot(const pd_model *m, int i);
/* The sampling summary (sampling/summary.h): with inv_t > 0, every following step that returns one row
 * of logits also summarizes them, during its output-head phase, for a truncated draw at
 * temperature 1/inv_t; 0 turns it off. pd_model_summary_sample draws from the last step's summary: the
 * token id, -1 if the summary cannot decide (the caller samples the logits instead), or -2 if
 * the last step made none. */
int pd_model_set_summary(pd_model *m, float inv_t);
int pd_model_summary_sample(pd_model *m, int top_k, double top_p, double min_p, double u01);

/* prefill: runs tokens[0..n) at positions pos..pos+n-1 of sequence slot seq through every
 * layer as one block (mat x mat, causal attention), appends their K/V, writes the last
 * position's logits into logits (n_vocab floats), or every position's (n*n_vocab) if all_logits. */
int pd_prefill(pd_model *m, int seq, const int32_t *tokens, int n, int pos, float *logits, int all_logits);
/* prefill_hidden: prefill's block (its K/V appended the same way), but instead of logits every
 * token's final hidden state after the output norm (what the output head reads), n * n_embd
 * floats into out, token-major; the head is skipped. For embeddings (pydecode/embeddings.py). */
int pd_prefill_hidden(pd_model *m, int seq, const int32_t *tokens, int n, int pos, float *out);
/* decode_step: one token at position pos of slot seq (the slot holds 0..pos-1); n_vocab logits. */
int pd_decode_step(pd_model *m, int seq, int32_t token, int pos, float *logits);
/* batch_step: n <= n_batch tokens of several sequences in one pass (every weight read once for
 * all of them): token i goes to slot seq[i] at position pos[i]; a sequence's tokens must be at
 * consecutive positions, in order (a decode is one token; a prefill chunk several). Logits of
 * tokens out_idx[0..n_out) go to logits[n_out][n_vocab]. */
int pd_batch_step(pd_model *m, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int n,
                  const int32_t *out_idx, int n_out, float *logits);

/* Kernel entry points for tests and benchmarks (isa: "scalar", "avx2", ... or NULL = best). */
const char *pd_isa_best(void);
int pd_isa_supported(const char *isa);
int pd_kernel_quantize_q8(const char *isa, const float *x, void *out, int k);
/* pd_kernel_matmul on the weights repacked (pd_repack) into type's interleaved layout, by the
 * kernel of isa ("scalar": the plain-C twin); PD_EINVAL where isa has no such kernel. */
int pd_kernel_matmul_repacked(const char *isa, int type, const void *w, size_t w_stride, int nrows, int k,
                              const float *x, int ncols, float *y);
/* 1 if isa's table has a kernel for type's repacked layout (so a load repacks it), else 0. */
int pd_kernel_has_repacked(const char *isa, int type);
int pd_repacked_type(int type);        /* the repacked layout's type id of a file type, -1: none */
/* The repacking of nrows (a multiple of 16) rows of k values (row stride src_stride) into
 * pd_repacked_type(type)'s layout at dst (as many bytes as the rows); 0 on success. */
int pd_repack(int type, const void *src, size_t src_stride, int nrows, int k, void *dst);
size_t pd_type_block_bytes(int type);  /* bytes per block of a type */
int pd_kernel_matmul(const char *isa, int type, const void *w, size_t w_stride, int nrows, int k,
                     const float *x, int ncols, float *y);   /* x: ncols x k floats; y: ncols x nrows */
int pd_kernel_dequantize_row(int type, const void *w, float *y, int k);
int pd_kernel_f32_to_f16(const char *isa, const float *x, uint16_t *y, int n);
int pd_kernel_quantize_q8k(const char *isa, const float *x, void *out, int k);
const char *pd_type_name(int type);   /* GGML's name of a type id, "unknown" otherwise */
/* g[i] = act(g[i]) * u[i] (SiLU, or tanh-GELU when gelu), the gated FFN activation. */
int pd_kernel_act_mul(const char *isa, float *g, const float *u, int n, int gelu);
/* Attention as a step computes it (core/attention.c): n_q query heads q[n_q][head_dim] sharing one
 * KV head, over n_pos cached rows k[n_pos], v[n_pos] in the cache format kv_type (one head's
 * head_dim values per row, rows contiguous); out[n_q][head_dim] = softmax(scale q.K^T) V. */
int pd_kernel_attn(const char *isa, int kv_type, int n_q, const float *q, const void *k, const void *v,
                   int n_pos, int head_dim, float scale, float *out);
/* The gated delta rule over n tokens of one head (core/deltanet_chunk.c): S (d x d, value major)
 * advanced, o[t] = S_t^T q_t; kq: n keys then n queries (d each); chunked by isa's table, or
 * token by token with sequential (the twin). */
int pd_kernel_delta_rule(const char *isa, int sequential, float *S, int d, int n, const float *kq, const float *v,
                         const float *beta, const float *g, float *o);
/* The kernel table's group entries over one run of n <= 256 rows (rows contiguous, hd values each,
 * in kv_type's format): scores[h][i] = q_h . K_i (unscaled; a Q8_0 cache's query quantized by
 * isa's quantize_q8), then out[h][j] += sum_i scores[h][i] * V_i[j] (out holds its input). */
int pd_kernel_attn_mh(const char *isa, int kv_type, int nh, int hd, const float *q, const void *k, const void *v,
                      int n, float *scores, float *out);
/* x[k] into k/32 GGML Q8_0 blocks (the KV cache's Q8_0 rows), by isa's quantizer. */
int pd_kernel_quantize_q8_0(const char *isa, const float *x, void *out, int k);

/* Sampling primitives (sampling.c): policy stays in Python, these keep a step's cost small. */
float pd_max_f32(const float *x, int n);
double pd_sum_exp(const char *isa, const float *x, int n, float scale, float shift);
int pd_top_k(const float *x, int n, int k, int32_t *ids, float *vals);
int pd_collect_above(const char *isa, const float *x, int n, float t, int32_t *out);
/* The kernel table whose vocabulary passes pd_sum_exp / pd_collect_above run for isa (NULL: the
 * one $PYDECODE_ISA names, else the best here); the forward pass's table is pd_model_isa. */
const char *pd_sampler_isa(const char *isa);
/* The mapped model file's guard (mapguard.c): within [base, base + len) a SIGBUS (the file was
 * truncated under the mapping) maps a zero page instead of killing the process, and is counted.
 * pd_guard_range returns an id >= 0 (negative: not available here); pd_guard_faults(id) counts
 * the faults so far; pd_unguard_range releases the id. */
int pd_guard_range(const void *base, size_t len);
void pd_unguard_range(int id);
long pd_guard_faults(int id);
/* Read bandwidth in GB/s (best of reps) streaming a buffer of `bytes` with n_threads (bandwidth.c). */
double pd_probe_read_bandwidth(size_t bytes, int n_threads, int reps);

/* Truncated draw over sorted candidates (top-p / min-p, then the draw); see sampling.c. */
int pd_draw_candidates(const float *vals, int n, float inv_t, double z, double top_p, double min_p,
                       int can_grow, double u01);
/* The truncated chain (top-k, top-p, min-p, draw) in one call; returns the token id. */
int pd_sample_truncated(const float *x, int n, int top_k, int first, float inv_t, double top_p,
                        double min_p, double u01);
/* Structured output's token bitmask (bit i % 32 of word i / 32 set = token i allowed; sampling.c):
 * the best allowed token (the first on ties, as numpy's argmax; -1 when none is allowed), the
 * logits with disallowed tokens at -inf (returns the count allowed), and the count allowed. */
int pd_argmax_masked(const float *x, int n, const uint32_t *mask);
int pd_apply_mask(float *dst, const float *x, int n, const uint32_t *mask);
int pd_mask_count(const uint32_t *mask, int n);
/* pd_sample_truncated over the allowed tokens alone, gathered first (ids ascending): when a mask
 * allows few, this reads them instead of the vocabulary. Returns the token id. */
int pd_sample_allowed(const float *x, int n, const uint32_t *mask, int top_k, int first, float inv_t,
                      double top_p, double min_p, double u01);
/* The truncated draw of pd_model_summary_sample over the allowed tokens only, when the summary
 * decides it exactly (top_k <= PD_SUMM_K and at least top_k allowed candidates above every
 * list's threshold); -1: sample the masked logits instead, -2: no summary. */
int pd_model_summary_sample_masked(pd_model *m, int top_k, double top_p, double min_p, double u01,
                                   const uint32_t *mask);
/* Structured output's draw first (sampling.c): a draw from the whole vocabulary's softmax at
 * temperature 1/inv_t, untruncated, and what decides whether the chain (top_k, top_p, min_p)
 * over the allowed tokens keeps it without a mask. sure = 1: it keeps that token in any allowed
 * set that holds it (an exact constrained draw when the grammar allows the token: rejection
 * sampling). Else pd_proposal_keeps decides from the allowed flags of the first candidates. */
typedef struct {
    int token;               /* the draw */
    int index;               /* its place among the candidates, best first; -1: past them */
    int sure;
    int n_cand;              /* candidates held: the vocabulary's best (PD_SUMM_K = 256, or fewer) */
    double z;                /* the vocabulary's exp-sum at inv_t, relative to the best (w_0 = 1) */
    int32_t ids[256];
    float vals[256];
} pd_proposal;
/* Over candidates p->ids/vals (n_cand, sorted) and p->z (0: the candidates are the whole
 * support), the draw u01 lands on: sets token, index (-1 past them: *tail = the target left,
 * token -1) and sure. Returns index. */
int pd_draw_untruncated(pd_proposal *p, float inv_t, int top_k, double top_p, double min_p, double u01,
                        double *tail);
/* From the logits: the token id (-1: out of memory). */
int pd_sample_propose(const float *x, int n, int top_k, float inv_t, double top_p, double min_p, double u01,
                      pd_proposal *p);
/* From the last step's summary: the token id, -1 when the draw lands past its candidates (take
 * the logits), -2 when the step made none. */
int pd_model_summary_propose(pd_model *m, int top_k, double top_p, double min_p, double u01, pd_proposal *p);
/* Whether the chain over the allowed tokens keeps p's token, from allowed[j] (1/0) of its first
 * n_known candidates (n_known > p->index): 1 kept, 0 not, -1 undecided (more flags or a mask). */
int pd_proposal_keeps(const pd_proposal *p, const int8_t *allowed, int n_known, int top_k, float inv_t,
                      double top_p, double min_p);
/* The constrained draw at u01 from the same answers, when they determine the chain over the
 * allowed tokens (the token id), else -1: a mask is needed. */
int pd_proposal_draw_known(const pd_proposal *p, const int8_t *allowed, int n_known, int top_k, float inv_t,
                           double top_p, double min_p, double u01);
/* Whether `token` survives the chain over the mask's allowed tokens: 1 / 0 (-1: out of memory). */
int pd_sample_allowed_keeps(const float *x, int n, const uint32_t *mask, int token, int top_k, float inv_t,
                            double top_p, double min_p);
#endif
