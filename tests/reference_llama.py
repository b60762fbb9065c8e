"""Plain numpy (float64) forward pass over a GGUF file (llama, qwen2, gemma3, qwen3, qwen3moe, phi3): the
test oracle.

Written for readability, not speed. Follows the llama architecture as in
Hugging Face ``modeling_llama`` and llama.cpp's llama graph:

    x = embed[tokens]
    per layer:  x += Wo @ attn(rope(Wq @ n(x)), rope(Wk @ n(x)), Wv @ n(x))   n = RMSNorm
                x += Wdown @ (silu(Wgate @ n(x)) * (Wup @ n(x)))
    logits = Wout @ n(x)           (Wout = token_embd when output.weight is absent)

Conventions that matter (checked against llama.cpp's convert_hf_to_gguf.py and ggml):
* The converter permutes HF's Q/K rows per head, ``reshape(n_head, 2, hd/2, in).swapaxes(1, 2)``,
  turning HF's half-split rotary pairs (i, i + hd/2) into adjacent pairs (2i, 2i+1). llama.cpp
  then applies "normal" (interleaved) RoPE: pair (x[2i], x[2i+1]) is rotated by
  pos * base^(-2i/rope_dim). This is NOT the NeoX / HF half-split layout.
* A 2-D GGUF tensor with ggml shape [ne0=in, ne1=out] dequantizes to a numpy (out, in) array,
  so y = W @ x, i.e. ``h @ W.T`` for row-major activations h of shape (tokens, in).
* GQA: query head h uses kv head h // (n_head / n_head_kv). Scores are scaled by 1/sqrt(head_dim).
* Phi-3 (HF ``modeling_phi3``): ``qkv_proj`` holds Q, K, V rows in that order and ``gate_up_proj``
  gate then up (``chunk(2)``); NeoX RoPE on the first rope.dimension_count dims of each head
  (partial_rotary_factor), the rest passed through; LongRoPE divides each frequency by the short
  or the long factor and multiplies cos and sin by the attention factor. HF picks the long
  factors when the sequence is longer than the original context; llama.cpp (and so pydecode)
  when the context is: ``long_factors`` says which, as the test's n_ctx would.
* gpt-oss's attention pieces (HF ``modeling_gpt_oss``), wherever a file has them: a learned sink
  logit per head (``attn_sinks``) joins each softmax and is dropped after it; an output-projection
  bias; YaRN RoPE (HF ``_compute_yarn_parameters``: frequencies mixed between 1/(factor base^(2i/d))
  and 1/base^(2i/d) by a ramp over the correction range from beta_fast / beta_slow, floored and
  ceiled as llama.cpp does; cos and sin times 0.1 ln(factor) + 1).
* Qwen3 (HF modeling_qwen3): q_norm / k_norm, an RMSNorm over each head's head_dim values, before
  RoPE; head_dim from the config (key_length), so n_head * head_dim may differ from n_embd.
* Qwen3-MoE (HF modeling_qwen3_moe, Qwen3MoeSparseMoeBlock): router_logits = gate(x);
  routing_weights = softmax(router_logits) over all experts; torch.topk(routing_weights, top_k);
  if norm_topk_prob (true in every Qwen3-MoE config, and llama.cpp's qwen3moe always): divided by
  their sum; out = sum_j w_j * down_j(silu(gate_j(x)) * up_j(x)). GGUF stores the experts as 3-D
  tensors [in, out, n_expert] (numpy: (n_expert, out, in)).
* Qwen2-MoE (HF modeling_qwen2_moe, Qwen2MoeSparseMoeBlock): the same routing with
  norm_topk_prob false, plus sigmoid(shared_expert_gate(x)) * shared_expert(x) (a SwiGLU FFN).
"""
from __future__ import annotations

import os

# Tiny matmuls + a multithreaded OpenBLAS on a busy machine spin-wait badly (seen: 5 tokens
# 0.15 s single-threaded vs 6 s with 2 threads). Only effective if numpy isn't imported yet.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402


