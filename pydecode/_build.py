"""cffi API-mode build of the C core (used by setup.py's cffi_modules).

The portable sources are compiled by cffi with common flags. ISA-specific kernel files are
compiled separately with their own flags by setup.py's build_ext (see ISA_SOURCES), so one
build runs on any x86-64 and the best kernels are picked at run time from CPUID.
"""
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CSRC = os.path.join("csrc")

COMMON_SOURCES = [
    "csrc/model.c",
    "csrc/threadpool.c",
    "csrc/quant_common.c",
    "csrc/kernels_scalar.c",
    "csrc/dispatch.c",
    "csrc/kernel_api.c",
    "csrc/sampling.c",
    "csrc/sample_summary.c",
    "csrc/bandwidth.c",
    "csrc/mapguard.c",
]
COMMON_FLAGS = ["-O3", "-std=gnu11", "-pthread", "-fno-math-errno", "-Wall", "-Wno-unused-function"]
LINK_FLAGS = ["-pthread", "-lm"]

# PYDECODE_SANITIZE=1 pip install -e . (or python setup.py build_ext --inplace): the C core with
# AddressSanitizer + UndefinedBehaviorSanitizer (setup.py passes COMMON_FLAGS to the ISA files
# too). Python must then load the ASan runtime first (with libstdc++, so that ASan can intercept
# C++ throws in sentencepiece) and not report its own by-design leaks:
#   LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \
#   ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 python -m pytest tests/
# (scripts/test.sh's second stage does exactly this with a sanitized copy of the package.)
# -O1, ASan's advice: precise reports, and a third of -O3's compile time (kernels_avx2.c: 20 s, not 60).
SANITIZE_FLAGS = ["-O1", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]
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
    sources=COMMON_SOURCES,
    include_dirs=["csrc"],
    extra_compile_args=COMMON_FLAGS,
    extra_link_args=LINK_FLAGS,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
