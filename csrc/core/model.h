/* The model as the core holds it: the struct every core file shares, the work of one step, and
 * the few small facts more than one core file needs. (Python sees only pydecode.h.)
 *   forward.c  the math of one step: layers, attention, the output head, in phases
 *   step.c     a step's argument checks and its publication to the thread pool
 *   load.c     validation, repacking, allocation; the model's facts (KV capacity, sizes)
 * The sampling summary's part of the model is in sampling/summary.c. */
#ifndef PD_CORE_MODEL_H
#define PD_CORE_MODEL_H
#include "pydecode.h"
#include "kernels/kernels.h"
#include "core/threadpool.h"
#include "sampling/summary.h"
#include "core/moe.h"
#include "core/deltanet.h"

#include <stdatomic.h>
#include <stddef.h>

#define ROW_ALIGN 16  /* rows per thread share: a multiple of the kernels' rows-per-pass and of
                         * PD_REPACK_ROWS (a repacked tensor is split only between row groups) */

struct pd_model {
    pd_config c;
    const pd_kernels *kt;        /* the kernel table (kernels/kernels.h) */
    pd_pool *pool;
    int decode_threads;          /* threads of a one-token step (0: all; pd_model_set_decode_threads) */
    pd_tensor g[PD_GLOBAL_SLOTS];
    pd_tensor *lt;               /* n_layer * PD_LAYER_SLOTS */
    /* KV cache: per layer [n_seq][kv_cap[l]][n_head_kv * head_dim], F16 or F32: one slot per
     * sequence. Position p of sequence s lives in row p % kv_cap[l] of slot s: global layers hold
     * n_ctx positions, sliding-window layers a ring of window + n_batch (a step's earliest query
     * of a sequence still sees its whole window). */
    void **kc, **vc;
    int *kv_cap;
    size_t kv_row_bytes, kv_bytes;   /* one position's K (or V) row of a layer (pd_kv_row_bytes); all */
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
    pd_q8 *qq;       /* q quantized per head [nb][qd/32] (a Q8_0 cache's scores) */
    float *scores;   /* per thread [pd_attn_scratch_floats] (core/attention.c) */
    float *attn_part;/* a wave's partial attention results [wave][n_head][attn_max_chunks][hd + 2] */
    int attn_wave, attn_max_chunks;
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
    /* Weights repacked at load (repack_weights): their buffers (core/hugemem.h), sizes and
     * tensor slots. */
    void **repacked;
    size_t *repacked_size;
    int *repacked_slot, n_repacked;
    size_t repacked_bytes;
    void *small_copy;        /* the small tensors moved off the file beside the repacked ones (load.c) */
    size_t small_copy_size;
    uint8_t *local_layers;     /* the model's copy of cfg->local_layers (c.local_layers points here) */
    /* The sampling summary (summary.h): one candidate list per thread, stats per head chunk. */
    float summ_inv_t;          /* > 0: summarize steps that return one row of logits */
    pd_summ_list *summ;        /* [n_threads], allocated on first use */
    float *summ_cmax;          /* [summ_chunks] */
    double *summ_csum;
    int summ_chunks, summ_ready;
    pd_moe moe;                /* the mixture-of-experts scratch (core/moe.h) */
    pd_ssm ssm;                /* a hybrid's recurrent states and their scratch (core/deltanet.h) */
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
    float *hidden;              /* or [n][n_embd]: every token's state after the output norm, no head
                                   (embeddings: pd_prefill_hidden) */
    uint32_t epoch;
    int summ;                   /* fold the logits into the sampling summary (summary.h) */
    int nth;                    /* the threads running it: chunk counts follow from it, so every
                                   thread must read the same value, under the step's seqlock */
} step_ctx;


/* Layer l's mixture-of-experts FFN (moe.c), after the FFN norm left its input in xn / xq / xqk:
 * x += sum over the token's k experts of weight x expert(xn). -1: fell behind. */
int pd_moe_ffn(pd_worker *w, step_ctx *s, int l);
/* Layer l's gated delta net (deltanet.c), after the attention norm left its input in xn / xq /
 * xqk: x += its output. -1: fell behind. */
int pd_deltanet(pd_worker *w, step_ctx *s, int l);
/* forward.c's phase helpers, shared with deltanet.c: out[t][r] = W[r] . input[t] for rows
 * [r0, r1); xn[t] = rmsnorm(src[t]) (or a copy, w NULL) quantized, every token; x += W @ xn. */
void pd_matmul_rows(pd_model *m, const pd_tensor *w, int r0, int r1, int n, float *out, size_t out_stride);
int pd_phase_norm(pd_worker *w, pd_model *m, const float *src, size_t stride, const pd_tensor *nw, int n_in, int n);
int pd_phase_residual_matmul(pd_worker *w, pd_model *m, const pd_tensor *wt, const pd_tensor *bias,
                             const pd_tensor *post_norm, int n);
/* Whether layer l's FFN is a mixture of experts (its router is present). */
static inline int pd_layer_is_moe(const pd_model *m, int l);

