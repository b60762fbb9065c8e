/* A step's way into the core: its arguments checked, then published to the thread pool.
 *
 * pd_prefill / pd_decode_step run one sequence's tokens (in chunks of n_batch:
 * causal attention makes chunked == whole-block, exactly), pd_prefill_hidden the same for their
 * normed final states (embeddings); pd_batch_step runs several
 * sequences' tokens in one pass. Each checks everything first (no thread touches a bad id,
 * position or slot), then publish_step() hands the step to the pool and runs its share.
 */
#include "core/model.h"

#include <string.h>

/* Checks a step's arguments before any thread touches them: every id, position and slot in
 * range, and each sequence's tokens at consecutive positions (the attention of a token reads
 * its sequence's earlier positions: the cache, or tokens earlier in this step). */
static int check_step(pd_model *m, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int n,
                      const int32_t *out_idx, int n_out) {
    const pd_config *c = &m->c;
    if (n < 1) return pd_set_err(m->err, sizeof m->err, "no tokens given (n=%d)", n);
    if (n > c->n_batch) return pd_set_err(m->err, sizeof m->err, "%d tokens in one step exceed n_batch %d", n, c->n_batch);
    if (n_out < 0 || n_out > n) return pd_set_err(m->err, sizeof m->err, "n_out %d outside 0..%d", n_out, n);
    for (int s = 0; s < c->n_seq; s++) m->seq_next[s] = -1;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
            return pd_set_err(m->err, sizeof m->err, "token id %d at index %d is outside the vocabulary (0..%d)",
                           tokens[i], i, c->n_vocab - 1);
        if (seq[i] < 0 || seq[i] >= c->n_seq)
            return pd_set_err(m->err, sizeof m->err, "sequence slot %d at index %d is outside 0..%d", seq[i], i, c->n_seq - 1);
        if (pos[i] < 0 || pos[i] >= c->n_ctx) {
            pd_set_err(m->err, sizeof m->err, "position %d at index %d exceeds the context size %d", pos[i], i, c->n_ctx);
            return PD_ERANGE;
        }
        int *next = &m->seq_next[seq[i]];
        if (*next >= 0 && pos[i] != *next)
            return pd_set_err(m->err, sizeof m->err, "sequence %d: position %d at index %d does not follow %d",
                           seq[i], pos[i], i, *next - 1);
        *next = pos[i] + 1;
    }
    for (int i = 0; i < n_out; i++)
        if (out_idx[i] < 0 || out_idx[i] >= n)
            return pd_set_err(m->err, sizeof m->err, "logits row %d outside the step's tokens 0..%d", out_idx[i], n - 1);
    return pd_ssm_check_step(m, pos, seq, n);   /* a hybrid's states continue (core/deltanet.h) */
}

static void publish_step(pd_model *m, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int n,
                        const int32_t *out_idx, int n_out, float *logits, float *hidden) {
    step_ctx *s = m->step;
    const int summ = m->summ_inv_t > 0 && n_out == 1 && logits;
    if (summ)
        for (int t = 0; t < m->c.n_threads; t++) pd_summ_reset(&m->summ[t]);
    m->summ_ready = summ;
    atomic_fetch_add_explicit(&m->step_seq, 1, memory_order_relaxed);   /* odd: being written */
    atomic_thread_fence(memory_order_release);
    const int all = pd_pool_size(m->pool), dt = m->decode_threads;
    const int nth = n == 1 && dt > 0 && dt < all ? dt : all;
    *s = (step_ctx){ m, tokens, pos, seq, n, out_idx, n_out, logits, hidden, ++m->epoch, summ, nth };
    /* The phases are reset for the new epoch BEFORE the step becomes readable: a worker that woke
     * late for the last step can read this one as soon as step_seq is even and run ahead of this
     * thread. Reset after, a preempted reset stored a phase's next before that worker claimed its
     * chunk and the phase's done after the worker counted it: the count was lost and the phase never
     * ended (seen once in CI: both threads waiting at a norm phase, next = e|1, done = e|0). */
    pd_phases_reset(m->phases, pd_step_phases(m, n), s->epoch);
    atomic_fetch_add_explicit(&m->step_seq, 1, memory_order_release);   /* even: consistent */
    pd_pool_run_async(m->pool, pd_forward_task, s, nth);
}

