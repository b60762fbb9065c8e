"""Mixture of experts (csrc/core/moe.c) on tiny qwen3moe files: the gating functions against the
numpy reference, the same bits however a step groups its tokens (decode, batch, prefill, thread
counts), batched and speculative decoding equal to plain decoding, a state file's round trip,
active bytes, and hostile expert counts refused with errors that name the key.

With F16 weights and an F32 KV cache the C core's only rounding is float32 arithmetic (the activations of an F16
matmul stay float), so the reference must agree to ~1e-6 relative: a wrong norm, gating or
routing shows as 10-100%. The quantized tiny model of test_archs.py checks the quantized paths.
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import pydecode
from pydecode import kvstate, speculative
from pydecode.errors import ModelError
from reference_llama import ReferenceModel
from tiny_models import N_VOCAB, write_tiny_model

EXACT_REL = 1e-5
MIXED = (QT.Q8_0, QT.Q5_0, QT.F16, QT.Q4_1)   # every expert tensor in another format (and layout)
ISAS = ["scalar", "avx2", "avxvnni", "avx512"]


def _rel(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def _isa(isa):
    from pydecode._core import lib
    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} not supported")


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("moe") / "tiny-qwen3moe.gguf"
    write_tiny_model(p, "qwen3moe", n_layer=3, n_expert_used=3, weight_types=MIXED)
    return p


GATINGS = {
    "softmax-norm": None,                                        # qwen3moe's own (no keys)
    "sigmoid": {"expert_gating_func": 2, "expert_weights_norm": False},
    "sigmoid-norm-scale": {"expert_gating_func": 2, "expert_weights_norm": True, "expert_weights_scale": 2.5},
    "softmax-chosen": {"expert_gating_func": 3},                 # gpt-oss's: softmax over the k chosen
}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("gating", GATINGS)
def test_gating_matches_reference(tmp_path, gating, isa):
    _isa(isa)
    path = tmp_path / "g.gguf"
    write_tiny_model(path, "qwen3moe", n_layer=3, n_expert_used=3, weight_types=(QT.F16,), moe_keys=GATINGS[gating],
                     router_scale=0.25)
    toks = np.random.default_rng(1).integers(0, N_VOCAB, 12).tolist()
    ref = ReferenceModel(path)
    want = ref.logits(toks)
    ours = pydecode.Model(path, n_ctx=64, n_threads=2, isa=isa, kv_type="f32").prefill(toks, all_logits=True)
    assert _rel(ours, want) <= EXACT_REL
    if gating == "softmax-norm":   # the test can tell: without the renormalization it is far off
        ref.expert_norm = False
        assert _rel(ours, ref.logits(toks)) > 0.05


@pytest.mark.parametrize("isa", ISAS)
def test_shared_expert_matches_reference(tmp_path, isa):
    """qwen2moe: softmax top-k not renormalized, plus the shared expert scaled per token by
    sigmoid(ffn_gate_inp_shexp . x); without that gate the logits are far off."""
    _isa(isa)
    path = tmp_path / "q2.gguf"
    write_tiny_model(path, "qwen2moe", n_layer=3, weight_types=(QT.F16,), router_scale=0.25)
    toks = np.random.default_rng(1).integers(0, N_VOCAB, 12).tolist()
    ref = ReferenceModel(path)
    m = pydecode.Model(path, n_ctx=64, n_threads=2, isa=isa, kv_type="f32")
    assert (m.config.n_ff_shexp, m.config.expert_norm) == (96, False)
    ours = m.prefill(toks, all_logits=True)
    assert _rel(ours, ref.logits(toks)) <= EXACT_REL
    ref.tensors.pop("blk.1.ffn_gate_inp_shexp.weight")
    assert _rel(ours, ref.logits(toks)) > 0.05


def test_tables_agree_on_the_quantized_path(moe_path):
    """Every ISA table against the scalar twin on mixed formats, repacked and not: the same
    routes (the logits' argmax) and logits within the activation rounding."""
    toks = np.random.default_rng(3).integers(0, N_VOCAB, 10).tolist()
    base = pydecode.Model(moe_path, n_ctx=64, n_threads=2, isa="scalar").prefill(toks, all_logits=True)
    for isa in ISAS[1:]:
        from pydecode._core import lib
        if not lib.pd_isa_supported(isa.encode()):
            continue
        for repack in (True, False):
            m = pydecode.Model(moe_path, n_ctx=64, n_threads=2, isa=isa, repack=repack)
            if repack and isa == "avx512":
                assert any("_exps" in name for name, _, _ in m.repacked)   # experts repacked per expert
            got = m.prefill(toks, all_logits=True)
            assert _rel(got, base) <= 0.02 and np.mean(np.argmax(got, 1) == np.argmax(base, 1)) >= 0.9, (isa, repack)


def test_same_bits_however_tokens_are_grouped(moe_path):
    """A token's logits do not depend on the other tokens of its step, on the thread count, or on
    prefill vs batch: each expert's rows are computed alike for any set of columns."""
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, N_VOCAB, n).tolist() for n in (5, 7, 4)]
    alone = []
    for threads in (1, 2):
        m = pydecode.Model(moe_path, n_ctx=64, n_threads=threads, n_seq=3)
        rows = [m.prefill(p, all_logits=True, seq=s).copy() for s, p in enumerate(prompts)]
        alone.append(rows)
        nxt = [int(np.argmax(r[-1])) for r in rows]
        step = m.batch_step(nxt, [len(p) for p in prompts], [0, 1, 2])   # three decodes in one step
        one = pydecode.Model(moe_path, n_ctx=64, n_threads=threads)
        for s, p in enumerate(prompts):
            one.prefill(p)
            assert np.array_equal(step[s], one.decode_step(nxt[s], len(p))), (threads, s)
    for a, b in zip(*alone):
        assert np.array_equal(a, b)                                     # 1 thread == 2 threads
    m = pydecode.Model(moe_path, n_ctx=64, n_threads=2, n_batch=3)   # prefill in chunks of 3
    assert np.array_equal(m.prefill(prompts[1], all_logits=True), alone[1][1])


