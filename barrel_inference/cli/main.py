"""bictl — drive the barrel-inference daemon from a terminal (also installed as `barrel-inference`).

Exit codes: 0 success, 1 the operation failed, 2 bad usage, 3 no daemon reachable.
"""

from __future__ import annotations

import click

from .alias import alias
from .chat import embed, run
from .client import CLIError
from .context import State
from .create import create
from .daemon import logs, serve, shutdown, stop, version
from .doctor import doctor
from .worker import worker
from .models import COMMANDS


class Group(click.Group):
    """Turns CLIError into `error: …` on stderr and its exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CLIError as exc:
            click.echo(f"error: {exc.message}", err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", envvar="BARREL_INFERENCE_HOST", help="The daemon: host, host:port or http://host:port (env BARREL_INFERENCE_HOST).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the daemon's answers.")
@click.option("--api-key", envvar="BARREL_INFERENCE_API_KEY", default=None, show_envvar=True,
              help="A key of the daemon's api_keys (an admin key for pull, rm, cp, create, unload), sent as a Bearer token.")
@click.version_option(package_name="barrel-inference", prog_name="bictl")
@click.pass_context
def main(ctx: click.Context, host: str | None, as_json: bool, timeout: float, api_key: str | None):
    """Pull, manage and chat with local models served by barrel-inference."""
    ctx.obj = State(host=host, json=as_json, timeout=timeout, api_key=api_key or None)


for command in [*COMMANDS, create, run, embed, serve, stop, shutdown, logs, version, doctor, worker, alias]:
    main.add_command(command)


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="bictl")
