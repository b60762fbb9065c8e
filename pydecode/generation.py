"""One generation's per-token policy: logits -> sample -> should_stop -> stop strings -> text
(with the user's logits processors before the sample and stopping criteria after it: Hooks).

Follow one token: the Engine (pydecode/engine.py) runs the prompt through the model (prefill,
in chunks) and gets the last position's logits; TokenPolicy.step samples a token (`sample`,
pydecode/sampling.py), `should_stop` decides whether it ends the generation, the incremental
detokenizer and the stop-string matcher turn it into text; otherwise the Engine's next step runs
it through every layer (`Model.decode_step`: append_kv in C, then attention over the cache)
and hands the next logits back here.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Iterator

from collections.abc import Sequence

import numpy as np

from .errors import ContextFullError
from .model import token_ids
from .sampling import Sampler, SamplingParams, top_logprobs
from .tokenizer.common import check_text


@dataclass
class Stats:
    """What a generation cost. positions_computed counts positions whose K/V were computed."""

    prompt_tokens: int = 0
    cached_tokens: int = 0           # prompt tokens whose K/V were reused from the previous call
    generated_tokens: int = 0
    positions_computed: int = 0
    prefill_s: float = 0.0
    ttft_s: float = 0.0              # time to first token: prefill + first sample
    token_latencies_s: list[float] = field(default_factory=list)  # each later token's step
    # (0.0 for the tokens after the first of a speculative pass: they came with it)
    decode_passes: int = 0           # model passes after the first token (plain or verifying drafts)
    draft_tokens: int = 0            # tokens a drafter proposed (speculative decoding)
    accepted_tokens: int = 0         # of those, the ones the model agreed with
    # structured output (pydecode/constraint.py)
    constraint_s: float = 0.0        # time the generation spent on its constraint (checks, waits
                                     # for masks, masked draws, forced runs), beyond a plain draw
    masks: int = 0                   # vocabulary masks computed (most steps need none: the draw
                                     # comes first and is checked alone, constraint.py)
    mask_s: float = 0.0              # their compute time
    forced_tokens: int = 0           # tokens the constraint forced: run through the model, not sampled
    shifted: int = 0                 # tokens context shifts dropped from the context (Engine._shift)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Tokens each decode pass of the model produced (1.0 without a drafter)."""
        return len(self.token_latencies_s) / self.decode_passes if self.decode_passes else 0.0

    @property
    def decode_s(self) -> float:
        return sum(self.token_latencies_s)

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.token_latencies_s)
        return n / self.decode_s if n and self.decode_s > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        n = self.prompt_tokens - self.cached_tokens
        return n / self.prefill_s if self.prefill_s > 0 else 0.0

    def __repr__(self) -> str:   # the per-token latencies stay in the field, not in the repr
        return (f"Stats(prompt_tokens={self.prompt_tokens}, cached_tokens={self.cached_tokens}, "
                f"generated_tokens={self.generated_tokens}, ttft={self.ttft_s * 1e3:.1f} ms, "
                f"prefill={self.prefill_tokens_per_s:.1f} t/s, decode={self.decode_tokens_per_s:.1f} t/s"
                + (f", drafted={self.draft_tokens}, accepted={self.accepted_tokens} "
                   f"({100 * self.acceptance_rate:.0f}%), {self.tokens_per_pass:.2f} tokens/pass"
                   if self.draft_tokens else "") + ")")


@dataclass
class Piece:
    """One streamed step: the token chosen and the text it released (may be '' while a UTF-8
    character or a possible stop string is incomplete)."""

    token: int
    text: str
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str               # "stop", "length" or "cancelled"
    stats: Stats
    stop_detail: str = ""            # which stop fired: "end-of-generation token 2 '<|im_end|>'",
                                     # "stop string '\\n\\n'", "max_tokens=64", "context full ...", "cancel()"
    logprobs: list[tuple[int, float | None, list[tuple[int, float]]]] | None = None  # (token, logprob, top-N);
                                     # a token the grammar forced has (token, None, []): the model never scored it
    complete: bool | None = None     # structured output: whether the text is a whole match of the
                                     # constraint (False: cut off by max_tokens, the context or a stop string)


