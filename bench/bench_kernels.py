"""Single-thread kernel throughput: GB/s of weight bytes streamed per mat-vec (decode) and the
same matrix against a block of columns (prefill), for each kernel table on this machine.

    python bench/bench_kernels.py [--rows 4096] [--k 4096] [--types Q4_1,Q4_K] [--ncols 1,16]
                                  [--layout file|repacked]

One 4096 x 4096 matrix (10.5 MB Q4_1, 17.8 MB Q8_0, 9.4 MB Q4_K, 13.8 MB Q6_K) fits a large L3, so two numbers are shown:
"cold" cycles through enough copies (>= 256 MB) that every call streams its weights from DRAM,
as decode does for a real model; "hot" repeats one matrix (L3-resident when it fits). Prefill
(ncols > 1) numbers count each weight byte once per call. --layout repacked times the 16-row
interleaved kernels the loader uses where a table has them (pd_repack of the same rows), as
numpy's 4 KiB pages (the loader's copies are huge-page memory: core/hugemem.c).
"""
import argparse
import time

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from pydecode._core import ffi, lib


# byte offset of the f16 super-block scale d of each K-quant block (dmin follows, if any)
K_D_OFFSET = {QT.Q2_K: 80, QT.Q3_K: 108, QT.Q4_K: 0, QT.Q5_K: 0, QT.Q6_K: 208}


def random_weights(qtype, rows, k, rng):
    """Random quant bytes with sane f16 scales (a valid tensor without running a quantizer)."""
    block, nbytes = GGML_QUANT_SIZES[qtype]
    w = rng.integers(0, 256, (rows, k // block * nbytes), dtype=np.uint8)
    if block == 32:   # scale (and min) f16 fields at the start of each block
        blocks = w.reshape(rows, k // 32, nbytes)
        nscale = 2 if qtype in (QT.Q4_1, QT.Q5_1) else 1
        blocks[..., : 2 * nscale] = np.full(nscale, 0.01, np.float16).view(np.uint8)
    elif block == 256:   # K-quants: every quant/sub-scale byte pattern is valid; set d (dmin)
        blocks = w.reshape(rows, k // 256, nbytes)
        off = K_D_OFFSET[qtype]
        nscale = 2 if qtype in (QT.Q2_K, QT.Q4_K, QT.Q5_K) else 1
        blocks[..., off: off + 2 * nscale] = np.full(nscale, 1e-3, np.float16).view(np.uint8)
    elif qtype in (QT.F16, QT.BF16, QT.F32):
        w = rng.standard_normal((rows, k)).astype(
            {QT.F16: np.float16, QT.F32: np.float32, QT.BF16: np.float32}[qtype])
        if qtype == QT.BF16:
            w = (w.view(np.uint32) >> 16).astype(np.uint16)
        w = w.view(np.uint8).reshape(rows, -1)
    return np.ascontiguousarray(w)


def repacked(qtype, w, rows, k):
    """(type id, bytes) of w in qtype's 16-row layout (None where there is none)."""
    rt = lib.pd_repacked_type(int(qtype))
    if rt < 0:
        return None
    out = np.empty_like(w)
    if lib.pd_repack(int(qtype), ffi.from_buffer(w), w.shape[1], rows, k, ffi.from_buffer(out)) != 0:
        return None
    return rt, out


def bench(isa, qtype, ws, rows, k, ncols, min_time=0.5):
    """Seconds per call (a list), cycling through the weight copies ws."""
    x = np.random.default_rng(1).standard_normal((ncols, k)).astype(np.float32)
    y = np.empty((ncols, rows), np.float32)
    calls = [(isa.encode(), int(qtype), ffi.from_buffer(w), w.shape[1], rows, k,
              ffi.from_buffer("float[]", x), ncols, ffi.from_buffer("float[]", y)) for w in ws]
    for args in calls:
        assert lib.pd_kernel_matmul(*args) == lib.PD_OK   # warm-up (page faults)
    times, start, i = [], time.perf_counter(), 0
    while time.perf_counter() - start < min_time or len(times) < 3:
        t = time.perf_counter()
        lib.pd_kernel_matmul(*calls[i % len(calls)])
        times.append(time.perf_counter() - t)
        i += 1
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--types", default="Q4_1,Q8_0,Q4_K,Q6_K")
    ap.add_argument("--ncols", default="1")
    ap.add_argument("--isas", default="scalar,avx2,avxvnni,avx512")
    ap.add_argument("--layout", choices=("file", "repacked"), default="file")
    ap.add_argument("--rounds", type=int, default=3,
                    help="the ISAs take turns this many times (others' load hits all alike)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    isas = []
    for isa in args.isas.split(","):
        if lib.pd_isa_supported(isa.encode()):
            isas.append(isa)
        else:
            print(f"{isa}: not compiled in or not supported by this CPU")
    print(f"{args.rows} x {args.k}, single thread; GB/s = weight bytes / best time (median)")
    table = []
    for name in args.types.split(","):
        qtype = QT[name]
        w = random_weights(qtype, args.rows, args.k, rng)
        if args.layout == "repacked":
            r = repacked(qtype, w, args.rows, args.k)
            if r is None:
                print(f"{name}: no repacked layout")
                continue
            qtype, w = r
        cold = [w] + [w.copy() for _ in range(-(-(256 << 20) // w.nbytes) - 1)]
        for ncols in map(int, args.ncols.split(",")):
            row = {}
            run = [i for i in isas if args.layout == "file" or lib.pd_kernel_has_repacked(i.encode(), int(QT[name]))]
            for label, ws in (("cold", cold), ("hot", [w])):
                times = {isa: [] for isa in run}
                for _ in range(args.rounds):
                    for isa in run:
                        times[isa] += bench(isa, qtype, ws, args.rows, args.k, ncols,
                                            min_time=0.5 / args.rounds)
                for isa in run:
                    best, med = min(times[isa]), float(np.median(times[isa]))
                    row[label, isa] = w.nbytes / best / 1e9
                    print(f"{name:5s} ncols={ncols:<3d} {isa:7s} {label:4s} {best * 1e3:8.3f} ms "
                          f"{w.nbytes / best / 1e9:6.2f} GB/s (median {w.nbytes / med / 1e9:5.2f})"
                          f" {2 * args.rows * args.k * ncols / best / 1e9:6.1f} GFLOP/s")
            table.append((name, ncols, row))
    print("\nGB/s (best), one column per ISA:")
    head = " ".join(f"{isa:>8s}" for isa in isas)
    print(f"{'type':5s} {'ncols':>5s}  cold: {head}   hot: {head}")
    for name, ncols, row in table:
        cells = [" ".join(f"{row[label, isa]:8.2f}" if (label, isa) in row else f"{'-':>8s}" for isa in isas) for label in ("cold", "hot")]
        print(f"{name:5s} {ncols:5d}        {cells[0]}        {cells[1]}")


if __name__ == "__main__":
    main()
