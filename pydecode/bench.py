"""`pydecode bench`: llama-bench style numbers (pp / tg, mean +- std over repetitions after a
warm-up), the roofline (weight + KV bytes per token against a measured read bandwidth), tokens/s
against context depth, the Python share of a generation step, and an optional A/B comparison with
llama-cpp-python on the same GGUF in the same process.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from . import _core
from .model import Model

ffi, lib = _core.ffi, _core.lib


@dataclass
class Row:
    model: str
    size_bytes: int
    params: int
    backend: str
    threads: int
    test: str                      # "pp64", "tg128", "tg128 @ d512"
    runs: list[float] = field(default_factory=list)   # tokens/s per repetition
    bytes_per_token: int = 0       # tg: weights + KV read per token
    bandwidth_gbs: float = 0.0     # measured read bandwidth for this thread count (0 = not probed)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.runs) if self.runs else 0.0

    @property
    def std(self) -> float:
        return statistics.stdev(self.runs) if len(self.runs) > 1 else 0.0

    @property
    def gbs(self) -> float:
        return self.mean * self.bytes_per_token / 1e9

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(mean=self.mean, std=self.std, effective_gbs=self.gbs)
        return d


def probe_bandwidth(n_bytes: int, threads: int, reps: int = 5) -> float:
    """Read bandwidth (GB/s, best of reps) streaming a buffer of n_bytes with `threads` threads."""
    return float(lib.pd_probe_read_bandwidth(int(n_bytes), int(threads), int(reps)))


def _random_prompt(n_vocab: int, n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(100, max(101, n_vocab - 100), n).tolist()


def bench_pydecode(path, threads: int, n_prompt: int, n_gen: int, reps: int, depths=(0,), isa=None) -> list[Row]:
    """pp{n_prompt} and tg{n_gen} (at each depth) for one thread count."""
    depth_max = max(depths)
    m = Model(path, n_threads=threads, n_ctx=max(n_prompt, depth_max + n_gen + 1) + 8, isa=isa)
    name = m.gguf.metadata.get("general.name", m.path.stem)
    size = m.gguf.file_size
    params = sum(t.n_elements for t in m.gguf.tensors.values())
    backend = f"pydecode/{m.isa}"
    rows = []
    prompt = _random_prompt(m.n_vocab, max(n_prompt, depth_max, 1))
    m.prefill(prompt[:8])                                   # warm-up: page in the weights, start threads
    for _ in range(3):
        m.decode_step(1, 8)
    if n_prompt:
        row = Row(name, size, params, backend, threads, f"pp{n_prompt}")
        for _ in range(reps):
            t = time.perf_counter()
            m.prefill(prompt[:n_prompt])
            row.runs.append(n_prompt / (time.perf_counter() - t))
        rows.append(row)
    kv_elem = 2 if m.kv_type == "f16" else 4
    for depth in depths:
        test = f"tg{n_gen}" + (f" @ d{depth}" if depth else "")
        # average KV bytes read per step over the run (positions depth..depth+n_gen)
        kv = m.config.kv_bytes_per_token(kv_elem) * (depth + n_gen / 2)
        row = Row(name, size, params, backend, threads, test, bytes_per_token=int(m.weight_bytes() + kv))
        if depth:
            m.prefill(prompt[:depth])
        for _ in range(reps):
            tok, pos = 1, max(depth, 1)
            if not depth:
                m.prefill([1])
            t = time.perf_counter()
            for i in range(n_gen):
                tok = int(np.argmax(m.decode_step(tok, pos + i)))
            row.runs.append(n_gen / (time.perf_counter() - t))
        rows.append(row)
    m.close()
    return rows


def python_overhead(path, threads: int, n_gen: int = 128) -> tuple[float, float]:
    """(ms per token of the full generate() loop, share of it spent outside the C step)."""
    from .llm import LLM

    llm = LLM(Model(path, n_threads=threads, n_ctx=n_gen + 64))
    llm.generate([1, 2, 3], max_tokens=8)
    best = None
    for _ in range(3):
        t = time.perf_counter()
        out = llm.generate([5, 6, 7, 8], max_tokens=n_gen, temperature=0.8, top_p=0.95, seed=1)
        total = time.perf_counter() - t - out.stats.prefill_s
        c_time = out.stats.decode_s
        n = max(1, out.stats.generated_tokens)
        cand = (total / n * 1e3, max(0.0, (total - c_time) / total))
        best = cand if best is None or cand[0] < best[0] else best
    llm.close()
    return best


def bench_llama_cpp_python(path, threads: int, n_prompt: int, n_gen: int, reps: int) -> list[Row]:
    """The same tests through llama-cpp-python (must be installed), for an A/B comparison."""
    import llama_cpp  # optional dependency

    llm = llama_cpp.Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads,
                          n_ctx=max(n_prompt, n_gen) + 16, n_batch=max(n_prompt, 8), verbose=False)
    name = f"{path.name}"
    size = path.stat().st_size
    rows = []
    prompt = _random_prompt(llm.n_vocab(), max(n_prompt, 8))
    llm.reset()
    llm.eval(prompt[:8])
    if n_prompt:
        row = Row(name, size, 0, "llama-cpp-python", threads, f"pp{n_prompt}")
        for _ in range(reps):
            llm.reset()
            t = time.perf_counter()
            llm.eval(prompt[:n_prompt])
            row.runs.append(n_prompt / (time.perf_counter() - t))
        rows.append(row)
    row = Row(name, size, 0, "llama-cpp-python", threads, f"tg{n_gen}")
    for _ in range(reps):
        llm.reset()
        llm.eval([1])
        tok = 1
        t = time.perf_counter()
        for _ in range(n_gen):
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        row.runs.append(n_gen / (time.perf_counter() - t))
    rows.append(row)
    return rows


def format_table(rows: list[Row], show_roofline: bool = True) -> str:
    """llama-bench's markdown table, plus bytes/token, GB/s and % of measured bandwidth for tg."""
    head = "| model | size | params | backend | threads | test | t/s |"
    sep = "| --- | ---: | ---: | --- | ---: | ---: | ---: |"
    if show_roofline:
        head += " bytes/token | GB/s | % of bw |"
        sep += " ---: | ---: | ---: |"
    out = [head, sep]
    for r in rows:
        line = (f"| {r.model} | {r.size_bytes / 2**20:.2f} MiB | {r.params / 1e6:.2f} M | {r.backend} | {r.threads} | "
                f"{r.test} | {r.mean:.2f} ± {r.std:.2f} |")
        if show_roofline:
            if r.test.startswith("tg") and r.bytes_per_token:
                pct = f"{100 * r.gbs / r.bandwidth_gbs:.0f}%" if r.bandwidth_gbs else "-"
                line += f" {r.bytes_per_token / 1e6:.1f} MB | {r.gbs:.1f} | {pct} |"
            else:
                line += " | | |"
        out.append(line)
    return "\n".join(out)


