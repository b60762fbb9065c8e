"""sample: one step's logits -> the next token id. Policy lives here, in Python.

The chain, in this order (llama.cpp's order):
    penalties (repeat / frequency / presence over the last `repeat_last_n` tokens) and logit_bias
    -> temperature -> top-k -> tail-free (tfs_z) -> locally typical (typical_p) -> top-p -> min-p
    -> a seeded draw.
Mirostat (mirostat_mode 1 or 2, with mirostat_tau and mirostat_eta) replaces everything after the
temperature: its own truncation steers each token's surprise toward tau (as llama.cpp's chain:
temperature, then mirostat). temperature == 0 is greedy: a plain argmax (after penalties, if any),
whatever the other stages say. Tail-free, typical and Mirostat are the rare stages: they run in
numpy (pydecode/sampling_extra.py, which gives their definitions); the others in C.

Cost on a 262k-token vocabulary stays around 0.2 ms a step because nothing vocabulary-wide is
sorted: a one-pass top-k in C (pd_top_k) picks the candidates and a SIMD exp-sum (pd_sum_exp)
gives the full-vocabulary normalizer when no top-k bounds the distribution. The candidate list
only grows when top-p or min-p needs more than it holds, so results are exact, not approximate.
With tail-free or typical on, the step sorts the candidates (the whole vocabulary without a
top-k: ~1 ms a step on 49k tokens, ~3 ms on 152k; ~0.3 ms with a top-k); Mirostat reads only
the likeliest (~0.3 ms).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _core
from .sampling_extra import ExtraChain

ffi, lib = _core.ffi, _core.lib

CANDIDATES = 256   # first candidate list when no top-k bounds it; grows x8 when needed
SUMMARY_K = 256    # candidates a model's sampling summary keeps (csrc/sampling/summary.h: PD_SUMM_K)


def _number(name, v, lo, hi, lo_open=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise ValueError(f"{name} must be a number, got {v!r}")
    if v < lo or v > hi or (lo_open and v == lo):
        raise ValueError(f"{name} must be in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings, validated on construction (names as in llama-cpp-python)."""

    temperature: float = 0.0
    top_k: int = 0                 # 0 = off
    top_p: float = 1.0             # 1 = off
    min_p: float = 0.0             # 0 = off
    repeat_penalty: float = 1.0    # 1 = off; >1 discourages tokens seen in the window
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = 64        # the penalty window, in tokens (prompt included)
    seed: int | None = None
    logit_bias: dict | None = None  # {token id: added to its logit}; -inf bans it (llama-cpp-python's)
    typical_p: float = 1.0         # 1 = off; locally typical sampling (sampling_extra.py)
    tfs_z: float = 1.0             # 1 = off; tail-free sampling
    mirostat_mode: int = 0         # 0 = off, 1 = Mirostat, 2 = Mirostat 2.0 (replace top-k ... min-p)
    mirostat_tau: float = 5.0      # Mirostat's target surprise, in bits
    mirostat_eta: float = 0.1      # Mirostat's learning rate

    def __post_init__(self):
        _number("temperature", self.temperature, 0.0, 1e6)
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        _number("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        _number("min_p", self.min_p, 0.0, 1.0)
        _number("repeat_penalty", self.repeat_penalty, 0.0, 1e6, lo_open=True)
        _number("frequency_penalty", self.frequency_penalty, -1e6, 1e6)
        _number("presence_penalty", self.presence_penalty, -1e6, 1e6)
        if not isinstance(self.repeat_last_n, int) or isinstance(self.repeat_last_n, bool) or self.repeat_last_n < 0:
            raise ValueError(f"repeat_last_n must be an integer >= 0, got {self.repeat_last_n!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not -1 <= self.seed < 2**64):
            raise ValueError(f"seed must be an integer in 0..2**64-1, or None / -1 for a random seed, "
                             f"got {self.seed!r}")
        if self.seed == -1:   # llama.cpp's spelling of "random"
            object.__setattr__(self, "seed", None)
        if self.logit_bias is not None:
            object.__setattr__(self, "logit_bias", _checked_bias(self.logit_bias) or None)
        _number("typical_p", self.typical_p, 0.0, 1.0, lo_open=True)
        _number("tfs_z", self.tfs_z, 0.0, 1.0, lo_open=True)
        m = self.mirostat_mode
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m not in (0, 1, 2):
            raise ValueError(f"mirostat_mode must be 0 (off), 1 (Mirostat) or 2 (Mirostat 2.0), got {m!r}")
        object.__setattr__(self, "mirostat_mode", int(m))
        _number("mirostat_tau", self.mirostat_tau, 0.0, 1e6)
        _number("mirostat_eta", self.mirostat_eta, 0.0, 1e6)

    @property
    def penalized(self) -> bool:
        return self.repeat_last_n > 0 and (self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0
                                           or self.presence_penalty != 0.0)

    @property
    def extra(self) -> bool:
        """Whether a stage of sampling_extra.py is on (tail-free, typical, Mirostat): they sample,
        so greedy (temperature 0) ignores them."""
        return self.temperature > 0 and (self.typical_p < 1.0 or self.tfs_z < 1.0 or self.mirostat_mode != 0)

    @property
    def adjusted(self) -> bool:
        """Whether no step may draw from a summary of the raw logits (nor take the C fast path):
        the chain starts from changed logits (penalties or a logit bias), or it has a stage the
        summary's few hundred candidates cannot serve (`extra`)."""
        return self.penalized or self.logit_bias is not None or self.extra


def _checked_bias(bias) -> dict[int, float]:
    """logit_bias as {token id: float}: ids as ints (or their decimal strings, as JSON keys
    arrive), values finite numbers or -inf (None and False too: llama.cpp's "never this token")."""
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be a dict of token id -> bias, got {type(bias).__name__}")
    out = {}
    for k, v in bias.items():
        t = int(k) if isinstance(k, str) and k.strip().lstrip("-").isdigit() else k
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {k!r}")
        if v is None or v is False:
            v = -math.inf
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v == math.inf:
            raise ValueError(f"logit_bias[{k!r}] must be a finite number or -inf, got {v!r}")
        out[t] = float(v)
    return out


# What `pydecode chat` samples with when the model recommends nothing: llama.cpp's chat defaults
# (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05) plus ollama's repeat penalty (1.1 over the
# last 64 tokens), which keeps small models from looping. `pydecode run` stays greedy.
CHAT_DEFAULTS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, repeat_last_n=64)

# GGUF keys in which a model's publisher records its recommended sampling (llama.cpp's names).
GGUF_SAMPLING_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
                      "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
                      "general.sampling.penalty_repeat": "repeat_penalty",
                      "general.sampling.penalty_last_n": "repeat_last_n"}


