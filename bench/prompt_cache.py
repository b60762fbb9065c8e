"""Time to first token of a long prompt: prefilled, against restored from a state file.

    python bench/prompt_cache.py [-m smollm2-135m] [-n 4000] [--kv-type f16] [-t 2]

The prompt is n tokens of this repository's README.md (repeated as needed). "prefill" is a fresh
LLM's generate(prompt, max_tokens=1); "restore" is a fresh LLM's load_state(FILE) (reading and
checking the file, then copying its rows into the cache) plus the same generate, which then
computes only the prompt's last position. Each is the best of --reps fresh loads.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))

import pydecode  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-n", "--tokens", type=int, default=4000)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    kw = dict(n_ctx=a.tokens + 64, n_threads=a.threads, kv_type=a.kv_type)
    with tempfile.TemporaryDirectory() as d:
        state = Path(d) / "prompt.pdkv"
        with pydecode.load(a.model, **kw) as llm:
            text = (_ROOT / "README.md").read_text()
            ids = llm.tokenize(text)
            while len(ids) < a.tokens:
                ids += ids
            prompt = ids[:a.tokens]
            llm.generate(prompt, max_tokens=1)
            llm.save_state(state)
        pre, res = [], []
        for _ in range(a.reps):
            with pydecode.load(a.model, **kw) as llm:
                t = time.perf_counter()
                first = llm.generate(prompt, max_tokens=1)
                pre.append(time.perf_counter() - t)
            with pydecode.load(a.model, **kw) as llm:
                t = time.perf_counter()
                llm.load_state(state)
                again = llm.generate(prompt, max_tokens=1)
                res.append(time.perf_counter() - t)
                assert again.tokens == first.tokens and again.stats.cached_tokens == a.tokens - 1
        size = state.stat().st_size
    print(f"{a.model}, {a.tokens}-token prompt, {a.kv_type} cache, {a.threads} threads: "
          f"prefill {min(pre):.3f} s, restore {min(res):.3f} s ({size / 1e6:.1f} MB file): "
          f"{min(pre) / min(res):.1f}x sooner")


if __name__ == "__main__":
    main()
