"""bench/synthetic.py: the synthetic GGUFs the benchmarks and the llama.cpp checks run on have the
real models' shapes, metadata and llama.cpp's quantization mixes, parse, and (for the architectures
pydecode runs) load and decode. The real shapes are checked on the plan (no bytes made); files are
written at --layers 1-2 or with shrunk widths so this stays fast."""
import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT, GGUFReader, quants

import pydecode
from pydecode.gguf_file import GGUFFile

SPEC = importlib.util.spec_from_file_location("synthetic", Path(__file__).resolve().parents[1] / "bench" / "synthetic.py")
synthetic = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(synthetic)
S = synthetic.SHAPES
NEW = ["qwen3-0.6b", "qwen3-4b", "qwen3-30b-a3b", "gpt-oss-20b", "llama-3.2-1b", "phi-4-mini"]
OLD_MIXES = ("q4_k_m", "q4_0", "q8_0")   # the formats pydecode decodes today


@pytest.mark.parametrize("mix", OLD_MIXES)
def test_synthetic_file_loads_and_decodes(tmp_path, smollm_path, mix):
    out = synthetic.write("tiny", mix, tmp_path / f"tiny-{mix}.gguf")
    types = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
    want = {"q4_k_m": "Q4_K", "q4_0": "Q4_0", "q8_0": "Q8_0"}[mix]
    assert types["blk.0.attn_q.weight"] == want and types["blk.0.ffn_norm.weight"] == "F32"
    # tied head: the token embedding takes the output's type, as llama.cpp's quantizer does
    assert types["token_embd.weight"] == ("Q8_0" if mix == "q8_0" else "Q6_K")
    if mix == "q4_k_m":   # llama.cpp's use_more_bits: the last eighth of the layers keeps Q6_K
        assert types["blk.1.attn_v.weight"] == "Q6_K" and types["blk.0.attn_v.weight"] == "Q4_K"
    with pydecode.Model(out, n_ctx=64, n_threads=2) as m:
        assert m.config.n_layer == 2 and m.config.n_embd == 256
        logits = m.prefill([1, 2, 3, 4])
        for i in range(4):
            assert np.isfinite(logits).all()
            logits = m.decode_step(int(np.argmax(logits)), 4 + i)


def test_synthetic_vocab_padding(tmp_path):
    """--vocab pads the token list (the embedding grows with it)."""
    out = synthetic.write("tiny", "q8_0", tmp_path / "tiny-pad.gguf", vocab=50000)
    r = GGUFReader(out)
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    assert int(emb.shape[1]) == 50000
    with pydecode.Model(out, n_ctx=32) as m:
        assert m.config.n_vocab == 50000
        assert np.isfinite(m.prefill([1, 2])).all()


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_0, QT.Q5_1, QT.Q5_K, QT.Q6_K, QT.Q8_0, QT.IQ4_NL, QT.IQ4_XS,
                                   QT.MXFP4])
def test_random_blocks_have_the_asked_size(qtype):
    """Each format's scale bytes are where random_blocks writes them: the entries' RMS is the one
    asked for (MXFP4's power-of-two scales: within a factor sqrt 2), their mean near zero."""
    w = synthetic.random_blocks(qtype, (64, 1024), np.random.default_rng(3), rms=0.01)
    x = quants.dequantize(w, qtype).astype(np.float64)
    assert x.shape == (64, 1024) and np.isfinite(x).all()
    rms = np.sqrt(np.mean(x ** 2))
    assert 0.01 / 1.5 < rms < 0.01 * 1.5, rms
    assert abs(x.mean()) < 0.2 * rms


def _types(shape, mix, layers=None):
    return {n: (dims, t.name) for n, (dims, t) in synthetic.plan_types(shape, mix, S[shape].n_vocab, layers).items()}


