"""The rarer sampling stages (pydecode/sampling_extra.py: tail-free, typical, Mirostat 1 and 2)
and the Python hooks of a generation (logits_processor, stopping_criteria: generation.Hooks).

The stages are checked against direct transcriptions of llama.cpp's definitions below (loops
over a sorted candidate list, as its C++ does, in float64), the kept set on many random logit
vectors and the draw's distribution by a chi-square test; Mirostat's mu against hand-computed
updates, and its long-run average surprise against tau. The hooks run on SmolLM2 through the
Engine: alone, batched, under a grammar, and with lookup drafts (the same calls and tokens).
"""
import json
import math
import re

import numpy as np
import pytest

import pydecode
from pydecode import speculative
from pydecode.sampling import Sampler, SamplingParams, sample


# ---------------------------------------------------------------- references (llama.cpp's loops)

def ref_sorted(x, t, top_k=0):
    """llama.cpp's softmax over the candidates: sorted by logit descending (ties: lower id),
    -inf ones dropped, top-k applied; (ids, probabilities)."""
    ids = np.argsort(-x, kind="stable")
    ids = ids[np.isfinite(x[ids])]
    if 0 < top_k < len(ids):
        ids = ids[:top_k]
    z = x[ids].astype(np.float64) / t
    p = np.exp(z - z.max())
    return ids, p / p.sum()


def ref_tail_free(ids, p, zz):
    if zz >= 1.0 or len(p) <= 2:
        return ids, p
    first = [p[i] - p[i + 1] for i in range(len(p) - 1)]
    second = [abs(first[i] - first[i + 1]) for i in range(len(first) - 1)]
    total = sum(second)
    second = [v / total for v in second] if total > 1e-6 else [1.0 / len(second)] * len(second)
    cum, last = 0.0, len(p)
    for i, v in enumerate(second):
        cum += v
        if cum > zz and i >= 1:
            last = i
            break
    q = p[:last]
    return ids[:last], q / q.sum()


def ref_typical(ids, p, tp):
    if tp >= 1.0:
        return ids, p
    entropy = -sum(float(v) * math.log(v) for v in p)
    shifted = np.array([abs(-math.log(v) - entropy) for v in p])
    order = np.argsort(shifted, kind="stable")
    cum, last = 0.0, len(order)
    for i, j in enumerate(order):
        cum += p[j]
        if cum > tp:
            last = i + 1
            break
    keep = np.sort(order[:last])   # (back in probability order)
    q = p[keep]
    return ids[keep], q / q.sum()


def ref_top_p_min_p(ids, p, top_p, min_p):
    keep = len(p)
    if top_p < 1.0:
        cum = 0.0
        for i, v in enumerate(p):
            cum += v
            if cum >= top_p:
                keep = i + 1
                break
    if min_p > 0.0:
        keep = min(keep, max(1, sum(1 for v in p if v >= min_p * p[0])))
    q = p[:keep]
    return ids[:keep], q / q.sum()


def ref_chain(x, t=1.0, top_k=0, tfs_z=1.0, typical_p=1.0, top_p=1.0, min_p=0.0):
    ids, p = ref_sorted(x, t, top_k)
    ids, p = ref_tail_free(ids, p, tfs_z)
    ids, p = ref_typical(ids, p, typical_p)
    return ref_top_p_min_p(ids, p, top_p, min_p)


def ref_draw(p, u):
    """pydecode's draw: the first prefix sum above u x the mass."""
    cum = 0.0
    for i, v in enumerate(p):
        cum += v
        if cum > u:
            return i
    return len(p) - 1


def chi_square_ok(counts, probs, n):
    """A chi-square goodness-of-fit test at about 1e-5 (Wilson-Hilferty's quantile), the rare
    cells pooled so that every expected count is >= 5."""
    exp = probs * n
    big = exp >= 5
    obs_c = list(counts[big]) + [counts[~big].sum()]
    exp_c = list(exp[big]) + [exp[~big].sum()]
    if exp_c[-1] < 5:
        obs_c, exp_c = obs_c[:-1], exp_c[:-1]
        obs_c[-1] += counts[~big].sum()
        exp_c[-1] += exp[~big].sum()
    stat = sum((o - e) ** 2 / e for o, e in zip(obs_c, exp_c))
    k = len(obs_c) - 1
    q = k * (1 - 2 / (9 * k) + 4.26 * math.sqrt(2 / (9 * k))) ** 3
    return stat < q, stat, q


