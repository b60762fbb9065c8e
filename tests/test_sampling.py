"""The sampler on synthetic logits (fixed seeds), and every stop condition on scripted logits.

Statistical checks use enough draws that a wrong implementation fails by a wide margin:
FREQ_TOL is the allowed absolute error of an empirical frequency over N_DRAWS draws (the
binomial standard deviation is at most 0.5/sqrt(N_DRAWS) = 0.007).
"""
import numpy as np
import pytest

from pydecode.engine import Engine
from pydecode.generation import StopStrings
from pydecode.slots import SlotLedger
from pydecode.sampling import Sampler, SamplingParams, apply_penalties, sample, top_logprobs
from pydecode.tokenizer import Tokenizer

N_DRAWS = 5000
FREQ_TOL = 0.03


def _draws(logits, n=N_DRAWS, recent=(), **kw):
    p = SamplingParams(seed=kw.pop("seed", 0), **kw)
    s = Sampler(p, len(logits))
    return np.array([sample(logits, p, s, recent) for _ in range(n)])


def _softmax(x, t=1.0):
    z = np.exp((x - x.max()) / t)
    return z / z.sum()


@pytest.fixture(scope="module")
def logits():
    return (np.random.default_rng(3).standard_normal(50_000) * 2).astype(np.float32)


def test_greedy_and_near_zero_temperature(logits):
    assert set(_draws(logits, 50, temperature=0.0)) == {int(np.argmax(logits))}
    assert set(_draws(logits, 50, temperature=1e-4)) == {int(np.argmax(logits))}


def test_top_k_never_leaves_the_k_best(logits):
    best = set(np.argsort(-logits)[:5].tolist())
    d = _draws(logits, 2000, temperature=5.0, top_k=5)
    assert set(d.tolist()) <= best and len(set(d.tolist())) == 5


def test_top_p_cuts_the_mass(logits):
    small = logits[:40].copy()
    p = _softmax(small)
    order = np.argsort(-p)
    nucleus = order[:int(np.searchsorted(np.cumsum(p[order]), 0.6)) + 1]
    d = _draws(small, temperature=1.0, top_p=0.6)
    assert set(d.tolist()) == set(nucleus.tolist())
    # within the nucleus, frequencies follow the renormalized probabilities
    q = p[nucleus] / p[nucleus].sum()
    for tok, want in zip(nucleus, q):
        assert abs(np.mean(d == tok) - want) < FREQ_TOL


def test_top_p_over_a_flat_large_vocabulary():
    """The nucleus needs far more than the first candidate list: the list must grow."""
    flat = np.zeros(100_000, np.float32)
    flat[:10] = 1.0
    d = _draws(flat, 300, temperature=1.0, top_p=0.5)
    assert len(set(d.tolist())) > 256           # a cut after 256 candidates would give <= 256


def test_min_p_threshold(logits):
    small = logits[:60].copy()
    p = _softmax(small, 0.7)
    allowed = set(np.flatnonzero(p >= 0.2 * p.max()).tolist())
    d = _draws(small, temperature=0.7, min_p=0.2)
    assert set(d.tolist()) == allowed


def test_temperature_frequencies_match_softmax_including_the_tail():
    """Plain temperature sampling over a vocabulary whose tail (outside the first candidate
    list) holds most of the mass: exercises the C tail scan."""
    x = np.zeros(20_000, np.float32)
    x[:3] = [3.0, 2.0, 1.0]
    p = _softmax(x)
    d = _draws(x, temperature=1.0)
    for tok in range(3):
        assert abs(np.mean(d == tok) - p[tok]) < FREQ_TOL
    assert abs(np.mean(d >= 256) - p[256:].sum()) < FREQ_TOL


def test_penalties_change_only_penalized_tokens(logits):
    recent = [5, 5, 9, 123, 5]
    p = SamplingParams(temperature=1.0, repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1)
    out = apply_penalties(logits, recent, p)
    changed = set(np.flatnonzero(out != logits).tolist())
    assert changed == {5, 9, 123}
    for t, count in ((5, 3), (9, 1)):
        base = logits[t] / 1.3 if logits[t] > 0 else logits[t] * 1.3
        assert out[t] == pytest.approx(base - 0.2 * count - 0.1, rel=1e-6)
    # greedy with a strong repeat penalty avoids the repeated argmax
    top = int(np.argmax(logits))
    assert _draws(logits, 1, recent=[top], temperature=0.0, repeat_penalty=1e3)[0] != top


