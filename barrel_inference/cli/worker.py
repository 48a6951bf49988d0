"""`bictl worker keygen`: CURVE key pairs for workers on other hosts and the gateways that use them."""

from __future__ import annotations

import click

from ..protocol.curve import CurveError, generate
from .client import CLIError


@click.group()
def worker():
    """Workers that run outside the gateway (another host, a systemd unit)."""


@worker.command()
@click.argument("name")
@click.option("--dir", "directory", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Where to write NAME.key (public) and NAME.key_secret (secret, mode 0600).")  # fmt: skip
def keygen(name: str, directory: str):
    """Write a CURVE key pair NAME.key / NAME.key_secret.

    \b
    A worker binds with its secret key and admits the gateways whose public keys are in its
    --curve-clients directory; a gateway sets `curve_secret_key` to its own secret key and, per
    model, `server_key` to the worker's public key:
      bictl worker keygen worker1  --dir /etc/barrel-inference/keys   # on the worker host
      bictl worker keygen gateway  --dir /etc/barrel-inference/keys   # on the gateway host
      copy gateway.key to the worker's clients dir, worker1.key to the gateway host
    """
    try:
        public, secret = generate(directory, name)
    except CurveError as exc:
        raise CLIError(str(exc)) from None
    click.echo(f"public key: {public}")
    click.echo(f"secret key: {secret}")
