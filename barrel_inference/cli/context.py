"""What every command shares: the daemon client and the output mode."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import click

from .client import Client, CLIError, daemon_url


@dataclass
class State:
    host: str | None = None
    json: bool = False
    timeout: float = 30.0
    api_key: str | None = None

    @property
    def url(self) -> str:
        return daemon_url(self.host)

    def client(self, timeout: float | None = None) -> Client:
        return Client(self.url, timeout or self.timeout, api_key=self.api_key)


def json_option(f):
    """`--json` on a command (the same as the group's `bictl --json …`)."""

    @click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
    @functools.wraps(f)
    def wrapper(*args, as_json: bool = False, **kwargs):
        state = click.get_current_context().find_object(State)
        if as_json:
            state.json = True
        return f(*args, **kwargs)

    return wrapper


def fail(message: str, code: int = 1):
    raise CLIError(message, exit_code=code)
