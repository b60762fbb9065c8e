"""Speculative decoding (pydecode/speculative.py): the same tokens as plain decoding, faster.

Greedy and seeded sampled runs with a drafter must equal plain decoding token for token (the
verification pass is bit-identical to one-token steps, and the drafts are verified with the
sequence's own sampler); the acceptance rule must preserve the target's distribution (a
chi-square test on scripted logits); the cache after rejected drafts must equal a recompute,
sliding-window rings included; stops inside an accepted run cut where plain decoding does.
"""
import numpy as np
import pytest

import pydecode
from pydecode import speculative
from pydecode.errors import ModelError
from pydecode.generation import TokenPolicy
from pydecode.registry import model_path
from pydecode.sampling import SamplingParams
from tiny_models import write_tiny_model

CACHE_ATOL = 5e-3
# Output that copies its prompt (lookup drafts are accepted) and prose (they mostly are not).
COPY = ("def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n\n"
        "# The same two functions again, unchanged:\ndef area(w, h):\n")
PROSE = "Once upon a time, in a small village by the sea, there lived"


def plain_and_drafted(path, prompt, draft, max_tokens=40, n_ctx=512, **kw):
    with pydecode.load(path, n_ctx=n_ctx, n_threads=2) as llm:
        plain = llm.generate(prompt, max_tokens, **kw)
    with pydecode.load(path, n_ctx=n_ctx, n_threads=2, draft=draft) as llm:
        drafted = llm.generate(prompt, max_tokens, **kw)
    return plain, drafted


# ---------------------------------------------------------------- the same tokens


@pytest.fixture
def every_guess(monkeypatch):
    """Every proposal verified in full. The Tuner's choice depends on the CPU's speed at the
    moment (under the sanitizers, or beside other load, it drafts less), so tests that need
    drafts to be made, accepted and rejected take this instead of timing."""
    monkeypatch.setattr(speculative.Tuner, "choose", lambda self, k_max, base=1, key=None: k_max)


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"])
def test_lookup_greedy_equals_plain(name, every_guess):
    path = model_path(name)
    with pydecode.load(path, n_ctx=512, n_threads=2) as llm:
        plain = [llm.generate(p, 40) for p in (COPY, PROSE)]
    with pydecode.load(path, n_ctx=512, n_threads=2, draft="lookup") as llm:
        got = [llm.generate(p, 40) for p in (COPY, PROSE)]
        streamed = list(llm.stream(COPY, 40))
        off = llm.generate(COPY, 40, draft_tokens=0)
    for a, b in zip(plain, got):
        assert b.tokens == a.tokens and b.text == a.text and b.finish_reason == a.finish_reason
    assert [p.token for p in streamed if p.token >= 0] == plain[0].tokens
    assert got[0].stats.accepted_tokens > 0                         # drafts were accepted ...
    assert got[0].stats.draft_tokens > got[0].stats.accepted_tokens or \
        got[1].stats.draft_tokens > got[1].stats.accepted_tokens   # ... and rejected
    assert got[0].stats.tokens_per_pass > 1.0
    assert off.tokens == plain[0].tokens and off.stats.draft_tokens == 0


def test_draft_model_greedy_equals_plain():
    """Qwen2.5-Coder-1.5B drafted by the 0.5B (same vocabulary), and by lookup, through generate
    and chat."""
    target, draft = model_path("qwen2.5-coder-1.5b"), model_path("qwen2.5-coder-0.5b")
    code = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    msgs = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    with pydecode.load(target, n_ctx=512, n_threads=2) as llm:
        plain = [llm.generate(code, 32), llm.generate(PROSE, 16), llm.chat(msgs, 24)]
    with pydecode.load(target, n_ctx=512, n_threads=2, draft=draft) as llm:
        got = [llm.generate(code, 32), llm.generate(PROSE, 16), llm.chat(msgs, 24)]
    with pydecode.load(target, n_ctx=512, n_threads=2, draft="lookup") as llm:   # and by lookup
        looked = [llm.generate(code, 32), llm.generate(PROSE, 16), llm.chat(msgs, 24)]
    for a, b, c in zip(plain, got, looked):
        assert b.tokens == a.tokens and b.finish_reason == a.finish_reason
        assert c.tokens == a.tokens and c.finish_reason == a.finish_reason
    assert sum(c.stats.accepted_tokens for c in got) > 0