def run(model_path, threads: list[int], *, reps: int = 5, n_prompt: int = 64, n_gen: int = 128,
        depths=(0,), bandwidth: bool = False, compare: str | None = None, isa: str | None = None,
        echo=print) -> dict:
    """Everything `pydecode bench` prints; returns the same as a dict (for --json)."""
    from .gguf_file import GGUFFile

    size = GGUFFile(model_path).file_size
    bw = {}
    if bandwidth:
        for t in threads:
            bw[t] = {"model_size": probe_bandwidth(size, t), "1GiB": probe_bandwidth(1 << 30, t, 3)}
            echo(f"read bandwidth, {t} thread(s): {bw[t]['model_size']:.1f} GB/s over {size / 2**20:.0f} MiB "
                 f"(the model's size), {bw[t]['1GiB']:.1f} GB/s over 1 GiB")
    rows: list[Row] = []
    ratios = []
    for t in threads:
        ours = bench_pydecode(model_path, t, n_prompt, n_gen, reps, depths, isa)
        for r in ours:
            r.bandwidth_gbs = bw.get(t, {}).get("model_size", 0.0)
        rows += ours
        if compare == "llama-cpp-python":
            theirs = bench_llama_cpp_python(model_path, t, n_prompt, n_gen, reps)
            rows += theirs
            for a in ours:
                for b in theirs:
                    if a.test == b.test:
                        ratios.append((t, a.test, a.mean / b.mean if b.mean else float("nan")))
    echo(format_table(rows))
    for t, test, ratio in ratios:
        echo(f"pydecode / llama-cpp-python, {t} thread(s), {test}: {ratio:.2f}x")
    ms, share = python_overhead(model_path, threads[-1], n_gen=min(n_gen, 128))
    echo(f"python share of a generate() step ({threads[-1]} thread(s), sampling on): {100 * share:.1f}% "
         f"of {ms:.2f} ms/token")
    return {"rows": [r.to_dict() for r in rows], "bandwidth": bw,
            "ratios": [{"threads": t, "test": s, "ratio": r} for t, s, r in ratios],
            "python_share": share, "ms_per_token": ms}
