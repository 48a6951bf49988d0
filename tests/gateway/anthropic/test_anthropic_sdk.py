"""The official anthropic SDK (and raw HTTP where the SDK hides the wire) against the gateway and the fake worker.

The fake worker echoes the last message's words; its magic words script typed parts:
THINK:word (a thinking part), CALL:name:{json} (a complete tool call), HALFCALL:name:{json} (a call
that never ends), SLOW (a long prefill before the first output), FAIL (the worker fails mid-request).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import anthropic
import httpx
import httpx2
import pytest

from barrel_inference.gateway.anthropic.blocks import thinking_signature
from barrel_inference.gateway.anthropic.routes import _Encoder

from ..conftest import MODEL, StubRecord, StubRegistry

ALIAS = "claude-sonnet-4-5"
FIXTURE = Path(__file__).parent / "fixtures" / "claude_code_request.json"
WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip


@pytest.fixture
async def make_gw(make_gateway, fake_worker):
    async def make(**settings_kw):
        aliases = {ALIAS: MODEL, "claude-haiku-4-5": MODEL, "claude-sonnet-4-5-20250929": MODEL}
        registry = StubRegistry(StubRecord(MODEL), aliases=aliases)
        return await make_gateway(fake_worker.endpoint, registry=registry, aliases=aliases, **settings_kw)

    return make


@pytest.fixture
async def gw(make_gw):
    return await make_gw()


def sdk(gw, **kw) -> anthropic.AsyncAnthropic:
    transport = httpx2.ASGITransport(app=gw.app)
    kw.setdefault("api_key", "any")
    return anthropic.AsyncAnthropic(base_url="http://gateway.test", http_client=httpx2.AsyncClient(transport=transport),
                                    max_retries=0, **kw)  # fmt: skip


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def parse_sse(raw: str) -> list[tuple[str, dict]]:
    out = []
    for block in raw.split("\n\n"):
        if block.strip():
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            data = json.loads(lines["data"])
            assert data["type"] == lines["event"]
            out.append((lines["event"], data))
    return out


async def test_create_plain(gw, fake_worker):
    client = sdk(gw)
    msg = await client.messages.create(model=ALIAS, max_tokens=64, messages=user("hello there world"),
                                       system="be brief", stop_sequences=["END"], extra_body={"temperature": 0.0, "top_k": 5})  # fmt: skip
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant" and msg.model == ALIAS
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "hello there world"
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    # the fake reports 5 prompt tokens (2 system + 3 user words), 2 of them read from its cache, and says the 3 it
    # evaluated stay in its cache for the next request (what this request created)
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens, msg.usage.cache_creation_input_tokens) == (0, 2, 3)
    assert msg.usage.output_tokens == 3
    assert msg.usage.cache_creation.ephemeral_5m_input_tokens == 3 and msg.usage.cache_creation.ephemeral_1h_input_tokens == 0
    sent = fake_worker.submits[-1]
    assert sent.id == msg.id and sent.max_tokens == 64 and sent.stop == ["END"]
    assert (sent.sampling.temperature, sent.sampling.top_k) == (0.0, 5)
    assert [m.role for m in sent.messages] == ["system", "user"]


async def test_max_tokens_stop_reason(gw):
    msg = await sdk(gw).messages.create(model=MODEL, max_tokens=2, messages=user("one two three four"))
    assert msg.stop_reason == "max_tokens" and msg.content[0].text == "one two" and msg.model == MODEL


async def test_stream_text_stream_and_final_message(gw):
    async with sdk(gw).messages.stream(model=ALIAS, max_tokens=64, messages=user("streamed words arrive")) as stream:
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "streamed words arrive" and len(texts) >= 2
    assert final.content[0].text == "streamed words arrive" and final.stop_reason == "end_turn"
    assert final.usage.input_tokens == 0 and final.usage.cache_read_input_tokens == 2 and final.usage.output_tokens == 3
    assert final.usage.cache_creation_input_tokens == 1  # the one prompt token evaluated stays cached


async def test_raw_stream_event_sequence(gw):
    body = {"model": ALIAS, "max_tokens": 64, "messages": user("a b"), "stream": True}
    r = await gw.client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    assert [n for n, _ in events] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                      "content_block_delta", "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    start = events[0][1]["message"]
    # as the real API's message_start: the input as admitted (what is created is known at the end), output_tokens 1
    assert start["usage"] == {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2, "output_tokens": 1,
                              "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}}  # fmt: skip
    assert events[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[-2][1]["usage"] == {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2, "output_tokens": 2}


async def test_cache_creation_is_what_the_worker_says_it_kept(gw, fake_worker):
    """cache_creation_input_tokens is the worker's committed count: all of the evaluated prompt when its cache
    stays, none when the worker dropped it; streamed (message_delta) and not alike, under the mark's TTL."""
    long_prompt = user("one two three four five six")  # 6 prompt tokens, 2 read from the cache
    msg = await sdk(gw).messages.create(model=ALIAS, max_tokens=64, messages=long_prompt)
    assert (msg.usage.input_tokens, msg.usage.cache_creation_input_tokens, msg.usage.cache_read_input_tokens) == (0, 4, 2)
    dropped = await sdk(gw).messages.create(model=ALIAS, max_tokens=64, messages=user("one two three four NOKEEP"))
    assert (dropped.usage.input_tokens, dropped.usage.cache_creation_input_tokens, dropped.usage.cache_read_input_tokens) == (3, 0, 2)
    marked = [{"role": "user", "content": [{"type": "text", "text": "one two three four five six",
                                            "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]  # fmt: skip
    async with sdk(gw).messages.stream(model=ALIAS, max_tokens=64, messages=marked) as stream:
        final = await stream.get_final_message()
    assert final.usage.cache_creation_input_tokens == 4 and final.usage.input_tokens == 0
    assert fake_worker.submits[-1].pin_ttl_s == 3600.0
    body = {"model": ALIAS, "max_tokens": 64, "messages": marked, "stream": False}
    r = await gw.client.post("/v1/messages", json=body)
    assert r.json()["usage"]["cache_creation"] == {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 4}


async def test_metadata_user_id_gives_the_worker_a_session_and_a_session_header_beats_it(gw, fake_worker):
    """Through the SDK and the gateway: Claude Code names no session header, but sends
    metadata.user_id; both turns of its conversation reach the worker under one session, and the
    Claude Code attribution line is out of the system prompt."""
    client = sdk(gw)
    system = "x-anthropic-billing-header: cc_version=2.0.1; cch=ab12;\nYou are Claude Code."
    turn1 = user("fix the bug")
    await client.messages.create(model=ALIAS, max_tokens=8, messages=turn1, system=system, metadata={"user_id": "user_7_session_3"})
    first = fake_worker.submits[-1]
    turn2 = turn1 + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "now test it"}]
    await client.messages.create(model=ALIAS, max_tokens=8, messages=turn2, system=system, metadata={"user_id": "user_7_session_3"})
    second = fake_worker.submits[-1]
    assert first.session is not None and first.session.startswith("u:") and second.session == first.session
    assert first.messages[0].content == "You are Claude Code."
    await client.messages.create(model=ALIAS, max_tokens=8, messages=turn1, metadata={"user_id": "user_7_session_3"},
                                 extra_headers={"x-session-id": "mine"})  # fmt: skip
    assert fake_worker.submits[-1].session == "h:mine"
    await client.messages.create(model=ALIAS, max_tokens=8, messages=turn1)
    assert fake_worker.submits[-1].session is None  # nothing names it: prefix matching alone


async def test_cache_control_marks_pin_the_cache_for_their_ttl(gw, fake_worker):
    client = sdk(gw)
    await client.messages.create(model=ALIAS, max_tokens=8, messages=user("no marks"))
    assert fake_worker.submits[-1].pin_ttl_s == 0.0
    await client.messages.create(model=ALIAS, max_tokens=8, messages=user("marked system"),
                                 system=[{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}])  # fmt: skip
    assert fake_worker.submits[-1].pin_ttl_s == 300.0
    await client.messages.create(model=ALIAS, max_tokens=8, messages=user("marked tool"),
                                 tools=[{**WEATHER, "cache_control": {"type": "ephemeral", "ttl": "1h"}}])  # fmt: skip
    assert fake_worker.submits[-1].pin_ttl_s == 3600.0
    nested = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
        {"type": "text", "text": "sunny", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}]}]  # fmt: skip
    await client.messages.create(model=ALIAS, max_tokens=8, messages=nested)
    assert fake_worker.submits[-1].pin_ttl_s == 300.0
    body = {"model": ALIAS, "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]}]}  # fmt: skip
    r = await gw.client.post("/v1/messages", json=body)
    assert r.status_code == 400 and "messages[0].content[0].cache_control.ttl" in r.json()["error"]["message"]


async def test_beta_query_and_headers_are_accepted(gw):
    client = sdk(gw)
    msg = await client.beta.messages.create(model=ALIAS, max_tokens=8, messages=user("beta works"),
                                            betas=["interleaved-thinking-2025-05-14"])  # fmt: skip
    assert msg.content[0].text == "beta works"


async def test_count_tokens(gw, fake_worker):
    client = sdk(gw)
    counted = await client.messages.count_tokens(model=ALIAS, system="two words", messages=user("three more words"), tools=[WEATHER])
    call = fake_worker.calls[-1]
    assert type(call).__name__ == "CountTokens" and call.add_generation_prompt
    assert [m.role for m in call.messages] == ["system", "user"] and call.tools[0]["function"]["name"] == "get_weather"
    assert not fake_worker.submits  # counted without a generation
    msg = await client.messages.create(model=ALIAS, max_tokens=1, system="two words", messages=user("three more words"), tools=[WEATHER])
    usage = msg.usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


async def test_tool_round_trip(gw, fake_worker):
    client = sdk(gw)
    first = await client.messages.create(model=ALIAS, max_tokens=64, tools=[WEATHER],
                                         messages=user('checking CALL:get_weather:{"city":"Paris"}'))  # fmt: skip
    assert [b.type for b in first.content] == ["text", "tool_use"]
    call = first.content[1]
    assert call.id.startswith("toolu_") and call.name == "get_weather" and call.input == {"city": "Paris"}
    assert first.stop_reason == "tool_use"
    second = await client.messages.create(model=ALIAS, max_tokens=64, tools=[WEATHER], messages=[
        *user('checking CALL:get_weather:{"city":"Paris"}'),
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny and warm"}]},
    ])  # fmt: skip
    sent = fake_worker.submits[-1]
    assert [m.role for m in sent.messages] == ["user", "assistant", "tool"]
    assert sent.messages[1].tool_calls[0].id == call.id and sent.messages[1].tool_calls[0].arguments == '{"city":"Paris"}'
    assert sent.messages[2].tool_call_id == call.id
    assert second.content[0].text == "sunny and warm" and second.stop_reason == "end_turn"


async def test_tool_call_streamed(gw):
    async with sdk(gw).messages.stream(model=ALIAS, max_tokens=64, tools=[WEATHER],
                                       messages=user('CALL:get_weather:{"city":"Oslo"} then')) as stream:  # fmt: skip
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["tool_use", "text"]  # generation order kept
    assert final.content[0].input == {"city": "Oslo"} and final.stop_reason == "tool_use"


@pytest.mark.parametrize("stream", [False, True])
async def test_max_tokens_inside_a_tool_call_exposes_no_call(gw, stream):
    client = sdk(gw)
    kw = dict(model=ALIAS, max_tokens=2, tools=[WEATHER], messages=user('first HALFCALL:get_weather:{"city":"Pa"} cut here'))
    if stream:
        async with client.messages.stream(**kw) as s:
            msg = await s.get_final_message()
    else:
        msg = await client.messages.create(**kw)
    assert msg.stop_reason == "max_tokens"
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "first"


async def test_thinking_blocks(gw):
    client = sdk(gw)
    kw = dict(model=ALIAS, max_tokens=64, thinking={"type": "enabled", "budget_tokens": 1024},
              messages=user("THINK:pondering answer"))  # fmt: skip
    msg = await client.messages.create(**kw)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "pondering" and msg.content[0].signature == thinking_signature("pondering")
    async with client.messages.stream(**kw) as s:
        final = await s.get_final_message()
    assert final.content[0].thinking == "pondering" and final.content[0].signature == msg.content[0].signature


# ---- errors ------------------------------------------------------------------------------------


async def test_bad_request_names_the_block(gw):
    with pytest.raises(anthropic.BadRequestError) as info:
        await sdk(gw).messages.create(model=ALIAS, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])  # fmt: skip
    err = info.value
    assert err.status_code == 400 and err.body["type"] == "error"
    assert err.body["error"]["type"] == "invalid_request_error" and "messages[0].content[0]" in err.body["error"]["message"]
    assert err.body["request_id"] and err.response.headers["request-id"] == err.body["request_id"]