def test_seeds(logits):
    a = _draws(logits, 200, temperature=1.0, seed=1)
    b = _draws(logits, 200, temperature=1.0, seed=1)
    c = _draws(logits, 200, temperature=1.0, seed=2)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_logprobs(logits):
    s = Sampler(SamplingParams(), len(logits))
    lp, top = top_logprobs(logits, s, 7, 3)
    ref = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64) - logits.max()).sum()) - logits.max()
    assert lp == pytest.approx(ref[7], abs=1e-4)
    assert [t for t, _ in top] == np.argsort(-logits)[:3].tolist()


@pytest.mark.parametrize("kw,name", [({"temperature": float("nan")}, "temperature"), ({"top_k": -1}, "top_k"),
                                     ({"top_p": 0.0}, "top_p"), ({"min_p": -0.1}, "min_p"),
                                     ({"repeat_penalty": 0.0}, "repeat_penalty"), ({"repeat_last_n": -1}, "repeat_last_n"),
                                     ({"seed": 1.5}, "seed"), ({"temperature": "hot"}, "temperature")])
def test_bad_parameters(kw, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kw)


# ---------------- stop conditions on scripted logits ----------------

class ScriptedModel:
    """Stands in for Model under an Engine: each step's logits put all mass on the next scripted
    token (one sequence slot)."""

    n_seq, n_batch, kv_type = 1, 256, "f16"

    def __init__(self, tokenizer, script, n_ctx=64):
        self.tokenizer, self.script, self.n_ctx = tokenizer, list(script), n_ctx
        self.n_vocab = tokenizer.vocab_size
        self.slots = SlotLedger(1, None)
        self.steps = 0

    def _next(self):
        x = np.zeros(self.n_vocab, np.float32)
        x[self.script[min(self.steps, len(self.script) - 1)]] = 100.0
        self.steps += 1
        return x

    def check_file(self):
        pass

    def set_summary(self, inv_t):
        pass

    def batch_step(self, tokens, pos, seq, out_idx, out=None, lease=None):
        return np.stack([self._next() for _ in out_idx]) if len(out_idx) else np.empty((0, self.n_vocab))

    def decode_step(self, token, pos, seq=0, lease=None):
        return self._next()


@pytest.fixture(scope="module")
def tok(smollm_path):
    from pydecode.gguf_file import GGUFFile

    return Tokenizer.from_metadata(GGUFFile(smollm_path).metadata)


def _run(tok, script, max_tokens=50, stop=None, n_ctx=64, cancel_after=None):
    g = Engine(ScriptedModel(tok, script, n_ctx)).submit(tok.encode("Hi"), max_tokens, stop=stop)
    pieces = []
    for piece in g:
        pieces.append(piece.text)
        if cancel_after is not None and len(pieces) == cancel_after:
            g.cancel()
    return g.completion, pieces


def test_stop_string_split_over_three_tokens(tok):
    ids = [tok.encode(w, add_special=False)[0] for w in ["Hello", " wor", "ld", " E", "N", "D", " more"]]
    assert len(ids) == 7
    out, pieces = _run(tok, ids, stop=["wor" + "ld EN"])   # spans " wor" | "ld" | " E" | "N"
    assert out.finish_reason == "stop" and "stop string" in out.stop_detail
    assert out.text == "Hello " and "".join(pieces) == "Hello "
    assert not any("wor" in p for p in pieces)              # held back, never emitted


def test_held_text_released_when_the_stop_does_not_complete(tok):
    ids = [tok.encode(w, add_special=False)[0] for w in ["Hello", " wor", "ry"]] + [tok.eos_id]
    out, pieces = _run(tok, ids, stop=["world"])
    assert out.text == "Hello worry" and "".join(pieces) == "Hello worry" and out.finish_reason == "stop"


