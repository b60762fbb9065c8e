"""Side by side: speculative decoding in llama.cpp (`llama-speculative`, `llama-lookup`) and in
pydecode (`load(draft=...)`), on the same GGUF files and prompts, with the same threads; each
against its own plain decoding (llama.cpp: `llama-bench -p 0 -n N`; pydecode: the same LLM with
draft_tokens=0). Greedy everywhere. Runs alternate tool by tool, `--rounds` times; the table
shows the best decode tokens/s of each.

    python bench/compare_speculative.py LLAMA_BIN_DIR [-t 2] [-n 128] [--rounds 2] [--json F]

LLAMA_BIN_DIR holds llama-speculative, llama-lookup and llama-bench, built from the
llama-cpp-python 0.3.36 sdist as for bench/compare_llamacpp.py (with -DLLAMA_BUILD_EXAMPLES=ON).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

from pydecode.bench import DRAFT_PROMPTS
from pydecode.registry import model_path
from pydecode.variants import cpu_model

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
CASES = [  # (name, drafter, prompt kind)
    ("draft model, code", "model", "code"),
    ("lookup, rewrite", "lookup", "rewrite"),
    ("lookup, prose", "lookup", "prose"),
]
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")


def llama_spec(bin_dir, case, target, draft, prompt, threads, n, k):
    exe = "llama-speculative" if case[1] == "model" else "llama-lookup"
    cmd = [os.path.join(bin_dir, exe), "-m", str(target), "-p", prompt, "-n", str(n), "-t", str(threads),
           "--temp", "0", "-c", "2048", "--spec-draft-n-max", str(k)]
    if case[1] == "model":
        cmd += ["-md", str(draft), "-td", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    m, a = DECODED.findall(out), ACCEPT.findall(out)
    if not m:
        raise RuntimeError(f"{exe} printed no speed (rc {r.returncode}):\n{out[-2000:]}")
    return {"tokens_per_s": float(m[-1][2]), "acceptance": float(a[-1]) / 100 if a else None}


def llama_plain(bin_dir, target, threads, n):
    r = subprocess.run([os.path.join(bin_dir, "llama-bench"), "-m", str(target), "-p", "0", "-n", str(n),
                        "-t", str(threads), "-r", "2", "-o", "json"], capture_output=True, text=True, timeout=900)
    return max(float(x["avg_ts"]) for x in json.loads(r.stdout))


def ours(case, target, draft, prompt, threads, n):
    code = ("import json, sys; from pydecode.bench import bench_draft; "
            "print(json.dumps(bench_draft(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), reps=2, "
            "prompts={'p': sys.argv[5]})))")
    d = "lookup" if case[1] == "lookup" else str(draft)
    r = subprocess.run([sys.executable, "-c", code, str(target), str(threads), d, str(n), prompt],
                       capture_output=True, text=True, timeout=900)
    if r.returncode:
        raise RuntimeError(f"pydecode failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bin_dir")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-k", "--draft-max", type=int, default=8, help="llama.cpp's --spec-draft-n-max")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    target, draft = model_path(TARGET), model_path(DRAFT)
    rows = []
    lp = max(llama_plain(a.bin_dir, target, a.threads, a.n_gen) for _ in range(a.rounds))
    for case in CASES:
        prompt = DRAFT_PROMPTS[case[2]]
        ls, us = [], []
        for r in range(a.rounds):
            ls.append(llama_spec(a.bin_dir, case, target, draft, prompt, a.threads, a.n_gen, a.draft_max))
            us.append(ours(case, target, draft, prompt, a.threads, a.n_gen))
            print(f"  {case[0]} round {r + 1}: llama.cpp {ls[-1]['tokens_per_s']:.1f} t/s, "
                  f"pydecode {us[-1]['draft_tokens_per_s']:.1f} t/s (plain {us[-1]['plain_tokens_per_s']:.1f})",
                  file=sys.stderr)
        lb, ub = max(ls, key=lambda x: x["tokens_per_s"]), max(us, key=lambda x: x["draft_tokens_per_s"])
        rows.append({"case": case[0], "llama_plain": lp, "llama_spec": lb["tokens_per_s"],
                     "llama_accept": lb["acceptance"], "ours_plain": max(u["plain_tokens_per_s"] for u in us),
                     "ours_spec": ub["draft_tokens_per_s"], "ours_accept": ub["acceptance"],
                     "ours_tokens_per_pass": ub["tokens_per_pass"]})
    print(f"host: {cpu_model()}, {a.threads} threads, {TARGET} (draft {DRAFT}), greedy, n = {a.n_gen}")
    print("| case | llama.cpp plain | llama.cpp drafted (accept) | x own plain | pydecode plain | "
          "pydecode drafted (accept, tokens/pass) | x own plain | pydecode / llama.cpp drafted |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        la = f"{100 * r['llama_accept']:.0f}%" if r["llama_accept"] is not None else "-"
        print(f"| {r['case']} | {r['llama_plain']:.1f} | {r['llama_spec']:.1f} ({la}) | "
              f"{r['llama_spec'] / r['llama_plain']:.2f} | {r['ours_plain']:.1f} | {r['ours_spec']:.1f} "
              f"({100 * r['ours_accept']:.0f}%, {r['ours_tokens_per_pass']:.2f}) | "
              f"{r['ours_spec'] / r['ours_plain']:.2f} | {r['ours_spec'] / r['llama_spec']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"host": cpu_model(), "threads": a.threads, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
