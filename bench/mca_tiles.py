"""Int8 multiply-adds per cycle of the batched (prefill / multi-sequence) tiles against the core's
int8 peak: predicted by llvm-mca for six CPUs and measured on this host.

    python bench/mca_tiles.py                          # every tile, C = 1, 2, 4 columns, six targets
    python bench/mca_tiles.py --only q4_1 --cols 4     # one format
    python bench/mca_tiles.py --no-measure             # llvm-mca only

A batched step (16 sequences, a prefill chunk, a speculative verification) multiplies each weight
register by several activation columns, so it is bound by arithmetic, not by DRAM: how close a
tile gets to the core's int8 peak decides its speed. For each tile, one C file includes the ISA's
kernel source and instantiates the tile with C columns (bench/mca_kernels.py's method: gcc -O3 -S
with the flags the build gives that file, the largest loop is one record of 16 repacked rows, or
4 file rows, to llvm-mca); MACs per step / cycles per step is the prediction. The peak is 64 int8
MACs per cycle on every target: two vpmaddubsw ymm (AVX2: Zen 1-4, Skylake .. Golden Cove) or two
vpdpbusd ymm (AVX-VNNI: Alder Lake, Sapphire Rapids) or one vpdpbusd zmm (AVX-512 VNNI: Ice Lake,
Sapphire Rapids, Zen 4 as two halves) per cycle, the throughputs uops.info measures. llvm-mca's own
figure for a loop of independent dots is printed beside it: its models give 127 for icelake-server
and skylake-avx512 (vpdpbusd zmm on two ports) and 32 for znver4, which the measured cores do not. The measured column times the table's
pd_kernel_matmul(_repacked) on an L2-resident matrix (--rows x --k) with C columns, and divides
by the clock /proc/cpuinfo reports (a VM's nominal clock: turbo makes the real figure lower).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mca_kernels import LACKS, TARGETS, find_mca, loop_asm, mca_cycles  # noqa: E402

NB = "(1 << 20)"
# (format, ISA, source, tile call with {C}, int8 MACs per loop step per column, layout)
TILES = [
    ("q4_0", "avx512", "csrc/kernels/x86/avx512.c", "tile_r16(PD_Q4_0_R16, {C}, NB, w, x, 4096, y, 16)", 16 * 32, "repacked"),
    ("q4_1", "avx512", "csrc/kernels/x86/avx512.c", "tile_r16(PD_Q4_1_R16, {C}, NB, w, x, 4096, y, 16)", 16 * 32, "repacked"),
    ("q8_0", "avx512", "csrc/kernels/x86/avx512.c", "tile_r16(PD_Q8_0_R16, {C}, NB, w, x, 4096, y, 16)", 16 * 32, "repacked"),
    ("q4_k", "avx512", "csrc/kernels/x86/avx512_kr16.c", "tile_q4k({C}, NB, w, x, 4096, y, 16)", 16 * 256, "repacked"),
    ("q6_k", "avx512", "csrc/kernels/x86/avx512_kr16.c", "tile_q6k({C}, NB, w, x, 4096, y, 16)", 16 * 256, "repacked"),
    ("q4_1", "avx2", "csrc/kernels/x86/avx2.c", "tile_r16_half(PD_Q4_1_R16, {C}, NB, w, 0, x, 4096, y, 16)", 8 * 32, "repacked"),
    ("q8_0", "avx2", "csrc/kernels/x86/avx2.c", "tile_r16_q8_half(PD_Q8_0_R16, {C}, NB, w, 0, x, 4096, y, 16)", 8 * 32, "repacked"),
    ("q4_k", "avx2", "csrc/kernels/x86/avx2.c", "tile2_q4k({CK}, NB, w, x, 4096, y, 16)", 16 * 256, "repacked"),
    ("q6_k", "avx2", "csrc/kernels/x86/avx2.c", "tile2_q6k({CK}, NB, w, x, 4096, y, 16)", 16 * 256, "repacked"),
    ("q4_1", "avxvnni", "csrc/kernels/x86/avxvnni.c", "tile_r16_half(PD_Q4_1_R16, {C}, NB, w, 0, x, 4096, y, 16)", 8 * 32, "repacked"),
    ("q4_k", "avxvnni", "csrc/kernels/x86/avxvnni.c", "tile2_q4k({CK}, NB, w, x, 4096, y, 16)", 16 * 256, "repacked"),
]
# One loop of independent dot instructions per table: (asm lines, MACs per iteration).
PEAK_LOOPS = {
    "avx512": ([f"vpdpbusd %zmm{16 + i % 4}, %zmm{20 + i % 4}, %zmm{i}" for i in range(12)], 12 * 64),
    "avxvnni": ([f"{{vex}} vpdpbusd %ymm{12 + i % 2}, %ymm{14 + i % 2}, %ymm{i}" for i in range(10)], 10 * 32),
    "avx2": ([f"vpmaddubsw %ymm{12 + i % 2}, %ymm{14 + i % 2}, %ymm{i}" for i in range(10)], 10 * 32),
}
PEAK = 64
GGML = {"q4_0": 2, "q4_1": 3, "q8_0": 8, "q4_k": 12, "q6_k": 14}


def peak(mca: str, isa: str, cpu: str) -> float:
    asm, macs = PEAK_LOOPS[isa]
    return macs / mca_cycles(mca, asm, cpu)


def predicted(mca: str, src: str, call: str, isa: str, cpus: list[str]) -> dict:
    asm = loop_asm(src, call.replace("NB", NB), isa)
    return {cpu: mca_cycles(mca, asm, cpu) for cpu in cpus if isa not in LACKS.get(cpu, ())}


def host_ghz() -> float:
    try:
        mhz = [float(m) for m in re.findall(r"cpu MHz\s*:\s*([\d.]+)", open("/proc/cpuinfo").read())]
        return max(mhz) / 1000 if mhz else 0.0
    except OSError:
        return 0.0


def measured(isa: str, fmt: str, layout: str, rows: int, k: int, cols: int, min_time: float = 0.3) -> float | None:
    """MACs per second of the table's matmul with `cols` columns on an L2-resident matrix."""
    import numpy as np
    from bench_kernels import bench, random_weights, repacked
    from pydecode._core import lib
    if not lib.pd_isa_supported(isa.encode()):
        return None
    qtype = GGML[fmt]
    w = random_weights(qtype, rows, k, np.random.default_rng(0))
    if layout == "repacked":   # the repacked layout's own type id: the kernel alone, no repack per call
        r = repacked(qtype, w, rows, k)
        if r is None or not lib.pd_kernel_has_repacked(isa.encode(), qtype):
            return None
        qtype, w = r
    best = min(bench(isa, qtype, [w], rows, k, cols, min_time))
    return rows * k * cols / best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mcpu", nargs="+", default=TARGETS)
    ap.add_argument("--only", help="formats containing this (q4_1, q4_k, ...)")
    ap.add_argument("--cols", type=int, nargs="+", default=[1, 2, 4], help="columns per tile (1..4)")
    ap.add_argument("--rows", type=int, default=256, help="rows of the measured matrix (L2-resident)")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--no-measure", action="store_true")
    a = ap.parse_args()
    mca = find_mca()
    if not mca:
        print("llvm-mca not found (Debian: apt install llvm-19)", file=sys.stderr)
        return 2
    ghz = host_ghz()
    peaks = {(isa, cpu): peak(mca, isa, cpu) for isa in PEAK_LOOPS for cpu in a.mcpu if isa not in LACKS.get(cpu, ())}
    print(f"int8 peak: {PEAK} MACs/cycle everywhere; llvm-mca's, for a loop of independent dots: " + "; ".join(
        f"{isa} " + ", ".join(f"{cpu} {peaks[isa, cpu]:.0f}" for cpu in a.mcpu if (isa, cpu) in peaks)
        for isa in PEAK_LOOPS) + "\n")
    head = "| tile | ISA | C | " + " | ".join(a.mcpu) + " | this host |"
    print(head)
    print("|" + "---|" * (4 + len(a.mcpu)))
    for fmt, isa, src, call, macs, layout in TILES:
        if a.only and a.only not in fmt:
            continue
        for c in a.cols:
            ck = min(c, 3)    # the 256-bit K-quant tiles take up to 3 columns a pass (kr16_256.h)
            if "{CK}" in call and ck != c:
                continue
            cyc = predicted(mca, src, call.format(C=c, CK=ck), isa, a.mcpu)
            cells = []
            for cpu in a.mcpu:
                if cpu not in cyc:
                    cells.append("-")
                    continue
                v = macs * c / cyc[cpu]
                cells.append(f"{v:.0f} ({100 * v / PEAK:.0f}%)")
            m = None if a.no_measure else measured(isa, fmt, layout, a.rows, a.k, c)
            host = "-"
            if m is not None and ghz:
                v = m / ghz / 1e9
                host = f"{v:.0f} ({100 * v / PEAK:.0f}%)"
            print(f"| {fmt} {layout} | {isa} | {c} | " + " | ".join(cells) + f" | {host} |")
    print(f"\nMACs per cycle (% of that CPU's int8 peak); '-': the CPU lacks the ISA. This host's column: "
          f"pd_kernel_matmul over {a.rows} x {a.k} at {ghz:.2f} GHz as /proc/cpuinfo reports it"
          + f"; % of the {PEAK} MACs/cycle peak.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
