"""GBNF that holds a tool call to the declared tools.

Pure: the JSON-Schema-to-GBNF converter lives with the engine and is passed in. Three uses:
- span: after a start marker was sampled, the rest of the span (`root` = the call(s) and the end
  marker), so the call is well-formed and names a declared tool;
- forced: tool_choice required / a named tool, the start marker and the call from the first token;
- generic: the whole reply, for models without a tool format of their own.
A format that writes the name outside the arguments' JSON (dsml, mistral's [ARGS] spelling) gets
one arguments rule per tool, each tool's converted grammar renamed apart; a format with neither
(dsml-invoke) gets no grammar, its calls still parsed and checked against the schemas.
"""

from __future__ import annotations

import re
from typing import Callable

from .base import ToolCallFormat, tool_name

SchemaToGbnf = Callable[[dict], str]
CALL_RULE = "tool-call"


def literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _rules(schema: dict, to_gbnf: SchemaToGbnf, rule: str) -> str:
    return re.sub(r"^root ::=", f"{rule} ::=", to_gbnf(schema), flags=re.M)


def only(tools: list[dict], choice) -> list[dict]:
    """The tools a tool_choice allows: all, or the one it names."""
    name = choice_name(choice)
    if name is None:
        return tools
    return [t for t in tools if tool_name(t) == name]


def choice_name(choice) -> str | None:
    if isinstance(choice, dict):
        fn = choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
        if isinstance(choice.get("name"), str):
            return choice["name"]
    return None


def forces_call(choice) -> bool:
    return choice in ("required", "any") or choice_name(choice) is not None


_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9-]*")


def prefixed(gbnf: str, prefix: str) -> str:
    """Every rule of a grammar renamed with `prefix` (its definitions and its references), so the
    grammars of several tools can live in one."""
    names = {line.split("::=", 1)[0].strip() for line in gbnf.splitlines() if "::=" in line}
    out = []
    for line in gbnf.splitlines():
        i, buf = 0, []
        while i < len(line):
            ch = line[i]
            if ch in "\"[":  # a literal or a character class: copied as is
                close = '"' if ch == '"' else "]"
                j = i + 1
                while j < len(line) and line[j] != close:
                    j += 2 if line[j] == "\\" else 1
                buf.append(line[i : j + 1])
                i = j + 1
                continue
            m = _IDENT.match(line, i)
            if m and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "-")):
                word = m.group(0)
                buf.append(prefix + word if word in names else word)
                i = m.end()
                continue
            buf.append(ch)
            i += 1
        out.append("".join(buf))
    return "\n".join(out)


def span_grammar(fmt: ToolCallFormat, tools: list[dict], to_gbnf: SchemaToGbnf, *, parallel: bool, forced: bool,
                 marker: Callable[[str], str] = literal) -> str | None:  # fmt: skip
    """GBNF of a span after its start marker (forced=False) or from the first token (forced=True).
    `marker(text)` writes a marker; the worker passes one that names a special token by id."""
    schema = fmt.payload_schema(tools)
    if schema is None:
        return _per_tool(fmt, tools, to_gbnf, parallel=parallel, forced=forced, marker=marker)
    body = fmt.span_grammar(CALL_RULE, parallel, marker)
    if body is None:
        return None
    root = f"{marker(fmt.start)} {body}" if forced and fmt.start else f"{body}"
    return f"root ::= {root}\n{_rules(schema, to_gbnf, CALL_RULE)}"


def _per_tool(fmt: ToolCallFormat, tools: list[dict], to_gbnf: SchemaToGbnf, *, parallel: bool, forced: bool,
              marker: Callable[[str], str]) -> str | None:  # fmt: skip
    """For formats that write the name outside the arguments' JSON: one arguments rule per tool."""
    from .base import tool_parameters

    alts, rules = [], []
    for i, t in enumerate(tools):
        name = tool_name(t)
        if name is None:
            continue
        rules.append(prefixed(to_gbnf(tool_parameters(t)), f"t{i}-"))
        alts.append((name, f"t{i}-root"))
    body = fmt.tool_span_grammar(alts, parallel, marker) if alts else None
    if body is None:
        return None
    root = f"{marker(fmt.start)} {body}" if forced and fmt.start else body
    return "\n".join([f"root ::= {root}", *rules])


def generic_grammar(tools: list[dict], to_gbnf: SchemaToGbnf, *, required: bool, parallel: bool) -> str:
    from .generic import FORMAT

    return to_gbnf(FORMAT.reply_schema(tools, required=required, parallel=parallel))
