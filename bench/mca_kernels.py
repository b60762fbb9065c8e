"""Predicted weight bytes per cycle of each hot kernel loop, per CPU, by llvm-mca.

    python bench/mca_kernels.py                       # every loop, the six targets
    python bench/mca_kernels.py --mcpu znver4 --only q4_k
    python bench/mca_kernels.py --json out.json

Decode is memory-bound only if every format's inner loop consumes weight bytes faster than one
core's DRAM stream delivers them (about 10 bytes per cycle: 32 GB/s at 3 GHz, measured on a
Zen 4 host); the goal is >= 1.5x that (15 B/cycle) on every target, so that no CPU is
compute-bound. llvm-mca's prediction is an upper bound (it assumes every load hits L1): confirm
it by measurement (bench/compare_llamacpp.py) on the host you have.

How: for each (kernel, ISA) a tiny C file includes the ISA's kernel source and instantiates the
decode tile (one column) in a function of its own; gcc -O3 -S compiles it with the flags the
build gives that file (pydecode/_build.py); the largest loop of that function (its body is one
step of the tile: one record of 16 repacked rows, or one block of 4 file rows) goes to llvm-mca
for each -mcpu; bytes per step / cycles per step (llvm-mca's block reciprocal throughput) is
the prediction. Needs gcc and llvm-mca (Debian: llvm-19, which knows znver4/5 and the Intel
cores; older ones lack znver4).
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
from pydecode._build import X86_ISA_SOURCES  # noqa: E402

TARGETS = ["znver3", "znver4", "sapphirerapids", "alderlake", "icelake-server", "skylake-avx512"]
# (name, format, ISA source, the call of one decode tile over NB steps, weight bytes per step)
NB = "(1 << 20)"
LOOPS = [
    ("q4_k r16", "q4_k", "csrc/kernels/x86/avx512_kr16.c", f"tile_q4k(1, {NB}, w, x, 0, y, 0)", 2304, "avx512"),
    ("q6_k r16", "q6_k", "csrc/kernels/x86/avx512_kr16.c", f"tile_q6k(1, {NB}, w, x, 0, y, 0)", 3360, "avx512"),
    ("q4_k r16", "q4_k", "csrc/kernels/x86/avx2.c", f"tile2_q4k_c1({NB}, w, x, y)", 2304, "avx2"),
    ("q6_k r16", "q6_k", "csrc/kernels/x86/avx2.c", f"tile2_q6k_c1({NB}, w, x, y)", 3360, "avx2"),
    ("q4_k r16", "q4_k", "csrc/kernels/x86/avxvnni.c", f"tile2_q4k_c1_bdot({NB}, w, x, y)", 2304, "avxvnni"),
    ("q6_k r16", "q6_k", "csrc/kernels/x86/avxvnni.c", f"tile2_q6k_c1({NB}, w, x, y)", 3360, "avxvnni"),
    ("q4_k file", "q4_k", "csrc/kernels/x86/avx512_kquant.c", f"tile_k(T_Q4_K, 4, 1, {NB}, w, 144 * {NB}, x, 0, y, 0)", 576, "avx512"),
    ("q6_k file", "q6_k", "csrc/kernels/x86/avx512_kquant.c", f"tile_k(T_Q6_K, 4, 1, {NB}, w, 210 * {NB}, x, 0, y, 0)", 840, "avx512"),
    ("q4_k file", "q4_k", "csrc/kernels/x86/avx2.c", f"tile_k(T_Q4_K, 4, 1, {NB}, w, 144 * {NB}, x, 0, y, 0)", 576, "avx2"),
    ("q6_k file", "q6_k", "csrc/kernels/x86/avx2.c", f"tile_k(T_Q6_K, 4, 1, {NB}, w, 210 * {NB}, x, 0, y, 0)", 840, "avx2"),
    ("q4_0 r16", "q4_0", "csrc/kernels/x86/avx512.c", f"tile_r16(PD_Q4_0_R16, 1, {NB}, w, x, 0, y, 0)", 288, "avx512"),
    ("q4_1 r16", "q4_1", "csrc/kernels/x86/avx512.c", f"tile_r16(PD_Q4_1_R16, 1, {NB}, w, x, 0, y, 0)", 320, "avx512"),
    ("q5_0 r16", "q5_0", "csrc/kernels/x86/avx512.c", f"tile_r16(PD_Q5_0_R16, 1, {NB}, w, x, 0, y, 0)", 352, "avx512"),
    ("q8_0 r16", "q8_0", "csrc/kernels/x86/avx512.c", f"tile_r16(PD_Q8_0_R16, 1, {NB}, w, x, 0, y, 0)", 544, "avx512"),
]
# Instructions each -mcpu cannot run (its table would never be picked there).
LACKS = {"znver3": {"avx512", "avxvnni"}, "alderlake": {"avx512"}, "znver4": {"avxvnni"}, "icelake-server": {"avxvnni"},
         "skylake-avx512": {"avxvnni"}}


def find_mca() -> str | None:
    for name in ("llvm-mca-19", "llvm-mca-18", "llvm-mca"):
        if p := shutil.which(name):
            return p
    return None


def loop_asm(src: str, call: str, isa: str) -> list[str]:
    """The instructions of the largest loop of a function that runs `call` once."""
    flags, macro = X86_ISA_SOURCES[src]
    with tempfile.TemporaryDirectory() as d:
        c = os.path.join(d, "h.c")
        with open(c, "w") as f:
            f.write(f'#include "{os.path.relpath(os.path.join(ROOT, src), os.path.join(ROOT, "csrc"))}"\n'
                    f"void mca_loop(const char *w, const char *x, float *y) {{ {call}; }}\n")
        s = os.path.join(d, "h.s")
        subprocess.run(["gcc", "-O3", "-std=gnu11", "-S", "-fno-asynchronous-unwind-tables", *flags,
                        f"-D{macro}", "-I", os.path.join(ROOT, "csrc"), "-o", s, c], check=True)
        text = open(s).read()
    return largest_loop(text, "mca_loop")


def largest_loop(text: str, func: str, holding: tuple[str, ...] = ()) -> list[str]:
    """The instructions of the largest loop (a backward jump's span) of func in gcc's asm text,
    among those holding one of the instructions named (any loop if none is named)."""
    body = text[text.index(f"{func}:"):]
    body = body[:body.index(f".size\t{func}")] if f".size\t{func}" in body else body
    lines = [ln.strip() for ln in body.splitlines()]
    labels = {ln[:-1]: i for i, ln in enumerate(lines) if re.match(r"^\.L\w+:$", ln)}
    best = (0, 0)
    for i, ln in enumerate(lines):      # a backward jump closes a loop (x86 j*, aarch64 b* / cb* / tb*)
        m = re.match(r"^(?:j\w+|b\.?[a-z]*|cbn?z|tbn?z)\s+(?:[^,]+,\s*)*(\.L\w+)$", ln)
        if m and m.group(1) in labels and labels[m.group(1)] < i and i - labels[m.group(1)] > best[1] - best[0]:
            span = lines[labels[m.group(1)] + 1:i + 1]
            if not holding or any(ln.split()[0] in holding for ln in span if ln):
                best = (labels[m.group(1)], i)
    return [ln for ln in lines[best[0] + 1:best[1] + 1]
            if ln and not ln.startswith(".") and not ln.startswith("#") and not ln.endswith(":")]


def mca_cycles(mca: str, asm: list[str], mcpu: str, triple: str | None = None) -> float:
    r = subprocess.run([mca, f"-mcpu={mcpu}", "-iterations=200"] + ([f"-mtriple={triple}"] if triple else []), input="\n".join(asm) + "\n", capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "llvm-mca failed")
    total = float(re.search(r"Total Cycles:\s+(\d+)", r.stdout).group(1))
    return total / 200


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mcpu", nargs="+", default=TARGETS)
    ap.add_argument("--only", help="formats containing this (q4_k, q6_k, ...)")
    ap.add_argument("--dram", type=float, default=10.0, help="bytes/cycle one core streams (default 10)")
    ap.add_argument("--json")
    a = ap.parse_args()
    mca = find_mca()
    if not mca:
        print("llvm-mca not found (Debian: apt install llvm-19)", file=sys.stderr)
        return 2
    ver = subprocess.run([mca, "--version"], capture_output=True, text=True).stdout
    llvm = " ".join(re.findall(r"LLVM version [\d.]+", ver))
    print(f"{mca}: {llvm}; gcc "
          f"{subprocess.run(['gcc', '-dumpfullversion'], capture_output=True, text=True).stdout.strip()}; "
          f"goal >= {1.5 * a.dram:.0f} B/cycle (1.5 x {a.dram:g}, one core's DRAM stream)\n")
    rows = []
    for name, fmt, src, call, nbytes, isa in LOOPS:
        if a.only and a.only not in fmt:
            continue
        asm = loop_asm(src, call, isa)
        row = {"kernel": name, "isa": isa, "bytes_per_step": nbytes, "instructions": len(asm), "bpc": {}}
        for cpu in a.mcpu:
            if isa in LACKS.get(cpu, ()):
                continue
            try:
                row["bpc"][cpu] = nbytes / mca_cycles(mca, asm, cpu)
            except (RuntimeError, AttributeError) as e:
                row["bpc"][cpu] = None
                print(f"  {name} {isa} on {cpu}: {e}", file=sys.stderr)
        rows.append(row)
    head = "| kernel | ISA | bytes/step | instr | " + " | ".join(a.mcpu) + " |"
    print(head)
    print("|" + "---|" * (4 + len(a.mcpu)))
    for r in rows:
        cells = []
        for cpu in a.mcpu:
            v = r["bpc"].get(cpu, "n/a")
            cells.append("-" if v == "n/a" else "err" if v is None else
                         (f"**{v:.1f}**" if v < 1.5 * a.dram else f"{v:.1f}"))
        print(f"| {r['kernel']} | {r['isa']} | {r['bytes_per_step']} | {r['instructions']} | " + " | ".join(cells) + " |")
    print(f"\nweight bytes per cycle (bold: under {1.5 * a.dram:.0f}); '-': that CPU lacks the ISA")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
