"""Side by side: llama.cpp's `llama-bench` and pydecode, decode (tgN) and prefill (ppN) tokens/s
on the same GGUF files, at each thread count (and optionally at a context depth).

    python bench/compare_llamacpp.py /tmp/llamabench/bin/llama-bench
    LLAMA_BENCH=/tmp/llamabench/bin/llama-bench python bench/compare_llamacpp.py -m smollm2-135m -t 1 2
    python bench/compare_llamacpp.py BIN -m smollm2-135m --depth 0 512 --rounds 4 --json out.json
    python bench/compare_llamacpp.py BIN --avx2 BIN_AVX2 --synthetic /tmp/synth   # everything, two tables

The llama-bench binary is one the user built (see bench/README.md); this script only runs it
(`-m MODEL -t T -p 64 -n 128 -r REPS -o json [-d DEPTH]`) and reads its JSON.

pydecode is measured in this process the way bench/bench_decode.py does it: a warm-up prefill of
8 tokens; ppN = one prefill of N random tokens at position 0 (or at position DEPTH); tgN = N
greedy decode steps (C step + numpy argmax) from a 1-token prompt (or from a DEPTH-token context),
so positions 1..N, the same near-empty context as llama-bench's tgN (positions 0..N-1).

The machine may be shared, so the two tools are interleaved: for each model and thread count,
--rounds rounds of (llama-bench -r REPS, then pydecode REPS repetitions), the order alternating
every round, so that a burst of outside load hits both. Every repetition is one sample; the table
gives the best and the median sample of each tool, and the ratio pydecode / llama.cpp of each;
a row where some median is under 85% of its best is marked noisy (outside load: read the best-of).
Only one tool runs at a time: pydecode's model (and its thread pool) is closed before llama-bench
starts, and llama-bench has exited before pydecode starts.

GB/s = tg tokens/s x weight bytes read per decoded token (pydecode's Model.weight_bytes(): every
tensor once, the token embedding only as the tied output head) -- the same file, so the same bytes
for both tools; at a depth the KV cache read is added (f16 K and V of the average position).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# Measure the checkout this script lives in, not some other installed pydecode.
_ROOT = Path(__file__).resolve().parents[1]
if (_ROOT / "pydecode" / "__init__.py").is_file():
    sys.path.insert(0, str(_ROOT))

import pydecode  # noqa: E402
from pydecode.model import Model  # noqa: E402
from pydecode.registry import resolve  # noqa: E402

NOISY = 0.85  # a row whose median sample is under this share of its best is marked noisy
DEFAULT_MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


# ---------------------------------------------------------------- llama.cpp

def llama_bench(binary: str, path: Path, threads: int, n_prompt: int, n_gen: int, reps: int,
                depth: int, kv_type: str = "f16", bench_args: tuple = ()) -> dict:
    """One llama-bench run: {'pp': [t/s per rep], 'tg': [...], 'info': first JSON record}.
    bench_args: appended as they are (ik_llama.cpp's llama-bench: `-rtr 1`)."""
    cmd = [binary, "-m", str(path), "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen),
           "-r", str(reps), "-o", "json"]
    if depth:
        cmd += ["-d", str(depth)]
    if kv_type != "f16":
        cmd += ["-ctk", kv_type, "-ctv", kv_type]
    cmd += list(bench_args)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    records = json.loads(proc.stdout)
    out = {"pp": [], "tg": [], "info": records[0] if records else {}, "cmd": cmd}
    for r in records:
        if r.get("n_depth", 0) != depth:
            raise RuntimeError(f"llama-bench ran at depth {r.get('n_depth')}, asked for {depth}")
        if r["n_prompt"] > 0 and r["n_gen"] == 0:
            out["pp"] += [float(x) for x in r["samples_ts"]]
        elif r["n_gen"] > 0 and r["n_prompt"] == 0:
            out["tg"] += [float(x) for x in r["samples_ts"]]
    return out


def llama_bench_version(binary: str) -> str:
    try:
        p = subprocess.run([binary, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=60)
        return " ".join(p.stdout.split())
    except (OSError, subprocess.SubprocessError) as e:
        return f"({e})"


# ---------------------------------------------------------------- pydecode

def pydecode_run(path: Path, threads: int, n_prompt: int, n_gen: int, reps: int, depth: int,
                 kv_type: str = "f16") -> dict:
    """bench/bench_decode.py's measurement, at depth 0 or after an untimed DEPTH-token context."""
    m = Model(path, n_threads=threads, n_ctx=max(512, depth + max(n_prompt, n_gen) + 8), kv_type=kv_type)
    try:
        rng = np.random.default_rng(0)
        prompt = rng.integers(100, m.n_vocab - 100, max(n_prompt, depth, 8)).tolist()
        m.prefill(prompt[:8])  # warm up: page in the weights, start the threads
        pp, tg = [], []
        for _ in range(reps):
            if n_prompt:               # -p 0: tg only (at a depth, one context prefill per repetition)
                if depth:
                    m.prefill(prompt[:depth])  # the context (untimed), rebuilt every repetition
                t = time.perf_counter()
                m.prefill(prompt[:n_prompt], pos=depth)
                pp.append(n_prompt / (time.perf_counter() - t))
            if depth:
                m.prefill(prompt[:depth])
                pos0 = depth
            else:
                m.prefill([1])
                pos0 = 1
            t = time.perf_counter()
            tok = 1
            for i in range(n_gen):
                tok = int(np.argmax(m.decode_step(tok, pos0 + i)))
            tg.append(n_gen / (time.perf_counter() - t))
        c = m.config
        kv_per_pos = 2 * c.n_layer * m.kv_row_bytes
        return {"pp": pp, "tg": tg, "weight_bytes": m.weight_bytes(), "isa": m.isa,
                "kv_bytes_per_pos": kv_per_pos, "kv_type": m.kv_type}
    finally:
        m.close()


# ---------------------------------------------------------------- driver

def _stats(xs):
    return (max(xs), statistics.median(xs)) if xs else (float("nan"), float("nan"))


def compare(binary, path, threads, n_prompt, n_gen, reps, rounds, depth, log, kv_type="f16", bench_args=()):
    res = {"model": path.name, "threads": threads, "depth": depth,
           "llama": {"pp": [], "tg": []}, "pydecode": {"pp": [], "tg": []}}
    for r in range(rounds):
        order = ("llama", "pydecode") if r % 2 == 0 else ("pydecode", "llama")
        for tool in order:
            t0 = time.perf_counter()
            if tool == "llama":
                out = llama_bench(binary, path, threads, n_prompt, n_gen, reps, depth, kv_type, bench_args)
                res["llama_info"] = out["info"]
            else:
                out = pydecode_run(path, threads, n_prompt, n_gen, reps, depth, kv_type)
                for k in ("weight_bytes", "isa", "kv_bytes_per_pos", "kv_type"):
                    res[k] = out[k]
            res[tool]["pp"] += out["pp"]
            res[tool]["tg"] += out["tg"]
            log(f"  round {r + 1}/{rounds} {tool:8s} tg {' '.join(f'{x:7.1f}' for x in out['tg'])}"
                f" | pp {' '.join(f'{x:7.1f}' for x in out['pp'])}  ({time.perf_counter() - t0:.1f}s,"
                f" load {os.getloadavg()[0]:.2f})")
    return res


def _ratio(a, b):
    """a / b; nan where b is 0 (a test not run, -p 0 or -n 0)."""
    return a / b if b else float("nan")


def table(results, n_prompt, n_gen) -> str:
    tg, pp = f"tg{n_gen}", f"pp{n_prompt}"
    head = ["model", "thr", "depth",
            f"llama.cpp {tg} best / med", f"pydecode {tg} best / med", "ratio best / med",
            f"llama.cpp {pp} best / med", f"pydecode {pp} best / med", "ratio best / med",
            "MB / token", "GB/s llama.cpp / pydecode (best tg)", "noisy"]
    rows = []
    for r in results:
        lt, pt = _stats(r["llama"]["tg"]), _stats(r["pydecode"]["tg"])
        lp, pq = _stats(r["llama"]["pp"]), _stats(r["pydecode"]["pp"])
        # bytes per decoded token: weights, plus the KV cache of the average position of the run
        avg_pos = r["depth"] + n_gen / 2
        bpt = r["weight_bytes"] + (r["kv_bytes_per_pos"] * avg_pos if r["depth"] else 0)
        rows.append([
            r["model"].removesuffix(".gguf"), str(r["threads"]), str(r["depth"]),
            f"{lt[0]:.1f} / {lt[1]:.1f}", f"{pt[0]:.1f} / {pt[1]:.1f}",
            f"{_ratio(pt[0], lt[0]):.2f} / {_ratio(pt[1], lt[1]):.2f}",
            f"{lp[0]:.1f} / {lp[1]:.1f}", f"{pq[0]:.1f} / {pq[1]:.1f}",
            f"{_ratio(pq[0], lp[0]):.2f} / {_ratio(pq[1], lp[1]):.2f}",
            f"{bpt / 1e6:.1f}", f"{lt[0] * bpt / 1e9:.1f} / {pt[0] * bpt / 1e9:.1f}",
            # a median far under the best: outside load hit this row, trust the best-of columns
            "yes" if min((x[1] / x[0] for x in (lt, pt, lp, pq) if x[0] > 0), default=1.0) < NOISY else "",
        ])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def pool(files):
    """The results of several --json files, samples of the same (model, threads, depth, table:
    native or AVX2 only) pooled."""
    merged = {}
    for fn in files:
        with open(fn) as f:
            for r in json.load(f)["results"]:
                key = (r["model"], r["threads"], r["depth"], r.get("table", "native"))
                if key not in merged:
                    merged[key] = r
                else:
                    for tool in ("llama", "pydecode"):
                        for k in ("pp", "tg"):
                            merged[key][tool][k] += r[tool][k]
    return list(merged.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("llama_bench", nargs="?", default=os.environ.get("LLAMA_BENCH"),
                    help="path to a llama-bench binary (default: $LLAMA_BENCH)")
    ap.add_argument("-m", "--model", nargs="+", default=None,
                    help="registry names or .gguf paths (default: the registry models already cached)")
    ap.add_argument("-t", "--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("-p", "--n-prompt", type=int, default=64)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=3, help="repetitions per tool run (llama-bench -r)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per configuration")
    ap.add_argument("-d", "--depth", type=int, nargs="+", default=[0],
                    help="context depths (llama-bench -d); pydecode prefills that many tokens first")
    ap.add_argument("--avx2", metavar="LLAMA_BENCH_AVX2",
                    help="also compare AVX2 only: this llama-bench built -DGGML_AVX512=OFF against "
                         "pydecode with PYDECODE_ISA=avx2 (a second table)")
    ap.add_argument("--synthetic", metavar="DIR",
                    help="add the synthetic laptop-size models (bench/synthetic.py: Llama-3.2-3B and, with "
                         "--synthetic-8b, Llama-3.1-8B, Q4_K_M, real vocabulary), written to DIR once")
    ap.add_argument("--synthetic-8b", action="store_true")
    ap.add_argument("--synthetic-shape", nargs="+", metavar="SHAPE[:MIX[:LAYERS]]",
                    help="with --synthetic: these bench/synthetic.py files instead (real vocabulary), e.g. "
                         "qwen3-30b-a3b:q4_k_m:24 gpt-oss-20b qwen3-4b (mix default the shape's usual: q4_k_m, gpt-oss-20b mxfp4; all layers)")
    ap.add_argument("--kv-type", default="f16", choices=["f16", "q8_0"],
                    help="KV cache of both tools (llama-bench -ctk/-ctv; pydecode kv_type)")
    ap.add_argument("--bench-args", default="",
                    help="more llama-bench arguments, e.g. '-rtr 1' for ik_llama.cpp's (its fastest CPU path)")
    ap.add_argument("--json", help="write every sample and llama-bench's metadata here")
    ap.add_argument("--tabulate", nargs="+", metavar="JSON",
                    help="run nothing: pool the samples of earlier --json files (same model, threads, "
                         "depth) and print their table")
    a = ap.parse_args()
    if a.tabulate:
        print(table(pool(a.tabulate), a.n_prompt, a.n_gen))
        return
    if not a.llama_bench:
        ap.error("give the llama-bench binary as an argument or in $LLAMA_BENCH (see bench/README.md)")
    if not (os.path.isfile(a.llama_bench) and os.access(a.llama_bench, os.X_OK)):
        ap.error(f"not an executable: {a.llama_bench}")

    if a.model is None:
        paths = []
        for name in DEFAULT_MODELS:
            try:
                paths.append(resolve(name, download=False))
            except Exception as e:  # not cached: skip rather than download gigabytes unasked
                print(f"skipping {name}: {e}", file=sys.stderr)
    else:
        paths = [resolve(x) for x in a.model]
    if a.synthetic:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import synthetic
        specs = a.synthetic_shape or ["llama-3.2-3b"] + (["llama-3.1-8b"] if a.synthetic_8b else [])
        for spec in specs:
            shape, mix, layers = (spec.split(":") + ["", ""])[:3]
            mix = mix or (synthetic.SHAPES[shape].default_mix if shape in synthetic.SHAPES else "")
            if shape not in synthetic.SHAPES or mix not in synthetic.MIXES:
                ap.error(f"--synthetic-shape {spec}: shapes {sorted(synthetic.SHAPES)}, mixes {synthetic.MIXES}")
            cut = f"-{layers}l" if layers else ""
            out = Path(a.synthetic) / f"{shape}{cut}-{mix}.gguf"
            if not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                synthetic.write(shape, mix, out, vocab=synthetic.SHAPES[shape].n_vocab, layers=int(layers or 0) or None)
            paths.append(out)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    log(f"llama-bench: {a.llama_bench} ({llama_bench_version(a.llama_bench)})")
    log(f"pydecode:    {Path(pydecode.__file__).parent}")
    runs = [("native", a.llama_bench, None)] + ([("AVX2 only", a.avx2, "avx2")] if a.avx2 else [])
    all_results = {}
    for label, binary, isa in runs:
        if isa:
            os.environ["PYDECODE_ISA"] = isa
        results = []
        for path in paths:
            for depth in a.depth:
                for t in a.threads:
                    log(f"[{label}] {path.name}  threads {t}  depth {depth}")
                    results.append(compare(binary, path, t, a.n_prompt, a.n_gen, a.reps, a.rounds, depth, log, a.kv_type,
                                           tuple(shlex.split(a.bench_args))))
                    results[-1]["table"] = label
        all_results[label] = results
        info = results[0].get("llama_info", {}) if results else {}
        print(f"## {label}: llama.cpp build {info.get('build_commit')} ({info.get('build_number')}), "
              f"backend {info.get('backends')}, flash_attn {info.get('flash_attn')}, "
              f"kv {info.get('type_k')}/{info.get('type_v')}, repack {info.get('repack', info.get('no_repack'))}, "
              f"cpu {info.get('cpu_info')}")
        print(f"pydecode {Path(pydecode.__file__).parent} (kernels {results[0].get('isa') if results else '?'})"
              f", kv {results[0].get('kv_type') if results else '?'}")
        print(f"{a.rounds} interleaved rounds x {a.reps} repetitions per tool; ratio = pydecode / llama.cpp")
        print()
        print(table(results, a.n_prompt, a.n_gen))
        print()
    results = [r for rs in all_results.values() for r in rs]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
