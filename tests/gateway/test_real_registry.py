"""The gateway with the real on-disk registry (names, aliases, ':latest') and a real worker process."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from barrel_inference.config import ModelSettings, Settings
from barrel_inference.gateway.app import create_app
from barrel_inference.gateway.workers import ModelManager
from barrel_inference.registry import Registry

from .conftest import LogCapture


@pytest.fixture
async def gateway_on_disk(tiny_gguf):
    with tempfile.TemporaryDirectory(prefix="bi-reg-", dir="/tmp") as d:
        tmp = Path(d)
        settings = Settings(
            model_cache_dir=str(tmp / "cache"), runtime_dir=str(tmp / "run"), embed_default_model=False,
            aliases={"gpt-4o-mini": "tiny"}, models={"tiny:latest": ModelSettings(n_seq_max=2, n_ctx=512)},
        )  # fmt: skip
        registry = Registry(settings)
        registry.register_local("tiny", tiny_gguf)
        logs = LogCapture(settings)
        models = ModelManager(settings, registry, logger=logs.logger,
                              worker_command=[sys.executable, "-m", "barrel_inference.worker"])  # fmt: skip
        app = create_app(settings, registry=registry, models=models, logger=logs.logger)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", timeout=60) as client:
            yield client, models
        await models.aclose()


async def test_real_registry_names_and_a_real_worker(gateway_on_disk):
    client, models = gateway_on_disk
    r = await client.get("/v1/models")
    assert [m["id"] for m in r.json()["data"]] == ["tiny:latest"]
    r = await client.get("/v1/models/gpt-4o-mini")
    assert r.status_code == 200 and r.json()["id"] == "gpt-4o-mini"
    r = await client.post("/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 4, "temperature": 0})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "gpt-4o-mini" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4 and body["usage"]["prompt_tokens"] > 0
    [running] = models.running()
    assert running.name == "tiny:latest" and running.n_seq_max == 2 and running.n_ctx == 512  # per-model settings applied
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x " * 600}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = await client.post("/v1/completions", json={"model": "tiny:7b", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
