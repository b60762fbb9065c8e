"""The shapes, metadata and quantization mixes of bench/synthetic.py's files, as data.

Each Shape holds the numbers of a real model's config.json as llama.cpp's convert_hf_to_gguf.py
writes them into GGUF (the keys each converter class writes, nothing more), `plan()` lists the
tensors of a file with their numpy shapes (outermost first: experts, rows, row length) and
`tensor_type()` gives each the type llama.cpp's quantizer (src/llama-quant.cpp,
llama_tensor_get_type) would give it for a mix. The sources read: llama.cpp 0c1e570 (the
llama-cpp-python 0.3.36 sdist), conversion/{llama,qwen,gpt_oss,phi}.py and src/models/*.cpp.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

QWEN_VOCAB = "ggml-vocab-qwen2.gguf"          # llama.cpp's Qwen2 vocabulary: Qwen3 uses the same one
LLAMA3_VOCAB = "ggml-vocab-llama-bpe.gguf"    # Llama 3's 128256-token BPE
O200K = "o200k"                               # OpenAI's vocabulary, as tests/conformance.py builds it
QWEN35_VOCAB = "ggml-vocab-qwen35.gguf"       # llama.cpp's Qwen3.5 pre-tokenizer test vocabulary (151936 tokens)


@dataclass(frozen=True)
class Shape:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_base: float
    tied: bool              # no output.weight: the head is token_embd
    tokenizer: str          # a ggml-vocab-*.gguf of llama.cpp's suite, "o200k", or a registry model
    n_vocab: int            # the real model's vocabulary (--vocab pads the tokenizer's to it)
    n_ctx: int = 8192
    rms_eps: float = 1e-5
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    head_dim_keys: bool = False   # config.json has head_dim: key_length / value_length written
    llama_keys: bool = False      # LlamaModel / old shapes: vocab_size and rope.dimension_count
    llama3_rope: tuple | None = None   # (factor, low_freq_factor, high_freq_factor, original ctx)
    kv: dict = field(default_factory=dict)   # further "<arch>.<key>" values the converter writes
    default_mix: str = "q4_k_m"   # the file people download
    template: str | None = None   # a chat template of tests/data/chat-templates (llama.cpp's set) to carry

    @property
    def moe(self) -> bool:
        return self.n_expert > 0


LLAMA = dict(llama_keys=True)
QWEN35 = dict(tokenizer=QWEN35_VOCAB, n_vocab=248320, n_ctx=262144, rms_eps=1e-6, head_dim_keys=True,
              rope_base=10000000.0, template="Qwen3.5-4B.jinja")


def _hybrid_kv(n_k: int, n_v: int, d: int = 128) -> dict:
    """The ssm.* and RoPE keys Qwen3.5's converter writes (conversion/qwen.py: Qwen3NextModel)."""
    return {"rope.dimension_count": 64, "rope.dimension_sections": [11, 11, 10, 0], "ssm.conv_kernel": 4,
            "ssm.state_size": d, "ssm.group_count": n_k, "ssm.time_step_rank": n_v, "ssm.inner_size": n_v * d,
            "full_attention_interval": 4}
QWEN3 = dict(tokenizer=QWEN_VOCAB, n_vocab=151936, n_ctx=40960, rms_eps=1e-6, head_dim_keys=True,
             rope_base=1000000.0)
