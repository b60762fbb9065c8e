"""Context shift (llama-server's --context-shift): a full context drops n_discard tokens after the
first n_keep and goes on. The cache then holds exactly what a prompt of the remaining tokens
would: every token after a shift equals (tokens and log-probabilities) a fresh generation from
the shifted context, which `contexts` below replays independently of the Engine. Checked alone,
batched, with a lookup and a model drafter, on a sliding-window ring, with structured output,
through state files, and over HTTP."""
import json

import httpx
import numpy as np
import pytest

import pydecode
from pydecode import Engine, speculative

from serving import Server

N_CTX = 64
PROMPT = "Once upon a time, in a land far away, there lived a"
ATOL = 1e-4
TIMEOUT = 120


def contexts(prompt, tokens, n_ctx, n_keep, n_discard=0):
    """The context each generated token was chosen after, by llama-server's rule: once the next
    token has no position left, n_discard (default: half) of the tokens after the first n_keep
    (capped at n_ctx - 4) are dropped."""
    ctx, out = list(prompt), []
    for t in tokens:
        out.append(list(ctx))
        ctx.append(t)
        if len(ctx) > n_ctx:
            keep = min(n_keep, n_ctx - 4)
            left = len(ctx) - keep
            drop = min(n_discard or left // 2, left - 1)
            ctx = ctx[:keep] + ctx[keep + drop:]
    return out, ctx


def check_against_recompute(fresh, prompt, c, n_ctx, n_keep, n_discard=0, lp_atol=ATOL):
    """Each stretch between shifts equals a fresh greedy generation from its first context."""
    ctxs, final = contexts(prompt, c.tokens, n_ctx, n_keep, n_discard)
    starts = [0] + [i for i in range(1, len(ctxs)) if ctxs[i][:-1] != ctxs[i - 1]]
    assert len(starts) > 1, "the test never shifted"
    dropped = sum(len(ctxs[i - 1]) + 1 - len(ctxs[i]) for i in starts[1:])
    assert c.stats.shifted == dropped
    for a, b in zip(starts, starts[1:] + [len(ctxs)]):
        ref = fresh.engine.submit(ctxs[a], b - a, logprobs=3, ignore_eos=True).result(TIMEOUT)
        assert ref.tokens == c.tokens[a:b], (a, b)
        if c.logprobs is not None:
            for (t, lp, top), (t2, lp2, top2) in zip(c.logprobs[a:b], ref.logprobs):
                assert t == t2 and abs(lp - lp2) <= lp_atol
                assert [x for x, _ in top] == [x for x, _ in top2]
    return final


@pytest.fixture(scope="module")
def llm(smollm_path):
    with pydecode.load(smollm_path, n_ctx=N_CTX, n_threads=2, n_seq=2) as m:
        yield m


@pytest.fixture(scope="module")
def fresh(smollm_path):
    """Another model on the same file: its slots never saw the shifted runs."""
    with pydecode.load(smollm_path, n_ctx=N_CTX, n_threads=2) as m:
        yield m


@pytest.mark.parametrize("n_keep,n_discard", [(4, 0), (0, 0), (-1, 0), (6, 10)])
def test_shift_equals_a_recompute_of_the_kept_context(llm, fresh, n_keep, n_discard):
    prompt = llm.tokenize(PROMPT)
    c = llm.engine.submit(prompt, 150, logprobs=3, ignore_eos=True, context_shift=True, n_keep=n_keep,
                          n_discard=n_discard).result(TIMEOUT)
    assert c.finish_reason == "length" and len(c.tokens) == 150 and c.stop_detail == "max_tokens=150"
    check_against_recompute(fresh, prompt, c, N_CTX, len(prompt) if n_keep < 0 else n_keep, n_discard)
    # without it the full context ends the generation
    plain = llm.engine.submit(prompt, 150, ignore_eos=True).result(TIMEOUT)
    assert plain.finish_reason == "length" and plain.stop_detail.startswith("context full")
    assert plain.tokens == c.tokens[:len(plain.tokens)] and plain.stats.shifted == 0


def test_generate_and_stream_take_it(llm):
    a = llm.generate(PROMPT, 90, context_shift=True, n_keep=4)
    b = list(llm.stream(PROMPT, 90, context_shift=True, n_keep=4))
    assert a.text == "".join(p.text for p in b) and (a.stats.shifted > 0 or a.finish_reason == "stop")


def test_batched_and_speculative_shifts_equal_alone(llm, smollm_path):
    prompts = [llm.tokenize(PROMPT), llm.tokenize("The three primary colors are red, yellow and")]
    kw = dict(logprobs=3, ignore_eos=True, context_shift=True, n_keep=2)
    alone = [llm.engine.submit(p, 120, **kw).result(TIMEOUT) for p in prompts]
    assert all(c.stats.shifted for c in alone)
    hs = [llm.engine.submit(p, 120, **kw) for p in prompts]   # two slots: one batch
    for h, want in zip(hs, alone):
        got = h.result(TIMEOUT)
        assert got.tokens == want.tokens
        assert all(abs(x[1] - y[1]) <= ATOL for x, y in zip(got.logprobs, want.logprobs))
    m = llm.model
    for draft in ("lookup", speculative.DraftModel(m, smollm_path)):
        e = Engine(m, draft=draft)
        try:
            got = [h.result(TIMEOUT) for h in [e.submit(p, 120, **kw) for p in prompts]]
        finally:
            e.close()
            if draft != "lookup":
                draft.close()
        assert [c.tokens for c in got] == [c.tokens for c in alone], draft
        assert [c.stats.shifted for c in got] == [c.stats.shifted for c in alone]


def test_shift_on_a_sliding_window_ring(tmp_path):
    """Gemma 3's local layers keep a ring of window + n_batch positions: after a shift the ring
    no longer holds the window before the kept prefix's end, so everything is prefilled again."""
    from tiny_models import write_tiny_model

    path = tmp_path / "tiny-gemma3.gguf"
    write_tiny_model(path, "gemma3")   # window 4
    prompt = np.random.default_rng(7).integers(0, 256, 12).tolist()
    with pydecode.LLM(pydecode.Model(path, n_ctx=32, n_threads=1, n_batch=4)) as a, \
            pydecode.LLM(pydecode.Model(path, n_ctx=32, n_threads=1, n_batch=4)) as b:
        c = a.engine.submit(prompt, 60, logprobs=3, ignore_eos=True, context_shift=True, n_keep=8).result(TIMEOUT)
        check_against_recompute(b, prompt, c, 32, 8)


def test_structured_output_survives_shifts(llm):
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    c = llm.generate("Tell a long story as JSON:", 120, json_schema=schema, context_shift=True, n_keep=4)
    assert c.stats.shifted > 0 and isinstance(json.loads(c.text)["story"], str)


def test_the_slot_holds_the_shifted_context(llm, fresh, tmp_path):
    """What a shifted run leaves in its slot is reused by the next prompt that starts with it,
    and saved and restored by state files, all equal to a recompute."""
    prompt = llm.tokenize(PROMPT)
    e = llm.engine
    h = e.submit(prompt, 100, ignore_eos=True, context_shift=True, n_keep=4)
    c = h.result(TIMEOUT)
    _, final = contexts(prompt, c.tokens, N_CTX, 4)
    held = llm.model.slots.held(h.slot)
    assert held == final[:-1]   # the last token was sampled, never decoded
    nxt = held + llm.tokenize(" and then", add_special=False)
    a, b = llm.generate(nxt, 8, logprobs=3), fresh.generate(nxt, 8, logprobs=3)
    assert a.stats.cached_tokens == len(held) and a.tokens == b.tokens
    assert all(abs(x[1] - y[1]) <= ATOL for x, y in zip(a.logprobs, b.logprobs))
    path = tmp_path / "shifted.state"
    h = e.submit(prompt, 100, ignore_eos=True, context_shift=True, n_keep=4)
    h.result(TIMEOUT)
    assert e.save_state(path, h) == len(held)
    assert fresh.engine.load_state(path) == held
    again = fresh.generate(nxt, 8, logprobs=3)
    assert again.stats.cached_tokens == len(held) and again.tokens == b.tokens


def test_bad_parameters_are_refused(llm):
    for kw in ({"context_shift": "yes"}, {"context_shift": True, "n_keep": -2}, {"context_shift": True, "n_discard": -1},
               {"context_shift": True, "n_keep": 1.5}):
        with pytest.raises(ValueError, match="context_shift|n_keep|n_discard"):
            llm.engine.submit(PROMPT, 4, **kw)


# ---------------------------------------------------------------- over HTTP (llama-server's ctx_shift tests)


@pytest.fixture(scope="module")
def srv():
    s = Server("-np", "1", "-c", str(N_CTX), "-t", "2", "--temp", "0", "--context-shift", "--keep", "4").wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.lines)


