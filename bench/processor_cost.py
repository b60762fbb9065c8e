"""What a Python logits_processor costs per decode step: an identity processor against none.

Per model, `--steps` decode steps (ignore_eos) with no processor and with `lambda ids, s: s`,
alternated `--reps` times. Two figures: the whole step (the median of a run's per-token
latencies; the least over the runs, as other load on the machine only adds), and the policy's
part of it (TokenPolicy.step, timed around each call: sampling, stops, detokenizing, and the
processor's copy, call and check), which other load hardly moves. Greedy, and sampled
(temperature 0.8, top-k 40: there the processor also turns off the model step's sampling
summary, so the draw reads the whole vocabulary).

    python bench/processor_cost.py [--models smollm2-135m qwen2.5-coder-0.5b] [-t 2] [--steps 100] [--reps 3]
"""
from __future__ import annotations

import argparse
import statistics

import time

import pydecode
from pydecode.generation import TokenPolicy
from pydecode.variants import cpu_model

PROMPT = "Write a long story about a lighthouse keeper and the sea."
MODES = {"greedy": {}, "sampled": dict(temperature=0.8, top_k=40, seed=1)}


POLICY: list[float] = []


def _timed(step):
    def wrapper(self, *args, **kw):
        t = time.perf_counter()
        try:
            return step(self, *args, **kw)
        finally:
            POLICY.append(time.perf_counter() - t)
    return wrapper


def per_step(llm, steps, kw, processor) -> tuple[float, float]:
    """(median step seconds, mean policy-step seconds) of one generation."""
    POLICY.clear()
    h = llm.engine.submit(PROMPT, steps, ignore_eos=True, logits_processor=processor, **kw)
    lat = h.result().stats.token_latencies_s
    return statistics.median(lat), statistics.mean(POLICY[1:])   # (the first: after the prefill)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    print(f"{cpu_model()}, {a.threads} threads, {a.steps} steps x {a.reps}")
    print("| model | vocab | mode | step ms, none | step ms, identity | policy us, none | policy us, identity "
          "| cost/step |")
    print("|---|---|---|---|---|---|---|---|")
    identity = lambda ids, scores: scores   # noqa: E731
    TokenPolicy.step = _timed(TokenPolicy.step)
    for name in a.models:
        with pydecode.load(name, n_ctx=512, n_threads=a.threads) as llm:
            per_step(llm, 8, {}, None)   # warm-up (the prompt cached from here on)
            for mode, kw in MODES.items():
                runs = {"none": [], "identity": []}
                for _ in range(a.reps):
                    runs["none"].append(per_step(llm, a.steps, kw, None))
                    runs["identity"].append(per_step(llm, a.steps, kw, identity))
                (base, pb), (proc, pp) = (min(runs[k]) for k in ("none", "identity"))
                pb, pp = (statistics.median(p for _, p in runs[k]) for k in ("none", "identity"))
                print(f"| {name} | {llm.model.n_vocab} | {mode} | {1e3 * base:.2f} | {1e3 * proc:.2f} | "
                      f"{1e6 * pb:.0f} | {1e6 * pp:.0f} | {1e6 * (pp - pb):+.0f} us "
                      f"({100 * (pp - pb) / base:+.1f}% of a step) |")


if __name__ == "__main__":
    main()
