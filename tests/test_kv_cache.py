"""The KV cache's formats (f32, f16, q8_0) and attention over them, kernel by kernel, on every
kernel table this CPU runs (the others skip): pd_kernel_attn runs core/attention.c's own chunk
and combine functions, so these are the kernels and the work split a step uses.

Oracles: gguf.quants' Q8_0 quantizer for the cache's rows (bit for bit), and a float64 softmax
over the values the kernel really sees: the dequantized K/V rows and, for a Q8_0 cache, the
query as quantized to pd_q8 (the numpy mirror of tests/test_kernels.py), tightly; the float
query loosely (what 8 bits cost)."""
import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from pydecode._core import ffi, lib
from test_kernels import SIMD_ISAS, isa, q8_numpy  # noqa: F401 (isa: the fixture)

KV = {"f32": lib.PD_KV_F32, "f16": lib.PD_KV_F16, "q8_0": lib.PD_KV_Q8_0}
CHUNK = 256   # PD_ATTN_CHUNK (core/model.h): past it a query is combined from several chunks
# |out - ref| <= ATTN_REL * max|V| * max(1, max|s| / 10): float32 scores of size |s| carry an
# absolute error ~|s| eps that exp turns into a relative one.
ATTN_REL = 1e-5


def cache_rows(kv, x):
    """x [n, hd] float32 as the cache stores it: raw bytes and the values they mean (float64)."""
    if kv == "q8_0":
        raw = gguf.quants.quantize(x, QT.Q8_0)
        return raw, gguf.quants.dequantize(raw, QT.Q8_0).reshape(x.shape).astype(np.float64)
    a = x.astype(np.float16 if kv == "f16" else np.float32)
    return a, a.astype(np.float64)


def attend(isa, kv, q, k_raw, v_raw, n_pos, hd, scale):
    out = np.full(q.shape, np.nan, np.float32)
    rc = lib.pd_kernel_attn(isa.encode(), KV[kv], q.shape[0], ffi.from_buffer("float[]", q),
                            ffi.from_buffer(np.ascontiguousarray(k_raw)), ffi.from_buffer(np.ascontiguousarray(v_raw)),
                            n_pos, hd, scale, ffi.from_buffer("float[]", out))
    assert rc == lib.PD_OK
    return out


def softmax_ref(q, kd, vd, scale):
    s = scale * (q.astype(np.float64) @ kd.T)               # [n_q, n_pos]
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ vd, np.abs(s).max()


def q_as_kernel_sees(kv, q):
    if kv != "q8_0":
        return q.astype(np.float64)
    qq = q8_numpy(q.ravel())
    return (qq["d"].astype(np.float64)[:, None] * qq["qs"]).reshape(q.shape)


SHAPES = [(1, 64), (7, 32), (100, 128), (33, 64), (5, 256), (300, 64), (2048, 64), (9, 96)]