# ---------------------------------------------------------------- the stages on random logits

CASES = [dict(tfs_z=0.95), dict(tfs_z=0.5), dict(typical_p=0.9), dict(typical_p=0.3), dict(typical_p=0.99),
         dict(tfs_z=0.97, typical_p=0.8), dict(typical_p=0.7, top_k=50), dict(tfs_z=0.9, top_p=0.8, min_p=0.01),
         dict(typical_p=0.95, top_p=0.9, min_p=0.02, top_k=200)]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_kept_set_matches_the_definitions(kw):
    rng = np.random.default_rng(11)
    for trial in range(60):
        n = int(rng.integers(3, 3000))
        x = (rng.standard_normal(n) * rng.uniform(0.3, 6.0)).astype(np.float32)
        if trial % 5 == 0:   # some banned tokens: no candidates at all
            x[rng.integers(0, n, n // 3)] = -np.inf
        t = float(rng.uniform(0.4, 1.6))
        p = SamplingParams(temperature=t, seed=1, **kw)
        s = Sampler(p, n)
        ids, w = s.extra.truncate(x, s)
        want_ids, want_p = ref_chain(x, t, **kw)
        assert ids.tolist() == want_ids.tolist(), (trial, kw)
        np.testing.assert_allclose(w / w.sum(), want_p, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(typical_p=0.6), dict(tfs_z=0.9), dict(typical_p=0.9, tfs_z=0.99, min_p=0.05)])
def test_draws_follow_the_kept_distribution(kw):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(60) * 2).astype(np.float32)
    ids, probs = ref_chain(x, 0.9, **kw)
    full = np.zeros(60)
    full[ids] = probs
    p = SamplingParams(temperature=0.9, seed=7, **kw)
    s = Sampler(p, 60)
    n = 20000
    draws = np.array([sample(x, p, s) for _ in range(n)])
    assert set(draws.tolist()) <= set(ids.tolist())
    ok, stat, q = chi_square_ok(np.bincount(draws, minlength=60)[ids], probs, n)
    assert ok, (stat, q)
    # and exactly: each draw is the reference's token for the seeded generator's uniform
    us = np.random.default_rng(7).random(200)
    s2 = Sampler(p, 60)
    assert [sample(x, p, s2) for _ in range(200)] == [int(ids[ref_draw(probs, u)]) for u in us]


def test_greedy_ignores_the_extra_stages():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(5000).astype(np.float32)
    plain = Sampler(SamplingParams(temperature=0.0), len(x))
    for kw in (dict(typical_p=0.2), dict(tfs_z=0.2), dict(mirostat_mode=1), dict(mirostat_mode=2, mirostat_tau=0.5)):
        p = SamplingParams(temperature=0.0, **kw)
        s = Sampler(p, len(x))
        assert not p.extra and s.extra is None
        assert (s.summary_inv_t, s.propose_inv_t) == (plain.summary_inv_t, plain.propose_inv_t) and s.propose_inv_t > 0
        assert sample(x, p, s) == int(np.argmax(x))
        on = Sampler(SamplingParams(temperature=0.7, **kw), len(x))
        assert on.summary_inv_t == 0.0 and on.propose_inv_t == 0.0   # no fast path, no summary


def test_parameters_are_checked():
    for bad in (dict(typical_p=0.0), dict(typical_p=1.5), dict(tfs_z=-0.1), dict(tfs_z=float("nan")),
                dict(mirostat_mode=3), dict(mirostat_mode=True), dict(mirostat_mode=1.0),
                dict(mirostat_tau=-1.0), dict(mirostat_eta=-0.5), dict(mirostat_eta="0.1")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)
    assert SamplingParams(mirostat_mode=np.int64(2)).mirostat_mode == 2


