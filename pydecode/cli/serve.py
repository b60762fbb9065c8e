"""`pydecode serve`: an OpenAI-compatible HTTP server (pydecode/server/)."""
from __future__ import annotations

import os
import sys

import click

from . import common


@click.command()
@common.model_args
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback: only this machine; 0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port (0: any free one, printed at start).")
@click.option("--n-seq", "--parallel", "-np", "n_seq", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Sequences decoded together (a KV cache slot of -c tokens each); more requests wait.")
@common.ctx_opt
@common.threads_opt
@common.isa_opt
@common.draft_opt
@common.kv_type_opt
@click.option("--api-key", default=None, envvar="PYDECODE_API_KEY", show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on every route but /health.")
@click.option("--alias", "aliases", multiple=True,
              help="Another model name requests may use (e.g. the one a tool insists on). Repeatable.")
@click.option("--max-queue", type=click.IntRange(min=0), default=256, show_default=True,
              help="Requests that may wait for a slot; beyond them, 429.")
@click.option("--max-body", type=click.IntRange(min=1024), default=8 << 20, show_default=True,
              help="Largest request body in bytes; beyond it, 413.")
@click.option("--timeout", "-to", "read_timeout", type=click.FloatRange(min=0.01), default=60, show_default=True,
              help="Seconds a client has to send its request headers, and then each part of its body; beyond, 408.")
@click.option("--cors", "cors", multiple=True, metavar="ORIGIN",
              help="Let web pages of ORIGIN call the API from a browser ('*' for any). Repeatable.")
@click.option("-v", "--verbose", is_flag=True, help="Log every request (uvicorn's access log).")
def serve(model, model_arg, host, port, n_seq, n_ctx, threads, isa, draft, kv_type, api_key, aliases, max_queue, max_body,
          read_timeout, cors, verbose):
    """Serve MODEL over HTTP with OpenAI's API (/v1/chat/completions, /v1/completions, ...).

    It listens at once and loads the model in the background; -c is each sequence's context."""
    try:
        from .. import server
        server.require()
        from ..server.run import serve as run_server
    except ImportError as e:
        raise click.ClickException(str(e)) from None
    name = common.model_name(model, model_arg)
    model_id = os.path.basename(name)[:-5] if name.endswith(".gguf") else name

    def load():
        return common.load_llm(common.resolve_model(name), n_ctx, threads, isa, n_seq=n_seq, draft=draft, kv_type=kv_type)

    try:
        code = run_server(load, model_id, host=host, port=port, aliases=aliases, api_key=api_key or None,
                          max_body=max_body, max_queue=max_queue, cors=cors, verbose=verbose,
                          read_timeout=read_timeout)
    except OSError as e:
        common.fail(e)
    sys.exit(code)