def test_more_threads_than_rows_gives_the_same_bits(moe_path):
    """100 threads over the tiny model's 64-wide residual: most threads get no rows of a phase
    (the weighted sum's chunks once came out 0 rows wide there: a division by zero)."""
    toks = [1, 2, 3, 4, 5]
    one, many = (pydecode.Model(moe_path, n_ctx=64, n_threads=t) for t in (1, 100))
    assert np.array_equal(many.prefill(toks, all_logits=True), one.prefill(toks, all_logits=True))
    assert np.array_equal(many.decode_step(7, len(toks)), one.decode_step(7, len(toks)))


def test_batched_and_speculative_decoding_equal_plain(moe_path, tmp_path, monkeypatch):
    monkeypatch.setattr(speculative.Tuner, "choose", lambda self, k_max, base=1, key=None: k_max)
    prompts = ["abab abab abab ab", "hello there", "x"]
    with pydecode.load(moe_path, n_ctx=128, n_threads=2) as llm:
        plain = [llm.generate(p, 16).tokens for p in prompts]
    with pydecode.load(moe_path, n_ctx=128, n_threads=2, n_seq=3) as llm:
        assert [r.tokens for r in llm.generate_batch(prompts, 16)] == plain
    with pydecode.load(moe_path, n_ctx=128, n_threads=2, draft="lookup") as llm:
        assert [llm.generate(p, 16).tokens for p in prompts] == plain
    draft = tmp_path / "draft.gguf"   # a dense qwen3 of the same vocabulary drafts for the MoE
    write_tiny_model(draft, "qwen3", n_layer=2)
    with pydecode.load(moe_path, n_ctx=128, n_threads=2, draft=str(draft)) as llm:
        got = [llm.generate(p, 16) for p in prompts]
    assert [g.tokens for g in got] == plain
    assert sum(g.stats.draft_tokens for g in got) > 0


def test_closing_a_target_and_its_draft_waits_for_their_shared_workers(moe_path, tmp_path, monkeypatch):
    # A draft runs on its target's pool, so freeing either model does not join the threads, and a
    # worker may still be leaving the last step (in pd_phase_end on the model's phases) when its
    # caller has returned: the free waits for it. ASan (stage 2) saw that use after free in about
    # one run in four of the test above on 2 busy cores; many short rounds widen the window.
    monkeypatch.setattr(speculative.Tuner, "choose", lambda self, k_max, base=1, key=None: k_max)
    draft = tmp_path / "draft.gguf"
    write_tiny_model(draft, "qwen3", n_layer=2)
    for r in range(30):   # lengths vary, so the last step is now the draft's, now the target's
        with pydecode.load(moe_path, n_ctx=64, n_threads=2, draft=str(draft)) as llm:
            assert len(llm.generate("abab abab"[: 3 + r % 6], 2 + r % 5).tokens) == 2 + r % 5


def test_cached_decode_and_state_file_round_trip(moe_path, tmp_path):
    m = pydecode.Model(moe_path, n_ctx=64, n_threads=2, n_batch=4)
    toks = np.random.default_rng(7).integers(0, N_VOCAB, 6).tolist()
    logits = m.prefill(toks).copy()
    for _ in range(6):
        t = int(np.argmax(logits))
        logits = m.decode_step(t, len(toks)).copy()
        toks.append(t)
    fresh = pydecode.Model(moe_path, n_ctx=64, n_threads=1, n_batch=4).prefill(toks)
    assert np.abs(fresh - logits).max() <= 2e-3
    kvstate.save(m, tmp_path / "s.pdkv", 0, toks)
    other = pydecode.Model(moe_path, n_ctx=64, n_threads=2, n_batch=4)
    assert kvstate.load(other, tmp_path / "s.pdkv", 0) == toks
    nxt = int(np.argmax(logits))
    assert np.array_equal(other.decode_step(nxt, len(toks)), m.decode_step(nxt, len(toks)))


