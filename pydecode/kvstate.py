"""A slot's state as a file or bytes: the tokens it holds and their K/V, so that another process
(or this one, later) continues exactly where it was: save / restore, prompt caches, and the
hand-off from a prefill process to a decode process.

The format (version 1), every integer little-endian:

    MAGIC (8 bytes) | u32 version | u32 header length H | header: H bytes of UTF-8 JSON |
    the K/V payload (the header's payload_bytes) | sha256 of everything before it (32 bytes)

The header names what the payload fits: the model's fingerprint (a hash of the GGUF header, the
metadata and the tensor directory, and of the first bytes of every tensor: two different files
have different fingerprints, and computing it reads about 4 KB a tensor, not the whole file),
the cache's format and shapes, and the tokens. The payload is the C core's own rows
(pd_model_kv_export: per layer K then V of the positions a later step still reads), so a
restored slot holds the same bits as the saved one. A file of another model, cache format or
version, or one truncated or changed anywhere (the checksum covers every byte), is refused with
a StateFileError that says which; nothing is written into the cache before every check passed.
Saving writes a temporary file beside the target and renames it into place, so a crash
mid-save leaves the old file (or none), never a partial one that looks valid.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import tempfile
from pathlib import Path

from .errors import PydecodeError

MAGIC = b"PDKVST\x00\x01"
VERSION = 1
_PREFIX = struct.Struct("<8sII")    # magic, version, header length
_DIGEST = 32
_MAX_HEADER = 64 << 20              # a header past this is not one of ours (token lists included)
_SAMPLE = 4096                      # bytes of each tensor the fingerprint reads


class StateFileError(PydecodeError, ValueError):
    """A saved state that cannot be restored here: not a state file, another version, truncated
    or corrupted, or made by another model or cache format. Nothing was written to the cache."""


def fingerprint(model) -> str:
    """The model file's identity for state files (computed once per Model)."""
    fp = getattr(model, "_state_fingerprint", None)
    if fp is None:
        g = model.gguf
        h = hashlib.sha256()
        h.update(struct.pack("<Q", g.file_size))
        h.update(g.data[:g.header_size])          # metadata and the tensor directory
        for name in sorted(g.tensors):
            t = g.tensors[name]
            h.update(g.data[t.offset:t.offset + min(_SAMPLE, t.n_bytes)])   # offset: absolute
        fp = model._state_fingerprint = h.hexdigest()
    return fp


def _shapes(model) -> dict:
    c = model.config
    # k_rotation: a q8_0 cache holds K rotated by 32-point Hadamard blocks (csrc/core/attention.c)
    return {"n_layer": c.n_layer, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim,
            "k_rotation": "hadamard32" if model.kv_type == "q8_0" else "none",
            "sliding_window": c.sliding_window,
            "local_layers": "".join("1" if c.layer_is_local(layer) else "0" for layer in range(c.n_layer)),
            # a hybrid's recurrent layers and their state (after the K/V rows in the payload)
            **({"recurrent": "".join("1" if r else "0" for r in c.recurrent),
                "ssm": [c.ssm_d_conv, c.ssm_n_k, c.ssm_n_v, c.ssm_d_state]} if c.recurrent else {}),
            # LongRoPE (phi3): the factors K was rotated with depend on the context (ArchConfig.rope_factors)
            **({"rope_factors": rf} if (rf := c.rope_factors(model.gguf, model.n_ctx)) else {})}


def dumps(model, slot: int, tokens: list[int]) -> bytes:
    """Slot `slot`'s state, holding the K/V of `tokens` (positions 0..len-1), as bytes."""
    tokens = [int(t) for t in tokens]
    payload = model.export_kv(slot, len(tokens))
    header = json.dumps({
        "format_version": VERSION,
        "model_fingerprint": fingerprint(model),
        "model_name": str(model.gguf.metadata.get("general.name", model.path.name)),
        "kv_type": model.kv_type,
        "shapes": _shapes(model),
        "n_tokens": len(tokens),
        "tokens": tokens,
        "payload_bytes": len(payload),
    }, separators=(",", ":")).encode()
    h = hashlib.sha256()
    parts = [_PREFIX.pack(MAGIC, VERSION, len(header)), header, payload]
    for p in parts:
        h.update(p)
    return b"".join(parts) + h.digest()


