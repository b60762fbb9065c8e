"""The measured default decode thread count (pydecode/threadcount.py): one-token steps on fewer
threads give the same logits, the count is measured once per CPU and model shape and then
read back, PYDECODE_DECODE_THREADS forces it, and n_threads= skips the measurement."""
import json

import numpy as np
import pytest

import pydecode
from pydecode import threadcount, variants
from pydecode._core import lib


def run(m):
    out = [m.prefill([2, 818, 5279, 529, 7001, 563]).copy()]
    for i in range(4):
        out.append(m.decode_step(int(np.argmax(out[-1])), 6 + i).copy())
    return np.stack(out)


@pytest.mark.parametrize("n_threads", [2, 3, 7])
def test_fewer_decode_threads_same_logits(smollm_path, n_threads):
    """Any decode thread count, down to 1, computes the same bits as all the threads."""
    with pydecode.Model(smollm_path, n_ctx=64, n_threads=n_threads) as m:
        ref = run(m)
        for k in range(1, n_threads):
            assert lib.pd_model_set_decode_threads(m._ptr, k) == lib.PD_OK
            assert run(m).tobytes() == ref.tobytes(), k


def test_decode_threads_out_of_range_is_refused(smollm_path):
    with pydecode.Model(smollm_path, n_ctx=32, n_threads=2) as m:
        assert m.decode_threads == 2
        for bad in (3, -1):
            assert lib.pd_model_set_decode_threads(m._ptr, bad) == lib.PD_EINVAL
            assert f"decode threads {bad} outside 0..2".encode() in pydecode._core.ffi.string(lib.pd_model_error(m._ptr))


def test_measured_once_per_shape_and_remembered(smollm_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PYDECODE_HOME", str(tmp_path))
    monkeypatch.delenv("PYDECODE_DECODE_THREADS", raising=False)
    monkeypatch.setattr(variants, "_memo", {})
    monkeypatch.setattr("pydecode.model.physical_cores", lambda: 2)
    calls = []
    real = threadcount.measure
    monkeypatch.setattr(threadcount, "measure", lambda *a: calls.append(a[1]) or real(*a))
    with pydecode.Model(smollm_path, n_ctx=64) as m:
        k = m.decode_threads
        assert 1 <= k <= 2 and calls == [2]
        ref = run(m)
    stored = json.loads((tmp_path / "variants.json").read_text())
    keys = [key for key in stored if "decode threads of 2" in key]
    assert len(keys) == 1 and stored[keys[0]] == k and variants.cpu_model() in keys[0]
    monkeypatch.setattr(variants, "_memo", {})          # a new process: read from the file
    with pydecode.Model(smollm_path, n_ctx=64) as m:
        assert m.decode_threads == k and calls == [2]
        assert run(m).tobytes() == ref.tobytes()
    with pydecode.Model(smollm_path, n_ctx=64, n_threads=2) as m:   # given: not measured
        assert m.decode_threads == 2 and calls == [2]


def test_forced_by_environment(smollm_path, monkeypatch):
    monkeypatch.setenv("PYDECODE_DECODE_THREADS", "1")
    with pydecode.Model(smollm_path, n_ctx=32, n_threads=3) as m:
        assert m.decode_threads == 1
        ref = run(m)
    monkeypatch.delenv("PYDECODE_DECODE_THREADS")
    with pydecode.Model(smollm_path, n_ctx=32, n_threads=3) as m:
        assert m.decode_threads == 3 and run(m).tobytes() == ref.tobytes()
    for bad in ("0", "4", "two"):
        monkeypatch.setenv("PYDECODE_DECODE_THREADS", bad)
        with pytest.raises(ValueError, match="PYDECODE_DECODE_THREADS"):
            pydecode.Model(smollm_path, n_ctx=32, n_threads=3)