def test_active_bytes(moe_path):
    m = pydecode.Model(moe_path, n_ctx=32, n_threads=1)
    c, g = m.config, m.gguf
    exps = sum(t.n_bytes for t in g.tensors.values() if t.name.endswith("_exps.weight"))
    total = c.weight_bytes_per_token(g, active=False)
    assert m.weight_bytes() == total - exps + exps * 3 // 8   # 3 of 8 experts read per token


@pytest.mark.parametrize("keys, match", [
    ({"expert_count": 0}, r"expert_count is 0, outside 1\.\.1024"),
    ({"expert_count": 1 << 30}, r"expert_count is 1073741824"),
    ({"expert_used_count": 9}, r"expert_used_count is 9, outside 1\.\.8"),
    ({"expert_used_count": 0}, r"expert_used_count is 0"),
    ({"expert_feed_forward_length": 40}, r"expert_feed_forward_length must be a positive multiple of 32"),
    ({"expert_gating_func": 7}, r"expert_gating_func is 7"),
])
def test_hostile_expert_keys_are_refused(tmp_path, keys, match):
    path = tmp_path / "h.gguf"
    write_tiny_model(path, "qwen3moe", n_layer=2, moe_keys=keys)
    with pytest.raises(ModelError, match=match):
        pydecode.Model(path, n_ctx=32, n_threads=1)


def test_expert_tensors_of_the_wrong_shape_or_in_a_dense_file(tmp_path):
    path = tmp_path / "s.gguf"
    write_tiny_model(path, "qwen3moe", n_layer=2, n_ff_exp=64, moe_keys={"expert_feed_forward_length": 32})
    with pytest.raises(ModelError, match=r"blk\.0\.ffn_gate_exps\.weight has shape \[64, 64, 8\], expected \[64, 32, 8\]"):
        pydecode.Model(path, n_ctx=32, n_threads=1)
    shared = tmp_path / "sh.gguf"   # shared-expert tensors where the config has none
    write_tiny_model(shared, "qwen2moe", n_layer=2)
    m = pydecode.Model(shared, n_ctx=32, n_threads=1)
    from pydecode._core import ffi, lib
    err = ffi.new("char[512]")
    assert lib.pd_model_new(m._cfg_with(n_ff_shexp=0), m._tensors, len(m._tensors), ffi.NULL, err, 512) == ffi.NULL
    assert "blk.0.ffn_gate_inp_shexp.weight is present but the config has no shared expert" in ffi.string(err).decode()
    dense = tmp_path / "d.gguf"   # a dense qwen3 carrying a router: the C core names it
    write_tiny_model(dense, "qwen3", n_layer=2, moe=True)
    with pytest.raises(ModelError, match=r"blk\.0\.ffn_gate_inp\.weight is present but the config has no experts"):
        pydecode.Model(dense, n_ctx=32, n_threads=1)


def test_info_shows_total_and_active_bytes(moe_path):
    from click.testing import CliRunner
    from pydecode.cli.info import info
    r = CliRunner().invoke(info, [str(moe_path)])
    assert r.exit_code == 0, r.output
    assert "experts         8 per layer, 3 per token, ffn 32; gating softmax, renormalized" in r.output
    assert "(3 of 8 experts; " in r.output and "MB with all of them)" in r.output


@pytest.mark.parametrize("fields, match", [
    (dict(n_expert=5000), "expert count 5000 outside 1..1024"),
    (dict(n_expert=0), "expert count 0 outside 1..1024"),
    (dict(n_expert=0, n_expert_used=0, n_ff_exp=0), "ffn_gate_inp.weight is present but the config has no experts"),
    (dict(n_expert_used=9), "experts used per token 9 outside 1..8"),
    (dict(n_expert_used=-1), "experts used per token -1"),
    (dict(n_ff_exp=48), "expert FFN width 48 must be a positive multiple of 32"),
    (dict(n_ff_exp=64), "blk.0.ffn_gate_exps.weight has shape [64, 256], expected [64, 512]"),
    (dict(expert_gating=9), "unknown expert gating function 9"),
    (dict(expert_scale=float("nan")), "expert weights scale nan"),
])
def test_c_core_refuses_hostile_expert_configs(moe_path, fields, match):
    """The C core's own checks (a caller of pd_model_new that is not Model): an error naming the
    problem, and the size estimate before a load does not wrap around."""
    from pydecode._core import ffi, lib
    m = pydecode.Model(moe_path, n_ctx=32, n_threads=1)
    cfg = m._cfg_with(**fields)
    err = ffi.new("char[512]")
    assert lib.pd_model_new(cfg, m._tensors, len(m._tensors), ffi.NULL, err, 512) == ffi.NULL
    assert match in ffi.string(err).decode()
    assert lib.pd_config_memory_bytes(cfg) < 1 << 40
