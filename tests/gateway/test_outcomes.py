"""Every answer of every route is counted (500s, refusals, embeddings, /api/*), and so are worker crashes and restarts."""

from __future__ import annotations

import asyncio
import os
import signal

from prometheus_client.parser import text_string_to_metric_families

from barrel_inference.gateway.metrics import GatewayMetrics

from .conftest import MODEL
from .test_workers import _importable, chat, manager, run, short_tmp  # noqa: F401 - fixtures


def samples(text: str, name: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def responses(text: str) -> dict[tuple[str, str, str], float]:
    return {(dict(k)["route"], dict(k)["method"], dict(k)["status"]): v for k, v in samples(text, "barrel_inference_http_responses_total").items()}


async def test_every_route_and_outcome_is_counted(make_gateway, fake_worker):
    class Broken:
        def list(self):
            raise RuntimeError("disk on fire")

        def resolve(self, name):
            raise RuntimeError("disk on fire")

    gw = await make_gateway(fake_worker.endpoint)
    c = gw.client
    assert (await c.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]})).status_code == 200
    assert (await c.get("/api/tags")).status_code == 200
    assert (await c.post("/v1/chat/completions", content=b"{")).status_code == 400
    deep = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"a": ' + b"[" * 10000 + b"]" * 10000 + b"}]}"
    r = await c.post("/v1/chat/completions", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400  # the probe's RecursionError 500
    assert (await c.get("/no/such/route")).status_code == 404
    counts = responses((await c.get("/metrics")).text)
    assert counts[("/v1/embeddings", "POST", "200")] == 1
    assert counts[("/api/tags", "GET", "200")] == 1
    assert counts[("/v1/chat/completions", "POST", "400")] == 2
    assert counts[("unmatched", "GET", "404")] == 1
    broken = await make_gateway(fake_worker.endpoint, registry=Broken())
    assert (await broken.client.get("/v1/models")).status_code == 500
    assert responses((await broken.client.get("/metrics")).text)[("/v1/models", "GET", "500")] == 1


async def test_worker_crashes_and_restarts_are_counted_by_cause(short_tmp):
    m, _ = manager(short_tmp)
    m.metrics = metrics = GatewayMetrics()
    try:
        h = await m.get(MODEL)
        _, done = await run(h, chat("c1", "a CRASH"))  # the fake worker exits with code 3
        assert done.error is not None
        h = await m.get(MODEL)
        os.kill(h.process.pid, signal.SIGKILL)
        for _ in range(200):
            if not h.alive:
                break
            await asyncio.sleep(0.02)
        h = await m.get(MODEL)
        text = metrics.render().decode()
        exits = {dict(k)["cause"]: v for k, v in samples(text, "barrel_inference_worker_exits_total").items()}
        starts = {dict(k)["kind"]: v for k, v in samples(text, "barrel_inference_worker_starts_total").items()}
        assert exits == {"exit 3": 1.0, "SIGKILL": 1.0}
        assert starts == {"first": 1.0, "restart": 2.0}
    finally:
        await m.aclose()
