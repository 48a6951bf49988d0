"""`serve` (foreground, or `--detach` with a pid file), `shutdown`, `stop [MODEL]`, `logs` and `version`."""

from __future__ import annotations

import json
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
    from ..gateway.ports import PortInUse, check_free

    settings = _settings(config, bind_host, port)
    if not detach:
        from ..gateway.server import run as run_gateway

        try:
            run_gateway(settings, reload=lambda: _settings(config, bind_host, port))
        except PortInUse as exc:
            raise CLIError(exc.message) from None
        except KeyboardInterrupt:
            return
        return
    url = daemon_url(f"{settings.host}:{settings.port}")
    pid_path = Path(pid_file) if pid_file else default_pid_file(settings)
    log_path = Path(log_file) if log_file else settings.run_dir() / "gateway.log"
    old = _read_pid(pid_path)
    if old and _alive(old) and _ours(old):
        raise CLIError(f"a daemon is already running (pid {old}, pid file {pid_path}); stop it with `bictl shutdown`")
    if _healthy(url):
        raise CLIError(f"a daemon already answers at {url}; stop it first (`bictl shutdown`) or choose another --port")
    try:
        check_free(settings.host, settings.port)
    except PortInUse as exc:
        raise CLIError(exc.message) from None
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
    write_daemon_record(settings, pid=proc.pid, pid_file=pid_path, log_file=log_path, url=url)
    stop_hint = "bictl shutdown" + (f" --pid-file {pid_path}" if pid_path != default_pid_file(settings) else "")
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
                click.echo(f"barrel-inference daemon started (pid {proc.pid}) at {url}; log: {log_path} (`bictl logs`); stop it with `{stop_hint}`")
            return
        time.sleep(0.2)
    raise CLIError(f"the daemon (pid {proc.pid}) did not answer at {url} within {wait_s:g}s; see {log_path}")


def daemon_record_path(settings) -> Path:
    return settings.run_dir() / "daemon.json"


def write_daemon_record(settings, *, pid: int, pid_file: Path, log_file: Path, url: str) -> None:
    """Where `serve --detach` put the pid and the log, for `shutdown` and `logs` to find (whatever flags it had)."""
    path = daemon_record_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": pid, "pid_file": str(pid_file), "log_file": str(log_file), "url": url}) + "\n")
    os.replace(tmp, path)


def read_daemon_record(settings) -> dict:
    try:
        data = json.loads(daemon_record_path(settings).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _shutdown(state: State, config, pid_file, timeout) -> None:
    settings = _settings(config, None, None)
    record = read_daemon_record(settings)
    if pid_file:
        pid_path = Path(pid_file)
    elif default_pid_file(settings).exists() or not record.get("pid_file"):
        pid_path = default_pid_file(settings)
    else:
        pid_path = Path(record["pid_file"])
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


def _daemon_options(f):
    f = click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait before killing the daemon.")(f)
    f = click.option("--pid-file", type=click.Path(dir_okay=False), help="The pid file `serve --detach` wrote.")(f)
    f = click.option("--config", "config", type=click.Path(dir_okay=False))(f)
    return f


@click.command()
@_daemon_options
@json_option
@click.pass_obj
def shutdown(state: State, config, pid_file, timeout):
    """Stop a daemon started with `bictl serve --detach`."""
    _shutdown(state, config, pid_file, timeout)


@click.command()
@click.argument("model", required=False, shell_complete=lambda ctx, param, incomplete: _complete(ctx, incomplete))
@_daemon_options
@json_option
@click.pass_obj
def stop(state: State, model, config, pid_file, timeout):
    """Unload MODEL (as `ollama stop`). Without MODEL it stops the daemon, as `bictl shutdown` does."""
    if model:
        from .models import unload_model

        unload_model(state, model)
        return
    click.echo("note: `bictl stop` without a model stops the daemon; `bictl shutdown` is its name now, "
               "and `bictl stop MODEL` unloads a model", err=True)  # fmt: skip
    _shutdown(state, config, pid_file, timeout)


def _complete(ctx, incomplete):
    from .chat import complete_models

    return complete_models(ctx, incomplete)


@click.command()
@click.option("--config", "config", type=click.Path(dir_okay=False))
@click.option("--log-file", type=click.Path(dir_okay=False), help="The daemon's log (default: where `serve --detach` put it).")
@click.option("-n", "--lines", default=20, show_default=True, type=click.IntRange(0), help="Print this many lines from the end first.")
@click.option("-f/-F", "--follow/--no-follow", default=True, show_default=True, help="Keep printing lines as they come (Ctrl-C ends).")
def logs(config, log_file, lines, follow):
    """Print the daemon's log and follow it (a daemon started with `bictl serve --detach`)."""
    settings = _settings(config, None, None)
    path = Path(log_file) if log_file else Path(read_daemon_record(settings).get("log_file") or settings.run_dir() / "gateway.log")
    try:
        f = open(path, "rb")
    except OSError:
        raise CLIError(f"no daemon log at {path} — a daemon started with `bictl serve --detach` writes one (a foreground daemon logs to its terminal)") from None
    with f:
        tail = f.read().splitlines()[-lines:] if lines else []
        for line in tail:
            click.echo(line.decode("utf-8", "replace"))
        if not follow:
            return
        try:
            while True:
                line = f.readline()
                if line:
                    click.echo(line.decode("utf-8", "replace").rstrip("\n"))
                    continue
                time.sleep(0.2)
        except KeyboardInterrupt:
            return


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
