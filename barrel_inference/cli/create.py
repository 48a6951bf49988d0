"""`create NAME -f Modelfile`: parse the Modelfile here (as Ollama's client does) and send Ollama's
POST /api/create body: {model, from, template, system, parameters, messages, license, stream}."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from .chat import PARAMETERS
from .client import CLIError
from .context import State, json_option

_COMMANDS = ("from", "parameter", "template", "system", "adapter", "license", "message")
_ROLES = ("system", "user", "assistant")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")


def _value(text: str, lines: list[str], i: int) -> tuple[str, int]:
    """A value: the rest of the line, "quoted", or \"\"\"…\"\"\" over several lines. Returns (value, next line)."""
    text = text.strip()
    if text.startswith('"""'):
        body = text[3:]
        if body.endswith('"""') and len(body) >= 3:
            return body[:-3], i + 1
        parts = [body]
        j = i + 1
        while j < len(lines):
            line = lines[j]
            if line.rstrip().endswith('"""'):
                parts.append(line.rstrip()[:-3])
                return "\n".join(parts).strip("\n"), j + 1
            parts.append(line)
            j += 1
        raise CLIError(f'Modelfile line {i + 1}: a """ block is not closed')
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1], i + 1
    return text, i + 1


def _typed(name: str, value: str):
    numeric = PARAMETERS[name][1] is not str if name in PARAMETERS else bool(_NUMBER.match(value))
    if numeric:
        try:
            return int(value) if re.match(r"^-?\d+$", value) else float(value)
        except ValueError:
            raise CLIError(f"Modelfile: PARAMETER {name} takes a number, not {value!r}") from None
    if value in ("true", "false"):
        return value == "true"
    return value


def parse_modelfile(text: str, base: Path | None = None) -> dict:
    """The /api/create body fields of a Modelfile (without `model`). FROM a local file becomes its absolute path."""
    out: dict = {}
    params: dict = {}
    messages: list[dict] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i].strip()
        if not raw or raw.startswith("#"):
            i += 1
            continue
        word, _, rest = raw.partition(" ")
        cmd = word.lower()
        if cmd not in _COMMANDS:
            raise CLIError(f"Modelfile line {i + 1}: unknown command {word!r} (known: {', '.join(c.upper() for c in _COMMANDS)})")
        if cmd == "parameter":
            name, _, value = rest.strip().partition(" ")
            if not value.strip():
                raise CLIError(f"Modelfile line {i + 1}: PARAMETER needs a name and a value")
            value, i = _value(value, lines, i)
            typed = _typed(name, value)
            if name == "stop":
                params.setdefault("stop", []).append(typed)
            else:
                params[name] = typed
            continue
        if cmd == "message":
            role, _, content = rest.strip().partition(" ")
            if role not in _ROLES:
                raise CLIError(f"Modelfile line {i + 1}: MESSAGE role must be one of {', '.join(_ROLES)}, not {role!r}")
            content, i = _value(content, lines, i)
            messages.append({"role": role, "content": content})
            continue
        value, i = _value(rest, lines, i)
        if cmd == "from":
            local = Path(value).expanduser()
            if not local.is_absolute() and base is not None and (value.startswith(".") or value.endswith(".gguf")):
                local = (base / local).resolve()
            out["from"] = str(local) if local.is_absolute() and local.exists() else value
        elif cmd == "adapter":
            raise CLIError(f"Modelfile line {i}: ADAPTER is not supported")
        elif cmd == "license":
            out.setdefault("license", []).append(value)
        else:
            out[cmd] = value
    if "from" not in out:
        raise CLIError("the Modelfile has no FROM line")
    if params:
        out["parameters"] = params
    if messages:
        out["messages"] = messages
    if isinstance(out.get("license"), list) and len(out["license"]) == 1:
        out["license"] = out["license"][0]
    return out


@click.command()
@click.argument("name")
@click.option("-f", "--file", "modelfile", default="Modelfile", show_default=True, type=click.Path(dir_okay=False),
              help="The Modelfile.")  # fmt: skip
@json_option
@click.pass_obj
def create(state: State, name: str, modelfile: str):
    """Create a model NAME from a Modelfile (FROM, PARAMETER, TEMPLATE, SYSTEM, MESSAGE, LICENSE)."""
    path = Path(modelfile)
    try:
        text = path.read_text()
    except OSError as exc:
        raise CLIError(f"cannot read the Modelfile {path}: {exc.strerror or exc}") from None
    body = {"model": name, **parse_modelfile(text, path.resolve().parent), "stream": True}
    last = None
    for event in state.client(timeout=600).ndjson("POST", "/api/create", body):
        last = event
        if state.json:
            click.echo(json.dumps(event))
        elif event.get("status"):
            click.echo(event["status"], err=True)
    if state.json:
        return
    if last is None or last.get("status") != "success":
        raise CLIError(f"the daemon did not confirm the creation of '{name}'")
    click.echo(f"created '{name}'")
