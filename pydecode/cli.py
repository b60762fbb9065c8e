"""The command line: parse, call the API, print. `pydecode --help` lists the commands."""
from __future__ import annotations

import sys
from collections import Counter

import click

from . import registry
from .errors import PydecodeError

DEFAULT_MODEL = "smollm2-135m"


def _load(model: str, n_ctx, threads, isa):
    from .llm import load

    return load(model, n_ctx=n_ctx, n_threads=threads, isa=isa)


def _fail(e: Exception):
    click.echo(f"error: {e}", err=True)
    sys.exit(1)


@click.group()
@click.version_option(package_name="pydecode")
def main():
    """pydecode: run GGUF language models fast on a CPU."""


_model_opt = click.option("-m", "--model", default=DEFAULT_MODEL, show_default=True,
                          help="Registry name (fetched on first use) or path to a .gguf file.")
_threads_opt = click.option("-t", "--threads", type=int, default=None, help="Threads (default: physical cores).")
_ctx_opt = click.option("-c", "--ctx", "n_ctx", type=int, default=None, help="Context size in tokens.")
_isa_opt = click.option("--isa", default=None, help="Force kernels: scalar, avx2 (default: best for this CPU, or $PYDECODE_ISA).")


@main.command()
@_model_opt
@click.option("-p", "--prompt", required=True, help="Prompt text.")
@click.option("-n", "--max-tokens", default=128, show_default=True, help="Tokens to generate.")
@click.option("--temp", "temperature", default=0.0, show_default=True, help="Sampling temperature (0 = greedy).")
@click.option("--top-k", default=0, show_default=True)
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--min-p", default=0.0, show_default=True)
@click.option("--seed", type=int, default=None)
@_threads_opt
@_ctx_opt
@_isa_opt
@click.option("--stats/--no-stats", default=True, show_default=True, help="Print timing to stderr.")
def run(model, prompt, max_tokens, temperature, top_k, top_p, min_p, seed, threads, n_ctx, isa, stats):
    """Stream the continuation of PROMPT to stdout."""
    try:
        llm = _load(model, n_ctx, threads, isa)
        gen = llm.stream(prompt, max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         min_p=min_p, seed=seed)
        try:
            for piece in gen:
                sys.stdout.write(piece.text)
                sys.stdout.flush()
        except KeyboardInterrupt:
            pass
        sys.stdout.write("\n")
        c = llm._last.completion if llm._last else None
        if stats and c is not None:
            s = c.stats
            click.echo(f"[{s.prompt_tokens} prompt tokens: {s.prefill_s * 1000:.1f} ms "
                       f"({s.prefill_tokens_per_s:.1f} t/s) | {s.generated_tokens} generated: "
                       f"{s.decode_tokens_per_s:.1f} t/s | ttft {s.ttft_s * 1000:.1f} ms | "
                       f"{llm.model.n_threads} threads, {llm.model.isa} | finish: {c.finish_reason}]", err=True)
    except (PydecodeError, ValueError, OSError) as e:
        _fail(e)