/* Writes a message into an error buffer (pd_model's err, or pd_model_new's); returns PD_EINVAL. */
int pd_set_err(char *buf, int len, const char *fmt, ...);

/* Tensor `slot` (PD_ATTN_NORM..) of layer l. */
static inline const pd_tensor *pd_layer_tensor(const pd_model *m, int l, int slot) {
    return &m->lt[(size_t)l * PD_LAYER_SLOTS + slot];
}
static inline int pd_layer_is_moe(const pd_model *m, int l) {
    return pd_layer_tensor(m, l, PD_GATE_INP)->data != NULL;
}
/* The output head: output.weight, or the embedding table it is tied to. */
static inline const pd_tensor *pd_head(const pd_model *m) {
    return m->g[PD_OUTPUT].data ? &m->g[PD_OUTPUT] : &m->g[PD_TOK_EMBD];
}

/* A sliding-window (local) layer, as the config says (the rule is Python's: ArchConfig.layer_is_local).
 * Its cache is a ring (load.c: kv capacity). */
static inline int pd_layer_is_local(const pd_config *c, int l) {
    return c->sliding_window > 0 && c->local_layers && c->local_layers[l];
}

/* Rows per chunk of a phase over a matrix of `rows` rows of row_bytes weight bytes each: about
 * 64 chunks (enough to balance 16 threads and absorb one descheduled), but no fewer than
 * PD_CHUNK_MIN_BYTES of weights, as each chunk costs a claim on a shared counter (a cache-line
 * transfer between cores): SmolLM2's 576 x 576 matrices in 36 chunks of 5.8 KB spent as long
 * claiming as computing, and ran slower on 2 threads than on 1. They depend on the matrix only
 * (never on the thread count), so every row is computed the same way whatever the threads:
 * results are identical across thread counts. */
#define PD_CHUNK_MIN_BYTES (32 << 10)
static inline int pd_chunk_rows(int rows, size_t row_bytes) {
    int c = (rows / 64 + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
    const size_t min_rows = row_bytes ? (PD_CHUNK_MIN_BYTES + row_bytes - 1) / row_bytes : 0;
    if ((size_t)c < min_rows) c = (int)((min_rows + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN);
    return c < 16 ? 16 : (c > 1024 ? 1024 : c);
}
/* The layers' matmul phases: about PD_CHUNKS_PER_THREAD chunks per running thread, and never
 * more than pd_chunk_rows gives. A thread streams each chunk's weights sequentially, the kernels
 * prefetching ahead (kernels/x86/avx512_kr16.c), but with chunks interleaved between threads the
 * first part of every chunk is read without that lead: the synthetic 3B on 2 threads (Zen 4) ran
 * 14.8-16.1 t/s in 64 chunks per matrix and 16.8-18.7 in 16. Results do not depend on the chunk
 * size (every row is computed the same way in any tile), so they stay identical across thread
 * counts. The output head keeps pd_chunk_rows: its sampler summary is folded per chunk. */
#define PD_CHUNKS_PER_THREAD 8
static inline int pd_matmul_chunk_rows(int rows, size_t row_bytes, int nth) {
    const int c0 = pd_chunk_rows(rows, row_bytes), want = (nth > 0 ? nth : 1) * PD_CHUNKS_PER_THREAD;
    int c = (rows / want + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
    return c > c0 ? (c > 1024 ? 1024 : c) : c0;
}
#define N_CHUNKS(rows, ch) (((rows) + (ch) - 1) / (ch))

/* What every thread of the pool runs for a step (forward.c); ctx is the model's step_ctx. */
void pd_forward_task(void *ctx, int ith, int nth);

/* for each chunk c of this phase that this thread takes: ... ; then wait for the phase */
#define FOR_CHUNKS(w, n, c) for (int c; ((c) = pd_chunk((w), (n))) >= 0; pd_chunk_done(w))
#define END_PHASE(w, n) do { if (pd_phase_end((w), (n))) return -1; } while (0)

/* The KV cache and attention (attention.c). A query's positions are cut at multiples of
 * PD_ATTN_CHUNK; a step's tokens are attended in waves of at most PD_ATTN_MAX_WAVE. */
#define PD_ATTN_CHUNK 256
#define PD_ATTN_MAX_WAVE 256
size_t pd_kv_row_bytes(const pd_config *c);
int pd_attn_max_chunks(const pd_config *c);
int pd_attn_wave(const pd_config *c);
size_t pd_attn_scratch_floats(const pd_config *c);
int pd_step_phases(const pd_model *m, int n);      /* phases a step of n tokens runs, at most */
void pd_append_kv(pd_model *m, int l, int s, int p, float *k, const float *v);
/* The query head h of token t as a Q8_0 cache's scores need it (rotated, quantized to m->qq);
 * nothing for the other formats. */
void pd_attn_query(pd_model *m, int t, int h, float *q);
int pd_attention(pd_worker *w, step_ctx *s, int l); /* layer l's attention phases; -1: fell behind */
size_t pd_kv_layer_off(const pd_model *m, int l, int s, int p);   /* byte offset of (slot, position) */
#endif
