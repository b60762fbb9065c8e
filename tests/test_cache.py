"""The cache never changes the math: cached decode == full recompute, and the positions counter.

Tolerance: the two paths run the same kernels on the same inputs (decode uses the mat-vec path,
prefill the mat-mat tile path; the KV cache is F16 in both), so they may differ only by float
summation order: max |diff| <= CACHE_ATOL on logits of magnitude ~20.
"""
import numpy as np
import pytest

import pydecode

CACHE_ATOL = 2e-3
PROMPT = "The quick brown fox jumps over the lazy dog. Then the fox"
N_DECODE = 8


@pytest.fixture(scope="module", params=["scalar", "avx2", "avxvnni", "avx512"])
def model(request, smollm_path):
    from pydecode._core import ffi, lib

    if not lib.pd_isa_supported(request.param.encode()):
        pytest.skip(f"{request.param} not supported on this CPU")
    m = pydecode.Model(smollm_path, n_ctx=256, n_threads=2, isa=request.param)
    yield m
    m.close()


def test_cached_decode_equals_recompute(model):
    prompt = model.tokenizer.encode(PROMPT)
    logits = model.prefill(prompt).copy()
    seq = list(prompt)
    cached_steps, positions = [], len(prompt)
    for _ in range(N_DECODE):
        tok = int(np.argmax(logits))
        logits = model.decode_step(tok, len(seq)).copy()
        seq.append(tok)
        positions += 1
        cached_steps.append((list(seq), logits))
    recompute_positions = 0
    for prefix, cached in cached_steps:
        fresh = model.prefill(prefix).copy()   # a fresh prefill over the whole prefix
        recompute_positions += len(prefix)
        diff = np.abs(fresh - cached).max()
        assert diff <= CACHE_ATOL, f"step {len(prefix) - len(prompt)}: max |diff| {diff}"
        assert np.argmax(fresh) == np.argmax(cached)
    assert positions == len(prompt) + N_DECODE
    # recompute path: the triangular sum prompt + (prompt+1) + ... (a fresh pass per step)
    n = len(prompt)
    assert recompute_positions == sum(n + i for i in range(1, N_DECODE + 1))


def test_all_logits_equal_stepwise(model):
    toks = model.tokenizer.encode(PROMPT)[:12]
    every = model.prefill(toks, all_logits=True).copy()
    for i in range(1, len(toks) + 1):
        last = model.prefill(toks[:i]).copy()
        assert np.abs(every[i - 1] - last).max() <= CACHE_ATOL


def test_positions_counter_in_stats(smollm_path):
    llm = pydecode.load(str(smollm_path), n_ctx=256, n_threads=2)
    out = llm.generate("Once upon a time", max_tokens=8)
    s = out.stats
    assert s.generated_tokens == len(out.tokens) == 8 and out.finish_reason == "length"
    # the last sampled token is never fed back: prompt + generated - 1 positions computed
    assert s.positions_computed == s.prompt_tokens + s.generated_tokens - 1
    assert len(s.token_latencies_s) == s.generated_tokens - 1 and s.ttft_s > 0
    # the same prompt again reuses the cached prefix: only the last prompt token is recomputed
    again = llm.generate("Once upon a time", max_tokens=8)
    assert again.tokens == out.tokens
    assert again.stats.cached_tokens == s.prompt_tokens - 1
    assert again.stats.positions_computed == 1 + 8 - 1
