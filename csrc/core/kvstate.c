/* A slot's KV cache as bytes and back (pydecode.h: pd_model_kv_export / _import): what save and
 * restore (pydecode/kvstate.py) and the hand-off between a prefill process and a decode process
 * carry. The bytes are the cache's own rows, in position order, so a restored slot holds exactly
 * the bits the exporting one held and the steps after it compute exactly what the exporter's
 * would have. Not during a step (the caller holds the model's lock). */
#include "core/model.h"

#include <string.h>

/* The first position of layer l that a step after n_pos positions can still read: 0, or for a
 * sliding-window layer the start of the last window (its ring may hold a few more, never read). */
static int kept_from(const pd_model *m, int l, int n_pos) {
    const int w = m->c.sliding_window;
    return pd_layer_is_local(&m->c, l) && n_pos > w ? n_pos - w : 0;
}

/* A hybrid's recurrent states (deltanet.h) follow the K/V rows: they are the slot's too. */
size_t pd_model_kv_export_bytes(const pd_model *m, int n_pos) {
    if (!m || n_pos < 0 || n_pos > m->c.n_ctx) return 0;
    size_t total = pd_ssm_slot_bytes(m);
    for (int l = 0; l < m->c.n_layer; l++)
        if (m->kv_cap[l]) total += 2 * (size_t)(n_pos - kept_from(m, l, n_pos)) * m->kv_row_bytes;
    return total;
}

static int copy_slot(pd_model *m, int seq, int n_pos, char *buf, size_t len, int to_cache) {
    if (!m || !buf) return PD_EINVAL;
    if (seq < 0 || seq >= m->c.n_seq)
        return pd_set_err(m->err, sizeof m->err, "sequence slot %d is outside 0..%d", seq, m->c.n_seq - 1);
    if (n_pos < 0 || n_pos > m->c.n_ctx) {
        pd_set_err(m->err, sizeof m->err, "%d positions do not fit in the context of %d", n_pos, m->c.n_ctx);
        return PD_ERANGE;
    }
    if (len != pd_model_kv_export_bytes(m, n_pos))
        return pd_set_err(m->err, sizeof m->err, "%zu bytes given for %d positions, which take %zu here",
                          len, n_pos, pd_model_kv_export_bytes(m, n_pos));
    if (m->ssm.n_rec && !to_cache && m->ssm.pos[seq] != n_pos)   /* the states hold exactly those positions */
        return pd_set_err(m->err, sizeof m->err, "sequence slot %d: its recurrent state holds %d positions, not %d",
                          seq, m->ssm.pos[seq], n_pos);
    const size_t row = m->kv_row_bytes;
    for (int l = 0; l < m->c.n_layer; l++)
        for (int kv = 0; kv < 2 && m->kv_cap[l]; kv++) {
            char *cache = kv ? (char *)m->vc[l] : (char *)m->kc[l];
            for (int p = kept_from(m, l, n_pos); p < n_pos; p++, buf += row) {
                char *r = cache + pd_kv_layer_off(m, l, seq, p);
                if (to_cache) memcpy(r, buf, row);
                else memcpy(buf, r, row);
            }
        }
    pd_ssm_copy_slot(m, seq, buf, to_cache);
    if (m->ssm.n_rec && to_cache) m->ssm.pos[seq] = n_pos;
    return PD_OK;
}

int pd_model_kv_export(pd_model *m, int seq, int n_pos, void *buf, size_t len) {
    return copy_slot(m, seq, n_pos, buf, len, 0);
}

int pd_model_kv_import(pd_model *m, int seq, int n_pos, const void *buf, size_t len) {
    return copy_slot(m, seq, n_pos, (char *)buf, len, 1);
}
