"""Random, valid blocks of the codebook formats gguf has no quantizer for (IQ4_NL, IQ4_XS).

Every byte pattern of their nibbles and 6-bit sub-block scales means something, so random bytes
are a well-formed tensor once the f16 scales written over them are sane: |w| about `scale`
(either sign, varied per block). gguf.quants' dequantize then defines their values. MXFP4 has a
quantizer in gguf (gguf.quants.quantize).
"""
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

# the mean |codebook value| is ~62 and IQ4_XS's mean |ls - 32| ~12 (16 over all 64): d for |w| ~ 1
_QS_OFF = {QT.IQ4_NL: 2, QT.IQ4_XS: 8}
_D_PER_UNIT = {QT.IQ4_NL: 1 / 62, QT.IQ4_XS: 1 / (62 * 12)}


def random_iq_blocks(qtype, rows: int, cols: int, rng, scale: float = 1.0, model_like: bool = False) -> np.ndarray:
    """[rows, row_bytes] uint8 of random IQ4_NL / IQ4_XS blocks whose values are about +-scale.
    model_like: blocks as a quantizer of gaussian weights makes them (for whole models): nibbles
    the codebook entry nearest a gaussian draw, IQ4_XS sub-block scales of one magnitude band
    (|ls - 32| in 8..15, either sign). Uniform nibbles and all 64 scales (the kernel tests' blocks,
    every bit pattern) make rows whose products grow layer by layer into hidden states that 8-bit
    activations quantize 2-4x more coarsely than a real model's."""
    block, size = GGML_QUANT_SIZES[qtype]
    nb = cols // block
    w = rng.integers(0, 256, (rows, nb, size), dtype=np.uint8)
    d = scale * _D_PER_UNIT[qtype] * rng.uniform(0.3, 2.0, (rows, nb)) * rng.choice([1, -1], (rows, nb))
    w[..., 0:2] = d.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    if model_like:   # nibbles: the codebook entry nearest a gaussian draw, as a quantizer picks them
        kv = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])
        g = rng.standard_normal((rows, nb, size - _QS_OFF[qtype], 2)) * 45
        idx = np.abs(g[..., None] - kv).argmin(axis=-1).astype(np.uint8)
        w[..., _QS_OFF[qtype]:] = idx[..., 0] | idx[..., 1] << 4
    if qtype == QT.IQ4_XS and model_like:
        ls = 32 + rng.integers(8, 16, (rows, nb, 8)) * rng.choice([1, -1], (rows, nb, 8))
        lo, hi = (ls & 15).astype(np.uint8), (ls >> 4).astype(np.uint16)
        w[..., 4:8] = lo[..., 0::2] | lo[..., 1::2] << 4                       # scales_l
        sh = (hi << (2 * np.arange(8, dtype=np.uint16))).sum(axis=-1).astype("<u2")
        w[..., 2:4] = sh.view(np.uint8).reshape(rows, nb, 2)                  # scales_h
    return np.ascontiguousarray(w.reshape(rows, -1))
