"""Plain numpy (float64) forward pass of the Qwen3.5 / Qwen3.6 hybrids (qwen35, qwen35moe): the
test oracle, written from the architecture's definition (HF ``modeling_qwen3_next`` /
``modeling_qwen3_5``) in the GGUF layout llama.cpp's converter writes (src/models/qwen35.cpp
reads it the same way).

Three of every four layers (``<arch>.full_attention_interval``, or the per-layer
``attention.recurrent_layers``) are linear attention, a gated delta net; the others are full
attention with an output gate. Every layer then has a SwiGLU FFN (qwen35moe: a mixture of experts
with a shared expert) behind ``post_attention_norm``:

    x += mixer(rmsnorm(x) * attn_norm)          mixer: gated_delta_net or gated_attention
    x += ffn(rmsnorm(x) * post_attention_norm)

gated_delta_net of one token sequence (channels C = 2 n_k d_k + n_v d_v):
    qkv = attn_qkv @ h   (q | k | v: n_k x d_k, n_k x d_k, n_v x d_v)     z = attn_gate @ h
    beta = sigmoid(ssm_beta @ h)     g = softplus(ssm_alpha @ h + ssm_dt.bias) * ssm_a   (per v head;
                                     ssm_a = -exp(A_log): the converter's; so exp(g) is a decay in (0, 1))
    qkv = silu(causal depthwise conv over time, kernel ssm_conv1d (d_conv taps), its state the
          last d_conv - 1 inputs)
    q, k = l2norm per head (x / max(|x|, eps), ggml_l2_norm); q /= sqrt(d_k)
    per v head j (its q / k: head j mod n_k, as ggml's repeat tiles them), state S (d_k x d_v):
        S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q                 (the delta rule)
    o = rmsnorm(o per head) * ssm_norm * silu(z);  out = ssm_out @ o

gated_attention: attn_q gives 2 d per head, the query then a gate (per head: [q_h | gate_h]);
Q/K RMSNorm per head, NeoX RoPE on the first rope.dimension_count dims (the text positions of
M-RoPE: every section at the token's position, so ordinary RoPE), softmax attention, the output
times sigmoid(gate), attn_output.

`state` (a dict) carries what a sequence keeps between calls: each recurrent layer's conv inputs
and S, each attention layer's K / V; `logits(tokens)` is the recompute from scratch.
"""
from __future__ import annotations

import numpy as np