def parse(model, data, what: str = "state") -> tuple[list[int], memoryview]:
    """Checks `data` (a whole state file's bytes) against `model` without touching its cache:
    (tokens, payload view), or StateFileError saying what does not fit."""
    view = memoryview(data).cast("B")
    if len(view) < _PREFIX.size + _DIGEST:
        raise StateFileError(f"{what}: {len(view)} bytes is too short to be a pydecode state file (truncated?)")
    magic, version, hlen = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise StateFileError(f"{what}: not a pydecode state file (bad magic bytes)")
    if version != VERSION:
        raise StateFileError(f"{what}: state file format version {version}; this pydecode reads version {VERSION}")
    if hashlib.sha256(view[:-_DIGEST]).digest() != bytes(view[-_DIGEST:]):
        raise StateFileError(f"{what}: checksum mismatch: the file is truncated or corrupted")
    if hlen > _MAX_HEADER or _PREFIX.size + hlen > len(view) - _DIGEST:
        raise StateFileError(f"{what}: header length {hlen} does not fit in the file")
    try:   # RecursionError: a header nested deeper than Python's stack (none of ours nests)
        head = json.loads(bytes(view[_PREFIX.size:_PREFIX.size + hlen]))
        tokens, n_payload = head["tokens"], head["payload_bytes"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise StateFileError(f"{what}: the header is not a valid state header") from None
    if head.get("model_fingerprint") != fingerprint(model):
        raise StateFileError(f"{what}: saved by another model ({head.get('model_name')!r}); "
                             f"this is {model.path.name}: a state restores only into the model file that made it")
    if head.get("kv_type") != model.kv_type:
        raise StateFileError(f"{what}: saved with a {head.get('kv_type')} KV cache; this model's is {model.kv_type} "
                             f"(load it with kv_type={head.get('kv_type')!r})")
    if head.get("shapes") != _shapes(model):
        raise StateFileError(f"{what}: saved with cache shapes {head.get('shapes')}, not this model's")
    if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < model.n_vocab for t in tokens):   # not bool
        raise StateFileError(f"{what}: the header's tokens are not token ids of this model")
    if len(tokens) > model.n_ctx:
        raise StateFileError(f"{what}: holds {len(tokens)} tokens, more than this model's context "
                             f"({model.n_ctx}, n_ctx); load the model with a larger n_ctx")
    payload = view[_PREFIX.size + hlen:-_DIGEST]
    if len(payload) != n_payload:
        raise StateFileError(f"{what}: {len(payload)} payload bytes, the header says {n_payload}")
    return tokens, payload


def loads(model, data, slot: int, what: str = "state", *, lease: object = None) -> list[int]:
    """Restores a state (dumps' bytes) into slot `slot`; returns the tokens it holds."""
    tokens, payload = parse(model, data, what)
    try:
        model.import_kv(slot, len(tokens), payload, lease=lease)
    except ValueError as e:   # the C core's size check: shapes that the header did not catch
        raise StateFileError(f"{what}: {e}") from None
    return tokens