def should_stop(token: int, n_generated: int, max_tokens: int, pos: int, n_ctx: int,
                eog_ids: frozenset[int]) -> tuple[str, str] | None:
    """Whether the generation ends at this freshly sampled token: (finish_reason, detail) or None.
    n_generated counts this token; pos is where it would be decoded. An end-of-generation token
    ends it unemitted ("stop"); max_tokens and a full context end it after emitting ("length").
    Stop strings are matched on the text (StopStrings), cancellation by Generation.cancel()."""
    if token in eog_ids:
        return "stop", f"end-of-generation token {token}"
    if n_generated >= max_tokens:
        return "length", f"max_tokens={max_tokens}"
    if pos >= n_ctx:
        return "length", f"context full ({n_ctx} positions)"
    return None


class StopStrings:
    """Matches stop strings across token boundaries. Text that might be the start of a stop string
    is held back; if the stop matches, it and everything after it are never emitted."""

    def __init__(self, stops):
        if isinstance(stops, str):
            stops = [stops]
        stops = list(stops or [])
        for s in stops:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must be a non-empty string or a list of them, got {s!r}")
        self.stops = stops
        self.held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """(text safe to emit now, the stop string that matched or None)."""
        if not self.stops:
            return text, None
        buf = self.held + text
        hits = [(buf.find(s), s) for s in self.stops if s in buf]
        if hits:
            at, stop = min(hits)
            self.held = ""
            return buf[:at], stop
        keep = 0   # longest suffix of buf that is a proper prefix of some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:n]):
                    keep = n
                    break
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], None

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def prompt_ids(tokenizer, prompt, n_vocab: int) -> list[int]:
    """The token ids of a prompt: a str is tokenized (BOS added when the model wants it); a
    sequence of ints (numpy integers too) is taken as ids. Anything else is a TypeError, an id
    outside the vocabulary or text that is not valid Unicode a ValueError, each naming `prompt`."""
    if isinstance(prompt, str):
        check_text(prompt, "prompt")
        return tokenizer.encode(prompt)
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise TypeError("prompt must be a str or a sequence of token ids, not bytes "
                        "(decode it first, e.g. prompt.decode('utf-8'))")
    if isinstance(prompt, np.ndarray) and (prompt.ndim != 1 or prompt.dtype.kind not in "iu"):
        raise TypeError(f"prompt must be a str or a 1-D sequence of integer token ids, got an array of "
                        f"dtype {prompt.dtype} and shape {prompt.shape}")
    if not isinstance(prompt, (np.ndarray, Sequence)):
        raise TypeError(f"prompt must be a str or a sequence of token ids (ints), got {type(prompt).__name__}")
    return token_ids(prompt, n_vocab, "prompt").tolist()


def _callables(v, name: str) -> list:
    """A callable or a list / tuple of them (llama-cpp-python's LogitsProcessorList and
    StoppingCriteriaList are lists) -> a list; anything else a TypeError naming the parameter."""
    if v is None:
        return []
    fs = list(v) if isinstance(v, (list, tuple)) else [v]
    for f in fs:
        if not callable(f):
            raise TypeError(f"{name} must be a callable f(input_ids, logits) or a list of them, got {f!r}")
    return fs


