"""What an 8-bit KV cache costs in accuracy: q8_0 against f16 on the same GGUF file, per model.

    python bench/kv_quality.py                       # the four registry models
    python bench/kv_quality.py -m smollm2-135m --json out.json

Three measures, each model loaded twice (kv_type f16 and q8_0, same threads, same kernels):
  1. max |delta logit| over 256 decoded positions: the f16 model's greedy continuation of a prompt
     is fed to both (teacher forcing), and the logits of every position compared;
  2. greedy agreement on six prompts (64 tokens each): the same tokens, or where they part, the
     f16 model's top-2 margin at that position (a small margin: a near tie that any rounding flips);
  3. perplexity of a real text (this repository's README.md, the first N tokens) under each cache.
No timing here: speed is bench/compare_llamacpp.py's and `pydecode bench --kv-type q8_0`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))

from pydecode.model import Model  # noqa: E402
from pydecode.registry import resolve  # noqa: E402

MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village, there lived",
           "Water boils at a temperature of", "The three primary colours are",
           "import numpy as np\n\ndef normalize(x):"]


def greedy(m: Model, ids: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    logits = m.prefill(ids).copy()
    out, all_logits = [], []
    for i in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        all_logits.append(logits)
        logits = m.decode_step(t, len(ids) + i).copy()
    return out, all_logits


def forced(m: Model, ids: list[int], cont: list[int]) -> list[np.ndarray]:
    logits = [m.prefill(ids).copy()]
    for i, t in enumerate(cont[:-1]):
        logits.append(m.decode_step(t, len(ids) + i).copy())
    return logits


def perplexity(m: Model, ids: list[int], chunk: int = 128) -> float:
    nll = 0.0
    for i in range(0, len(ids) - 1, chunk):
        part = ids[i:i + chunk]
        lg = m.prefill(part, pos=i, all_logits=True).astype(np.float64)
        nxt = ids[i + 1:i + 1 + len(part)]
        lg = lg[:len(nxt)]
        mx = lg.max(axis=1, keepdims=True)
        logz = (mx[:, 0] + np.log(np.exp(lg - mx).sum(axis=1)))
        nll += float((logz - lg[np.arange(len(nxt)), nxt]).sum())
    return float(np.exp(nll / (len(ids) - 1)))


def measure(name: str, threads: int, n_text: int, pair=("f16", "q8_0")) -> dict:
    path = resolve(name)
    models = {kv: Model(path, n_ctx=max(n_text, 512) + 8, n_threads=threads, kv_type=kv) for kv in pair}
    f16, q8 = models[pair[0]], models[pair[1]]    # the reference cache and the one measured
    try:
        res = {"model": name, "isa": f16.isa, "kv_bytes_per_token": {kv: m.config.kv_bytes_per_token(m.kv_elem_bytes)
                                                                    for kv, m in models.items()}}
        ids = f16.tokenizer.encode(PROMPTS[2])
        cont, ref = greedy(f16, ids, 256)
        got = forced(q8, ids, cont)
        d = [float(np.abs(a - b).max()) for a, b in zip(ref, got)]
        res["max_dlogit_256"], res["mean_max_dlogit_256"] = max(d), float(np.mean(d))
        res["logit_scale"] = float(np.mean([np.abs(a).max() for a in ref]))
        cases = []
        for p in PROMPTS:
            pid = f16.tokenizer.encode(p)
            a, la = greedy(f16, pid, 64)
            b, _ = greedy(q8, pid, 64)
            same = a == b
            case = {"prompt": p, "same": same}
            if not same:
                k = next(i for i in range(64) if a[i] != b[i])
                top2 = np.sort(la[k])[-2:]
                case.update(parted_at=k, f16_top2_margin=float(top2[1] - top2[0]))
            cases.append(case)
        res["greedy"] = cases
        text = (_ROOT / "README.md").read_text()
        tid = f16.tokenizer.encode(text)[:n_text]
        res["ppl_tokens"] = len(tid)
        res["ppl"] = {kv: perplexity(m, tid) for kv, m in models.items()}
        return res
    finally:
        for m in models.values():
            m.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", nargs="+", default=MODELS)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--text-tokens", type=int, default=3000)
    ap.add_argument("--pair", nargs=2, default=["f16", "q8_0"], metavar=("REF", "TEST"),
                    help="the two caches compared (--pair f32 f16: how much f16 itself parts from f32)")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    ref, test = a.pair
    print(f"| model | max \\|Δlogit\\| (256 pos) | mean of per-position max | greedy same (6) | parted: {ref} top-2 margin "
          f"| ppl {ref} | ppl {test} | Δppl |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.model:
        r = measure(name, a.threads, a.text_tokens, tuple(a.pair))
        rows.append(r)
        same = sum(c["same"] for c in r["greedy"])
        parted = ", ".join(f"{c['f16_top2_margin']:.3f} @ {c['parted_at']}" for c in r["greedy"] if not c["same"]) or "-"
        p16, p8 = r["ppl"][a.pair[0]], r["ppl"][a.pair[1]]
        print(f"| {name} | {r['max_dlogit_256']:.3f} | {r['mean_max_dlogit_256']:.3f} | {same}/6 | {parted} "
              f"| {p16:.4f} | {p8:.4f} | {100 * (p8 / p16 - 1):+.2f}% |", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
