/* Vocabulary-wide sampling primitives, beside the core: Python keeps the policy (sampling.py),
 * these keep a step's sampling cost far below the forward pass even on a 262k-token vocabulary.
 * Portable C over the kernel table's two vocabulary passes (sum_exp, collect_above). */
#include "pydecode.h"
#include "kernels/kernels.h"
#include "sampling/fkey.h"
#include "sampling/summary.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

float pd_max_f32(const float *x, int n) {
    /* 8 independent lanes so the compiler vectorizes without -ffast-math */
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float r = -INFINITY;
    for (int j = 0; j < 8; j++) r = m[j] > r ? m[j] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* The vocabulary passes are kernel-table entries (kernels/kernels.h: sum_exp, collect_above),
 * so one dispatcher picks them for the whole core: isa names a table ("scalar", "avx2", ...), or
 * NULL for the one $PYDECODE_ISA names, else the best this CPU has (one that cannot run here
 * gives way to the best). */
double pd_sum_exp(const char *isa, const float *x, int n, float scale, float shift) {
    return pd_kernels_or_best(isa)->sum_exp(x, n, scale, shift);
}

/* The ids i (ascending) with x[i] > t, into out (room for n + 16); returns how many. top-k's
 * pass over the whole vocabulary. */
int pd_collect_above(const char *isa, const float *x, int n, float t, int32_t *out) {
    return pd_kernels_or_best(isa)->collect_above(x, n, t, out);
}

const char *pd_sampler_isa(const char *isa) { return pd_kernels_or_best(isa)->name; }

/* min-heap of (value, id) on the k best seen so far; ties keep the lower id (deterministic) */
static int worse(float va, int32_t ia, float vb, int32_t ib) { return va < vb || (va == vb && ia > ib); }

static void sift_down(float *v, int32_t *id, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, s = i;
        if (l < k && worse(v[l], id[l], v[s], id[s])) s = l;
        if (r < k && worse(v[r], id[r], v[s], id[s])) s = r;
        if (s == i) return;
        float tv = v[i]; v[i] = v[s]; v[s] = tv;
        int32_t ti = id[i]; id[i] = id[s]; id[s] = ti;
        i = s;
    }
}

/* Heap top-k over x[idx[i]] (or x[i] when idx is NULL), i < n; leaves a min-heap. */
static void heap_top_k(const float *x, const int32_t *idx, int n, int k, int32_t *ids, float *vals) {
    for (int i = 0; i < k; i++) { ids[i] = idx ? idx[i] : i; vals[i] = x[ids[i]]; }
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(vals, ids, k, i);
    float floor = vals[0];
    for (int i = k; i < n; i++) {
        int32_t id = idx ? idx[i] : i;
        if (x[id] <= floor) continue;      /* the common case: a single compare */
        vals[0] = x[id]; ids[0] = id;
        sift_down(vals, ids, k, 0);
        floor = vals[0];
    }
}

/* Per-thread scratch that outlives a call: a fresh malloc of a vocabulary-sized buffer each
 * step went to mmap and page faults (tens of microseconds a step, measured in the decode loop). */
typedef struct { void *p; size_t n; } scratch;
static void *scratch_get(scratch *s, size_t bytes) {
    if (s->n < bytes) {
        void *p = realloc(s->p, bytes);
        if (!p) return NULL;
        s->p = p;
        s->n = bytes;
    }
    return s->p;
}
static _Thread_local scratch s_cand, s_heap, s_hist, s_radix;

/* Collects into cand the ids of values > the j-th best of a strided sample (j about 2k /
 * stride: about 2k values should beat it). Returns how many. */
static int cand_by_sample(const float *x, int n, int k, int stride, int32_t *cand) {
    int ns = 0;
    for (int i = 0; i < n; i += stride) cand[ns++] = i;
    int j = 2 * k / stride + 8;
    j = j < ns ? j : ns;
    int32_t *hid = scratch_get(&s_heap, (size_t)j * (sizeof(int32_t) + sizeof(float)));
    if (!hid) return 0;
    float *hval = (float *)(hid + j);
    heap_top_k(x, cand, ns, j, hid, hval);
    return pd_collect_above(NULL, x, n, hval[0], cand);
}