class Hooks:
    """A generation's logits processors and stopping criteria (llama-cpp-python's semantics):
    each processor f(input_ids, scores) -> scores runs, in order, on a copy of each step's raw
    logits before the penalties, the logit bias, the chain and the grammar's mask; each
    criterion f(input_ids, logits) -> bool runs once the next token is chosen, with the raw
    logits, and any True ends the generation before that token. input_ids (np.intc, read-only)
    are the ids evaluated so far: the prompt and the tokens generated (forced ones included)."""

    def __init__(self, processors, criteria, prompt: list[int], n_vocab: int):
        self.processors = _callables(processors, "logits_processor")
        self.criteria = _callables(criteria, "stopping_criteria")
        self.n_vocab = n_vocab
        self._ids = np.empty(max(64, 2 * len(prompt)), np.intc)
        self._ids[:len(prompt)] = prompt
        self._n = len(prompt)

    def append(self, token: int) -> None:
        if self._n == len(self._ids):
            self._ids = np.concatenate([self._ids, np.empty(len(self._ids), np.intc)])
        self._ids[self._n] = token
        self._n += 1

    def input_ids(self) -> np.ndarray:
        v = self._ids[:self._n]
        v.flags.writeable = False
        return v

    def process(self, logits: np.ndarray) -> np.ndarray:
        """The processors' logits: float32, one per token. An answer that is not a float array of
        one score per token is a TypeError naming logits_processor, NaN or +inf (or nothing above
        -inf) a ValueError."""
        ids, x = self.input_ids(), np.array(logits, dtype=np.float32)
        for f in self.processors:
            y = f(ids, x)
            if not isinstance(y, np.ndarray) or y.dtype.kind != "f":
                raise TypeError(f"logits_processor {f!r} must return a numpy float array (the scores), got "
                                + (f"an array of dtype {y.dtype}" if isinstance(y, np.ndarray) else type(y).__name__))
            if y.shape != (self.n_vocab,):   # (a TypeError too, as llama-cpp-python's wrapper raises)
                raise TypeError(f"logits_processor {f!r} returned an array of shape {y.shape}; the scores have "
                                f"shape ({self.n_vocab},)")
            x = np.ascontiguousarray(y, dtype=np.float32)
        top = float(x.max())
        if not top < np.inf:   # NaN or +inf anywhere (max propagates NaN), which no draw can read
            raise ValueError("logits_processor returned NaN or +inf scores")
        if top == -np.inf:
            raise ValueError("logits_processor set every token's score to -inf: nothing is left to choose")
        return x

    def stops(self, logits: np.ndarray) -> bool:
        ids, raw = self.input_ids(), logits.view()
        raw.flags.writeable = False
        return any(bool(f(ids, raw)) for f in self.criteria)


