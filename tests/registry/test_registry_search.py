"""Search across HuggingFace and the Ollama library into one hit list."""

from __future__ import annotations

import pytest
from aiohttp import web

from barrel_inference.config import Settings
from barrel_inference.registry import RegistryError
from barrel_inference.registry.fetch import Fetcher
from barrel_inference.registry.search import parse_count, parse_updated, search
from tests.registry.registry_fakes import OLLAMA_SEARCH_PAGE, FakeHF, FakeOllama, FileHost


@pytest.fixture
async def remotes():
    async with FileHost() as cdn, FakeHF(cdn) as hf, FakeOllama(cdn) as ol:
        hf.add_repo("unsloth/Qwen3-0.6B-GGUF", {"Qwen3-0.6B-Q4_K_M.gguf": b"GGUF1", "Qwen3-0.6B-Q8_0.gguf": b"GGUF2", "README.md": b""}, downloads=5000)
        hf.add_repo("Qwen/Qwen3-0.6B", {"model.safetensors": b"x"}, downloads=9_000_000, tags=["safetensors"])
        hf.add_repo("someone/qwen3-tiny-GGUF", {"tiny.gguf": b"GGUF3"}, downloads=10)
        hf.add_repo("other/llama-GGUF", {"l.gguf": b"GGUF4"}, downloads=10**6)
        ol.search_html = OLLAMA_SEARCH_PAGE
        yield hf, ol


@pytest.fixture
async def fetcher(remotes):
    hf, ol = remotes
    f = Fetcher(Settings(hf_endpoint=hf.url, ollama_search_url=ol.url), env={})
    yield f
    await f.close()


async def test_search_merges_both_sources_by_downloads(fetcher, remotes):
    hf, ol = remotes
    res = await search(fetcher, "qwen", limit=10)
    assert res["errors"] == {}
    hits = res["hits"]
    ids = [h["id"] for h in hits]
    # ollama's qwen3 (3.1M pulls) and granite (27.7K) interleave with HF's GGUF repos by downloads
    assert ids == ["ollama://library/qwen3", "ollama://library/granite3.2-vision", "hf://unsloth/Qwen3-0.6B-GGUF", "hf://someone/qwen3-tiny-GGUF"]
    q = hits[0]
    assert q["source"] == "ollama" and q["name"] == "qwen3" and q["downloads"] == 3_100_000
    assert q["tags"] == ["tools", "thinking", "0.6b", "8b"] and q["files"] == ["qwen3:0.6b", "qwen3:8b"]
    assert q["last_modified"] == "2025-05-01T10:00:00+00:00" and q["description"].startswith("Qwen3 is")
    g = hits[1]
    assert g["description"] == "A compact and efficient vision-language model & more." and g["downloads"] == 27_700
    h = hits[2]
    assert h["source"] == "hf" and h["files"] == ["Qwen3-0.6B-Q4_K_M.gguf", "Qwen3-0.6B-Q8_0.gguf"] and h["downloads"] == 5000
    assert h["last_modified"] == "2025-01-01T00:00:00.000Z"
    assert ol.log[-1].headers.get("HX-Request") == "true" and "q=qwen" in ol.log[-1].path


async def test_search_options(fetcher, remotes):
    res = await search(fetcher, "qwen", sources=["hf"], hf_filter="any", limit=2)
    assert [h["id"] for h in res["hits"]] == ["hf://Qwen/Qwen3-0.6B", "hf://unsloth/Qwen3-0.6B-GGUF"]
    assert res["hits"][0]["files"] == ["model.safetensors"]
    res = await search(fetcher, "qwen", sources=["hf"], hf_filter="safetensors")
    assert [h["id"] for h in res["hits"]] == ["hf://Qwen/Qwen3-0.6B"]
    res = await search(fetcher, "qwen", sources=["ollama"], limit=1)
    assert [h["id"] for h in res["hits"]] == ["ollama://library/granite3.2-vision"]  # page order, then limit
    for bad in ({"sources": ["pypi"]}, {"hf_filter": "onnx"}, {"limit": 0}):
        with pytest.raises(RegistryError) as e:
            await search(fetcher, "qwen", **bad)
        assert e.value.code == "invalid_request"


async def test_a_failing_source_is_reported_not_fatal(remotes):
    hf, _ = remotes
    async def down(request):
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/search", down)
    from tests.registry.registry_fakes import start

    runner, url = await start(app)
    f = Fetcher(Settings(hf_endpoint=hf.url, ollama_search_url=url), env={})
    try:
        res = await search(f, "llama")
    finally:
        await f.close()
        await runner.cleanup()
    assert [h["id"] for h in res["hits"]] == ["hf://other/llama-GGUF"]
    assert "503" in res["errors"]["ollama"]


async def test_search_timeout_per_source(remotes):
    hf, _ = remotes
    import asyncio

    async def slow(request):
        await asyncio.sleep(2)
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/search", slow)
    from tests.registry.registry_fakes import start

    runner, url = await start(app)
    f = Fetcher(Settings(hf_endpoint=hf.url, ollama_search_url=url), env={})
    try:
        res = await search(f, "llama", timeout=0.3)
    finally:
        await f.close()
        await runner.cleanup()
    assert res["hits"] and "within 0.3s" in res["errors"]["ollama"]


@pytest.mark.parametrize("text, n", [("27.7K", 27700), ("3.1M", 3_100_000), ("812", 812), ("1,024", 1024), ("2B", 2_000_000_000), ("", None), ("x", None)])
def test_parse_count(text, n):
    assert parse_count(text) == n


def test_parse_updated():
    assert parse_updated("Feb 27, 2025 7:26 PM UTC", "3 weeks ago") == "2025-02-27T19:26:00+00:00"
    assert parse_updated(None, "3 weeks ago") == "3 weeks ago"
