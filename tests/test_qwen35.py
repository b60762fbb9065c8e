"""Qwen3.5 / Qwen3.6 hybrids (qwen35, qwen35moe: csrc/core/deltanet.c, pydecode/hybrid.py) on tiny
random-weight files: the forward pass against the numpy reference (tests/reference_qwen35.py,
itself checked against llama.cpp in bench/), on every ISA table; chunked prefill equals one
block; cached decode equals recompute; batched equals alone; the recurrent state's positions
(a step must continue them or start at 0); the Engine's prefix reuse (a cached run reused whole
or not at all); and what is not supported yet refused clearly (drafts, state files).

Tolerances (rms(ours - ref) / rms(ref)): QUANT_TOL against the reference that rounds each matmul
input to 8 bits as the C core does (measured 0.3-0.5%); FLOAT_TOL against the float reference
(measured 3.1-4.2%: the delta rule carries the 8-bit noise along the sequence)."""
import numpy as np
import pytest

import pydecode
from pydecode import Engine
from cache_check import assert_cached_decode_equals_recompute
from reference_qwen35 import Qwen35Reference
from tiny_models import N_VOCAB, write_tiny_hybrid

QUANT_TOL = 0.02
FLOAT_TOL = 0.08
CACHE_ATOL = 2e-3
TIMEOUT = 120
ISAS = ["scalar", "avx2", "avxvnni", "avx512", "neon"]


@pytest.fixture(scope="module", params=["dense", "moe"])
def hybrid(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("hybrid") / f"tiny-qwen35-{request.param}.gguf"
    write_tiny_hybrid(path, moe=request.param == "moe")
    return path


def _sequential(*models):
    """The models' delta rule token by token: its sums then do not depend on how a prompt is cut
    into steps (the matrix form's do, by rounding: an 8-bit activation moved across a step by it
    changes these 64-wide models' log-probabilities by up to ~1e-2)."""
    from pydecode._core import lib

    for m in models:
        lib.pd_model_set_delta_sequential(m._ptr, 1)


def _rel(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def test_config_from_metadata(hybrid):
    with pydecode.Model(hybrid, n_ctx=32, n_threads=1) as m:
        c = m.config
        assert c.recurrent == (True, True, True, False) and c.attn_gated and c.rope_neox
        assert (c.ssm_d_conv, c.ssm_n_k, c.ssm_n_v, c.ssm_d_state) == (4, 2, 4, 32)
        assert c.n_attn_layers == 1 and c.kv_positions(0, 10) == 0 and c.kv_positions(3, 10) == 10
        # one attention layer's K/V per position; a fixed recurrent state per sequence
        assert c.kv_bytes_per_token(2) == 2 * 2 * 32 * 2
        assert c.ssm_state_bytes() == 3 * 4 * (3 * 8 * 32 + 4 * 32 * 32)


@pytest.mark.parametrize("isa", ISAS)
def test_logits_match_reference(hybrid, isa):
    from pydecode._core import lib

    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} not supported")
    toks = np.random.default_rng(1).integers(0, N_VOCAB, 12).tolist()
    ref, ref8 = Qwen35Reference(hybrid).logits(toks), Qwen35Reference(hybrid, act_quant=True).logits(toks)
    with pydecode.Model(hybrid, n_ctx=64, n_threads=2, isa=isa) as m:
        ours = m.prefill(toks, all_logits=True)
        repacked = {name.split(".", 2)[-1] for name, _, _ in m.repacked}
    assert _rel(ours, ref8) <= QUANT_TOL and _rel(ours, ref) <= FLOAT_TOL
    assert np.mean(np.argmax(ours, 1) == np.argmax(ref8, 1)) >= 0.9
    if isa in ("avx512", "avxvnni"):   # their tables repack Q8_0 / Q4_1: a delta net's projections too
        assert {"attn_qkv.weight", "attn_gate.weight", "ssm_out.weight"} <= repacked, repacked


def _delta_rule(isa, sequential, S, kq, v, beta, g):
    from pydecode._core import ffi, lib

    S, o = S.copy(), np.zeros_like(v)
    f = lambda a: ffi.cast("float *", a.ctypes.data)   # noqa: E731
    assert lib.pd_kernel_delta_rule(isa.encode(), sequential, f(S), v.shape[1], v.shape[0], f(kq), f(v), f(beta),
                                    f(g), f(o)) == 0
    return S, o


@pytest.mark.parametrize("isa", ISAS)
def test_chunked_delta_rule_equals_sequential(isa):
    """The delta rule in matrix form over chunks of 64 tokens (csrc/core/deltanet_chunk.c, on the
    table's f32 products) equals its token-by-token twin: the outputs and the state after one
    token (a decode step), a few, one chunk and a bit (70: 64 + 6), and three chunks, from an empty
    state and a full one."""
    from pydecode._core import lib

    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} not supported")
    rng = np.random.default_rng(9)
    for d, n in ((32, 1), (32, 5), (32, 70), (128, 1), (128, 64), (128, 150)):
        k, q = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(2))
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        q /= np.linalg.norm(q, axis=1, keepdims=True) * np.sqrt(d)
        kq, v = np.concatenate([k, q]), rng.standard_normal((n, d)).astype(np.float32)
        beta, g = rng.uniform(0, 1, n).astype(np.float32), -rng.uniform(0, 2, n).astype(np.float32)
        for S0 in (np.zeros((d, d), np.float32), 0.3 * rng.standard_normal((d, d)).astype(np.float32)):
            S_seq, o_seq = _delta_rule("scalar", 1, S0, kq, v, beta, g)
            S, o = _delta_rule(isa, 0, S0, kq, v, beta, g)
            assert np.abs(S - S_seq).max() <= 1e-5 * np.abs(S_seq).max(), (d, n)
            assert np.abs(o - o_seq).max() <= 1e-5 * np.abs(o_seq).max(), (d, n)