class TokenPolicy:
    """The per-token policy of one generation: sample -> should_stop -> stop strings -> detokenize
    -> Pieces, and the Completion at the end. Generation (one sequence) and the Engine (many, batched)
    both feed it logits; neither repeats any of it. It never calls the model: after `step`, either
    the generation has ended (`completion` is set) or `tokens[-1]` must be decoded at `pos`."""

    def __init__(self, tokenizer, n_vocab: int, n_ctx: int, prompt: list[int], max_tokens: int,
                 params: SamplingParams, stop=None, logprobs: int | None = None, ignore_eos: bool = False,
                 constraint=None, logits_processor=None, stopping_criteria=None, context_shift: bool = False):
        if not prompt:
            raise ValueError("the prompt is empty (no tokens)")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool) or not 0 <= logprobs <= 100):
            raise ValueError(f"logprobs must be an integer in 0..100 or None, got {logprobs!r}")
        if not isinstance(ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {ignore_eos!r}")
        if len(prompt) > n_ctx:
            raise ContextFullError(f"the prompt has {len(prompt)} tokens but the context holds {n_ctx}")
        if constraint is not None and ignore_eos:
            raise ValueError("ignore_eos cannot be combined with structured output (the grammar decides where it ends)")
        # A context that shifts (Engine._shift) is never full: max_tokens ends the generation.
        n_ctx = sys.maxsize if context_shift else n_ctx
        self.tokenizer, self.n_ctx, self.max_tokens, self.logprobs = tokenizer, n_ctx, max_tokens, logprobs
        self.stops = StopStrings(stop)
        hooks = Hooks(logits_processor, stopping_criteria, prompt, n_vocab) \
            if logits_processor is not None or stopping_criteria is not None else None
        self.hooks = hooks if hooks is not None and (hooks.processors or hooks.criteria) else None
        self.sampler = Sampler(params, n_vocab, processed=bool(self.hooks and self.hooks.processors))
        self.detok = tokenizer.decoder(skip_special=True)
        self.eog = frozenset() if ignore_eos else tokenizer.eog_ids
        self.recent = list(prompt[-params.repeat_last_n:]) if params.penalized else None
        self.tokens: list[int] = []
        self.stats = Stats(prompt_tokens=len(prompt))
        self.completion: Completion | None = None
        self.t0 = time.perf_counter()      # ttft counts from here (the driver resets it)
        self._text: list[str] = []
        self._lps: list | None = [] if logprobs is not None else None
        self._sampled = False
        self.pos0 = len(prompt)
        # Structured output (pydecode/constraint.py): the matcher that masks each step's choice
        # and forces the tokens the grammar leaves no choice about.
        self.constraint = constraint
        self._cut = False                  # a forced run was cut short (max_tokens, the context, a stop)
        self._accepting = None             # stopping_criteria ended it: whether the text was complete

    def start(self) -> list[Piece]:
        """The pieces of the tokens a constraint forces before anything is sampled (they are
        prefilled with the prompt); [] without one."""
        out: list[Piece] = []
        c = self.constraint
        if c is not None:
            ff = c.initial()
            if c.budget is not None:
                self._check_budget(c, ff)
            self._force(ff, self.pos0, out)
            if c.done and self.completion is None:
                out += self.end("stop", f"constraint complete ({c.grammar.what})")
        return out

    def step(self, logits: np.ndarray, pos: int, summary=None) -> list[Piece]:
        """Chooses the next token from `logits` (pos: where it would be decoded) and returns the
        pieces to emit now. summary: the Model whose step also summarized these logits for this
        sampler (see Sampler.summary_inv_t), or None. With a constraint, the token is chosen
        among the allowed ones, and the tokens it then forces follow it (tokens[-k:]: all still
        to be decoded, from pos on)."""
        st = self.stats
        c = self.constraint
        budget = c.budget if c is not None else None
        if budget is not None:                    # JSON closes within max_tokens (budget.py)
            room = self._room(pos)
            if not budget.fits(room - 1):
                return self._close(budget, room)
            mark = budget.mark()
        hooks, raw = self.hooks, logits
        if hooks is not None and hooks.processors:
            logits, summary = hooks.process(logits), None
        accepting = c.accepting if hooks is not None and hooks.criteria and c is not None else None
        token = (c.choose(logits, self.sampler, self.recent or (), summary) if c is not None else
                 self.sampler.sample(logits, self.recent or (), summary))
        if not self._sampled:
            self._sampled = True
            st.ttft_s = time.perf_counter() - self.t0
        if hooks is not None and hooks.criteria and hooks.stops(raw):   # before the token, unemitted
            self._accepting = accepting
            return self.end("stop", "stopping_criteria")
        finish = should_stop(token, len(self.tokens) + 1, self.max_tokens, pos, self.n_ctx, self.eog)
        if finish and finish[0] == "stop":        # end-of-generation token: not emitted
            return self.end("stop", f"{finish[1]} {self.tokenizer.decode([token])!r}")
        if c is not None and c.done:              # the constraint completes with this token
            finish = None
        forced = None
        if budget is not None and not c.done:     # the token and what it forces must leave room
            forced = c.forced()                   # for the shortest completion after them
            if not budget.fits(room - 1 - len(forced)):
                budget.rollback(mark)
                return self._close(budget, room)
        lp = top_logprobs(raw, self.sampler, token, self.logprobs) if self.logprobs is not None else None
        out: list[Piece] = []
        if self._emit(token, lp, out) or (finish and self._ended(finish, out)):
            return out
        if forced is None and c is not None and not c.done:
            forced = c.forced()
        if forced:
            self._force(forced, pos + 1, out)
        if c is not None and c.done and self.completion is None:
            out += self.end("stop", f"constraint complete ({c.grammar.what})")
        return out

    def _room(self, pos: int) -> int:
        """Tokens this generation may still emit, the one chosen at pos included."""
        return min(self.max_tokens - len(self.tokens), self.n_ctx - pos + 1)

    def _check_budget(self, c, initial: list[int]) -> None:
        """Before anything is generated: a schema whose shortest output does not fit in
        max_tokens (and the context) is refused."""
        room = self._room(self.pos0) - len(initial)
        if not c.budget.fits(room):
            text, toks = c.budget.closing()
            shortest = self.tokenizer.decode(initial) + text
            raise ValueError(f"max_tokens={self.max_tokens} is too small for {c.grammar.what}: its shortest "
                             f"valid output, {shortest[:200]!r}, takes {len(initial) + len(toks)} tokens"
                             + (f" (the context has room for {self._room(self.pos0)} after the prompt)"
                                if self._room(self.pos0) < self.max_tokens else ""))

    def _close(self, budget, room: int) -> list[Piece]:
        """Ends the generation with the shortest completion of its JSON (forced, unsampled): it
        parses and validates, and the finish_reason is "length"."""
        out: list[Piece] = []
        why = (f"max_tokens={self.max_tokens}" if room == self.max_tokens - len(self.tokens)
               else f"context full ({self.n_ctx} positions)")
        for t in budget.close(room):
            if self._emit(t, None, out):
                return out
        return out + self.end("length", f"{why}: the JSON was closed with its shortest completion "
                                        f"({budget.closed_tokens} tokens)")

    def _emit(self, token: int, lp, out: list[Piece]) -> bool:
        """Appends one chosen or forced token: its text through the stop strings into `out`.
        True when a stop string ended the generation."""
        self.tokens.append(token)
        self.stats.generated_tokens = len(self.tokens)
        if self.recent is not None:
            self.recent.append(token)
        if self.hooks is not None:
            self.hooks.append(token)
        if self._lps is not None:
            self._lps.append((token, lp[0], lp[1]) if lp is not None else (token, None, []))
        text, stop = self.stops.feed(self.detok.feed(token))
        if text or stop is None:
            self._text.append(text)
            out.append(Piece(token, text, *(lp if lp else (None, None))))
        if stop is not None:
            self.finish("stop", f"stop string {stop!r}")
            return True
        return False

    def _ended(self, finish, out: list[Piece]) -> bool:
        out += self.end(*finish)
        return True

    def _force(self, forced: list[int], pos: int, out: list[Piece]) -> None:
        """Emits the tokens a constraint forced (the first to be decoded at pos), up to max_tokens
        and the context. A run cut short leaves the grammar ahead of the text: the output is then
        incomplete. A run that completes the grammar needs no decoding (the caller ends it)."""
        for k, t in enumerate(forced):
            last = k == len(forced) - 1
            finish = None if last and self.constraint.done else should_stop(
                t, len(self.tokens) + 1, self.max_tokens, pos + k, self.n_ctx, frozenset())
            self._cut = not last   # (read by finish(), if this token ends the generation)
            if self._emit(t, None, out) or (finish and self._ended(finish, out)):
                return
        self._cut = False

    def end(self, reason: str, detail: str) -> list[Piece]:
        """Ends the generation now: text held back (an incomplete character, a possible stop
        string) is released, unless a stop string completes in it (then that is the reason,
        except for a cancel)."""
        text, stop = self.stops.feed(self.detok.flush())
        if stop is None:
            text += self.stops.flush()
        elif reason != "cancelled":
            reason, detail = "stop", f"stop string {stop!r}"
        self._text.append(text)
        self.finish(reason, detail)
        return [Piece(-1, text)] if text else []

    def abort(self, detail: str) -> None:
        """Ends it without a drain (an interrupt or an abandoned stream): held text is kept."""
        self._text.append(self.stops.flush())
        self.finish("cancelled", detail)

    def finish(self, reason: str, detail: str) -> None:
        if self.completion is None:
            complete = None
            c = self.constraint
            if c is not None:
                st = self.stats
                st.constraint_s, st.masks, st.mask_s, st.forced_tokens = c.cost_s, c.masks, c.mask_s, c.forced_tokens
                accepting = c.accepting if self._accepting is None else self._accepting
                complete = accepting and not self._cut and not detail.startswith("stop string")
                if not complete and reason == "length":
                    detail += f" (the output is incomplete: the {c.grammar.what} is not finished)"
            self.completion = Completion("".join(self._text), list(self.tokens), reason, self.stats, detail,
                                         self._lps, complete)