# ---------------------------------------------------------------- Mirostat

def ref_mirostat(x, t, tau, eta, mu, u, n_vocab, m=100):
    """llama.cpp's Mirostat step (float64): (token, new mu)."""
    ids, p = ref_sorted(x, t)
    sum_tb = sum_tt = 0.0
    for i in range(min(m - 1, len(p) - 1)):
        ti = math.log((i + 2) / (i + 1))
        sum_tb += ti * math.log(p[i] / p[i + 1])
        sum_tt += ti * ti
    s_hat = sum_tb / sum_tt
    eps = s_hat - 1
    k = ((eps * 2 ** mu) / (1 - n_vocab ** -eps)) ** (1 / s_hat)
    k = max(int(k), 1)
    q = p[:k] / p[:k].sum()
    j = ref_draw(q, u)
    return int(ids[j]), mu - eta * (-math.log2(q[j]) - tau)


def ref_mirostat2(x, t, tau, eta, mu, u):
    ids, p = ref_sorted(x, t)
    keep = next((i for i, v in enumerate(p) if -math.log2(v) > mu), len(p)) or 1
    q = p[:keep] / p[:keep].sum()
    j = ref_draw(q, u)
    return int(ids[j]), mu - eta * (-math.log2(q[j]) - tau)


def test_mirostat2_by_hand():
    """Two tokens of probabilities 3/4 and 1/4: mu starts at 2 tau = 10, both are kept (surprises
    0.415 and 2 bits), the draw's surprise moves mu by eta (tau - surprise)."""
    x = np.array([0.0, -math.log(3.0)], np.float32)
    p = SamplingParams(temperature=1.0, mirostat_mode=2, mirostat_tau=5.0, mirostat_eta=0.1, seed=3)
    s = Sampler(p, 2)
    assert s.extra.mu == 10.0
    us = np.random.default_rng(3).random(4)
    mu = 10.0
    for u in us:
        tok = sample(x, p, s)
        assert tok == (0 if u < 0.75 else 1)
        mu -= 0.1 * (-math.log2(0.75 if tok == 0 else 0.25) - 5.0)
        assert s.extra.mu == pytest.approx(mu, abs=1e-6)
    # mu below the best token's surprise: only the best is kept (surprise 0 renormalized)
    s.extra.mu = 0.1
    assert sample(x, p, s) == 0 and s.extra.mu == pytest.approx(0.1 + 0.5)