@pytest.mark.parametrize("isa", ISAS)
def test_chunked_model_equals_sequential(hybrid, isa):
    """The same in the model, over a 150-token prompt and the decode steps after it: equal to the
    rounding of the 8-bit activations (an input 1e-7 away from a rounding edge moves by one step,
    so the two forms' logits part by up to ~1e-3 of their size, not 1e-7)."""
    from pydecode._core import lib

    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} not supported")
    toks = np.random.default_rng(8).integers(0, N_VOCAB, 155).tolist()
    out = []
    for sequential in (True, False):
        with pydecode.Model(hybrid, n_ctx=256, n_threads=2, isa=isa) as m:
            lib.pd_model_set_delta_sequential(m._ptr, sequential)
            rows = [m.prefill(toks[:150], all_logits=True).copy()]
            rows += [m.decode_step(t, 150 + i).copy()[None] for i, t in enumerate(toks[150:])]
            out.append(np.concatenate(rows))
    assert _rel(out[1], out[0]) < QUANT_TOL / 2
    assert np.mean(np.argmax(out[1], 1) == np.argmax(out[0], 1)) >= 0.95


def test_reference_continues_its_state():
    """The oracle's own incremental path equals its recompute (what the C core is held to)."""
    import tempfile
    import os
    path = os.path.join(tempfile.mkdtemp(), "h.gguf")
    write_tiny_hybrid(path)
    r = Qwen35Reference(path)
    toks = np.random.default_rng(4).integers(0, N_VOCAB, 10).tolist()
    st = {}
    parts = np.concatenate([r.logits(toks[:3], st), r.logits(toks[3:4], st), r.logits(toks[4:], st)])
    assert np.abs(parts - r.logits(toks)).max() < 1e-9


def test_chunked_prefill_equals_one_block(hybrid):
    toks = np.random.default_rng(3).integers(0, N_VOCAB, 13).tolist()
    with pydecode.Model(hybrid, n_ctx=64, n_threads=2, n_batch=4) as a, \
            pydecode.Model(hybrid, n_ctx=64, n_threads=2, n_batch=64) as b:
        np.testing.assert_allclose(a.prefill(toks, all_logits=True), b.prefill(toks, all_logits=True), atol=CACHE_ATOL)


def test_cached_decode_equals_recompute(hybrid):
    toks = np.random.default_rng(2).integers(0, N_VOCAB, 6).tolist()
    with pydecode.Model(hybrid, n_ctx=64, n_threads=2, n_batch=4) as m, \
            pydecode.Model(hybrid, n_ctx=64, n_threads=1, n_batch=4) as fresh:
        assert_cached_decode_equals_recompute(m, fresh, toks, 12, CACHE_ATOL)


