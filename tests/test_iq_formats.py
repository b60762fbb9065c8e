"""The codebook formats IQ4_NL, IQ4_XS and MXFP4 (kernels/formats.h) on every kernel table.

gguf.quants is the oracle: its dequantize defines the weights' values (bit for bit against
pd_dequantize_row), its quantize builds MXFP4 weights; IQ4_NL / IQ4_XS weights are random valid
blocks with sane scales (tests/iq_blocks.py), plus blocks at the extremes. The matmuls are checked
as tests/test_kernels.py checks the other block formats: tightly against float64 numpy of the
dequantized weights times the same 8-bit activations, loosely against the float product; each
SIMD table against the scalar twin (IQ4_XS, a K-quant without minima: bit for bit, as the
K-quants; IQ4_NL and MXFP4, whose blocks pair with pd_q8 as Q8_0: within the legacy formats'
summation-order tolerance on x86, bit for bit on ARM: tests/arm/check_kernels.c); a row's result
independent of its tile. Then tiny models in these formats through the whole forward pass against
the numpy reference (tests/reference_llama.py) on every x86 table.
"""
import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

import pydecode
from iq_blocks import random_iq_blocks
from pydecode._core import ffi, lib
from reference_llama import ReferenceModel
from test_kernels import TIGHT_REL, acts, dq8, matmul, q8_numpy, q8k_numpy
from tiny_models import N_VOCAB, write_tiny_model

IQ_TYPES = [QT.IQ4_NL, QT.IQ4_XS, QT.MXFP4]
Q8K_TYPES = (QT.IQ4_XS,)                       # pd_q8k activations; the others pd_q8
X86_ISAS = ["scalar", "avx2", "avxvnni", "avxvnni_evex", "avx512"]
ISAS = X86_ISAS + ["neon", "dotprod", "i8mm"]
KS = {QT.IQ4_NL: [32, 96, 576, 1536], QT.MXFP4: [32, 96, 576, 1536], QT.IQ4_XS: [256, 512, 1536]}


def _supported(isa):
    if not lib.pd_isa_supported(isa.encode()):
        pytest.skip(f"ISA {isa!r} is not compiled in or not supported by this CPU")


