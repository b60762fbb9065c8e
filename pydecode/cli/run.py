"""`pydecode run`: stream the continuation of a prompt to stdout (greedy unless told otherwise)."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict

import click

from ..errors import PydecodeError
from ..sampling import SamplingParams
from . import common

RUN_DEFAULTS = {f.name: f.default for f in SamplingParams.__dataclass_fields__.values()}   # greedy


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def stats_dict(c) -> dict:
    s = c.stats
    d = asdict(s)
    d.update(decode_s=s.decode_s, decode_tokens_per_s=s.decode_tokens_per_s,
             prefill_tokens_per_s=s.prefill_tokens_per_s, acceptance_rate=s.acceptance_rate,
             tokens_per_pass=s.tokens_per_pass)
    return d


@click.command()
@common.model_args
@click.argument("prompt_arg", metavar="[PROMPT]", required=False)
@click.option("-p", "--prompt", default=None, help="Prompt text (or the second argument).")
@click.option("-n", "--max-tokens", "--n-predict", "max_tokens", type=click.IntRange(min=1), default=128,
              show_default=True, help="Tokens to generate.")
@common.sampling_options
@common.structure_options
@click.option("--stop", multiple=True, help="Stop at this text (not printed). Repeatable.")
@click.option("--context-shift/--no-context-shift", default=False, show_default=True,
              help="When the context is full, drop the older half of it (after --keep tokens) and go on "
                   "(llama-cli's --context-shift) instead of ending.")
@click.option("--keep", type=click.IntRange(min=-1), default=0, show_default=True,
              help="Tokens at the start a context shift keeps (-1: the whole prompt).")
@click.option("--chat", "as_chat", is_flag=True,
              help="Wrap the prompt in the model's chat template, as a user message.")
@click.option("-s", "--system", default=None, help="System prompt (implies --chat).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (text, tokens, finish_reason, stop_detail, stats) and nothing else.")
@common.runtime_options
@click.option("--stats/--no-stats", default=True, show_default=True, help="Print timing to stderr.")
def run(model, model_arg, prompt_arg, prompt, max_tokens, stop, context_shift, keep, as_chat, system, as_json,
        threads, n_ctx, isa, draft, kv_type, prompt_cache, stats, **kw):
    """Stream the continuation of PROMPT to stdout: `pydecode run [MODEL] PROMPT` or -p PROMPT.

    Greedy by default (the same text every run); --temp and the other sampler flags sample."""
    name = common.model_name(model, model_arg)
    if prompt is not None and prompt_arg is not None:
        raise click.UsageError("give the prompt once: as the second argument or with -p")
    prompt = prompt if prompt is not None else prompt_arg
    if prompt is None:
        raise click.UsageError("no prompt: pydecode run [MODEL] PROMPT, or -p PROMPT")
    sampling = common.resolve_sampling(kw, RUN_DEFAULTS)
    progress = common.PrefillProgress(enabled=None if not as_json else False)
    try:
        path = common.resolve_model(name)
        llm = common.load_llm(path, n_ctx, threads, isa, draft=draft, kv_type=kv_type)
        common.restore_prompt_cache(llm, prompt_cache)
        sampling.update(common.resolve_structure(kw, llm))
        if context_shift:
            sampling.update(context_shift=True, n_keep=keep)
        if as_chat or system is not None:
            messages = ([{"role": "system", "content": system}] if system is not None else []) + \
                       [{"role": "user", "content": prompt}]
            stream = llm.stream_chat(messages, max_tokens, stop=list(stop) or None, on_prefill=progress, **sampling)
        else:
            stream = llm.stream(prompt, max_tokens, stop=list(stop) or None, on_prefill=progress, **sampling)
        c = common.consume(stream, None if as_json else common.stdout_write)
        common.save_prompt_cache(llm, prompt_cache)
    except (PydecodeError, ValueError, OSError) as e:
        common.fail(e)
    finally:
        progress.close()
    if as_json:
        out = {"model": llm.model.path.name, "text": c.text, "tokens": list(c.tokens),
               "finish_reason": c.finish_reason, "stop_detail": c.stop_detail,
               **({"complete": c.complete} if c.complete is not None else {}),
               "stats": stats_dict(c), "threads": llm.model.n_threads, "isa": llm.model.isa}
        common.stdout_write(json.dumps(out, ensure_ascii=False) + "\n")
    else:
        common.stdout_write("\n")
        if stats:
            s = c.stats
            finish = "[stopped]" if c.finish_reason == "cancelled" else \
                c.finish_reason + (f" ({c.stop_detail})" if c.stop_detail else "")
            click.echo(f"[{s.prompt_tokens} prompt tokens: {_ms(s.prefill_s)} ({s.prefill_tokens_per_s:.1f} t/s) | "
                       f"{s.generated_tokens} generated: {s.decode_tokens_per_s:.1f} t/s | ttft {_ms(s.ttft_s)} | "
                       + (f"drafts {s.accepted_tokens}/{s.draft_tokens} accepted, {s.tokens_per_pass:.2f} tokens/pass | "
                          if s.draft_tokens else "") +
                       (f"context shifts dropped {s.shifted} tokens | " if s.shifted else "") +
                       f"{llm.model.n_threads} threads, {llm.model.isa} | finish: {finish}]", err=True)
    sys.exit(130 if c.finish_reason == "cancelled" else 0)     # 130: stopped by Ctrl-C