def test_state_positions_are_checked(hybrid):
    """A slot's recurrent state holds the positions it absorbed: a step must continue there (or
    start at 0, afresh); anything else is a clear error, never silently wrong logits."""
    toks = np.random.default_rng(5).integers(0, N_VOCAB, 8).tolist()
    with pydecode.Model(hybrid, n_ctx=64, n_threads=1, n_seq=2) as m:
        first = m.prefill(toks[:5]).copy()
        with pytest.raises(ValueError, match="recurrent state holds positions 0..4"):
            m.decode_step(toks[5], 3)
        m.decode_step(toks[5], 5)                       # continues
        again = m.prefill(toks[:5]).copy()              # position 0: afresh
        np.testing.assert_allclose(again, first, atol=1e-6)
        with pytest.raises(ValueError, match="recurrent state"):
            m.batch_step([toks[0], toks[1]], [0, 2], [1, 0], [0, 1])


def test_batched_equals_alone_and_prefix_reuse(hybrid):
    prompts = [np.random.default_rng(s).integers(0, 256, 9).tolist() for s in (6, 7)]
    with pydecode.LLM(pydecode.Model(hybrid, n_ctx=64, n_threads=2, n_seq=2)) as llm, \
            pydecode.LLM(pydecode.Model(hybrid, n_ctx=64, n_threads=2)) as solo:
        e = llm.engine
        alone = [solo.engine.submit(p, 10, logprobs=3, ignore_eos=True).result(TIMEOUT) for p in prompts]
        hs = [e.submit(p, 10, logprobs=3, ignore_eos=True) for p in prompts]
        for h, want in zip(hs, alone):
            got = h.result(TIMEOUT)
            assert got.tokens == want.tokens
            assert all(abs(x[1] - y[1]) <= 1e-4 for x, y in zip(got.logprobs, want.logprobs))
        # a prompt that extends what a slot holds reuses all of it; one that parts from it midway
        # is recomputed (a recurrent state cannot be cut back), both equal to a fresh run
        held = prompts[0] + alone[0].tokens[:-1]
        for p, cached in ((held + [5, 6], len(held)), (held[:6] + [7, 8], 0)):
            got = e.submit(p, 4, logprobs=3, ignore_eos=True).result(TIMEOUT)
            want = solo.engine.submit(p, 4, logprobs=3, ignore_eos=True).result(TIMEOUT)
            assert got.stats.cached_tokens == cached and got.tokens == want.tokens
            assert all(abs(x[1] - y[1]) <= 1e-4 for x, y in zip(got.logprobs, want.logprobs))
            e.submit(prompts[0], 10, ignore_eos=True).result(TIMEOUT)   # the slot holds `held` again


def test_checkpoints_reuse_a_prompt_near_its_end(hybrid):
    """A prompt of >= 16 tokens leaves a copy of its slot's recurrent state 4 tokens before its end
    (pydecode/slots.py); a later prompt that parts from the slot's run after that point (a
    regenerated answer; a chat turn whose template re-renders the last prompt's end) restores it
    instead of recomputing: the same tokens and log-probabilities as a cold start. At most
    max_checkpoints per slot (the oldest go); 0 turns them off; a prompt parting before every
    checkpoint is recomputed. (Both models run the delta rule token by token, whose sums do not
    depend on where a checkpoint cuts the prompt: so the restored state is checked to 1e-5.)"""
    rng = np.random.default_rng(11)
    p1 = rng.integers(0, 256, 30).tolist()
    with pydecode.LLM(pydecode.Model(hybrid, n_ctx=128, n_threads=2)) as llm, \
            pydecode.LLM(pydecode.Model(hybrid, n_ctx=128, n_threads=2)) as cold:
        e, ledger = llm.engine, llm.model.slots
        cold.model.slots.max_checkpoints = 0
        _sequential(llm.model, cold.model)

        # made first: a drafting engine may measure its passes on the model (that rewrites slot 0)
        spec = Engine(llm.model, draft="lookup")

        def check(prompt, cached, draft=None):
            eng = e if draft is None else spec
            got = eng.submit(prompt, 6, logprobs=3, ignore_eos=True).result(TIMEOUT)
            cold.model.slots.erase(0)
            want = cold.engine.submit(prompt, 6, logprobs=3, ignore_eos=True).result(TIMEOUT)
            assert (got.stats.cached_tokens, got.tokens) == (cached, want.tokens)
            assert all(abs(x[1] - y[1]) <= 1e-5 for x, y in zip(got.logprobs, want.logprobs))
            return got

        first = check(p1, 0)
        check(p1, 26)                                            # regenerated: from the checkpoint
        check(p1[:28] + [1, 2, 3, 4, 5], 26)                     # parts after it
        held = p1[:28] + [1, 2, 3, 4, 5] + check(p1[:28] + [1, 2, 3, 4, 5], 29).tokens[:-1]
        check(held + [7, 8], len(held))                          # extends the run: all of it
        check(p1[:20] + [9] * 12, 0)                             # parts before every checkpoint
        assert sorted(ledger._ckpt[0]) == [28]
        check(p1[:20] + [9] * 12, 28, draft="lookup")            # a drafting engine restores it too
        q = p1
        check(q, 0)
        for i in range(6):                                       # a conversation's turns
            q, at = q + [i] * 6, len(q) - 4
            check(q, at)
        assert len(ledger._ckpt[0]) == ledger.max_checkpoints == 4
        assert ledger.checkpoint_bytes() == 4 * len(llm.model.ssm_snapshot(0)) > 0
        ledger.max_checkpoints = 0
        check(first.tokens[:20] + p1, 0)
        check(first.tokens[:20] + p1, 0)
        assert ledger.checkpoint_bytes() == 0
        spec.close()


