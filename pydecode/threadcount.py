"""How many threads a one-token decode step uses by default: measured once per CPU and model
shape, not guessed.

A decode step meets at every phase end (core/threadpool.c), a few hundred times per token. On
a small model the matmuls between those meetings are short, so past some thread count another
core adds more waiting than it removes work: on the 2-vCPU Zen 4 host SmolLM2-135M once ran
199 t/s on 1 thread and 167 on 2. Where that point lies depends on the CPU (its cores, their
caches, how far apart they sit) and the model, so the first load of a model shape on a CPU with
the default thread count times decode steps with fewer threads, halving from all of them while
that is faster, and remembers the fastest in the layout cache (pydecode/variants.py's file).
Prefill and batched steps always use every thread (they are matrix x matrix work); the results
of a step do not depend on how many threads computed it. `n_threads=` (the CLI's -t) sets the
count and skips this; PYDECODE_DECODE_THREADS=N forces the decode count.
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from ._core import ffi, lib

log = logging.getLogger("pydecode")

STEPS = 3          # timed decode steps per candidate and round
ROUNDS = 2         # candidates take turns, against a burst of outside load
GAIN = 0.03        # fewer threads must be this much faster to be chosen


def _step_seconds(ptr, n: int, logits) -> float:
    """Best time of a one-token step with n decode threads (slot 0, positions 0..STEPS)."""
    lib.pd_model_set_decode_threads(ptr, n)
    best = float("inf")
    for pos in range(STEPS):
        t = time.perf_counter()
        if lib.pd_decode_step(ptr, 0, 1, pos, logits) != lib.PD_OK:
            return float("inf")
        best = min(best, time.perf_counter() - t)
    return best


def measure(ptr, n_threads: int, logits) -> int:
    """The fastest decode thread count: n_threads, then halves of it while each wins by GAIN."""
    lib.pd_decode_step(ptr, 0, 1, 0, logits)            # warm-up: page faults, the pool awake
    best_n, n = n_threads, n_threads // 2
    while n >= 1:
        t_n = t_best = float("inf")
        for _ in range(ROUNDS):
            t_n = min(t_n, _step_seconds(ptr, n, logits))
            t_best = min(t_best, _step_seconds(ptr, best_n, logits))
        if t_n > t_best * (1 - GAIN):
            break
        best_n, n = n, n // 2
    lib.pd_model_set_decode_threads(ptr, 0)
    return best_n


def forced(n_threads: int) -> int | None:
    """PYDECODE_DECODE_THREADS, checked against the model's thread count (None when unset)."""
    v = os.environ.get("PYDECODE_DECODE_THREADS", "")
    if not v:
        return None
    if not v.isdigit() or not 1 <= int(v) <= n_threads:
        raise ValueError(f"PYDECODE_DECODE_THREADS must be an integer in 1..{n_threads}, got {v!r}")
    return int(v)


def choose(model) -> int:
    """Decode threads for a freshly built model that took the default thread count (before any
    sequence is in its cache: the measurement writes slot 0's first positions)."""
    n = model.n_threads
    if n == 1:
        return 1
    from .variants import cache_get, cache_put, cpu_model
    c = model.config
    shape = (f"decode threads of {n} | {model.isa} | {c.arch} {c.n_layer}x{c.n_embd} ff {c.n_ff} "
             f"vocab {c.n_vocab} | {model.weight_bytes()} B")
    known = cache_get(shape)
    if isinstance(known, int) and 1 <= known <= n:
        return known
    logits = np.zeros(model.n_vocab, np.float32)
    t0 = time.perf_counter()
    k = measure(model._ptr, n, ffi.cast("float *", logits.ctypes.data))
    log.info("decode threads measured on %s in %.0f ms: %d of %d", cpu_model(), 1e3 * (time.perf_counter() - t0), k, n)
    cache_put(shape, k)
    return k
