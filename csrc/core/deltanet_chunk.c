/* The gated delta rule over a chunk of tokens in matrix form (deltanet.c's phase_delta runs it;
 * pd_delta_sequential below, token by token, is the twin the tests hold it to).
 *
 * Token t of the chunk (t = 0..n-1) decays the state by exp(g_t), then writes beta_t times the
 * error of its value: S_t = exp(g_t) S_{t-1} + k_t u_t^T, u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t).
 * With G_t = g_0 + .. + g_t and D[t][s] = exp(G_t - G_s) (s <= t: the decay from s to t), unrolled
 * from the chunk's first state S:
 *
 *   u_t = beta_t (v_t - e^G_t S^T k_t) - sum_{s<t} beta_t D[t][s] (k_s . k_t) u_s   (a triangular solve)
 *   o_t = S_t^T q_t = e^G_t S^T q_t + sum_{s<=t} D[t][s] (k_s . q_t) u_s
 *   S_n = e^G_{n-1} S + sum_s D[n-1][s] k_s u_s^T
 *
 * so the state is read twice per chunk (S^T [k q] for every token at once, then its update)
 * instead of twice per token, and every product is a kernel-table entry (matmul_f32, attn_accum,
 * attn_accum_mh over F32 rows): SIMD on every ISA, the scalar table's loops as their twins. A
 * one-token chunk is the decode step: the same two passes over S as the sequential form. */
#include "core/model.h"

#include <math.h>
#include <string.h>

/* Per thread, for a chunk of PD_DELTA_CHUNK tokens of a head of d dims (deltanet.c's chunk_floats). */
size_t pd_delta_scratch_floats(int d) {
    const size_t n = PD_DELTA_CHUNK, dd = (size_t)d;
    return 2 * n * dd      /* kq: the chunk's k rows, then its q rows (the caller's) */
         + 2 * n * dd      /* wp: S^T k_t, then S^T q_t */
         + 3 * n * n       /* b: k_s . k_t, then k_s . q_t; dk: D[t][s] */
         + n * dd          /* u */
         + n * dd;         /* mw: weights, up to d rows of n */
}

/* Advances S (d x d, value major: S[r][i], value dim r over key dim i) over n <= PD_DELTA_CHUNK
 * tokens and writes o_t = S_t^T q_t at o + t*os. kq (in sc, first): [n][d] l2-normalized keys,
 * then [n][d] queries (scaled); v_t at v + t*vs; beta[t]; g[t] the log decay (<= 0). */
void pd_delta_chunk(const pd_kernels *kt, float *S, int d, int n, const float *v, size_t vs, const float *beta,
                    const float *g, float *o, size_t os, float *sc) {
    const size_t dd = (size_t)d, N = PD_DELTA_CHUNK;
    const float *kq = sc;
    float *wp = sc + 2 * N * dd, *b = wp + 2 * N * dd, *dk = b + 2 * N * N, *u = dk + N * N, *mw = u + N * dd;
    double G[PD_DELTA_CHUNK], acc = 0.0;
    float e[PD_DELTA_CHUNK];
    for (int t = 0; t < n; t++) {   /* in double: G_t - G_s of two long sums keeps its digits */
        acc += g[t];
        G[t] = acc;
        e[t] = (float)exp(acc);
    }
    for (int t = 0; t < n; t++)
        for (int s = 0; s <= t; s++) dk[t * n + s] = (float)exp(G[t] - G[s]);
    kt->matmul[PD_F32](d, S, dd * sizeof(float), d, kq, dd * sizeof(float), 2 * n, wp, dd);   /* S^T [k q] */
    kt->matmul[PD_F32](d, kq, dd * sizeof(float), n, kq, dd * sizeof(float), 2 * n, b, (size_t)n);  /* k_s . [k q]_t */
    for (int t = 0; t < n; t++) {   /* u, row by row: row t needs rows s < t */
        float *ut = u + (size_t)t * dd;
        const float *vt = v + (size_t)t * vs, *wt = wp + (size_t)t * dd;
        for (int r = 0; r < d; r++) ut[r] = beta[t] * (vt[r] - e[t] * wt[r]);
        if (!t) continue;
        for (int s = 0; s < t; s++) mw[s] = -beta[t] * dk[t * n + s] * b[t * n + s];
        kt->attn_accum(ut, mw, u, dd, t, d, 0);
    }
    for (int t = 0; t < n; t++) {
        float *ot = o + (size_t)t * os;
        const float *pt = wp + (size_t)(n + t) * dd;
        for (int r = 0; r < d; r++) ot[r] = e[t] * pt[r];
        for (int s = 0; s <= t; s++) mw[s] = dk[t * n + s] * b[(size_t)(n + t) * n + s];
        kt->attn_accum(ot, mw, u, dd, t + 1, d, 0);
    }
    /* S = e^G_last S + sum_s D[last][s] k_s u_s^T: row r of S gains sum_s (D u_s[r]) k_s, one
     * "head" per row r over the n key rows */
    const float el = e[n - 1];
    for (size_t i = 0; i < dd * dd; i++) S[i] *= el;
    for (int r = 0; r < d; r++)
        for (int s = 0; s < n; s++) mw[(size_t)r * n + s] = dk[(n - 1) * n + s] * u[(size_t)s * dd + r];
    kt->attn_accum_mh(PD_KV_F32, d, d, S, mw, (size_t)n, kq, dd * sizeof(float), n);
}

/* The twin, token by token, with pd_delta_chunk's arguments (kq its own, not in a scratch): row r
 * of S decays, gives S^T k, takes the update and gives S^T q in one pass. */
void pd_delta_sequential(float *S, int d, int n, const float *kq, const float *v, size_t vs, const float *beta,
                         const float *g, float *o, size_t os) {
    for (int t = 0; t < n; t++) {
        const float *k = kq + (size_t)t * d, *q = kq + (size_t)(n + t) * d, *vt = v + (size_t)t * vs;
        const float decay = expf(g[t]);
        for (int r = 0; r < d; r++) {
            float *Sr = S + (size_t)r * d, sk = 0.0f;
            for (int i = 0; i < d; i++) { Sr[i] *= decay; sk += Sr[i] * k[i]; }
            const float delta = (vt[r] - sk) * beta[t];
            float out = 0.0f;
            for (int i = 0; i < d; i++) { Sr[i] += delta * k[i]; out += Sr[i] * q[i]; }
            o[(size_t)t * os + r] = out;
        }
    }
}
