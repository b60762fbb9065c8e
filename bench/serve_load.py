"""Load on an OpenAI-compatible server: N concurrent streaming chat clients, each sending
requests back to back; aggregate tokens/s, time to first token and inter-token latency
percentiles, errors. It starts the servers itself, on the same GGUF file, threads and number of
parallel sequences, and measures them in turns within one run:

    python bench/serve_load.py -m smollm2-135m -t 2 --concurrency 1,4,8,16 \\
        --llama-server /tmp/llamasrv/bin/llama-server --rounds 2

pydecode serve gets --n-seq N and -c CTX (per sequence); llama-server gets --parallel N and
-c N*CTX (its context is shared by its slots), --threads and --threads-batch T. Every request
asks for a fixed number of tokens (ignore_eos, which both servers take), drawn per request from
--max-tokens, so both generate the same work. Sampling: temperature 0.7, top-k 40, top-p 0.95,
a seed per request. TTFT is measured to the first chunk that carries text, ITL between chunks
that carry text, both on the client. Needs httpx (in the test extra: pip install '.[test]').
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

SYSTEM = "You are a helpful assistant. Answer clearly and concisely."
QUESTIONS = [
    "What is the difference between a process and a thread?",
    "Give me three ideas for a birthday party for a ten-year-old.",
    "Explain how a hash map works, with its average and worst-case costs.",
    "Summarize the plot of Romeo and Juliet in a paragraph.",
    "Write a Python function that checks whether a string is a palindrome, and explain it.",
    "Why is the sky blue? Explain it to a curious teenager.",
    "List the planets of the solar system with one fact about each.",
    "How do I make a good cup of coffee with a French press?",
]
DOCUMENT = ("The committee met on Tuesday to review the quarterly budget. Spending on infrastructure rose by "
            "twelve percent, mostly because of the new data centre, while travel costs fell after the switch "
            "to remote meetings. The marketing team asked for a larger share next quarter to launch the "
            "product in two new regions. Several members raised concerns about hiring: three senior roles "
            "have been open for more than four months. The chair proposed a review of salaries against the "
            "market and a referral bonus. The meeting ended with an agreement to revisit the budget in six weeks. ")


def conversation(rng: random.Random) -> list[dict]:
    """A realistic spread of prompts: a short question (most), a document to summarize (some)."""
    if rng.random() < 0.3:
        doc = DOCUMENT * rng.randint(1, 3)
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Summarize these meeting notes in three bullet points:\n\n{doc}"}]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": rng.choice(QUESTIONS)}]


# ---------------------------------------------------------------- servers

class Server:
    def __init__(self, kind: str, cmd: list[str], url: str):
        self.kind, self.url = kind, url
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def wait_ready(self, timeout=300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited: {self.proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.kind} did not become ready")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(kind: str, args, n_par: int) -> Server:
    port = free_port()
    if kind == "pydecode":
        cmd = [sys.executable, "-m", "pydecode", "serve", args.model, "--port", str(port), "-t", str(args.threads),
               "--n-seq", str(n_par), "-c", str(args.ctx)]
    else:
        from pydecode.registry import resolve
        cmd = [args.llama_server, "-m", str(resolve(args.model)), "--port", str(port), "--host", "127.0.0.1",
               "-t", str(args.threads), "-tb", str(args.threads), "-np", str(n_par), "-c", str(args.ctx * n_par),
               "--no-webui"]
    return Server(kind, cmd, f"http://127.0.0.1:{port}").wait_ready()


# ---------------------------------------------------------------- clients

async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    t0 = time.perf_counter()
    ttft, last, gaps, chunks, usage = None, None, [], 0, None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return {"error": f"{r.status_code}: {r.text[:200]}"}
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                d = json.loads(line[6:])
                if d.get("usage"):
                    usage = d["usage"]
                if "error" in d:
                    return {"error": str(d["error"])[:200]}
                ch = d.get("choices") or []
                if ch and (ch[0].get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - t0
                    else:
                        gaps.append(now - last)
                    last, chunks = now, chunks + 1
    except httpx.HTTPError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    tokens = usage["completion_tokens"] if usage and usage.get("completion_tokens") else chunks
    return {"ttft": ttft, "gaps": gaps, "tokens": tokens, "end": time.perf_counter()}


async def level(url: str, model: str, n_clients: int, per_client: int, max_tokens: tuple[int, int],
                seed: int) -> dict:
    rng = random.Random(seed)
    plans = [[(conversation(rng), rng.randint(*max_tokens), rng.randrange(2**31)) for _ in range(per_client)]
             for _ in range(n_clients)]
    limits = httpx.Limits(max_connections=n_clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def run(plan):
            out = []
            for msgs, n, s in plan:
                body = {"model": model, "messages": msgs, "max_tokens": n, "stream": True, "temperature": 0.7,
                        "top_k": 40, "top_p": 0.95, "seed": s, "ignore_eos": True,
                        "stream_options": {"include_usage": True}}
                out.append(await one_request(client, url, body))
            return out

        t0 = time.perf_counter()
        results = [r for rs in await asyncio.gather(*(run(p) for p in plans)) for r in rs]
        wall = time.perf_counter() - t0
    ok = [r for r in results if "error" not in r]
    ttfts = sorted(r["ttft"] for r in ok if r["ttft"] is not None)
    gaps = sorted(g for r in ok for g in r["gaps"])
    return {"clients": n_clients, "requests": len(results), "errors": len(results) - len(ok),
            "error_sample": next((r["error"] for r in results if "error" in r), None),
            "tokens": sum(r["tokens"] for r in ok), "wall_s": wall,
            "tok_s": sum(r["tokens"] for r in ok) / wall,
            "ttft": {p: pct(ttfts, p) for p in (50, 95, 99)}, "itl": {p: pct(gaps, p) for p in (50, 95, 99)}}


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))]


# ---------------------------------------------------------------- the run

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=2, help="requests each client sends, back to back")
    ap.add_argument("--max-tokens", default="96,160", help="MIN,MAX tokens per request (uniform)")
    ap.add_argument("-c", "--ctx", type=int, default=1024, help="context per sequence")
    ap.add_argument("--llama-server", default=None, help="a llama-server binary to measure side by side")
    ap.add_argument("--rounds", type=int, default=1, help="turns of every server, interleaved")
    ap.add_argument("--json", default=None, help="write every measurement here")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    lo, hi = (int(x) for x in args.max_tokens.split(","))
    kinds = ["pydecode"] + (["llama.cpp"] if args.llama_server else [])
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?") if Path("/proc/cpuinfo").exists() else "?"
    print(f"# serve_load: {args.model}, {args.threads} threads, {os.cpu_count()} CPUs ({cpu}), "
          f"parallel {max(levels)}, {args.requests} requests per client, {lo}-{hi} tokens each", flush=True)
    runs = {k: {n: [] for n in levels} for k in kinds}
    for rnd in range(args.rounds):
        for kind in kinds:
            srv = start(kind, args, max(levels))
            try:
                asyncio.run(level(srv.url, args.model, 1, 1, (8, 8), 0))   # warm-up
                for n in levels:
                    r = asyncio.run(level(srv.url, args.model, n, args.requests, (lo, hi), seed=1000 * n + rnd))
                    runs[kind][n].append(r)
                    print(f"round {rnd + 1} {kind:9s} c={n:<3d} {r['tok_s']:8.1f} tok/s  ttft p50/p95 "
                          f"{r['ttft'][50] * 1e3:7.1f}/{r['ttft'][95] * 1e3:7.1f} ms  itl p50/p95/p99 "
                          f"{r['itl'][50] * 1e3:6.1f}/{r['itl'][95] * 1e3:6.1f}/{r['itl'][99] * 1e3:6.1f} ms  "
                          f"errors {r['errors']}" + (f" ({r['error_sample']})" if r['errors'] else ""), flush=True)
            finally:
                srv.stop()

    def best(kind, n):   # the round with the highest throughput; its latencies with it
        return max(runs[kind][n], key=lambda r: r["tok_s"])

    print("\n| server | clients | tok/s | TTFT p50 / p95 / p99 ms | ITL p50 / p95 / p99 ms | errors |")
    print("|---|---|---|---|---|---|")
    for kind in kinds:
        for n in levels:
            r = best(kind, n)
            print(f"| {kind} | {n} | {r['tok_s']:.1f} | {r['ttft'][50] * 1e3:.0f} / {r['ttft'][95] * 1e3:.0f} / "
                  f"{r['ttft'][99] * 1e3:.0f} | {r['itl'][50] * 1e3:.1f} / {r['itl'][95] * 1e3:.1f} / "
                  f"{r['itl'][99] * 1e3:.1f} | {sum(x['errors'] for x in runs[kind][n])} |")
    one = best("pydecode", levels[0])["tok_s"]
    print("\npydecode scaling: " + ", ".join(f"c={n}: {best('pydecode', n)['tok_s'] / one:.2f}x" for n in levels))
    if "llama.cpp" in kinds:
        print("pydecode / llama.cpp: " + ", ".join(
            f"c={n}: tok/s {best('pydecode', n)['tok_s'] / best('llama.cpp', n)['tok_s']:.2f}x, "
            f"TTFT p95 {best('pydecode', n)['ttft'][95] / best('llama.cpp', n)['ttft'][95]:.2f}x" for n in levels))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "cpu": cpu, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
