"""The model: a GGUF file mapped into memory, handed zero-copy to the C core, plus its tokenizer.

`prefill` and `decode_step` are the two calls into C; each runs a whole forward step over every
layer with the GIL released (cffi releases it around every call) and never calls back into Python.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np

from . import _core
from .config import GLOBAL_TENSORS, INT_MAX, LAYER_TENSORS, ArchConfig, arch_config, check_tokenizer_metadata
from .hybrid import SSM_TENSORS
from .model_state import SlotBytes
from .errors import ContextFullError, ModelClosedError, ModelError, ModelFileChangedError
from .gguf_file import GGUFFile
from .host import available_memory, physical_cores  # noqa: F401  (monkeypatched here by tests)
from .slots import SlotLedger, ring_extra
from .tokenizer import Tokenizer, TokenizerError

log = logging.getLogger("pydecode")

ffi, lib = _core.ffi, _core.lib

DEFAULT_N_CTX = 4096
DEFAULT_N_BATCH = 256
MAX_N_BATCH = 65536
MAX_THREADS = 512
MAX_N_SEQ = 4096
# The KV cache's formats (pd_config.kv_type): f16 (default), f32, and q8_0 (GGML's Q8_0 blocks:
# per 32 values an f16 scale and 32 int8, 34 bytes: 53% of f16's; needs head_dim % 32 == 0).
KV_TYPES = {"f16": lib.PD_KV_F16, "f32": lib.PD_KV_F32, "q8_0": lib.PD_KV_Q8_0}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class TokenIdError(TypeError, ValueError):
    """A token id that is not an integer: a TypeError, and a ValueError as Model's calls have
    always raised for bad ids."""


def token_ids(tokens, n_vocab: int, name: str = "tokens") -> np.ndarray:
    """`tokens` as a flat int32 array, checked: integers (numpy ones too; never bools or floats)
    within the vocabulary. Python's one check of token ids, where it must happen: before the
    cast to C's int32 (the C core checks them again). Errors name `name`."""
    toks = np.asarray(tokens)
    if toks.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of token ids")
    if toks.dtype.kind not in "iu":   # Python ints beyond int64 (an object array), or not ints at all
        for i, t in enumerate(toks.tolist() if toks.dtype.kind != "O" else toks):
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                raise TokenIdError(f"{name} must be a sequence of token ids (ints); item {i} is "
                                   f"{type(t).__name__} {t!r}")
    bad = np.flatnonzero((toks < 0) | (toks >= n_vocab)) if toks.dtype.kind in "iu" else \
        [i for i, t in enumerate(toks) if not 0 <= t < n_vocab]
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{name}: token id {toks[i]} at index {i} is outside the vocabulary (0..{n_vocab - 1})")
    return np.ascontiguousarray(toks, dtype=np.int32)


