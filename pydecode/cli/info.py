"""`pydecode info`: what a model file holds and what loading it does on this CPU."""
from __future__ import annotations

from collections import Counter

import click

from ..errors import PydecodeError
from ..slots import DEFAULT_CHECKPOINTS
from . import common


@click.command()
@common.model_args
def info(model, model_arg):
    """Architecture, size, quant mix, context and KV bytes of MODEL."""
    from ..config import arch_config
    from ..gguf_file import GGUFFile

    try:
        path = common.resolve_model(common.model_name(model, model_arg))
        g = GGUFFile(path)
        c = arch_config(g)
    except (PydecodeError, ValueError, OSError) as e:
        common.fail(e)
    n_params = c.n_params(g)
    mix = Counter()
    by_bytes = Counter()
    for t in g.tensors.values():
        mix[t.type_name] += 1
        by_bytes[t.type_name] += t.n_bytes
    per_token = c.weight_bytes_per_token(g)
    kv = c.kv_bytes_per_token(2)
    click.echo(f"file            {path} ({g.file_size / 1e6:.1f} MB)")
    click.echo(f"name            {g.metadata.get('general.name', '?')}")
    click.echo(f"architecture    {c.arch}: {c.n_layer} layers, d_model {c.n_embd}, {c.n_head} heads "
               f"({c.n_head_kv} kv), head_dim {c.head_dim}, ffn {c.n_ff}, vocab {c.n_vocab}")
    if c.n_expert:
        click.echo(f"experts         {c.n_expert} per layer, {c.n_expert_used} per token, ffn {c.n_ff_exp}; "
                   f"gating {c.expert_gating}{', renormalized' if c.expert_norm else ''}"
                   f"{f', x {c.expert_scale:g}' if c.expert_scale else ''}")
    click.echo(f"parameters      {n_params / 1e6:.1f} M")
    click.echo(f"context         {c.n_ctx_train} tokens (trained); rope base {c.rope_base:g}, dims {c.rope_dim}")
    click.echo(f"output head     {'tied to token_embd' if c.tied_output else 'output.weight'}")
    click.echo("quant mix       " + ", ".join(f"{k}: {mix[k]} tensors, {by_bytes[k] / 1e6:.1f} MB"
                                             for k in sorted(mix, key=lambda k: -by_bytes[k])))
    total = c.weight_bytes_per_token(g, active=False)
    click.echo(f"weights/token   {per_token / 1e6:.1f} MB read per decoded token" + (
        f" ({c.n_expert_used} of {c.n_expert} experts; {total / 1e6:.1f} MB with all of them)" if c.n_expert else ""))
    full = c.kv_bytes(c.n_ctx_train)   # sliding-window layers hold at most their window
    click.echo(f"KV cache        {kv} bytes per token (F16), {full / 1e6:.1f} MB at full context"
               + (f" (sliding-window layers keep {c.sliding_window} positions)" if c.sliding_window else ""))
    if c.recurrent:   # a hybrid (pydecode/hybrid.py): most layers keep a fixed state, not a cache
        click.echo(f"recurrent       {sum(c.recurrent)} of {c.n_layer} layers gated delta nets ({c.ssm_n_k} key / "
                   f"{c.ssm_n_v} value heads of {c.ssm_d_state}, conv {c.ssm_d_conv}): their state "
                   f"{c.ssm_state_bytes() / 1e6:.1f} MB per sequence (F32), whatever its length; "
                   f"the KV cache above is the {c.n_attn_layers} attention layers'"
                   + (f"; {c.n_mtp} multi-token-prediction layer(s) skipped, as llama.cpp does" if c.n_mtp else "")
                   + f"; prefix reuse keeps up to {DEFAULT_CHECKPOINTS} checkpoints of it per slot "
                     f"({DEFAULT_CHECKPOINTS * c.ssm_state_bytes() / 1e6:.1f} MB; serve --ctx-checkpoints)")
    click.echo(f"tokenizer       {g.metadata.get('tokenizer.ggml.model')} / {g.metadata.get('tokenizer.ggml.pre', '-')}")
    try:   # what loading does on this CPU: which kernels, which weights it repacks (a small context)
        from ..model import Model
        with Model(path, n_ctx=16) as m:
            kinds = Counter(t for _, t, _ in m.repacked)
            click.echo(f"on this CPU     {m.isa} kernels; " + (
                f"{len(m.repacked)} tensors repacked at load ({', '.join(f'{k}: {v}' for k, v in kinds.items())}), "
                f"{m.repacked_bytes / 1e6:.1f} MB beyond the mapped file (PYDECODE_REPACK=0: none)"
                if m.repacked else "weights read in the file's layout (zero-copy)"))
            if m.layouts:
                click.echo("layouts         " + ", ".join(
                    f"{k}: {'16-row repack' if v == 'repacked' else 'file layout'}" for k, v in m.layouts.items())
                    + " (measured on this CPU once, ~/.cache/pydecode/variants.json)")
            click.echo(f"threads         {m.n_threads} (physical cores); a one-token decode step uses "
                       f"{m.decode_threads} (measured once per CPU and model shape; -t N sets both)")
    except (PydecodeError, ValueError, OSError) as e:
        click.echo(f"on this CPU     cannot load: {e}")
