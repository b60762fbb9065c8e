"""Who owns each KV cache slot of a Model, and which tokens its cache holds.

A Model's KV cache has n_seq slots. The SlotLedger (one per Model, `model.slots`) is the one
record of them: a generation leases a slot for its lifetime (the Engine does this for every
generation of an LLM), and on release says which tokens the slot's cache then holds, so the
next prompt that shares a prefix with them reuses their K/V instead of recomputing them.

A direct Model call (prefill / decode_step / batch_step without a lease) writes a slot behind
the ledger's back: it forgets what that slot held, and it is refused while a generation leases
the slot, so two writers never silently overwrite each other's cache.
"""
from __future__ import annotations

import threading


class SlotBusy(RuntimeError):
    """The slot asked for (or every slot) is leased now: waiting may get it (Engine waits)."""


# A hybrid's recurrent state (csrc/core/deltanet.h) holds exactly the positions it absorbed and
# cannot be cut back: a slot's cached run is reused whole (the prompt extends it) or not at all.
RECURRENT = -1


def ring_extra(model) -> int | None:
    """n_batch when the model has sliding-window layers (their cache is a ring of window + n_batch
    positions, see ArchConfig.kv_positions); RECURRENT for a hybrid; else None."""
    c = model.config
    if c.recurrent:
        return RECURRENT
    return model.n_batch if any(c.layer_is_local(layer) for layer in range(c.n_layer)) else None


def reusable_prefix(cached: list[int], prompt: list[int], ring: int | None, spill: int = 0) -> int:
    """How many leading prompt tokens can keep the K/V that a cache holding `cached` has for them:
    the longest common prefix, less the last prompt token (its logits are needed), and none when
    a sliding-window ring (ring = ring_extra) no longer holds the window before that prefix's end:
    it survives only while at most ring + 1 positions were written after it. spill: positions
    written past `cached` (rejected speculative drafts) that count as written after it."""
    n, limit = 0, min(len(cached), len(prompt) - 1)
    while n < limit and cached[n] == prompt[n]:
        n += 1
    if ring == RECURRENT:   # the state holds all of `cached` (and any spill): all of it, or nothing
        return n if n == len(cached) and not spill else 0
    return 0 if ring is not None and len(cached) + spill - n > ring else n


