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

Two options say where a gap comes from. --floor runs llama.cpp a second time with the other float
KV cache (f16 <-> f32): its gap to itself is the file's rounding noise floor (each cache rounding
moves every later 8-bit activation quantization; on a random-weight file, where every forced token
is an unlikely one and a mixture-of-experts route flips on a near tie, that is several tenths).
--reference adds the tests' float64 numpy forward pass and each runtime's distance from it. And a
float mix of bench/synthetic.py (--mix f32, with --kv-type f32) leaves no runtime anything to round
to 8 bits: there the two must agree to float32 accumulation order (1e-4 nats), architecture by
architecture.
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


# the KV cache formats both runtimes have, as llama.cpp's ggml_type numbers
GGML_KV_TYPE = {"f32": 0, "f16": 1, "q8_0": 8}


def pydecode_logits(path: Path, ids: list[int], threads: int, n_ctx: int = 0, kv: str = "f16") -> np.ndarray:
    from pydecode.model import Model

    with Model(path, n_ctx=n_ctx or len(ids) + 8, n_threads=threads, kv_type=kv) as m:
        return np.array(m.prefill(ids, all_logits=True), dtype=np.float32)


def llamacpp_logits(path: Path, ids: list[int], threads: int, n_ctx: int = 0, kv: str = "f16") -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=n_ctx or len(ids) + 8, n_batch=len(ids), n_ubatch=len(ids),
                n_threads=threads, n_threads_batch=threads, logits_all=True, verbose=False,
                type_k=GGML_KV_TYPE[kv], type_v=GGML_KV_TYPE[kv])
    try:
        llm.eval(ids)
        return np.array(llm.scores[:len(ids)], dtype=np.float32)
    finally:
        llm.close()
        del llm
        gc.collect()


def reference_logits(path: Path, ids: list[int], n_ctx: int = 0) -> np.ndarray:
    """The tests' float64 numpy forward pass (tests/reference_llama.py: weights dequantized exactly,
    activations not quantized, no f16 cache): what both runtimes approximate."""
    sys.path.insert(0, str(ROOT / "tests"))
    from reference_llama import ReferenceModel
    from reference_qwen35 import Qwen35Reference

    from pydecode.gguf_file import GGUFFile

    f = GGUFFile(path)
    try:
        hybrid = f.architecture in Qwen35Reference.ARCHS   # the hybrids' reference adds the delta nets
    finally:
        f.close()
    ref = (Qwen35Reference if hybrid else ReferenceModel)(path)
    # phi3's LongRoPE factors follow the context, as both runtimes choose them
    ref.long_factors = bool(n_ctx) and n_ctx > int(ref.meta(f"{ref.arch}.rope.scaling.original_context_length", 1 << 30))
    try:
        return np.asarray(ref.logits(ids), dtype=np.float64)
    finally:
        del ref
        gc.collect()


def _gap(pa: np.ndarray, pb: np.ndarray) -> tuple[float, float]:
    d = np.abs(pa - pb)
    return float(d.max()), float(d.mean())


def compare(path: Path, text: str, n: int, threads: int, n_ctx: int = 0, reference: bool = False,
            kv: str = "f16", floor: bool = False) -> dict:
    ids = token_ids(path, text, n)
    a = pydecode_logits(path, ids, threads, n_ctx, kv)
    b = llamacpp_logits(path, ids, threads, n_ctx, kv)
    if a.shape != b.shape:
        raise SystemExit(f"{path}: logits {a.shape} (pydecode) vs {b.shape} (llama.cpp)")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return {"model": path.name, "tokens": len(ids), "error": "non-finite logits"}
    pa, pb = forced(a, ids), forced(b, ids)
    d = np.abs(pa - pb)
    return {"model": path.name, "kv": kv, "tokens": len(ids), "max_abs": float(d.max()), "mean_abs": float(d.mean()),
            "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).mean()),
            "mean_logprob_pydecode": float(pa.mean()), "mean_logprob_llamacpp": float(pb.mean()),
            "worst_position": int(d.argmax()) + 1,
            **(_against_reference(path, ids, n_ctx, pa, pb) if reference else {}),
            **(_noise_floor(path, ids, threads, n_ctx, kv, pb) if floor else {})}


