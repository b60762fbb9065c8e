"""The command line: parse, call the API, print. One module per command; `pydecode --help`
lists them. What they share (the model argument, option spellings, loading, errors, Ctrl-C,
progress) is in common.py."""
from __future__ import annotations

import click

from . import common
from .bench import bench
from .chat import chat
from .info import info
from .models import list_models, pull
from .run import run
from .serve import serve
from .verify import verify

DEFAULT_MODEL = common.DEFAULT_MODEL


@click.group()
@click.version_option(package_name="pydecode")
def main():
    """pydecode: run GGUF language models fast on a CPU."""
    common.install_sigterm()


for _command in (run, chat, serve, info, verify, bench, pull, list_models):
    main.add_command(_command)

__all__ = ["main", "DEFAULT_MODEL"]
