/* The hybrids' recurrent layers (deltanet.c): a gated delta net per layer where
 * pd_config.recurrent_layers says so (Qwen3.5 / Qwen3.6: three of every four layers), and the
 * full-attention layers' output gate (pd_config.attn_gated).
 *
 * A recurrent layer keeps, per sequence slot, a state of fixed size instead of a KV cache: the
 * causal convolution's last d_conv - 1 inputs (C channels) and one d x d matrix per value head.
 * It absorbs a sequence's tokens in order and cannot be cut back, so the core counts the
 * positions each slot's state holds (pos) and a step of a slot must continue there or start
 * afresh at position 0 (step.c checks it; Python's SlotLedger plans by it). */
#ifndef PD_CORE_DELTANET_H
#define PD_CORE_DELTANET_H
#include "pydecode.h"
#include "kernels/kernels.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int n_rec;           /* recurrent layers (0: not a hybrid; every pointer below NULL) */
    uint8_t *layers;     /* [n_layer] the model's copy of cfg->recurrent_layers */
    float **conv;        /* [n_layer] (NULL for attention layers): [n_seq][d_conv - 1][C] */
    float **state;       /* [n_layer]: [n_seq][n_v][d][d], value dim major (row j: value j over the key dims) */
    int32_t *pos;        /* [n_seq] positions each slot's states hold */
    size_t state_bytes;  /* conv + state, every layer and slot */
    /* a step's scratch, for up to n_batch tokens */
    float *qkv;          /* [nb][C]: the projections, then (in place) the convolution's silu output */
    float *z;            /* [nb][n_v d] the output gate's projection */
    float *ba;           /* [nb][2 n_v] beta then alpha, raw */
    float *o;            /* [nb][n_v d] the heads' gated, normed outputs (ssm_out's input) */
    float *chunk;        /* per thread [pd_delta_scratch_floats(d)] (deltanet_chunk.c) */
    int sequential;      /* 1: the delta rule token by token (the chunked form's twin: pd_model_set_delta_sequential) */
    float *qfull;        /* attn_gated: [nb][2 n_head head_dim] attn_q's output (query | gate per head) */
    float *qgate;        /* attn_gated: [nb][n_head head_dim] the gates */
} pd_ssm;

struct pd_model;

static inline int pd_layer_is_recurrent(const pd_config *c, int l) {
    return c->recurrent_layers && c->recurrent_layers[l];
}
/* Channels of a recurrent layer's convolution (q, k, v), and the value width. */
static inline int pd_ssm_channels(const pd_config *c) { return (2 * c->ssm_n_k + c->ssm_n_v) * c->ssm_d_state; }
static inline int pd_ssm_inner(const pd_config *c) { return c->ssm_n_v * c->ssm_d_state; }

/* The config's hybrid fields (hostile counts refused): PD_OK or an error in err. */
int pd_ssm_check_config(const pd_config *c, char *err, int len);
/* Bytes of the states (every slot) and the scratch, for pd_config_memory_bytes. */
size_t pd_ssm_bytes(const pd_config *c);
int pd_ssm_alloc(struct pd_model *m);     /* 0, or -1 out of memory */
void pd_ssm_free(struct pd_model *m);
int pd_ssm_grow(struct pd_model *m, int n_seq);   /* the states of n_seq slots (new ones empty); 0 or -1 */
/* Checks that every slot of a step continues its states (or starts at 0); then records where
 * they will be. PD_OK or an error in m->err. */
int pd_ssm_check_step(struct pd_model *m, const int32_t *pos, const int32_t *seq, int n);
void pd_ssm_advance(struct pd_model *m, const int32_t *pos, const int32_t *seq, int n);
/* One slot's states as bytes (state files, kvstate.c): every recurrent layer's convolution
 * inputs then its heads' matrices, f32, in layer order; 0 bytes for a model without them. */
size_t pd_ssm_slot_bytes(const struct pd_model *m);
void pd_ssm_copy_slot(struct pd_model *m, int seq, char *buf, int to_state);

/* Dims per head at most (a hostile state_size is refused; the chunk scratch grows with it). */
#define PD_SSM_MAX_STATE 512
/* The chunked delta rule (deltanet_chunk.c): a slot's run of tokens per call, at most this many. */
#define PD_DELTA_CHUNK 64
size_t pd_delta_scratch_floats(int d);
void pd_delta_chunk(const pd_kernels *kt, float *S, int d, int n, const float *v, size_t vs, const float *beta,
                    const float *g, float *o, size_t os, float *sc);
void pd_delta_sequential(float *S, int d, int n, const float *kq, const float *v, size_t vs, const float *beta,
                         const float *g, float *o, size_t os);
#endif
