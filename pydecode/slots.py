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
# cannot be cut back: a slot's cached run is reused whole (the prompt extends it), or from one of
# its checkpoints (copies of the state at chosen positions, kept by the ledger), or not at all.
RECURRENT = -1
# Where the Engine checkpoints a hybrid's state: CHECKPOINT_BEFORE_END positions before the end of
# each prompt of at least CHECKPOINT_MIN_PROMPT tokens (shorter ones are cheap to recompute). A
# chat's next turn repeats its history, but templates re-render the end of the last prompt (the
# assistant header, an empty think block) differently once the answer is in it, and a regenerated
# answer repeats the prompt itself: both part from the cached run within the last few tokens.
# (llama-server checkpoints 4 and 4 + n_ubatch tokens before the end, and at user turns.)
CHECKPOINT_BEFORE_END = 4
CHECKPOINT_MIN_PROMPT = 16
DEFAULT_CHECKPOINTS = 4   # per slot; the oldest goes first (each costs the state's bytes)


def ring_extra(model) -> int | None:
    """n_batch when the model has sliding-window layers (their cache is a ring of window + n_batch
    positions, see ArchConfig.kv_positions); RECURRENT for a hybrid; else None."""
    c = model.config
    if c.recurrent:
        return RECURRENT
    return model.n_batch if any(c.layer_is_local(layer) for layer in range(c.n_layer)) else None


def reusable_prefix(cached: list[int], prompt: list[int], ring: int | None, spill: int = 0,
                    checkpoints=()) -> int:
    """How many leading prompt tokens can keep the K/V that a cache holding `cached` has for them:
    the longest common prefix, less the last prompt token (its logits are needed), and none when
    a sliding-window ring (ring = ring_extra) no longer holds the window before that prefix's end:
    it survives only while at most ring + 1 positions were written after it. spill: positions
    written past `cached` (rejected speculative drafts) that count as written after it. A
    recurrent state (ring RECURRENT) holds all of `cached` and any spill: all of it, else the
    longest of its checkpoints (positions) within the common prefix, else nothing."""
    n, limit = 0, min(len(cached), len(prompt) - 1)
    while n < limit and cached[n] == prompt[n]:
        n += 1
    if ring == RECURRENT:
        return n if n == len(cached) and not spill else max((c for c in checkpoints if c <= n), default=0)
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
        # A hybrid's checkpoints per slot: {position: the recurrent state's bytes there}, oldest
        # first; each is of the slot's held tokens (the ledger drops those a write invalidates).
        self._ckpt: list[dict[int, bytearray]] = [{} for _ in range(n_seq)]
        self.max_checkpoints = DEFAULT_CHECKPOINTS if ring == RECURRENT else 0

    @property
    def n_seq(self) -> int:
        return len(self._held)

    def lease(self, prompt: list[int], lessee: object, checkpoints: bool = False) -> tuple[int, int] | None:
        """Leases the free slot whose cache holds the longest reusable prefix of `prompt`:
        (slot, reusable tokens), or None when every slot is leased. checkpoints: the lessee puts
        back the restore_point of a hybrid's reuse (the Engine does), so a checkpoint counts."""
        with self._lock:
            for slot, who in enumerate(self._lessee):
                if who is lessee:       # leased already (an interrupted admission): the same one
                    return slot, self._reuse(slot, prompt, checkpoints)
            best, best_n = None, -1
            for slot, who in enumerate(self._lessee):
                if who is None:
                    n = self._reusable(slot, prompt, checkpoints)
                    if n > best_n:
                        best, best_n = slot, n
            if best is None:
                return None
            self._lessee[best] = lessee
            return best, self._reuse(best, prompt, checkpoints)

    def _reusable(self, slot: int, prompt: list[int], checkpoints: bool) -> int:
        return reusable_prefix(self._held[slot], prompt, self._ring, self._spill[slot],
                               self._ckpt[slot] if checkpoints else ())

    def _reuse(self, slot: int, prompt: list[int], checkpoints: bool) -> int:
        """A lease's reuse of its slot: the tokens kept; the checkpoints past them go (the lessee
        writes those positions again)."""
        n = self._reusable(slot, prompt, checkpoints)
        self.trim_checkpoints(slot, n)
        return n

    def restore_point(self, slot: int, n: int) -> bytearray | None:
        """The checkpoint a lease reusing n tokens of `slot` must put back first: None when its
        state is there already (its whole held run) or starts afresh (n = 0)."""
        with self._lock:
            if self._ring != RECURRENT or not n or (n == len(self._held[slot]) and not self._spill[slot]):
                return None
            return self._ckpt[slot][n]

    def add_checkpoint(self, slot: int, lessee: object, pos: int, state: bytearray) -> None:
        """The lessee's slot state after its first `pos` held tokens, kept for later leases (at
        most max_checkpoints per slot: the oldest goes first)."""
        with self._lock:
            if self._lessee[slot] is not lessee or self.max_checkpoints <= 0:
                return
            ck = self._ckpt[slot]
            ck.pop(pos, None)
            ck[pos] = state
            while len(ck) > self.max_checkpoints:
                del ck[next(iter(ck))]

    def trim_checkpoints(self, slot: int, n: int) -> None:
        """Positions from n on of `slot` are written again (a lease's reuse, a context shift): their
        checkpoints go."""
        with self._lock:
            self._ckpt[slot] = {c: b for c, b in self._ckpt[slot].items() if c <= n}

    def checkpoint_bytes(self) -> int:
        """The memory the checkpoints of every slot take."""
        with self._lock:
            return sum(len(b) for ck in self._ckpt for b in ck.values())

    def lease_slot(self, slot: int, prompt: list[int], lessee: object,
                   checkpoints: bool = False) -> tuple[int, int] | None:
        """Leases this one slot (a request pinned to it, llama-server's id_slot): (slot, reusable
        tokens), or None while it is leased."""
        with self._lock:
            if self._lessee[slot] is not None and self._lessee[slot] is not lessee:
                return None
            self._lessee[slot] = lessee
            return slot, self._reuse(slot, prompt, checkpoints)

    def erase(self, slot: int) -> int:
        """Forgets what a free slot's cache holds (its tokens are recomputed when next needed);
        returns how many it held. SlotBusy while a generation leases it."""
        with self._lock:
            if self._lessee[slot] is not None:
                raise SlotBusy(f"sequence slot {slot} is in use by a generation; finish or cancel it first")
            n = len(self._held[slot])
            self._held[slot] = []
            self._spill[slot] = 0
            self._ckpt[slot] = {}
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
                if not held:
                    self._ckpt[slot] = {}
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
            if not latest:   # taken to be written from its start
                self._ckpt[slot] = {}
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
            self._ckpt[slot] = {}

    def grow(self, n_seq: int) -> None:
        """More slots (the model's cache grew), empty and free."""
        with self._lock:
            while len(self._held) < n_seq:
                self._held.append([])
                self._spill.append(0)
                self._lessee.append(None)
                self._stamp.append(0)
                self._ckpt.append({})

    def forget_all(self) -> None:
        with self._lock:
            self._held = [[] for _ in self._held]
            self._spill = [0] * len(self._held)
            self._ckpt = [{} for _ in self._held]

    def n_free(self) -> int:
        with self._lock:
            return sum(who is None for who in self._lessee)

    def n_leased(self) -> int:
        with self._lock:
            return sum(who is not None for who in self._lessee)

    def held(self, slot: int) -> list[int]:
        with self._lock:
            return list(self._held[slot])
