"""bench/synthetic.py: the synthetic GGUFs the laptop-size benchmarks run on load, decode, and have
the real shapes' quantization mixes (small shapes here; the 3B/8B ones only in bench/)."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

import pydecode

SPEC = importlib.util.spec_from_file_location("synthetic", Path(__file__).resolve().parents[1] / "bench" / "synthetic.py")
synthetic = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(synthetic)


@pytest.mark.parametrize("mix", synthetic.MIXES)
def test_synthetic_file_loads_and_decodes(tmp_path, smollm_path, mix):
    out = synthetic.write("tiny", mix, tmp_path / f"tiny-{mix}.gguf")
    types = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
    want = {"q4_k_m": "Q4_K", "q4_0": "Q4_0", "q8_0": "Q8_0"}[mix]
    assert types["blk.0.attn_q.weight"] == want and types["blk.0.ffn_norm.weight"] == "F32"
    if mix == "q4_k_m":   # llama.cpp's use_more_bits: the last eighth of the layers keeps Q6_K
        assert types["blk.1.attn_v.weight"] == "Q6_K" and types["blk.0.attn_v.weight"] == "Q4_K"
    with pydecode.Model(out, n_ctx=64, n_threads=2) as m:
        assert m.config.n_layer == 2 and m.config.n_embd == 256
        logits = m.prefill([1, 2, 3, 4])
        for i in range(4):
            assert np.isfinite(logits).all()
            logits = m.decode_step(int(np.argmax(logits)), 4 + i)


def test_synthetic_vocab_padding(tmp_path):
    """--vocab pads the token list (the embedding grows with it)."""
    out = synthetic.write("tiny", "q8_0", tmp_path / "tiny-pad.gguf", vocab=50000)
    r = GGUFReader(out)
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    assert int(emb.shape[1]) == 50000
    with pydecode.Model(out, n_ctx=32) as m:
        assert m.config.n_vocab == 50000
        assert np.isfinite(m.prefill([1, 2])).all()