async def test_missing_max_tokens_is_400(gw):
    r = await gw.client.post("/v1/messages", json={"model": ALIAS, "messages": user("hi")})
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


async def test_server_tool_is_400_naming_the_type(gw):
    with pytest.raises(anthropic.BadRequestError) as info:
        await sdk(gw).messages.create(model=ALIAS, max_tokens=8, messages=user("hi"),
                                      tools=[{"type": "web_search_20250305", "name": "web_search"}])  # fmt: skip
    assert "web_search_20250305" in info.value.body["error"]["message"]


async def test_unknown_model_is_404_saying_how_to_alias(gw):
    with pytest.raises(anthropic.NotFoundError) as info:
        await sdk(gw).messages.create(model="claude-opus-4-7", max_tokens=8, messages=user("hi"))
    body = info.value.body
    assert body["error"]["type"] == "not_found_error" and "[aliases]" in body["error"]["message"]


async def test_api_key_allowlist(make_gw):
    gw = await make_gw(anthropic_api_keys=["sk-good", "sk-other"])
    with pytest.raises(anthropic.AuthenticationError) as info:
        await sdk(gw, api_key="sk-bad").messages.create(model=ALIAS, max_tokens=8, messages=user("hi"))
    assert info.value.status_code == 401 and info.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        await sdk(gw, api_key="sk-bad").messages.count_tokens(model=ALIAS, messages=user("hi"))
    r = await gw.client.post("/v1/messages", json={"model": ALIAS, "max_tokens": 8, "messages": user("hi")})
    assert r.status_code == 401  # no key at all
    ok = await sdk(gw, api_key="sk-other").messages.create(model=ALIAS, max_tokens=8, messages=user("x-api-key works"))
    assert ok.content[0].text == "x-api-key works"
    ok = await sdk(gw, api_key=None, auth_token="sk-good").messages.create(model=ALIAS, max_tokens=8, messages=user("bearer works"))
    assert ok.content[0].text == "bearer works"


