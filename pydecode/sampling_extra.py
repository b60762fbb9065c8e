"""The rarer stages of the sampling chain, in numpy: tail-free, locally typical, Mirostat 1 and 2.

They follow llama.cpp's definitions (src/llama-sampling.cpp; tail-free as it stood before
llama.cpp removed it), placed in pydecode's chain (pydecode/sampling.py):

    penalties, logit_bias -> temperature -> top-k -> tail-free -> typical -> top-p -> min-p -> draw
    penalties, logit_bias -> temperature -> Mirostat (its truncation and its draw)

Every stage sees the distribution of the candidates left by the one before, renormalized
(llama.cpp softmaxes the current candidates at each stage). A token at -inf (banned by
logit_bias, refused by structured output's mask) is no candidate at all: so a constrained draw
is exactly this chain over the allowed tokens.

- Tail-free (tfs_z < 1): the probabilities sorted descending, their second differences
  |p[i] - 2 p[i+1] + p[i+2]| normalized to sum 1 (uniform when they sum to under 1e-6); the
  first i >= 1 where their running sum exceeds z keeps the i best tokens (none: all kept).
- Locally typical (typical_p < 1): H the entropy; tokens ordered by |-log p - H| (closest to the
  expected surprise first) are kept until their mass exceeds typical_p (at least one). On the
  probability-sorted list that order is two sorted runs meeting where -log p crosses H, so the
  kept tokens are a contiguous band of it, found by merging the runs (no second sort).
- Mirostat (mirostat_mode 1): s_hat, the Zipf exponent least-squares-fitted to the m = 100 best
  tokens, gives k = (eps 2^mu / (1 - N^-eps))^(1/s_hat), eps = s_hat - 1, N the vocabulary size;
  the draw is from the k best; then mu -= eta (surprise - tau), surprise = -log2 of the drawn
  token's probability among the k.
- Mirostat 2.0 (mirostat_mode 2): the tokens whose surprise -log2 p is at most mu (at least the
  best one), the draw among them, mu updated from its probability renormalized over them.

mu starts at 2 tau and lives in the Sampler: one per generation, updated only by the tokens the
generation actually chooses (speculative verification steps the policy once per kept row).
Arithmetic is in float64, the draw as pydecode's (one uniform: the first prefix sum of the kept
weights, best first, above u times their mass); ties in the logits go to the lower token id.
"""
from __future__ import annotations

import math

import numpy as np

from . import _core

ffi, lib = _core.ffi, _core.lib

MIROSTAT_M = 100     # the tokens Mirostat 1 fits its Zipf exponent to (llama.cpp's m)
LN2 = math.log(2.0)


def tail_free(p: np.ndarray, z: float) -> int:
    """How many of the probability-sorted candidates tail-free sampling keeps."""
    n = len(p)
    if z >= 1.0 or n <= 2:
        return n
    d1 = p[:-1] - p[1:]
    d2 = np.abs(d1[:-1] - d1[1:])
    total = d2.sum()
    at, span = 0, 1024
    while at < len(d2):   # the cut is usually early: running sums a chunk at a time
        part = d2[at:at + span]
        part = part / total if total > 1e-6 else np.full(len(part), 1.0 / len(d2))
        cum = np.cumsum(part) + (run if at else 0.0)
        past = np.flatnonzero(cum > z)
        past = past[past + at >= 1]   # i >= 1 (min_keep)
        if len(past):
            return int(past[0]) + at
        run, at, span = cum[-1], at + span, span * 4
    return n


