/* A step's logits summarized for the sampler while they are hot (sampling/summary.c).
 *
 * Reading a 49k-262k logit vector after the step costs tens of microseconds: the output head
 * has streamed tens of MB of weights through the caches since those logits were written. So
 * during the head phase, the thread that has just computed a chunk of logits folds it, from
 * L1/L2, into (a) the chunk's max and exp-sum at the sampler's temperature, and (b) its own
 * running list of the best candidates (everything above its current threshold; when the list
 * fills up it keeps the best PD_SUMM_K and raises the threshold). After the step the sampler
 * merges those few hundred candidates and rescales the chunk sums into the vocabulary's
 * normalizer: the same candidates and (to rounding) the same normalizer as a pass over the
 * whole vector, without that pass. */
#ifndef PD_SUMMARY_H
#define PD_SUMMARY_H
#include <stdint.h>
#include "kernels/kernels.h"
#include "pydecode.h"

#define PD_SUMM_K 256                 /* candidates kept: top-k up to this, else the full path */
#define PD_SUMM_CAP 512               /* a list is cut back to PD_SUMM_K when it passes this */
#define PD_SUMM_CHUNK 1024            /* the largest chunk of rows a head phase hands out */

typedef struct {
    int n;                            /* candidates held (ids ascending within each fold) */
    float thr;                        /* only values above it can still be among the best */
    int32_t id[PD_SUMM_CAP + PD_SUMM_CHUNK + 16];
    float val[PD_SUMM_CAP + PD_SUMM_CHUNK + 16];
    int32_t idx[PD_SUMM_CHUNK + 16];  /* scratch for one chunk's collection */
} pd_summ_list;

void pd_summ_reset(pd_summ_list *l);
/* Folds logits x[0..n) (ids r0..r0+n-1, n <= PD_SUMM_CHUNK) into list l and writes the chunk's
 * max and exp-sum (sum of exp((x - max) * inv_t)), with the vocabulary passes of table K (the
 * model's). */
void pd_summ_fold(const pd_kernels *K, pd_summ_list *l, const float *x, int r0, int n, float inv_t, float *cmax,
                  double *csum);
/* The sampler's truncated draw (as pd_sample_truncated) from n_lists folded lists and n_chunks
 * chunk stats: the token id, or -1 when the summary cannot decide it (top_k above PD_SUMM_K, or
 * top-p / min-p needing more candidates than it holds): the caller then takes the full path.
 * mask (NULL: none): only those tokens may be drawn (structured output's bitmask; bounded top_k only). */
int pd_summ_sample(const pd_summ_list *lists, int n_lists, const float *cmax, const double *csum, int n_chunks,
                   int n_vocab, int top_k, float inv_t, double top_p, double min_p, double u01,
                   const uint32_t *mask);
/* Structured output's draw-first proposal (pd_draw_untruncated, pydecode.h) from the lists: the
 * token id, or -1 when the draw lands past the best PD_SUMM_K (the caller reads the logits). */
int pd_summ_propose(const pd_summ_list *lists, int n_lists, const float *cmax, const double *csum, int n_chunks,
                    int n_vocab, int top_k, float inv_t, double top_p, double min_p, double u01, pd_proposal *p);
#endif