/* Collects into cand the ids of values whose key is >= the k-th largest key with its low 8
 * bits cleared: two histogram passes (the keys' top 12 bits, then the next 12 within the
 * boundary bin) pin that down, so only k plus a handful of near-ties are collected. */
static int cand_by_histogram(const float *x, int n, int k, int32_t *cand) {
    enum { BINS = 4096 };
    uint32_t *h = scratch_get(&s_hist, BINS * sizeof *h);
    if (!h) return 0;
    memset(h, 0, BINS * sizeof *h);
    uint32_t lo = 0, above = 0;
    for (int level = 0; level < 2; level++) {
        const int shift = level ? 8 : 20;
        if (level) memset(h, 0, BINS * sizeof *h);
        for (int i = 0; i < n; i++) {
            const uint32_t key = fkey(x[i]);
            if (!level) h[key >> 20]++;
            else if ((key >> 20) == (lo >> 20)) h[(key >> 8) & (BINS - 1)]++;
        }
        int bin = BINS - 1;
        for (; bin > 0 && above + h[bin] < (uint32_t)k; bin--) above += h[bin];
        lo |= (uint32_t)bin << shift;
    }
    int nc = 0;
    for (int i = 0; i < n; i++) if (fkey(x[i]) >= lo) cand[nc++] = i;
    return nc;
}

/* The k largest logits, sorted descending (ids and values), ties to the lower id. Returns how
 * many (min(k, n)). Exact, and fast on a big vocabulary whatever k: candidates are narrowed
 * first (by a sample's threshold when k is small against n, else by histograms of the values'
 * bits; all of them when k >= n/2) and radix-sorted, in vocabulary order, so ties keep the lower
 * id. Small inputs (or a failed allocation) take a heap over everything. */
/* Sorts the candidates (ids ascending) by value, descending, keeping id order among equal
 * values: a stable LSD radix sort on the inverted keys, 4 passes of 8 bits. Writes the first k. */
static int radix_first_k(const float *x, const int32_t *cand, int nc, int k, int32_t *ids, float *vals) {
    uint32_t *key = scratch_get(&s_radix, (size_t)nc * 2 * (sizeof(uint32_t) + sizeof(int32_t)));
    if (!key) return -1;
    int32_t *id = (int32_t *)(key + 2 * (size_t)nc);
    uint32_t *k0 = key, *k1 = key + nc;
    int32_t *i0 = id, *i1 = id + nc;
    for (int i = 0; i < nc; i++) { k0[i] = ~fkey(x[cand[i]]); i0[i] = cand[i]; }
    for (int sh = 0; sh < 32; sh += 8) {
        uint32_t count[257] = { 0 };
        for (int i = 0; i < nc; i++) count[((k0[i] >> sh) & 255) + 1]++;
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        for (int i = 0; i < nc; i++) {
            const uint32_t d = count[(k0[i] >> sh) & 255]++;
            k1[d] = k0[i]; i1[d] = i0[i];
        }
        uint32_t *tk = k0; k0 = k1; k1 = tk;
        int32_t *ti = i0; i0 = i1; i1 = ti;
    }
    for (int i = 0; i < k; i++) { ids[i] = i0[i]; vals[i] = x[i0[i]]; }
    return k;
}

int pd_top_k(const float *x, int n, int k, int32_t *ids, float *vals) {
    if (!x || !ids || !vals || n <= 0 || k <= 0) return 0;
    if (k > n) k = n;
    int32_t *cand = n >= 4096 ? scratch_get(&s_cand, ((size_t)n + 16) * sizeof *cand) : NULL;
    int nc = 0, stride = n / (8 * k);
    if (cand && k >= n / 2)            /* most of the vocabulary: sort it all */
        for (nc = 0; nc < n; nc++) cand[nc] = nc;
    else if (cand)
        nc = stride >= 4 ? cand_by_sample(x, n, k, stride, cand) : cand_by_histogram(x, n, k, cand);
    int done = nc >= k && radix_first_k(x, cand, nc, k, ids, vals) == k;
    if (done) return k;
    heap_top_k(x, NULL, n, k, ids, vals);
    /* heap -> descending order: repeatedly move the minimum to the end */
    for (int end = k - 1; end > 0; end--) {
        float tv = vals[0]; vals[0] = vals[end]; vals[end] = tv;
        int32_t ti = ids[0]; ids[0] = ids[end]; ids[end] = ti;
        sift_down(vals, ids, end, 0);
    }
    return k;
}