def test_multibyte_character_split_over_two_tokens(tok):
    # "é" is two bytes; byte-level BPE has a token for each byte on its own
    b1, b2 = "é".encode()
    byte_tok = {tok.token_bytes(i): i for i in range(tok.vocab_size)}
    script = [byte_tok[bytes([b1])], byte_tok[bytes([b2])], tok.eos_id]
    out, pieces = _run(tok, script)
    assert out.text == "é" and "\ufffd" not in "".join(pieces)
    assert pieces[0] == "" and pieces[1] == "é"            # emitted once complete, exactly once
    out, _ = _run(tok, script, stop=["é"])
    assert out.text == "" and out.finish_reason == "stop"


def test_eog_max_tokens_context_and_cancel(tok):
    word = tok.encode(" yes", add_special=False)[0]
    out, _ = _run(tok, [word, word, tok.eos_id])
    assert out.finish_reason == "stop" and out.tokens == [word, word] and "end-of-generation" in out.stop_detail
    out, _ = _run(tok, [word], max_tokens=5)
    assert out.finish_reason == "length" and len(out.tokens) == 5 and out.stop_detail == "max_tokens=5"
    out, _ = _run(tok, [word], n_ctx=len(tok.encode("Hi")) + 3)
    assert out.finish_reason == "length" and "context full" in out.stop_detail
    out, _ = _run(tok, [word], cancel_after=3)
    assert out.finish_reason == "cancelled" and len(out.tokens) == 3 and out.text == " yes" * 3


def test_abandoned_stream_is_closed_cleanly(tok):
    word = tok.encode(" yes", add_special=False)[0]
    g = Engine(ScriptedModel(tok, [word])).submit(tok.encode("Hi"), 50)
    next(g), next(g)
    g.close()
    assert g.completion.finish_reason == "cancelled" and len(g.completion.tokens) == 2


def test_stop_strings_unit():
    s = StopStrings(["\n\n", "END"])
    assert s.feed("a\n") == ("a", None)
    assert s.feed("b") == ("\nb", None)
    assert s.feed("EN") == ("", None)
    assert s.feed("D!") == ("", "END")
    with pytest.raises(ValueError, match="stop"):
        StopStrings([""])


# ---------------------------------------------------------------- the C primitives

from pydecode import _core  # noqa: E402


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 262_144])
def test_sum_exp_matches_numpy_on_every_isa(isa, n):
    """pd_sum_exp (scalar, AVX2 and AVX-512 exp polynomials; an ISA the CPU lacks falls back to
    the best it has) against float64 numpy, including masked tails and scores far below the shift."""
    x = (np.random.default_rng(n).standard_normal(n) * 20).astype(np.float32)
    for scale, shift in [(1.0, float(x.max())), (1.25, float(x.max())), (0.5, 3.0)]:
        got = _core.lib.pd_sum_exp(isa.encode(), _core.ffi.cast("float *", x.ctypes.data), n, scale, shift)
        want = np.exp(scale * (x.astype(np.float64) - shift)).sum()
        assert got == pytest.approx(want, rel=2e-6, abs=1e-30)


@pytest.mark.parametrize("k", [1, 7, 256, 2048, 16_384, 40_000, 50_000])
def test_top_k_is_exact_with_ties_to_the_lower_id(logits, k):
    """pd_top_k's candidate narrowing (sample threshold, bit histograms, whole-vocabulary radix
    sort) against a stable numpy sort, with ties and -0.0 == +0.0 in the data."""
    x = logits.copy()
    x[::97] = 1.5          # many exact ties
    x[5::101] = -0.0
    x[7::103] = 0.0
    ids = np.empty(k, np.int32)
    vals = np.empty(k, np.float32)
    n = _core.lib.pd_top_k(_core.ffi.cast("float *", x.ctypes.data), len(x), k,
                           _core.ffi.cast("int32_t *", ids.ctypes.data), _core.ffi.cast("float *", vals.ctypes.data))
    want = np.argsort(-x.astype(np.float64), kind="stable")[:k]
    assert n == min(k, len(x)) and (ids[:n] == want).all() and (vals[:n] == x[want]).all()


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
@pytest.mark.parametrize("n", [1, 15, 16, 31, 63, 64, 65, 50_000])
def test_collect_above_matches_numpy_on_every_isa(isa, n):
    """top-k's vocabulary pass (the ids above a threshold, in order) on every ISA, with NaN,
    -0.0 and values equal to the threshold in the data."""
    x = (np.random.default_rng(n).standard_normal(n) * 3).astype(np.float32)
    x[::37] = np.nan
    x[3::41] = -0.0
    x[5::43] = 1.0
    out = np.full(n + 16, -7, np.int32)
    for t in [-np.inf, -1.0, 0.0, 1.0, 2.5, 100.0]:
        got = _core.lib.pd_collect_above(isa.encode(), _core.ffi.cast("float *", x.ctypes.data), n, t,
                                         _core.ffi.cast("int32_t *", out.ctypes.data))
        want = np.flatnonzero(x > t)
        assert got == len(want) and (out[:got] == want).all()


