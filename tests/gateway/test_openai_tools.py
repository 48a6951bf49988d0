"""Tool calls and reasoning on the OpenAI chat API, against the fake worker's scripted tool-call parts."""

from __future__ import annotations

import json

import pytest

from .conftest import MODEL
from .test_openai_routes import sse_events

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = 'CALL:get_weather:{"city":"Paris"}'


def body(text: str, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "tools": TOOLS, **kw}


async def test_tool_calls_in_the_message(gateway):
    r = await gateway.client.post("/v1/chat/completions", json=body(f"THINK:rain? {CALL}"))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant", "content": None, "reasoning_content": "rain?",
        "tool_calls": [{"id": "call_fc0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}],
    }  # fmt: skip


async def test_text_and_parallel_calls_keep_their_order(gateway):
    r = await gateway.client.post("/v1/chat/completions", json=body(f"checking {CALL} {CALL.replace('Paris', 'Rome')}"))
    msg = r.json()["choices"][0]["message"]
    assert msg["content"] == "checking"
    assert [json.loads(c["function"]["arguments"])["city"] for c in msg["tool_calls"]] == ["Paris", "Rome"]
    assert [c["id"] for c in msg["tool_calls"]] == ["call_fc0", "call_fc1"]


async def test_streamed_tool_calls_and_reasoning(gateway):
    r = await gateway.client.post("/v1/chat/completions", json=body(f"THINK:hmm ok {CALL}", stream=True))
    events = sse_events(r.text)
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert {"reasoning_content": "hmm"} in deltas and {"content": " ok"} in deltas
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls == [
        {"index": 0, "id": "call_fc0", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"city":"Paris"}'}},
    ]
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_tool_parameters_reach_the_worker(gateway, fake_worker):
    r = await gateway.client.post("/v1/chat/completions", json=body(
        "hi", tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False,
        reasoning_effort="low", chat_template_kwargs={"enable_thinking": False}, thinking_budget=64,
    ))  # fmt: skip
    assert r.status_code == 200, r.text
    s = fake_worker.submits[-1]
    assert s.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert s.parallel_tool_calls is False and s.thinking_budget == 64
    assert s.template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}
    r = await gateway.client.post("/v1/chat/completions", json=body("hi", tool_choice="required"))
    assert fake_worker.submits[-1].tool_choice == "required" and fake_worker.submits[-1].parallel_tool_calls is True


@pytest.mark.parametrize(
    "extra",
    [
        {"tool_choice": "sometimes"},
        {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tool_choice": {"type": "function"}},
        {"tool_choice": "required", "tools": None},
    ],
)
async def test_bad_tool_choice_is_400(gateway, extra):
    r = await gateway.client.post("/v1/chat/completions", json=body("hi", **extra))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tool_choice"
