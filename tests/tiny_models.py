"""Tiny random-weight GGUF models, written with gguf.GGUFWriter, for architecture tests.

Small enough to build in milliseconds, shaped to exercise what real models rarely do at short
prompts: a sliding window of 4 (gemma3), local/global layer interleaving, GQA, biases, a vocabulary
that is not a multiple of the kernels' rows per pass, and several weight formats at once.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from iq_blocks import random_iq_blocks

N_VOCAB = 263
REPO = Path(__file__).resolve().parents[1]


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
    """Llama 3.1/3.2's per-frequency divisors as llama.cpp's converter writes rope_freqs.weight
    (Llama-3.2-1B: factor 32, low/high frequency factors 1 and 4, original context 8192): the
    synthetic generator's function (bench/synthetic_shapes.py), one formula for both."""
    mod = sys.modules.get("synthetic_shapes")
    if mod is None:   # registered before it runs: its dataclasses look their module up there
        spec = importlib.util.spec_from_file_location("synthetic_shapes", REPO / "bench" / "synthetic_shapes.py")
        mod = sys.modules["synthetic_shapes"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return np.array(mod.llama3_rope_freqs(head_dim, base, factor, low, high, orig_ctx), np.float32)


def _add_tokenizer(w) -> None:
    """The tiny models' tokenizer: the byte alphabet, <|bos|> <|eos|>, one merge, unused tokens."""
    tokens = _byte_tokens() + ["<|bos|>", "<|eos|>", "ab"] + [f"<unused{i}>" for i in range(N_VOCAB - 259)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3, 3, 1] + [3] * (N_VOCAB - 259))
    w.add_token_merges(["a b"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    w.add_add_bos_token(False)


def _writer(path, arch: str, n_layer: int, n_embd: int, n_ff: int) -> GGUFWriter:
    w = GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    return w


def _write_out(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _tensor_writers(w, rng, weight_types):
    """(matrix, vector): add a random matrix (the next of weight_types in turn; experts: a 3-D
    stack) or an F32 vector around `center` to the writer."""
    types = iter(weight_types * 1000)

    def matrix(name, rows, cols, scale=None, experts=0):
        shape = (experts, rows, cols) if experts else (rows, cols)   # an expert tensor: [cols, rows, experts] in GGML
        a = rng.standard_normal(shape).astype(np.float32) * (scale or 1.0 / np.sqrt(cols))
        t = next(types)
        if t == QT.F32:
            w.add_tensor(name, a)
        elif t == QT.F16:
            w.add_tensor(name, a.astype(np.float16))
        elif t in (QT.IQ4_NL, QT.IQ4_XS):  # no numpy quantizer: random blocks with sane scales
            b = random_iq_blocks(t, (experts or 1) * rows, cols, rng, scale or 1.0 / np.sqrt(cols), model_like=True)
            w.add_tensor(name, b.reshape(shape[:-1] + (b.shape[-1],)), raw_dtype=t)
        elif t.name.startswith("IQ"):  # no numpy quantizer: random bytes are a well-formed tensor
            block, size = GGML_QUANT_SIZES[t]
            w.add_tensor(name, rng.integers(0, 256, shape[:-1] + (cols // block * size,), dtype=np.uint8), raw_dtype=t)
        else:
            w.add_tensor(name, quantize(a, t), raw_dtype=t)

    def vector(name, n, center=1.0, spread=0.1):
        w.add_tensor(name, (center + spread * rng.standard_normal(n)).astype(np.float32))

    return matrix, vector


def write_tiny_model(path, arch: str = "gemma3", *, n_layer: int = 7, n_embd: int = 64, n_head: int = 4,
                     n_head_kv: int = 2, head_dim: int = 32, n_ff: int = 96, window: int = 4,
                     weight_types=(QT.Q8_0, QT.Q5_0, QT.F16, QT.Q4_1), seed: int = 0,
                     rope_freqs: bool = False, n_expert: int = 8, n_expert_used: int = 2, n_ff_exp: int = 32,
                     moe_keys: dict | None = None, moe: bool | None = None, router_scale: float = 1.0,
                     sinks: bool = False, out_bias: bool = False, yarn: float = 0.0, expert_bias: float = 0.5,
                     pooling_type: int | None = None) -> None:
    """arch "qwen3moe": every layer's FFN is n_expert experts of width n_ff_exp, n_expert_used per
    token (moe_keys: <arch>.* keys added or overriding the counts, e.g. {"expert_gating_func": 2}).
    moe=True with a dense arch: the experts beside the dense FFN (a hostile file). router_scale 1:
    decisive routes (8-bit activation noise never flips one); 0.25: the weights of the k chosen
    differ enough for their gating and renormalization to matter.
    sinks, out_bias, yarn: gpt-oss's attention pieces on any architecture (attention sinks, an
    attn_output bias, YaRN RoPE of that factor over an original context of 8).
    pooling_type: <arch>.pooling_type, llama.cpp's enum (an embedding model's; absent: none)."""
    rng = np.random.default_rng(seed)
    w = _writer(path, arch, n_layer, n_embd, n_ff)
    dense = arch not in ("qwen3moe", "qwen2moe", "gpt-oss")
    if arch == "gpt-oss":   # gpt-oss's data: sinks, output bias, YaRN (over an original context of 8), SWA
        sinks, out_bias, yarn = True, True, yarn or 4.0
        w.add_sliding_window(window)
    moe = not dense if moe is None else moe
    if moe:   # the keys llama.cpp's converter writes for Qwen3-MoE
        keys = {"expert_count": n_expert, "expert_used_count": n_expert_used, "expert_feed_forward_length": n_ff_exp,
                **({"expert_shared_feed_forward_length": n_ff} if arch == "qwen2moe" else {}), **(moe_keys or {})}
        for key, value in keys.items():   # gating as a number: this gguf's enum lacks 3
            w.add_uint32(f"{arch}.{key}", value) if key in ("expert_gating_func", "expert_count") \
                else getattr(w, "add_" + key)(value)
    if pooling_type is not None:
        w.add_uint32(f"{arch}.pooling_type", pooling_type)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6 if arch == "gemma3" else 1e4)
    if arch == "gemma3":
        w.add_sliding_window(window)
    if yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(yarn)
        w.add_rope_scaling_orig_ctx_len(8)
    if arch == "phi3":   # partial rotary (3/4 of the head), LongRoPE past an original context of 32
        w.add_rope_dimension_count(head_dim * 3 // 4)
        w.add_rope_scaling_orig_ctx_len(32)
        w.add_rope_scaling_attn_factors(1.19)
        w.add_sliding_window(window)   # Phi-3's key, which llama.cpp (and pydecode) ignore
    _add_tokenizer(w)

    matrix, vector = _tensor_writers(w, rng, weight_types)

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
    if arch in ("qwen2", "qwen3moe", "qwen2moe", "gpt-oss"):  # untied output head
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
        if out_bias:
            vector(p + "attn_output.bias", n_embd, 0.0, 0.5)
        if sinks:   # around the scores' scale, so that they take a real share of the softmax
            vector(p + "attn_sinks.weight", n_head, 0.5, 1.0)
        if arch in ("qwen2", "qwen2moe", "gpt-oss"):
            vector(p + "attn_q.bias", qd, 0.0, 0.5)
            vector(p + "attn_k.bias", kvd, 0.0, 0.5)
            vector(p + "attn_v.bias", kvd, 0.0, 0.5)
        if arch in ("gemma3", "qwen3", "qwen3moe"):
            vector(p + "attn_q_norm.weight", head_dim)
            vector(p + "attn_k_norm.weight", head_dim)
        if arch == "gemma3":
            vector(p + "post_attention_norm.weight", n_embd)
            vector(p + "post_ffw_norm.weight", n_embd)
        vector(p + ("post_attention_norm.weight" if arch == "gpt-oss" else "ffn_norm.weight"), n_embd)
        if moe:   # the router stays F32 (llama.cpp's quantize never quantizes ffn_gate_inp)
            w.add_tensor(p + "ffn_gate_inp.weight", (router_scale * rng.standard_normal((n_expert, n_embd))).astype(np.float32))
            matrix(p + "ffn_gate_exps.weight", n_ff_exp, n_embd, experts=n_expert)
            matrix(p + "ffn_up_exps.weight", n_ff_exp, n_embd, experts=n_expert)
            matrix(p + "ffn_down_exps.weight", n_embd, n_ff_exp, experts=n_expert)
        if moe and arch == "qwen2moe":   # its shared expert, of width n_ff, gated per token
            vector(p + "ffn_gate_inp_shexp.weight", n_embd, 0.0, 0.3)
            matrix(p + "ffn_gate_shexp.weight", n_ff, n_embd)
            matrix(p + "ffn_up_shexp.weight", n_ff, n_embd)
            matrix(p + "ffn_down_shexp.weight", n_embd, n_ff)
        if moe and arch == "gpt-oss":   # router and expert biases (expert_bias 2: the clamps bite)
            bias_scale = expert_bias
            vector(p + "ffn_gate_inp.bias", n_expert, 0.0, 0.5)
            w.add_tensor(p + "ffn_gate_exps.bias", (bias_scale * rng.standard_normal((n_expert, n_ff_exp))).astype(np.float32))
            w.add_tensor(p + "ffn_up_exps.bias", (bias_scale * rng.standard_normal((n_expert, n_ff_exp))).astype(np.float32))
            w.add_tensor(p + "ffn_down_exps.bias", (0.5 * rng.standard_normal((n_expert, n_embd))).astype(np.float32))
        if dense and arch == "phi3":   # gate then up, in one tensor
            matrix(p + "ffn_up.weight", 2 * n_ff, n_embd)
            matrix(p + "ffn_down.weight", n_embd, n_ff)
        elif dense:
            matrix(p + "ffn_gate.weight", n_ff, n_embd)
            matrix(p + "ffn_up.weight", n_ff, n_embd)
            matrix(p + "ffn_down.weight", n_embd, n_ff)
    _write_out(w)


def tiny_server(tmp_path_factory, n_ctx: int):
    """A generator for a module fixture: (llm, Starlette TestClient) over the server's app on a
    2-layer tiny llama (its engine started), closed after the module."""
    import pytest
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    import pydecode
    from pydecode.server import ServerState, create_app

    path = tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf"
    write_tiny_model(path, "llama", n_layer=2)
    llm = pydecode.load(str(path), n_ctx=n_ctx, n_threads=1)
    state = ServerState("tiny")
    llm.engine.start()
    state.ready(llm)
    with TestClient(create_app(state)) as client:
        yield llm, client
    llm.close()


def write_tiny_hybrid(path, *, moe: bool = False, n_layer: int = 4, n_embd: int = 64, n_head: int = 4,
                      n_head_kv: int = 2, head_dim: int = 32, n_ff: int = 96, n_k: int = 2, n_v: int = 4,
                      d_state: int = 32, d_conv: int = 4, interval: int = 4, rope_dim: int = 16,
                      n_expert: int = 8, n_expert_used: int = 2, n_ff_exp: int = 32,
                      weight_types=(QT.Q8_0, QT.Q5_0, QT.F16, QT.Q4_1), seed: int = 0, mtp: bool = False) -> None:
    """A tiny Qwen3.5 hybrid (qwen35; qwen35moe with moe): every `interval`-th layer full gated
    attention, the others gated delta nets of n_k key heads and n_v value heads (n_v / n_k query
    heads share a key head, as in the real models) of d_state dims, with the tensors and keys
    llama.cpp's converter writes (src/models/qwen35.cpp reads them). tests/reference_qwen35.py is
    its oracle. mtp: a multi-token-prediction block after the layers, as the converter writes it
    (block_count counts it; nextn_predict_layers 1; the layer kinds as attention.recurrent_layers),
    drawn last: the other tensors are those of the file without it."""
    arch = "qwen35moe" if moe else "qwen35"
    rng = np.random.default_rng(seed)
    w = _writer(path, arch, n_layer + mtp, n_embd, n_ff)
    if mtp:
        w.add_uint32(f"{arch}.nextn_predict_layers", 1)
        w.add_array(f"{arch}.attention.recurrent_layers", [(i + 1) % interval != 0 for i in range(n_layer)] + [False])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e7)
    w.add_rope_dimension_count(rope_dim)
    w.add_array(f"{arch}.rope.dimension_sections", [rope_dim // 6, rope_dim // 6, rope_dim // 2 - 2 * (rope_dim // 6), 0])
    for key, value in (("ssm.conv_kernel", d_conv), ("ssm.inner_size", n_v * d_state), ("ssm.state_size", d_state),
                       ("ssm.time_step_rank", n_v), ("ssm.group_count", n_k), ("full_attention_interval", interval)):
        w.add_uint32(f"{arch}.{key}", value)
    if moe:
        for key, value in (("expert_count", n_expert), ("expert_used_count", n_expert_used),
                           ("expert_feed_forward_length", n_ff_exp), ("expert_shared_feed_forward_length", n_ff)):
            w.add_uint32(f"{arch}.{key}", value)
    _add_tokenizer(w)
    matrix, vector = _tensor_writers(w, rng, weight_types)

    qd, kvd, key_dim, value_dim = n_head * head_dim, n_head_kv * head_dim, n_k * d_state, n_v * d_state
    w.add_tensor("token_embd.weight", quantize(rng.standard_normal((N_VOCAB, n_embd)).astype(np.float32), QT.Q8_0),
                 raw_dtype=QT.Q8_0)
    vector("output_norm.weight", n_embd)
    matrix("output.weight", N_VOCAB, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", n_embd)
        vector(p + "post_attention_norm.weight", n_embd)
        if (i + 1) % interval == 0:   # full attention: the query and its gate, per head
            matrix(p + "attn_q.weight", 2 * qd, n_embd)
            matrix(p + "attn_k.weight", kvd, n_embd)
            matrix(p + "attn_v.weight", kvd, n_embd)
            matrix(p + "attn_output.weight", n_embd, qd)
            vector(p + "attn_q_norm.weight", head_dim)
            vector(p + "attn_k_norm.weight", head_dim)
        else:                         # the gated delta net
            matrix(p + "attn_qkv.weight", 2 * key_dim + value_dim, n_embd)
            matrix(p + "attn_gate.weight", value_dim, n_embd)
            w.add_tensor(p + "ssm_conv1d.weight", (rng.standard_normal((2 * key_dim + value_dim, d_conv)) * 0.5)
                         .astype(np.float32))
            vector(p + "ssm_dt.bias", n_v, 0.0, 1.0)
            w.add_tensor(p + "ssm_a", (-np.exp(rng.uniform(-1.0, 1.0, n_v))).astype(np.float32))   # -exp(A_log)
            w.add_tensor(p + "ssm_beta.weight", (rng.standard_normal((n_v, n_embd)) / np.sqrt(n_embd)).astype(np.float32))
            w.add_tensor(p + "ssm_alpha.weight", (rng.standard_normal((n_v, n_embd)) / np.sqrt(n_embd)).astype(np.float32))
            vector(p + "ssm_norm.weight", d_state)
            matrix(p + "ssm_out.weight", n_embd, value_dim)
        if moe:
            w.add_tensor(p + "ffn_gate_inp.weight", rng.standard_normal((n_expert, n_embd)).astype(np.float32))
            matrix(p + "ffn_gate_exps.weight", n_ff_exp, n_embd, experts=n_expert)
            matrix(p + "ffn_up_exps.weight", n_ff_exp, n_embd, experts=n_expert)
            matrix(p + "ffn_down_exps.weight", n_embd, n_ff_exp, experts=n_expert)
            vector(p + "ffn_gate_inp_shexp.weight", n_embd, 0.0, 0.3)
            matrix(p + "ffn_gate_shexp.weight", n_ff, n_embd)
            matrix(p + "ffn_up_shexp.weight", n_ff, n_embd)
            matrix(p + "ffn_down_shexp.weight", n_embd, n_ff)
        else:
            matrix(p + "ffn_gate.weight", n_ff, n_embd)
            matrix(p + "ffn_up.weight", n_ff, n_embd)
            matrix(p + "ffn_down.weight", n_embd, n_ff)
    if mtp:   # a full-attention block with its nextn projections (never run: skipped on load)
        p = f"blk.{n_layer}."
        for name in ("attn_norm", "post_attention_norm", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm"):
            vector(p + name + ".weight", n_embd)
        matrix(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd)
        for name, rows, cols in (("attn_q", 2 * n_head * head_dim, n_embd), ("attn_k", n_head_kv * head_dim, n_embd),
                                 ("attn_v", n_head_kv * head_dim, n_embd), ("attn_output", n_embd, n_head * head_dim),
                                 ("ffn_gate", n_ff, n_embd), ("ffn_up", n_ff, n_embd), ("ffn_down", n_embd, n_ff)):
            matrix(p + name + ".weight", rows, cols)
        vector(p + "attn_q_norm.weight", head_dim)
        vector(p + "attn_k_norm.weight", head_dim)
    _write_out(w)
