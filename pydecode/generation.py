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
from .sampling import SamplingParams, sample


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
    """One streamed step: the token chosen and the text it completed (may be '' mid-character)."""

    token: int
    text: str


@dataclass
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str               # "stop" (end-of-generation token), "length" (max_tokens or context)
    stats: Stats
    stop_detail: str = ""            # which stop fired, e.g. "eog token 2 '<|im_end|>'" or "max_tokens=64"


def should_stop(token: int, n_generated: int, max_tokens: int, pos: int, n_ctx: int,
                eog_ids: frozenset[int]) -> tuple[str, str] | None:
    """Whether the generation ends at this freshly sampled token: (finish_reason, detail) or None.
    n_generated counts this token; pos is where it would be decoded. An end-of-generation token
    ends it unemitted ("stop"); max_tokens and a full context end it after emitting ("length")."""
    if token in eog_ids:
        return "stop", f"end-of-generation token {token}"
    if n_generated >= max_tokens:
        return "length", f"max_tokens={max_tokens}"
    if pos >= n_ctx:
        return "length", f"context full ({n_ctx} positions)"
    return None


class Generation:
    """One generation over a Model whose cache holds `cached` tokens from an earlier call.
    Iterate for Pieces; afterwards `completion` holds the result."""

    def __init__(self, model: Model, prompt: list[int], cached: list[int], max_tokens: int,
                 params: SamplingParams):
        if not prompt:
            raise ValueError("the prompt is empty (no tokens)")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if len(prompt) > model.n_ctx:
            raise ContextFullError(f"the prompt has {len(prompt)} tokens but the context holds {model.n_ctx}")
        self.model, self.prompt, self.max_tokens, self.params = model, prompt, max_tokens, params
        self.rng = np.random.default_rng(params.seed)
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

    def __iter__(self) -> Iterator[Piece]:
        model, st = self.model, self.stats
        detok = model.tokenizer.decoder(skip_special=True)
        eog = model.tokenizer.eog_ids
        t0 = time.perf_counter()
        logits = model.prefill(self.prompt[self.reused:], pos=self.reused)
        self.kv_tokens = list(self.prompt)
        st.positions_computed += len(self.prompt) - self.reused
        st.prefill_s = time.perf_counter() - t0
        pos = len(self.prompt)
        text: list[str] = []
        finish = None
        while True:
            token = sample(logits, self.params, self.rng)
            now = time.perf_counter()
            if not self.tokens:
                st.ttft_s = now - t0
            finish = should_stop(token, len(self.tokens) + 1, self.max_tokens, pos, model.n_ctx, eog)
            if finish and finish[0] == "stop":
                break
            self.tokens.append(token)
            st.generated_tokens = len(self.tokens)
            piece = detok.feed(token)
            text.append(piece)
            yield Piece(token, piece)
            if finish:
                break
            t1 = time.perf_counter()
            logits = model.decode_step(token, pos)
            self.kv_tokens.append(token)
            pos += 1
            st.positions_computed += 1
            st.token_latencies_s.append(time.perf_counter() - t1)
        tail = detok.flush()
        if tail:
            text.append(tail)
            yield Piece(-1, tail)
        reason, detail = finish
        if reason == "stop":
            detail += f" {model.tokenizer.decode([token])!r}"
        self.completion = Completion("".join(text), list(self.tokens), reason, st, detail)
