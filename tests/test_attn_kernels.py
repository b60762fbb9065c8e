"""The kernel tables' group attention entries (kernels.h: attn_scores_mh, attn_accum_mh), which
core/attention.c calls once per run of cache rows for all query heads of a KV head: on every
table this CPU runs (the others skip), against scalar.c's plain-C twins and against float64 numpy
over the values the kernels really see (the dequantized rows; for a Q8_0 cache the query as
quantized to pd_q8). pd_kernel_attn_mh runs the scores, then the weighted sum with the scores
as the weights, into an output that already holds values (the entry adds to it)."""
import numpy as np
import pytest

from pydecode._core import ffi, lib
from test_kernels import isa  # noqa: F401 (the fixture: every kernel table this CPU runs)
from test_kv_cache import KV, cache_rows, q_as_kernel_sees

# Float32 sums of up to 256 terms: |error| <= REL * (the sum of the terms' magnitudes).
REL = 2e-5


def run_mh(isa, kv, q, k_raw, v_raw, n, out0):
    """(scores [nh, n], out [nh, hd]) of the entry; the buffers carry a NaN tail that must stay."""
    nh, hd = q.shape
    scores = np.full(nh * n + 16, np.nan, np.float32)
    out = np.concatenate([out0.ravel(), np.full(16, np.nan, np.float32)]).astype(np.float32)
    rc = lib.pd_kernel_attn_mh(isa.encode(), KV[kv], nh, hd, ffi.from_buffer("float[]", q),
                               ffi.from_buffer(np.ascontiguousarray(k_raw)), ffi.from_buffer(np.ascontiguousarray(v_raw)),
                               n, ffi.from_buffer("float[]", scores), ffi.from_buffer("float[]", out))
    assert rc == lib.PD_OK
    assert np.isnan(scores[nh * n:]).all() and np.isnan(out[nh * hd:]).all()   # nothing written past the ends
    return scores[:nh * n].reshape(nh, n), out[:nh * hd].reshape(nh, hd)


def check(got_s, got_o, qd, kd, vd, out0):
    """Scores against q . K in float64, the sums against out0 + (the kernel's scores) @ V."""
    ref_s = qd @ kd.T
    assert np.all(np.abs(got_s - ref_s) <= REL * (np.abs(qd) @ np.abs(kd).T) + 1e-30)
    w = got_s.astype(np.float64)
    ref_o = out0 + w @ vd
    assert np.all(np.abs(got_o - ref_o) <= REL * (np.abs(out0) + np.abs(w) @ np.abs(vd)) + 1e-30)


@pytest.mark.parametrize("kv", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("nh", [1, 2, 3, 4, 7, 8])
@pytest.mark.parametrize("hd", [32, 64, 128, 256])
@pytest.mark.parametrize("n", [1, 5, 16, 17, 255, 256])
def test_attn_mh(isa, kv, nh, hd, n):
    rng = np.random.default_rng([nh, hd, n, len(kv)])
    q = (rng.standard_normal((nh, hd)) * 2).astype(np.float32)
    k_raw, kd = cache_rows(kv, rng.standard_normal((n, hd)).astype(np.float32))
    v_raw, vd = cache_rows(kv, rng.standard_normal((n, hd)).astype(np.float32))
    out0 = rng.standard_normal((nh, hd)).astype(np.float32)
    s, o = run_mh(isa, kv, q, k_raw, v_raw, n, out0)
    check(s, o, q_as_kernel_sees(kv, q), kd, vd, out0.astype(np.float64))
    if isa != "scalar":   # the plain-C twin: the same values within float rounding
        s0, o0 = run_mh("scalar", kv, q, k_raw, v_raw, n, out0)
        qd = q_as_kernel_sees(kv, q)
        assert np.all(np.abs(s - s0) <= 2 * REL * (np.abs(qd) @ np.abs(kd).T) + 1e-30)
        w = np.abs(s0.astype(np.float64))
        assert np.all(np.abs(o - o0) <= 2 * REL * (np.abs(out0) + w @ np.abs(vd)) + 1e-30)


@pytest.mark.parametrize("kv", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("nh,hd", [(16, 64), (12, 96), (5, 160), (9, 48), (2, 512)])
def test_attn_mh_other_shapes(isa, kv, nh, hd):
    """More heads than one register tile holds, head sizes off the fast paths' list (48, 96, 160
    (Q8_0 needs hd % 32: 48 is float only), 512: past the fast paths' 256)."""
    if kv == "q8_0" and hd % 32:
        pytest.skip("a Q8_0 cache needs hd % 32 == 0")
    rng = np.random.default_rng([nh, hd])
    n = 37
    q = rng.standard_normal((nh, hd)).astype(np.float32)
    k_raw, kd = cache_rows(kv, rng.standard_normal((n, hd)).astype(np.float32))
    v_raw, vd = cache_rows(kv, rng.standard_normal((n, hd)).astype(np.float32))
    out0 = rng.standard_normal((nh, hd)).astype(np.float32)
    s, o = run_mh(isa, kv, q, k_raw, v_raw, n, out0)
    check(s, o, q_as_kernel_sees(kv, q), kd, vd, out0.astype(np.float64))


def test_attn_mh_rejects_bad_args():
    q = np.zeros((2, 64), np.float32)
    buf = np.zeros(4096, np.float32)
    args = (ffi.from_buffer("float[]", q), ffi.from_buffer(buf), ffi.from_buffer(buf))
    for kv, nh, hd, n in [(lib.PD_KV_F32, 2, 64, 0), (lib.PD_KV_F32, 2, 64, 257), (lib.PD_KV_Q8_0, 2, 48, 4),
                          (7, 2, 64, 4), (lib.PD_KV_F32, 0, 64, 4)]:
        assert lib.pd_kernel_attn_mh(b"scalar", kv, nh, hd, *args, n, ffi.from_buffer("float[]", buf),
                                     ffi.from_buffer("float[]", buf)) == lib.PD_EINVAL