def iq_weights(qtype, nrows, k, seed=0):
    """(raw bytes [nrows, row_bytes], dequantized float64 [nrows, k]): MXFP4 by gguf's quantizer
    (per-row offsets and a few large values stretch the blocks' exponents), the others random
    valid blocks; a few blocks at the extremes: every nibble 0 (IQ4_NL's -127), IQ4_XS every
    byte 0xFF past d (scales 31, nibbles 113) or 0x00 (scales -32, nibbles -127), MXFP4 the
    exponents 0 and 1 (subnormal scales) and nibble 7 / 15 (+-12)."""
    rng = np.random.default_rng([seed, int(qtype), nrows, k])
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype == QT.MXFP4:
        w = (rng.standard_normal((nrows, k)) * 0.5 + rng.uniform(-0.3, 0.3, (nrows, 1))).astype(np.float32)
        w[rng.random((nrows, k)) < 0.01] *= 8
        wb = np.ascontiguousarray(gguf.quants.quantize(w, qtype)).view(np.uint8).reshape(nrows, -1).copy()
        blocks = wb.reshape(nrows, k // block, size)
        pick = rng.random(blocks.shape[:2])
        blocks[pick < 0.03, 1:] = 0x77
        blocks[(pick >= 0.03) & (pick < 0.06), 1:] = 0xFF
        blocks[(pick >= 0.06) & (pick < 0.08), 0] = rng.integers(0, 2, ((pick >= 0.06) & (pick < 0.08)).sum())
    else:
        wb = random_iq_blocks(qtype, nrows, k, rng, scale=0.5)
        blocks = wb.reshape(nrows, k // block, size)
        pick = rng.random(blocks.shape[:2])
        blocks[pick < 0.03, 2:] = 0x00
        if qtype == QT.IQ4_XS:
            blocks[(pick >= 0.03) & (pick < 0.06), 2:] = 0xFF
        blocks[(pick >= 0.06) & (pick < 0.08), 0:2] = 0     # d = 0
    wb = np.ascontiguousarray(wb)
    wd = gguf.quants.dequantize(wb, qtype).reshape(nrows, k).astype(np.float64)
    return wb, wd


def _act_dq(qtype, x):
    """Each column's 8-bit activations (the numpy mirrors of quantize_q8 / q8k), dequantized."""
    quant = q8k_numpy if qtype in Q8K_TYPES else q8_numpy
    return np.stack([dq8(quant(row)) for row in x]), [quant(row) for row in x]


def check_against_oracle(y, wd, x, qtype):
    """tests/test_kernels.py's two checks: tight against the same quantized activations, a hard
    bound against the float product (activation rounding |x - dq(x)| <= d/2 per block)."""
    xa, q = _act_dq(qtype, x)
    ref = xa @ wd.T
    tight = TIGHT_REL * (np.abs(xa) @ np.abs(wd).T) + 1e-30
    err = np.abs(y - ref)
    assert (err <= tight).all(), f"tight: worst err/tol {(err / tight).max():.3g}"
    bs = 256 if qtype in Q8K_TYPES else 32
    half_d = np.stack([np.repeat(qc["d"].astype(np.float64), bs) / 2 for qc in q])
    bound = 1.01 * (half_d @ np.abs(wd).T) + tight
    err_f = np.abs(y - x.astype(np.float64) @ wd.T)
    assert (err_f <= bound).all(), f"loose bound: worst err/bound {(err_f / bound).max():.3g}"


# ---------------------------------------------------------------- dequantization, traits


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_dequantize_row_equals_gguf_bit_for_bit(qtype):
    k = 4096
    wb, _ = iq_weights(qtype, 3, k)
    if qtype == QT.MXFP4:   # every exponent, subnormal and overflowing ones included
        wb = wb.copy()
        wb.reshape(-1, 17)[:256, 0] = np.arange(256, dtype=np.uint8)
    want = gguf.quants.dequantize(wb, qtype).reshape(3, k).astype(np.float32)
    for r in range(3):
        y = np.empty(k, np.float32)
        assert lib.pd_kernel_dequantize_row(int(qtype), ffi.from_buffer(wb[r]), ffi.from_buffer("float[]", y), k) == lib.PD_OK
        assert y.tobytes() == want[r].tobytes()


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_traits_match_gguf(qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    assert lib.pd_type_block_bytes(int(qtype)) == size
    assert ffi.string(lib.pd_type_name(int(qtype))).decode() == qtype.name
    y = np.empty(block, np.float32)
    w = np.zeros(size, np.uint8)
    assert lib.pd_kernel_dequantize_row(int(qtype), ffi.from_buffer(w), ffi.from_buffer("float[]", y), block) == lib.PD_OK
    if block > 32:   # IQ4_XS: only whole super-blocks
        assert lib.pd_kernel_dequantize_row(int(qtype), ffi.from_buffer(w), ffi.from_buffer("float[]", y), 32) == lib.PD_EINVAL


# ---------------------------------------------------------------- matmuls


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("nrows,ncols", [(1, 1), (7, 3), (33, 8), (33, 1), (5, 17)])
def test_matmul_vs_gguf(isa, qtype, nrows, ncols):
    _supported(isa)
    for k in KS[qtype]:
        wb, wd = iq_weights(qtype, nrows, k)
        x = acts(ncols, k)
        check_against_oracle(matmul(isa, qtype, wb, nrows, k, x), wd, x, qtype)


@pytest.mark.parametrize("isa", ISAS[1:])
@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_simd_vs_scalar_twin(isa, qtype):
    """ncols 1..17, odd row counts, several k: IQ4_XS bit for bit (exact integers per super-block,
    then the scalar float expression, as every K-quant kernel); IQ4_NL and MXFP4 as the legacy
    formats: x86 sums blocks in vector lanes, within 2 x the tight tolerance."""
    _supported(isa)
    for nrows, k, ncols in [(5, KS[qtype][0], 1), (33, KS[qtype][1], 3), (13, KS[qtype][2], 9), (7, KS[qtype][1], 17),
                            (9, KS[qtype][-1], 2), (4, KS[qtype][0], 16)]:
        wb, wd = iq_weights(qtype, nrows, k)
        x = acts(ncols, k)
        ys, ya = (matmul(i, qtype, wb, nrows, k, x) for i in ("scalar", isa))
        if qtype in Q8K_TYPES or isa in ("neon", "dotprod", "i8mm"):
            assert ya.tobytes() == ys.tobytes(), (nrows, k, ncols)
        else:
            xa, _ = _act_dq(qtype, x)
            tol = 2 * TIGHT_REL * (np.abs(xa) @ np.abs(wd).T) + 1e-30
            assert (np.abs(ya - ys) <= tol).all(), (nrows, k, ncols)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_matmul_bit_identical_in_any_tile(isa, qtype):
    """A row's result does not depend on the tile computing it, nor a column's on its neighbours
    (decode included): the kernels' half of thread-count independence (tests/test_kernels.py)."""
    _supported(isa)
    k, nrows = KS[qtype][1], 13
    wb, _ = iq_weights(qtype, nrows, k)
    x = acts(6, k)
    whole = matmul(isa, qtype, wb, nrows, k, x)
    for cuts in ([1, 6], [3, 7, 11], [9]):
        bounds = list(zip([0] + cuts, cuts + [nrows]))
        parts = np.concatenate([matmul(isa, qtype, wb[a:b], b - a, k, x) for a, b in bounds], axis=1)
        assert parts.tobytes() == whole.tobytes(), f"row cuts {cuts}"
    for groups in (((0, 2), (2, 6)), tuple((c, c + 1) for c in range(6))):
        cols = np.concatenate([matmul(isa, qtype, wb, nrows, k, x[a:b]) for a, b in groups])
        assert cols.tobytes() == whole.tobytes(), f"column groups {groups}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_matmul_extreme_blocks_and_activations(isa, qtype):
    """The largest integer sums each format makes: blocks of the largest codebook magnitudes
    (IQ4_NL / IQ4_XS -127, MXFP4 -12; IQ4_XS with its largest scale) against activations at full
    scale (|q| = 127, same sign, alternating, or the weights' sign): no int16 pair sum or int32
    block sum may overflow."""
    _supported(isa)
    k, nrows = 512, 5
    wb, _ = iq_weights(qtype, nrows, k)
    wb = wb.copy()
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = wb.reshape(nrows, k // block, size)
    if qtype == QT.IQ4_XS:
        blocks[:3, :, 2:8] = 0x00      # scales -32
        blocks[:3, :, 8:] = 0x00       # nibbles 0: -127
    elif qtype == QT.IQ4_NL:
        blocks[:3, :, 2:] = 0x00
    else:
        blocks[:3, :, 1:] = 0xFF       # -12
        blocks[3, :, 1:] = 0x77        # +12
    wd = gguf.quants.dequantize(wb, qtype).reshape(nrows, k).astype(np.float64)
    x = np.stack([np.ones(k), -np.ones(k), np.tile([1.0, -1.0], k // 2), np.sign(wd[0]) + (wd[0] == 0)]).astype(np.float32) * 3
    y = matmul(isa, qtype, wb, nrows, k, x)
    check_against_oracle(y, wd, x, qtype)
    if qtype in Q8K_TYPES or isa == "scalar":
        return
    ys = matmul("scalar", qtype, wb, nrows, k, x)
    xa, _ = _act_dq(qtype, x)
    assert (np.abs(y - ys) <= 2 * TIGHT_REL * (np.abs(xa) @ np.abs(wd).T) + 1e-30).all()


def test_other_formats_still_refused():
    """Formats without kernels keep failing clearly (PD_EINVAL here; a load names tensor and type)."""
    w = np.zeros(4096, np.uint8)
    x = np.zeros(256, np.float32)
    y = np.zeros(1, np.float32)
    for t in (QT.IQ2_XXS, QT.IQ3_S, QT.IQ1_M, QT.TQ2_0, QT.NVFP4, QT.Q8_K):
        assert lib.pd_kernel_matmul(b"scalar", int(t), ffi.from_buffer(w), 512, 1, 256, ffi.from_buffer("float[]", x),
                                    1, ffi.from_buffer("float[]", y)) == lib.PD_EINVAL


# ---------------------------------------------------------------- IQ4_NL, MXFP4 repacked by 16 rows

R16_TYPES = [QT.IQ4_NL, QT.MXFP4]


def matmul_repacked(isa, qtype, wb, nrows, k, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.full((x.shape[0], nrows), np.nan, np.float32)
    assert lib.pd_kernel_matmul_repacked(isa.encode(), int(qtype), ffi.from_buffer(wb), wb.shape[1], nrows, k,
                                         ffi.from_buffer("float[]", x), x.shape[0], ffi.from_buffer("float[]", y)) == lib.PD_OK
    return y


@pytest.mark.parametrize("isa", X86_ISAS)
@pytest.mark.parametrize("qtype", R16_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("nrows,ncols", [(16, 1), (16, 8), (48, 3), (32, 17), (64, 9)])
def test_repacked_vs_gguf_and_its_twin(isa, qtype, nrows, ncols):
    """PD_IQ4_NL_R16 / PD_MXFP4_R16 (formats.h: 16-row records, the nibbles codebook indices), where
    a table has them (every x86 table; ARM keeps the file's layout): against the gguf
    oracle, bit for bit against the plain-C twin, within the scalar-vs-SIMD tolerance of the
    file-layout kernel, and a column's result independent of its neighbours."""
    _supported(isa)
    if isa != "scalar" and not lib.pd_kernel_has_repacked(isa.encode(), int(qtype)):
        pytest.skip(f"no repacked {qtype.name} kernel in the {isa} table")
    for k in KS[qtype]:
        wb, wd = iq_weights(qtype, nrows, k)
        x = acts(ncols, k)
        y = matmul_repacked(isa, qtype, wb, nrows, k, x)
        check_against_oracle(y, wd, x, qtype)
        assert y.tobytes() == matmul_repacked("scalar", qtype, wb, nrows, k, x).tobytes()
        xa, _ = _act_dq(qtype, x)
        tol = 2 * TIGHT_REL * (np.abs(xa) @ np.abs(wd).T) + 1e-30
        assert (np.abs(y - matmul(isa, qtype, wb, nrows, k, x)) <= tol).all()
        cols = np.concatenate([matmul_repacked(isa, qtype, wb, nrows, k, x[c:c + 1]) for c in range(ncols)])
        assert cols.tobytes() == y.tobytes()


@pytest.mark.parametrize("isa", ["avx2", "avxvnni", "avxvnni_evex", "avx512"])
def test_which_tables_repack_the_codebook_formats(isa):
    """Every x86 table has the 16-row records of IQ4_NL and MXFP4 (AVX2 splits the looked-up bytes
    into nibbles for vpmaddubsw, as its Q8_0 records); IQ4_XS (like Q2_K, Q3_K, Q5_K) keeps the
    file's layout."""
    _supported(isa)
    for t in R16_TYPES:
        assert lib.pd_kernel_has_repacked(isa.encode(), int(t)), t.name
    assert not lib.pd_kernel_has_repacked(isa.encode(), int(QT.IQ4_XS))


# ---------------------------------------------------------------- whole models in these formats

# (IQ4_XS blocks are 256 values: every matrix's row length is a multiple of 256)
SHAPE = dict(n_layer=3, n_embd=256, n_head=8, n_head_kv=2, head_dim=32, n_ff=512)
REL_RMS_TOL = 0.04   # tests/test_archs.py's: 8-bit activations against the float reference
CACHE_ATOL = 2e-3
MIXES = {"iq4_nl": (QT.IQ4_NL,), "iq4_xs": (QT.IQ4_XS,), "mxfp4": (QT.MXFP4,),
         "mixed": (QT.IQ4_XS, QT.MXFP4, QT.IQ4_NL, QT.Q8_0)}


def _rel(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


@pytest.fixture(scope="module", params=list(MIXES))
def iq_model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("iq") / f"tiny-{request.param}.gguf"
    write_tiny_model(path, "llama", weight_types=MIXES[request.param], **SHAPE)
    return path


@pytest.mark.parametrize("repack", [True, False], ids=["repack", "file"])
@pytest.mark.parametrize("isa", X86_ISAS)
def test_tiny_model_matches_reference(iq_model, isa, repack):
    _supported(isa)
    toks = np.random.default_rng(1).integers(0, N_VOCAB, 12).tolist()
    ref = ReferenceModel(iq_model).logits(toks)
    with pydecode.Model(iq_model, n_ctx=64, n_threads=2, isa=isa, repack=repack) as m:
        ours = m.prefill(toks, all_logits=True).copy()
        packed = {t for _, t, _ in m.repacked}
    for t in R16_TYPES:
        want = repack and t in MIXES[iq_model.stem.removeprefix("tiny-")] and lib.pd_kernel_has_repacked(isa.encode(), int(t))
        assert (t.name in packed) == bool(want), (t.name, packed)
    assert _rel(ours, ref) <= REL_RMS_TOL
    assert np.mean(np.argmax(ours, 1) == np.argmax(ref, 1)) >= 0.75


def test_tiny_model_cached_decode_equals_recompute(iq_model):
    toks = np.random.default_rng(2).integers(0, N_VOCAB, 6).tolist()
    with pydecode.Model(iq_model, n_ctx=64, n_threads=2, n_batch=4) as m, \
            pydecode.Model(iq_model, n_ctx=64, n_threads=1, n_batch=4) as fresh:
        logits = m.prefill(toks).copy()
        seq = list(toks)
        for _ in range(6):
            t = int(np.argmax(logits))
            logits = m.decode_step(t, len(seq)).copy()
            seq.append(t)
            assert np.abs(fresh.prefill(seq).copy() - logits).max() <= CACHE_ATOL, len(seq)


@pytest.mark.parametrize("types", [(QT.MXFP4,), (QT.IQ4_NL, QT.MXFP4, QT.Q8_0)], ids=["mxfp4", "mixed"])
def test_moe_experts_in_the_codebook_formats(tmp_path, types):
    """Mixture-of-experts tensors in MXFP4 / IQ4_NL (gpt-oss's and many MoE files' formats): the
    experts repack per expert where the table repacks the format, and the model follows the
    reference on every x86 table, repacked or not."""
    path = tmp_path / "moe-iq.gguf"
    write_tiny_model(path, "qwen3moe", n_layer=3, weight_types=types, n_ff_exp=64)
    toks = np.random.default_rng(1).integers(0, N_VOCAB, 12).tolist()
    ref = ReferenceModel(path).logits(toks)
    for isa in ("scalar", "avx2", "avxvnni", "avx512"):
        if not lib.pd_isa_supported(isa.encode()):
            continue
        for repack in (True, False):
            m = pydecode.Model(path, n_ctx=64, n_threads=2, isa=isa, repack=repack)
            assert _rel(m.prefill(toks, all_logits=True), ref) <= REL_RMS_TOL, (isa, repack)
            assert (m.repacked_bytes > 0) == (repack and isa != "scalar"), (isa, repack)
            m.close()
