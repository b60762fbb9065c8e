/* The sampling summary of sampling/summary.h: folding chunks of hot logits, and the draw from it. */
#include "core/model.h"
#include "sampling/summary.h"
#include "sampling/fkey.h"
#include "pydecode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* (value descending, id ascending) as one ascending 64-bit key. */
static inline uint64_t rank_key(float v, int32_t id) { return (uint64_t)(~fkey(v)) << 32 | (uint32_t)id; }

static void swap_pair(int32_t *id, float *val, int a, int b) {
    int32_t ti = id[a]; id[a] = id[b]; id[b] = ti;
    float tv = val[a]; val[a] = val[b]; val[b] = tv;
}

/* Moves the k best (by rank_key) of the n pairs to the front, in no particular order. */
static void select_best(int32_t *id, float *val, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;   /* median of three as the pivot */
        uint64_t a = rank_key(val[lo], id[lo]), b = rank_key(val[mid], id[mid]), c = rank_key(val[hi], id[hi]);
        int p = (a < b) == (b < c) ? mid : (b < a) == (a < c) ? lo : hi;
        const uint64_t pk = rank_key(val[p], id[p]);
        swap_pair(id, val, p, hi);
        int store = lo;
        for (int i = lo; i < hi; i++)
            if (rank_key(val[i], id[i]) < pk) swap_pair(id, val, i, store++);
        swap_pair(id, val, store, hi);
        if (store == k - 1 || store == k) return;   /* the first k are the k best */
        if (store < k) lo = store + 1; else hi = store - 1;
    }
}

void pd_summ_reset(pd_summ_list *l) { l->n = 0; l->thr = -INFINITY; }

void pd_summ_fold(const pd_kernels *K, pd_summ_list *l, const float *x, int r0, int n, float inv_t, float *cmax,
                  double *csum) {
    const float mx = pd_max_f32(x, n);
    *cmax = mx;
    *csum = mx == -INFINITY ? 0.0 : K->sum_exp(x, n, inv_t, mx);
    if (!(mx > l->thr)) return;               /* nothing here beats the list: the common case */
    const int got = K->collect_above(x, n, l->thr, l->idx);
    for (int i = 0; i < got; i++) {
        l->id[l->n + i] = r0 + l->idx[i];
        l->val[l->n + i] = x[l->idx[i]];
    }
    l->n += got;
    if (l->n > PD_SUMM_CAP) {
        select_best(l->id, l->val, l->n, PD_SUMM_K);
        l->n = PD_SUMM_K;
        float t = l->val[0];
        for (int i = 1; i < PD_SUMM_K; i++) t = l->val[i] < t ? l->val[i] : t;
        l->thr = t;   /* a later (higher) id equal to it ranks below every kept one */
    }
}

/* LSD radix sort of 64-bit keys, 8 bits a pass (n is at most a few thousand). */
static void radix_sort64(uint64_t *a, uint64_t *tmp, int n) {
    for (int sh = 0; sh < 64; sh += 8) {
        uint32_t count[257] = { 0 };
        for (int i = 0; i < n; i++) count[((a[i] >> sh) & 255) + 1]++;
        if (count[((a[0] >> sh) & 255) + 1] == (uint32_t)n) continue;   /* one bucket: nothing moves */
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        for (int i = 0; i < n; i++) tmp[count[(a[i] >> sh) & 255]++] = a[i];
        memcpy(a, tmp, (size_t)n * sizeof *a);
    }
}

/* The lists' candidates merged, best first, as rank keys (room for 2x: the sort's scratch), and
 * (vals not NULL) room for their values: the count, or -1 (none, or no memory; nothing to free
 * then). */
static int summ_merge(const pd_summ_list *lists, int n_lists, uint64_t **key, float **vals) {
    int total = 0;
    for (int t = 0; t < n_lists; t++) total += lists[t].n;
    if (total < 1) return -1;
    *key = malloc((size_t)total * 2 * sizeof **key);
    if (vals) *vals = malloc((size_t)total * sizeof **vals);
    if (!*key || (vals && !*vals)) { free(*key); if (vals) free(*vals); return -1; }
    int n = 0;
    for (int t = 0; t < n_lists; t++)
        for (int i = 0; i < lists[t].n; i++) (*key)[n++] = rank_key(lists[t].val[i], lists[t].id[i]);
    radix_sort64(*key, *key + total, n);
    return n;
}

/* The vocabulary's exp-sum at inv_t relative to v0, from the chunks' maxima and sums. */
static double summ_z(const float *cmax, const double *csum, int n_chunks, float inv_t, float v0) {
    double z = 0.0;
    for (int c = 0; c < n_chunks; c++)
        if (cmax[c] != -INFINITY) z += csum[c] * exp(((double)cmax[c] - v0) * inv_t);
    return z;
}

