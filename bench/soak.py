"""Soak test: many short sessions, RSS over time. Flat RSS after warm-up = no leak.

    python bench/soak.py                         # 20 000 tokens, SmolLM2, one model
    python bench/soak.py --reload-every 10       # ... closing and reloading it every 10 sessions
    python bench/soak.py --tokens 5000 --json

Each session is a short generation with its own prompt and sampler settings (greedy, seeded
sampling with penalties, a stop string, logprobs, a chat turn, or a stream abandoned midway);
with --reload-every N the model is closed and loaded again every N sessions (pd_model_free, the
mapping, the tokenizer). RSS (anonymous and file-backed, after gc + malloc_trim) is printed every --report-every tokens;
the verdict compares the anonymous RSS (heap: where a leak shows) at the end with its highest
point in the first half, and fits a slope over the second half. Exit status 1 if both say it grew
more than --max-growth-mb over the second half.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pydecode  # noqa: E402

PROMPTS = [
    "Once upon a time", "The capital of France is", "def fibonacci(n):", "Water boils at",
    "List three colors:", "In 1969, the first", "Dear customer, we", "The quick brown fox",
    "import numpy as np\n", "Q: What is 2+2?\nA:", "Le chat est", "\u4e2d\u6587\u662f",
    "Emoji: \U0001f600", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
]


try:
    _trim = ctypes.CDLL("libc.so.6").malloc_trim   # glibc: give freed heap pages back first
except (OSError, AttributeError):
    _trim = None


def settle() -> None:
    gc.collect()
    if _trim is not None:
        _trim(0)


def rss() -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes. A leak shows in the anonymous part; the file part
    is the mapped model's pages (it moves with which weights were read, and is not a leak)."""
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:", "VmRSS:")):
                vals[line.split(":")[0]] = int(line.split()[1]) * 1024
    if "RssAnon" not in vals:   # old kernels: all of it
        return vals.get("VmRSS", 0), 0
    return vals["RssAnon"], vals["RssFile"]


def session(llm, rng: random.Random, n: int) -> int:
    """One short session; returns the tokens it generated."""
    kind = rng.randrange(6)
    prompt = rng.choice(PROMPTS) + (" " + str(rng.randrange(10**6)) if rng.random() < 0.5 else "")
    if kind == 0:
        return len(llm.generate(prompt, max_tokens=n).tokens)
    if kind == 1:
        return len(llm.generate(prompt, max_tokens=n, temperature=0.9, top_k=40, top_p=0.95, min_p=0.02,
                                repeat_penalty=1.1, seed=rng.randrange(2**31)).tokens)
    if kind == 2:
        return len(llm.generate(prompt, max_tokens=n, stop=["\n\n", "."], temperature=0.7,
                                seed=rng.randrange(2**31)).tokens)
    if kind == 3:
        return len(llm.generate(prompt, max_tokens=n, logprobs=5).tokens)
    if kind == 4:
        return len(llm.chat([{"role": "user", "content": prompt}], max_tokens=n).tokens)
    it = llm.stream(prompt, max_tokens=n, temperature=0.8, seed=rng.randrange(2**31))
    got = 0
    for _ in it:                      # abandoned midway
        got += 1
        if got >= n // 2:
            break
    it.close()
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=20000, help="tokens to generate in all")
    ap.add_argument("--session-tokens", type=int, default=48, help="max tokens per session")
    ap.add_argument("--reload-every", type=int, default=0,
                    help="sessions between model reloads (0: never). Reloads raise the heap to a plateau "
                         "(allocator fragmentation: ~80 MiB for SmolLM2, reached after ~30 reloads)")
    ap.add_argument("--report-every", type=int, default=1000, help="tokens between RSS lines")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-growth-mb", type=float, default=4.0)
    ap.add_argument("--json", action="store_true", help="print the samples as JSON at the end")
    a = ap.parse_args(argv)

    rng = random.Random(a.seed)
    load = lambda: pydecode.load(a.model, n_ctx=a.ctx, n_threads=a.threads)  # noqa: E731
    settle()
    rss0 = rss()[0]
    llm = load()
    samples = [(0, 0, 0.0, *rss())]            # (tokens, sessions, seconds, anon rss, file rss)
    print(f"soak: {a.model}, {a.tokens} tokens, sessions of <= {a.session_tokens}, reload every "
          f"{a.reload_every} sessions; anonymous RSS before load {rss0 / 2**20:.1f} MiB, after {samples[0][3] / 2**20:.1f} MiB")
    print(f"{'tokens':>7} {'sessions':>8} {'reloads':>7} {'seconds':>8} {'tok/s':>6} {'anon RSS MiB':>12} "
          f"{'file RSS MiB':>12}")
    t0 = time.perf_counter()
    total = sessions = reloads = 0
    next_report = a.report_every
    while total < a.tokens:
        total += session(llm, rng, min(a.session_tokens, a.tokens - total))
        sessions += 1
        if a.reload_every and sessions % a.reload_every == 0:
            llm.close()
            llm = load()
            reloads += 1
        if total >= next_report or total >= a.tokens:
            settle()
            dt = time.perf_counter() - t0
            samples.append((total, sessions, dt, *rss()))
            print(f"{total:>7} {sessions:>8} {reloads:>7} {dt:>8.1f} {total / dt:>6.1f} {samples[-1][3] / 2**20:>12.1f} "
                  f"{samples[-1][4] / 2**20:>12.1f}", flush=True)
            next_report += a.report_every
    llm.close()
    settle()
    end_rss = rss()[0]

    # Warm-up: allocator pools and fragmentation from reloads settle at some level; a leak keeps
    # climbing. So the end is compared with the highest point of the first half.
    first, half = samples[:max(2, len(samples) // 2)], samples[len(samples) // 2:]
    warm = max(first, key=lambda s: s[3])
    slope = 0.0
    if len(half) >= 2:
        xs = [s[0] for s in half]
        ys = [s[3] for s in half]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        den = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0
    growth = samples[-1][3] - warm[3]
    span = half[-1][0] - half[0][0] if len(half) >= 2 else 0
    print(f"anonymous RSS: start {samples[0][3] / 2**20:.1f} MiB, first half max (at {warm[0]} tokens) "
          f"{warm[3] / 2**20:.1f} MiB, end {samples[-1][3] / 2**20:.1f} MiB, max {max(s[3] for s in samples) / 2**20:.1f} "
          f"MiB; end - first half's max {growth / 2**20:+.1f} MiB; slope over the second half "
          f"{slope * 1000 / 1024:+.1f} KiB per 1000 tokens ({slope * span / 2**20:+.1f} MiB over its {span} tokens); "
          f"after the last close {end_rss / 2**20:.1f} MiB (before the first load {rss0 / 2**20:.1f})")
    # A leak: the second half still climbs (fitted), and ends above the first half's peak.
    climb = min(growth, slope * span)
    ok = climb <= a.max_growth_mb * 2**20
    print("verdict:", "flat (no leak seen)" if ok else
          f"RSS STILL GROWS: {climb / 2**20:.1f} MiB over the second half (limit {a.max_growth_mb} MiB)")
    if a.json:
        print(json.dumps({"samples": [dict(tokens=t, sessions=s, seconds=d, rss_anon=r, rss_file=f)
                                      for t, s, d, r, f in samples],
                          "growth_bytes": growth, "slope_bytes_per_token": slope, "end_rss_after_close": end_rss}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
