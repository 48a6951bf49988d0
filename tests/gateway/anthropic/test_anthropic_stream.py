"""Typed parts -> content blocks and named SSE events; the stop_reason contract; usage."""

from __future__ import annotations

import json

import pytest

from barrel_inference.gateway.anthropic.blocks import ContentAssembler, stop_reason_of, thinking_signature, usage_json
from barrel_inference.gateway.anthropic.stream import MessageStreamEncoder
from barrel_inference.protocol import (
    CacheInfo, Done, ErrorCode, ErrorInfo, FinishReason, TextPart, ThinkingPart, ToolCallArgs, ToolCallEnd, ToolCallStart, Usage,
)  # fmt: skip


def parse_sse(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        event_line, data_line = block.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: "), block
        name, data = event_line[7:], json.loads(data_line[6:])
        assert data["type"] == name  # every event's name equals its data's type
        out.append((name, data))
    return out


def call(index, call_id, name, *chunks, end=True, arguments=None):
    parts = [ToolCallStart(index=index, id=call_id, name=name)]
    parts += [ToolCallArgs(index=index, text=c) for c in chunks]
    if end:
        parts.append(ToolCallEnd(index=index, arguments=arguments if arguments is not None else "".join(chunks)))
    return parts


def test_text_thinking_and_tool_blocks_in_order():
    enc = MessageStreamEncoder("msg_1", "claude-sonnet-4-5")
    raw = enc.start(prompt_tokens=10, cached_tokens=4)
    raw += enc.parts([ThinkingPart("let me"), ThinkingPart(" think")])
    raw += enc.parts([TextPart("Checking"), TextPart(" now.")])
    raw += enc.parts(call(0, "abc", "get_weather", '{"city":', ' "Paris"}'))
    raw += enc.parts([TextPart("Done.")])
    raw += enc.finish(Done(id="msg_1", finish_reason=FinishReason.TOOL_CALLS, usage=Usage(10, 7, 4)))
    events = parse_sse(raw)
    names = [n for n, _ in events]
    assert names == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    start = events[0][1]["message"]
    assert start == {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [],
                     "stop_reason": None, "stop_sequence": None,
                     "usage": {"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4, "output_tokens": 1,
                               "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}}}  # fmt: skip
    assert events[2][1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[5][1]["delta"] == {"type": "signature_delta", "signature": thinking_signature("let me think")}
    assert events[7][1] == {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}
    tool_start = events[11][1]
    assert tool_start["index"] == 2
    assert tool_start["content_block"] == {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {}}
    assert events[12][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"city":"Paris"}'}
    assert events[14][1]["content_block"] == {"type": "text", "text": ""} and events[14][1]["index"] == 3
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4, "output_tokens": 7}
    assert enc.blocks.content == [
        {"type": "thinking", "thinking": "let me think", "signature": thinking_signature("let me think")},
        {"type": "text", "text": "Checking now."},
        {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "text", "text": "Done."},
    ]


def test_call_cut_by_max_tokens_is_never_exposed():
    enc = MessageStreamEncoder("msg_1", "m")
    raw = enc.start(5)
    raw += enc.parts([TextPart("Let me call it.")])
    raw += enc.parts(call(0, "x", "get_weather", '{"city": "Pa', end=False))
    raw += enc.finish(Done(id="msg_1", finish_reason=FinishReason.LENGTH, usage=Usage(5, 16, 0)))
    events = parse_sse(raw)
    assert not any(d.get("content_block", {}).get("type") == "tool_use" for _, d in events)
    assert not any(d.get("delta", {}).get("type") == "input_json_delta" for _, d in events)
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert enc.blocks.content == [{"type": "text", "text": "Let me call it."}] and enc.blocks.dropped_calls == 1


def test_complete_call_then_cut_call_keeps_the_complete_one_and_says_max_tokens():
    blocks = ContentAssembler()
    blocks.feed(call(0, "a", "f", '{"x": 1}') + call(1, "b", "f", '{"x": ', end=False))
    blocks.finish()
    assert [b["id"] for b in blocks.content] == ["toolu_a"]
    assert stop_reason_of(Done(id="r", finish_reason=FinishReason.LENGTH), blocks.tool_calls) == ("max_tokens", None)


def test_call_with_arguments_that_are_not_an_object_is_dropped():
    blocks = ContentAssembler()
    blocks.feed(call(0, "a", "f", "[1, 2]") + call(1, "b", "f", "not json"))
    blocks.finish()
    assert blocks.content == [] and blocks.tool_calls == 0 and blocks.dropped_calls == 2
    assert stop_reason_of(Done(id="r", finish_reason=FinishReason.TOOL_CALLS), blocks.tool_calls) == ("end_turn", None)


def test_parallel_calls_each_become_a_block():
    blocks = ContentAssembler()
    blocks.feed(call(0, "a", "f", "{}") + call(1, "toolu_b", "g", '{"y": [1]}'))
    assert [(b["id"], b["name"], b["input"]) for b in blocks.content] == [("toolu_a", "f", {}), ("toolu_b", "g", {"y": [1]})]


STOPS = [
    (FinishReason.STOP, None, 0, ("end_turn", None)),
    (FinishReason.STOP, "END", 0, ("stop_sequence", "END")),
    (FinishReason.LENGTH, None, 0, ("max_tokens", None)),
    (FinishReason.LENGTH, None, 1, ("max_tokens", None)),
    (FinishReason.TOOL_CALLS, None, 1, ("tool_use", None)),
    (FinishReason.STOP, None, 2, ("tool_use", None)),
    (FinishReason.TOOL_CALLS, None, 0, ("end_turn", None)),
]  # fmt: skip


@pytest.mark.parametrize("finish,stop_sequence,calls,expected", STOPS)
def test_stop_reason_contract(finish, stop_sequence, calls, expected):
    assert stop_reason_of(Done(id="r", finish_reason=finish, stop_sequence=stop_sequence), calls) == expected


def test_usage_never_invents_cache_figures():
    assert usage_json(100, 0, 3) == {"input_tokens": 100, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 3,
                                     "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}}  # fmt: skip
    assert usage_json(100, 60, 3)["input_tokens"] == 40
    assert usage_json(10, 60, 3)["cache_read_input_tokens"] == 10  # clamped to the prompt
    created = usage_json(100, 60, 3, 40, ttl_1h=True)
    assert (created["input_tokens"], created["cache_creation_input_tokens"], created["cache_read_input_tokens"]) == (0, 40, 60)
    assert created["cache_creation"] == {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 40}
    assert usage_json(100, 60, 3, 90)["cache_creation_input_tokens"] == 40  # never more than was evaluated


def test_message_delta_carries_the_committed_tokens():
    enc = MessageStreamEncoder("msg_1", "m")
    enc.start(prompt_tokens=10, cached_tokens=4)
    done = Done(id="msg_1", finish_reason=FinishReason.STOP, usage=Usage(10, 2, 4), cache=CacheInfo(evaluated_tokens=6, committed_tokens=6))
    delta = parse_sse(enc.finish(done))[0][1]
    assert delta["usage"] == {"input_tokens": 0, "cache_creation_input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": 2}


def test_error_event_and_ping():
    enc = MessageStreamEncoder("msg_1", "m")
    assert parse_sse(enc.error(ErrorInfo(ErrorCode.WORKER_UNAVAILABLE, "the worker died"))) == [
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "the worker died"}})
    ]
    assert parse_sse(enc.error(ErrorInfo(ErrorCode.DECODE_FAILED, "decode failed")))[0][1]["error"]["type"] == "api_error"
    assert parse_sse(enc.ping()) == [("ping", {"type": "ping"})]


def test_empty_text_parts_open_no_block():
    enc = MessageStreamEncoder("msg_1", "m")
    assert enc.parts([TextPart("")]) == b""
    raw = enc.finish(Done(id="msg_1", finish_reason=FinishReason.STOP, usage=Usage(3, 0, 0)))
    assert [n for n, _ in parse_sse(raw)] == ["message_delta", "message_stop"]
    assert enc.blocks.content == []
