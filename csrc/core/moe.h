/* The mixture-of-experts FFN (moe.c): its scratch, part of struct pd_model, and its entry points.
 *
 * A step's tokens are routed (router logits -> gating -> top-k -> weights, per token), then
 * grouped by expert: the (token, expert) pairs are numbered expert by expert, tokens in order
 * within an expert, so an expert's pairs are one contiguous run of rows. Each chosen expert's
 * weights are then streamed once per step, as one matmul whose columns are its tokens. */
#ifndef PD_CORE_MOE_H
#define PD_CORE_MOE_H
#include "pydecode.h"
#include "kernels/formats.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    void *block;         /* the one allocation everything below lives in (NULL: a dense model) */
    size_t bytes;
    float *logits;       /* [nb][n_expert] router logits */
    int32_t *sel;        /* [nb][k] chosen experts, largest logit first */
    float *wt;           /* [nb][k] their weights */
    int32_t *pair;       /* [nb][k] the pair number of (token, j) */
    int32_t *tok;        /* [P] the token of pair p (P = nb * k) */
    int32_t *start;      /* [n_expert + 1] expert e's pairs are start[e] .. start[e + 1] - 1 */
    int32_t *cursor;     /* [n_expert] grouping scratch */
    int32_t *active;     /* [n_expert] the experts holding pairs this step, ascending */
    int32_t *n_active;   /* [n_layer] how many, per layer: a phase's chunk count follows from it, and a
                            thread that lags a few phases behind (the others took all their chunks)
                            must still read its layer's count, not the next layer's */
    size_t in_stride;    /* values per row of the pair inputs: max(n_embd, n_ff_exp) */
    float *xf;           /* [P][in_stride] the pairs' float inputs (F32/F16 experts) */
    pd_q8 *xq;           /* [P][in_stride / 32] the pairs' Q8 inputs */
    pd_q8k *xqk;         /* [P][in_stride / 256 + 1] the pairs' Q8_K inputs */
    float *g, *u;        /* [P][n_ff_exp] gate (then act(gate) * up) and up outputs */
    float *y;            /* [P][n_embd] the experts' down projections, before weighting */
    /* the shared expert (n_ff_shexp > 0), per token: */
    float *sg, *su;      /* [nb][n_ff_shexp] gate (then act(gate) * up) and up */
    pd_q8 *sxq;          /* [nb][n_ff_shexp / 32] sg quantized for its down */
    pd_q8k *sxqk;        /* [nb][n_ff_shexp / 256 + 1] */
    float *sy;           /* [nb][n_embd] its down projection */
    float *sgate;        /* [nb] its weight: sigmoid(gate_inp_shexp . x), or 1 */
} pd_moe;

struct pd_model;

/* Bytes of the MoE scratch for cfg (0 for a dense model): in pd_config_memory_bytes. */
size_t pd_moe_scratch_bytes(const pd_config *c);
/* Allocates / frees m->moe (once, at load). pd_moe_alloc: 0, or -1 out of memory. */
int pd_moe_alloc(struct pd_model *m);
void pd_moe_free(struct pd_model *m);
/* The config's MoE fields, checked at load (hostile counts): PD_OK or an error in err. */
int pd_moe_check_config(const pd_config *c, char *err, int len);
/* Phases an MoE layer runs beyond a dense one (pd_step_phases). */
#define PD_MOE_EXTRA_PHASES 4
#endif
