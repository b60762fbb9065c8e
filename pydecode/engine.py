"""Many answers at once: continuous batching over the sequence slots of one Model.

Each step is ONE `Model.batch_step` call, so every weight is read once for all sequences: the
next token of every decoding sequence (one token each) plus chunks of newly admitted prompts
filling the rest of the step's n_batch tokens (chunked prefill: a long prompt shares steps with
the others' decodes instead of freezing them). Requests wait FIFO beyond the slot cap and join
between steps; finished or cancelled ones leave at once and free their slot. What happens to each
sampled token (sampling, stops, detokenizing, logprobs) is generation.TokenPolicy, one per
sequence: the same code a single Generation runs.

Threads: submit() and cancel() may be called from any thread. Either a driver thread steps
(start()/stop(), or `with engine:`), or, while none runs, whoever waits on a handle (iterating it,
result()) steps the whole batch itself; the pieces of other handles queue up for their consumers.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from typing import Iterator

import numpy as np

from .errors import QueueFullError
from .generation import Completion, Piece, Stats, TokenPolicy, reusable_prefix, ring_extra
from .model import Model, _is_int
from .sampling import SamplingParams

_END = object()   # _wait's answer for "the sequence has ended"


class _Seq:
    """One request's state. The engine holds these; the user holds a Handle (when it is dropped
    unfinished, the sequence is cancelled)."""

    def __init__(self, prompt: list[int], policy: TokenPolicy):
        self.prompt, self.policy = prompt, policy
        self.slot: int | None = None
        self.kv: list[int] = []                # tokens whose K/V the slot holds for it, in order
        self.pieces: deque[Piece] = deque()    # produced, not yet taken by its consumer
        self.done = False
        self.error: BaseException | None = None
        self.cancelled = False
        self.t_admit = self.t_last = 0.0

    @staticmethod
    def abandon(s: "_Seq") -> None:
        s.cancelled = True                     # no lock: a finalizer may run inside a locked section


class Handle:
    """One submitted request: an iterator of Pieces (like Generation), `.completion` once it has
    ended, `.result()` to wait for it, `.cancel()`."""

    def __init__(self, engine: "Engine", seq: _Seq):
        self._engine, self._s = engine, seq
        weakref.finalize(self, _Seq.abandon, seq)

    def __iter__(self) -> Iterator[Piece]:
        return self

    def __next__(self) -> Piece:
        s = self._s
        got = self._engine._wait(lambda: s.pieces.popleft() if s.pieces else (_END if s.done else None))
        if got is not _END:
            return got
        if s.error is not None:
            raise s.error
        raise StopIteration

    def result(self, timeout: float | None = None) -> Completion:
        """Blocks until the request has ended (TimeoutError after `timeout` seconds) and returns
        its Completion; raises the error that ended it, if one did."""
        s = self._s
        self._engine._wait(lambda: _END if s.done else None, timeout)
        if s.error is not None:
            raise s.error
        return s.policy.completion

    def cancel(self) -> None:
        """Ends the request at the next step boundary (now, if no step is running), keeping what
        it produced; its slot is freed at once."""
        eng, s = self._engine, self._s
        with eng._cond:
            if s.done:
                return
            s.cancelled = True
            if not eng._stepping:              # between steps already: end it now
                eng._reap()
            eng._cond.notify_all()

    close = cancel

    @property
    def done(self) -> bool:
        return self._s.done

    @property
    def completion(self) -> Completion | None:
        """The result once it has ended (None before, or when an error ended it)."""
        return self._s.policy.completion if self._s.done else None

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


class Engine:
    """Continuous batching over a Model's n_seq KV slots (see the module docstring).

    max_seqs: sequences decoded together (default: the model's n_seq, at most its n_batch);
    max_queue: requests that may wait beyond them (default: unbounded; submit raises
    QueueFullError when full); prefill_chunk: most prompt tokens one step takes (default: the
    model's n_batch; smaller keeps the other streams' inter-token latency lower while a long
    prompt is prefilled). Do not drive the same model's slots with other calls meanwhile."""

    def __init__(self, model: Model, max_seqs: int | None = None, max_queue: int | None = None,
                 prefill_chunk: int | None = None):
        n = min(model.n_seq, model.n_batch) if max_seqs is None else max_seqs
        if not _is_int(n) or not 1 <= n <= model.n_seq:
            raise ValueError(f"max_seqs must be an integer in 1..{model.n_seq} (the model's n_seq), got {max_seqs!r}")
        if n > model.n_batch:   # every active sequence's decode must fit in one step
            raise ValueError(f"max_seqs={n} exceeds the model's n_batch={model.n_batch} (tokens per step)")
        if max_queue is not None and (not _is_int(max_queue) or max_queue < 0):
            raise ValueError(f"max_queue must be an integer >= 0 or None, got {max_queue!r}")
        chunk = model.n_batch if prefill_chunk is None else prefill_chunk
        if not _is_int(chunk) or not 1 <= chunk <= model.n_batch:
            raise ValueError(f"prefill_chunk must be an integer in 1..{model.n_batch} (n_batch), got {prefill_chunk!r}")
        self.model, self.max_seqs, self.max_queue, self.prefill_chunk = model, n, max_queue, chunk
        self._cond = threading.Condition()
        self._queue: deque[_Seq] = deque()
        self._active: list[_Seq] = []          # in admission order
        self._free = list(range(n))
        self._logits_buf = None   # batch_step's output, reused step after step (rows are read within the step)
        self._held: list[list[int]] = [[] for _ in range(n)]   # what each slot's cache holds: prefix reuse
        self._stepping = False                 # a thread is inside a step
        self._driving = False                  # a driver thread runs: consumers only wait
        self._stop_req = False
        self._thread: threading.Thread | None = None
        self._elem = 2 if model.kv_type == "f16" else 4
        self._ring = ring_extra(model)

    # ---- requests ----

    def submit(self, prompt: str | list[int], max_tokens: int = 256, *, stop: str | list[str] | None = None,
               logprobs: int | None = None, **sampling) -> Handle:
        """Queues a request (text or token ids) and returns its Handle. Sampling parameters as in
        LLM.generate (temperature, top_k, top_p, min_p, penalties, repeat_last_n, seed); every
        parameter is checked here, so a bad one raises now, never inside a step."""
        m = self.model
        ids = m.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < m.n_vocab]
        if bad:   # caught here: inside a step it would fail every sequence of that step
            raise ValueError(f"token id {bad[0]} in the prompt is outside the vocabulary (0..{m.n_vocab - 1})")
        policy = TokenPolicy(m.tokenizer, m.n_vocab, m.n_ctx, ids, max_tokens, SamplingParams(**sampling),
                             stop=stop, logprobs=logprobs)
        s = _Seq(ids, policy)
        with self._cond:
            # Queued requests that free slots will take at the next step are not waiting.
            if self.max_queue is not None and len(self._queue) - len(self._free) >= self.max_queue:
                raise QueueFullError(f"the queue is full: {self.max_queue} requests already wait for one of "
                                     f"{self.max_seqs} sequence slots (max_queue={self.max_queue})")
            self._queue.append(s)
            self._cond.notify_all()
        return Handle(self, s)

    @property
    def n_active(self) -> int:
        return len(self._active)

    @property
    def n_queued(self) -> int:
        return len(self._queue)

    @property
    def kv_bytes_reserved(self) -> int:
        """KV cache bytes allocated (every slot, full context)."""
        return self.model.kv_bytes

    @property
    def kv_bytes_in_use(self) -> int:
        """KV bytes the active sequences fill: their positions x per-position bytes, layer by
        layer, sliding-window layers capped at their ring (ArchConfig.kv_bytes)."""
        c, nb = self.model.config, self.model.n_batch
        with self._cond:
            return sum(c.kv_bytes(len(s.kv), self._elem, ring_extra=nb) for s in self._active)

    # ---- stepping ----

    def step(self) -> int:
        """One step of the whole batch (waits while another thread is inside one). Returns the
        tokens it ran (0: nothing to do). An error in it ends the sequences it carried: their
        handles raise it."""
        with self._cond:
            while self._stepping:
                self._cond.wait()
            plan = self._claim()
        self._execute(plan)
        return len(plan[0])

    def _claim(self):
        """Under the lock, no step running: marks one as running and lays it out."""
        self._stepping = True
        try:
            return self._plan()
        except BaseException:
            self._stepping = False
            self._cond.notify_all()
            raise

    def _plan(self):
        """Reaps cancellations, admits queued requests FIFO into free slots, and lays out the
        step: decodes first (one token each), then prompt chunks in admission order, so the
        earliest admitted prompt is served first and none starves."""
        self._reap()
        while self._queue and self._free:
            s = self._queue.popleft()
            s.slot, n = self._pick_slot(s.prompt)
            s.kv = s.prompt[:n]
            s.policy.stats.cached_tokens = n
            s.t_admit = time.perf_counter()
            self._active.append(s)
        tokens, pos, slots, out, items = [], [], [], [], []   # items: (seq, its tokens, logits row)

        def add(s, toks, want_logits):
            items.append((s, toks, len(out) if want_logits else None))
            if want_logits:
                out.append(len(tokens) + len(toks) - 1)
            pos.extend(range(len(s.kv), len(s.kv) + len(toks)))
            tokens.extend(toks)
            slots.extend([s.slot] * len(toks))

        for s in self._active:
            if len(s.kv) >= len(s.prompt):   # decoding: the token it sampled last step
                add(s, [s.policy.tokens[-1]], True)
        # >= 1 while a prompt is pending: decodes <= max_seqs - 1 <= n_batch - 1.
        budget = min(self.model.n_batch - len(tokens), self.prefill_chunk)
        for s in self._active:
            if budget <= 0:
                break
            if len(s.kv) < len(s.prompt):
                toks = s.prompt[len(s.kv):len(s.kv) + budget]
                add(s, toks, len(s.kv) + len(toks) == len(s.prompt))
                budget -= len(toks)
        return tokens, pos, slots, out, items

    def _pick_slot(self, prompt: list[int]) -> tuple[int, int]:
        """The free slot whose cache holds the longest reusable prefix of the prompt, and its length."""
        best, best_n = self._free[0], -1
        for slot in self._free:
            n = reusable_prefix(self._held[slot], prompt, self._ring)
            if n > best_n:
                best, best_n = slot, n
        self._free.remove(best)
        return best, best_n

    def _execute(self, plan) -> None:
        """Outside the lock: the model call, then each sequence's policy step. A sequence's
        state advances only once its part succeeded, so an interrupt leaves the others to redo
        this step. Results are published under the lock in `finally`."""
        tokens, pos, slots, out, items = plan
        results = []   # (seq, pieces, error)
        try:
            if not tokens:
                return
            try:
                if self._logits_buf is None or len(self._logits_buf) < len(out):
                    self._logits_buf = np.empty((max(len(out), self.max_seqs), self.model.n_vocab), np.float32)
                logits = self.model.batch_step(tokens, pos, slots, out, out=self._logits_buf)
            except Exception as e:
                results = [(s, [], e) for s, _, _ in items]
                return
            for s, toks, row in items:
                pieces = []
                try:
                    if row is not None:
                        pieces = s.policy.step(logits[row], len(s.kv) + len(toks))
                        now, st = time.perf_counter(), s.policy.stats
                        if s.t_last:
                            st.token_latencies_s.append(now - s.t_last)
                        else:
                            st.prefill_s = now - s.t_admit
                        s.t_last = now
                except Exception as e:
                    results.append((s, [], e))
                    continue
                except BaseException as e:   # its policy state is half-updated: end it with the interrupt
                    results.append((s, [], e))
                    raise
                s.kv += toks
                s.policy.stats.positions_computed += len(toks)
                results.append((s, pieces, None))
        finally:
            with self._cond:
                for s, pieces, err in results:
                    s.pieces.extend(pieces)
                    if err is not None or s.policy.completion is not None:
                        self._retire(s, err)
                self._stepping = False
                self._cond.notify_all()

    def _reap(self) -> None:
        """Under the lock: ends cancelled requests (active ones free their slot)."""
        for s in [s for s in self._active if s.cancelled] + [s for s in self._queue if s.cancelled]:
            s.pieces.extend(s.policy.end("cancelled", "cancel()"))
            self._retire(s)

    def _retire(self, s: _Seq, error: BaseException | None = None) -> None:
        if s in self._active:
            self._active.remove(s)
            self._free.append(s.slot)
            # After an error the slot's cache may hold uncommitted writes (a ring may have wrapped).
            self._held[s.slot] = s.kv if error is None else []
        elif s in self._queue:
            self._queue.remove(s)
        s.error, s.done = error, True

    def _wait(self, take, timeout: float | None = None):
        """take()'s first answer that is not None (take runs under the lock). While no driver
        thread runs and no other thread is stepping, the caller steps the whole batch itself."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                got = take()
                if got is not None:
                    return got
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"the request did not end within {timeout} s")
                if self._driving or self._stepping:
                    self._cond.wait(left)
                    continue
                plan = self._claim()
            self._execute(plan)
            if not plan[0]:
                with self._cond:
                    if take() is None:   # cannot happen: a pending request always has work
                        raise RuntimeError("the engine has nothing to run but the request is not done")

    # ---- a driver thread ----

    def start(self) -> "Engine":
        """Starts a background thread that steps whenever there is work (until stop())."""
        with self._cond:
            if self._driving:
                return self
            self._driving, self._stop_req = True, False
        self._thread = threading.Thread(target=self._drive, name="pydecode-engine", daemon=True)
        self._thread.start()
        return self

    def run(self) -> None:
        """Drives the engine in the calling thread until stop() is called from another."""
        with self._cond:
            if self._driving:
                raise RuntimeError("the engine already has a driver")
            self._driving, self._stop_req = True, False
        self._drive()

    def stop(self) -> None:
        """Stops the driver after its current step. Pending requests stay: their consumers (or a
        new start()) drive them."""
        with self._cond:
            self._stop_req = True
            self._cond.notify_all()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join()

    def _drive(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop_req and (self._stepping or not (self._queue or self._active)):
                        self._cond.wait()
                    if self._stop_req:
                        return
                    plan = self._claim()
                self._execute(plan)   # its errors went to the handles of its sequences
        except BaseException as e:    # a bug: fail every request rather than leave them waiting
            with self._cond:
                for s in list(self._active) + list(self._queue):
                    self._retire(s, e)
                self._held = [[] for _ in self._held]
        finally:
            with self._cond:
                self._driving = False
                self._cond.notify_all()

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