def save(model, path: str | os.PathLike, slot: int, tokens: list[int]) -> int:
    """Writes the state file atomically (a temporary file in the same folder, fsync, rename).
    Returns its size in bytes."""
    data = dumps(model, slot, tokens)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        try:   # a replaced file keeps its mode; a new one stays private (0600: it holds a conversation)
            os.fchmod(fd, stat.S_IMODE(os.stat(path).st_mode))
        except OSError:
            pass
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:   # the rename itself survives a crash once the folder is synced (best effort)
        dfd = os.open(path.parent or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return len(data)


def max_bytes(model) -> int:
    """The largest state file `model` can have made: its header (the token list of a full
    context and the fixed fields) and a full slot's K/V."""
    return _PREFIX.size + min(_MAX_HEADER, 16 * model.n_ctx + (64 << 10)) + model.kv_export_bytes(model.n_ctx) + _DIGEST


def read_file(model, path: str | os.PathLike) -> bytes:
    """The bytes of the state file at `path`, read only if it can be one of `model`'s: a regular
    file (not a device such as /dev/zero, a FIFO that blocks for a writer or a folder; opened
    without blocking and checked on the opened descriptor, so a symlink swapped meanwhile
    changes nothing) no larger than max_bytes. StateFileError otherwise; OSError if unreadable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError(f"{path}: not a regular file, so not a state file")
        cap = max_bytes(model)
        if st.st_size > cap:
            raise StateFileError(f"{path}: {st.st_size} bytes, more than any state file of this model "
                                 f"({cap} bytes at most at n_ctx {model.n_ctx})")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        data = f.read(cap + 1)
    if len(data) > cap:   # it grew while read
        raise StateFileError(f"{path}: more than {cap} bytes, more than any state file of this model")
    return data


def replaceable(path: str | os.PathLike) -> bool:
    """Whether a state may be written over `path`: absent, empty, or a regular file that starts
    like a state file (of any model: --prompt-cache replaces a stale one). Anything else (a
    document, a device, a FIFO, a folder) is never overwritten."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return not os.path.islink(path)   # a dangling symlink: writing would follow it
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        return stat.S_ISREG(st.st_mode) and (st.st_size == 0 or os.read(fd, len(MAGIC)) == MAGIC)
    finally:
        os.close(fd)


def load(model, path: str | os.PathLike, slot: int, *, lease: object = None) -> list[int]:
    """Restores the state file at `path` into slot `slot`; returns the tokens it holds."""
    return loads(model, read_file(model, path), slot, str(path), lease=lease)


# ---- through the model's SlotLedger: what an LLM or an Engine saves and restores ----
# The slot is leased for the copy, so no generation writes it meanwhile; what the ledger records
# for it is then exactly what the file holds. take: how the slot is leased (default the ledger's
# take, which refuses a busy slot; an Engine's waits for it).

def export_slot(model, slot: int | None = None, take=None) -> tuple[int, bytes]:
    """(slot, state bytes) of a slot that no generation leases: `slot`, or the one released last."""
    me = object()
    slot = (take or model.slots.take)(slot, me, latest=True)
    try:
        return slot, dumps(model, slot, model.slots.held(slot))
    finally:
        model.slots.give_back(slot, me)


def import_slot(model, data, slot: int | None = None, what: str = "state", take=None) -> tuple[int, list[int]]:
    """Restores state bytes into `slot` (default: the free slot unused longest); the ledger then
    knows the tokens it holds, so a prompt that starts with them reuses their K/V instead of
    prefilling them. Returns (slot, tokens)."""
    me = object()
    slot = (take or model.slots.take)(slot, me, latest=False)
    tokens: list[int] = []
    try:
        tokens = loads(model, data, slot, what, lease=me)
    except StateFileError:
        model.slots.give_back(slot, me)   # refused before a byte was written: the slot is as it was
        raise
    except BaseException:
        model.slots.release(slot, me, [])
        raise
    model.slots.release(slot, me, tokens)
    return slot, tokens


def save_slot(model, path: str | os.PathLike, slot: int | None = None, take=None) -> tuple[int, int, int]:
    """Writes a slot's state file atomically: (slot, tokens saved, file bytes)."""
    me = object()
    slot = (take or model.slots.take)(slot, me, latest=True)
    try:
        tokens = model.slots.held(slot)
        return slot, len(tokens), save(model, path, slot, tokens)
    finally:
        model.slots.give_back(slot, me)


def load_slot(model, path: str | os.PathLike, slot: int | None = None, take=None) -> tuple[int, list[int]]:
    """Restores the state file at `path` (import_slot). Returns (slot, tokens)."""
    return import_slot(model, read_file(model, path), slot, str(path), take)
