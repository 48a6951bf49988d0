"""bare-json, the catch-all: the whole reply is a call object `{"name": …, "arguments": …}` (or a
list of them), with no markers. A reply that starts like JSON but is not a call stays text.
"""

from __future__ import annotations

from ..protocol import ToolCall
from .base import ToolCallFormat, ToolCallParseError, arguments_object, call_from_object, dumps, loads_object, named_call_schema


class BareJson(ToolCallFormat):
    name = "bare-json"
    start = ""
    ends = ()
    end_in_span = False
    at_eog = True
    calls_per_span = "many"

    def parse(self, span: bytes) -> list[ToolCall]:
        value = loads_object(self.text_of(span).strip())
        items = value if isinstance(value, list) else [value]
        if not items:
            raise ToolCallParseError("an empty list is not a call")
        return [call_from_object(o) for o in items]

    def render(self, calls: list[ToolCall]) -> bytes:
        objs = [f'{{"name": {dumps(c.name)}, "arguments": {dumps(arguments_object(c))}}}' for c in calls]
        return (objs[0] if len(objs) == 1 else "[" + ", ".join(objs) + "]").encode()

    def payload_schema(self, tools: list[dict]) -> dict:
        return named_call_schema(tools, "arguments")

    def span_grammar(self, call_rule: str, parallel: bool, marker) -> str:
        return f'{call_rule} | "[" {call_rule} ( ", " {call_rule} )* "]"' if parallel else call_rule


FORMAT = BareJson()
