"""`pydecode bench`: llama-bench style numbers (pp / tg, mean +- std over repetitions after a
warm-up), the roofline (weight + KV bytes per token against a measured read bandwidth), tokens/s
against context depth, the Python share of a generation step, an optional A/B comparison with
llama-cpp-python on the same GGUF in the same process, and (--concurrency) batched decoding of
many sequences through the Engine.
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


class _Ours:
    """pydecode under test: pp (one prefill of the prompt) and tg (greedy decode steps)."""

    def __init__(self, path, threads, n_ctx, isa=None, kv_type="f16"):
        self.m = m = Model(path, n_threads=threads, n_ctx=n_ctx, isa=isa, kv_type=kv_type)
        self.name = m.gguf.metadata.get("general.name", m.path.stem)
        self.size = m.gguf.file_size
        self.params = m.config.n_params(m.gguf)
        self.backend = f"pydecode/{m.isa}" + ("+repack" if m.repacked else "")
        self.n_vocab = m.n_vocab
        m.prefill([1] * 8)                                  # warm-up: page in the weights, start threads
        for i in range(3):
            m.decode_step(1, 8 + i)

    def pp(self, prompt) -> float:
        t = time.perf_counter()
        self.m.prefill(prompt)
        return len(prompt) / (time.perf_counter() - t)

    def tg(self, n_gen, context=()) -> float:
        """n_gen decode steps after `context` (prefilled, untimed; default one token)."""
        context = list(context) or [1]
        self.m.prefill(context)
        tok, pos = context[-1], len(context)
        t = time.perf_counter()
        for i in range(n_gen):
            tok = int(np.argmax(self.m.decode_step(tok, pos + i)))
        return n_gen / (time.perf_counter() - t)

    def close(self):
        self.m.close()


class _LlamaCppPython:
    """The same tests through llama-cpp-python (an optional install), for the A/B comparison."""

    def __init__(self, path, threads, n_ctx, n_batch):
        import llama_cpp  # optional dependency

        self.llm = llama_cpp.Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads,
                                   n_ctx=n_ctx, n_batch=n_batch, verbose=False)
        self.backend = "llama-cpp-python"
        self.n_vocab = self.llm.n_vocab()
        self.llm.reset()
        self.llm.eval([1] * 8)

    def pp(self, prompt) -> float:
        self.llm.reset()
        t = time.perf_counter()
        self.llm.eval(prompt)
        return len(prompt) / (time.perf_counter() - t)

    def _argmax(self) -> int:
        # The last token's logits, read in place (Llama.scores stays empty unless logits_all).
        return int(np.argmax(np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.n_vocab,))))

    def tg(self, n_gen, context=()) -> float:
        llm = self.llm
        llm.reset()
        llm.eval(list(context) or [1])
        tok = self._argmax()
        t = time.perf_counter()
        for _ in range(n_gen):
            llm.eval([tok])
            tok = self._argmax()
        return n_gen / (time.perf_counter() - t)

    def close(self):
        self.llm.close()


def bench_threads(path, threads: int, n_prompt: int, n_gen: int, reps: int, depths=(0,), isa=None,
                  compare: str | None = None, kv_type: str = "f16") -> list[Row]:
    """pp{n_prompt} and tg{n_gen} (at each depth) for one thread count; with compare, the other
    runtime on the same file runs each repetition right after ours (A/B alternating, so that
    machine noise hits both alike)."""
    depth_max = max(depths)
    n_ctx = max(n_prompt, depth_max + n_gen + 1) + 8
    runners = [_Ours(path, threads, n_ctx, isa, kv_type)]
    if compare == "llama-cpp-python":
        runners.append(_LlamaCppPython(path, threads, n_ctx, max(n_prompt, depth_max, 8)))
    ours = runners[0]
    m = ours.m
    prompt = _random_prompt(ours.n_vocab, max(n_prompt, depth_max, 1))
    kv_elem = m.kv_elem_bytes
    tests = [(f"pp{n_prompt}", None, 0)] if n_prompt else []
    for depth in depths:
        # tg reads every weight plus the KV cache: on average depth + n_gen/2 positions per step;
        # a hybrid's recurrent state, whatever the depth, read and written once (ArchConfig.ssm_state_bytes)
        kv = m.config.kv_bytes_per_token(kv_elem) * (depth + n_gen / 2) + 2 * m.config.ssm_state_bytes()
        tests.append((f"tg{n_gen}" + (f" @ d{depth}" if depth else ""), depth, int(m.weight_bytes() + kv)))
    rows = []
    for test, depth, bpt in tests:
        mine = [Row(ours.name, ours.size, ours.params, r.backend, threads, test, bytes_per_token=bpt)
                for r in runners]
        for _ in range(reps):
            for r, row in zip(runners, mine):
                row.runs.append(r.pp(prompt[:n_prompt]) if depth is None else r.tg(n_gen, prompt[:depth]))
        rows += mine
    for r in runners:
        r.close()
    return rows


def python_overhead(path, threads: int, n_gen: int = 128) -> tuple[float, float]:
    """(ms per token of the full generate() loop, share of it spent outside the C step)."""
    from .llm import LLM

    llm = LLM(Model(path, n_threads=threads, n_ctx=n_gen + 64))
    llm.generate([1, 2, 3], max_tokens=8)
    best = None
    for _ in range(3):
        t = time.perf_counter()
        # a natural prompt: the sampler's cost depends on how peaked the distribution is
        out = llm.generate("Once upon a time", max_tokens=n_gen, temperature=0.8, top_p=0.95, seed=1)
        total = time.perf_counter() - t - out.stats.prefill_s
        c_time = out.stats.decode_s
        n = max(1, out.stats.generated_tokens)
        cand = (total / n * 1e3, max(0.0, (total - c_time) / total))
        best = cand if best is None or cand[0] < best[0] else best
    llm.close()
    return best


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
        echo=print, kv_type: str = "f16") -> dict:
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
        got = bench_threads(model_path, t, n_prompt, n_gen, reps, depths, isa, compare, kv_type)
        for r in got:
            r.bandwidth_gbs = bw.get(t, {}).get("model_size", 0.0)
        rows += got
        ours = [r for r in got if r.backend.startswith("pydecode")]
        theirs = {r.test: r for r in got if not r.backend.startswith("pydecode")}
        ratios += [(t, a.test, a.mean / theirs[a.test].mean) for a in ours if a.test in theirs and theirs[a.test].mean]
    echo(format_table(rows))
    for t, test, ratio in ratios:
        echo(f"pydecode / llama-cpp-python, {t} thread(s), {test}: {ratio:.2f}x")
    ms, share = python_overhead(model_path, threads[-1], n_gen=min(n_gen, 128))
    echo(f"python share of a generate() step ({threads[-1]} thread(s), sampling on): {100 * share:.1f}% "
         f"of {ms:.2f} ms/token")
    return {"rows": [r.to_dict() for r in rows], "bandwidth": bw,
            "ratios": [{"threads": t, "test": s, "ratio": r} for t, s, r in ratios],
            "python_share": share, "ms_per_token": ms}


# ---- many sequences at once (`pydecode bench --concurrency 1,2,4,8,16`) ----

_TOPICS = ["the sea", "a small robot", "winter in the mountains", "the history of bread", "a lost key",
           "the moon landing", "an old library", "learning to swim", "a city at night", "the first computer",
           "a garden in spring", "a long train journey", "the northern lights", "a chess game", "honey bees",
           "a lighthouse keeper"]


def _conc_prompt(i: int) -> str:
    return f"Story {i + 1}: a short story about {_TOPICS[i % len(_TOPICS)]}."


def bench_concurrency(path, threads: int, levels, n_gen: int, isa=None, reps: int = 1) -> list[dict]:
    """For each level C: C sequences of n_gen tokens each, from short different prompts, through
    the batching Engine (one model with n_seq = max level), after a warm-up. Every sequence runs
    its full n_gen tokens (end-of-generation tokens are ignored, as llama-bench does), so levels
    compare like for like. With reps > 1 the levels take turns (1, 8, 1, 8, ...: a machine whose
    speed drifts moves all of them alike); a row gives the mean and std of the aggregate t/s over
    the repetitions, and latency percentiles over all of them."""
    from .engine import Engine
    from .model import DEFAULT_N_BATCH

    top = max(levels)
    m = Model(path, n_threads=threads, n_seq=top, n_batch=max(DEFAULT_N_BATCH, top), n_ctx=n_gen + 64, isa=isa)
    wb = m.weight_bytes()
    Engine(m, max_seqs=1).submit(_conc_prompt(0), 4).result()   # warm-up: page in the weights, start threads
    runs = {c: [] for c in levels}
    for _ in range(reps):
        for c in levels:
            eng = Engine(m, max_seqs=c)
            t = time.perf_counter()
            handles = [eng.submit(_conc_prompt(i), n_gen) for i in range(c)]
            for h in handles:
                h._s.policy.eog = frozenset()   # run to n_gen: no sequence ends early (before any step runs)
            runs[c].append(([h.result() for h in handles], time.perf_counter() - t))
    rows = []
    for c in levels:
        outs = [o for os_, _ in runs[c] for o in os_]
        tps = np.array([sum(o.stats.generated_tokens for o in os_) / wall for os_, wall in runs[c]])
        itl = np.array([x for o in outs for x in o.stats.token_latencies_s]) * 1e3
        ttft = np.array([o.stats.ttft_s for o in outs]) * 1e3
        p50, p95, p99 = np.percentile(itl, [50, 95, 99]) if len(itl) else (0.0, 0.0, 0.0)
        rows.append({"threads": threads, "concurrency": c, "reps": reps,
                     "generated_tokens": sum(o.stats.generated_tokens for o in runs[c][0][0]),
                     "wall_s": float(np.mean([w for _, w in runs[c]])),
                     "tokens_per_s": float(tps.mean()), "tokens_per_s_std": float(tps.std()),
                     "tokens_per_s_each": tps.tolist(),
                     "per_seq_tokens_per_s": float(np.mean([o.stats.decode_tokens_per_s for o in outs])),
                     "itl_p50_ms": float(p50), "itl_p95_ms": float(p95), "itl_p99_ms": float(p99),
                     "ttft_p50_ms": float(np.median(ttft)), "ttft_mean_ms": float(ttft.mean()),
                     "weight_bytes_per_token": wb / c, "isa": m.isa, "repacked_bytes": m.repacked_bytes})
    m.close()
    return rows


def format_concurrency(rows: list[dict]) -> str:
    out = ["| threads | concurrency | t/s (all) | t/s (per seq) | ITL p50 ms | ITL p95 ms | ITL p99 ms | "
           "TTFT p50 ms | weight MB / token |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['threads']} | {r['concurrency']} | {r['tokens_per_s']:.1f} ± {r.get('tokens_per_s_std', 0):.1f} | "
                   f"{r['per_seq_tokens_per_s']:.1f} | "
                   f"{r['itl_p50_ms']:.2f} | {r['itl_p95_ms']:.2f} | {r['itl_p99_ms']:.2f} | {r['ttft_p50_ms']:.1f} | "
                   f"{r['weight_bytes_per_token'] / 1e6:.1f} |")
    for t in sorted({r["threads"] for r in rows}):
        mine = sorted((r for r in rows if r["threads"] == t), key=lambda r: r["concurrency"])
        lo = mine[0]
        if len(mine) > 1 and lo["tokens_per_s"] > 0:
            out.append(f"{t} thread(s), aggregate t/s against concurrency {lo['concurrency']}: " + ", ".join(
                f"{r['concurrency']}: {r['tokens_per_s'] / lo['tokens_per_s']:.2f}x (ITL p95 {r['itl_p95_ms']:.2f} ms)"
                for r in mine[1:]) + f"; {lo['reps']} repetition(s), levels in turns")
    if rows:
        rb = rows[0].get("repacked_bytes", 0)
        out.append(f"kernels: {rows[0]['isa']}; " + (f"weights repacked at load: {rb / 1e6:.1f} MB beyond the mapped file"
                                                      if rb else "weights read from the mapped file (no repack)"))
    return "\n".join(out)


# ---------------------------------------------------------------- speculative decoding

# A 30-line file to copy with one change (the "rewrite" prompt).
_CLIENT = '''import json
import urllib.request


class Client:
    """A small JSON-over-HTTP client."""

    def __init__(self, base_url, timeout=30, retries=3):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries

    def get(self, path, params=None):
        url = self.base_url + path
        if params:
            url += "?" + "&".join(f"{k}={v}" for k, v in params.items())
        for attempt in range(self.retries):
            try:
                with urllib.request.urlopen(url, timeout=self.timeout) as r:
                    return json.loads(r.read().decode("utf-8"))
            except OSError:
                if attempt == self.retries - 1:
                    raise

    def post(self, path, body):
        data = json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.base_url + path, data=data,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            return json.loads(r.read().decode("utf-8"))
'''

DRAFT_PROMPTS = {
    # code completion: what a same-vocabulary draft model is for
    "code": "def quicksort(items):\n    \"\"\"Sort a list with quicksort and return the sorted list.\"\"\"\n",
    # output that mostly copies the input: what prompt lookup is for
    "rewrite": ("Rewrite this code with one change: the default timeout becomes 60 instead of 30. "
                "Change nothing else.\n\n" + _CLIENT + "\n\nThe rewritten code:\n\nimport json\n"),
    # open-ended prose: drafts rarely pay; the self-tuning must step aside
    "prose": "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n",
}


def bench_draft(path, threads: int, draft: str, n_gen: int, reps: int = 3, isa=None, prompts=None) -> list[dict]:
    """Decode tokens/s with the drafter against without it, same LLM, same prompts, alternated
    (greedy: the outputs are the same tokens; checked). One row per prompt kind."""
    from .llm import load
    rows = []
    with load(path, n_threads=threads, isa=isa, draft=draft) as llm:
        for kind, prompt in (prompts or DRAFT_PROMPTS).items():
            llm.generate(prompt, 4)                                  # the prompt's prefill, cached
            plain, spec = [], []
            for _ in range(reps):
                a = llm.generate(prompt, n_gen, draft_tokens=0)
                b = llm.generate(prompt, n_gen)
                if a.tokens != b.tokens:
                    raise RuntimeError(f"speculative output differs from plain decoding on the {kind!r} prompt")
                plain.append(a.stats.decode_tokens_per_s)
                spec.append(b)
            best = max(spec, key=lambda c: c.stats.decode_tokens_per_s)
            st = best.stats
            rows.append({"prompt": kind, "threads": threads, "draft": draft, "n_gen": n_gen,
                         "plain_tokens_per_s": max(plain), "draft_tokens_per_s": st.decode_tokens_per_s,
                         "speedup": st.decode_tokens_per_s / max(plain) if max(plain) else 0.0,
                         "acceptance": st.acceptance_rate, "tokens_per_pass": st.tokens_per_pass,
                         "drafted": st.draft_tokens, "accepted": st.accepted_tokens})
    return rows


def format_draft(rows: list[dict]) -> str:
    out = ["| prompt | threads | draft | plain t/s | drafted t/s | speedup | accepted | tokens/pass |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['prompt']} | {r['threads']} | {r['draft']} | {r['plain_tokens_per_s']:.1f} | "
                   f"{r['draft_tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['accepted']}/{r['drafted']} "
                   f"({100 * r['acceptance']:.0f}%) | {r['tokens_per_pass']:.2f} |")
    return "\n".join(out)
