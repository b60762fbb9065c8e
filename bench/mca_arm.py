"""Predicted weight bytes per cycle of the ARM64 decode loops, ours against llama.cpp's, by llvm-mca;
then the batch tiles (prefill, batched decode) in int8 multiply-adds per cycle.

    python bench/mca_arm.py [--llama-cpp DIR] [--mcpu apple-a14 ...] [--batch-mcpu ...] [--json out.json]

No ARM hardware needed: the cross compiler (Debian gcc-aarch64-linux-gnu) compiles each loop
with -O3 and the -march of its table, llvm-mca (llvm-19 knows apple-a14 = M1, apple-m4,
neoverse-n1, cortex-a76, cortex-x1) predicts its cycles per iteration on each core. The loop is
the largest one of a function that runs a decode tile (one activation column) over many
blocks; the weight bytes it consumes per iteration are counted from its dot instructions (SDOT:
2 per 32-value block and 16 per K-quant super-block; baseline NEON: SMULL + SMULL2 per 16
values, twice as many), so unrolling by the compiler does not skew the figure.

llama.cpp's loops are its ggml_vec_dot_* (ggml-cpu/arch/arm/quants.c of the llama-cpp-python
sdist, --llama-cpp pointing at vendor/llama.cpp), compiled with the same compiler and flags.
Compare with what a core can stream from memory: an Apple M1 P-core reaches about 60 GB/s at
3.2 GHz (~18 B/cycle; the cluster 53-68 GB/s), a Raspberry Pi 5 9-13 GB/s for all four
Cortex-A76 at 2.4 GHz (~1-1.4 B/cycle per core when all stream). llvm-mca assumes every load
hits L1: an upper bound, to be confirmed on hardware.

The batch table: our 4-row x 4-column tile as the dotprod table runs it (SDOT per row and
column) and as the i8mm table runs it (SMMLA per 2 x 2, kernels/arm/mmla.h), against llama.cpp's
i8mm paths: ggml_vec_dot_* with nrc == 2 (2 rows x 2 columns, quants.c) and, with an aarch64
g++, its repacked GEMM tiles (repack.cpp: q4_0 4x8, q8_0 4x8, q4_K 8x8, q6_K 8x8; llama.cpp
repacks those formats at load when the CPU has i8mm). Measured in int8 multiply-adds per
cycle: 16 per SDOT, 32 per SMMLA in the loop, over llvm-mca's cycles per iteration, on the
cores that have i8mm (Apple M2+ share apple-m4's model here; M1 = apple-a14 lacks i8mm).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from mca_kernels import find_mca, largest_loop, mca_cycles  # noqa: E402
from pydecode._build import ARM_ISA_SOURCES  # noqa: E402

TARGETS = ["apple-a14", "apple-m4", "neoverse-n1", "cortex-a76", "cortex-x1"]
BATCH_TARGETS = ["apple-m4", "neoverse-v1", "neoverse-n2", "neoverse-v2", "cortex-x2"]
CC = os.environ.get("AARCH64_CC", "aarch64-linux-gnu-gcc")
CXX = os.environ.get("AARCH64_CXX", "aarch64-linux-gnu-g++")
I8MM = "-march=armv8.2-a+dotprod+i8mm"
NB = "(1 << 20)"
# (format, block bytes, values per block, our decode call: 4-row tile x 1 column, as matmul runs it)
OURS = [
    ("q4_0", 18, 32, f"atile(PD_Q4_0, 4, 1, {NB}, w, {NB} * 18, x, 0, y, 1)"),
    ("q8_0", 34, 32, f"atile(PD_Q8_0, 4, 1, {NB}, w, {NB} * 34, x, 0, y, 1)"),
    ("q4_k", 144, 256, f"ktile(PD_Q4_K, 4, 1, {NB}, w, {NB} * 144, x, 0, y, 1)"),
    ("q6_k", 210, 256, f"ktile(PD_Q6_K, 4, 1, {NB}, w, {NB} * 210, x, 0, y, 1)"),
]
# (format, the tile call of the batch table: 4 rows x 4 columns; dotprod runs arm_tile, i8mm arm_tile_mm)
BATCH = [
    ("q4_0", f"atile(PD_Q4_0, 4, 4, {NB}, w, {NB} * 18, x, 34, y, 1)", f"atile_mm(PD_Q4_0, 4, {NB}, w, {NB} * 18, x, 34, y, 1)"),
    ("q8_0", f"atile(PD_Q8_0, 4, 4, {NB}, w, {NB} * 34, x, 34, y, 1)", f"atile_mm(PD_Q8_0, 4, {NB}, w, {NB} * 34, x, 34, y, 1)"),
    # (the i8mm table runs the K-quants' SDOT tile: None, the same loop as dotprod's)
    ("q4_k", f"ktile(PD_Q4_K, 4, 4, {NB}, w, {NB} * 144, x, 292, y, 1)", None),
    ("q6_k", f"ktile(PD_Q6_K, 4, 4, {NB}, w, {NB} * 210, x, 292, y, 1)", None),
]
LLAMA_GEMM = {"q4_0": "ggml_gemm_q4_0_4x8_q8_0", "q8_0": "ggml_gemm_q8_0_4x8_q8_0",
              "q4_k": "ggml_gemm_q4_K_8x8_q8_K", "q6_k": "ggml_gemm_q6_K_8x8_q8_K"}
# the 16-row repacked layouts (dotprod and i8mm tables; the loader repacks Q4_0..Q8_0 with them):
# one quarter (4 rows) of a record set x 1 column, as matmul_r16 runs decode
OURS_R16 = [
    ("q4_0 r16", 18, 32, f"r16_quarter(PD_Q4_0_R16, 1, {NB}, w, 0, x, 0, y, 1)"),
    ("q8_0 r16", 34, 32, f"r16_quarter(PD_Q8_0_R16, 1, {NB}, w, 0, x, 0, y, 1)"),
]
BATCH_R16 = [   # (the same SDOT-by-element tile in both tables; an SMMLA one on this layout was slower)
    ("q4_0 r16", f"r16_quarter(PD_Q4_0_R16, 4, {NB}, w, 0, x, 34, y, 1)", None),
    ("q8_0 r16", f"r16_quarter(PD_Q8_0_R16, 4, {NB}, w, 0, x, 34, y, 1)", None),
]
LLAMA = {"q4_0": "ggml_vec_dot_q4_0_q8_0", "q8_0": "ggml_vec_dot_q8_0_q8_0",
         "q4_k": "ggml_vec_dot_q4_K_q8_K", "q6_k": "ggml_vec_dot_q6_K_q8_K"}


def compile_asm(src_text: str | None, path: str | None, flags: list[str], includes: list[str], cc: str = CC) -> str:
    with tempfile.TemporaryDirectory() as d:
        c = path
        if src_text is not None:
            c = os.path.join(d, "loop.c")
            with open(c, "w") as f:
                f.write(src_text)
        s = os.path.join(d, "loop.s")
        std = ["-std=gnu++17"] if path and path.endswith(".cpp") else ["-std=gnu11"]
        subprocess.run([cc, "-O3", *std, "-S", "-fno-asynchronous-unwind-tables", "-ffp-contract=off",
                        "-DNDEBUG", *flags, *[f"-I{i}" for i in includes], "-o", s, c], check=True)
        return open(s).read()


def bytes_per_iteration(asm: list[str], isa: str, block_bytes: int, values: int) -> float:
    """Weight bytes one iteration reads, from its dot instructions (16 values each, SDOT; half that
    per SMULL/SMULL2 on baseline NEON)."""
    if isa in ("dotprod", "i8mm"):   # (the i8mm table's decode tile is the dotprod one)
        vals = 16 * sum(ln.split()[0] == "sdot" for ln in asm)
    else:   # the int8 widening multiplies only (SMULL v.8h, v.8b, v.8b and SMULL2 v.8h, v.16b, v.16b)
        vals = 8 * sum(ln.split()[0] in ("smull", "smull2") and ".8h" in ln.split(",")[0] for ln in asm)
    return vals / values * block_bytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mcpu", nargs="+", default=TARGETS)
    ap.add_argument("--llama-cpp", help="llama.cpp source tree (vendor/llama.cpp of the llama-cpp-python sdist)")
    ap.add_argument("--batch-mcpu", nargs="+", default=BATCH_TARGETS)
    ap.add_argument("--json")
    a = ap.parse_args()
    mca = find_mca()
    if not mca or not shutil.which(CC):
        print(f"needs llvm-mca (Debian llvm-19) and {CC} (gcc-aarch64-linux-gnu)", file=sys.stderr)
        return 2
    ver = " ".join(re.findall(r"LLVM version [\d.]+", subprocess.run([mca, "--version"], capture_output=True,
                                                                       text=True).stdout))
    gcc = subprocess.run([CC, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    print(f"{mca}: {ver}; {CC} {gcc}\n")
    rows = []
    for src, (flags, _) in ARM_ISA_SOURCES.items():
        isa = os.path.basename(src)[:-2]
        for fmt, bb, vals, call in OURS + (OURS_R16 if isa != "neon" else []):
            text = compile_asm(f'#include "{os.path.relpath(src, "csrc")}"\n'
                               f"void mca_loop(const char *w, const char *x, float *y) {{ {call}; }}\n",
                               None, flags, [os.path.join(ROOT, "csrc")])
            rows.append(("pydecode", isa, fmt, largest_loop(text, "mca_loop"), bb, vals))
    if a.llama_cpp:
        g = os.path.join(a.llama_cpp, "ggml")
        for isa, march in (("neon", "-march=armv8-a"), ("dotprod", "-march=armv8.2-a+dotprod")):
            text = compile_asm(None, os.path.join(g, "src/ggml-cpu/arch/arm/quants.c"), [march],
                               [os.path.join(g, "include"), os.path.join(g, "src"), os.path.join(g, "src/ggml-cpu")])
            for fmt, bb, vals, _ in OURS:
                dots = ("sdot",) if isa == "dotprod" else ("smull", "smull2")
                rows.append(("llama.cpp", isa, fmt, largest_loop(text, LLAMA[fmt], dots), bb, vals))
    out = []
    print("| loop | table | format | instr/iter | bytes/iter | " + " | ".join(a.mcpu) + " |")
    print("|" + "---|" * (5 + len(a.mcpu)))
    for who, isa, fmt, asm, bb, vals in rows:
        nbytes = bytes_per_iteration(asm, isa, bb, vals)
        bpc = per_cycle(mca, asm, nbytes, a.mcpu, f"{who} {isa} {fmt}")
        out.append({"who": who, "isa": isa, "format": fmt, "instructions": len(asm), "bytes": nbytes, "bpc": bpc})
        cells = ["err" if v is None else f"{v:.1f}" for v in bpc.values()]
        print(f"| {who} | {isa} | {fmt} | {len(asm)} | {nbytes:.0f} | " + " | ".join(cells) + " |")
    print("\nweight bytes per cycle of one core (llvm-mca, L1-resident); higher is better")
    out_batch = batch_table(mca, a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"decode": out, "batch": out_batch}, f, indent=1)
    return 0


def per_cycle(mca: str, asm: list[str], amount: float, cpus: list[str], what: str) -> dict:
    """{cpu: amount per iteration / llvm-mca's cycles per iteration} (None where it failed)."""
    out = {}
    for cpu in cpus:
        try:
            out[cpu] = amount / mca_cycles(mca, asm, cpu, triple="aarch64") if amount else None
        except (RuntimeError, AttributeError) as e:
            out[cpu] = None
            print(f"  {what} on {cpu}: {e}", file=sys.stderr)
    return out


def macs_per_iteration(asm: list[str]) -> int:
    ops = [ln.split()[0] for ln in asm]
    return 16 * ops.count("sdot") + 32 * ops.count("smmla")


def batch_table(mca: str, a) -> list[dict]:
    """int8 multiply-adds per cycle of the batch tiles: ours (dotprod, i8mm) and llama.cpp's i8mm."""
    srcs = {os.path.basename(src)[:-2]: (src, flags) for src, (flags, _) in ARM_ISA_SOURCES.items()}
    rows = []
    for fmt, sdot_call, mm_call in BATCH + BATCH_R16:
        for isa, call in (("dotprod", sdot_call), ("i8mm", mm_call)):
            if call is None:
                continue
            src, flags = srcs[isa]
            text = compile_asm(f'#include "{os.path.relpath(src, "csrc")}"\n'
                               f"void mca_loop(const char *w, const char *x, float *y) {{ {call}; }}\n",
                               None, flags, [os.path.join(ROOT, "csrc")])
            rows.append(("pydecode", f"{isa} 4x4", fmt, largest_loop(text, "mca_loop")))
    if a.llama_cpp:
        g = os.path.join(a.llama_cpp, "ggml")
        inc = [os.path.join(g, "include"), os.path.join(g, "src"), os.path.join(g, "src/ggml-cpu")]
        text = compile_asm(None, os.path.join(g, "src/ggml-cpu/arch/arm/quants.c"), [I8MM], inc)
        for fmt, _, _ in BATCH:
            rows.append(("llama.cpp", "vec_dot 2x2", fmt, largest_loop(text, LLAMA[fmt], ("smmla",))))
        if shutil.which(CXX):
            text = compile_asm(None, os.path.join(g, "src/ggml-cpu/arch/arm/repack.cpp"), [I8MM], inc, cc=CXX)
            names = {m.group(1): m.group(0) for m in re.finditer(r"^(_Z\w*?(ggml_gemm_\w+?_q8_\w)\w*):", text, re.M)}
            for fmt, _, _ in BATCH:
                sym = next((k for k in names if LLAMA_GEMM[fmt] in k), LLAMA_GEMM[fmt])
                try:
                    loop = largest_loop(text, sym, ("smmla",))
                except ValueError:
                    loop = []
                if loop:
                    rows.append(("llama.cpp", "repack gemm", fmt, loop))
                else:   # (q4_0 4x8 is inline asm, whose local labels the loop finder does not follow)
                    print(f"  llama.cpp {LLAMA_GEMM[fmt]}: no compiled loop found (inline asm?)", file=sys.stderr)
        else:
            print(f"  (no {CXX}: llama.cpp's repacked GEMM tiles left out)", file=sys.stderr)
    out = []
    print("\n| loop | tile | format | instr/iter | MACs/iter | " + " | ".join(a.batch_mcpu) + " |")
    print("|" + "---|" * (5 + len(a.batch_mcpu)))
    for who, tile, fmt, asm in rows:
        macs = macs_per_iteration(asm)
        mpc = per_cycle(mca, asm, macs, a.batch_mcpu, f"{who} {tile} {fmt}")
        out.append({"who": who, "tile": tile, "format": fmt, "instructions": len(asm), "macs": macs, "macs_per_cycle": mpc})
        cells = ["err" if v is None else f"{v:.0f}" for v in mpc.values()]
        print(f"| {who} | {tile} | {fmt} | {len(asm)} | {macs} | " + " | ".join(cells) + " |")
    print("\nint8 multiply-adds per cycle of one core in the batch tiles (llvm-mca, L1-resident); higher is better")
    return out


if __name__ == "__main__":
    sys.exit(main())