def test_qwen3_dense_real_shapes():
    p = _types("qwen3-0.6b", "q4_k_m")
    assert "output.weight" not in p and p["token_embd.weight"] == ((151936, 1024), "Q6_K")
    assert p["blk.0.attn_q.weight"] == ((2048, 1024), "Q4_K")        # 16 heads x 128, not n_embd
    assert p["blk.0.attn_k.weight"] == ((1024, 1024), "Q4_K")
    assert p["blk.27.attn_output.weight"] == ((1024, 2048), "Q4_K")
    assert p["blk.0.attn_q_norm.weight"] == ((128,), "F32") and p["blk.0.attn_k_norm.weight"] == ((128,), "F32")
    assert p["blk.0.attn_v.weight"][1] == "Q6_K" and p["blk.4.attn_v.weight"][1] == "Q4_K"
    assert len([n for n in p if n.startswith("blk.")]) == 28 * 11
    p = _types("qwen3-4b", "iq4_xs")
    assert p["blk.0.attn_v.weight"] == ((1024, 2560), "Q5_K")        # GQA 4: IQ4 mixes give attn_v Q5_K
    assert p["blk.0.ffn_down.weight"] == ((2560, 9728), "Q5_K")      # first eighth of ffn_down
    assert p["blk.10.ffn_down.weight"] == ((2560, 9728), "IQ4_XS")
    assert p["token_embd.weight"] == ((151936, 2560), "Q6_K")
    assert _types("qwen3-4b", "iq4_nl")["blk.10.ffn_gate.weight"] == ((9728, 2560), "IQ4_NL")


def test_qwen3_moe_real_shapes():
    p = _types("qwen3-30b-a3b", "q4_k_m")
    assert p["output.weight"] == ((151936, 2048), "Q6_K") and p["token_embd.weight"][1] == "Q4_K"
    assert p["blk.0.ffn_gate_inp.weight"] == ((128, 2048), "F32")
    assert p["blk.6.ffn_gate_exps.weight"] == ((128, 768, 2048), "Q4_K")
    assert p["blk.6.ffn_up_exps.weight"] == ((128, 768, 2048), "Q4_K")
    assert p["blk.0.ffn_down_exps.weight"] == ((128, 2048, 768), "Q6_K")
    assert p["blk.6.ffn_down_exps.weight"] == ((128, 2048, 768), "Q4_K")
    assert p["blk.47.attn_q.weight"] == ((4096, 2048), "Q4_K") and p["blk.47.attn_k.weight"] == ((512, 2048), "Q4_K")
    assert not any("ffn_gate.weight" in n or "shexp" in n for n in p)
    p = _types("qwen3-30b-a3b", "mxfp4")   # llama.cpp's MXFP4_MOE: experts MXFP4, the rest Q8_0
    assert p["blk.3.ffn_down_exps.weight"][1] == "MXFP4" and p["blk.3.attn_q.weight"][1] == "Q8_0"
    assert p["output.weight"][1] == "Q8_0" and p["blk.3.ffn_gate_inp.weight"][1] == "F32"
    assert _types("qwen3-30b-a3b", "iq4_xs", layers=4)["blk.3.ffn_up_exps.weight"][1] == "IQ4_XS"
    kv = synthetic.metadata(S["qwen3-30b-a3b"], 48, 151936)
    assert (kv["expert_count"], kv["expert_used_count"], kv["expert_feed_forward_length"]) == (128, 8, 768)
    assert kv["attention.key_length"] == 128 and kv["attention.head_count_kv"] == 4


QUANT_MIXES = [m for m in synthetic.MIXES if m not in ("f16", "f32")]