class SlotLedger:
    """The lease and the held tokens of every KV slot of one model (see the module docstring).
    Thread-safe; every method is short and never calls the model."""

    def __init__(self, n_seq: int, ring: int | None):
        # Reentrant: an engine's finalizer (which releases its leases) may run inside any code.
        self._lock = threading.RLock()
        self._held: list[list[int]] = [[] for _ in range(n_seq)]
        self._spill: list[int] = [0] * n_seq     # positions written past the held tokens
        self._lessee: list[object | None] = [None] * n_seq
        self._stamp: list[int] = [0] * n_seq     # when each slot was last released (0: never)
        self._clock = 0
        self._ring = ring

    @property
    def n_seq(self) -> int:
        return len(self._held)

    def lease(self, prompt: list[int], lessee: object) -> tuple[int, int] | None:
        """Leases the free slot whose cache holds the longest reusable prefix of `prompt`:
        (slot, reusable tokens), or None when every slot is leased."""
        with self._lock:
            for slot, who in enumerate(self._lessee):
                if who is lessee:       # leased already (an interrupted admission): the same one
                    return slot, reusable_prefix(self._held[slot], prompt, self._ring, self._spill[slot])
            best, best_n = None, -1
            for slot, who in enumerate(self._lessee):
                if who is None:
                    n = reusable_prefix(self._held[slot], prompt, self._ring, self._spill[slot])
                    if n > best_n:
                        best, best_n = slot, n
            if best is None:
                return None
            self._lessee[best] = lessee
            return best, best_n

    def lease_slot(self, slot: int, prompt: list[int], lessee: object) -> tuple[int, int] | None:
        """Leases this one slot (a request pinned to it, llama-server's id_slot): (slot, reusable
        tokens), or None while it is leased."""
        with self._lock:
            if self._lessee[slot] is not None and self._lessee[slot] is not lessee:
                return None
            self._lessee[slot] = lessee
            return slot, reusable_prefix(self._held[slot], prompt, self._ring, self._spill[slot])

    def erase(self, slot: int) -> int:
        """Forgets what a free slot's cache holds (its tokens are recomputed when next needed);
        returns how many it held. SlotBusy while a generation leases it."""
        with self._lock:
            if self._lessee[slot] is not None:
                raise SlotBusy(f"sequence slot {slot} is in use by a generation; finish or cancel it first")
            n = len(self._held[slot])
            self._held[slot] = []
            self._spill[slot] = 0
            return n

    def is_leased(self, slot: int) -> bool:
        with self._lock:
            return self._lessee[slot] is not None

    def release(self, slot: int, lessee: object, held: list[int], spill: int = 0) -> None:
        """Ends a lease; `held` are the tokens whose K/V the slot now holds, in order ([] when
        unknown, e.g. after an error inside a step); spill: positions written past them (the
        rejected drafts of speculative decoding)."""
        with self._lock:
            if self._lessee[slot] is lessee:
                self._lessee[slot] = None
                self._held[slot] = list(held)
                self._spill[slot] = spill if held else 0
                self._clock += 1
                self._stamp[slot] = self._clock

    def take(self, slot: int | None, lessee: object, *, latest: bool) -> int:
        """Leases one given free slot (None: with latest, the free slot released last that holds
        tokens, for saving it; else the free slot released longest ago, for restoring into it)
        and returns it; SlotBusy (a RuntimeError) when it (or every slot) is leased now, for the
        caller to wait (Engine._take_slot) or give up. give_back ends such a
        lease and keeps what the slot holds; release records new contents."""
        with self._lock:
            if slot is None:
                free = [i for i, who in enumerate(self._lessee) if who is None and (self._held[i] or not latest)]
                if not free:
                    if latest and all(who is None for who in self._lessee):
                        raise RuntimeError("no sequence slot holds tokens")
                    raise SlotBusy("no free sequence slot holds tokens" if latest else "every sequence slot is in use")
                slot = max(free, key=self._stamp.__getitem__) if latest else min(free, key=self._stamp.__getitem__)
            elif not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < len(self._held):
                raise ValueError(f"sequence slot must be an integer in 0..{len(self._held) - 1}, got {slot!r}")
            if self._lessee[slot] is not None:
                raise SlotBusy(f"sequence slot {slot} is in use by a generation; finish or cancel it first")
            self._lessee[slot] = lessee
            return slot

    def give_back(self, slot: int, lessee: object) -> None:
        """Ends a lease from take() with the slot's contents unchanged."""
        with self._lock:
            if self._lessee[slot] is lessee:
                self._lessee[slot] = None

    def direct_write(self, slot: int) -> None:
        """A write into `slot` by a direct Model call: refused while a generation leases it;
        otherwise the slot's record is forgotten (the caller decides what it holds now)."""
        with self._lock:
            if self._lessee[slot] is not None:
                raise RuntimeError(f"sequence slot {slot} is in use by a generation (an Engine leases it); "
                                   f"finish or cancel that generation before writing the slot directly")
            self._held[slot] = []
            self._spill[slot] = 0

    def grow(self, n_seq: int) -> None:
        """More slots (the model's cache grew), empty and free."""
        with self._lock:
            while len(self._held) < n_seq:
                self._held.append([])
                self._spill.append(0)
                self._lessee.append(None)
                self._stamp.append(0)

    def forget_all(self) -> None:
        with self._lock:
            self._held = [[] for _ in self._held]
            self._spill = [0] * len(self._held)

    def n_free(self) -> int:
        with self._lock:
            return sum(who is None for who in self._lessee)

    def n_leased(self) -> int:
        with self._lock:
            return sum(who is not None for who in self._lessee)

    def held(self, slot: int) -> list[int]:
        with self._lock:
            return list(self._held[slot])
