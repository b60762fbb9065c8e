"""Synthetic GGUFs of real laptop-size shapes, for decode benchmarks of models we cannot download.

    python bench/synthetic.py llama-3.2-3b -o /tmp/llama-3.2-3b-q4_k_m.gguf
    python bench/synthetic.py llama-3.1-8b --mix q4_0 -o /tmp/llama-3.1-8b-q4_0.gguf
    python bench/synthetic.py qwen2.5-7b -o /tmp/qwen2.5-7b-q4_k_m.gguf
    python bench/synthetic.py tiny -o /tmp/tiny.gguf          # 2 layers: what the tests load

The tensors have the shapes of the real model and the types of llama.cpp's quantization mix
(q4_k_m: Q4_K, with Q6_K for the output head and for attn_v / ffn_down of the layers llama.cpp
gives more bits: the first and last eighth and every third in between; q4_0, q8_0: every matrix
in that type, the head Q6_K as llama.cpp does). Their blocks are random bytes whose f16 scales
are set to small sane values, so every kernel streams real bytes in the real layout and the
logits stay finite; the text is noise. The tokenizer (and its vocabulary size) is copied from a
registry model: SmolLM2's (49152 tokens) for the llama shapes, Qwen2.5's for qwen2.5-7b, so
the embedding and head are smaller than the real ones (128256 / 152064 rows) unless
--vocab pads the token list with unused tokens. llama.cpp loads the same files.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT, GGUFReader, GGUFValueType, GGUFWriter

SHAPES = {
    # name: arch, layers, embd, ff, heads, kv heads, head dim, rope base, tied head, tokenizer source
    "llama-3.2-3b": ("llama", 28, 3072, 8192, 24, 8, 128, 500000.0, True, "smollm2-135m"),
    "llama-3.1-8b": ("llama", 32, 4096, 14336, 32, 8, 128, 500000.0, False, "smollm2-135m"),
    "qwen2.5-7b": ("qwen2", 28, 3584, 18944, 28, 4, 128, 1000000.0, False, "qwen2.5-coder-0.5b"),
    "tiny": ("llama", 2, 256, 512, 4, 2, 64, 10000.0, True, "smollm2-135m"),
}
MIXES = ("q4_k_m", "q4_0", "q8_0")
# byte offset of each block's f16 scale d (and of dmin, for the formats that have one)
D_OFFSET = {QT.Q4_0: 0, QT.Q8_0: 0, QT.Q4_K: 0, QT.Q6_K: 208}
DMIN_OFFSET = {QT.Q4_K: 2}


def more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits: the layers a Q4_K_M file keeps attn_v / ffn_down in Q6_K."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def tensor_type(name: str, layer: int, n_layer: int, mix: str) -> QT:
    if name == "output.weight":
        return QT.Q8_0 if mix == "q8_0" else QT.Q6_K
    if mix == "q4_0":
        return QT.Q4_0
    if mix == "q8_0":
        return QT.Q8_0
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and more_bits(layer, n_layer):
        return QT.Q6_K
    return QT.Q4_K


def random_blocks(qtype: QT, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """rows x cols values of qtype as raw bytes: random quants, f16 scales of about 1/(8 sqrt(cols))."""
    block, nbytes = GGML_QUANT_SIZES[qtype]
    w = rng.integers(0, 256, (rows, cols // block, nbytes), dtype=np.uint8)
    scale = np.float16(1.0 / (8.0 * np.sqrt(cols)) / (16 if qtype in (QT.Q4_K, QT.Q6_K) else 4))
    d = np.frombuffer(np.array([scale], np.float16).tobytes(), np.uint8)
    w[:, :, D_OFFSET[qtype]:D_OFFSET[qtype] + 2] = d
    if qtype in DMIN_OFFSET:
        w[:, :, DMIN_OFFSET[qtype]:DMIN_OFFSET[qtype] + 2] = d
    return w.reshape(rows, -1)


def copy_tokenizer(writer: GGUFWriter, src: Path, vocab: int | None) -> int:
    """The tokenizer.* keys of src; returns the vocabulary size (padded to vocab if given)."""
    r = GGUFReader(src)
    n = 0
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        val = f.contents()
        if key == "tokenizer.ggml.tokens":
            n = len(val)
            if vocab and vocab > n:
                val = list(val) + [f"<unused_{i}>" for i in range(n, vocab)]
                n = vocab
        elif key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores") and vocab and vocab > len(val):
            val = list(val) + ([4] if key.endswith("type") else [0.0]) * (vocab - len(val))   # 4: unused
        sub = f.types[1] if f.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, val, f.types[0], sub_type=sub)
    return n


def write(shape: str, mix: str, out: Path, vocab: int | None = None, seed: int = 0) -> Path:
    from pydecode.registry import model_path

    arch, n_layer, d, ff, nh, nkv, hd, base, tied, tok = SHAPES[shape]
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(out), arch)
    w.add_name(f"synthetic {shape} {mix}")
    n_vocab = copy_tokenizer(w, model_path(tok), vocab)
    w.add_context_length(8192)
    w.add_embedding_length(d)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(base)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type({"q4_k_m": 15, "q4_0": 2, "q8_0": 7}[mix])
    w.add_quantization_version(2)

    def mat(name, rows, cols, layer=0):
        t = tensor_type(name, layer, n_layer, mix)
        w.add_tensor(name, random_blocks(t, rows, cols, rng), raw_dtype=t)

    ones = lambda n: np.ones(n, np.float32)  # noqa: E731
    mat("token_embd.weight", n_vocab, d)
    w.add_tensor("output_norm.weight", ones(d))
    if not tied:
        mat("output.weight", n_vocab, d)
    for l in range(n_layer):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", ones(d))
        mat(p + "attn_q.weight", nh * hd, d, l)
        mat(p + "attn_k.weight", nkv * hd, d, l)
        mat(p + "attn_v.weight", nkv * hd, d, l)
        if arch == "qwen2":
            for n, rows in (("attn_q", nh * hd), ("attn_k", nkv * hd), ("attn_v", nkv * hd)):
                w.add_tensor(p + n + ".bias", (rng.standard_normal(rows) * 0.02).astype(np.float32))
        mat(p + "attn_output.weight", d, nh * hd, l)
        w.add_tensor(p + "ffn_norm.weight", ones(d))
        mat(p + "ffn_gate.weight", ff, d, l)
        mat(p + "ffn_up.weight", ff, d, l)
        mat(p + "ffn_down.weight", d, ff, l)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--mix", choices=MIXES, default="q4_k_m")
    ap.add_argument("--vocab", type=int, help="pad the vocabulary to this many tokens (e.g. 128256)")
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args()
    out = write(a.shape, a.mix, a.out, a.vocab)
    print(f"{out}: {out.stat().st_size / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
