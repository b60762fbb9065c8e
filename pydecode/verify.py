"""`pydecode verify`: the KV cache checked against recomputing, side by side, step by step.

Two Models on the same file. The cached one prefills the prompt once, then runs decode_step per
new token (each step computes the K/V of one position and reads the rest from the cache). The
recompute one runs a fresh prefill over the whole sequence so far at every step (no cache
reuse). Both must give the same logits up to float summation order (TOLERANCE, the bound of
tests/test_cache.py) and so the same greedy tokens.

Counting the positions whose K/V each path computes, for a prompt of P tokens and N new tokens
(N logit vectors; the last chosen token is never fed back):
    cached:     P + (N - 1)                       e.g. P=13, N=5: 13 + 4 = 17
    recompute:  P + (P+1) + ... + (P+N-1)         e.g. 13 + 14 + 15 + 16 + 17 = 75
KV cache bytes in use after a step: 2 (K and V) x n_kv_heads x positions x head_dim x bytes per
element, summed over layers, sliding-window layers counting at most their window
(ArchConfig.kv_bytes). The C core allocates that for n_ctx positions, sliding-window layers
keeping a ring of window + n_batch (Model.kv_bytes, pd_model_kv_bytes).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .errors import ContextFullError
from .generation import prompt_ids
from .model import DEFAULT_N_BATCH, Model

TOLERANCE = 2e-3   # max |logit difference| (logits of magnitude ~20): tests/test_cache.py's CACHE_ATOL


@dataclass
class Step:
    index: int                  # 1-based: step k produces the k-th new token
    token: int                  # the token the cached path chose (and both paths are fed)
    token_recompute: int        # the token the recompute path would choose
    max_abs_diff: float         # max |logit_cached - logit_recompute| over the vocabulary
    agree: bool                 # within TOLERANCE, and the same token (or a tie within 2 x TOLERANCE)
    positions_cached: int       # positions whose K/V the cached path computed at this step
    positions_recompute: int    # ... and the recompute path
    cached_s: float
    recompute_s: float
    kv_positions: int           # positions the cache holds after this step
    kv_bytes_in_use: int        # by the formula (sliding-window layers capped at their window)
    text: str = ""              # the token's text


@dataclass
class Verification:
    path: str
    prompt_tokens: int
    steps: list[Step] = field(default_factory=list)
    tolerance: float = TOLERANCE
    kv_bytes_allocated: int = 0   # the C allocation (n_ctx positions), pd_model_kv_bytes
    n_ctx: int = 0

    def _total(field: str):
        return property(lambda self: sum(getattr(s, field) for s in self.steps),
                        doc=f"The steps' {field}, summed.")

    positions_cached = _total("positions_cached")
    positions_recompute = _total("positions_recompute")
    cached_s = _total("cached_s")
    recompute_s = _total("recompute_s")
    del _total

    @property
    def max_abs_diff(self) -> float:
        return max((s.max_abs_diff for s in self.steps), default=0.0)

    @property
    def ok(self) -> bool:
        return all(s.agree for s in self.steps)

    @property
    def tokens(self) -> list[int]:
        return [s.token for s in self.steps]


def expected_positions(prompt_tokens: int, n_new: int) -> tuple[int, int]:
    """(cached, recompute) positions computed for N new tokens: P + N - 1 and the triangular sum."""
    if n_new < 1:
        return 0, 0
    return prompt_tokens + n_new - 1, sum(prompt_tokens + i for i in range(n_new))


def verify(path, prompt: str | list[int], n: int, *, n_threads: int | None = None, n_ctx: int | None = None,
           n_batch: int = DEFAULT_N_BATCH, isa: str | None = None, kv_type: str = "f16",
           tolerance: float = TOLERANCE, on_step=None, on_prefill=None, model_cls=None) -> Verification:
    """Greedy-decodes n tokens after `prompt` with the cache and by recomputing; on_step(step)
    is called after each step (for printing as it goes), on_prefill(done, total) after each
    chunk of the first prefill (a progress bar)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    model_cls = model_cls or Model
    cached = model_cls(path, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, isa=isa, kv_type=kv_type)
    try:
        ids = prompt_ids(cached.tokenizer, prompt, cached.n_vocab)
        if not ids:
            raise ValueError("the prompt is empty (no tokens)")
        need = len(ids) + n - 1
        if need > cached.n_ctx:
            raise ContextFullError(f"the prompt ({len(ids)} tokens) and {n} new tokens need {need} positions; "
                                   f"the context holds {cached.n_ctx} (n_ctx)")
        recompute = model_cls(path, n_ctx=cached.n_ctx, n_threads=cached.n_threads, n_batch=n_batch, isa=isa,
                              kv_type=kv_type)
        try:
            return _run(cached, recompute, ids, n, tolerance, on_step, on_prefill)
        finally:
            recompute.close()
    finally:
        cached.close()


