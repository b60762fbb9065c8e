"""The load-time choice of a weight layout (pydecode/variants.py): measured once per CPU and
remembered, forced by PYDECODE_LAYOUT, and never a change in the results."""
import json

import numpy as np
import pytest

import pydecode
from pydecode import variants
from pydecode._core import lib


def run(path, n_threads=2):
    with pydecode.Model(path, n_ctx=64, n_threads=n_threads) as m:
        out = [m.prefill([2, 818, 5279, 529, 7001, 563]).copy()]
        for i in range(3):
            out.append(m.decode_step(int(np.argmax(out[-1])), 6 + i).copy())
        return np.stack(out), m.layouts, [t for _, t, _ in m.repacked]


def test_either_layout_gives_the_same_logits(gemma_path, monkeypatch):
    """Gemma's Q4_K and Q6_K matrices in the file's layout or repacked by 16 rows: the same bits
    (the chosen formats' kernels agree exactly), on the best table of this CPU."""
    best = lib.pd_isa_best()
    if not lib.pd_kernel_has_repacked(best, 12):
        pytest.skip("this CPU's table has no repacked K-quant kernels")
    monkeypatch.setenv("PYDECODE_LAYOUT", "file")
    a, la, ta = run(gemma_path)
    monkeypatch.setenv("PYDECODE_LAYOUT", "repacked")
    b, lb, tb = run(gemma_path)
    assert la == {"Q4_K": "file", "Q6_K": "file"} and lb == {"Q4_K": "repacked", "Q6_K": "repacked"}
    assert "Q4_K" not in ta and "Q4_K" in tb
    assert a.tobytes() == b.tobytes()


def test_choice_measured_once_and_remembered(gemma_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PYDECODE_HOME", str(tmp_path))
    monkeypatch.delenv("PYDECODE_LAYOUT", raising=False)
    monkeypatch.setattr(variants, "_memo", {})
    calls = []
    real = variants.measure
    monkeypatch.setattr(variants, "measure", lambda isa, t: calls.append(t) or real(isa, t))
    got = variants.choose("avx2", [12, 14, 2]) if lib.pd_isa_supported(b"avx2") else {}
    if not got:
        pytest.skip("no AVX2 table here")
    assert set(got) == {12, 14} and set(got.values()) <= {"repacked", "file"} and sorted(calls) == [12, 14]
    stored = json.loads((tmp_path / "variants.json").read_text())
    (key, val), = stored.items()
    assert variants.cpu_model() in key and "avx2" in key and val == {"Q4_K": got[12], "Q6_K": got[14]}
    monkeypatch.setattr(variants, "_memo", {})       # a new process: read from the file
    assert variants.choose("avx2", [12, 14]) == got and sorted(calls) == [12, 14]


def test_repack_off_chooses_nothing(gemma_path):
    with pydecode.Model(gemma_path, n_ctx=32, repack=False) as m:
        assert m.layouts == {} and m.repacked == []


def test_bad_layout_setting_is_named(gemma_path, monkeypatch):
    monkeypatch.setenv("PYDECODE_LAYOUT", "fast")
    with pytest.raises(ValueError, match="PYDECODE_LAYOUT"):
        pydecode.Model(gemma_path, n_ctx=32)
