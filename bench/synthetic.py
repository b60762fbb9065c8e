"""Synthetic GGUFs of real model shapes, for benchmarks and checks of models we cannot download.

    python bench/synthetic.py llama-3.2-3b -o /tmp/llama-3.2-3b-q4_k_m.gguf
    python bench/synthetic.py qwen3-30b-a3b --layers 8 -o /tmp/qwen3-30b-a3b-8l-q4_k_m.gguf
    python bench/synthetic.py gpt-oss-20b --mix mxfp4 --vocab 201088 -o /tmp/gpt-oss-20b-mxfp4.gguf
    python bench/synthetic.py llama-3.2-1b --mix iq4_xs -o /tmp/llama-3.2-1b-iq4_xs.gguf
    python bench/synthetic.py tiny -o /tmp/tiny.gguf          # 2 layers: what the tests load

Shapes (bench/synthetic_shapes.py): llama-3.2-3b, llama-3.1-8b, qwen2.5-7b, tiny, qwen3-0.6b,
qwen3-4b, qwen3-30b-a3b (128 experts, top 8), gpt-oss-20b (32 experts, top 4, MXFP4 experts,
attention sinks, sliding-window 128 / full layers, YaRN), llama-3.2-1b (llama3 RoPE scaling,
rope_freqs.weight), phi-4-mini (fused attn_qkv and gate+up, LongRoPE factors, 96 of 128 dims
rotated), qwen3.5-0.8b, qwen3.5-4b and qwen3.6-35b-a3b (hybrids: 3 of 4 layers gated delta nets,
every 4th gated full attention; the 35B with 256 experts, top 8, and a shared expert; `--layers 4`
gives three delta-net layers and one attention layer). `--layers N` keeps the first N layers. The tensors have the shapes of the real model
and the types llama.cpp's quantizer gives them for the mix (q4_k_m, q4_0, q8_0, iq4_xs, iq4_nl,
mxfp4; see synthetic_shapes.tensor_type), or every matrix in f16 / f32 (mixes f16, f32: not files
people run, but an architecture's arithmetic without 8-bit rounding, for logprob_vs_llamacpp.py). Their blocks are random bytes whose scales are set so
each matrix's entries have an RMS of about 1/sqrt(row length) (the head 4x that, so the logits
spread a few nats): every kernel streams real bytes in the real layout, activations keep their
size through the layers and the logits stay finite; the text is noise. The tokenizer is the family's
where one is at hand (llama.cpp's Qwen2 vocabulary for Qwen3, its Llama 3 BPE, OpenAI's o200k for
gpt-oss and Phi-4-mini), else a registry model's; --vocab pads its token list with unused tokens
(e.g. to the real 201088 of gpt-oss).
llama.cpp loads these files (bench/README.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT, GGUFValueType, GGUFWriter, quants

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_shapes import (FILE_TYPE, MIXES, SHAPES, Shape, llama3_rope_factors, longrope_factors,  # noqa: E402
                              metadata, more_bits, plan, tensor_type)

__all__ = ["SHAPES", "MIXES", "Shape", "write", "plan_types", "more_bits", "tensor_type", "random_blocks"]

# byte offset of each block's f16 scale d, and of its second f16 (dmin or m) with the factor that
# makes the block's entries average about zero (for Q4_K: E[q] = 7.5 of 0..15, so dmin = 7.5 d)
D_OFFSET = {QT.Q4_0: 0, QT.Q4_1: 0, QT.Q5_0: 0, QT.Q5_1: 0, QT.Q8_0: 0, QT.Q2_K: 80, QT.Q3_K: 108,
            QT.Q4_K: 0, QT.Q5_K: 0, QT.Q6_K: 208, QT.IQ4_NL: 0, QT.IQ4_XS: 0}
SECOND = {QT.Q4_1: (2, -7.5), QT.Q5_1: (2, -15.5), QT.Q2_K: (82, 1.5), QT.Q4_K: (2, 7.5), QT.Q5_K: (2, 15.5)}
HEAD_GAIN = 4.0


@lru_cache(maxsize=None)
def unit_rms(qtype: QT) -> float:
    """RMS of the dequantized entries of random blocks whose scale is 1 (MXFP4: exponent 127)."""
    w = _with_scales(qtype, np.random.default_rng(1).integers(0, 256, (512, GGML_QUANT_SIZES[qtype][1]), np.uint8),
                     np.ones(512))
    return float(np.sqrt(np.mean(quants.dequantize(w.reshape(1, -1), qtype).astype(np.float64) ** 2)))


def _with_scales(qtype: QT, w: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Write scale d[i] into block i of w (n_blocks x block bytes), in place."""
    if qtype == QT.MXFP4:   # e8m0: one exponent byte, 2^(e-127)
        w[:, 0] = np.clip(127 + np.round(np.log2(d)), 1, 254).astype(np.uint8)
        return w
    off = D_OFFSET[qtype]
    w[:, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    if qtype in SECOND:
        off2, k = SECOND[qtype]
        w[:, off2:off2 + 2] = (d * k).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return w


def random_blocks(qtype: QT, dims: tuple, rng: np.random.Generator, rms: float | None = None) -> np.ndarray:
    """A tensor of qtype as raw bytes (dims numpy order, last the row length): random quants, block
    scales drawn around the value that gives entries of RMS `rms` (default 1/sqrt(row length))."""
    cols = dims[-1]
    rms = rms if rms is not None else 1.0 / np.sqrt(cols)
    block, nbytes = GGML_QUANT_SIZES[qtype]
    n = int(np.prod(dims)) // block
    w = rng.integers(0, 256, (n, nbytes), dtype=np.uint8)
    _with_scales(qtype, w, rms / unit_rms(qtype) * rng.uniform(0.5, 1.5, n))
    return w.reshape(*dims[:-1], cols // block * nbytes)


def _conformance():
    """tests/conformance.py, which fetches llama.cpp's vocabulary suite and the o200k vocabulary."""
    spec = importlib.util.spec_from_file_location("conformance", Path(__file__).resolve().parents[1] / "tests" / "conformance.py")
    conformance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conformance)
    return conformance


def tokenizer_file(name: str) -> Path:
    """A ggml-vocab-*.gguf of llama.cpp's suite (fetched by tests/conformance.py), else a registry model."""
    from pydecode.registry import model_path, models_dir

    if not name.endswith(".gguf"):
        return model_path(name)
    path = models_dir().parent / "conformance" / "tokenizer" / name
    return path if path.exists() else _conformance().tokenizer_dir() / name


@lru_cache(maxsize=8)
def _tokenizer_keys(src: str) -> tuple:
    """The tokenizer.* keys of a tokenizer source (SHAPES' `tokenizer`), read with pydecode's reader
    (gguf's GGUFReader takes ~20 s on a 151k-token vocabulary); "o200k": OpenAI's vocabulary as
    tests/conformance.py builds its GGUF metadata (gpt-4o pre-tokenizer, gpt-oss's harmony specials)."""
    from pydecode.gguf_file import GGUFFile

    if src == "o200k":
        return tuple(_conformance().o200k_metadata().items())
    f = GGUFFile(tokenizer_file(src))
    try:
        return tuple((k, v) for k, v in f.metadata.items() if k.startswith("tokenizer."))
    finally:
        f.close()


def _gguf_type(val) -> tuple:
    """(type, array element type) of a metadata value as the converters write them: token ids
    uint32, token types int32, scores float32."""
    kinds = {bool: GGUFValueType.BOOL, int: GGUFValueType.UINT32, float: GGUFValueType.FLOAT32,
             str: GGUFValueType.STRING}
    if isinstance(val, list):
        first = type(val[0]) if val else str
        return GGUFValueType.ARRAY, (GGUFValueType.INT32 if first is int else kinds[first])
    return kinds[type(val)], None


def copy_tokenizer(writer: GGUFWriter, src: str, vocab: int | None, skip=()) -> int:
    """The tokenizer.* keys of tokenizer source src (but those in skip); returns the vocabulary
    size (padded to vocab if given)."""
    n = 0
    for key, val in _tokenizer_keys(str(src)):
        if key in skip:
            continue
        if key == "tokenizer.ggml.tokens":
            n = len(val)
            if vocab and vocab > n:
                val = list(val) + [f"<unused_{i}>" for i in range(n, vocab)]
                n = vocab
        elif key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores") and vocab and vocab > len(val):
            val = list(val) + ([4] if key.endswith("type") else [0.0]) * (vocab - len(val))   # 4: unused
        vtype, sub = _gguf_type(val)
        writer.add_key_value(key, val, vtype, sub_type=sub)
    return n


def _add_kv(w: GGUFWriter, key: str, val) -> None:
    if isinstance(val, list):   # (bools as BOOL, ints as INT32: the converters' types)
        w.add_array(key, val)
    elif isinstance(val, bool):
        w.add_bool(key, val)
    elif isinstance(val, int):
        w.add_uint32(key, val)
    elif isinstance(val, float):
        w.add_float32(key, val)
    else:
        w.add_string(key, val)


def _shape(shape: str | Shape) -> tuple[str, Shape]:
    return (shape, SHAPES[shape]) if isinstance(shape, str) else (shape.arch, shape)


def plan_types(shape: str | Shape, mix: str, n_vocab: int, layers: int | None = None) -> dict:
    """name -> (numpy dims, type) of every tensor of the file write() makes (no bytes made)."""
    _, s = _shape(shape)
    n_layer = min(layers or s.n_layer, s.n_layer)
    return {t.name: (t.dims, tensor_type(t.name, t.dims, t.layer, n_layer, mix, s)) for t in plan(s, n_layer, n_vocab)}


def _values(t, s: Shape, qtype: QT, rng: np.random.Generator) -> np.ndarray:
    """The bytes or floats of one planned tensor."""
    if t.kind == "mat" and qtype not in (QT.F32, QT.F16):
        gain = HEAD_GAIN if t.name == "output.weight" or (s.tied and t.name == "token_embd.weight") else 1.0
        return random_blocks(qtype, t.dims, rng, gain / np.sqrt(t.dims[-1]))
    if t.kind in ("mat", "router"):
        gain = HEAD_GAIN if t.kind == "mat" and (t.name == "output.weight" or (s.tied and t.name == "token_embd.weight")) else 1.0
        x = (rng.standard_normal(t.dims, dtype=np.float32) * np.float32(gain / np.sqrt(t.dims[-1])))
        return x.astype(np.float16) if qtype == QT.F16 else x
    if t.kind == "ones":
        return np.ones(t.dims, np.float32)
    if t.kind == "bias":
        return (rng.standard_normal(t.dims) * 0.02).astype(np.float32)
    if t.kind == "conv":    # a delta net's causal convolution taps (F32)
        return (rng.standard_normal(t.dims) * 0.3).astype(np.float32)
    if t.kind == "ssm_a":   # -exp(A_log), A in [1, 16] as the models initialize it
        return (-rng.uniform(1.0, 16.0, t.dims)).astype(np.float32)
    if t.kind == "dt_bias":   # softplus^-1 of a time step in [0.001, 0.1]
        return np.log(np.expm1(rng.uniform(0.001, 0.1, t.dims))).astype(np.float32)
    if t.kind == "sinks":   # a learned logit per head; gpt-oss's are of order one
        return rng.standard_normal(t.dims).astype(np.float32)
    if t.kind == "rope_freqs":
        return np.array(llama3_rope_factors(s), np.float32)
    return np.array(longrope_factors(t.dims[0], long=t.kind == "rope_long"), np.float32)


def write(shape: str | Shape, mix: str, out: Path, vocab: int | None = None, seed: int = 0,
          layers: int | None = None) -> Path:
    """Write the synthetic file; shape is a SHAPES name or a Shape (the tests shrink real ones)."""
    name, s = _shape(shape)
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r} (known: {', '.join(MIXES)})")
    n_layer = min(layers or s.n_layer, s.n_layer)
    if n_layer < 1:
        raise ValueError("--layers must be at least 1")
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(out), s.arch)
    cut = f" {n_layer} of {s.n_layer} layers" if n_layer < s.n_layer else ""
    w.add_name(f"synthetic {name} {mix}{cut}")
    n_vocab = copy_tokenizer(w, s.tokenizer, vocab, skip=("tokenizer.chat_template",) if s.template else ())
    if s.template:   # (in place of the tokenizer source's, which copy_tokenizer left out)
        w.add_chat_template((Path(__file__).resolve().parents[1] / "tests" / "data" / "chat-templates" / s.template)
                            .read_text(encoding="utf-8"))
    for key, val in metadata(s, n_layer, n_vocab).items():
        _add_kv(w, f"{s.arch}.{key}", val)
    w.add_file_type(FILE_TYPE[mix])
    w.add_quantization_version(2)
    tensors = plan(s, n_layer, n_vocab)
    types = [tensor_type(t.name, t.dims, t.layer, n_layer, mix, s) for t in tensors]
    # tensor infos first, then each tensor's bytes made and written one at a time: a 30B file
    # never has to fit in memory
    for t, q in zip(tensors, types):
        if q in (QT.F32, QT.F16):
            dt = np.float32 if q == QT.F32 else np.float16
            w.add_tensor_info(t.name, t.dims, np.dtype(dt), int(np.prod(t.dims)) * np.dtype(dt).itemsize)
        else:
            block, nbytes = GGML_QUANT_SIZES[q]
            raw = (*t.dims[:-1], t.dims[-1] // block * nbytes)
            w.add_tensor_info(t.name, raw, np.dtype(np.uint8), int(np.prod(raw)), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t, q in zip(tensors, types):
        w.write_tensor_data(_values(t, s, q, rng))
    w.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--mix", choices=MIXES, help="default: the shape's usual file (q4_k_m; gpt-oss-20b mxfp4)")
    ap.add_argument("--layers", type=int, help="keep the first N layers of the real shape")
    ap.add_argument("--vocab", type=int, help="pad the vocabulary to this many tokens (e.g. 128256); "
                                              "'--vocab 0' is the tokenizer's own, the default")
    ap.add_argument("--real-vocab", action="store_true", help="pad to the real model's vocabulary")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args()
    vocab = SHAPES[a.shape].n_vocab if a.real_vocab else a.vocab
    out = write(a.shape, a.mix or SHAPES[a.shape].default_mix, a.out, vocab, a.seed, a.layers)
    print(f"{out}: {out.stat().st_size / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
