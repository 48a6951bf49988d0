"""The interactive session of `bictl run` (as `ollama run`): slash commands, \"\"\" multi-line input, readline
history kept in the user's data dir, and Ctrl-C that stops an answer without leaving."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click

from .chat import PARAMETERS, Session, parse_parameter
from .client import CLIError

HELP = """Available commands:
  /set parameter NAME VALUE   set a parameter (/set parameter shows their names)
  /set system TEXT            set the system prompt
  /set verbose | quiet        print or hide counts and rates after each answer
  /show info                  details of the model
  /show template              the model's chat template
  /show parameters            the session's parameters
  /show system                the system prompt
  /load MODEL                 switch to another model (the conversation starts over)
  /save MODEL                 save the model with this session's system prompt, parameters and messages
  /clear                      forget the conversation
  /bye                        leave (or Ctrl-D)
  /?, /help                   this help
Use \"\"\" to begin and end a multi-line message. Ctrl-C stops an answer."""


def _history_file() -> Path | None:
    try:
        import platformdirs

        path = Path(os.environ.get("BICTL_HISTORY") or Path(platformdirs.user_data_dir("barrel_inference_server")) / "history")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path
    except (ImportError, OSError):
        return None


def _readline(history: Path | None):
    try:
        import readline
    except ImportError:  # pragma: no cover - platforms without readline
        return None
    if history is not None and history.is_file():
        try:
            readline.read_history_file(history)
        except OSError:
            pass
    readline.set_history_length(1000)
    return readline


def read_message(prompt: str = ">>> ") -> str:
    """One message: a line, or the lines between \"\"\" and \"\"\". EOFError / KeyboardInterrupt pass through."""
    line = input(prompt)
    if not line.lstrip().startswith('"""'):
        return line
    first = line.lstrip()[3:]
    if first.rstrip().endswith('"""') and len(first.rstrip()) >= 3:
        return first.rstrip()[:-3]
    lines = [first] if first else []
    while True:
        more = input("... ")
        if more.rstrip().endswith('"""'):
            lines.append(more.rstrip()[:-3])
            break
        lines.append(more)
    return "\n".join(lines).strip("\n")


def show(session: Session, what: str) -> None:
    info = session.info
    if what == "info":
        d = info.get("details") or {}
        mi = info.get("model_info") or {}
        ctx_len = next((v for k, v in mi.items() if k.endswith(".context_length")), None)
        loader = info.get("loader") or {}
        rows = [
            ("model", session.name),
            ("architecture", d.get("family")),
            ("parameters", d.get("parameter_size")),
            ("quantization", d.get("quantization_level")),
            ("context length", ctx_len),
            ("n_ctx (served)", loader.get("n_ctx")),
            ("capabilities", ", ".join(info.get("capabilities") or [])),
            ("mode", "chat" if session.chat else "text completion (no chat template)"),
        ]
        for k, v in rows:
            click.echo(f"  {k:<16}{v if v not in (None, '') else '?'}")
    elif what == "template":
        click.echo(info.get("template") or "(no chat template: prompts are continued as text)")
    elif what == "parameters":
        if not session.params:
            click.echo("no parameters set")
        for k, v in sorted(session.params.items()):
            click.echo(f"  {k:<16}{v}")
    elif what == "system":
        click.echo(session.system or "no system prompt set")
    else:
        click.echo(f"unknown: /show {what} — /show info | template | parameters | system", err=True)


def save(session: Session, name: str) -> None:
    """Ollama's /save: a new model from this one with the session's system prompt, parameters and messages."""
    body: dict = {"model": name, "from": session.name, "stream": False}
    if session.system:
        body["system"] = session.system
    if session.params:
        body["parameters"] = dict(session.params)
    if session.messages:
        body["messages"] = list(session.messages)
    session.state.client(timeout=120).call("POST", "/api/create", body)
    click.echo(f"Created new model '{name}'")


def command(session: Session, line: str) -> bool:
    """Run one slash command; False means leave."""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    cmd, args = words[0], words[1:]
    if cmd in ("/bye", "/exit", "/quit"):
        return False
    if cmd in ("/?", "/help"):
        click.echo(HELP)
    elif cmd == "/clear":
        session.messages = []
        click.echo("Cleared session context")
    elif cmd == "/set":
        if args[:1] == ["parameter"]:
            if len(args) < 3:
                click.echo("usage: /set parameter NAME VALUE; names: " + ", ".join(sorted(PARAMETERS)))
            else:
                session.params[args[1]] = parse_parameter(args[1], " ".join(args[2:]))
                click.echo(f"Set parameter '{args[1]}' to '{' '.join(args[2:])}'")
        elif args[:1] == ["system"]:
            rest = line.split("system", 1)[1].strip()
            session.system = rest.strip('"') if rest.startswith('"') and rest.endswith('"') else rest
            click.echo("Set system message.")
        elif args[:1] == ["verbose"]:
            session.verbose = True
            click.echo("Set 'verbose' mode.")
        elif args[:1] == ["quiet"]:
            session.verbose = False
            click.echo("Set 'quiet' mode.")
        else:
            click.echo("usage: /set parameter NAME VALUE | /set system TEXT | /set verbose | /set quiet")
    elif cmd == "/show":
        show(session, args[0] if args else "info")
    elif cmd == "/load":
        if not args:
            click.echo("usage: /load MODEL")
        else:
            session.load(args[0])
            click.echo(f"Loading model '{args[0]}'")
    elif cmd == "/save":
        if not args:
            click.echo("usage: /save MODEL")
        else:
            save(session, args[0])
    else:
        click.echo(f"Unknown command '{cmd}'. Type /? for help")
    return True


def repl(session: Session) -> None:
    history = _history_file()
    rl = _readline(history)
    click.echo(f"{session.name} — send a message (/? for help)", err=True)
    try:
        while True:
            try:
                line = read_message()
            except EOFError:
                click.echo("")
                return
            except KeyboardInterrupt:
                click.echo("\nUse Ctrl-D or /bye to exit.")
                continue
            if not line.strip():
                continue
            if line.startswith("/"):
                try:
                    if not command(session, line.strip()):
                        return
                except CLIError as exc:
                    if exc.exit_code != 1:
                        raise
                    click.echo(f"error: {exc.message}", err=True)
                continue
            try:
                session.ask(line)
            except KeyboardInterrupt:
                click.echo("\n(stopped)")
            except CLIError as exc:
                if exc.exit_code != 1:
                    raise
                click.echo(f"error: {exc.message}", err=True)
    finally:
        if rl is not None and history is not None:
            try:
                rl.write_history_file(history)
            except OSError:
                pass