def chat_defaults(metadata: dict) -> tuple[dict, str]:
    """The sampling a chat starts from, and where it comes from: the model's recommendation in
    its GGUF metadata (general.sampling.*) over CHAT_DEFAULTS, values that would not validate
    skipped."""
    out, found = dict(CHAT_DEFAULTS), []
    for key, name in GGUF_SAMPLING_KEYS.items():
        v = metadata.get(key)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        v = int(v) if name in ("top_k", "repeat_last_n") else float(v)
        try:
            SamplingParams(**{name: v})
        except ValueError:
            continue
        out[name] = v
        found.append(name)
    return out, ("the model's recommendation (GGUF general.sampling.*)" if found else
                 "pydecode's chat defaults (llama.cpp's, with a 1.1 repeat penalty)")


def apply_penalties(logits: np.ndarray, recent, p: SamplingParams) -> np.ndarray:
    """A copy of logits with the tokens of the last repeat_last_n ids penalized (others untouched)."""
    window = np.asarray(recent[-p.repeat_last_n:], dtype=np.int64)
    if not window.size:
        return logits
    ids, counts = np.unique(window, return_counts=True)
    ids, counts = ids[ids < len(logits)], counts[ids < len(logits)]
    out = logits.copy()
    v = out[ids]
    v = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
    out[ids] = v - counts * p.frequency_penalty - p.presence_penalty
    return out


