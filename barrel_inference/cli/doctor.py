"""`bictl doctor`: the system report, from the running daemon, else computed here."""

from __future__ import annotations

import asyncio

import click

from .. import __version__
from ..config import load_settings
from ..sysreport import build_report, engine_facts, render_text
from .client import EXIT_UNREACHABLE, CLIError
from .context import State, json_option
from .formatting import echo_json


def _local_report(config: str | None) -> dict:
    from ..gateway.fallbacks import FallbackStore

    try:
        settings = load_settings(config)
    except (OSError, ValueError) as exc:
        raise CLIError(f"cannot load the configuration: {exc}") from None
    facts = asyncio.run(engine_facts(settings.model_settings("").extra_buffers or "auto"))
    store = FallbackStore.in_cache_dir(settings.cache_dir())
    return build_report(settings, facts, fallbacks=store.entries(), models=[], version=__version__)


@click.command()
@click.option("--config", type=click.Path(dir_okay=False), default=None, envvar="BARREL_INFERENCE_CONFIG",
              help="Configuration file, used when no daemon answers.")  # fmt: skip
@json_option
@click.pass_obj
def doctor(state: State, config: str | None):
    """What llama.cpp build, CPU features, GPUs and engine profiles are in use, and why.

    Asks the running daemon (GET /api/system); with no daemon, reports this machine from the
    configuration. Paste its output into bug reports.
    """
    source = state.url
    try:
        report = state.client(timeout=max(state.timeout, 90)).call("GET", "/api/system")
    except CLIError as exc:
        if exc.exit_code != EXIT_UNREACHABLE:
            raise
        report = _local_report(config)
        source = "this machine (no daemon answered at " + state.url + ")"
    if state.json:
        echo_json({"source": source, **report})
        return
    click.echo(f"report from {source}")
    click.echo(render_text(report))
