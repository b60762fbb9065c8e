"""Build of pydecode's C core: cffi API mode for the portable sources, plus the per-ISA kernel
files with their own flags. The source lists and flags are pydecode/_build.py's."""
import concurrent.futures
import os
import runpy
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
# Read the build script by path: importing the pydecode package needs the extension built.
_build = runpy.run_path(os.path.join(HERE, "pydecode", "_build.py"))


class BuildExt(build_ext):
    def flags_supported(self, flags) -> bool:
        """Whether this compiler takes an ISA file's flags (an older gcc lacks -mavxvnni before 11,
        the i8mm extension before 10): that table is then left out, and the rest still builds."""
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "probe.c")
            with open(src, "w") as f:
                f.write("int pd_flags_probe;\n")
            try:
                self.compiler.compile([src], output_dir=d, extra_postargs=flags + ["-fPIC"])
                return True
            except Exception:   # distutils' CompileError (its module moved between setuptools versions)
                return False

    def build_extension(self, ext):
        if ext.name == "pydecode._core":
            # Any C source or header change relinks (extra objects are not in the up-to-date check).
            ext.depends = list(ext.depends or []) + sorted(
                os.path.relpath(os.path.join(d, f), HERE)
                for d, _, files in os.walk(os.path.join(HERE, "csrc")) for f in files if f.endswith((".c", ".h")))
            # The ISA files are the slow ones (big SIMD kernels at -O3, or under the sanitizers):
            # compiled side by side, one compiler process per core.
            sources = {}
            for src, (flags, macro) in _build["isa_sources"]().items():
                if self.flags_supported(flags):
                    sources[src] = (flags, macro)
                else:
                    print(f"pydecode: this compiler rejects {' '.join(flags)}: {src} left out (its kernel table "
                          f"is not built; a newer compiler gives it)", file=sys.stderr)

            def compile_one(src):
                flags, _ = sources[src]
                return self.compiler.compile([src], output_dir=self.build_temp, include_dirs=["csrc"],
                                             extra_postargs=_build["COMMON_FLAGS"] + flags + ["-fPIC"])

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