/* The first index i (in vocabulary order) where the running sum of exp(scale*(x - shift)) over
 * the ids NOT in `skip` (sorted ascending, n_skip of them) reaches target; -1 if never.
 * Used for the rare draw that lands in the tail outside the candidate list. */
static int draw_tail(const float *x, int n, float scale, float shift, const int32_t *skip, int n_skip,
                     double target) {
    double s = 0.0;
    int j = 0;
    for (int i = 0; i < n; i++) {
        if (j < n_skip && skip[j] == i) { j++; continue; }
        s += expf(scale * (x[i] - shift));
        if (s >= target) return i;
    }
    return -1;
}

/* The truncated draw of sampling.py's chain, over candidates already sorted descending (vals,
 * n of them): weights w_i = exp((v_i - v_0) * inv_t) in double; z is the mass they stand
 * against (the whole vocabulary's, from pd_sum_exp; 0: the candidates are the whole support,
 * as after top-k). top_p < 1 keeps the smallest prefix whose share of z reaches top_p; min_p > 0
 * keeps the w_i >= min_p (w_0 == 1); then u01 * (kept mass) picks the first prefix sum above it.
 * Returns the candidate's index, or -1 when the candidates are too few to decide (top_p not
 * reached, or every one passes min_p) and can_grow: the caller asks for more and calls again.
 * One C call instead of a dozen numpy ones: after a decode step has streamed the weights through
 * the caches, each of those cost microseconds (measured: ~100 us a step on SmolLM2). */
int pd_draw_candidates(const float *vals, int n, float inv_t, double z, double top_p, double min_p,
                       int can_grow, double u01) {
    if (!vals || n <= 0) return -1;
    double *w = scratch_get(&s_heap, (size_t)n * sizeof *w);
    if (!w) return 0;
    const double shift = vals[0];
    double total = 0.0;
    for (int i = 0; i < n; i++) { w[i] = exp(((double)vals[i] - shift) * inv_t); total += w[i]; }
    if (z < total) z = total;
    int keep = n;
    if (top_p < 1.0) {
        double cum = 0.0;
        int i = 0;
        for (; i < n; i++) { cum += w[i]; if (cum / z >= top_p) break; }
        if (i == n) { if (can_grow) return -1; i = n - 1; }
        keep = i + 1;
    }
    if (min_p > 0.0) {
        int above = 0;
        for (int i = 0; i < n; i++) above += w[i] >= min_p;
        if (above == n && can_grow) return -1;
        if (above < 1) above = 1;
        if (above < keep) keep = above;
    }
    double mass = 0.0;
    for (int i = 0; i < keep; i++) mass += w[i];
    const double target = u01 * mass;
    double cum = 0.0;
    for (int i = 0; i < keep; i++) { cum += w[i]; if (cum > target) return i; }
    return keep - 1;
}

/* The whole truncated chain of sampling.py after the penalties, in one call: top-k (top_k > 0
 * bounds it; else a first list of `first` candidates that grows x8 while top-p or min-p needs
 * more), the vocabulary's exp-sum when the candidates do not cover it, then pd_draw_candidates.
 * Returns the token id, or -1 when scratch memory runs out. Python would make the same calls,
 * but after a decode step has streamed the weights through the caches every interpreted line
 * costs microseconds (measured ~55 us a step on SmolLM2); one call costs one. */
static _Thread_local scratch s_ids, s_vals;
int pd_sample_truncated(const float *x, int n, int top_k, int first, float inv_t, double top_p,
                        double min_p, double u01) {
    if (!x || n <= 0) return -1;
    const int bounded = top_k > 0 && top_k < n;
    int k = bounded ? top_k : (first > 0 && first < n ? first : n);
    for (;;) {
        int32_t *ids = scratch_get(&s_ids, (size_t)k * sizeof *ids);
        float *vals = scratch_get(&s_vals, (size_t)k * sizeof *vals);
        if (!ids || !vals) return -1;
        const int got = pd_top_k(x, n, k, ids, vals);
        if (got <= 0) return -1;
        const int whole = bounded || got == n;
        const double z = whole ? 0.0 : pd_sum_exp(NULL, x, n, inv_t, vals[0]);
        const int i = pd_draw_candidates(vals, got, inv_t, z, top_p, min_p, !whole, u01);
        if (i >= 0) return ids[i];
        k = k > n / 8 ? n : k * 8;
    }
}

