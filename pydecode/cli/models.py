"""`pydecode pull` and `pydecode list`: the model cache."""
from __future__ import annotations

import click

from .. import registry
from ..errors import PydecodeError
from . import common


@click.command()
@click.argument("name")
@click.option("--force", is_flag=True, help="Download again even if cached.")
def pull(name, force):
    """Download a registry model into the cache."""
    try:
        path = registry.pull(name, force=force)
    except (PydecodeError, ValueError, OSError) as e:
        common.fail(e)
    click.echo(str(path))


@click.command("list")
def list_models():
    """Models in the registry (and whether they are downloaded)."""
    for m in registry.list_models():
        mark = m["status"] if m["status"] != "changed on disk" else "changed on disk: re-verified at next use"
        click.echo(f"{m['name']:22s} {m['size'] / 1e6:8.1f} MB  {m['arch']:8s} {m['quant']:8s} [{mark}]  {m['description']}")
