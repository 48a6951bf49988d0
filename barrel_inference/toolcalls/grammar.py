"""GBNF that holds a tool call to the declared tools.

Pure: the JSON-Schema-to-GBNF converter lives with the engine and is passed in. Three uses:
- span: after a start marker was sampled, the rest of the span (`root` = the call(s) and the end
  marker), so the call is well-formed and names a declared tool;
- forced: tool_choice required / a named tool, the start marker and the call from the first token;
- generic: the whole reply, for models without a tool format of their own.
A format that writes no call as one JSON value (dsml, mistral's [ARGS] spelling) gets no grammar;
its calls are still parsed and checked against the schemas.
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


def span_grammar(fmt: ToolCallFormat, tools: list[dict], to_gbnf: SchemaToGbnf, *, parallel: bool, forced: bool,
                 marker: Callable[[str], str] = literal) -> str | None:  # fmt: skip
    """GBNF of a span after its start marker (forced=False) or from the first token (forced=True).
    `marker(text)` writes a marker; the worker passes one that names a special token by id."""
    schema = fmt.payload_schema(tools)
    if schema is None:
        return None
    body = fmt.span_grammar(CALL_RULE, parallel, marker)
    if body is None:
        return None
    root = f"{marker(fmt.start)} {body}" if forced and fmt.start else f"{body}"
    return f"root ::= {root}\n{_rules(schema, to_gbnf, CALL_RULE)}"


def generic_grammar(tools: list[dict], to_gbnf: SchemaToGbnf, *, required: bool, parallel: bool) -> str:
    from .generic import FORMAT

    return to_gbnf(FORMAT.reply_schema(tools, required=required, parallel=parallel))