def test_speculative_equals_plain(hybrid):
    """Drafts verified in one pass, rejected ones rolled back (the recurrent state restored and
    fed the accepted tokens): greedy output with prompt lookup or a draft model (the same file)
    equals plain decoding, and the slot then holds exactly the accepted tokens."""
    from pydecode import speculative
    rng = np.random.default_rng(13)
    base = rng.integers(0, 256, 6).tolist()
    prompts = [base * 3 + [9], rng.integers(0, 256, 10).tolist()]   # repetitive: lookup drafts
    with pydecode.LLM(pydecode.Model(hybrid, n_ctx=128, n_threads=2, n_seq=2)) as llm:
        plain = [llm.engine.submit(p, 24, logprobs=2, ignore_eos=True).result(TIMEOUT) for p in prompts]
        for draft in ("lookup", speculative.DraftModel(llm.model, hybrid)):
            e = Engine(llm.model, draft=draft)
            try:
                got = [h.result(TIMEOUT) for h in [e.submit(p, 24, logprobs=2, ignore_eos=True) for p in prompts]]
                again = e.submit(prompts[0] + got[0].tokens[:-1] + [3], 4, ignore_eos=True).result(TIMEOUT)
            finally:
                e.close()
                if draft != "lookup":
                    draft.close()
            assert [c.tokens for c in got] == [c.tokens for c in plain], draft
            for c, want in zip(got, plain):
                assert all(abs(x[1] - y[1]) <= 1e-3 for x, y in zip(c.logprobs, want.logprobs))
            assert sum(c.stats.draft_tokens for c in got) > 0
            if draft == "lookup":   # (random weights: the lookup's guesses are rejected, and rolled back)
                assert sum(c.stats.accepted_tokens for c in got) < sum(c.stats.draft_tokens for c in got)
            assert again.stats.cached_tokens == len(prompts[0]) + len(got[0].tokens) - 1


