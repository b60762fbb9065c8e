"""The token-level half of llama-cpp-python's Llama: a context the object keeps
(input_ids[:n_tokens], the logits after them in `scores`) that eval() extends, sample() draws
from and generate() runs, with reset(), save_state() / load_state() and the seed.

The context lives in one of the model's KV slots, leased from its SlotLedger (pydecode/slots.py)
for each call and released with the tokens it then holds, exactly as the batching Engine's
generations do: so a completion after eval() reuses what eval() computed, an eval() after a
completion reuses the completion's prompt, and neither can overwrite the other's cache unseen
(a slot another generation holds is never written). A slot that changed hands since is simply
recomputed from the tokens, so the context is always what input_ids says."""
from __future__ import annotations

import random

import numpy as np

from .. import constraint as structured
from ..errors import ContextFullError
from ..generation import Hooks
from ..sampling import Sampler, SamplingParams
from .llama_cache import LlamaState, longest_token_prefix
from .llama_grammar import structure_of


def sampling_params(temperature, top_k, top_p, min_p, typical_p, tfs_z, mirostat_mode, mirostat_tau, mirostat_eta,
                    repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n, seed) -> dict:
    """llama-cpp-python's sampling arguments as pydecode's (SamplingParams' names). As llama.cpp:
    top_p <= 0 keeps only the most likely token (greedy), temperature < 0 draws from the
    untruncated softmax, and top_k <= 0 is off."""
    if top_p <= 0:
        temperature = 0.0
    if temperature < 0:
        temperature, top_k, top_p, min_p = 1.0, 0, 1.0, 0.0
    return dict(temperature=float(temperature), top_k=max(0, int(top_k)), top_p=min(1.0, float(top_p)) if top_p > 0
                else 1.0, min_p=float(min_p), typical_p=float(typical_p), tfs_z=float(tfs_z),
                mirostat_mode=mirostat_mode, mirostat_tau=float(mirostat_tau), mirostat_eta=float(mirostat_eta),
                repeat_penalty=float(repeat_penalty), frequency_penalty=float(frequency_penalty),
                presence_penalty=float(presence_penalty), repeat_last_n=repeat_last_n, seed=seed)


