"""Speculative decoding: several tokens per pass of the model, exactly the tokens it would decode.

A decode step reads every weight to produce one token. A drafter guesses the next k tokens
cheaply; the Engine runs the last token and the k guesses through the model in ONE pass (its
batch step, weights read once for all k + 1 positions) and keeps the longest run the model
agrees with (`accept_run`). Two drafters:

- `PromptLookup`: the longest recent n-gram of the context found earlier in it proposes the
  tokens that followed it (no second model; pays when the output copies its input: editing
  code, summarizing, answering about a given text).
- `DraftModel`: a smaller model with the same vocabulary proposes its greedy continuation. It
  has a KV slot per target slot (kept in step with the tokens the target accepted) and runs on
  the target's thread pool.

Exactness. Both drafters propose deterministically: the draft distribution q is a point mass on
the proposed token d. The standard speculative-sampling rule (accept d with probability
min(1, p(d)/q(d)) = p(d); on a rejection draw from max(0, p - q) normalized, which is p without
d) is then the same as drawing from p, the target's distribution after the whole sampler chain
(penalties, temperature, top-k/p, min-p), and accepting d when the draw equals it: the emitted
token is distributed as p either way. `accept_run` does exactly that, one position after the
other, with the sequence's own Sampler and its uniforms in order, so greedy output is the
plain decoding's token for token, and a seeded sampled run is too (the same uniforms meet the
same logits: the C core's batched pass is bit-identical to one-token steps).

Cache. The pass writes the K/V of all k + 1 positions; those past the accepted point hold
rejected guesses until the next pass overwrites them (attention never reads past a query's
position). Sliding-window rings hold window + n_batch positions, so a pass of at most n_batch
tokens never overwrites what a later query needs; the SlotLedger is told how far past the held
tokens a slot was written (`_Seq.spill`), so prefix reuse stays correct.

Self-tuning (`Tuner`): what a pass of n tokens costs against a one-token step is measured once
per CPU and model shape (`verify_costs`, cached beside the layout choices), then from the
engine's own steps as they run (`PassCosts`); acceptance is tracked per sequence. Each step picks the k with the most expected tokens per second, or none
when plain decoding is expected to be faster (then an occasional one-token probe keeps the
acceptance estimate fresh).
"""
from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np

from .errors import ModelError
from .slots import reusable_prefix, ring_extra

log = logging.getLogger("pydecode")

MAX_DRAFT = 16                     # the most tokens one pass verifies beyond the last one
COST_NS = (1, 2, 3, 4, 5, 6, 8, 10, 13, 17)   # pass sizes timed by verify_costs (others interpolated)


# ---------------------------------------------------------------- verification


def accept_run(policy, rows: np.ndarray, toks: list[int], pos: int) -> tuple[list, int, bool]:
    """Feeds the logits of one verification pass to `policy` (a generation.TokenPolicy) position
    after position. toks = [last token, d1..dk]; rows[j] are the logits after toks[j]; pos is
    where toks[0] was computed. Returns (pieces, used, rejected): `used` rows were consumed,
    i.e. toks[:used] now have valid K/V (used - 1 drafts accepted); rejected: a draft differed
    from what the policy chose (False when all matched or the generation ended first)."""
    pieces = []
    for j in range(len(toks)):
        n_before = len(policy.tokens)
        pieces += policy.step(rows[j], pos + j + 1)
        if policy.completion is not None:
            return pieces, j + 1, False
        if len(policy.tokens) > n_before + 1:   # a constraint forced tokens after it: the next
            # pass starts from them, whatever the later rows guessed
            return pieces, j + 1, j + 1 < len(toks) and policy.tokens[n_before] != toks[j + 1]
        if j + 1 < len(toks) and (len(policy.tokens) == n_before or policy.tokens[-1] != toks[j + 1]):
            return pieces, j + 1, True
    return pieces, len(toks), False


def verify(seq, rows: np.ndarray, toks: list[int]) -> tuple[list, int]:
    """accept_run for an engine sequence (its policy, its position), counting the drafts and the
    accepted ones in its Stats and its Tuner. Returns (pieces, rows used)."""
    pieces, used, rejected = accept_run(seq.policy, rows, toks, len(seq.kv))
    st = seq.policy.stats
    st.draft_tokens += len(toks) - 1
    st.accepted_tokens += used - 1
    seq.tuner.update(len(toks) - 1, used - 1, rejected, seq.spec_key)
    return pieces, used


# ---------------------------------------------------------------- drafters