/* ---------------- constrained output: a token bitmask over the vocabulary ----------------
 * mask: bit (i % 32) of word i / 32 set = token i allowed (llguidance's layout, little-endian
 * words). Structured output (pydecode/constraint.py) applies it here, never in a Python loop. */

static inline int allowed(const uint32_t *mask, int i) { return (mask[i >> 5] >> (i & 31)) & 1u; }

int pd_argmax_masked(const float *x, int n, const uint32_t *mask) {
    if (!x || !mask || n <= 0) return -1;
    int best = -1;
    float bv = -INFINITY;
    const int words = (n + 31) / 32;
    for (int w = 0; w < words; w++) {
        uint32_t bits = mask[w];
        const int base = w * 32;
        if (base + 32 > n) bits &= n - base >= 32 ? ~0u : ((1u << (n - base)) - 1u);
        if (bits == ~0u) {   /* a whole word allowed: a plain max (vectorizes), then its first index */
            float m = -INFINITY;
            for (int j = 0; j < 32; j++) m = x[base + j] > m ? x[base + j] : m;
            if (m > bv || (best < 0 && m == bv)) {
                for (int j = 0; j < 32; j++)
                    if (x[base + j] == m) { bv = m; best = base + j; break; }
            }
            continue;
        }
        while (bits) {       /* the first index of the maximum wins, as numpy's argmax */
            const int j = __builtin_ctz(bits);
            bits &= bits - 1;
            const float v = x[base + j];
            if (v > bv || (best < 0 && !(v < bv))) { bv = v; best = base + j; }
        }
    }
    return best;
}

int pd_apply_mask(float *dst, const float *x, int n, const uint32_t *mask) {
    if (!dst || !x || !mask || n <= 0) return -1;
    int count = 0;
    for (int i = 0; i < n; i++) {
        const int a = allowed(mask, i);
        dst[i] = a ? x[i] : -INFINITY;
        count += a;
    }
    return count;
}

int pd_mask_count(const uint32_t *mask, int n) {
    if (!mask || n <= 0) return 0;
    int count = 0;
    for (int w = 0; w < n / 32; w++) count += __builtin_popcount(mask[w]);
    if (n % 32) count += __builtin_popcount(mask[n / 32] & ((1u << (n % 32)) - 1u));
    return count;
}

static _Thread_local scratch s_allowed_id, s_allowed_val;

/* The mask's allowed tokens gathered, ids ascending (top-k's ties keep the lower id), with their
 * logits, into this thread's scratch: how many (-1: out of memory, or none allowed). */
static int gather_allowed(const float *x, int n, const uint32_t *mask, int32_t **ids, float **vals) {
    const int c = pd_mask_count(mask, n);
    if (c <= 0) return -1;
    *ids = scratch_get(&s_allowed_id, (size_t)c * sizeof **ids);
    *vals = scratch_get(&s_allowed_val, (size_t)c * sizeof **vals);
    if (!*ids || !*vals) return -1;
    int m = 0;
    for (int w = 0; w < (n + 31) / 32; w++) {
        uint32_t bits = mask[w];
        while (bits) {
            const int i = w * 32 + __builtin_ctz(bits);
            bits &= bits - 1;
            if (i >= n) break;
            (*ids)[m] = i;
            (*vals)[m++] = x[i];
        }
    }
    return m;
}

int pd_sample_allowed(const float *x, int n, const uint32_t *mask, int top_k, int first, float inv_t,
                      double top_p, double min_p, double u01) {
    if (!x || !mask || n <= 0) return -1;
    int32_t *ids;
    float *vals;
    const int m = gather_allowed(x, n, mask, &ids, &vals);
    if (m <= 0) return -1;
    const int j = pd_sample_truncated(vals, m, top_k > 0 && top_k < m ? top_k : 0, first, inv_t, top_p, min_p, u01);
    return j >= 0 ? ids[j] : j;
}

