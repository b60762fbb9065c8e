"""Does every structured output parse and validate, even when max_tokens cuts it?

For each registry model, the 20 schemas of tests/structured_schemas.py plus the issue's unbounded
"describe a person" schema (no maxLength, no maxItems: the case that used to run on to
max_tokens inside a string), greedy and sampled, at each max_tokens: generate, json.loads,
jsonschema.validate. A generation whose shortest valid output cannot fit is refused before
decoding (a ValueError), and counted apart: it produced nothing to parse.

Prints, per model and max_tokens: outputs, parsed and valid, how many ended with "length"
(of them, how many the budget closed), refusals, and seconds. Exit status 1 if any output
does not validate.

    python bench/structured_closing.py [--models smollm2-135m gemma3-270m qwen2.5-coder-0.5b]
                                       [--max-tokens 32 64 256] [-t 2]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import jsonschema  # noqa: E402

import pydecode  # noqa: E402
from pydecode.variants import cpu_model  # noqa: E402
from structured_schemas import SCHEMAS  # noqa: E402

PERSON = ("a person", {"type": "object", "properties": {   # the example: nothing bounded
    "name": {"type": "string"}, "age": {"type": "integer"}, "height": {"type": "number"},
    "hobbies": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    "required": ["name", "age", "height", "hobbies", "address"]})
MODES = {"greedy": {}, "sampled": dict(temperature=0.8, top_k=40, top_p=0.95, seed=7)}


def one(llm, what, schema, max_tokens, mode):
    """'refused' | ('valid' | 'invalid', finish_reason, closed by the budget, text)."""
    msgs = [{"role": "user", "content": f"Reply with JSON only: {what}."}]
    try:
        c = llm.chat(msgs, max_tokens, json_schema=schema, **MODES[mode])
    except ValueError as e:
        if "too small" not in str(e):
            raise
        return "refused"
    try:
        jsonschema.validate(json.loads(c.text), schema)
        ok = "valid"
    except (ValueError, jsonschema.ValidationError):
        ok = "invalid"
    return ok, c.finish_reason, "closed with its shortest" in (c.stop_detail or ""), c.text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"])
    ap.add_argument("--max-tokens", nargs="+", type=int, default=[32, 64, 256])
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    cases = list(SCHEMAS) + [PERSON]
    print(f"host: {cpu_model()}, {args.threads} threads; {len(cases)} schemas x {len(MODES)} modes")
    print(f"{'model':<20} {'max_tokens':>10} {'outputs':>8} {'valid':>6} {'length':>7} {'closed':>7} "
          f"{'refused':>8} {'s':>6}")
    bad = []
    for name in args.models:
        with pydecode.load(name, n_ctx=2048, n_threads=args.threads) as llm:
            for mt in args.max_tokens:
                t0 = time.perf_counter()
                n = valid = length = closed = refused = 0
                for mode in MODES:
                    for what, schema in cases:
                        r = one(llm, what, schema, mt, mode)
                        if r == "refused":
                            refused += 1
                            continue
                        n += 1
                        valid += r[0] == "valid"
                        length += r[1] == "length"
                        closed += r[2]
                        if r[0] != "valid":
                            bad.append((name, mt, mode, what, r[3]))
                print(f"{name:<20} {mt:>10} {n:>8} {valid:>6} {length:>7} {closed:>7} {refused:>8} "
                      f"{time.perf_counter() - t0:>6.0f}", flush=True)
    for b in bad:
        print("INVALID", *b[:4], repr(b[4][:200]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
