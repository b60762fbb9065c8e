"""Sampling cost per step on a real vocabulary (default: Gemma 3's 262,144 tokens).

    python bench/bench_sampling.py [-m gemma3-270m]

Uses the model's real logits after a short prompt (their shape matters: a peaked distribution
keeps top-p candidate lists short) and reports the mean time of sample() per configuration.
"""
import argparse
import time

import numpy as np

import pydecode
from pydecode.sampling import Sampler, SamplingParams, sample

CONFIGS = {
    "greedy": dict(temperature=0.0),
    "greedy + penalties": dict(temperature=0.0, repeat_penalty=1.1, frequency_penalty=0.1),
    "temp 0.8": dict(temperature=0.8),
    "temp 0.8, top-p 0.95": dict(temperature=0.8, top_p=0.95),
    "full chain (pen, temp, top-k 40, top-p 0.95, min-p 0.05)": dict(
        temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, frequency_penalty=0.1,
        presence_penalty=0.1),
    "pen, temp 1.0, top-p 0.9, min-p 0.05 (no top-k)": dict(
        temperature=1.0, top_p=0.9, min_p=0.05, repeat_penalty=1.1),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="gemma3-270m")
    ap.add_argument("-n", type=int, default=2000)
    a = ap.parse_args()
    llm = pydecode.load(a.model, n_ctx=256)
    ids = llm.tokenize("Once upon a time, in a small village by the sea, there lived")
    logits = llm.model.prefill(ids).copy()
    recent = ids[-64:]
    print(f"model {a.model}: vocabulary {len(logits)}; decode step for reference:", end=" ")
    t = time.perf_counter()
    for i in range(20):
        llm.model.decode_step(ids[-1], len(ids) + i)
    print(f"{(time.perf_counter() - t) / 20 * 1e3:.2f} ms")
    for name, kw in CONFIGS.items():
        p = SamplingParams(seed=0, **kw)
        s = Sampler(p, len(logits))
        sample(logits, p, s, recent)
        t = time.perf_counter()
        for _ in range(a.n):
            sample(logits, p, s, recent)
        print(f"{name:58s} {(time.perf_counter() - t) / a.n * 1e3:.3f} ms/step")


if __name__ == "__main__":
    main()