def test_seeded_sampling_equals_plain(every_guess):
    """The drafts are checked with the sequence's own sampler, uniform after uniform: a seeded
    sampled run gives the tokens plain decoding gives."""
    path = model_path("smollm2-135m")
    kw = dict(temperature=0.8, top_k=40, top_p=0.95, seed=1234, repeat_penalty=1.05)
    plain, drafted = plain_and_drafted(path, COPY, "lookup", 48, **kw)
    assert drafted.tokens == plain.tokens and drafted.stats.draft_tokens > 0


def test_engine_batches_drafts_with_other_sequences():
    path = model_path("smollm2-135m")
    prompts = [COPY, PROSE, COPY + "    return"]
    with pydecode.load(path, n_ctx=512, n_threads=2) as llm:
        plain = [llm.generate(p, 32) for p in prompts]
    with pydecode.load(path, n_ctx=512, n_threads=2, n_seq=3, draft="lookup") as llm:
        got = llm.generate_batch(prompts, 32)
    assert [c.tokens for c in got] == [c.tokens for c in plain]
    assert sum(c.stats.accepted_tokens for c in got) > 0


def test_draft_model_drafts_for_every_sequence_of_a_batch():
    """SmolLM2 drafting for itself (the same greedy choices: everything is accepted) over three
    sequences at once, the draft's slots growing with the target's; then a stream."""
    path = model_path("smollm2-135m")
    prompts = [PROSE, "The capital of France is", "def fib(n):"]
    with pydecode.load(path, n_ctx=512, n_threads=2) as llm:
        plain = [llm.generate(p, 24) for p in prompts]
    with pydecode.load(path, n_ctx=512, n_threads=2, draft=path) as llm:
        got = llm.generate_batch(prompts, 24)
        streamed = [p.token for p in llm.stream(prompts[0], 24) if p.token >= 0]
    assert [c.tokens for c in got] == [c.tokens for c in plain]
    assert streamed == plain[0].tokens
    assert all(c.stats.acceptance_rate > 0.9 for c in got), [c.stats for c in got]


# ---------------------------------------------------------------- stops inside an accepted run



def test_stops_inside_a_drafted_run_cut_where_plain_does(every_guess):
    path = model_path("smollm2-135m")
    with pydecode.load(path, n_ctx=512, n_threads=2) as llm:
        ref = llm.generate(COPY, 24)
    stop = llm.detokenize(ref.tokens[5:8])       # a stop string spanning drafted tokens
    n_prompt = len(pydecode.load(path, n_ctx=64, n_threads=1).tokenize(COPY))
    cases = [dict(max_tokens=24, stop=stop), dict(max_tokens=7), dict(max_tokens=24, n_ctx=n_prompt + 9)]
    for case in cases:
        n_ctx = case.pop("n_ctx", 512)
        plain, drafted = plain_and_drafted(path, COPY, "lookup", n_ctx=n_ctx, **case)
        assert (drafted.text, drafted.tokens, drafted.finish_reason, drafted.stop_detail) == \
            (plain.text, plain.tokens, plain.finish_reason, plain.stop_detail), case
        assert drafted.stats.accepted_tokens > 0, case


def test_end_of_generation_inside_a_drafted_run(every_guess):
    """A question asked again: lookup proposes the earlier answer with its end token, and the
    generation ends at that token inside the drafted run, as plain decoding does."""
    path = model_path("smollm2-135m")
    q = "What is the capital of France? Answer in one word."
    msgs = [{"role": r, "content": c} for _ in range(3) for r, c in (("user", q), ("assistant", "Paris."))]
    msgs.append({"role": "user", "content": q})
    with pydecode.load(path, n_ctx=512, n_threads=2) as llm:
        plain = llm.chat(msgs, 48)
    with pydecode.load(path, n_ctx=512, n_threads=2, draft="lookup") as llm:
        llm.generate("Hi", 6)     # the engine's first one-token steps run plain (they calibrate it)
        got = llm.chat(msgs, 48)
    assert plain.finish_reason == "stop" and "end-of-generation" in plain.stop_detail
    assert (got.tokens, got.text, got.stop_detail) == (plain.tokens, plain.text, plain.stop_detail)
    assert got.stats.accepted_tokens > 0 and got.stats.draft_tokens > got.stats.accepted_tokens


