"""When what a sequence's cache positions hold is rewritten: a context shift (a full context
drops old tokens and prefills the rest again), the rollback of a hybrid's recurrent state after
rejected drafts, and a hybrid's checkpoints (its state kept at a position of a prompt, put back
for a later prompt that parts from the slot's run after it: pydecode/slots.py says where). A mixin
of Engine (pydecode/engine.py), apart because it is its own concern; it uses Engine's model and
_retire. _pending: the tokens a sequence still has to run."""
from __future__ import annotations

import contextlib
import signal
import threading

from . import slots as slots_mod
from .request import _Seq


class SeqContexts:
    def _shift(self, s: _Seq) -> None:
        """Under the lock: s's context is full (its next token has no position left). Drops
        n_discard tokens after the first n_keep, and prefills the tokens after them again at their
        new positions, in chunks like a prompt (the kept prefix keeps its K/V: causal attention
        never let it see what came later). So the cache then holds exactly what a prompt of the
        remaining tokens would, the cache-equals-recompute guarantee, at the cost of prefilling
        about half the context again. (llama.cpp rotates the cached keys to their new positions
        instead: cheaper, but the kept tokens' K/V then still carry what the dropped ones
        contributed.) n_discard defaults to half of what follows n_keep; n_keep gives way
        to the tokens not yet decoded (the last sampled one, any a constraint forced)."""
        n_ctx, ctx, pend = self.model.n_ctx, s.context(), _pending(s)
        if len(pend) >= n_ctx:   # a forced run longer than the context: nothing can be kept
            s.pieces.extend(s.policy.end("length", f"context full ({n_ctx} positions): a forced run of "
                                                   f"{len(pend)} tokens does not fit"))
            self._retire(s)
            return
        n_keep, n_discard = s.shift
        keep = min(n_keep, n_ctx - 4, n_ctx - len(pend))
        left = len(ctx) - keep
        drop = max(len(ctx) - n_ctx, min(n_discard or left // 2, left - len(pend)))
        new = ctx[:keep] + ctx[keep + drop:]
        s.base, s.gen_from = new[:len(new) - len(pend)], len(s.policy.tokens) - len(pend)
        ring = slots_mod.ring_extra(self.model)
        s.kv = s.kv[:slots_mod.reusable_prefix(s.kv, new, ring, max(0, s.written - len(s.kv)))]
        self.model.slots.trim_checkpoints(s.slot, len(s.kv))
        s.ckpt_at = None
        s.policy.stats.shifted += drop

    def _admit_reuse(self, s: _Seq, n: int) -> None:
        """Under the lock, at admission, once the ledger lent s its slot reusing n prompt tokens:
        a hybrid's state is put back to the checkpoint at n when the slot's run is not reused
        whole, and s is told where its own prompt's checkpoint goes (ckpt_at)."""
        ledger = self.model.slots
        snap = ledger.restore_point(s.slot, n)
        if snap is not None:
            self.model.ssm_restore(s.slot, snap, n, lease=s)
        at = len(s.prompt) - slots_mod.CHECKPOINT_BEFORE_END
        s.ckpt_at = at if ledger.max_checkpoints > 0 and len(s.prompt) >= slots_mod.CHECKPOINT_MIN_PROMPT \
            and n < at else None

    @staticmethod
    def _cut_at_checkpoint(s: _Seq, toks: list[int]) -> list[int]:
        """A prompt chunk ends at s's checkpoint position (the state there is copied after the step)."""
        if s.ckpt_at is not None and len(s.kv) < s.ckpt_at < len(s.kv) + len(toks):
            return toks[:s.ckpt_at - len(s.kv)]
        return toks

    def _keep_checkpoint(self, s: _Seq) -> None:
        """(In the step.) s's slot state holds its prompt up to its checkpoint position: a copy
        goes to the ledger (memory: Model.ssm_slot_bytes per checkpoint)."""
        if s.ckpt_at is not None and len(s.kv) == s.ckpt_at and s.base is s.prompt:
            self.model.slots.add_checkpoint(s.slot, s, s.ckpt_at, self.model.ssm_snapshot(s.slot))
            s.ckpt_at = None

    @contextlib.contextmanager
    def _booked_whole(self):
        """Around a step's execution: on a hybrid, a Ctrl-C that lands once the model call returned
        would leave the recurrent states past what their sequences know (the redo of the step
        would be refused), so in the main thread it is held until the step is booked, then raised.
        (A step is one model call, which a Ctrl-C never cuts short anyway; a dense model's redo
        rewrites the same K/V rows, so it needs none of this.)"""
        config = getattr(self.model, "config", None)   # (a test's scripted model has none)
        if config is None or not config.recurrent or threading.current_thread() is not threading.main_thread() \
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield
            return
        held = []
        signal.signal(signal.SIGINT, lambda *_: held.append(1))
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if held:
                raise KeyboardInterrupt

    def _roll_back(self, s: _Seq, snap, accepted: list[int]) -> None:
        """(Outside the lock, in the step.) A verification pass of a hybrid rejected drafts: its
        recurrent state is put back as it was before the pass and fed the accepted tokens (their
        K/V rows are rewritten with the same values), so the slot holds exactly them. The cost:
        one more pass over the accepted tokens, when a draft is rejected."""
        n = len(s.kv)
        self.model.ssm_restore(s.slot, snap, n, lease=s)
        if accepted:
            self.model.prefill(accepted, n, seq=s.slot, lease=s)
        s.written = n + len(accepted)


def _pending(s: _Seq) -> list[int]:
    """The tokens a sequence knows but its slot does not hold yet: the rest of its prompt (or of
    the context a shift kept), then its output's (the last sampled token, any a constraint forced)."""
    n, base = len(s.kv), s.base
    if n < len(base):
        return base[n:] + s.policy.tokens[s.gen_from:]
    return s.policy.tokens[s.gen_from + n - len(base):]