@pytest.mark.parametrize("kw", [dict(top_k=40), dict(top_p=0.95), dict(top_p=0.5, min_p=0.05), dict(min_p=0.2),
                                dict(top_k=3000, top_p=0.999), dict(top_p=0.9999), dict(min_p=1e-9)])
def test_sample_truncated_equals_its_primitives_step_by_step(logits, kw):
    """The one-call chain (pd_sample_truncated) picks exactly what pd_top_k, pd_sum_exp and
    pd_draw_candidates pick when called one by one, candidate growth included."""
    lib, ffi = _core.lib, _core.ffi
    x = logits * np.float32(1.7)
    px = ffi.cast("float *", x.ctypes.data)
    n, inv_t = len(x), 1 / 0.8
    top_k, top_p, min_p = kw.get("top_k", 0), kw.get("top_p", 1.0), kw.get("min_p", 0.0)
    for u in np.random.default_rng(1).random(25).tolist() + [0.0, 0.999999]:
        k = top_k or 256
        while True:
            ids, vals = np.empty(k, np.int32), np.empty(k, np.float32)
            got = lib.pd_top_k(px, n, k, ffi.cast("int32_t *", ids.ctypes.data), ffi.cast("float *", vals.ctypes.data))
            whole = top_k > 0 or got == n
            z = 0.0 if whole else lib.pd_sum_exp(ffi.NULL, px, n, inv_t, float(vals[0]))
            i = lib.pd_draw_candidates(ffi.cast("float *", vals.ctypes.data), got, inv_t, z, top_p, min_p,
                                       int(not whole), u)
            if i >= 0:
                break
            k = min(k * 8, n)
        assert lib.pd_sample_truncated(px, n, top_k, 256, inv_t, top_p, min_p, u) == ids[i]


# ---------------------------------------------------------------- the sampling summary (csrc/sampling/summary.h)

SUMMARY_PARAMS = [dict(top_p=0.95), dict(top_k=40), dict(top_k=256, top_p=0.9), dict(top_p=0.5, min_p=0.05),
                  dict(min_p=0.1), dict(top_p=0.999999)]


def _summary_vs_full(m, steps, inv_t, n_u=12):
    """For each decode step with the summary on: the summary's draw == pd_sample_truncated's over
    the step's logits, for every parameter set and u (or -1: it defers, never disagrees)."""
    from pydecode._core import ffi, lib

    m.set_summary(inv_t)
    toks = m.tokenizer.encode("Once upon a time, in a small village by the sea")
    logits = m.prefill(toks)
    seen = deferred = 0
    us = np.random.default_rng(7).random(n_u).tolist() + [0.0, 0.9999999]
    for i in range(steps):
        buf = ffi.from_buffer("float[]", logits)
        for kw in SUMMARY_PARAMS:
            top_k, top_p, min_p = kw.get("top_k", 0), kw.get("top_p", 1.0), kw.get("min_p", 0.0)
            for u in us:
                want = lib.pd_sample_truncated(buf, len(logits), top_k, 256, inv_t, top_p, min_p, u)
                got = m.sample_summary(top_k, top_p, min_p, u)
                assert got in (want, -1), (i, kw, u, got, want)
                seen += 1
                deferred += got == -1
        logits = m.decode_step(int(np.argmax(logits)), len(toks) + i)
    m.set_summary(0.0)
    return seen, deferred


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_summary_draw_equals_the_full_pass(smollm_path, threads):
    """The candidates each thread folds during the head phase (any split of its chunks) and the
    rescaled chunk sums give the same draw as a pass over the whole logit vector."""
    import pydecode

    with pydecode.Model(smollm_path, n_ctx=128, n_threads=threads) as m:
        seen, deferred = _summary_vs_full(m, 4, 1 / 0.8)
    assert deferred < seen / 4        # it decides most draws itself


