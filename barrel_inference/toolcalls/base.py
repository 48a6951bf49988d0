"""What every tool-call format is: markers, a parser of a captured span and its inverse.

A span is the exact text a model wrote for its calls, start marker included (and the end marker
when the format has a textual one). `parse` turns it into protocol ToolCalls (arguments as
canonical JSON); `render` turns ToolCalls back into the span the model would have written.
`parse(render(calls)) == calls` for every format, and `render(parse(span)) == span` for a
span written in the format's canonical spelling.
"""

from __future__ import annotations

import json
from typing import Any

from ..protocol import ToolCall


class ToolCallParseError(ValueError):
    """The captured span is not a well-formed call of this format."""


def canonical_arguments(args: Any) -> str:
    """Arguments as the canonical JSON text carried in protocol ToolCalls (compact, key order kept)."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError as exc:
            raise ToolCallParseError(f"arguments are not JSON: {exc}") from exc
    if not isinstance(args, dict):
        raise ToolCallParseError("arguments must be a JSON object")
    return json.dumps(args, ensure_ascii=False, separators=(",", ":"))


def arguments_object(call: ToolCall) -> dict:
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError as exc:
        raise ToolCallParseError(f"arguments of {call.name!r} are not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ToolCallParseError(f"arguments of {call.name!r} must be a JSON object")
    return value


def dumps(value: Any) -> str:
    """JSON as chat templates write it (`tojson`: ', ' and ': ' separators, no ASCII escaping)."""
    return json.dumps(value, ensure_ascii=False)


def loads_object(text: str, what: str = "call") -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ToolCallParseError(f"{what} is not JSON: {exc}") from exc


def call_from_object(obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall:
    """{"name": ..., "arguments"|"parameters": {...}} -> ToolCall."""
    if not isinstance(obj, dict):
        raise ToolCallParseError("a call must be a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallParseError("a call needs a string 'name'")
    for key in args_keys:
        if key in obj:
            return ToolCall(name=name, arguments=canonical_arguments(obj[key]))
    return ToolCall(name=name, arguments="{}")


class ToolCallFormat:
    """One tool-call format. Subclasses set the markers and implement parse / render.

    start: the text that opens a span ("" for formats recognised by the shape of the whole
    output). ends: texts that close it; with none, the span runs to the end of generation.
    end_in_span: whether the closing text belongs to the span (a textual end such as
    </tool_call>) or not (an end-of-generation token such as <|eom_id|>).
    at_eog: a span still open at end of generation is complete (its end is the EOG token).
    calls_per_span: "one" (each call is its own span) or "many".
    bare_start: the model may also write the span without its start marker, as the whole reply.
    """

    name: str = ""
    start: str = ""
    ends: tuple[str, ...] = ()
    end_in_span: bool = True
    at_eog: bool = False
    calls_per_span: str = "one"
    bare_start: bool = False  # a reply that opens with a JSON value is a span too (without the marker)

    def parse(self, span: bytes) -> list[ToolCall]:
        raise NotImplementedError

    def render(self, calls: list[ToolCall]) -> bytes:
        raise NotImplementedError

    def payload_schema(self, tools: list[dict]) -> dict | None:
        """JSON Schema of one call's JSON payload where the format writes a call as one JSON value
        (used to build the grammar that constrains a span); None when it does not."""
        return None

    def span_grammar(self, call_rule: str, parallel: bool, marker) -> str | None:
        """The GBNF of a span after its start marker, given the rule name of one call's JSON and
        `marker(text)`, the GBNF of a marker (a token reference where it is one special token)."""
        return None

    def tool_span_grammar(self, alts: list[tuple[str, str]], parallel: bool, marker) -> str | None:
        """For formats that write the name outside the arguments' JSON: the GBNF of a span after its
        start marker, given (tool name, rule of its arguments) for each tool."""
        return None

    def markers(self) -> list[str]:
        return [m for m in (self.start, *self.ends) if m]

    @staticmethod
    def text_of(span: bytes) -> str:
        try:
            return span.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolCallParseError(f"the span is not UTF-8: {exc}") from exc


def tool_name(tool: dict) -> str | None:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        return fn["name"]
    if isinstance(tool, dict) and isinstance(tool.get("name"), str):
        return tool["name"]
    return None


def tool_parameters(tool: dict) -> dict:
    fn = tool.get("function") if isinstance(tool, dict) else None
    src = fn if isinstance(fn, dict) else tool
    params = src.get("parameters") if isinstance(src, dict) else None
    if params is None and isinstance(src, dict):
        params = src.get("input_schema")
    return params if isinstance(params, dict) else {"type": "object"}


def named_call_schema(tools: list[dict], args_key: str = "arguments") -> dict:
    """{"name": <one declared name>, args_key: <its parameters>} as a JSON Schema (anyOf over tools)."""
    alts = []
    for t in tools:
        name = tool_name(t)
        if name is None:
            continue
        alts.append({
            "type": "object",
            "properties": {"name": {"const": name}, args_key: tool_parameters(t)},
            "required": ["name", args_key],
            "additionalProperties": False,
        })  # fmt: skip
    return alts[0] if len(alts) == 1 else {"anyOf": alts}
