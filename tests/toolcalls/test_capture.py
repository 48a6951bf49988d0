"""The streaming capture: markers split at every byte boundary never leak, calls come out whole
and valid, thinking is split off, and the stop-reason contract holds."""

from __future__ import annotations

import itertools

import pytest

from barrel_inference.protocol import FinishReason, TextPart, ThinkingPart, ToolCallArgs, ToolCallEnd, ToolCallStart
from barrel_inference.toolcalls import FormatTable
from barrel_inference.toolcalls.capture import Capture
from barrel_inference.toolcalls.schema import ToolSchemaError, ToolValidator

from .test_formats import CANONICAL

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS = [WEATHER]
THINK = ("<think>", "</think>")
ARGS = '{"city":"Paris"}'


def ids():
    counter = itertools.count()
    return lambda: f"c{next(counter)}"


def merged(parts):
    out = []
    for p in parts:
        if out and type(p) is type(out[-1]) and type(p) in (TextPart, ThinkingPart):
            out[-1] = type(p)(out[-1].text + p.text)
        else:
            out.append(p)
    return out


def run(fmt, pieces, *, tools=TOOLS, reason=FinishReason.STOP, **kw):
    cap = Capture(FormatTable().get(fmt) if fmt else None, tools, new_id=ids(), **kw)
    parts = []
    for p in pieces:
        cap.feed(p)
        parts += cap.take()
    finish = cap.finish(reason)
    return merged(parts + cap.take()), finish, cap


def splits(data: bytes):
    """Every way of cutting data in two, plus one byte per piece."""
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]
    yield [data[i : i + 1] for i in range(len(data))]


def call_parts(span: str, index: int = 0, id: str = "c0"):
    return [ToolCallStart(index, id, "get_weather"), ToolCallArgs(index, ARGS), ToolCallEnd(index, ARGS, span)]


MARKED = [n for n in sorted(CANONICAL) if FormatTable().get(n).start]


@pytest.mark.parametrize("name", MARKED)
def test_call_after_text_split_at_every_byte(name):
    span = CANONICAL[name]
    data = ("Let me check. " + span).encode()
    for pieces in splits(data):
        parts, finish, _ = run(name, pieces)
        assert parts == [TextPart("Let me check. "), *call_parts(span)], pieces
        assert finish is FinishReason.TOOL_CALLS


@pytest.mark.parametrize("name", ["bare-json", "generic"])
def test_markerless_reply_is_a_call(name):
    span = CANONICAL[name]
    for pieces in splits(("\n" + span).encode()):
        parts, finish, _ = run(name, pieces)
        assert parts == call_parts(span) and finish is FinishReason.TOOL_CALLS


def test_thinking_split_at_every_byte_then_a_call():
    span = CANONICAL["qwen-xml"]
    data = ("<think>rain in Paris?</think>\n\n" + span).encode()
    for pieces in splits(data):
        parts, finish, _ = run("qwen-xml", pieces, thinking=THINK)
        assert parts == [ThinkingPart("rain in Paris?"), *call_parts(span)]
        assert finish is FinishReason.TOOL_CALLS


def test_prompt_opened_the_thinking_span():
    parts, finish, _ = run(None, [b"hm", b"m</th", b"ink>\n\nIt", b" rains."], tools=None, thinking=THINK, in_thinking=True)
    assert parts == [ThinkingPart("hmm"), TextPart("It rains.")] and finish is FinishReason.STOP


def test_text_only_turn_with_tools_ends_as_stop():
    parts, finish, _ = run("qwen-xml", [b"No tool ", b"needed <tool", b" really"])
    assert parts == [TextPart("No tool needed <tool really")] and finish is FinishReason.STOP


def test_partial_marker_at_the_end_is_text():
    parts, finish, _ = run("qwen-xml", [b"almost <tool_ca"])
    assert parts == [TextPart("almost <tool_ca")] and finish is FinishReason.STOP


def test_without_tools_markers_are_text():
    span = CANONICAL["qwen-xml"]
    parts, finish, _ = run("qwen-xml", [span.encode()], tools=None)
    assert parts == [TextPart(span)] and finish is FinishReason.STOP


@pytest.mark.parametrize("name", MARKED)
def test_call_cut_by_max_tokens_is_dropped(name):
    span = CANONICAL[name].encode()
    parts, finish, _ = run(name, [b"Checking. ", span[: len(span) - 3]], reason=FinishReason.LENGTH)
    assert parts == [TextPart("Checking. ")]
    assert finish is FinishReason.LENGTH


def test_call_cut_just_after_its_marker_is_dropped():
    parts, finish, _ = run("qwen-xml", [b"<tool_call>"], reason=FinishReason.LENGTH)
    assert parts == [] and finish is FinishReason.LENGTH


