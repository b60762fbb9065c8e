"""Tiny random-weight GGUF models, written with gguf.GGUFWriter, for architecture tests.

Small enough to build in milliseconds, shaped to exercise what real models rarely do at short
prompts: a sliding window of 4 (gemma3), local/global layer interleaving, GQA, biases, a vocabulary
that is not a multiple of the kernels' rows per pass, and several weight formats at once.
"""
from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

N_VOCAB = 263


def _byte_tokens() -> list[str]:
    """The GPT-2 byte-level alphabet: one token per byte, so any text encodes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def llama3_rope_freqs(head_dim: int, base: float, factor: float = 32.0, low: float = 1.0, high: float = 4.0,
                     orig_ctx: int = 8192) -> np.ndarray:
    """Llama 3.1/3.2's per-frequency divisors, as llama.cpp's converter writes rope_freqs.weight
    (Llama-3.2-1B: factor 32, low/high frequency factors 1 and 4, original context 8192): 1 for
    short wavelengths, the factor for long ones, a smooth blend between."""
    out = []
    for freq in base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim):
        wavelen = 2 * np.pi / freq
        if wavelen < orig_ctx / high:
            out.append(1.0)
        elif wavelen > orig_ctx / low:
            out.append(factor)
        else:
            smooth = (orig_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def write_tiny_model(path, arch: str = "gemma3", *, n_layer: int = 7, n_embd: int = 64, n_head: int = 4,
                     n_head_kv: int = 2, head_dim: int = 32, n_ff: int = 96, window: int = 4,
                     weight_types=(QT.Q8_0, QT.Q5_0, QT.F16, QT.Q4_1), seed: int = 0,
                     rope_freqs: bool = False) -> None:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6 if arch == "gemma3" else 1e4)
    if arch == "gemma3":
        w.add_sliding_window(window)
    if arch == "phi3":   # partial rotary (3/4 of the head), LongRoPE past an original context of 32
        w.add_rope_dimension_count(head_dim * 3 // 4)
        w.add_rope_scaling_orig_ctx_len(32)
        w.add_rope_scaling_attn_factors(1.19)
        w.add_sliding_window(window)   # Phi-3's key, which llama.cpp (and pydecode) ignore
    tokens = _byte_tokens() + ["<|bos|>", "<|eos|>", "ab"] + [f"<unused{i}>" for i in range(N_VOCAB - 259)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3, 3, 1] + [3] * (N_VOCAB - 259))
    w.add_token_merges(["a b"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    w.add_add_bos_token(False)

    types = iter(weight_types * 1000)

    def matrix(name, rows, cols, scale=None):
        a = rng.standard_normal((rows, cols)).astype(np.float32) * (scale or 1.0 / np.sqrt(cols))
        t = next(types)
        if t == QT.F32:
            w.add_tensor(name, a)
        elif t == QT.F16:
            w.add_tensor(name, a.astype(np.float16))
        elif t.name.startswith("IQ"):  # no numpy quantizer: random bytes are a well-formed tensor
            block, size = GGML_QUANT_SIZES[t]
            w.add_tensor(name, rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8), raw_dtype=t)
        else:
            w.add_tensor(name, quantize(a, t), raw_dtype=t)

    def vector(name, n, center=1.0, spread=0.1):
        w.add_tensor(name, (center + spread * rng.standard_normal(n)).astype(np.float32))

    qd, kvd = n_head * head_dim, n_head_kv * head_dim
    w.add_tensor("token_embd.weight", quantize(rng.standard_normal((N_VOCAB, n_embd)).astype(np.float32), QT.Q8_0),
                 raw_dtype=QT.Q8_0)
    vector("output_norm.weight", n_embd)
    if rope_freqs:  # Llama 3.1-style per-frequency divisors, as llama.cpp's converter computes them
        # (for an original context of 16, not 8192, so that they matter within a short prompt)
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(head_dim, 1e4, orig_ctx=16))
    if arch == "phi3":
        rd = head_dim * 3 // 4
        w.add_tensor("rope_factors_short.weight", np.linspace(1.0, 1.5, rd // 2).astype(np.float32))
        w.add_tensor("rope_factors_long.weight", np.linspace(1.0, 24.0, rd // 2).astype(np.float32))
    if arch == "qwen2":  # untied output head
        matrix("output.weight", N_VOCAB, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", n_embd)
        if arch == "phi3":   # Q, K, V in one tensor
            matrix(p + "attn_qkv.weight", qd + 2 * kvd, n_embd)
        else:
            matrix(p + "attn_q.weight", qd, n_embd)
            matrix(p + "attn_k.weight", kvd, n_embd)
            matrix(p + "attn_v.weight", kvd, n_embd)
        matrix(p + "attn_output.weight", n_embd, qd)
        if arch == "qwen2":
            vector(p + "attn_q.bias", qd, 0.0, 0.5)
            vector(p + "attn_k.bias", kvd, 0.0, 0.5)
            vector(p + "attn_v.bias", kvd, 0.0, 0.5)
        if arch == "gemma3":
            vector(p + "attn_q_norm.weight", head_dim)
            vector(p + "attn_k_norm.weight", head_dim)
            vector(p + "post_attention_norm.weight", n_embd)
            vector(p + "post_ffw_norm.weight", n_embd)
        vector(p + "ffn_norm.weight", n_embd)
        if arch == "phi3":   # gate then up, in one tensor
            matrix(p + "ffn_up.weight", 2 * n_ff, n_embd)
        else:
            matrix(p + "ffn_gate.weight", n_ff, n_embd)
            matrix(p + "ffn_up.weight", n_ff, n_embd)
        matrix(p + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
