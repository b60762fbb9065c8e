"""Hybrid architectures' extra data: Qwen3.5 / Qwen3.6 (qwen35, qwen35moe), whose recurrent layers
are gated delta nets (csrc/core/deltanet.c) beside full-attention layers with an output gate.

What a GGUF file says about them (llama.cpp's keys, src/models/qwen35.cpp): ssm.conv_kernel,
ssm.state_size (dims per head, keys and values), ssm.group_count (key heads), ssm.time_step_rank
(value heads), ssm.inner_size (value heads x dims), and which layers are recurrent
(attention.recurrent_layers, else every layer but each full_attention_interval-th). block_count
includes the multi-token-prediction layers (nextn_predict_layers): they are skipped, as llama.cpp
does by default (pydecode info says so).

A recurrent layer keeps a fixed-size state per sequence instead of a KV cache, and it cannot be
cut back: the SlotLedger reuses a slot's whole cached run or nothing (slots.RECURRENT).
"""
from __future__ import annotations

from .errors import ModelError

# The C core's recurrent-layer slots, in pydecode.h's order (after the attention ones).
SSM_TENSORS = ["attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight", "ssm_conv1d.weight",
               "ssm_dt.bias", "ssm_a", "ssm_norm.weight", "ssm_out.weight"]
MAX_CONV = 8
MAX_STATE = 512   # the C core's SSM_MAX_STATE


def hybrid_fields(gguf, p: str, key) -> dict:
    """The ArchConfig fields of a hybrid: `key(gguf, name, kind, default)` is config._key."""
    def bad(name: str, why: str):
        raise ModelError(f"{gguf.path}: metadata key {p}{name} {why}")

    n_all = key(gguf, p + "block_count", int)
    n_mtp = key(gguf, p + "nextn_predict_layers", int, 0)
    if not 0 <= n_mtp < n_all:
        bad("nextn_predict_layers", f"is {n_mtp}, not below block_count {n_all}")
    n_layer = n_all - n_mtp
    d_conv = key(gguf, p + "ssm.conv_kernel", int)
    d_state = key(gguf, p + "ssm.state_size", int)
    n_k = key(gguf, p + "ssm.group_count", int)
    n_v = key(gguf, p + "ssm.time_step_rank", int)
    inner = key(gguf, p + "ssm.inner_size", int)
    if not 2 <= d_conv <= MAX_CONV:
        bad("ssm.conv_kernel", f"is {d_conv}, outside 2..{MAX_CONV}")
    if d_state < 32 or d_state % 32 or d_state > MAX_STATE:
        bad("ssm.state_size", f"must be a multiple of 32 in 32..{MAX_STATE}, got {d_state}")
    if n_k < 1 or n_v < 1 or n_v % n_k or n_v > 4096:
        bad("ssm.time_step_rank", f"(value heads) {n_v} must be a multiple of ssm.group_count (key heads) {n_k}")
    if inner != n_v * d_state:
        bad("ssm.inner_size", f"is {inner}, not value heads x state size = {n_v * d_state} (keys and values "
                              f"of one width are what the delta rule here supports)")
    flags = gguf.metadata.get(p + "attention.recurrent_layers")
    if flags is not None:
        if not isinstance(flags, list) or len(flags) < n_layer or not all(isinstance(f, (bool, int)) for f in flags):
            bad("attention.recurrent_layers", f"must be {n_layer} or more flags, got {flags!r:.80}")
        recurrent = tuple(bool(f) for f in flags[:n_layer])
    else:
        every = key(gguf, p + "full_attention_interval", int, 4)
        if every < 1:
            bad("full_attention_interval", f"must be positive, got {every}")
        recurrent = tuple((i + 1) % every != 0 for i in range(n_layer))
    if all(recurrent):
        bad("attention.recurrent_layers", "leaves no attention layer")
    return dict(n_layer=n_layer, n_mtp=n_mtp, recurrent=recurrent, ssm_d_conv=d_conv, ssm_n_k=n_k, ssm_n_v=n_v,
                ssm_d_state=d_state, attn_gated=True)


def layer_shapes(cfg, layer: int, shapes: dict) -> dict:
    """The tensor shapes (GGML order) layer `layer` needs: a recurrent layer's delta net in place of
    the attention's, or the gated attention's doubled attn_q; the FFN's as `shapes` has them."""
    d, qd = cfg.n_embd, cfg.n_head * cfg.head_dim
    out = dict(shapes)
    if cfg.recurrent[layer]:
        for name in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_q_norm.weight",
                     "attn_k_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"):
            out.pop(name, None)
        C, inner, nv = (2 * cfg.ssm_n_k + cfg.ssm_n_v) * cfg.ssm_d_state, cfg.ssm_n_v * cfg.ssm_d_state, cfg.ssm_n_v
        out.update({"attn_qkv.weight": (d, C), "attn_gate.weight": (d, inner), "ssm_beta.weight": (d, nv),
                    "ssm_alpha.weight": (d, nv), "ssm_conv1d.weight": (cfg.ssm_d_conv, C), "ssm_dt.bias": (nv,),
                    "ssm_a": (nv,), "ssm_norm.weight": (cfg.ssm_d_state,), "ssm_out.weight": (inner, d)})
    else:
        out["attn_q.weight"] = (d, 2 * qd)
    return out


# F32 vectors (checked as such) among SSM_TENSORS; the convolution is F32 too (pydecode.h).
SSM_VECTORS = {"ssm_dt.bias", "ssm_a", "ssm_norm.weight", "ssm_conv1d.weight"}