class PromptLookup:
    """Proposes the continuation of the context's latest n-gram (MAX_N down to 2 tokens) after
    its most recent earlier occurrence. Where none matches (the output just changed a token of
    what it copies, say a renamed identifier), it goes on copying from where the last proposal's
    source had got to, as if the change replaced a token by a token ("copy"); failing that, the
    latest occurrence of the last token alone (n = 1). One per sequence; the index of n-grams
    grows with the context (each position indexed once), so a proposal costs O(MAX_N)."""

    MAX_N = 4

    def __init__(self):
        self._index: dict[tuple, int] = {}    # n-gram -> end (exclusive) of its latest occurrence
        self._done = 0                        # n-grams ending before this position are indexed
        self._src: int | None = None          # where the context's next token would be copied from
        self._seen = 0                        # len(context) at the last proposal

    def propose(self, ctx: list[int], k: int):
        """Up to k tokens, and what matched: the n-gram's length, "copy", or 0 (nothing)."""
        end = len(ctx) - 1                    # index every n-gram that ends before the last token
        for e in range(self._done, end):
            for n in range(1, self.MAX_N + 1):
                if e + 1 >= n:
                    self._index[tuple(ctx[e + 1 - n:e + 1])] = e + 1
        self._done = max(self._done, end)
        if self._src is not None:             # the tokens since the last proposal, one for one
            self._src += len(ctx) - self._seen
        self._seen = len(ctx)
        for n in range(min(self.MAX_N, len(ctx)), 1, -1):
            at = self._index.get(tuple(ctx[len(ctx) - n:]))
            if at is not None:
                self._src = at
                return ctx[at:at + k], n
        if self._src is not None and self._src < end:
            return ctx[self._src:min(self._src + k, end)], "copy"
        at = self._index.get((ctx[-1],))
        if at is not None:
            self._src = at
            return ctx[at:at + k], 1
        return [], 0


class DraftModel:
    """A smaller model of the same vocabulary, drafting its greedy continuation for each target
    slot in a slot of its own (the tokens each holds: `fed`). Shares the target's thread pool and
    lock: drafting and verifying take turns on the same cores."""

    def __init__(self, target, path):
        from .model import Model
        draft = Model(path, n_ctx=target.n_ctx, n_threads=target.n_threads, n_batch=target.n_batch,
                      kv_type=target.kv_type, isa=target.isa, n_seq=target.n_seq, repack=target.repack)
        try:
            check_same_vocabulary(target, draft)
            draft.share_pool(target)
        except BaseException:
            draft.close()
            raise
        self.model = draft
        self.fed: list[list[int]] = [[] for _ in range(draft.n_seq)]
        self._ring = ring_extra(draft)
        # a draft step's time over the target's one-token step (the tuner's draft_cost): from the
        # bytes each reads until measured (round_s: seconds of a one-token draft step, measured)
        self.cost = draft.weight_bytes() / max(1, target.weight_bytes())
        self.round_s: float | None = None

    def propose_batch(self, reqs: list[tuple[int, list[int], int]]) -> list[list[int]]:
        """reqs: (slot, context, k) per sequence -> its k greedy draft tokens. Sequences draft
        together: one draft step per drafted position (the first also catches up on what the
        target accepted since the last proposal)."""
        m = self.model
        if max(s for s, _, _ in reqs) >= m.n_seq:
            m.grow_slots(max(s for s, _, _ in reqs) + 1)
            self.fed += [[] for _ in range(m.n_seq - len(self.fed))]
        out: list[list[int]] = [[] for _ in reqs]
        feeds = []                                      # (request index, tokens, their first position)
        for i, (slot, ctx, k) in enumerate(reqs):
            n = reusable_prefix(self.fed[slot], ctx, self._ring)
            feeds.append((i, ctx[n:], n))
        try:
            first = True
            while feeds:
                t0 = time.perf_counter()
                for i, toks, p in feeds:                # what each slot holds, once this step wrote
                    self.fed[reqs[i][0]] = self.fed[reqs[i][0]][:p] + toks
                if len(feeds) == 1 or sum(len(t) for _, t, _ in feeds) > m.n_batch:
                    # one sequence (or a long catch-up) alone
                    rows = [int(np.argmax(m.prefill(toks, p, seq=reqs[i][0]))) for i, toks, p in feeds]
                else:
                    tokens, pos, seqs, last = [], [], [], []
                    for i, toks, p in feeds:
                        tokens += toks
                        pos += range(p, p + len(toks))
                        seqs += [reqs[i][0]] * len(toks)
                        last.append(len(tokens) - 1)
                    rows = [int(np.argmax(r)) for r in m.batch_step(tokens, pos, seqs, last)]
                if not first:   # a one-token round (the first also catches up): its time
                    dt = time.perf_counter() - t0
                    self.round_s = dt if self.round_s is None else 0.8 * self.round_s + 0.2 * dt
                first = False
                nxt = []
                for (i, toks, p), t in zip(feeds, rows):
                    out[i].append(t)
                    slot, ctx, k = reqs[i]
                    if len(out[i]) < k and p + len(toks) < m.n_ctx:
                        nxt.append((i, [t], p + len(toks)))
                feeds = nxt
        except BaseException:
            for slot, _, _ in reqs:                     # what an interrupted step wrote is unknown
                self.fed[slot] = []
            raise
        return out

    def close(self) -> None:
        self.model.close()


