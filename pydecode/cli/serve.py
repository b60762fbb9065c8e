"""`pydecode serve`: an OpenAI-, Anthropic- and llama-server-compatible HTTP server
(pydecode/server/). Flags have llama-server's names and meanings where they fit a CPU runtime;
those it has no use for (GPU layers, batch sizes) are accepted with a notice."""
from __future__ import annotations

import os
import sys

import click

from . import common

# llama-server flags that change nothing on a CPU runtime with continuous batching and a
# memory-mapped model: (names, takes a value).
NO_EFFECT = [
    (("-ngl", "--n-gpu-layers", "--gpu-layers"), True), (("-ub", "--ubatch-size"), True), (("-fa", "--flash-attn"), True), (("-sm", "--split-mode"), True),
    (("-ts", "--tensor-split"), True), (("-mg", "--main-gpu"), True), (("-dev", "--device"), True),
    (("--cache-ram", "-cram"), True), (("--threads-batch", "-tb"), True), (("--numa",), True),
    (("-cb", "--cont-batching"), False), (("-nocb", "--no-cont-batching"), False), (("--kv-unified", "-kvu"), False),
    (("--swa-full",), False), (("--no-ui",), False), (("--offline",), False), (("--mlock",), False),
    (("--no-mmap",), False), (("--mmap",), False), (("--no-cache-idle-slots",), False), (("--no-warmup",), False),
    (("--jinja",), False), (("--no-jinja",), False), (("--no-webui",), False), (("--no-mmproj",), False),
]
# llama-server features pydecode does not have (reranking, images, MCP tools, a model router):
# the flag is accepted so that a script's command line starts, and the server says what is not
# served; a request that needs the feature gets a clear error.
UNAVAILABLE = [
    (("--reranking", "--rerank"), False), (("--media-path",), True), (("-mmu", "--mmproj-url"), True),
    (("-mm", "--mmproj"), True), (("--tools",), True), (("--tools-runtime",), True), (("--ui-mcp-proxy",), False),
    (("--mcp-servers-config",), True), (("--mcp-servers-json",), True), (("--models-dir",), True),
    (("--models-max",), True), (("--models-preset",), True), (("--no-models-autoload",), False),
    (("--backend_sampling", "--backend-sampling"), False), (("--spec-type",), True), (("--spec-draft-n-max",), True),
    (("--spec-draft-n-min",), True), (("--spec-synth-len",), True), (("--spec-synth-rates",), True),
]
CACHE_TYPES = {"f16": "f16", "f32": "f32", "q8_0": "q8_0", "bf16": "f16"}


def _no_effect_options(f):
    for names, takes in reversed(NO_EFFECT + UNAVAILABLE):
        kind = "ignored_" if (names, takes) in NO_EFFECT else "absent_"
        dest = kind + names[-1].lstrip("-").replace("-", "_")
        if takes:
            f = click.option(*names, dest, default=None, hidden=True, expose_value=True)(f)
        else:
            f = click.option(*names, dest, is_flag=True, default=False, hidden=True)(f)
    return f