def typical(s: np.ndarray, typical_p: float) -> tuple[int, int]:
    """The band [a, b) of the probability-sorted candidates (s: their scaled logits, descending)
    that locally typical sampling keeps."""
    n = len(s)
    if typical_p >= 1.0 or n <= 1:
        return 0, n
    w = np.exp(s - s[0])
    z = w.sum()
    p = w / z
    neg = np.log(z) - (s - s[0])              # -log p, ascending
    h = float(np.sum(p * neg))                # the entropy
    c = int(np.searchsorted(neg, h, "left"))  # [0, c): -log p < H
    span = 256
    while True:   # merged within a window around c, widened until the cut falls inside it
        lo, hi = max(0, c - span), min(n, c + span)
        left = (h - neg[lo:c])[::-1]          # |-log p - H|, ascending from index c - 1 down
        right = neg[c:hi] - h                 # ascending from index c up
        # ranks in the merged order (a tie goes to the likelier token, as a stable sort of the list)
        rank_l = np.arange(len(left)) + np.searchsorted(right, left, "left")
        rank_r = np.arange(len(right)) + np.searchsorted(left, right, "right")
        mass = np.empty(len(left) + len(right))
        mass[rank_l] = p[lo:c][::-1]
        mass[rank_r] = p[c:hi]
        cum = np.cumsum(mass)
        # the merged prefix before every token outside the window is the whole list's
        bound = min(h - neg[lo - 1] if lo else np.inf, neg[hi] - h if hi < n else np.inf)
        sure = int(np.searchsorted(left, bound, "left") + np.searchsorted(right, bound, "left"))
        past = np.flatnonzero(cum[:sure] > typical_p)
        if len(past) or (lo == 0 and hi == n):
            k = int(past[0]) + 1 if len(past) else len(cum)
            return c - int(np.searchsorted(rank_l, k)), c + int(np.searchsorted(rank_r, k))
        span *= 4


def draw(w: np.ndarray, u: float) -> int:
    """pydecode's draw over weights sorted best first: the first prefix sum above u x their mass."""
    cum = np.cumsum(w)
    return min(int(np.searchsorted(cum, u * cum[-1], "right")), len(w) - 1)


