"""Sanity checks of the numpy reference forward pass (the oracle for the C forward pass)."""
import numpy as np
import pytest

try:  # tests/ on sys.path (pytest's default rootdir/prepend import mode)
    from reference_llama import ReferenceModel
except ImportError:  # tests/ imported as a package
    from .reference_llama import ReferenceModel

# "The capital of France is" in SmolLM2's GPT-2 byte-level BPE (Ġ = leading space). These are
# the ids a BPE built from the GGUF's own vocab + merges produces for that string.
PROMPT = ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
PROMPT_IDS = [504, 3575, 282, 4649, 314]


@pytest.fixture(scope="module")
def ref(smollm_path):
    return ReferenceModel(smollm_path)


def test_config(ref):
    assert (ref.n_layer, ref.n_embd, ref.n_ff) == (30, 576, 1536)
    assert (ref.n_head, ref.n_head_kv, ref.head_dim, ref.rope_dim) == (9, 3, 64, 64)
    assert ref.n_vocab == 49152 and ref.rope_base == 100000.0
    assert not ref.has("output.weight")  # tied embeddings


def test_capital_of_france_is_paris(ref):
    ids = [ref.vocab.index(t) for t in PROMPT]
    assert ids == PROMPT_IDS
    logits = ref.logits(ids)
    assert logits.shape == (len(ids), ref.n_vocab) and logits.dtype == np.float64
    assert np.isfinite(logits).all()
    last = logits[-1]
    top = np.argsort(-last)
    assert ref.vocab[top[0]] == "ĠParis"
    assert last[top[0]] - last[top[1]] > 1.0  # measured: 17.37 vs 14.89 (" the")
    assert "ĠLondon" in [ref.vocab[i] for i in top[:5]]


def test_causal(ref):
    full = ref.logits(PROMPT_IDS)
    prefix = ref.logits(PROMPT_IDS[:3])
    np.testing.assert_allclose(full[:3], prefix, rtol=0, atol=1e-9)
