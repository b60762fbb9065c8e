"""Architectures as data: one ArchConfig, read from GGUF metadata, drives the single forward pass.

Adding an architecture means adding an entry to ARCHS (what differs: RoPE layout, biases, norms,
activation, ...), never copying the forward pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ModelError
from .gguf_file import GGUFFile, type_name

# What differs between architectures. Keys absent from an entry take the defaults below.
ARCHS: dict[str, dict] = {
    # Llama 1/2/3, SmolLM2, TinyLlama, Mistral: interleaved RoPE (the GGUF converter permutes Q/K).
    "llama": {},
    # Qwen2 / Qwen2.5: NeoX RoPE; Q/K/V biases come as optional tensors.
    "qwen2": dict(rope_neox=True),
    # Gemma 3: embeddings x sqrt(d), GELU(tanh)-gated FFN, per-head Q/K RMSNorm and post-attention /
    # post-FFN norms (optional tensors), 5 local (sliding-window, RoPE base 10k) layers per global one.
    "gemma3": dict(rope_neox=True, act_gelu=True, embd_scale="sqrt", rope_base_local=10000.0,
                   sliding_window=True, swa_period=6),
}
ARCH_DEFAULTS = dict(rope_neox=False, act_gelu=False, embd_scale=0.0, rope_base_local=0.0,
                     sliding_window=False, swa_period=0)

# Tensor names of the GGUF convention, by the C core's slot order (csrc/pydecode.h).
GLOBAL_TENSORS = ["token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"]
LAYER_TENSORS = [
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight", "attn_k_norm.weight",
    "post_attention_norm.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
    "ffn_down.weight", "post_ffw_norm.weight",
]
OPTIONAL_TENSORS = {"output.weight", "rope_freqs.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight",
                    "attn_k_norm.weight", "post_attention_norm.weight", "post_ffw_norm.weight"}


@dataclass(frozen=True)
class ArchConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    rope_base: float
    rope_dim: int
    rope_neox: bool
    act_gelu: bool
    embd_scale: float
    rope_base_local: float
    rope_freq_scale: float
    sliding_window: int
    swa_period: int
    tied_output: bool

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """K and V of one position in every layer: 2 x n_layers x n_kv_heads x head_dim x bytes."""
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * bytes_per_element

    def n_params(self, gguf: GGUFFile) -> int:
        return sum(t.n_elements for t in gguf.tensors.values())


def _key(gguf: GGUFFile, key: str, kind: type, default=None):
    v = gguf.metadata.get(key, default)
    if v is None:
        raise ModelError(f"{gguf.path}: metadata key {key} is missing")
    if kind is int and isinstance(v, list):  # some models store per-layer lists
        if not v or any(x != v[0] for x in v):
            raise ModelError(f"{gguf.path}: metadata key {key} varies per layer ({v[:8]}...), not supported")
        v = v[0]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise ModelError(f"{gguf.path}: metadata key {key} must be a non-negative integer, got {v!r}")
    if kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ModelError(f"{gguf.path}: metadata key {key} must be a finite number, got {v!r}")
        v = float(v)
    return v


def _rope_freq_scale(gguf: GGUFFile, p: str) -> float:
    """Linear RoPE scaling (positions divided by the factor); other kinds are refused, not ignored."""
    kind = gguf.metadata.get(p + "rope.scaling.type", "none")
    factor = _key(gguf, p + "rope.scaling.factor", float, 1.0)
    if kind in ("none", None) or factor in (0.0, 1.0):
        return 1.0
    if kind != "linear":
        raise ModelError(f"{gguf.path}: RoPE scaling '{kind}' ({p}rope.scaling.type) is not supported")
    return 1.0 / factor


def arch_config(gguf: GGUFFile) -> ArchConfig:
    """Reads `<arch>.*` metadata into an ArchConfig and checks it against the tensors."""
    arch = gguf.architecture
    if arch not in ARCHS:
        raise ModelError(f"{gguf.path}: architecture '{arch}' is not supported (supported: {', '.join(ARCHS)})")
    a = {**ARCH_DEFAULTS, **ARCHS[arch]}
    p = arch + "."
    n_embd = _key(gguf, p + "embedding_length", int)
    n_head = _key(gguf, p + "attention.head_count", int)
    n_head_kv = _key(gguf, p + "attention.head_count_kv", int, n_head)
    if n_head == 0 or n_embd == 0 or n_head_kv == 0 or n_head % n_head_kv:
        raise ModelError(f"{gguf.path}: head counts {n_head}/{n_head_kv} and embedding {n_embd} are inconsistent")
    head_dim = _key(gguf, p + "attention.key_length", int, n_embd // n_head)
    emb = gguf.tensors.get("token_embd.weight")
    if emb is None:
        raise ModelError(f"{gguf.path}: tensor token_embd.weight is missing")
    cfg = ArchConfig(
        arch=arch,
        n_layer=_key(gguf, p + "block_count", int),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=_key(gguf, p + "feed_forward_length", int),
        n_vocab=emb.shape[1] if len(emb.shape) > 1 else 0,
        n_ctx_train=_key(gguf, p + "context_length", int, 2048),
        norm_eps=_key(gguf, p + "attention.layer_norm_rms_epsilon", float, 1e-5),
        rope_base=_key(gguf, p + "rope.freq_base", float, 10000.0),
        rope_dim=_key(gguf, p + "rope.dimension_count", int, head_dim),
        rope_neox=a["rope_neox"],
        act_gelu=a["act_gelu"],
        embd_scale=math.sqrt(n_embd) if a["embd_scale"] == "sqrt" else a["embd_scale"],
        rope_base_local=_key(gguf, p + "rope.freq_base_swa", float, a["rope_base_local"]),
        rope_freq_scale=_rope_freq_scale(gguf, p),
        sliding_window=_key(gguf, p + "attention.sliding_window", int, 0) if a["sliding_window"] else 0,
        swa_period=_key(gguf, p + "attention.sliding_window_pattern", int, a["swa_period"]),
        tied_output="output.weight" not in gguf.tensors,
    )
    check_tensors(gguf, cfg)
    return cfg


def check_tensors(gguf: GGUFFile, cfg: ArchConfig) -> None:
    """Every tensor the architecture needs is present with the right shape (GGML order)."""
    d, qd, kvd = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    want = {
        "token_embd.weight": (d, cfg.n_vocab), "output_norm.weight": (d,), "output.weight": (d, cfg.n_vocab),
        "rope_freqs.weight": (cfg.rope_dim // 2,),
    }
    layer = {
        "attn_norm.weight": (d,), "attn_q.weight": (d, qd), "attn_k.weight": (d, kvd), "attn_v.weight": (d, kvd),
        "attn_output.weight": (qd, d), "attn_q.bias": (qd,), "attn_k.bias": (kvd,), "attn_v.bias": (kvd,),
        "attn_q_norm.weight": (cfg.head_dim,), "attn_k_norm.weight": (cfg.head_dim,),
        "post_attention_norm.weight": (d,), "ffn_norm.weight": (d,), "ffn_gate.weight": (d, cfg.n_ff),
        "ffn_up.weight": (d, cfg.n_ff), "ffn_down.weight": (cfg.n_ff, d), "post_ffw_norm.weight": (d,),
    }
    for l in range(cfg.n_layer):
        want.update({f"blk.{l}.{k}": v for k, v in layer.items()})
    for name, shape in want.items():
        t = gguf.tensors.get(name)
        base = name.split(".", 2)[-1] if name.startswith("blk.") else name
        if t is None:
            if base not in OPTIONAL_TENSORS:
                raise ModelError(f"{gguf.path}: tensor {name} is missing (architecture {cfg.arch})")
            continue
        if tuple(t.shape) != shape:
            raise ModelError(f"{gguf.path}: tensor {name} has shape {list(t.shape)}, expected {list(shape)}")
        if len(shape) == 1 and t.type != 0:
            raise ModelError(f"{gguf.path}: tensor {name} has type {type_name(t.type)}, expected F32")
