"""The cache-equals-recompute check the architecture and format tests share: greedy decode steps
from a prompt, each step's logits against a fresh prefill of the whole prefix by a second model."""
from __future__ import annotations

import numpy as np


def assert_cached_decode_equals_recompute(model, fresh, toks, steps: int, atol: float) -> None:
    """model decodes `steps` greedy tokens after prefilling toks; fresh (a Model of the same file)
    recomputes each prefix; every step's logits agree within atol."""
    logits = model.prefill(toks).copy()
    seq = list(toks)
    for _ in range(steps):
        t = int(np.argmax(logits))
        logits = model.decode_step(t, len(seq)).copy()
        seq.append(t)
        assert np.abs(fresh.prefill(seq).copy() - logits).max() <= atol, len(seq)
