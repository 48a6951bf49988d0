"""The official anthropic SDK against the real daemon (gateway + worker processes).

The tiny generated model checks the engine path (shapes, usage, count_tokens against a real render,
streaming, errors); the real Gemma 3 270M (marker `gemma`) checks real text through Claude Code's
model ids routed by an alias.
"""

import json
from pathlib import Path

import anthropic
import pytest

from .daemon import Daemon

ALIASES = '[aliases]\n"claude-sonnet-4-5" = "tiny"\n"claude-haiku-4-5" = "gemma3:270m"\n'
FIXTURE = Path(__file__).parent.parent / "gateway" / "anthropic" / "fixtures" / "claude_code_request.json"


@pytest.fixture(scope="module")
def daemon(tiny_gguf, tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("anthropic"), {"tiny": tiny_gguf}, n_seq_max=2, n_ctx=2048, threads=1,
               extra='anthropic_api_keys = ["sk-local"]\n' + ALIASES)  # fmt: skip
    with d:
        yield d


def client(daemon, **kw) -> anthropic.AsyncAnthropic:
    kw.setdefault("api_key", "sk-local")
    return anthropic.AsyncAnthropic(base_url=daemon.url, max_retries=0, timeout=120, **kw)


async def test_create_stream_and_count_tokens_agree(daemon):
    c = client(daemon)
    kw = dict(model="claude-sonnet-4-5", max_tokens=8, extra_body={"temperature": 0.0}, system=[{"type": "text", "text": "Be brief.",
              "cache_control": {"type": "ephemeral"}}], messages=[{"role": "user", "content": "hello"}])  # fmt: skip
    counted = await c.messages.count_tokens(model=kw["model"], system=kw["system"], messages=kw["messages"])
    msg = await c.messages.create(**kw)
    assert msg.id.startswith("msg_") and msg.model == "claude-sonnet-4-5" and msg.role == "assistant"
    assert msg.stop_reason in ("end_turn", "max_tokens") and 0 < msg.usage.output_tokens <= 8
    u = msg.usage
    # count_tokens renders exactly what the request rendered
    assert counted.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens > 5
    async with c.messages.stream(**kw) as stream:
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    text = "".join(texts)
    assert final.content == [] and text == "" or final.content[0].text == text
    # the same prompt again: this time it came from the KV cache (its greedy text may differ slightly: see README)
    assert final.usage.cache_read_input_tokens > 0 and final.stop_reason in ("end_turn", "max_tokens")
    f = final.usage
    assert f.input_tokens + f.cache_read_input_tokens + f.cache_creation_input_tokens == counted.input_tokens
    # what the first request evaluated stayed in the worker's cache: it reports it as created, never more
    assert u.cache_creation_input_tokens == counted.input_tokens - u.cache_read_input_tokens > 0 and u.input_tokens == 0


async def test_errors_from_the_real_daemon(daemon):
    with pytest.raises(anthropic.AuthenticationError):
        await client(daemon, api_key="sk-wrong").messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError) as info:
        await client(daemon).messages.create(model="claude-opus-4-7", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert "[aliases]" in info.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as info:
        await client(daemon).messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "word " * 3000}])
    assert info.value.body["error"]["type"] == "invalid_request_error" and "2048" in info.value.body["error"]["message"]


async def test_count_tokens_counts_a_prompt_longer_than_the_context(daemon):
    """The context limit applies to generating; counting a prompt over it answers its size (as the real API does)."""
    c = client(daemon)
    long = [{"role": "user", "content": "word " * 3000}]
    counted = await c.messages.count_tokens(model="tiny", messages=long, system=[{"type": "text", "text": "x " * 2000}])
    assert counted.input_tokens > 2048 + 3000
    with pytest.raises(anthropic.BadRequestError):  # generating it is still refused
        await c.messages.create(model="tiny", max_tokens=4, messages=long)


async def test_models_list_shows_names_and_aliases(daemon):
    page = await client(daemon).models.list()
    ids = [m.id for m in page.data]
    assert "tiny:latest" in ids and "claude-sonnet-4-5" in ids and page.first_id == ids[0]


async def test_claude_code_request_replayed(daemon):
    import httpx

    fixture = json.loads(FIXTURE.read_text())
    body = {**fixture["body"], "model": "claude-sonnet-4-5", "max_tokens": 4, "temperature": 0}
    body["tools"] = body["tools"][:1]  # the tiny model's 2048-token context, one byte a token
    headers = {**fixture["headers"], "authorization": "Bearer sk-local"}
    async with httpx.AsyncClient(base_url=daemon.url, timeout=120) as c:
        r = await c.post(fixture["path"], content=json.dumps(body), headers=headers)
    assert r.status_code == 200, r.text
    names = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]


@pytest.mark.gemma
async def test_gemma_real_text_through_a_claude_alias(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("anthropic-gemma"), {}, n_seq_max=2, n_ctx=1024, threads=2, embed_default=True,
               extra=ALIASES)  # fmt: skip
    d.start(timeout=180)
    try:
        c = client(d)
        msg = await c.messages.create(model="claude-haiku-4-5", max_tokens=24, extra_body={"temperature": 0.0},
                                      messages=[{"role": "user", "content": "What is the capital of France?"}])  # fmt: skip
        assert msg.model == "claude-haiku-4-5" and msg.content[0].text.strip()  # real text from the real model
        async with c.messages.stream(model="claude-haiku-4-5", max_tokens=24, extra_body={"temperature": 0.0},
                                     messages=[{"role": "user", "content": "What is the capital of France?"}]) as s:  # fmt: skip
            streamed = "".join([t async for t in s.text_stream])
            final = await s.get_final_message()
        # (the second run reuses the cached prompt, so its greedy text may differ slightly: see README)
        assert streamed.strip() and final.content[0].text == streamed and final.usage.cache_read_input_tokens > 0
    finally:
        d.stop()