def _prefill(m: Model, ids: list[int], on_prefill) -> np.ndarray:
    """The cached path's first prefill: in n_batch chunks when someone watches its progress
    (chunking changes no result: the C core computes each position exactly as in one block)."""
    if on_prefill is None:
        return m.prefill(ids)
    for i in range(0, len(ids), m.n_batch):
        logits = m.prefill(ids[i:i + m.n_batch], pos=i)
        on_prefill(min(i + m.n_batch, len(ids)), len(ids))
    return logits


def _run(cached: Model, recompute: Model, ids: list[int], n: int, tol: float, on_step,
         on_prefill=None) -> Verification:
    cfg = cached.config
    elem = cached.kv_elem_bytes
    out = Verification(str(cached.path), len(ids), tolerance=tol, kv_bytes_allocated=cached.kv_bytes,
                       n_ctx=cached.n_ctx)
    seq = list(ids)
    token = None
    for k in range(1, n + 1):
        t0 = time.perf_counter()
        if token is None:
            la = _prefill(cached, seq, on_prefill).copy()
            pc = len(seq)
        else:
            la = cached.decode_step(token, len(seq) - 1).copy()
            pc = 1
        t1 = time.perf_counter()
        lb = recompute.prefill(seq).copy()     # the whole sequence, every step
        t2 = time.perf_counter()
        diff = float(np.max(np.abs(la - lb)))
        ta, tb = int(np.argmax(la)), int(np.argmax(lb))
        same = ta == tb or abs(float(la[ta]) - float(la[tb])) <= 2 * tol   # a tie within tolerance
        step = Step(k, ta, tb, diff, bool(diff <= tol and same), pc, len(seq), t1 - t0, t2 - t1,
                    len(seq), cfg.kv_bytes(len(seq), elem), cached.tokenizer.decode([ta]))
        out.steps.append(step)
        if on_step:
            on_step(step)
        token = ta
        seq.append(ta)
    return out


HEADER = (f"{'step':>4} {'token':>7} {'text':<14} {'max|dlogit|':>11} {'agree':>5} {'cached K/V (total)':>18} "
          f"{'recompute K/V (total)':>21} {'cached ms':>9} {'recomp ms':>9} {'KV bytes in use':>15}")


def _cell(text: str, width: int) -> str:
    """text cut and padded to `width` terminal columns (East Asian wide characters take two)."""
    import unicodedata

    out, used = "", 0
    for ch in text:
        w = 2 if unicodedata.east_asian_width(ch) in "WF" else (0 if unicodedata.combining(ch) else 1)
        if used + w > width:
            break
        out, used = out + ch, used + w
    return out + " " * (width - used)


def step_line(s: Step, total_cached: int, total_recompute: int) -> str:
    """One table row; the totals are the positions computed up to and including this step."""
    text = _cell(repr(s.text)[1:-1], 14)
    agree = "yes" if s.agree and s.token == s.token_recompute else ("tie" if s.agree else "NO")
    return (f"{s.index:>4} {s.token:>7} {text} {s.max_abs_diff:>11.2e} {agree:>5} "
            f"{f'{s.positions_cached} ({total_cached})':>18} {f'{s.positions_recompute} ({total_recompute})':>21} "
            f"{s.cached_s * 1e3:>9.1f} {s.recompute_s * 1e3:>9.1f} {s.kv_bytes_in_use:>15}")


def summary_lines(v: Verification) -> list[str]:
    speed = v.recompute_s / v.cached_s if v.cached_s > 0 else float("inf")
    last = v.steps[-1]
    bad = [s.index for s in v.steps if not s.agree]
    return [
        f"positions computed: {v.positions_cached} with the cache vs {v.positions_recompute} recomputing "
        f"(prompt {v.prompt_tokens} + {len(v.steps)} new); time {v.cached_s * 1e3:.1f} ms vs "
        f"{v.recompute_s * 1e3:.1f} ms ({speed:.1f}x)",
        f"KV cache: {last.kv_bytes_in_use} bytes in use for {last.kv_positions} positions "
        f"(2 x n_kv_heads x positions x head_dim x bytes per layer, window-capped); "
        f"{v.kv_bytes_allocated} bytes allocated for n_ctx {v.n_ctx}",
        f"max |dlogit| {v.max_abs_diff:.2e} (tolerance {v.tolerance:g}): "
        + ("the paths AGREE" if not bad else f"the paths DISAGREE at step{'s' if len(bad) > 1 else ''} "
                                             f"{', '.join(map(str, bad))}"),
    ]


def report_lines(v: Verification) -> list[str]:
    """The whole table `pydecode verify` prints: header, one row per step, summary."""
    lines, tc, tr = [HEADER], 0, 0
    for s in v.steps:
        tc += s.positions_cached
        tr += s.positions_recompute
        lines.append(step_line(s, tc, tr))
    return lines + summary_lines(v)