class Sampler:
    """Holds a step's reusable buffers and the seeded generator; `sample` is the step."""

    _U_BATCH = 64   # uniforms drawn at a time: the same stream as one rng.random() per draw

    def __init__(self, params: SamplingParams, n_vocab: int, processed: bool = False):
        self.params, self.n_vocab = params, n_vocab
        # processed: a logits processor (TokenPolicy's) rewrites every step's logits, so a
        # summary the model made of the raw ones is of no use to the draw.
        self.processed = processed
        self.rng = np.random.default_rng(params.seed)
        self._ids = np.empty(0, np.int32)
        self._vals = np.empty(0, np.float32)
        self._u: list[float] = []
        # The common case decided once: temperature sampling truncated by top-k / top-p / min-p,
        # no penalties, one C call a step (sample() below, with everything precomputed).
        p = params
        bounded = 0 < p.top_k < n_vocab
        self._fast = (p.temperature > 0 and not p.adjusted and (bounded or p.top_p < 1.0 or p.min_p > 0.0))
        self._fast_args = (p.top_k if bounded else 0, CANDIDATES, 1.0 / p.temperature if p.temperature else 0.0,
                           p.top_p, p.min_p)
        # Plain temperature sampling (untruncated, no penalties): the whole softmax's draw, the
        # one computation the constrained draw makes too (draw_untruncated).
        self._plain = p.temperature > 0 and not p.adjusted and not self._fast
        self._bias = None
        if p.logit_bias:
            ids = np.fromiter(p.logit_bias, np.int64)
            if ids.max() >= n_vocab:
                raise ValueError(f"logit_bias: token id {int(ids.max())} is outside the vocabulary (0..{n_vocab - 1})")
            self._bias = (ids, np.fromiter(p.logit_bias.values(), np.float32))
        self._src = self._buf = None
        # tail-free / typical / Mirostat (and Mirostat's mu, which lives as long as the generation)
        self.extra = ExtraChain(p, n_vocab) if p.extra else None
        self.proposal = None   # propose's candidates and draw (a pd_proposal *), made on first use
        self._fresh = False    # whether it holds the last proposed step's candidates

    @property
    def summary_inv_t(self) -> float:
        """1 / temperature when a model's step may summarize its logits for this sampler's draw
        (csrc/sampling/summary.h: the draw then reads a few hundred candidates, not the vocabulary), else 0.
        The Engine turns the summary on for the steps that return one sequence's one row."""
        if self.processed:
            return 0.0
        return self._fast_args[2] if (self._fast and self._fast_args[0] <= SUMMARY_K) or self._plain else 0.0

    @property
    def propose_inv_t(self) -> float:
        """summary_inv_t for a constrained draw: `propose` reads the summary at any top-k (its draw
        is untruncated; greedy's is the best of its candidates, at any temperature: 1), whenever
        no penalty changes the logits first."""
        p = self.params
        return 0.0 if p.adjusted or self.processed else self._fast_args[2] if p.temperature > 0 else 1.0

    def uniform(self) -> float:
        """The next uniform draw of the seeded generator (drawn in batches: the same numbers)."""
        if not self._u:
            self._u = self.rng.random(self._U_BATCH).tolist()[::-1]
        return self._u.pop()

    def _top(self, x: np.ndarray, k: int):
        k = min(k, len(x))
        if len(self._ids) < k:
            self._ids, self._vals = np.empty(k, np.int32), np.empty(k, np.float32)
        n = lib.pd_top_k(ffi.cast("float *", x.ctypes.data), len(x), k,
                         ffi.cast("int32_t *", self._ids.ctypes.data), ffi.cast("float *", self._vals.ctypes.data))
        return self._ids[:n], self._vals[:n]

    def sample(self, logits: np.ndarray, recent=(), summary=None) -> int:
        """The next token from one step's logits. summary: the Model whose step summarized these
        logits for this sampler (at summary_inv_t), or None. Both ways draw the same uniforms,
        so a seeded run picks the same tokens with or without it."""
        if self._plain:
            return self.draw_untruncated(logits, summary)[0]
        if self._fast and logits is self._src:      # the same logits buffer as the last step
            u = self.uniform()
            if summary is not None:
                t = summary.sample_summary(self._fast_args[0], self._fast_args[3], self._fast_args[4], u)
                if t >= 0:
                    return t
            t = lib.pd_sample_truncated(self._buf, self.n_vocab, *self._fast_args, u)
            if t >= 0:
                return t
        elif self._fast and logits.dtype == np.float32 and logits.flags.c_contiguous and len(logits) == self.n_vocab:
            self._src, self._buf = logits, ffi.from_buffer("float[]", logits)
            return self.sample(logits, recent, summary)
        return sample(logits, self.params, self, recent)

    def penalize(self, logits: np.ndarray, recent=()) -> np.ndarray:
        """The logits the chain starts from: with the penalties and the logit bias applied (a
        copy), if any."""
        x = apply_penalties(logits, recent, self.params) if self.params.penalized and len(recent) else logits
        if self._bias is not None:
            x = x.copy() if x is logits else x
            x[self._bias[0]] += self._bias[1]
        return x

    def propose(self, logits: np.ndarray, summary=None) -> tuple[int, bool]:
        """Structured output's draw first (constraint.py; logits already `penalize`d): a token
        chosen without the mask, and whether it is then sure to be an exact constrained choice if
        the grammar allows it. Greedy: the best token (sure). Sampling: a draw from the whole
        vocabulary's softmax at the temperature, untruncated (pd_sample_propose, or the step's
        summary); sure when its place among the best shows it survives top-k / top-p / min-p over
        any allowed set that holds it (csrc/sampling/sampling.c says why that is exact). Not
        sure: `proposal` holds the candidates for pd_proposal_keeps. Refused or not kept: the
        caller draws afresh under the mask (`sample_masked`)."""
        if self.proposal is None:
            self.proposal = ffi.new("pd_proposal *")
        p = self.proposal
        if self.params.temperature == 0:   # the best token: sure (the summary's candidates come with it)
            self._fresh = summary is not None and summary.summary_propose(0, 1.0, 0.0, 0.0, p) >= 0
            return (p.token if self._fresh else self.sample(logits)), True
        return self.draw_untruncated(logits, summary)

    def draw_untruncated(self, logits: np.ndarray, summary=None) -> tuple[int, bool]:
        """A draw from the whole vocabulary's softmax at the temperature (logits already
        `penalize`d), from the step's summary when it made one, else from the logits
        (pd_sample_propose), into `proposal`: the token, and whether it is sure to survive the
        chain's truncation (see propose). The one computation of plain temperature sampling and of
        the constrained draw, so that a seed picks the same tokens with and without a grammar
        that allows them, whatever the kernel table's exp-sum rounding."""
        if self.proposal is None:
            self.proposal = ffi.new("pd_proposal *")
        p = self.proposal
        self._fresh = True
        top_k, _, inv_t, top_p, min_p = self._fast_args
        u = self.uniform()
        if summary is not None and summary.summary_propose(top_k, top_p, min_p, u, p) >= 0:
            return p.token, bool(p.sure)
        self._propose_from(logits, top_k, inv_t, top_p, min_p, u)
        return p.token, bool(p.sure)

    def _propose_from(self, logits: np.ndarray, top_k: int, inv_t: float, top_p: float, min_p: float,
                      u: float) -> None:
        """pd_sample_propose into `proposal`: its candidates and draw read from the logits."""
        x = np.ascontiguousarray(logits, dtype=np.float32)
        if lib.pd_sample_propose(ffi.cast("float *", x.ctypes.data), self.n_vocab, top_k, inv_t, top_p, min_p,
                                 u, self.proposal) < 0:
            raise MemoryError("sampling scratch memory could not be allocated")

    def candidates(self, logits: np.ndarray):
        """The proposal with this step's best candidates, best first (ties: the lower id first,
        as argmax): greedy's when `propose` had no summary to take them from."""
        if not self._fresh:
            self._propose_from(logits, 0, 1.0, 1.0, 0.0, 0.0)
            self._fresh = True
        return self.proposal

    def redraw(self, logits: np.ndarray) -> tuple[int, bool]:
        """Another `propose` from the same step's logits, with the next uniform: over the
        candidates the last one kept (the same list, so answers about them stay valid), from the
        logits when it lands past them."""
        top_k, _, inv_t, top_p, min_p = self._fast_args
        u = self.uniform()
        p = self.proposal
        if lib.pd_draw_untruncated(p, inv_t, top_k, top_p, min_p, u, ffi.NULL) < 0:
            self._propose_from(logits, top_k, inv_t, top_p, min_p, u)
        return p.token, bool(p.sure)

    def draw_known(self, allowed, n_known: int) -> int:
        """pd_proposal_draw_known with the next uniform: the constrained draw from the grammar's
        answers for the first n_known candidates, or -1 when they do not determine it."""
        top_k, _, inv_t, top_p, min_p = self._fast_args
        return lib.pd_proposal_draw_known(self.proposal, allowed, n_known, top_k, inv_t, top_p, min_p, self.uniform())

    def proposal_keeps(self, allowed, n_known: int) -> int:
        """pd_proposal_keeps for the last `propose`: 1 kept, 0 not, -1 undecided."""
        top_k, _, inv_t, top_p, min_p = self._fast_args
        return lib.pd_proposal_keeps(self.proposal, allowed, n_known, top_k, inv_t, top_p, min_p)

    def keeps(self, logits: np.ndarray, mask, token: int) -> bool:
        """Whether `token` survives the chain over the tokens the mask allows (logits `penalize`d)."""
        top_k, _, inv_t, top_p, min_p = self._fast_args
        x = np.ascontiguousarray(logits, dtype=np.float32)
        r = lib.pd_sample_allowed_keeps(ffi.cast("float *", x.ctypes.data), self.n_vocab, mask, token,
                                        top_k, inv_t, top_p, min_p)
        if r < 0:
            raise MemoryError("sampling scratch memory could not be allocated")
        return r == 1

    def sample_masked(self, logits: np.ndarray, mask, constraint, recent=(), summary=None) -> int:
        """The next token among those a structured-output bitmask allows (mask: uint32_t * cdata,
        see constraint.py): the same chain as `sample`, over the allowed tokens only. Greedy is
        one C pass over the logits and the mask; otherwise the disallowed logits become -inf (in
        C) before the chain, or the step's summary decides the draw when it can do so exactly.
        With a stage of sampling_extra.py on, its chain runs over the allowed tokens (-inf ones
        are not candidates there)."""
        p = self.params
        pen = p.penalized and len(recent)   # (the logit bias: already in `logits`, see Constraint._choose)
        if p.temperature == 0 and not pen:
            x = np.ascontiguousarray(logits, dtype=np.float32)
            return int(lib.pd_argmax_masked(ffi.cast("float *", x.ctypes.data), self.n_vocab, mask))
        if self._fast:
            u = self.uniform()
            if summary is not None:
                t = summary.sample_summary_masked(self._fast_args[0], self._fast_args[3], self._fast_args[4], u, mask)
                if t >= 0:
                    return t
            x = np.ascontiguousarray(logits, dtype=np.float32)
            if lib.pd_mask_count(mask, self.n_vocab) <= self.n_vocab // 8:   # few allowed: read only them
                t = lib.pd_sample_allowed(ffi.cast("float *", x.ctypes.data), self.n_vocab, mask, *self._fast_args, u)
            else:
                x = constraint.masked_logits(x, mask)
                t = lib.pd_sample_truncated(ffi.cast("float *", x.ctypes.data), self.n_vocab, *self._fast_args, u)
            if t < 0:
                raise MemoryError("sampling scratch memory could not be allocated")
            return int(t)
        x = apply_penalties(logits, recent, p) if pen else logits
        return sample(constraint.masked_logits(x, mask), p, self, (), biased=True)


