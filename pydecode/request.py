"""One request of an Engine: its state (`_Seq`, the engine's) and the user's `Handle` on it.

A Handle is an iterator of Pieces (a consumer that iterates or calls result() steps the whole
batch itself while no driver thread runs: Engine._wait), `.take()` / `.set_waker()` for
consumers that must not block (an event loop), `.cancel()`, and `.completion` once it has ended.
Dropping an unfinished handle cancels its request and frees its slot.
"""
from __future__ import annotations

import weakref
from collections import deque
from typing import TYPE_CHECKING, Iterator

from .generation import Completion, Piece, Stats, TokenPolicy

if TYPE_CHECKING:
    from .engine import Engine

_END = object()   # Engine._wait's answer for "the sequence has ended"


class _Seq:
    """One request's state. The engine holds these; the user holds a Handle (when it is dropped
    unfinished, the sequence is cancelled and its slot freed)."""

    def __init__(self, prompt: list[int], policy: TokenPolicy):
        self.prompt, self.policy = prompt, policy
        self.slot: int | None = None
        self.kv: list[int] = []                # tokens whose K/V the slot holds for it, in order
        self.pieces: deque[Piece] = deque()    # produced, not yet taken by its consumer
        self.done = False
        self.error: BaseException | None = None
        self.cancelled = False
        self.cancel_detail = "cancel()"
        self.on_prefill = None                 # callable(done, total) after each prompt chunk
        self.want_slot: int | None = None      # the slot it must run in (Engine.submit's slot), if any
        self.t_admit = self.t_last = 0.0
        self.draft_max = 0                     # most draft tokens a pass verifies (0: plain decoding)
        self.lookup = None                     # its speculative.PromptLookup, when it drafts by lookup
        self.tuner = None                      # its speculative.Tuner, when it drafts at all
        self.written = 0                       # positions its passes wrote (past kv: rejected drafts)
        self.ckpt_at = None                    # a hybrid's: where its prompt's state is checkpointed
        self.spec_key = None                   # the kind of its last proposal (Tuner's key)
        self.waker = None                      # called (under the lock) when pieces arrive or it ends
        # What its cache positions hold, in order: base, then policy.tokens[gen_from:]. base is the
        # prompt until a context shift (Engine._shift) makes it the kept context; tokens of base
        # past kv are prefilled in chunks like a prompt.
        self.base, self.gen_from = prompt, 0
        self.shift: tuple[int, int] | None = None   # context shift: (n_keep, n_discard); None: a full context ends it

    def context(self) -> list[int]:
        """The tokens its cache positions are for (the prompt and its output, less what context
        shifts dropped)."""
        return self.base + self.policy.tokens[self.gen_from:]


def _abandon(engine_ref, s: _Seq) -> None:
    """A Handle's finalizer: cancels its unfinished request and, when the engine is free to,
    retires it at once (so its slot does not wait for the next step). Never blocks: it may run
    inside any code of any thread, including the engine's own."""
    if s.done:
        return
    s.cancelled, s.cancel_detail = True, "abandoned (its handle was dropped)"
    eng = engine_ref()
    if eng is None or not eng._cond.acquire(blocking=False):
        return                                 # the next step reaps it
    try:
        if eng._stepper is None:
            eng._reap()
        eng._cond.notify_all()
    finally:
        eng._cond.release()


def _wake(s: _Seq) -> None:
    """Tells a non-blocking consumer (Handle.set_waker) that its request has news."""
    if s.waker is not None:
        try:
            s.waker()
        except Exception:   # e.g. its event loop has closed: nobody is listening any more
            pass


class Handle:
    """One submitted request: an iterator of Pieces, `.completion` once it has ended, `.result()`
    to wait for it, `.cancel()`. Dropping an unfinished handle cancels its request."""

    def __init__(self, engine: "Engine", seq: _Seq):
        self._engine, self._s = engine, seq
        weakref.finalize(self, _abandon, weakref.ref(engine), seq)

    def __iter__(self) -> Iterator[Piece]:
        return self

    def __next__(self) -> Piece:
        s = self._s
        got = self._engine._wait(s, lambda: s.pieces.popleft() if s.pieces else (_END if s.done else None))
        if got is not _END:
            return got
        if s.error is not None:
            raise s.error
        raise StopIteration

    def take(self) -> tuple[list[Piece], bool]:
        """Never waits and never steps: (the pieces produced since the last take, whether the
        request has ended with all of them taken). For consumers that do not block, such as an
        event loop, while a driver thread (Engine.start) steps; see set_waker."""
        s = self._s
        with self._engine._cond:
            got = list(s.pieces)
            s.pieces.clear()
            return got, s.done

    def set_waker(self, waker) -> None:
        """waker(): called from the stepping thread whenever new pieces are ready or the request
        ends (and once now if either is already the case). It runs under the engine's lock, so it
        must return at once and never call back into the engine: e.g.
        `lambda: loop.call_soon_threadsafe(event.set)`."""
        s = self._s
        with self._engine._cond:
            s.waker = waker
            if s.pieces or s.done:
                _wake(s)

    def result(self, timeout: float | None = None) -> Completion:
        """Blocks until the request has ended (TimeoutError after `timeout` seconds) and returns
        its Completion; raises the error that ended it, if one did."""
        s = self._s
        self._engine._wait(s, lambda: _END if s.done else None, timeout)
        if s.error is not None:
            raise s.error
        return s.policy.completion

    def cancel(self, detail: str = "cancel()") -> None:
        """Ends the request at the next step boundary (now, if no step is running), keeping what
        it produced (finish_reason "cancelled", stop_detail `detail`); its slot is freed at once."""
        self._engine._cancel(self._s, detail)

    close = cancel

    @property
    def done(self) -> bool:
        return self._s.done

    @property
    def completion(self) -> Completion | None:
        """The result once it has ended: what it produced, with its finish_reason (None before;
        after an error, the part produced before it, finish_reason "cancelled")."""
        return self._s.policy.completion if self._s.done else None

    @property
    def error(self) -> BaseException | None:
        """The error that ended the request, if one did."""
        return self._s.error

    @property
    def stats(self) -> Stats:
        return self._s.policy.stats

    @property
    def tokens(self) -> list[int]:
        return self._s.policy.tokens

    @property
    def prompt(self) -> list[int]:
        return self._s.prompt

    @property
    def slot(self) -> int | None:
        """The KV slot it was given (None while queued)."""
        return self._s.slot