class Model(SlotBytes):
    """A loaded model. Its C calls are serialized by a lock (one step at a time, from any
    thread). close() waits for the step in flight, then frees the C model; any use after it
    raises ModelClosedError.

    The weights are the file's own pages, mapped read-only: do not write to or truncate a model
    file while it is loaded (replacing it by a new file, e.g. with a rename, is safe). Each step
    checks that the file is unchanged (size and modification time) and turns a read of a page
    that a truncation removed into an error instead of SIGBUS; either way the model raises
    ModelFileChangedError and refuses every later step."""

    def __init__(self, path: str | os.PathLike, *, n_ctx: int | None = None, n_threads: int | None = None,
                 n_batch: int = DEFAULT_N_BATCH, kv_type: str = "f16", isa: str | None = None,
                 n_seq: int = 1, repack: bool | None = None):
        """Maps `path` and builds the C model. n_ctx: KV cache positions per sequence (default
        min(4096, trained context)); n_threads: default physical cores (one-token decode steps
        then use the fastest count measured once per CPU and model shape, `decode_threads`:
        threadcount.py); n_batch: tokens per step
        (prefill chunk size, and the most tokens one batch_step takes); kv_type: "f16" or "f32"
        cache, or "q8_0" (8-bit blocks, about half of f16's bytes: longer contexts in the same memory,
        and faster decode at depth); isa: force "scalar"/"avx2"/... kernels (default: best, or $PYDECODE_ISA);
        n_seq: sequence slots in the KV cache (sequences that batch_step decodes together);
        repack: let the C core copy the weights whose format has a faster interleaved layout on
        this CPU into it at load (default True, or $PYDECODE_REPACK=0 for False): `repacked`
        lists them, `repacked_bytes` is the memory they take beyond the mapped file."""
        self._ptr = None
        self._guard = -1
        self._lock = threading.Lock()
        self._failed: str | None = None    # why the model refuses to run (the file changed)
        # Parameters first: they are cheap to check and a typo should not wait for a big load.
        if n_ctx is not None and (not _is_int(n_ctx) or not 1 <= n_ctx <= INT_MAX):
            raise ValueError(f"n_ctx must be an integer in 1..{INT_MAX}, got {n_ctx!r}")
        if n_threads is not None and (not _is_int(n_threads) or not 1 <= n_threads <= MAX_THREADS):
            raise ValueError(f"n_threads must be an integer in 1..{MAX_THREADS}, got {n_threads!r}")
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {', '.join(map(repr, KV_TYPES))}, got {kv_type!r}")
        if not _is_int(n_batch) or not 1 <= n_batch <= MAX_N_BATCH:
            raise ValueError(f"n_batch must be an integer in 1..{MAX_N_BATCH}, got {n_batch!r}")
        if not _is_int(n_seq) or not 1 <= n_seq <= MAX_N_SEQ:
            raise ValueError(f"n_seq must be an integer in 1..{MAX_N_SEQ}, got {n_seq!r}")
        if repack is None:
            repack = os.environ.get("PYDECODE_REPACK", "1") != "0"
        if not isinstance(repack, bool):
            raise ValueError(f"repack must be True or False, got {repack!r}")
        self.n_seq, self.repack = n_seq, repack
        self.path = Path(path)
        self.gguf = GGUFFile(path)
        self.config: ArchConfig = arch_config(self.gguf)
        check_tokenizer_metadata(self.gguf)
        try:
            self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata, cache_path=str(path) + ".spm.model")
        except TokenizerError as e:
            raise ModelError(f"{path}: {e}") from None
        except Exception:
            # A tokenizer library refused the vocabulary: name the key at fault if the file is
            # (ModelError); anything else is a bug and goes up as it is.
            check_tokenizer_metadata(self.gguf, deep=True)
            raise
        if self.tokenizer.vocab_size != self.config.n_vocab:
            raise ModelError(f"{path}: the tokenizer has {self.tokenizer.vocab_size} tokens "
                             f"(tokenizer.ggml.tokens) but token_embd.weight has {self.config.n_vocab} rows")
        if n_ctx is None:
            n_ctx = min(DEFAULT_N_CTX, self.config.n_ctx_train)
        threads_given = n_threads is not None
        if n_threads is None:
            n_threads = physical_cores()
        self.n_ctx, self.n_threads, self.kv_type = n_ctx, n_threads, kv_type
        if not isa:
            isa = os.environ.get("PYDECODE_ISA") or None
        self._isa_c = ffi.new("char[]", isa.encode()) if isa else ffi.NULL
        self.n_batch = n_batch
        self._cfg, self._tensors, names = self._c_args()
        self.layouts = self._choose_layouts(isa)
        self._check_memory()
        if self.repack and (avail := available_memory()) is not None and \
                self.memory_needed() + self.repack_bytes_at_most() > avail:
            log.warning("not enough free memory to repack the weights (%.0f MB); keeping the file's layout",
                        self.repack_bytes_at_most() / 1e6)
            self.repack = False
            self._cfg.no_repack = 1
        from . import threadcount
        decode_threads = threadcount.forced(self.n_threads)
        self._build(names)
        self.n_vocab = self.config.n_vocab
        # one-token steps on fewer threads where that is faster (measured once: threadcount.py)
        if decode_threads is None:
            decode_threads = self.n_threads if threads_given else threadcount.choose(self)
        self.decode_threads = decode_threads
        lib.pd_model_set_decode_threads(self._ptr, decode_threads)   # n_threads: all, as 0
        self._logits = np.zeros(self.n_vocab, dtype=np.float32)
        self._logits_ptr = ffi.cast("float *", self._logits.ctypes.data)
        self.slots = SlotLedger(self.n_seq, ring_extra(self))   # who owns each KV slot, what it holds
        self._file_state = self.gguf.file_state()
        self._guard = lib.pd_guard_range(ffi.cast("void *", self._base_buf), len(self.gguf.data))

    def _choose_layouts(self, isa: str | None) -> dict[str, str]:
        """{format: 'repacked' | 'file'} where this CPU's table has both kernels of a format and
        they agree bit for bit (pydecode/variants.py measures once per CPU); the formats that
        keep the file's layout go to the C core as cfg.repack_skip."""
        if not self.repack:
            return {}
        from .variants import choose
        table = isa or ffi.string(lib.pd_isa_best()).decode()   # the table pd_model_new will take
        chosen = choose(table, {int(self._tensors[i].type) for i in range(len(self._tensors))
                                if self._tensors[i].data != ffi.NULL})
        skip = 0
        for t, layout in chosen.items():
            if layout == "file":
                skip |= 1 << t
        self._cfg.repack_skip = skip
        return {ffi.string(lib.pd_type_name(t)).decode(): v for t, v in chosen.items()}

    def _cfg_with(self, **fields):
        cfg = ffi.new("pd_config *", self._cfg[0])
        for k, v in fields.items():
            setattr(cfg, k, v)
        return cfg

    def memory_needed(self, n_batch: int | None = None) -> int:
        """Bytes loading allocates beyond the mapped file and any repacked copy: the KV cache (as
        allocated: sliding-window layers keep a ring of window + n_batch) and a step's scratch
        (the C core's own count, pd_config_memory_bytes); for another n_batch if given."""
        return int(lib.pd_config_memory_bytes(self._cfg if n_batch is None else self._cfg_with(n_batch=n_batch)))

    def repack_bytes_at_most(self) -> int:
        """The bytes repacking at load copies on this CPU (the C core's own rules,
        pd_config_repack_bytes: which tensors, formats and table); `repacked_bytes` says what it
        did. 0 with repack=False."""
        return int(lib.pd_config_repack_bytes(self._cfg_with(no_repack=0), self._tensors, len(self._tensors),
                                              self._isa_c))

    def _check_memory(self) -> None:
        """A clear error before allocating, not an out-of-memory (or a machine swapping to death)
        when the first long prompt touches a KV cache larger than the memory there is."""
        need = self.memory_needed()
        avail = available_memory()
        if avail is not None and need > avail:
            kv = self.n_seq * self.slot_bytes()
            raise ValueError(
                f"n_ctx {self.n_ctx} needs {need} bytes ({need / 2**30:.1f} GiB: a {self.kv_type} KV cache of "
                f"{kv} bytes{f' for {self.n_seq} sequences' if self.n_seq > 1 else ''} plus scratch) but only "
                f"{avail} bytes ({avail / 2**30:.1f} GiB) of memory are available; "
                f"use a smaller n_ctx (at most ~{self.n_ctx * avail // need} here)")

    def _c_args(self):
        """The C core's view of the model: its pd_config and tensor table (pointers into the
        mapping, zero-copy), and the GGUF name of each tensor slot."""
        c = self.config
        cfg = ffi.new("pd_config *")
        cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv = c.n_layer, c.n_embd, c.n_head, c.n_head_kv
        cfg.head_dim, cfg.n_vocab = c.head_dim, c.n_vocab
        for k, v in c.c_fields().items():   # the FFN: dense, or a mixture of experts
            setattr(cfg, k, v)
        cfg.n_ctx, cfg.n_threads = self.n_ctx, self.n_threads
        cfg.norm_eps, cfg.rope_base, cfg.rope_base_local = c.norm_eps, c.rope_base, c.rope_base_local
        cfg.rope_dim, cfg.rope_neox = c.rope_dim, int(c.rope_neox)
        cfg.attn_scale, cfg.embd_scale, cfg.act_gelu = 0.0, c.embd_scale, int(c.act_gelu)
        cfg.sliding_window = c.sliding_window
        # Which layers are local is decided here, once (ArchConfig.layer_is_local); C is told.
        self._local_layers = ffi.new("uint8_t[]", [int(c.layer_is_local(l)) for l in range(c.n_layer)])
        cfg.local_layers = self._local_layers
        if c.recurrent:   # a hybrid (pydecode/hybrid.py): its gated delta nets, the attention's gate
            self._recurrent_layers = ffi.new("uint8_t[]", [int(r) for r in c.recurrent])
            cfg.recurrent_layers = self._recurrent_layers
            cfg.ssm_d_conv, cfg.ssm_n_k, cfg.ssm_n_v, cfg.ssm_d_state = c.ssm_d_conv, c.ssm_n_k, c.ssm_n_v, c.ssm_d_state
        cfg.attn_gated = int(c.attn_gated)
        cfg.rope_freq_scale, cfg.rope_attn_factor = c.rope_freq_scale, c.rope_attn_factor
        cfg.rope_yarn_ext, cfg.rope_yarn_low, cfg.rope_yarn_high = c.rope_yarn
        cfg.kv_type = KV_TYPES[self.kv_type]
        cfg.n_seq = self.n_seq
        cfg.no_repack = int(not self.repack)
        cfg.weights_mapped = 1   # gguf_file maps the file read-only
        cfg.n_batch = self.n_batch
        names = list(GLOBAL_TENSORS) + [f"blk.{l}.{t}" for l in range(c.n_layer) for t in LAYER_TENSORS]
        tensors = ffi.new("pd_tensor[]", len(names))
        # One pointer to the whole mapping; tensors are offsets into it (zero-copy).
        self._base_buf = ffi.from_buffer(self.gguf.data)
        base = ffi.cast("char *", self._base_buf)
        views = c.tensor_views(self.gguf, self.n_ctx)   # a slot: a tensor, or rows of a fused one
        ssm = set(SSM_TENSORS)
        for i, name in enumerate(names):
            if name not in views:
                continue
            parts = name.split(".", 2)
            if parts[0] == "blk" and parts[2] in ssm and not c.layer_is_recurrent(int(parts[1])):
                continue   # (phi3's fused attn_qkv is its Q/K/V views, not a delta net's projection)
            t, row0, rows = views[name]
            if t.offset % 4:
                raise ModelError(f"{self.path}: tensor {t.name} is not 4-byte aligned in the file")
            tensors[i].type = t.type
            tensors[i].data = base + t.offset + row0 * t.row_bytes
            tensors[i].ne0, tensors[i].ne1, tensors[i].row_bytes = t.shape[0], rows, t.row_bytes
        return cfg, tensors, names

    def _build(self, names) -> None:
        err = ffi.new("char[512]")
        ptr = lib.pd_model_new(self._cfg, self._tensors, len(names), self._isa_c, err, 512)
        if ptr == ffi.NULL:
            msg = ffi.string(err).decode(errors="replace")
            if "instruction set" in msg:
                raise ValueError(msg + " (choose with isa= or PYDECODE_ISA: scalar; avx2, avxvnni, avx512 on x86-64; "
                                       "neon, dotprod, i8mm on ARM64)")
            raise ModelError(f"{self.path}: {msg}")
        self._ptr = ptr
        # What the C core repacked at load (one log line per tensor at DEBUG, a summary at INFO).
        self.repacked: list[tuple[str, str, int]] = []
        for i in range(lib.pd_model_n_repacked(ptr)):
            name = names[lib.pd_model_repacked_slot(ptr, i)]
            t = self.gguf.tensors.get(name) or self.gguf.tensors["token_embd.weight"]   # a tied head
            label = name if name == t.name else f"{t.name} (as {name}, the tied output head)"
            self.repacked.append((label, t.type_name, t.n_bytes))
            log.debug("repacked %s (%s, %d bytes) into its interleaved layout", label, t.type_name, t.n_bytes)
        if self.repacked:
            log.info("repacked %d tensors (%.1f MB) at load for the %s kernels, and copied the small ones "
                     "(%.0f kB) off the file", len(self.repacked), self.repacked_bytes / 1e6, self.isa,
                     self.small_copy_bytes / 1e3)

    # ---- the two calls into C ----

    def _block(self, tokens, pos, what: str) -> np.ndarray:
        """A block's token ids, checked: at least one, in the vocabulary, fitting the context at pos."""
        toks = token_ids(tokens, self.n_vocab)
        n = len(toks)
        if n == 0:
            raise ValueError(f"{what} needs at least one token")
        if not isinstance(pos, (int, np.integer)) or pos < 0 or pos + n > self.n_ctx:
            raise ContextFullError(f"{n} tokens at position {pos} do not fit in the context of {self.n_ctx} tokens")
        return toks

    def prefill(self, tokens, pos: int = 0, all_logits: bool = False, seq: int = 0, *,
                lease: object = None) -> np.ndarray:
        """Runs the prompt tokens at positions pos.. of sequence slot seq as one block, filling
        the KV cache. Returns the last position's logits (a view reused by the next call), or
        [n, vocab] if all_logits. `lease`: the slot's lessee in `slots` (the Engine); without
        one the write is direct (refused while a generation leases the slot, see SlotLedger)."""
        toks = self._block(tokens, pos, "prefill")
        n = len(toks)
        out = np.empty((n, self.n_vocab), dtype=np.float32) if all_logits else self._logits
        slot = self._slot(seq)
        with self._lock:
            self._usable(slot, lease)
            rc = lib.pd_prefill(self._ptr, slot, ffi.cast("int32_t *", toks.ctypes.data), n, pos,
                                ffi.cast("float *", out.ctypes.data), int(all_logits))
            self._check(rc)
        return out

    def prefill_hidden(self, tokens, pos: int = 0, seq: int = 0, *, lease: object = None) -> np.ndarray:
        """prefill (the same checks, the same K/V written), but returns every token's final hidden
        state after the output norm, what the head reads: a fresh float32 [n, n_embd] (the head
        is skipped). The states of embeddings (pydecode/embeddings.py). `lease` as in prefill."""
        toks = self._block(tokens, pos, "prefill_hidden")
        n = len(toks)
        out = np.empty((n, self.config.n_embd), dtype=np.float32)
        slot = self._slot(seq)
        with self._lock:
            self._usable(slot, lease)
            rc = lib.pd_prefill_hidden(self._ptr, slot, ffi.cast("int32_t *", toks.ctypes.data), n, pos,
                                       ffi.cast("float *", out.ctypes.data))
            self._check(rc)
        return out

    def decode_step(self, token: int, pos: int, seq: int = 0, *, lease: object = None) -> np.ndarray:
        """One token at position pos of sequence slot seq (the cache holds 0..pos-1): appends its
        K/V, returns the logits (a view reused by the next call). `lease` as in prefill."""
        if not (_is_int(token) or isinstance(token, np.integer)) or not 0 <= token < self.n_vocab:
            token_ids([token], self.n_vocab, "token")   # the same check and message as for a sequence
        if not 0 <= pos < self.n_ctx:
            raise ContextFullError(f"position {pos} is outside the context of {self.n_ctx} tokens")
        slot = self._slot(seq)
        with self._lock:
            self._usable(slot, lease)
            rc = lib.pd_decode_step(self._ptr, slot, int(token), pos, self._logits_ptr)
            self._check(rc)
        return self._logits

    def batch_step(self, tokens, pos, seq, out_idx=None, out: np.ndarray | None = None, *,
                   lease: object = None) -> np.ndarray:
        """One pass over several sequences at once (every weight read once for all of them): token
        i goes to sequence slot seq[i] at position pos[i]. A sequence's tokens must sit at
        consecutive positions, in order: one token for a decode, several for a prefill chunk.
        At most n_batch tokens. Returns the logits of the tokens listed in out_idx (default: all),
        [len(out_idx), vocab]: a fresh array, or the first rows of `out` (float32, C-contiguous,
        [>= len(out_idx), vocab]) when given, which saves a step the allocation (and the page
        faults) of a buffer the size of several vocabularies. `lease` as in prefill (one lessee
        for every slot of the step)."""
        toks = token_ids(tokens, self.n_vocab)
        n = len(toks)
        if n == 0:
            raise ValueError("batch_step needs a flat, non-empty sequence of token ids")
        if n > self.n_batch:
            raise ValueError(f"{n} tokens in one step exceed n_batch={self.n_batch}")
        arrays = []
        for name, a in (("pos", pos), ("seq", seq)):
            a = np.ascontiguousarray(a, dtype=np.int64)
            if a.shape != (n,):
                raise ValueError(f"{name} must have one entry per token ({n}), got shape {a.shape}")
            arrays.append(a)
        p, s = arrays
        buf = out
        out = np.arange(n) if out_idx is None else np.ascontiguousarray(out_idx, dtype=np.int64)
        if out.ndim != 1 or (len(out) and (out.min() < 0 or out.max() >= n)):
            raise ValueError(f"out_idx must list token indices in 0..{n - 1}")
        if buf is not None and (not isinstance(buf, np.ndarray) or buf.dtype != np.float32 or buf.ndim != 2
                                or not buf.flags.c_contiguous or not buf.flags.writeable
                                or buf.shape[1] != self.n_vocab or buf.shape[0] < len(out)):
            raise ValueError(f"out must be a writable C-contiguous float32 array of shape (>= {len(out)}, {self.n_vocab})")
        bad = np.flatnonzero((s < 0) | (s >= self.n_seq))
        if len(bad):
            raise ValueError(f"sequence slot {s[bad[0]]} at index {bad[0]} is outside 0..{self.n_seq - 1}")
        bad = np.flatnonzero((p < 0) | (p >= self.n_ctx))
        if len(bad):
            raise ContextFullError(f"position {p[bad[0]]} at index {bad[0]} is outside the context of {self.n_ctx} tokens")
        t32, p32, s32, o32 = (np.ascontiguousarray(a, dtype=np.int32) for a in (toks, p, s, out))
        logits = np.empty((len(o32), self.n_vocab), dtype=np.float32) if buf is None else buf[:len(o32)]
        i32 = "int32_t *"
        slots = None if lease is not None else sorted(set(s32.tolist()))
        with self._lock:
            self._usable(slots, lease)
            rc = lib.pd_batch_step(self._ptr, ffi.cast(i32, t32.ctypes.data), ffi.cast(i32, p32.ctypes.data),
                                   ffi.cast(i32, s32.ctypes.data), n, ffi.cast(i32, o32.ctypes.data), len(o32),
                                   ffi.cast("float *", logits.ctypes.data))
            self._check(rc)
        return logits

    def _slot(self, seq) -> int:
        if not _is_int(seq) and not isinstance(seq, np.integer) or not 0 <= seq < self.n_seq:
            raise ValueError(f"sequence slot must be an integer in 0..{self.n_seq - 1}, got {seq!r}")
        return int(seq)

    def _usable(self, slots, lease) -> None:
        """Under the lock, before a C call: the model is open and its file intact, and a direct
        write (no lease) may take these slots (an int, a list, or None for none)."""
        if self._ptr is None:
            raise ModelClosedError(f"{self.path.name}: the model is closed")
        if self._failed:
            raise ModelFileChangedError(self._failed)
        if lease is None and slots is not None:
            for slot in ([slots] if isinstance(slots, int) else slots):
                self.slots.direct_write(slot)

    def _check(self, rc: int) -> None:
        """Under the lock, after a C call: the file under the mapping, then the return code."""
        self._check_file()
        if rc == lib.PD_OK:
            return
        msg = ffi.string(lib.pd_model_error(self._ptr)).decode(errors="replace")
        if rc == lib.PD_ERANGE:
            raise ContextFullError(msg)
        raise ValueError(msg)

    def _check_file(self) -> None:
        if lib.pd_guard_faults(self._guard) or self.gguf.file_state() != self._file_state:
            self._failed = (f"{self.path}: the model file was truncated or modified while loaded (its bytes are "
                            f"mapped, not copied), so this model's output can no longer be trusted; load it again. "
                            f"Replace a loaded model file by a new file (a rename) instead of writing to it")
            self.slots.forget_all()
        if self._failed:
            raise ModelFileChangedError(self._failed)

    def check_file(self) -> None:
        """Raises ModelClosedError, or ModelFileChangedError if the file changed since load (a
        cheap fstat; it does not wait for a step in flight)."""
        if self._ptr is None:
            raise ModelClosedError(f"{self.path.name}: the model is closed")
        self._check_file()

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def slot_bytes(self) -> int:
        """KV cache bytes one sequence slot takes (all layers, n_ctx positions; the C core's count)."""
        return int(lib.pd_config_kv_bytes(self._cfg_with(n_seq=1)))

    def grow_slots(self, n_seq: int) -> int:
        """Gives the KV cache up to n_seq sequence slots, as many as the available memory allows
        (the slots it has keep their contents). Returns the slot count now."""
        if not _is_int(n_seq) or not 1 <= n_seq <= MAX_N_SEQ:
            raise ValueError(f"n_seq must be an integer in 1..{MAX_N_SEQ}, got {n_seq!r}")
        avail = available_memory()
        if avail is not None:
            n_seq = min(n_seq, self.n_seq + int(avail * 0.9) // max(1, self.slot_bytes()))
        if n_seq <= self.n_seq:
            return self.n_seq
        with self._lock:
            self._usable(None, None)
            rc = lib.pd_model_grow_seq(self._ptr, n_seq)
            if rc != lib.PD_OK:
                raise MemoryError(ffi.string(lib.pd_model_error(self._ptr)).decode(errors="replace"))
            self.slots.grow(n_seq)
            self.n_seq = n_seq
        return n_seq

    # ---- facts ----

    @property
    def isa(self) -> str:
        with self._lock:
            self._usable(None, None)
            return ffi.string(lib.pd_model_isa(self._ptr)).decode()

    @property
    def kv_row_bytes(self) -> int:
        """Bytes of one position's K (or V) in one layer: n_head_kv x head_dim values of the cache's
        format (x 2 for f16, x 4 for f32, x 34/32 for q8_0)."""
        with self._lock:
            self._usable(None, None)
            return int(lib.pd_model_kv_row_bytes(self._ptr))

    @property
    def kv_elem_bytes(self) -> float:
        """Bytes of one cached K or V value: 2 (f16), 4 (f32), 34/32 (q8_0, scales included)."""
        return self.kv_row_bytes / (self.config.n_head_kv * self.config.head_dim)

    @property
    def kv_bytes(self) -> int:
        """Bytes allocated for the KV cache (all layers, n_ctx positions, n_seq slots)."""
        with self._lock:
            self._usable(None, None)
            return int(lib.pd_model_kv_bytes(self._ptr))

    def set_summary(self, inv_t: float) -> None:
        """With inv_t > 0, each following step that returns one row of logits also summarizes
        them for a truncated draw at temperature 1/inv_t (csrc/sampling/summary.h), so that `sample_summary`
        needs no pass over the vocabulary; 0 turns it off."""
        with self._lock:
            self._usable(None, None)
            rc = lib.pd_model_set_summary(self._ptr, float(inv_t))
            if rc != lib.PD_OK:
                raise ValueError(ffi.string(lib.pd_model_error(self._ptr)).decode(errors="replace"))

    def sample_summary(self, top_k: int, top_p: float, min_p: float, u: float) -> int:
        """The truncated draw from the last step's summary: a token id, or -1 when the summary
        cannot decide it (sample the logits instead), -2 when the last step made none."""
        with self._lock:
            self._usable(None, None)
            return lib.pd_model_summary_sample(self._ptr, top_k, top_p, min_p, u)

    def sample_summary_masked(self, top_k: int, top_p: float, min_p: float, u: float, mask) -> int:
        """sample_summary over the tokens a structured-output bitmask allows (mask: a uint32_t *
        cdata); -1 when the summary cannot decide it exactly, -2 when the last step made none."""
        with self._lock:
            self._usable(None, None)
            return lib.pd_model_summary_sample_masked(self._ptr, top_k, top_p, min_p, u, mask)

    def summary_propose(self, top_k: int, top_p: float, min_p: float, u: float, proposal) -> int:
        """Structured output's untruncated draw from the last step's summary into proposal (a
        pd_proposal *; Sampler.propose): a token id, -1 past its candidates, -2 when the step made none."""
        with self._lock:
            self._usable(None, None)
            return lib.pd_model_summary_propose(self._ptr, top_k, top_p, min_p, u, proposal)

    def share_pool(self, other: "Model") -> None:
        """Runs this model's steps on `other`'s threads, under `other`'s lock (a draft model beside
        its target: they take turns, and two pools would spin against each other on the same
        cores). Both need the same n_threads."""
        with self._lock, other._lock:
            if self._ptr is None or other._ptr is None:
                raise ModelClosedError("the model is closed")
            self._check(lib.pd_model_share_pool(self._ptr, other._ptr))
            self._lock = other._lock

    @property
    def repacked_bytes(self) -> int:
        """Memory held by weights repacked at load (a copy of those tensors, beyond the mapped file),
        including `small_copy_bytes`."""
        return int(lib.pd_model_repacked_bytes(self._ptr)) if self._ptr is not None else 0

    @property
    def small_copy_bytes(self) -> int:
        """Of `repacked_bytes`, the small tensors (norms, biases, sinks) copied off the file beside
        the repacked ones, so that reading them does not fault the released pages back in."""
        return int(lib.pd_model_small_copy_bytes(self._ptr)) if self._ptr is not None else 0

    def weight_bytes(self) -> int:
        """Bytes of weights read per decoded token (ArchConfig.weight_bytes_per_token)."""
        return self.config.weight_bytes_per_token(self.gguf)

    def close(self) -> None:
        """Frees the C model once the step in flight (if any) has ended; later calls raise
        ModelClosedError. Idempotent."""
        with self._lock:
            if self._ptr is not None:
                lib.pd_model_free(self._ptr)
                self._ptr = None
            if self._guard >= 0:
                lib.pd_unguard_range(self._guard)
                self._guard = -1

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
