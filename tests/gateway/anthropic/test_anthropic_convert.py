"""Pure Anthropic conversions: request body -> Submit, errors -> envelope, models list, the key allowlist."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from barrel_inference.gateway.anthropic.convert import prompt_of, to_submit, turn_options
from barrel_inference.gateway.anthropic.definition import FAMILY
from barrel_inference.gateway.anthropic.errors import error_body, error_status
from barrel_inference.gateway.anthropic.models import list_of, page
from barrel_inference.gateway.anthropic.wire import CountTokensRequest, MessagesRequest, WireError, decode
from barrel_inference.gateway.errors import GatewayError
from barrel_inference.protocol import ChatMessage, ErrorCode, ErrorInfo, ToolCall


def req(**kw) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **kw}
    return decode(json.dumps(body).encode(), MessagesRequest)


def submit(**kw):
    return to_submit(req(**kw), "msg_1")


def refused(**kw) -> GatewayError:
    with pytest.raises((GatewayError, WireError)) as info:
        submit(**kw)
    return info.value


WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip


def test_minimal_request():
    s = submit()
    assert s.id == "msg_1" and s.max_tokens == 16 and s.stop == [] and s.tools is None
    assert s.messages == [ChatMessage(role="user", content="hi")]


@pytest.mark.parametrize("system,expected", [
    ("be brief", "be brief"),
    ([{"type": "text", "text": "You are Claude Code."},
      {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
     "You are Claude Code.\n\nBe brief."),
])  # fmt: skip
def test_system_string_or_text_blocks(system, expected):
    s = submit(system=system)
    assert s.messages[0] == ChatMessage(role="system", content=expected)
    assert s.messages[1].role == "user"


def test_sampling_stop_and_ignored_fields():
    s = submit(temperature=0.0, top_p=0.5, top_k=7, stop_sequences=["END", "\n\nHuman:"],
               metadata={"user_id": "u1"}, service_tier="auto", container=None, stream=True)  # fmt: skip
    assert (s.sampling.temperature, s.sampling.top_p, s.sampling.top_k) == (0.0, 0.5, 7)
    assert s.stop == ["END", "\n\nHuman:"]


def test_metadata_user_id_with_the_first_user_message_is_the_session():
    """A client that names its user (Claude Code sends metadata.user_id) gets a session without any
    session header: every turn of one conversation the same, another conversation of that user
    (another first user message) its own, and none without a user id."""
    turn1 = [{"role": "user", "content": "fix the bug"}]
    turn2 = turn1 + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "and test it"}]
    a1 = submit(messages=turn1, metadata={"user_id": "user_1_session_9"}, system="You are Claude Code.")
    a2 = submit(messages=turn2, metadata={"user_id": "user_1_session_9"}, system="You are Claude Code.")
    assert a1.session is not None and a1.session.startswith("u:") and a1.session == a2.session
    assert submit(messages=[{"role": "user", "content": "write docs"}], metadata={"user_id": "user_1_session_9"}).session != a1.session
    assert submit(messages=turn1, metadata={"user_id": "user_2_session_1"}).session != a1.session
    assert submit(messages=turn1).session is None and submit(messages=turn1, metadata={}).session is None


def test_structured_output_becomes_a_json_schema_constraint():
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    assert submit(output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"}).json_schema == schema
    assert submit(output_config={"effort": "high"}).json_schema is None
    assert submit(cache_control={"type": "ephemeral"}).json_schema is None  # top-level cache_control accepted


def test_tool_round_trip_history():
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call the tool.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18C, sunny", "cache_control": {"type": "ephemeral"}},
            {"type": "tool_result", "tool_use_id": "toolu_02", "is_error": True,
             "content": [{"type": "text", "text": "timeout"}]},
            {"type": "text", "text": "and tomorrow?"},
        ]},
    ]  # fmt: skip
    s = submit(messages=messages, tools=[WEATHER])
    assert s.messages == [
        ChatMessage(role="user", content="weather in Paris?"),
        ChatMessage(role="assistant", content="Let me check.", thinking="I should call the tool.",
                    tool_calls=[ToolCall(name="get_weather", arguments='{"city":"Paris"}', id="toolu_01")]),
        ChatMessage(role="tool", content="18C, sunny", tool_call_id="toolu_01"),
        ChatMessage(role="tool", content="Error: timeout", tool_call_id="toolu_02"),
        ChatMessage(role="user", content="and tomorrow?"),
    ]  # fmt: skip
    assert s.tools == [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["input_schema"],
                                                         "description": "Weather of a city"}}]  # fmt: skip


@pytest.mark.parametrize("choice,has_tools", [
    ({"type": "auto"}, True), ({"type": "any"}, True), ({"type": "tool", "name": "get_weather"}, True),
    ({"type": "auto", "disable_parallel_tool_use": True}, True), ({"type": "none"}, False),
])  # fmt: skip
def test_tool_choice(choice, has_tools):
    s = submit(tools=[WEATHER], tool_choice=choice)
    assert (s.tools is not None) == has_tools


@pytest.mark.parametrize("change,options", [
    ({}, {}),
    ({"tool_choice": {"type": "auto"}}, {"tool_choice": "auto"}),
    ({"tool_choice": {"type": "any", "disable_parallel_tool_use": True}}, {"tool_choice": "required", "parallel_tool_calls": False}),
    ({"tool_choice": {"type": "tool", "name": "get_weather"}}, {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    ({"tool_choice": {"type": "none"}}, {"tool_choice": "none"}),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, {"template_kwargs": {"enable_thinking": True}, "thinking_budget": 1024}),
    ({"thinking": {"type": "disabled"}}, {"template_kwargs": {"enable_thinking": False}}),
    ({"thinking": {"type": "adaptive"}}, {"template_kwargs": {"enable_thinking": True}}),
])  # fmt: skip
def test_turn_options_in_engine_terms(change, options):
    assert turn_options(req(tools=[WEATHER], **change)) == options


@pytest.mark.parametrize("thinking", [{"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}])
def test_thinking_config_accepted(thinking):
    assert submit(thinking=thinking).messages[-1].content == "hi"


# every refusal names its block or field, and is a 400-class error (never a 500)
REFUSALS = [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "read"}, {"type": "document", "source": {}}]}]},
     "messages[0].content[1]"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}]},
     "messages[0].content[0].content[0]"),
    ({"messages": [{"role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "web_search_tool_result", "tool_use_id": "s", "content": []}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "hologram"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": []}, "messages"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]}, "tools[0].type"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"system": [{"type": "image", "source": {}}]}, "system[0].type"),
    ({"temperature": 1.5}, "temperature"),
    ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
    ({"stop_sequences": [""]}, "stop_sequences[0]"),
]  # fmt: skip


@pytest.mark.parametrize("change,param", REFUSALS)
def test_refusals_name_the_field(change, param):
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **change}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises((GatewayError, WireError)) as info:
        to_submit(decode(json.dumps(body).encode(), MessagesRequest), "msg_1")
    err = info.value
    assert err.param == param, str(err)
    where = param.rsplit(".", 1)[0] if param.endswith((".type", ".name", ".input_schema", ".budget_tokens")) else param
    assert where in str(err)  # the message names the block or field too
    if isinstance(err, GatewayError):
        assert error_status(err.info) == 400


def test_image_refusal_says_why():
    err = refused(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert "image blocks are not supported" in str(err)


def test_count_tokens_request_needs_no_max_tokens():
    body = {"model": "m", "system": "s", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    messages, tools = prompt_of(decode(json.dumps(body).encode(), CountTokensRequest))
    assert [m.role for m in messages] == ["system", "user"] and tools[0]["function"]["name"] == "get_weather"


STATUSES = [
    (ErrorCode.INVALID_REQUEST, 400, "invalid_request_error"), (ErrorCode.CONTEXT_LENGTH, 400, "invalid_request_error"),
    (ErrorCode.TEMPLATE, 400, "invalid_request_error"), (ErrorCode.UNSUPPORTED, 400, "invalid_request_error"),
    (ErrorCode.MODEL_NOT_FOUND, 404, "not_found_error"), (ErrorCode.OVERLOADED, 529, "overloaded_error"),
    (ErrorCode.WORKER_UNAVAILABLE, 529, "overloaded_error"), (ErrorCode.DECODE_FAILED, 500, "api_error"),
    (ErrorCode.INTERNAL, 500, "api_error"), (ErrorCode.REQUEST_TOO_LARGE, 413, "request_too_large"),
    (ErrorCode.QUEUE_TIMEOUT, 504, "timeout_error"), (ErrorCode.NOT_FOUND, 404, "not_found_error"),
    (ErrorCode.METHOD_NOT_ALLOWED, 405, "invalid_request_error"),
]  # fmt: skip


@pytest.mark.parametrize("code,status,kind", STATUSES)
def test_error_envelope(code, status, kind):
    info = ErrorInfo(code, "what went wrong")
    assert error_status(info) == status
    assert error_body(info, request_id="req_1") == {"type": "error", "error": {"type": kind, "message": "what went wrong"},
                                                    "request_id": "req_1"} or code == ErrorCode.MODEL_NOT_FOUND  # fmt: skip
    assert error_body(info)["error"]["type"] == kind
    response = FAMILY.error_response(info, headers={"x-request-id": "req_1"})
    assert response.status_code == status and response.headers["request-id"] == "req_1"
    assert json.loads(response.body) == error_body(info, status, "req_1")
    assert ("retry-after" in response.headers) == (status in (503, 504, 529))


def test_unknown_model_says_how_to_alias():
    body = error_body(ErrorInfo(ErrorCode.MODEL_NOT_FOUND, "model 'claude-opus-4-7' not found"))
    assert body["error"]["type"] == "not_found_error" and "[aliases]" in body["error"]["message"]


def test_every_error_code_maps_below_600():
    for code in ErrorCode:
        assert 400 <= error_status(ErrorInfo(code, "x")) < 600


class Rec:
    def __init__(self, name, day):
        self.name = name
        self.modified = dt.datetime(2025, 1, day, tzinfo=dt.timezone.utc)


def test_models_list_names_then_aliases_with_cursors():
    items = list_of([Rec("a:latest", 1), Rec("b:latest", 5)], {"claude-sonnet-4-5": "a:latest", "claude-haiku-4-5": "b"})
    assert [m["id"] for m in items] == ["b:latest", "a:latest", "claude-haiku-4-5", "claude-sonnet-4-5"]
    assert items[0] == {"type": "model", "id": "b:latest", "display_name": "b:latest", "created_at": "2025-01-05T00:00:00Z"}
    assert items[3]["display_name"] == "claude-sonnet-4-5 (alias of a:latest)" and items[3]["created_at"] == "2025-01-01T00:00:00Z"
    assert items[2]["created_at"] == "2025-01-05T00:00:00Z"  # a tag-less alias target finds its ':latest'
    first = page(items, limit="2", after_id=None, before_id=None)
    assert [m["id"] for m in first["data"]] == ["b:latest", "a:latest"] and first["has_more"]
    assert (first["first_id"], first["last_id"]) == ("b:latest", "a:latest")
    second = page(items, limit="2", after_id=first["last_id"], before_id=None)
    assert [m["id"] for m in second["data"]] == ["claude-haiku-4-5", "claude-sonnet-4-5"] and not second["has_more"]
    back = page(items, limit="1", after_id=None, before_id="claude-haiku-4-5")
    assert [m["id"] for m in back["data"]] == ["a:latest"] and back["has_more"]
    with pytest.raises(GatewayError):
        page(items, limit="0", after_id=None, before_id=None)
