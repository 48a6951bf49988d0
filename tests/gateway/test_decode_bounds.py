"""Integers and nesting bounded at decode: the probe's 500s (OverflowError, RecursionError) are 400s naming the field."""

from __future__ import annotations

import pytest

from .conftest import MODEL

BIG = 2**64
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {**CHAT, "max_tokens": BIG}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": BIG}, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "seed": BIG}, "seed"),
    ("/v1/chat/completions", {**CHAT, "seed": -(2**70)}, "seed"),
    ("/v1/chat/completions", {**CHAT, "top_k": BIG}, "top_k"),
    ("/v1/chat/completions", {**CHAT, "n": BIG}, "n"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {str(BIG): 1}}, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": [BIG]}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 10**30}, "max_tokens"),
])  # fmt: skip
async def test_huge_integers_are_400_naming_the_field(gateway, path, body, param):
    r = await gateway.client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_json_nested_10000_deep_is_400(gateway):
    deep = b"[" * 10_000 + b"]" * 10_000
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": %s}}]}' % (MODEL.encode(), deep)  # noqa: E501
    r = await gateway.client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    r = await gateway.client.post("/api/show", content=b'{"model": ' + deep + b"}", headers={"content-type": "application/json"})
    assert r.status_code == 400


async def test_the_largest_allowed_values_still_work(gateway):
    r = await gateway.client.post("/v1/chat/completions", json={**CHAT, "seed": 2**63 - 1, "max_tokens": 2**31 - 1})
    assert r.status_code == 200


@pytest.mark.parametrize("extra", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": -(2**63) - 1}}}},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"maximum": 2**70}}}]},
])  # fmt: skip
async def test_integers_beyond_64_bits_inside_schemas_are_400(gateway, extra):
    """Found by the fuzz suite: the link could not carry them (OverflowError, a 500)."""
    r = await gateway.client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text
    r = await gateway.client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
