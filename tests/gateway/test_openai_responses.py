"""The Responses API (POST /v1/responses and the stored responses) with the official openai SDK
against the gateway and the scripted fake worker: plain and streamed, function calls, reasoning,
previous_response_id chains, store: false, the event sequence, and refusals naming what is refused."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from .conftest import MODEL


@pytest.fixture
async def sdk(gateway):
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gateway.test", timeout=10)
    client = openai.AsyncOpenAI(base_url="http://gateway.test/v1", api_key="unused", http_client=http, max_retries=0)
    yield client
    await http.aclose()


async def test_create_plain_shape_usage_and_get(sdk, gateway):
    r = await sdk.responses.create(model=MODEL, input="hello there world", instructions="be brief")
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert r.output_text == "hello there world"
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "output_text"
    assert r.usage.output_tokens == 3 and r.usage.input_tokens_details.cached_tokens == 2
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    sent = gateway_worker_submit(gateway)
    assert [(m.role, m.content) for m in sent.messages] == [("system", "be brief"), ("user", "hello there world")]
    again = await sdk.responses.retrieve(r.id)
    assert again.id == r.id and again.output_text == "hello there world"


def gateway_worker_submit(gateway):
    return gateway.fake_worker.submits[-1]


@pytest.fixture(autouse=True)
def _bind_worker(gateway, fake_worker):
    gateway.fake_worker = fake_worker


async def test_previous_response_id_continues_the_conversation(sdk, gateway):
    first = await sdk.responses.create(model=MODEL, input="remember the word blue")
    second = await sdk.responses.create(model=MODEL, input="which word", previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.output_text == "which word"
    sent = gateway_worker_submit(gateway)
    assert [(m.role, m.content) for m in sent.messages] == [
        ("user", "remember the word blue"), ("assistant", "remember the word blue"), ("user", "which word"),
    ]
    items = await sdk.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in items.data] == ["message", "message", "message"] and all(i.id for i in items.data)
    # deleted: gone for GET and for continuing
    await sdk.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as missing:
        await sdk.responses.create(model=MODEL, input="again", previous_response_id=first.id)
    assert missing.value.code == "previous_response_not_found" and missing.value.param == "previous_response_id"


async def test_store_false_keeps_nothing(sdk):
    r = await sdk.responses.create(model=MODEL, input="forget me", store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(r.id)


async def test_function_calls_round_trip(sdk, gateway):
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    r = await sdk.responses.create(model=MODEL, input='checking CALL:get_weather:{"city":"Paris"}', tools=tools,
                                   tool_choice={"type": "function", "name": "get_weather"})  # fmt: skip
    kinds = [o.type for o in r.output]
    assert kinds == ["message", "function_call"]
    call = r.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    sent = gateway_worker_submit(gateway)
    assert sent.tools == [{"type": "function", "function": {"name": "get_weather", "parameters": tools[0]["parameters"]}}]
    assert sent.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    follow = await sdk.responses.create(
        model=MODEL, previous_response_id=r.id, tools=tools,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    assert follow.status == "completed"
    msgs = gateway_worker_submit(gateway).messages
    assert msgs[-2].role == "assistant" and msgs[-2].tool_calls[0].id == call.call_id
    assert msgs[-1].role == "tool" and msgs[-1].tool_call_id == call.call_id and msgs[-1].content == "sunny"


async def test_stream_event_sequence(sdk):
    stream = await sdk.responses.create(model=MODEL, input='THINK:hmm answer CALL:f:{"a":1}', stream=True,
                                        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}])  # fmt: skip
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[0].content[0].text == "hmm" and final.output[1].content[0].text == " answer"
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1, 2]


async def test_max_output_tokens_is_incomplete_and_a_cut_call_is_dropped(sdk):
    r = await sdk.responses.create(model=MODEL, input="one two three four", max_output_tokens=2)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "one two"
    stream = await sdk.responses.create(model=MODEL, input="one two three", max_output_tokens=2, stream=True)
    events = [e async for e in stream]
    assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input[0].content[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}, "input[0].content[0].type"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [{"type": "function", "name": "f"}]}, "tool_choice.name"),
    ],
)
async def test_refusals_name_what_is_refused(sdk, kwargs, param):
    body = {"model": MODEL, "input": "hi", **kwargs}
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk.responses.create(**body)
    assert bad.value.param == param


async def test_text_format_json_schema_reaches_the_worker(sdk, gateway):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    await sdk.responses.create(model=MODEL, input='{"a": 1}', text={"format": {"type": "json_schema", "name": "t", "schema": schema, "strict": True}},
                               reasoning={"effort": "low"})  # fmt: skip
    sent = gateway_worker_submit(gateway)
    assert sent.json_schema == schema and sent.json_schema_strict and sent.template_kwargs == {"reasoning_effort": "low"}


async def test_store_survives_a_new_gateway(make_gateway, fake_worker, tmp_path):
    gw1 = await make_gateway(fake_worker.endpoint)
    r = await gw1.client.post("/v1/responses", json={"model": MODEL, "input": "kept on disk"})
    rid = r.json()["id"]
    gw2 = await make_gateway(fake_worker.endpoint)  # same settings: same SQLite file
    got = await gw2.client.get(f"/v1/responses/{rid}")
    assert got.status_code == 200 and got.json()["output"][0]["content"][0]["text"] == "kept on disk"