int pd_summ_sample(const pd_summ_list *lists, int n_lists, const float *cmax, const double *csum, int n_chunks,
                   int n_vocab, int top_k, float inv_t, double top_p, double min_p, double u01,
                   const uint32_t *mask) {
    const int bounded = top_k > 0 && top_k < n_vocab;
    if (!lists || n_lists < 1 || n_vocab < 1 || (bounded && top_k > PD_SUMM_K)) return -1;
    if (mask && !bounded) return -1;          /* the chunk sums count disallowed tokens too */
    uint64_t *key;
    float *vals;
    int n = summ_merge(lists, n_lists, &key, &vals), rc = -1;
    if (n < 0) return -1;
    if (mask) {   /* structured output: the best top_k allowed candidates, when they are exact */
        float thr = -INFINITY;
        for (int t = 0; t < n_lists; t++) thr = lists[t].thr > thr ? lists[t].thr : thr;
        int kept = 0;
        for (int i = 0; i < n && kept < top_k; i++) {
            const uint32_t id = (uint32_t)(key[i] & 0xffffffffu);
            if ((mask[id >> 5] >> (id & 31)) & 1u) key[kept++] = key[i];
        }
        /* A token no list holds ranks at or below its list's threshold: the k-th allowed
         * candidate must beat every threshold, or an allowed token outside the lists may be better. */
        if (kept < top_k || !(fkey_inv(~(uint32_t)(key[kept - 1] >> 32)) > thr)) goto done;
        n = kept;
    }
    /* As pd_sample_truncated: k = top_k (bounded) or a first list of PD_SUMM_K candidates. Every
     * list holds its thread's best PD_SUMM_K (and more), so the merged best k are exact. */
    const int k = bounded ? top_k : (PD_SUMM_K < n_vocab ? PD_SUMM_K : n_vocab);
    if (n < k) goto done;                     /* (a list can hold fewer only if the vocabulary is small) */
    for (int i = 0; i < k; i++) vals[i] = fkey_inv(~(uint32_t)(key[i] >> 32));
    const int whole = bounded || k == n_vocab;
    const double z = whole ? 0.0 : summ_z(cmax, csum, n_chunks, inv_t, vals[0]);
    const int i = pd_draw_candidates(vals, k, inv_t, z, top_p, min_p, !whole, u01);
    if (i >= 0) rc = (int)(uint32_t)(key[i] & 0xffffffffu);
done:
    free(key);
    free(vals);
    return rc;
}

/* pd_draw_untruncated (sampling.c) over the summary's best PD_SUMM_K and the vocabulary's
 * exp-sum: the token, or -1 past them (the caller draws from the logits, with the same u01). */
int pd_summ_propose(const pd_summ_list *lists, int n_lists, const float *cmax, const double *csum, int n_chunks,
                    int n_vocab, int top_k, float inv_t, double top_p, double min_p, double u01, pd_proposal *p) {
    if (!lists || n_lists < 1 || n_vocab < 1 || !p) return -1;
    uint64_t *key;
    int n = summ_merge(lists, n_lists, &key, NULL), rc = -1;
    if (n < 0) return -1;
    const int k = PD_SUMM_K < n_vocab ? PD_SUMM_K : n_vocab;
    if (n >= k) {
        for (int i = 0; i < k; i++) {
            p->vals[i] = fkey_inv(~(uint32_t)(key[i] >> 32));
            p->ids[i] = (int32_t)(uint32_t)(key[i] & 0xffffffffu);
        }
        p->n_cand = k;
        p->z = k == n_vocab ? 0.0 : summ_z(cmax, csum, n_chunks, inv_t, p->vals[0]);
        if (pd_draw_untruncated(p, inv_t, top_k, top_p, min_p, u01, NULL) >= 0) rc = p->token;
    }
    free(key);
    return rc;
}

int pd_model_set_summary(pd_model *m, float inv_t) {
    if (!m) return PD_EINVAL;
    if (!(inv_t >= 0.0f) || isinf(inv_t)) return pd_set_err(m->err, sizeof m->err, "summary inv_t must be finite and >= 0");
    if (inv_t > 0 && !m->summ) {
        const int ch = pd_chunk_rows(m->c.n_vocab, pd_head(m)->row_bytes);
        if (ch > PD_SUMM_CHUNK) return pd_set_err(m->err, sizeof m->err, "head chunks exceed the summary's");
        m->summ_chunks = N_CHUNKS(m->c.n_vocab, ch);
        m->summ = aligned_alloc(64, ((size_t)m->c.n_threads * sizeof(pd_summ_list) + 63) / 64 * 64);
        m->summ_cmax = malloc((size_t)m->summ_chunks * sizeof(float));
        m->summ_csum = malloc((size_t)m->summ_chunks * sizeof(double));
        if (!m->summ || !m->summ_cmax || !m->summ_csum) {
            free(m->summ); free(m->summ_cmax); free(m->summ_csum);
            m->summ = NULL; m->summ_cmax = NULL; m->summ_csum = NULL;
            pd_set_err(m->err, sizeof m->err, "out of memory for the sampling summary");
            return PD_ENOMEM;
        }
    }
    m->summ_inv_t = inv_t;
    m->summ_ready = 0;
    return PD_OK;
}

int pd_model_summary_sample(pd_model *m, int top_k, double top_p, double min_p, double u01) {
    if (!m || !m->summ_ready) return -2;
    return pd_summ_sample(m->summ, m->c.n_threads, m->summ_cmax, m->summ_csum, m->summ_chunks, m->c.n_vocab,
                          top_k, m->summ_inv_t, top_p, min_p, u01, NULL);
}

int pd_model_summary_sample_masked(pd_model *m, int top_k, double top_p, double min_p, double u01,
                                   const uint32_t *mask) {
    if (!m || !m->summ_ready) return -2;
    if (!mask) return -1;
    return pd_summ_sample(m->summ, m->c.n_threads, m->summ_cmax, m->summ_csum, m->summ_chunks, m->c.n_vocab,
                          top_k, m->summ_inv_t, top_p, min_p, u01, mask);
}

int pd_model_summary_propose(pd_model *m, int top_k, double top_p, double min_p, double u01, pd_proposal *p) {
    if (!m || !m->summ_ready) return -2;
    return pd_summ_propose(m->summ, m->c.n_threads, m->summ_cmax, m->summ_csum, m->summ_chunks, m->c.n_vocab,
                           top_k, m->summ_inv_t, top_p, min_p, u01, p);
}
