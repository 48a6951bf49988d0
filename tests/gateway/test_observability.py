"""Logs and metrics a person can read: one JSON stream (hypercorn's own messages included), every event with its
logger, embeddings logged and counted, no `_created` series, build_info, a deleted model's series removed."""

from __future__ import annotations

import asyncio
import io
import json

import httpx

from barrel_inference import __version__
from barrel_inference.config import ModelSettings, Settings
from barrel_inference.gateway.logging import make_logger
from barrel_inference.gateway.metrics import llama_cpp_version
from barrel_inference.gateway.server import serve
from barrel_inference.registry import Registry
from netutil import wait_healthy
from tests.cli.conftest import free_port
from tinymodel import write_tiny_gguf

from .conftest import MODEL
from .fake_worker import FakeWorker


async def test_one_json_stream_with_logger_names_and_clean_metrics(tmp_path):
    worker = FakeWorker(model=MODEL)  # embeds: a vector per input, one token per word
    await worker.start()
    port = free_port()
    settings = Settings(host="127.0.0.1", port=port, model_cache_dir=str(tmp_path / "cache"), runtime_dir=str(tmp_path / "run"),
                        embed_default_model=False, models={MODEL: ModelSettings(endpoint=worker.endpoint, insecure=True)}, log_json=True)  # fmt: skip
    stream = io.StringIO()
    logger = make_logger(settings, stream=stream)
    registry = Registry(settings, logger=logger)
    registry.register_local(MODEL, write_tiny_gguf(tmp_path / "t.gguf"))
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop, registry=registry, logger=logger))
    url = settings.base_url()
    try:
        await wait_healthy(url)
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            r = await c.post("/v1/embeddings", json={"model": "fake", "input": ["one two", "three"]})
            assert r.status_code == 200, r.text
            r = await c.post("/v1/embeddings", json={"model": "fake", "input": []})
            assert r.status_code == 400
            r = await c.post("/v1/chat/completions", json={"model": "fake", "messages": [{"role": "user", "content": "a b"}]})
            assert r.status_code == 200
            m = (await c.get("/metrics")).text
            assert "_created" not in m
            assert (f'barrel_inference_build_info{{engine_profile="extra_buffers=auto",llama_cpp_version="{llama_cpp_version() or "unknown"}",'
                    f'version="{__version__}"}} 1.0') in m  # fmt: skip
            assert 'barrel_inference_requests_total{api="openai.embeddings",model="fake:latest",status="ok"} 1.0' in m
            assert 'barrel_inference_requests_total{api="openai.embeddings",model="unknown",status="invalid_request"} 1.0' in m
            assert 'barrel_inference_embedding_inputs_total{model="fake:latest"} 2.0' in m
            assert 'barrel_inference_prompt_tokens_total{model="fake:latest"} 5.0' in m  # 3 embedded + 2 prompted
            r = await c.request("DELETE", "/api/delete", json={"model": "fake"})
            assert r.status_code == 200
            m = (await c.get("/metrics")).text
            assert 'model="fake:latest"' not in m and "barrel_inference_build_info{" in m
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await worker.stop()
    lines = stream.getvalue().splitlines()
    events = [json.loads(line) for line in lines]  # every line is JSON: one stream
    assert all(e.get("logger_name") for e in events), [e for e in events if not e.get("logger_name")]
    hyper = [e for e in events if e["logger_name"] == "hypercorn.error"]
    assert any("Running on" in e["message"] for e in hyper), hyper
    embeds = [e for e in events if e["event"] == "request" and e.get("api") == "openai.embeddings"]
    assert [(e["status"], e["inputs"]) for e in embeds] == [("ok", 2), ("invalid_request", 0)]
    assert embeds[0]["prompt_tokens"] == 3 and embeds[0]["model"] == MODEL and "total_ms" in embeds[0]
    assert any(e["event"] == "model_registered" and e["logger_name"] == "barrel_inference.registry" for e in events)