def sample(logits: np.ndarray, params: SamplingParams, sampler: Sampler, recent=(), biased: bool = False) -> int:
    """Chooses the next token from one step's logits (see the module docstring for the chain);
    biased: the penalties and logit bias are applied already."""
    p = params
    x = logits if biased else sampler.penalize(logits, recent)
    if p.temperature == 0:
        return int(np.argmax(x))
    x = np.ascontiguousarray(x, dtype=np.float32)
    if sampler.extra is not None:   # tail-free, typical or Mirostat: the numpy chain
        return sampler.extra.sample(x, sampler)
    inv_t = 1.0 / p.temperature
    n = len(x)
    bounded = 0 < p.top_k < n
    if bounded or p.top_p < 1.0 or p.min_p > 0.0:
        # The truncated chain (top-k, top-p, min-p, the draw) is one C call: after a decode step
        # has streamed the weights through the caches, each Python line here costs microseconds.
        t = lib.pd_sample_truncated(ffi.from_buffer("float[]", x), n, p.top_k if bounded else 0, CANDIDATES,
                                    inv_t, p.top_p, p.min_p, sampler.uniform())
        if t < 0:
            raise MemoryError("sampling scratch memory could not be allocated")
        return t
    # Plain temperature sampling over the whole vocabulary (after penalties): the constrained
    # draw's computation (Sampler.draw_untruncated), so both pick the same token from one uniform.
    return sampler.draw_untruncated(x)[0]


def top_logprobs(logits: np.ndarray, sampler: Sampler, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """The model's log-probability of `token` and its n most likely alternatives (raw logits)."""
    x = np.ascontiguousarray(logits, dtype=np.float32)
    m = float(x.max())
    log_z = m + math.log(lib.pd_sum_exp(ffi.NULL, ffi.cast("float *", x.ctypes.data), len(x), 1.0, m))
    ids, vals = sampler._top(x, max(n, 1))
    return float(x[token]) - log_z, [(int(i), float(v) - log_z) for i, v in zip(ids[:n], vals[:n])]