# ---------------------------------------------------------------- the cache after rejections


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_cache_after_rejections_equals_recompute(tmp_path, arch, every_guess):
    """Past the sliding window (4) of a tiny gemma3: rejected drafts overwrite ring rows that
    no later query reads. The slot's cache, then one more step, equals a fresh prefill."""
    path = tmp_path / f"{arch}.gguf"
    write_tiny_model(path, arch)
    prompt = [1, 5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8, 5, 6]
    kw = dict(temperature=10.0, seed=5)      # a random model's greedy text loops: sample, for rejections
    with pydecode.load(path, n_ctx=96, n_threads=2) as llm:
        plain = llm.generate(prompt, 40, **kw)
    with pydecode.load(path, n_ctx=96, n_threads=2, draft="lookup") as llm:
        got = llm.generate(prompt, 40, **kw)
        assert got.tokens == plain.tokens
        st = got.stats
        assert st.draft_tokens > st.accepted_tokens, "no draft was rejected: the test needs rejections"
        held = llm.model.slots.held(0)
        assert held == prompt + got.tokens[:-1]
        again = llm.generate(prompt + got.tokens[:10], 8, **kw)   # the ledger reuses what is still valid
        with pydecode.load(path, n_ctx=96, n_threads=2) as ref:
            assert again.tokens == ref.generate(prompt + got.tokens[:10], 8, **kw).tokens
    # the recompute check on a slot filled by a drafted run
    with pydecode.load(path, n_ctx=96, n_threads=2, draft="lookup") as llm:
        got = llm.generate(prompt, 30, **kw)
        assert got.stats.draft_tokens > got.stats.accepted_tokens
        seq = prompt + got.tokens
        m = llm.model
        cached = m.decode_step(seq[-1], len(seq) - 1).copy()
        fresh = pydecode.Model(path, n_ctx=96, n_threads=2).prefill(seq).copy()
        assert np.abs(cached - fresh).max() <= CACHE_ATOL


# ---------------------------------------------------------------- the acceptance rule


class _Tok:
    """The least a TokenPolicy needs of a tokenizer (no text: ids only)."""
    eog_ids = frozenset()

    def decoder(self, skip_special=True):
        class D:
            feed = staticmethod(lambda t: "")
            flush = staticmethod(lambda: "")
        return D()

    def decode(self, ids):
        return ""


def test_speculative_sampling_preserves_the_distribution():
    """Scripted logits over 8 tokens, a deliberately unlikely draft: over 20 000 seeded passes,
    the first token emitted follows the target's distribution p (chi-square, 7 degrees of
    freedom, significance 0.001: statistic < 24.32), the draft is accepted at rate p(draft), and
    the token after an accepted draft follows the second row's distribution."""
    rng = np.random.default_rng(7)
    rows = rng.normal(0, 1.2, (2, 8)).astype(np.float32)
    t = 0.9
    p = [np.exp(r / t) / np.exp(r / t).sum() for r in rows]
    wrong = int(np.argmin(p[0]))
    n = 20000
    first, second = np.zeros(8), np.zeros(8)
    for seed in range(n):
        pol = TokenPolicy(_Tok(), 8, 64, [0], 4, SamplingParams(temperature=t, seed=seed))
        pieces, used, rejected = speculative.accept_run(pol, rows, [0, wrong], 1)
        first[pol.tokens[0]] += 1
        if used == 2:
            second[pol.tokens[1]] += 1
        assert rejected == (pol.tokens[0] != wrong)
    chi = ((first - n * p[0]) ** 2 / (n * p[0])).sum()
    assert chi < 24.32, (chi, first / n, p[0])
    assert abs(first[wrong] / n - p[0][wrong]) < 4 * np.sqrt(p[0][wrong] / n) + 1e-3
    m = second.sum()
    assert m == first[wrong]
    if m >= 200:
        chi2 = ((second - m * p[1]) ** 2 / (m * p[1])).sum()
        assert chi2 < 24.32 or (second / m - p[1]).__abs__().max() < 0.05


# ---------------------------------------------------------------- pieces


def test_prompt_lookup_proposes_what_followed_the_latest_ngram():
    look = speculative.PromptLookup()
    ctx = [1, 2, 3, 4, 5, 9, 9, 2, 3]
    assert look.propose(ctx, 3) == ([4, 5, 9], 2)   # (tokens, the n-gram length that matched)
    ctx += [4, 7, 2, 3, 4]
    assert look.propose(ctx, 2) == ([7, 2], 3)      # the latest earlier occurrence of (2, 3, 4)
    assert speculative.PromptLookup().propose([8], 4) == ([], 0)
    assert speculative.PromptLookup().propose([5, 6, 5], 4) == ([6, 5], 1)