async def test_alias_added_without_a_restart_on_sighup(daemon):
    import asyncio
    import signal

    c = client(daemon)
    body = dict(max_tokens=2, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError):
        await c.messages.create(model="claude-opus-4-7", **body)
    original = daemon.config.read_text()
    daemon.config.write_text(original.replace("[aliases]\n", '[aliases]\n"claude-opus-4-7" = "tiny"\n'))
    try:
        daemon.proc.send_signal(signal.SIGHUP)
        for _ in range(100):
            if "config_reloaded" in daemon.log():
                break
            await asyncio.sleep(0.05)
        msg = await c.messages.create(model="claude-opus-4-7", **body)
        assert msg.model == "claude-opus-4-7" and msg.usage.output_tokens > 0
        ids = [m.id for m in (await c.models.list()).data]
        assert "claude-opus-4-7" in ids
    finally:
        daemon.config.write_text(original)
        daemon.proc.send_signal(signal.SIGHUP)


def test_forced_tool_use_round_trip_on_control_token_markers(tmp_path):
    """A real tool call through the Messages API: the tiny GGUF with Qwen's vocabulary and template
    (its <tool_call> markers are control tokens), tool_choice any, then the tool_result turn, whose
    history carries the call rebuilt from the bytes the model wrote (a replay hit)."""
    import httpx

    from tinymodel import write_tiny_gguf

    qwen = write_tiny_gguf(tmp_path / "qwen.gguf", flavour="qwen2.5", context_length=8192)
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "required": ["city"],
              "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}}}]  # fmt: skip
    (tmp_path / "d").mkdir()
    with Daemon(tmp_path / "d", {"qwen": qwen}, n_seq_max=2, n_ctx=4096, threads=1) as d:
        c = anthropic.Anthropic(base_url=d.url, api_key="unused", max_retries=0, timeout=120)
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        msg = c.messages.create(model="qwen", max_tokens=80, tools=tools, messages=ask, extra_body={"temperature": 0.0},
                                tool_choice={"type": "any", "disable_parallel_tool_use": True})  # fmt: skip
        assert msg.stop_reason == "tool_use", msg
        (use,) = [b for b in msg.content if b.type == "tool_use"]
        assert use.id.startswith("toolu_") and use.name == "get_weather" and use.input["city"] in ("Paris", "Rome")
        assert not any(b.type == "text" and "<tool_call>" in b.text for b in msg.content)
        follow = c.messages.create(model="qwen", max_tokens=2, tools=tools, extra_body={"temperature": 0.0}, messages=[
            *ask, {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}])  # fmt: skip
        assert follow.stop_reason in ("end_turn", "max_tokens")
        stats = httpx.get(d.url + "/api/stats", params={"model": "qwen"}, timeout=30).json()
        replay = stats.get("tool_replay_lookups") or stats["stats"]["tool_replay_lookups"]
        assert replay["hit"] == 1  # the toolu_ id found the call the model wrote
        first_evaluated = msg.usage.input_tokens + msg.usage.cache_creation_input_tokens
        assert follow.usage.cache_read_input_tokens > first_evaluated  # the first turn's cache was reused


async def test_a_cache_control_pin_keeps_a_conversation_that_retention_would_drop(tiny_gguf, tmp_path):
    """Three conversations on three sequences, idle caches limited to 100 tokens and no saved-state tiers:
    retention drops the least recently used unpinned cache. The first conversation marks its prompt with
    cache_control: it survives (its next turn reads its cache) and the second one goes instead. (One KV
    buffer: retention bounds only that layout, and "auto" gives this small model a buffer per sequence.)"""
    defaults = "max_retained_tokens = 100\nkv_ram_bytes = 0\nkv_unified = true\n"
    with Daemon(tmp_path, {"tiny": tiny_gguf}, n_seq_max=3, n_ctx=1024, threads=1, defaults=defaults) as d:
        c = client(d, api_key="unused")

        async def turn(messages):
            return await c.messages.create(model="tiny", max_tokens=4, messages=messages, extra_body={"temperature": 0.0})

        def first(word, mark=False):
            block = {"type": "text", "text": (word + " ") * 12}
            if mark:
                block["cache_control"] = {"type": "ephemeral"}
            return [{"role": "user", "content": [block]}]

        def follow(msgs, reply):
            return [*msgs, {"role": "assistant", "content": [b.model_dump() for b in reply.content] or "ok"},
                    {"role": "user", "content": "and then"}]  # fmt: skip

        a, b, cc = first("alpha", mark=True), first("bravo"), first("charlie")
        ra, rb = await turn(a), await turn(b)
        await turn(cc)  # three idle caches of ~80 tokens: over the limit, the oldest unpinned one goes
        ua = ra.usage
        assert ua.cache_creation_input_tokens > 50 and ua.input_tokens == 0  # what it evaluated stayed cached
        a2, b2 = await turn(follow(a, ra)), await turn(follow(b, rb))
        assert a2.usage.cache_read_input_tokens >= ua.cache_read_input_tokens + ua.cache_creation_input_tokens
        assert b2.usage.cache_read_input_tokens < 10  # only the chat template's opening, shared with the others