def test_state_files_carry_the_recurrent_state(hybrid, tmp_path):
    """A saved slot holds its K/V and its recurrent state: restored in a new process, the
    continuation is the exporter's, bit for bit; a truncated file, or one of another model, is
    refused and changes nothing."""
    import json
    import subprocess
    import sys
    prompt = np.random.default_rng(12).integers(0, 256, 9).tolist()
    path = tmp_path / "slot.state"
    with pydecode.LLM(pydecode.Model(hybrid, n_ctx=64, n_threads=1)) as llm:
        h = llm.engine.submit(prompt, 6, ignore_eos=True)
        first = h.result(TIMEOUT)
        held = llm.model.slots.held(h.slot)
        assert llm.engine.save_state(path, h) == len(held)
        more = held + [7, 8]
        want = llm.engine.submit(more, 6, logprobs=3, ignore_eos=True).result(TIMEOUT)
        assert want.stats.cached_tokens == len(held) and first.tokens
        data = path.read_bytes()
        for bad in (data[:len(data) // 2], data[:-1]):
            (tmp_path / "bad.state").write_bytes(bad)
            with pytest.raises(ValueError):
                llm.engine.load_state(tmp_path / "bad.state")
    code = f"""
import json, pydecode
llm = pydecode.LLM(pydecode.Model({str(hybrid)!r}, n_ctx=64, n_threads=1))
held = llm.engine.load_state({str(path)!r})
c = llm.engine.submit(held + [7, 8], 6, logprobs=3, ignore_eos=True).result(60)
print(json.dumps([c.stats.cached_tokens, c.tokens, [lp for _, lp, _ in c.logprobs]]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cached, toks, lps = json.loads(out.stdout.strip().splitlines()[-1])
    assert cached == len(held) and toks == want.tokens and lps == [lp for _, lp, _ in want.logprobs]
    other = tmp_path / "other.gguf"
    write_tiny_hybrid(other, n_v=2)   # other recurrent shapes
    with pydecode.LLM(pydecode.Model(other, n_ctx=64, n_threads=1)) as llm:
        with pytest.raises(ValueError):
            llm.engine.load_state(path)


def test_context_shift_recomputes_the_kept_context(hybrid):
    """A shift cannot cut the recurrent state back: the kept context is prefilled afresh, and
    each stretch equals a fresh run from it (test_context_shift's replay). Token by token delta
    rules, as in the checkpoint test: the shift's chunks are not the fresh run's."""
    from test_context_shift import check_against_recompute

    prompt = np.random.default_rng(8).integers(0, 256, 10).tolist()
    with pydecode.LLM(pydecode.Model(hybrid, n_ctx=32, n_threads=2)) as a, \
            pydecode.LLM(pydecode.Model(hybrid, n_ctx=32, n_threads=2)) as b:
        _sequential(a.model, b.model)
        c = a.engine.submit(prompt, 50, logprobs=3, ignore_eos=True, context_shift=True, n_keep=4).result(TIMEOUT)
        check_against_recompute(b, prompt, c, 32, 4)


def test_q8_0_cache_and_more_slots(hybrid):
    """kv_type q8_0 applies to the attention layers (the recurrent state stays f32); slots grown
    later start with empty states."""
    toks = np.random.default_rng(9).integers(0, N_VOCAB, 10).tolist()
    with pydecode.Model(hybrid, n_ctx=64, n_threads=2) as f16, \
            pydecode.Model(hybrid, n_ctx=64, n_threads=2, kv_type="q8_0") as q8:
        want = f16.prefill(toks, all_logits=True)
        assert _rel(q8.prefill(toks, all_logits=True), want) < 0.01
        q8.grow_slots(3)
        np.testing.assert_allclose(q8.prefill(toks, seq=2, all_logits=True), q8.prefill(toks, seq=0, all_logits=True),
                                   atol=1e-6)


def test_synthetic_shapes_write_load_and_match(tmp_path):
    """bench/synthetic.py's Qwen3.5 shapes (shrunk to test size, the real layout and quant mix,
    the Qwen3.5 pre-tokenizer's vocabulary) load and match the reference; the real shapes plan
    the tensors llama.cpp's converter writes."""
    import dataclasses
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("synthetic", Path(__file__).resolve().parents[1] / "bench" / "synthetic.py")
    synthetic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synthetic)
    from synthetic_shapes import _hybrid_kv
    S = synthetic.SHAPES
    real = synthetic.plan_types("qwen3.6-35b-a3b", "q4_k_m", 248320, 4)
    assert real["blk.0.attn_qkv.weight"][0] == (8192, 2048) and real["blk.3.attn_q.weight"][0] == (8192, 2048)
    assert real["blk.0.ssm_conv1d.weight"][1] == synthetic.QT.F32 and real["blk.0.ffn_down_exps.weight"][0] == (256, 2048, 512)
    for name in ("qwen3.5-0.8b", "qwen3.6-35b-a3b"):
        s = S[name]
        small = dataclasses.replace(s, n_embd=256, n_ff=512 if not s.moe else 256, n_head=4, n_head_kv=2, head_dim=64,
                                    kv={**s.kv, **_hybrid_kv(2, 4, 32), "rope.dimension_count": 16,
                                        "rope.dimension_sections": [3, 3, 2, 0]},
                                    **({"n_expert": 4, "n_expert_used": 2, "n_ff_exp": 128} if s.moe else {}))
        if s.moe:
            small = dataclasses.replace(small, kv={**small.kv, "expert_shared_feed_forward_length": 256})
        path = synthetic.write(small, "q4_k_m", tmp_path / f"{name}.gguf", layers=4)
        toks = np.random.default_rng(11).integers(0, 5000, 8).tolist()
        with pydecode.Model(path, n_ctx=32, n_threads=2) as m:
            assert m.config.recurrent == (True, True, True, False) and m.tokenizer.encode("hello world")
            assert "<think>" in m.gguf.metadata["tokenizer.chat_template"]   # Qwen3.5's, with its reasoning
            ours = m.prefill(toks, all_logits=True)
        ref8 = Qwen35Reference(path, act_quant=True).logits(toks)
        assert _rel(ours, ref8) <= 2 * QUANT_TOL, name   # (K-quants' 256-blocks: measured 2.1%)


def test_mtp_layers_are_skipped(tmp_path):
    """A file with the multi-token-prediction block (block_count counts it, nextn_predict_layers
    says so) loads as the layers before it, as llama.cpp does; pydecode info says so."""
    from click.testing import CliRunner
    from pydecode.cli import main
    plain, mtp = tmp_path / "plain.gguf", tmp_path / "mtp.gguf"
    write_tiny_hybrid(plain)
    write_tiny_hybrid(mtp, mtp=True)
    toks = np.random.default_rng(14).integers(0, N_VOCAB, 7).tolist()
    with pydecode.Model(plain, n_ctx=32, n_threads=1) as a, pydecode.Model(mtp, n_ctx=32, n_threads=1) as b:
        assert b.config.n_layer == 4 and b.config.n_mtp == 1 and b.config.recurrent == a.config.recurrent
        np.testing.assert_array_equal(a.prefill(toks, all_logits=True), b.prefill(toks, all_logits=True))
    out = CliRunner().invoke(main, ["info", str(mtp)])
    assert out.exit_code == 0 and "1 multi-token-prediction layer(s) skipped" in out.output, out.output


def test_served_over_http(tmp_path):
    """A hybrid behind the server: completions whole and streamed agree, the next request that
    extends the first reuses its slot, and a JSON schema still parses."""
    import json
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient
    from pydecode.server import ServerState, create_app

    path = tmp_path / "h.gguf"
    write_tiny_hybrid(path)
    llm = pydecode.load(str(path), n_ctx=128, n_threads=1)
    state = ServerState("tiny-hybrid")
    llm.engine.start()
    state.ready(llm)
    try:
        with TestClient(create_app(state)) as client:
            body = {"prompt": "abc abc", "max_tokens": 8, "temperature": 0}
            whole = client.post("/v1/completions", json=body).json()
            r = client.post("/v1/completions", json={**body, "stream": True})
            text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in r.text.splitlines()
                           if line.startswith("data: {"))
            assert text == whole["choices"][0]["text"]
            ids = llm.tokenize("abc abc")
            first = client.post("/completion", json={"prompt": ids, "n_predict": 6, "return_tokens": True}).json()
            n = client.post("/completion", json={"prompt": ids + first["tokens"] + [5], "n_predict": 2}).json()
            # the slot's whole run: every returned token but the last went through the model, and the
            # last did too where an end-of-generation token (not returned) was drawn after it
            fed = len(first["tokens"]) - (first["stop_type"] != "eos")
            assert n["timings"]["cache_n"] == len(ids) + fed
            schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
            j = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 24,
                                                          "response_format": {"type": "json_schema", "json_schema":
                                                                              {"name": "t", "schema": schema}}}).json()
            assert isinstance(json.loads(j["choices"][0]["message"]["content"])["a"], int)
    finally:
        llm.close()