/* ---------------- structured output: a draw first, the mask only when it is needed ----------------
 * A constrained draw is the chain (top-k, top-p, min-p, the draw) over the allowed tokens alone.
 * Rejection sampling gives it without a mask on most steps (constraint.py): draw y from the
 * whole vocabulary's softmax at the temperature, untruncated; when y is allowed and survives
 * the chain over the allowed tokens, it IS a draw of the constrained chain (a softmax draw that
 * lands in a set is distributed as the softmax over that set); when not, a fresh draw under the
 * mask is (the two branches mix to the same distribution). Whether y survives is often known
 * without the mask, from its place among the vocabulary's best ("sure"): top-k: its rank among
 * the allowed is at most its rank overall; top-p: the allowed mass above it is at most the
 * whole mass above it M, and the allowed top-k's mass at least that plus its own w, so M / (M +
 * w) < top_p suffices; min-p: the best allowed token weighs at most the best overall. */
_Static_assert(PD_SUMM_K == sizeof(((pd_proposal *)0)->ids) / sizeof(int32_t), "pd_proposal holds PD_SUMM_K");

int pd_draw_untruncated(pd_proposal *p, float inv_t, int top_k, double top_p, double min_p, double u01,
                        double *tail) {
    if (!p) return -1;
    p->token = p->index = -1;
    p->sure = 0;
    const int k = p->n_cand;
    if (k <= 0 || k > PD_SUMM_K) return -1;
    double w[PD_SUMM_K];
    const double shift = p->vals[0];
    double total = 0.0;
    for (int i = 0; i < k; i++) { w[i] = exp(((double)p->vals[i] - shift) * inv_t); total += w[i]; }
    double z = p->z < total ? total : p->z;
    const double target = u01 * z;
    double cum = 0.0;
    for (int i = 0; i < k; i++) {
        if (cum + w[i] > target || (i == k - 1 && z == total)) {
            p->index = i;
            p->token = p->ids[i];
            p->sure = (top_k <= 0 || i < top_k) && (top_p >= 1.0 || cum < top_p * (cum + w[i]))
                      && (min_p <= 0.0 || w[i] >= min_p);
            return i;
        }
        cum += w[i];
    }
    if (tail) *tail = target - cum;
    return -1;
}

