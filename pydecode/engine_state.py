"""An Engine's calls on a slot's KV state (pydecode/kvstate.py): save / restore, hand-off.

A mixin of Engine (pydecode/engine.py), apart because it is its own concern: waiting for a
slot the way a generation waits its turn, then handing it to kvstate."""
from __future__ import annotations

import time

from .errors import ModelClosedError
from .request import Handle
from .slots import SlotBusy


class SlotStates:
    """save_state / load_state / export_state / import_state of an Engine (it provides model,
    _cond, _closed, _active, _queue, _driving, _stepper, _state_waiting and _step_once)."""

    def _state_slot(self, slot) -> int | None:
        """slot: an int, None (the slot released last), or a finished Handle: the slot it ran in,
        while that still holds its tokens (another request may have taken it since)."""
        if isinstance(slot, Handle):
            s = slot._s
            if not slot.done or s.slot is None or self.model.slots.held(s.slot) != s.kv or not s.kv:
                raise RuntimeError("that request's slot no longer holds its tokens (unfinished, failed, or reused "
                                   "by another request)")
            return s.slot
        return slot

    def _take_slot(self, slot, lessee, *, latest: bool, timeout: float | None = None) -> int:
        """SlotLedger.take, waiting while the slot (or every slot) is leased, as a generation
        waits its turn: freed slots go to waiting restores before queued generations, and
        while no driver thread runs the caller steps the batch itself (so a state call on the
        slot of a request nobody consumes yet still ends). TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # A restore into any free slot holds back queued generations while it waits (else they
        # could take every slot that frees); a save waits for a generation to end, so holding
        # them back would wait forever.
        reserve = int(slot is None and not latest)
        with self._cond:
            self._state_waiting += reserve
        try:
            while True:
                with self._cond:
                    if self._closed:
                        raise ModelClosedError("the engine is closed")
                    try:
                        return self.model.slots.take(slot, lessee, latest=latest)
                    except RuntimeError as busy:   # SlotBusy, or no slot holds tokens yet while some will
                        if not (isinstance(busy, SlotBusy) or self._active or self._queue):
                            raise
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            raise TimeoutError(f"{busy} (waited {timeout} s for it)") from None
                    if self._driving or self._stepper is not None or not (self._active or self._queue):
                        # (nothing here to step: leased by another Engine, a direct call or another state call)
                        self._cond.wait(0.02 if left is None else min(left, 0.02))
                        continue
                self._step_once()
        finally:
            with self._cond:
                self._state_waiting -= reserve

    def _taker(self, timeout):
        return lambda slot, lessee, latest: self._take_slot(slot, lessee, latest=latest, timeout=timeout)

    def save_state(self, path, slot=None, timeout: float | None = None) -> int:
        """Writes a slot's tokens and K/V to a state file (kvstate.save_slot); returns the tokens.
        Waits for the slot while a generation leases it (TimeoutError after `timeout` s)."""
        from . import kvstate
        return kvstate.save_slot(self.model, path, self._state_slot(slot), self._taker(timeout))[1]

    def load_state(self, path, slot: int | None = None, timeout: float | None = None) -> list[int]:
        """Restores a state file into a free slot; a prompt that starts with its tokens reuses them."""
        from . import kvstate
        return kvstate.load_slot(self.model, path, slot, self._taker(timeout))[1]

    def export_state(self, slot=None, timeout: float | None = None) -> bytes:
        from . import kvstate
        return kvstate.export_slot(self.model, self._state_slot(slot), self._taker(timeout))[1]

    def import_state(self, data, slot: int | None = None, timeout: float | None = None) -> list[int]:
        from . import kvstate
        return kvstate.import_slot(self.model, data, slot, "state", self._taker(timeout))[1]
