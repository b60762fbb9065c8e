"""Architectures as data: one ArchConfig, read from GGUF metadata, drives the single forward pass.

Adding an architecture means adding an entry to ARCHS (what differs: RoPE layout, biases, norms,
activation, ...), never copying the forward pass.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .errors import ModelError
from .gguf_file import GGUFFile, type_name
from .hybrid import SSM_TENSORS, SSM_VECTORS, hybrid_fields, layer_shapes

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
    # Phi-3 / Phi-3.5 / Phi-4-mini: NeoX RoPE (partial: rope.dimension_count), Q/K/V fused in
    # attn_qkv and gate/up fused in ffn_up (FUSED_TENSORS: views of their rows), LongRoPE's
    # per-frequency factors (rope_factors_short / _long, chosen by the context: rope_factors)
    # and its attention factor. Its sliding_window key is ignored, as llama.cpp does (see
    # llama.cpp's phi3 loader: the converters do not say which layers would use it).
    "phi3": dict(rope_neox=True),
    # Qwen3: NeoX RoPE (llama.cpp's rope type for LLM_ARCH_QWEN3), per-head Q/K RMSNorm before
    # RoPE (attn_q_norm / attn_k_norm: optional tensors), no QKV bias; head_dim is
    # attention.key_length (128), not n_embd / n_head (0.6B: 1024 / 16 = 64).
    "qwen3": dict(rope_neox=True),
    # Qwen3-MoE: Qwen3's attention; every layer's FFN a mixture of experts (core/moe.c): softmax
    # over all experts, the top expert_used_count, their weights renormalized to sum 1. llama.cpp
    # (llm_build_qwen3moe) hard-codes softmax and norm_w = true, HF (Qwen3MoeSparseMoeBlock)
    # normalizes when norm_topk_prob (true in every released config): the defaults here; the
    # GGUF keys expert_gating_func / expert_weights_norm / expert_weights_scale override them
    # where a file has them (a qwen3moe file has none).
    "qwen3moe": dict(rope_neox=True, moe=True, expert_gating="softmax", expert_norm=True),
    # Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (QKV biases); softmax top-k NOT
    # renormalized (llama.cpp's llm_build_qwen2moe: norm_w = false; HF norm_topk_prob = false), plus
    # a shared expert every token runs (ffn_*_shexp, width expert_shared_feed_forward_length),
    # scaled by sigmoid(ffn_gate_inp_shexp . x).
    "qwen2moe": dict(rope_neox=True, moe=True, expert_gating="softmax", expert_norm=False),
    # gpt-oss (llama.cpp's openai-moe graph, HF modeling_gpt_oss): NeoX RoPE with YaRN on every
    # layer; sliding-window (attention.sliding_window, 128) and full layers alternating, the
    # even ones local (llama.cpp's swa pattern 2), sharing the global RoPE; Q/K/V and output
    # biases; attention sinks; its "post_attention_norm" is the FFN's input norm (RENAMES);
    # experts gated by the softmax over the 4 chosen logits (not renormalized), with router and
    # expert biases and the clamped SwiGLU (expert_act).
    "gpt-oss": dict(rope_neox=True, sliding_window=True, swa_period=2, moe=True, expert_gating="softmax_weight",
                    expert_norm=False, expert_act="swiglu_oai",
                    renames={"post_attention_norm.weight": "ffn_norm.weight"}),
    # Qwen3.5 / Qwen3.6 hybrids (pydecode/hybrid.py, csrc/core/deltanet.c): gated delta nets in 3 of 4
    # layers, full attention with an output gate (Qwen3's Q/K norms, NeoX RoPE on 64 of 256 dims:
    # M-RoPE at text positions) in the rest; "post_attention_norm" is the FFN's input norm. qwen35moe:
    # Qwen3-MoE's routing (softmax, top-k renormalized) and a shared expert gated by a sigmoid.
    "qwen35": dict(rope_neox=True, hybrid=True, renames={"post_attention_norm.weight": "ffn_norm.weight"}),
    "qwen35moe": dict(rope_neox=True, hybrid=True, moe=True, expert_gating="softmax", expert_norm=True,
                      renames={"post_attention_norm.weight": "ffn_norm.weight"}),
}
ARCH_DEFAULTS = dict(rope_neox=False, act_gelu=False, embd_scale=0.0, rope_base_local=0.0,
                     sliding_window=False, swa_period=0, moe=False, expert_gating="softmax", expert_norm=False,
                     expert_act="model", renames={}, hybrid=False)
EXPERT_ACTS = {"model": 0, "swiglu_oai": 1}   # the C core's PD_EXPERT_ACT_*
# GGUF <arch>.expert_gating_func (llama.cpp's llama_expert_gating_func_type) -> name -> the C
# core's PD_GATING_* (pydecode.h).
GATING_FUNCS = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}
GATING_C = {"softmax": 0, "sigmoid": 1, "softmax_weight": 2}
MAX_EXPERTS = 1024   # the C core's PD_MAX_EXPERTS

# Tensor names of the GGUF convention, by the C core's slot order (csrc/pydecode.h).
GLOBAL_TENSORS = ["token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"]
LAYER_TENSORS = [
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight", "attn_k_norm.weight",
    "post_attention_norm.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
    "ffn_down.weight", "post_ffw_norm.weight",
    "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
    "ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight",
    "attn_output.bias", "attn_sinks.weight",
    "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias",
    *SSM_TENSORS,   # a hybrid's recurrent layers (pydecode/hybrid.py)
]
# Fused tensors: a file may hold these instead of the slots they stand for, each slot a run of
# the fused tensor's rows (zero-copy views: tensor_views). phi3's ffn_up of 2 x n_ff rows holds
# gate then up (llama.cpp's fused SwiGLU: silu of the first half times the second half).
FUSED_TENSORS = {
    "attn_qkv.weight": ("attn_q.weight", "attn_k.weight", "attn_v.weight"),
    "ffn_up.weight": ("ffn_gate.weight", "ffn_up.weight"),
}
# LongRoPE's frequency factors (phi3): one of the two becomes the rope_freqs.weight slot.
ROPE_FACTORS = ("rope_factors_short.weight", "rope_factors_long.weight")
OPTIONAL_TENSORS = {"output.weight", "rope_freqs.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight",
                    "attn_k_norm.weight", "post_attention_norm.weight", "post_ffw_norm.weight", "attn_output.bias",
                    "attn_sinks.weight", "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias",
                    "ffn_down_exps.bias", "ffn_gate_inp_shexp.weight"}
DENSE_FFN = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


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
    rope_attn_factor: float = 1.0   # scales the rotated dims' cos/sin (LongRoPE's / YaRN's attention factor)
    n_ctx_orig: int = 0             # rope.scaling.original_context_length (0: n_ctx_train)
    rope_yarn: tuple = (0.0, 0.0, 0.0)   # YaRN: (ext_factor, first and last ramped pair); ext 0: off
    # Mixture of experts (0 / defaults: dense). n_ff_exp: one expert's FFN width.
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    expert_gating: str = "softmax"
    expert_norm: bool = False
    expert_scale: float = 0.0
    expert_act: str = "model"       # the experts' activation: the model's, or gpt-oss's "swiglu_oai"
    n_ff_shexp: int = 0             # the shared expert's width (qwen2moe; 0: none)
    # Hybrids (pydecode/hybrid.py; empty / 0: none): which layers are gated delta nets, their shapes
    recurrent: tuple = ()
    ssm_d_conv: int = 0
    ssm_n_k: int = 0
    ssm_n_v: int = 0
    ssm_d_state: int = 0
    attn_gated: bool = False        # attention's Q holds a gate per head (its output times sigmoid(gate))
    n_mtp: int = 0                  # multi-token-prediction layers of the file, skipped

    def layer_is_recurrent(self, layer: int) -> bool:
        return bool(self.recurrent) and self.recurrent[layer]

    @property
    def n_attn_layers(self) -> int:
        """Layers with a KV cache (a hybrid's others keep a fixed state: ssm_state_bytes)."""
        return self.n_layer - sum(self.recurrent)

    def ssm_state_bytes(self) -> int:
        """One sequence's recurrent state (f32): each recurrent layer's convolution inputs and
        one state_size^2 matrix per value head."""
        C = (2 * self.ssm_n_k + self.ssm_n_v) * self.ssm_d_state
        return sum(self.recurrent) * 4 * ((self.ssm_d_conv - 1) * C + self.ssm_n_v * self.ssm_d_state ** 2)

    def rope_factors(self, gguf: GGUFFile, n_ctx: int) -> str | None:
        """The LongRoPE factor tensor a context of n_ctx positions uses, or None: the long
        factors past the original training context, else the short ones (llama.cpp's choice,
        made per context, so a state file records it: kvstate._shapes)."""
        if ROPE_FACTORS[0] not in gguf.tensors:
            return None
        return ROPE_FACTORS[1] if n_ctx > (self.n_ctx_orig or self.n_ctx_train) else ROPE_FACTORS[0]

    def tensor_views(self, gguf: GGUFFile, n_ctx: int | None = None) -> dict:
        """Each tensor slot's source as (GGUF tensor, first row, rows): the file's tensor of that
        name whole, or a run of rows of a fused tensor (FUSED_TENSORS), or the LongRoPE factors
        for rope_freqs.weight (rope_factors; the short ones when n_ctx is not given)."""
        views = {name: (t, 0, t.n_elements // t.shape[0] if t.shape else 0) for name, t in gguf.tensors.items()}
        for l in range(self.n_layer):
            p = f"blk.{l}."
            qkv = gguf.tensors.get(p + "attn_qkv.weight")
            if qkv is not None and p + "attn_q.weight" not in gguf.tensors and qkv.shape[0] == self.n_embd \
                    and not self.layer_is_recurrent(l):
                lens = (self.n_head * self.head_dim, self.n_head_kv * self.head_dim, self.n_head_kv * self.head_dim)
                self._split(views, qkv, [p + n for n in FUSED_TENSORS["attn_qkv.weight"]], lens)
            up = gguf.tensors.get(p + "ffn_up.weight")
            if up is not None and p + "ffn_gate.weight" not in gguf.tensors and tuple(up.shape) == (self.n_embd, 2 * self.n_ff):
                self._split(views, up, [p + n for n in FUSED_TENSORS["ffn_up.weight"]], (self.n_ff, self.n_ff))
        for src, dst in ARCHS[self.arch].get("renames", {}).items():   # a tensor another slot's name fits
            for l in range(self.n_layer):
                if f"blk.{l}.{src}" in views and f"blk.{l}.{dst}" not in gguf.tensors:
                    views[f"blk.{l}.{dst}"] = views.pop(f"blk.{l}.{src}")
        rf = self.rope_factors(gguf, n_ctx or 0)
        if rf is not None and "rope_freqs.weight" not in gguf.tensors and rf in gguf.tensors:
            t = gguf.tensors[rf]
            views["rope_freqs.weight"] = (t, 0, 1)
        return views

    @staticmethod
    def _split(views: dict, t, names: list, lens) -> None:
        rows = t.n_elements // t.shape[0] if len(t.shape) == 2 else -1
        if sum(lens) != rows:   # no views: check_tensors names the tensor that does not fit
            return
        r0 = 0
        for name, n in zip(names, lens):
            views[name] = (t, r0, n)
            r0 += n

    def c_fields(self) -> dict:
        """The pd_config fields of the FFN (pydecode.h): every layer a mixture of experts gets no
        dense FFN scratch (n_ff = the expert width, which the C core checks like any n_ff)."""
        if not self.n_expert:
            return {"n_ff": self.n_ff}
        return {"n_ff": self.n_ff_exp, "n_expert": self.n_expert, "n_expert_used": self.n_expert_used,
                "n_ff_exp": self.n_ff_exp, "expert_gating": GATING_C[self.expert_gating],
                "expert_norm": int(self.expert_norm), "expert_scale": self.expert_scale,
                "expert_act": EXPERT_ACTS[self.expert_act],
                "n_ff_shexp": self.n_ff_shexp}

    def kv_bytes_per_token(self, bytes_per_element: float = 2) -> int:
        """K and V of one position in every layer: 2 x n_layers x n_kv_heads x head_dim x bytes
        (per value: 2 for f16, 4 for f32, 34/32 for q8_0: Model.kv_elem_bytes)."""
        return round(2 * self.n_attn_layers * self.n_head_kv * self.head_dim * bytes_per_element)

    def layer_is_local(self, layer: int) -> bool:
        """Whether a layer attends over a sliding window: the one rule (the C core is told per
        layer, pd_config.local_layers). Gemma 3: every swa_period-th layer is global."""
        return self.sliding_window > 0 and (self.swa_period <= 0 or (layer + 1) % self.swa_period != 0)

    def kv_positions(self, layer: int, positions: int, ring_extra: int | None = None) -> int:
        """Positions whose K/V layer `layer` keeps for a sequence of `positions`: all of them, or,
        in a sliding-window layer, at most the window. ring_extra=n_batch gives what the C core
        allocates instead (a ring of window + n_batch, so a prefill chunk's first query still
        sees its whole window)."""
        if self.layer_is_recurrent(layer):
            return 0
        if not self.layer_is_local(layer):
            return positions
        return min(positions, self.sliding_window + (ring_extra or 0))

    def kv_bytes(self, positions: int, bytes_per_element: float = 2, ring_extra: int | None = None) -> int:
        """KV cache bytes for `positions` positions: 2 x n_kv_heads x positions x head_dim x bytes
        per layer (sliding-window layers capped at their window, see kv_positions), summed."""
        per_position = round(2 * self.n_head_kv * self.head_dim * bytes_per_element)
        return sum(per_position * self.kv_positions(l, positions, ring_extra) for l in range(self.n_layer))

    def weight_bytes_per_token(self, gguf: GGUFFile, active: bool = True) -> int:
        """Bytes of weights a decoded token reads: every tensor once, except the embedding table
        (one row per token), which a tied output head reads whole as the head, and the experts'
        tensors (*_exps), of which a token reads its n_expert_used of n_expert (active=False:
        all of them, what a step of many tokens may read)."""
        total = 0
        for t in gguf.tensors.values():
            experts = self.n_expert and t.name.endswith("_exps.weight")
            total += t.n_bytes * self.n_expert_used // self.n_expert if experts and active else t.n_bytes
        emb = gguf.tensors["token_embd.weight"].n_bytes
        return total - emb + (emb if self.tied_output else 0)

    def n_params(self, gguf: GGUFFile) -> int:
        """Parameters: every tensor's values (the embedding counted once, tied head or not)."""
        return sum(t.n_elements for t in gguf.tensors.values())


# Sizes reach the C core as `int`: anything larger is hostile, not big.
INT_MAX = (1 << 31) - 1


def _key(gguf: GGUFFile, key: str, kind: type, default=None):
    v = gguf.metadata.get(key, default)
    if v is None:
        raise ModelError(f"{gguf.path}: metadata key {key} is missing")
    if kind is int and isinstance(v, list):  # some models store per-layer lists
        if not v or any(x != v[0] for x in v):
            raise ModelError(f"{gguf.path}: metadata key {key} varies per layer ({v[:8]}...), not supported")
        v = v[0]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= INT_MAX):
        raise ModelError(f"{gguf.path}: metadata key {key} must be an integer in 0..{INT_MAX}, got {v!r}")
    if kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ModelError(f"{gguf.path}: metadata key {key} must be a finite number, got {v!r}")
        v = float(v)
    if kind is str and not isinstance(v, str):
        raise ModelError(f"{gguf.path}: metadata key {key} must be a string, got {type(v).__name__}")
    return v


def _yarn(gguf: GGUFFile, p: str, rope_dim: int, base: float, factor: float, attn_factor: float,
          n_ctx_orig: int) -> tuple[tuple, float]:
    """YaRN's data, as llama.cpp computes it: ((ext_factor, low, high), the cos/sin scale).
    Pairs below `low` keep the unscaled angle, past `high` the interpolated one (ggml's
    ggml_rope_yarn_corr_dims, from beta_fast / beta_slow rotations over the original context);
    cos and sin are scaled by 1 + 0.1 ln(factor) (times rope.scaling.attn_factor), which is what
    llama.cpp's attn_factor and ggml's rope_yarn give together."""
    if _key(gguf, p + "rope.scaling.yarn_log_multiplier", float, 0.0) != 0.0:
        raise ModelError(f"{gguf.path}: YaRN with {p}rope.scaling.yarn_log_multiplier (DeepSeek's) is not supported")
    ext = _key(gguf, p + "rope.scaling.yarn_ext_factor", float, 1.0)
    fast = _key(gguf, p + "rope.scaling.yarn_beta_fast", float, 32.0)
    slow = _key(gguf, p + "rope.scaling.yarn_beta_slow", float, 1.0)
    if not (0 <= ext <= 1 and fast > 0 and slow > 0 and n_ctx_orig > 0):
        raise ModelError(f"{gguf.path}: YaRN metadata out of range (ext_factor {ext}, beta_fast {fast}, "
                         f"beta_slow {slow}, original context {n_ctx_orig})")

    def corr_dim(rotations: float) -> float:
        return rope_dim * math.log(n_ctx_orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(0.0, math.floor(corr_dim(fast))), min(rope_dim - 1.0, math.ceil(corr_dim(slow)))
    return (ext, low, high), attn_factor * (1.0 + 0.1 * math.log(factor) if ext else 1.0)


def _rope_freq_scale(gguf: GGUFFile, p: str) -> float:
    """Linear RoPE scaling (positions divided by the factor). Scalings that live in a tensor of
    per-frequency factors are the tensor's: Llama 3's (rope_freqs.weight; llama.cpp's converter
    writes no type for it, others write 'llama3') and LongRoPE's (rope_factors_*, phi3). Other
    kinds are refused, not ignored."""
    kind = _key(gguf, p + "rope.scaling.type", str, "none")
    factor = _key(gguf, p + "rope.scaling.factor", float, 1.0)
    if factor < 0:
        raise ModelError(f"{gguf.path}: metadata key {p}rope.scaling.factor must be positive, got {factor}")
    in_tensor = {"llama3": ("rope_freqs.weight",), "longrope": ROPE_FACTORS}
    if kind == "yarn":
        return 1.0 / factor if factor > 1.0 else 1.0
    if kind in in_tensor:
        if not any(n in gguf.tensors for n in in_tensor[kind]):
            raise ModelError(f"{gguf.path}: RoPE scaling '{kind}' ({p}rope.scaling.type) needs the tensor "
                             f"{in_tensor[kind][0]}, which the file lacks")
        return 1.0
    if kind == "none" or factor in (0.0, 1.0):
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
    if _key(gguf, p + "attention.value_length", int, head_dim) != head_dim:
        raise ModelError(f"{gguf.path}: metadata key {p}attention.value_length differs from the key length "
                         f"{head_dim}, not supported")
    emb = gguf.tensors.get("token_embd.weight")
    if emb is None:
        raise ModelError(f"{gguf.path}: tensor token_embd.weight is missing")
    hybrid = hybrid_fields(gguf, p, _key) if a["hybrid"] else {}
    cfg = ArchConfig(
        arch=arch,
        n_layer=hybrid.pop("n_layer", None) or _key(gguf, p + "block_count", int),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=_key(gguf, p + "feed_forward_length", int, _key(gguf, p + "expert_feed_forward_length", int, 0)
                  if a["moe"] else None),
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
        rope_attn_factor=_key(gguf, p + "rope.scaling.attn_factor", float, 1.0),
        n_ctx_orig=_key(gguf, p + "rope.scaling.original_context_length", int, 0),
        **(_experts(gguf, p, a) if a["moe"] else {}),
        **hybrid,
    )
    if _key(gguf, p + "rope.scaling.type", str, "none") == "yarn" and cfg.rope_freq_scale < 1.0:
        if not (cfg.rope_base > 1 and 2 <= cfg.rope_dim):
            raise ModelError(f"{gguf.path}: YaRN needs {p}rope.freq_base > 1 and a rotary dimension")
        yarn, mscale = _yarn(gguf, p, cfg.rope_dim, cfg.rope_base, 1.0 / cfg.rope_freq_scale, cfg.rope_attn_factor,
                             cfg.n_ctx_orig or cfg.n_ctx_train)
        cfg = dataclasses.replace(cfg, rope_yarn=yarn, rope_attn_factor=mscale)
    check_config(gguf, cfg)
    check_tensors(gguf, cfg)
    return cfg


def _experts(gguf: GGUFFile, p: str, a: dict) -> dict:
    """An MoE architecture's expert keys (llama.cpp's names): counts, width, gating (defaults
    from ARCHS), each checked with an error naming its key."""
    def bad(key: str, why: str):
        raise ModelError(f"{gguf.path}: metadata key {p}{key} {why}")

    n = _key(gguf, p + "expert_count", int)
    used = _key(gguf, p + "expert_used_count", int)
    width = _key(gguf, p + "expert_feed_forward_length", int)
    if not 1 <= n <= MAX_EXPERTS:
        bad("expert_count", f"is {n}, outside 1..{MAX_EXPERTS}")
    if not 1 <= used <= n:
        bad("expert_used_count", f"is {used}, outside 1..{n} (the expert count)")
    if width < 1 or width % 32:
        bad("expert_feed_forward_length", f"must be a positive multiple of 32, got {width}")
    gating = a["expert_gating"]
    if p + "expert_gating_func" in gguf.metadata:
        code = _key(gguf, p + "expert_gating_func", int)
        if code not in GATING_FUNCS:
            bad("expert_gating_func", f"is {code}, not one of {GATING_FUNCS} (llama.cpp's gating functions)")
        gating = GATING_FUNCS[code]
    norm = gguf.metadata.get(p + "expert_weights_norm", a["expert_norm"])
    if not isinstance(norm, (bool, int)):
        bad("expert_weights_norm", f"must be a bool, got {norm!r}")
    scale = _key(gguf, p + "expert_weights_scale", float, 0.0)
    if scale < 0:
        bad("expert_weights_scale", f"must not be negative, got {scale}")
    # A shared expert: its width where the file holds its tensors (llama.cpp's qwen2moe reads the
    # key, default n_ff; its qwen3moe neither, and a qwen3moe file has no such tensors).
    shexp = 0
    if "blk.0.ffn_up_shexp.weight" in gguf.tensors:
        shexp = _key(gguf, p + "expert_shared_feed_forward_length", int,
                     _key(gguf, p + "feed_forward_length", int, 0))
        if shexp < 1 or shexp % 32:
            bad("expert_shared_feed_forward_length", f"must be a positive multiple of 32, got {shexp}")
    return dict(n_expert=n, n_expert_used=used, n_ff_exp=width, expert_gating=gating, expert_norm=bool(norm),
                expert_scale=scale, expert_act=a["expert_act"], n_ff_shexp=shexp)


def check_config(gguf: GGUFFile, cfg: ArchConfig) -> None:
    """Values the forward pass relies on, checked before any tensor is looked at (so that a
    hostile block_count cannot make check_tensors walk 2^31 layers). Each error names its key."""
    p, path = cfg.arch + ".", gguf.path

    def bad(key: str, why: str):
        raise ModelError(f"{path}: metadata key {p}{key} {why}")

    # Every layer needs at least its 6 required tensors (fused Q/K/V and gate/up: phi3), all in this file.
    if not 1 <= cfg.n_layer <= len(gguf.tensors) // 6:
        bad("block_count", f"is {cfg.n_layer}, but the file's {len(gguf.tensors)} tensors hold at most "
                           f"{len(gguf.tensors) // 6} layers")
    if cfg.n_head * cfg.head_dim > INT_MAX or cfg.n_head_kv * cfg.head_dim > INT_MAX:
        bad("attention.key_length", f"{cfg.head_dim} x {cfg.n_head} heads overflows")
    if cfg.head_dim < 2 or cfg.head_dim % 2:
        bad("attention.key_length", f"(head dimension) must be even and >= 2, got {cfg.head_dim}")
    if cfg.rope_dim % 2 or cfg.rope_dim > cfg.head_dim:
        bad("rope.dimension_count", f"must be even and <= the head dimension {cfg.head_dim}, got {cfg.rope_dim}")
    if cfg.n_ff < 1:
        bad("feed_forward_length", "must be positive")
    if cfg.n_ctx_train < 1:
        bad("context_length", "must be positive")
    if cfg.norm_eps < 0:
        bad("attention.layer_norm_rms_epsilon", f"must not be negative, got {cfg.norm_eps}")
    if cfg.rope_base <= 0 or cfg.rope_base_local < 0:
        bad("rope.freq_base", f"must be positive, got {cfg.rope_base} (local {cfg.rope_base_local})")
    if not 0 < cfg.rope_attn_factor <= 1e3:
        bad("rope.scaling.attn_factor", f"must be in (0, 1000], got {cfg.rope_attn_factor}")


def check_tensors(gguf: GGUFFile, cfg: ArchConfig) -> None:
    """Every tensor the architecture needs is present with the right shape (GGML order)."""
    d, qd, kvd = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    want = {
        "token_embd.weight": (d, cfg.n_vocab), "output_norm.weight": (d,), "output.weight": (d, cfg.n_vocab),
        "rope_freqs.weight": (cfg.rope_dim // 2,), ROPE_FACTORS[0]: (cfg.rope_dim // 2,),
        ROPE_FACTORS[1]: (cfg.rope_dim // 2,),
    }
    if (ROPE_FACTORS[0] in gguf.tensors) != (ROPE_FACTORS[1] in gguf.tensors):
        raise ModelError(f"{gguf.path}: LongRoPE needs both {ROPE_FACTORS[0]} and {ROPE_FACTORS[1]}")
    views = cfg.tensor_views(gguf)
    layer = {
        "attn_norm.weight": (d,), "attn_q.weight": (d, qd), "attn_k.weight": (d, kvd), "attn_v.weight": (d, kvd),
        "attn_output.weight": (qd, d), "attn_q.bias": (qd,), "attn_k.bias": (kvd,), "attn_v.bias": (kvd,),
        "attn_q_norm.weight": (cfg.head_dim,), "attn_k_norm.weight": (cfg.head_dim,),
        "post_attention_norm.weight": (d,), "ffn_norm.weight": (d,), "ffn_gate.weight": (d, cfg.n_ff),
        "ffn_up.weight": (d, cfg.n_ff), "ffn_down.weight": (cfg.n_ff, d), "post_ffw_norm.weight": (d,),
        "attn_output.bias": (d,), "attn_sinks.weight": (cfg.n_head,),
    }
    fused = {"attn_qkv.weight": (d, qd + 2 * kvd), "ffn_up.weight": (d, 2 * cfg.n_ff)}
    if cfg.n_expert:   # 3-D expert tensors: [in, out, n_expert] in GGML order (llama.cpp's convention)
        ne, nf = cfg.n_expert, cfg.n_ff_exp
        for name in DENSE_FFN:
            layer.pop(name)
        layer.update({"ffn_gate_inp.weight": (d, ne), "ffn_gate_exps.weight": (d, nf, ne),
                      "ffn_up_exps.weight": (d, nf, ne), "ffn_down_exps.weight": (nf, d, ne),
                      "ffn_gate_inp.bias": (ne,), "ffn_gate_exps.bias": (nf, ne), "ffn_up_exps.bias": (nf, ne),
                      "ffn_down_exps.bias": (d, ne)})
        if cfg.n_ff_shexp:
            ns = cfg.n_ff_shexp
            layer.update({"ffn_gate_inp_shexp.weight": (d,), "ffn_gate_shexp.weight": (d, ns),
                          "ffn_up_shexp.weight": (d, ns), "ffn_down_shexp.weight": (ns, d)})
    for l in range(cfg.n_layer):
        want.update({f"blk.{l}.{k}": v for k, v in (layer_shapes(cfg, l, layer) if cfg.recurrent else layer).items()})
    for name, shape in want.items():
        v = views.get(name) if name != "rope_freqs.weight" else (gguf.tensors.get(name), 0, 0)
        t = v[0] if v else None
        base = name.split(".", 2)[-1] if name.startswith("blk.") else name
        if t is None:
            if base not in OPTIONAL_TENSORS and base not in ROPE_FACTORS:
                src = next((f for f, parts in FUSED_TENSORS.items() if base in parts), None)
                also = f" (nor a fused {src} of shape {list(fused[src])})" if src else ""
                raise ModelError(f"{gguf.path}: tensor {name} is missing{also} (architecture {cfg.arch})")
            continue
        if v[2] != t.n_elements // t.shape[0]:   # rows of a fused tensor (checked whole by
            continue                             # tensor_views: its rows add up)
        if tuple(t.shape) != shape:
            extra = f" (or a fused one of {list(fused[base])})" if base in fused else ""
            raise ModelError(f"{gguf.path}: tensor {t.name} has shape {list(t.shape)}, expected {list(shape)}{extra}")
        if (len(shape) == 1 or name.endswith(".bias") or base in SSM_VECTORS) and t.type != 0:
            raise ModelError(f"{gguf.path}: tensor {name} has type {type_name(t.type)}, expected F32")


# tokenizer.ggml.* keys and the Python type each must have (lists: of elements of that type).
_NUM = (int, float)
TOKENIZER_KEYS: dict[str, tuple] = {
    "tokenizer.ggml.model": (str, None), "tokenizer.ggml.pre": (str, None),
    "tokenizer.ggml.tokens": (list, str), "tokenizer.ggml.token_type": (list, int),
    "tokenizer.ggml.scores": (list, _NUM), "tokenizer.ggml.merges": (list, str),
    "tokenizer.ggml.bos_token_id": (int, None), "tokenizer.ggml.eos_token_id": (int, None),
    "tokenizer.ggml.eot_token_id": (int, None), "tokenizer.ggml.eom_token_id": (int, None),
    "tokenizer.ggml.unknown_token_id": (int, None), "tokenizer.ggml.padding_token_id": (int, None),
    "tokenizer.ggml.add_bos_token": ((bool, int), None), "tokenizer.ggml.add_eos_token": ((bool, int), None),
    "tokenizer.ggml.add_space_prefix": ((bool, int), None), "tokenizer.chat_template": (str, None),
}


def check_tokenizer_metadata(gguf: GGUFFile, deep: bool = False) -> None:
    """The tokenizer keys have the types the tokenizer reads them as (a hostile file could store
    the vocabulary as numbers, or a token id as a string): a ModelError naming the key, not a
    TypeError from deep inside a tokenizer library. deep: also the checks that cost time in
    proportion to the vocabulary (~50 ms per 50k merges), run only once a tokenizer build failed."""
    meta = gguf.metadata
    if "tokenizer.ggml.model" not in meta:
        raise ModelError(f"{gguf.path}: metadata key tokenizer.ggml.model is missing")
    for key, (kind, elem) in TOKENIZER_KEYS.items():
        v = meta.get(key)
        if v is None:
            continue
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise ModelError(f"{gguf.path}: metadata key {key} has type {type(v).__name__}, expected "
                             f"{'an array' if kind is list else getattr(kind, '__name__', 'a bool')}")
        if elem is not None and not all(isinstance(x, elem) for x in v):
            bad = next(x for x in v if not isinstance(x, elem))
            raise ModelError(f"{gguf.path}: metadata key {key} holds a {type(bad).__name__} ({bad!r:.40}) "
                             f"among its elements")
    if deep and meta.get("tokenizer.ggml.model") == "gpt2" and meta.get("tokenizer.ggml.merges") is not None:
        check_merges(gguf.path, meta["tokenizer.ggml.tokens"] or [], meta["tokenizer.ggml.merges"])


def check_merges(path: str, tokens: list[str], merges: list[str]) -> None:
    """Each BPE merge is "left right", both parts and their concatenation in the vocabulary (the
    BPE model refuses anything else, with an exception that names neither file nor key)."""
    vocab = set(tokens)
    for i, m in enumerate(merges):
        left, sep, right = m.partition(" ")
        if not sep or left not in vocab or right not in vocab or left + right not in vocab:
            raise ModelError(f"{path}: metadata key tokenizer.ggml.merges: merge #{i} {m!r:.80} is not two "
                             f"vocabulary tokens whose concatenation is one")
