"""`serve` (foreground, or `--detach` with a pid file), `stop` and `version`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from .. import __version__
from ..config import load_settings
from .client import EXIT_UNREACHABLE, Client, CLIError, daemon_url
from .context import State, json_option
from .formatting import echo_json


def _settings(config: str | None, host: str | None, port: int | None):
    try:
        return load_settings(config, host=host, port=port)
    except (OSError, ValueError) as exc:
        raise CLIError(f"cannot load the configuration: {exc}") from None


def default_pid_file(settings) -> Path:
    return settings.run_dir() / "gateway.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ours(pid: int) -> bool:
    """The process looks like a barrel-inference daemon (guards against a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return _alive(pid)  # no /proc: trust the pid file
    return b"barrel_inference" in cmdline or b"bictl" in cmdline or b"barrel-inference" in cmdline


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _healthy(url: str) -> bool:
    try:
        return (Client(url, timeout=2).call("GET", "/health") or {}).get("status") == "ok"
    except CLIError:
        return False


@click.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), help="TOML config file (default: $BARREL_INFERENCE_CONFIG).")
@click.option("--host", "bind_host", help="Bind address (default from config, 127.0.0.1).")
@click.option("--port", type=int, help="Bind port (default from config, 8080).")
@click.option("--detach", is_flag=True, help="Run in the background and write a pid file.")
@click.option("--pid-file", type=click.Path(dir_okay=False), help="With --detach: where to write the pid (default <run dir>/gateway.pid).")
@click.option("--log-file", type=click.Path(dir_okay=False), help="With --detach: the daemon's log (default <run dir>/gateway.log).")
@click.option("--wait", "wait_s", default=120.0, show_default=True, help="With --detach: seconds to wait for the daemon to answer.")
@json_option
@click.pass_obj
def serve(state: State, config, bind_host, port, detach, pid_file, log_file, wait_s):
    """Start the daemon (in the foreground unless --detach)."""
    settings = _settings(config, bind_host, port)
    if not detach:
        from ..gateway.server import run as run_gateway

        run_gateway(settings, reload=lambda: _settings(config, bind_host, port))
        return
    url = daemon_url(f"{settings.host}:{settings.port}")
    pid_path = Path(pid_file) if pid_file else default_pid_file(settings)
    log_path = Path(log_file) if log_file else settings.run_dir() / "gateway.log"
    old = _read_pid(pid_path)
    if old and _alive(old) and _ours(old):
        raise CLIError(f"a daemon is already running (pid {old}, pid file {pid_path}); stop it with `bictl stop`")
    if _healthy(url):
        raise CLIError(f"a daemon already answers at {url}; stop it first (`bictl stop`) or choose another --port")
    argv = [sys.executable, "-m", "barrel_inference.cli", "serve"]
    for flag, value in (("--config", config), ("--host", bind_host), ("--port", port)):
        if value is not None:
            argv += [flag, str(value)]
    pid_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    tmp = pid_path.with_suffix(".tmp")
    tmp.write_text(f"{proc.pid}\n")
    os.replace(tmp, pid_path)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pid_path.unlink(missing_ok=True)
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            raise CLIError(f"the daemon exited with code {proc.returncode} before it answered; its log ({log_path}) ends with:\n" + "\n".join(tail))
        if _healthy(url):
            if state.json:
                echo_json({"pid": proc.pid, "url": url, "pid_file": str(pid_path), "log_file": str(log_path)})
            else:
                click.echo(f"barrel-inference daemon started (pid {proc.pid}) at {url}; log: {log_path}; stop it with `bictl stop`")
            return
        time.sleep(0.2)
    raise CLIError(f"the daemon (pid {proc.pid}) did not answer at {url} within {wait_s:g}s; see {log_path}")


@click.command()
@click.option("--config", "config", type=click.Path(dir_okay=False))
@click.option("--pid-file", type=click.Path(dir_okay=False), help="The pid file `serve --detach` wrote.")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait before killing it.")
@json_option
@click.pass_obj
def stop(state: State, config, pid_file, timeout):
    """Stop a daemon started with `bictl serve --detach`."""
    settings = _settings(config, None, None)
    pid_path = Path(pid_file) if pid_file else default_pid_file(settings)
    pid = _read_pid(pid_path)
    if pid is None:
        raise CLIError(f"no pid file at {pid_path} — was the daemon started with `bictl serve --detach`? (a foreground daemon stops with Ctrl-C)")
    if not _alive(pid) or not _ours(pid):
        pid_path.unlink(missing_ok=True)
        raise CLIError(f"the daemon (pid {pid}) is not running; removed the stale pid file {pid_path}")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    killed = False
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            killed = True
            time.sleep(0.2)
            break
        time.sleep(0.1)
    pid_path.unlink(missing_ok=True)
    if state.json:
        echo_json({"pid": pid, "stopped": True, "killed": killed})
    else:
        click.echo(f"stopped the daemon (pid {pid})" + (f" — it did not exit within {timeout:g}s and was killed" if killed else ""))


@click.command()
@json_option
@click.pass_obj
def version(state: State):
    """Print the client's and the daemon's versions."""
    daemon = None
    error = None
    try:
        daemon = (state.client(timeout=5).call("GET", "/api/version") or {}).get("version")
    except CLIError as exc:
        if exc.exit_code != EXIT_UNREACHABLE:
            raise
        error = exc.message
    if state.json:
        echo_json({"client": __version__, "daemon": daemon, "url": state.url, **({"error": error} if error else {})})
        return
    click.echo(f"bictl {__version__}")
    click.echo(f"daemon {daemon} at {state.url}" if daemon else f"daemon: {error}")