def check_same_vocabulary(target, draft) -> None:
    """A draft must propose the target's token ids: same vocabulary size and the same tokens."""
    a = target.gguf.metadata.get("tokenizer.ggml.tokens")
    b = draft.gguf.metadata.get("tokenizer.ggml.tokens")
    if target.n_vocab != draft.n_vocab or a is None or b is None or len(a) != len(b):
        raise ModelError(f"the draft model {draft.path.name} has a vocabulary of {draft.n_vocab} tokens, "
                         f"the target {target.path.name} {target.n_vocab}: a draft must share the target's vocabulary")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            raise ModelError(f"the draft model {draft.path.name}'s token {i} is {y!r} where the target "
                             f"{target.path.name} has {x!r}: a draft must share the target's vocabulary")


# ---------------------------------------------------------------- self-tuning


def verify_costs(model) -> dict[int, float]:
    """{n: time of an n-token pass / time of a one-token step} for the pass sizes COST_NS on this
    CPU, measured once per model shape and thread count (slot 0, first positions: before any
    sequence is in the cache) and cached like the layout choices (pydecode/variants.py)."""
    from .variants import cache_get, cache_put, cpu_model
    c = model.config
    key = (f"verify costs of {model.n_threads} threads | {model.isa} | {c.arch} {c.n_layer}x{c.n_embd} "
           f"ff {c.n_ff} vocab {c.n_vocab} | {model.weight_bytes()} B")
    known = cache_get(key)
    if isinstance(known, dict) and all(str(n) in known for n in COST_NS):
        return {n: float(known[str(n)]) for n in COST_NS}
    t0 = time.perf_counter()
    logits = np.empty((max(COST_NS), model.n_vocab), np.float32)
    times: dict[int, list[float]] = {n: [] for n in COST_NS}

    def step(n):   # n tokens in slot 0 at positions 0..n-1, every row of logits
        model.batch_step([1] * n, list(range(n)), [0] * n, out=logits)

    step(1)                                           # warm-up
    for _ in range(3):                                # the median of three, alternating sizes
        for n in COST_NS:
            t = time.perf_counter()
            step(n)
            times[n].append(time.perf_counter() - t)
    med = {n: float(np.median(v)) for n, v in times.items()}
    ratios = {n: max(1.0, med[n] / med[1]) if n > 1 else 1.0 for n in COST_NS}
    log.info("verification pass costs measured on %s in %.0f ms: %s", cpu_model(),
             1e3 * (time.perf_counter() - t0), ", ".join(f"{n}: {r:.2f}" for n, r in ratios.items()))
    cache_put(key, {str(n): r for n, r in ratios.items()})
    return ratios


def cost_at(costs: dict[int, float], n: int) -> float:
    """A pass of n tokens over a one-token step: interpolated between the measured sizes,
    extrapolated past the largest along its last slope."""
    ns = sorted(costs)
    if n in costs:
        return costs[n]
    if n > ns[-1]:
        slope = (costs[ns[-1]] - costs[ns[-2]]) / (ns[-1] - ns[-2])
        return costs[ns[-1]] + slope * (n - ns[-1])
    hi = next(x for x in ns if x > n)
    lo = max(x for x in ns if x < n)
    return costs[lo] + (costs[hi] - costs[lo]) * (n - lo) / (hi - lo)


class PassCosts:
    """What a step of n tokens (all decoding: one row of logits each) costs over a one-token
    step. Measured at first from `verify_costs` (the C pass alone, at the first positions); then
    from the engine's own steps, Python side included (`observe`): the median of the last
    SAMPLES steps of each size over that of one-token steps, once both have MIN_SEEN."""

    SAMPLES, MIN_SEEN = 9, 3

    def __init__(self, measured: dict[int, float]):
        self.measured = measured
        self._seen: dict[int, deque] = {}
        self._median: dict[int, float | None] = {}

    def observe(self, n: int, seconds: float) -> None:
        self._seen.setdefault(n, deque(maxlen=self.SAMPLES)).append(seconds)
        self._median.pop(n, None)

    def seconds(self, n: int) -> float | None:
        """The median time of a step of n tokens, once seen MIN_SEEN times (else None)."""
        if n not in self._median:
            v = self._seen.get(n)
            self._median[n] = float(np.median(v)) if v is not None and len(v) >= self.MIN_SEEN else None
        return self._median[n]

    def ratio(self, n: int) -> float:
        one, t = self.seconds(1), self.seconds(n)
        if n == 1:
            return 1.0
        if one is not None and t is not None:
            return max(1.0, t / one)
        return cost_at(self.measured, n)


