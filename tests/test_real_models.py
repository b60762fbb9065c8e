"""Gemma 3 270M and Qwen2.5-Coder 0.5B against the numpy reference, and cache == recompute.

Same tolerances and reasoning as test_forward.py (8-bit activations; see there). Gemma's
sliding window is 512, so the window itself is exercised by the tiny models of test_archs.py;
here the real weights, norms, K-quants and the 262k-token head are.
"""
import numpy as np
import pytest

import pydecode
from pydecode.registry import model_path
from cache_check import assert_cached_decode_equals_recompute
from reference_llama import ReferenceModel

REL_RMS_TOL = 0.08
NOISE_FACTOR = 1.6
CACHE_ATOL = 5e-3
PROMPTS = {
    "gemma3-270m": "The capital of France is Paris. The capital of Germany is",
    "qwen2.5-coder-0.5b": "def add(a, b):\n    return",
}


@pytest.fixture(scope="module", params=sorted(PROMPTS))
def real(request):
    return request.param, model_path(request.param)


def _rel(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def test_logits_match_reference(real):
    name, path = real
    m = pydecode.Model(path, n_ctx=64, n_threads=2)
    toks = m.tokenizer.encode(PROMPTS[name])[:12]
    ours = m.prefill(toks, all_logits=True).astype(np.float64)
    plain = ReferenceModel(path)
    ref = plain.logits(toks)
    quant = ReferenceModel(path, act_quant=True)
    quant._w = plain._w          # the same dequantized weights: decode them once, not twice
    refq = quant.logits(toks)
    rel, noise = _rel(ours, ref), _rel(refq, ref)
    assert rel <= REL_RMS_TOL and rel <= NOISE_FACTOR * max(noise, 0.01), (rel, noise)
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1.0
    assert np.array_equal(np.argmax(ours, 1)[clear], np.argmax(ref, 1)[clear])


def test_cached_decode_equals_recompute(real):
    name, path = real
    m = pydecode.Model(path, n_ctx=64, n_threads=2)
    fresh_model = pydecode.Model(path, n_ctx=64, n_threads=2)   # a fresh prefill over each whole prefix
    assert_cached_decode_equals_recompute(m, fresh_model, m.tokenizer.encode(PROMPTS[name]), 6, CACHE_ATOL)