static _Thread_local scratch s_skip;
static int cmp_id(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int pd_sample_propose(const float *x, int n, int top_k, float inv_t, double top_p, double min_p, double u01,
                      pd_proposal *p) {
    if (!x || n <= 0 || !p) return -1;
    const int k = n < PD_SUMM_K ? n : PD_SUMM_K;   /* the summary's candidates: the same draw either way */
    if (pd_top_k(x, n, k, p->ids, p->vals) != k) return -1;
    p->n_cand = k;
    p->z = k == n ? 0.0 : pd_sum_exp(NULL, x, n, inv_t, p->vals[0]);
    double tail = 0.0;
    if (pd_draw_untruncated(p, inv_t, top_k, top_p, min_p, u01, &tail) >= 0) return p->token;
    /* past the candidates (rare): the tail, in vocabulary order, not sure of anything */
    int32_t *skip = scratch_get(&s_skip, (size_t)k * sizeof *skip);
    if (!skip) return -1;
    memcpy(skip, p->ids, (size_t)k * sizeof *skip);
    qsort(skip, (size_t)k, sizeof *skip, cmp_id);
    const int t = draw_tail(x, n, inv_t, p->vals[0], skip, k, tail);
    p->token = t >= 0 ? t : p->ids[k - 1];
    return p->token;
}

/* The most the tokens past the first `known` mass (all relative to the best) may weigh, given
 * the vocabulary's exp-sum z (0: the candidates, `total`, are all of it). z is a float-lane sum
 * (pd_sum_exp, or the summary's chunk sums): its rounding stays far below the 1% allowed here. */
static double unknown_mass(double z, double total, double known) {
    const double zz = (z > total ? z : total) * 1.01;
    return zz - known > 0.0 ? zz - known : 0.0;
}

/* The exact decision from the grammar's answers for the first n_known candidates, when the
 * draw was not sure: its rank among the allowed (top-k), the best allowed (min-p) and the
 * allowed mass above it (top-p) are then known; top-p's normalizer lies between the known
 * allowed mass and that plus what the unknown tokens may add (each weighs at most the first
 * unknown candidate): decided when the whole interval agrees. */
int pd_proposal_keeps(const pd_proposal *p, const int8_t *allowed, int n_known, int top_k, float inv_t,
                      double top_p, double min_p) {
    if (!p || !allowed) return -1;
    const int i = p->index, k = p->n_cand;
    if (i < 0 || n_known <= i || n_known > k || k > PD_SUMM_K) return -1;
    if (!allowed[i]) return 0;
    const double v0 = p->vals[0];
    double known = 0.0, known_allowed = 0.0, first_k = 0.0, above = 0.0, wmax = 0.0;
    int n_allowed = 0, rank = 0;
    for (int j = 0; j < n_known; j++) {
        const double w = exp(((double)p->vals[j] - v0) * inv_t);
        known += w;
        if (!allowed[j]) continue;
        if (n_allowed == 0) wmax = w;
        if (j < i) { above += w; rank++; }
        if (top_k > 0 && n_allowed < top_k) first_k += w;
        known_allowed += w;
        n_allowed++;
    }
    if (top_k > 0 && rank >= top_k) return 0;
    const double wy = exp(((double)p->vals[i] - v0) * inv_t);
    if (min_p > 0.0 && !(wy >= min_p * wmax)) return 0;
    if (top_p >= 1.0 || rank == 0) return 1;
    const double wnext = exp(((double)p->vals[n_known < k ? n_known : k - 1] - v0) * inv_t);
    double zlo, zhi;
    if (top_k > 0) {   /* the allowed top-k's mass (or all allowed, when fewer) */
        zlo = n_allowed >= top_k ? first_k : known_allowed;
        zhi = n_allowed >= top_k ? first_k : known_allowed + (top_k - n_allowed) * wnext;
    } else {           /* all allowed mass: the unknown part at most the rest of the vocabulary's */
        double total = known;
        for (int j = n_known; j < k; j++) total += exp(((double)p->vals[j] - v0) * inv_t);
        zlo = known_allowed;
        zhi = known_allowed + unknown_mass(p->z, total, known);
    }
    if (above < top_p * zlo) return 1;
    if (above >= top_p * zhi) return 0;
    return -1;
}

/* The constrained draw itself from the same answers, when they determine it: the allowed
 * candidates among the first n_known, best first, are the best allowed tokens of the whole
 * vocabulary (every unknown token weighs at most the first unknown candidate, wnext); the
 * chain keeps a prefix of them whose length is fixed whatever the unknown tokens are when
 * top-k is filled by known ones (or the unknown could add at most (top_k - found) * wnext),
 * top-p's cut is the same at both ends of its normalizer's interval, and min-p's threshold
 * is above wnext. Then u01 picks in that prefix as pd_draw_candidates does. */
int pd_proposal_draw_known(const pd_proposal *p, const int8_t *allowed, int n_known, int top_k, float inv_t,
                           double top_p, double min_p, double u01) {
    if (!p || !allowed) return -1;
    const int k = p->n_cand;
    if (n_known <= 0 || n_known > k || k > PD_SUMM_K) return -1;
    /* Weights relative to the best allowed token (relative to the vocabulary's best they can
     * all underflow to 0 at a low temperature when the grammar refuses the best by far). */
    int a0 = 0;
    while (a0 < n_known && !allowed[a0]) a0++;
    if (a0 == n_known) return -1;
    const double v0 = p->vals[0], va = p->vals[a0];
    double w[PD_SUMM_K], known0 = 0.0, total0 = 0.0;   /* (known0, total0: relative to v0) */
    int at[PD_SUMM_K], n = 0;
    for (int j = 0; j < k; j++) {
        const double wj = exp(((double)p->vals[j] - v0) * inv_t);
        total0 += wj;
        if (j >= n_known) continue;
        known0 += wj;
        if (allowed[j]) { w[n] = exp(((double)p->vals[j] - va) * inv_t); at[n++] = j; }
    }
    const int none_unknown = n_known == k && p->z == 0.0;   /* the candidates are the vocabulary */
    const double wnext = none_unknown ? 0.0 : exp(((double)p->vals[n_known < k ? n_known : k - 1] - va) * inv_t);
    int base = n;                               /* the known part of the chain's base set */
    double unknown = 0.0;                       /* what the unknown tokens may add to its mass */
    if (top_k > 0) {
        if (n >= top_k) base = top_k; else unknown = (top_k - n) * wnext;
    } else if (!none_unknown) {
        unknown = unknown_mass(p->z, total0, known0) * exp(((double)v0 - va) * inv_t);
        if (!isfinite(unknown)) return -1;
    }
    double zlo = 0.0;
    for (int j = 0; j < base; j++) zlo += w[j];
    const double zhi = zlo + unknown;
    /* min-p: the known ones above min_p of the best; decided when no unknown token can pass */
    int keep_m = base, m_known = 1;
    if (min_p > 0.0) {
        keep_m = 0;
        while (keep_m < base && w[keep_m] >= min_p * w[0]) keep_m++;
        if (keep_m < 1) keep_m = 1;
        m_known = keep_m < base || unknown == 0.0 || wnext < min_p * w[0];
    } else {
        m_known = unknown == 0.0;
    }
    /* top-p: the cut at both ends of the normalizer's interval */
    int keep_p = base, p_known = unknown == 0.0;
    if (top_p < 1.0) {
        int lo = -1, hi = -1;
        double cum = 0.0;
        for (int j = 0; j < base; j++) {
            cum += w[j];
            if (lo < 0 && cum >= top_p * zlo) lo = j + 1;
            if (hi < 0 && cum >= top_p * zhi) { hi = j + 1; break; }
        }
        if (lo < 0) lo = base;                  /* (rounding: all of it, as pd_draw_candidates) */
        if (hi < 0 && unknown == 0.0) hi = base;
        keep_p = lo;
        p_known = hi == lo;
    }
    int keep;   /* min(top-p's, min-p's) */
    if (p_known && m_known) keep = keep_p < keep_m ? keep_p : keep_m;
    else if (p_known) keep = keep_p;                      /* min-p keeps all of base, or more */
    else if (m_known && keep_m <= keep_p) keep = keep_m;  /* top-p keeps keep_p (its low end), or more */
    else return -1;
    double mass = 0.0;
    for (int j = 0; j < keep; j++) mass += w[j];
    const double target = u01 * mass;
    double cum = 0.0;
    for (int j = 0; j < keep; j++) { cum += w[j]; if (cum > target) return p->ids[at[j]]; }
    return p->ids[at[keep - 1]];
}

/* Whether `token` survives the chain over the allowed tokens (pd_sample_allowed's, to the same
 * order: value descending, id ascending on ties): its rank under top-k, the allowed mass above
 * it under top-p, its weight against the best allowed under min-p. The exact answer when the
 * draw-first check was not sure. 1 / 0, or -1 when scratch memory runs out. */
int pd_sample_allowed_keeps(const float *x, int n, const uint32_t *mask, int token, int top_k, float inv_t,
                            double top_p, double min_p) {
    if (!x || !mask || n <= 0 || token < 0 || token >= n || !allowed(mask, token)) return 0;
    int32_t *ids;
    float *vals;
    const int m = gather_allowed(x, n, mask, &ids, &vals);
    if (m <= 0) return -1;
    const float xy = x[token];
    float vmax = -INFINITY;
    int rank = 0;   /* the allowed ranked above it: larger values, or equal ones with lower ids */
    for (int i = 0; i < m; i++) {
        vmax = vals[i] > vmax ? vals[i] : vmax;
        rank += vals[i] > xy || (vals[i] == xy && ids[i] < token);
    }
    const int bounded = top_k > 0 && top_k < m;
    if (bounded && rank >= top_k) return 0;
    const double wy = exp(((double)xy - vmax) * inv_t);
    if (min_p > 0.0 && !(wy >= min_p)) return 0;
    if (top_p >= 1.0 || rank == 0) return 1;
    double above = 0.0, z;   /* their mass */
    for (int i = 0; i < m; i++)
        if (vals[i] > xy || (vals[i] == xy && ids[i] < token)) above += exp(((double)vals[i] - vmax) * inv_t);
    if (bounded) {   /* top-p's mass is the allowed top-k's */
        int32_t *tid = scratch_get(&s_ids, (size_t)top_k * sizeof *tid);
        float *tv = scratch_get(&s_vals, (size_t)top_k * sizeof *tv);
        if (!tid || !tv || pd_top_k(vals, m, top_k, tid, tv) != top_k) return -1;
        z = 0.0;
        for (int i = 0; i < top_k; i++) z += exp(((double)tv[i] - vmax) * inv_t);
    } else {         /* the whole allowed set's, by the table's vectorized exp-sum */
        z = pd_sum_exp(NULL, vals, m, inv_t, vmax);
    }
    return above / z < top_p;
}
