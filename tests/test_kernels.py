"""Kernel tests: every kernel table (ISA) x every weight type, against gguf's numpy code.

gguf.quants is the oracle for the block formats (its quantize builds the weights, its
dequantize defines their values). gguf has no quantizer for the K-quants, so their weights are
built by hand: random bytes are a valid block of every K format (each bit pattern of the packed
quants and sub-block scales means something), with sane f16 super-block scales written over
them; gguf's dequantize still defines their values. Block-format matmuls quantize the
activations to 8 bits first (pd_q8 per 32 values, pd_q8k per 256 for the K-quants), so each is
checked twice: tightly against the product with the same quantized activations (numpy mirrors
of quantize_q8 / quantize_q8k below), and more loosely against the float product.
"""
import functools

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from pydecode import _core
from pydecode._core import ffi, lib

# ---------------------------------------------------------------- tolerances
# Tight: kernel vs float64 reference over the SAME quantized inputs. Each block's integer dot is
# exact, so only float32 rounding (scales, block sums: <= ~50 terms, f32 eps 6e-8) remains:
# |y - ref| <= TIGHT_REL * sum_i |w_i * x_i|. Also used for scalar vs each SIMD table (summation order).
# K-quants: per super-block the scale and minimum terms (each exact in integers, < 2^27) are
# rounded separately, so their error scales with sum_i (|d sc q_i| + |dmin m|) |x_i|, which the
# hand-built blocks keep within a few times sum_i |w_i x_i|: the same TIGHT_REL holds.
TIGHT_REL = 1e-5
# Loose, hard bound: q8 activations are round-to-nearest, so |x - dq(x)| <= d_block/2 and
# |y - W@x| <= sum_i |w_i| d_i/2 (+ the tight term); the factor is slack for d, 1/d rounding.
LOOSE_BOUND_SLACK = 1.01
# Loose, statistical: the rms error over all outputs must stay within this many predicted
# standard deviations of the activation rounding noise sqrt(sum_i w_i^2 d_i^2 / 12).
LOOSE_SIGMAS = 4.0
# Exact (bit for bit): quantize_q8 / quantize_q8k vs their numpy mirrors, dequantize_row vs
# gguf.dequantize, f16<->f32 vs numpy (NaNs: both NaN, payload not compared).

# avxvnni_evex: the AVX-VNNI table's source with its VEX dots as EVEX ones (x86/avxvnni_evex.c),
# so its logic runs on AVX-512 VNNI hosts that lack AVX-VNNI
ISAS = ["scalar", "avx2", "avxvnni", "avxvnni_evex", "avx512", "neon", "dotprod", "i8mm"]
SIMD_ISAS = ISAS[1:]
K_TYPES = [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K]
TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0] + K_TYPES
FLOAT_TYPES = (QT.F32, QT.F16, QT.BF16)
KS = [32, 256, 576, 1536]
K_KS = [256, 512, 2048]                                 # K-quants: whole super-blocks of 256
SHAPES = [(1, 1), (7, 3), (33, 8), (33, 1), (7, 8)]     # (nrows, ncols): rows not a multiple of 4
Q8_DTYPE = np.dtype([("d", "<f4"), ("s", "<f4"), ("qs", "i1", 32)])   # pd_q8, 40 bytes
Q8K_DTYPE = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])   # pd_q8k, 292
# byte offset of the f16 super-block scale d in each K block (dmin, if any, follows it)
K_D_OFFSET = {QT.Q2_K: 80, QT.Q3_K: 108, QT.Q4_K: 0, QT.Q5_K: 0, QT.Q6_K: 208}
K_HAS_MIN = (QT.Q2_K, QT.Q4_K, QT.Q5_K)



def _quantize_q8k(isa, x, out, k):
    xp = ffi.NULL if x is None else ffi.cast("float *", x)
    return lib.pd_kernel_quantize_q8k(isa, xp, ffi.cast("void *", out), k)


def _type_name(t):
    return ffi.string(lib.pd_type_name(t))


def type_k_params(types=TYPES, ks=KS, k_ks=K_KS):
    """(qtype, k) pairs: each type with the row lengths its block size allows."""
    return [pytest.param(t, k, id=f"{t.name}-{k}") for t in types
            for k in (k_ks if t in K_TYPES else ks)]



@pytest.fixture(params=ISAS)
def isa(request):
    if not lib.pd_isa_supported(request.param.encode()):
        pytest.skip(f"ISA {request.param!r} is not compiled in or not supported by this CPU")
    return request.param


# ---------------------------------------------------------------- helpers


def _q8_rule(x, block):
    """gguf's Q8_0 rule per block of `block` values: d = amax/127 (float32), q =
    round-half-away(x * (1/d)). Returns (d, q)."""
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, block)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    return d, gguf.quants.np_roundf(blocks * inv[:, None]).astype(np.int8)


def q8_numpy(x):
    """numpy mirror of quantize_q8: the Q8_0 rule per 32 values, and s = d * sum(q)."""
    d, qs = _q8_rule(x, 32)
    out = np.empty(len(d), Q8_DTYPE)
    out["d"], out["qs"] = d, qs
    out["s"] = d * qs.sum(axis=1, dtype=np.int32).astype(np.float32)
    return out


def q8k_numpy(x):
    """numpy mirror of quantize_q8k: the same rule per 256 values, bsums = sums of 16 q."""
    d, qs = _q8_rule(x, 256)
    out = np.empty(len(d), Q8K_DTYPE)
    out["d"], out["qs"] = d, qs
    out["bsums"] = qs.reshape(-1, 16, 16).sum(axis=2, dtype=np.int32)
    return out


