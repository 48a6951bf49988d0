"""qwen-xml: `<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>` (Hermes, Qwen 2.5, Qwen 3).

One call per span; parallel calls are consecutive spans separated by a newline.
"""

from __future__ import annotations

from ..protocol import ToolCall
from .base import ToolCallFormat, ToolCallParseError, arguments_object, call_from_object, dumps, loads_object, named_call_schema


class QwenXml(ToolCallFormat):
    name = "qwen-xml"
    start = "<tool_call>"
    ends = ("</tool_call>",)
    end_in_span = True

    def parse(self, span: bytes) -> list[ToolCall]:
        text = self.text_of(span)
        if not text.startswith(self.start) or not text.endswith(self.ends[0]):
            raise ToolCallParseError(f"a {self.name} call is enclosed in {self.start}…{self.ends[0]}")
        body = text[len(self.start) : -len(self.ends[0])].strip()
        return [call_from_object(loads_object(body))]

    def render(self, calls: list[ToolCall]) -> bytes:
        spans = [
            f'{self.start}\n{{"name": {dumps(c.name)}, "arguments": {dumps(arguments_object(c))}}}\n{self.ends[0]}'
            for c in calls
        ]
        return "\n".join(spans).encode()

    def payload_schema(self, tools: list[dict]) -> dict:
        return named_call_schema(tools, "arguments")

    def span_grammar(self, call_rule: str, parallel: bool, marker) -> str:
        one = f'"\\n"? {call_rule} "\\n"? {marker(self.ends[0])}'
        return f'{one} ( "\\n"? {marker(self.start)} {one} )*' if parallel else one


FORMAT = QwenXml()