def test_ctrl_c_after_a_step_keeps_the_other_sequences(hybrid):
    """A Ctrl-C that lands once a batched step's model call returned (the states have absorbed
    its tokens) reaches the caller, whose generation ends; the other sequence of that step goes
    on exactly (its redo would otherwise be refused: its state is past what it knows)."""
    import _thread

    prompts = [np.random.default_rng(s).integers(0, 256, 9).tolist() for s in (21, 22)]
    with pydecode.LLM(pydecode.Model(hybrid, n_ctx=64, n_threads=2, n_seq=2)) as llm, \
            pydecode.LLM(pydecode.Model(hybrid, n_ctx=64, n_threads=2)) as solo:
        want = solo.engine.submit(prompts[1], 12, ignore_eos=True).result(TIMEOUT).tokens
        m, real, calls = llm.model, llm.model.batch_step, []

        def batch_step(*a, **k):
            out = real(*a, **k)
            calls.append(1)
            if len(calls) == 3:
                _thread.interrupt_main()   # delivered at the next bytecode: after the call
            return out

        m.batch_step = batch_step
        other = llm.engine.submit(prompts[1], 12, ignore_eos=True)
        with pytest.raises(KeyboardInterrupt):
            llm.engine.submit(prompts[0], 12, ignore_eos=True).result(TIMEOUT)
        del m.batch_step
        assert other.result(TIMEOUT).tokens == want
