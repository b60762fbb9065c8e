"""sample: logits -> next token id. Policy lives in Python; numpy keeps it vectorized.

Chain, in this order: temperature -> top-k -> top-p -> min-p -> seeded draw.
temperature == 0 is greedy (a plain argmax).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0          # 0 = off
    top_p: float = 1.0      # 1 = off
    min_p: float = 0.0      # 0 = off
    seed: int | None = None

    def __post_init__(self):
        t = self.temperature
        if not isinstance(t, (int, float)) or isinstance(t, bool) or math.isnan(t) or t < 0 or math.isinf(t):
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or math.isnan(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.min_p, (int, float)) or math.isnan(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Chooses the next token from one step's logits."""
    if params.temperature == 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / params.temperature
    ids = np.arange(len(z))
    if 0 < params.top_k < len(z):
        keep = np.argpartition(z, -params.top_k)[-params.top_k:]
        ids, z = keep, z[keep]
    order = np.argsort(-z, kind="stable")
    ids, z = ids[order], z[order]
    p = np.exp(z - z[0])
    p /= p.sum()
    if params.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(p), params.top_p)) + 1
        ids, p = ids[:cut], p[:cut]
    if params.min_p > 0:
        keep = p >= params.min_p * p[0]
        ids, p = ids[keep], p[keep]
    p = p / p.sum()
    return int(ids[rng.choice(len(p), p=p)])