async def test_too_large_is_413_stating_the_limit(make_gw, monkeypatch):
    from barrel_inference.config import Settings
    from barrel_inference.gateway import lifecycle

    if "max_request_body_bytes" in Settings.__struct_fields__:
        gw = await make_gw(max_request_body_bytes=2048)
    else:
        monkeypatch.setattr(lifecycle, "DEFAULT_MAX_BODY", 2048)
        gw = await make_gw()
    with pytest.raises(anthropic.APIStatusError) as info:
        await sdk(gw).messages.create(model=ALIAS, max_tokens=8, messages=user("word " * 1000))
    assert info.value.status_code == 413
    assert info.value.body["error"]["type"] == "request_too_large" and "2048" in info.value.body["error"]["message"]


async def test_overloaded_is_529_with_retry_after(make_gw, fake_worker):
    gw = await make_gw(max_queue=0)
    client = sdk(gw)
    stalled = [asyncio.create_task(client.messages.create(model=ALIAS, max_tokens=8, messages=user("STALL")))
               for _ in range(fake_worker.n_seq_max)]  # fmt: skip
    for _ in range(200):
        if len(fake_worker.submits) == fake_worker.n_seq_max:
            break
        await asyncio.sleep(0.01)
    try:
        with pytest.raises(anthropic.OverloadedError) as info:
            await client.messages.create(model=ALIAS, max_tokens=8, messages=user("hi"))
        assert info.value.status_code == 529 and info.value.response.headers["retry-after"]
        assert info.value.body["error"]["type"] == "overloaded_error"
    finally:
        for t in stalled:
            t.cancel()
        await asyncio.gather(*stalled, return_exceptions=True)


