"""bictl alias list / set / rm: change the daemon's model aliases without a restart."""

from __future__ import annotations

from urllib.parse import quote

import click

from .context import State, json_option
from .formatting import echo_json, table


@click.group()
def alias():
    """Client model ids -> registry names, changed on the running daemon (kept across restarts)."""


@alias.command("list")
@json_option
@click.pass_obj
def list_aliases(state: State):
    """Every alias and the model it maps to."""
    aliases = (state.client().call("GET", "/api/aliases") or {}).get("aliases", {})
    if state.json:
        echo_json(aliases)
        return
    if not aliases:
        click.echo("no aliases")
        return
    click.echo(table(["ALIAS", "MODEL"], [[name, target] for name, target in sorted(aliases.items())]))


@alias.command("set")
@click.argument("name")
@click.argument("model")
@json_option
@click.pass_obj
def set_alias(state: State, name: str, model: str):
    """Serve NAME (e.g. claude-sonnet-4-5) with MODEL (a registry name)."""
    out = state.client().call("PUT", f"/api/aliases/{quote(name, safe='')}", {"target": model})
    if state.json:
        echo_json(out)
    else:
        click.echo(f"{out['alias']} -> {out['target']}")


@alias.command("rm")
@click.argument("name")
@json_option
@click.pass_obj
def remove_alias(state: State, name: str):
    """Remove alias NAME."""
    out = state.client().call("DELETE", f"/api/aliases/{quote(name, safe='')}")
    if state.json:
        echo_json(out)
    else:
        click.echo(f"removed alias {name}")