def q8k_c(isa_name, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(x.size // 256, Q8K_DTYPE)
    rc = _quantize_q8k(isa_name.encode(), x.ctypes.data, out.ctypes.data, x.size)
    assert rc == lib.PD_OK
    return out


def act_quant(qtype, x):
    """The 8-bit activations a block type's matmul works on (numpy mirror)."""
    return q8k_numpy(x) if qtype in K_TYPES else q8_numpy(x)


def q8_c(isa_name, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(x.size // 32, Q8_DTYPE)
    rc = lib.pd_kernel_quantize_q8(isa_name.encode(), ffi.from_buffer("float[]", x),
                                   ffi.from_buffer(out), x.size)
    assert rc == lib.PD_OK
    return out


def dq8(q):  # dequantized q8 activations, float64, flat
    return (q["d"].astype(np.float64)[:, None] * q["qs"]).ravel()


def matmul(isa_name, qtype, wbytes, nrows, k, x, stride=None):
    """y[c, r] = row r of the raw weight bytes . x[c]."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.full((x.shape[0], nrows), np.nan, np.float32)
    rc = lib.pd_kernel_matmul(isa_name.encode(), int(qtype), ffi.from_buffer(wbytes),
                              stride or wbytes.shape[1], nrows, k, ffi.from_buffer("float[]", x),
                              x.shape[0], ffi.from_buffer("float[]", y))
    assert rc == lib.PD_OK
    return y


def k_blocks(qtype, nrows, k, rng):
    """Hand-built K-quant rows: random quant and sub-block-scale bytes, f16 super-block scales
    d (and dmin) of either sign and varied size per block, a few blocks with every byte 0xFF
    (largest quants, scales and minima) and a few with d = 0."""
    _, nbytes = GGML_QUANT_SIZES[qtype]
    nb = k // 256
    w = rng.integers(0, 256, (nrows, nb, nbytes), dtype=np.uint8)
    w[rng.random((nrows, nb)) < 0.03] = 0xFF
    nscale = 2 if qtype in K_HAS_MIN else 1
    # |w| ~ 0.1..1: d * (largest sc*q: 15*3, 31*7, 63*15, 63*31, 127*31 in the 5 formats)
    scale = {QT.Q2_K: 0.01, QT.Q3_K: 0.005, QT.Q4_K: 1e-3, QT.Q5_K: 5e-4, QT.Q6_K: 2e-4}[qtype]
    ds = scale * rng.uniform(0.2, 2.0, (nrows, nb, nscale)) * rng.choice([1, 1, 1, -1], (nrows, nb, nscale))
    ds[rng.random((nrows, nb)) < 0.03, 0] = 0
    off = K_D_OFFSET[qtype]
    w[..., off:off + 2 * nscale] = ds.astype(np.float16).view(np.uint8).reshape(nrows, nb, -1)
    return np.ascontiguousarray(w.reshape(nrows, -1))


@functools.lru_cache(maxsize=None)
def weights(qtype, nrows, k, seed=0):
    """(raw bytes [nrows, row_bytes], dequantized float64 [nrows, k]) built by gguf (K-quants:
    hand-built, dequantized by gguf)."""
    rng = np.random.default_rng([seed, int(qtype), nrows, k])
    if qtype in K_TYPES:
        wbytes = k_blocks(qtype, nrows, k, rng)
        wd = gguf.quants.dequantize(wbytes, qtype).reshape(nrows, k).astype(np.float64)
        return wbytes, wd
    # per-row offsets make the minimum of q4_1/q5_1 matter; a few large values stretch blocks
    w = rng.standard_normal((nrows, k)) * 0.5 + rng.uniform(-0.3, 0.3, (nrows, 1))
    w = w.astype(np.float32)
    w[rng.random((nrows, k)) < 0.01] *= 8
    wq = gguf.quants.quantize(w, qtype)
    wbytes = np.ascontiguousarray(wq).view(np.uint8).reshape(nrows, -1)
    wd = gguf.quants.dequantize(wq, qtype).reshape(nrows, k).astype(np.float64)
    return wbytes, wd


def acts(ncols, k, seed=1):
    rng = np.random.default_rng([seed, ncols, k])
    return (rng.standard_normal((ncols, k)) * rng.uniform(0.1, 3.0, (ncols, 1))).astype(np.float32)


def check_against_oracle(y, wd, x, qtype):
    """(a) tight vs the product with the same quantized activations, (b) loose vs float."""
    if qtype in FLOAT_TYPES:
        xa = x.astype(np.float64)
    else:
        xa = np.stack([dq8(act_quant(qtype, row)) for row in x])
    ref = xa @ wd.T
    tight = TIGHT_REL * (np.abs(xa) @ np.abs(wd).T) + 1e-30
    err = np.abs(y - ref)
    assert (err <= tight).all(), f"tight: worst err/tol {(err / tight).max():.3g}"
    if qtype in FLOAT_TYPES:
        return
    bs = 256 if qtype in K_TYPES else 32
    half_d = np.stack([np.repeat(act_quant(qtype, row)["d"].astype(np.float64), bs) / 2 for row in x])
    ref_f = x.astype(np.float64) @ wd.T
    bound = LOOSE_BOUND_SLACK * (half_d @ np.abs(wd).T) + tight
    err_f = np.abs(y - ref_f)
    assert (err_f <= bound).all(), f"loose bound: worst err/bound {(err_f / bound).max():.3g}"
    sigma = np.sqrt(((2 * half_d) ** 2 / 12) @ (wd ** 2).T)
    rms, rms_sigma = np.sqrt(np.mean(err_f ** 2)), np.sqrt(np.mean(sigma ** 2))
    assert rms <= LOOSE_SIGMAS * rms_sigma, f"loose rms {rms:.3g} vs sigma {rms_sigma:.3g}"


# ---------------------------------------------------------------- activation quantization


def test_quantize_q8_matches_numpy_mirror(isa):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(32 * 64) * np.repeat(rng.uniform(1e-3, 100, 64), 32)).astype("f4")
    x[:32] = 0                                              # all-zero block: d = 0
    x[32:64] = np.arange(-15.5, 16.5, 1, dtype=np.float32)  # amax 16.5 -> d, many near-ties
    x[64:96] = np.r_[127, np.arange(-15.5, 15.5, 1)].astype(np.float32)  # d = 1: exact .5 ties
    got, want = q8_c(isa, x), q8_numpy(x)
    assert got.tobytes() == want.tobytes()   # bit-exact: d, s and every q
    assert (got["qs"][2][1:] == np.where(x[65:96] > 0, np.ceil(x[65:96]), np.floor(x[65:96]))).all()


def test_quantize_q8k_matches_numpy_mirror(isa):
    rng = np.random.default_rng(6)
    nb = 24
    x = (rng.standard_normal(256 * nb) * np.repeat(rng.uniform(1e-3, 100, nb), 256)).astype("f4")
    x[:256] = 0                                                  # all-zero block: d = 0
    ties = np.arange(-127.5, 128.5, 1, dtype=np.float32)         # 256 exact .5 ties ...
    ties[0], ties[-1] = -127, 127                                # ... in a block with d = 1
    x[256:512] = ties
    x[512:768] = -ties[::-1] * 0.5 - 0.25                        # amax 63.75, many near-ties
    x[768:1024] = np.where(np.arange(256) == 77, -300, x[768:1024])  # amax of negative sign
    x[1024:1280] = rng.standard_normal(256).astype("f4") * 1e-30     # tiny (normal f32) values
    got, want = q8k_c(isa, x), q8k_numpy(x)
    assert got.tobytes() == want.tobytes()   # bit-exact: d, every q and every bsum
    assert want["d"][1] == 1 and (got["qs"][1][1:-1] == np.where(ties[1:-1] > 0, np.ceil(ties[1:-1]),
                                                                 np.floor(ties[1:-1]))).all()
    assert abs(got["qs"]).max() == 127


@pytest.mark.parametrize("bad", [np.nan, -np.nan, np.inf, -np.inf])
def test_quantize_a_non_finite_block_is_nan_everywhere(isa, bad):
    """formats.h's rule: a block with a NaN or an infinity anywhere quantizes to d = NaN (s = NaN)
    and zero quants (the conversion of NaN to int was INT_MIN, and summing it overflowed, caught by
    UBSan); the other blocks are untouched, bit-exact with the mirror. A NaN after larger values
    (float max instructions drop it) counts too."""
    rng = np.random.default_rng(8)
    for where in (0, 5, 31, 200):
        x = rng.standard_normal(256 * 3).astype("f4")
        x[256 + 255] = 1e30                                # a finite huge value in the same block
        x[256 + where] = bad
        ok = np.r_[0:256, 512:768]
        got8 = q8_c(isa, x)
        assert np.isnan(got8["d"][8 + where // 32]) and np.isnan(got8["s"][8 + where // 32])
        assert not got8["qs"][8 + where // 32].any()
        want8 = q8_numpy(np.where(np.isfinite(x), x, 0).astype("f4"))
        fine = [b for b in range(24) if b != 8 + where // 32]
        assert got8[fine].tobytes() == want8[fine].tobytes()
        gotk = q8k_c(isa, x)
        assert np.isnan(gotk["d"][1]) and not gotk["qs"][1].any() and not gotk["bsums"][1].any()
        wantk = q8k_numpy(x[ok].astype("f4"))
        assert gotk[[0, 2]].tobytes() == wantk.tobytes()


# ---------------------------------------------------------------- matmul vs the gguf oracle


@pytest.mark.parametrize("qtype,k", type_k_params())
@pytest.mark.parametrize("nrows,ncols", SHAPES)
def test_matmul_vs_gguf(isa, qtype, k, nrows, ncols):
    wbytes, wd = weights(qtype, nrows, k)
    x = acts(ncols, k)
    check_against_oracle(matmul(isa, qtype, wbytes, nrows, k, x), wd, x, qtype)


@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k", [1, 7, 45, 100])
def test_matmul_float_types_any_k(isa, qtype, k):
    wbytes, wd = weights(qtype, 9, k)
    x = acts(5, k)
    check_against_oracle(matmul(isa, qtype, wbytes, 9, k, x), wd, x, qtype)


@pytest.mark.parametrize("simd", SIMD_ISAS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("nrows,ncols", [(1, 1), (7, 3), (37, 11)])
def test_scalar_vs_simd(simd, qtype, nrows, ncols):
    if not lib.pd_isa_supported(simd.encode()):
        pytest.skip(f"{simd} is not compiled in or not supported by this CPU")
    k = 768 if qtype in K_TYPES else 576
    wbytes, wd = weights(qtype, nrows, k)
    x = acts(ncols, k)
    ys, ya = (matmul(i, qtype, wbytes, nrows, k, x) for i in ("scalar", simd))
    xa = (x.astype(np.float64) if qtype in FLOAT_TYPES
          else np.stack([dq8(act_quant(qtype, r)) for r in x]))
    tol = 2 * TIGHT_REL * (np.abs(xa) @ np.abs(wd).T) + 1e-30
    assert (np.abs(ya - ys) <= tol).all()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_bit_identical_in_any_tile(isa, qtype):
    """A row's result does not depend on the tile that computes it (4-row or single-row tiles,
    any neighbours), nor a column's on the columns computed with it (one column, the decode
    case, included): the kernels' half of the guarantee that a forward pass is bit-identical
    for any split of the rows across threads, and that a decode step computes what a prefill
    of the same position does."""
    k = 512 if qtype in K_TYPES else (100 if qtype in FLOAT_TYPES else 576)
    nrows = 13
    wbytes, _ = weights(qtype, nrows, k)
    x = acts(6, k)
    whole = matmul(isa, qtype, wbytes, nrows, k, x)
    for cuts in ([1, 6], [3, 7, 11], [2], [9]):
        bounds = list(zip([0] + cuts, cuts + [nrows]))
        parts = np.concatenate([matmul(isa, qtype, wbytes[a:b], b - a, k, x) for a, b in bounds], axis=1)
        assert parts.tobytes() == whole.tobytes(), f"row cuts {cuts}"
    for groups in (((0, 2), (2, 6)), ((0, 1), (1, 5), (5, 6)), tuple((c, c + 1) for c in range(6))):
        cols = np.concatenate([matmul(isa, qtype, wbytes, nrows, k, x[a:b]) for a, b in groups])
        assert cols.tobytes() == whole.tobytes(), f"column groups {groups}"
    single = np.concatenate([matmul(isa, qtype, wbytes[a:b], b - a, k, x[:1]) for a, b in ((0, 5), (5, 13))], axis=1)
    assert single.tobytes() == whole[:1].tobytes()


@pytest.mark.parametrize("qtype", [QT.Q4_1, QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
def test_matmul_row_stride(isa, qtype):
    """Rows further apart than their bytes (a sub-matrix of a wider tensor)."""
    wbytes, wd = weights(qtype, 11, 256)
    wide = np.zeros((11, wbytes.shape[1] + 24), np.uint8)
    wide[:, :wbytes.shape[1]] = wbytes
    x = acts(3, 256)
    y = matmul(isa, qtype, wide, 11, 256, x, stride=wide.shape[1])
    check_against_oracle(y, wd, x, qtype)


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_matmul_k_extreme_activations(isa, qtype):
    """Activations at full scale (|q| = 127 everywhere, same sign or alternating) against blocks
    of all-0xFF bytes: the largest integer sums each format can produce (int16 pair sums, int32
    super-block sums must not overflow)."""
    k, nrows = 512, 5
    wbytes, _ = weights(qtype, nrows, k)
    wbytes = wbytes.copy()
    blocks = wbytes.reshape(nrows, 2, -1)
    off = K_D_OFFSET[qtype]
    nscale = 2 if qtype in K_HAS_MIN else 1
    blocks[:3, :, :off] = 0xFF
    blocks[:3, :, off + 2 * nscale:] = 0xFF
    wd = gguf.quants.dequantize(wbytes, qtype).reshape(nrows, k).astype(np.float64)
    x = np.stack([np.ones(k), -np.ones(k), np.tile([1.0, -1.0], k // 2),
                  np.sign(wd[0]) + (wd[0] == 0)]).astype(np.float32) * 3
    check_against_oracle(matmul(isa, qtype, wbytes, nrows, k, x), wd, x, qtype)


# ---------------------------------------------------------------- real tensors of the model file


@pytest.fixture(scope="module")
def smollm(smollm_path):
    reader = gguf.GGUFReader(str(smollm_path))
    return {t.name: t for t in reader.tensors}


@pytest.mark.parametrize("name,rows", [
    ("blk.0.attn_q.weight", None),       # Q4_1, 576 x 576
    ("blk.0.ffn_down.weight", None),     # Q4_1, k = 1536
    ("token_embd.weight", (1000, 1075)), # Q8_0, a slice of the 49152 rows
])
@pytest.mark.parametrize("ncols", [1, 5])
def test_matmul_model_tensors(isa, smollm, name, rows, ncols):
    t = smollm[name]
    data = t.data if rows is None else t.data[rows[0]:rows[1]]   # rows of raw bytes (memmap)
    nrows, k = data.shape[0], int(t.shape[0])
    wd = gguf.quants.dequantize(np.asarray(data), t.tensor_type).reshape(nrows, k).astype("f8")
    x = acts(ncols, k, seed=7)
    y = matmul(isa, t.tensor_type, np.ascontiguousarray(data), nrows, k, x)
    check_against_oracle(y, wd, x, t.tensor_type)


@pytest.fixture(scope="module")
def gemma():
    from pydecode.registry import model_path

    reader = gguf.GGUFReader(str(model_path("gemma3-270m")))
    return {t.name: t for t in reader.tensors}


GEMMA_K_TENSORS = [
    ("blk.0.attn_output.weight", QT.Q4_K),   # k = 1024, 640 rows
    ("blk.0.ffn_down.weight", QT.Q6_K),      # k = 2048, 640 rows
    ("blk.2.ffn_down.weight", QT.Q4_K),      # k = 2048
]


@pytest.mark.parametrize("name,qtype", GEMMA_K_TENSORS)
@pytest.mark.parametrize("ncols", [1, 5])
def test_matmul_gemma_k_tensors(isa, gemma, name, qtype, ncols):
    t = gemma[name]
    assert t.tensor_type == qtype
    data = np.ascontiguousarray(t.data)
    nrows, k = data.shape[0], int(t.shape[0])
    wd = gguf.quants.dequantize(data, qtype).reshape(nrows, k).astype("f8")
    x = acts(ncols, k, seed=8)
    y = matmul(isa, qtype, data, nrows, k, x)
    check_against_oracle(y, wd, x, qtype)


@pytest.mark.parametrize("name,qtype", GEMMA_K_TENSORS[:2])
def test_dequantize_row_gemma_k_tensor(gemma, name, qtype):
    t = gemma[name]
    rows = np.asarray(t.data[100:104])
    want = gguf.quants.dequantize(rows, qtype).reshape(4, -1)
    for r in range(4):
        y = np.empty(want.shape[1], np.float32)
        assert lib.pd_kernel_dequantize_row(int(qtype), ffi.from_buffer(rows[r]),
                                            ffi.from_buffer("float[]", y), y.size) == lib.PD_OK
        assert y.tobytes() == want[r].tobytes()


def test_dequantize_row_model_tensor(smollm):
    t = smollm["token_embd.weight"]
    rows = np.asarray(t.data[5000:5004])
    want = gguf.quants.dequantize(rows, t.tensor_type).reshape(4, -1)
    for r in range(4):
        y = np.empty(want.shape[1], np.float32)
        assert lib.pd_kernel_dequantize_row(int(t.tensor_type), ffi.from_buffer(rows[r]),
                                            ffi.from_buffer("float[]", y), y.size) == lib.PD_OK
        assert y.tobytes() == want[r].tobytes()


# ---------------------------------------------------------------- forward pass vs thread count

THREAD_COUNTS = (1, 2, 3, 7)


@pytest.mark.parametrize("model", ["smollm", "gemma"])
@pytest.mark.parametrize("isa_name", ISAS)
def test_forward_bit_identical_across_thread_counts(request, model, isa_name):
    """Every output row of a matmul is computed by exactly one thread, with the same
    instructions in the same order whatever its neighbours in the tile (the kernels) and
    whichever thread takes it (core/forward.c hands out row chunks whose size depends on the matrix
    only, tokens and (token, head) pairs whole): prefill logits of every position and the
    decode steps after them are bit-identical for any thread count."""
    import pydecode

    if not lib.pd_isa_supported(isa_name.encode()):
        pytest.skip(f"ISA {isa_name!r} is not compiled in or not supported by this CPU")
    smollm_path = request.getfixturevalue(f"{model}_path")   # gemma: Q4_K/Q6_K (repacked), Q5_0, Q8_0
    prompt = [1, 504, 3158, 2365, 19, 260, 7890, 30]
    steps = [282, 6213, 28, 1177]                      # fed at positions 8..11
    runs = {}
    for t in THREAD_COUNTS:
        with pydecode.Model(smollm_path, n_ctx=64, n_threads=t, isa=isa_name) as m:
            assert m.isa == isa_name and m.n_threads == t
            pre = m.prefill(prompt, all_logits=True).copy()
            dec = np.stack([m.decode_step(tok, len(prompt) + i).copy() for i, tok in enumerate(steps)])
        assert np.isfinite(pre).all() and np.isfinite(dec).all()
        runs[t] = (pre, dec)
    pre1, dec1 = runs[1]
    for t in THREAD_COUNTS[1:]:
        pre, dec = runs[t]
        assert pre.tobytes() == pre1.tobytes(), (
            f"{isa_name}: prefill logits with {t} threads differ from 1 thread at positions "
            f"{sorted(set(np.nonzero(pre != pre1)[0]))}")
        assert dec.tobytes() == dec1.tobytes(), (
            f"{isa_name}: decode logits with {t} threads differ from 1 thread at steps "
            f"{sorted(set(np.nonzero(dec != dec1)[0]))}")


# ---------------------------------------------------------------- dequantize_row, f16


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_row_exact(qtype):
    k = 2048 if qtype in K_TYPES else 256      # K-quants: enough blocks for the 0xFF / d=0 ones
    wbytes, _ = weights(qtype, 3, k)
    want = gguf.quants.dequantize(wbytes, qtype).reshape(3, k).astype(np.float32)
    for r in range(3):
        y = np.empty(k, np.float32)
        assert lib.pd_kernel_dequantize_row(int(qtype), ffi.from_buffer(wbytes[r]),
                                            ffi.from_buffer("float[]", y), k) == lib.PD_OK
        assert y.tobytes() == want[r].tobytes()


def test_f16_to_f32_exhaustive():
    bits = np.arange(65536, dtype=np.uint16)
    y = np.empty(65536, np.float32)
    assert lib.pd_kernel_dequantize_row(int(QT.F16), ffi.from_buffer(bits),
                                        ffi.from_buffer("float[]", y), 65536) == lib.PD_OK
    want = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert (np.isnan(y) == nan).all()
    assert (y[~nan].view(np.uint32) == want[~nan].view(np.uint32)).all()


def f32_to_f16_inputs():
    rng = np.random.default_rng(3)
    all_f16 = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    # exact midpoints between neighbouring f16 values (representable in f32): the ties
    with np.errstate(invalid="ignore"):   # inf + -inf neighbours around the NaNs
        halfway = ((all_f16[:-1].astype(np.float64) + all_f16[1:]) / 2).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 65536, 1e30,
                        2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 2.0**-26, 2.0**-14,
                        2.0**-14 * 0.9999,
                        1e-45, 3e-8, 6.1e-5, 1 + 2.0**-11, 1 + 3 * 2.0**-11], np.float32)
    rand_bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    small = rng.standard_normal(100_000) * np.exp2(rng.uniform(-30, 17, 100_000))   # all scales
    small = small.astype(np.float32)
    return np.concatenate([all_f16, halfway, -halfway, special, -special, rand_bits, small])


def test_f32_to_f16(isa):
    x = f32_to_f16_inputs()
    got = np.empty(x.size, np.uint16)
    assert lib.pd_kernel_f32_to_f16(isa.encode(), ffi.from_buffer("float[]", x),
                                         ffi.from_buffer("uint16_t[]", got), x.size) == lib.PD_OK
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(want)
    assert (np.isnan(got.view(np.float16)) == nan).all()
    assert (got[~nan] == want[~nan].view(np.uint16)).all()


# (attention and the KV cache's formats: tests/test_kv_cache.py)


# ---------------------------------------------------------------- dispatch and bad input


def test_isa_names():
    best = ffi.string(lib.pd_isa_best()).decode()
    assert best in ISAS and lib.pd_isa_supported(best.encode())
    assert lib.pd_isa_supported(b"scalar") == 1
    assert lib.pd_isa_supported(b"foo") == 0 and lib.pd_isa_supported(ffi.NULL) == 0


def test_env_var_forces_isa(monkeypatch):
    x = np.ones(32, np.float32)
    out = np.zeros(1, Q8_DTYPE)

    def call():
        return lib.pd_kernel_quantize_q8(ffi.NULL, ffi.from_buffer("float[]", x),
                                         ffi.from_buffer(out), 32)

    monkeypatch.setenv("PYDECODE_ISA", "foo")
    assert call() == lib.PD_EINVAL
    monkeypatch.setenv("PYDECODE_ISA", "scalar")
    assert call() == lib.PD_OK
    monkeypatch.delenv("PYDECODE_ISA")
    assert call() == lib.PD_OK


def test_bad_inputs_return_errors():
    E = lib.PD_EINVAL
    w = np.zeros(4096, np.uint8)
    x = np.ones(256, np.float32)
    y = np.zeros(256, np.float32)
    pw, px, py = ffi.from_buffer(w), ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", y)
    mm = lib.pd_kernel_matmul
    assert mm(b"scalar", 99, pw, 144, 1, 256, px, 1, py) == E          # unknown type id
    assert mm(b"scalar", -1, pw, 144, 1, 256, px, 1, py) == E
    assert mm(b"scalar", int(QT.Q8_1), pw, 288, 1, 256, px, 1, py) == E  # known, no kernel
    assert mm(b"foo", int(QT.Q4_0), pw, 144, 1, 256, px, 1, py) == E   # unknown isa
    assert mm(b"scalar", int(QT.Q4_0), pw, 144, 1, 48, px, 1, py) == E  # k % 32
    assert mm(b"scalar", int(QT.Q4_0), pw, 100, 1, 256, px, 1, py) == E  # stride < row bytes
    assert mm(b"scalar", int(QT.Q4_0), pw, 144, 0, 256, px, 1, py) == E  # no rows
    assert mm(b"scalar", int(QT.Q4_0), pw, 144, 1, 256, px, 0, py) == E  # no columns
    assert mm(b"scalar", int(QT.Q4_0), ffi.NULL, 144, 1, 256, px, 1, py) == E
    for isa_name in (i.encode() for i in ISAS):
        if not lib.pd_isa_supported(isa_name):
            continue
        for t in K_TYPES:                                            # k % 256 != 0 (but % 32 == 0)
            row = GGML_QUANT_SIZES[t][1]
            assert mm(isa_name, int(t), pw, row, 1, 128, px, 1, py) == E
            assert mm(isa_name, int(t), pw, 2 * row, 1, 384, px, 1, py) == E
            assert mm(isa_name, int(t), pw, row - 1, 1, 256, px, 1, py) == E  # stride < row bytes
            assert mm(isa_name, int(t), pw, row, 1, 256, px, 1, py) == lib.PD_OK
        for t in (QT.Q8_K, QT.IQ2_XXS, QT.IQ1_M, QT.TQ2_0, QT.NVFP4):   # (IQ4_NL/XS, MXFP4: test_iq_formats.py)
            assert mm(isa_name, int(t), pw, 144, 1, 256, px, 1, py) == E   # no kernel
    q = lib.pd_kernel_quantize_q8
    assert q(b"scalar", px, pw, 33) == E and q(b"scalar", px, pw, 0) == E
    assert q(b"foo", px, pw, 32) == E
    qk = _quantize_q8k
    for bad_k in (0, 32, 128, 257, -256):
        assert qk(b"scalar", x.ctypes.data, w.ctypes.data, bad_k) == E
    assert qk(b"foo", x.ctypes.data, w.ctypes.data, 256) == E
    assert qk(b"scalar", None, w.ctypes.data, 256) == E
    dr = lib.pd_kernel_dequantize_row
    assert dr(99, pw, py, 32) == E and dr(int(QT.Q8_1), pw, py, 32) == E
    assert dr(int(QT.Q4_0), pw, py, 48) == E
    for t in K_TYPES:
        assert dr(int(t), pw, py, 32) == E and dr(int(t), pw, py, 384) == E
    assert dr(int(QT.IQ2_XXS), pw, py, 256) == E and dr(int(QT.IQ4_XS), pw, py, 32) == E
    at = lib.pd_kernel_attn
    assert at(b"foo", 0, 1, px, pw, pw, 1, 64, 1.0, py) == E
    assert at(b"scalar", 0, 1, px, pw, pw, 0, 64, 1.0, py) == E
    assert at(b"scalar", 0, 1, px, pw, pw, 1, 0, 1.0, py) == E
    h = np.zeros(8, np.uint16)
    ph = ffi.from_buffer("uint16_t[]", h)
    assert lib.pd_kernel_f32_to_f16(b"foo", ffi.from_buffer("float[]", x), ph, 8) == E
    assert lib.pd_kernel_f32_to_f16(b"scalar", ffi.NULL, ph, 8) == E


def test_type_names():
    """pd_type_name (used in error messages) spells every GGML type id as the gguf package does;
    retired ids keep their historical names; anything else is "unknown"."""
    for t in QT:
        assert _type_name(int(t)).decode() == t.name
    retired = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
               36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}
    for i in range(40):
        want = retired[i] if i in retired else QT(i).name
        assert _type_name(i).decode() == want
    for i in (-1, 43, 99, 1 << 30):
        assert _type_name(i).decode() == "unknown"


# ---------------------------------------------------------------- repacked layouts (built at load)

REPACKED_ISAS = ["scalar", "avx2", "avxvnni", "avxvnni_evex", "avx512"]   # scalar: the plain-C twin


def matmul_repacked(isa_name, qtype, wbytes, nrows, k, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.full((x.shape[0], nrows), np.nan, np.float32)
    rc = lib.pd_kernel_matmul_repacked(isa_name.encode(), int(qtype), ffi.from_buffer(wbytes), wbytes.shape[1],
                                       nrows, k, ffi.from_buffer("float[]", x), x.shape[0],
                                       ffi.from_buffer("float[]", y))
    assert rc == lib.PD_OK
    return y


REPACKED_TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0]


@pytest.mark.parametrize("isa", REPACKED_ISAS)
@pytest.mark.parametrize("qtype", REPACKED_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k", [32, 96, 576, 1536])
@pytest.mark.parametrize("nrows,ncols", [(16, 1), (16, 8), (48, 3), (160, 9), (32, 17), (64, 64)])
def test_repacked_vs_gguf_and_its_twin(isa, qtype, k, nrows, ncols):
    """The legacy formats repacked by 16 rows (PD_*_R16): the AVX-512 and AVX-VNNI kernels against the gguf
    oracle (the same tolerances as every kernel), against their plain-C twin bit for bit, and
    against the file-layout kernel of the same ISA within the scalar-vs-SIMD tolerance."""
    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} is not supported by this CPU")
    wbytes, wd = weights(qtype, nrows, k)
    x = acts(ncols, k)
    y = matmul_repacked(isa, qtype, wbytes, nrows, k, x)
    check_against_oracle(y, wd, x, qtype)
    assert y.tobytes() == matmul_repacked("scalar", qtype, wbytes, nrows, k, x).tobytes()
    xa = np.stack([dq8(q8_numpy(r)) for r in x])
    tol = 2 * TIGHT_REL * (np.abs(xa) @ np.abs(wd).T) + 1e-30
    assert (np.abs(y - matmul(isa, qtype, wbytes, nrows, k, x)) <= tol).all()


KR16_TYPES = [QT.Q4_K, QT.Q6_K]


@pytest.mark.parametrize("isa", REPACKED_ISAS)
@pytest.mark.parametrize("qtype", KR16_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k", [256, 512, 1536])
@pytest.mark.parametrize("nrows,ncols", [(16, 1), (16, 5), (48, 3), (160, 9), (32, 17), (64, 64)])
def test_kquants_repacked_bit_identical_to_the_scalar_file_kernels(isa, qtype, k, nrows, ncols):
    """Q4_K and Q6_K repacked by 16 rows (PD_Q4_K_R16, PD_Q6_K_R16): every ISA's kernel and the
    plain-C twin of the layout give the scalar table's results on the file's layout bit for bit
    (the same exact integers per super-block, then the same float expression), and so pass the
    gguf oracle with its tolerances."""
    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} is not supported by this CPU")
    if isa != "scalar" and not lib.pd_kernel_has_repacked(isa.encode(), int(qtype)):
        pytest.skip(f"no repacked {qtype.name} kernel in the {isa} table")
    wbytes, wd = weights(qtype, nrows, k)
    x = acts(ncols, k)
    y = matmul_repacked(isa, qtype, wbytes, nrows, k, x)
    check_against_oracle(y, wd, x, qtype)
    assert y.tobytes() == matmul("scalar", qtype, wbytes, nrows, k, x).tobytes()


@pytest.mark.parametrize("isa", REPACKED_ISAS)
def test_q4k_repacked_one_column_past_its_stack_table(isa):
    """The one-column Q4_K path keeps each super-block's minimum pairs in a table on the stack
    (256 super-blocks, k <= 65536); a longer row takes the general tile: same bits either way."""
    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} is not supported by this CPU")
    if isa != "scalar" and not lib.pd_kernel_has_repacked(isa.encode(), int(QT.Q4_K)):
        pytest.skip(f"no repacked Q4_K kernel in the {isa} table")
    for k in (65536, 65536 + 256):
        wbytes, _ = weights(QT.Q4_K, 16, k)
        x = acts(1, k)
        assert matmul_repacked(isa, QT.Q4_K, wbytes, 16, k, x).tobytes() == matmul("scalar", QT.Q4_K, wbytes, 16, k, x).tobytes()


@pytest.mark.parametrize("isa", ["avx2", "avxvnni", "avxvnni_evex", "avx512"])
@pytest.mark.parametrize("qtype", [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=lambda t: t.name)
def test_kquant_file_kernels_bit_identical_to_scalar(isa, qtype):
    """Every x86 K-quant kernel on the file's layout sums each super-block's integers exactly and
    then rounds the scalar table's float expression as written: the same bits as the scalar
    kernel (and so as the repacked layouts' kernels: the load-time choice between the two
    layouts never changes a logit). Odd row counts, tiles of 1..4 columns and remainders."""
    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"{isa} is not supported by this CPU")
    for nrows, k, ncols in [(5, 256, 1), (33, 512, 3), (48, 1536, 9), (7, 2048, 17)]:
        wbytes, _ = weights(qtype, nrows, k)
        x = acts(ncols, k)
        assert matmul(isa, qtype, wbytes, nrows, k, x).tobytes() == matmul("scalar", qtype, wbytes, nrows, k, x).tobytes()


@pytest.mark.parametrize("isa_name", ["avx2", "avxvnni", "avxvnni_evex", "avx512"])
@pytest.mark.parametrize("qtype", REPACKED_TYPES + KR16_TYPES, ids=lambda t: t.name)
def test_repacked_bit_identical_in_any_tile(isa_name, qtype):
    """A repacked row group's results do not depend on the columns computed with it (tiles of
    up to 8 columns, the decode column alone) nor on the groups beside it."""
    if not lib.pd_isa_supported(isa_name.encode()):
        pytest.skip(f"no {isa_name} on this CPU")
    nrows, k = 64, 576 if qtype not in KR16_TYPES else 768
    if not lib.pd_kernel_has_repacked(isa_name.encode(), int(qtype)):
        pytest.skip(f"no repacked {qtype.name} kernel in the {isa_name} table")
    wbytes, _ = weights(qtype, nrows, k)
    x = acts(19, k)
    whole = matmul_repacked(isa_name, qtype, wbytes, nrows, k, x)
    for groups in (((0, 1), (1, 9), (9, 19)), tuple((c, c + 1) for c in range(19))):
        cols = np.concatenate([matmul_repacked(isa_name, qtype, wbytes, nrows, k, x[a:b]) for a, b in groups])
        assert cols.tobytes() == whole.tobytes()
    rows = np.concatenate([matmul_repacked(isa_name, qtype, wbytes[a:a + 16], 16, k, x)
                           for a in range(0, nrows, 16)], axis=1)
    assert rows.tobytes() == whole.tobytes()


@pytest.mark.parametrize("nrows,qtype,isa_name", [(15, QT.Q4_1, "scalar"), (17, QT.Q4_1, "scalar"),
                                                   (16, QT.Q2_K, "scalar"), (16, QT.Q5_K, "avx2")])
def test_repacked_rejects_what_it_cannot_do(nrows, qtype, isa_name):
    """Rows not in whole groups of 16, a format without a repacked layout, or an ISA without
    the kernel: PD_EINVAL, never a wrong answer."""
    if not lib.pd_isa_supported(isa_name.encode()):
        pytest.skip(f"{isa_name} not supported here")
    k = 256
    wbytes, _ = weights(qtype, nrows, k)
    x = acts(2, k)
    y = np.zeros((2, nrows), np.float32)
    rc = lib.pd_kernel_matmul_repacked(isa_name.encode(), int(qtype), ffi.from_buffer(wbytes), wbytes.shape[1],
                                       nrows, k, ffi.from_buffer("float[]", x), 2, ffi.from_buffer("float[]", y))
    assert rc == lib.PD_EINVAL


def test_model_repacks_at_load_and_agrees_with_the_file_layout(smollm_path):
    """SmolLM2 (Q4_1, a tied Q8_0 head): on AVX-512 every layer matrix and the head are repacked
    at load (a copy the size of those tensors, reported), and greedy decoding agrees with the file-layout kernels as two
    ISAs do (tests/test_generation.py: the same tokens until a near-tie of the top two logits;
    8-bit activations make 30 layers amplify summation-order differences). repack=False keeps
    everything zero-copy."""
    import pydecode

    runs = {}
    for repack in (True, False):
        with pydecode.Model(smollm_path, n_ctx=128, n_threads=2, repack=repack) as m:
            seq = m.tokenizer.encode("The capital of France is")
            logits, steps = m.prefill(seq).copy(), []
            for _ in range(16):
                t = int(np.argmax(logits))
                steps.append((t, logits.copy()))
                logits = m.decode_step(t, len(seq))
                seq.append(t)
            runs[repack] = (steps, m.repacked, m.repacked_bytes - m.small_copy_bytes, m.isa, m.small_copy_bytes)
    (a, packed, nbytes, isa_name, small), (b, none, zero, _, no_small) = runs[True], runs[False]
    assert none == [] and zero == 0 and no_small == 0
    # the norms copied off the file beside the repacked tensors: 30 layers x 2 + the output norm
    assert small == (30 * 2 + 1) * 576 * 4 if packed else small == 0
    if isa_name in ("avx512", "avxvnni", "avx2"):
        assert len(packed) == 30 * 7 + 1 and all(t == "Q4_1" for _, t, _ in packed[1:])
        assert packed[0][:2] == ("token_embd.weight (as output.weight, the tied output head)", "Q8_0")
        assert nbytes == sum(n for _, _, n in packed)
    else:
        assert packed == [] and nbytes == 0
    for (ta, la), (tb, lb) in zip(a, b):
        if ta != tb:
            top2 = np.sort(lb)[-2:]
            assert top2[1] - top2[0] <= 0.5, top2
            break
    with pytest.raises(ValueError, match="repack"):
        pydecode.Model(smollm_path, n_ctx=64, repack="yes")


def test_repack_skipped_when_memory_is_short(smollm_path, monkeypatch, caplog):
    """Repacking copies weights out of the (evictable) file mapping into process memory: where
    that copy would not fit in the memory available, the model loads with the file's layout
    and says so, rather than pushing the machine into swap."""
    import pydecode
    import pydecode.model as pm

    probe = pydecode.Model(smollm_path, n_ctx=64, n_threads=1, repack=False)
    tight = probe.memory_needed(probe.n_batch) + probe.repack_bytes_at_most() // 2
    probe.close()
    monkeypatch.setattr(pm, "available_memory", lambda: tight)
    with caplog.at_level("WARNING", logger="pydecode"):
        with pydecode.Model(smollm_path, n_ctx=64, n_threads=1) as m:
            assert m.repacked == [] and m.repacked_bytes == 0 and not m.repack
    assert "not enough free memory to repack" in caplog.text


# ---------------------------------------------------------------- the gated FFN activation


@pytest.mark.parametrize("gelu", [0, 1], ids=["silu", "gelu"])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1536])
def test_act_mul_vs_float64(isa, gelu, n):
    """g = act(g) * u (SiLU, tanh-GELU) on every ISA against float64 numpy, with arguments far
    past exp's range on both sides (no overflow, no NaN) and signed zeros."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[:min(n, 8)] = [0.0, -0.0, 100.0, -100.0, 88.5, -88.5, 1e-8, -30.0][:min(n, 8)]
    u = rng.standard_normal(n).astype(np.float32)
    xd = x.astype(np.float64)
    z = 1.5957691216 * (xd + 0.044715 * xd ** 3) if gelu else xd
    with np.errstate(over="ignore"):
        want = xd / (1 + np.exp(-z)) * u
    g = x.copy()
    assert lib.pd_kernel_act_mul(isa.encode(), ffi.from_buffer("float[]", g), ffi.from_buffer("float[]", u), n, gelu) == 0
    assert np.isfinite(g).all()
    assert (np.abs(g - want) <= 1e-5 * np.abs(want) + 1e-6 * np.abs(u)).all()


def test_pydecode_isa_reaches_every_per_isa_entry(smollm_path):
    """PYDECODE_ISA=scalar: the forward pass's table (pd_model_isa), the sampler's vocabulary
    passes (pd_sampler_isa: pd_sum_exp, pd_collect_above, top-k, the truncated draw) and the
    summary folded in the head phase (the model's table) are all the scalar ones: one
    dispatcher serves every per-ISA entry. Without it, the best table here serves them all."""
    import os
    import subprocess
    import sys

    code = f"""
import pydecode
from pydecode._core import ffi, lib
m = pydecode.Model({str(smollm_path)!r}, n_ctx=64, n_threads=1)
print(m.isa, ffi.string(lib.pd_sampler_isa(ffi.NULL)).decode(), ffi.string(lib.pd_isa_best()).decode())
llm = pydecode.LLM(m)
print(len(llm.generate("Once upon a time", 4, temperature=0.8, top_p=0.9, seed=1).tokens))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYDECODE_ISA"}
    forced = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**env, "PYDECODE_ISA": "scalar"})
    assert forced.returncode == 0, forced.stderr
    model_isa, sampler_isa, best = forced.stdout.split()[:3]
    assert model_isa == sampler_isa == "scalar" and forced.stdout.split()[3] == "4"
    free = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert free.returncode == 0, free.stderr
    assert free.stdout.split()[:3] == [best, best, best]


def test_kquant_model_repacks_and_releases_the_file_pages(gemma_path):
    """Gemma 3 270M (Q4_K_M mix: Q4_K, Q6_K, Q5_0, Q8_0): where the table has the repacked
    K-quant kernels every eligible Q4_K/Q6_K matrix is repacked, the file's pages under the
    repacked tensors leave resident memory (madvise), and the logits agree with the file layout
    (different kernels: within float tolerance; the same greedy token)."""
    import pydecode

    def mapped_rss(m):
        """Resident bytes of this model's own mapping of the file. (Other models alive in the test
        process, fixtures of earlier tests, may map the same file: their pages are not this one's.)"""
        start = m.gguf.data.ctypes.data
        end = start + len(m.gguf.data)
        rss, inside = 0, False
        for line in open("/proc/self/smaps"):
            head = line.split(None, 1)[0] if line.strip() else ""
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo < end and start < hi
            elif inside and line.startswith("Rss:"):
                rss += int(line.split()[1]) * 1024
        return rss

    prompt = [2, 818, 5279, 529, 7001, 563]
    out = {}
    for repack in (True, False):
        with pydecode.Model(gemma_path, n_ctx=64, n_threads=2, repack=repack) as m:
            logits = m.prefill(prompt).copy()
            out[repack] = (logits, [t for _, t, _ in m.repacked], m.repacked_bytes, mapped_rss(m),
                           lib.pd_kernel_has_repacked(m.isa.encode(), int(QT.Q4_K)), m.layouts)
    (lt, types, nbytes, rss, has_k, layouts), (lf, none, _, _, _, _) = out[True], out[False]
    assert none == []
    if has_k:
        # Which K-quant layout runs is timed per CPU (pydecode/variants.py): each format the chooser
        # gave the repacked layout is repacked, and the others keep the file's.
        for fmt in ("Q4_K", "Q6_K"):
            assert (fmt in types) == (layouts.get(fmt) == "repacked"), (fmt, layouts, types)
        assert rss <= gemma_path.stat().st_size - 0.8 * nbytes, (rss, nbytes)
    assert int(np.argmax(lt)) == int(np.argmax(lf))
    assert np.abs(lt - lf).max() <= 0.05 * np.abs(lf).max()
