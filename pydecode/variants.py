"""Which weight layout a format uses on this CPU, where CPUs disagree: chosen at load by a short
micro-benchmark and remembered per CPU model.

A format with a repacked layout (formats.h: the 16-row interleaves) has two kernels in a table:
the file's layout and the repacked one. For the K-quants the two give bit-identical results
(every x86 K-quant kernel sums exact integers per super-block and then rounds the scalar
table's expression), so the faster may be chosen freely: llvm-mca predicts the 256-bit
repacked loops below the file-layout ones on Intel cores (bench/mca_kernels.py) while a Zen 4
measured them faster. The first load on a CPU times both kernels on a small matrix (a few ms
per format, only for the formats the model has) and stores the winner in
~/.cache/pydecode/variants.json under the CPU's model name, the table and the build of the C
core; later loads read it. Formats whose layouts are not bit-identical (the legacy Q4_0..Q8_0)
are not chosen here: their repacked AVX-512 kernels win everywhere llvm-mca and measurement
looked. PYDECODE_LAYOUT=file|repacked forces the choice; PYDECODE_REPACK=0 (or repack=False)
keeps every layout as the file's.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from ._core import ffi, lib

log = logging.getLogger("pydecode")

CHOSEN = (10, 11, 12, 13, 14)    # Q2_K .. Q6_K (GGML type ids): layouts with bit-identical kernels
ROWS, K = 512, 4096              # 1.2 MB of Q4_K: a few ms per kernel, resident in L2/L3
_memo: dict[str, object] = {}     # the cache file's entries read or written by this process


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith(("model name", "Model", "Hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def _cache_file() -> Path:
    from .registry import models_dir
    return models_dir().parent / "variants.json"   # beside the models: $PYDECODE_HOME or ~/.cache/pydecode


def _build_id() -> str:
    from . import _core
    st = os.stat(_core.__file__)
    return f"{st.st_size}-{int(st.st_mtime)}"


def _seconds(isa: bytes, qtype: int, w: np.ndarray, x: np.ndarray, y: np.ndarray, reps: int = 5) -> float:
    args = (isa, qtype, ffi.from_buffer(w), w.shape[1], ROWS, K, ffi.from_buffer("float[]", x), 1,
            ffi.from_buffer("float[]", y))
    if lib.pd_kernel_matmul(*args) != lib.PD_OK:
        return float("inf")
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        lib.pd_kernel_matmul(*args)
        best = min(best, time.perf_counter() - t)
    return best


def measure(isa: str, qtype: int) -> str:
    """'repacked' or 'file': the faster decode kernel of qtype on table isa, timed now."""
    rt = lib.pd_repacked_type(qtype)
    row_bytes = K // 256 * int(lib.pd_type_block_bytes(qtype))
    w = np.full((ROWS, row_bytes), 0x11, np.uint8)   # small normal f16 scales; the values do not matter
    x, y = np.ones(K, np.float32), np.zeros(ROWS, np.float32)
    a = isa.encode()
    t_file, t_rep = [], []
    for _ in range(2):                                # alternate, against a burst of outside load
        t_file.append(_seconds(a, qtype, w, x, y))
        t_rep.append(_seconds(a, rt, w, x, y))
    return "repacked" if min(t_rep) < min(t_file) else "file"


def cache_get(key: str):
    """What the cache file holds for key on this CPU model and build of the C core (None)."""
    full = f"{cpu_model()} | {key} | {_build_id()}"
    if full not in _memo:
        try:
            data = json.loads(_cache_file().read_text())
            _memo[full] = data.get(full) if isinstance(data, dict) else None
        except (OSError, ValueError):
            _memo[full] = None
    return _memo[full]


def cache_put(key: str, value) -> None:
    """Stores value for key on this CPU model and build (atomically; a failure is only logged)."""
    full = f"{cpu_model()} | {key} | {_build_id()}"
    _memo[full] = value
    path = _cache_file()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(data, dict):
            data = {}
        data[full] = value
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except (OSError, ValueError) as e:
        log.debug("could not store %r in %s: %s", key, path, e)


def choose(isa: str, types) -> dict[int, str]:
    """{type: 'repacked' | 'file'} for the chosen formats among types that isa's table can repack."""
    forced = os.environ.get("PYDECODE_LAYOUT", "")
    if forced not in ("", "file", "repacked"):
        raise ValueError(f"PYDECODE_LAYOUT must be 'file' or 'repacked' (or unset), got {forced!r}")
    todo = [t for t in sorted(set(types)) if t in CHOSEN and lib.pd_kernel_has_repacked(isa.encode(), t)]
    if not todo:
        return {}
    if forced:                                    # every chosen format, no measurement
        return {t: forced for t in todo}
    known = cache_get(isa)
    known = dict(known) if isinstance(known, dict) else {}
    names = {t: ffi.string(lib.pd_type_name(t)).decode() for t in todo}
    missing = [t for t in todo if known.get(names[t]) not in ("file", "repacked")]
    if missing:
        t0 = time.perf_counter()
        for t in missing:
            known[names[t]] = measure(isa, t)
        log.info("weight layouts measured on %s (%s table) in %.0f ms: %s", cpu_model(), isa,
                 1e3 * (time.perf_counter() - t0), ", ".join(f"{names[t]} {known[names[t]]}" for t in missing))
        cache_put(isa, known)
    return {t: known[names[t]] for t in todo}