@pytest.mark.parametrize("kv", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("n_pos,hd", SHAPES)
@pytest.mark.parametrize("n_q", [1, 3])                 # 3: a grouped-query head group
@pytest.mark.parametrize("qscale", [1.0, 60.0])         # 60: scores in the thousands
def test_attention_vs_numpy(isa, kv, n_pos, hd, n_q, qscale):
    rng = np.random.default_rng([n_pos, hd, n_q, int(qscale)])
    q = (rng.standard_normal((n_q, hd)) * qscale).astype(np.float32)
    k_raw, kd = cache_rows(kv, rng.standard_normal((n_pos, hd)).astype(np.float32))
    v_raw, vd = cache_rows(kv, rng.standard_normal((n_pos, hd)).astype(np.float32))
    scale = 1 / np.sqrt(hd)
    out = attend(isa, kv, q, k_raw, v_raw, n_pos, hd, scale)
    ref, smax = softmax_ref(q_as_kernel_sees(kv, q), kd, vd, scale)
    tol = ATTN_REL * np.abs(vd).max() * max(1.0, smax / 10)
    assert np.abs(out - ref).max() <= tol
    if kv == "q8_0" and qscale == 1.0:   # the 8-bit query costs little against the float one
        ref_f, _ = softmax_ref(q.astype(np.float64), kd, vd, scale)
        assert np.abs(out - ref_f).max() <= 0.02 * np.abs(vd).max()


@pytest.mark.parametrize("simd", SIMD_ISAS)
@pytest.mark.parametrize("n_pos,hd", [(33, 64), (700, 128), (257, 256)])
def test_q8_0_attention_twin(simd, n_pos, hd):
    """Every SIMD table's Q8_0 attention against scalar.c's twin."""
    if not lib.pd_isa_supported(simd.encode()):
        pytest.skip(f"ISA {simd!r} is not compiled in or not supported by this CPU")
    rng = np.random.default_rng([n_pos, hd])
    q = rng.standard_normal((4, hd)).astype(np.float32) * 3
    k_raw, _ = cache_rows("q8_0", rng.standard_normal((n_pos, hd)).astype(np.float32))
    v_raw, vd = cache_rows("q8_0", rng.standard_normal((n_pos, hd)).astype(np.float32))
    a = attend("scalar", "q8_0", q, k_raw, v_raw, n_pos, hd, 0.125)
    b = attend(simd, "q8_0", q, k_raw, v_raw, n_pos, hd, 0.125)
    assert np.abs(a - b).max() <= 1e-5 * np.abs(vd).max()


def test_chunks_combine_like_one_pass(isa):
    """A query over several chunks (combined by rescaling) equals the float64 softmax of all its
    positions; one of 256 positions and one of 257 differ only by the last row's share."""
    rng = np.random.default_rng(5)
    hd, q = 64, rng.standard_normal((2, 64)).astype(np.float32)
    k_raw, kd = cache_rows("f32", rng.standard_normal((3 * CHUNK + 5, hd)).astype(np.float32))
    v_raw, vd = cache_rows("f32", rng.standard_normal((3 * CHUNK + 5, hd)).astype(np.float32))
    for n in (CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5):
        out = attend(isa, "f32", q, k_raw, v_raw, n, hd, 0.125)
        ref, _ = softmax_ref(q.astype(np.float64), kd[:n], vd[:n], 0.125)
        assert np.abs(out - ref).max() <= ATTN_REL * np.abs(vd).max()


@pytest.mark.parametrize("k", [32, 64, 192, 1024])
def test_quantize_q8_0_rows_equal_gguf(isa, k):
    """The cache's Q8_0 rows are gguf's quantizer's bytes, bit for bit (scales in f16)."""
    rng = np.random.default_rng(k)
    x = (rng.standard_normal(k) * rng.choice([1e-3, 1.0, 300.0], size=k)).astype(np.float32)
    x[:32] = 0.0                                    # an all-zero block: scale 0
    out = np.zeros(k // 32 * 34, np.uint8)
    assert lib.pd_kernel_quantize_q8_0(isa.encode(), ffi.from_buffer("float[]", x), ffi.from_buffer(out), k) == lib.PD_OK
    assert out.tobytes() == gguf.quants.quantize(x, QT.Q8_0).tobytes()


def test_bad_arguments_are_refused():
    q = np.zeros((1, 40), np.float32)
    rows = np.zeros(4096, np.uint8)
    for kv_type, hd in ((lib.PD_KV_Q8_0, 40), (7, 64), (-1, 64)):   # q8_0 needs hd % 32 == 0; unknown types
        assert lib.pd_kernel_attn(b"scalar", kv_type, 1, ffi.from_buffer("float[]", q), ffi.from_buffer(rows),
                                  ffi.from_buffer(rows), 4, hd, 1.0, ffi.from_buffer("float[]", q)) == lib.PD_EINVAL
    assert lib.pd_kernel_quantize_q8_0(b"scalar", ffi.from_buffer("float[]", q), ffi.from_buffer(rows), 40) == lib.PD_EINVAL


# ---------------------------------------------------------------- whole models with a q8_0 cache

import pydecode  # noqa: E402
from pydecode import verify as V  # noqa: E402
from tiny_models import write_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    p = tmp_path_factory.mktemp("kvq8") / "tiny-gemma3.gguf"
    write_tiny_model(p, "gemma3", n_layer=7, window=4)   # layers 0-4 local, 5 global, 6 local
    return p


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "neon", "dotprod"])
def test_q8_0_cache_equals_recompute_past_a_chunk(smollm_path, isa):
    """SmolLM2, a 300-token prompt (two attention chunks) and 6 decodes with a q8_0 cache: every
    cached step's logits equal recomputing the whole prefix (into a q8_0 cache too) within the
    verify tolerance (2e-3): the same rows are quantized the same way in both."""
    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} not supported by this CPU or build")
    ids = [int(t) for t in np.random.default_rng(3).integers(100, 40000, 300)]
    v = V.verify(smollm_path, ids, 6, n_threads=2, n_ctx=320, isa=isa, kv_type="q8_0")
    assert v.ok, V.report_lines(v)


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_q8_0_cache_sliding_window_ring_wraps(tiny_gemma, isa):
    """Window 4, n_batch 2: the local layers' q8_0 ring wraps; cached equals recomputed."""
    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} not supported by this CPU or build")
    v = V.verify(tiny_gemma, list(range(10, 19)), 6, n_threads=1, n_ctx=32, n_batch=2, isa=isa, kv_type="q8_0")
    assert v.ok, V.report_lines(v)


def test_q8_0_cache_close_to_f16(smollm_path):
    """What 8 bits cost: a q8_0 cache's logits stay near the f16 cache's over a 300-token prompt
    and the same greedy continuation (the quality table in bench/README.md measures more)."""
    ids = [int(t) for t in np.random.default_rng(4).integers(100, 40000, 300)]
    out = {}
    for kv in ("f16", "q8_0"):
        m = pydecode.Model(smollm_path, n_ctx=320, n_threads=2, kv_type=kv)
        out[kv] = m.prefill(ids).copy()
        m.close()
    # 1.0, not 0.5: on this random prompt the gap depends on float rounding that grows through the
    # 30 layers (the scalar table's own gap is 0.63; kernel tables differ from it by up to ~0.5).
    assert np.abs(out["f16"] - out["q8_0"]).max() < 1.0 and np.argmax(out["f16"]) == np.argmax(out["q8_0"])


def test_q8_0_cache_is_refused_for_a_head_dim_not_a_multiple_of_32(tmp_path):
    p = tmp_path / "hd48.gguf"
    write_tiny_model(p, "llama", n_layer=2, n_head=2, n_head_kv=2, head_dim=48)
    with pytest.raises(pydecode.ModelError, match="q8_0 KV cache needs head_dim a multiple of 32"):
        pydecode.Model(p, n_ctx=16, n_threads=1, kv_type="q8_0")
    with pytest.raises(ValueError, match="kv_type must be one of"):
        pydecode.Model(p, n_ctx=16, n_threads=1, kv_type="q4_0")
