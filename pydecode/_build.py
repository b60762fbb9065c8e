"""The build of pydecode's C core, in one place: every source file, its flags, cffi's module.

cffi (API mode) compiles SOURCES with COMMON_FLAGS; setup.py's build_ext compiles each file of
ISA_SOURCES with its own flags (never -march=native, never AMX) and links it in, so one build runs
on any CPU of its family and the best kernel table is picked at run time (kernels/dispatch.c).
Headers are included by their path under csrc/ ("core/model.h", "kernels/kernels.h").
"""
import os
import platform
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SOURCES = [
    "csrc/core/forward.c", "csrc/core/moe.c", "csrc/core/deltanet.c", "csrc/core/deltanet_chunk.c", "csrc/core/attention.c", "csrc/core/kvstate.c", "csrc/core/step.c", "csrc/core/load.c", "csrc/core/threadpool.c",
    "csrc/core/mapguard.c", "csrc/core/bandwidth.c", "csrc/core/hugemem.c",
    "csrc/kernels/dispatch.c", "csrc/kernels/quant.c", "csrc/kernels/kquant_r16.c", "csrc/kernels/scalar.c", "csrc/kernels/kernel_api.c",
    "csrc/sampling/sampling.c", "csrc/sampling/summary.c",
]
# ISA file -> (its flags, the macro that tells dispatch.c its table is compiled in).
AVX512_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mfma", "-mf16c", "-mavx2"]
X86_ISA_SOURCES = {
    "csrc/kernels/x86/avx2.c": (["-mavx2", "-mfma", "-mf16c"], "PD_HAVE_AVX2"),
    "csrc/kernels/x86/avx512.c": (AVX512_FLAGS, "PD_HAVE_AVX512"),
    "csrc/kernels/x86/avx512_kquant.c": (AVX512_FLAGS, "PD_HAVE_AVX512"),
    "csrc/kernels/x86/avx512_kr16.c": (AVX512_FLAGS, "PD_HAVE_AVX512"),
    "csrc/kernels/x86/avx512_attn.c": (AVX512_FLAGS, "PD_HAVE_AVX512"),
    "csrc/kernels/x86/avxvnni.c": (["-mavxvnni", "-mavx2", "-mfma", "-mf16c"], "PD_HAVE_AVXVNNI"),
    "csrc/kernels/x86/avxvnni_evex.c": (["-mavx512vnni", "-mavx512vl", "-mavx512f", "-mavx2", "-mfma", "-mf16c"],
                                        "PD_HAVE_AVXVNNI_EVEX"),
}


# ARM64 (Linux aarch64, macOS arm64): the baseline table, the dot-product one and the int8
# matrix-multiply one, each with its own -march (never -mcpu=native): one build runs on every
# aarch64 CPU.
ARM_ISA_SOURCES = {
    "csrc/kernels/arm/neon.c": (["-march=armv8-a"], "PD_HAVE_NEON"),
    "csrc/kernels/arm/dotprod.c": (["-march=armv8.2-a+dotprod"], "PD_HAVE_DOTPROD"),
    "csrc/kernels/arm/i8mm.c": (["-march=armv8.2-a+dotprod+i8mm"], "PD_HAVE_I8MM"),
}


def is_arm64() -> bool:
    return platform.machine().lower() in ("aarch64", "arm64")


def isa_sources() -> dict:
    """The ISA files this machine's build compiles (x86-64: the x86 tables; ARM64: the ARM ones)."""
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        return X86_ISA_SOURCES
    if is_arm64():
        return ARM_ISA_SOURCES
    return {}


COMMON_FLAGS = ["-O3", "-std=gnu11", "-pthread", "-fno-math-errno", "-Wall", "-Wno-unused-function"]
# ARM64 compilers fuse a * b + c into one rounding by default (FMA is baseline there, while the
# x86 scalar files are built without it): off, so scalar.c computes the same floats on every
# machine and the ARM tables' block epilogues, written as its expressions, give its bits.
if is_arm64():
    COMMON_FLAGS.append("-ffp-contract=off")
LINK_FLAGS = ["-pthread", "-lm"]

# PYDECODE_SANITIZE=1 pip install -e . (or python setup.py build_ext --inplace): the C core with
# AddressSanitizer + UndefinedBehaviorSanitizer (setup.py passes COMMON_FLAGS to the ISA files
# too). Python must then load the ASan runtime first (with libstdc++, so that ASan can intercept
# C++ throws in sentencepiece) and not report its own by-design leaks:
#   LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \
#   ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 python -m pytest tests/
# (scripts/test.sh's second stage does exactly this with a sanitized copy of the package.)
# -O1, ASan's advice: precise reports, and a third of -O3's compile time. -fno-wrapv undoes the
# -fwrapv of Python's own CFLAGS, which setuptools puts first: with it gcc took 5x as long on the
# sanitized SIMD files (kernels/x86/avx2.c: 190 s, not 40; the whole build 6.7 min on 2 cores),
# and signed overflow is then reported by UBSan instead of defined. -g1: line tables (what ASan's
# reports print) without variable tracking, which gcc gives up on in the big tiles anyway.
SANITIZE_FLAGS = ["-O1", "-fno-wrapv", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g1"]
if os.environ.get("PYDECODE_SANITIZE", "") not in ("", "0"):
    COMMON_FLAGS = [f for f in COMMON_FLAGS if not f.startswith("-O")] + SANITIZE_FLAGS
    LINK_FLAGS = LINK_FLAGS + ["-fsanitize=address,undefined"]


def _cdef_from_header(path):
    """The cdef is the public header minus preprocessor lines (cffi parses plain C decls)."""
    with open(path) as f:
        text = f.read()
    lines = []
    for line in text.splitlines():
        m = re.match(r"\s*#define\s+(PD_E\w+|PD_OK)\s+\(?(-?\d+)\)?", line)
        if m:
            lines.append(f"#define {m.group(1)} {m.group(2)}")
        elif not line.lstrip().startswith("#"):
            lines.append(line)
    return "\n".join(lines)


ffibuilder = FFI()
ffibuilder.cdef(_cdef_from_header(os.path.join(ROOT, "csrc", "pydecode.h")))
ffibuilder.set_source(
    "pydecode._core",
    '#include "pydecode.h"',
    sources=SOURCES,
    include_dirs=["csrc"],
    extra_compile_args=COMMON_FLAGS,
    extra_link_args=LINK_FLAGS,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
