"""dsml: DeepSeek V3 / R1 markers, the function name and fenced JSON arguments:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Also parsed: V3.1's unfenced `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`.
Several calls share one span, joined by a newline.
"""

from __future__ import annotations

import re

from ..protocol import ToolCall
from .grammar import literal
from .base import ToolCallFormat, ToolCallParseError, arguments_object, canonical_arguments, dumps, loads_object

BEGIN = "<｜tool▁calls▁begin｜>"
END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
_FENCE = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.S)


class Dsml(ToolCallFormat):
    name = "dsml"
    start = BEGIN
    ends = (END,)
    end_in_span = True
    calls_per_span = "many"

    def parse(self, span: bytes) -> list[ToolCall]:
        text = self.text_of(span)
        if not text.startswith(BEGIN) or not text.endswith(END):
            raise ToolCallParseError(f"a {self.name} span is enclosed in {BEGIN}…{END}")
        body = text[len(BEGIN) : -len(END)]
        calls = []
        for chunk in body.split(CALL_BEGIN)[1:]:
            inner, sep_end, rest = chunk.partition(CALL_END)
            if not sep_end or rest.strip():
                raise ToolCallParseError(f"each call ends with {CALL_END}")
            head, sep, args = inner.partition(SEP)
            if not sep:
                raise ToolCallParseError(f"a call separates its type or name with {SEP}")
            if head.strip() in ("function", ""):  # V3 / R1: type<sep>name\n```json …```
                name, _, args = args.partition("\n")
            else:  # V3.1: name<sep>{…}
                name = head
            name = name.strip()
            if not name:
                raise ToolCallParseError("a call needs a function name")
            m = _FENCE.match(args)
            payload = m.group(1) if m else args.strip()
            calls.append(ToolCall(name=name, arguments=canonical_arguments(loads_object(payload, "arguments"))))
        if not calls or body.split(CALL_BEGIN)[0].strip():
            raise ToolCallParseError(f"expected {CALL_BEGIN} right after {BEGIN}")
        return calls

    def render(self, calls: list[ToolCall]) -> bytes:
        blocks = [
            f"{CALL_BEGIN}function{SEP}{c.name}\n```json\n{dumps(arguments_object(c))}\n```{CALL_END}" for c in calls
        ]
        return (BEGIN + "\n".join(blocks) + END).encode()

    def tool_span_grammar(self, alts, parallel: bool, marker) -> str:
        call = (f"{marker(CALL_BEGIN)} \"function\" {marker(SEP)} ( "
                + " | ".join(f"{literal(name)} \"\\n```json\\n\" {rule}" for name, rule in alts)
                + f" ) \"\\n```\" {marker(CALL_END)}")  # fmt: skip
        more = f' ( "\\n" {call} )*' if parallel else ""
        return f"{call}{more} {marker(END)}"

    def markers(self) -> list[str]:
        return [BEGIN, END, CALL_BEGIN, CALL_END, SEP]


FORMAT = Dsml()


# ---- DeepSeek V3.2: DSML invoke blocks -------------------------------------------------------

DSML_BEGIN = "<｜DSML｜function_calls>"
DSML_END = "</｜DSML｜function_calls>"
_INVOKE = re.compile(r'<｜DSML｜invoke name="([^"]+)">(.*?)</｜DSML｜invoke>', re.S)
_PARAM = re.compile(r'<｜DSML｜parameter name="([^"]+)" string="(true|false)">(.*?)</｜DSML｜parameter>', re.S)


class DsmlInvoke(ToolCallFormat):
    """`<｜DSML｜function_calls>` holding `<｜DSML｜invoke name=…>` blocks of `<｜DSML｜parameter …>` values
    (string="true": the text as is; otherwise a JSON value)."""

    name = "dsml-invoke"
    start = DSML_BEGIN
    ends = (DSML_END,)
    end_in_span = True
    calls_per_span = "many"

    def parse(self, span: bytes) -> list[ToolCall]:
        text = self.text_of(span)
        if not text.startswith(DSML_BEGIN) or not text.endswith(DSML_END):
            raise ToolCallParseError(f"a {self.name} span is enclosed in {DSML_BEGIN}…{DSML_END}")
        body = text[len(DSML_BEGIN) : -len(DSML_END)]
        calls, pos = [], 0
        for m in _INVOKE.finditer(body):
            if body[pos : m.start()].strip():
                raise ToolCallParseError("only invoke blocks belong in a function_calls span")
            pos = m.end()
            args, ppos = {}, 0
            inner = m.group(2)
            for p in _PARAM.finditer(inner):
                if inner[ppos : p.start()].strip():
                    raise ToolCallParseError("only parameter blocks belong in an invoke block")
                ppos = p.end()
                args[p.group(1)] = p.group(3) if p.group(2) == "true" else loads_object(p.group(3), "a parameter")
            if inner[ppos:].strip():
                raise ToolCallParseError("only parameter blocks belong in an invoke block")
            calls.append(ToolCall(name=m.group(1), arguments=canonical_arguments(args)))
        if not calls or body[pos:].strip():
            raise ToolCallParseError("expected invoke blocks")
        return calls

    def render(self, calls: list[ToolCall]) -> bytes:
        out = [DSML_BEGIN]
        for c in calls:
            out.append(f'<｜DSML｜invoke name="{c.name}">')
            for k, v in arguments_object(c).items():
                s, val = ("true", v) if isinstance(v, str) else ("false", dumps(v))
                out.append(f'<｜DSML｜parameter name="{k}" string="{s}">{val}</｜DSML｜parameter>')
            out.append("</｜DSML｜invoke>")
        out.append(DSML_END)
        return "\n".join(out).encode()


FORMAT_INVOKE = DsmlInvoke()