def test_server_shifts_and_says_truncated(srv, llm):
    ids = llm.tokenize(PROMPT)
    r = httpx.post(srv.url + "/completion", json={"prompt": PROMPT, "n_predict": 96, "ignore_eos": True}, timeout=120)
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["timings"]["predicted_n"] == 96 and b["truncated"] is True
    assert b["timings"]["prompt_n"] + b["timings"]["cache_n"] == len(ids)
    assert b["generation_settings"]["n_keep"] == 4
    want = llm.engine.submit(PROMPT, 96, ignore_eos=True, context_shift=True, n_keep=4).result(TIMEOUT)
    assert b["content"] == want.text
    # n_keep and n_discard per request, as llama-server reads them
    r = httpx.post(srv.url + "/completion", json={"prompt": PROMPT, "n_predict": 80, "ignore_eos": True,
                                                  "n_keep": -1, "n_discard": 8}, timeout=120)
    want = llm.engine.submit(PROMPT, 80, ignore_eos=True, context_shift=True, n_keep=-1, n_discard=8).result(TIMEOUT)
    assert r.json()["content"] == want.text and r.json()["generation_settings"]["n_discard"] == 8
    r = httpx.post(srv.url + "/completion", json={"prompt": PROMPT, "n_predict": 8, "n_keep": -3}, timeout=60)
    assert r.status_code == 400 and "n_keep" in r.text


def test_server_refuses_a_prompt_over_the_context_even_shifting(srv):
    r = httpx.post(srv.url + "/completion", json={"prompt": "word " * 200, "n_predict": 4}, timeout=60)
    assert r.status_code == 400 and "exceeds the available context size" in r.json()["error"]["message"]


def test_server_openai_routes_shift_to_max_tokens(srv):
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 90, "ignore_eos": True,
                                                      "stream": True}, timeout=120)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-1])
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Tell a story."}],
                                                           "max_tokens": 100, "ignore_eos": True}, timeout=120)
    assert r.json()["usage"]["completion_tokens"] == 100 and r.json()["choices"][0]["finish_reason"] == "length"