/* One sequence: tokens at positions pos.. in chunks of n_batch (causal attention makes chunked ==
 * whole-block, exactly). Logits of the last token, or of every token if all; or, with hidden,
 * every token's normed final state instead of any logits. */
static int run_seq(pd_model *m, const int32_t *tokens, int n, int pos, int sq, float *logits, int all,
                   float *hidden) {
    if (!m) return PD_EINVAL;
    if (n < 1) return pd_set_err(m->err, sizeof m->err, "no tokens given (n=%d)", n);
    if (sq < 0 || sq >= m->c.n_seq) return pd_set_err(m->err, sizeof m->err, "sequence slot %d is outside 0..%d", sq, m->c.n_seq - 1);
    if (pos < 0 || pos > m->c.n_ctx - n) {
        pd_set_err(m->err, sizeof m->err, "positions %d..%lld exceed the context size %d",
                pos, (long long)pos + n - 1, m->c.n_ctx);
        return PD_ERANGE;
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->c.n_vocab)
            return pd_set_err(m->err, sizeof m->err, "token id %d at index %d is outside the vocabulary (0..%d)",
                           tokens[i], i, m->c.n_vocab - 1);
    int rc = pd_ssm_check_step(m, &pos, &sq, 1);   /* a hybrid's states continue (core/deltanet.h) */
    if (rc) return rc;
    for (int done = 0; done < n;) {
        int chunk = n - done < m->c.n_batch ? n - done : m->c.n_batch;
        int last = done + chunk == n;
        for (int i = 0; i < chunk; i++) { m->pos[i] = pos + done + i; m->seq[i] = sq; m->out_idx[i] = i; }
        pd_ssm_advance(m, m->pos, m->seq, chunk);
        int n_out = all ? chunk : (last ? 1 : 0);
        if (!all) m->out_idx[0] = chunk - 1;
        if (hidden)
            publish_step(m, tokens + done, m->pos, m->seq, chunk, m->out_idx, 0, NULL, hidden + (size_t)done * m->c.n_embd);
        else
            publish_step(m, tokens + done, m->pos, m->seq, chunk, m->out_idx, n_out,
                        all ? logits + (size_t)done * m->c.n_vocab : (last ? logits : NULL), NULL);
        done += chunk;
    }
    return PD_OK;
}

int pd_prefill(pd_model *m, int seq, const int32_t *tokens, int n, int pos, float *logits, int all_logits) {
    return run_seq(m, tokens, n, pos, seq, logits, all_logits, NULL);
}

int pd_prefill_hidden(pd_model *m, int seq, const int32_t *tokens, int n, int pos, float *out) {
    if (m && !out) return pd_set_err(m->err, sizeof m->err, "no output buffer for the hidden states");
    return run_seq(m, tokens, n, pos, seq, NULL, 0, out);
}

int pd_decode_step(pd_model *m, int seq, int32_t token, int pos, float *logits) {
    return run_seq(m, &token, 1, pos, seq, logits, 0, NULL);
}

int pd_batch_step(pd_model *m, const int32_t *tokens, const int32_t *pos, const int32_t *seq, int n,
                  const int32_t *out_idx, int n_out, float *logits) {
    if (!m) return PD_EINVAL;
    int rc = check_step(m, tokens, pos, seq, n, out_idx, n_out);
    if (rc) return rc;
    /* The arguments are copied: the workers may still read them after this call returns (async). */
    memcpy(m->pos, pos, (size_t)n * sizeof *pos);
    memcpy(m->seq, seq, (size_t)n * sizeof *seq);
    memcpy(m->out_idx, out_idx, (size_t)n_out * sizeof *out_idx);
    pd_ssm_advance(m, m->pos, m->seq, n);
    publish_step(m, tokens, m->pos, m->seq, n, m->out_idx, n_out, n_out ? logits : NULL, NULL);
    return PD_OK;
}
