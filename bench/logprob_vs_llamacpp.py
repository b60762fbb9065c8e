"""Teacher-forced log-probabilities of the same tokens from pydecode and from llama.cpp.

    LLAMA_CPP_LIB_PATH=/tmp/llamabench/bin PYTHONPATH=/tmp/lcpy \\
        python bench/logprob_vs_llamacpp.py smollm2-135m gemma3-270m qwen2.5-coder-0.5b /tmp/synth/x.gguf

For each GGUF file (a registry name or a path): a text is tokenized once, by pydecode's tokenizer
(cut to --tokens ids), and the same ids go to both runtimes in one prefill with every position's
logits: pydecode's `Model.prefill(ids, all_logits=True)` and llama.cpp's through its own Python
binding, llama-cpp-python (`Llama(logits_all=True).eval(ids)`, built from the 0.3.36 sdist over the
libllama.so of bench/README.md section 1). At each position i < n-1 both give log p(ids[i+1] | ids[..i])
(a float64 log-softmax of the float32 logits); the table shows the largest and the mean |difference|
of those forced tokens, in nats, and how often the two runtimes' argmax agree. The runtimes run one
after the other, each alone (one benchmark at a time), with the same thread count. A wrong RoPE,
norm or router is several nats; the different activation quantization of the two is a few tenths.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEXT = (
    "The history of computing is a story of abstraction. Early machines were programmed by rewiring "
    "panels and flipping switches; later, stored programs let the same hardware run many tasks. "
    "Assembly languages gave names to instructions, and compilers turned structured code into machine "
    "words. Operating systems shared one processor among many users, while networks joined distant "
    "computers into a single fabric. Today a laptop runs language models that predict the next word "
    "of a sentence, reading billions of weights from memory for every token it writes. The speed of "
    "that loop depends less on arithmetic than on how quickly bytes move from memory to the cores, "
    "which is why quantized formats that pack each weight into four bits matter so much. "
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def forced(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    """log p(ids[i+1]) at each position i from a [n, vocab] logits array."""
    lp = log_softmax(logits[:-1])
    return lp[np.arange(len(ids) - 1), ids[1:]]


def token_ids(path: Path, text: str, n: int) -> list[int]:
    """pydecode's tokenization of text (with BOS where the file asks for it), repeated to n ids."""
    from pydecode.gguf_file import GGUFFile
    from pydecode.tokenizer import Tokenizer

    f = GGUFFile(path)
    try:
        tok = Tokenizer.from_metadata(f.metadata, cache_path=str(path) + ".spm.model")
    finally:
        f.close()
    ids = tok.encode(text)
    body = tok.encode(text, add_special=False)
    while len(ids) < n:
        ids += body
    return ids[:n]


def pydecode_logits(path: Path, ids: list[int], threads: int, n_ctx: int = 0) -> np.ndarray:
    from pydecode.model import Model

    with Model(path, n_ctx=n_ctx or len(ids) + 8, n_threads=threads) as m:
        return np.array(m.prefill(ids, all_logits=True), dtype=np.float32)


def llamacpp_logits(path: Path, ids: list[int], threads: int, n_ctx: int = 0) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=n_ctx or len(ids) + 8, n_batch=len(ids), n_ubatch=len(ids),
                n_threads=threads, n_threads_batch=threads, logits_all=True, verbose=False)
    try:
        llm.eval(ids)
        return np.array(llm.scores[:len(ids)], dtype=np.float32)
    finally:
        llm.close()
        del llm
        gc.collect()


def compare(path: Path, text: str, n: int, threads: int, n_ctx: int = 0) -> dict:
    ids = token_ids(path, text, n)
    a = pydecode_logits(path, ids, threads, n_ctx)
    b = llamacpp_logits(path, ids, threads, n_ctx)
    if a.shape != b.shape:
        raise SystemExit(f"{path}: logits {a.shape} (pydecode) vs {b.shape} (llama.cpp)")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return {"model": path.name, "tokens": len(ids), "error": "non-finite logits"}
    pa, pb = forced(a, ids), forced(b, ids)
    d = np.abs(pa - pb)
    return {"model": path.name, "tokens": len(ids), "max_abs": float(d.max()), "mean_abs": float(d.mean()),
            "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).mean()),
            "mean_logprob_pydecode": float(pa.mean()), "mean_logprob_llamacpp": float(pb.mean()),
            "worst_position": int(d.argmax()) + 1}


def check_llamacpp(path: Path, text: str, n: int, threads: int, n_ctx: int = 0) -> dict:
    """llama.cpp alone (for architectures pydecode does not run yet): does it load the file and
    give finite logits, and how spread are they (a synthetic file's sanity check)."""
    ids = token_ids(path, text, n)
    try:
        b = llamacpp_logits(path, ids, threads, n_ctx)
    except Exception as e:   # llama-cpp-python raises ValueError when llama.cpp refuses the file
        return {"model": path.name, "tokens": len(ids), "error": f"llama.cpp refused: {e}"}
    pb = forced(b, ids)
    return {"model": path.name, "tokens": len(ids), "finite": bool(np.isfinite(b).all()),
            "logit_std": float(b.std(axis=-1).mean()), "mean_logprob_llamacpp": float(pb.mean())}


def table(rows: list[dict]) -> str:
    if rows and "finite" in rows[0]:
        return "\n".join(["| model | tokens | loads | finite logits | logit std | mean logprob |", "|---|---|---|---|---|---|"]
                         + [f"| {r['model']} | {r['tokens']} | " + (f"no: {r['error']} | | | |" if "error" in r else
                            f"yes | {r['finite']} | {r['logit_std']:.2f} | {r['mean_logprob_llamacpp']:.2f} |")
                            for r in rows])
    out = ["| model | tokens | max abs d logprob | mean abs d logprob | argmax agree | mean logprob pydecode / llama.cpp |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | {r['tokens']} | {r['error']} | | | |")
            continue
        out.append(f"| {r['model']} | {r['tokens']} | {r['max_abs']:.3f} | {r['mean_abs']:.4f} | "
                   f"{r['argmax_agree']:.0%} | {r['mean_logprob_pydecode']:.2f} / {r['mean_logprob_llamacpp']:.2f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="registry names or GGUF paths")
    ap.add_argument("--tokens", type=int, default=128, help="ids fed to both (default 128)")
    ap.add_argument("--text", help="a text file to tokenize instead of the built-in paragraph")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=0,
                    help="context of both runtimes (default tokens + 8); above a LongRoPE model's original "
                         "context (Phi-4-mini: 4096) both switch to its long factors")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--llamacpp-only", action="store_true",
                    help="only check that llama.cpp loads each file and gives finite logits")
    a = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"llama_cpp not importable ({e}): see bench/README.md, 'teacher-forced log-probs'")
    from pydecode.registry import resolve

    text = Path(a.text).read_text() if a.text else TEXT
    rows = []
    for m in a.models:
        path = Path(resolve(m))
        r = (check_llamacpp if a.llamacpp_only else compare)(path, text, a.tokens, a.threads, a.n_ctx)
        print(json.dumps(r), file=sys.stderr, flush=True)
        rows.append(r)
    print(f"llama.cpp {os.environ.get('LLAMA_CPP_LIB_PATH', '(llama_cpp package)')}, {a.threads} threads")
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
