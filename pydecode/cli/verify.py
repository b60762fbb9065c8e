"""`pydecode verify`: the KV cache checked against recomputing the whole prefix, step by step."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict

import click

from ..errors import PydecodeError
from . import common


@click.command()
@common.model_args
@click.option("-p", "--prompt", required=True, help="Prompt text.")
@click.option("-n", "--max-tokens", "--n-predict", "n", type=click.IntRange(min=1), default=8, show_default=True,
              help="New tokens to decode (greedy).")
@click.option("--tol", type=click.FloatRange(min=0), default=None,
              help="Max |logit difference| allowed (default: the cache tests' bound, 2e-3).")
@click.option("--kv-type", type=click.Choice(["f16", "f32", "q8_0"]), default="f16", show_default=True, help="KV cache type.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@common.threads_opt
@common.ctx_opt
@common.isa_opt
def verify(model, model_arg, prompt, n, tol, kv_type, as_json, threads, n_ctx, isa):
    """Check the KV cache: decode with it and, side by side, by recomputing the whole prefix at
    every step (a second model on the same file). Prints per step the max |logit difference|,
    whether the chosen tokens agree, the positions whose K/V each path computed, the time of
    each, and the KV bytes in use. Exit status 1 if the two paths disagree."""
    from .. import verify as _verify

    printed = [0, 0]
    progress = common.PrefillProgress(enabled=False if as_json else None)

    def on_step(step):
        progress.close()
        if as_json:
            return
        if step.index == 1:
            click.echo(_verify.HEADER)
        printed[0] += step.positions_cached
        printed[1] += step.positions_recompute
        click.echo(_verify.step_line(step, printed[0], printed[1]))

    try:
        path = common.resolve_model(common.model_name(model, model_arg))
        v = _verify.verify(path, prompt, n, n_threads=threads, n_ctx=n_ctx, isa=isa, kv_type=kv_type,
                           tolerance=_verify.TOLERANCE if tol is None else tol, on_step=on_step,
                           on_prefill=progress)
    except (PydecodeError, ValueError, OSError) as e:
        common.fail(e)
    finally:
        progress.close()
    if as_json:
        click.echo(json.dumps({
            "model": str(path), "prompt_tokens": v.prompt_tokens, "tokens": v.tokens, "ok": v.ok,
            "tolerance": v.tolerance, "max_abs_diff": v.max_abs_diff, "positions_cached": v.positions_cached,
            "positions_recompute": v.positions_recompute, "cached_s": v.cached_s, "recompute_s": v.recompute_s,
            "kv_bytes_in_use": v.steps[-1].kv_bytes_in_use, "kv_bytes_allocated": v.kv_bytes_allocated,
            "n_ctx": v.n_ctx, "steps": [asdict(s) for s in v.steps]}))
    else:
        for line in _verify.summary_lines(v):
            click.echo(line)
    sys.exit(0 if v.ok else 1)
