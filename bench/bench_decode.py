"""Decode and prefill speed of pydecode on a model, llama-bench style (tg128 / pp64).

    python bench/bench_decode.py [-m smollm2-135m] [-t 1 2] [--n-gen 128] [--n-prompt 64]

Reports tokens/s (best of --reps) and the share of the weight bytes streamed per second.
"""
import argparse
import time

import numpy as np

import pydecode
from pydecode.model import Model
from pydecode.registry import resolve


def bench(path, threads, n_gen, n_prompt, reps):
    m = Model(path, n_threads=threads, n_ctx=max(512, n_prompt + n_gen + 8))
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, m.n_vocab - 100, n_prompt).tolist()
    m.prefill(prompt[:8])  # warm up: page in the weights, start the threads
    pp = tg = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        m.prefill(prompt)
        pp = max(pp, n_prompt / (time.perf_counter() - t))
        m.prefill([1])
        t = time.perf_counter()
        tok = 1
        for i in range(n_gen):
            tok = int(np.argmax(m.decode_step(tok, 1 + i)))
        tg = max(tg, n_gen / (time.perf_counter() - t))
    return pp, tg, m.weight_bytes(), m.isa


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-t", "--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--n-prompt", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    path = resolve(a.model)
    print(f"model {path.name}")
    for t in a.threads:
        pp, tg, wb, isa = bench(path, t, a.n_gen, a.n_prompt, a.reps)
        print(f"threads {t} ({isa}): tg{a.n_gen} {tg:7.1f} t/s ({tg * wb / 1e9:5.1f} GB/s of weights)  "
              f"pp{a.n_prompt} {pp:7.1f} t/s")


if __name__ == "__main__":
    main()