class ExtraChain:
    """The chain after the temperature when an extra stage is on (SamplingParams.extra), and
    Mirostat's mu."""

    def __init__(self, params, n_vocab: int):
        self.params, self.n_vocab = params, n_vocab
        self.mu = 2.0 * params.mirostat_tau
        self.last_surprise = None   # the last Mirostat draw's surprise in bits (tests, diagnostics)

    def _candidates(self, x: np.ndarray, k: int, sampler) -> tuple[np.ndarray, np.ndarray]:
        """The k best logits (sorted descending, ties to the lower id; pd_top_k), -inf dropped;
        copies (the sampler's buffers are reused)."""
        ids, vals = sampler._top(x, k)
        n = int(np.count_nonzero(vals > -np.inf))
        if n == 0:
            raise ValueError("every token is at -inf (banned by logit_bias or a logits_processor): nothing to sample")
        return ids[:n].copy(), vals[:n].astype(np.float64)

    def sample(self, x: np.ndarray, sampler) -> int:
        """The next token from x (float32 logits, penalties and bias applied, disallowed at -inf)."""
        p = self.params
        inv_t = 1.0 / p.temperature
        if p.mirostat_mode == 1:
            return self._mirostat(x, sampler, inv_t)
        if p.mirostat_mode == 2:
            return self._mirostat2(x, sampler, inv_t)
        ids, w = self.truncate(x, sampler)
        return int(ids[draw(w, sampler.uniform())])

    def truncate(self, x: np.ndarray, sampler) -> tuple[np.ndarray, np.ndarray]:
        """The tokens top-k -> tail-free -> typical -> top-p -> min-p keep (best first) and their
        weights (proportional to their probabilities)."""
        p = self.params
        n = len(x)
        ids, vals = self._candidates(x, p.top_k if 0 < p.top_k < n else n, sampler)
        s = (vals - vals[0]) * (1.0 / p.temperature)
        if p.tfs_z < 1.0:
            w = np.exp(s)
            keep = tail_free(w / w.sum(), p.tfs_z)
            ids, s = ids[:keep], s[:keep]
        if p.typical_p < 1.0:
            a, b = typical(s, p.typical_p)
            ids, s = ids[a:b], s[a:b]
        w = np.exp(s - s[0])
        keep = len(w)
        if p.top_p < 1.0:     # the smallest prefix whose share reaches top_p (as pd_draw_candidates)
            cum = np.cumsum(w)
            keep = min(keep, int(np.searchsorted(cum / cum[-1], p.top_p, "left")) + 1)
        if p.min_p > 0.0:     # w is relative to the best candidate left
            keep = min(keep, max(1, int(np.count_nonzero(w >= p.min_p))))
        return ids[:keep], w[:keep]

    def _update(self, surprise: float) -> None:
        self.last_surprise = surprise
        self.mu -= self.params.mirostat_eta * (surprise - self.params.mirostat_tau)

    def _mirostat(self, x: np.ndarray, sampler, inv_t: float) -> int:
        ids, vals = self._candidates(x, MIROSTAT_M, sampler)
        s = (vals - vals[0]) * inv_t
        m = len(s)
        k = 1
        if m > 1:
            t = np.log(np.arange(2, m + 1) / np.arange(1, m))   # log((i + 2) / (i + 1))
            b = s[:-1] - s[1:]                                   # log(p_i / p_{i+1})
            s_hat = float(np.dot(t, b) / np.dot(t, t))
            k = self._mirostat_k(s_hat)
        if k > len(ids):
            ids, vals = self._candidates(x, k, sampler)
            s = (vals - vals[0]) * inv_t
        w = np.exp(s[:k])
        j = draw(w, sampler.uniform())
        self._update(-math.log2(w[j] / w.sum()))
        return int(ids[j])

    def _mirostat_k(self, s_hat: float) -> int:
        """llama.cpp's k from the fitted exponent and mu, as an int in 1..n_vocab (its limits
        where the formula divides 0 by 0 or overflows)."""
        eps, n = s_hat - 1.0, self.n_vocab
        with np.errstate(all="ignore"):
            two_mu = np.exp2(np.float64(self.mu))
            ratio = two_mu / math.log(n) if abs(eps) < 1e-12 else eps * two_mu / (1.0 - np.float64(n) ** -eps)
            k = ratio ** (1.0 / s_hat) if s_hat > 0 else (np.inf if ratio > 1 else 0.0)
        if not np.isfinite(k):
            return n if k > 0 else 1
        return int(max(1.0, min(float(n), float(k))))

    def _mirostat2(self, x: np.ndarray, sampler, inv_t: float) -> int:
        # The tokens of surprise <= mu: logit >= max + (log Z - mu ln 2) / inv_t. Found by one
        # float32 pass with a margin, then decided in float64 (no vocabulary-wide sort).
        mx = float(lib.pd_max_f32(ffi.cast("float *", x.ctypes.data), len(x)))
        if mx == -math.inf:
            raise ValueError("every token is at -inf (banned by logit_bias or a logits_processor): nothing to sample")
        log_z = math.log(lib.pd_sum_exp(ffi.NULL, ffi.cast("float *", x.ctypes.data), len(x), inv_t, mx))
        cut = log_z - self.mu * LN2                   # on (logit - max) * inv_t
        near = np.flatnonzero(x >= np.float32(mx + (cut - 1e-3 * (1.0 + abs(cut))) / inv_t))
        s = (x[near].astype(np.float64) - mx) * inv_t
        keep = near[s >= cut] if len(near) else near
        if len(keep) == 0:                            # at least the best token
            ids, vals = self._candidates(x, 1, sampler)
            self._update(0.0)
            return int(ids[0])
        order = np.lexsort((keep, -x[keep]))          # best first, ties to the lower id
        ids = keep[order]
        w = np.exp((x[ids].astype(np.float64) - mx) * inv_t)
        j = draw(w, sampler.uniform())
        self._update(-math.log2(w[j] / w.sum()))
        return int(ids[j])
