"""Build of pydecode's C core: cffi API mode, plus per-ISA kernel files with their own flags."""
import concurrent.futures
import os
import platform
import runpy

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Read the build script by path: importing the pydecode package needs the extension built.
_build = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pydecode", "_build.py"))
COMMON_FLAGS = _build["COMMON_FLAGS"]

# ISA-specific kernel files: compiled with their own flags, selected at run time from CPUID.
# Never -march=native (and never AMX flags): one build must run on any CPU of the family.
X86_ISA_SOURCES = {
    "csrc/kernels_avx2.c": (["-mavx2", "-mfma", "-mf16c"], "PD_HAVE_AVX2"),
    "csrc/sampling_avx2.c": (["-mavx2", "-mfma"], "PD_HAVE_AVX2"),
    "csrc/sampling_avx512.c": (["-mavx512f", "-mavx512dq", "-mfma"], "PD_HAVE_AVX512"),
    "csrc/kernels_avx512.c": (["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni",
                               "-mfma", "-mf16c", "-mavx2"], "PD_HAVE_AVX512"),
    "csrc/kernels_avxvnni.c": (["-mavxvnni", "-mavx2", "-mfma", "-mf16c"], "PD_HAVE_AVXVNNI"),
}


def isa_sources():
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i686", "x86"):
        return X86_ISA_SOURCES
    return {}


class BuildExt(build_ext):
    def build_extension(self, ext):
        if ext.name == "pydecode._core":
            # Any C source or header change relinks (extra objects are not in the up-to-date check).
            here = os.path.dirname(os.path.abspath(__file__))
            ext.depends = list(ext.depends or []) + sorted(
                os.path.join("csrc", f) for f in os.listdir(os.path.join(here, "csrc")) if f.endswith((".c", ".h")))
            # The ISA files are the slow ones (big SIMD kernels at -O3, or under the sanitizers):
            # compiled side by side, one compiler process per core.
            sources = isa_sources()

            def compile_one(src):
                flags, _ = sources[src]
                return self.compiler.compile([src], output_dir=self.build_temp, include_dirs=["csrc"],
                                             extra_postargs=COMMON_FLAGS + flags + ["-fPIC"])

            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
                for objs in pool.map(compile_one, list(sources)):
                    ext.extra_objects = list(ext.extra_objects or []) + objs
            for _, macro in sources.values():
                if (macro, "1") not in (ext.define_macros or []):
                    ext.define_macros = list(ext.define_macros or []) + [(macro, "1")]
        super().build_extension(ext)


setup(
    cffi_modules=["pydecode/_build.py:ffibuilder"],
    cmdclass={"build_ext": BuildExt},
)
