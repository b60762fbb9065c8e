"""Every architecture through one forward pass: tiny random-weight GGUFs against the numpy reference.

The gemma3 model has a sliding window of 4 and 7 layers (layers 5 global, the rest local with
their own RoPE base), and the prompt is 12 tokens, so the window and the local/global split are
really exercised; the cache ring of local layers wraps during the decode test (n_batch 4).
Tolerances: as in test_forward.py (8-bit activations), on logits of magnitude ~5.
- REL_RMS_TOL: rms(ours - ref) / rms(ref) against the float reference.
- CACHE_ATOL: cached decode vs fresh prefill of the whole prefix (same kernels, summation order only).
"""
import numpy as np
import pytest

import pydecode
from reference_llama import ReferenceModel
from tiny_models import N_VOCAB, write_tiny_model

REL_RMS_TOL = 0.04  # measured 0.6-1.7%; a missing window or the wrong RoPE layout gives 12-16%
CACHE_ATOL = 2e-3
ARCHS = ["llama", "qwen2", "gemma3", "qwen3", "qwen3moe", "qwen2moe"]


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / f"tiny-{request.param}.gguf"
    write_tiny_model(path, request.param)
    return path


def _rel(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avxvnni", "avx512"])
def test_tiny_logits_match_reference(tiny, isa):
    from pydecode._core import lib

    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} not supported")
    toks = np.random.default_rng(1).integers(0, N_VOCAB, 12).tolist()
    ref = ReferenceModel(tiny).logits(toks)
    m = pydecode.Model(tiny, n_ctx=64, n_threads=2, isa=isa)
    ours = m.prefill(toks, all_logits=True)
    assert _rel(ours, ref) <= REL_RMS_TOL
    assert np.mean(np.argmax(ours, 1) == np.argmax(ref, 1)) >= 0.75


def test_sliding_window_matters(tmp_path):
    """Guard against a test that passes by accident: without the window the logits differ."""
    path = tmp_path / "g.gguf"
    write_tiny_model(path, "gemma3")
    toks = list(range(10, 22))
    with_window = ReferenceModel(path)
    no_window = ReferenceModel(path)
    no_window.window = 0
    assert np.abs(with_window.logits(toks)[-1] - no_window.logits(toks)[-1]).max() > 0.1


def test_tiny_cached_decode_equals_recompute(tiny):
    m = pydecode.Model(tiny, n_ctx=64, n_threads=2, n_batch=4)
    toks = np.random.default_rng(2).integers(0, N_VOCAB, 6).tolist()
    logits = m.prefill(toks).copy()
    seq = list(toks)
    for _ in range(12):                       # well past the window of 4 and the ring of 8
        t = int(np.argmax(logits))
        logits = m.decode_step(t, len(seq)).copy()
        seq.append(t)
        fresh = pydecode.Model(tiny, n_ctx=64, n_threads=1, n_batch=4).prefill(seq).copy()
        assert np.abs(fresh - logits).max() <= CACHE_ATOL, len(seq)


def test_arch_config_from_metadata(tiny):
    m = pydecode.Model(tiny, n_ctx=32, n_threads=1)
    c = m.config
    assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim) == (7, 64, 4, 2, 32)
    if c.arch == "gemma3":
        assert c.sliding_window == 4 and c.swa_period == 6 and c.act_gelu and c.rope_neox
        assert c.embd_scale == pytest.approx(8.0) and c.rope_base_local == 10000.0
    assert c.rope_neox == (c.arch in ("qwen2", "gemma3", "qwen3", "qwen3moe", "qwen2moe"))
    assert c.tied_output == (c.arch not in ("qwen2", "qwen3moe", "qwen2moe"))
    if c.arch == "qwen3moe":
        assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.expert_gating, c.expert_norm) == (8, 2, 32, "softmax", True)


def test_iq_tensor_fails_at_load_naming_tensor_and_type(tmp_path):
    from gguf import GGMLQuantizationType as QT

    path = tmp_path / "iq.gguf"
    write_tiny_model(path, "llama", weight_types=(QT.Q8_0, QT.IQ4_NL))
    with pytest.raises(pydecode.ModelError, match=r"blk\.0\.attn_k\.weight has unsupported type IQ4_NL"):
        pydecode.Model(path, n_ctx=32, n_threads=1)


def test_llama3_rope_freqs(tmp_path):
    """rope_freqs.weight divides the RoPE frequencies: our logits follow the reference with it."""
    path = tmp_path / "l3.gguf"
    write_tiny_model(path, "llama", rope_freqs=True)
    toks = np.random.default_rng(4).integers(0, N_VOCAB, 12).tolist()
    ref = ReferenceModel(path).logits(toks)
    ours = pydecode.Model(path, n_ctx=64, n_threads=2).prefill(toks, all_logits=True)
    assert _rel(ours, ref) <= REL_RMS_TOL
    plain = ReferenceModel(path)
    plain.tensors.pop("rope_freqs.weight")
    assert _rel(plain.logits(toks), ref) > 3 * REL_RMS_TOL   # the factors matter at this size
