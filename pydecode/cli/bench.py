"""`pydecode bench`: llama-bench's table (pp / tg tokens/s), the roofline, a depth sweep, an A/B
against llama-cpp-python, and --concurrency for the batching Engine."""
from __future__ import annotations

import json

import click

from ..errors import PydecodeError
from . import common


@click.command()
@common.model_args
@click.option("-t", "--threads", type=int, multiple=True, help="Thread counts (repeatable; default 1 and all physical cores).")
@click.option("-r", "--reps", default=5, show_default=True, help="Repetitions per test (after a warm-up).")
@click.option("-p", "--n-prompt", default=64, show_default=True, help="Prompt tokens for the pp test (0: skip).")
@click.option("-n", "--n-gen", default=128, show_default=True, help="Tokens for the tg test.")
@click.option("-d", "--depth", type=int, multiple=True, help="Context depths for tg (repeatable; e.g. -d 0 -d 512 -d 2048).")
@click.option("--bandwidth", is_flag=True, help="Probe read bandwidth and show %% of it reached by tg.")
@click.option("--compare", type=click.Choice(["llama-cpp-python"]), default=None,
              help="A/B against llama-cpp-python on the same file (must be installed).")
@click.option("--concurrency", default=None, metavar="C1,C2,...",
              help="Instead of pp/tg: C sequences of N_GEN tokens each at once through the batching Engine, "
                   "for each level (e.g. 1,2,4,8,16): aggregate and per-sequence t/s, ITL, TTFT.")
@click.option("--draft", default=None, metavar="lookup|MODEL",
              help="Instead of pp/tg: decode with this drafter (speculative decoding) against without it, "
                   "on code-completion, rewrite and prose prompts (greedy; same tokens checked).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@common.isa_opt
@common.kv_type_opt
def bench(model, model_arg, threads, reps, n_prompt, n_gen, depth, bandwidth, compare, concurrency, draft, as_json, isa,
          kv_type):
    """Speed of MODEL, llama-bench style: pp / tg tokens/s (mean ± std), roofline, depth sweep;
    --concurrency: many sequences decoded at once."""
    from .. import bench as _bench
    from ..model import MAX_N_SEQ, physical_cores

    try:
        path = common.resolve_model(common.model_name(model, model_arg))
        threads = list(threads) or sorted({1, physical_cores()})
        if reps < 1 or n_gen < 1 or n_prompt < 0 or any(t < 1 for t in threads) or any(x < 0 for x in depth):
            raise click.BadParameter("reps, n-gen and threads must be >= 1; n-prompt and depths >= 0")
        if concurrency is not None:
            try:
                levels = [int(x) for x in concurrency.split(",")]
            except ValueError:
                levels = []
            if not levels or any(not 1 <= c <= MAX_N_SEQ for c in levels):
                raise click.BadParameter(f"a comma-separated list of integers in 1..{MAX_N_SEQ}, got {concurrency!r}",
                                         param_hint="--concurrency")
            rows = [r for t in threads for r in _bench.bench_concurrency(path, t, levels, n_gen, isa=isa, reps=reps)]
            click.echo(json.dumps({"concurrency": rows}) if as_json else _bench.format_concurrency(rows))
            return
        if draft is not None:
            ref = draft if draft == "lookup" else str(common.resolve_model(draft))
            rows = [r for t in threads for r in _bench.bench_draft(path, t, ref, n_gen, reps=reps, isa=isa)]
            click.echo(json.dumps({"draft": rows}) if as_json else _bench.format_draft(rows))
            return
        if compare:
            try:
                import llama_cpp  # noqa: F401
            except ImportError:
                raise click.UsageError("--compare llama-cpp-python needs the llama-cpp-python package installed")
        lines = []
        result = _bench.run(path, threads, reps=reps, n_prompt=n_prompt, n_gen=n_gen, depths=tuple(depth) or (0,),
                            bandwidth=bandwidth, compare=compare, isa=isa, kv_type=kv_type,
                            echo=(lines.append if as_json else click.echo))
    except (PydecodeError, ValueError, OSError) as e:
        common.fail(e)
    if as_json:
        click.echo(json.dumps(result, default=str))
