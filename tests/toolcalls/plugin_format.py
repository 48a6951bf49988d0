"""An operator's tool-call format, loaded through the plugin path in tests: `<<call name {args}>>`."""

from barrel_inference.protocol import ToolCall
from barrel_inference.toolcalls.base import ToolCallFormat, ToolCallParseError, arguments_object, canonical_arguments, dumps


class AngleCall(ToolCallFormat):
    name = "angle"
    start = "<<call "
    ends = (">>",)

    def parse(self, span: bytes) -> list[ToolCall]:
        text = self.text_of(span)
        name, _, args = text[len(self.start) : -len(self.ends[0])].partition(" ")
        if not name:
            raise ToolCallParseError("no name")
        return [ToolCall(name=name, arguments=canonical_arguments(args))]

    def render(self, calls: list[ToolCall]) -> bytes:
        return "".join(f"{self.start}{c.name} {dumps(arguments_object(c))}{self.ends[0]}" for c in calls).encode()


FORMAT = AngleCall()