@click.command(context_settings={"show_default": True})
@common.model_args
@click.option("--host", default="127.0.0.1",
              help="Address(es) to listen on, comma-separated (loopback: only this machine; 0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, help="Port (0: any free one, printed at start).")
@click.option("--n-seq", "--parallel", "-np", "n_seq", type=click.IntRange(1, 256), default=4,
              help="Sequences decoded together (a KV cache slot of -c tokens each); more requests wait.")
@click.option("-c", "--ctx", "--ctx-size", "n_ctx", type=click.IntRange(min=0), default=None,
              help="Each sequence's context in tokens (note: llama-server's -c is the total over its slots). "
                   "Default: min(4096, the model's trained context).")
@common.threads_opt
@common.isa_opt
@common.draft_opt
@click.option("-md", "--model-draft", "model_draft", default=None, hidden=True, help="Same as --draft MODEL.")
@common.kv_type_opt
@click.option("-ctk", "--cache-type-k", "cache_type_k", default=None, hidden=True)
@click.option("-ctv", "--cache-type-v", "cache_type_v", default=None, hidden=True)
@common.sampling_options
@click.option("-n", "--n-predict", "n_predict", type=int, default=-1,
              help="Tokens a request generates when it names no limit (-1: until the context is full).")
@click.option("--api-key", default=None, envvar="PYDECODE_API_KEY", show_envvar=True,
              help="Require 'Authorization: Bearer KEY' (or 'X-Api-Key: KEY') on every route but /health. "
                   "Comma-separated for several keys.")
@click.option("--api-key-file", default=None, type=click.Path(dir_okay=False), help="Keys, one per line.")
@click.option("--alias", "aliases", multiple=True,
              help="The served model's name(s), comma-separated or repeated; /models lists the first in sort "
                   "order as its id (as llama-server).")
@click.option("--tags", default=None, help="Comma-separated tags listed in /models.")
@click.option("--strict-model", is_flag=True,
              help="404 for a request naming another model (default: any name is this model, as llama-server).")
@click.option("--chat-template", default=None, metavar="NAME|JINJA",
              help="Replace the model's chat template: a built-in name (chatml, llama3, mistral-v7, gemma, "
                   "command-r, ...) or jinja text.")
@click.option("--chat-template-file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Replace the model's chat template with this jinja file.")
@click.option("--reasoning-format", type=click.Choice(["auto", "deepseek", "deepseek-legacy", "none"]), default="auto",
              help="Reasoning models: auto/deepseek split the reasoning into reasoning_content; none leaves it in "
                   "the content.")
@click.option("--reasoning", "-rea", type=click.Choice(["on", "off", "auto"]), default="auto",
              help="Whether a reasoning model thinks (the template's enable_thinking), unless a request says.")
@click.option("--metrics", is_flag=True, help="Serve Prometheus metrics at /metrics (else 501).")
@click.option("--slots/--no-slots", default=True, help="Serve the slots' state at GET /slots.")
@click.option("--slot-save-path", default=None, type=click.Path(file_okay=False),
              help="Folder for POST /slots/N?action=save|restore (the files are pydecode state files).")
@click.option("--context-shift/--no-context-shift", default=False,
              help="When a sequence fills its context, drop the older half of its history (after the first "
                   "--keep tokens) and go on, instead of ending it (finish_reason length).")
@click.option("--keep", type=int, default=0, help="Tokens at the start a context shift keeps (-1: the whole prompt).")
@click.option("--ctx-checkpoints", "-ctxcp", "ctx_checkpoints", type=click.IntRange(0, 64), default=None,
              help="Hybrid models (Qwen3.5): copies of a slot's recurrent state kept near each prompt's end, "
                   "so a prompt that parts from the slot's history there reuses it (default 4 per slot; 0: none).")
@click.option("--embedding", "--embeddings", "embedding", is_flag=True,
              help="Serve embeddings: /v1/embeddings (OpenAI's shape) and /embedding, /embeddings (llama-server's).")
@click.option("--pooling", type=click.Choice(["none", "mean", "cls", "last", "rank"]), default=None,
              help="Embedding pooling (default: the GGUF's pooling_type; none when it has none, which "
                   "/v1/embeddings refuses). rank (reranking) is not supported.")
@click.option("--sleep-idle-seconds", type=float, default=None,
              help="After this long without requests, free the model's memory (the next request reloads it).")
@click.option("--max-queue", type=click.IntRange(min=0), default=256, help="Requests that may wait for a slot; beyond them, 429.")
@click.option("--max-body", type=click.IntRange(min=1024), default=8 << 20, help="Largest request body in bytes; beyond it, 413.")
@click.option("--timeout", "-to", "read_timeout", type=click.FloatRange(min=0.01), default=60,
              help="Seconds a client has to send its request headers, and then each part of its body; beyond, 408.")
@click.option("--cors", "--cors-origins", "cors", multiple=True, metavar="ORIGINS",
              help="Web pages that may call the API from a browser: origins, comma-separated ('*' any; 'localhost' "
                   "any page of this machine). Default: any with --api-key, else localhost pages.")
@click.option("--props", "props_writable", is_flag=True, help="Let POST /props change the default sampling settings.")
@click.option("-v", "--verbose", is_flag=True, help="Log every request (uvicorn's access log).")
@click.option("-b", "--batch-size", "batch_size", type=click.IntRange(min=1), default=None,
              help="Most prompt tokens one step takes (default: adaptive, about 0.25 s of work).")
@click.option("--lora", multiple=True, hidden=True)
@click.option("--grp-attn-n", "-gan", "grp_attn_n", type=int, default=1, hidden=True)
@click.option("--grp-attn-w", "-gaw", "grp_attn_w", type=int, default=None, hidden=True)
@_no_effect_options
def serve(model, model_arg, host, port, n_seq, n_ctx, threads, isa, draft, model_draft, kv_type, cache_type_k,
          cache_type_v, n_predict, api_key, api_key_file, aliases, tags, strict_model, chat_template,
          chat_template_file, reasoning_format, reasoning, metrics, slots, slot_save_path, context_shift, keep,
          ctx_checkpoints, embedding, pooling, sleep_idle_seconds, max_queue, max_body, read_timeout, cors, props_writable, verbose,
          batch_size, lora, grp_attn_n, grp_attn_w, **kw):
    """Serve MODEL over HTTP: OpenAI's API (/v1/chat/completions, /v1/completions, /v1/responses,
    /v1/embeddings), Anthropic's /v1/messages, and llama-server's routes (/completion, /infill,
    /props, /slots, /tokenize, ...).

    It listens at once and loads the model in the background; -c is each sequence's context."""
    try:
        from .. import server
        server.require()
        from ..server.run import serve as run_server
        from ..server.settings import Settings
    except ImportError as e:
        raise click.ClickException(str(e)) from None
    if lora:
        raise click.BadParameter("LoRA adapters are not supported by pydecode (they change every output)",
                                 param_hint="--lora")
    if pooling == "rank":
        raise click.BadParameter("rank pooling (a reranker's scores) is not supported by pydecode; "
                                 "use none, mean, cls or last", param_hint="--pooling")
    if grp_attn_n != 1:
        raise click.BadParameter("group attention (self-extend) is not supported by pydecode", param_hint="--grp-attn-n")
    sampling = {k: kw.pop(k) for k in common.SAMPLING if kw.get(k) is not None}
    for k in common.SAMPLING:
        kw.pop(k, None)
    given = {k: v for k, v in kw.items() if v not in (None, False)}
    ignored = sorted(k[len("ignored_"):].replace("_", "-") for k in given if k.startswith("ignored_"))
    absent = sorted(k[len("absent_"):].replace("_", "-") for k in given if k.startswith("absent_"))
    if ignored:
        click.echo(f"pydecode serve: note: --{', --'.join(ignored)} change nothing here (a CPU runtime with "
                   f"continuous batching and a memory-mapped model)", err=True)
    if absent:
        click.echo(f"pydecode serve: note: --{', --'.join(absent)}: not available in pydecode (text models only; "
                   f"no reranking, image input, MCP tools or model router); requests that need them get an error",
                   err=True)
    if model_draft:
        if draft and draft != model_draft:
            raise click.UsageError("two drafts given: --draft and --model-draft")
        draft = model_draft
    kv_type = _cache_type(kv_type, cache_type_k, cache_type_v)
    name = common.model_name(model, model_arg)
    names = [a.strip() for spec in aliases for a in spec.split(",") if a.strip()]
    default_id = os.path.basename(name)[:-5] if name.endswith(".gguf") else name
    model_id = sorted(names)[0] if names else default_id
    template = None
    if chat_template_file:
        with open(chat_template_file, encoding="utf-8") as f:
            template = f.read()
    elif chat_template:
        template = chat_template
    keys = [k.strip() for k in (api_key or "").split(",") if k.strip()]
    if api_key_file:
        with open(api_key_file, encoding="utf-8") as f:
            keys += [line.strip() for line in f if line.strip()]
    settings = Settings(sampling=sampling, n_predict=n_predict, metrics=metrics, slots=slots,
                        slot_save_path=slot_save_path, chat_template=template, reasoning=reasoning,
                        reasoning_format=reasoning_format,
                        tags=tuple(t.strip() for t in (tags or "").split(",") if t.strip()),
                        aliases=tuple(dict.fromkeys([model_id, *names, default_id])), strict_model=strict_model,
                        alias_names=tuple(dict.fromkeys(names)),
                        context_shift=context_shift, keep=keep, embeddings=embedding, pooling=pooling,
                        sleep_idle_s=sleep_idle_seconds, props_writable=props_writable,
                        cors=tuple(o.strip() for spec in cors for o in spec.split(",") if o.strip()),
                        verbose=verbose)
    if slot_save_path:
        os.makedirs(slot_save_path, exist_ok=True)

    def load():
        llm = common.load_llm(common.resolve_model(name), n_ctx or None, threads, isa, n_seq=n_seq, draft=draft,
                              kv_type=kv_type)
        settings.model_path = str(llm.model.path) if hasattr(llm.model, "path") else str(name)
        if template is not None:
            llm.chat_template = template
        if batch_size is not None:
            llm.engine.prefill_chunk = min(batch_size, llm.model.n_batch)
        if ctx_checkpoints is not None and llm.model.config.recurrent:
            llm.model.slots.max_checkpoints = ctx_checkpoints
        return llm

    try:
        code = run_server(load, model_id, host=host, port=port, api_keys=keys, settings=settings,
                          max_body=max_body, max_queue=max_queue, verbose=verbose, read_timeout=read_timeout)
    except OSError as e:
        common.fail(e)
    sys.exit(code)


def _cache_type(kv_type: str, k: str | None, v: str | None) -> str:
    """-ctk / -ctv (llama-server's per-cache types) as one --kv-type: they must agree."""
    given = {x for x in (k, v) if x is not None}
    if not given:
        return kv_type
    if len(given) > 1:
        raise click.BadParameter(f"-ctk {k} and -ctv {v} differ: pydecode keeps K and V in one format (--kv-type)")
    t = given.pop().lower()
    if t not in CACHE_TYPES:
        raise click.BadParameter(f"cache type {t!r}: pydecode's KV cache is f16, f32 or q8_0", param_hint="-ctk/-ctv")
    return CACHE_TYPES[t]
