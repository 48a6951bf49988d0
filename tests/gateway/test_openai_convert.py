"""Pure OpenAI conversions: request -> Submit, Done -> response, ErrorCode -> status, SSE chunks."""

from __future__ import annotations

import json

import msgspec
import pytest

from barrel_inference.gateway.errors import GatewayError
from barrel_inference.gateway.openai.convert import (
    chat_response, chat_to_submit, completion_to_submit, error_body, error_status,
)  # fmt: skip
from barrel_inference.gateway.openai.stream import ChatStreamEncoder, CompletionStreamEncoder
from barrel_inference.gateway.openai.wire import ChatCompletionRequest, CompletionRequest, decode
from barrel_inference.protocol import Done, ErrorCode, ErrorInfo, FinishReason, Sampling, Usage


def chat_req(**kw) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}
    return decode(json.dumps(body).encode(), ChatCompletionRequest)


STATUS = [
    (ErrorCode.INVALID_REQUEST, 400), (ErrorCode.CONTEXT_LENGTH, 400), (ErrorCode.GRAMMAR, 400),
    (ErrorCode.TEMPLATE, 400), (ErrorCode.UNSUPPORTED, 400), (ErrorCode.MODEL_NOT_FOUND, 404),
    (ErrorCode.OVERLOADED, 503), (ErrorCode.WORKER_UNAVAILABLE, 503), (ErrorCode.DECODE_FAILED, 500),
    (ErrorCode.INTERNAL, 500), (ErrorCode.NOT_FOUND, 404), (ErrorCode.METHOD_NOT_ALLOWED, 405),
    (ErrorCode.REQUEST_TOO_LARGE, 413), (ErrorCode.QUEUE_TIMEOUT, 504), (ErrorCode.TOOL_CALL_INVALID, 500),
    (ErrorCode.FORBIDDEN, 403), (ErrorCode.OUTPUT_INVALID, 500), (ErrorCode.UNAUTHENTICATED, 401),
    (ErrorCode.UNSUPPORTED_MEDIA_TYPE, 415),
]  # fmt: skip


@pytest.mark.parametrize("code,status", STATUS)
def test_error_status_and_body(code, status):
    assert error_status(code) == status
    body = error_body(ErrorInfo(code, "msg", param="p"))
    assert body == {"error": {"message": "msg", "type": "invalid_request_error" if status < 500 else "server_error",
                              "param": "p", "code": code.value}}  # fmt: skip


def test_every_error_code_has_a_status():
    assert {c for c, _ in STATUS} == set(ErrorCode)


def test_messages_convert_to_engine_terms():
    req = chat_req(messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": None, "reasoning_content": "hmm",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ])  # fmt: skip
    s = chat_to_submit(req, "rid")
    roles = [m.role for m in s.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    assert s.messages[1].content == "part one\npart two"
    assert s.messages[2].content == "" and s.messages[2].thinking == "hmm"
    assert s.messages[2].tool_calls[0].name == "f" and s.messages[2].tool_calls[0].arguments == '{"a":1}'
    assert s.messages[2].tool_calls[0].id == "call_1"
    assert s.messages[3].tool_call_id == "call_1"


def test_defaults_keep_engine_sampling():
    s = chat_to_submit(chat_req(), "rid")
    assert s.sampling == Sampling()
    assert s.max_tokens is None and s.stop == [] and s.json_schema is None and s.tools is None


@pytest.mark.parametrize("response_format,schema", [
    (None, None),
    ({"type": "text"}, None),
    ({"type": "json_object"}, {}),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": ["a"]}}},
     {"type": "object", "required": ["a"]}),
])  # fmt: skip
def test_response_format(response_format, schema):
    kw = {"response_format": response_format} if response_format else {}
    assert chat_to_submit(chat_req(**kw), "r").json_schema == schema


def test_tool_choice_none_hides_tools():
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert chat_to_submit(chat_req(tools=tools), "r").tools == tools
    assert chat_to_submit(chat_req(tools=tools, tool_choice="none"), "r").tools is None


@pytest.mark.parametrize("prompt,text,tokens", [
    ("abc", "abc", None), (["abc"], "abc", None), ([1, 2, 3], None, [1, 2, 3]),
])  # fmt: skip
def test_completion_prompts(prompt, text, tokens):
    req = msgspec.convert({"model": "m", "prompt": prompt}, CompletionRequest)
    s = completion_to_submit(req, "r")
    assert (s.prompt, s.prompt_tokens, s.max_tokens) == (text, tokens, 16)


def test_image_part_is_unsupported_and_named():
    req = chat_req(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(GatewayError) as info:
        chat_to_submit(req, "r")
    assert info.value.code == ErrorCode.UNSUPPORTED and info.value.param == "messages[0].content[1]"


def test_chat_response_shape():
    done = Done(id="r", finish_reason=FinishReason.LENGTH, usage=Usage(5, 2, 3))
    body = chat_response("r", "m", 7, "hey", done)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}}


def parse(raw: bytes) -> list:
    out = []
    for block in raw.decode().split("\n\n"):
        if block:
            data = block.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_chat_stream_encoder():
    enc = ChatStreamEncoder("r", "m", 7, include_usage=True)
    done = Done(id="r", finish_reason=FinishReason.STOP, usage=Usage(1, 2, 0))
    events = parse(enc.start() + enc.text("a") + enc.text("") + enc.finish(done))
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[1]["choices"][0]["delta"] == {"content": "a"}
    assert events[2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert events[3]["choices"] == [] and events[3]["usage"]["total_tokens"] == 3
    assert events[4] == "[DONE]" and len(events) == 5


def test_completion_stream_encoder_and_error():
    enc = CompletionStreamEncoder("r", "m", 7, include_usage=False)
    assert enc.start() == b""
    events = parse(enc.text("x") + enc.error(ErrorInfo(ErrorCode.WORKER_UNAVAILABLE, "gone")))
    assert events[0]["object"] == "text_completion" and events[0]["choices"][0]["text"] == "x"
    assert events[1]["error"]["code"] == "worker_unavailable" and events[2] == "[DONE]"