async def test_worker_failure_is_api_error(gw):
    with pytest.raises(anthropic.InternalServerError) as info:
        await sdk(gw).messages.create(model=ALIAS, max_tokens=8, messages=user("partial FAIL"))
    assert info.value.status_code == 500 and info.value.body["error"]["type"] == "api_error"


async def test_worker_failure_mid_stream_is_an_error_event(gw):
    body = {"model": ALIAS, "max_tokens": 64, "messages": user("partial FAIL"), "stream": True}
    r = await gw.client.post("/v1/messages", json=body)
    events = parse_sse(r.text)
    assert events[0][0] == "message_start" and events[-1][0] == "error"
    assert events[-1][1]["error"]["type"] == "api_error"
    with pytest.raises(anthropic.APIStatusError):
        async with sdk(gw).messages.stream(model=ALIAS, max_tokens=64, messages=user("partial FAIL")) as s:
            await s.get_final_message()


async def test_ping_while_a_long_prefill_runs(gw, monkeypatch):
    monkeypatch.setattr(_Encoder, "keepalive_s", 0.05)
    body = {"model": ALIAS, "max_tokens": 64, "messages": user("SLOW finally"), "stream": True}
    r = await gw.client.post("/v1/messages", json=body)
    names = [n for n, _ in parse_sse(r.text)]
    first_block = names.index("content_block_start")
    assert names[0] == "message_start" and names[1:first_block].count("ping") >= 3  # the first, then keepalives


