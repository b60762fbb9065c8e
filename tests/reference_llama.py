"""Plain numpy (float64) forward pass over a GGUF file (llama, qwen2, gemma3, phi3): the test oracle.

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
        if arch not in ("llama", "qwen2", "gemma3", "phi3"):
            raise NotImplementedError(f"reference supports llama, qwen2, gemma3, phi3; got {arch!r}")
        self.arch = arch

        def m(key, default=None):
            return self.meta(f"{arch}.{key}", default)

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
        self.neox = arch in ("qwen2", "gemma3", "phi3")
        self.rope_attn_factor = float(m("rope.scaling.attn_factor", 1.0))
        self.long_factors = False   # phi3: the LongRoPE factors of a context past the original one
        self.gemma = arch == "gemma3"
        # Gemma 3: 5 sliding-window layers (RoPE base 10k) then 1 global layer (metadata base).
        self.window = int(m("attention.sliding_window", 0)) if self.gemma else 0
        self.swa_period = int(m("attention.sliding_window_pattern", 6)) if self.gemma else 0
        self.rope_base_local = float(m("rope.freq_base_swa", 10000.0))

    def is_local(self, i) -> bool:
        return self.window > 0 and i % self.swa_period < self.swa_period - 1

    # -- GGUF access ---------------------------------------------------------------------------
    def meta(self, key, default=None):
        f = self.fields.get(key)
        return default if f is None else f.contents()

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
        ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # (T, d/2)
        mscale = 1.0 if local else self.rope_attn_factor
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
        if self.gemma:  # per-head RMSNorm of Q and K before RoPE
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
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", p, v).reshape(T, self.n_head * hd)
        return self.linear(o, f"blk.{i}.attn_output")

    def ffn(self, h, i):
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
            f = self.ffn(self.rmsnorm(x, f"blk.{i}.ffn_norm.weight"), i)
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
