"""Every generation of an LLM: continuous batching over the sequence slots of one Model.

Each step is ONE model call, so every weight is read once for all sequences: the next token of
every decoding sequence (one token each) plus chunks of newly admitted prompts filling the rest
of the step's n_batch tokens (chunked prefill: a long prompt shares steps with the others'
decodes instead of freezing them, and a cancel or Ctrl-C waits for one chunk at most). A step
of one sequence's one token is `Model.decode_step`; any other is `Model.batch_step`. Requests
wait FIFO beyond the slot cap and join between steps; finished or cancelled ones leave at once
and free their slot. What happens to each sampled token (sampling, stops, detokenizing,
logprobs) is generation.TokenPolicy, one per sequence. With a drafter (Engine(draft=...)), a
decoding sequence's step also carries the tokens it guesses next, verified in the same pass
(pydecode/speculative.py): the same tokens, several per pass.

Slots are leased from the model's SlotLedger (pydecode/slots.py), which also remembers what
each slot's cache holds, so a new request takes the free slot sharing the longest prefix with
its prompt and prefills only the rest.

Threads: submit() and cancel() may be called from any thread. Either a driver thread steps
(start()/stop(), or `with engine:`), or, while none runs, whoever waits on a handle (iterating it,
result()) steps the whole batch itself; the pieces of other handles queue up for their consumers.
The driver holds the engine only weakly: an engine (and its LLM and model) that nobody else
references is freed, and its driver ends. close() cancels every request and waits for the step
in flight. A KeyboardInterrupt in a thread waiting on a handle ends that handle's request
(finish_reason "cancelled", its partial result kept) and reaches the caller.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections import deque

import numpy as np

from .errors import ModelClosedError, QueueFullError
from .generation import TokenPolicy, prompt_ids
from .model import Model, _is_int
from .request import Handle, _Seq, _wake
from .sampling import SamplingParams
from .engine_state import SlotStates
from .engine_context import SeqContexts, _pending
from . import constraint, speculative


class Engine(SlotStates, SeqContexts):
    """Continuous batching over a Model's n_seq KV slots (see the module docstring).

    max_seqs: sequences decoded together (default: the model's n_seq, at most its n_batch);
    max_queue: requests that may wait beyond them (default: unbounded; submit raises
    QueueFullError when full); prefill_chunk: most prompt tokens one step takes (default: as many
    as take about PREFILL_STEP_S on this machine, measured as prompts run, within 16..n_batch;
    smaller keeps the other streams' inter-token latency lower while a long prompt is
    prefilled, and bounds how long a cancel or Ctrl-C waits). How a prompt is cut into chunks
    never changes the results: the C core computes each position exactly as in one block."""

    PREFILL_STEP_S = 0.25

    def __init__(self, model: Model, max_seqs: int | None = None, max_queue: int | None = None,
                 prefill_chunk: int | None = None, draft=None):
        n = min(model.n_seq, model.n_batch) if max_seqs is None else max_seqs
        if not _is_int(n) or not 1 <= n <= model.n_seq:
            raise ValueError(f"max_seqs must be an integer in 1..{model.n_seq} (the model's n_seq), got {max_seqs!r}")
        if n > model.n_batch:   # every active sequence's decode must fit in one step
            raise ValueError(f"max_seqs={n} exceeds the model's n_batch={model.n_batch} (tokens per step)")
        if max_queue is not None and (not _is_int(max_queue) or max_queue < 0):
            raise ValueError(f"max_queue must be an integer >= 0 or None, got {max_queue!r}")
        if prefill_chunk is not None and (not _is_int(prefill_chunk) or not 1 <= prefill_chunk <= model.n_batch):
            raise ValueError(f"prefill_chunk must be an integer in 1..{model.n_batch} (n_batch), got {prefill_chunk!r}")
        self.model, self.max_seqs, self.max_queue, self.prefill_chunk = model, n, max_queue, prefill_chunk
        # Speculative decoding (pydecode/speculative.py): "lookup", a speculative.DraftModel, or None.
        if not (draft is None or draft == "lookup" or isinstance(draft, speculative.DraftModel)):
            raise ValueError(f"draft must be None, 'lookup' or a speculative.DraftModel, got {draft!r}")
        self.draft = draft
        self._costs = speculative.PassCosts(speculative.verify_costs(model)) if draft is not None else None
        self._follows_model = max_seqs is None    # max_seqs grows with the model's slots (grow)
        self._s_per_token: float | None = None   # measured step time per token, for the adaptive chunk
        # A plain lock: a finalizer's non-blocking acquire (see _abandon) never re-enters it.
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[_Seq] = deque()
        self._active: list[_Seq] = []          # in admission order
        self._logits_buf = None   # batch_step's output, reused step after step (rows are read within the step)
        self._stepper: int | None = None       # the thread inside a step (its ident), None between steps
        self._driving = False                  # a driver thread runs: consumers only wait
        self._stop_req = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._summ = 0.0                       # the model's sampling-summary setting, as last set here
        self._state_waiting = 0                # restores waiting for a free slot (_take_slot)
        self.n_steps = 0                       # model calls made (steps with work)
        self.busy_in_steps = 0                 # the sequences those steps carried, summed
        # Tokens a constraint forces run through the model in one pass (False: one step each;
        # the same tokens either way, which the tests check).
        self.forced_runs = True
        # Leases still held when the engine is dropped go back to the model's ledger.
        weakref.finalize(self, _release_leases, model.slots, self._active)

    # ---- requests ----

    def submit(self, prompt: str | list[int], max_tokens: int = 256, *, stop: str | list[str] | None = None,
               logprobs: int | None = None, on_prefill=None, draft_tokens: int | None = None,
               ignore_eos: bool = False, json_schema=None, regex: str | None = None, grammar: str | None = None,
               choices: list[str] | None = None, response_format: dict | None = None, slot: int | None = None,
               logits_processor=None, stopping_criteria=None, context_shift: bool = False, n_keep: int = 0,
               n_discard: int = 0, **sampling) -> Handle:
        """Queues a request (text or token ids) and returns its Handle. Sampling parameters as in
        LLM.generate (temperature, top_k, top_p, min_p, typical_p, tfs_z, mirostat_mode /
        mirostat_tau / mirostat_eta, penalties, repeat_last_n, seed, logit_bias), and its
        logits_processor and stopping_criteria (generation.Hooks: the model's step then makes no
        summary for it). Every parameter is checked here, so a bad one raises now, never inside
        a step. on_prefill:
        called as on_prefill(done, total) after each chunk of the prompt (in the stepping thread;
        its errors are ignored), e.g. for a progress bar. draft_tokens: the most tokens a
        drafter (the engine's `draft`) may propose per pass, 0..speculative.MAX_DRAFT (0: decode
        plainly; default: MAX_DRAFT when the engine has a drafter); the output is the same.
        ignore_eos: generate past end-of-generation tokens, to max_tokens (benchmarks).
        Structured output (pydecode/constraint.py), at most one of: json_schema (a dict or a JSON
        string), regex, grammar (Lark or GBNF), choices (the output is one of these strings),
        response_format (OpenAI's {"type": "json_object"} or {"type": "json_schema", "json_schema":
        {"name", "schema", "strict"}}, or llama-cpp-python's {"type": "json_object", "schema": ...}).
        The output then always matches it; a bad one raises ValueError here. slot: run in this KV
        slot (waiting while it is in use), e.g. to reuse what it holds (llama-server's id_slot);
        default: the free slot sharing the longest prefix with the prompt.
        context_shift: when the context is full, drop n_discard tokens (default: half of those
        after the kept ones) after the first n_keep (-1: the whole prompt; a BOS is kept beyond
        them) and go on, instead of ending (finish_reason "length"): llama-server's
        --context-shift (see _shift); Completion.stats.shifted counts the tokens dropped."""
        m = self.model
        if slot is not None and (not _is_int(slot) or not 0 <= slot < m.n_seq):
            raise ValueError(f"slot must be an integer in 0..{m.n_seq - 1} (the sequence slots), got {slot!r}")
        if self._closed:
            raise ModelClosedError("the engine is closed")
        if draft_tokens is not None and (not _is_int(draft_tokens) or not 0 <= draft_tokens <= speculative.MAX_DRAFT):
            raise ValueError(f"draft_tokens must be an integer in 0..{speculative.MAX_DRAFT} or None, got {draft_tokens!r}")
        m.check_file()
        ids = prompt_ids(m.tokenizer, prompt, m.n_vocab)
        if not isinstance(context_shift, bool):
            raise ValueError(f"context_shift must be a bool, got {context_shift!r}")
        for name, v, low in (("n_keep", n_keep, -1), ("n_discard", n_discard, 0)):
            if not _is_int(v) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        params = SamplingParams(**sampling)
        g = constraint.grammar_of(json_schema, regex, grammar, choices, response_format)
        policy = TokenPolicy(m.tokenizer, m.n_vocab, m.n_ctx, ids, max_tokens, params, stop=stop,
                             logprobs=logprobs, ignore_eos=ignore_eos, logits_processor=logits_processor,
                             stopping_criteria=stopping_criteria, context_shift=context_shift,
                             constraint=None if g is None else constraint.Constraint(
                                 m.tokenizer, m.n_vocab, constraint.compile_grammar(m.tokenizer, g)))
        s = _Seq(ids, policy)
        s.on_prefill = on_prefill
        s.want_slot = slot
        if context_shift:   # (llama-server: -1 keeps the prompt; a BOS is kept beyond n_keep)
            bos = int(n_keep >= 0 and m.tokenizer.bos_id is not None and ids[0] == m.tokenizer.bos_id)
            s.shift = (len(ids) if n_keep < 0 else n_keep + bos, n_discard)
        s.pieces.extend(policy.start())   # what a constraint forces first
        if policy.completion is not None:   # ... may be the whole output (choices=["yes"])
            s.done = True
            return Handle(self, s)
        if self.draft is not None:
            s.draft_max = speculative.MAX_DRAFT if draft_tokens is None else draft_tokens
        if s.draft_max:
            lookup = self.draft == "lookup"
            s.lookup = speculative.PromptLookup() if lookup else None
            s.tuner = speculative.Tuner(self._costs, 0.0, speculative.lookup_prior) if lookup else \
                speculative.Tuner(self._costs, self.draft.cost)
        with self._cond:
            if self._closed:
                raise ModelClosedError("the engine is closed")
            # Queued requests that free slots will take at the next step are not waiting.
            free = self.max_seqs - len(self._active)
            if self.max_queue is not None and len(self._queue) - free >= self.max_queue:
                raise QueueFullError(f"the queue is full: {self.max_queue} requests already wait for one of "
                                     f"{self.max_seqs} sequence slots (max_queue={self.max_queue})")
            self._queue.append(s)
            self._cond.notify_all()
        return Handle(self, s)

    def _cancel(self, s: _Seq, detail: str) -> None:
        if s.done:
            return
        s.cancel_detail, s.cancelled = detail, True
        # cancel() may come from a signal handler (Ctrl-C in the CLI) that interrupted this very
        # thread inside the lock: then the flag alone does it, at the next step boundary.
        if not self._cond.acquire(timeout=0.1):
            return
        try:
            if self._stepper is None and not s.done:   # between steps already: end it now
                self._reap()
            self._cond.notify_all()
        finally:
            self._cond.release()

    def _count(self, seqs) -> int:
        with self._cond:
            if self._stepper is None:   # cancellations flagged without the lock end now
                self._reap()
            return len(seqs)

    @property
    def n_active(self) -> int:
        return self._count(self._active)

    @property
    def n_queued(self) -> int:
        return self._count(self._queue)

    @property
    def kv_bytes_reserved(self) -> int:
        """KV cache bytes allocated (every slot, full context)."""
        return self.model.kv_bytes

    @property
    def kv_bytes_in_use(self) -> int:
        """KV bytes the active sequences fill: their positions x per-position bytes, layer by
        layer, sliding-window layers capped at their ring (ArchConfig.kv_bytes)."""
        c, nb = self.model.config, self.model.n_batch
        elem = self.model.kv_elem_bytes
        with self._cond:
            return sum(c.kv_bytes(len(s.kv), elem, ring_extra=nb) for s in self._active)

    # ---- stepping ----

    def step(self) -> int:
        """One step of the whole batch (waits while another thread is inside one). Returns the
        tokens it ran (0: nothing to do). An error in it ends the sequences it carried: their
        handles raise it."""
        with self._cond:
            while self._stepper is not None:
                self._cond.wait()
        return self._step_once()

    def _step_once(self) -> int:
        """Claims the step, plans and executes it; 0 when another thread is stepping or there
        is nothing to do. Whatever interrupts it, the step is released and its results
        published (see _execute)."""
        me = threading.get_ident()
        try:
            with self._cond:
                if self._stepper is not None or self._closed:
                    return 0
                self._stepper = me
                plan = self._plan()
            if plan:   # (counts for the server's /metrics: model calls, and the sequences in each)
                self.n_steps += 1
                self.busy_in_steps += len({id(s) for s, _, _ in plan})
            with self._booked_whole():
                self._execute(plan)
            return sum(len(toks) for _, toks, _ in plan)
        finally:
            if self._stepper == me:            # only this thread sets it to its own ident
                with self._cond:
                    self._stepper = None
                    self._cond.notify_all()

    def _plan(self):
        """Under the lock: reaps cancellations, admits queued requests FIFO into free slots, and
        lays out the step: decodes first (one token each), then prompt chunks in admission order,
        so the earliest admitted prompt is served first and none starves."""
        self._reap()
        ledger = self.model.slots
        # A slot that frees while a restore waits for one is kept for it (it waited first, or
        # at least as long as any generation admitted later would have).
        while self._queue and len(self._active) < self.max_seqs and \
                (not self._state_waiting or ledger.n_free() > self._state_waiting):
            s = self._queue[0]
            if s in self._active:            # an interrupt landed between the two lines below
                self._queue.popleft()
                continue
            got = ledger.lease(s.prompt, s, True) if s.want_slot is None else \
                ledger.lease_slot(s.want_slot, s.prompt, s, True)
            if got is None:   # the other slots are leased elsewhere (another Engine on this model)
                break
            s.slot, n = got
            self._admit_reuse(s, n)
            s.kv = s.prompt[:n]
            s.policy.stats.cached_tokens = n
            s.t_admit = time.perf_counter()
            self._active.append(s)
            self._queue.popleft()
        for s in list(self._active):
            if s.shift is not None and len(s.kv) >= len(s.base) and len(s.kv) + len(_pending(s)) > self.model.n_ctx:
                self._shift(s)
        items = []   # (seq, its tokens, logits rows it needs: 0, 1, or 1 + its drafts)
        decoding = [s for s in self._active if len(s.kv) >= len(s.base)]
        room = self.model.n_batch - len(decoding)   # one token each is theirs
        for s in decoding:
            # The token it sampled last step, and the tokens a constraint forced after it (run
            # together, unsampled: the logits row needed is the last one's).
            pend = _pending(s)
            take = 1 + (min(len(pend) - 1, room) if self.forced_runs else 0)
            room -= take - 1
            items.append((s, pend[:take], int(take == len(pend))))
        # >= 1 while a prompt is pending (decodes <= max_seqs - 1 <= n_batch - 1), unless forced
        # runs took the room this step.
        budget = min(room, self._chunk())
        for s in self._active:
            if budget <= 0:
                break
            if len(s.kv) < len(s.base):   # its prompt's next chunk (with the tokens forced after it)
                pend = _pending(s)
                toks = self._cut_at_checkpoint(s, pend[:budget])
                items.append((s, toks, int(len(toks) == len(pend))))
                budget -= len(toks)
        return items

    @staticmethod
    def _layout(items):
        """The step's model-call arguments: tokens, positions, slots, logits rows (out), and
        each item's first row."""
        tokens, pos, slots, out, first = [], [], [], [], []
        for s, toks, n_rows in items:
            first.append(len(out))
            out.extend(range(len(tokens) + len(toks) - n_rows, len(tokens) + len(toks)))
            pos.extend(range(len(s.kv), len(s.kv) + len(toks)))
            tokens.extend(toks)
            slots.extend([s.slot] * len(toks))
        return tokens, pos, slots, out, first

    def _chunk(self) -> int:
        """Prompt tokens the next step may take: prefill_chunk, or what takes about
        PREFILL_STEP_S at the speed measured so far (32 before any measurement)."""
        if self.prefill_chunk is not None:
            return self.prefill_chunk
        if self._s_per_token is None:
            return min(32, self.model.n_batch)
        n = int(self.PREFILL_STEP_S / self._s_per_token) // 16 * 16
        return max(16, min(self.model.n_batch, n))

    def _model_call(self, tokens, pos, slots, out, items):
        """The step's one model call; returns its logits rows. With one row of one sequence
        whose sampler can use it, the step also summarizes the logits for the draw."""
        m = self.model
        p = items[0][0].policy
        want = 0.0
        if len(items) == 1 and len(out) == 1:   # (a constrained draw reads it first, at any top-k)
            want = p.sampler.summary_inv_t if p.constraint is None else p.sampler.propose_inv_t
        if want != self._summ:
            m.set_summary(want)
            self._summ = want
        if len(tokens) == 1:
            s = items[0][0]
            return (m.decode_step(tokens[0], pos[0], s.slot, lease=s),)
        if self._logits_buf is None or len(self._logits_buf) < len(out):
            self._logits_buf = np.empty((max(len(out), self.max_seqs), m.n_vocab), np.float32)
        return m.batch_step(tokens, pos, slots, out, out=self._logits_buf, lease=self)

    def _execute(self, plan) -> None:
        """Outside the lock: the model call, then each sequence's policy step. A sequence's
        state advances only once its part succeeded, so an interrupt leaves the others to redo
        this step (rewriting the same cache positions). Results are published under the lock in
        `finally`."""
        items = plan
        results = []   # (seq, pieces, error)
        try:
            if not items:
                return
            try:
                if self.draft is not None:   # outside the lock: a draft model's steps
                    items = speculative.add_drafts(items, self.model, self.draft, self._costs)
                tokens, pos, slots, out, first = self._layout(items)
                for s, toks, _ in items:   # before the call: an interrupt may come once it wrote them
                    s.written = max(s.written, len(s.kv) + len(toks))
                # A hybrid's recurrent state absorbs every token verified, rejected ones too: it is
                # copied first, to be put back and fed only the accepted ones (_roll_back).
                snaps = {id(s): self.model.ssm_snapshot(s.slot) for s, _, n_rows in items
                         if n_rows > 1 and self.model.config.recurrent}
                t0 = time.perf_counter()
                logits = self._model_call(tokens, pos, slots, out, items)
                dt = time.perf_counter() - t0
                if len(tokens) >= 16:   # a step with a prompt chunk: its time per token
                    per = dt / len(tokens)
                    self._s_per_token = per if self._s_per_token is None else 0.7 * self._s_per_token + 0.3 * per
            except Exception as e:
                results = [(s, [], e) for s, _, _ in items]
                return
            summarized = self._summ > 0
            for (s, toks, n_rows), row in zip(items, first):
                pieces, used = [], len(toks)
                try:
                    n_had = len(s.policy.tokens)
                    if n_rows > 1:   # a verification pass: the longest run the policy agrees with
                        pieces, used = speculative.verify(s, logits[row:row + n_rows], toks)
                    elif n_rows:
                        pieces = s.policy.step(logits[row], len(s.kv) + len(toks),
                                               self.model if summarized else None)
                    if n_rows:
                        now, st = time.perf_counter(), s.policy.stats
                        if s.t_last:   # one latency per token: a pass's later tokens came with its first
                            st.decode_passes += 1
                            new = max(1, len(s.policy.tokens) - n_had)
                            st.token_latencies_s += [now - s.t_last] + [0.0] * (new - 1)
                        else:
                            st.prefill_s = now - s.t_admit
                        s.t_last = now
                except Exception as e:
                    results.append((s, [], e))
                    continue
                except BaseException as e:   # its policy state is half-updated: end it with the interrupt
                    results.append((s, [], e))
                    raise
                if id(s) in snaps and used < len(toks):
                    self._roll_back(s, snaps[id(s)], toks[:used])
                s.kv += toks[:used]
                self._keep_checkpoint(s)
                s.policy.stats.positions_computed += len(toks)
                results.append((s, pieces, None))
                if s.on_prefill is not None and len(s.kv) <= len(s.prompt) and s.base is s.prompt:
                    try:
                        s.on_prefill(len(s.kv), len(s.prompt))
                    except Exception:
                        pass
            if self._costs is not None and len(out) == len(tokens):   # decodes (and drafts) only
                self._costs.observe(len(tokens), time.perf_counter() - t0)   # the pass and its policy steps
        finally:
            with self._cond:
                for s, pieces, err in results:
                    s.pieces.extend(pieces)
                    if err is not None or s.policy.completion is not None:
                        self._retire(s, err)
                    elif pieces:
                        _wake(s)
                idle = not self._active
                self._cond.notify_all()
            if idle and self._summ:   # still inside the step: no other call races it
                self._summ = 0.0
                try:
                    self.model.set_summary(0.0)
                except Exception:     # closed meanwhile: nothing left to summarize for
                    pass

    def _reap(self) -> None:
        """Under the lock, no step running: ends cancelled requests (active ones free their slot)."""
        for s in [s for s in self._active if s.cancelled] + [s for s in self._queue if s.cancelled]:
            s.pieces.extend(s.policy.end("cancelled", s.cancel_detail))
            self._retire(s)

    def _retire(self, s: _Seq, error: BaseException | None = None) -> None:
        if error is not None and s.policy.completion is None:
            s.policy.abort(f"error: {type(error).__name__}: {error}")
        if s in self._active:
            self._active.remove(s)
            # After an error the slot's cache may hold uncommitted writes (a ring may have wrapped).
            self.model.slots.release(s.slot, s, s.kv if error is None else [], max(0, s.written - len(s.kv)))
        elif s in self._queue:
            self._queue.remove(s)
        s.error, s.done = error, True
        _wake(s)

    def _interrupted(self, s: _Seq) -> None:
        """A KeyboardInterrupt (or another BaseException) reached the thread waiting on `s`:
        end `s` now, keeping what it produced, so its slot is free and nothing waits on it."""
        with self._cond:
            if not s.done:
                s.cancelled, s.cancel_detail = True, "KeyboardInterrupt"
                if self._stepper is None:
                    self._reap()
            self._cond.notify_all()

    def _wait(self, s: _Seq, take, timeout: float | None = None):
        """take()'s first answer that is not None (take runs under the lock). While no driver
        thread runs and no other thread is stepping, the caller steps the whole batch itself."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                with self._cond:
                    got = take()
                    if got is not None:
                        return got
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"the request did not end within {timeout} s")
                    if self._driving or self._stepper is not None:
                        self._cond.wait(left)
                        continue
                if not self._step_once():
                    with self._cond:   # its slot may be leased elsewhere (another Engine on this model)
                        if take() is None and self._stepper is None and not self._active:
                            self._cond.wait(0.01)
        except TimeoutError:
            raise
        except BaseException:
            self._interrupted(s)
            raise

    # ---- a driver thread ----

    def start(self) -> "Engine":
        """Starts a background thread that steps whenever there is work (until stop())."""
        with self._cond:
            if self._closed:
                raise ModelClosedError("the engine is closed")
            if self._driving:
                return self
            self._driving, self._stop_req = True, False
            self._thread = threading.Thread(target=_drive, args=(weakref.ref(self), self._cond),
                                            name="pydecode-engine", daemon=True)
        self._thread.start()
        return self

    def run(self) -> None:
        """Drives the engine in the calling thread until stop() is called from another."""
        with self._cond:
            if self._driving:
                raise RuntimeError("the engine already has a driver")
            self._driving, self._stop_req = True, False
        _drive(weakref.ref(self), self._cond)

    def stop(self) -> None:
        """Stops the driver after its current step. Pending requests stay: their consumers (or a
        new start()) drive them."""
        with self._cond:
            self._stop_req = True
            self._cond.notify_all()
            t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join()

    def close(self) -> None:
        """Cancels every request (their handles raise ModelClosedError, keeping what they
        produced), stops the driver and waits for the step in flight. Idempotent."""
        with self._cond:
            if self._stepper == threading.get_ident():
                raise RuntimeError("close() cannot be called from inside a step")
            self._closed = True
            while self._stepper is not None:
                self._cond.wait()
            err = ModelClosedError("the model was closed while this request ran")
            for s in list(self._active) + list(self._queue):
                s.policy.abort("closed")
                self._retire(s, err)
            self._cond.notify_all()
        self.stop()

    def grow(self, n_seq: int) -> int:
        """Up to n_seq sequences at once: the model's KV cache grows (within the memory there
        is) and, unless max_seqs was given, so does max_seqs. Returns the sequences it can run."""
        self.model.grow_slots(min(n_seq, self.model.n_batch))
        with self._cond:
            if self._follows_model:
                self.max_seqs = min(self.model.n_seq, self.model.n_batch)
            return self.max_seqs

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _drive(engine_ref, cond) -> None:
    """The driver's loop. It holds the engine only while stepping: between steps a dropped
    engine is freed, and the loop ends at its next look (at most a second later)."""
    while True:
        with cond:
            eng = engine_ref()
            if eng is None:
                return
            if eng._stop_req or eng._closed:
                eng._driving = False
                cond.notify_all()
                return
            if eng._stepper is not None or not (eng._queue or eng._active):
                del eng
                if engine_ref() is not None:
                    cond.wait(1.0)
                continue
        try:
            eng._step_once()
        except BaseException as e:   # a bug: fail every request rather than leave them waiting
            with cond:
                for s in list(eng._active) + list(eng._queue):
                    eng._retire(s, e)
                eng.model.slots.forget_all()
                eng._driving = False
                cond.notify_all()
            return
        finally:
            del eng


def _release_leases(ledger, active: list) -> None:
    """An engine's finalizer: slots its unfinished sequences leased go back (their cache content
    unknown)."""
    for s in list(active):
        if s.slot is not None:
            ledger.release(s.slot, s, [])