@pytest.mark.parametrize("mix", QUANT_MIXES)
def test_gpt_oss_real_shapes(mix):
    p = _types("gpt-oss-20b", mix)
    for n, dims in (("ffn_gate_exps", (32, 2880, 2880)), ("ffn_up_exps", (32, 2880, 2880)),
                    ("ffn_down_exps", (32, 2880, 2880))):
        assert p[f"blk.5.{n}.weight"] == (dims, "MXFP4")               # every mix: the real file's experts
        assert p[f"blk.5.{n}.bias"] == (dims[:2], "F32")
    assert p["blk.0.attn_sinks.weight"] == ((64,), "F32")
    assert p["blk.0.attn_q.weight"][0] == (4096, 2880) and p["blk.0.attn_q.bias"] == ((4096,), "F32")
    assert p["blk.0.attn_k.weight"][0] == (512, 2880) and p["blk.0.attn_output.bias"] == ((2880,), "F32")
    assert p["blk.0.ffn_gate_inp.weight"] == ((32, 2880), "F32") and p["blk.0.ffn_gate_inp.bias"] == ((32,), "F32")
    assert "blk.0.post_attention_norm.weight" in p and "blk.0.ffn_norm.weight" not in p
    # 2880 is no multiple of 256: k-quants fall back to 32-blocks, as llama.cpp's quantizer does
    want_q = {"q4_k_m": "Q5_0", "q4_0": "Q4_0", "q8_0": "Q8_0", "iq4_xs": "IQ4_NL", "iq4_nl": "IQ4_NL", "mxfp4": "Q8_0"}
    assert p["blk.0.attn_q.weight"][1] == want_q[mix]
    assert p["output.weight"] == ((201088, 2880), "Q8_0")   # Q6_K does not fit 2880 either
    kv = synthetic.metadata(S["gpt-oss-20b"], 24, 201088)
    assert kv["attention.sliding_window"] == 128 and kv["rope.scaling.type"] == "yarn"
    assert kv["rope.scaling.factor"] == 32.0 and kv["rope.scaling.original_context_length"] == 4096
    assert (kv["expert_count"], kv["expert_used_count"], kv["attention.key_length"]) == (32, 4, 64)


def test_llama3_rope_scaling():
    p = _types("llama-3.2-1b", "q4_k_m")
    assert p["rope_freqs.weight"] == ((32,), "F32") and "output.weight" not in p
    assert p["blk.15.attn_q.weight"] == ((2048, 2048), "Q4_K") and p["blk.0.attn_k.weight"][0] == (512, 2048)
    f = synthetic.llama3_rope_factors(S["llama-3.2-1b"])
    # what llama.cpp's converter computes for factor 32, low/high 1 / 4, original context 8192
    assert len(f) == 32 and f[0] == 1.0 and f[-1] == 32.0
    assert all(a <= b for a, b in zip(f, f[1:])) and any(1.0 < x < 32.0 for x in f)


def test_phi3_fused_shapes():
    p = _types("phi-4-mini", "q4_k_m")
    assert p["blk.0.attn_qkv.weight"] == ((3072 + 2 * 1024, 3072), "Q6_K")  # attn_qkv is attn_v to the quantizer
    assert p["blk.4.attn_qkv.weight"][1] == "Q4_K"
    assert p["blk.0.ffn_up.weight"] == ((2 * 8192, 3072), "Q4_K") and p["blk.0.ffn_down.weight"][0] == (3072, 8192)
    assert not any(n.endswith(("attn_q.weight", "ffn_gate.weight")) for n in p)
    assert p["rope_factors_long.weight"] == ((48,), "F32") and p["rope_factors_short.weight"] == ((48,), "F32")
    from synthetic_shapes import longrope_factors
    assert longrope_factors(48, long=False) == [1.0] * 48 and longrope_factors(48, long=True)[-1] == 47.77
    kv = synthetic.metadata(S["phi-4-mini"], 32, 200064)
    assert kv["rope.dimension_count"] == 96 and abs(kv["rope.scaling.attn_factor"] - 1.1902) < 1e-4


def _small(name):
    """The real shape's architecture and tensor set at widths a test writes in a second (gpt-oss keeps
    a row length that is no multiple of 256, so the fallbacks are written too)."""
    s = S[name]
    kw = dict(n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64)
    if s.moe:
        kw.update(n_expert=4, n_expert_used=2, n_ff_exp=128)
    if s.arch == "gpt-oss":
        kw.update(n_embd=96, n_ff=96, n_ff_exp=96)
    if s.arch == "phi3":
        kw.update(kv={**s.kv, "rope.dimension_count": 48})
    return dataclasses.replace(s, **kw)


