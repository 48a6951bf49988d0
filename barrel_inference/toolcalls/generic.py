"""generic: for models whose template shows no tool format (Gemma 3 270M has no template at all).

The tools are described in a system message, and a grammar holds the whole reply to one JSON
object, as llama-server's generic handler does:
  {"tool_call": {"name": …, "arguments": {…}}}            one call
  {"tool_calls": [{"name": …, "arguments": {…}}, …]}      parallel calls
  {"response": "…"}                                       a plain answer (tool_choice auto only)
"""

from __future__ import annotations

import json
import re

from ..protocol import ToolCall
from .base import ToolCallFormat, ToolCallParseError, arguments_object, call_from_object, dumps, loads_object, named_call_schema, tool_name


_RESPONSE_START = re.compile(r'\s*\{\s*"response"\s*:\s*"((?:[^"\\]|\\.)*)', re.S)


class Generic(ToolCallFormat):
    name = "generic"
    start = ""
    ends = ()
    end_in_span = False
    at_eog = True
    calls_per_span = "many"

    def _value(self, span: bytes) -> dict:
        value = loads_object(self.text_of(span).strip(), "reply")
        if not isinstance(value, dict):
            raise ToolCallParseError("the reply must be a JSON object")
        return value

    def parse(self, span: bytes) -> list[ToolCall]:
        value = self._value(span)
        if "tool_call" in value:
            return [call_from_object(value["tool_call"])]
        if isinstance(value.get("tool_calls"), list) and value["tool_calls"]:
            return [call_from_object(o) for o in value["tool_calls"]]
        raise ToolCallParseError("the reply holds no tool_call")

    def as_text(self, span: bytes) -> str | None:
        """The answer of a {"response": …} reply; None when the reply is not one."""
        try:
            value = self._value(span)
        except ToolCallParseError:
            return None
        resp = value.get("response")
        return resp if isinstance(resp, str) and len(value) == 1 else None

    def partial_text(self, span: bytes) -> str:
        """A reply cut by the token limit: the answer so far of a {"response": "…"} reply, else nothing
        (the start of a call is never text)."""
        m = _RESPONSE_START.match(self.text_of(span))
        if m is None:
            return ""
        body = m.group(1)
        for cut in range(len(body), max(-1, len(body) - 12), -1):  # drop a half-written escape at the end
            try:
                return json.loads('"' + body[:cut] + '"')
            except ValueError:
                continue
        return ""

    def render(self, calls: list[ToolCall]) -> bytes:
        objs = [f'{{"name": {dumps(c.name)}, "arguments": {dumps(arguments_object(c))}}}' for c in calls]
        if len(objs) == 1:
            return f'{{"tool_call": {objs[0]}}}'.encode()
        return f'{{"tool_calls": [{", ".join(objs)}]}}'.encode()

    def reply_schema(self, tools: list[dict], *, required: bool, parallel: bool) -> dict:
        """The JSON Schema the whole reply is held to."""
        call = named_call_schema(tools, "arguments")
        alts = [{"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"], "additionalProperties": False}]
        if parallel:
            alts.append({
                "type": "object",
                "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
                "required": ["tool_calls"], "additionalProperties": False,
            })  # fmt: skip
        if not required:
            alts.append({"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"], "additionalProperties": False})
        return alts[0] if len(alts) == 1 else {"anyOf": alts}

    def system_prompt(self, tools: list[dict], *, required: bool, parallel: bool) -> str:
        names = ", ".join(n for n in (tool_name(t) for t in tools) if n)
        lines = [
            "You can call these tools (JSON Schema of each tool's arguments):",
            json.dumps([t.get("function", t) for t in tools], ensure_ascii=False, indent=2),
            "",
            "Reply with one JSON object and nothing else:",
            '- to call a tool: {"tool_call": {"name": "<tool>", "arguments": {…}}}',
        ]
        if parallel:
            lines.append('- to call several tools at once: {"tool_calls": [{"name": …, "arguments": …}, …]}')
        if not required:
            lines.append('- to answer without a tool: {"response": "<your answer>"}')
        lines.append(f"Tools: {names}.")
        return "\n".join(lines)


FORMAT = Generic()