class ReferenceModel:
    ARCHS = ("llama", "qwen2", "gemma3", "qwen3", "qwen3moe", "qwen2moe", "phi3", "gpt-oss")

    def __init__(self, path, act_quant: bool = False):
        # act_quant: quantize each matmul input to 8-bit blocks of 32 the way the C core does
        # (d = amax/127, q = round(x/d)) before a quantized weight sees it; the comparison with the
        # C forward can then be tight. Without it, this is the plain float model.
        self.act_quant = act_quant
        self.reader = GGUFReader(str(path))
        self.fields = {k: f for k, f in self.reader.fields.items()}
        self.tensors = {t.name: t for t in self.reader.tensors}
        self._w = {}  # name -> dequantized float32 array (exact ggml values), cached

        arch = self.meta("general.architecture")
        if arch not in self.ARCHS:
            raise NotImplementedError(f"{type(self).__name__} supports {', '.join(self.ARCHS)}; got {arch!r}"
                                      + (" (tests/reference_qwen35.py has the hybrids)" if arch.startswith("qwen35") else ""))
        self.arch = arch
        m = self.hparam

        self.n_layer = int(m("block_count"))
        self.n_embd = int(m("embedding_length"))
        self.n_ff = int(m("feed_forward_length"))
        self.n_head = int(m("attention.head_count"))
        self.n_head_kv = int(m("attention.head_count_kv", self.n_head))
        self.head_dim = int(m("attention.key_length", self.n_embd // self.n_head))
        self.rope_base = float(m("rope.freq_base", 10000.0))
        self.rope_dim = int(m("rope.dimension_count", self.head_dim))
        self.eps = float(m("attention.layer_norm_rms_epsilon", 1e-5))
        self.n_vocab = int(self.tensors["token_embd.weight"].shape[1])  # ggml ne1 = rows
        # Qwen2 and Gemma rotate NeoX-style halves (i, i + d/2); llama GGUFs use adjacent pairs.
        self.neox = arch in ("qwen2", "gemma3", "qwen3", "qwen3moe", "qwen2moe", "phi3", "gpt-oss", "qwen35", "qwen35moe")
        self.oss = arch == "gpt-oss"
        self.swiglu_oai = self.oss   # gpt-oss's clamped SwiGLU in the experts
        self.rope_attn_factor = float(m("rope.scaling.attn_factor", 1.0))
        self.long_factors = False   # phi3: the LongRoPE factors of a context past the original one
        self.yarn = m("rope.scaling.type") == "yarn" and float(m("rope.scaling.factor", 1.0)) > 1.0
        if self.yarn:
            self.yarn_factor = float(m("rope.scaling.factor"))
            orig = int(m("rope.scaling.original_context_length", m("context_length", 2048)))
            d = self.rope_dim

            def corr(rotations):
                return d * np.log(orig / (rotations * 2 * np.pi)) / (2 * np.log(self.rope_base))
            self.yarn_low = max(0.0, np.floor(corr(float(m("rope.scaling.yarn_beta_fast", 32.0)))))
            self.yarn_high = min(d - 1.0, np.ceil(corr(float(m("rope.scaling.yarn_beta_slow", 1.0)))))
        # Mixture of experts (GGUF keys as llama.cpp names them; gating 1 softmax, 2 sigmoid,
        # 3 softmax over the chosen logits only).
        self.n_expert = int(m("expert_count", 0))
        self.n_expert_used = int(m("expert_used_count", 0))
        self.gating = int(m("expert_gating_func", 3 if arch == "gpt-oss" else 1))   # gpt-oss: over the k chosen
        self.expert_norm = bool(m("expert_weights_norm", arch == "qwen3moe"))
        self.expert_scale = float(m("expert_weights_scale", 0.0)) or 1.0
        self.gemma = arch == "gemma3"
        # Gemma 3: 5 sliding-window layers (RoPE base 10k) then 1 global layer (metadata base).
        # gpt-oss: every other layer (the even ones) local, with the global layers' RoPE
        self.window = int(m("attention.sliding_window", 0)) if self.gemma or self.oss else 0
        self.swa_period = int(m("attention.sliding_window_pattern", 6 if self.gemma else 2)) if self.window else 0
        self.rope_base_local = float(m("rope.freq_base_swa", 10000.0 if self.gemma else self.rope_base))

    def is_local(self, i) -> bool:
        return self.window > 0 and i % self.swa_period < self.swa_period - 1

    # -- GGUF access ---------------------------------------------------------------------------
    def meta(self, key, default=None):
        f = self.fields.get(key)
        return default if f is None else f.contents()

    def hparam(self, key, default=None):
        """The architecture's own key (ARCH.key)."""
        return self.meta(f"{self.arch}.{key}", default)

    @property
    def vocab(self) -> list:
        return self.meta("tokenizer.ggml.tokens")

    def has(self, name) -> bool:
        return name in self.tensors

    def w(self, name) -> np.ndarray:
        """Dequantized tensor in numpy order (ggml shape reversed): (out, in) for matrices."""
        if name not in self._w:
            t = self.tensors[name]
            a = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            self._w[name] = a.reshape([int(d) for d in reversed(t.shape)])
        return self._w[name]

    # -- building blocks -----------------------------------------------------------------------
    def rmsnorm(self, x, name):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.w(name)

    @staticmethod
    def q8(x, block=32):
        """x -> dequant(quant_q8(x)) per block of 32 (256 for the K-quants) along the last axis."""
        b = x.reshape(*x.shape[:-1], -1, block)
        d = np.abs(b).max(axis=-1, keepdims=True) / 127.0
        q = np.round(np.divide(b, d, out=np.zeros_like(b), where=d > 0))
        return (q * d).reshape(x.shape)

    def linear(self, x, name):
        wtype = int(self.tensors[name + ".weight"].tensor_type)
        if self.act_quant and wtype not in (0, 1, 30):
            x = self.q8(x, 256 if 10 <= wtype <= 14 else 32)
        y = x @ self.w(name + ".weight").astype(np.float64).T  # upcast (contiguous) then transpose
        if self.has(name + ".bias"):
            y = y + self.w(name + ".bias")
        return y

    def rope(self, x, pos, base=None):
        """RoPE on x of shape (T, heads, head_dim): interleaved ("normal", GGML mode 0) pairs
        (2i, 2i+1), or NeoX halves (i, i + d/2)."""
        d = self.rope_dim
        base = self.rope_base if base is None else base
        inv_freq = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,)
        local = base != self.rope_base
        factors = "rope_factors_long.weight" if self.long_factors else "rope_factors_short.weight"
        if self.has("rope_freqs.weight") and not local:  # llama3-style per-frequency factors
            inv_freq = inv_freq / self.w("rope_freqs.weight")
        elif self.has(factors):                          # LongRoPE
            inv_freq = inv_freq / self.w(factors)
        mscale = 1.0 if local else self.rope_attn_factor
        if self.yarn:   # every layer's RoPE (gpt-oss's local layers share it)
            span = max(self.yarn_high - self.yarn_low, 0.001)
            extrap = 1.0 - np.clip((np.arange(d // 2) - self.yarn_low) / span, 0.0, 1.0)
            inv_freq = inv_freq / self.yarn_factor * (1 - extrap) + inv_freq * extrap
            mscale *= 0.1 * np.log(self.yarn_factor) + 1.0
        ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # (T, d/2)
        cos, sin = np.cos(ang)[:, None, :] * mscale, np.sin(ang)[:, None, :] * mscale
        x = x.copy()
        a, b = (slice(0, d // 2), slice(d // 2, d)) if self.neox else (slice(0, d, 2), slice(1, d, 2))
        x0, x1 = x[..., a].copy(), x[..., b].copy()
        x[..., a] = x0 * cos - x1 * sin
        x[..., b] = x0 * sin + x1 * cos
        return x

    def attention(self, h, i, pos):
        T, hd = h.shape[0], self.head_dim
        if self.has(f"blk.{i}.attn_qkv.weight"):  # phi3: one projection, split Q | K | V
            qkv = self.linear(h, f"blk.{i}.attn_qkv")
            qd, kvd = self.n_head * hd, self.n_head_kv * hd
            q, k, v = qkv[:, :qd], qkv[:, qd:qd + kvd], qkv[:, qd + kvd:]
        else:
            q, k, v = (self.linear(h, f"blk.{i}.attn_{n}") for n in "qkv")
        q, k, v = q.reshape(T, self.n_head, hd), k.reshape(T, self.n_head_kv, hd), v.reshape(T, self.n_head_kv, hd)
        if self.has(f"blk.{i}.attn_q_norm.weight"):  # per-head RMSNorm of Q and K before RoPE (gemma3, qwen3)
            q = self.rmsnorm(q, f"blk.{i}.attn_q_norm.weight")
            k = self.rmsnorm(k, f"blk.{i}.attn_k_norm.weight")
        base = self.rope_base_local if self.is_local(i) else self.rope_base
        q, k = self.rope(q, pos, base), self.rope(k, pos, base)
        group = self.n_head // self.n_head_kv
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # head h -> kv h//group
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)  # (heads, T_q, T_k)
        causal = np.triu(np.ones((T, T), dtype=bool), k=1)
        if self.is_local(i):  # query t sees keys s with t - s < window
            causal |= np.tril(np.ones((T, T), dtype=bool), k=-self.window)
        scores = np.where(causal[None], -np.inf, scores)
        if self.has(f"blk.{i}.attn_sinks.weight"):   # one more logit per head, weighing no value
            sink = np.broadcast_to(self.w(f"blk.{i}.attn_sinks.weight")[:, None, None], (self.n_head, T, 1))
            scores = np.concatenate([scores, sink], axis=-1)
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        p = p[..., :T]
        o = np.einsum("hts,shd->thd", p, v).reshape(T, self.n_head * hd)
        return self.linear(o, f"blk.{i}.attn_output")

    def expert_linear(self, x, name, e):
        """x @ expert e's matrix of the 3-D tensor `name` (.weight), as linear() does for a 2-D one."""
        wtype = int(self.tensors[name + ".weight"].tensor_type)
        if self.act_quant and wtype not in (0, 1, 30):
            x = self.q8(x, 256 if 10 <= wtype <= 14 else 32)
        y = x @ self.w(name + ".weight")[e].astype(np.float64).T
        return y + self.w(name + ".bias")[e] if self.has(name + ".bias") else y   # gpt-oss's expert biases

    def route(self, logits):
        """(experts, weights) of one token: the k largest router outputs, their gated weights."""
        k = self.n_expert_used
        sel = np.argsort(-logits, kind="stable")[:k]   # torch.topk order; a tie keeps the lower id
        if self.gating == 1:
            p = np.exp(logits - logits.max())
            w = (p / p.sum())[sel]
        elif self.gating == 2:
            w = 1.0 / (1.0 + np.exp(-logits[sel]))
        else:
            p = np.exp(logits[sel] - logits[sel].max())
            w = p / p.sum()
        if self.expert_norm:
            w = w / w.sum()
        return sel, w * self.expert_scale

    def moe(self, h, i):
        p = f"blk.{i}."
        logits = self.linear(h, p + "ffn_gate_inp")
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            x = h[t:t + 1]
            for e, wt in zip(*self.route(logits[t])):
                g = self.expert_linear(x, p + "ffn_gate_exps", e)
                u = self.expert_linear(x, p + "ffn_up_exps", e)
                if self.swiglu_oai:   # HF GptOssExperts: gate clamped above, up to [-limit, limit]; alpha 1.702
                    g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
                    act = g / (1.0 + np.exp(-1.702 * g)) * (u + 1.0)
                else:
                    act = g / (1.0 + np.exp(-g)) * u
                out[t] += wt * self.expert_linear(act, p + "ffn_down_exps", e)[0]
        if self.has(p + "ffn_up_shexp.weight"):
            g, u = self.linear(h, p + "ffn_gate_shexp"), self.linear(h, p + "ffn_up_shexp")
            shared = self.linear(g / (1.0 + np.exp(-g)) * u, p + "ffn_down_shexp")
            if self.has(p + "ffn_gate_inp_shexp.weight"):
                shared = shared / (1.0 + np.exp(-(h @ self.w(p + "ffn_gate_inp_shexp.weight").astype(np.float64))))[:, None]
            out = out + shared
        return out

    def ffn(self, h, i):
        if self.n_expert:
            return self.moe(h, i)
        if self.has(f"blk.{i}.ffn_gate.weight"):
            g, u = self.linear(h, f"blk.{i}.ffn_gate"), self.linear(h, f"blk.{i}.ffn_up")
        else:  # phi3: gate_up_proj, gate rows first
            g, u = np.split(self.linear(h, f"blk.{i}.ffn_up"), 2, axis=-1)
        if self.gemma:  # GELU, tanh approximation
            act = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))
        else:
            act = g / (1.0 + np.exp(-g))  # silu
        return self.linear(act * u, f"blk.{i}.ffn_down")

    # -- forward -------------------------------------------------------------------------------
    def hidden(self, tokens) -> np.ndarray:
        """Final-norm hidden states, shape (T, n_embd), float64."""
        tokens = np.asarray(tokens, dtype=np.int64)
        pos = np.arange(len(tokens))
        x = self.w("token_embd.weight")[tokens].astype(np.float64)
        if self.gemma:
            x = x * np.sqrt(self.n_embd)
        for i in range(self.n_layer):
            a = self.attention(self.rmsnorm(x, f"blk.{i}.attn_norm.weight"), i, pos)
            if self.gemma:
                a = self.rmsnorm(a, f"blk.{i}.post_attention_norm.weight")
            x = x + a
            # (gpt-oss names its FFN input norm post_attention_norm)
            f = self.ffn(self.rmsnorm(x, f"blk.{i}.{'post_attention_norm' if self.oss else 'ffn_norm'}.weight"), i)
            if self.gemma:
                f = self.rmsnorm(f, f"blk.{i}.post_ffw_norm.weight")
            x = x + f
        return self.rmsnorm(x, "output_norm.weight")

    def logits(self, tokens) -> np.ndarray:
        """Logits for every position, shape (T, n_vocab), float64 (causal attention)."""
        out = "output" if self.has("output.weight") else "token_embd"  # tied embeddings
        return self.linear(self.hidden(tokens), out)

    def greedy(self, tokens, n: int) -> list:
        """n greedy continuation ids (full recompute per step: slow but obviously correct)."""
        toks = list(tokens)
        for _ in range(n):
            toks.append(int(np.argmax(self.logits(toks)[-1])))
        return toks[len(tokens):]