@pytest.mark.parametrize("name,mix", [(n, S[n].default_mix) for n in NEW] + [
    ("qwen3-30b-a3b", "iq4_xs"), ("qwen3-30b-a3b", "mxfp4"), ("gpt-oss-20b", "q4_k_m"), ("qwen3-0.6b", "iq4_nl")])
def test_new_shapes_write_and_parse(tmp_path, name, mix):
    shape = _small(name)
    out = synthetic.write(shape, mix, tmp_path / f"{name}.gguf", layers=2)
    f = GGUFFile(out)
    try:
        n_vocab = len(f.metadata["tokenizer.ggml.tokens"])
        want = synthetic.plan_types(shape, mix, n_vocab, 2)
        assert set(f.tensors) == set(want)
        for n, (dims, t) in want.items():
            assert f.tensors[n].shape == tuple(reversed(dims)) and f.tensors[n].type == t, n
        arch = f.metadata["general.architecture"]
        assert arch == shape.arch and f.metadata[f"{arch}.block_count"] == 2
        assert f.metadata["general.file_type"] == synthetic.FILE_TYPE[mix]
        assert f.metadata["tokenizer.ggml.model"] == "gpt2"
        if name.startswith("qwen3"):
            assert f.metadata["tokenizer.ggml.pre"] == "qwen2" and n_vocab == 151936
        if name == "llama-3.2-1b":
            assert f.metadata["tokenizer.ggml.pre"] == "llama-bpe" and n_vocab == 128256
        if name in ("gpt-oss-20b", "phi-4-mini"):   # o200k with the harmony specials
            assert f.metadata["tokenizer.ggml.pre"] == "gpt-4o" and n_vocab == 200019
        for n in ("rope_freqs.weight", "rope_factors_long.weight", "blk.1.attn_sinks.weight"):
            if n in f.tensors:
                assert np.isfinite(f.tensor_array(n)).all()
    finally:
        f.close()


def test_real_shape_cut_writes(tmp_path):
    """--layers 1 of the real Qwen3-0.6B: the real widths on disk, the real tokenizer."""
    out = synthetic.write("qwen3-0.6b", "q4_k_m", tmp_path / "q.gguf", layers=1)
    f = GGUFFile(out)
    try:
        assert f.metadata["qwen3.block_count"] == 1 and f.metadata["qwen3.attention.key_length"] == 128
        assert f.tensors["blk.0.attn_q.weight"].shape == (1024, 2048)
        assert f.tensors["token_embd.weight"].type == QT.Q6_K and "blk.1.attn_q.weight" not in f.tensors
    finally:
        f.close()


@pytest.mark.parametrize("mix,want", [("f16", "F16"), ("f32", "F32")])
def test_float_mixes_leave_nothing_quantized(mix, want):
    """The float mixes (bench/logprob_vs_llamacpp.py's rounding-free check of an architecture):
    every matrix, gpt-oss's experts too, in the mix's float type; norms and biases stay f32."""
    for shape in ("gpt-oss-20b", "qwen3-30b-a3b", "phi-4-mini"):
        for name, (dims, t) in _types(shape, mix, layers=2).items():
            assert t == (want if name.endswith(".weight") and len(dims) > 1 and "gate_inp" not in name else "F32"), (shape, name)


def test_a_float_mix_file_loads_and_decodes(tmp_path, smollm_path):
    out = synthetic.write("tiny", "f16", tmp_path / "tiny-f16.gguf")
    assert {t.tensor_type.name for t in GGUFReader(out).tensors if len(t.shape) > 1} == {"F16"}
    with pydecode.Model(out, n_ctx=64, n_threads=2) as m:
        logits = m.prefill([1, 2, 3, 4])
        for i in range(4):
            assert np.isfinite(logits).all() and np.std(logits) > 0.1
            logits = m.decode_step(int(np.argmax(logits)), 4 + i)