SHAPES = {
    # the first four: laptop-size dense models (issue 20's benchmarks; SmolLM2 / Qwen2.5 tokenizers)
    "llama-3.2-3b": Shape("llama", 28, 3072, 8192, 24, 8, 128, 500000.0, True, "smollm2-135m", 128256, **LLAMA),
    "llama-3.1-8b": Shape("llama", 32, 4096, 14336, 32, 8, 128, 500000.0, False, "smollm2-135m", 128256, **LLAMA),
    "qwen2.5-7b": Shape("qwen2", 28, 3584, 18944, 28, 4, 128, 1000000.0, False, "qwen2.5-coder-0.5b", 152064,
                        **LLAMA),
    "tiny": Shape("llama", 2, 256, 512, 4, 2, 64, 10000.0, True, "smollm2-135m", 49152, **LLAMA),
    # Qwen/Qwen3-0.6B, Qwen3-4B, Qwen3-30B-A3B (config.json): head_dim 128 regardless of n_embd
    "qwen3-0.6b": Shape("qwen3", 28, 1024, 3072, 16, 8, 128, tied=True, **QWEN3),
    "qwen3-4b": Shape("qwen3", 36, 2560, 9728, 32, 8, 128, tied=True, **QWEN3),
    "qwen3-30b-a3b": Shape("qwen3moe", 48, 2048, 6144, 32, 4, 128, tied=False, n_expert=128, n_expert_used=8,
                           n_ff_exp=768, **QWEN3),
    # openai/gpt-oss-20b: o200k with the harmony specials (200019 tokens; --real-vocab pads to 201088)
    "gpt-oss-20b": Shape("gpt-oss", 24, 2880, 2880, 64, 8, 64, 150000.0, False, O200K, 201088,
                         n_ctx=131072, n_expert=32, n_expert_used=4, n_ff_exp=2880, head_dim_keys=True, default_mix="mxfp4",
                         kv={"attention.sliding_window": 128, "rope.scaling.type": "yarn",
                             "rope.scaling.factor": 32.0, "rope.scaling.original_context_length": 4096,
                             "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0}),
    # meta-llama/Llama-3.2-1B: rope_scaling llama3, factor 32, low/high freq factors 1 / 4, original 8192
    "llama-3.2-1b": Shape("llama", 16, 2048, 8192, 32, 8, 64, 500000.0, True, LLAMA3_VOCAB, 128256,
                          n_ctx=131072, head_dim_keys=True, llama3_rope=(32.0, 1.0, 4.0, 8192), **LLAMA),
    # microsoft/Phi-4-mini-instruct: phi3, partial_rotary_factor 0.75 (96 of 128 dims), LongRoPE with
    # original 4096 of 131072 positions; o200k (gpt-oss's specials, not Phi-4-mini's), --real-vocab 200064
    # Qwen/Qwen3.5-0.8B, Qwen3.5-4B, Qwen3.6-35B-A3B (text_config): hybrids, 3 of 4 layers gated delta
    # nets of 16 key heads and 16 / 32 value heads of 128 (ssm.*), every 4th full attention with an
    # output gate; 64 of 256 head dims rotated (M-RoPE sections 11/11/10); the MTP layer not written
    # (pydecode and llama.cpp skip it). --real-vocab pads llama.cpp's 151936-token test vocabulary
    # (the Qwen3.5 pre-tokenizer) to the real 248320.
    "qwen3.5-0.8b": Shape("qwen35", 24, 1024, 3584, 8, 2, 256, tied=True, kv=_hybrid_kv(16, 16), **QWEN35),
    "qwen3.5-4b": Shape("qwen35", 32, 2560, 9216, 16, 4, 256, tied=True, kv=_hybrid_kv(16, 32), **QWEN35),
    "qwen3.6-35b-a3b": Shape("qwen35moe", 40, 2048, 512, 16, 2, 256, tied=False, n_expert=256, n_expert_used=8,
                             n_ff_exp=512, kv={**_hybrid_kv(16, 32), "expert_shared_feed_forward_length": 512},
                             **QWEN35),
    "phi-4-mini": Shape("phi3", 32, 3072, 8192, 24, 8, 128, 10000.0, True, O200K, 200064,
                        n_ctx=131072,
                        kv={"rope.dimension_count": 96, "rope.scaling.original_context_length": 4096,
                            "rope.scaling.attn_factor": math.sqrt(1 + math.log(32) / math.log(4096)),
                            "attention.sliding_window": 262144}),
}

MIXES = ("q4_k_m", "q4_0", "q8_0", "iq4_xs", "iq4_nl", "mxfp4", "f16", "f32")
DEFAULT_TYPE = {"q4_k_m": QT.Q4_K, "q4_0": QT.Q4_0, "q8_0": QT.Q8_0, "iq4_xs": QT.IQ4_XS,
                "iq4_nl": QT.IQ4_NL, "mxfp4": QT.MXFP4, "f16": QT.F16, "f32": QT.F32}
# general.file_type: llama_ftype's numbers (include/llama.h)
FILE_TYPE = {"q4_k_m": 15, "q4_0": 2, "q8_0": 7, "iq4_xs": 30, "iq4_nl": 25, "mxfp4": 38, "f16": 1, "f32": 0}
# Float mixes (every matrix f16 or f32, gpt-oss's experts too) are not files people run: they are
# for checking the arithmetic of an architecture without the 8-bit activation rounding that the
# quantized formats bring (bench/logprob_vs_llamacpp.py: at f32 no runtime quantizes anything).
FLOAT_MIXES = ("f16", "f32")
# tensor_type_fallback: a row length the block does not divide gets a 32-block type instead
FALLBACK = {QT.IQ4_XS: QT.IQ4_NL, QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0, QT.Q2_K: QT.Q4_0,
            QT.Q3_K: QT.Q4_0}


def use_more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits: the layers a Q4_K_M file keeps attn_v / ffn_down in Q6_K."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


more_bits = use_more_bits   # the name the first version of bench/synthetic.py had


def quantized(name: str, dims: tuple) -> bool:
    """tensor_allows_quantization: 2-D and 3-D *.weight tensors, not norms nor the expert router."""
    return (len(dims) >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name and "ssm_conv1d" not in name)


def _category(name: str) -> str:
    """tensor_get_category, in its order (attn_qkv counts as attn_v, as category_is_attn_v says)."""
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_v"), ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"),
                     ("attn_output.weight", "attn_output"), ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


def tensor_type(name: str, dims: tuple, layer: int, n_layer: int, mix: str, shape: Shape) -> QT:
    """The type llama.cpp's quantizer gives tensor `name` (numpy dims) of layer `layer` for `mix`
    (only the rules the six mixes here reach). n_layer is the file's: a --layers cut is quantized
    as the quantizer would quantize that smaller model, so its share of Q6_K layers stays real."""
    if not quantized(name, dims):
        return QT.F32
    if mix in FLOAT_MIXES:
        return DEFAULT_TYPE[mix]
    if shape.arch == "gpt-oss" and len(dims) == 3:
        return QT.MXFP4   # the real file's experts are MXFP4 (the converter repacks them as they are)
    t = default = DEFAULT_TYPE[mix]
    cat = _category(name)
    cols = dims[-1]
    gqa = shape.n_head // shape.n_head_kv
    if cat == "output" or (shape.tied and cat == "token_embd"):
        t = QT.Q8_0 if mix == "mxfp4" or cols % GGML_QUANT_SIZES[default][0] else \
            (QT.Q6_K if default != QT.Q8_0 else QT.Q8_0)
    elif mix == "mxfp4":
        t = QT.MXFP4 if len(dims) == 3 else QT.Q8_0
    elif cat == "attn_v":
        if mix in ("iq4_xs", "iq4_nl") and gqa >= 4:
            t = QT.Q5_K
        elif mix == "q4_k_m" and use_more_bits(layer, n_layer):
            t = QT.Q6_K
        if shape.n_expert == 8:
            t = QT.Q8_0
    elif cat == "attn_k" and shape.n_expert == 8:
        t = QT.Q8_0
    elif cat == "ffn_down":
        if mix == "q4_k_m" and use_more_bits(layer, n_layer):
            t = QT.Q6_K
        elif mix in ("iq4_xs", "iq4_nl") and layer < n_layer // 8:
            t = QT.Q5_K
    elif cat == "attn_output" and shape.n_expert == 8 and mix in ("q4_k_m", "iq4_xs", "iq4_nl"):
        t = QT.Q5_K
    if cols % GGML_QUANT_SIZES[t][0]:
        t = FALLBACK.get(t, t)
        if cols % GGML_QUANT_SIZES[t][0]:
            t = QT.F16
    return t


@dataclass(frozen=True)
class Tensor:
    name: str
    dims: tuple          # numpy order: (experts,) rows, row length
    layer: int           # -1: not a layer's
    kind: str            # mat | router | ones | bias | sinks | rope_freqs | rope_long | rope_short


def plan(shape: Shape, n_layer: int, n_vocab: int) -> list[Tensor]:
    """Every tensor of the file, in the order it is written."""
    s = shape
    d, hd, nh, nkv, ff, E, fe = s.n_embd, s.head_dim, s.n_head, s.n_head_kv, s.n_ff, s.n_expert, s.n_ff_exp
    out = [Tensor("token_embd.weight", (n_vocab, d), -1, "mat"), Tensor("output_norm.weight", (d,), -1, "ones")]
    if not s.tied:
        out.append(Tensor("output.weight", (n_vocab, d), -1, "mat"))
    if s.llama3_rope:
        out.append(Tensor("rope_freqs.weight", (hd // 2,), -1, "rope_freqs"))
    if s.arch == "phi3":
        half = s.kv["rope.dimension_count"] // 2
        out += [Tensor("rope_factors_long.weight", (half,), -1, "rope_long"),
                Tensor("rope_factors_short.weight", (half,), -1, "rope_short")]
    for l in range(n_layer):
        p = f"blk.{l}."
        t = lambda name, dims, kind="mat": out.append(Tensor(p + name, dims, l, kind))  # noqa: E731
        if s.arch.startswith("qwen35"):
            _hybrid_layer(s, l, t)
            continue
        t("attn_norm.weight", (d,), "ones")
        if s.arch == "phi3":
            t("attn_qkv.weight", (nh * hd + 2 * nkv * hd, d))
        else:
            for n, rows in (("attn_q", nh * hd), ("attn_k", nkv * hd), ("attn_v", nkv * hd)):
                t(n + ".weight", (rows, d))
                if s.arch in ("qwen2", "gpt-oss"):
                    t(n + ".bias", (rows,), "bias")
        if s.arch in ("qwen3", "qwen3moe"):
            t("attn_q_norm.weight", (hd,), "ones")
            t("attn_k_norm.weight", (hd,), "ones")
        t("attn_output.weight", (d, nh * hd))
        if s.arch == "gpt-oss":
            t("attn_output.bias", (d,), "bias")
            t("attn_sinks.weight", (nh,), "sinks")
            t("post_attention_norm.weight", (d,), "ones")
        else:
            t("ffn_norm.weight", (d,), "ones")
        if s.moe:
            t("ffn_gate_inp.weight", (E, d), "router")
            if s.arch == "gpt-oss":
                t("ffn_gate_inp.bias", (E,), "bias")
            for n, dims in (("ffn_gate_exps", (E, fe, d)), ("ffn_up_exps", (E, fe, d)), ("ffn_down_exps", (E, d, fe))):
                t(n + ".weight", dims)
                if s.arch == "gpt-oss":
                    t(n + ".bias", dims[:2], "bias")
        elif s.arch == "phi3":
            t("ffn_up.weight", (2 * ff, d))      # gate and up fused, gate first
            t("ffn_down.weight", (d, ff))
        else:
            t("ffn_gate.weight", (ff, d))
            t("ffn_up.weight", (ff, d))
            t("ffn_down.weight", (d, ff))
    return out


def _hybrid_layer(s: Shape, l: int, t) -> None:
    """One layer of a Qwen3.5 hybrid, in the converter's order: a gated delta net (3 of 4) or gated
    full attention, then the FFN (dense, or experts with a shared expert)."""
    d, hd, nh, nkv = s.n_embd, s.head_dim, s.n_head, s.n_head_kv
    nk, nv, ds = s.kv["ssm.group_count"], s.kv["ssm.time_step_rank"], s.kv["ssm.state_size"]
    C, inner = (2 * nk + nv) * ds, nv * ds
    t("attn_norm.weight", (d,), "ones")
    t("post_attention_norm.weight", (d,), "ones")
    if (l + 1) % s.kv["full_attention_interval"]:
        t("attn_qkv.weight", (C, d))
        t("attn_gate.weight", (inner, d))
        t("ssm_conv1d.weight", (C, s.kv["ssm.conv_kernel"]), "conv")
        t("ssm_dt.bias", (nv,), "dt_bias")
        t("ssm_a", (nv,), "ssm_a")
        t("ssm_beta.weight", (nv, d))
        t("ssm_alpha.weight", (nv, d))
        t("ssm_norm.weight", (ds,), "ones")
        t("ssm_out.weight", (d, inner))
    else:
        t("attn_q.weight", (2 * nh * hd, d))   # per head: the query, then its gate
        t("attn_k.weight", (nkv * hd, d))
        t("attn_v.weight", (nkv * hd, d))
        t("attn_output.weight", (d, nh * hd))
        t("attn_q_norm.weight", (hd,), "ones")
        t("attn_k_norm.weight", (hd,), "ones")
    if s.moe:
        E, fe, fs = s.n_expert, s.n_ff_exp, s.kv["expert_shared_feed_forward_length"]
        t("ffn_gate_inp.weight", (E, d), "router")
        for n, dims in (("ffn_gate_exps", (E, fe, d)), ("ffn_up_exps", (E, fe, d)), ("ffn_down_exps", (E, d, fe))):
            t(n + ".weight", dims)
        t("ffn_gate_inp_shexp.weight", (d,), "bias")
        t("ffn_gate_shexp.weight", (fs, d))
        t("ffn_up_shexp.weight", (fs, d))
        t("ffn_down_shexp.weight", (d, fs))
    else:
        t("ffn_gate.weight", (s.n_ff, d))
        t("ffn_up.weight", (s.n_ff, d))
        t("ffn_down.weight", (d, s.n_ff))


def metadata(shape: Shape, n_layer: int, n_vocab: int) -> dict:
    """The "<arch>.*" keys, as the converter class of the architecture writes them."""
    s = shape
    kv = {"context_length": s.n_ctx, "embedding_length": s.n_embd, "block_count": n_layer,
          "feed_forward_length": s.n_ff, "attention.head_count": s.n_head, "attention.head_count_kv": s.n_head_kv,
          "rope.freq_base": s.rope_base, "attention.layer_norm_rms_epsilon": s.rms_eps}
    if s.llama_keys:
        kv.update({"vocab_size": n_vocab, "rope.dimension_count": s.head_dim})
    if s.head_dim_keys:
        kv.update({"attention.key_length": s.head_dim, "attention.value_length": s.head_dim})
    if s.moe:
        kv.update({"expert_count": s.n_expert, "expert_used_count": s.n_expert_used,
                   "expert_feed_forward_length": s.n_ff_exp})
    kv.update(s.kv)
    if s.arch.startswith("qwen35"):   # the converter writes the layer kinds too
        kv["attention.recurrent_layers"] = [bool((i + 1) % s.kv["full_attention_interval"]) for i in range(n_layer)]
    return kv


def llama3_rope_factors(shape: Shape) -> list[float]:
    """rope_freqs.weight of a Llama 3 shape (llama3_rope_freqs)."""
    return llama3_rope_freqs(shape.head_dim, shape.rope_base, *shape.llama3_rope)


def llama3_rope_freqs(dim: int, base: float, factor: float, low: float, high: float, old_ctx: int) -> list[float]:
    """rope_freqs.weight as LlamaModel.generate_extra_tensors computes it: per frequency pair, 1
    for short wavelengths, `factor` for long ones, a smooth blend between (also what the tests'
    tiny Llama 3 models carry: tests/tiny_models.py)."""
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / base ** (i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


# microsoft/Phi-4-mini-instruct config.json, rope_scaling (longrope): short_factor is 48 x 1.0
PHI4_MINI_LONG_FACTOR = [
    1.0, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649,
    2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533,
    5.984965424, 6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651,
    14.64173252, 16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03,
    32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77,
]


def longrope_factors(n: int, long: bool) -> list[float]:
    """LongRoPE's per-pair factors: Phi-4-mini's own for its 48 pairs; another length (a test's
    shrunk shape) gets the same curve resampled."""
    if not long:
        return [1.0] * n
    if n == len(PHI4_MINI_LONG_FACTOR):
        return list(PHI4_MINI_LONG_FACTOR)
    src = PHI4_MINI_LONG_FACTOR
    return [float(x) for x in np.interp(np.linspace(0, len(src) - 1, n), np.arange(len(src)), src)]