def _noise_floor(path: Path, ids: list[int], threads: int, n_ctx: int, kv: str, pb: np.ndarray) -> dict:
    """llama.cpp against itself with the other float cache (f16 <-> f32): the same model and
    arithmetic but for the rounding of K and V, which moves every later activation's 8-bit
    quantization. A gap between the runtimes no larger than this is rounding, not a bug."""
    other = "f32" if kv != "f32" else "f16"
    pc = forced(llamacpp_logits(path, ids, threads, n_ctx, other), ids)
    fmax, fmean = _gap(pb, pc)
    return {"floor_max": fmax, "floor_mean": fmean, "floor_kv": other}


def _against_reference(path: Path, ids: list[int], n_ctx: int, pa: np.ndarray, pb: np.ndarray) -> dict:
    """Each runtime's distance from the float64 reference: which of the two the gap comes from."""
    pr = forced(reference_logits(path, ids, n_ctx), ids)
    (pmax, pmean), (lmax, lmean) = _gap(pa, pr), _gap(pb, pr)
    return {"ref_max_pydecode": pmax, "ref_mean_pydecode": pmean, "ref_max_llamacpp": lmax, "ref_mean_llamacpp": lmean}


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
    ref = any("ref_max_pydecode" in r for r in rows)
    fl = any("floor_max" in r for r in rows)
    out = ["| model | tokens | max abs d logprob | mean abs d logprob | argmax agree | mean logprob pydecode / llama.cpp |"
           + (" pydecode vs f64 reference (max / mean) | llama.cpp vs f64 reference (max / mean) |" if ref else "")
           + (" llama.cpp vs itself, other float cache (max / mean) |" if fl else ""),
           "|---|---|---|---|---|---|" + ("---|---|" if ref else "") + ("---|" if fl else "")]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | {r['tokens']} | {r['error']} | | | |")
            continue
        out.append(f"| {r['model']} | {r['tokens']} | {r['max_abs']:.3f} | {r['mean_abs']:.4f} | "
                   f"{r['argmax_agree']:.0%} | {r['mean_logprob_pydecode']:.2f} / {r['mean_logprob_llamacpp']:.2f} |"
                   + (f" {r['ref_max_pydecode']:.3f} / {r['ref_mean_pydecode']:.4f} | "
                      f"{r['ref_max_llamacpp']:.3f} / {r['ref_mean_llamacpp']:.4f} |" if "ref_max_pydecode" in r else
                      (" | |" if ref else ""))
                   + (f" {r['floor_max']:.3f} / {r['floor_mean']:.4f} |" if "floor_max" in r else (" |" if fl else "")))
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
    ap.add_argument("--kv-type", choices=list(GGML_KV_TYPE), default="f16",
                    help="both runtimes' KV cache format (default f16, each one's default)")
    ap.add_argument("--floor", action="store_true",
                    help="also run llama.cpp with the other float KV cache (f16 <-> f32) and show its gap to "
                         "itself: the file's rounding noise floor")
    ap.add_argument("--reference", action="store_true",
                    help="also run the tests' float64 numpy forward pass (slow; memory: the file's weights "
                         "as float32) and show each runtime's distance from it")
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
        r = (check_llamacpp(path, text, a.tokens, a.threads, a.n_ctx) if a.llamacpp_only else
             compare(path, text, a.tokens, a.threads, a.n_ctx, a.reference, a.kv_type, a.floor))
        print(json.dumps(r), file=sys.stderr, flush=True)
        rows.append(r)
    print(f"llama.cpp {os.environ.get('LLAMA_CPP_LIB_PATH', '(llama_cpp package)')}, {a.threads} threads, "
          f"{a.kv_type} KV cache in both")
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
