"""A Modelfile parser: FROM, PARAMETER, TEMPLATE, SYSTEM, MESSAGE, LICENSE, ADAPTER, REQUIRES; `#` comments.

Values are bare words, "quoted strings" (with backslash escapes) or \"\"\"triple-quoted\"\"\" text spanning lines.
PARAMETER values are typed by the option's kind (integer, number, boolean, repeated stop strings); an unknown
parameter, a value of the wrong type or an unknown instruction is an error naming the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from . import options as opts

# parameters a manifest may carry besides Ollama's options: ours
EXTRA_PARAMETERS = {"num_seq_max": opts.INT}
MESSAGE_ROLES = ("system", "user", "assistant", "tool")


class ModelfileError(ValueError):
    pass


@dataclass
class Modelfile:
    from_: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    template: str | None = None
    system: str | None = None
    license: list[str] = field(default_factory=list)
    adapters: list[str] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)


def parameter_value(name: str, raw: Any, where: str = "parameters") -> Any:
    """Type one parameter (a Modelfile's text, or a JSON value); unknown names and wrong types raise."""
    kind = opts.KNOWN.get(name) or EXTRA_PARAMETERS.get(name)
    if kind is None:
        raise ModelfileError(str(opts.unknown(name, where).info.message))
    if isinstance(raw, str) and kind != opts.STRINGS:
        text = raw.strip()
        try:
            if kind == opts.BOOL:
                if text.lower() not in ("true", "false"):
                    raise ValueError
                raw = text.lower() == "true"
            elif kind == opts.INT:
                raw = int(text)
            else:
                raw = float(text)
        except ValueError:
            raise ModelfileError(f"parameter {name!r} must be {kind}, got {raw!r}") from None
    if name in opts.KNOWN:
        try:
            return opts.check_value(name, raw, where)
        except Exception as exc:
            raise ModelfileError(getattr(getattr(exc, "info", None), "message", str(exc))) from None
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ModelfileError(f"parameter {name!r} must be {kind}, got {raw!r}")
    return raw


def _read_value(text: str, pos: int, line_no: int) -> tuple[str, int, int]:
    """The value starting at text[pos]: (value, position after it, lines consumed beyond the first)."""
    if text.startswith('"""', pos):
        end = text.find('"""', pos + 3)
        if end < 0:
            raise ModelfileError(f"line {line_no}: unterminated \"\"\" string")
        value = text[pos + 3 : end]
        return value, end + 3, value.count("\n")
    if text.startswith('"', pos):
        i = pos + 1
        while i < len(text) and text[i] != '"':
            if text[i] == "\n":
                raise ModelfileError(f"line {line_no}: unterminated string")
            i += 2 if text[i] == "\\" else 1
        if i >= len(text):
            raise ModelfileError(f"line {line_no}: unterminated string")
        try:
            value = json.loads(text[pos : i + 1])
        except ValueError:
            value = text[pos + 1 : i]
        return value, i + 1, 0
    end = text.find("\n", pos)
    end = len(text) if end < 0 else end
    return text[pos:end].strip(), end, 0


def _word(text: str, pos: int) -> tuple[str, int]:
    """The word at pos (up to white space) and where the value after it starts (blanks skipped)."""
    n, end = len(text), pos
    while end < n and text[end] not in " \t\r\n":
        end += 1
    after = end
    while after < n and text[after] in " \t":
        after += 1
    return text[pos:end], after


def parse(text: str) -> Modelfile:
    mf = Modelfile()
    pos, line_no, n = 0, 1, len(text)
    while pos < n:
        # skip blank space and comments
        while pos < n and text[pos] in " \t\r\n":
            if text[pos] == "\n":
                line_no += 1
            pos += 1
        if pos >= n:
            break
        if text[pos] == "#":
            end = text.find("\n", pos)
            pos = n if end < 0 else end
            continue
        command, pos = _word(text, pos)
        command = command.upper()
        start_line = line_no
        if command == "PARAMETER":
            name, pos = _word(text, pos)
            name = name.lower()
            if not name:
                raise ModelfileError(f"line {start_line}: PARAMETER needs a name and a value")
            value, pos, extra = _read_value(text, pos, start_line)
            line_no += extra
            if value == "":
                raise ModelfileError(f"line {start_line}: PARAMETER {name} needs a value")
            try:
                typed = parameter_value(name, value)
            except ModelfileError as exc:
                raise ModelfileError(f"line {start_line}: {exc}") from None
            if name == "stop":
                mf.parameters.setdefault("stop", []).extend(typed)
            else:
                mf.parameters[name] = typed
            continue
        if command == "MESSAGE":
            role, pos = _word(text, pos)
            role = role.lower()
            if role not in MESSAGE_ROLES:
                raise ModelfileError(f"line {start_line}: MESSAGE role must be one of {', '.join(MESSAGE_ROLES)}, got {role!r}")
            value, pos, extra = _read_value(text, pos, start_line)
            line_no += extra
            mf.messages.append({"role": role, "content": value})
            continue
        if command not in ("FROM", "TEMPLATE", "SYSTEM", "LICENSE", "ADAPTER", "REQUIRES"):
            raise ModelfileError(f"line {start_line}: unknown instruction {command!r} (FROM, PARAMETER, TEMPLATE, SYSTEM, MESSAGE, LICENSE, ADAPTER)")
        value, pos, extra = _read_value(text, pos, start_line)
        line_no += extra
        if command == "FROM":
            if not value:
                raise ModelfileError(f"line {start_line}: FROM needs a model name or a path")
            mf.from_ = value
        elif command == "TEMPLATE":
            mf.template = value
        elif command == "SYSTEM":
            mf.system = value
        elif command == "LICENSE":
            mf.license.append(value)
        elif command == "ADAPTER":
            mf.adapters.append(value)
    return mf