# ---- models -----------------------------------------------------------------------------------


async def test_models_in_anthropic_shape_only_with_the_version_header(gw):
    page = await sdk(gw).models.list()
    ids = [m.id for m in page.data]
    assert ids == [MODEL, "claude-haiku-4-5", ALIAS, "claude-sonnet-4-5-20250929"]  # registry names, then aliases
    assert all(m.type == "model" and m.display_name for m in page.data)
    one = await sdk(gw).models.retrieve(ALIAS)
    assert one.id == ALIAS and MODEL in one.display_name
    r = await gw.client.get("/v1/models")  # no anthropic-version: the OpenAI family answers
    assert r.json()["object"] == "list" and r.json()["data"][0]["object"] == "model"


# ---- a Claude-Code-shaped request, replayed ---------------------------------------------------


async def test_claude_code_request_fixture(gw, fake_worker):
    fixture = json.loads(FIXTURE.read_text())
    body = fixture["body"]
    assert len(body["tools"]) == 15 and body["stream"] and fixture["path"].endswith("?beta=true")
    r = await gw.client.post(fixture["path"], content=json.dumps(body), headers=fixture["headers"])
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text.endswith("what does main.py do")
    assert events[0][1]["message"]["model"] == body["model"]
    sent = fake_worker.submits[-1]
    assert len(sent.tools) == 15 and {t["function"]["name"] for t in sent.tools} >= {"Bash", "Read", "Edit", "TodoWrite"}
    assert sent.messages[0].role == "system" and sent.messages[0].content.startswith("You are a coding agent")
    assert sent.messages[1].content.endswith("what does main.py do") and sent.max_tokens == 32000


@pytest.mark.parametrize("method,path,status,kind", [
    ("GET", "/v1/messages", 405, "invalid_request_error"),
    ("POST", "/v1/messages/batches", 404, "not_found_error"),
    ("POST", "/v1/messages/count_tokens", 400, "invalid_request_error"),  # empty body
])  # fmt: skip
async def test_routing_errors_in_the_anthropic_envelope(gw, method, path, status, kind):
    r = await gw.client.request(method, path)
    assert r.status_code == status
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["request_id"] == r.headers["request-id"]


async def test_bad_json_and_wrong_types_are_400_never_500(gw):
    for raw in (b"{not json", b"[]", b'{"model": 3, "max_tokens": 1, "messages": []}',
                b'{"model": "m", "max_tokens": "many", "messages": []}'):  # fmt: skip
        r = await gw.client.post("/v1/messages", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"


async def test_tool_choice_and_thinking_reach_the_worker(gw, fake_worker):
    client = sdk(gw)
    await client.messages.create(model=ALIAS, max_tokens=8, messages=user("hi"), tools=[WEATHER],
                                 tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
                                 thinking={"type": "enabled", "budget_tokens": 256})  # fmt: skip
    s = fake_worker.submits[-1]
    assert s.tool_choice == {"type": "function", "function": {"name": "get_weather"}} and s.parallel_tool_calls is False
    assert s.template_kwargs == {"enable_thinking": True} and s.thinking_budget == 256
    await client.messages.create(model=ALIAS, max_tokens=8, messages=user("hi"), tools=[WEATHER], tool_choice={"type": "any"})
    assert fake_worker.submits[-1].tool_choice == "required" and fake_worker.submits[-1].parallel_tool_calls is True
