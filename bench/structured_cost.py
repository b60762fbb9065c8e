"""What structured output costs per token, and what forced runs give back.

For each model (SmolLM2 49k vocabulary, Qwen2.5 152k, Gemma 3 262k) and each constraint (a
nested JSON Schema, a regex), greedy and sampled:

- constraint ms/token: the time a generation spends on its constraint (token checks, waits for
  a mask, masked draws, forced runs: Stats.constraint_s) over its output tokens, and its share
  of the time per output token;
- masks/token and mask ms: vocabulary masks computed (the draw comes first and is checked
  alone; a mask only when it is refused or its place does not decide it) and their compute time;
- forced: the share of output tokens the grammar forced (run through the model in one pass,
  never sampled);
- output t/s against unconstrained decoding of as many tokens (ignore_eos), side by side: the
  "schema-heavy outputs are faster" check.

    python bench/structured_cost.py [--models smollm2-135m qwen2.5-coder-0.5b gemma3-270m] [-t 2] [--reps 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import pydecode  # noqa: E402
from pydecode.variants import cpu_model  # noqa: E402
from structured_schemas import SCHEMAS  # noqa: E402

NESTED = SCHEMAS[19]      # a company with offices: objects in an array in an object
REGEX = ("a phone number", r"\+[0-9]{1,3} [0-9]{3}-[0-9]{3}-[0-9]{4}")
SAMPLED = dict(temperature=0.8, top_k=40, top_p=0.95)


def run(llm, what, kw, reps):
    """reps constrained generations and, after each, an unconstrained one of as many tokens (the
    prompt is cached for both by then: the first call prefills it)."""
    msgs = [{"role": "user", "content": f"Reply with JSON only: {what[0]}." if "json_schema" in kw
             else f"Write {what[0]}."}]
    ids = llm.chat_tokens(msgs)
    rows = []
    for r in range(reps):
        c = llm.generate(ids, 256, seed=r, **kw)
        plain = llm.engine.submit(ids, len(c.tokens), ignore_eos=True, seed=r,
                                  **{k: v for k, v in kw.items() if k in SAMPLED}).result()
        rows.append((c, plain))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"])
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    print(f"host: {cpu_model()}, {os.cpu_count()} CPUs")
    print("| model | vocab | constraint | mode | tokens | constraint ms/token | share of a token | masks/token | "
          "mask ms | forced | constrained t/s | unconstrained t/s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in a.models:
        with pydecode.load(name, n_ctx=1024, n_threads=a.threads) as llm:
            llm.generate("warm up", 8)
            for label, what, ckw in (("nested JSON Schema", NESTED, {"json_schema": NESTED[1]}),
                                     ("regex", REGEX, {"regex": REGEX[1]})):
                for mode, skw in (("greedy", {}), ("sampled", SAMPLED)):
                    rows = run(llm, what, {**ckw, **skw}, a.reps)
                    toks = sum(len(c.tokens) for c, _ in rows)
                    cost = sum(c.stats.constraint_s for c, _ in rows)
                    # decode speed: tokens after the first over the time after the first (the
                    # prompt's prefill, and the forced tokens prefilled with it, left out)
                    dec = sum(len(c.stats.token_latencies_s) for c, _ in rows)
                    wall = sum(c.stats.decode_s for c, _ in rows)
                    pdec = sum(len(p.stats.token_latencies_s) for _, p in rows)
                    pwall = sum(p.stats.decode_s for _, p in rows)
                    masks = sum(c.stats.masks for c, _ in rows)
                    mask_s = sum(c.stats.mask_s for c, _ in rows)
                    forced = sum(c.stats.forced_tokens for c, _ in rows)
                    complete = all(c.complete for c, _ in rows)
                    tps, ptps = dec / wall, pdec / pwall
                    per_token = wall / dec
                    print(f"| {name} | {llm.model.n_vocab} | {label} | {mode} | {toks // a.reps} | "
                          f"{1e3 * cost / toks:.3f} | {100 * cost / toks / per_token:.1f}% | {masks / toks:.2f} | "
                          f"{1e3 * mask_s / max(1, masks):.3f} | {100 * forced / toks:.0f}% | {tps:.1f} | {ptps:.1f} | "
                          f"{tps / ptps:.2f}x |" + ("" if complete else " (some incomplete)"), flush=True)


if __name__ == "__main__":
    main()
