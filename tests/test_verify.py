"""`pydecode verify` (issue 7.5): cached decode vs recomputing, the positions counts, and the KV
bytes formula against the C allocation (pd_model_kv_bytes and the per-layer ring sizes)."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

import pydecode
from pydecode import verify as V
from pydecode._core import ffi, lib
from pydecode.cli import main
from test_cache import CACHE_ATOL
from tiny_models import write_tiny_model


def test_tolerance_is_the_cache_tests_bound():
    assert V.TOLERANCE == CACHE_ATOL


@pytest.mark.parametrize("p,n,cached,recompute", [
    (2, 4, 5, 14),      # 2 + 3 = 5;  2 + 3 + 4 + 5 = 14
    (13, 5, 17, 75),    # 13 + 4 = 17; 13 + 14 + 15 + 16 + 17 = 75
    (7, 1, 7, 7),
])
def test_counting_formula(p, n, cached, recompute):
    assert V.expected_positions(p, n) == (cached, recompute)


@pytest.fixture(scope="module")
def prompt13(smollm_path):
    m = pydecode.Model(smollm_path, n_ctx=32, n_threads=1)
    ids = m.tokenizer.encode("The quick brown fox jumps over the lazy dog and then it ran into the")[:13]
    m.close()
    assert len(ids) == 13
    return ids


@pytest.mark.parametrize("p,n,cached,recompute", [(2, 4, 5, 14), (13, 5, 17, 75)])
def test_counts_measured(smollm_path, prompt13, p, n, cached, recompute):
    v = V.verify(smollm_path, prompt13[:p], n, n_threads=2, n_ctx=64)
    assert (v.positions_cached, v.positions_recompute) == (cached, recompute)
    assert [s.positions_cached for s in v.steps] == [p] + [1] * (n - 1)
    assert [s.positions_recompute for s in v.steps] == [p + i for i in range(n)]
    assert v.ok and v.max_abs_diff <= CACHE_ATOL
    assert all(s.token == s.token_recompute for s in v.steps)
    assert all(s.cached_s > 0 and s.recompute_s > 0 for s in v.steps)


def test_agrees_with_greedy_generation(smollm_path):
    """The tokens verify decodes are the ones generate() produces greedily."""
    v = V.verify(smollm_path, "The capital of France is", 6, n_threads=2, n_ctx=64)
    llm = pydecode.load(str(smollm_path), n_ctx=64, n_threads=2)
    assert llm.generate("The capital of France is", max_tokens=6).tokens == v.tokens
    llm.close()


def test_kv_bytes_in_use_by_the_formula(smollm_path, prompt13):
    """2 x n_layers x n_kv_heads x positions x head_dim x 2 bytes: SmolLM2, 30 x 3 x 64."""
    v = V.verify(smollm_path, prompt13, 5, n_threads=2, n_ctx=64)
    assert [s.kv_positions for s in v.steps] == [13, 14, 15, 16, 17]
    assert [s.kv_bytes_in_use for s in v.steps] == [2 * 30 * 3 * p * 64 * 2 for p in range(13, 18)]
    assert v.kv_bytes_allocated == 2 * 30 * 3 * 64 * 64 * 2


def test_cli_prints_the_table_and_exits_zero(smollm_path):
    r = CliRunner().invoke(main, ["verify", "-m", str(smollm_path), "-p", "Once upon a time", "-n", "4", "-t", "2"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split()[:5] == ["step", "token", "text", "max|dlogit|", "agree"]
    rows = [l for l in lines if l.strip()[:1].isdigit()]
    assert len(rows) == 4 and all(" yes " in l for l in rows)
    assert "the paths AGREE" in r.output and "with the cache vs" in r.output


def test_cli_json(smollm_path):
    r = CliRunner().invoke(main, ["verify", "-m", str(smollm_path), "-p", "Hi", "-n", "3", "-t", "1", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    p = d["prompt_tokens"]
    assert d["ok"] and (d["positions_cached"], d["positions_recompute"]) == V.expected_positions(p, 3)
    assert len(d["steps"]) == 3 and d["kv_bytes_in_use"] == 2 * 30 * 3 * (p + 2) * 64 * 2


class _Skewed(pydecode.Model):
    """A model whose full prefill of 4+ tokens is off by 0.01 on one logit (a broken path)."""

    def prefill(self, tokens, pos=0, all_logits=False):
        out = super().prefill(tokens, pos, all_logits)
        if len(tokens) >= 4:
            out[7] += 0.01
        return out


def test_disagreement_is_reported_and_fails(smollm_path):
    v = V.verify(smollm_path, [1, 2, 3], 3, n_threads=1, n_ctx=32, model_cls=_Skewed)
    # step 1: both full prefills of 3 tokens (unskewed); steps 2, 3: the recompute prefill is skewed
    assert [s.agree for s in v.steps] == [True, False, False] and not v.ok
    assert 0.009 < v.max_abs_diff < 0.011
    assert "DISAGREE at steps 2, 3" in V.summary_lines(v)[-1]


def test_cli_exits_nonzero_on_disagreement(smollm_path, monkeypatch):
    monkeypatch.setattr(V, "Model", _Skewed)
    r = CliRunner().invoke(main, ["verify", "-m", str(smollm_path), "-p", "Once upon a time", "-n", "3", "-t", "1"])
    assert r.exit_code == 1 and " NO " in r.output and "DISAGREE" in r.output


def test_cli_errors(smollm_path):
    r = CliRunner().invoke(main, ["verify", "-m", str(smollm_path), "-p", "Hi there", "-n", "40", "-c", "8"])
    assert r.exit_code == 1 and "need" in r.output and "positions" in r.output
    r = CliRunner().invoke(main, ["verify", "-m", str(smollm_path), "-p", "Hi", "-n", "0"])
    assert r.exit_code == 2


# ------------------------------------------------------------------ the formula vs the C allocation

def _c_caps(m):
    return [lib.pd_model_kv_cap(m._ptr, l) for l in range(m.config.n_layer)]


@pytest.mark.parametrize("kv_type,elem", [("f16", 2), ("f32", 4), ("q8_0", 34 / 32)])
@pytest.mark.parametrize("n_ctx", [1, 100, 4096])
def test_kv_formula_equals_allocation_smollm(smollm_path, kv_type, elem, n_ctx):
    m = pydecode.Model(smollm_path, n_ctx=n_ctx, n_threads=1, kv_type=kv_type)
    c = m.config
    assert lib.pd_model_kv_row_bytes(m._ptr) == c.n_head_kv * c.head_dim * elem == m.kv_elem_bytes * c.n_head_kv * c.head_dim
    assert _c_caps(m) == [n_ctx] * c.n_layer
    assert m.kv_bytes == 2 * c.n_layer * c.n_head_kv * n_ctx * c.head_dim * elem == c.kv_bytes(n_ctx, elem)
    assert lib.pd_model_kv_cap(m._ptr, -1) == -1 and lib.pd_model_kv_cap(m._ptr, c.n_layer) == -1
    m.close()


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    p = tmp_path_factory.mktemp("verify") / "tiny-gemma3.gguf"
    write_tiny_model(p, "gemma3", n_layer=7, window=4)   # layers 0-4 local, 5 global, 6 local
    return p


@pytest.mark.parametrize("n_ctx,n_batch", [(64, 4), (64, 256), (6, 1), (3, 2), (8, 4)])
def test_kv_formula_equals_allocation_sliding_window(tiny_gemma, n_ctx, n_batch):
    """Sliding-window layers allocate a ring of window + n_batch (at most n_ctx)."""
    m = pydecode.Model(tiny_gemma, n_ctx=n_ctx, n_threads=1, n_batch=n_batch)
    c = m.config
    assert c.sliding_window == 4 and [c.layer_is_local(l) for l in range(7)] == [True] * 5 + [False, True]
    want = [n_ctx if l == 5 else min(n_ctx, 4 + n_batch) for l in range(7)]
    assert _c_caps(m) == want == [c.kv_positions(l, n_ctx, n_batch) for l in range(7)]
    assert m.kv_bytes == sum(2 * c.n_head_kv * cap * c.head_dim * 2 for cap in want) == c.kv_bytes(n_ctx, 2, n_batch)
    m.close()


def test_kv_formula_equals_allocation_gemma(gemma_path):
    m = pydecode.Model(gemma_path, n_ctx=2048, n_threads=1, n_batch=64)
    c = m.config
    assert c.sliding_window == 512 and sum(c.layer_is_local(l) for l in range(c.n_layer)) == 15
    assert _c_caps(m) == [2048 if not c.layer_is_local(l) else 512 + 64 for l in range(c.n_layer)]
    assert m.kv_bytes == c.kv_bytes(2048, 2, ring_extra=64) == 2 * c.n_head_kv * c.head_dim * 2 * (3 * 2048 + 15 * 576)
    m.close()


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avxvnni", "avx512"])
def test_verify_sliding_window_ring_wraps(tiny_gemma, isa):
    """Window 4, n_batch 2: local layers keep a ring of 6 that wraps; the cache still equals
    recomputing, and the bytes in use count the window (4) for local layers."""
    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} not supported by this CPU or build")
    v = V.verify(tiny_gemma, list(range(10, 19)), 6, n_threads=1, n_ctx=32, n_batch=2, isa=isa)
    assert v.ok, V.report_lines(v)
    c = pydecode.Model(tiny_gemma, n_ctx=32, n_threads=1).config
    per = 2 * c.n_head_kv * c.head_dim * 2
    for s in v.steps:
        p = s.kv_positions
        assert s.kv_bytes_in_use == per * (p + 6 * min(p, 4))   # 1 global layer, 6 local ones
    assert v.positions_cached == 9 + 5 and v.positions_recompute == sum(range(9, 15))



# ------------------------------------------------------------------ the seed's attention example

VOCAB = {"A": (1.0, 0.0), "B": (0.0, 1.0), "C": (-1.0, -1.0)}   # Q = K = V = the token's vector
NAMES = list(VOCAB)
SCALE = 1 / np.sqrt(2)


def _attend(isa, q, keys, values, head_dim, f16):
    """pd_kernel_attn over the cache, the 2-d vectors zero-padded to head_dim (padding does not
    change a dot product or a weighted sum)."""
    n = len(keys)
    qa = np.zeros(head_dim, np.float32)
    qa[:2] = q
    ka, va = np.zeros((n, head_dim), np.float32), np.zeros((n, head_dim), np.float32)
    ka[:, :2], va[:, :2] = keys, values
    if f16:
        ka, va = ka.astype(np.float16), va.astype(np.float16)   # 0, 1, -1: exact in F16
    out = np.zeros(head_dim, np.float32)
    rc = lib.pd_kernel_attn(isa.encode(), int(f16), 1, ffi.from_buffer("float[]", qa), ffi.from_buffer(ka),
                            ffi.from_buffer(va), n, head_dim, float(SCALE), ffi.from_buffer("float[]", out))
    assert rc == lib.PD_OK
    assert not out[2:].any()
    return out[:2]


class _TinyAttentionModel:
    """One attention layer, no MLP: h = attention(q of the last token, the cached K/V);
    logits = [h1, h0, -h0 - h1] over the vocabulary A, B, C."""

    def __init__(self, isa, head_dim, f16):
        self.isa, self.head_dim, self.f16 = isa, head_dim, f16
        self.k, self.v = [], []          # the KV cache: one row per processed position

    def step(self, token):
        vec = VOCAB[token]
        self.k.append(vec)
        self.v.append(vec)
        h = _attend(self.isa, vec, self.k, self.v, self.head_dim, self.f16)
        return h, np.array([h[1], h[0], -h[0] - h[1]])


@pytest.mark.parametrize("f16", [False, True], ids=["f32", "f16"])
@pytest.mark.parametrize("head_dim", [2, 32])
@pytest.mark.parametrize("isa", ["scalar", "avx2", "avxvnni", "avx512"])
def test_hand_worked_attention_example(isa, head_dim, f16):
    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} not supported by this CPU or build")
    m = _TinyAttentionModel(isa, head_dim, f16)
    for tok in "AB":                                   # the prompt "A B"
        h, logits = m.step(tok)
    # q = B = (0, 1) against keys A, B: scores (0, 1)/sqrt 2, weights 1 : e^0.7071 = 0.330 : 0.670
    w = np.exp([0.0, SCALE]) / np.exp([0.0, SCALE]).sum()
    assert np.allclose(h, [0.330, 0.670], atol=5e-4) and np.allclose(h, w, atol=1e-6)
    assert np.allclose(logits, [0.670, 0.330, -1.0], atol=5e-4)
    nxt = NAMES[int(np.argmax(logits))]
    assert nxt == "A"                                 # greedy picks A
    assert len(m.k) == len(m.v) == 2                  # the cache holds two positions until A is processed
    h, logits = m.step(nxt)
    assert len(m.k) == 3
    # q = A = (1, 0) against A, B, A: weights e^0.7071 : 1 : e^0.7071 -> h = (0.802, 0.198): greedy B
    assert np.allclose(h, [0.802, 0.198], atol=5e-4)
    assert NAMES[int(np.argmax(logits))] == "B"


def test_attention_kernel_refuses_bad_arguments():
    q = np.zeros(4, np.float32)
    out = np.zeros(4, np.float32)
    args = (ffi.from_buffer("float[]", q), ffi.from_buffer(q), ffi.from_buffer(q))
    for n_pos, hd in ((0, 4), (1, 0), (-1, 4)):
        assert lib.pd_kernel_attn(b"scalar", 0, 1, *args, n_pos, hd, 1.0, ffi.from_buffer("float[]", out)) == lib.PD_EINVAL
    assert lib.pd_kernel_attn(b"no-such-isa", 0, 1, *args, 1, 4, 1.0, ffi.from_buffer("float[]", out)) == lib.PD_EINVAL
    assert lib.pd_kernel_attn(b"scalar", 0, 1, ffi.NULL, args[1], args[2], 1, 4, 1.0,
                              ffi.from_buffer("float[]", out)) == lib.PD_EINVAL