def test_tuner_steps_aside_when_drafts_do_not_pay():
    costs = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 1.6, 6: 1.7, 8: 2.0, 10: 2.4, 13: 3.0, 17: 3.8}
    good = speculative.Tuner(costs, 0.0, prior=0.9)
    assert good.choose(16) >= 3
    bad = speculative.Tuner(costs, 0.4, prior=0.05)
    picks = [bad.choose(16) for _ in range(16)]
    assert picks.count(0) >= 14 and set(picks) <= {0, 1}     # plain, with a rare one-token probe
    by_match = speculative.Tuner(costs, 0.0, speculative.lookup_prior)   # acceptance kept per key
    for _ in range(10):
        by_match.update(3, 3, False, key=4)
        by_match.update(2, 0, True, key=1)
    assert by_match.choose(16, key=4) >= 3 and by_match.acceptance(1) < 0.1
    assert speculative.cost_at(costs, 7) == pytest.approx(1.85)
    assert speculative.cost_at(costs, 21) == pytest.approx(3.8 + 0.2 * 4)


def test_bad_draft_arguments_are_clear_errors(tmp_path):
    smol = model_path("smollm2-135m")
    write_tiny_model(tmp_path / "t.gguf", "llama")
    with pytest.raises(ModelError, match="vocabulary"):
        pydecode.load(smol, n_ctx=64, n_threads=1, draft=tmp_path / "t.gguf")
    with pytest.raises(TypeError, match="draft"):
        pydecode.load(smol, n_ctx=64, n_threads=1, draft=3)
    with pydecode.load(smol, n_ctx=64, n_threads=1, draft="lookup") as llm:
        for bad in (-1, 17, 2.5, "4"):
            with pytest.raises(ValueError, match="draft_tokens"):
                llm.generate("Hi", 4, draft_tokens=bad)


# ---------------------------------------------------------------- the command line


def _cli(*args, input=None):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "pydecode.cli", *args], capture_output=True, text=True,
                          timeout=300, input=input)


def test_cli_run_chat_and_bench_take_a_drafter(smollm_path):
    import json
    plain = _cli("run", str(smollm_path), COPY, "-n", "24", "--json")
    drafted = _cli("run", str(smollm_path), COPY, "-n", "24", "--json", "--draft", "lookup")
    assert plain.returncode == 0 and drafted.returncode == 0, drafted.stderr
    a, b = json.loads(plain.stdout), json.loads(drafted.stdout)
    assert a["tokens"] == b["tokens"] and b["stats"]["draft_tokens"] > 0 and b["stats"]["tokens_per_pass"] > 1
    r = _cli("run", str(smollm_path), COPY, "-n", "16", "--draft", "lookup")
    assert r.returncode == 0 and "accepted" in r.stderr and "tokens/pass" in r.stderr, r.stderr
    r = _cli("chat", str(smollm_path), "-n", "16", "--draft", "lookup", input="Say hello.\n")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = _cli("run", str(smollm_path), "Hi", "-n", "4", "--draft", "no-such-model")
    assert r.returncode != 0 and "no-such-model" in r.stderr and "Traceback" not in r.stderr
    r = _cli("bench", str(smollm_path), "-t", "1", "-r", "1", "-n", "8", "--draft", "lookup")
    assert r.returncode == 0, r.stderr
    assert "| rewrite |" in r.stdout and "| prose |" in r.stdout and "tokens/pass" in r.stdout


def test_llama_compat_takes_llama_cpp_pythons_prompt_lookup(smollm_path):
    from pydecode import Llama, LlamaPromptLookupDecoding
    plain = Llama(model_path=str(smollm_path), n_ctx=512, verbose=False)
    drafted = Llama(model_path=str(smollm_path), n_ctx=512, verbose=False,
                    draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))
    a = plain(COPY, max_tokens=24, temperature=0.0)
    b = drafted(COPY, max_tokens=24, temperature=0.0)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    with pytest.raises(TypeError, match="draft_model"):
        Llama(model_path=str(smollm_path), verbose=False, draft_model="lookup")
