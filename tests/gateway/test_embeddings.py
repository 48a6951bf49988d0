"""POST /v1/embeddings as the official openai SDK calls it (base64 by default), dimensions, token-id inputs."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import openai
import pytest

from .conftest import MODEL


@pytest.fixture
def sdk(gateway):
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gateway.test")
    return openai.AsyncOpenAI(base_url="http://gateway.test/v1", api_key="unused", http_client=http, max_retries=0)


async def test_the_sdks_default_call_works(sdk, gateway, fake_worker):
    res = await sdk.embeddings.create(model=MODEL, input="hello there")  # the SDK sends encoding_format=base64
    assert len(res.data) == 1 and res.data[0].index == 0
    vec = res.data[0].embedding
    assert isinstance(vec, list) and len(vec) == 4 and all(isinstance(x, float) for x in vec)
    plain = (await gateway.client.post("/v1/embeddings", json={"model": MODEL, "input": "hello there"})).json()
    assert vec == pytest.approx(plain["data"][0]["embedding"], rel=1e-6)  # float32 of the same vector
    assert res.usage.prompt_tokens == 2
    assert fake_worker.calls[-1].inputs == ["hello there"]


async def test_base64_is_little_endian_float32(gateway):
    r = await gateway.client.post("/v1/embeddings", json={"model": MODEL, "input": ["a b", "c"], "encoding_format": "base64"})
    plain = (await gateway.client.post("/v1/embeddings", json={"model": MODEL, "input": ["a b", "c"]})).json()
    for item, want in zip(r.json()["data"], plain["data"]):
        raw = base64.b64decode(item["embedding"])
        assert len(raw) == 4 * len(want["embedding"])
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(want["embedding"], rel=1e-6)


async def test_dimensions_truncate_and_renormalise(sdk, gateway):
    full = (await gateway.client.post("/v1/embeddings", json={"model": MODEL, "input": "a b c"})).json()["data"][0]["embedding"]
    res = await sdk.embeddings.create(model=MODEL, input="a b c", dimensions=2)
    vec = res.data[0].embedding
    norm = math.sqrt(full[0] ** 2 + full[1] ** 2)
    assert vec == pytest.approx([full[0] / norm, full[1] / norm], rel=1e-6)
    r = await gateway.client.post("/v1/embeddings", json={"model": MODEL, "input": "a", "dimensions": 99})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"


async def test_token_id_inputs(sdk, fake_worker):
    res = await sdk.embeddings.create(model=MODEL, input=[5, 6, 7])
    assert len(res.data) == 1 and fake_worker.calls[-1].inputs == [[5, 6, 7]]
    res = await sdk.embeddings.create(model=MODEL, input=[[1, 2], [3]])
    assert [d.index for d in res.data] == [0, 1] and fake_worker.calls[-1].inputs == [[1, 2], [3]]


@pytest.mark.parametrize("body,param", [
    ({"model": MODEL, "input": []}, "input"),
    ({"model": MODEL, "input": [1, "a"]}, "input"),
    ({"model": MODEL, "input": [[1], []]}, "input"),
    ({"model": MODEL, "input": [""]}, "input"),
    ({"model": MODEL, "input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"model": MODEL, "input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x"}, "model"),
])  # fmt: skip
async def test_bad_embedding_requests_are_400_naming_the_field(gateway, body, param):
    r = await gateway.client.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