@main.command()
@_model_opt
@click.option("-p", "--prompt", default=None, help="Ask one question and exit (default: interactive).")
@click.option("-s", "--system", default=None, help="System prompt.")
@click.option("-n", "--max-tokens", default=512, show_default=True, help="Max tokens per reply.")
@click.option("--temp", "temperature", default=0.0, show_default=True, help="Sampling temperature (0 = greedy).")
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--seed", type=int, default=None)
@_threads_opt
@_ctx_opt
@_isa_opt
def chat(model, prompt, system, max_tokens, temperature, top_p, seed, threads, n_ctx, isa):
    """Chat with MODEL in the terminal (Ctrl-D or /exit to quit, Ctrl-C stops a reply)."""
    try:
        llm = _load(model, n_ctx, threads, isa)
    except (PydecodeError, ValueError, OSError) as e:
        _fail(e)
    history = [{"role": "system", "content": system}] if system else []
    interactive = prompt is None
    if interactive:
        click.echo(f"pydecode chat: {llm.model.path.name} ({llm.model.n_threads} threads, {llm.model.isa}). "
                   "Ctrl-D or /exit to quit.", err=True)
    while True:
        if interactive:
            try:
                user = input("> ")
            except EOFError:
                click.echo("", err=True)
                break
            if user.strip() in ("/exit", "/quit"):
                break
            if not user.strip():
                continue
        else:
            user = prompt
        history.append({"role": "user", "content": user})
        # Keep the conversation inside the context: drop the oldest turns (never the system prompt).
        while len(llm.tokenize(llm.chat_prompt(history))) + max_tokens > llm.n_ctx and len(history) > 1 + bool(system):
            del history[int(bool(system))]
            click.echo("[context full: dropped the oldest turn]", err=True)
        reply = []
        try:
            for piece in llm.stream_chat(history, max_tokens, temperature=temperature, top_p=top_p, seed=seed):
                reply.append(piece.text)
                sys.stdout.write(piece.text)
                sys.stdout.flush()
        except KeyboardInterrupt:
            click.echo(" [stopped]", err=True)
        except (PydecodeError, ValueError) as e:
            _fail(e)
        sys.stdout.write("\n")
        history.append({"role": "assistant", "content": "".join(reply)})
        c = llm._last.completion if llm._last else None
        if c is not None:
            s = c.stats
            click.echo(f"[{s.generated_tokens} tokens, {s.decode_tokens_per_s:.1f} t/s, "
                       f"prefilled {s.prompt_tokens - s.cached_tokens} new of {s.prompt_tokens} prompt tokens]", err=True)
        if not interactive:
            break


@main.command()
@click.argument("model", default=DEFAULT_MODEL)
def info(model):
    """Architecture, size, quant mix, context and KV bytes of MODEL."""
    from .config import arch_config
    from .gguf_file import GGUFFile

    try:
        path = registry.resolve(model)
        g = GGUFFile(path)
        c = arch_config(g)
    except (PydecodeError, ValueError, OSError) as e:
        _fail(e)
    n_params = sum(t.n_elements for t in g.tensors.values())
    mix = Counter()
    by_bytes = Counter()
    for t in g.tensors.values():
        mix[t.type_name] += 1
        by_bytes[t.type_name] += t.n_bytes
    weight = sum(t.n_bytes for t in g.tensors.values())
    emb = g.tensors["token_embd.weight"].n_bytes
    per_token = weight - emb + (emb if c.tied_output else 0)
    kv = c.kv_bytes_per_token(2)
    click.echo(f"file            {path} ({g.file_size / 1e6:.1f} MB)")
    click.echo(f"name            {g.metadata.get('general.name', '?')}")
    click.echo(f"architecture    {c.arch}: {c.n_layer} layers, d_model {c.n_embd}, {c.n_head} heads "
               f"({c.n_head_kv} kv), head_dim {c.head_dim}, ffn {c.n_ff}, vocab {c.n_vocab}")
    click.echo(f"parameters      {n_params / 1e6:.1f} M")
    click.echo(f"context         {c.n_ctx_train} tokens (trained); rope base {c.rope_base:g}, dims {c.rope_dim}")
    click.echo(f"output head     {'tied to token_embd' if c.tied_output else 'output.weight'}")
    click.echo("quant mix       " + ", ".join(f"{k}: {mix[k]} tensors, {by_bytes[k] / 1e6:.1f} MB"
                                             for k in sorted(mix, key=lambda k: -by_bytes[k])))
    click.echo(f"weights/token   {per_token / 1e6:.1f} MB read per decoded token")
    click.echo(f"KV cache        {kv} bytes per token (F16), {kv * c.n_ctx_train / 1e6:.1f} MB at full context")
    click.echo(f"tokenizer       {g.metadata.get('tokenizer.ggml.model')} / {g.metadata.get('tokenizer.ggml.pre', '-')}")


@main.command()
@click.argument("name")
@click.option("--force", is_flag=True, help="Download again even if cached.")
def pull(name, force):
    """Download a registry model into the cache."""
    try:
        path = registry.pull(name, force=force)
    except (PydecodeError, ValueError, OSError) as e:
        _fail(e)
    click.echo(str(path))


@main.command("list")
def list_models():
    """Models in the registry (and whether they are downloaded)."""
    for m in registry.list_models():
        mark = "downloaded" if m["cached"] else "not downloaded"
        click.echo(f"{m['name']:22s} {m['size'] / 1e6:8.1f} MB  {m['arch']:8s} {m['quant']:8s} [{mark}]  {m['description']}")


if __name__ == "__main__":
    main()