@pytest.mark.parametrize("mode", [1, 2])
def test_mirostat_steps_match_the_reference(mode):
    rng = np.random.default_rng(8)
    n = 3000
    tau, eta, t = 3.0, 0.3, 0.8
    p = SamplingParams(temperature=t, mirostat_mode=mode, mirostat_tau=tau, mirostat_eta=eta, seed=21)
    s = Sampler(p, n)
    us = np.random.default_rng(21).random(12)
    mu = 2 * tau
    for u in us:
        x = (rng.standard_normal(n) * 2.5).astype(np.float32)
        want, mu = (ref_mirostat(x, t, tau, eta, mu, u, n) if mode == 1 else ref_mirostat2(x, t, tau, eta, mu, u))
        assert sample(x, p, s) == want
        assert s.extra.mu == pytest.approx(mu, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("tau", [2.0, 4.0])
def test_mirostat_average_surprise_approaches_tau(mode, tau):
    """On Zipf-like logits (p_i ~ i^-1.1, shuffled, with noise every step) the observed surprise
    averages tau once mu has settled."""
    rng = np.random.default_rng(4)
    n = 5000
    base = -1.1 * np.log(np.arange(1, n + 1))
    p = SamplingParams(temperature=1.0, mirostat_mode=mode, mirostat_tau=tau, mirostat_eta=0.1, seed=9)
    s = Sampler(p, n)
    seen = []
    for step in range(2500):
        x = (rng.permutation(base) + 0.3 * rng.standard_normal(n)).astype(np.float32)
        sample(x, p, s)
        if step >= 500:
            seen.append(s.extra.last_surprise)
    assert abs(np.mean(seen) - tau) < 0.2, (np.mean(seen), tau)


def test_mirostat_k_at_its_limits():
    s = Sampler(SamplingParams(temperature=1.0, mirostat_mode=1, seed=0), 1000)
    flat = np.zeros(1000, np.float32)        # s_hat = 0: k from the limit
    assert 0 <= sample(flat, s.params, s) < 1000
    s.extra.mu = 5000.0                      # 2^mu overflows: every candidate
    assert 0 <= sample(np.linspace(0, -3, 1000).astype(np.float32), s.params, s) < 1000
    one = np.full(1000, -np.inf, np.float32)
    one[17] = 0.0
    assert sample(one, s.params, s) == 17


def test_seeded_runs_repeat():
    rng = np.random.default_rng(1)
    xs = [(rng.standard_normal(4000) * 3).astype(np.float32) for _ in range(30)]
    for kw in (dict(typical_p=0.8), dict(tfs_z=0.9), dict(mirostat_mode=1), dict(mirostat_mode=2)):
        runs = []
        for _ in range(2):
            p = SamplingParams(temperature=0.9, seed=123, **kw)
            s = Sampler(p, 4000)
            runs.append([sample(x, p, s) for x in xs])
        assert runs[0] == runs[1] and len(set(runs[0])) > 1, kw


# ---------------------------------------------------------------- on a model: hooks, grammars, batching

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def llm(smollm_path):
    with pydecode.load(smollm_path, n_ctx=512, n_threads=2, n_seq=3) as m:
        yield m


def test_extra_stages_generate_and_repeat(llm):
    for kw in (dict(typical_p=0.9), dict(tfs_z=0.95), dict(mirostat_mode=1), dict(mirostat_mode=2, mirostat_tau=4.0)):
        a = llm.generate(PROMPT, 16, temperature=0.9, seed=5, **kw)
        b = llm.generate(PROMPT, 16, temperature=0.9, seed=5, **kw)
        assert a.tokens == b.tokens and a.tokens, kw
        assert llm.generate(PROMPT, 8, temperature=0.0, **kw).tokens == llm.generate(PROMPT, 8).tokens
    with pytest.raises(ValueError, match="typical_p"):
        llm.generate(PROMPT, 4, temperature=0.9, typical_p=2.0)


def test_processor_bans_and_forces(llm):
    greedy = llm.generate(PROMPT, 12)
    banned = set(greedy.tokens[:3])

    def ban(ids, scores):
        scores[list(banned)] = -np.inf
        return scores

    for kw in ({}, dict(temperature=0.8, top_k=40, seed=1), dict(temperature=0.9, mirostat_mode=2, seed=2)):
        c = llm.generate(PROMPT, 12, logits_processor=ban, **kw)
        assert not banned & set(c.tokens), kw
    force = llm.tokenize(" blue", add_special=False)[0]

    def only(ids, scores):
        out = np.full_like(scores, -np.inf)
        out[force] = 0.0
        return out

    c = llm.generate(PROMPT, 7, logits_processor=[ban, only], temperature=0.7, seed=3)
    assert c.tokens == [force] * 7 and c.finish_reason == "length"


def test_processor_sees_the_prompt_and_the_tokens_so_far(llm):
    calls = []

    def spy(ids, scores):
        assert ids.dtype == np.intc and scores.dtype == np.float32 and scores.shape == (llm.model.n_vocab,)
        calls.append((ids.copy(), scores.copy()))
        return scores

    prompt = llm.tokenize(PROMPT)
    c = llm.generate(PROMPT, 10, logits_processor=spy)
    assert c.tokens == llm.generate(PROMPT, 10).tokens    # an identity processor changes nothing
    assert len(calls) == len(c.tokens) + (c.finish_reason == "stop")   # (an end token: chosen, not emitted)
    for i, (ids, scores) in enumerate(calls):
        assert ids.tolist() == prompt + c.tokens[:i]
        assert int(np.argmax(scores)) == c.tokens[i]


def test_a_processor_turns_the_model_summary_off(llm, monkeypatch):
    asked = []
    orig = type(llm.model).set_summary
    monkeypatch.setattr(type(llm.model), "set_summary", lambda self, v: (asked.append(v), orig(self, v))[1])
    llm.generate(PROMPT, 6, temperature=0.8, top_k=40, seed=1)
    assert any(v > 0 for v in asked)        # (the sampler would read one)
    asked.clear()
    llm.generate(PROMPT, 6, temperature=0.8, top_k=40, seed=1, logits_processor=lambda i, s: s)
    llm.generate(PROMPT, 6, temperature=0.8, typical_p=0.9, seed=1)
    assert not any(v > 0 for v in asked)


def test_stopping_criteria_stop_before_the_token(llm):
    greedy = llm.generate(PROMPT, 12)
    n_prompt = len(llm.tokenize(PROMPT))
    seen = []

    def at_four(ids, logits):
        seen.append((len(ids), int(np.argmax(logits))))
        return len(ids) == n_prompt + 4

    c = llm.generate(PROMPT, 12, stopping_criteria=[lambda ids, logits: False, at_four])
    assert c.tokens == greedy.tokens[:4] and c.finish_reason == "stop" and c.stop_detail == "stopping_criteria"
    assert seen == [(n_prompt + i, greedy.tokens[i]) for i in range(5)]   # raw logits, ids before the token
    assert c.text == llm.detokenize(greedy.tokens[:4])
    pieces = list(llm.stream(PROMPT, 12, stopping_criteria=at_four))
    assert [p.token for p in pieces if p.token >= 0] == greedy.tokens[:4]


def test_hook_errors_reach_the_caller_and_the_engine_goes_on(llm):
    want = llm.generate(PROMPT, 6).tokens

    def boom(ids, scores):
        raise RuntimeError("processor failed")

    bads = [(boom, RuntimeError, "processor failed"),
            (lambda i, s: s[:10], TypeError, "logits_processor.*shape"),
            (lambda i, s: s.tolist(), TypeError, "logits_processor.*numpy float array"),
            (lambda i, s: s.astype(np.int32), TypeError, "logits_processor"),
            (lambda i, s: np.full_like(s, np.nan), ValueError, "logits_processor.*NaN"),
            (lambda i, s: np.full_like(s, -np.inf), ValueError, "logits_processor.*-inf")]
    for f, kind, msg in bads:
        with pytest.raises(kind, match=msg):
            llm.generate(PROMPT, 6, logits_processor=f)
        assert llm.generate(PROMPT, 6).tokens == want
    with pytest.raises(ZeroDivisionError):
        llm.generate(PROMPT, 6, stopping_criteria=lambda i, l: 1 / 0)
    for bad in ("not callable", [len, 3]):
        with pytest.raises(TypeError, match="logits_processor"):
            llm.stream(PROMPT, 6, logits_processor=bad)
        with pytest.raises(TypeError, match="stopping_criteria"):
            llm.stream(PROMPT, 6, stopping_criteria=bad)
    assert llm.engine.n_active == 0 and llm.generate(PROMPT, 6).tokens == want


def test_grammar_holds_with_the_extra_stages(llm):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    ask = [{"role": "user", "content": "Describe a person as JSON."}]
    for kw in (dict(mirostat_mode=2, mirostat_tau=5.0), dict(mirostat_mode=1), dict(typical_p=0.8),
               dict(tfs_z=0.9, typical_p=0.95), dict(logits_processor=lambda i, s: s * 0.5)):
        for seed in (1, 2):
            c = llm.chat(ask, 80, temperature=1.0, seed=seed, json_schema=schema, **kw)
            v = json.loads(c.text)   # (complete, or closed within max_tokens: valid either way)
            assert isinstance(v["name"], str) and isinstance(v["age"], int)
        c = llm.generate("Q: a date?\nA:", 20, temperature=1.2, seed=4, regex=r"\d{4}-\d\d-\d\d", **kw)
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", c.text), (kw, c.text)


def test_extra_stage_draws_only_allowed_tokens_exactly():
    """Under a mask, the chain runs over the allowed tokens as if the others were -inf."""
    from pydecode import _core
    rng = np.random.default_rng(6)
    n = 700
    x = (rng.standard_normal(n) * 2).astype(np.float32)
    allowed = rng.random(n) < 0.3
    words = np.zeros((n + 31) // 32, np.uint32)
    for i in np.flatnonzero(allowed):
        words[i >> 5] |= np.uint32(1 << (i & 31))
    mask = _core.ffi.cast("uint32_t *", words.ctypes.data)

    class Masker:   # what sample_masked needs of a Constraint
        def masked_logits(self, logits, mask):
            return np.where(allowed, logits, -np.inf).astype(np.float32)

    for kw in (dict(typical_p=0.7), dict(tfs_z=0.9), dict(mirostat_mode=2)):
        p = SamplingParams(temperature=0.8, seed=2, **kw)
        a, b = Sampler(p, n), Sampler(p, n)
        masked = np.where(allowed, x, -np.inf).astype(np.float32)
        got = [a.sample_masked(x, mask, Masker()) for _ in range(300)]
        assert all(allowed[t] for t in got)
        assert got == [sample(masked, p, b) for _ in range(300)]


def test_each_sequence_has_its_own_processor(llm):
    words = [" red", " green", " blue"]
    ids = [llm.tokenize(w, add_special=False)[0] for w in words]

    def forcing(t):
        def f(_, scores):
            out = np.full_like(scores, -np.inf)
            out[t] = 0.0
            return out
        return f

    handles = [llm.engine.submit(PROMPT, 5, logits_processor=forcing(t)) for t in ids]
    outs = [h.result() for h in handles]
    assert [o.tokens for o in outs] == [[t] * 5 for t in ids]

    # two generate_batch calls at once (3 sequences in the same steps), each with its processor
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(llm.generate_batch, ["The sky is", "Grass is"], 6, logits_processor=forcing(ids[0]))
        b = pool.submit(llm.generate_batch, [PROMPT], 6, logits_processor=forcing(ids[2]), temperature=0.9, seed=1)
        assert [c.tokens for c in a.result()] == [[ids[0]] * 6] * 2
        assert [c.tokens for c in b.result()] == [[ids[2]] * 6]

    prompts = ["The sky is", "Grass is", PROMPT]
    seen = []

    def record(input_ids, scores):
        seen.append(input_ids.tolist())
        scores[ids[0]] = -np.inf
        return scores

    batch = llm.generate_batch(prompts, 8, logits_processor=record, temperature=0.8, seed=3)
    alone = [llm.generate(p, 8, logits_processor=lambda i, s: (s.__setitem__(ids[0], -np.inf), s)[1],
                          temperature=0.8, seed=3) for p in prompts]
    assert [c.tokens for c in batch] == [c.tokens for c in alone]
    for p, c in zip(prompts, batch):
        toks = llm.tokenize(p)
        calls = len(c.tokens) + (c.finish_reason == "stop")
        mine = [x for x in seen if x[:len(toks)] == toks]
        assert mine == [toks + c.tokens[:i] for i in range(calls)]


# ---------------------------------------------------------------- speculative decoding

COPY = ("def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n\n"
        "# The same two functions again, unchanged:\ndef area(w, h):\n")


def test_lookup_drafts_change_nothing_a_processor_sees(smollm_path, monkeypatch):
    monkeypatch.setattr(speculative.Tuner, "choose", lambda self, k_max, base=1, key=None: k_max)
    vocab = {}

    def recorder(log):
        def f(ids, scores):
            log.append((ids.copy(), scores.copy()))
            scores[vocab["banned"]] -= 3.0 * (len(ids) % 2)   # depends on the position: must be the same
            return scores
        return f

    with pydecode.load(smollm_path, n_ctx=512, n_threads=2, draft="lookup") as llm:
        vocab["banned"] = llm.tokenize("    return", add_special=False)[:1]
        runs = {}
        for k in (0, None):
            log = []
            c = llm.generate(COPY, 40, logits_processor=recorder(log), draft_tokens=k)
            runs[k] = (c, log)
        for kw in (dict(temperature=0.8, top_k=40, seed=7), dict(temperature=0.9, mirostat_mode=2, seed=7),
                   dict(temperature=0.9, typical_p=0.9, seed=8)):
            a = llm.generate(COPY, 30, draft_tokens=0, logits_processor=lambda i, s: s, **kw)
            b = llm.generate(COPY, 30, logits_processor=lambda i, s: s, **kw)
            assert a.tokens == b.tokens, kw
    (plain, plain_log), (drafted, drafted_log) = runs[0], runs[None]
    assert drafted.stats.accepted_tokens > 0 and plain.stats.draft_tokens == 0
    assert drafted.tokens == plain.tokens and drafted.text == plain.text
    assert len(drafted_log) == len(plain_log) == len(plain.tokens) + (plain.finish_reason == "stop")
    for (ia, sa), (ib, sb) in zip(plain_log, drafted_log):
        assert ia.tolist() == ib.tolist()
        np.testing.assert_array_equal(sa, sb)


# ---------------------------------------------------------------- the HTTP server's fields

def test_server_fields_map_and_are_checked():
    from pydecode.server import params
    from pydecode.server.params import APIError
    g = params.generation({"typical_p": 0.9, "mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2,
                           "tfs_z": 0.95}, chat=False, default_max_tokens=16)
    s = g.sampling
    got = tuple(s[k] for k in ("typical_p", "mirostat_mode", "mirostat_tau", "mirostat_eta", "tfs_z"))
    assert got == (0.9, 2, 4.0, 0.2, 0.95)
    SamplingParams(**{k: v for k, v in s.items() if k != "logit_bias"})
    assert params.generation({"typical_p": 1.5}, chat=True, default_max_tokens=None).sampling["typical_p"] == 1.0
    for body, field in (({"mirostat": 3}, "mirostat"), ({"mirostat": "2"}, "mirostat"), ({"typical_p": 0}, "typical_p"),
                        ({"typical_p": "x"}, "typical_p"), ({"mirostat_tau": -1}, "mirostat_tau"),
                        ({"mirostat_eta": None, "mirostat_tau": [1]}, "mirostat_tau"), ({"tfs_z": -2}, "tfs_z")):
        with pytest.raises(APIError) as e:
            params.generation(body, chat=False, default_max_tokens=16)
        assert e.value.status == 400 and e.value.param == field, body


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    from tiny_models import tiny_server as serve

    yield from serve(tmp_path_factory, n_ctx=256)


def test_server_routes_sample_with_them(tiny_server):
    llm, client = tiny_server
    body = {"prompt": "abc", "n_predict": 8, "temperature": 0.9, "seed": 3, "mirostat": 2, "mirostat_tau": 3.0,
            "typical_p": 0.9}
    r = client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    b = r.json()
    gs = b["generation_settings"]
    assert gs["mirostat"] == 2 and gs["mirostat_tau"] == 3.0 and gs["typical_p"] == 0.9
    assert gs["samplers"][-1] == "mirostat_v2"
    want = llm.generate(llm.tokenize("abc"), 8, temperature=0.9, seed=3, mirostat_mode=2, mirostat_tau=3.0,
                        typical_p=0.9)
    assert b["content"] == want.text
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 8, "temperature": 0.9, "seed": 3,
                                             "typical_p": 0.8, "tfs_z": 0.9})
    assert r.status_code == 200, r.text
    want = llm.generate("abc", 8, temperature=0.9, seed=3, typical_p=0.8, tfs_z=0.9,
                        top_k=40, top_p=0.95, min_p=0.05)   # (and the server's defaults)
    assert r.json()["choices"][0]["text"] == want.text
    for path, bad, field in (("/completion", {"mirostat": 5}, "mirostat"),
                             ("/v1/chat/completions", {"typical_p": -1}, "typical_p")):
        req = {"prompt": "abc", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **bad}
        r = client.post(path, json=req)
        assert r.status_code == 400 and field in r.text, r.text
