"""A Model's slot as bytes: its K/V rows (pydecode/kvstate.py: save / restore, hand-off) and a
hybrid's recurrent state (speculative decoding's rollback). A mixin of Model (pydecode/model.py),
apart because it is its own concern; it uses Model's _ptr, _lock, n_ctx, _slot, _usable, _check."""
from __future__ import annotations

from . import _core
from . import model as _model   # (its _is_int, looked up at call time: model.py imports this module)
from .errors import ContextFullError

ffi, lib = _core.ffi, _core.lib


class SlotBytes:
    def export_kv(self, seq: int, n_pos: int) -> bytearray:
        """The K/V rows that positions 0..n_pos-1 of slot seq left in the cache (the ones a later
        step still reads: a sliding-window layer keeps its last window), in the cache's format."""
        slot = self._slot(seq)
        if not _model._is_int(n_pos) or not 0 <= n_pos <= self.n_ctx:
            raise ContextFullError(f"{n_pos!r} positions do not fit in the context of {self.n_ctx} tokens")
        with self._lock:
            self._usable(None, None)
            buf = bytearray(lib.pd_model_kv_export_bytes(self._ptr, n_pos))
            self._check(lib.pd_model_kv_export(self._ptr, slot, n_pos, ffi.from_buffer(buf), len(buf)))
        return buf

    def kv_export_bytes(self, n_pos: int) -> int:
        """Bytes export_kv gives for n_pos positions."""
        with self._lock:
            self._usable(None, None)
            return int(lib.pd_model_kv_export_bytes(self._ptr, n_pos))

    def import_kv(self, seq: int, n_pos: int, data, *, lease: object = None) -> None:
        """Writes what export_kv gave (of a model of the same shapes and kv_type) into slot seq:
        its steps then continue from position n_pos exactly as the exporter's would. `lease` as
        in prefill."""
        slot = self._slot(seq)
        if not _model._is_int(n_pos) or not 0 <= n_pos <= self.n_ctx:
            raise ContextFullError(f"{n_pos!r} positions do not fit in the context of {self.n_ctx} tokens")
        view = memoryview(data).cast("B")
        with self._lock:
            self._usable(slot, lease)
            self._check(lib.pd_model_kv_import(self._ptr, slot, n_pos, ffi.from_buffer(view), len(view)))

    def ssm_snapshot(self, seq: int) -> bytearray:
        """A copy of slot seq's recurrent state (a hybrid's; empty otherwise)."""
        slot = self._slot(seq)
        with self._lock:
            self._usable(None, None)
            buf = bytearray(lib.pd_model_ssm_slot_bytes(self._ptr))
            if buf:
                self._check(lib.pd_model_ssm_snapshot(self._ptr, slot, ffi.from_buffer(buf), len(buf), 0, 0))
        return buf

    def ssm_restore(self, seq: int, snapshot, pos: int, *, lease: object = None) -> None:
        """Puts an ssm_snapshot back: slot seq's recurrent state then holds positions 0..pos-1."""
        slot = self._slot(seq)
        view = memoryview(snapshot).cast("B")
        with self._lock:
            self._usable(slot, lease)
            if len(view):
                self._check(lib.pd_model_ssm_snapshot(self._ptr, slot, ffi.from_buffer(view), len(view), 1, pos))
