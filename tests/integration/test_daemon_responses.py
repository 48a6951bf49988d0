"""The Responses API on the real daemon with the official openai SDK: a forced function call on a
tiny GGUF with Qwen's control-token markers, its output sent back through previous_response_id
(the call replayed from its captured bytes), streaming, and the store across a daemon restart;
and plain text from the real Gemma 3 270M."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tinymodel import write_tiny_gguf

from .daemon import Daemon

CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}
TOOLS = [{"type": "function", "name": "get_weather", "parameters": CITY}]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("qwen") / "qwen.gguf", flavour="qwen2.5", context_length=8192)


def client(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_function_call_then_its_output_through_previous_response_id(qwen, tmp_path):
    with Daemon(tmp_path, {"qwen": qwen}, n_seq_max=2, n_ctx=4096, threads=1) as d:
        c = client(d)
        r = c.responses.create(model="qwen", input="Weather in Paris?", tools=TOOLS, tool_choice="required",
                               parallel_tool_calls=False, temperature=0, max_output_tokens=80)  # fmt: skip
        calls = [o for o in r.output if o.type == "function_call"]
        assert r.status == "completed" and len(calls) == 1, r.output
        call = calls[0]
        assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Rome")
        assert "<tool_call>" not in r.output_text

        follow = c.responses.create(model="qwen", previous_response_id=r.id, tools=TOOLS, temperature=0, max_output_tokens=2,
                                    input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])  # fmt: skip
        assert follow.status in ("completed", "incomplete") and follow.previous_response_id == r.id
        stats = httpx.get(d.url + "/api/stats", params={"model": "qwen"}, timeout=30).json()
        replay = stats.get("tool_replay_lookups") or stats["stats"]["tool_replay_lookups"]
        assert replay["hit"] == 1  # the history's call was rebuilt from the bytes the model wrote
        # the next turn reuses the first turn's cache: prompt + output, less the last sampled token
        assert follow.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens + r.usage.output_tokens - 1

        with c.responses.stream(model="qwen", input="Weather in Rome?", tools=TOOLS, tool_choice="required",
                                parallel_tool_calls=False, temperature=0, max_output_tokens=80) as s:  # fmt: skip
            kinds = [e.type for e in s]
            final = s.get_final_response()
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        assert "response.function_call_arguments.done" in kinds
        assert [o.type for o in final.output if o.type == "function_call"] == ["function_call"]
    with Daemon(tmp_path, {"qwen": qwen}, n_seq_max=2, n_ctx=4096, threads=1) as d2:  # the same cache dir
        kept = client(d2).responses.retrieve(follow.id)
        assert kept.id == follow.id and kept.previous_response_id == r.id
        items = client(d2).responses.input_items.list(follow.id, order="asc")
        assert [i.type for i in items.data] == ["message", "function_call", "function_call_output"]


@pytest.mark.gemma
def test_gemma_text_through_responses(gemma_gguf, tmp_path):
    with Daemon(tmp_path, {"gemma": gemma_gguf}, n_seq_max=2, n_ctx=1024, threads=2) as d:
        c = client(d)
        r = c.responses.create(model="gemma", input="The capital of France is", temperature=0, max_output_tokens=8)
        assert r.status == "incomplete" and r.usage.output_tokens == 8 and r.output_text.strip()
        r2 = c.responses.create(model="gemma", input="And of Italy?", previous_response_id=r.id, temperature=0, max_output_tokens=8)
        assert r2.usage.input_tokens > r.usage.input_tokens and r2.output_text.strip()
