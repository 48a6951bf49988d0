"""mistral-tool-calls: `[TOOL_CALLS] [{"name": …, "arguments": …}, …]` (Mistral 7B v0.3, Nemo), and the
newer spelling `[TOOL_CALLS]name[ARGS]{…}` (Mistral Small 3.2, Magistral, Devstral) as
`mistral-tool-calls-args`. Both parse either spelling; each renders its own. The span runs to the
end of generation (</s>).
"""

from __future__ import annotations

from ..protocol import ToolCall
from .grammar import literal
from .base import ToolCallFormat, ToolCallParseError, arguments_object, call_from_object, canonical_arguments, dumps, loads_object, named_call_schema

ARGS = "[ARGS]"


class MistralToolCalls(ToolCallFormat):
    name = "mistral-tool-calls"
    start = "[TOOL_CALLS]"
    ends = ()
    end_in_span = False
    at_eog = True
    calls_per_span = "many"
    args_spelling = False

    def parse(self, span: bytes) -> list[ToolCall]:
        text = self.text_of(span)
        if not text.startswith(self.start):
            raise ToolCallParseError(f"a {self.name} span starts with {self.start}")
        body = text[len(self.start) :]
        if body.lstrip().startswith("["):
            items = loads_object(body.strip())
            if not isinstance(items, list) or not items:
                raise ToolCallParseError("[TOOL_CALLS] is followed by a non-empty JSON list of calls")
            return [call_from_object(o) for o in items]
        calls = []
        for chunk in body.split(self.start):  # parallel calls each repeat the marker
            if not chunk.strip():
                continue
            name, sep, args = chunk.partition(ARGS)
            name = name.strip()
            if not sep or not name:
                raise ToolCallParseError("expected name[ARGS]{…} after [TOOL_CALLS]")
            calls.append(ToolCall(name=name, arguments=canonical_arguments(loads_object(args.strip(), "arguments"))))
        if not calls:
            raise ToolCallParseError("no call after [TOOL_CALLS]")
        return calls

    def render(self, calls: list[ToolCall]) -> bytes:
        if self.args_spelling:
            return "".join(f"{self.start}{c.name}{ARGS}{dumps(arguments_object(c))}" for c in calls).encode()
        items = ", ".join(f'{{"name": {dumps(c.name)}, "arguments": {dumps(arguments_object(c))}}}' for c in calls)
        return f"{self.start} [{items}]".encode()

    def payload_schema(self, tools: list[dict]) -> dict | None:
        return None if self.args_spelling else named_call_schema(tools, "arguments")

    def span_grammar(self, call_rule: str, parallel: bool, marker) -> str | None:
        if self.args_spelling:
            return None
        more = f' ( ", " {call_rule} )*' if parallel else ""
        return f'" "? "[" {call_rule}{more} "]"'


class MistralToolCallsArgs(MistralToolCalls):
    name = "mistral-tool-calls-args"
    args_spelling = True

    def tool_span_grammar(self, alts, parallel: bool, marker) -> str:
        call = "( " + " | ".join(f"{literal(name)} {marker(ARGS)} {rule}" for name, rule in alts) + " )"
        return f"{call} ( {marker(self.start)} {call} )*" if parallel else call

    def markers(self) -> list[str]:
        return [self.start, ARGS]


FORMAT = MistralToolCalls()
FORMAT_ARGS = MistralToolCallsArgs()
