"""The real daemon (gateway + worker processes) on a generated tiny GGUF: fast engine-path checks."""

import asyncio
import json
import time

import httpx
import pytest

from .daemon import Daemon

# the tiny model's end-of-generation tokens, <|endoftext|> and <|im_end|>: suppressed so lengths are exact
EOS_BIAS = {"264": -100, "266": -100}


@pytest.fixture(scope="module")
def daemon(tiny_gguf, tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("daemon"), {"tiny": tiny_gguf}, n_seq_max=2, n_ctx=2048, threads=1)
    with d:
        yield d


async def stream_chat(client, body, on_chunk=None):
    """POST a streaming chat; returns (chunks, arrival times)."""
    chunks, times = [], []
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            times.append(time.perf_counter())
            chunks.append(line[6:])
            if on_chunk is not None and await on_chunk(len(chunks)):
                break
    return chunks, times


def chat(content, **kw):
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "temperature": 0, "logit_bias": EOS_BIAS, **kw}


async def test_chat_completion_shape_and_usage(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
        r = await c.post("/v1/chat/completions", json=chat("hello", max_tokens=12))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 12 and body["usage"]["prompt_tokens"] > 5


async def test_stream_ends_with_done_and_include_usage_chunk(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
        chunks, _ = await stream_chat(c, chat("hi", max_tokens=6, stream_options={"include_usage": True}))
    assert chunks[-1] == "[DONE]"
    usage_chunk = json.loads(chunks[-2])
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 6
    finals = [json.loads(x)["choices"][0]["finish_reason"] for x in chunks[:-2]]
    assert finals[-1] == "length" and all(f is None for f in finals[:-1])


async def test_concurrent_streams_interleave(daemon):
    second_done = asyncio.Event()
    after_second = []

    async def first_until_after_second(n):
        if second_done.is_set():
            after_second.append(n)
        return len(after_second) >= 3  # the first kept streaming after the second finished

    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
        started = asyncio.Event()

        async def on_first(n):
            started.set()
            return await first_until_after_second(n)

        first = asyncio.create_task(stream_chat(c, chat("first", max_tokens=100000), on_chunk=on_first))
        await asyncio.wait_for(started.wait(), 30)
        chunks2, _ = await stream_chat(c, chat("second", max_tokens=3))
        second_done.set()
        await asyncio.wait_for(first, 30)
    assert json.loads(chunks2[-2])["choices"][0]["finish_reason"] == "length"
    assert len(after_second) >= 3, "the first stream had ended before the second was served"


async def test_over_long_prompt_is_400_streamed_or_not(daemon):
    long = "word " * 3000
    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
        r1 = await c.post("/v1/chat/completions", json=chat(long, max_tokens=4))
        r2 = await c.post("/v1/chat/completions", json=chat(long, max_tokens=4, stream=True))
        r3 = await c.post("/v1/completions", json={"model": "tiny", "prompt": long, "max_tokens": 4})
    for r in (r1, r2, r3):
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and "2048" in err["message"]


async def worker_stats(c, model="tiny"):
    r = await c.get("/api/stats", params={"model": model})
    assert r.status_code == 200, r.text
    return r.json()["stats"]


async def wait_until(probe, pred, timeout=30.0):
    """Poll `await probe()` until pred(value) holds; fail with the last value at the deadline."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = await probe()
        if pred(value):
            return value
        assert loop.time() < end, f"not reached within {timeout}s: {value}"
        await asyncio.sleep(0.05)


def disconnected_count(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("barrel_inference_requests_total{") and 'status="client_disconnected"' in line)  # fmt: skip


async def test_disconnect_aborts_in_the_worker_and_frees_the_sequences(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
        assert (await c.post("/v1/chat/completions", json=chat("warm", max_tokens=1))).status_code == 200
        before = await worker_stats(c)
        dropped_before = disconnected_count((await c.get("/metrics")).text)

        async def two_chunks(n):
            return n >= 2

        # fill both sequences with endless streams, drop them after two chunks each
        await asyncio.gather(*(stream_chat(c, chat(f"s{i}", max_tokens=100000), on_chunk=two_chunks) for i in range(2)))
        # the worker ended both as aborts (an endless stream cannot end any other way this soon) and freed their sequences
        after = await wait_until(lambda: worker_stats(c), lambda s: s["aborts_total"] - before["aborts_total"] >= 2 and s["seqs_busy"] == 0)
        assert after["aborts_total"] - before["aborts_total"] == 2 and after["running"] == 0 and after["waiting"] == 0, after
        assert after["requests_total"] - before["requests_total"] == 2
        assert disconnected_count((await c.get("/metrics")).text) - dropped_before == 2
        r = await c.post("/v1/chat/completions", json=chat("after", max_tokens=4))
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


async def test_unknown_model_is_404_and_bad_field_is_400(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
        r404 = await c.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        r400 = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"})
    assert r404.status_code == 404 and r404.json()["error"]["code"] == "model_not_found"
    assert r400.status_code == 400 and r400.json()["error"]["param"] == "temperature"


async def test_models_health_and_metrics(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
        assert (await c.get("/health")).json() == {"status": "ok"}
        ids = [m["id"] for m in (await c.get("/v1/models")).json()["data"]]
        metrics = (await c.get("/metrics")).text
    assert "tiny:latest" in ids or "tiny" in ids
    assert "barrel_inference_requests_total" in metrics
    assert "barrel_inference_completion_tokens_total" in metrics


async def test_killed_worker_fails_in_flight_and_the_next_request_restarts_it(daemon):
    import os
    import signal

    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
        assert (await c.post("/v1/chat/completions", json=chat("warm", max_tokens=2))).status_code == 200
        workers = daemon.children()
        assert workers, "no worker process under the gateway"
        task = asyncio.create_task(c.post("/v1/chat/completions", json=chat("doomed", max_tokens=100000)))
        await wait_until(lambda: worker_stats(c), lambda s: s["running"] == 1)  # in flight in the worker, not merely sent
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        r = await task
        assert r.status_code in (500, 502, 503) and "error" in r.json()
        assert (await c.get("/health")).status_code == 200
        r2 = await c.post("/v1/chat/completions", json=chat("again", max_tokens=3))
    assert r2.status_code == 200 and r2.json()["usage"]["completion_tokens"] == 3


async def test_response_format_json_schema_is_enforced(daemon):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["n", "ok"]}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "json please"}], "temperature": 0.7, "seed": 3,
            "max_tokens": 200, "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}  # fmt: skip
    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
        r = await c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    value = json.loads(choice["message"]["content"])
    assert isinstance(value["n"], int) and isinstance(value["ok"], bool)


async def test_embeddings_openai_shape_normalised_and_deterministic(daemon):
    import math

    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
        r = await c.post("/v1/embeddings", json={"model": "tiny", "input": ["hello world", "hello world", "something else"]})
        one = await c.post("/v1/embeddings", json={"model": "tiny", "input": "hello world"})
        bad = await c.post("/v1/embeddings", json={"model": "tiny", "input": []})
        long = await c.post("/v1/embeddings", json={"model": "tiny", "input": "word " * 3000})
        missing = await c.post("/v1/embeddings", json={"model": "nope", "input": "x"})
    assert r.status_code == 200, r.text
    body = r.json()
    vecs = [d["embedding"] for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and body["object"] == "list"
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-6 for v in vecs)
    assert vecs[0] == vecs[1] != vecs[2]
    assert body["usage"]["prompt_tokens"] > 0
    assert one.json()["data"][0]["embedding"] == vecs[0]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
    assert missing.status_code == 404


def test_bictl_embed_against_the_daemon(daemon):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "barrel_inference.cli", "--host", daemon.url, "embed", "tiny", "hello"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "dim=64" in out.stdout


async def test_metrics_show_each_workers_sequences_kv_cells_and_load_time(daemon):
    import re

    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
        r = await c.post("/v1/chat/completions", json=chat("metrics please", max_tokens=6))
        assert r.status_code == 200
        text = (await c.get("/metrics")).text

    def value(pattern: str) -> float:
        m = re.search(pattern + r" ([0-9.e+]+)", text)
        assert m, pattern
        return float(m.group(1))

    busy = value(r'barrel_inference_sequences\{model="tiny:latest",replica="0",state="busy"\}')
    free = value(r'barrel_inference_sequences\{model="tiny:latest",replica="0",state="free"\}')
    assert busy + free == 2 and free >= 1  # n_seq_max = 2; the finished request freed its sequence
    assert value(r'barrel_inference_kv_cells_used\{model="tiny:latest",replica="0"\}') > 0  # the idle sequence keeps its prefix
    assert value(r'barrel_inference_worker_load_seconds\{model="tiny:latest",replica="0"\}') > 0
    assert 'barrel_inference_worker_starts_total{kind="first",model="tiny:latest",replica="0"}' in text
