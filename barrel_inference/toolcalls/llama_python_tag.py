"""llama-python-tag: `<|python_tag|>{"name": …, "parameters": …}`, ended by <|eom_id|> or <|eot_id|>
(Llama 3.1 / 3.2 / 3.3). The end tokens end the generation and are not part of the span. With
JSON tools the model also writes the object as the whole reply without the tag; that parses too.
"""

from __future__ import annotations

from ..protocol import ToolCall
from .base import ToolCallFormat, ToolCallParseError, arguments_object, call_from_object, dumps, loads_object, named_call_schema


class LlamaPythonTag(ToolCallFormat):
    name = "llama-python-tag"
    start = "<|python_tag|>"
    ends = ("<|eom_id|>", "<|eot_id|>")
    end_in_span = False
    at_eog = True
    calls_per_span = "many"
    bare_start = True  # with JSON tools Llama 3.1 writes the object alone, no <|python_tag|>

    def parse(self, span: bytes) -> list[ToolCall]:
        text = self.text_of(span)
        body = (text[len(self.start) :] if text.startswith(self.start) else text).strip()
        # several calls are written one after another, separated by ';' or newlines
        calls, pos = [], 0
        import json

        dec = json.JSONDecoder()
        while pos < len(body):
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
            if pos >= len(body):
                break
            try:
                obj, pos = dec.raw_decode(body, pos)
            except ValueError as exc:
                raise ToolCallParseError(f"call is not JSON: {exc}") from exc
            calls.append(call_from_object(obj, ("parameters", "arguments")))
        if not calls:
            loads_object(body)  # raises with the JSON error
        return calls

    def render(self, calls: list[ToolCall]) -> bytes:
        body = "; ".join(f'{{"name": {dumps(c.name)}, "parameters": {dumps(arguments_object(c))}}}' for c in calls)
        return (self.start + body).encode()

    def payload_schema(self, tools: list[dict]) -> dict:
        return named_call_schema(tools, "parameters")

    def span_grammar(self, call_rule: str, parallel: bool, marker) -> str:
        more = f' ( "; " {call_rule} )*' if parallel else ""
        return f"{call_rule}{more}"


FORMAT = LlamaPythonTag()
