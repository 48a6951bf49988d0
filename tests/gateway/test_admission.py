"""Admission queues: a bounded FIFO per model in the gateway, with a timeout, for generations and embeddings."""

from __future__ import annotations

import asyncio

import pytest

from barrel_inference.config import ModelSettings
from barrel_inference.gateway.admission import ModelQueue
from barrel_inference.gateway.errors import GatewayError
from barrel_inference.protocol import ErrorCode

from .conftest import MODEL
from .test_disconnect import drive, wait_for


def chat(text: str, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **kw}


async def one_seq_gateway(make_gateway, fake_worker, **kw):
    fake_worker.n_seq_max = 1
    return await make_gateway(fake_worker.endpoint, **kw)


async def test_queue_full_is_503_with_retry_after_and_the_worker_sees_only_what_fits(make_gateway, fake_worker):
    gw = await one_seq_gateway(make_gateway, fake_worker, defaults=ModelSettings(max_queue=1))
    held = [asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat(f"w{i} STALL"))) for i in range(2)]
    q = gw.app.state.admission.queue(MODEL)
    await wait_for(lambda: len(fake_worker.submits) == 1 and q.depth == 1)
    r = await gw.client.post("/v1/chat/completions", json=chat("one more"))
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "overloaded"
    m = (await gw.client.get("/metrics")).text
    assert 'barrel_inference_requests_waiting{model="fake:latest"} 1.0' in m
    for t in held:
        t.cancel()
    await asyncio.gather(*held, return_exceptions=True)


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
async def test_ollama_requests_over_a_full_queue_get_its_503_with_retry_after(make_gateway, fake_worker, path):
    """The Ollama family through the same admission: its own error body ({"error": ...}), 503."""
    gw = await one_seq_gateway(make_gateway, fake_worker, defaults=ModelSettings(max_queue=1))
    held = [asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat(f"w{i} STALL"))) for i in range(2)]
    q = gw.app.state.admission.queue(MODEL)
    await wait_for(lambda: len(fake_worker.submits) == 1 and q.depth == 1)
    body = {"model": MODEL, "stream": False, **({"messages": [{"role": "user", "content": "one more"}]} if path == "/api/chat" else {"prompt": "one more"})}
    r = await gw.client.post(path, json=body)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert set(r.json()) == {"error"} and r.json()["error"]
    assert len(fake_worker.submits) == 1
    for t in held:
        t.cancel()
    await asyncio.gather(*held, return_exceptions=True)


async def test_waiting_past_queue_timeout_is_504_queue_timeout(make_gateway, fake_worker):
    gw = await one_seq_gateway(make_gateway, fake_worker, models={MODEL: ModelSettings(endpoint=fake_worker.endpoint, insecure=True, queue_timeout_ms=200)})
    held = asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat("w STALL")))
    await wait_for(lambda: len(fake_worker.submits) == 1)
    for stream in (False, True):
        r = await gw.client.post("/v1/chat/completions", json=chat("late", stream=stream))
        assert r.status_code == 504 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_timeout" and "queue_timeout_ms" in r.json()["error"]["message"]
    assert len(fake_worker.submits) == 1
    m = (await gw.client.get("/metrics")).text
    assert 'barrel_inference_queue_rejections_total{model="fake:latest",reason="timeout"} 2.0' in m
    assert 'barrel_inference_queue_wait_seconds_count{model="fake:latest"} 3.0' in m
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)


async def test_a_client_that_leaves_while_queued_is_removed_and_never_reaches_the_worker(make_gateway, fake_worker):
    gw = await one_seq_gateway(make_gateway, fake_worker)
    held = asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat("w STALL")))
    await wait_for(lambda: len(fake_worker.submits) == 1)
    q = gw.app.state.admission.queue(MODEL)
    sent = await drive(gw.app, "/v1/chat/completions", chat("queued then gone"), disconnect_after_body_chunks=None,
                       disconnect_when=lambda _sent: q.depth == 1)  # leaves once it waits in the queue
    assert sent[0]["status"] == 499
    assert q.depth == 0 and len(fake_worker.submits) == 1
    m = (await gw.client.get("/metrics")).text
    assert 'barrel_inference_queue_rejections_total{model="fake:latest",reason="disconnected"} 1.0' in m
    held.cancel()  # the running one leaves: its slot is free again
    await asyncio.gather(held, return_exceptions=True)
    await wait_for(lambda: q.running == 0)
    r = await gw.client.post("/v1/chat/completions", json=chat("next"))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "next"


async def test_queued_requests_run_in_arrival_order(make_gateway, fake_worker):
    gw = await one_seq_gateway(make_gateway, fake_worker)
    fake_worker.tick_s = 0.05
    q = gw.app.state.admission.queue(MODEL)
    tasks = [asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat("first a b c d")))]
    await wait_for(lambda: len(fake_worker.submits) == 1)
    for i in range(4):
        tasks.append(asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat(f"q{i}"))))
        await wait_for(lambda: q.depth == i + 1)
    rs = await asyncio.gather(*tasks)
    assert [r.status_code for r in rs] == [200] * 5
    assert [s.messages[0].content for s in fake_worker.submits] == ["first a b c d", "q0", "q1", "q2", "q3"]


async def test_embeddings_wait_in_the_same_queue(make_gateway, fake_worker):
    gw = await one_seq_gateway(make_gateway, fake_worker, defaults=ModelSettings(max_queue=0))
    held = asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat("w STALL")))
    await wait_for(lambda: len(fake_worker.submits) == 1)
    r = await gw.client.post("/v1/embeddings", json={"model": MODEL, "input": "hello"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded" and r.headers["retry-after"] == "1"
    assert not any(type(c).__name__ == "Embed" for c in fake_worker.calls)
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)
    await wait_for(lambda: gw.app.state.admission.queue(MODEL).running == 0)
    r = await gw.client.post("/v1/embeddings", json={"model": MODEL, "input": "hello"})
    assert r.status_code == 200


async def test_model_queue_unit_fifo_and_capacity():
    q = ModelQueue("m")
    a = await q.acquire(2, 10, 5)
    b = await q.acquire(2, 10, 5)
    order: list[str] = []

    async def wait(name: str):
        slot = await q.acquire(2, 10, 5)
        order.append(name)
        return slot

    waiters = [asyncio.create_task(wait(n)) for n in "xyz"]
    await wait_for(lambda: q.depth == 3)
    with pytest.raises(GatewayError) as info:
        await q.acquire(2, 3, 5)
    assert info.value.code == ErrorCode.OVERLOADED and info.value.info.retryable
    a.release()
    a.release()  # idempotent: frees one place only
    await wait_for(lambda: order == ["x"])
    b.release()
    await wait_for(lambda: order == ["x", "y"])
    assert q.running == 2 and q.depth == 1
    waiters[2].cancel()
    await asyncio.gather(waiters[2], return_exceptions=True)
    assert q.depth == 0


def test_queue_limits_per_model_then_defaults_then_top_level():
    from barrel_inference.config import Settings
    from barrel_inference.gateway.admission import Admission

    s = Settings(max_queue=5, defaults=ModelSettings(max_queue=3), models={"m:1": ModelSettings(max_queue=1, queue_timeout_ms=100)})
    assert Admission(s).limits("m:1") == (1, 0.1)
    assert Admission(s).limits("other:1") == (3, 60.0)
    assert Admission(Settings(max_queue=5)).limits("x:1") == (5, 60.0)
