"""The generation loop: prefill -> (sample -> should_stop -> decode_step)* -> text.

Follow one token: `prefill` fills the KV cache with the prompt and gives the last position's
logits; `sample` picks a token; `should_stop` decides whether it ends the generation; otherwise
the incremental detokenizer turns it into text and `decode_step` runs it through every layer,
appending its K/V (append_kv, in C) and giving the next logits.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .errors import ContextFullError
from .model import Model
from .sampling import Sampler, SamplingParams, top_logprobs


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
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] | None = None  # (token, logprob, top-N)


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


class Generation:
    """One generation over a Model whose cache holds `cached` tokens from an earlier call.
    A plain iterator of Pieces; `completion` holds the result once it has ended. It can be
    abandoned midway (close(), or just dropped) or cancelled: the cache bookkeeping stays right."""

    def __init__(self, model: Model, prompt: list[int], cached: list[int], max_tokens: int,
                 params: SamplingParams, stop=None, logprobs: int | None = None):
        if not prompt:
            raise ValueError("the prompt is empty (no tokens)")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool) or not 0 <= logprobs <= 100):
            raise ValueError(f"logprobs must be an integer in 0..100 or None, got {logprobs!r}")
        if len(prompt) > model.n_ctx:
            raise ContextFullError(f"the prompt has {len(prompt)} tokens but the context holds {model.n_ctx}")
        self.model, self.prompt, self.max_tokens, self.params = model, prompt, max_tokens, params
        self.stops = StopStrings(stop)
        self.logprobs = logprobs
        self.sampler = Sampler(params, model.n_vocab)
        # Reuse the K/V of the longest common prefix with what the cache holds, but always
        # recompute at least the last prompt token: its logits are needed.
        n = 0
        limit = min(len(cached), len(prompt) - 1)
        while n < limit and cached[n] == prompt[n]:
            n += 1
        self.reused = n
        self.tokens: list[int] = []
        self.kv_tokens: list[int] = list(prompt[:n])  # tokens whose K/V the cache holds, in order
        self.stats = Stats(prompt_tokens=len(prompt), cached_tokens=n)
        self.completion: Completion | None = None
        self._text: list[str] = []
        self._lps: list | None = [] if logprobs is not None else None
        self._cancelled = False
        self._it = self._run()

    def __iter__(self) -> Iterator[Piece]:
        return self

    def __next__(self) -> Piece:
        return next(self._it)

    def cancel(self) -> None:
        """Ends the generation at the next step boundary, keeping what was produced."""
        self._cancelled = True

    def close(self) -> None:
        """Abandons the generation now; `completion` says "cancelled" if it had not ended."""
        self._it.close()
        self._finish("cancelled", "abandoned")

    def _finish(self, reason: str, detail: str) -> None:
        if self.completion is None:
            self.completion = Completion("".join(self._text), list(self.tokens), reason, self.stats, detail,
                                         self._lps)

    def _drain(self, detok) -> Iterator[Piece]:
        """At the end: text held back (an incomplete character, a possible stop string) is
        released, unless a stop string completes in it. Returns the stop string that matched."""
        text, stop = self.stops.feed(detok.flush())
        if stop is None:
            text += self.stops.flush()
        if text:
            self._text.append(text)
            yield Piece(-1, text)
        return stop

    def _run(self) -> Iterator[Piece]:
        model, st = self.model, self.stats
        detok = model.tokenizer.decoder(skip_special=True)
        eog = model.tokenizer.eog_ids
        recent = list(self.prompt[-self.params.repeat_last_n:]) if self.params.penalized else None
        try:
            t0 = time.perf_counter()
            logits = model.prefill(self.prompt[self.reused:], pos=self.reused)
            self.kv_tokens = list(self.prompt)
            st.positions_computed += len(self.prompt) - self.reused
            st.prefill_s = time.perf_counter() - t0
            pos = len(self.prompt)
            while True:
                if self._cancelled:
                    yield from self._drain(detok)
                    return self._finish("cancelled", "cancel()")
                token = self.sampler.sample(logits, recent or ())
                if not self.tokens:
                    st.ttft_s = time.perf_counter() - t0
                finish = should_stop(token, len(self.tokens) + 1, self.max_tokens, pos, model.n_ctx, eog)
                if finish and finish[0] == "stop":        # end-of-generation token: not emitted
                    stop = yield from self._drain(detok)
                    detail = f"{finish[1]} {model.tokenizer.decode([token])!r}"
                    return self._finish("stop", detail if stop is None else f"stop string {stop!r}")
                lp = top_logprobs(logits, self.sampler, token, self.logprobs) if self.logprobs is not None else None
                self.tokens.append(token)
                st.generated_tokens = len(self.tokens)
                if recent is not None:
                    recent.append(token)
                if lp is not None:
                    self._lps.append((token, lp[0], lp[1]))
                text, stop = self.stops.feed(detok.feed(token))
                if text or stop is None:
                    self._text.append(text)
                    yield Piece(token, text, *(lp if lp else (None, None)))
                if stop is not None:
                    return self._finish("stop", f"stop string {stop!r}")
                if finish:                                  # max_tokens or a full context
                    stop = yield from self._drain(detok)
                    return self._finish(*finish) if stop is None else self._finish("stop", f"stop string {stop!r}")
                t1 = time.perf_counter()
                logits = model.decode_step(token, pos)
                self.kv_tokens.append(token)
                pos += 1
                st.positions_computed += 1
                st.token_latencies_s.append(time.perf_counter() - t1)
        except KeyboardInterrupt:
            # Ctrl-C inside a step: end cleanly with what was produced. The cache stays
            # consistent: kv_tokens only grows after a decode_step has returned.
            self._text.append(self.stops.flush())
            self._finish("cancelled", "KeyboardInterrupt")
        except GeneratorExit:
            self._text.append(self.stops.flush())
            self._finish("cancelled", "abandoned")
            raise