def test_summary_draw_equals_the_full_pass_gemma(gemma_path):
    """262,144 logits in 256 chunks, hot temperature and cold."""
    import pydecode

    with pydecode.Model(gemma_path, n_ctx=128, n_threads=2) as m:
        for inv_t in (1 / 1.5, 1 / 0.3):
            _summary_vs_full(m, 2, inv_t, n_u=6)


def test_summary_on_a_small_vocabulary(tmp_path):
    """A vocabulary smaller than the summary's candidate list: every logit is a candidate."""
    import pydecode
    from tiny_models import write_tiny_model

    path = tmp_path / "tiny.gguf"
    write_tiny_model(path, "llama")
    with pydecode.Model(path, n_ctx=64, n_threads=3) as m:
        m.set_summary(1.0)
        logits = m.prefill([1, 2, 3])
        from pydecode._core import ffi, lib
        buf = ffi.from_buffer("float[]", logits)
        for u in np.linspace(0, 0.999, 37):
            for top_p in (1.0, 0.9, 0.3):
                want = lib.pd_sample_truncated(buf, len(logits), 0, 256, 1.0, top_p, 0.0, u)
                assert m.sample_summary(0, top_p, 0.0, u) == want


def test_summary_state_and_bad_input(smollm_path):
    """No summary before a summarized step (-2), none for steps that return several rows, and a
    bad temperature is refused; generate() detaches (summary off) when it ends and picks the
    same seeded tokens as without the summary."""
    import pydecode
    from pydecode import sampling

    with pydecode.Model(smollm_path, n_ctx=128, n_threads=2) as m:
        assert m.sample_summary(40, 1.0, 0.0, 0.5) == -2
        m.set_summary(1.0)
        m.prefill([1, 2, 3], all_logits=True)          # several rows: not summarized
        assert m.sample_summary(40, 1.0, 0.0, 0.5) == -2
        m.prefill([1, 2, 3])
        assert m.sample_summary(40, 1.0, 0.0, 0.5) >= 0
        for bad in (-1.0, float("nan"), float("inf")):
            with pytest.raises(ValueError):
                m.set_summary(bad)
    kw = dict(max_tokens=24, temperature=0.8, top_p=0.95, seed=3)
    llm = pydecode.load(smollm_path, n_ctx=128, n_threads=2)
    a = llm.generate("The capital of France is", **kw)
    llm.model.prefill([1, 2, 3])
    assert llm.model.sample_summary(40, 1.0, 0.0, 0.5) == -2   # summary off once the engine is idle
    orig = sampling.Sampler.summary_inv_t
    sampling.Sampler.summary_inv_t = property(lambda self: 0.0)    # the full pass over the logits
    try:
        b = pydecode.load(smollm_path, n_ctx=128, n_threads=2).generate("The capital of France is", **kw)
    finally:
        sampling.Sampler.summary_inv_t = orig
    assert a.tokens == b.tokens


def test_logit_bias_bans_and_boosts_on_every_path():
    """logit_bias is added before the chain: greedy, the truncated C draw, plain temperature
    sampling and the masked draw all see it (and none reads a summary of the unbiased logits)."""
    import math
    from pydecode.sampling import Sampler, SamplingParams
    rng = np.random.default_rng(0)
    logits = rng.normal(size=1000).astype(np.float32)
    best = int(np.argmax(logits))
    for kw in ({}, {"temperature": 0.8, "top_k": 40, "seed": 1}, {"temperature": 1.0, "seed": 2}):
        banned = Sampler(SamplingParams(logit_bias={best: -math.inf}, **kw), 1000)
        assert all(banned.sample(logits) != best for _ in range(50))
        boosted = Sampler(SamplingParams(logit_bias={"7": 1000.0}, **kw), 1000)
        assert boosted.sample(logits) == 7
        assert banned.summary_inv_t == 0.0 and banned.propose_inv_t == 0.0
    with pytest.raises(ValueError, match="outside the vocabulary"):
        Sampler(SamplingParams(logit_bias={5000: 1.0}), 1000)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={1: float("nan")})