@pytest.mark.parametrize(
    "span, why",
    [
        ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "not a declared tool"),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": 7}}\n</tool_call>', "do not match"),
        ('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>', "do not match"),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>', "malformed"),
    ],
)
def test_invalid_call_is_an_error_never_a_call(span, why):
    parts, finish, cap = run("qwen-xml", [b"ok ", span.encode(), b"more text"])
    assert finish is FinishReason.ERROR and why in cap.error
    assert not any(isinstance(p, (ToolCallStart, ToolCallArgs, ToolCallEnd)) for p in parts)


def test_parallel_calls_keep_order_with_text():
    a = CANONICAL["qwen-xml"]
    b = a.replace("Paris", "Rome")
    parts, finish, cap = run("qwen-xml", [b"x ", a.encode(), b"\n", b.encode()])
    assert finish is FinishReason.TOOL_CALLS and [c.id for c in cap.calls] == ["c0", "c1"]
    assert parts[0] == TextPart("x ") and parts[1:4] == call_parts(a)
    assert parts[5] == ToolCallStart(1, "c1", "get_weather") and parts[7].raw == b


def test_one_call_only_without_parallel_calls():
    a = CANONICAL["qwen-xml"]
    cap = Capture(FormatTable().get("qwen-xml"), TOOLS, parallel=False, new_id=ids())
    cap.feed(a.encode())
    assert cap.finished
    cap.feed(b"\n" + a.encode())
    assert cap.finish(FinishReason.STOP) is FinishReason.TOOL_CALLS and len(cap.calls) == 1
    many = Capture(FormatTable().get("mistral-tool-calls"), TOOLS, parallel=False, new_id=ids())
    many.feed(b'[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "get_weather", "arguments": {"city": "B"}}]')
    assert many.finish(FinishReason.STOP) is FinishReason.TOOL_CALLS and len(many.calls) == 1


def test_eog_ended_format_needs_the_end_of_generation():
    span = CANONICAL["llama-python-tag"].encode()
    parts, finish, _ = run("llama-python-tag", [span], reason=FinishReason.STOP)
    assert finish is FinishReason.TOOL_CALLS and parts == call_parts(span.decode())


def test_qwen_call_without_its_end_marker_at_eog_is_accepted_when_whole():
    span = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    parts, finish, _ = run("qwen-xml", [span.encode()])
    assert finish is FinishReason.TOOL_CALLS and parts == call_parts(span)


def test_bare_json_that_is_not_a_call_stays_text():
    parts, finish, _ = run("bare-json", [b'{"answer": ', b"42}"])
    assert parts == [TextPart('{"answer": 42}')] and finish is FinishReason.STOP


def test_generic_response_is_text():
    parts, finish, _ = run("generic", [b'{"response": "It is sunny."}'])
    assert parts == [TextPart("It is sunny.")] and finish is FinishReason.STOP


def test_multibyte_text_split_inside_a_character():
    data = "héllo ✓ ".encode() + CANONICAL["dsml"].encode()
    for pieces in splits(data):
        parts, _, _ = run("dsml", pieces)
        assert parts[0] == TextPart("héllo ✓ ") and isinstance(parts[1], ToolCallStart)


def test_thinking_tokens_are_counted():
    cap = Capture(None, None, thinking=THINK, in_thinking=True)
    for p in [b"a", b"b", b"c"]:
        cap.feed(p)
    assert cap.thinking_tokens == 3 and cap.in_thinking


def test_bad_tool_schema_is_the_requests_fault():
    with pytest.raises(ToolSchemaError) as exc:
        ToolValidator([WEATHER, {"type": "function", "function": {"name": "x", "parameters": {"type": "nope"}}}])
    assert exc.value.index == 1


def test_remote_refs_are_never_fetched():
    v = ToolValidator([{"type": "function", "function": {"name": "f", "parameters": {"$ref": "http://127.0.0.1:9/schema.json"}}}])
    from barrel_inference.protocol import ToolCall

    assert "cannot be applied" in v.error(ToolCall("f", "{}"))


def test_llama_writes_the_call_without_its_tag():
    span = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    parts, finish, _ = run("llama-python-tag", [b" ", span[:9].encode(), span[9:].encode()])
    assert finish is FinishReason.TOOL_CALLS and parts == call_parts(span)
    parts, finish, _ = run("llama-python-tag", [b'{"answer": 1}'])
    assert finish is FinishReason.STOP and parts == [TextPart('{"answer": 1}')]


@pytest.mark.parametrize("pattern", ["(a+)+$", "^(\\w+\\s?)*$", "(a*){2,}", "a" * 1001])
def test_patterns_that_could_backtrack_forever_are_refused(pattern):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}}}
    with pytest.raises(ToolSchemaError):
        ToolValidator([tool])


@pytest.mark.parametrize("pattern", ["^[A-Z][a-z]+$", "^\\d{3}-\\d{4}$", "(ab)+", "^(foo|bar)$"])
def test_ordinary_patterns_are_checked(pattern):
    from barrel_inference.protocol import ToolCall

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}}}
    v = ToolValidator([tool])
    assert v.error(ToolCall("f", '{"s": "~~~"}')) is not None