class Tuner:
    """One sequence's choice of k. Acceptance: an estimate of the chance that the next draft
    token matches, given the ones before did (geometric), from decayed counts of accepted tokens
    and rejections, kept per kind of proposal (`key`: for prompt lookup the length of the n-gram
    that matched, as a 4-gram's continuation is far likelier right than a 1-gram's). Expected
    tokens of a pass with k drafts: (1 - a^(k+1)) / (1 - a)."""

    DECAY = 0.9
    PROBE_EVERY = 16           # steps between one-token probes while speculation does not pay
    GAIN = 1.08                # expected speedup a pass must promise over a plain step (the
                               # measured pass costs leave out the Python side of a pass)

    def __init__(self, costs: PassCosts | dict, draft_cost: float, prior=0.6):
        self.costs = costs if isinstance(costs, PassCosts) else PassCosts(costs)
        self.draft_cost = draft_cost
        self._prior = prior if callable(prior) else (lambda key: prior)
        self._counts: dict = {}
        self._idle = 0

    def _c(self, key) -> list[float]:
        if key not in self._counts:
            p = self._prior(key)
            self._counts[key] = [2 * p, 2 * (1 - p)]
        return self._counts[key]

    def acceptance(self, key=None) -> float:
        acc, rej = self._c(key)
        return acc / (acc + rej)

    def choose(self, k_max: int, base: int = 1, key=None) -> int:
        """Drafts for the next pass (0: decode plainly). base: tokens of the step besides these
        drafts (this sequence's last token and the other sequences' tokens)."""
        if k_max < 1:
            return 0
        a = min(self.acceptance(key), 0.999)
        c0 = self.costs.ratio(base)
        best_k, best = 0, 1.0
        for k in range(1, k_max + 1):
            gain = (1 - a ** (k + 1)) / (1 - a) / (self.costs.ratio(base + k) / c0 + k * self.draft_cost)
            if gain > best:
                best_k, best = k, gain
        if best_k and best >= self.GAIN:
            self._idle = 0
            return best_k
        self._idle += 1
        if self._idle >= self.PROBE_EVERY:             # keep the acceptance estimate alive
            self._idle = 0
            return 1
        return 0

    def update(self, drafted: int, accepted: int, rejected: bool, key=None) -> None:
        if drafted < 1:
            return
        c = self._c(key)
        c[0] = c[0] * self.DECAY + accepted
        c[1] = c[1] * self.DECAY + (1 if rejected else 0)


def lookup_prior(n: int) -> float:
    """Acceptance a prompt-lookup proposal starts from, by the length of the n-gram it matched."""
    return {1: 0.1, 2: 0.4, 3: 0.6, "copy": 0.5}.get(n, 0.7)


# ---------------------------------------------------------------- the engine's side


def add_drafts(items, model, draft, costs: PassCosts):
    """A step's items (seq, tokens, logits rows) with the decoding sequences' drafts appended:
    each sequence that drafts gets the k its Tuner chooses (0: none), the step staying within
    n_batch, and needs 1 + k rows. draft: "lookup" or a DraftModel. Called outside the engine's
    lock, before the model call."""
    spec = [i for i, (s, toks, n) in enumerate(items)
            if n == 1 and len(toks) == 1 and s.draft_max and len(s.kv) >= len(s.base)]
    # The first one-token steps run plain: what a pass costs is measured against them.
    if not spec or (len(items) == 1 and costs.seconds(1) is None):
        return items
    used = sum(len(t) for _, t, _ in items)
    reqs, props = [], {}
    for i in spec:
        s = items[i][0]
        k_max = min(s.draft_max, model.n_batch - used, model.n_ctx - 1 - len(s.kv),
                    s.policy.max_tokens - len(s.policy.tokens) - 1)
        if s.lookup is not None:   # proposals cost nothing: look first, then choose by the match
            guess, s.spec_key = s.lookup.propose(s.prompt + s.policy.tokens, k_max) if k_max > 0 else ([], 0)
            k = s.tuner.choose(len(guess), base=used, key=s.spec_key) if guess else 0
            props[i] = guess[:k]
        else:
            k = s.tuner.choose(k_max, base=used)
        if k:
            reqs.append((i, k))
            used += k
    if not reqs:
        return items
    if draft != "lookup":
        got = draft.propose_batch([(items[i][0].slot, items[i][0].context(), k)
                                   for i, k in reqs])
        props = {i: p for (i, _), p in zip(reqs, got)}
        one = costs.seconds(1)
        if one and draft.round_s:   # a draft step over a one-token step of the target
            draft.cost = draft.round_s / one
            for i, _ in reqs:
                items[i][0].tuner.draft_cost = draft.cost
    items = list(items)
    for i, p in props.items():
        if p:
            s, toks, _ = items[i]
            items[i] = (s, toks + p, 1 + len(p))
    return items
