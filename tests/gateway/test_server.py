"""The gateway under real hypercorn on a real port, driven by the openai SDK and raw httpx."""

from __future__ import annotations

import asyncio
import socket

import httpx
from netutil import wait_healthy
import openai
import pytest

from barrel_inference.gateway.server import serve
from barrel_inference.gateway.workers import ModelManager

from .conftest import MODEL, LogCapture, StubRecord, StubRegistry, make_settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DefaultingRegistry(StubRegistry):
    def __init__(self, *records) -> None:
        super().__init__(*records)
        self.ensured = 0

    def ensure_default(self):
        self.ensured += 1
        return None


@pytest.fixture
async def server(tmp_path, fake_worker):
    settings = make_settings(tmp_path, fake_worker.endpoint, host="127.0.0.1", port=free_port(),
                             preload=["missing:1b", MODEL])  # fmt: skip
    settings.embed_default_model = True
    logs = LogCapture(settings)
    registry = DefaultingRegistry(StubRecord(MODEL))
    models = ModelManager(settings, registry, logger=logs.logger, heartbeat=(0.5, 5.0))
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop, registry=registry, models=models, logger=logs.logger))
    base = settings.base_url()
    await wait_healthy(base)
    assert registry.ensured == 1
    assert [e["model"] for e in logs.events("model_preload_failed")] == ["missing:1b"]  # and the gateway still serves
    yield base, models, logs
    stop.set()
    await asyncio.wait_for(task, 15)
    assert models.running() == [] and logs.events("gateway_stopped")


async def test_openai_sdk_chat_plain_and_streamed(server, fake_worker):
    base, models, _ = server
    assert fake_worker.connects >= 1 and models.running()  # preloaded at startup, before any request
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    reply = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "sdk says hi"}])
    assert reply.choices[0].message.content == "sdk says hi"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens_details.cached_tokens == 2
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "streamed words here"}], stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    pieces, usage, finish = [], None, None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == "streamed words here"
    assert finish == "stop" and usage.completion_tokens == 3
    completion = await client.completions.create(model=MODEL, prompt="legacy prompt text", max_tokens=2)
    assert completion.choices[0].text == "legacy prompt" and completion.choices[0].finish_reason == "length"
    models_page = await client.models.list()
    assert [m.id for m in models_page.data] == [MODEL]


async def test_openai_sdk_sees_typed_errors(server):
    base, _, _ = server
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], n=2)
    assert bad.value.status_code == 400 and bad.value.param == "n"
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="nope:1b", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as long:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "TOOLONG"}], stream=True)
    assert long.value.code == "context_length_exceeded"
    stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a CRASH"}], stream=True)
    with pytest.raises(openai.APIError) as mid:
        async for _ in stream:
            pass
    assert mid.value.body["code"] == "worker_unavailable"


async def test_disconnect_mid_stream_aborts_over_tcp(server, fake_worker):
    base, _, logs = server
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "one two STALL"}], "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if '"content":"one"' in line:
                    break
    rid = fake_worker.submits[-1].id
    for _ in range(300):
        if fake_worker.aborts:
            break
        await asyncio.sleep(0.01)
    assert fake_worker.aborts == [rid]


async def test_malformed_json_over_tcp_is_400(server):
    base, _, _ = server
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        r = await client.post("/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
