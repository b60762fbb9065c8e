"""The model: a GGUF file mapped into memory, handed zero-copy to the C core, plus its tokenizer.

`prefill` and `decode_step` are the two calls into C; each runs a whole forward step over every
layer with the GIL released (cffi releases it around every call) and never calls back into Python.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

from . import _core
from .config import GLOBAL_TENSORS, LAYER_TENSORS, ArchConfig, arch_config
from .errors import ContextFullError, ModelError
from .gguf_file import GGUFFile
from .tokenizer import Tokenizer, TokenizerError

ffi, lib = _core.ffi, _core.lib

DEFAULT_N_CTX = 4096
DEFAULT_N_BATCH = 256


def physical_cores() -> int:
    """Physical cores (not hyperthreads) this process may run on: decode is bandwidth/compute bound
    per core, so a second hyperthread on a core mostly adds contention."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:
        allowed = set(range(os.cpu_count() or 1))
    cores = set()
    for cpu in allowed:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "core_id") as f1, open(base + "physical_package_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            return max(1, len(allowed))
    return max(1, len(cores))


class Model:
    """A loaded model. Not thread-safe: one generation at a time (a lock enforces it)."""

    def __init__(self, path: str | os.PathLike, *, n_ctx: int | None = None, n_threads: int | None = None,
                 n_batch: int = DEFAULT_N_BATCH, kv_type: str = "f16", isa: str | None = None):
        """Maps `path` and builds the C model. n_ctx: KV cache positions (default min(4096,
        trained context)); n_threads: default physical cores; n_batch: prefill chunk size;
        kv_type: "f16" or "f32" cache; isa: force "scalar"/"avx2" kernels (default: best, or
        $PYDECODE_ISA)."""
        self.path = Path(path)
        self.gguf = GGUFFile(path)
        self.config: ArchConfig = arch_config(self.gguf)
        try:
            self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata, cache_path=str(path) + ".spm.model")
        except TokenizerError as e:
            raise ModelError(f"{path}: {e}") from None
        if n_ctx is None:
            n_ctx = min(DEFAULT_N_CTX, self.config.n_ctx_train)
        if not isinstance(n_ctx, int) or n_ctx < 1:
            raise ValueError(f"n_ctx must be a positive integer, got {n_ctx!r}")
        if n_threads is None:
            n_threads = physical_cores()
        if not isinstance(n_threads, int) or not 1 <= n_threads <= 512:
            raise ValueError(f"n_threads must be an integer in 1..512, got {n_threads!r}")
        if kv_type not in ("f16", "f32"):
            raise ValueError(f"kv_type must be 'f16' or 'f32', got {kv_type!r}")
        if not isinstance(n_batch, int) or n_batch < 1:
            raise ValueError(f"n_batch must be a positive integer, got {n_batch!r}")
        self.n_ctx, self.n_threads, self.kv_type = n_ctx, n_threads, kv_type
        self._lock = threading.Lock()
        self._ptr = None
        self._build(n_batch, isa)
        self.n_vocab = self.config.n_vocab
        self._logits = np.zeros(self.n_vocab, dtype=np.float32)
        self._logits_ptr = ffi.cast("float *", self._logits.ctypes.data)

    def _build(self, n_batch: int, isa: str | None) -> None:
        c = self.config
        cfg = ffi.new("pd_config *")
        cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv = c.n_layer, c.n_embd, c.n_head, c.n_head_kv
        cfg.head_dim, cfg.n_ff, cfg.n_vocab = c.head_dim, c.n_ff, c.n_vocab
        cfg.n_ctx, cfg.n_batch, cfg.n_threads = self.n_ctx, n_batch, self.n_threads
        cfg.norm_eps, cfg.rope_base, cfg.rope_base_local = c.norm_eps, c.rope_base, c.rope_base_local
        cfg.rope_dim, cfg.rope_neox = c.rope_dim, int(c.rope_neox)
        cfg.attn_scale, cfg.embd_scale, cfg.act_gelu = 0.0, c.embd_scale, int(c.act_gelu)
        cfg.sliding_window, cfg.swa_period = c.sliding_window, c.swa_period
        cfg.rope_freq_scale = c.rope_freq_scale
        cfg.kv_f16 = int(self.kv_type == "f16")
        names = list(GLOBAL_TENSORS) + [f"blk.{l}.{t}" for l in range(c.n_layer) for t in LAYER_TENSORS]
        tensors = ffi.new("pd_tensor[]", len(names))
        # One pointer to the whole mapping; tensors are offsets into it (zero-copy).
        self._base_buf = ffi.from_buffer(self.gguf.data)
        base = ffi.cast("char *", self._base_buf)
        for i, name in enumerate(names):
            t = self.gguf.tensors.get(name)
            if t is None:
                continue
            if t.offset % 4:
                raise ModelError(f"{self.path}: tensor {name} is not 4-byte aligned in the file")
            tensors[i].type = t.type
            tensors[i].data = base + t.offset
            tensors[i].ne0 = t.shape[0]
            tensors[i].ne1 = t.n_elements // t.shape[0]
            tensors[i].row_bytes = t.row_bytes
        err = ffi.new("char[512]")
        if not isa:
            isa = os.environ.get("PYDECODE_ISA") or None
        isa_c = ffi.new("char[]", isa.encode()) if isa else ffi.NULL
        ptr = lib.pd_model_new(cfg, tensors, len(names), isa_c, err, 512)
        if ptr == ffi.NULL:
            msg = ffi.string(err).decode(errors="replace")
            if "instruction set" in msg:
                raise ValueError(msg + " (choose with isa= or PYDECODE_ISA: scalar, avx2)")
            raise ModelError(f"{self.path}: {msg}")
        self._ptr = ptr

    # ---- the two calls into C ----

    def prefill(self, tokens, pos: int = 0, all_logits: bool = False) -> np.ndarray:
        """Runs the prompt tokens at positions pos.. as one block, filling the KV cache.
        Returns the last position's logits (a view reused by the next call), or [n, vocab] if all_logits."""
        toks = np.ascontiguousarray(tokens, dtype=np.int32)
        n = len(toks)
        if n == 0:
            raise ValueError("prefill needs at least one token")
        if pos + n > self.n_ctx:
            raise ContextFullError(f"{n} tokens at position {pos} do not fit in the context of {self.n_ctx} tokens")
        out = np.empty((n, self.n_vocab), dtype=np.float32) if all_logits else self._logits
        with self._lock:
            rc = lib.pd_prefill(self._ptr, ffi.cast("int32_t *", toks.ctypes.data), n, pos,
                                ffi.cast("float *", out.ctypes.data), int(all_logits))
        self._check(rc)
        return out

    def decode_step(self, token: int, pos: int) -> np.ndarray:
        """One token at position pos (the cache holds 0..pos-1): appends its K/V, returns the logits."""
        with self._lock:
            rc = lib.pd_decode_step(self._ptr, int(token), pos, self._logits_ptr)
        self._check(rc)
        return self._logits

    def _check(self, rc: int) -> None:
        if rc == lib.PD_OK:
            return
        msg = ffi.string(lib.pd_model_error(self._ptr)).decode(errors="replace")
        if rc == lib.PD_ERANGE:
            raise ContextFullError(msg)
        raise ValueError(msg)

    # ---- facts ----

    @property
    def isa(self) -> str:
        return ffi.string(lib.pd_model_isa(self._ptr)).decode()

    @property
    def kv_bytes(self) -> int:
        """Bytes allocated for the KV cache (all layers, n_ctx positions)."""
        return int(lib.pd_model_kv_bytes(self._ptr))

    def weight_bytes(self) -> int:
        """Bytes of weights read per decoded token (every tensor once; the tied head is the embedding)."""
        total = sum(t.n_bytes for t in self.gguf.tensors.values())
        if self.config.tied_output:
            total += self.gguf.tensors["token_embd.weight"].n_bytes  # read again as the output head
        # The embedding table itself is only read one row per token.
        total -= self.gguf.tensors["token_embd.weight"].n_bytes
        return total

    def close(self) -> None:
        if self._ptr is not None:
            lib.pd_model_free(self._ptr)
            self._ptr = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
