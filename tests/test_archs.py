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
from cache_check import assert_cached_decode_equals_recompute
from reference_llama import ReferenceModel
from tiny_models import N_VOCAB, write_tiny_model

REL_RMS_TOL = 0.04  # measured 0.6-1.7%; a missing window or the wrong RoPE layout gives 12-16%
CACHE_ATOL = 2e-3
ARCHS = ["llama", "qwen2", "gemma3", "qwen3", "qwen3moe", "qwen2moe", "phi3", "gpt-oss"]


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
    r = ReferenceModel(tiny)
    r.long_factors = True    # phi3: n_ctx 64 is past the tiny model's original context of 32
    ref = r.logits(toks)
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
    toks = np.random.default_rng(2).integers(0, N_VOCAB, 6).tolist()
    with pydecode.Model(tiny, n_ctx=64, n_threads=2, n_batch=4) as m, \
            pydecode.Model(tiny, n_ctx=64, n_threads=1, n_batch=4) as fresh:   # 12: well past the window of 4
        assert_cached_decode_equals_recompute(m, fresh, toks, 12, CACHE_ATOL)  # and the ring of 8


def test_arch_config_from_metadata(tiny):
    m = pydecode.Model(tiny, n_ctx=32, n_threads=1)
    c = m.config
    assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim) == (7, 64, 4, 2, 32)
    if c.arch == "gemma3":
        assert c.sliding_window == 4 and c.swa_period == 6 and c.act_gelu and c.rope_neox
        assert c.embd_scale == pytest.approx(8.0) and c.rope_base_local == 10000.0
    assert c.rope_neox == (c.arch in ("qwen2", "gemma3", "qwen3", "qwen3moe", "qwen2moe", "phi3", "gpt-oss"))
    if c.arch == "gpt-oss":   # even layers local, sharing the global (YaRN) RoPE; experts as gpt-oss gates them
        assert c.sliding_window == 4 and [c.layer_is_local(l) for l in range(3)] == [True, False, True]
        assert c.rope_base_local == 0 and c.rope_yarn[0] == 1.0 and c.rope_freq_scale == 0.25
        assert (c.expert_gating, c.expert_norm, c.expert_act) == ("softmax_weight", False, "swiglu_oai")
    if c.arch == "phi3":   # its sliding_window key is ignored (as llama.cpp does); LongRoPE's data read
        assert c.sliding_window == 0 and c.rope_dim == 24 and c.n_ctx_orig == 32
        assert c.rope_attn_factor == pytest.approx(1.19)
    assert c.tied_output == (c.arch not in ("qwen2", "qwen3moe", "qwen2moe", "gpt-oss"))
    if c.arch == "qwen3moe":
        assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.expert_gating, c.expert_norm) == (8, 2, 32, "softmax", True)


def test_iq_tensor_fails_at_load_naming_tensor_and_type(tmp_path):
    from gguf import GGMLQuantizationType as QT

    path = tmp_path / "iq.gguf"   # (IQ4_NL, IQ4_XS, MXFP4 load: tests/test_iq_formats.py; IQ2_XXS does not)
    write_tiny_model(path, "llama", weight_types=(QT.Q8_0, QT.IQ2_XXS), n_embd=256, n_head=8, n_ff=256)
    with pytest.raises(pydecode.ModelError, match=r"blk\.0\.attn_k\.weight has unsupported type IQ2_XXS"):
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


def test_phi3_fused_tensors_and_longrope_follow_the_reference(tmp_path):
    """phi3: attn_qkv and the fused gate/up are zero-copy views of their rows; the LongRoPE factors
    are the short ones within the original context and the long ones past it (llama.cpp's choice,
    by the context size), with the attention factor on the rotated dims. Each choice matches the
    reference, and each matters (the other factors give other logits)."""
    path = tmp_path / "phi3.gguf"
    write_tiny_model(path, "phi3")
    toks = np.random.default_rng(5).integers(0, N_VOCAB, 12).tolist()
    refs = {}
    for long in (False, True):
        r = ReferenceModel(path)
        r.long_factors = long
        refs[long] = r.logits(toks)
    for n_ctx, long in ((32, False), (64, True)):
        m = pydecode.Model(path, n_ctx=n_ctx, n_threads=2)
        ours = m.prefill(toks, all_logits=True)
        assert _rel(ours, refs[long]) <= REL_RMS_TOL, (n_ctx, long)
        assert _rel(ours, refs[not long]) > 3 * REL_RMS_TOL, (n_ctx, long)
        assert m.repacked_bytes >= 0   # (the views repack like whole tensors where the table does)
        m.close()


