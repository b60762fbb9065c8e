"""GGUF files: metadata, tensor directory, and zero-copy tensor data from a memory mapping.

The `gguf` package's GGUFReader is the reference reader (our tests compare against it), but it
builds a numpy object per array element and takes ~2.4 s on SmolLM2's 49k-token vocabulary (and
several times that on Gemma's 262k). This reader walks the header once with struct, checks every
length against the bytes that remain (a truncated or hostile file raises ModelError naming what
is wrong, never a crash or a huge allocation), and maps the data section without copying it.
The block sizes and type names come from the gguf package.
"""
from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import ModelError

GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4
MAX_NESTING = 4
MAX_DIM = 1 << 40  # per dimension; a tensor's bytes must also fit in the file

# GGUF metadata value types -> (struct format, size); 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP_DTYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
              7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


def type_name(type_id: int) -> str:
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type#{type_id}"


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor directory. shape is in GGML order: shape[0] is the row length."""

    name: str
    shape: tuple[int, ...]
    type: int
    offset: int  # absolute byte offset in the file
    n_bytes: int

    @property
    def type_name(self) -> str:
        return type_name(self.type)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type)]
        return self.shape[0] // block * size


class _Cursor:
    """Bounds-checked reads over the header bytes."""

    def __init__(self, buf: memoryview, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelError(f"{self.path}: truncated GGUF file: {what} needs {n} bytes at offset {self.pos}, "
                             f"file has {len(self.buf)}")

    def scalar(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype], what)
        if vtype == 8:
            return self.string(what)
        if vtype == 9:
            if depth >= MAX_NESTING:
                raise ModelError(f"{self.path}: metadata {what}: arrays nested too deeply")
            etype = self.scalar("<I", what)
            count = self.scalar("<Q", what)
            if etype in _NP_DTYPES:  # numeric arrays: one vectorized read
                size = np.dtype(_NP_DTYPES[etype]).itemsize
                self.need(count * size, what)
                arr = np.frombuffer(self.buf, dtype=_NP_DTYPES[etype], count=count, offset=self.pos)
                self.pos += count * size
                return arr.tolist()
            if etype == 8:
                self.need(count * 8, what)  # every string has at least its 8-byte length
                return [self.string(what) for _ in range(count)]
            if etype == 9:
                self.need(count * 12, what)
                return [self.value(9, what, depth + 1) for _ in range(count)]
            raise ModelError(f"{self.path}: metadata {what}: unknown array element type {etype}")
        raise ModelError(f"{self.path}: metadata {what}: unknown value type {vtype}")


class GGUFFile:
    """A memory-mapped GGUF file. `metadata` holds plain Python values; `tensors` the directory;
    `data` is a read-only uint8 view of the whole file (no copy) that tensor pointers index into."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            raise ModelError(f"{self.path}: cannot open model file: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ModelError(f"{self.path}: not a regular file (a directory, device or pipe)")
            size = st.st_size
            if size < 24:
                raise ModelError(f"{self.path}: not a GGUF file (only {size} bytes)")
            try:
                self._mmap = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise ModelError(f"{self.path}: cannot map model file: {e}") from None
        except BaseException:
            os.close(fd)
            raise
        # The descriptor stays open: file_state() asks it whether the mapped file (this inode,
        # even if the path is renamed over) was written to or truncated since.
        self._fd = fd
        self._state = (st.st_size, st.st_mtime_ns)
        self.file_size = size
        self.data = np.frombuffer(self._mmap, dtype=np.uint8)
        self._parse(memoryview(self._mmap))

    def _parse(self, buf: memoryview) -> None:
        c = _Cursor(buf, self.path)
        c.need(4, "magic")
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise ModelError(f"{self.path}: not a GGUF file (magic {bytes(buf[:4])!r})")
        c.pos = 4
        self.version = c.scalar("<I", "version")
        if self.version not in (2, 3):
            hint = " (a big-endian file?)" if self.version & 0xFFFF == 0 else ""
            raise ModelError(f"{self.path}: unsupported GGUF version {self.version}{hint} (supported: 2, 3)")
        n_tensors = c.scalar("<Q", "tensor count")
        n_kv = c.scalar("<Q", "metadata count")
        # Each entry takes some bytes, so a count larger than the file is hostile, not big.
        if n_tensors > self.file_size // 24 or n_kv > self.file_size // 12:
            raise ModelError(f"{self.path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys "
                             f"in a {self.file_size}-byte file)")
        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = c.string(f"key #{i}")
            if key in self.metadata:
                raise ModelError(f"{self.path}: duplicate metadata key {key}")
            vtype = c.scalar("<I", f"type of {key}")
            self.metadata[key] = c.value(vtype, key)
        infos = []
        for i in range(n_tensors):
            name = c.string(f"tensor #{i} name")
            n_dims = c.scalar("<I", f"dims of {name}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise ModelError(f"{self.path}: tensor {name}: {n_dims} dimensions (1..{MAX_DIMS} allowed)")
            shape = tuple(c.scalar("<Q", f"shape of {name}") for _ in range(n_dims))
            ttype = c.scalar("<I", f"type of {name}")
            rel = c.scalar("<Q", f"offset of {name}")
            infos.append((name, shape, ttype, rel))
        align = self.metadata.get("general.alignment", 32)
        if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
            raise ModelError(f"{self.path}: general.alignment {align!r} is not a power of two")
        self.alignment = align
        self.header_size = c.pos  # magic .. end of the tensor directory (before the padding)
        self.data_start = (c.pos + align - 1) // align * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, ttype, rel in infos:
            if name in self.tensors:
                raise ModelError(f"{self.path}: duplicate tensor name {name}")
            try:
                qtype = GGMLQuantizationType(ttype)
                block, bsize = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ModelError(f"{self.path}: tensor {name} has unknown type id {ttype}") from None
            if any(d <= 0 or d > MAX_DIM for d in shape):
                raise ModelError(f"{self.path}: tensor {name} has invalid shape {list(shape)} "
                                 f"(each dimension must be 1..{MAX_DIM})")
            if shape[0] % block:
                raise ModelError(f"{self.path}: tensor {name}: row of {shape[0]} values is not a whole number "
                                 f"of {qtype.name} blocks ({block})")
            n_el = 1
            for d in shape:
                n_el *= d
            n_bytes = n_el // block * bsize
            if n_bytes > self.file_size:  # not merely cut short: no file this size could hold it
                raise ModelError(f"{self.path}: tensor {name}: shape {list(shape)} of {qtype.name} needs "
                                 f"{n_bytes} bytes, more than the whole file ({self.file_size} bytes)")
            if rel % align:
                raise ModelError(f"{self.path}: tensor {name} data offset {rel} is not {align}-byte aligned")
            offset = self.data_start + rel
            if offset >= self.file_size:
                raise ModelError(f"{self.path}: tensor {name} data offset {rel} (byte {offset}) is outside the "
                                 f"file ({self.file_size} bytes; truncated file?)")
            if offset + n_bytes > self.file_size:
                raise ModelError(f"{self.path}: truncated file: tensor {name} needs bytes {offset}..{offset + n_bytes} "
                                 f"but the file has {self.file_size}")
            self.tensors[name] = TensorInfo(name, shape, ttype, offset, n_bytes)
        # Tensors may leave gaps (padding) but never share bytes: a write through one would be
        # a read of another, and a hostile directory could alias one tensor's bytes as many.
        by_offset = sorted(self.tensors.values(), key=lambda t: (t.offset, t.n_bytes))
        for a, b in zip(by_offset, by_offset[1:]):
            if b.offset < a.offset + a.n_bytes:
                raise ModelError(f"{self.path}: tensors {a.name} ({a.type_name} {list(a.shape)}: bytes "
                                 f"{a.offset}..{a.offset + a.n_bytes}) and {b.name} ({b.type_name} {list(b.shape)}: "
                                 f"bytes {b.offset}..{b.offset + b.n_bytes}) overlap")

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelError(f"{self.path}: metadata key general.architecture is missing")
        return arch

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The raw bytes of a tensor: a read-only view into the mapping (no copy)."""
        t = self.tensors[name]
        return self.data[t.offset:t.offset + t.n_bytes]

    def tensor_array(self, name: str) -> np.ndarray:
        """F32/F16 tensors as typed arrays, others as raw uint8 rows (shape [rows, row_bytes]); no copy."""
        t = self.tensors[name]
        raw = self.tensor_bytes(name)
        rows = t.n_elements // t.shape[0]
        if t.type == GGMLQuantizationType.F32:
            return raw.view(np.float32).reshape(rows, t.shape[0]) if len(t.shape) > 1 else raw.view(np.float32)
        if t.type == GGMLQuantizationType.F16:
            return raw.view(np.float16).reshape(rows, t.shape[0])
        return raw.reshape(rows, t.row_bytes)

    def file_state(self) -> tuple[int, int]:
        """(size, mtime in ns) of the mapped file now; the values at load while it is unchanged."""
        if self._fd < 0:
            return self._state
        st = os.fstat(self._fd)
        return st.st_size, st.st_mtime_ns

    def close(self) -> None:
        """Releases the mapping (only safe once no model uses its pointers)."""
        self.data = None  # type: ignore[assignment]
        try:
            self._mmap.close()
        except BufferError:
            pass  # views still alive: the mapping goes when they do
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self):
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    @property
    def path_obj(self) -> Path:
        return Path(self.path)
