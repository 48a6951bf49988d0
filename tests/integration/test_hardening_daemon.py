"""The probe's requests against the real daemon (gateway + worker processes, tiny GGUF), scaled to run
in seconds: each is refused with the right status, names what was wrong, and the worker serving the
next request is the same process (nothing crashed)."""

import asyncio

import httpx
import pytest

from .daemon import Daemon


@pytest.fixture(scope="module")
def daemon(tiny_gguf, tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("hardening"), {"tiny": tiny_gguf}, n_seq_max=2, n_ctx=1024, threads=1)
    with d:
        yield d


def chat(content="hi", **kw):
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **kw}


def schema(s):
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}


async def worker_pid(client) -> int:
    r = await client.get("/api/ps")
    return r.json()["models"][0]["pid"] if r.json()["models"] else 0


@pytest.mark.parametrize("body, status, words", [
    (chat(response_format=schema({"type": "string", "maxLength": 20000})), 400, ["maxLength", "20000", "1000"]),
    (chat(response_format=schema({"type": "array", "maxItems": 50000})), 400, ["maxItems", "1000"]),
    (chat(response_format=schema({"enum": [f"v{i}" for i in range(20000)]})), 400, ["enum", "128"]),
    (chat("word " * 400_000), 400, ["characters", "1024"]),  # 2 MB (the probe: 5 MB froze every stream for 7 s)
    (chat(max_tokens=2**64), 400, ["max_tokens"]),
    (chat(seed=2**64), 400, ["seed"]),
])  # fmt: skip
async def test_probe_requests_are_refused_and_the_worker_lives(daemon, body, status, words):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200
        pid = await worker_pid(client)
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == status, r.text
        message = r.json()["error"]["message"]
        assert all(w in message for w in words), message
        ok = await client.post("/v1/chat/completions", json=chat())
        assert ok.status_code == 200 and await worker_pid(client) == pid


async def test_a_grammar_bomb_does_not_stall_a_running_stream(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as client:
        stream = asyncio.create_task(client.post("/v1/chat/completions", json=chat(max_tokens=60, logit_bias={"264": -100, "266": -100})))
        bombs = [client.post("/v1/chat/completions", json=chat(response_format=schema({"enum": [f"v{i}" for i in range(20000)]})))
                 for _ in range(4)]  # fmt: skip
        answers = await asyncio.gather(*bombs)
        assert all(a.status_code == 400 for a in answers)
        r = await stream
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 60


async def test_browser_requests_are_refused_by_the_daemon(daemon):
    async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as client:
        r = await client.post("/api/pull", content=b'{"model": "file:///tmp/x.gguf"}', headers={"content-type": "text/plain", "origin": "http://evil.example"})
        assert r.status_code == 403
        r = await client.post("/api/pull", json={"model": "http://127.0.0.1:9/api/tags", "stream": False})
        assert r.status_code == 403 and "pull_allow_private" in r.json()["error"]
        r = await client.get("/api/tags", headers={"host": "rebind.evil.example"})
        assert r.status_code == 403