class TokenContext:
    """Mixed into compat.llama.Llama, which sets _llm, _logits_all, _seed and last_n_tokens_size
    before calling _init_context."""

    def _init_context(self) -> None:
        n_ctx, n_vocab = self._llm.n_ctx, self._llm.model.n_vocab
        self.input_ids = np.zeros(n_ctx, dtype=np.intc)
        # every position's logits with logits_all (n_ctx x n_vocab floats, as llama-cpp-python),
        # else the last position's only
        self.scores = np.zeros((n_ctx if self._logits_all else 1, n_vocab), dtype=np.single)
        self.n_tokens = 0
        self._slot: int | None = None
        self._have_logits = False    # scores hold the logits after input_ids[:n_tokens]
        self._lessee = object()      # this context's lease in the SlotLedger

    @property
    def _input_ids(self) -> np.ndarray:
        return self.input_ids[:self.n_tokens]

    @property
    def _scores(self) -> np.ndarray:
        if self._logits_all:
            return self.scores[:self.n_tokens]
        return self.scores[:1] if self._have_logits else self.scores[:0]

    @property
    def eval_tokens(self):
        from collections import deque
        return deque(self.input_ids[:self.n_tokens].tolist(), maxlen=self._llm.n_ctx)

    @property
    def eval_logits(self):
        from collections import deque
        return deque(self._scores.tolist(), maxlen=self._llm.n_ctx)

    def set_seed(self, seed: int) -> None:
        """The seed the next sample() / generate() draws with (create_completion without a seed
        derives its own from it, as llama-cpp-python)."""
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self._seed = seed

    def _next_seed(self, seed: int | None) -> int:
        """llama-cpp-python's seed chain: a call's seed, else one drawn from the last; either is
        the seed from then on (so save_state / load_state replays the same draws)."""
        self._seed = seed if seed is not None else random.Random(self._seed).randint(0, 2**32)
        return self._seed & (2**64 - 1)

    def reset(self) -> None:
        """Forgets the context (n_tokens = 0). The cache keeps what it holds, so evaluating the
        same tokens again reuses them."""
        self.n_tokens = 0
        self._have_logits = False

    # ---- eval: tokens into the context ----

    def eval(self, tokens) -> None:
        """Appends tokens to the context (input_ids[n_tokens:]) and computes the logits after
        them (of every position with logits_all)."""
        self._require_model("eval")
        toks = [int(t) for t in tokens]
        if not toks:
            return
        n0, n_ctx = self.n_tokens, self._llm.n_ctx
        if n0 + len(toks) > n_ctx:
            raise ContextFullError(f"eval: {n0} tokens in the context and {len(toks)} more exceed n_ctx={n_ctx}")
        self._compute(self.input_ids[:n0].tolist() + toks)

    def _compute(self, target: list[int]) -> None:
        """Makes the context `target`: its tokens' K/V in a leased slot (recomputing what the slot
        does not hold), the logits after them in scores."""
        model = self._llm.model
        got = model.slots.lease(target, self._lessee)
        if got is None:
            raise RuntimeError("every KV slot of this model is in use by a generation (an unfinished stream?): "
                               "finish or close it first")
        slot, reuse = got
        start = min(reuse, self.n_tokens) if self._logits_all else reuse
        held: list[int] = []
        try:
            run, pos = target[start:], start
            for i in range(0, len(run), model.n_batch):
                chunk = run[i:i + model.n_batch]
                out = model.prefill(chunk, pos, all_logits=self._logits_all, seq=slot, lease=self._lessee)
                if self._logits_all:
                    self.scores[pos:pos + len(chunk)] = out
                pos += len(chunk)
            if not self._logits_all:
                self.scores[0] = out
            held = target
        finally:
            model.slots.release(slot, self._lessee, held)
        self.input_ids[:len(target)] = target
        self.n_tokens, self._slot, self._have_logits = len(target), slot, True

    def _follow(self, handle) -> None:
        """After a generation through the Engine: the context is what its slot now holds."""
        slot = handle.slot
        if slot is None:
            return
        held = self._llm.model.slots.held(slot)[:self._llm.n_ctx]
        self.input_ids[:len(held)] = held
        self.n_tokens, self._slot, self._have_logits = len(held), slot, False

    # ---- sample / generate ----

    def _logits_at(self, idx: int | None) -> tuple[np.ndarray, int]:
        """(the logits after position idx, the tokens before them)."""
        last = self.n_tokens - 1
        if idx is None or idx == last:
            if not self._have_logits:
                if self.n_tokens == 0:
                    raise RuntimeError("sample: the context is empty; eval() tokens first")
                self._compute(self.input_ids[:self.n_tokens].tolist())   # (after a completion: recomputed)
            return (self.scores[last] if self._logits_all else self.scores[0]), self.n_tokens
        if not isinstance(idx, int) or not 0 <= idx < self.n_tokens:
            raise ValueError(f"idx must be a position in 0..{last} (the context), got {idx!r}")
        if not self._logits_all:
            raise ValueError(f"idx={idx}: only the last position's logits are kept; Llama(logits_all=True) "
                             f"keeps every position's")
        return self.scores[idx], idx + 1

    def _choose(self, sampler, matcher, logits, n_before, logits_processor, penalize_nl) -> int:
        ids = self.input_ids[:n_before]
        # (the Engine's hooks: the same checks of a processor's answer)
        x = Hooks(logits_processor, None, ids, len(logits)).process(logits) if logits_processor is not None \
            else logits.copy()
        recent = ids[-self.last_n_tokens_size:].tolist() if self.last_n_tokens_size else []
        if not penalize_nl:   # (the newline's logit left out of the penalties)
            nl = self.token_nl()
            recent = [t for t in recent if t != nl]
        if matcher is not None:
            return int(matcher.choose(x, sampler, recent))
        return int(sampler.sample(x, recent))

    def _sampler(self, temp, top_k, top_p, min_p, typical_p, tfs_z, mirostat_mode, mirostat_tau, mirostat_eta,
                 repeat_penalty, frequency_penalty, presence_penalty) -> Sampler:
        params = SamplingParams(**sampling_params(temp, top_k, top_p, min_p, typical_p, tfs_z, mirostat_mode,
                                                  mirostat_tau, mirostat_eta, repeat_penalty, frequency_penalty,
                                                  presence_penalty, self.last_n_tokens_size,
                                                  self._seed & (2**64 - 1)))
        return Sampler(params, self._llm.model.n_vocab)

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True, logits_processor=None, grammar=None,
               idx: int | None = None) -> int:
        """The next token from the logits after position idx (default: the context's last),
        through the sampling chain; penalties over the tokens before it. grammar: as in
        llama-cpp-python, where one sample() call makes its sampler afresh, the token is one the
        grammar may start with (its state is not carried from call to call; generate(grammar=)
        follows it through the tokens)."""
        self._require_model("sample")
        logits, n_before = self._logits_at(idx)
        sampler = self._sampler(temp, top_k, top_p, min_p, typical_p, tfs_z, mirostat_mode, mirostat_tau,
                                mirostat_eta, repeat_penalty, frequency_penalty, presence_penalty)
        return self._choose(sampler, self._matcher(grammar), logits, n_before, logits_processor, penalize_nl)

    def _matcher(self, grammar):
        """A fresh structured.Constraint of a LlamaGrammar (or None)."""
        if grammar is None:
            return None
        tok = self._llm.tokenizer
        g = structured.grammar_of(**structure_of(grammar))
        return structured.Constraint(tok, self._llm.model.n_vocab, structured.compile_grammar(tok, g))

    def generate(self, tokens, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
                 temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True, frequency_penalty: float = 0.0,
                 presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                 mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, penalize_nl: bool = True,
                 logits_processor=None, stopping_criteria=None, grammar=None):
        """Yields tokens after `tokens` until the caller stops, a stopping criterion says so, or
        the context is full; `send(more_tokens)` appends tokens after the one just yielded. With
        reset (the default), a context that starts with `tokens` is reused, not recomputed."""
        self._require_model("generate")
        tokens = [int(t) for t in tokens]
        if not tokens and self.n_tokens == 0:
            raise ValueError("generate: no tokens (and the context is empty)")
        if reset:
            n = longest_token_prefix(self.input_ids[:self.n_tokens].tolist(), tokens)
            if not (n == len(tokens) == self.n_tokens and self._have_logits):
                keep = min(n, len(tokens) - 1)
                if keep < self.n_tokens:
                    self.n_tokens, self._have_logits = keep, False
                tokens = tokens[keep:]
            else:
                tokens = []
        sampler = self._sampler(temp, top_k, top_p, min_p, typical_p, tfs_z, mirostat_mode, mirostat_tau,
                                mirostat_eta, repeat_penalty, frequency_penalty, presence_penalty)
        tok = self._llm.tokenizer
        matcher = self._matcher(grammar)
        while True:
            if tokens:
                self.eval(tokens)
            logits, n_before = self._logits_at(None)
            if matcher is not None and matcher.done:   # the grammar is complete: only the end is left
                token = tok.eos_id if tok.eos_id is not None else next(iter(tok.eog_ids))
            else:
                token = self._choose(sampler, matcher, logits, n_before, logits_processor, penalize_nl)
            if stopping_criteria is not None and \
                    Hooks(None, stopping_criteria, self.input_ids[:self.n_tokens], len(logits)).stops(logits):
                return
            more = yield token
            if self.n_tokens >= self._llm.n_ctx:
                return
            tokens = [token] + [int(t) for t in (more or [])]

    # ---- saved states ----

    def save_state(self) -> LlamaState:
        """The context (tokens, logits, the seed) and its KV cache, as a LlamaState."""
        self._require_model("save_state")
        data = b""
        if self.n_tokens:
            ours = self.input_ids[:self.n_tokens].tolist()
            if self._slot is None or self._llm.model.slots.held(self._slot)[:self.n_tokens] != ours:
                self._compute(ours)        # its slot was reused meanwhile: computed again
            data = self._llm.export_state(slot=self._slot)
        scores = (self.scores[:self.n_tokens].copy() if self._logits_all else
                  self.scores[:1].copy() if self._have_logits else None)
        return LlamaState(self.input_ids.copy(), scores, self.n_tokens, data,
                          len(data) + (scores.nbytes if scores is not None else 0), self._seed)

    def load_state(self, state: LlamaState) -> None:
        """Restores a save_state(): the context, its logits, the seed and the KV cache. A state
        of another model (or a damaged one) is refused with the reason (pydecode/kvstate.py)."""
        self._require_model("load_state")
        if not isinstance(state, LlamaState):
            raise TypeError(f"load_state takes a LlamaState (from save_state), got {type(state).__name__}")
        n = int(state.n_tokens)
        if n > self._llm.n_ctx:
            raise ValueError(f"load_state: the state holds {n} tokens, more than n_ctx={self._llm.n_ctx}")
        ids = np.asarray(state.input_ids, dtype=np.intc)[:n].tolist()
        if n:
            slot = self._slot if self._slot is not None else 0
            held = self._llm.import_state(state.llama_state, slot=slot)
            if held[:n] != ids:
                raise ValueError("load_state: the state's KV cache does not hold its input_ids (a damaged state)")
            self._slot = slot
        self.input_ids[:] = 0
        self.input_ids[:n] = ids
        self.n_tokens = n
        sc = state.scores
        self._have_logits = sc is not None and n > 0 and len(sc) > 0
        if self._have_logits:
            if self._logits_all and len(sc) == n:
                self.scores[:n] = sc
            else:
                self.scores[-1 if not self._logits_all else n - 1] = sc[-1]
        self._seed = state.seed