from reference_llama import ReferenceModel


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class Qwen35Reference(ReferenceModel):
    ARCHS = ("qwen35", "qwen35moe")

    def __init__(self, path, act_quant: bool = False):
        super().__init__(path, act_quant)
        m = self.hparam

        self.d_conv = int(m("ssm.conv_kernel"))
        self.d_inner = int(m("ssm.inner_size"))
        self.d_k = int(m("ssm.state_size"))
        self.n_v = int(m("ssm.time_step_rank"))
        self.n_k = int(m("ssm.group_count"))
        self.d_v = self.d_inner // self.n_v
        rec = m("attention.recurrent_layers")
        if rec is not None:
            self.recurrent = [bool(r) for r in rec][:self.n_layer]
        else:
            every = int(m("full_attention_interval", 4))
            self.recurrent = [(i + 1) % every != 0 for i in range(self.n_layer)]
        self.expert_norm = bool(m("expert_weights_norm", True))   # (qwen35moe: softmax top-k renormalized)

    # -- the two mixers ---------------------------------------------------------------------------
    def l2norm(self, x):
        return x / np.maximum(np.sqrt((x * x).sum(axis=-1, keepdims=True)), self.eps)

    def gated_delta_net(self, h, i, st):
        """Layer i's linear attention over h (T, n_embd), from and into state st (a dict)."""
        p = f"blk.{i}."
        T, nk, nv, dk, dv = h.shape[0], self.n_k, self.n_v, self.d_k, self.d_v
        qkv = self.linear(h, p + "attn_qkv")
        z = self.linear(h, p + "attn_gate").reshape(T, nv, dv)
        beta = sigmoid(self.linear(h, p + "ssm_beta"))
        g = softplus(self.linear(h, p + "ssm_alpha") + self.w(p + "ssm_dt.bias")) * self.w(p + "ssm_a")
        C = qkv.shape[1]
        conv = st.get("conv", np.zeros((self.d_conv - 1, C)))
        xin = np.concatenate([conv, qkv], axis=0)                       # (d_conv - 1 + T, C)
        kern = self.w(p + "ssm_conv1d.weight").astype(np.float64)       # (C, d_conv)
        y = np.stack([(xin[t:t + self.d_conv] * kern.T).sum(axis=0) for t in range(T)])
        st["conv"] = xin[-(self.d_conv - 1):]
        y = y * sigmoid(y)                                              # silu
        q = self.l2norm(y[:, :nk * dk].reshape(T, nk, dk)) / np.sqrt(dk)
        k = self.l2norm(y[:, nk * dk:2 * nk * dk].reshape(T, nk, dk))
        v = y[:, 2 * nk * dk:].reshape(T, nv, dv)
        S = st.get("S", np.zeros((nv, dk, dv)))
        o = np.zeros((T, nv, dv))
        for t in range(T):
            for j in range(nv):
                kj, qj = k[t, j % nk], q[t, j % nk]
                S[j] *= np.exp(g[t, j])
                d = (v[t, j] - S[j].T @ kj) * beta[t, j]
                S[j] += np.outer(kj, d)
                o[t, j] = S[j].T @ qj
        st["S"] = S
        o = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + self.eps) * self.w(p + "ssm_norm.weight")
        o = o * (z * sigmoid(z))
        return self.linear(o.reshape(T, nv * dv), p + "ssm_out")

    def gated_attention(self, h, i, pos, st):
        """Layer i's full attention with its output gate, appending to the K / V in st."""
        p = f"blk.{i}."
        T, hd, nh, nkv = h.shape[0], self.head_dim, self.n_head, self.n_head_kv
        qg = self.linear(h, p + "attn_q").reshape(T, nh, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:]
        k = self.linear(h, p + "attn_k").reshape(T, nkv, hd)
        v = self.linear(h, p + "attn_v").reshape(T, nkv, hd)
        q = self.rope(self.rmsnorm(q, p + "attn_q_norm.weight"), pos)
        k = self.rope(self.rmsnorm(k, p + "attn_k_norm.weight"), pos)
        K = np.concatenate([st["k"], k]) if "k" in st else k
        V = np.concatenate([st["v"], v]) if "v" in st else v
        st["k"], st["v"] = K, V
        group = nh // nkv
        Kr, Vr = np.repeat(K, group, axis=1), np.repeat(V, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, Kr) / np.sqrt(hd)
        n0 = K.shape[0] - T                                        # positions cached before
        future = np.arange(K.shape[0])[None, :] > (n0 + np.arange(T))[:, None]
        scores = np.where(future[None], -np.inf, scores)
        w = np.exp(scores - scores.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", w, Vr) * sigmoid(gate)
        return self.linear(o.reshape(T, nh * hd), p + "attn_output")

    # -- forward ------------------------------------------------------------------------------------
    def hidden(self, tokens, state: dict | None = None) -> np.ndarray:
        """Final-norm hidden states (T, n_embd) of `tokens` after what `state` holds (a dict that
        is updated: pass the same one to continue a sequence; None: from scratch)."""
        state = {} if state is None else state
        tokens = np.asarray(tokens, dtype=np.int64)
        n0 = state.get("n", 0)
        pos = np.arange(n0, n0 + len(tokens))
        x = self.w("token_embd.weight")[tokens].astype(np.float64)
        for i in range(self.n_layer):
            st = state.setdefault(i, {})
            h = self.rmsnorm(x, f"blk.{i}.attn_norm.weight")
            x = x + (self.gated_delta_net(h, i, st) if self.recurrent[i] else self.gated_attention(h, i, pos, st))
            x = x + self.ffn(self.rmsnorm(x, f"blk.{i}.post_attention_norm.weight"), i)
        state["n"] = n0 + len(tokens)
        return self.rmsnorm(x, "output_norm.weight")

    def logits(self, tokens, state: dict | None = None) -> np.ndarray:
        out = "output" if self.has("output.weight") else "token_embd"
        return self.linear(self.hidden(tokens, state), out)