def test_phi3_state_file_records_its_rope_factors(tmp_path):
    """A state saved with the long factors (n_ctx past the original context) is refused by a model
    that runs the short ones: its K rows were rotated otherwise."""
    from pydecode.kvstate import StateFileError

    path = tmp_path / "phi3.gguf"
    write_tiny_model(path, "phi3")
    llm = pydecode.load(path, n_ctx=64, n_threads=1)
    llm.generate([1, 2, 3, 4], 4)
    llm.save_state(tmp_path / "s.state")
    llm.close()
    short = pydecode.load(path, n_ctx=32, n_threads=1)
    with pytest.raises(StateFileError, match="rope_factors"):
        short.load_state(tmp_path / "s.state")
    short.close()


def test_longrope_and_llama3_scaling_types_need_their_tensors(tmp_path):
    """rope.scaling.type 'llama3' / 'longrope' live in tensors: a file that names one without them
    is refused by name, not run with the wrong frequencies."""
    import gguf

    from pydecode.gguf_file import GGUFFile
    from pydecode.config import arch_config

    path = tmp_path / "l.gguf"
    write_tiny_model(path, "llama")
    r = gguf.GGUFReader(path)
    out = tmp_path / "typed.gguf"
    w = gguf.GGUFWriter(str(out), "llama")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    w.add_key_value("llama.rope.scaling.type", "llama3", gguf.GGUFValueType.STRING)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(pydecode.ModelError, match="llama3.*rope_freqs.weight"):
        arch_config(GGUFFile(out))


def test_sinks_output_bias_and_yarn_follow_the_reference(tmp_path):
    """gpt-oss's attention pieces, as data on any architecture: attention sinks (a logit per head in
    every softmax: csrc/core/attention.c combine), an attn_output bias and YaRN RoPE. Each matches
    the reference and each matters (the reference without it differs); cached decode equals
    recompute with them; every x86 table agrees."""
    from pydecode._core import lib

    path = tmp_path / "oss-attn.gguf"
    write_tiny_model(path, "llama", n_layer=3, sinks=True, out_bias=True, yarn=4.0)
    toks = np.random.default_rng(6).integers(0, N_VOCAB, 20).tolist()
    ref = ReferenceModel(path).logits(toks)
    for isa in ("scalar", "avx2", "avx512"):
        if not lib.pd_isa_supported(isa.encode()):
            continue
        ours = pydecode.Model(path, n_ctx=64, n_threads=2, isa=isa).prefill(toks, all_logits=True)
        assert _rel(ours, ref) <= REL_RMS_TOL, isa
    for drop in ("sinks", "bias", "yarn"):
        r = ReferenceModel(path)
        if drop == "yarn":
            r.yarn = False
        else:
            for l in range(3):
                r.tensors.pop(f"blk.{l}." + ("attn_sinks.weight" if drop == "sinks" else "attn_output.bias"))
        assert _rel(r.logits(toks), ref) > 2 * REL_RMS_TOL, drop
    with pydecode.Model(path, n_ctx=64, n_threads=2, n_batch=4) as m, \
            pydecode.Model(path, n_ctx=64, n_threads=1, n_batch=4) as fresh:
        assert_cached_decode_equals_recompute(m, fresh, toks[:6], 6, CACHE_ATOL)


def test_gpt_oss_clamped_swiglu_and_expert_biases(tmp_path):
    """gpt-oss's experts: router and expert biases and the clamped SwiGLU (limit 7, alpha 1.702),
    with biases large enough that the clamps bite. Against the reference that quantizes each
    matmul input as the C core does (large biases make the float model's 8-bit error grow to
    ~10%), on every x86 table; without the clamps the reference differs; batched and prompt-lookup
    decoding give plain decoding's tokens; a state file round-trips."""
    from pydecode._core import lib

    path = tmp_path / "oss.gguf"
    write_tiny_model(path, "gpt-oss", n_layer=4, expert_bias=2.0)
    toks = np.random.default_rng(1).integers(0, N_VOCAB, 12).tolist()
    ref = ReferenceModel(path, act_quant=True).logits(toks)
    for isa in ("scalar", "avx2", "avxvnni", "avx512"):
        if lib.pd_isa_supported(isa.encode()):
            m = pydecode.Model(path, n_ctx=64, n_threads=2, isa=isa)
            assert _rel(m.prefill(toks, all_logits=True), ref) <= REL_RMS_TOL, isa
            m.close()
    r = ReferenceModel(path, act_quant=True)
    r.swiglu_oai = False   # plain SwiGLU: no clamps, no alpha, no +1
    assert _rel(r.logits(toks), ref) > 3 * REL_RMS_TOL
    llm = pydecode.load(path, n_ctx=64, n_threads=2)
    prompts = [[5, 6, 7, 8, 9], [20, 21, 22], [40, 41, 42, 43, 40, 41, 42]]
    plain = [llm.generate(p, 10).tokens for p in prompts]
    assert [o.tokens for o in llm.generate_batch(prompts, 10)] == plain
    llm.save_state(tmp_path / "s.state")
    assert llm.load_state(tmp_path / "s.state")
    llm.close()
    lookup = pydecode.load(path, n_ctx=64, n_threads=2, draft="lookup")
    assert [lookup.generate(p, 10).tokens for p in prompts] == plain
    lookup.close()
